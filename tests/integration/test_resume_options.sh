#!/usr/bin/env bash
# test_resume_options.sh: what resume allows and refuses, and write errors.
# - checkpoint.load_optimizer=false restarts AdamW (other losses, optimizer
#   step counted afresh) and is not carried into later checkpoints;
# - a change of model shape is refused (exit 2, naming the key);
# - `run` into a run.dir with checkpoints is refused (exit 2);
# - an older checkpoint named while newer ones exist is refused, and with
#   --set run.dir=NEW it branches into NEW with the original's losses (its index cache in NEW);
# - a branch into a run.dir that holds checkpoints is refused, and a branch
#   only reads its source (a damaged checkpoint there is skipped, not moved);
# - a finished run has nothing to do (exit 0, its last line `done:`,
#   recipe.yaml left as it was); a
#   directory without checkpoints is an error (exit 1);
# - a checkpoint that cannot be written (file size limit) stops the run with
#   exit 1 and a message, sync or async, leaving no partial checkpoint; the
#   last line names the newest checkpoint and how to go on (a full disk: the
#   room retention needs);
# - a resume's --set values are said key by key, once, for the checkpoint
#   resumed, with a warning for those that change what the run reads or what
#   it computes (saying which); an edited run.dir/recipe.yaml is warned of;
#   another micro_batch_size with evaluation on is warned of (other samples).
# test_host_threads_tsan.sh runs this file on the ThreadSanitizer build (its
# async saves, one failing in the writer); stopping and requeueing are in
# test_resume_requeue.sh, which run.dir a resume writes in test_run_dir.sh.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
source "$(dirname "$0")/resume_lib.sh"

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

# a branch into a run.dir that holds checkpoints (another run's, or another branch's, older ones included) is
# refused: its retention would delete them (it deleted them), and its recipe.yaml and metrics.jsonl be mixed
ls "$WORK/branch/checkpoints" > "$WORK/branch-before.txt"; cp "$WORK/branch/recipe.yaml" "$WORK/branch-recipe.yaml"
expect 2 "run.dir: '.*branch' already holds checkpoints (the newest at step 30) of another run or branch" \
  "$MEGATRAIN" resume "$WORK/a/checkpoints/iter_0000010" --set run.dir="$WORK/branch" --set train.steps=40 \
  --set checkpoint.keep_last=1
[[ "$(ls "$WORK/branch/checkpoints")" == "$(cat "$WORK/branch-before.txt")" ]] &&
  cmp -s "$WORK/branch/recipe.yaml" "$WORK/branch-recipe.yaml" || fail "the refused branch changed the run.dir it named"
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
expect 0 "done: the run is complete: its checkpoint is at step 30 of 30" "$MEGATRAIN" resume "$WORK/a"
[[ $(tail -n 1 "$WORK/out.log") == "done: the run is complete: its checkpoint is at step 30 of 30 (nothing to train; \
raise train.steps with --set to go on)" ]] || fail "a finished run's resume: last line $(tail -n 1 "$WORK/out.log")"
mkdir "$WORK/empty"
expect 1 "holds no checkpoints" "$MEGATRAIN" resume "$WORK/empty"
expect 2 "no such directory" "$MEGATRAIN" resume "$WORK/missing" # usage, as every command's missing path
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
  [[ "$(tail -n 1 "$WORK/full.log")" == "megatrain: error: the run stopped after step "*" and has no checkpoint: once \
the cause is fixed, it starts over" ]] || fail "async=$async: the last line does not say what is kept: $(tail -n 1 "$WORK/full.log")"
  last=$(json_field "$dir/metrics.jsonl" step | tail -n 1)
  [[ $last -lt 200 ]] || fail "async=$async: the run went on to step $last"
  [[ -z "$(ls "$dir/checkpoints")" ]] || fail "async=$async: something was left in checkpoints/: $(ls "$dir/checkpoints")"
  echo "async=$async: save failure stopped the run at step $last with exit 1"
done
# A full disk at a later save (fsync failing with ENOSPC in the step-20 checkpoint, tests/integration/fail_fsync.c):
# the last line names the newest checkpoint, the command that continues from it, and the room retention needs. (Not
# on the ThreadSanitizer build, whose runtime is not to be preceded by an LD_PRELOAD library.)
if [[ -z ${TSAN_OPTIONS:-} ]]; then
  cc -shared -fPIC -o "$WORK/fail_fsync.so" "$REPO/tests/integration/fail_fsync.c" -ldl || fail "cannot build fail_fsync.so"
  for async in false true; do
    dir="$WORK/fullater-$async"
    run "$dir" 10 > /dev/null
    status=0
    LD_PRELOAD="$WORK/fail_fsync.so" FAIL_FSYNC_MATCH=iter_0000020.tmp "$MEGATRAIN" resume "$dir" --set train.steps=30 \
      --set checkpoint.async=$async > "$WORK/fullater.log" 2>&1 || status=$?
    [[ $status -eq 1 ]] || fail "async=$async: a full disk at step 20 gave exit $status: $(tail -n 3 "$WORK/fullater.log")"
    [[ "$(tail -n 1 "$WORK/fullater.log")" == "megatrain: error: the run stopped after step "*"; its newest checkpoint is \
$dir/checkpoints/iter_0000010: once the cause is fixed (room for checkpoint.keep_last = 3 checkpoints and the one \
being written: \`megatrain plan\` says how much), \`megatrain resume $dir\` continues from step 10" ]] ||
      fail "async=$async: the last line after a full disk: $(tail -n 2 "$WORK/fullater.log")"
  done
  # a branch into a new run.dir that fails its first save goes on from the checkpoint it branched from (it said the
  # run had no checkpoint and would start over)
  status=0
  LD_PRELOAD="$WORK/fail_fsync.so" FAIL_FSYNC_MATCH=iter_0000020.tmp "$MEGATRAIN" resume \
    "$WORK/fullater-false/checkpoints/iter_0000010" --set run.dir="$WORK/branch-full" --set train.steps=30 \
    --set checkpoint.async=false > "$WORK/branch-full.log" 2>&1 || status=$?
  [[ $status -eq 1 && "$(tail -n 1 "$WORK/branch-full.log")" == "megatrain: error: the run stopped after step 20 and \
has no checkpoint in $WORK/branch-full/checkpoints yet: once the cause is fixed (room for checkpoint.keep_last = 3 \
checkpoints and the one being written: \`megatrain plan\` says how much), \`megatrain resume \
$WORK/fullater-false/checkpoints/iter_0000010 --set run.dir=$WORK/branch-full\` continues from step 10 again" ]] ||
    fail "a branch's failed first save: exit $status: $(tail -n 2 "$WORK/branch-full.log")"
  echo "a failed save's last line names the newest checkpoint (a branch's: the one it came from) and how to go on"
fi
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
expect 0 "resume: run.seed changes the samples the run reads from here on" \
  "$MEGATRAIN" resume "$seedrun" --set train.steps=12 --set run.seed=99 --set run.dir="$WORK/seedrun-99"
grep -q "resume: --set changes run.dir .* -> .*seedrun-99\"; run.seed 1234 -> 99; train.steps 10 -> 12; data.cache_dir" \
  "$WORK/out.log" || fail "the changes line: $(grep 'changes' "$WORK/out.log")"
"$MEGATRAIN" resume "$seedrun" --set train.steps=12 --set data.cache_dir="$WORK/cache2" --set run.seed=1234 \
  --set run.dir="$WORK/seedrun-c" > "$WORK/out.log" 2>&1 || fail "resume with the cache dir: $(tail -2 "$WORK/out.log")"
! grep -q "changes the samples" "$WORK/out.log" && ! grep -q "run.seed" "$WORK/out.log" ||
  fail "an unchanged seed or the cache directory warned of: $(grep 'changes' "$WORK/out.log")"
expect 0 "resume: model.rope_theta changes what its model computes from here on" \
  "$MEGATRAIN" resume "$seedrun" --set train.steps=12 --set model.rope_theta=500000 --set run.dir="$WORK/seedrun-r" \
  --set init_from="$WORK/a"
grep -q "init_from has no effect on a resume" "$WORK/out.log" || fail "init_from on a resume: not said"
! grep -q "changes the samples" "$WORK/out.log" || fail "rope_theta said to change the samples: $(grep warning "$WORK/out.log")"
# said once, for the checkpoint resumed: not for a newer one that then fails to load (a chunk's CRC), nor before
cp -r "$seedrun" "$WORK/seed-crc"
"$MEGATRAIN" resume "$WORK/seed-crc" --set train.steps=20 > /dev/null 2>&1 || fail "seed-crc: to step 20"
python3 -c "import sys; f = open(sys.argv[1], 'r+b'); f.seek(200); b = f.read(1); f.seek(200); f.write(bytes([b[0] ^ 1]))" \
  "$WORK/seed-crc/checkpoints/iter_0000020/shard_00000.zst"
expect 0 "resume: from .*iter_0000010 at step 10" "$MEGATRAIN" resume "$WORK/seed-crc" --set train.steps=21 \
  --set run.seed=5 --set run.dir="$WORK/seed-crc-5"
[[ $(grep -c "resume: --set changes" "$WORK/out.log") -eq 1 && $(grep -c "run.seed changes" "$WORK/out.log") -eq 1 ]] ||
  fail "the --set report, after a checkpoint that did not load: $(grep 'changes' "$WORK/out.log")"
grep -q "run.seed 1234 -> 5; train.steps 10 -> 21" "$WORK/out.log" || fail "not the resumed checkpoint's changes: $(grep 'changes' "$WORK/out.log")"

# run.dir/recipe.yaml edited (resume reads the checkpoint's recipe): said, naming the key and --set; a --set of
# that key is the resume's own choice, not an edit left out
sed -i 's/^  weight_decay: 0.1$/  weight_decay: 0.05/' "$seedrun/recipe.yaml"
expect 0 "resume: $seedrun/recipe.yaml differs from the recipe this resume goes on with (the checkpoint's, with \
the --set values) at 1 key (this resume's value -> the file's): optimizer.weight_decay 0.1 -> 0.05; resume reads \
the checkpoint's recipe, not that file, and rewrites it: to change a key, resume with --set KEY=VALUE" \
  "$MEGATRAIN" resume "$seedrun"
"$MEGATRAIN" resume "$seedrun" --set optimizer.weight_decay=0.05 --set train.steps=11 > "$WORK/out.log" 2>&1 ||
  fail "resume with the edit as --set: $(tail -n 3 "$WORK/out.log")"
! grep -q "differs from the recipe" "$WORK/out.log" || fail "an edit given as --set warned of: $(grep differs "$WORK/out.log")"
"$MEGATRAIN" resume "$seedrun" --set train.steps=12 > "$WORK/out.log" 2>&1 || fail "resume: $(tail -n 3 "$WORK/out.log")"
! grep -q "differs from the recipe" "$WORK/out.log" || fail "an unedited recipe.yaml warned of: $(grep differs "$WORK/out.log")"

# another micro_batch_size with evaluation on: eval_batches counts micro-batches, so eval_loss is measured on other
# samples (with the same weights 3.48 -> 3.22): said, with how to keep them; scaled eval_batches: not said
run "$WORK/ev" 10 --set train.eval_interval=10 > /dev/null
cp -r "$WORK/ev" "$WORK/ev2"
expect 0 "resume: train.eval_batches counts micro-batches: eval_loss is now measured over 4 batches of 4 samples \
instead of 4 of 8 (other samples): the curve is not comparable across this resume; keep train.micro_batch_size 8 or \
scale eval_batches (--set train.eval_batches=8)" \
  "$MEGATRAIN" resume "$WORK/ev" --set train.micro_batch_size=4 --set train.steps=11
"$MEGATRAIN" resume "$WORK/ev2" --set train.micro_batch_size=4 --set train.eval_batches=8 --set train.steps=11 \
  > "$WORK/out.log" 2>&1 || fail "resume with eval_batches scaled: $(tail -n 3 "$WORK/out.log")"
! grep -q "counts micro-batches" "$WORK/out.log" || fail "eval_batches scaled: warned: $(grep micro-batches "$WORK/out.log")"

# a resume with nothing to do leaves run.dir/recipe.yaml as it was (its --set values never ran)
cp "$WORK/a/recipe.yaml" "$WORK/a-recipe.yaml"
expect 0 "the run is complete" "$MEGATRAIN" resume "$WORK/a" --set optimizer.lr=0.001
cmp -s "$WORK/a/recipe.yaml" "$WORK/a-recipe.yaml" || fail "a resume with nothing to do rewrote recipe.yaml"

