#!/usr/bin/env bash
# test_parallel_ckpt_kill.sh: crash safety of checkpoints written by many
# ranks. A tp 2 x pp 2 job saving every step (each rank its own shard file,
# rank 0 the metadata; saves made slow with MEGATRAIN_TEST_SLOW_SAVE_MS so
# that kills land inside them) loses one rank to SIGKILL at a random moment,
# several times, with sync and async saves. After every kill: the job ended
# non-zero, every iter_* directory is a complete checkpoint that `inspect`
# verifies (with one shard file per writing rank), the latest pointer names
# one of them, and `resume` on the same layout continues from it. Kill
# delays are printed for reproduction. Skips without mpirun.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
command -v mpirun > /dev/null || { echo "mpirun not found"; exit 77; }
export OMP_NUM_THREADS=1
demo_data "$WORK/english"
dir="$WORK/run"
ck="$dir/checkpoints"
layout=(--set parallel.tp=2 --set parallel.pp=2)
settings=(--set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.eval_interval=0
          --set optimizer.schedule.warmup_steps=1 --set train.micro_batch_size=2 --set model.num_layers=4
          --set "train.batch_schedule=[{step: 0, global_batch_size: 8}]")

mid_save=0
for i in 1 2 3 4; do
  async=$([[ $((i % 2)) -eq 0 ]] && echo true || echo false)
  if compgen -G "$ck/iter_???????" > /dev/null; then
    cmd=(resume "$dir" --set train.steps=100000 --set checkpoint.async=$async)
  else
    cmd=(run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$dir" --set train.steps=100000
         --set checkpoint.interval=1 --set checkpoint.async=$async "${settings[@]}" "${layout[@]}")
  fi
  mpirun --allow-run-as-root --oversubscribe -np 4 -x MEGATRAIN_TEST_SLOW_SAVE_MS=4 "$MEGATRAIN" "${cmd[@]}" \
    > "$WORK/kill-$i.log" 2>&1 &
  mpirun_pid=$!
  victim=""
  for _ in $(seq 600); do   # up to 60 s for the ranks to start and log a step
    [[ -n "$victim" ]] || victim=$(rank_pid $mpirun_pid $((i % 4)))
    [[ -n "$victim" ]] && grep -q "^step" "$WORK/kill-$i.log" 2> /dev/null && break
    sleep 0.1
  done
  [[ -n "$victim" ]] || { cat "$WORK/kill-$i.log"; fail "kill $i: rank $((i % 4)) not found"; }
  delay=$(printf '0.%03d' $((RANDOM % 1000)))
  sleep "$delay"
  kill -KILL "$victim" 2> /dev/null || true
  wait_gone $mpirun_pid 60 "kill $i: the job still runs 60 s after rank $((i % 4)) was killed"
  set +e
  wait $mpirun_pid
  rc=$?
  set -e
  [[ $rc -ne 0 ]] || fail "kill $i: the job exited 0"
  leftovers=$(ls "$ck" 2> /dev/null | grep -c -E '\.tmp\.|\.deleting$' || true)
  [[ $leftovers -gt 0 ]] && mid_save=$((mid_save + 1))
  n=$(check_checkpoints "$ck" 4)
  echo "kill $i (async=$async): rank $((i % 4)) killed ${delay}s after a step: $n complete checkpoints, $leftovers leftovers"
done
[[ $mid_save -gt 0 ]] || fail "no kill landed inside a save; the test did not test anything"

# What is left resumes on the same layout and cleans up the leftovers.
step=$(cat "$ck/latest_checkpointed_iteration.txt")
timeout 120 mpirun --allow-run-as-root --oversubscribe -np 4 "$MEGATRAIN" resume "$dir" \
  --set train.steps=$((step + 2)) > "$WORK/final.log" 2>&1 || { cat "$WORK/final.log"; fail "the final resume failed"; }
grep -q "resume: from" "$WORK/final.log" || fail "the final resume did not say where it resumed from"
[[ $(ls "$ck" | grep -c -E '\.tmp\.|\.deleting$' || true) -eq 0 ]] || fail "leftovers remain after a save"
echo "after $mid_save kill(s) inside a save: every checkpoint verifies and the run resumes"
