#!/usr/bin/env bash
# test_health.sh: a NaN planted in the gradients at step 5 (the test-only
# MEGATRAIN_TEST_NAN_STEP) with train.max_nonfinite_steps=1 skips that step's
# update: the run completes, the log names the step and the first parameter
# whose gradient went bad, later losses are finite, the optimizer step lags
# the step by one and the checkpoints after it verify. The skipped update
# leaves the parameters untouched (eval loss after a skipped step 4 equals
# eval loss after step 3 of a clean run, bit for bit). With the default 0 the
# run stops with exit 1 at step 5, writes no checkpoint after step 4, and
# resuming from step 4 gives the clean run's losses for steps 5-10 exactly.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
run() {
  "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$1" --set train.steps=10 \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 \
    --set checkpoint.interval=4 --set optimizer.schedule.warmup_steps=2 "${@:2}"
}
losses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$1/metrics.jsonl"; }

run "$WORK/clean" > /dev/null

# Skip: the run goes on.
MEGATRAIN_TEST_NAN_STEP=5 run "$WORK/skip" --set train.max_nonfinite_steps=1 > "$WORK/skip.log" 2>&1 \
  || fail "skip run exited $?: $(tail -n 3 "$WORK/skip.log")"
grep -q "^megatrain: warning: step 5: skipped the update: .*first non-finite gradient: " "$WORK/skip.log" \
  || fail "no skip warning for step 5: $(grep -i step.5 "$WORK/skip.log")"
named=$(grep -o "first non-finite gradient: [^ ]*" "$WORK/skip.log" | cut -d' ' -f4)
"$MEGATRAIN" inspect "$WORK/skip/checkpoints/iter_0000008" > "$WORK/inspect.txt" || fail "iter_0000008 does not verify"
first=$(awk '$1 == "tensor" {getline; print $1; exit}' "$WORK/inspect.txt")
[[ -n "$named" && "$named" == "$first" ]] || fail "named '$named', expected the first parameter '$first'"
[[ $(grep -c "skipped the update" "$WORK/skip.log") -eq 1 ]] || fail "expected exactly one skipped step"
grep -q '"step":5,"loss":[0-9.]*,.*"grad_norm":null' "$WORK/skip/metrics.jsonl" \
  || fail "step 5 in metrics.jsonl does not show the NaN grad norm"
for s in 6 7 8 9 10; do
  grep -q "\"step\":$s,\"loss\":[0-9]" "$WORK/skip/metrics.jsonl" || fail "step $s: loss not finite after the skip"
done
grep -q "step 8 of 10: .*optimizer step 7;" "$WORK/inspect.txt" || fail "the skipped step moved the optimizer step"

# A skipped step is logged whatever logging.interval says (metrics.jsonl and the step line), and so is the step that
# stops the run, its line before the error.
logged() { grep -o '"step":[0-9]*' "$1/metrics.jsonl" | cut -d: -f2 | tr '\n' ' '; }
MEGATRAIN_TEST_NAN_STEP=5 run "$WORK/sparse" --set train.steps=6 --set logging.interval=4 \
  --set train.max_nonfinite_steps=1 > "$WORK/sparse.log" 2>&1 || fail "sparse skip run failed: $(tail -n 3 "$WORK/sparse.log")"
[[ "$(logged "$WORK/sparse")" == "1 4 5 6 " ]] || fail "logging.interval 4, step 5 skipped: steps $(logged "$WORK/sparse")logged"
grep -q '"step":5,.*"grad_norm":null' "$WORK/sparse/metrics.jsonl" || fail "the skipped step 5's line: no null grad_norm"
grep -q '^step  5/6 |' "$WORK/sparse.log" || fail "no step line for the skipped step 5: $(grep '^step' "$WORK/sparse.log")"
set +e
MEGATRAIN_TEST_NAN_STEP=5 run "$WORK/sparse-stop" --set train.steps=6 --set logging.interval=4 > "$WORK/sparse-stop.log" 2>&1
rc=$?
set -e
[[ $rc -eq 1 ]] || fail "sparse stop run exited $rc, expected 1"
[[ "$(logged "$WORK/sparse-stop")" == "1 4 5 " ]] || fail "stopped at step 5: steps $(logged "$WORK/sparse-stop")logged"
[[ "$(grep -o '^step  5/6 \|error: step 5: ' "$WORK/sparse-stop.log" | tr '\n' ,)" == "step  5/6 ,error: step 5: ," ]] ||
  fail "stopped at step 5: expected its step line, then the error: $(tail -n 3 "$WORK/sparse-stop.log")"

# The skipped update leaves the parameters as they were.
run "$WORK/eval3" --set train.steps=3 --set train.eval_interval=3 > /dev/null
MEGATRAIN_TEST_NAN_STEP=4 run "$WORK/eval4" --set train.steps=4 --set train.eval_interval=4 \
  --set train.max_nonfinite_steps=1 > /dev/null || fail "run with a NaN at step 4 failed"
e3=$(json_field "$WORK/eval3/metrics.jsonl" eval_loss)
e4=$(json_field "$WORK/eval4/metrics.jsonl" eval_loss)
[[ -n "$e3" && "$e3" == "$e4" ]] || fail "eval loss after the skipped step 4 ($e4) != after step 3 ($e3)"

# Stop: exit 1 at step 5, last checkpoint step 4, resume reproduces the clean run.
set +e
MEGATRAIN_TEST_NAN_STEP=5 run "$WORK/stop" > "$WORK/stop.log" 2>&1
rc=$?
set -e
[[ $rc -eq 1 ]] || fail "stop run exited $rc, expected 1"
grep -q "error: step 5: .*first non-finite gradient: $first; stopping after 1 non-finite step" "$WORK/stop.log" \
  || fail "no stop message: $(tail -n 2 "$WORK/stop.log")"
[[ "$(ls "$WORK/stop/checkpoints" | tr '\n' ' ')" == "iter_0000004 latest_checkpointed_iteration.txt " ]] \
  || fail "expected only iter_0000004, found: $(ls "$WORK/stop/checkpoints")"
"$MEGATRAIN" inspect "$WORK/stop/checkpoints/iter_0000004" > /dev/null || fail "iter_0000004 does not verify"
"$MEGATRAIN" resume "$WORK/stop" > "$WORK/resume.log" || fail "resume from step 4 failed"
diff <(losses "$WORK/clean") <(losses "$WORK/stop") > "$WORK/diff.txt" \
  || fail "resumed losses differ from the clean run: $(head -n 4 "$WORK/diff.txt")"

# On 2 ranks (dp 2) the stop is agreed (the grad norm is every rank's): every rank exits 1 at step 5, nothing is
# aborted, the checkpoint of step 4 is whole.
if command -v mpirun > /dev/null && [[ -z ${TSAN_OPTIONS:-} ]]; then
  MEGATRAIN_TEST_NAN_STEP=5 stop_together stop-dp2 2 "$WORK/stop-dp2.log" "$MEGATRAIN" run \
    "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/stop-dp2" --set train.steps=10 \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set checkpoint.interval=4 \
    --set optimizer.schedule.warmup_steps=2 --set train.micro_batch_size=2
  grep -q "error: rank [01]: step 5: .*stopping after 1 non-finite step" "$WORK/stop-dp2.log" ||
    { cat "$WORK/stop-dp2.log"; fail "dp 2: no stop message"; }
  [[ "$(ls "$WORK/stop-dp2/checkpoints" | tr '\n' ' ')" == "iter_0000004 latest_checkpointed_iteration.txt " ]] ||
    fail "dp 2: expected only iter_0000004, found: $(ls "$WORK/stop-dp2/checkpoints")"
  "$MEGATRAIN" inspect "$WORK/stop-dp2/checkpoints/iter_0000004" > /dev/null || fail "dp 2: iter_0000004 does not verify"
  echo "dp 2: every rank stopped at step 5 with exit 1, no abort"
fi
echo "ok: skipped, stopped and resumed as configured"
