#!/usr/bin/env bash
# test_train_recipe_forms.sh: train.tokens instead of train.steps, Megatron's
# token-threshold batch schedule (metrics.jsonl's consumed_samples its global
# batches' sum), and the resolved run.dir/recipe.yaml, which must reproduce
# the run that wrote it bit for bit.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
data="data.train=[{path: $WORK/english, weight: 1.0}]"
# 8 samples x 64 tokens = 512 tokens per step until 4096 tokens (step 8), then 16 x 64 = 1024.
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/tok" --set "$data" \
  --set train.steps=null --set train.tokens=10K --set train.batch_schedule=null \
  --set 'train.global_batch_size=0:8 4K:16' --set logging.interval=1 --set train.eval_interval=0 \
  --set optimizer.schedule.warmup_steps=4 > /dev/null
m="$WORK/tok/metrics.jsonl"
steps=$(json_field "$m" step | tail -n 1)
tokens=$(json_field "$m" consumed_tokens | tail -n 1)
# 8 steps reach 4096 tokens; then 1024 a step: 4096 + 6*1024 = 10240 >= 10000 after step 14.
[[ "$steps" == 14 ]] || fail "train.tokens=10K should take 14 steps, took $steps"
awk -v t="$tokens" 'BEGIN { exit !(t == 10240) }' || fail "consumed tokens $tokens, expected 10240"
paste -d' ' <(json_field "$m" step) <(json_field "$m" global_batch_size) |
  awk '($1 <= 8 && $2 != 8) || ($1 > 8 && $2 != 16) { bad = 1; print } END { exit bad }' ||
  fail "token-threshold schedule not followed"
# consumed_samples (Megatron's consumed samples): each step's global batch added, 8 x 8 + 6 x 16 = 160 at the end;
# consumed_tokens is it times seq_len (64)
paste -d' ' <(json_field "$m" global_batch_size) <(json_field "$m" consumed_samples) <(json_field "$m" consumed_tokens) |
  awk '{ sum += $1; if ($2 != sum || $3 != $2 * 64) { bad = 1; print "step " NR ": " $0 } } END { exit bad || sum != 160 }' ||
  fail "consumed_samples is not the global batches' sum"
# The resolved recipe reproduces the run.
"$MEGATRAIN" run "$WORK/tok/recipe.yaml" --set run.dir="$WORK/again" > /dev/null
diff <(json_field "$m" loss) <(json_field "$WORK/again/metrics.jsonl" loss) ||
  fail "run.dir/recipe.yaml does not reproduce the run"
# parallel.sequence_parallel at tp 1 does nothing, and the run says so (Megatron warns and turns it off too)
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/sp1" --set "$data" --set train.steps=1 \
  --set optimizer.schedule.warmup_steps=0 --set parallel.sequence_parallel=true > "$WORK/sp1.log" 2>&1 ||
  fail "sequence_parallel at tp 1: $(tail -n 3 "$WORK/sp1.log")"
grep -q "warning: parallel.sequence_parallel splits the sequence over the tensor-parallel ranks: at parallel.tp 1" \
  "$WORK/sp1.log" || fail "sequence_parallel at tp 1: no warning"
# so does parallel.distributed_optimizer at dp 1 (it was dropped without a word)
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/zero1-dp1" --set "$data" --set train.steps=1 \
  --set optimizer.schedule.warmup_steps=0 --set parallel.distributed_optimizer=true > "$WORK/zero1-dp1.log" 2>&1 ||
  fail "distributed_optimizer at dp 1: $(tail -n 3 "$WORK/zero1-dp1.log")"
grep -q "warning: parallel.distributed_optimizer shards the optimizer over the data-parallel ranks: at dp 1" \
  "$WORK/zero1-dp1.log" || fail "distributed_optimizer at dp 1: no warning"

# wsd's settings beside another decay are said to be unused (as fp8's beside bf16 are)
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/wsd-unused" --set "$data" --set train.steps=2 \
  --set optimizer.schedule.warmup_steps=0 --set optimizer.schedule.wsd_decay_steps=5 --set train.eval_interval=0 \
  > "$WORK/wsd.log" 2>&1 || fail "wsd settings beside cosine: the run failed: $(tail -3 "$WORK/wsd.log")"
grep -q "warning: optimizer.schedule.wsd_decay_steps and wsd_decay_style apply to decay: wsd only; this run's decay is cosine" \
  "$WORK/wsd.log" || fail "wsd settings beside cosine: no warning"
echo "wsd settings beside another decay: warned of"

# checkpoint.keep_every that interval's saves rarely reach is said (keep_every 50 at interval 20: every 100 steps)
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/keep-every" --set "$data" --set train.steps=1 \
  --set optimizer.schedule.warmup_steps=0 --set checkpoint.interval=20 --set checkpoint.keep_every=50 \
  --set train.eval_interval=0 > "$WORK/keep.log" 2>&1 || fail "keep_every 50: the run failed: $(tail -3 "$WORK/keep.log")"
grep -q "warning: checkpoint.keep_every 50 is not a multiple of checkpoint.interval 20: a checkpoint is saved every 20 \
steps, so only those at multiples of 100 are kept beyond keep_last" "$WORK/keep.log" || fail "keep_every 50: $(cat "$WORK/keep.log")"
echo "keep_every that is not a multiple of interval: warned of"
