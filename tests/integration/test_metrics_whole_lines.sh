#!/usr/bin/env bash
# test_metrics_whole_lines.sh: run.dir/metrics.jsonl never holds a half-written line that later lines join.
# 1. A write of metrics.jsonl that fails midway (a full disk; here the file size limit, `ulimit -f`, which
#    megatrain meets as EFBIG since it ignores SIGXFSZ) is cut off again and warned about once (a later line
#    short enough to fit is written, said, and a longer one after it warned of again): the file ends with a
#    newline and every line parses (before, the line stopped midway, without a word).
# 2. A resume drops a last line without its newline (what a crash or a full disk left) instead of keeping
#    it for the next line to run into: every line of the resumed run's file parses, each step once.
# 3. A disk full for a while (steps 4-7, MEGATRAIN_TEST_FULL_DISK_STEPS: half of each write, then ENOSPC) loses
#    those steps' lines and TensorBoard events only: both files are cut back to their last whole record, each
#    says once that it cannot write and once that it writes again, lines and events resume at step 8 (before,
#    neither file got another record, the event file kept a torn one), and the done line says the file is
#    incomplete.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
common=(--set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.eval_interval=0
        --set optimizer.schedule.warmup_steps=1 --set logging.tensorboard=false)
all_lines_parse() {  # FILE: every line a JSON object, the file ending with a newline; prints the steps
  python3 - "$1" <<'PY'
import json, sys
data = open(sys.argv[1], 'rb').read()
assert data.endswith(b'\n'), 'metrics.jsonl ends inside a line: %r' % data[-60:]
print(' '.join(str(json.loads(line)['step']) for line in data.decode().splitlines()))
PY
}

# 1. the file size limit reached by metrics.jsonl (2 KiB: about 9 lines); no checkpoints, whose writes would fail
# (the log through a pipe: the limit applies to every file the process writes, its log file too; pipefail gives
# megatrain's status)
status=0
(ulimit -f 2; exec "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/full" --set train.steps=16 \
  --set checkpoint.interval=0 --set data.cache_dir="$WORK/cache" "${common[@]}") 2>&1 | cat > "$WORK/full.log" ||
  status=$?
[[ $status -eq 1 ]] || fail "a run whose final save meets the size limit: exit $status, expected 1: $(tail -n 3 "$WORK/full.log")"
# warned of once a failure, not each step: as many warnings as writes that failed after one that did not (a line
# short enough to fit written again, said, then a longer one failing)
cannot=$(grep -c "warning: metrics.jsonl: cannot write step" "$WORK/full.log" || true)
again=$(grep -c "warning: metrics.jsonl: writing again from step" "$WORK/full.log" || true)
(( cannot >= 1 && (cannot == again || cannot == again + 1) )) ||
  fail "not one warning per failure of the metrics lines ($cannot, $again written again): $(grep -v '^step' "$WORK/full.log")"
steps=$(all_lines_parse "$WORK/full/metrics.jsonl") || fail "metrics.jsonl after a failed write is not whole lines"
last=$(grep -o "cannot write step [0-9]*" "$WORK/full.log" | head -n 1 | grep -o "[0-9]*$")
# the steps before it, then (each later step tries again) only a later line short enough to fit, said
[[ "$steps " == "$(seq -s ' ' 1 $((last - 1))) "* ]] || fail "after the failed write of step $last: steps $steps"
[[ "$steps" == "$(seq -s ' ' 1 $((last - 1)))" ]] || grep -q "metrics.jsonl: writing again from step" "$WORK/full.log" ||
  fail "lines after the failed write of step $last, unsaid: steps $steps"

# 2. a line cut short at step 6, after the checkpoint of step 6: the resume drops it and appends whole lines
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/run" --set train.steps=6 \
  --set checkpoint.interval=3 "${common[@]}" > "$WORK/run.log" 2>&1 || fail "the run failed: $(tail -n 3 "$WORK/run.log")"
python3 - "$WORK/run/metrics.jsonl" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines()
open(sys.argv[1], 'w').write('\n'.join(lines[:5]) + '\n' + lines[5][:50])  # step 6's line stops midway
PY
inode=$(stat -c %i "$WORK/run/metrics.jsonl")
"$MEGATRAIN" resume "$WORK/run" --set train.steps=9 > "$WORK/resume.log" 2>&1 ||
  fail "the resume failed: $(tail -n 3 "$WORK/resume.log")"
grep -q "resume: dropped the incomplete last line of $WORK/run/metrics.jsonl" "$WORK/resume.log" ||
  fail "the resume did not say it dropped the incomplete line: $(grep -v '^step' "$WORK/resume.log")"
steps=$(all_lines_parse "$WORK/run/metrics.jsonl") || fail "metrics.jsonl after the resume is not whole lines"
[[ "$steps" == "1 2 3 4 5 7 8 9" ]] || fail "steps after the resume: $steps, expected 1-5 and 7-9 (6's line was cut)"
[[ $(stat -c %i "$WORK/run/metrics.jsonl") == "$inode" ]] ||
  fail "the resume replaced metrics.jsonl (cut in place, it keeps the file tail -f follows and needs no room)"
# lines to drop among kept ones (a file edited by hand: a step-40 line put before step 9's) are dropped all the same
python3 - "$WORK/run/metrics.jsonl" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines()
lines.insert(len(lines) - 1, lines[-1].replace('"step":9,', '"step":40,', 1))
open(sys.argv[1], 'w').write('\n'.join(lines) + '\n')
PY
"$MEGATRAIN" resume "$WORK/run" --set train.steps=10 > "$WORK/resume2.log" 2>&1 ||
  fail "the second resume failed: $(tail -n 3 "$WORK/resume2.log")"
steps=$(all_lines_parse "$WORK/run/metrics.jsonl") || fail "metrics.jsonl after the second resume is not whole lines"
[[ "$steps" == "1 2 3 4 5 7 8 9 10" ]] || fail "steps after a resume past an edited line: $steps"
# 3. the disk full for steps 4-7 of 12, the TensorBoard file read back with TensorBoard's own reader
MEGATRAIN_TEST_FULL_DISK_STEPS=4-7 "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/gap" \
  --set train.steps=12 --set checkpoint.interval=0 "${common[@]}" --set logging.tensorboard=true > "$WORK/gap.log" 2>&1 ||
  fail "the run with a full disk for steps 4-7 failed: $(tail -n 3 "$WORK/gap.log")"
steps=$(all_lines_parse "$WORK/gap/metrics.jsonl") || fail "metrics.jsonl after a full disk is not whole lines"
[[ "$steps" == "1 2 3 8 9 10 11 12" ]] || fail "a full disk for steps 4-7: lines of steps $steps"
for file in "metrics.jsonl" "tensorboard event file"; do
  [[ $(grep -c "warning: $file: cannot write step" "$WORK/gap.log") -eq 1 ]] &&
    grep -q "warning: $file: cannot write step 4: No space left on device; trying again at each logged step" "$WORK/gap.log" &&
    [[ $(grep -c "warning: $file: writing again" "$WORK/gap.log") -eq 1 ]] &&
    grep -q "warning: $file: writing again from step 8; steps 4-7 are missing" "$WORK/gap.log" ||
    fail "$file: not one warning and one line for writing again: $(grep -v '^step' "$WORK/gap.log")"
done
grep -q "^done: .*metrics in $WORK/gap/metrics.jsonl (incomplete: 4 logged step(s) without their line, 4 without their \
TensorBoard events; see the warnings)" "$WORK/gap.log" ||
  fail "the done line does not say metrics.jsonl is incomplete: $(tail -n 1 "$WORK/gap.log")"
! grep -q "metrics.jsonl (incomplete" "$WORK/run.log" "$WORK/resume.log" || fail "a run that lost no line said incomplete"
need_python tensorboard
"$PY" - "$WORK"/gap/tensorboard/events.out.tfevents.* <<'PY' || fail "the event file after a full disk"
import struct, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
data = open(sys.argv[1], 'rb').read()
at = records = 0
while at < len(data):  # whole TFRecords (8-byte length, 4-byte CRC, data, 4-byte CRC) up to the file's end
    assert at + 12 <= len(data), 'a torn record header at byte %d of %d' % (at, len(data))
    at += 12 + struct.unpack('<Q', data[at:at + 8])[0] + 4
    records += 1
assert at == len(data), 'the last record ends at byte %d of %d' % (at, len(data))
acc = EventAccumulator(sys.argv[1])  # checks the CRCs; stops at the first record it cannot read
acc.Reload()
steps = [e.step for e in acc.Scalars('train/loss')]
assert steps == [1, 2, 3, 8, 9, 10, 11, 12], 'train/loss at steps %s' % steps
print('event file: %d whole records, train/loss at steps %s' % (records, steps))
PY
echo "ok"
