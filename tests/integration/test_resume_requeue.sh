#!/usr/bin/env bash
# test_resume_requeue.sh: stopping a run and going on, as a preempted or
# time-limited job does.
# - train.exit_interval and train.exit_duration_mins stop a run after a step
#   with a checkpoint and exit 0, that step logged (whatever logging.interval);
#   the minutes count from the process's start, a slow setup included;
#   a SIGTERM during a checkpoint's save stops the run after that step;
#   the resumed pieces give the uninterrupted run's losses;
# - `run --resume-if-exists` (a requeued job's one command) starts, resumes,
#   finishes, then has nothing to do (its last line `done:`, as a finished
#   run's); a changed recipe file is refused, what a
#   resume writes into the recipe itself (a LoRA run's frozen base,
#   load_optimizer: false in the file) is not a change, and a run.dir whose
#   checkpoints were all moved aside is refused rather than started afresh
#   (and by a plain `run`);
# - a token budget (train.tokens) still ends at its tokens when a resume
#   changes the batch schedule or seq_len;
# - a resume that changes the lr schedule says so with both rates.
# (Split from test_resume_options.sh, which test_host_threads_tsan.sh runs on
# the ThreadSanitizer build: these drive no thread of megatrain's own that
# that file's saves do not.)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
source "$(dirname "$0")/resume_lib.sh"

run "$WORK/a" 20 > /dev/null # the uninterrupted losses of steps 1-20
# train.exit_interval and train.exit_duration_mins (Megatron's --exit-interval, --exit-duration-in-mins) stop the
# run after a step as SIGTERM does: a checkpoint, exit 0, the line that says how to go on; a resume goes on to the
# next limit, and the pieces give the uninterrupted run's losses
expect 0 "stopped by train.exit_interval after step 7: checkpoint in .*iter_0000007; continue with .*(it stops again \
after step 14, the next multiple of train.exit_interval 7, which the run keeps; add --set train.exit_interval=0 to run to \
the end)" run "$WORK/ex" 20 --set train.exit_interval=7
# the last piece stops at the end: no "stops again"
expect 0 "stopped by train.exit_interval after step 14: checkpoint in .*iter_0000014; continue with [^(]*$" \
  "$MEGATRAIN" resume "$WORK/ex"
expect 0 "done: 20 steps" "$MEGATRAIN" resume "$WORK/ex"
[[ "$(losses "$WORK/ex")" == "$(losses "$WORK/a" | head -n 20)" ]] || fail "exit_interval: the pieces' losses differ"
expect 0 "stopped by train.exit_duration_mins after step 1: checkpoint in .*iter_0000001.*(it stops again \
1e-06 minutes after it starts, train.exit_duration_mins, which the run keeps; add --set train.exit_duration_mins=0 to run \
to the end)" run "$WORK/dur" 20 \
  --set train.exit_duration_mins=1e-6
# the minutes count from the process's start, setup included (Megatron's --exit-duration-in-mins too): a setup of
# 1.5 s (MEGATRAIN_TEST_SLOW_SETUP_MS, a large checkpoint's load standing in) against a limit of 1.2 s stops the
# run after its first step, which a limit counted from the training loop's start let run on (3 steps of the tiny
# model take milliseconds)
(export MEGATRAIN_TEST_SLOW_SETUP_MS=1500
 expect 0 "stopped by train.exit_duration_mins after step 1: checkpoint in " run "$WORK/dur-setup" 3 \
   --set train.exit_duration_mins=0.02)
# the step a run stops at is logged whatever logging.interval says: its checkpoint's step has its line and metrics
expect 0 "stopped by train.exit_interval after step 7" run "$WORK/exlog" 20 --set train.exit_interval=7 \
  --set logging.interval=5
grep -q "^step  *7/20 | loss" "$WORK/out.log" && [[ "$(losses "$WORK/exlog" | tail -n 1)" == '"step":7,'* ]] ||
  fail "the stop's step is not logged: $(cat "$WORK/out.log") $(cat "$WORK/exlog/metrics.jsonl")"
# a stop that comes during a checkpoint's save stops the run after that step, logged, with no further step and save
(export MEGATRAIN_TEST_SLOW_SAVE_MS=40 EXEC=exec
 run "$WORK/insave" 20 --set checkpoint.interval=5 --set checkpoint.async=false --set logging.interval=3 \
   > "$WORK/insave.log" 2>&1) &
pid=$!
for _ in $(seq 1 3000); do compgen -G "$WORK/insave/checkpoints/iter_0000005.tmp.*" > /dev/null && break; sleep 0.02; done
kill -TERM $pid
status=0; wait $pid || status=$?
[[ $status -eq 0 ]] && grep -q "stopped by SIGTERM after step 5: checkpoint in " "$WORK/insave.log" &&
  [[ ! -e "$WORK/insave/checkpoints/iter_0000006" && "$(losses "$WORK/insave" | tail -n 1)" == '"step":5,'* ]] ||
  fail "SIGTERM during the step-5 save: exit $status: $(tail -n 4 "$WORK/insave.log"); $(ls "$WORK/insave/checkpoints")"
echo "exit_interval and exit_duration_mins: stopped, saved, resumed to the uninterrupted losses; a stop during a save \
stops after its step"

# run --resume-if-exists, a requeued job's one command: it starts, then resumes from the newest checkpoint (stopped
# here by exit_interval, as by a preemption), then has nothing to do; the pieces give the uninterrupted losses. A
# recipe file changed in between is refused, naming the key.
expect 0 "no checkpoint in .*: starting the run" run "$WORK/req" 20 --set train.exit_interval=7 --resume-if-exists
expect 0 "holds checkpoints: resuming" run "$WORK/req" 20 --set train.exit_interval=7 --resume-if-exists
grep -q "stopped by train.exit_interval after step 14" "$WORK/out.log" || fail "requeue: $(tail -2 "$WORK/out.log")"
expect 0 "done: 20 steps" run "$WORK/req" 20 --set train.exit_interval=7 --resume-if-exists
expect 0 "the run is complete" run "$WORK/req" 20 --set train.exit_interval=7 --resume-if-exists
# ... and its last line says so as a finished run's does (a job script that resubmits until `done:` resubmitted
# forever on "resume: nothing to do")
[[ $(tail -n 1 "$WORK/out.log") == "done: the run is complete: its checkpoint is at step 20 of 20 (nothing to train; \
raise train.steps with --set to go on)" ]] || fail "a finished run's requeue: last line $(tail -n 1 "$WORK/out.log")"
[[ "$(losses "$WORK/req")" == "$(losses "$WORK/a" | head -n 20)" ]] || fail "--resume-if-exists: the pieces' losses differ"
sed 's/weight_decay: 0.1/weight_decay: 0.05/' "$REPO/recipes/tiny/llama.yaml" > "$WORK/edited.yaml"
expect 2 "resume-if-exists: .*iter_0000020 holds a run whose recipe differs from this one, first at optimizer.weight_decay: '0.05' in this recipe, '0.1' in the checkpoint's" \
  "$MEGATRAIN" run "$WORK/edited.yaml" --set run.dir="$WORK/req" --set train.steps=20 \
  --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.eval_interval=0 \
  --set checkpoint.interval=10 --set checkpoint.keep_last=3 --set optimizer.schedule.decay_steps=30 \
  --set optimizer.schedule.warmup_steps=5 --set train.exit_interval=7 --resume-if-exists
# what a resume writes into the recipe itself is no change of it: a LoRA run (a resume stores its frozen base) and a
# recipe file with checkpoint.load_optimizer: false (a requeue still loads AdamW: the third piece's losses are the
# LoRA run's uninterrupted ones) requeue three times; a run.dir spelled with a trailing slash is the same run
{ cat "$REPO/recipes/tiny/llama.yaml"; printf 'checkpoint:\n  load_optimizer: false\n'; } > "$WORK/lora.yaml"
requeue() { run "$WORK/$1" 15 --set train.exit_interval=5 --resume-if-exists "${@:2}"; }
lora=(--set "peft={type: lora, rank: 4, alpha: 8}")
for piece in 5 10; do
  expect 0 "stopped by train.exit_interval after step $piece" requeue lora "${lora[@]}"
done
expect 0 "done: 15 steps" requeue lora "${lora[@]}"
! grep -q "optimizer state not loaded" "$WORK/out.log" || fail "a requeue dropped the AdamW state"
expect 0 "done: 15 steps" run "$WORK/lora-straight" 15 "${lora[@]}"
[[ "$(losses "$WORK/lora")" == "$(losses "$WORK/lora-straight")" ]] || fail "LoRA requeued: the pieces' losses differ"
expect 0 "stopped by train.exit_interval after step 5" "$MEGATRAIN" run "$WORK/lora.yaml" --set run.dir="$WORK/lo/" \
  --set train.steps=10 --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set train.exit_interval=5 \
  --set optimizer.schedule.warmup_steps=2 --resume-if-exists
expect 0 "done: 10 steps" "$MEGATRAIN" run "$WORK/lora.yaml" --set run.dir="$WORK/lo/" --set train.steps=10 \
  --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set train.exit_interval=5 \
  --set optimizer.schedule.warmup_steps=2 --resume-if-exists
! grep -q "optimizer state not loaded" "$WORK/out.log" || fail "load_optimizer: false in the file: AdamW dropped"
# ... but a --set of it, in the dotted form or the section's, is this requeue's choice: AdamW starts afresh
for form in checkpoint.load_optimizer=false 'checkpoint={load_optimizer: false, interval: 50}'; do
  rm -rf "$WORK/opt"
  expect 0 "stopped by train.exit_interval after step 5" requeue opt --set "$form"
  expect 0 "optimizer state not loaded" requeue opt --set "$form"
done
# a run.dir whose checkpoints were all found unusable (moved aside) is refused, not started afresh over its history
expect 0 "stopped by train.exit_interval after step 5" requeue bad
rm "$WORK/bad/checkpoints/iter_0000005/metadata.mtck"
expect 1 "no valid checkpoint to resume from" requeue bad
expect 1 "holds no valid checkpoint, only ones moved aside as incomplete or corrupt (1, the newest \
iter_0000005.invalid)" requeue bad
[[ $(grep -c '"step"' "$WORK/bad/metrics.jsonl") -eq 5 ]] || fail "the refused requeue touched metrics.jsonl"
# ... and so is a plain `run` there (it cut metrics.jsonl and saved beside the .invalid ones), which writes nothing
ls -A "$WORK/bad" "$WORK/bad/checkpoints" > "$WORK/bad-before.txt"
expect 2 "run.dir: $WORK/bad/checkpoints holds no valid checkpoint, only ones moved aside as incomplete or corrupt \
(1, the newest iter_0000005.invalid): the run cannot continue from them, and starting it afresh here would overwrite \
its history; repair or remove them, or choose another run.dir" run "$WORK/bad" 15 --set logging.tensorboard=true
[[ $(grep -c '"step"' "$WORK/bad/metrics.jsonl") -eq 5 ]] || fail "the refused run touched metrics.jsonl"
ls -A "$WORK/bad" "$WORK/bad/checkpoints" | cmp -s - "$WORK/bad-before.txt" || fail "the refused run wrote: $(ls -A "$WORK/bad")"
echo "run --resume-if-exists: started, resumed, finished; a changed recipe refused"

# a token budget goes on from where the run stands: resumed with another batch schedule (or seq_len) it still ends
# at train.tokens (before, the steps were counted as if the new schedule had run from step 0: 2/3 of the budget)
tok=(--set train.steps=null --set train.tokens=153600 --set "train.batch_schedule=[{step: 0, global_batch_size: 8}, {step: 100, global_batch_size: 16}]" --set optimizer.schedule.decay_steps=null --set logging.interval=10)
expect 0 "stopped by train.exit_interval after step 100" run "$WORK/tok" 1 "${tok[@]}" --set train.exit_interval=100
cp -r "$WORK/tok" "$WORK/tok-at-100"
expect 0 "done: 200 steps, 153600 tokens (this session: steps 101-200 in " "$MEGATRAIN" resume "$WORK/tok" \
  --set "train.batch_schedule=[{step: 0, global_batch_size: 16}]" --set train.exit_interval=0
expect 0 "done: 300 steps, 153600 tokens" "$MEGATRAIN" resume "$WORK/tok-at-100" \
  --set run.dir="$WORK/tok32" --set train.seq_len=32 --set train.exit_interval=0
grep -q "^train: 300 steps, seq_len 32, .* 4000 train samples" "$WORK/out.log" ||
  fail "seq_len 32 from step 100: the samples are the 800 read plus 200 steps of 16: $(grep '^train:' "$WORK/out.log")"

# The lr after a resume that changes the schedule: with decay_steps null a longer train.steps re-stretches the decay,
# which the resume says with both rates (the logged lr of step 21 is the new one); decay_steps set to the old length
# keeps the checkpoint's lr, with no warning.
run "$WORK/lr" 30 --set optimizer.schedule.decay_steps=null > /dev/null
lr_at() { grep -o "\"step\":$2,\"loss\":[^,]*,\"lr\":[^,]*" "$1/metrics.jsonl" | sed 's/.*"lr"://'; }
expect 0 "resume: the learning rate of step 21 is .* under this recipe, .* under the checkpoint's (.*x): optimizer.schedule.decay_steps is null, so the decay spans train.steps, now 60 steps (the checkpoint's run: 30); --set optimizer.schedule.decay_steps=30 keeps its schedule" \
  "$MEGATRAIN" resume "$WORK/lr/checkpoints/iter_0000020" --set run.dir="$WORK/lr60" --set train.steps=60
awk -v a="$(lr_at "$WORK/lr" 21)" -v b="$(lr_at "$WORK/lr60" 21)" 'BEGIN { exit !(b > 1.5 * a) }' \
  || fail "step 21's lr: $(lr_at "$WORK/lr" 21) before, $(lr_at "$WORK/lr60" 21) re-stretched: expected the jump"
"$MEGATRAIN" resume "$WORK/lr/checkpoints/iter_0000020" --set run.dir="$WORK/lr60k" --set train.steps=60 \
  --set optimizer.schedule.decay_steps=30 > "$WORK/lr60k.log" 2>&1 || fail "resume keeping the schedule: $(tail -3 "$WORK/lr60k.log")"
! grep -q "learning rate of step" "$WORK/lr60k.log" || fail "decay_steps kept: $(grep 'learning rate' "$WORK/lr60k.log")"
[[ $(lr_at "$WORK/lr60k" 21) == "$(lr_at "$WORK/lr" 21)" ]] || fail "decay_steps kept: step 21's lr changed"
expect 0 "resume: the learning rate of step 21 is .*: this resume's --set changed optimizer.lr, min_lr or optimizer.schedule" \
  "$MEGATRAIN" resume "$WORK/lr/checkpoints/iter_0000020" --set run.dir="$WORK/lr-x" --set optimizer.lr=1e-2
# warmup_fraction of a null decay_steps re-stretches the warmup too, also with a constant schedule
run "$WORK/lrf" 20 --set optimizer.schedule.decay_steps=null --set optimizer.schedule.warmup_steps=0 \
  --set optimizer.schedule.warmup_fraction=0.5 --set optimizer.schedule.decay=constant --set train.exit_interval=5 > /dev/null
expect 0 "resume: the learning rate of step 6 is .*: optimizer.schedule.decay_steps is null, so the warmup_fraction's share spans train.steps, now 40 steps (the checkpoint's run: 20)" \
  "$MEGATRAIN" resume "$WORK/lrf" --set train.steps=40 --set train.exit_interval=0
echo "an lr moved by a resume's --set: warned with both rates"
