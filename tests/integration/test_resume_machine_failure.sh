#!/usr/bin/env bash
# test_resume_machine_failure.sh: a checkpoint that cannot be read for a reason of the machine, not of the
# checkpoint (here too few file descriptors, `ulimit -n`: EMFILE; likewise ENOMEM, EACCES), is not corrupt.
# `resume` and `run --resume-if-exists` stop with exit 1 naming the checkpoint and the reason, move nothing
# aside and try no older checkpoint. Before, every checkpoint of the run was renamed iter_N.invalid in turn
# (each failed alike), after which no resume found one and --resume-if-exists refused the run for good; with
# only the newest failing (a passing shortage), the run fell back and trained again from an older step.
# With the limit lifted, the same command resumes from the newest checkpoint.
# Likewise a checkpoint of a newer format (an older megatrain in a job script: a module, a build not updated): it is
# left as it is, no older one tried, the stop saying so (exit 1); it moved every checkpoint aside as corrupt in turn,
# and the right megatrain then found none. The metadata's version put back, the run resumes from its newest.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
dir="$WORK/run"
recipe=("$REPO/recipes/tiny/llama.yaml" --set run.dir="$dir" --set train.steps=4 --set checkpoint.interval=2
        --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set optimizer.schedule.warmup_steps=1
        --set train.eval_interval=0)
"$MEGATRAIN" run "${recipe[@]}" > "$WORK/run.log" 2>&1 || fail "the run failed: $(tail -n 3 "$WORK/run.log")"
before=$(ls "$dir/checkpoints")
[[ "$before" == *iter_0000002* && "$before" == *iter_0000004* ]] || fail "expected checkpoints 2 and 4: $before"

for form in resume resume-if-exists; do
  if [[ $form == resume ]]; then cmd=(resume "$dir" --set train.steps=6)
  else cmd=(run "${recipe[@]}" --resume-if-exists); fi
  status=0
  (ulimit -n 6; exec "$MEGATRAIN" "${cmd[@]}") > "$WORK/$form.log" 2>&1 || status=$?
  [[ $status -eq 1 ]] || fail "$form with ulimit -n 6: exit $status, expected 1: $(tail -n 3 "$WORK/$form.log")"
  grep -q "error: $dir/checkpoints/iter_0000004 could not be read for a reason of this machine, not of the checkpoint (Too many open files)" \
    "$WORK/$form.log" || fail "$form: no message naming the checkpoint and the reason: $(cat "$WORK/$form.log")"
  [[ "$(ls "$dir/checkpoints")" == "$before" ]] || fail "$form moved checkpoints: $(ls "$dir/checkpoints")"
  grep -q "falling back" "$WORK/$form.log" && fail "$form fell back to an older checkpoint"
done
"$MEGATRAIN" resume "$dir" --set train.steps=6 > "$WORK/after.log" 2>&1 ||
  fail "the resume with the limit lifted failed: $(tail -n 3 "$WORK/after.log")"
grep -q "resume: from $dir/checkpoints/iter_0000004 at step 4" "$WORK/after.log" ||
  fail "the resume did not continue from step 4: $(grep -v '^step' "$WORK/after.log")"

before=$(ls "$dir/checkpoints")
[[ "$before" == *iter_0000006* ]] || fail "expected checkpoint 6: $before"
for ck in "$dir"/checkpoints/iter_*; do printf '\x02' | dd of="$ck/metadata.mtck" bs=1 seek=8 conv=notrunc 2> /dev/null; done
for form in resume resume-if-exists; do
  if [[ $form == resume ]]; then cmd=(resume "$dir" --set train.steps=8)
  else cmd=(run "${recipe[@]}" --set train.steps=8 --resume-if-exists); fi
  status=0
  "$MEGATRAIN" "${cmd[@]}" > "$WORK/$form-newer.log" 2>&1 || status=$?
  [[ $status -eq 1 ]] || fail "$form of a newer format: exit $status, expected 1: $(tail -n 3 "$WORK/$form-newer.log")"
  grep -q "error: $dir/checkpoints/iter_0000006 was written by a newer megatrain (checkpoint format version 2; this \
one, megatrain [0-9.]*, reads version 1): it is left as it is and no older checkpoint is tried" "$WORK/$form-newer.log" ||
    fail "$form: no message naming the checkpoint and its format: $(cat "$WORK/$form-newer.log")"
  [[ "$(ls "$dir/checkpoints")" == "$before" ]] || fail "$form moved checkpoints of a newer format: $(ls "$dir/checkpoints")"
  grep -q "falling back" "$WORK/$form-newer.log" && fail "$form fell back from a checkpoint of a newer format"
done
for ck in "$dir"/checkpoints/iter_*; do printf '\x01' | dd of="$ck/metadata.mtck" bs=1 seek=8 conv=notrunc 2> /dev/null; done
"$MEGATRAIN" run "${recipe[@]}" --set train.steps=8 --resume-if-exists > "$WORK/after.log" 2>&1 ||
  fail "the resume with the version put back failed: $(tail -n 3 "$WORK/after.log")"
grep -q "resume: from $dir/checkpoints/iter_0000006 at step 6" "$WORK/after.log" ||
  fail "the resume did not continue from step 6: $(grep -v '^step' "$WORK/after.log")"
echo "ok"
