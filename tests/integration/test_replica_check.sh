#!/usr/bin/env bash
# test_replica_check.sh: the cross-replica parameter check (train.replica_check_interval)
# in a dp=2 MPI job. Identical replicas pass it (checked at steps 5 and 10);
# one parameter bit flipped on rank 1 after step 3 (test hook
# MEGATRAIN_TEST_FLIP_PARAM=1:3) is caught at step 5: every rank stops with
# exit 1 (no abort), the message names rank 1, no step 6 runs and no
# checkpoint is written from the diverged state; at tp 2 x dp 2 too, where
# one dp group holds the flip. Skips without mpirun.
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

# The flip: every rank stops at step 5 with exit 1 (the verdict is every rank's), nothing aborted; at tp 2 x dp 2 the
# ranks of the dp group without the flip stop with the others.
flip() { # flip NAME NP [--set ...]: rank 1 flipped after step 3, the run stopped together at step 5
  local name=$1 np=$2
  shift 2
  (export MEGATRAIN_TEST_FLIP_PARAM=1:3
   stop_together "$name" "$np" "$WORK/$name.log" "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" \
     --set run.dir="$WORK/$name" --set train.steps=10 --set train.micro_batch_size=2 \
     --set "train.batch_schedule=[{step: 0, global_batch_size: 8}]" --set train.replica_check_interval=5 \
     --set checkpoint.interval=5 --set optimizer.schedule.warmup_steps=3 \
     --set "data.train=[{path: $WORK/english, weight: 1.0}]" "$@") || fail "$name: not stopped together"
  grep -q "step 5: the parameters differ across data-parallel replicas: rank(s) 1 " "$WORK/$name.log" \
    || { cat "$WORK/$name.log"; fail "$name: the message does not name step 5 and rank 1"; }
  ! grep -q '^step *6/10' "$WORK/$name.log" || fail "$name: the job went on past the failed check"
  [[ ! -d "$WORK/$name/checkpoints/iter_0000005" ]] || fail "$name: a checkpoint was written from the diverged state"
  echo "$name: the flip on rank 1 caught at step 5, every rank exited 1"
}
flip flip 2
flip flip-tp2dp2 4 --set parallel.tp=2 --set train.micro_batch_size=1
echo "ok: identical replicas pass; a flipped bit on rank 1 is caught at the next check"
