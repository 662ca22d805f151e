#!/usr/bin/env bash
# test_lora_moe.sh: LoRA on the mixture-of-experts families (peft: on the attention projections; the routed and
# shared experts and the router frozen with the rest of the base; docs/finetune.md).
#   - init_from a full run's checkpoint: step 1's loss is the full model's, bit for bit, for mixtral and qwen3_moe;
#   - the checkpoint holds the attention adapters and their moments alone, a reference to the base; 6 steps
#     straight and 3 + `resume` give the same losses bit for bit;
#   - layouts: ep 2, tp 2 (with etp 2 for qwen3_moe), pp 2, cp 2, dp 2 with ZeRO-1, and ep 2 x dp 2 log the single
#     rank's losses, grad norms and eval losses (relative 1e-5); skipped without mpirun;
#   - refused with exit 2 naming the key: MLP targets (the experts have no adapters), load_balancing expert_bias;
#     without target_modules the attention projections are adapted.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1
demo_data "$WORK/english"
lora_settings "$WORK/english"
ATTN=(--set "peft={type: lora, rank: 4, alpha: 8, target_modules: [q_proj, k_proj, v_proj, o_proj]}")
losses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$1/metrics.jsonl"; }
run() { "$MEGATRAIN" run "$REPO/recipes/tiny/$1.yaml" --set run.dir="$2" "${COMMON[@]}" "${@:3}"; }

for family in mixtral qwen3_moe; do
  run "$family" "$WORK/$family-full" --set train.steps=2 --set checkpoint.interval=2 > /dev/null
  cp -r "$WORK/$family-full/checkpoints/iter_0000002" "$WORK/$family-start"
  start="$WORK/$family-start"
  run "$family" "$WORK/$family-lora" "${ATTN[@]}" --set init_from="$start" --set train.steps=6 \
    --set checkpoint.interval=3 --set checkpoint.keep_last=2 > "$WORK/$family-lora.log"
  run "$family" "$WORK/$family-full2" --set init_from="$start" --set train.steps=1 --set checkpoint.interval=0 > /dev/null
  [[ "$(losses "$WORK/$family-lora" | head -n 1)" == "$(losses "$WORK/$family-full2" | head -n 1)" ]] \
    || fail "$family: step 1 of LoRA ($(losses "$WORK/$family-lora" | head -n 1)) is not the base model's"
  # the adapters train: the loss moves from the base's
  [[ "$(json_field "$WORK/$family-lora/metrics.jsonl" loss | tail -n 1)" != \
     "$(json_field "$WORK/$family-lora/metrics.jsonl" loss | head -n 1)" ]] || fail "$family: the loss never moved"
  # the checkpoint: 4 layers x 4 targets x A, B, their moments, no base tensor (experts, router) but a reference
  "$MEGATRAIN" inspect "$WORK/$family-lora/checkpoints/iter_0000006" > "$WORK/$family-inspect.log"
  adapters=$(grep -cE '^ *layers\.[0-9]+\.attn\.[a-z]_proj\.lora_[AB]\.weight ' "$WORK/$family-inspect.log" || true)
  m=$(grep -c '^ *optimizer\.m\.' "$WORK/$family-inspect.log" || true)
  [[ $adapters -eq 32 && $m -eq 32 ]] || fail "$family: expected 32 adapters and 32 moments, found $adapters and $m"
  ! grep -qE '^ *layers\.[0-9]+\.mlp\.' "$WORK/$family-inspect.log" || fail "$family: the checkpoint stores MLP tensors"
  grep -qF "frozen base: not stored here, referenced: $(realpath "$start") " "$WORK/$family-inspect.log" \
    || fail "$family: the checkpoint does not reference the start"
  # resume: 3 + 3 steps are the 6 straight ones
  run "$family" "$WORK/$family-half" "${ATTN[@]}" --set init_from="$start" --set train.steps=3 \
    --set checkpoint.interval=3 > /dev/null
  "$MEGATRAIN" resume "$WORK/$family-half" --set train.steps=6 > /dev/null
  [[ "$(losses "$WORK/$family-half")" == "$(losses "$WORK/$family-lora")" ]] || fail "$family: resume differs"
  echo "$family: step 1 is the base's, 32 attention adapters in the checkpoint with a reference to the base, resume exact"
  # plan's checkpoint size: the adapters alone (12 bytes each), the base referenced
  "$MEGATRAIN" plan "$REPO/recipes/tiny/$family.yaml" "${COMMON[@]}" "${ATTN[@]}" --set init_from="$start" \
    > "$WORK/$family-plan.out"
  trainable=$(grep -o '[0-9.]*K trainable' "$WORK/$family-plan.out" | grep -o '^[0-9.]*')
  grep -q "^checkpoint: $(awk -v k="$trainable" 'BEGIN { printf "%.2f", k * 1000 * 12 / 1048576 }') MiB each before zstd \
(fp32 weights of the adapters: the frozen base referenced" "$WORK/$family-plan.out" || fail "$family: plan: $(cat "$WORK/$family-plan.out")"
done

if command -v mpirun > /dev/null; then
  for family in mixtral qwen3_moe; do
    start="$WORK/$family-start"
    run "$family" "$WORK/$family-1" "${ATTN[@]}" --set init_from="$start" --set train.steps=6 \
      --set checkpoint.interval=0 > /dev/null
    etp=(); [[ $family == qwen3_moe ]] && etp=(--set parallel.etp=2)
    for layout in "ep2 2 --set parallel.ep=2" "tp2 2 --set parallel.tp=2 ${etp[*]}" "pp2 2 --set parallel.pp=2" \
                  "cp2 2 --set parallel.cp=2" "dp2-zero1 2 --set parallel.distributed_optimizer=true" \
                  "ep2dp2 4 --set parallel.ep=2"; do
      read -r name np settings <<< "$layout"
      # shellcheck disable=SC2086
      timeout 300 mpirun --allow-run-as-root --oversubscribe -np "$np" "$MEGATRAIN" run \
        "$REPO/recipes/tiny/$family.yaml" --set run.dir="$WORK/$family-$name" "${COMMON[@]}" "${ATTN[@]}" \
        --set init_from="$start" --set train.steps=6 --set checkpoint.interval=0 $settings \
        > "$WORK/$family-$name.log" 2>&1 || { tail -n 5 "$WORK/$family-$name.log"; fail "$family $name: the run failed"; }
      for field in loss grad_norm eval_loss; do
        compare "$field" "$WORK/$family-1/metrics.jsonl" "$WORK/$family-$name/metrics.jsonl" \
          || fail "$family $name: $field differs from one rank"
      done
    done
    echo "$family: ep 2, tp 2, pp 2, cp 2, dp 2 with ZeRO-1 and ep 2 x dp 2 give the one-rank losses"
  done
else
  echo "no mpirun: layouts not checked"
fi

# refused: MLP targets (the experts have no adapters), expert_bias (the biases would move in the frozen base)
expect_refused() {
  local what=$1 message=$2 status=0
  shift 2
  "$MEGATRAIN" "$@" > "$WORK/refused.log" 2>&1 || status=$?
  [[ $status -eq 2 ]] && grep -qF -- "$message" "$WORK/refused.log" || fail "$what: exit $status: $(cat "$WORK/refused.log")"
}
expect_refused "MLP targets" "peft.target_modules: up_proj: on a mixture-of-experts model (model.family mixtral) LoRA \
adapts the attention projections only (q_proj, k_proj, v_proj, o_proj, the default there): the routed experts have no \
adapters" plan "$REPO/recipes/tiny/mixtral.yaml" --set "peft={type: lora, rank: 4, alpha: 8, target_modules: [q_proj, up_proj]}"
# without target_modules a MoE model's LoRA adapts its four attention projections
"$MEGATRAIN" plan "$REPO/recipes/tiny/qwen3_moe.yaml" --set "peft={type: lora, rank: 4, alpha: 8}" > "$WORK/default.out"
grep -q "^peft: LoRA rank 4, alpha 8 on 4 linear layer(s) per layer" "$WORK/default.out" || fail "default targets: $(cat "$WORK/default.out")"
expect_refused "expert_bias" "LoRA on a mixture-of-experts model with load_balancing expert_bias" \
  plan "$REPO/recipes/tiny/qwen3_moe.yaml" "${ATTN[@]}" --set model.moe.load_balancing=expert_bias
echo "refused: MLP targets, expert_bias"
