#!/usr/bin/env bash
# test_fuzz_replay.sh: builds the libFuzzer harnesses of tests/fuzz (clang,
# AddressSanitizer with LeakSanitizer, UndefinedBehaviorSanitizer) and runs
# every committed input once through its harness: the seed corpora
# (tests/fuzz/corpus/NAME) and every past crash (tests/fuzz/crashes/NAME),
# so that a fixed defect stays fixed. Any crash, sanitizer report, leak,
# harness check or timeout fails. clang-14 is required (make deps installs it).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO"
command -v clang-14 > /dev/null ||
  fail "clang-14 not found: run make deps (scripts/install_deps.sh installs clang-14 and libclang-rt-14-dev)"
make --no-print-directory -j2 fuzz-build > "$WORK/build.log" 2>&1 ||
  { tail -n 30 "$WORK/build.log"; fail "building the fuzz harnesses failed (make fuzz-build)"; }

shopt -s nullglob
export UBSAN_OPTIONS=print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1
harnesses=0 total=0
for src in tests/fuzz/fuzz_*.c; do
  name=$(basename "$src" .c)
  name=${name#fuzz_}
  corpus=(tests/fuzz/corpus/"$name"/*)
  [[ ${#corpus[@]} -gt 0 ]] || fail "$name: no seed corpus in tests/fuzz/corpus/$name"
  inputs=("${corpus[@]}" tests/fuzz/crashes/"$name"/*)
  log=$WORK/$name.log
  status=0
  build/fuzz/fuzz_"$name" -timeout=10 "${inputs[@]}" < /dev/null > "$log" 2>&1 || status=$?
  if [[ $status -ne 0 ]] || grep -qE 'ERROR: |runtime error: |fuzz harness: ' "$log"; then
    grep -vE '^(INFO|Executed|Running):' "$log" | head -n 40
    fail "$name: exit status $status replaying $(grep '^Running: ' "$log" | tail -n 1 | cut -d' ' -f2)"
  fi
  ran=$(grep -c '^Executed ' "$log" || true)
  [[ $ran -eq ${#inputs[@]} ]] || fail "$name: ran $ran of ${#inputs[@]} inputs"
  echo "$name: ${#inputs[@]} inputs, no findings"
  harnesses=$((harnesses + 1)) total=$((total + ${#inputs[@]}))
done
for dir in tests/fuzz/crashes/*/; do
  [[ -f tests/fuzz/fuzz_$(basename "$dir").c ]] || fail "$dir: no harness tests/fuzz/fuzz_$(basename "$dir").c replays it"
done
[[ $harnesses -ge 8 ]] || fail "expected at least 8 harnesses, found $harnesses"
echo "fuzz replay: $total inputs through $harnesses harnesses, no findings"
