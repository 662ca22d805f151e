#!/usr/bin/env bash
# test_resume_data_changed.sh: a dataset built again at its path between a run and its resume. The checkpoint
# records each dataset's fingerprint (record DATA: documents, sizes, CRC-32C; `inspect` shows it). Built again
# from the same text (new files, new times: the sample index cache is rebuilt), resume says nothing and steps
# 5-8 have the straight run's losses bit for bit; copied to another path and resumed from there, it is said to have
# moved with the same contents. Built from a text with one letter changed, or with text
# appended, resume warns naming the dataset and what changed (the samples are other ones), and trains on. A data.valid
# dataset built again with other text is warned about as the validation's (the training's losses stay the same),
# once and recorded once where data.valid lists it twice. A dataset left out of the blend (its share of data.split
# empty) is recorded too: built again into the blend, it is warned about.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
text="$WORK/text.txt"
cat /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 > "$text"
build() { "$MEGATRAIN" data build --input "$1" --output "$WORK/en" --overwrite > /dev/null 2>&1 || fail "data build $1"; }
build "$text"
dir="$WORK/run"
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$dir" --set train.steps=8 \
  --set "data.train=[{path: $WORK/en, weight: 1.0}]" --set logging.interval=1 --set train.eval_interval=0 \
  --set checkpoint.interval=4 --set checkpoint.keep_last=5 --set optimizer.schedule.warmup_steps=2 \
  > "$WORK/straight.log" 2>&1 || fail "the straight run failed: $(tail -n 3 "$WORK/straight.log")"
losses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$dir/metrics.jsonl"; }
losses > "$WORK/straight.txt"
"$MEGATRAIN" inspect "$dir/checkpoints/iter_0000004" > "$WORK/inspect.txt" 2>&1 || fail "inspect failed"
docs=$(grep -c . "$text")
grep -q "^  data.train $WORK/en: $docs documents, .* CRC-32C [0-9a-f]\{8\}$" "$WORK/inspect.txt" \
  || fail "inspect does not show the dataset of $docs documents: $(grep -i data "$WORK/inspect.txt")"

# resume_from_4 NAME: resume the run at step 4 (its step-8 checkpoint removed), log in $WORK/NAME.log
resume_from_4() {
  rm -rf "$dir/checkpoints/iter_0000008"
  echo 4 > "$dir/checkpoints/latest_checkpointed_iteration.txt"
  "$MEGATRAIN" resume "$dir" > "$WORK/$1.log" 2>&1 || fail "$1: resume failed: $(tail -n 3 "$WORK/$1.log")"
  grep -q "resume: from .*iter_0000004 at step 4" "$WORK/$1.log" || fail "$1: did not resume at step 4"
}

sleep 1 # another modification time: the sample index cache's key changes
build "$text"
resume_from_4 same
grep -q "has changed" "$WORK/same.log" && fail "the same text built again was warned about: $(grep warning "$WORK/same.log")"
diff "$WORK/straight.txt" <(losses) > /dev/null || fail "the same text built again: the resumed losses differ"
echo "the same text built again: no warning, steps 5-8 identical"

# the same dataset copied byte for byte to another path and resumed with it there: said to have moved with the same
# contents (the fingerprint the checkpoint recorded), not that the run no longer computes what it would have
mkdir -p "$WORK/moved" && cp "$WORK/en.bin" "$WORK/en.idx" "$WORK/moved/"
rm -rf "$dir/checkpoints/iter_0000008" && echo 4 > "$dir/checkpoints/latest_checkpointed_iteration.txt"
"$MEGATRAIN" resume "$dir" --set "data.train=[{path: $WORK/moved/en, weight: 1.0}]" > "$WORK/moved.log" 2>&1 ||
  fail "moved: resume failed: $(tail -n 3 "$WORK/moved.log")"
grep -qF "resume: data.train[0] moved from $WORK/en to $WORK/moved/en: the same contents (fingerprint matches)" \
  "$WORK/moved.log" || fail "moved: not said: $(grep resume "$WORK/moved.log")"
! grep -q "warning: resume: data.train" "$WORK/moved.log" || fail "moved: warned: $(grep warning "$WORK/moved.log")"
diff "$WORK/straight.txt" <(losses) > /dev/null || fail "moved: the resumed losses differ"
# ... and with one letter changed there, it is other samples, warned of
sed '0,/GNU/s//GNX/' "$text" > "$WORK/edited.txt"
"$MEGATRAIN" data build --input "$WORK/edited.txt" --output "$WORK/moved/en" --overwrite > /dev/null 2>&1 || fail "build moved"
rm -rf "$dir/checkpoints/iter_0000008" && echo 4 > "$dir/checkpoints/latest_checkpointed_iteration.txt"
"$MEGATRAIN" resume "$dir" --set "data.train=[{path: $WORK/moved/en, weight: 1.0}]" > "$WORK/moved2.log" 2>&1 ||
  fail "moved and changed: resume failed: $(tail -n 3 "$WORK/moved2.log")"
grep -q "warning: resume: data.train\[0\] changes the samples the run reads" "$WORK/moved2.log" && ! grep -q " moved from" \
  "$WORK/moved2.log" || fail "moved and changed: $(grep resume "$WORK/moved2.log")"
# (the resumes above rewrote the recipe with the new path: the checkpoint's own is used from here on, as before)
echo "the same dataset at another path: said to have moved; changed there: warned"

sed '0,/GNU/s//GNX/' "$text" > "$WORK/edited.txt"
build "$WORK/edited.txt"
resume_from_4 edited
grep -qF "warning: resume: data.train dataset $WORK/en has changed since the checkpoint was written ($docs documents as then, other contents (CRC-32C" "$WORK/edited.log" \
  || fail "one letter changed: no warning: $(grep -i warning "$WORK/edited.log")"
grep -q "no longer equals the uninterrupted one" "$WORK/edited.log" || fail "the warning does not say the run differs"
echo "one letter changed: warned"

cat "$text" /usr/share/common-licenses/MPL-2.0 > "$WORK/longer.txt"
build "$WORK/longer.txt"
resume_from_4 longer
more=$(grep -c . "$WORK/longer.txt")
grep -qE "warning: resume: data.train dataset $WORK/en has changed since the checkpoint was written \($docs documents in [0-9]+ bytes then, $more in [0-9]+ now\)" "$WORK/longer.log" \
  || fail "text appended: no warning with $docs and $more documents: $(grep -i warning "$WORK/longer.log")"
[[ $(losses | wc -l) -eq 8 ]] || fail "text appended: the resumed run did not train on to step 8"
echo "text appended: warned ($docs -> $more documents), trained on"
# data.valid rebuilt with other text: warned as the validation's data, the training's losses still the straight run's
build "$text" # data.train as the run had it
"$MEGATRAIN" data build --input /usr/share/common-licenses/MPL-2.0 --output "$WORK/va" > /dev/null 2>&1 || fail "data build va"
vdir="$WORK/vrun"
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$vdir" --set train.steps=4 \
  --set "data.train=[{path: $WORK/en, weight: 1.0}]" --set "data.valid=[{path: $WORK/va, weight: 1.0}, {path: $WORK/va, weight: 2.0}]" --set "data.split=[100, 0, 0]" \
  --set logging.interval=1 --set train.eval_interval=2 --set train.eval_batches=1 --set checkpoint.interval=2 \
  --set checkpoint.keep_last=5 --set optimizer.schedule.warmup_steps=1 > "$WORK/vstraight.log" 2>&1 \
  || fail "the run with data.valid failed: $(tail -n 3 "$WORK/vstraight.log")"
"$MEGATRAIN" inspect "$vdir/checkpoints/iter_0000002" > "$WORK/vinspect.txt" 2>&1 || fail "inspect vrun failed"
[[ $(grep -c "^  data.valid $WORK/va:" "$WORK/vinspect.txt") == 1 ]] \
  || fail "data.valid lists $WORK/va twice: not recorded once: $(grep data "$WORK/vinspect.txt")"
vlosses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$vdir/metrics.jsonl"; }
vlosses > "$WORK/vstraight.txt"
"$MEGATRAIN" data build --input /usr/share/common-licenses/Apache-2.0 --output "$WORK/va" --overwrite > /dev/null 2>&1 \
  || fail "data build va again"
rm -rf "$vdir/checkpoints/iter_0000004"
echo 2 > "$vdir/checkpoints/latest_checkpointed_iteration.txt"
"$MEGATRAIN" resume "$vdir" > "$WORK/valid.log" 2>&1 || fail "data.valid changed: resume failed: $(tail -n 3 "$WORK/valid.log")"
grep -qF "warning: resume: data.valid dataset $WORK/va has changed since the checkpoint was written" "$WORK/valid.log" \
  || fail "data.valid changed: no warning: $(grep -i warning "$WORK/valid.log")"
grep -q "data.valid dataset .*the training is not affected" "$WORK/valid.log" \
  || fail "data.valid changed: the warning does not say the training is unaffected: $(grep -i warning "$WORK/valid.log")"
grep -q "data.valid dataset .*no longer equals the uninterrupted one" "$WORK/valid.log" \
  && fail "data.valid changed: the warning says the training differs"
grep -q "data.train dataset" "$WORK/valid.log" && fail "data.valid changed: data.train warned about"
[[ $(grep -c "data.valid dataset" "$WORK/valid.log") == 1 ]] \
  || fail "data.valid changed: a dataset listed twice is not warned about once: $(grep -c warning "$WORK/valid.log") warnings"
diff "$WORK/vstraight.txt" <(vlosses) > /dev/null || fail "data.valid changed: the training losses differ"
echo "data.valid rebuilt with other text: warned as validation data, training losses identical"
# a dataset whose train share is empty is left out of the blend, and recorded all the same: built again with
# documents that its share then holds, the resumed run blends it in, and resume says so
head -n 1 "$text" > "$WORK/one.txt"
"$MEGATRAIN" data build --input "$WORK/one.txt" --output "$WORK/b" > /dev/null 2>&1 || fail "data build b"
edir="$WORK/erun"
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$edir" --set train.steps=4 \
  --set "data.train=[{path: $WORK/en, weight: 1.0}, {path: $WORK/b, weight: 1.0}]" --set "data.split=[10, 90, 0]" \
  --set train.eval_interval=0 --set checkpoint.interval=2 --set checkpoint.keep_last=5 \
  --set optimizer.schedule.warmup_steps=1 > "$WORK/estraight.log" 2>&1 \
  || fail "the run with an empty share failed: $(tail -n 3 "$WORK/estraight.log")"
grep -q "$WORK/b: the train share of data.split .* has no tokens" "$WORK/estraight.log" \
  || fail "$WORK/b was not left out of the train blend: $(grep -i warning "$WORK/estraight.log")"
"$MEGATRAIN" data build --input "$text" --output "$WORK/b" --overwrite > /dev/null 2>&1 || fail "data build b again"
rm -rf "$edir/checkpoints/iter_0000004"
echo 2 > "$edir/checkpoints/latest_checkpointed_iteration.txt"
"$MEGATRAIN" resume "$edir" > "$WORK/empty.log" 2>&1 || fail "empty share: resume failed: $(tail -n 3 "$WORK/empty.log")"
grep -q "blended from 2 datasets" "$WORK/empty.log" || fail "the rebuilt dataset is not in the blend: $(grep '^train:' "$WORK/empty.log")"
grep -qF "warning: resume: data.train dataset $WORK/b has changed since the checkpoint was written (1 documents in" \
  "$WORK/empty.log" || fail "a left-out dataset built again: no warning: $(grep -i warning "$WORK/empty.log")"
echo "a dataset left out of the blend (empty share), built again into it: warned"
# a DATA record this megatrain cannot decode (here a split no version writes, the body's CRC made to match: as a
# later version's record would be) drops the record, not the checkpoint: resume goes on from it and says so
python3 - "$edir/checkpoints/iter_0000002/metadata.mtck" <<'PY'
import struct, sys
path = sys.argv[1]
b = bytearray(open(path, "rb").read())
at = b.index(b"DATA", 24)
split = b.index(b"train", at)
b[split:split + 5] = b"trzin"
table = []
for i in range(256):
    c = i
    for _ in range(8): c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    table.append(c)
crc = 0xFFFFFFFF
for x in b[24:]: crc = table[(crc ^ x) & 0xFF] ^ (crc >> 8)
b[12:16] = struct.pack("<I", crc ^ 0xFFFFFFFF)
open(path, "wb").write(bytes(b))
PY
"$MEGATRAIN" inspect "$edir/checkpoints/iter_0000002" > /dev/null 2>&1 || fail "a checkpoint with an undecodable DATA record does not inspect"
rm -rf "$edir/checkpoints/iter_0000004"
echo 2 > "$edir/checkpoints/latest_checkpointed_iteration.txt"
"$MEGATRAIN" resume "$edir" > "$WORK/unread.log" 2>&1 || fail "undecodable DATA: resume failed: $(tail -n 3 "$WORK/unread.log")"
grep -q "resume: from .*iter_0000002 at step 2" "$WORK/unread.log" || fail "undecodable DATA: not resumed from step 2"
grep -qF "warning: resume: the checkpoint's record of its data is of a form this megatrain cannot read (written by a newer one?): the datasets are not compared" \
  "$WORK/unread.log" || fail "undecodable DATA: no warning: $(grep -i warning "$WORK/unread.log")"
echo "an undecodable DATA record: the checkpoint resumes, the record is said to be unread"
echo "PASS test_resume_data_changed"
