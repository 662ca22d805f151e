#!/usr/bin/env bash
# test_dp_failure.sh: one rank failing in a dp=2 MPI job (the test hook
# MEGATRAIN_TEST_FAIL_RANK=1 makes rank 1 fail at step 3) brings the whole job
# down with a non-zero status within the time limit, and the message names the
# rank; nothing is left waiting; the same for the last pipeline stage of a
# tp 2 x pp 2 job. Then a rank killed with SIGKILL mid-run: the
# job ends non-zero within 60 s and mpirun names rank 1. Skips without mpirun.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
command -v mpirun > /dev/null || { echo "mpirun not found"; exit 77; }
export OMP_NUM_THREADS=1
demo_data "$WORK/english"
for fail_rank in 1 0; do
  set +e
  timeout 60 mpirun --allow-run-as-root --oversubscribe -np 2 -x MEGATRAIN_TEST_FAIL_RANK=$fail_rank \
    "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/run-$fail_rank" --set train.steps=10 \
    --set train.micro_batch_size=2 --set "train.batch_schedule=[{step: 0, global_batch_size: 8}]" \
    --set optimizer.schedule.warmup_steps=3 --set "data.train=[{path: $WORK/english, weight: 1.0}]" \
    > "$WORK/log-$fail_rank" 2>&1
  rc=$?
  set -e
  [[ $rc -ne 124 ]] || { cat "$WORK/log-$fail_rank"; fail "rank $fail_rank failing: the job hung (timeout)"; }
  [[ $rc -ne 0 ]] || { cat "$WORK/log-$fail_rank"; fail "rank $fail_rank failing: the job exited 0"; }
  grep -q "rank $fail_rank: step 3: failure injected" "$WORK/log-$fail_rank" \
    || { cat "$WORK/log-$fail_rank"; fail "rank $fail_rank failing: the message does not name the rank"; }
  ! grep -q '^step  4/10' "$WORK/log-$fail_rank" || fail "rank $fail_rank failing: the job went on past step 3"
  echo "rank $fail_rank failing at step 3: job stopped with status $rc"
done

# In a tp 2 x pp 2 job, the last stage's second tp rank (rank 3) failing
# while the others wait on it in the pipeline and the tp collectives.
set +e
timeout 60 mpirun --allow-run-as-root --oversubscribe -np 4 -x MEGATRAIN_TEST_FAIL_RANK=3 \
  "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/run-tp" --set train.steps=10 \
  --set train.micro_batch_size=2 --set "train.batch_schedule=[{step: 0, global_batch_size: 8}]" \
  --set parallel.tp=2 --set parallel.pp=2 --set optimizer.schedule.warmup_steps=3 \
  --set "data.train=[{path: $WORK/english, weight: 1.0}]" > "$WORK/log-tp" 2>&1
rc=$?
set -e
[[ $rc -ne 124 ]] || { cat "$WORK/log-tp"; fail "tp2 pp2, rank 3 failing: the job hung (timeout)"; }
[[ $rc -ne 0 ]] || { cat "$WORK/log-tp"; fail "tp2 pp2, rank 3 failing: the job exited 0"; }
grep -q "rank 3: step 3: failure injected" "$WORK/log-tp" \
  || { cat "$WORK/log-tp"; fail "tp2 pp2, rank 3 failing: the message does not name the rank"; }
echo "tp2 pp2, rank 3 failing at step 3: job stopped with status $rc"

# Kill rank 1 (SIGKILL) mid-run.
mpirun --allow-run-as-root --oversubscribe -np 2 "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" \
  --set run.dir="$WORK/run-kill" --set train.steps=100000 --set train.micro_batch_size=2 \
  --set "train.batch_schedule=[{step: 0, global_batch_size: 8}]" --set checkpoint.interval=0 \
  --set logging.interval=1 --set "data.train=[{path: $WORK/english, weight: 1.0}]" > "$WORK/log-kill" 2>&1 &
mpirun_pid=$!
trap 'kill -9 $mpirun_pid 2> /dev/null || true; rm -rf "$WORK"' EXIT
victim=""
for _ in $(seq 300); do   # up to 30 s for rank 1 to start and step 3 to be logged
  [[ -n "$victim" ]] || victim=$(rank_pid $mpirun_pid 1)
  [[ -n "$victim" && -s "$WORK/run-kill/metrics.jsonl" && $(wc -l < "$WORK/run-kill/metrics.jsonl") -ge 3 ]] && break
  sleep 0.1
done
[[ -n "$victim" ]] || { cat "$WORK/log-kill"; fail "kill: rank 1 not found among mpirun's children"; }
kill -9 "$victim"
wait_gone $mpirun_pid 60 "kill: the job still runs 60 s after rank 1 was killed"
set +e
wait $mpirun_pid
rc=$?
set -e
[[ $rc -ne 0 ]] || fail "kill: the job exited 0 after rank 1 was killed"
grep -q "rank 1" "$WORK/log-kill" || { cat "$WORK/log-kill"; fail "kill: the message does not name rank 1"; }
echo "rank 1 killed: job stopped with status $rc"
