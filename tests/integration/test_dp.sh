#!/usr/bin/env bash
# test_dp.sh: data parallel over MPI on the CPU. `mpirun -np 2` (dp = 2) trains
# the same losses, grad norms, eval losses and test loss as the single-rank run of the same
# recipe (relative error < 1e-5, step by step), for llama and qwen3; only rank 0
# prints, writes metrics.jsonl and checkpoints. Without OMP_NUM_THREADS each rank
# runs its share of the host's CPUs (said once); more threads than CPUs are warned
# of. Skips without mpirun.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
command -v mpirun > /dev/null || { echo "mpirun not found"; exit 77; }
export OMP_NUM_THREADS=1
demo_data "$WORK/english"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np 2)
args() {  # args RECIPE RUN_DIR
  echo "$REPO/recipes/tiny/$1.yaml" --set "run.dir=$2"
}
COMMON=(--set train.steps=10 --set logging.interval=1 --set train.micro_batch_size=2
        --set "train.batch_schedule=[{step: 0, global_batch_size: 8}]" --set train.eval_interval=5
        --set train.eval_batches=3 --set optimizer.schedule.warmup_steps=3 --set checkpoint.interval=5
        --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set "data.split=[90, 5, 5]")

for family in llama qwen3; do
  "$MEGATRAIN" run $(args $family "$WORK/$family-1") "${COMMON[@]}" > "$WORK/$family-1.log"
  timeout 60 "${MPIRUN[@]}" "$MEGATRAIN" run $(args $family "$WORK/$family-2") "${COMMON[@]}" \
    > "$WORK/$family-2.log" 2>&1 || { cat "$WORK/$family-2.log"; fail "$family: the dp=2 run failed"; }
  grep -q "dp 2" "$WORK/$family-2.log" || fail "$family: the banner does not say dp 2"
  [[ $(wc -l < "$WORK/$family-2/metrics.jsonl") -eq 10 ]] || fail "$family: metrics.jsonl should hold 10 lines (rank 0 only)"
  [[ $(grep -c '^step ' "$WORK/$family-2.log") -eq 10 ]] || fail "$family: expected 10 step lines (rank 0 only)"
  for field in loss grad_norm eval_loss test_loss; do
    compare $field "$WORK/$family-1/metrics.jsonl" "$WORK/$family-2/metrics.jsonl" || fail "$family: $field differs"
  done
  # the test share (data.split's third) is evaluated once, after the last step
  [[ $(grep -c '"test_loss"' "$WORK/$family-2/metrics.jsonl") -eq 1 && $(tail -n 1 "$WORK/$family-2/metrics.jsonl" | grep -c '"test_loss"') -eq 1 ]] ||
    fail "$family: expected test_loss on the last line only"
  # The run with dp=2 differs from the single rank only by rounding: a wrong
  # scale (sum instead of mean) or wrong samples would show here.
  [[ -d "$WORK/$family-2/checkpoints/iter_0000010" ]] || fail "$family: no final checkpoint"
  "$MEGATRAIN" inspect "$WORK/$family-2/checkpoints/iter_0000010" > /dev/null || fail "$family: checkpoint does not verify"
  echo "$family: dp=2 matches the single rank: $(json_field "$WORK/$family-2/metrics.jsonl" loss | tr '\n' ' ')"
done

# OpenMP threads of ranks sharing the host: without OMP_NUM_THREADS each rank takes its share of the CPUs (said once;
# every rank took them all, 100x slower on 2 CPUs with 4 ranks); one that oversubscribes them is warned of
share() { # NAME SETTING...: a 1-step dp 2 run, its output in $WORK/NAME.log
  local name=$1; shift
  env "$@" timeout 60 "${MPIRUN[@]}" "$MEGATRAIN" run $(args llama "$WORK/$name") "${COMMON[@]}" --set train.steps=1 \
    --set optimizer.schedule.warmup_steps=0 --set train.eval_interval=0 > "$WORK/$name.log" 2>&1 ||
    { cat "$WORK/$name.log"; fail "$name: the run failed"; }
}
share unset -u OMP_NUM_THREADS
[[ $(grep -c "OMP_NUM_THREADS is unset: each of the 2 ranks on this host runs [0-9]* OpenMP thread" "$WORK/unset.log") \
  -eq 1 ]] || fail "OMP_NUM_THREADS unset: not said once: $(head -n 5 "$WORK/unset.log")"
share over OMP_NUM_THREADS=$(( $(cores) + 1 ))
over=$(( $(cores) + 1 ))
grep -q "warning: OMP_NUM_THREADS=$over: each of the 2 ranks on this host runs $over OpenMP threads, $(( 2 * over )) in \
all, and a rank may use [0-9]* CPU" "$WORK/over.log" ||
  fail "oversubscribed OpenMP threads: no warning: $(head -n 5 "$WORK/over.log")"
share one OMP_NUM_THREADS=1
! grep -q "OMP_NUM_THREADS" "$WORK/one.log" || fail "OMP_NUM_THREADS=1: a line about it: $(grep OMP "$WORK/one.log")"
echo "OpenMP threads: each rank its share without OMP_NUM_THREADS, oversubscription warned of"

# A layout that does not divide the world is refused with exit 2, naming the key.
expect_refused "tp=2 on 3 ranks" "parallel: expected tp \* pp \* cp (2 \* 1 \* 1 = 2) to divide the world size 3" 3 \
  run $(args llama "$WORK/tp") "${COMMON[@]}" --set parallel.tp=2
