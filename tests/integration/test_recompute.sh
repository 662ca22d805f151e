#!/usr/bin/env bash
# test_recompute.sh: train.recompute on the CPU. A tiny recipe trained with
# selective and full recomputation logs the losses, grad norms (and MoE
# statistics) of recompute none exactly (the same digits, not a tolerance):
# on one rank, and under mpirun with tp 2 + sequence parallel, cp 2, pp 2
# with vpp 2, and a MoE recipe on ep 2 (expert_bias, capacity dropping,
# z-loss; its aux loss, imbalance and drop rate too). A run with recompute
# resumed from its checkpoint continues as the uninterrupted one. An unknown mode is refused (the GPU's recompute:
# tests/gpu/test_cuda_recompute.sh). Layouts skip without mpirun.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1
demo_data "$WORK/english"
COMMON=(--set train.steps=4 --set logging.interval=1 --set train.micro_batch_size=2 --set model.num_layers=4
        --set "train.batch_schedule=[{step: 0, global_batch_size: 4}]" --set train.seq_len=32
        --set checkpoint.interval=2 --set train.eval_interval=0 --set optimizer.schedule.warmup_steps=1
        --set "data.train=[{path: $WORK/english, weight: 1.0}]")

# same FIELDS A B: the values of each field are the same strings, line by line, and there are some.
same() {
  local a=$1 b=$2 field
  shift 2
  for field in "$@"; do
    [[ -n $(json_field "$a" "$field") ]] || fail "$a: no $field values"
    diff <(json_field "$a" "$field") <(json_field "$b" "$field") > /dev/null || fail "$b: $field differs from $a"
  done
}

# train NAME NP RECIPE MODE [SETTINGS...]: a run of NP ranks (1: no mpirun) into $WORK/NAME-MODE.
train() {
  local name=$1 np=$2 recipe=$3 mode=$4
  shift 4
  local launch=("$MEGATRAIN")
  (( np > 1 )) && launch=(timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$np" "$MEGATRAIN")
  "${launch[@]}" run "$REPO/recipes/tiny/$recipe.yaml" --set run.dir="$WORK/$name-$mode" "${COMMON[@]}" \
    --set train.recompute="$mode" "$@" > "$WORK/$name-$mode.log" 2>&1 \
    || { tail -20 "$WORK/$name-$mode.log"; fail "$name with recompute $mode: the run failed"; }
}

# layout NAME NP RECIPE FIELDS SETTINGS...: none, selective and full give the same FIELDS.
layout() {
  local name=$1 np=$2 recipe=$3 fields=$4
  shift 4
  for mode in none selective full; do train "$name" "$np" "$recipe" $mode "$@"; done
  for mode in selective full; do
    # shellcheck disable=SC2086
    same "$WORK/$name-none/metrics.jsonl" "$WORK/$name-$mode/metrics.jsonl" $fields
  done
  echo "$name: selective and full log none's $fields exactly"
}

layout one-rank 1 qwen3 "loss grad_norm"
grep -q "recompute: full" "$WORK/one-rank-full/recipe.yaml" || fail "the resolved recipe does not record train.recompute"

# Resume with recompute: the run saved at step 2 continues as the uninterrupted one.
"$MEGATRAIN" resume "$WORK/one-rank-full/checkpoints/iter_0000002" --set run.dir="$WORK/resumed" > "$WORK/resumed.log" 2>&1 \
  || { tail -20 "$WORK/resumed.log"; fail "resume with recompute full failed"; }
for field in step loss grad_norm; do
  diff <(json_field "$WORK/one-rank-full/metrics.jsonl" $field | tail -n +3) \
       <(json_field "$WORK/resumed/metrics.jsonl" $field) > /dev/null \
    || fail "resume: $field of the resumed run differs from the uninterrupted one"
done
echo "resume with recompute full continues bit for bit"

MOE=(--set model.num_layers=2 --set model.moe.load_balancing=expert_bias --set model.moe.bias_update_rate=0.01
     --set model.moe.score_function=sigmoid --set model.moe.capacity_factor=1.0 --set model.moe.z_loss_coeff=0.01)
if command -v mpirun > /dev/null; then
  layout tp2-sp 2 llama "loss grad_norm" --set parallel.tp=2 --set parallel.sequence_parallel=true
  layout cp2 2 qwen3 "loss grad_norm" --set parallel.cp=2
  layout pp2-vpp2 2 llama "loss grad_norm" --set parallel.pp=2 --set parallel.vpp=2
  layout moe-ep2 2 qwen3_moe "loss grad_norm moe_aux_loss moe_imbalance moe_drop_rate" "${MOE[@]}" --set parallel.ep=2
  json_field "$WORK/moe-ep2-none/metrics.jsonl" moe_drop_rate | grep -qv "^0$" || fail "moe-ep2: no token was dropped (the drop count is not tested)"
else
  echo "mpirun not found: the parallel layouts are skipped"
fi

expect_refused "an unknown mode" "train.recompute" 2 \
  run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/bad" "${COMMON[@]}" --set train.recompute=some
