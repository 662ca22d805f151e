#!/usr/bin/env bash
# run_tests.sh: runs every CI test (unit programs in build/tests, or MT_UNIT_DIR, then
# tests/integration/test_*.sh) and ends with one "N passed, N failed, N skipped"
# line. A test that exits 77 is counted as skipped.
# Usage: bash tests/run_tests.sh [NAME_FILTER]
set -u
cd "$(dirname "$0")/.."
export MEGATRAIN="${MEGATRAIN:-$PWD/build/megatrain}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
filter="${1:-}"
passed=0; failed=0; skipped=0; failed_names=()
logdir=$(mktemp -d)

run_one() {
  local name=$1; shift
  [[ -n "$filter" && "$name" != *"$filter"* ]] && return
  local start=$SECONDS
  "$@" > "$logdir/$name.log" 2>&1
  local rc=$?
  if [[ $rc -eq 0 ]]; then
    passed=$((passed + 1)); printf 'PASS  %-40s %3ds\n' "$name" $((SECONDS - start))
  elif [[ $rc -eq 77 ]]; then   # the test said it cannot run here (exit 77)
    skipped=$((skipped + 1)); printf 'SKIP  %-40s %s\n' "$name" "$(tail -n 1 "$logdir/$name.log")"
  else
    failed=$((failed + 1)); failed_names+=("$name")
    printf 'FAIL  %-40s %3ds\n' "$name" $((SECONDS - start))
    sed 's/^/      | /' "$logdir/$name.log" | tail -n 40
  fi
}

for t in "${MT_UNIT_DIR:-build/tests}"/test_*; do
  [[ -x "$t" ]] && run_one "$(basename "$t")" "$t"
done
for t in tests/integration/test_*.sh; do
  [[ -f "$t" ]] && run_one "$(basename "$t" .sh)" bash "$t"
done

rm -rf "$logdir"
echo
[[ $failed -gt 0 ]] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 && $passed -gt 0 ]]
