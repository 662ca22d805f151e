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
# and the right megatrain then found none. The metadata's version put back, the run resumes from its newest. A
# version no megatrain wrote (a flipped high bit) is corruption as before: set aside, the one before resumed.
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
# the format version (a u32 at byte 8, little-endian; below 256), and one above it
version=$(od -An -tu1 -j8 -N1 "$dir/checkpoints/iter_0000006/metadata.mtck" | tr -d ' ')
set_version() {  # set_version CKPT_DIR BYTE_OFFSET VALUE: one byte of the metadata's version field
  printf "\\$(printf '%03o' "$3")" | dd of="$1/metadata.mtck" bs=1 seek="$2" conv=notrunc 2> /dev/null
}
for ck in "$dir"/checkpoints/iter_*; do set_version "$ck" 8 $((version + 1)); done
for form in resume resume-if-exists; do
  if [[ $form == resume ]]; then cmd=(resume "$dir" --set train.steps=8)
  else cmd=(run "${recipe[@]}" --set train.steps=8 --resume-if-exists); fi
  status=0
  "$MEGATRAIN" "${cmd[@]}" > "$WORK/$form-newer.log" 2>&1 || status=$?
  [[ $status -eq 1 ]] || fail "$form of a newer format: exit $status, expected 1: $(tail -n 3 "$WORK/$form-newer.log")"
  grep -q "error: $dir/checkpoints/iter_0000006 was written by a newer megatrain (checkpoint format version \
$((version + 1)); this one, megatrain [^,]*, reads version $version): it is left as it is and no older checkpoint is \
tried" "$WORK/$form-newer.log" ||
    fail "$form: no message naming the checkpoint and its format: $(cat "$WORK/$form-newer.log")"
  [[ "$(ls "$dir/checkpoints")" == "$before" ]] || fail "$form moved checkpoints of a newer format: $(ls "$dir/checkpoints")"
  grep -q "falling back" "$WORK/$form-newer.log" && fail "$form fell back from a checkpoint of a newer format"
  grep -q "skipping checkpoint" "$WORK/$form-newer.log" && fail "$form says it skips the checkpoint it stops at"
done
for ck in "$dir"/checkpoints/iter_*; do set_version "$ck" 8 "$version"; done
"$MEGATRAIN" run "${recipe[@]}" --set train.steps=8 --resume-if-exists > "$WORK/after.log" 2>&1 ||
  fail "the resume with the version put back failed: $(tail -n 3 "$WORK/after.log")"
grep -q "resume: from $dir/checkpoints/iter_0000006 at step 6" "$WORK/after.log" ||
  fail "the resume did not continue from step 6: $(grep -v '^step' "$WORK/after.log")"
# a version no megatrain wrote (a flipped high bit: 2^31 above) is a corrupt header, not a newer format: that
# checkpoint is set aside and the resume goes on from the one before, as for any other corruption
set_version "$dir/checkpoints/iter_0000008" 11 128
"$MEGATRAIN" resume "$dir" --set train.steps=10 > "$WORK/flipped.log" 2>&1 ||
  fail "the resume past a flipped version failed: $(tail -n 3 "$WORK/flipped.log")"
grep -q "resume: from $dir/checkpoints/iter_0000006 at step 6" "$WORK/flipped.log" &&
  grep -q "format version 2147483649 (this megatrain reads version $version): the file is corrupt" "$WORK/flipped.log" &&
  ! grep -q "newer megatrain" "$WORK/flipped.log" ||
  fail "a flipped version bit: $(grep -v '^step' "$WORK/flipped.log")"
echo "ok"
