#!/usr/bin/env bash
# test_comm_mpi.sh: the host collectives that the unit test build/tests/test_comm
# checks on one rank, run under mpirun on 2, 3 and 4 ranks
# (comm_all_reduce_max_float: values of every kind, NaN on one rank only, a
# prime count, a split into groups of one and two ranks; tests/unit/test_comm.c).
# Skips without mpirun.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
command -v mpirun > /dev/null || { echo "mpirun not found"; exit 77; }
BIN="$(dirname "$MEGATRAIN")/tests/test_comm"
[[ -x "$BIN" ]] || fail "$BIN not built (make test-build)"
for np in 2 3 4; do
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$np" "$BIN" > "$WORK/np$np.log" 2>&1 ||
    { tail -30 "$WORK/np$np.log"; fail "test_comm on $np ranks"; }
  [[ $(grep -c '\[  PASSED  \] 3 test(s)' "$WORK/np$np.log") -eq $np ]] ||
    { cat "$WORK/np$np.log"; fail "test_comm on $np ranks: not every rank passed its 3 tests"; }
  echo "test_comm on $np ranks: every rank passed"
done
echo "PASS test_comm_mpi"
