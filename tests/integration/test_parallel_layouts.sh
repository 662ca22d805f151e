#!/usr/bin/env bash
# test_parallel_layouts.sh: every layout among tp in {1,2}, pp in {1,2} (and
# pp 2 with vpp 2), dp in {1,2} and cp in {1,2}, with and without sequence
# parallel (tp 2) and the distributed optimizer (dp 2), on up to 8 ranks under
# mpirun on the CPU (53 layouts), trains the single-rank losses and grad norms for 10 steps
# (relative error < 1e-5), each with one of tiny llama, qwen2 (biases) and qwen3 (qk-norm,
# tied embeddings: the embedding group): the family whose number is the sum of the layout's choices
# (tp - 1, pp 1 / 2 / 2 with vpp 2 as 0 / 1 / 2, dp - 1, cp - 1, sp, zero) mod 3, so that each family
# meets every pair of choices the grid has (tp 2 with cp 2, sp with zero, ...; checked at the end), in a
# third of the launches that every family on every layout takes (MT_LAYOUTS_ALL=1: all three on each, 159
# runs; most of a launch is eight processes starting, not the ten steps); then uneven stages from
# parallel.pp_layers, and an evaluation long enough for the pipeline to run
# it in several rounds. Only rank 0 logs. Skips without mpirun.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
command -v mpirun > /dev/null || { echo "mpirun not found"; exit 77; }
export OMP_NUM_THREADS=1
demo_data "$WORK/english"
COMMON=(--set train.steps=10 --set logging.interval=1 --set train.micro_batch_size=2 --set model.num_layers=4
        --set "train.batch_schedule=[{step: 0, global_batch_size: 8}]" --set optimizer.schedule.warmup_steps=3
        --set checkpoint.interval=0 --set train.eval_interval=5 --set train.eval_batches=3
        --set "data.train=[{path: $WORK/english, weight: 1.0}]")

FAMILIES=(llama qwen2 qwen3)
family_extra() { [[ $1 != qwen3 ]] || echo "--set model.tie_word_embeddings=true"; }
for family in "${FAMILIES[@]}"; do
  base="$WORK/$family-base"
  read -ra extra <<< "$(family_extra $family)"
  "$MEGATRAIN" run "$REPO/recipes/tiny/$family.yaml" --set run.dir="$base" "${COMMON[@]}" "${extra[@]}" > "$base.log"
done
runs=0
declare -A grid_pairs=() family_pairs=()  # "tp=2 cp=2" the grid has; "qwen3 tp=2 cp=2" a family ran
for tp in 1 2; do for pp in 1 2 2v; do for dp in 1 2; do for cp in 1 2; do
  for sp in false true; do for zero in false true; do
    [[ $sp == true && $tp == 1 ]] && continue
    [[ $zero == true && $dp == 1 ]] && continue
    vpp=1; p=$pp
    [[ $pp == 2v ]] && { p=2; vpp=2; }
    np=$((tp * p * dp * cp))
    (( np > 1 )) || continue
    choices=("tp=$tp" "pp=$pp" "dp=$dp" "cp=$cp" "sp=$sp" "zero=$zero")
    pick=$((tp - 1 + dp - 1 + cp - 1))  # the family: the sum of the choices' numbers, mod 3
    case $pp in 2) pick=$((pick + 1)) ;; 2v) pick=$((pick + 2)) ;; esac
    [[ $sp == false ]] || pick=$((pick + 1))
    [[ $zero == false ]] || pick=$((pick + 1))
    families=("${FAMILIES[$((pick % 3))]}")
    [[ ${MT_LAYOUTS_ALL:-0} == 1 ]] && families=("${FAMILIES[@]}")
    for ((i = 0; i < 6; i++)); do for ((j = i + 1; j < 6; j++)); do
      grid_pairs["${choices[i]} ${choices[j]}"]=1
      for family in "${families[@]}"; do family_pairs["$family ${choices[i]} ${choices[j]}"]=1; done
    done; done
    for family in "${families[@]}"; do
      base="$WORK/$family-base"
      read -ra extra <<< "$(family_extra $family)"
      name="$family-tp$tp-pp$pp-dp$dp-cp$cp-sp$sp-zero$zero"
      timeout 120 mpirun --allow-run-as-root --oversubscribe -np $np "$MEGATRAIN" run \
        "$REPO/recipes/tiny/$family.yaml" --set run.dir="$WORK/$name" "${COMMON[@]}" "${extra[@]}" \
        --set parallel.tp=$tp --set parallel.pp=$p --set parallel.vpp=$vpp --set parallel.cp=$cp \
        --set parallel.sequence_parallel=$sp --set parallel.distributed_optimizer=$zero \
        > "$WORK/$name.log" 2>&1 || { tail -20 "$WORK/$name.log"; fail "$name: the run failed"; }
      [[ $(grep -c '^step ' "$WORK/$name.log") -eq 10 ]] || fail "$name: expected 10 step lines (rank 0 only)"
      for field in loss grad_norm eval_loss; do
        compare $field "$base/metrics.jsonl" "$WORK/$name/metrics.jsonl" || fail "$name: $field differs from one rank"
      done
      runs=$((runs + 1))
      rm -rf "$WORK/$name"
    done
  done; done
done; done; done; done
for pair in "${!grid_pairs[@]}"; do
  for family in "${FAMILIES[@]}"; do
    [[ -n ${family_pairs["$family $pair"]:-} ]] || fail "$family never ran with $pair: the families' rotation misses a pair"
  done
done
echo "$runs runs: every layout matches the single rank, each family with every pair of choices (${#grid_pairs[@]})"

# Uneven stages from parallel.pp_layers (a chunk may hold no layer).
for layout in "2:--set parallel.pp=2 --set parallel.pp_layers=[1,3]" \
              "4:--set parallel.tp=2 --set parallel.pp=2 --set parallel.vpp=2 --set parallel.pp_layers=[0,2,1,1]"; do
  IFS=: read -r np settings <<< "$layout"
  name="llama-pp_layers-$np"
  # shellcheck disable=SC2086
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$np" "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" \
    --set run.dir="$WORK/$name" "${COMMON[@]}" $settings > "$WORK/$name.log" 2>&1 \
    || { tail -20 "$WORK/$name.log"; fail "$name: the run failed"; }
  for field in loss grad_norm eval_loss; do
    compare $field "$WORK/llama-base/metrics.jsonl" "$WORK/$name/metrics.jsonl" || fail "$name: $field differs"
  done
  runs=$((runs + 1))
done
echo "$runs layouts match"

# A pipeline evaluates in rounds of 8 x pp micro-batches (a signal is looked for between them): 37 batches at
# pp 2 x vpp 2 are rounds of 16, 16 and 5, and give the single rank's eval_loss.
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/eval-rounds-1" "${COMMON[@]}" \
  --set train.eval_batches=37 > "$WORK/eval-rounds-1.log" 2>&1 || fail "eval rounds: the one-rank run failed"
timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" \
  --set run.dir="$WORK/eval-rounds-pp" "${COMMON[@]}" --set train.eval_batches=37 --set parallel.pp=2 \
  --set parallel.vpp=2 > "$WORK/eval-rounds-pp.log" 2>&1 || { tail -20 "$WORK/eval-rounds-pp.log"; fail "eval rounds: pp 2 failed"; }
compare eval_loss "$WORK/eval-rounds-1/metrics.jsonl" "$WORK/eval-rounds-pp/metrics.jsonl" \
  || fail "eval rounds: pp 2 x vpp 2's eval_loss over 37 batches differs from one rank"
echo "37 evaluation batches in pipeline rounds: the single rank's eval_loss"

# The interleaved schedule needs the micro-batches per step to be a multiple
# of pp: refused at start with exit 2, naming the key (mbs 8: one micro-batch).
expect_refused "vpp 2 with one micro-batch per step" \
  "global_batch_size: the interleaved schedule (vpp 2) needs the micro-batches per step" 2 \
  run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/vpp-bad" "${COMMON[@]}" --set parallel.pp=2 \
  --set parallel.vpp=2 --set train.micro_batch_size=8
