#!/usr/bin/env bash
# test_run_dir.sh: which run directory a resume writes, and what it refuses.
# - a checkpoint copied out of its run resumes in its recipe's run.dir when
#   that holds it, and is refused over another run's; run={...} on resume;
#   run.dir names holding a line break (or U+0085) resume there; paths that
#   are not UTF-8 are refused, naming them;
# - entries named like checkpoints that are not (a dangling link, a file, a
#   renamed checkpoint) stop resume (exit 1, nothing moved) and are refused
#   by run, which says what they are;
# - one writer a run.dir: a second `run` or `resume` there is refused while
#   the first trains (exit 1, naming the holder) and changes nothing; a run
#   or resume refused after taking the lock does not keep the next one out; a run refused in a run.dir that
#   was there (data it cannot open, a model too large, run.dir/tensorboard a file) leaves its metrics.jsonl and
#   recipe.yaml as they were, and its lock file and data index keep no later run out;
# - relative data paths are written absolute, so a resume from another
#   directory reads the same data;
# - a run.dir that is a file, or under one, is refused as such;
# - run.dir/checkpoints may be a link to another file system: saves, retention and resume go through it.
# (Split from test_resume_options.sh, which test_host_threads_tsan.sh runs on
# the ThreadSanitizer build.)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
source "$(dirname "$0")/resume_lib.sh"

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

# Entries named like checkpoints that are not (a dangling link: an archive volume not mounted; a file; a
# checkpoint renamed or copied to another step's name): resume stops at each (exit 1), naming it and how to fix
# it, moves nothing aside and tries no older checkpoint (it used to rename each to .invalid and fall back: the
# newest state behind an unmounted volume lost, the link renamed); fixed, it goes on. inspect warns of the renamed
# one; a new run refuses a run.dir holding any of them, saying what it is.
names="$WORK/names"
ck="$names/checkpoints"
run "$names" 20 > /dev/null
cp -r "$ck/iter_0000010" "$WORK/renamed"
mv "$ck/iter_0000020" "$WORK/iter_0000020"
ln -s "$WORK/archive/iter_0000020" "$ck/iter_0000020"
expect 1 "resume: $ck/iter_0000020 is named like a checkpoint but is a symbolic link to '$WORK/archive/iter_0000020', \
which does not exist (a volume that is not mounted?); nothing was moved aside and no older checkpoint tried: mount \
what it links to" "$MEGATRAIN" resume "$names" --set train.steps=25
no_invalid() { [[ -z $(ls -d "$ck"/*.invalid* 2> /dev/null) ]] || fail "$1: moved aside: $(ls "$ck")"; }
no_invalid "a dangling link"
[[ -L $ck/iter_0000020 ]] || fail "the dangling link was not left as it was: $(ls -l "$ck")"
mkdir "$WORK/archive" && mv "$WORK/iter_0000020" "$WORK/archive/" # the volume mounted: the newest state is used
expect 0 "resume: from $ck/iter_0000020 at step 20" "$MEGATRAIN" resume "$names"
echo junk > "$ck/iter_0000030"
expect 1 "resume: $ck/iter_0000030 is named like a checkpoint but is a regular file; nothing was moved aside and no \
older checkpoint tried: remove it (or move it out of checkpoints/), and resume again" "$MEGATRAIN" resume "$names"
no_invalid "a file"
[[ $(cat "$ck/iter_0000030") == junk ]] || fail "the file named like a checkpoint changed"
rm "$ck/iter_0000030"
mv "$WORK/renamed" "$ck/iter_0000040"
"$MEGATRAIN" inspect "$ck/iter_0000040" > /dev/null 2> "$WORK/inspect.err" || true
grep -q "iter_0000040: its name says step 40, its metadata step 10 (renamed or copied?): a resume of its run stops \
at it (exit 1) until it is renamed back to iter_0000010 or removed" "$WORK/inspect.err" ||
  fail "inspect of a renamed checkpoint: $(cat "$WORK/inspect.err")"
expect 1 "resume: $ck/iter_0000040: its name says step 40, its metadata step 10 (renamed or copied?); nothing was \
moved aside and no older checkpoint tried: remove it (a copy? $ck/iter_0000010 is there), and resume again" \
  "$MEGATRAIN" resume "$names" --set train.steps=25
no_invalid "a copy renamed"
rm -rf "$ck/iter_0000010"
expect 1 "metadata step 10 (renamed or copied?); .*: rename it back to $ck/iter_0000010 (or remove it)" \
  "$MEGATRAIN" resume "$names" --set train.steps=25
mv "$ck/iter_0000040" "$ck/iter_0000010"
expect 0 "done: 25 steps" "$MEGATRAIN" resume "$names" --set train.steps=25
no_invalid "the entries fixed"
mkdir -p "$WORK/junk/checkpoints" && echo junk > "$WORK/junk/checkpoints/iter_0000500"
expect 2 "run.dir: '$WORK/junk' holds no checkpoint, but $WORK/junk/checkpoints/iter_0000500 is named like one and is \
a regular file: a save of that step would collide with it; remove it, or choose another run.dir" run "$WORK/junk" 5
ln -s "$WORK/nowhere" "$WORK/junk/checkpoints/iter_0000600"
expect 2 "iter_0000600 (among others) is named like one and is a symbolic link to '$WORK/nowhere', which does not \
exist (a volume that is not mounted?): a save of that step would collide with it; mount what it links to and" \
  run "$WORK/junk" 5
echo "entries that are not checkpoints: resume stops at them, moving nothing; refused by run, said what they are"

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
# with checkpoints there, `run` says the run is in use, not "continue it with megatrain resume" (which is refused)
expect 1 "run.dir: '$busy' is in use by another megatrain process (pid $holder on " run "$busy" 10
expect 1 "is in use by another megatrain process (pid $holder on " "$MEGATRAIN" resume "$busy" --set train.steps=200000
kill -0 "$holder" || fail "the busy run ended early: $(tail -n 3 "$WORK/busy.log")"
kill -TERM "$holder"
wait "$holder" || fail "the busy run, stopped by SIGTERM: exit $?: $(tail -n 3 "$WORK/busy.log")"
stopped=$(basename "$(ls -d "$busy"/checkpoints/iter_* | tail -n 1)")
expect 0 "resume: from $busy/checkpoints/$stopped" "$MEGATRAIN" resume "$busy" --set train.steps=$((10#${stopped#iter_} + 2))
echo "one writer a run.dir: a second run and resume refused while the first trains; resume after it stopped"

# A run or resume refused after it took the lock (data it cannot open, a model that does not fit) leaves
# run.dir/.megatrain.lock behind: the lock is an flock(2) on that file, which the kernel drops when the process
# ends, so the file alone holds nothing. With the recipe fixed, the same command goes on, no file removed by hand.
refused="$WORK/refused" gone="[{path: $WORK/nothere, weight: 1.0}]"
mkdir -p "$refused" # made beforehand (a job script's), so a refused run leaves it and its lock file
expect 1 "data.train\[0\].path: $WORK/nothere.idx: cannot open" run "$refused" 10 --set "data.train=$gone"
expect 2 "model.hidden_size: the model does not fit" run "$refused" 10 --set model.hidden_size=65536 \
  --set model.num_attention_heads=512 --set model.num_key_value_heads=512 --set model.num_layers=64
[[ -e $refused/.megatrain.lock ]] || fail "the refused runs left no lock file (this check is moot)"
expect 0 "done: 10 steps" run "$refused" 10
expect 1 "cannot open" "$MEGATRAIN" resume "$refused" --set train.steps=12 --set "data.train=$gone"
expect 0 "done: 12 steps" "$MEGATRAIN" resume "$refused" --set train.steps=12
expect 1 "cannot open" "$MEGATRAIN" resume "$refused" --set train.steps=14 --set run.dir="$WORK/refused-on" \
  --set "data.train=$gone"
[[ $(ls -A "$WORK/refused-on") == .megatrain.lock ]] || fail "the refused branch left: $(ls -A "$WORK/refused-on")"
expect 0 "done: 14 steps" "$MEGATRAIN" resume "$refused" --set train.steps=14 --set run.dir="$WORK/refused-on"
echo "refused after the lock (data, a model too large): the lock file left holds nothing; the fixed command goes on"
# ... and leaves a run.dir that was there as it found it: an earlier attempt's metrics.jsonl (a job killed before its
# first checkpoint) was cut to nothing and its recipe.yaml replaced by the refused one's, before the data was opened
kept="$WORK/kept"
run "$kept" 6 > /dev/null && rm -rf "$kept/checkpoints" # the attempt's files, without a checkpoint
cp "$kept/metrics.jsonl" "$WORK/kept-metrics" && cp "$kept/recipe.yaml" "$WORK/kept-recipe"
expect 1 "data.train\[0\].path: $WORK/nothere.idx: cannot open" run "$kept" 10 --set "data.train=$gone"
expect 2 "model.hidden_size: the model does not fit" run "$kept" 10 --set model.hidden_size=65536 \
  --set model.num_attention_heads=512 --set model.num_key_value_heads=512 --set model.num_layers=64
cmp -s "$kept/metrics.jsonl" "$WORK/kept-metrics" || fail "a refused run changed metrics.jsonl: $(wc -l < "$kept/metrics.jsonl") lines"
cmp -s "$kept/recipe.yaml" "$WORK/kept-recipe" || fail "a refused run rewrote recipe.yaml"
expect 0 "done: 10 steps" run "$kept" 10 # accepted: a fresh metrics.jsonl and its own recipe
[[ "$(json_field "$kept/metrics.jsonl" step | tr '\n' ' ')" == "1 2 3 4 5 6 7 8 9 10 " ]] ||
  fail "the accepted run's metrics.jsonl: $(json_field "$kept/metrics.jsonl" step | tr '\n' ' ')"
grep -q '^  steps: 10$' "$kept/recipe.yaml" || fail "the accepted run did not write its recipe.yaml"
echo "a refused run leaves an existing run.dir's metrics.jsonl and recipe.yaml as they were"
# ... also when refused after the data was opened, for what a writer of the run needs: run.dir/tensorboard a file,
# where the TensorBoard writer makes its directory (it cut metrics.jsonl and replaced recipe.yaml first). The lock
# file and the data's index cache it leaves do not keep the next run out: the index is valid, and reused as it is.
tbf="$WORK/tbfile"
run "$tbf" 6 > /dev/null && rm -rf "$tbf/checkpoints" "$tbf/data-cache"
cp "$tbf/metrics.jsonl" "$WORK/tbf-metrics" && cp "$tbf/recipe.yaml" "$WORK/tbf-recipe"
printf 'notes\n' > "$tbf/tensorboard"
expect 1 "logging.tensorboard: $tbf/tensorboard: exists and is not a directory" run "$tbf" 10 \
  --set logging.tensorboard=true
cmp -s "$tbf/metrics.jsonl" "$WORK/tbf-metrics" || fail "a run refused for tensorboard cut metrics.jsonl: $(wc -l < "$tbf/metrics.jsonl") lines"
cmp -s "$tbf/recipe.yaml" "$WORK/tbf-recipe" || fail "a run refused for tensorboard rewrote recipe.yaml"
[[ "$(cat "$tbf/tensorboard")" == notes ]] || fail "the file named tensorboard changed"
index=$(ls "$tbf"/data-cache/*.gptidx) && stat -c '%i %Y %s' "$index" > "$WORK/tbf-index" ||
  fail "the refused run left no index in data-cache/: $(ls -A "$tbf")"
rm "$tbf/tensorboard"
expect 0 "done: 10 steps" run "$tbf" 10 --set logging.tensorboard=true
[[ "$(stat -c '%i %Y %s' "$index")" == "$(cat "$WORK/tbf-index")" && $(ls "$tbf"/data-cache | wc -l) -eq 1 ]] ||
  fail "the refused run's index was not reused: $(ls -l "$tbf/data-cache")"
ls "$tbf"/tensorboard/events.out.tfevents.* > /dev/null || fail "the accepted run wrote no event file"
echo "refused for run.dir/tensorboard a file: metrics.jsonl and recipe.yaml as they were; the next run goes on"
# A writer that cannot open after setup (the TensorBoard event file, its fopen failing with EACCES:
# tests/integration/fail_fopen.c) stops the run as a refusal in setup does: the run.dir it made goes, with the
# parents it made for it (runs/ here), and an existing one keeps its earlier metrics.jsonl. (Not on the
# ThreadSanitizer build, whose runtime is not to be preceded by an LD_PRELOAD library.)
if [[ -z ${TSAN_OPTIONS:-} ]]; then
  cc -shared -fPIC -o "$WORK/fail_fopen.so" "$REPO/tests/integration/fail_fopen.c" -ldl || fail "cannot build fail_fopen.so"
  mkdir -p "$WORK/tbparent"
  (export LD_PRELOAD="$WORK/fail_fopen.so" FAIL_FOPEN_MATCH=tfevents \
     ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
   expect 1 "cannot create the tensorboard event file: Permission denied" run "$WORK/tbparent/runs/tbopen" 4 \
     --set logging.tensorboard=true)
  [[ -d "$WORK/tbparent" && ! -e "$WORK/tbparent/runs" ]] ||
    fail "the run stopped by its event file left: $(find "$WORK/tbparent" -mindepth 1)"
  echo "a writer that cannot open after setup: the run.dir the run made goes, with the parents it made"
  # on two ranks, where rank 0 alone writes the metrics: every rank stops with it, no abort (rank 1 went on into
  # the first step's collectives and the job ended by MPI_Abort)
  stop_together tbranks 2 "$WORK/tbranks.log" env LD_PRELOAD="$WORK/fail_fopen.so" FAIL_FOPEN_MATCH=tfevents \
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" OMP_NUM_THREADS=1 \
    "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/tbparent/runs/tbranks" --set train.steps=4 \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set train.micro_batch_size=4 --set train.eval_interval=0 \
    --set optimizer.schedule.warmup_steps=1 --set logging.tensorboard=true
  grep -q "cannot create the tensorboard event file: Permission denied" "$WORK/tbranks.log" ||
    { cat "$WORK/tbranks.log"; fail "two ranks: the event file's error is not said"; }
  [[ ! -e "$WORK/tbparent/runs" ]] || fail "two ranks: the refused run left: $(find "$WORK/tbparent" -mindepth 1)"
  echo "two ranks: every rank stops with rank 0's writer, no abort"
fi

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
# a run.dir that is a file, or lies under one: refused as such (it said "checkpoints: cannot list"), the file kept
printf 'notes\n' > "$WORK/afile"
expect 2 "run.dir: '$WORK/afile' is not a directory (a file of that name is there): choose another run.dir" \
  run "$WORK/afile" 10
expect 2 "run.dir: '$WORK/afile/sub' is not a directory (a part of its path is a file)" run "$WORK/afile/sub" 10
[[ "$(cat "$WORK/afile")" == notes ]] || fail "the file named as run.dir changed"
echo "run.dir a file: refused as such"

# run.dir/checkpoints a link to another file system's directory (docs/checkpoints.md): saves go there, retention
# deletes there (keep_last 1), and resume reads from there, giving the straight run's losses
mkdir -p "$WORK/bigfs/ck" "$WORK/linked"
ln -s "$WORK/bigfs/ck" "$WORK/linked/checkpoints"
run "$WORK/linked" 20 --set checkpoint.keep_last=1 > /dev/null
[[ -L "$WORK/linked/checkpoints" && "$(ls "$WORK/bigfs/ck" | grep '^iter_')" == iter_0000020 ]] ||
  fail "checkpoints through a link: $(ls -l "$WORK/linked" "$WORK/bigfs/ck")"
expect 0 "done: 30 steps" "$MEGATRAIN" resume "$WORK/linked" --set train.steps=30
[[ -d "$WORK/bigfs/ck/iter_0000030" && ! -e "$WORK/bigfs/ck/iter_0000020" ]] || fail "resume through the link: $(ls "$WORK/bigfs/ck")"
run "$WORK/straight" 30 --set checkpoint.keep_last=1 > /dev/null
[[ "$(losses "$WORK/linked" | tail -n 10)" == "$(losses "$WORK/straight" | tail -n 10)" ]] ||
  fail "the resume through the link differs from the straight run"
echo "run.dir/checkpoints a link: saves, retention and resume go through it"
