#!/usr/bin/env bash
# test_replica_check.sh: the cross-replica parameter check (train.replica_check_interval)
# in a dp=2 MPI job. Identical replicas pass it (checked at steps 5 and 10);
# one parameter bit flipped on rank 1 after step 3 (test hook
# MEGATRAIN_TEST_FLIP_PARAM=1:3) is caught at step 5: the job stops with
# exit 1, the message names rank 1, no step 6 runs and no checkpoint is
# written from the diverged state. Skips without mpirun.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
command -v mpirun > /dev/null || { echo "mpirun not found"; exit 77; }
export OMP_NUM_THREADS=1
demo_data "$WORK/english"
run() {  # run RUN_DIR [mpirun options]
  local dir=$1; shift
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "$@" \
    "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$dir" --set train.steps=10 --set train.micro_batch_size=2 \
    --set "train.batch_schedule=[{step: 0, global_batch_size: 8}]" --set train.replica_check_interval=5 \
    --set checkpoint.interval=5 --set optimizer.schedule.warmup_steps=3 \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]"
}
run "$WORK/same" > "$WORK/same.log" 2>&1 || { cat "$WORK/same.log"; fail "identical replicas failed the check"; }
grep -q "^step *10/10" "$WORK/same.log" || fail "the run with identical replicas did not finish"

set +e
run "$WORK/flip" -x MEGATRAIN_TEST_FLIP_PARAM=1:3 > "$WORK/flip.log" 2>&1
rc=$?
set -e
grep -i "error" "$WORK/flip.log" | head -3
[[ $rc -ne 0 && $rc -ne 124 ]] || { cat "$WORK/flip.log"; fail "a flipped parameter on rank 1 was not caught (exit $rc)"; }
grep -q "step 5: the parameters differ across data-parallel replicas: rank(s) 1 " "$WORK/flip.log" \
  || { cat "$WORK/flip.log"; fail "the message does not name step 5 and rank 1"; }
! grep -q '^step *6/10' "$WORK/flip.log" || fail "the job went on past the failed check"
[[ ! -d "$WORK/flip/checkpoints/iter_0000005" ]] || fail "a checkpoint was written from the diverged state"
echo "ok: identical replicas pass; a flipped bit on rank 1 is caught at the next check"
