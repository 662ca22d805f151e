#!/usr/bin/env bash
# test_moe_init_from.sh: init_from a MoE checkpoint (as from a converted
# Hugging Face Qwen3-MoE or Mixtral) into a recipe whose routing differs.
#  - expert-bias balancing added to a model trained without it: the biases
#    start at zero (said once), so the first loss is the one the same recipe
#    with the checkpoint's aux_loss gives, bit for bit; said under pp 2 too,
#    where rank 0's stage holds no MoE layer;
#    A coefficient of the auxiliary loss, which expert_bias does not use, and
#    a model convert cannot export (expert biases) are warned of;
#  - routers trained with expert biases into a recipe without them, and a
#    recipe whose top-k, renormalisation, score function or MoE layers differ
#    from the checkpoint's: refused, exit 2, the key named; a resume that adds
#    or drops the biases: refused, exit 2, saying what can (and nothing of
#    what its --set changes); a resume's --set of aux_loss_coeff is said to
#    change only the router's gradient;
#  - a MoE family with no MoE layer logs no imbalance (it printed nan).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1
demo_data "$WORK/english"
run() {
  local dir=$1; shift
  "$MEGATRAIN" run "$REPO/recipes/tiny/qwen3_moe.yaml" --set run.dir="$dir" --set train.steps=1 \
    --set train.seq_len=32 --set train.micro_batch_size=2 --set "train.batch_schedule=[{step: 0, global_batch_size: 2}]" \
    --set optimizer.schedule.warmup_steps=0 --set train.eval_interval=0 --set logging.interval=1 \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]" "$@"
}
first_loss() { json_field "$1/metrics.jsonl" loss | head -n 1; }

run "$WORK/base" > "$WORK/base.log" 2>&1                 # load_balancing: aux_loss
! grep -q "warning" "$WORK/base.log" || fail "warnings for tiny qwen3_moe: $(grep warning "$WORK/base.log")"
run "$WORK/aux" --set init_from="$WORK/base" > /dev/null
run "$WORK/bias" --set init_from="$WORK/base" --set model.moe.load_balancing=expert_bias \
  --set model.moe.aux_loss_coeff=0.001 > "$WORK/bias.log" 2>&1
grep -qF "model.moe.aux_loss_coeff (0.001) weighs the auxiliary load-balancing loss; load_balancing: expert_bias has none" \
  "$WORK/bias.log" || fail "no line that aux_loss_coeff is not used: $(grep aux_loss "$WORK/bias.log")"
grep -q "warning: model.moe.aux_loss_coeff" "$WORK/bias.log" && fail "the unused aux_loss_coeff is a warning (a converted model's comes from its config.json)"
grep -qF "warning: this model has no Hugging Face counterpart: transformers' Qwen3MoeForCausalLM has no expert biases (model.moe.load_balancing: expert_bias), so \`megatrain convert\` exports its checkpoints only with --drop-expert-bias" \
  "$WORK/bias.log" || fail "no warning that the model cannot be exported: $(grep warning "$WORK/bias.log")"
grep -q "^init_from: .* has no expert biases .*: the routers' biases start at zero" "$WORK/bias.log" ||
  fail "no line saying the expert biases start at zero: $(grep init_from "$WORK/bias.log")"
a=$(first_loss "$WORK/aux") b=$(first_loss "$WORK/bias")
[[ -n "$a" && "$a" == "$b" ]] || fail "init_from with expert biases added: first loss $b, with the checkpoint's aux_loss $a"
# pp 2 with the MoE layer on the second stage only: rank 0 holds no bias, and still says they start at zero
if command -v mpirun > /dev/null; then
  run "$WORK/base01" --set "model.moe.layer_freq=[0, 1]" > /dev/null
  timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$MEGATRAIN" run "$REPO/recipes/tiny/qwen3_moe.yaml" \
    --set run.dir="$WORK/pp2" --set train.steps=1 --set train.seq_len=32 --set train.micro_batch_size=2 \
    --set "train.batch_schedule=[{step: 0, global_batch_size: 2}]" --set optimizer.schedule.warmup_steps=1 \
    --set train.eval_interval=0 --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set parallel.pp=2 \
    --set "model.moe.layer_freq=[0, 1]" --set init_from="$WORK/base01" --set model.moe.load_balancing=expert_bias \
    > "$WORK/pp2.log" 2>&1 || fail "pp 2: $(tail -n 3 "$WORK/pp2.log")"
  grep -q "^init_from: .* has no expert biases .*: the routers' biases start at zero" "$WORK/pp2.log" ||
    fail "pp 2, the biases on stage 1 only: no line saying they start at zero: $(grep init_from "$WORK/pp2.log")"
fi


# (a MoE family whose layers are all dense logs no expert imbalance and no auxiliary loss, not nan; a run with
# expert_bias and no z-loss trains no auxiliary loss: no aux column either, where it printed aux 0.0000)
run "$WORK/dense" --set "model.moe.layer_freq=[0, 0]" > "$WORK/dense.log"
grep -q "^step " "$WORK/dense.log" && ! grep -q "^step .*| aux \|^step .*| imbalance " "$WORK/dense.log" &&
  ! grep -qi "nan" "$WORK/dense.log" || fail "all-dense qwen3_moe: $(grep '^step' "$WORK/dense.log")"
grep -q "^step .*| imbalance " "$WORK/bias.log" && ! grep -q "^step .*| aux " "$WORK/bias.log" &&
  ! grep -q '"moe_aux_loss"' "$WORK/bias/metrics.jsonl" ||
  fail "expert_bias without a z-loss: an aux column: $(grep '^step' "$WORK/bias.log" | head -2)"

# refused(NAME EXPECTED-MESSAGE --set ...): exit 2 with the message
refused() {
  local name=$1 message=$2; shift 2
  local status=0
  run "$WORK/$name" "$@" > "$WORK/$name.log" 2>&1 || status=$?
  [[ $status -eq 2 ]] || fail "$name: exit $status, expected 2: $(tail -n 3 "$WORK/$name.log")"
  grep -qF -- "$message" "$WORK/$name.log" || fail "$name: expected '$message': $(tail -n 3 "$WORK/$name.log")"
}
refused drop_bias "the checkpoint's routers choose with expert biases (model.moe.load_balancing: expert_bias)" \
  --set init_from="$WORK/bias"
refused topk "model.moe.num_experts_per_tok is 2 in the checkpoint but 1 in the recipe" \
  --set init_from="$WORK/base" --set model.moe.num_experts_per_tok=1
refused renorm "model.moe.norm_topk_prob is true in the checkpoint but false in the recipe" \
  --set init_from="$WORK/base" --set model.moe.norm_topk_prob=false
refused score "model.moe.score_function is softmax in the checkpoint but sigmoid in the recipe" \
  --set init_from="$WORK/base" --set model.moe.score_function=sigmoid
refused layers "layer 1 is MoE in the checkpoint but dense in the recipe (model.moe.layer_freq)" \
  --set init_from="$WORK/base" --set model.moe.layer_freq=2
# a resume can neither add nor drop the biases, and says which and what can
resume_refused() {
  local name=$1 message=$2; shift 2
  local status=0
  "$MEGATRAIN" resume "$@" > "$WORK/$name.log" 2>&1 || status=$?
  [[ $status -eq 2 ]] || fail "$name: exit $status, expected 2: $(tail -n 3 "$WORK/$name.log")"
  grep -qF -- "$message" "$WORK/$name.log" || fail "$name: expected '$message': $(tail -n 3 "$WORK/$name.log")"
}
resume_refused resume_add "has no tensor 'layers.0.mlp.router.expert_bias': its routers were trained without expert biases" \
  "$WORK/base" --set train.steps=2 --set model.moe.load_balancing=expert_bias
# ... having said nothing of what its --set changes first ("it continues", then the refusal)
! grep -q "changes\|it continues" "$WORK/resume_add.log" || fail "a refused resume said what it changes: $(cat "$WORK/resume_add.log")"
resume_refused resume_drop "tensor 'layers.0.mlp.router.expert_bias' is an expert bias: its routers choose with them" \
  "$WORK/bias" --set train.steps=2 --set model.moe.load_balancing=aux_loss
[[ -z $(ls "$WORK/base/checkpoints" "$WORK/bias/checkpoints" | grep invalid) ]] ||
  fail "a refused resume moved a checkpoint aside: $(ls "$WORK/base/checkpoints" "$WORK/bias/checkpoints")"
# a --set of the auxiliary loss's weight changes the router's gradient only, and says so (not "what the model
# computes"); here with nothing to train, which still reports it
"$MEGATRAIN" resume "$WORK/base" --set model.moe.aux_loss_coeff=0.05 > "$WORK/coeff.log" 2>&1 ||
  fail "resume with another aux_loss_coeff: $(tail -n 3 "$WORK/coeff.log")"
grep -qF "resume: model.moe.aux_loss_coeff changes only the router's gradient (the weight of a load-balancing loss term, \
not the model's output) from here on" "$WORK/coeff.log" || fail "aux_loss_coeff's change: $(grep -i resume "$WORK/coeff.log")"
! grep -q "changes the samples\|changes what its model computes" "$WORK/coeff.log" ||
  fail "aux_loss_coeff said to change the samples or the model: $(grep -i warning "$WORK/coeff.log")"
echo "ok"
