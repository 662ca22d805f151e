#!/usr/bin/env bash
# test_lora.sh: LoRA runs on the CPU (peft:; docs/finetune.md).
#   - init_from a full run's checkpoint: step 1's loss is the full model's,
#     bit for bit (the adapters start with B = 0), and only the adapters change;
#   - checkpoints (checkpoint.frozen_base: auto, the default, which references
#     a base outside any run's checkpoints/): no base tensors, a reference to
#     the init_from checkpoint, the adapters with
#     their moments; 6 steps straight and 3 + `resume` give the same losses
#     bit for bit (async saves); resume with another rank is refused, with
#     another alpha logged; init_from a LoRA checkpoint with another alpha
#     is refused
#     (test_lora_base.sh: the reference, store mode, a missing base);
#   - layouts: tp 2, pp 2, cp 2, dp 2 with the distributed optimizer, and tp 2
#     x pp 2 x dp 2 with sequence parallel and ZeRO-1 (8 ranks) log the
#     single rank's losses, grad norms and eval losses (relative 1e-5), for
#     llama and qwen3 (qk-norm) on tp 2; a checkpoint of tp 2 x dp 2 with
#     ZeRO-1 resumes on one rank with its losses; skipped without mpirun;
#   - bad input is refused with exit 2 naming the key: rank 0, an unknown
#     target module, dropout, a MoE model's MLP (test_lora_moe.sh: its attention), a rank tp does not divide; a CUDA
#     build (when build/cuda/megatrain exists) refuses peft on cuda.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1
demo_data "$WORK/english"
lora_settings "$WORK/english"
losses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$1/metrics.jsonl"; }
run() { "$MEGATRAIN" run "$REPO/recipes/tiny/$1.yaml" --set run.dir="$2" "${COMMON[@]}" "${@:3}"; }

# A full run to start from, then LoRA and full training from its checkpoint.
run llama "$WORK/full" --set train.steps=2 --set checkpoint.interval=2 > /dev/null
cp -r "$WORK/full/checkpoints/iter_0000002" "$WORK/start" # out of its run: no retention deletes it
start="$WORK/start"
run llama "$WORK/lora" "${LORA[@]}" --set init_from="$start" --set train.steps=6 --set checkpoint.interval=3 \
  --set checkpoint.keep_last=2 > "$WORK/lora.log"
grep -q "init_from: the frozen base weights (the LoRA adapters start as initialised) from $start" "$WORK/lora.log" \
  || fail "init_from did not load the frozen base: $(grep init_from "$WORK/lora.log")"
run llama "$WORK/full2" --set init_from="$start" --set train.steps=1 --set checkpoint.interval=0 > /dev/null
[[ "$(losses "$WORK/lora" | head -n 1)" == "$(losses "$WORK/full2" | head -n 1)" ]] \
  || fail "step 1 of LoRA ($(losses "$WORK/lora" | head -n 1)) is not the base model's ($(losses "$WORK/full2" | head -n 1))"
echo "init_from: step 1 of the LoRA run is the base model's loss bit for bit"

# The checkpoint: no base tensor but a reference to the start, moments for the 56 adapters only (4 layers x 7
# targets x A, B).
"$MEGATRAIN" inspect "$WORK/lora/checkpoints/iter_0000006" > "$WORK/inspect.log"
adapters=$(grep -cE '^ *layers\.[0-9]+\.(attn|mlp)\.[a-z_]+\.lora_[AB]\.weight ' "$WORK/inspect.log" || true)
m=$(grep -c '^ *optimizer\.m\.' "$WORK/inspect.log" || true)
m_adapters=$(grep -cE '^ *optimizer\.m\.layers\.[0-9]+\.[a-z]+\.[a-z_]+\.lora_[AB]\.weight ' "$WORK/inspect.log" || true)
! grep -qE '^ *(embed\.weight|layers\.3\.mlp\.down_proj\.weight) ' "$WORK/inspect.log" \
  || fail "the checkpoint stores base weights: $(head -n 20 "$WORK/inspect.log")"
grep -qF "frozen base: not stored here, referenced: $(realpath "$start") " "$WORK/inspect.log" \
  || fail "the checkpoint does not reference the start: $(head -n 5 "$WORK/inspect.log")"
[[ $adapters -eq 56 && $m -eq 56 && $m_adapters -eq 56 ]] \
  || fail "expected 56 adapters with 56 optimizer.m tensors, found $adapters and $m ($m_adapters of adapters)"
echo "checkpoint: a reference to the base, 56 adapters with their moments"
# the base did not move: a full conversion of the LoRA checkpoint's base equals the start's
"$MEGATRAIN" convert "$start" "$WORK/start.hf" > /dev/null
"$MEGATRAIN" convert "$WORK/lora/checkpoints/iter_0000006" "$WORK/merged.hf" --merge-lora > "$WORK/merge.log"
grep -q "to Hugging Face $WORK/merged.hf (float32), its LoRA adapters (rank 4, alpha 8) merged into the weights" \
  "$WORK/merge.log" || fail "the merge's line does not say the adapters were merged: $(cat "$WORK/merge.log")"
"$MEGATRAIN" convert "$WORK/lora/checkpoints/iter_0000006" "$WORK/adapter" > /dev/null
[[ -s "$WORK/adapter/adapter_model.safetensors" && -s "$WORK/adapter/adapter_config.json" ]] \
  || fail "convert did not write the PEFT adapter"
grep -q '"peft_type": "LORA"' "$WORK/adapter/adapter_config.json" || fail "adapter_config.json: no peft_type LORA"
# --base-model: the Hugging Face directory of the base is written for AutoPeftModelForCausalLM; a megatrain
# checkpoint (which PEFT cannot load) or a model of another shape is refused, and DST is not made
"$MEGATRAIN" convert "$WORK/lora/checkpoints/iter_0000006" "$WORK/adapter-auto" --base-model "$WORK/start.hf" \
  > "$WORK/auto.log" || fail "convert --base-model with the base's Hugging Face directory failed"
grep -q "AutoPeftModelForCausalLM.from_pretrained(\"$WORK/adapter-auto\"), which loads the base $WORK/start.hf" \
  "$WORK/auto.log" || fail "convert --base-model: the log does not say how to load it: $(cat "$WORK/auto.log")"
base_refused() { # NAME BASE PATTERN [STATUS: 1, a path that is no base; 2, a path not there (usage)]
  set +e; "$MEGATRAIN" convert "$WORK/lora/checkpoints/iter_0000006" "$WORK/$1" --base-model "$2" > "$WORK/$1.log" 2>&1
  local rc=$? want=${4:-1}; set -e
  [[ $rc -eq $want && ! -e "$WORK/$1" ]] && grep -q -- "$3" "$WORK/$1.log" ||
    fail "convert --base-model $2: expected exit $want saying '$3', got $rc: $(cat "$WORK/$1.log")"
}
base_refused ckpt-base "$start" "a megatrain checkpoint; PEFT loads the base from a Hugging Face directory"
base_refused other-base "$REPO/tests/fixtures/hf/llama_tied" "not the model the adapters were trained on (model\.[a-z_]* is"
# a path that is not there, or a file, is refused (they were written into adapter_config.json, which PEFT then could
# not load); a name that is no path here is a Hub id, written as is
base_refused missing-base "$WORK/no-such-model" "--base-model $WORK/no-such-model: No such file or directory; expected the Hugging Face directory" 2
base_refused dot-base ./no-such-model "--base-model ./no-such-model: No such file or directory" 2
base_refused file-base "$WORK/start.hf/config.json" "--base-model $WORK/start.hf/config.json: a file, not a directory" 2
"$MEGATRAIN" convert "$WORK/lora/checkpoints/iter_0000006" "$WORK/adapter-hub" --base-model org/no-such-model > /dev/null
grep -q '"base_model_name_or_path": "org/no-such-model"' "$WORK/adapter-hub/adapter_config.json" ||
  fail "a Hub name was not written as is: $(cat "$WORK/adapter-hub/adapter_config.json")"
echo "convert --base-model: the base's Hugging Face directory taken; a checkpoint or another model refused"
! cmp -s "$WORK/start.hf/model.safetensors" "$WORK/merged.hf/model.safetensors" \
  || fail "the merged model equals the base: the adapters learned nothing"

# Bit-exact resume: 3 steps, then resume to 6.
run llama "$WORK/resumed" "${LORA[@]}" --set init_from="$start" --set train.steps=3 --set checkpoint.interval=3 > /dev/null
"$MEGATRAIN" resume "$WORK/resumed" --set train.steps=6 > "$WORK/resume.log" 2>&1 \
  || fail "resume failed: $(tail -n 3 "$WORK/resume.log")"
diff <(losses "$WORK/lora") <(losses "$WORK/resumed") > "$WORK/diff.txt" \
  || fail "resumed losses differ: $(head -n 4 "$WORK/diff.txt")"
echo "resume: steps 4-6 identical to the straight run"
expect_refused "resume with another rank" "peft.rank is 4 in the checkpoint but 8 in the recipe; a run cannot be resumed with other adapters" 1 \
  resume "$WORK/resumed" --set train.steps=8 --set peft.rank=8
# alpha may change on resume (it rescales the trained adapters' contribution, as rope_theta may change): logged
"$MEGATRAIN" resume "$WORK/resumed" --set train.steps=7 --set peft.alpha=16 > "$WORK/resume-alpha.log" 2>&1 \
  || fail "resume with another alpha failed: $(tail -n 3 "$WORK/resume-alpha.log")"
grep -q "peft.alpha 8 -> 16" "$WORK/resume-alpha.log" || fail "resume did not log the alpha change"
echo "resume: another peft.alpha is taken and logged"

# Layouts against one rank.
if command -v mpirun > /dev/null; then
  for family in llama qwen3; do
    run $family "$WORK/$family-1" "${LORA[@]}" --set train.steps=5 --set checkpoint.interval=0 > /dev/null
    layouts=("2:--set parallel.tp=2")
    [[ $family == llama ]] && layouts+=("2:--set parallel.pp=2" "2:--set parallel.cp=2"
      "2:--set parallel.distributed_optimizer=true"
      "8:--set parallel.tp=2 --set parallel.pp=2 --set parallel.sequence_parallel=true --set parallel.distributed_optimizer=true")
    for layout in "${layouts[@]}"; do
      IFS=: read -r np settings <<< "$layout"
      name="$family-np$np-$(echo "$settings" | tr -dc 'a-z0-9=')"
      # shellcheck disable=SC2086
      timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$np" "$MEGATRAIN" run "$REPO/recipes/tiny/$family.yaml" \
        --set run.dir="$WORK/$name" "${COMMON[@]}" "${LORA[@]}" --set train.steps=5 --set checkpoint.interval=0 \
        $settings > "$WORK/$name.log" 2>&1 || { tail -n 20 "$WORK/$name.log"; fail "$family $settings: the run failed"; }
      for field in loss grad_norm eval_loss; do
        compare $field "$WORK/$family-1/metrics.jsonl" "$WORK/$name/metrics.jsonl" \
          || fail "$family $settings: $field differs from one rank"
      done
      echo "$family on $np ranks ($settings): the single rank's losses"
    done
  done
  # A checkpoint of tp 2 x dp 2 with ZeRO-1 (the adapters' moments sharded) resumes on one rank.
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np 4 "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" \
    --set run.dir="$WORK/zero1" "${COMMON[@]}" "${LORA[@]}" --set train.steps=3 --set checkpoint.interval=3 \
    --set parallel.tp=2 --set parallel.distributed_optimizer=true > "$WORK/zero1.log" 2>&1 \
    || { tail -n 20 "$WORK/zero1.log"; fail "tp 2 x dp 2 with ZeRO-1: the run failed"; }
  "$MEGATRAIN" resume "$WORK/zero1" --set train.steps=5 --set parallel.tp=1 --set parallel.distributed_optimizer=false \
    > "$WORK/zero1-resume.log" 2>&1 || fail "resume on one rank: $(tail -n 3 "$WORK/zero1-resume.log")"
  compare loss "$WORK/llama-1/metrics.jsonl" "$WORK/zero1/metrics.jsonl" || fail "resumed on one rank: losses differ"
  echo "a tp 2 x dp 2 ZeRO-1 checkpoint resumes on one rank with its losses"
else
  echo "no mpirun: layouts not checked"
fi

# Bad input.
expect_refused "rank 0" "peft.rank: expected a positive integer, found '0'" 1 \
  plan "$REPO/recipes/tiny/llama.yaml" --set "peft={type: lora, rank: 0, alpha: 8}"
expect_refused "an unknown target module" "peft.target_modules: item 1: 'qkv_proj' is not a layer LoRA adapts" 1 \
  plan "$REPO/recipes/tiny/llama.yaml" --set "peft={type: lora, rank: 4, alpha: 8, target_modules: [q_proj, qkv_proj]}"
expect_refused "dropout" "peft.dropout: expected 0: LoRA dropout is not implemented yet, found 0.05" 1 \
  plan "$REPO/recipes/tiny/llama.yaml" --set "peft={type: lora, rank: 4, alpha: 8, dropout: 0.05}"
expect_refused "LoRA on MoE's experts" "peft.target_modules: gate_proj: on a mixture-of-experts model (model.family \
mixtral) LoRA adapts the attention projections only" 1 \
  plan "$REPO/recipes/tiny/mixtral.yaml" --set "peft={type: lora, rank: 4, alpha: 8, target_modules: all-linear}"
expect_refused "a rank tp does not divide" "peft.rank: expected a multiple of parallel.tp (2)" 1 \
  plan "$REPO/recipes/tiny/llama.yaml" --set "peft={type: lora, rank: 3, alpha: 8}" --set parallel.tp=2
# peft.type none with adapter settings: trains every parameter, and says the settings are not used
"$MEGATRAIN" plan "$REPO/recipes/tiny/llama.yaml" --set "peft={type: none, rank: 4, alpha: 8}" > "$WORK/none.log" 2>&1
run llama "$WORK/none" --set train.steps=1 --set "peft={type: none, rank: 4, alpha: 8}" > "$WORK/none.log" 2>&1 ||
  fail "peft.type none with a rank: $(tail -n 3 "$WORK/none.log")"
grep -q "warning: peft.type: none trains every parameter: the peft: section's rank, alpha and target_modules are not \
used" "$WORK/none.log" || fail "peft.type none with a rank: no warning: $(head -n 5 "$WORK/none.log")"
expect_refused "init_from LoRA without peft" "the checkpoint has LoRA adapters but the recipe has no peft: section; to train them on, give the recipe the \
checkpoint's, peft: {type: lora, rank: 4, alpha: 8, target_modules: \[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, \
down_proj\]}" 1 \
  run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/no-peft" "${COMMON[@]}" --set train.steps=1 \
  --set init_from="$WORK/lora/checkpoints/iter_0000006"
expect_refused "init_from LoRA with another alpha" "peft.alpha is 8 in the checkpoint but 16 in the recipe; the recipe's peft: must match the checkpoint's, peft: \
{type: lora, rank: 4, alpha: 8, target_modules: \[q_proj, " 1 \
  run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/other-alpha" "${COMMON[@]}" --set train.steps=1 \
  --set "peft={type: lora, rank: 4, alpha: 16}" --set init_from="$WORK/lora/checkpoints/iter_0000006" \
  --set "data.train=[$WORK/no-such-data]" # said before any data is read
if [[ -x "$REPO/build/cuda/megatrain" ]]; then
  MEGATRAIN="$REPO/build/cuda/megatrain" expect_refused "peft on cuda" "peft: LoRA is not implemented on GPUs yet" 1 \
    run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/cuda" "${COMMON[@]}" "${LORA[@]}" --set run.device=cuda \
    --set precision=bf16 --set train.steps=1
else
  echo "no build/cuda/megatrain: the cuda refusal is not checked here"
fi
