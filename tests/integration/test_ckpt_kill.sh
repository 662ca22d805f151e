#!/usr/bin/env bash
# test_ckpt_kill.sh: crash safety. A run that saves every step (made slow
# with MEGATRAIN_TEST_SLOW_SAVE_MS, so kills land inside saves) is killed
# with SIGKILL at random times, then resumed and killed again, several times,
# with sync and async saves. After every kill: every iter_* directory is a
# complete checkpoint that `inspect` verifies, the latest pointer names one
# of them, and `resume` continues from what is left. At least one kill must
# have landed mid-save (a temporary directory left behind), and the final
# resume cleans the leftovers up. The run starts with init_from a checkpoint
# converted from a Hugging Face directory with tokenizer files and a
# generation_config.json: every complete checkpoint holds them byte for byte,
# through the kills and resumes. Kill times are printed for reproduction.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
# the tiny byte-level model below carries another tokenizer's files on purpose (to test carrying them): the byte
# data opts out of the check against the model's tokenizer (docs/data.md) by losing its record
rm "$WORK/english.build.json"
dir="$WORK/run"
ck="$dir/checkpoints"
settings=(--set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.eval_interval=0
          --set optimizer.schedule.warmup_steps=1)

# the starting weights: a Hugging Face directory (a one-step run converted) with its tokenizer files
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/seed" --set train.steps=1 \
  --set optimizer.schedule.warmup_steps=0 --set "data.train=[{path: $WORK/english, weight: 1.0}]" > /dev/null 2>&1
"$MEGATRAIN" convert "$WORK/seed" "$WORK/seed.hf" > /dev/null
carried="tokenizer.json tokenizer_config.json chat_template.jinja generation_config.json"
for f in $carried; do cp "$REPO/tests/fixtures/hf/llama3_export/$f" "$WORK/seed.hf/$f"; done
"$MEGATRAIN" convert "$WORK/seed.hf" "$WORK/seed.ckpt" > /dev/null
# carried_intact: every complete checkpoint holds the carried files as they were
carried_intact() {
  local d f
  for d in "$ck"/iter_???????; do
    [[ -d "$d" ]] || continue
    for f in $carried; do cmp -s "$WORK/seed.hf/$f" "$d/$f" || fail "$(basename "$d"): $f is not the one carried"; done
  done
}

mid_save=0
for i in 1 2 3 4 5 6; do
  async=$([[ $((i % 3)) -eq 0 ]] && echo true || echo false)
  if compgen -G "$ck/iter_???????" > /dev/null; then
    cmd=(resume "$dir" --set train.steps=100000 --set checkpoint.async=$async)
  else
    cmd=(run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$dir" --set train.steps=100000
         --set checkpoint.interval=1 --set checkpoint.async=$async --set init_from="$WORK/seed.ckpt" "${settings[@]}")
  fi
  (export MEGATRAIN_TEST_SLOW_SAVE_MS=4; exec "$MEGATRAIN" "${cmd[@]}" > "$WORK/kill-$i.log" 2>&1) &
  pid=$!
  # Wait for the first step of this process, then kill at a random moment.
  for _ in $(seq 1 6000); do  # up to a minute on a busy machine
    grep -q "^step" "$WORK/kill-$i.log" 2>/dev/null && break
    kill -0 $pid 2>/dev/null || fail "kill $i: megatrain exited early: $(tail -n 3 "$WORK/kill-$i.log")"
    sleep 0.01
  done
  delay=$(printf '%d.%03d' $((RANDOM % 2)) $((RANDOM % 1000)))
  sleep "$delay"
  kill -KILL $pid
  wait $pid 2>/dev/null || true
  leftovers=$(ls "$ck" | grep -c -E '\.tmp\.|\.deleting$' || true)
  [[ $leftovers -gt 0 ]] && mid_save=$((mid_save + 1))
  n=$(check_checkpoints "$ck")
  carried_intact
  echo "kill $i (async=$async) ${delay}s after its first step: $n complete checkpoints, $leftovers leftovers"
done
[[ $mid_save -gt 0 ]] || fail "no kill landed inside a save; the test did not test anything"

last=$(cat "$ck/latest_checkpointed_iteration.txt")
"$MEGATRAIN" resume "$dir" --set train.steps=$((last + 2)) > "$WORK/final.log" 2>&1 \
  || fail "final resume failed: $(tail -n 3 "$WORK/final.log")"
[[ "$(cat "$ck/latest_checkpointed_iteration.txt")" == $((last + 2)) ]] || fail "final resume did not save step $((last + 2))"
[[ -z "$(ls "$ck" | grep -E '\.tmp\.|\.deleting$' || true)" ]] || fail "leftovers not cleaned up: $(ls "$ck")"
check_checkpoints "$ck" > /dev/null
carried_intact
