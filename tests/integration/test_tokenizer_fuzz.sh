#!/usr/bin/env bash
# test_tokenizer_fuzz.sh: megatrain's ids and decoded texts equal Hugging Face `tokenizers`' on random
# adversarial text (tests/fixtures/tokenizers/fuzz_diff.py: many scripts, emoji sequences, combining marks in every
# normal form, controls, NUL, invalid UTF-8 after a BOM, mixed newlines, digit runs, added-token lookalikes), for
# every fixture tokenizer and the byte-pair variants of the byte-level ones, through `data build` (JSONL with two
# workers, text lines, --add-bos) and `data inspect --json`. Needs `tokenizers` (lib.sh need_python: skipped
# where it cannot be installed, except in CI). A fixed seed, so a failure reproduces with the same command.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need_python tokenizers
"$PY" "$REPO/tests/fixtures/tokenizers/fuzz_diff.py" --count 400 --seed 1 --pairs --megatrain "$MEGATRAIN" \
  > "$WORK/fuzz.txt" 2>&1 || fail "fuzz_diff.py: $(cat "$WORK/fuzz.txt")"
grep -q "fuzz_diff: ok" "$WORK/fuzz.txt" || fail "fuzz_diff.py: $(cat "$WORK/fuzz.txt")"
echo "ok: $(grep -c 'all equal' "$WORK/fuzz.txt") tokenizers equal on random text"
