#!/usr/bin/env bash
# test_parallel_resume.sh: checkpoints across layouts. A run at tp 2, pp 2,
# dp 2 (8 ranks, with and without the distributed optimizer) saves at step 5,
# each rank its own shard file (with ZeRO-1 every dp rank its moments);
# resuming it at tp 1 pp 1 dp 1, at tp 1 pp 2 dp 4 and at tp 2 cp 2 pp 2 vpp 2
# continues as the uninterrupted single-rank run (losses and grad norms,
# relative error < 1e-5), optimizer state included. The checkpoint converts
# to Hugging Face like any other. A resume whose layout does not fit the
# launch says how to change it. The timers line gives data, forward and
# backward on one rank, the pipeline's one figure at pp 2. Skips without mpirun.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
command -v mpirun > /dev/null || { echo "mpirun not found"; exit 77; }
export OMP_NUM_THREADS=1
demo_data "$WORK/english"
COMMON=(--set train.steps=10 --set logging.interval=1 --set train.micro_batch_size=2 --set model.num_layers=4
        --set "train.batch_schedule=[{step: 0, global_batch_size: 8}]" --set optimizer.schedule.warmup_steps=3
        --set checkpoint.interval=5 --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.timers_interval=5)
mpi() { local np=$1; shift; timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$np" "$MEGATRAIN" "$@"; }

"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/one" "${COMMON[@]}" > "$WORK/one.log"
grep -qE '^timers \(ms per step, steps 6-10, rank 0\): data [0-9.]+ \| forward [0-9.]+ \| backward [0-9.]+ \| comm ' \
  "$WORK/one.log" || fail "one rank: no timers line: $(grep timers "$WORK/one.log")"
for zero in false true; do
  saved="$WORK/saved-$zero"
  mpi 8 run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$saved" "${COMMON[@]}" --set parallel.tp=2 \
    --set parallel.pp=2 --set parallel.distributed_optimizer=$zero > "$saved.log" 2>&1 \
    || { tail -20 "$saved.log"; fail "tp2 pp2 dp2 (distributed optimizer $zero): the run failed"; }
  compare loss "$WORK/one/metrics.jsonl" "$saved/metrics.jsonl" || fail "tp2 pp2 dp2: losses differ from one rank"
  # the timers line: one figure for the pipeline's interleaved passes (it booked them all as backward)
  grep -qE '^timers \(ms per step, steps 1-5, rank 0\): pipeline [0-9.]+ \(forward, backward, transfers, bubble and data, not told apart\) \| comm ' \
    "$saved.log" || fail "pp 2: no pipeline timers line: $(grep timers "$saved.log")"
  # the pipeline's line is part of the banner, after the layout (it came before the run's header)
  [[ "$(grep -E '^(megatrain: run|layout:|pipeline parallel:)' "$saved.log" | cut -d' ' -f1 | tr '\n' ' ')" == \
     "megatrain: layout: pipeline " ]] || fail "pp 2: the banner's order: $(head -n 6 "$saved.log")"
  ckpt="$saved/checkpoints/iter_0000005"
  "$MEGATRAIN" inspect "$ckpt" > /dev/null || fail "the tp2 pp2 dp2 checkpoint does not verify"
  # each tp x pp rank of dp 0 writes its shard; with ZeRO-1 every dp rank too (its part of the moments)
  shards=$(ls "$ckpt" | grep -c '^shard_')
  [[ $shards -eq $([[ $zero == true ]] && echo 8 || echo 4) ]] || fail "distributed optimizer $zero: $shards shard files"
  # name:ranks:settings of the resumed layout
  for layout in "tp1-pp1-dp1:1:" "tp1-pp2-dp4:8:--set parallel.pp=2" \
                "tp2-cp2-pp2-vpp2:8:--set parallel.tp=2 --set parallel.cp=2 --set parallel.pp=2 --set parallel.vpp=2"; do
    IFS=: read -r name np settings <<< "$layout"
    dir="$WORK/resumed-$zero-$name"
    # shellcheck disable=SC2086
    mpi "$np" resume "$ckpt" --set run.dir="$dir" --set parallel.tp=1 --set parallel.pp=1 --set parallel.vpp=1 \
      --set parallel.cp=1 --set parallel.distributed_optimizer=$zero $settings > "$dir.log" 2>&1 \
      || { tail -20 "$dir.log"; fail "resume at $name: failed"; }
    [[ $(json_field "$dir/metrics.jsonl" step | head -1) == 6 ]] || fail "resume at $name: did not start at step 6"
    for field in loss grad_norm; do
      compare $field "$WORK/one/metrics.jsonl" "$dir/metrics.jsonl" 6 \
        || fail "resume at $name (saved with distributed optimizer $zero): $field differs from the uninterrupted run"
    done
    echo "saved at tp2 pp2 dp2 (distributed optimizer $zero), resumed at $name: continues as the uninterrupted run"
  done
done

"$MEGATRAIN" convert "$WORK/saved-false/checkpoints/iter_0000010" "$WORK/hf" > /dev/null \
  || fail "the tp2 pp2 dp2 checkpoint does not convert to Hugging Face"
[[ -f "$WORK/hf/config.json" ]] || fail "convert wrote no config.json"

# The checkpoint's recipe says tp 2 pp 2: one rank cannot take it, and the
# message names the keys to set.
set +e
"$MEGATRAIN" resume "$WORK/saved-false/checkpoints/iter_0000005" --set run.dir="$WORK/bad" > "$WORK/bad.log" 2>&1
rc=$?
set -e
[[ $rc -eq 2 ]] || { cat "$WORK/bad.log"; fail "resume on a world that does not fit: expected exit 2, got $rc"; }
grep -q "parallel" "$WORK/bad.log" || { cat "$WORK/bad.log"; fail "resume on a world that does not fit: no hint"; }
echo "a layout that does not fit the launch is refused with exit 2"

# A batch ramp resumed onto a dp its finished stage does not divide: 1 rank ramps 2 -> 8 at step 5 (micro-batches
# of 2), saves at step 5; 4 ranks (dp 4) resume it. Stage 0's 2 is no multiple of 2 x 4, but its steps are done:
# the resume is taken (it was refused) and continues as the uninterrupted run; a stage still ahead that dp 4 does
# not divide is still refused, naming it.
RAMP=(--set "train.batch_schedule=[{step: 0, global_batch_size: 2}, {step: 5, global_batch_size: 8}]")
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/ramp" "${COMMON[@]}" "${RAMP[@]}" > "$WORK/ramp.log"
mpi 4 resume "$WORK/ramp/checkpoints/iter_0000005" --set run.dir="$WORK/ramp-dp4" > "$WORK/ramp-dp4.log" 2>&1 ||
  { tail -20 "$WORK/ramp-dp4.log"; fail "a ramp resumed at dp 4 after its first stage: refused"; }
for field in loss grad_norm; do
  compare $field "$WORK/ramp/metrics.jsonl" "$WORK/ramp-dp4/metrics.jsonl" 6 ||
    fail "a ramp resumed at dp 4: $field differs from the uninterrupted run"
done
# refused_at_dp4 NAME SCHEDULE STAGE GBS: resuming at step 5 on dp 4 with this schedule is refused (exit 2), naming
# stage STAGE's global batch size GBS, which 2 x 4 does not divide
refused_at_dp4() {
  local rc=0
  mpi 4 resume "$WORK/ramp/checkpoints/iter_0000005" --set run.dir="$WORK/ramp-$1" --set "train.batch_schedule=$2" \
    > "$WORK/ramp-$1.log" 2>&1 || rc=$?
  [[ $rc -eq 2 ]] && grep -q "stage $3 has global batch size $4; expected a multiple of micro_batch_size \* dp = 2 \* 4 = 8" \
    "$WORK/ramp-$1.log" || { cat "$WORK/ramp-$1.log"; fail "$1: stage $3 that dp 4 does not divide: exit $rc"; }
}
refused_at_dp4 ahead "[{step: 0, global_batch_size: 2}, {step: 5, global_batch_size: 8}, {step: 8, global_batch_size: 12}]" 2 12
# the stage the resume starts in is not finished: one dp 4 does not divide is refused too
refused_at_dp4 current "[{step: 0, global_batch_size: 2}, {step: 5, global_batch_size: 6}, {step: 8, global_batch_size: 8}]" 1 6
echo "a batch ramp resumed at dp 4 after a stage dp 4 does not divide: taken, the uninterrupted run's numbers"
