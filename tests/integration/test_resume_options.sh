#!/usr/bin/env bash
# test_resume_options.sh: what resume allows and refuses, and write errors.
# - checkpoint.load_optimizer=false restarts AdamW (other losses, optimizer
#   step counted afresh) and is not carried into later checkpoints;
# - a change of model shape is refused (exit 2, naming the key);
# - `run` into a run.dir with checkpoints is refused (exit 2);
# - an older checkpoint named while newer ones exist is refused, and with
#   --set run.dir=NEW it branches into NEW with the original's losses (its index cache in NEW);
# - a checkpoint copied out of its run continues in its recipe's run.dir when
#   that holds the same checkpoint, and is refused when it holds others
#   (another run's); a run.dir whose name holds a line break resumes there;
# - a finished run has nothing to do (exit 0); a directory without
#   checkpoints is an error (exit 1);
# - a checkpoint that cannot be written (file size limit) stops the run with
#   exit 1 and a message, sync or async, leaving no partial checkpoint;
# - a second process on a run.dir another one is writing (run or resume)
#   is refused (exit 1, naming the holder) before it writes anything.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
run() {
  local dir=$1 steps=$2; shift 2
  "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$dir" --set train.steps="$steps" \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.eval_interval=0 \
    --set checkpoint.interval=10 --set checkpoint.keep_last=3 --set optimizer.schedule.decay_steps=30 \
    --set optimizer.schedule.warmup_steps=5 "$@"
}
losses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$1/metrics.jsonl"; }
# expect STATUS PATTERN CMD...: CMD exits with STATUS and prints PATTERN.
expect() {
  local want=$1 pattern=$2 status=0; shift 2
  "$@" > "$WORK/out.log" 2>&1 || status=$?
  [[ $status -eq $want ]] || fail "$*: exit $status, expected $want: $(tail -n 3 "$WORK/out.log")"
  grep -q -- "$pattern" "$WORK/out.log" || fail "$*: output lacks '$pattern': $(tail -n 3 "$WORK/out.log")"
}

run "$WORK/a" 20 > /dev/null
cp -r "$WORK/a" "$WORK/b"
"$MEGATRAIN" resume "$WORK/a" --set train.steps=30 > "$WORK/a-resume.log" 2>&1
! grep -q "learning rate of step" "$WORK/a-resume.log" || fail "a longer run on its own decay_steps warned of the lr"
expect 0 "optimizer state not loaded" "$MEGATRAIN" resume "$WORK/b" --set train.steps=30 --set checkpoint.load_optimizer=false
[[ "$(losses "$WORK/a" | head -n 20)" == "$(losses "$WORK/b" | head -n 20)" ]] || fail "steps 1-20 differ"
[[ "$(losses "$WORK/a" | sed -n 22p)" != "$(losses "$WORK/b" | sed -n 22p)" ]] \
  || fail "load_optimizer=false gave the same step 22 as loading the optimizer (step 21 is computed before its update)"
"$MEGATRAIN" inspect "$WORK/b" > "$WORK/inspect.txt"
grep -q "step 30 of 30: .* optimizer step 10;" "$WORK/inspect.txt" \
  || fail "a fresh optimizer should have made 10 updates by step 30: $(sed -n 3p "$WORK/inspect.txt")"
grep -q "load_optimizer: true" "$WORK/b/checkpoints/iter_0000030/recipe.yaml" \
  || fail "load_optimizer=false was carried into the next checkpoint's recipe"
echo "load_optimizer=false: restarted AdamW"

expect 2 "model.hidden_size is 64 in the checkpoint but 128 in the recipe" \
  "$MEGATRAIN" resume "$WORK/a" --set train.steps=40 --set model.hidden_size=128
! grep -q "changes" "$WORK/out.log" || fail "a refused resume said what it changes: $(grep changes "$WORK/out.log")"
expect 2 "model.num_layers is 2 in the checkpoint but 3 in the recipe" \
  "$MEGATRAIN" resume "$WORK/a" --set train.steps=40 --set model.num_layers=3
expect 2 "already holds checkpoints (the newest at step 30); continue that run with \`megatrain resume" \
  run "$WORK/a" 40
expect 2 "holds a newer checkpoint (step 30) than the one resumed from (step 10)" \
  "$MEGATRAIN" resume "$WORK/a/checkpoints/iter_0000010"
expect 0 "resume: from .*iter_0000010 at step 10" \
  "$MEGATRAIN" resume "$WORK/a/checkpoints/iter_0000010" --set run.dir="$WORK/branch" --set train.steps=30
[[ "$(losses "$WORK/branch")" == "$(losses "$WORK/a" | sed -n '11,30p')" ]] || fail "the branch does not repeat steps 11-30"
[[ -d "$WORK/branch/checkpoints/iter_0000030" && -d "$WORK/a/checkpoints/iter_0000030" ]] || fail "branch checkpoints misplaced"
# train.exit_interval and train.exit_duration_mins (Megatron's --exit-interval, --exit-duration-in-mins) stop the
# run after a step as SIGTERM does: a checkpoint, exit 0, the line that says how to go on; a resume goes on to the
# next limit, and the pieces give the uninterrupted run's losses
expect 0 "stopped by train.exit_interval after step 7: checkpoint in .*iter_0000007; continue with" run "$WORK/ex" 20 \
  --set train.exit_interval=7
expect 0 "stopped by train.exit_interval after step 14" "$MEGATRAIN" resume "$WORK/ex"
expect 0 "done: 20 steps" "$MEGATRAIN" resume "$WORK/ex"
[[ "$(losses "$WORK/ex")" == "$(losses "$WORK/a" | head -n 20)" ]] || fail "exit_interval: the pieces' losses differ"
expect 0 "stopped by train.exit_duration_mins after step 1: checkpoint in .*iter_0000001" run "$WORK/dur" 20 \
  --set train.exit_duration_mins=1e-6
echo "exit_interval and exit_duration_mins: stopped, saved, resumed to the uninterrupted losses"

# run --resume-if-exists, a requeued job's one command: it starts, then resumes from the newest checkpoint (stopped
# here by exit_interval, as by a preemption), then has nothing to do; the pieces give the uninterrupted losses. A
# recipe file changed in between is refused, naming the key.
expect 0 "no checkpoint in .*: starting the run" run "$WORK/req" 20 --set train.exit_interval=7 --resume-if-exists
expect 0 "holds checkpoints: resuming" run "$WORK/req" 20 --set train.exit_interval=7 --resume-if-exists
grep -q "stopped by train.exit_interval after step 14" "$WORK/out.log" || fail "requeue: $(tail -2 "$WORK/out.log")"
expect 0 "done: 20 steps" run "$WORK/req" 20 --set train.exit_interval=7 --resume-if-exists
expect 0 "nothing to do" run "$WORK/req" 20 --set train.exit_interval=7 --resume-if-exists
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
# a run.dir whose checkpoints were all found unusable (moved aside) is refused, not started afresh over its history
expect 0 "stopped by train.exit_interval after step 5" requeue bad
rm "$WORK/bad/checkpoints/iter_0000005/metadata.mtck"
expect 1 "no valid checkpoint to resume from" requeue bad
expect 1 "holds no valid checkpoint, only ones moved aside as incomplete or corrupt (iter_0000005.invalid" requeue bad
[[ $(grep -c '"step"' "$WORK/bad/metrics.jsonl") -eq 5 ]] || fail "the refused requeue touched metrics.jsonl"
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

# a branch into a run.dir that holds checkpoints (another run's, or another branch's, older ones included) is
# refused: its retention would delete them (it deleted them), and its recipe.yaml and metrics.jsonl be mixed
ls "$WORK/branch/checkpoints" > "$WORK/branch-before.txt"; cp "$WORK/branch/recipe.yaml" "$WORK/branch-recipe.yaml"
expect 2 "run.dir: '.*branch' already holds checkpoints (the newest at step 30) of another run or branch" \
  "$MEGATRAIN" resume "$WORK/a/checkpoints/iter_0000010" --set run.dir="$WORK/branch" --set train.steps=40 \
  --set checkpoint.keep_last=1
[[ "$(ls "$WORK/branch/checkpoints")" == "$(cat "$WORK/branch-before.txt")" ]] &&
  cmp -s "$WORK/branch/recipe.yaml" "$WORK/branch-recipe.yaml" || fail "the refused branch changed the run.dir it named"
# a checkpoint copied out of its run resumes into its recipe's run.dir, the run's own (its checkpoints are this
# run's, none newer): not a branch
run "$WORK/own" 20 > /dev/null
mkdir -p "$WORK/bk"; cp -r "$WORK/own/checkpoints/iter_0000020" "$WORK/bk/"
expect 0 "done: 30 steps" "$MEGATRAIN" resume "$WORK/bk/iter_0000020" --set train.steps=30
[[ -d "$WORK/own/checkpoints/iter_0000030" ]] || fail "the copied checkpoint did not go on in its run.dir"
# ... but not into a run.dir that does not hold that checkpoint: another run's (the recipe's run.dir is often
# relative, so that of whatever directory resume runs in), whose checkpoints retention would delete (it did)
run "$WORK/gone" 20 > /dev/null
cp -r "$WORK/gone/checkpoints/iter_0000020" "$WORK/bk/gone20"
rm -rf "$WORK/gone"; run "$WORK/gone" 10 --set run.seed=7 > /dev/null # another run, at the same run.dir
expect 2 "bk/gone20 is not inside a run's checkpoints/ directory, so the run would continue in its recipe's run.dir, \
'$WORK/gone', which holds checkpoints (the newest at step 10) but not this one" \
  "$MEGATRAIN" resume "$WORK/bk/gone20" --set train.steps=30 --set checkpoint.keep_last=1
[[ "$(ls "$WORK/gone/checkpoints")" == "$(printf 'iter_0000010\nlatest_checkpointed_iteration.txt')" ]] ||
  fail "the refused resume changed the other run's checkpoints: $(ls "$WORK/gone/checkpoints")"
expect 0 "done: 30 steps" "$MEGATRAIN" resume "$WORK/bk/gone20" --set train.steps=30 --set run.dir="$WORK/gone-on"
# run={...} on resume: with a dir it branches there; without one (it replaces the section) the run stays in its own
cp -r "$WORK/own" "$WORK/sect"
expect 0 "done: 31 steps" "$MEGATRAIN" resume "$WORK/sect" --set train.steps=31 --set "run={dir: $WORK/sect-branch}"
[[ -d "$WORK/sect-branch/checkpoints/iter_0000031" && ! -d "$WORK/sect/checkpoints/iter_0000031" ]] ||
  fail "run={dir: NEW} did not branch into NEW"
expect 0 "done: 31 steps" "$MEGATRAIN" resume "$WORK/sect" --set train.steps=31 --set "run={seed: 1234}"
[[ -d "$WORK/sect/checkpoints/iter_0000031" ]] || fail "run={seed: ...} left the run's own directory"
# a run.dir whose name holds a line break resumes there (YAML folded it into a space: another directory)
nl_dir="$WORK/line
break"
cp -r "$WORK/own" "$nl_dir"
expect 0 "done: 31 steps" "$MEGATRAIN" resume "$nl_dir" --set train.steps=31
[[ -d "$nl_dir/checkpoints/iter_0000031" && ! -e "$WORK/line break" ]] || fail "the resume left its run.dir"
nel_dir="$WORK/nel$(printf '\xc2\x85')dir" # U+0085 NEL, which YAML reads as a line break too
cp -r "$WORK/own" "$nel_dir"
expect 0 "done: 31 steps" "$MEGATRAIN" resume "$nel_dir" --set train.steps=31
[[ -d "$nel_dir/checkpoints/iter_0000031" && ! -e "$WORK/nel dir" ]] || fail "the resume left its run.dir (NEL)"
grep -q 'dir: "[^"]*nel\\x85dir"' "$nel_dir/recipe.yaml" || fail "recipe.yaml does not escape NEL: $(grep dir: "$nel_dir/recipe.yaml")"
# a path that is not UTF-8 (which YAML cannot hold): a run directory refused naming it, not a --set; relative data
# paths from such a current directory refused at the start (recipe.yaml could not hold them: no checkpoint of the
# run would have resumed)
bad_dir="$WORK/$(printf 'bad\xff')dir"
cp -r "$WORK/own" "$bad_dir"
expect 2 "resume: $bad_dir: the run directory's path is not UTF-8" "$MEGATRAIN" resume "$bad_dir" --set train.steps=32
expect 0 "done: 32 steps" "$MEGATRAIN" resume "$bad_dir" --set train.steps=32 --set run.dir="$WORK/bad-on" # as it says
(cd "$bad_dir" && expect 2 "data.train\[0\].path: corpus is relative, and the current directory's path is not UTF-8" \
  run "$WORK/bad-cwd" 10 --set "data.train=[corpus]")
echo "a copied checkpoint resumes in its own run.dir, not another run's; run.dir with a line break; non-UTF-8 paths refused"
# a branch only reads its source: a damaged checkpoint there is skipped, not moved aside
cp -r "$WORK/a" "$WORK/src"; rm "$WORK/src/checkpoints/iter_0000030/metadata.mtck"
expect 0 "resume: from .*iter_0000020 at step 20" "$MEGATRAIN" resume "$WORK/src" --set run.dir="$WORK/branch2" \
  --set train.steps=30
[[ -d "$WORK/src/checkpoints/iter_0000030" && ! -e "$WORK/src/checkpoints/iter_0000030.invalid" ]] ||
  fail "a branch moved its source's damaged checkpoint aside: $(ls "$WORK/src/checkpoints")"
# data.cache_dir's default follows run.dir: the recipes say null, and the branch caches its index in its own run.dir
grep -q '^  cache_dir: null$' "$WORK/a/recipe.yaml" "$WORK/a/checkpoints/iter_0000010/recipe.yaml" ||
  fail "the default data.cache_dir was written resolved: $(grep cache_dir "$WORK/a/recipe.yaml")"
ls "$WORK/branch/data-cache/"*.gptidx > /dev/null 2>&1 || fail "the branch did not cache its index in its own run.dir"
expect 0 "nothing to do: the checkpoint is at step 30" "$MEGATRAIN" resume "$WORK/a"
mkdir "$WORK/empty"
expect 1 "holds no checkpoints" "$MEGATRAIN" resume "$WORK/empty"
expect 1 "no such directory" "$MEGATRAIN" resume "$WORK/missing"
expect 2 "unknown key 'train.stpes'" "$MEGATRAIN" resume "$WORK/a" --set train.stpes=40

# Write errors: a 400 KB file size limit (megatrain ignores SIGXFSZ: a write fails with EFBIG, named).
for async in false true; do
  dir="$WORK/full-$async"
  status=0
  (ulimit -f 400; exec "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$dir" \
    --set train.steps=200 --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 \
    --set train.eval_interval=0 --set checkpoint.interval=10 --set checkpoint.async=$async) > "$WORK/full.log" 2>&1 \
    || status=$?
  [[ $status -eq 1 ]] || fail "async=$async: a failed save gave exit $status: $(tail -n 3 "$WORK/full.log")"
  grep -q "error: checkpoint at step 10 failed: .*shard_00000.zst: write failed: File too large" "$WORK/full.log" \
    || fail "async=$async: no clear message: $(grep error "$WORK/full.log")"
  last=$(json_field "$dir/metrics.jsonl" step | tail -n 1)
  [[ $last -lt 200 ]] || fail "async=$async: the run went on to step $last"
  [[ -z "$(ls "$dir/checkpoints")" ]] || fail "async=$async: something was left in checkpoints/: $(ls "$dir/checkpoints")"
  echo "async=$async: save failure stopped the run at step $last with exit 1"
done
# On 2 ranks (dp 2: rank 0 writes the shard) the failed save is every rank's verdict: each rank exits 1, nothing
# is aborted, one error line, nothing left in checkpoints/. (Open MPI over TCP: its shared-memory transport would
# size a file past the limit.)
if command -v mpirun > /dev/null && [[ -z ${TSAN_OPTIONS:-} ]]; then
  for async in false true; do
    dir="$WORK/full-dp2-$async"
    OMPI_MCA_btl=self,tcp stop_together "full-dp2-$async" 2 "$WORK/full-dp2.log" bash -c 'ulimit -f 400; exec "$@"' _ \
      "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$dir" --set train.steps=200 \
      --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.eval_interval=0 \
      --set checkpoint.interval=10 --set checkpoint.async=$async --set train.micro_batch_size=2
    [[ $(grep -c "error: .*checkpoint at step 10 failed: .*write failed: File too large" "$WORK/full-dp2.log") -eq 1 ]] ||
      { cat "$WORK/full-dp2.log"; fail "dp 2, async=$async: expected one error line"; }
    [[ -z "$(ls "$dir/checkpoints")" ]] || fail "dp 2, async=$async: left in checkpoints/: $(ls "$dir/checkpoints")"
    echo "dp 2, async=$async: save failure stopped every rank with exit 1, no abort"
  done
fi

# A resume says what its --set values change, key by key from the checkpoint's recipe, and warns when the run then
# reads other samples or computes another model than the uninterrupted run would (the seed, the data, a model key);
# a value the checkpoint already has (the seed as it was) and the cache directory change nothing read; init_from
# does nothing on a resume and says so
seedrun="$WORK/seedrun"
run "$seedrun" 10 > /dev/null
expect 0 "resume: run.seed changes the samples the run reads or what its model computes" \
  "$MEGATRAIN" resume "$seedrun" --set train.steps=12 --set run.seed=99 --set run.dir="$WORK/seedrun-99"
grep -q "resume: --set changes run.dir .* -> .*seedrun-99\"; run.seed 1234 -> 99; train.steps 10 -> 12; data.cache_dir" \
  "$WORK/out.log" || fail "the changes line: $(grep 'changes' "$WORK/out.log")"
"$MEGATRAIN" resume "$seedrun" --set train.steps=12 --set data.cache_dir="$WORK/cache2" --set run.seed=1234 \
  --set run.dir="$WORK/seedrun-c" > "$WORK/out.log" 2>&1 || fail "resume with the cache dir: $(tail -2 "$WORK/out.log")"
! grep -q "changes the samples" "$WORK/out.log" && ! grep -q "run.seed" "$WORK/out.log" ||
  fail "an unchanged seed or the cache directory warned of: $(grep 'changes' "$WORK/out.log")"
expect 0 "resume: model.rope_theta changes the samples the run reads or what its model computes" \
  "$MEGATRAIN" resume "$seedrun" --set train.steps=12 --set model.rope_theta=500000 --set run.dir="$WORK/seedrun-r" \
  --set init_from="$WORK/a"
grep -q "init_from has no effect on a resume" "$WORK/out.log" || fail "init_from on a resume: not said"

# Entries named like checkpoints that are not (a dangling link, a file, a checkpoint renamed to a later step):
# resume moves each aside as it does a corrupt checkpoint and goes on from the newest that is one (before, a link
# was passed over and the run failed at its save of that step, again at every resume; a renamed one was resumed
# as the newest); inspect warns of the renamed one; a new run refuses a run.dir holding any of them.
names="$WORK/names"
run "$names" 20 > /dev/null
cp -r "$names/checkpoints/iter_0000010" "$WORK/renamed"
rm -rf "$names/checkpoints/iter_0000020"
ln -s /nonexistent/iter_0000020 "$names/checkpoints/iter_0000020"
echo junk > "$names/checkpoints/iter_0000030"
mv "$WORK/renamed" "$names/checkpoints/iter_0000040"
"$MEGATRAIN" inspect "$names/checkpoints/iter_0000040" > /dev/null 2> "$WORK/inspect.err" || true
grep -q "iter_0000040: its name says step 40, its metadata step 10 (renamed or copied?)" "$WORK/inspect.err" ||
  fail "inspect of a renamed checkpoint: $(cat "$WORK/inspect.err")"
expect 0 "resume: from $names/checkpoints/iter_0000010 at step 10" "$MEGATRAIN" resume "$names" --set train.steps=25
for n in 20 30 40; do [[ -e $names/checkpoints/iter_00000$n.invalid || -L $names/checkpoints/iter_00000$n.invalid ]] ||
  fail "iter_00000$n was not moved aside: $(ls "$names/checkpoints")"; done
grep -q "its name says step 40, its metadata step 10" "$WORK/out.log" || fail "the renamed checkpoint's reason: $(cat "$WORK/out.log")"
[[ -d $names/checkpoints/iter_0000020 ]] || fail "the resumed run did not save step 20: $(ls "$names/checkpoints")"
mkdir -p "$WORK/junk/checkpoints" && echo junk > "$WORK/junk/checkpoints/iter_0000010"
expect 2 "already holds checkpoints (the newest at step 10)" run "$WORK/junk" 5
echo "entries that are not checkpoints: moved aside on resume, refused by run"

# One writer a run: while a run trains in run.dir, another `run` or `resume` there is refused naming the holder,
# and changes nothing; after the first stops (SIGTERM: a checkpoint), resume goes on.
busy="$WORK/busy"
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$busy" --set train.steps=100000 --set train.eval_interval=0 \
  --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set checkpoint.interval=20 > "$WORK/busy.log" 2>&1 &
holder=$!
BACKGROUND+=("$holder")
for _ in $(seq 300); do [[ -s $busy/metrics.jsonl ]] && break; sleep 0.1; done
[[ -s $busy/metrics.jsonl ]] || fail "the busy run did not start: $(cat "$WORK/busy.log")"
[[ -e $busy/checkpoints/iter_0000020 ]] && fail "the busy run saved before the second run could try"
cp "$busy/recipe.yaml" "$WORK/busy-recipe.yaml"
expect 1 "run.dir: '$busy' is in use by another megatrain process (pid $holder on " run "$busy" 10
# ... having written nothing there: its own recipe.yaml (10 steps) not written, metrics.jsonl not cut
cmp -s "$busy/recipe.yaml" "$WORK/busy-recipe.yaml" || fail "the refused run wrote recipe.yaml"
[[ $(json_field "$busy/metrics.jsonl" step | head -n 1) == 1 ]] || fail "the refused run cut metrics.jsonl"
for _ in $(seq 300); do [[ -e $busy/checkpoints/iter_0000020 ]] && break; sleep 0.1; done
[[ -e $busy/checkpoints/iter_0000020 ]] || fail "the busy run did not save: $(cat "$WORK/busy.log")"
expect 1 "is in use by another megatrain process (pid $holder on " "$MEGATRAIN" resume "$busy" --set train.steps=200000
kill -0 "$holder" || fail "the busy run ended early: $(tail -n 3 "$WORK/busy.log")"
kill -TERM "$holder"
wait "$holder" || fail "the busy run, stopped by SIGTERM: exit $?: $(tail -n 3 "$WORK/busy.log")"
stopped=$(basename "$(ls -d "$busy"/checkpoints/iter_* | tail -n 1)")
expect 0 "resume: from $busy/checkpoints/$stopped" "$MEGATRAIN" resume "$busy" --set train.steps=$((10#${stopped#iter_} + 2))
echo "one writer a run.dir: a second run and resume refused while the first trains; resume after it stopped"

# Relative data paths are taken from the directory the run started in and written absolute to recipe.yaml and the
# checkpoints, so a resume from another directory (a requeued job's script) reads the same data (it failed, the
# path taken from the new directory); a relative data.cache_dir alike.
mkdir -p "$WORK/start/corpus" "$WORK/elsewhere"
cp "$WORK/english.bin" "$WORK/english.idx" "$WORK/start/corpus/"
(cd "$WORK/start" && run rel 10 --set "data.train=[{path: ./corpus/english, weight: 1.0}]" --set data.cache_dir=cache \
  > /dev/null)
grep -q "{path: \"$WORK/start/corpus/english\", weight: 1}" "$WORK/start/rel/recipe.yaml" \
  || fail "recipe.yaml keeps the relative path: $(grep -A1 ' train:' "$WORK/start/rel/recipe.yaml")"
grep -q "cache_dir: \"$WORK/start/cache\"" "$WORK/start/rel/checkpoints/iter_0000010/recipe.yaml" \
  || fail "the checkpoint keeps the relative cache_dir: $(grep cache_dir "$WORK/start/rel/checkpoints/iter_0000010/recipe.yaml")"
(cd "$WORK/elsewhere" && expect 0 "resume: from $WORK/start/rel/checkpoints/iter_0000010" \
  "$MEGATRAIN" resume "$WORK/start/rel" --set train.steps=12)
[[ -z $(ls -A "$WORK/elsewhere") ]] || fail "the resume wrote into the current directory: $(ls -A "$WORK/elsewhere")"
(cd "$WORK/start" && run same 12 --set "data.train=[{path: corpus/english, weight: 1.0}]" > /dev/null)
[[ "$(losses "$WORK/start/rel")" == "$(losses "$WORK/start/same")" ]] || fail "the resume from elsewhere read other data"
echo "relative data paths: written absolute, a resume from another directory reads the same data"
# a resume with nothing to do leaves run.dir/recipe.yaml as it was (its --set values never ran)
cp "$WORK/a/recipe.yaml" "$WORK/a-recipe.yaml"
expect 0 "nothing to do" "$MEGATRAIN" resume "$WORK/a" --set optimizer.lr=0.001
cmp -s "$WORK/a/recipe.yaml" "$WORK/a-recipe.yaml" || fail "a resume with nothing to do rewrote recipe.yaml"

