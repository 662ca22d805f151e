#!/usr/bin/env bash
# test_fp8_moe.sh: precision: fp8 with a mixture of experts on the CPU: the
# routed experts' products (each expert its own scales, as Transformer
# Engine's GroupedLinear) and the shared expert's in FP8, with tensorwise
# current scaling and with delayed scaling (docs/fp8.md, "In the model").
# SHARED: the tiny qwen3_moe with a shared expert
# (moe.shared_expert_intermediate_size 64).
# - The tiny qwen3_moe, and SHARED, trained 100 steps in fp8 track fp32: the
#   mean loss of steps 81-100 within 2% (measured on 2026-11-24: 0.95% and
#   0.22%, the largest single step 4.1% and 6.8%; with run.seed 1 and 2 the
#   means differ by 0.2% to 1.7%), and fp8 does change the numbers.
# - Layouts of SHARED, 12 steps against one rank. tp 2 (etp 1), tp 2 + etp 2
#   + sp, cp 2 and dp 2: the losses of steps 1-2 within 1e-6 and the grad
#   norm of step 1 within 5e-5 (the amaxes reduced over cp and etp give the
#   one-rank scales; measured on 2026-11-24 over 4 seeds with and without the
#   shared expert: losses 0, grad norms at most 5.7e-6, from a few E5M2
#   roundings that fp32 noise upstream moves, e.g. 7 of 327,680 expert
#   gradient values on tp 2; without the reductions: losses 4e-6 to 1.4e-5,
#   grad norms 8.7e-4 to 1.3e-3). After that FP8 rounding amplifies fp32
#   noise: losses within 1e-3 and grad norms within 1e-1 (measured at most
#   1.8e-4 and 4.3e-2; an MoE grad norm also moves with near-tie routing).
# - ep 2 (dp 2): an expert computes both dp ranks' rows with one scale from
#   all of them, as a GPU grouped product does, so ep matches one rank within
#   FP8 rounding only: step 1's loss differs (measured 2.2e-6 to 1.5e-5), all
#   losses within 1e-3 and grad norms within 1e-1 (measured at most 3.7e-4
#   and 3.5e-2).
# - Resume of an fp8 MoE run equals the uninterrupted run bit for bit.
# - Delayed scaling (every expert's amax histories, updated once per step
#   from every rank's rows): SHARED tracks fp32 within 2% (measured on
#   2026-11-24: 0.54%, without the shared expert 1.1%); tp 2 + etp 2 + sp
#   and cp 2 as above (measured: losses 0 on steps 1-2, first grad norm
#   8.6e-6, then 1.1e-4 and 2.6e-3); ep 2 gives the one-rank losses and grad
#   norms of steps 1-2 within 1e-6 (the histories do not depend on which rows
#   an expert computes together: tensorwise ep 2 differs at step 1), then
#   FP8 noise as above: an expert's weight gradient sums both dp ranks' rows
#   in one product under ep and each micro-batch's in its own on one rank, so
#   the weights part in fp32 noise after step 1 and, sooner or later, an FP8
#   rounding flips (measured on 2026-11-25: losses equal on steps 1-10 and
#   1.1e-6 at step 12 with OpenBLAS's Haswell kernels, equal on steps 1-5
#   and 3.6e-5 at step 12 with its Nehalem kernels, within 5.1e-9 on all 12
#   steps with its SkylakeX kernels); resume bit for bit from the
#   checkpointed histories (the experts' rows included).
# - Refused with exit 2: the cuda build refuses fp8.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1
demo_data "$WORK/english"
COMMON=(--set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.eval_interval=0
        --set checkpoint.interval=0 --set train.micro_batch_size=4 --set optimizer.schedule.warmup_steps=2
        --set "train.batch_schedule=[{step: 0, global_batch_size: 8}]")
SHARED=(--set model.moe.shared_expert_intermediate_size=64)

# run NAME NP SETTINGS...: the tiny qwen3_moe on NP ranks.
run() { train_run "$REPO/recipes/tiny/qwen3_moe.yaml" "$@"; }

for variant in routed shared; do
  extra=()
  [[ $variant == shared ]] && extra=("${SHARED[@]}")
  for p in fp32 fp8; do
    run "$variant-$p" 1 --set train.steps=100 --set optimizer.schedule.warmup_steps=10 --set precision=$p "${extra[@]}"
  done
  loss_tracks "$variant: fp8 vs fp32" "$variant-fp32" "$variant-fp8"
done

run shared-delayed 1 --set train.steps=100 --set optimizer.schedule.warmup_steps=10 --set precision=fp8 \
  --set fp8.recipe=delayed "${SHARED[@]}"
loss_tracks "shared: fp8 delayed vs fp32" shared-fp32 shared-delayed

FP8=(--set precision=fp8 --set train.steps=12 "${SHARED[@]}")
DELAYED=(--set precision=fp8 --set fp8.recipe=delayed --set fp8.amax_history_len=4 --set train.steps=12 "${SHARED[@]}")
run one 1 "${FP8[@]}"
if command -v mpirun > /dev/null; then
  for layout in "tp2 2 --set parallel.tp=2" \
                "tp2-etp2-sp 2 --set parallel.tp=2 --set parallel.etp=2 --set parallel.sequence_parallel=true" \
                "cp2 2 --set parallel.cp=2" "dp2 2"; do
    read -r name np settings <<< "$layout"
    # shellcheck disable=SC2086
    run "$name" "$np" "${FP8[@]}" $settings
    near_one_rank "$name" loss 2 1e-6 1e-3
    near_one_rank "$name" grad_norm 1 5e-5 1e-1
  done
  echo "fp8 MoE: tp 2, tp 2 + etp 2 + sp, cp 2 and dp 2 give the one-rank losses (1e-6 on steps 1-2, then FP8 noise)"
  run ep2 2 "${FP8[@]}" --set parallel.ep=2
  near_one_rank ep2 loss 0 0 1e-3
  near_one_rank ep2 grad_norm 0 0 1e-1
  [[ $(json_field "$WORK/one/metrics.jsonl" loss | head -1) != "$(json_field "$WORK/ep2/metrics.jsonl" loss | head -1)" ]] \
    || fail "ep2: step 1's loss is one rank's"
  echo "fp8 MoE: ep 2 matches one rank within FP8 rounding (each expert one scale over both dp ranks' rows)"

  run one_delayed 1 "${DELAYED[@]}"
  for layout in "tp2-etp2-sp 2 --set parallel.tp=2 --set parallel.etp=2 --set parallel.sequence_parallel=true" \
                "cp2 2 --set parallel.cp=2"; do
    read -r name np settings <<< "$layout"
    # shellcheck disable=SC2086
    run "$name-delayed" "$np" "${DELAYED[@]}" $settings
    ONE=one_delayed near_one_rank "$name-delayed" loss 2 1e-6 1e-3
    ONE=one_delayed near_one_rank "$name-delayed" grad_norm 1 5e-5 1e-1
  done
  run ep2-delayed 2 "${DELAYED[@]}" --set parallel.ep=2
  ONE=one_delayed near_one_rank ep2-delayed loss 2 1e-6 1e-3
  ONE=one_delayed near_one_rank ep2-delayed grad_norm 2 1e-6 1e-1
  echo "fp8 MoE delayed: tp 2 + etp 2 + sp, cp 2 and ep 2 give the one-rank losses (1e-6 on steps 1-2, then FP8 noise)"
fi

run straight 1 "${FP8[@]}" --set checkpoint.interval=6
resume_exact straight 6 12
echo "fp8 MoE: resume equals the uninterrupted run bit for bit"

run straight-delayed 1 "${DELAYED[@]}" --set checkpoint.interval=6
"$MEGATRAIN" inspect "$WORK/straight-delayed/checkpoints/iter_0000006" > "$WORK/inspect.txt"
grep -q 'fp8.layers.1.amax_history *\[60, 4\]' "$WORK/inspect.txt" ||
  fail "no expert amax histories (12 + 6 x 8 rows) in the checkpoint"
resume_exact straight-delayed 6 12
echo "fp8 MoE delayed: resume equals the uninterrupted run bit for bit"

if [[ -x "$REPO/build/cuda/megatrain" ]]; then
  MEGATRAIN="$REPO/build/cuda/megatrain" expect_refused "fp8 MoE on cuda" \
    "precision: fp8 runs as the exact CPU emulation only" 1 run "$REPO/recipes/tiny/qwen3_moe.yaml" \
    --set run.dir="$WORK/cuda" "${COMMON[@]}" --set precision=fp8 --set run.device=cuda
else
  echo "no build/cuda/megatrain: the cuda refusal is not checked here"
fi
echo "PASS test_fp8_moe"
