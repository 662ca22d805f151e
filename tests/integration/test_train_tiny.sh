#!/usr/bin/env bash
# test_train_tiny.sh: the demo recipe learns. tiny llama on byte-level English
# goes from about ln(256) to a loss below 2.5 within its 300 steps, and the
# global batch changes at step 100 as its batch schedule says; a long evaluation
# says how far it is.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/run" \
  --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 > "$WORK/out.txt"
m="$WORK/run/metrics.jsonl"
[[ -s "$m" ]] || fail "no metrics.jsonl"
test -s "$WORK/run/recipe.yaml" || fail "no resolved recipe.yaml"
first=$(json_field "$m" loss | head -n 1)
last=$(json_field "$m" loss | tail -n 1)
echo "loss $first -> $last"
awk -v a="$first" 'BEGIN { exit !(a > 5.0 && a < 6.0) }' || fail "first loss $first is not near ln(256)=5.55"
awk -v b="$last" 'BEGIN { exit !(b < 2.5) }' || fail "final loss $last is not below 2.5"
json_field "$m" eval_loss | grep -q . || fail "no eval_loss in metrics"
# every eval_interval steps and after the last one: 100, 200, 300 here; 10, 20 and 25 for 25 steps (Megatron's
# evaluation at the end of training)
[[ $(grep -c '"eval_loss"' "$m") -eq 3 ]] || fail "expected eval_loss at steps 100, 200, 300: $(grep -c '"eval_loss"' "$m")"
before=$(date +%s.%N)
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/run25" --set train.steps=25 \
  --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set train.eval_interval=10 --set precision=bf16 \
  > "$WORK/run25.txt"
after=$(date +%s.%N)
# every line's "time": Unix seconds to the millisecond, within the run, in order
json_field "$WORK/run25/metrics.jsonl" time | awk -v a="$before" -v b="$after" '
  { n++; if ($1 !~ /^[0-9]+\.[0-9][0-9][0-9]$/ || $1 < a - 0.001 || $1 > b || $1 < last) bad = bad " " $1; last = $1 }
  END { if (n != 4 || bad != "") { printf "%d time values; outside [%s, %s] or out of order:%s\n", n, a, b, bad; exit 1 } }' ||
  fail "metrics.jsonl's time field (4 lines: steps 1, 10, 20, 25)"
grep -q "^train: .*, device cpu, precision fp32$" "$WORK/out.txt" &&
  grep -q "^train: .*, device cpu, precision bf16 (the cpu computes in fp32)$" "$WORK/run25.txt" ||
  fail "the banner's precision: $(grep '^train:' "$WORK/out.txt" "$WORK/run25.txt")"
[[ $(grep -o '"step":[0-9]*,.*"eval_loss"' "$WORK/run25/metrics.jsonl" | cut -d, -f1 | tr '\n' ' ') == '"step":10 "step":20 "step":25 ' ]] ||
  fail "25 steps, eval_interval 10: eval_loss at $(grep '"eval_loss"' "$WORK/run25/metrics.jsonl" | cut -d, -f1)"
# steps and global batch sizes, paired: 8 before step 100, 16 from step 101 on
paste -d' ' <(json_field "$m" step) <(json_field "$m" global_batch_size) > "$WORK/gbs.txt"
awk '($1 <= 100 && $2 != 8) || ($1 > 100 && $2 != 16) { bad = 1; print "step " $1 " gbs " $2 } END { exit bad }' \
  "$WORK/gbs.txt" || fail "global batch does not follow the schedule"
grep -q "^step *300/300" "$WORK/out.txt" || fail "no log line for step 300"
# the ETA: the schedule's remaining tokens (8 a step to step 100, 16 after, seq_len 64) at the line's tok/s,
# in the printed unit (s and m to the second; h drops the seconds, d the minutes); none on the last step
awk '/^step / {
  split($2, s, "/"); step = s[1] + 0; tps = eta = ""
  for (i = 1; i <= NF; i++) { if ($i == "tok/s") tps = $(i + 1); if ($i == "eta") eta = $(i + 1) }
  if (step == 300) { if (eta != "") { print "eta on the last step"; bad = 1 }; next }
  if (eta == "") { print "no eta at step " step; bad = 1; next }
  left = (step < 100 ? (100 - step) * 8 + 200 * 16 : (300 - step) * 16) * 64 / tps
  secs = 0; tol = 0.51; rest = eta
  while (match(rest, /^[0-9]+[dhms]/)) {
    n = substr(rest, 1, RLENGTH - 1) + 0; u = substr(rest, RLENGTH, 1); rest = substr(rest, RLENGTH + 1)
    secs += n * (u == "d" ? 86400 : u == "h" ? 3600 : u == "m" ? 60 : 1)
    if (u == "d") tol = 3600; else if (u == "h" && tol < 60) tol = 60
  }
  if (rest != "" || secs < left - tol - 1e-3 * left || secs > left + 0.51 + 1e-3 * left) {
    print "step " step ": eta " eta " for " left " s left"; bad = 1
  }
} END { exit bad }' "$WORK/out.txt" || fail "the step lines' eta is not the schedule's remaining tokens at their tok/s"
# a long evaluation says how far it is (a line every 30 s; 0 s here): 24 batches, said from the 9th on
MEGATRAIN_TEST_EVAL_PROGRESS_SECONDS=0 "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/evalp" \
  --set train.steps=1 --set optimizer.schedule.warmup_steps=0 --set "data.train=[{path: $WORK/english, weight: 1.0}]" \
  --set train.eval_interval=1 --set train.eval_batches=24 --set "data.split=[90, 10, 0]" > "$WORK/evalp.txt"
grep -q "^evaluation (eval_loss): 8 of 24 batches, [0-9]* s, about [0-9]* s left$" "$WORK/evalp.txt" &&
  grep -q "^evaluation (eval_loss): 16 of 24 batches" "$WORK/evalp.txt" ||
  fail "a long evaluation's progress is not said: $(grep -i evaluation "$WORK/evalp.txt")"
