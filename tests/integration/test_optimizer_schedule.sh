#!/usr/bin/env bash
# test_optimizer_schedule.sh: Megatron's --lr-warmup-init and weight-decay increment reach the optimizer on the
# CPU (tests/unit/test_lr_schedule.c checks the values against Megatron's own scheduler):
# - optimizer.schedule.warmup_init: the first step's lr is it, the start line says the warmup starts from it;
# - optimizer.weight_decay_style linear from weight_decay 0 to weight_decay_end: metrics.jsonl's weight_decay
#   of each logged step is the update's (step N: 0.6 x (N - 1) / 6), the start line names the schedule; the first
#   update decays nothing, so step 2's loss equals a run with weight_decay 0 bit for bit, and step 3's differs
#   from it (the second update decayed);
# - a run stopped by train.exit_interval and resumed gives the uninterrupted run's losses bit for bit;
# - a constant weight decay writes no weight_decay to metrics.jsonl;
# - a resume with a longer train.steps warns that the weight decay's schedule is stretched over it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
run() {  # run DIR [--set ...]
  "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$1" --set train.steps=6 \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.eval_interval=0 \
    --set checkpoint.interval=0 --set optimizer.schedule.warmup_steps=3 --set optimizer.schedule.warmup_init=1e-4 \
    --set logging.tensorboard=false "${@:2}"
}
SCHEDULE=(--set optimizer.weight_decay=0 --set optimizer.weight_decay_end=0.6 --set optimizer.weight_decay_style=linear)
run "$WORK/wd" "${SCHEDULE[@]}" > "$WORK/wd.log" 2>&1 || { cat "$WORK/wd.log"; fail "the scheduled run failed"; }
grep -q "lr schedule: warmup 3 steps from 0.0001 to 0.003, .*; weight decay 0 to 0.6 (linear) over the run's 6 steps" \
  "$WORK/wd.log" || fail "the start line does not state the schedule: $(grep 'lr schedule' "$WORK/wd.log")"
lrs=$(json_field "$WORK/wd/metrics.jsonl" lr | head -1)
[[ $lrs == 0.0001 ]] || fail "step 1's lr is $lrs, expected warmup_init 0.0001"
paste <(json_field "$WORK/wd/metrics.jsonl" step) <(json_field "$WORK/wd/metrics.jsonl" weight_decay) | awk '
  { want = 0.6 * ($1 - 1) / 6; d = $2 - want; if (d < 0) d = -d; n++
    if (NF != 2 || d > 1e-9) { print "step " $1 ": weight_decay " $2 ", expected " want; bad = 1 } }
  END { if (n != 6) { print n " weight_decay values, expected 6"; bad = 1 } exit bad }' \
  || fail "metrics.jsonl's weight_decay is not the schedule's"

run "$WORK/zero" --set optimizer.weight_decay=0 > /dev/null 2>&1 || fail "the run without weight decay failed"
! grep -q weight_decay "$WORK/zero/metrics.jsonl" || fail "a constant weight decay wrote weight_decay to metrics.jsonl"
loss() { json_field "$1/metrics.jsonl" loss | sed -n "$2p"; }
[[ $(loss "$WORK/wd" 2) == $(loss "$WORK/zero" 2) ]] \
  || fail "step 2's loss $(loss "$WORK/wd" 2) differs from weight_decay 0's $(loss "$WORK/zero" 2): update 1 decayed"
[[ $(loss "$WORK/wd" 3) != $(loss "$WORK/zero" 3) ]] \
  || fail "step 3's loss equals weight_decay 0's: the scheduled weight decay of update 2 did not reach the optimizer"

run "$WORK/part" "${SCHEDULE[@]}" --set train.exit_interval=3 > /dev/null 2>&1 || fail "the stopped run failed"
"$MEGATRAIN" resume "$WORK/part" > "$WORK/resume.log" 2>&1 || { cat "$WORK/resume.log"; fail "resume failed"; }
for field in loss lr weight_decay; do
  [[ $(json_field "$WORK/part/metrics.jsonl" $field) == $(json_field "$WORK/wd/metrics.jsonl" $field) ]] \
    || fail "the resumed run's $field differs from the uninterrupted run's"
done
# a resume to a longer run re-stretches the weight decay over the new train.steps, and says so
"$MEGATRAIN" resume "$WORK/part" --set train.steps=9 > "$WORK/longer.log" 2>&1 || { cat "$WORK/longer.log"; fail "resume to 9 steps failed"; }
grep -q "warning: resume: the weight decay of step 7 is 0.4 under this recipe, 0.6 under the checkpoint's run: optimizer.weight_decay_style linear spans train.steps, now 9 steps (the checkpoint's run: 6)" \
  "$WORK/longer.log" || fail "no warning of the re-stretched weight decay: $(grep -i 'weight decay' "$WORK/longer.log")"
echo "ok"
