#!/usr/bin/env bash
# test_throughput_saves.sh: the step line's tok/s (and the TFLOP/s and eta that follow it) leaves out the time the
# loop spent on checkpoint saves, as it leaves out evaluations: saves made slow with MEGATRAIN_TEST_SLOW_SAVE_MS
# (seconds each, against milliseconds a step) leave the tok/s of the interval after a save within a factor of the
# others' (before, it fell a hundredfold). Both ways a save blocks the loop: a synchronous save, and an async save
# that waits for the previous one to finish writing, which the log says once per wait
# ("checkpoint: waited S s for the previous save (iter_N) ...").
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
run() {  # NAME ASYNC: 16 steps, a line every 4, a save every 4 (its writes slowed)
  MEGATRAIN_TEST_SLOW_SAVE_MS=30 "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/$1" \
    --set train.steps=16 --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=4 \
    --set checkpoint.interval=4 --set checkpoint.async="$2" --set train.eval_interval=0 \
    --set optimizer.schedule.warmup_steps=1 --set logging.tensorboard=false > "$WORK/$1.log" 2>&1 ||
    fail "$1: exit $?: $(tail -n 3 "$WORK/$1.log")"
}
# steady NAME: the tok/s of steps 8, 12 and 16 (each interval after a save) within a factor 4 of step 4's (before
# any save); prints them
steady() {
  json_field "$WORK/$1/metrics.jsonl" tokens_per_s | tr '\n' ' ' | awk -v n="$1" '
    { printf "%s: tok/s %s\n", n, $0; if (NF != 5) { print n ": expected 5 lines (steps 1, 4, 8, 12, 16)"; exit 1 }
      for (i = 3; i <= 5; i++) if (!($i > $2 / 4 && $i < $2 * 4)) { print n ": line " i " far from step 4'"'"'s"; exit 1 } }'
}

run sync false
steady sync || fail "sync saves counted in tok/s: $(grep '^step' "$WORK/sync.log")"
! grep -q "checkpoint: waited" "$WORK/sync.log" || fail "sync: a wait for a previous save said"

# async: each save (about 2 s of writing) is still in flight at the next, which waits for it
run async true
steady async || fail "waits for the previous save counted in tok/s: $(grep '^step' "$WORK/async.log")"
for prev in 4 8 12; do
  grep -q "^checkpoint: waited [0-9.]* s for the previous save ($(printf iter_%07d $prev)) to finish writing before saving step $((prev + 4)) " \
    "$WORK/async.log" || fail "async: no line for the wait for iter_$prev: $(grep checkpoint "$WORK/async.log")"
done
echo "ok: tok/s leaves out sync saves and the waits for async ones"
