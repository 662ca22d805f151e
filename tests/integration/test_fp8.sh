#!/usr/bin/env bash
# test_fp8.sh: precision: fp8 on the CPU (the exact emulation of Hopper's FP8
# products; docs/fp8.md), with fp8.recipe tensorwise (current scaling) and
# delayed (amax histories, checkpointed).
# - The tiny llama trained 100 steps in fp8 tracks fp32: over four seeds, the
#   mean of each run's mean loss of steps 81-100 within 2% (one seed's curve is
#   chaotic: seed 1234 alone was 0.24% tensorwise and 0.81% delayed on
#   2026-11-24, and 2.5% tensorwise with OpenBLAS's Haswell kernels on
#   2026-11-25; over the four seeds 0.92% and 0.24% there, 0.21% and 0.22%
#   with the SkylakeX kernels), and fp8 does change the numbers (some step
#   differs by > 1e-3).
# - Layouts: tp 2 + sp, cp 2, pp 2 and dp 2 give the one-rank fp8 losses and
#   grad norms to 1e-6 on steps 1-2 (same weights: the amaxes reduced over tp
#   and cp give the one-rank scales; a per-rank scale would differ at once),
#   and after that losses within 5e-4 and grad norms within 1e-2 (an fp32
#   difference of 1e-7 upstream can move a value across an FP8 rounding
#   boundary; measured on 2026-11-24 over 12 steps, tensorwise: losses
#   4.2e-5, grad norms 2.0e-3 on tp 2, 2.3e-4 on cp 2, 5.7e-5 on dp 2, 0 on
#   pp 2; delayed: losses 1.8e-5, grad norms 1.4e-3 on tp 2, 4.1e-5 on cp 2,
#   5.8e-9 on dp 2). Delayed scaling on dp 2 checks that the histories take
#   the step's amaxes over every dp rank and micro-batch, and the gradients'
#   as one rank sees them (a dp rank's are dp times larger).
# - Resume of an fp8 run equals the uninterrupted run bit for bit: tensorwise
#   keeps no state; delayed (history length 4, so the checkpoint's histories
#   decide step 7's scales) from its checkpointed histories, also on dp 2
#   with the distributed optimizer (its writers' sharded checkpoint); a pp 2
#   checkpoint resumed on tp 2 continues the one-rank run (within the layout
#   tolerance).
# - Delayed scaling with train.recompute full gives the same bits.
# - A delayed checkpoint resumes into bf16 (warning that the fp8: settings
#   are not used); a tensorwise one into delayed
#   (the histories start afresh, and it says so); one resumed with another
#   fp8.grad_format or margin makes its scales the new settings' (and says
#   how many: the exact values are test_fp8_linear's); another
#   fp8.amax_history_len is refused with exit 2, naming the key.
# - LoRA in fp8 (the frozen base's products; the adapters stay fp32) tracks
#   LoRA in fp32: the mean loss of steps 41-60 of 60 within 3e-4 (measured on
#   2026-11-24: 6e-5 tensorwise, 8e-5 delayed; the largest step 1.0e-3 and
#   1.2e-3: the base is frozen, so its casts change little), and a delayed
#   LoRA run resumes bit for bit.
# - Refused with exit 2: the cuda build refuses fp8. (MoE in fp8:
#   test_fp8_moe.sh.)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1
demo_data "$WORK/english"
COMMON=(--set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.eval_interval=0
        --set checkpoint.interval=0 --set train.micro_batch_size=4 --set optimizer.schedule.warmup_steps=2
        --set "train.batch_schedule=[{step: 0, global_batch_size: 8}]")

# run NAME NP SETTINGS...: the tiny llama on NP ranks.
run() { train_run "$REPO/recipes/tiny/llama.yaml" "$@"; }
values() { json_field "$WORK/$1/metrics.jsonl" "$2"; }

LONG=(--set train.steps=100 --set optimizer.schedule.warmup_steps=10)
SEEDS=(1234 1 2 3)
for seed in "${SEEDS[@]}"; do
  run "fp32-$seed" 1 "${LONG[@]}" --set precision=fp32 --set run.seed="$seed"
  for recipe in tensorwise delayed; do
    run "fp8_$recipe-$seed" 1 "${LONG[@]}" --set precision=fp8 --set fp8.recipe=$recipe --set run.seed="$seed"
  done
done
for recipe in tensorwise delayed; do loss_tracks_seeds "fp8 $recipe vs fp32" fp32 "fp8_$recipe" "${SEEDS[@]}"; done
# The log says fp8 is on, with its scaling; a tensorwise run given delayed scaling's settings is told they are unused
grep -q "^precision: fp8, tensorwise current scaling (margin 0): the linear layers' products take E4M3 inputs forward, E5M2 gradients" \
  "$WORK/fp8_tensorwise-1234.log" || fail "no precision line: $(head -n 5 "$WORK/fp8_tensorwise-1234.log")"
grep -q "^precision: fp8, delayed scaling (amax history 1024, its max, margin 0)" "$WORK/fp8_delayed-1234.log" ||
  fail "no delayed precision line: $(head -n 5 "$WORK/fp8_delayed-1234.log")"
! grep -q "^precision" "$WORK/fp32-1234.log" || fail "an fp32 run printed a precision line"
! grep -q "amax_history_len .* not used" "$WORK/fp8_tensorwise-1234.log" || fail "a warning without the settings"
run history-tensorwise 1 --set train.steps=1 --set optimizer.schedule.warmup_steps=0 --set precision=fp8 \
  --set fp8.amax_history_len=16
grep -q "warning: fp8.amax_history_len and fp8.amax_compute_algo apply to fp8.recipe: delayed only" \
  "$WORK/history-tensorwise.log" || fail "no warning of an unused amax history: $(grep -i warn "$WORK/history-tensorwise.log")"

# near ONE NAME: NAME's 12 losses and grad norms are ONE's (1e-6 on steps 1-2, then FP8 noise).
near() {
  ONE=$1 near_one_rank "$2" loss 2 1e-6 5e-4
  ONE=$1 near_one_rank "$2" grad_norm 2 1e-6 1e-2
}

FP8=(--set precision=fp8 --set train.steps=12)
DELAYED=(--set precision=fp8 --set fp8.recipe=delayed --set fp8.amax_history_len=4 --set train.steps=12)
run one 1 "${FP8[@]}"
run one_delayed 1 "${DELAYED[@]}"
run one_delayed_recompute 1 "${DELAYED[@]}" --set train.recompute=full
diff <(grep -o '"loss":[^,]*,"lr":[^,]*,"global_batch_size":[^,]*,"grad_norm":[^,]*' "$WORK/one_delayed/metrics.jsonl") \
     <(grep -o '"loss":[^,]*,"lr":[^,]*,"global_batch_size":[^,]*,"grad_norm":[^,]*' \
       "$WORK/one_delayed_recompute/metrics.jsonl") > /dev/null || fail "delayed fp8 with recompute full differs"
echo "fp8 delayed: train.recompute full gives the same bits (a recomputed forward casts and records as its forward)"
if command -v mpirun > /dev/null; then
  for layout in "tp2sp 2 --set parallel.tp=2 --set parallel.sequence_parallel=true" "cp2 2 --set parallel.cp=2" \
                "pp2 2 --set parallel.pp=2" "dp2 2"; do
    read -r name np settings <<< "$layout"
    # shellcheck disable=SC2086
    run "$name" "$np" "${FP8[@]}" $settings
    near one "$name"
    [[ $name == pp2 ]] && continue # delayed on pp 2: resumed on tp 2 below
    # shellcheck disable=SC2086
    run "${name}_delayed" "$np" "${DELAYED[@]}" $settings
    near one_delayed "${name}_delayed"
  done
  echo "fp8: tp 2 + sp, cp 2, pp 2 and dp 2 give the one-rank losses, tensorwise and delayed (1e-6 on steps 1-2, then FP8 noise)"
fi

run straight 1 "${FP8[@]}" --set checkpoint.interval=6
resume_exact straight 6 12
run straight_delayed 1 "${DELAYED[@]}" --set checkpoint.interval=6
CKPT="$WORK/straight_delayed/checkpoints/iter_0000006"
"$MEGATRAIN" inspect "$CKPT" > "$WORK/inspect.txt" # (grep -q on a pipe would end inspect with SIGPIPE)
grep -q 'fp8.layers.1.amax_history *\[12, 4\]' "$WORK/inspect.txt" || fail "no amax histories in $CKPT"
resume_exact straight_delayed 6 12
echo "fp8: resume equals the uninterrupted run bit for bit (tensorwise, and delayed from its checkpointed histories)"
if command -v mpirun > /dev/null; then
  run zero1_delayed 2 "${DELAYED[@]}" --set checkpoint.interval=6 --set parallel.distributed_optimizer=true
  resume_exact zero1_delayed 6 12 2
  run pp2_delayed 2 "${DELAYED[@]}" --set checkpoint.interval=6 --set parallel.pp=2
  near one_delayed pp2_delayed
  timeout 180 mpirun --allow-run-as-root --oversubscribe -np 2 "$MEGATRAIN" resume \
    "$WORK/pp2_delayed/checkpoints/iter_0000006" --set run.dir="$WORK/pp2_on_tp2" --set parallel.pp=1 \
    --set parallel.tp=2 > "$WORK/pp2_on_tp2.log" 2>&1 || { tail -5 "$WORK/pp2_on_tp2.log"; fail "pp 2 -> tp 2 resume failed"; }
  paste <(values straight_delayed loss | tail -6) <(values pp2_on_tp2 loss) | awk '
    { n++; d = ($2 - $1) / $1; if (d < 0) d = -d; if (!(d <= 5e-4)) bad = 1 } END { exit !(n == 6 && !bad) }' ||
    fail "the delayed pp 2 checkpoint resumed on tp 2 does not continue the one-rank run"
  echo "fp8 delayed: a dp 2 distributed-optimizer run resumes bit for bit, a pp 2 checkpoint on tp 2"
fi

"$MEGATRAIN" resume "$CKPT" --set run.dir="$WORK/into_bf16" --set precision=bf16 > "$WORK/into_bf16.log" 2>&1 ||
  { tail -5 "$WORK/into_bf16.log"; fail "the delayed checkpoint does not resume into bf16"; }
[[ $(values into_bf16 loss | wc -l) -eq 6 ]] || fail "into_bf16: no steps 7-12"
grep -q "warning: the fp8: settings apply with precision: fp8 only; this run's precision is bf16" \
  "$WORK/into_bf16.log" || fail "into_bf16: no warning that the fp8: settings (delayed) are not used"
"$MEGATRAIN" resume "$WORK/straight/checkpoints/iter_0000006" --set run.dir="$WORK/into_delayed" \
  --set fp8.recipe=delayed > "$WORK/into_delayed.log" 2>&1 || { tail -5 "$WORK/into_delayed.log"; fail "tensorwise -> delayed"; }
grep -q "delayed scaling starts afresh" "$WORK/into_delayed.log" || fail "tensorwise -> delayed does not say it starts afresh"
expect_refused "another fp8.amax_history_len" "resume with --set fp8.amax_history_len=4" 1 resume "$CKPT" \
  --set run.dir="$WORK/len16" --set fp8.amax_history_len=16
grep -q "FP8 scales made this run's" "$WORK/straight_delayed-resumed.log" &&
  fail "a resume with the same fp8: settings rescaled its scales"
"$MEGATRAIN" resume "$CKPT" --set run.dir="$WORK/into_e4m3" --set fp8.grad_format=e4m3 > "$WORK/into_e4m3.log" 2>&1 ||
  { tail -5 "$WORK/into_e4m3.log"; fail "the delayed e5m2 checkpoint does not resume into e4m3 gradients"; }
grep -q "resume: 8 FP8 scales made this run's: the checkpoint's were for fp8.grad_format e5m2, margin 0; this run has \
e4m3, margin 0" "$WORK/into_e4m3.log" || fail "e5m2 -> e4m3: the 8 gradient scales (2 layers x 4 products) not rescaled"
"$MEGATRAIN" resume "$CKPT" --set run.dir="$WORK/margin2" --set fp8.margin=2 > "$WORK/margin2.log" 2>&1 ||
  { tail -5 "$WORK/margin2.log"; fail "the delayed checkpoint does not resume with another margin"; }
grep -q "resume: 24 FP8 scales made this run's" "$WORK/margin2.log" || fail "margin 0 -> 2: the 24 scales not rescaled"
echo "fp8 delayed: resumes into bf16, from tensorwise (afresh), into e4m3 gradients or another margin (the scales" \
  "made the new settings'); another history length is refused"

# LoRA: the frozen base's products in FP8, the adapters in fp32 (bf16 on a GPU), as TE + PEFT run them.
LORA=(--set "peft={type: lora, rank: 4, alpha: 8}" --set train.steps=60 --set optimizer.schedule.warmup_steps=5)
run lora_fp32 1 "${LORA[@]}" --set precision=fp32
for recipe in tensorwise delayed; do
  run "lora_$recipe" 1 "${LORA[@]}" --set precision=fp8 --set fp8.recipe=$recipe --set checkpoint.interval=30
  paste <(values lora_fp32 loss) <(values "lora_$recipe" loss) | awk -v R=$recipe '
    { n++; d = ($2 - $1) / $1; if (d < 0) d = -d; if (d > worst) worst = d; if (n > 40) { a += $1; b += $2 } }
    END { rel = (b - a) / a; if (rel < 0) rel = -rel
          printf "LoRA in fp8 %s vs fp32: mean loss of steps 41-60 relative %.6f, largest step difference %.5f\n", R, rel, worst
          exit !(n == 60 && rel <= 3e-4 && worst > 1e-4) }' || fail "LoRA in fp8 $recipe does not track fp32 within 3e-4"
done
resume_exact lora_delayed 30 60
echo "LoRA in fp8 (delayed): resume equals the uninterrupted run bit for bit"

if [[ -x "$REPO/build/cuda/megatrain" ]]; then
  MEGATRAIN="$REPO/build/cuda/megatrain" expect_refused "fp8 on cuda" "precision: fp8 runs as the exact CPU emulation only" \
    1 run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/cuda" "${COMMON[@]}" --set precision=fp8 \
    --set run.device=cuda
else
  echo "no build/cuda/megatrain: the cuda refusal is not checked here"
fi
echo "PASS test_fp8"
