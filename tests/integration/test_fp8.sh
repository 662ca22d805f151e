#!/usr/bin/env bash
# test_fp8.sh: precision: fp8 on the CPU (the exact emulation of Hopper's FP8
# products, tensorwise current scaling; docs/fp8.md).
# - The tiny llama trained 100 steps in fp8 tracks fp32: the mean loss of
#   steps 81-100 within 2% (measured 0.24% on 2026-11-24; the largest single
#   step 4.4%), and fp8 does change the numbers (some step differs by > 1e-3).
# - Layouts: tp 2 + sp, cp 2, pp 2 and dp 2 give the one-rank fp8 losses and
#   grad norms to 1e-6 on steps 1-2 (same weights: the amaxes reduced over tp
#   and cp give the one-rank scales; a per-rank scale would differ at once),
#   and after that losses within 5e-4 and grad norms within 1e-2 (an fp32
#   difference of 1e-7 upstream can move a value across an FP8 rounding
#   boundary; measured on 2026-11-24 over 12 steps: losses 4.2e-5, grad norms
#   2.0e-3 on tp 2, 2.3e-4 on cp 2, 5.7e-5 on dp 2, 0 on pp 2).
# - Resume of an fp8 run equals the uninterrupted run bit for bit (current
#   scaling keeps no state).
# - Refused with exit 2 naming the key: fp8 with peft, fp8.recipe delayed
#   (not wired yet); the cuda build refuses fp8. (MoE in fp8: test_fp8_moe.sh.)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1
demo_data "$WORK/english"
COMMON=(--set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.eval_interval=0
        --set checkpoint.interval=0 --set train.micro_batch_size=4 --set optimizer.schedule.warmup_steps=2
        --set "train.batch_schedule=[{step: 0, global_batch_size: 8}]")

# run NAME NP SETTINGS...: the tiny llama on NP ranks.
run() { train_run "$REPO/recipes/tiny/llama.yaml" "$@"; }

run fp32 1 --set train.steps=100 --set optimizer.schedule.warmup_steps=10 --set precision=fp32
run fp8 1 --set train.steps=100 --set optimizer.schedule.warmup_steps=10 --set precision=fp8
loss_tracks "fp8 vs fp32" fp32 fp8

FP8=(--set precision=fp8 --set train.steps=12)
run one 1 "${FP8[@]}"
if command -v mpirun > /dev/null; then
  for layout in "tp2sp 2 --set parallel.tp=2 --set parallel.sequence_parallel=true" "cp2 2 --set parallel.cp=2" \
                "pp2 2 --set parallel.pp=2" "dp2 2"; do
    read -r name np settings <<< "$layout"
    # shellcheck disable=SC2086
    run "$name" "$np" "${FP8[@]}" $settings
    near_one_rank "$name" loss 2 1e-6 5e-4
    near_one_rank "$name" grad_norm 2 1e-6 1e-2
  done
  echo "fp8: tp 2 + sp, cp 2, pp 2 and dp 2 give the one-rank losses (1e-6 on steps 1-2, then FP8 noise)"
fi

run straight 1 "${FP8[@]}" --set checkpoint.interval=6
resume_exact straight 6 12
echo "fp8: resume equals the uninterrupted run bit for bit"

expect_refused "fp8 with LoRA" "precision: fp8 with peft (LoRA) is not implemented yet" 1 run \
  "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/lora" "${COMMON[@]}" --set precision=fp8 \
  --set "peft={type: lora, rank: 4, alpha: 8}"
expect_refused "fp8 delayed scaling" "fp8.recipe: delayed scaling is not wired into training yet" 1 run \
  "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/delayed" "${COMMON[@]}" --set precision=fp8 \
  --set fp8.recipe=delayed
if [[ -x "$REPO/build/cuda/megatrain" ]]; then
  MEGATRAIN="$REPO/build/cuda/megatrain" expect_refused "fp8 on cuda" "precision: fp8 runs as the exact CPU emulation only" \
    1 run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/cuda" "${COMMON[@]}" --set precision=fp8 \
    --set run.device=cuda
else
  echo "no build/cuda/megatrain: the cuda refusal is not checked here"
fi
echo "PASS test_fp8"
