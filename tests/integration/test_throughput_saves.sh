#!/usr/bin/env bash
# test_throughput_saves.sh: the step line's tok/s (and the TFLOP/s and eta that follow it) leaves out the time the
# loop spent on checkpoint saves, as it leaves out evaluations. Saves made slow with MEGATRAIN_TEST_SLOW_SAVE_MS (its
# sleeps alone take seconds a save, against milliseconds a step) must be left out of each interval that follows one:
# the interval's wall time (elapsed_s) less the time its tok/s implies (its tokens / tok/s) is what was left out, and
# it must be at least the save's sleeps (sync; before, it was 0 and tok/s fell a hundredfold), or the wait for the
# previous save that the log reports (async: "checkpoint: waited S s for the previous save (iter_N) ..."). What is
# checked is time the program itself accounts for, not how fast this machine runs.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
run() {  # NAME ASYNC [MS]: 16 steps, a line every 4, a save every 4 (its writes slowed MS ms each, 30 by default)
  MEGATRAIN_TEST_SLOW_SAVE_MS=${3:-30} "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/$1" \
    --set train.steps=16 --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=4 \
    --set checkpoint.interval=4 --set checkpoint.async="$2" --set train.eval_interval=0 \
    --set optimizer.schedule.warmup_steps=1 --set logging.tensorboard=false > "$WORK/$1.log" 2>&1 ||
    fail "$1: exit $?: $(tail -n 3 "$WORK/$1.log")"
}
# left_out NAME: for each line after the first two (steps 8, 12, 16), the seconds of its interval that tok/s left out
left_out() {
  python3 - "$WORK/$1/metrics.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l["step"] for l in lines] == [1, 4, 8, 12, 16], [l["step"] for l in lines]
for a, b in zip(lines[1:], lines[2:]):
    wall = b["elapsed_s"] - a["elapsed_s"]
    print(f'{b["step"]} {wall - (b["consumed_tokens"] - a["consumed_tokens"]) / b["tokens_per_s"]:.3f}')
PY
}
run sync false
left_out sync > "$WORK/sync.left" || fail "sync: metrics.jsonl: $(cat "$WORK/sync/metrics.jsonl")"
# every sync save of tiny llama sleeps 30 ms a write, over a second in all (the saves' own lines say how long each took)
awk '{ if (!($2 >= 1.0)) { print "step " $1 ": only " $2 " s left out"; bad = 1 } } END { exit bad }' "$WORK/sync.left" ||
  fail "sync saves counted in tok/s: $(cat "$WORK/sync.left"); $(grep '^checkpoint: saved' "$WORK/sync.log")"
! grep -q "checkpoint: waited" "$WORK/sync.log" || fail "sync: a wait for a previous save said"

# async: each save (seconds of writing) is still in flight at the next, which waits for it; the wait is left out of
# the interval after it
run async true 60 # saves of seconds, far longer than 4 steps even on a loaded machine: each waits
left_out async > "$WORK/async.left" || fail "async: metrics.jsonl: $(cat "$WORK/async/metrics.jsonl")"
waits=0
for prev in 4 8 12; do
  wait_s=$(sed -n "s/^checkpoint: waited \([0-9.]*\) s for the previous save ($(printf iter_%07d $prev)) to finish writing before saving step $((prev + 4)) .*/\1/p" \
    "$WORK/async.log")
  [[ -n "$wait_s" ]] || continue # a wait under a second is not said (a loaded machine trains slower)
  waits=$((waits + 1))
  left=$(awk -v s=$((prev + 8)) '$1 == s { print $2 }' "$WORK/async.left")
  [[ $((prev + 8)) -gt 16 ]] || awk -v l="$left" -v w="$wait_s" 'BEGIN { exit !(l >= w - 0.1) }' ||
    fail "async: the wait of $wait_s s before saving step $((prev + 4)) is not left out of step $((prev + 8))'s tok/s ($left s)"
done
[[ $waits -ge 1 ]] || fail "async: no wait for a previous save said: $(grep checkpoint "$WORK/async.log")"
echo "ok: tok/s leaves out sync saves ($(tr '\n' ' ' < "$WORK/sync.left")) and the waits for async ones ($waits said)"
