#!/usr/bin/env bash
# test_train_determinism.sh: the same recipe, seed and data give the same losses
# bit for bit on a second run; another seed gives other losses. Each family runs.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
train() {  # train RECIPE RUN_DIR [--set ...]
  local recipe=$1 dir=$2; shift 2
  "$MEGATRAIN" run "$REPO/recipes/tiny/$recipe.yaml" --set run.dir="$dir" --set train.steps=12 \
    --set logging.interval=1 --set train.eval_interval=6 --set optimizer.schedule.warmup_steps=3 \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]" "$@" > /dev/null
}
for family in llama qwen2 qwen3; do
  train $family "$WORK/$family-a"
  train $family "$WORK/$family-b"
  train $family "$WORK/$family-c" --set run.seed=99
  a=$(json_field "$WORK/$family-a/metrics.jsonl" loss | tr '\n' ' ')
  b=$(json_field "$WORK/$family-b/metrics.jsonl" loss | tr '\n' ' ')
  c=$(json_field "$WORK/$family-c/metrics.jsonl" loss | tr '\n' ' ')
  [[ $(wc -w <<< "$a") -eq 12 ]] || fail "$family: expected 12 logged losses, got: $a"
  [[ "$a" == "$b" ]] || fail "$family: two runs differ: $a vs $b"
  [[ "$a" != "$c" ]] || fail "$family: another seed gave the same losses"
  ea=$(json_field "$WORK/$family-a/metrics.jsonl" eval_loss | tr '\n' ' ')
  eb=$(json_field "$WORK/$family-b/metrics.jsonl" eval_loss | tr '\n' ' ')
  [[ -n "$ea" && "$ea" == "$eb" ]] || fail "$family: eval losses differ or missing: '$ea' vs '$eb'"
  echo "$family: $a"
done
