#!/usr/bin/env bash
# test_megatron_data.sh: megatrain's indexed datasets and megatron-core's (tests/fixtures/megatron, README.md there).
# 1. `megatrain data build` still writes the bytes of tests/fixtures/megatron/indexed/mt_* (uint16 with the byte
#    tokenizer, int32 with a tokenizer of 70006 ids, an SFT build and its uint8 loss mask), which megatron-core
#    0.16.1's IndexedDataset read as indexed.txt records (tokens, lengths, pointers, document indices, dtype);
#    test_megatron_data checks megatrain's reader against the same record. Where build/test-venv has
#    megatron-core (not a tests/python_env.sh group; README.md says how to add it), IndexedDataset reads the
#    fresh build itself and must give the record; elsewhere the committed bytes stand in for it.
# 2. `data inspect --json` reads the datasets megatron-core's IndexedDatasetBuilder wrote (mc_*) with the
#    dtype, documents, sequences and tokens of indexed.txt.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
D="$WORK"
FIX="$REPO/tests/fixtures/megatron"

bigid_tokenizer "$D/big"
"$MEGATRAIN" data build --input "$FIX/indexed/input.txt" --output "$D/mt_byte" > /dev/null
"$MEGATRAIN" data build --input "$FIX/indexed/input.txt" --output "$D/mt_bigid" --tokenizer "$D/big" > /dev/null
"$MEGATRAIN" data build --input "$FIX/indexed/sft.jsonl" --output "$D/mt_sft" --format sft > /dev/null
for name in mt_byte mt_bigid mt_sft mt_sft_mask; do
  for ext in bin idx; do
    cmp "$D/$name.$ext" "$FIX/indexed/$name.$ext" ||
      fail "data build wrote another $name.$ext than the one megatron-core read (make_data_fixture.py remakes both)"
  done
done

# record NAME: the block of indexed.txt that describes dataset NAME
record() { awk -v n="$1" '/^dataset / { on = $2 == n } on' "$FIX/indexed.txt"; }

for name in mc_int32 mc_uint16 mc_merged; do
  head=$(record "$name" | head -n 1)
  dtype=$(sed -E 's/.*dtype=([0-9]+).*/\1/' <<< "$head")
  seqs=$(sed -E 's/.*sequences=([0-9]+).*/\1/' <<< "$head")
  docs=$(sed -E 's/.*documents=([0-9]+).*/\1/' <<< "$head")
  tokens=$(record "$name" | awk '$1 == "lengths" { for (i = 2; i <= NF; i++) s += $i; print s + 0 }')
  words=([4]=int32 [8]=uint16)
  "$MEGATRAIN" data inspect "$FIX/indexed/$name" --json --docs 0 > "$D/inspect.json"
  grep -q "\"dtype\":\"${words[$dtype]}\",\"documents\":$docs,\"sequences\":$seqs,\"tokens\":$tokens," "$D/inspect.json" ||
    fail "$name: data inspect: $(cut -c1-200 "$D/inspect.json"); megatron-core: $head, $tokens tokens"
done

PY="$REPO/build/test-venv/bin/python"
if [[ -x "$PY" ]] && "$PY" -c "import warnings; warnings.filterwarnings('ignore'); import megatron.core.datasets.indexed_dataset" 2> /dev/null; then
  (cd "$REPO" && "$PY" tests/fixtures/megatron/make_data_fixture.py describe "$D"/mt_{byte,bigid,sft,sft_mask}) \
    2> /dev/null > "$D/seen.txt"
  diff "$D/seen.txt" <(for name in mt_byte mt_bigid mt_sft mt_sft_mask; do record "$name"; done) > "$D/diff.txt" ||
    fail "megatron-core reads the fresh builds otherwise than indexed.txt records: $(head -n 10 "$D/diff.txt")"
  echo "megatron-core read the fresh builds"
else
  echo "megatron-core is not in build/test-venv: the committed bytes that it read stand in"
fi
echo "PASS"
