#!/usr/bin/env bash
# run_gpu_tests.sh: the GPU tests (`make test-gpu`): the programs built in
# build/cuda/gpu-tests, then tests/gpu/test_*.sh with build/cuda/megatrain.
# GPU_BUILD=build/emu: the same on the CPU emulator (`make test-gpu-emu`).
# Ends with one "N passed, N failed, N skipped" line, like tests/run_tests.sh.
# Usage: bash tests/gpu/run_gpu_tests.sh [NAME ...]: only the tests whose file name contains a NAME (a rerun of the
# ones that failed, within a GPU session's few minutes).
set -u
cd "$(dirname "$0")/../.."
GPU_BUILD=${GPU_BUILD:-build/cuda}
export MEGATRAIN="$PWD/$GPU_BUILD/megatrain"
passed=0; failed=0; skipped=0
for t in "$GPU_BUILD"/gpu-tests/test_* tests/gpu/test_*.sh; do
  [[ -e "$t" && "$t" != *.d ]] || continue
  name=$(basename "$t")
  if (( $# > 0 )); then
    wanted=0; for w in "$@"; do [[ "$name" == *"$w"* ]] && wanted=1; done
    (( wanted )) || continue
  fi
  echo "== $name"
  start=$SECONDS
  if [[ "$t" == *.sh ]]; then bash "$t"; else "$t"; fi
  rc=$?
  if [[ $rc -eq 0 ]]; then passed=$((passed + 1)); echo "PASS  $name $((SECONDS - start))s"
  elif [[ $rc -eq 77 ]]; then skipped=$((skipped + 1)); echo "SKIP  $name"
  else failed=$((failed + 1)); echo "FAIL  $name (exit $rc)"; fi
done
echo
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 && $passed -gt 0 ]]
