#!/usr/bin/env bash
# test_resume.sh: exact resume. 40 steps straight, and 20 steps then
# `megatrain resume --set train.steps=40`, give the same losses bit for bit
# for steps 21-40, with the global batch changing at step 25 and the LR
# schedule spanning the resume point, with async saves on and off. A run
# stopped by SIGTERM (mid-run, even mid-save) saves, exits 0 and resumes to
# the same losses; likewise SIGUSR1. Checks the checkpoint layout, the latest
# pointer (one holding garbage is warned about and ignored), retention
# (keep_last 2) and that metrics.jsonl has each step once. A SIGTERM in a long
# evaluation stops it within a few batches (on 2 ranks and at pp 2 too). A
# token outside the vocabulary past the part of the data checked before the
# first step stops the run cleanly (exit 1 on every rank, the checkpoints
# whole) at the step, or the evaluation, that reads it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
# run DIR STEPS [--set ...]: tiny llama with a schedule that changes after step 20
# (with EXEC=exec, megatrain replaces the shell: for signals to reach it).
run() {
  local dir=$1 steps=$2; shift 2
  ${EXEC:-} "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$dir" --set train.steps="$steps" \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 \
    --set train.eval_interval=10 --set checkpoint.interval=10 --set optimizer.schedule.decay_steps=40 \
    --set optimizer.schedule.warmup_steps=5 \
    --set "train.batch_schedule=[{step: 0, global_batch_size: 8}, {step: 25, global_batch_size: 16}]" "$@"
}
losses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$1/metrics.jsonl"; }

run "$WORK/straight" 40 > "$WORK/straight.log"
grep -q "checkpoint retention: removed .*iter_0000010 (checkpoint.keep_last 2)" "$WORK/straight.log" &&
  grep -q "checkpoint retention: removed .*iter_0000020 (checkpoint.keep_last 2)" "$WORK/straight.log" ||
  fail "no log line for the checkpoints retention removed: $(grep retention "$WORK/straight.log")"
# each removal is said after the save that made it due (iter_0000010's after iter_0000030's "saved")
[[ "$(grep -E '^checkpoint(: saved| retention)' "$WORK/straight.log" | sed -E 's/.*(saved|removed) [^ ]*iter_0*([0-9]+).*/\1 \2/' |
  tr '\n' ' ')" == "saved 10 saved 20 saved 30 removed 10 saved 40 removed 20 " ]] ||
  fail "checkpoint lines out of order: $(grep -E '^checkpoint' "$WORK/straight.log")"
[[ $(losses "$WORK/straight" | wc -l) -eq 40 ]] || fail "straight run: expected 40 logged steps"
ck="$WORK/straight/checkpoints"
[[ "$(cat "$ck/latest_checkpointed_iteration.txt")" == 40 ]] || fail "latest pointer is not 40"
[[ "$(ls "$ck" | tr '\n' ' ')" == "iter_0000030 iter_0000040 latest_checkpointed_iteration.txt " ]] \
  || fail "expected iter_0000030, iter_0000040 (keep_last 2) and the pointer, found: $(ls "$ck")"
for f in metadata.mtck model.yaml recipe.yaml shard_00000.zst; do
  [[ -s "$ck/iter_0000040/$f" ]] || fail "iter_0000040/$f missing"
done
# (Under ThreadSanitizer, test_host_threads_tsan.sh: neither keep_last 0, which the straight run's saves cover, nor
# the synchronous saves, which start no thread: 35 s there.)
if [[ ${MT_SANITIZE:-0} != 1 ]]; then
  run "$WORK/keep-all" 30 --set checkpoint.keep_last=0 --set train.eval_interval=0 > "$WORK/keep-all.log"
  [[ "$(ls "$WORK/keep-all/checkpoints" | tr '\n' ' ')" == "iter_0000010 iter_0000020 iter_0000030 latest_checkpointed_iteration.txt " ]] &&
    ! grep -q "retention" "$WORK/keep-all.log" || fail "keep_last 0 should keep every checkpoint: $(ls "$WORK/keep-all/checkpoints")"
fi
grep -q "global_batch_size\":16" "$WORK/straight/metrics.jsonl" || fail "the batch schedule did not change"

for async in true $([[ ${MT_SANITIZE:-0} == 1 ]] || echo false); do
  dir="$WORK/resumed-$async"
  run "$dir" 20 --set checkpoint.async=$async > /dev/null
  [[ "$(cat "$dir/checkpoints/latest_checkpointed_iteration.txt")" == 20 ]] || fail "async=$async: no checkpoint at 20"
  pointer="$dir/checkpoints/latest_checkpointed_iteration.txt"
  if [[ $async == false ]]; then printf 'twenty\n' > "$pointer"; fi  # a damaged pointer: warned about, not used
  "$MEGATRAIN" resume "$dir" --set train.steps=40 > "$WORK/resume-$async.log" 2>&1
  grep -q "resume: from .*iter_0000020 at step 20" "$WORK/resume-$async.log" || fail "async=$async: did not resume at 20"
  if [[ $async == false ]]; then
    grep -qF "warning: $pointer holds 'twenty', not a step number; ignoring it: resuming from the newest checkpoint directory, iter_0000020" \
      "$WORK/resume-$async.log" || fail "no warning about the damaged pointer: $(head -n 3 "$WORK/resume-$async.log")"
    [[ "$(cat "$pointer")" == 40 ]] || fail "the damaged pointer was not replaced by the next save"
  fi
  diff <(losses "$WORK/straight") <(losses "$dir") > "$WORK/diff.txt" \
    || fail "async=$async: losses differ from the straight run: $(head -n 4 "$WORK/diff.txt")"
  grep -q "^train:$" "$dir/recipe.yaml" && grep -q "steps: 40" "$dir/recipe.yaml" \
    || fail "async=$async: run.dir/recipe.yaml does not record train.steps 40"
  echo "async=$async: steps 21-40 identical"
done

# SIGTERM during a long evaluation (200,000 batches: minutes): it stops within a few batches, as a preemption's
# grace period needs, the step's checkpoint is saved and the run exits 0. On 2 ranks (an odd number of batches: the
# ranks evaluate different counts) the signal reaches rank 1 alone: rank 0 learns it in the evaluation's check; at
# pp 2 the pipeline evaluates in rounds and the signal reaches the last stage alone.
# (Under ThreadSanitizer, test_host_threads_tsan.sh, only the one-rank run: it reports Open MPI's own locks.)
for layout in 1 $([[ -n ${TSAN_OPTIONS:-} ]] || echo dp2 pp2); do
  dir="$WORK/eval-signal-$layout"
  cmd=("$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$dir" --set train.steps=4
       --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set optimizer.schedule.warmup_steps=1
       --set logging.interval=1 --set train.eval_interval=2 --set train.eval_batches=200001 --set checkpoint.interval=100
       --set train.micro_batch_size=4)
  [[ $layout == pp2 ]] && cmd+=(--set parallel.pp=2)
  if [[ $layout == 1 ]]; then "${cmd[@]}" > "$WORK/eval-signal.log" 2>&1 &
  else mpirun --allow-run-as-root --oversubscribe -np 2 "${cmd[@]}" > "$WORK/eval-signal.log" 2>&1 &
  fi
  pid=$!
  for _ in $(seq 1 3000); do [[ -f "$dir/metrics.jsonl" && -s "$dir/metrics.jsonl" ]] && break; sleep 0.02; done
  sleep 2 # into step 2's evaluation
  target=$pid
  [[ $layout == 1 ]] || target=$(rank_pid "$pid" 1)
  [[ -n "$target" ]] || fail "eval signal: no rank 1 process"
  kill -TERM "$target"
  killed_at=$SECONDS
  wait_gone "$pid" 60 "eval signal ($layout): still running 60 s after SIGTERM: $(tail -n 3 "$WORK/eval-signal.log")"
  status=0; wait "$pid" || status=$?
  [[ $status -eq 0 ]] || fail "eval signal ($layout): exit status $status: $(tail -n 5 "$WORK/eval-signal.log")"
  grep -q "evaluation stopped by a signal after [0-9]* of 200001 batches" "$WORK/eval-signal.log" ||
    fail "eval signal ($layout): the evaluation was not stopped: $(tail -n 5 "$WORK/eval-signal.log")"
  grep -q "stopped by SIGTERM after step 2" "$WORK/eval-signal.log" ||
    fail "eval signal ($layout): $(tail -n 3 "$WORK/eval-signal.log")"
  [[ "$(cat "$dir/checkpoints/latest_checkpointed_iteration.txt")" == 2 ]] ||
    fail "eval signal ($layout): no checkpoint of step 2"
  echo "SIGTERM in an evaluation ($layout): stopped in $((SECONDS - killed_at)) s, step 2 saved"
done
# a pp 2 checkpoint resumed on one rank: the refusal says how to set this launch's layout, the pipeline split
# (vpp, pp_layers, which a checkpoint may hold) included
if [[ -d "$WORK/eval-signal-pp2" ]]; then
  status=0
  "$MEGATRAIN" resume "$WORK/eval-signal-pp2" --set train.eval_batches=1 > "$WORK/pp-hint.log" 2>&1 || status=$?
  [[ $status -eq 2 ]] && grep -q "with pp 1 --set parallel.vpp=1 --set parallel.pp_layers=null)" "$WORK/pp-hint.log" ||
    fail "pp 2 on one rank: $status $(cat "$WORK/pp-hint.log")"
  status=0
  "$MEGATRAIN" resume "$WORK/eval-signal-pp2" --set parallel.pp=1 --set "parallel.pp_layers=[1, 1]" \
    > "$WORK/pp-hint.log" 2>&1 || status=$?
  [[ $status -eq 2 ]] && grep -q "parallel.pp_layers: expected one layer count per pipeline stage" "$WORK/pp-hint.log" &&
    grep -q "(the checkpoint's pipeline split: a resume on another pp sets its own, e.g. --set parallel.pp_layers=null --set parallel.vpp=1)" "$WORK/pp-hint.log" ||
    fail "pp_layers of 2 stages at pp 1: $status $(cat "$WORK/pp-hint.log")"
fi

# SIGTERM while saving every step slowly (so the signal lands in a save or a
# step), then resume without the slowness; SIGUSR1 and SIGHUP (the terminal closed) alike (SIGUSR1, SIGHUP and the
# SIGPIPE case below, the same handler as SIGTERM's, not under the sanitizers: test_host_threads_tsan runs this file,
# and each took a minute more there).
names=(TERM)
[[ ${MT_SANITIZE:-0} == 1 ]] || names+=(USR1 HUP)
for name in "${names[@]}"; do
  sig=$name dir="$WORK/signal-$name"
  (export MEGATRAIN_TEST_SLOW_SAVE_MS=3 EXEC=exec
   run "$dir" 40 --set checkpoint.interval=1 --set checkpoint.async=false > "$WORK/$name.log" 2>&1) &
  pid=$!  # megatrain itself (exec), not a shell
  for _ in $(seq 1 3000); do  # up to a minute on a busy machine
    [[ -f "$dir/metrics.jsonl" && $(wc -l < "$dir/metrics.jsonl") -ge 3 ]] && break
    sleep 0.02
  done
  kill -$sig $pid
  status=0; wait $pid || status=$?
  [[ $status -eq 0 ]] || fail "$name: exit status $status: $(tail -n 3 "$WORK/$name.log")"
  stopped=$(json_field "$dir/metrics.jsonl" step | tail -n 1)
  [[ $stopped -lt 40 ]] || fail "$name: the run was not stopped early"
  grep -q "stopped by SIG$sig after step $stopped" "$WORK/$name.log" || fail "$name: no stop message: $(tail -n 2 "$WORK/$name.log")"
  [[ "$(cat "$dir/checkpoints/latest_checkpointed_iteration.txt")" == "$stopped" ]] \
    || fail "$name: latest checkpoint is not the step it stopped at ($stopped)"
  "$MEGATRAIN" resume "$dir" > /dev/null
  diff <(losses "$WORK/straight") <(losses "$dir") > "$WORK/diff.txt" \
    || fail "$name: resumed losses differ: $(head -n 4 "$WORK/diff.txt")"
  echo "$name at step $stopped: resumed identically"
done

# SIGPIPE: what reads the run's output goes away (`| head`, a killed tee): the run saves after the step and exits 0
# rather than dying with the steps since its last checkpoint; the resumed run's losses are the straight run's.
if [[ ${MT_SANITIZE:-0} != 1 ]]; then
dir="$WORK/signal-PIPE"
set +o pipefail
run "$dir" 40 --set checkpoint.interval=100 2> "$WORK/PIPE.err" | head -n 12 > /dev/null
status=${PIPESTATUS[0]}
set -o pipefail
[[ $status -eq 0 ]] || fail "PIPE: exit status $status: $(tail -n 3 "$WORK/PIPE.err")"
stopped=$(json_field "$dir/metrics.jsonl" step | tail -n 1)
[[ $stopped -lt 40 && "$(cat "$dir/checkpoints/latest_checkpointed_iteration.txt")" == "$stopped" ]] ||
  fail "PIPE: stopped at step $stopped, latest checkpoint $(cat "$dir/checkpoints/latest_checkpointed_iteration.txt" 2> /dev/null)"
"$MEGATRAIN" resume "$dir" > /dev/null
diff <(losses "$WORK/straight") <(losses "$dir") > "$WORK/diff.txt" || fail "PIPE: resumed losses differ: $(head -n 4 "$WORK/diff.txt")"
echo "PIPE at step $stopped: saved, resumed identically"
fi

# SIGTERM to both ranks of a dp 2 run, then again every 10 ms for 1.5 s (a scheduler's to every rank and mpirun's
# forwarded copy land in the final save, MPI's teardown and the exit): every rank still exits 0 with the stop
# message and the step's checkpoint (the teardown had put the default handler back: a late one ended a rank with
# 143, and mpirun with it). (Not under ThreadSanitizer, test_host_threads_tsan.sh: it reports Open MPI's own locks.)
if command -v mpirun > /dev/null && [[ -z ${TSAN_OPTIONS:-} ]]; then
  dir="$WORK/signal-again"
  mpirun --allow-run-as-root --oversubscribe -np 2 "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" \
    --set run.dir="$dir" --set train.steps=400 --set "data.train=[{path: $WORK/english, weight: 1.0}]" \
    --set train.micro_batch_size=4 --set checkpoint.interval=100 --set logging.interval=1 > "$WORK/again.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 3000); do [[ -s "$dir/metrics.jsonl" ]] && break; sleep 0.02; done
  ranks="$(rank_pid "$pid" 0) $(rank_pid "$pid" 1)"
  [[ $(wc -w <<< "$ranks") -eq 2 ]] || fail "signal again: the ranks' pids: '$ranks'"
  # shellcheck disable=SC2086
  for _ in $(seq 1 150); do kill -TERM $ranks 2> /dev/null || true; sleep 0.01; done
  status=0; wait "$pid" || status=$?
  stopped=$(json_field "$dir/metrics.jsonl" step | tail -n 1)
  [[ $status -eq 0 ]] && grep -q "stopped by SIGTERM after step $stopped" "$WORK/again.log" &&
    [[ "$(cat "$dir/checkpoints/latest_checkpointed_iteration.txt")" == "$stopped" ]] ||
    fail "SIGTERM again and again: exit $status: $(tail -n 4 "$WORK/again.log")"
  echo "SIGTERM repeated on both ranks: exit 0, step $stopped saved"
fi

# A token outside the vocabulary past the 2^24 tokens a run checks before its first step (late_bad_data: 64 of its
# 4160 documents hold them): the step that reads it stops the run with exit 1 and the dataset's error (its file,
# the token, a sequence past those 2^24 tokens and the place in it), printed once per dp replica that read one, not
# the model's "input token ... outside the vocabulary" (exit 2, a save in flight abandoned). The step is not
# applied; the save in flight completes: every checkpoint left is whole, none half-written, the latest pointer names
# the step before. Training data on one rank and on 2 (dp 2); validation data (data.split's share: the later
# documents, which the check before the first step does not reach) at the first evaluation, on 2 ranks (pp 2). On
# 2 ranks every rank exits 1 with no MPI abort (mpirun told to wait for all, each rank's status recorded), and
# mpirun, left to end the job at the first non-zero status, exits 1.
late_bad_data "$WORK/late" 64
bad_cmd() { # NAME SETTINGS...: BAD, the command line of a run into $WORK/NAME on the late data
  local name=$1
  shift
  BAD=("$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/$name" --set train.steps=40
       --set "data.train=[{path: $WORK/late, weight: 1.0}]" --set optimizer.schedule.warmup_steps=1
       --set logging.interval=1 --set checkpoint.interval=1 --set checkpoint.async=true "$@")
}
bad_run() { # NAME NP SETTINGS...: that run on NP ranks; STATUS its exit status (NP > 1: each rank's, when all agree)
  local name=$1 np=$2
  shift 2
  bad_cmd "$name" "$@"
  status=0
  if [[ $np -eq 1 ]]; then timeout 120 "${BAD[@]}" > "$WORK/$name.log" 2>&1 || status=$?; return; fi
  stop_together "$name" "$np" "$WORK/$name.log" "${BAD[@]}"
  status=1
}
# expect_bad_stop NAME WHAT ERRORS: bad_run NAME stopped as said above, WHAT ("training data", "evaluation:
# validation data") leading the error, ERRORS its lines on stderr ("1", "1|2")
expect_bad_stop() {
  local name=$1 what=$2 errors=$3 log="$WORK/$1.log" ck="$WORK/$1/checkpoints" pattern n step
  [[ $status -eq 1 ]] || { tail -n 5 "$log"; fail "$name: exit status $status, expected 1"; }
  pattern="^megatrain: error: (rank [0-9]: )?step [0-9]+: $what: $WORK/late: token 300 \(token [0-9]+ of sequence "
  pattern+="(409[6-9]|41[0-9][0-9])\) is outside the model's vocabulary \[0, 256\): was the dataset built with "
  pattern+="another tokenizer than the model's\? \(\`megatrain data inspect $WORK/late --tokenizer MODEL_DIR\` shows "
  pattern+="its ids\); stopping the run"
  n=$(grep -cE "$pattern" "$log" || true)
  [[ $n =~ ^($errors)$ ]] || { cat "$log"; fail "$name: $n error lines naming the dataset, expected $errors"; }
  ! grep -qE "model_forward|MPI_ABORT|stopping the job" "$log" || { cat "$log"; fail "$name: not a clean stop"; }
  step=$(grep -oE "step [0-9]+: $what" "$log" | head -n 1 | sed -E 's/^step ([0-9]+):.*/\1/')
  [[ $step -gt 1 ]] || fail "$name: stopped at step $step, expected a checkpoint before it"
  [[ $(json_field "$WORK/$name/metrics.jsonl" step | tail -n 1) -eq $((step - 1)) ]] ||
    fail "$name: metrics.jsonl should end at step $((step - 1)): $(tail -n 1 "$WORK/$name/metrics.jsonl")"
  ! ls "$ck" | grep -v -E '^(iter_[0-9]{7}|latest_checkpointed_iteration.txt)$' ||
    fail "$name: a half-written checkpoint was left: $(ls "$ck")"
  n=$(check_checkpoints "$ck")
  [[ "$(cat "$ck/latest_checkpointed_iteration.txt")" == $((step - 1)) ]] ||
    fail "$name: the latest checkpoint is $(cat "$ck/latest_checkpointed_iteration.txt"), expected $((step - 1))"
  echo "$name: stopped at step $step with exit 1 ($what), $n whole checkpoint(s), the last of step $((step - 1))"
}
# the test share (data.split's third: here the bad documents, with no validation share) is evaluated after the
# last step; a token it refuses costs the test loss only: the run is trained, it exits 0 with its last checkpoint
bad_run late-test 1 --set "data.split=[4096, 0, 64]" --set train.steps=3 --set train.eval_interval=3 \
  --set train.eval_batches=2
[[ $status -eq 0 ]] || fail "late-test: exit $status: $(tail -n 3 "$WORK/late-test.log")"
grep -q "evaluation is off during training: .*; data.split's test share of data.train is evaluated after the last step" \
  "$WORK/late-test.log" &&
  grep -q "step 3: evaluation: test data: .*: no test_loss (the run's last checkpoint is saved as usual)" \
    "$WORK/late-test.log" && [[ "$(cat "$WORK/late-test/checkpoints/latest_checkpointed_iteration.txt")" == 3 ]] ||
  fail "late-test: $(grep -E 'warning|error' "$WORK/late-test.log")"
! grep -q '"test_loss"' "$WORK/late-test/metrics.jsonl" || fail "late-test: a test_loss from refused data"
echo "a bad token in the test share: no test_loss, exit 0, step 3 saved"
bad_run late-train 1 --set "data.split=[1, 0, 0]"
expect_bad_stop late-train "training data" 1
if [[ -z ${TSAN_OPTIONS:-} ]]; then # (ThreadSanitizer reports Open MPI's own locks: see the evaluation signal above)
  dp=(--set "data.split=[1, 0, 0]" --set train.micro_batch_size=2)
  bad_run late-train-dp 2 "${dp[@]}"
  expect_bad_stop late-train-dp "training data" "1|2"
  bad_run late-valid-pp 2 --set "data.split=[4096, 64, 0]" --set train.eval_interval=3 --set train.eval_batches=2 \
    --set parallel.pp=2
  expect_bad_stop late-valid-pp "evaluation: validation data" 1
  # a checkpoint that does not fit the recipe on one rank only (pp 2, MoE on the second stage alone, resumed with
  # expert_bias: only that stage needs a tensor the checkpoint lacks) is refused by every rank together, said
  # once, exit 2, nothing moved aside (before, rank 0 took it for unreadable and rank 1 aborted the job)
  moe=("$MEGATRAIN" run "$REPO/recipes/tiny/qwen3_moe.yaml" --set run.dir="$WORK/moe-pp2" --set train.steps=4
       --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set optimizer.schedule.warmup_steps=1
       --set "model.moe.layer_freq=[0, 1]" --set parallel.pp=2 --set train.eval_interval=0)
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "${moe[@]}" > "$WORK/moe-pp2.log" 2>&1 ||
    fail "moe pp 2: $(tail -n 3 "$WORK/moe-pp2.log")"
  ranks_end 2 moe-pp2-bias 2 "$WORK/moe-pp2-bias.log" "$MEGATRAIN" resume "$WORK/moe-pp2" --set train.steps=6 \
    --set model.moe.load_balancing=expert_bias
  [[ $(grep -c "has no tensor 'layers.1.mlp.router.expert_bias': its routers were trained without expert biases" "$WORK/moe-pp2-bias.log") -eq 1 ]] &&
    [[ -d "$WORK/moe-pp2/checkpoints/iter_0000004" && -z $(ls "$WORK/moe-pp2/checkpoints" | grep invalid) ]] ||
    fail "a checkpoint that fits one rank only: $(cat "$WORK/moe-pp2-bias.log"; ls "$WORK/moe-pp2/checkpoints")"
  echo "a checkpoint missing a tensor one stage needs: refused by both ranks with exit 2, said once"
  bad_cmd late-train-mpirun "${dp[@]}"
  status=0
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "${BAD[@]}" > "$WORK/late-train-mpirun.log" 2>&1 ||
    status=$?
  expect_bad_stop late-train-mpirun "training data" "1|2"
fi
