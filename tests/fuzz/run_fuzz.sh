#!/usr/bin/env bash
# run_fuzz.sh: fuzz each named harness (build/fuzz/fuzz_NAME, built by `make
# fuzz-build`) for SECONDS, starting from its committed corpus and crashes
# (tests/fuzz/corpus/NAME, tests/fuzz/crashes/NAME; left unchanged: new
# inputs go to build/fuzz/corpus/NAME) and its dictionary when there is one
# (tests/fuzz/NAME.dict). A crash, leak, sanitizer report, timeout (10 s)
# or out-of-memory leaves the input in build/fuzz/artifacts/NAME/ and makes
# the script fail after the other harnesses have run.
# Usage: bash tests/fuzz/run_fuzz.sh SECONDS NAME...
set -uo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:?usage: run_fuzz.sh SECONDS NAME...}
shift
failed=()
for name in "$@"; do
  bin=build/fuzz/fuzz_$name
  [[ -x $bin ]] || { echo "run_fuzz: $bin is missing (make fuzz-build)" >&2; exit 1; }
  work=build/fuzz/corpus/$name artifacts=build/fuzz/artifacts/$name
  mkdir -p "$work" "$artifacts"
  seeds=()
  for d in tests/fuzz/corpus/$name tests/fuzz/crashes/$name; do [[ -d $d ]] && seeds+=("$d"); done
  dict=()
  [[ -f tests/fuzz/$name.dict ]] && dict=(-dict="tests/fuzz/$name.dict")
  log=build/fuzz/$name.log
  echo "fuzz $name for ${seconds}s (log: $log)"
  "$bin" -max_total_time="$seconds" -timeout=10 -print_final_stats=1 "${dict[@]}" \
    -artifact_prefix="$artifacts/" "$work" "${seeds[@]}" < /dev/null > "$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  if [[ $rc -ne 0 ]]; then
    failed+=("$name")
    echo "  FAILED (exit $rc) after ${execs:-?} executions; input in $artifacts/:"
    grep -E 'ERROR|SUMMARY|runtime error|fuzz harness:' "$log" | head -n 5 | sed 's/^/    /'
  else
    echo "  ok: ${execs:-?} executions, corpus $(ls "$work" | wc -l) inputs"
  fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzzing found problems in: ${failed[*]} (see tests/fuzz/README.md: how to add a crash)"
  exit 1
fi
