#!/usr/bin/env bash
# test_ckpt_corrupt.sh: damaged checkpoints. A flipped byte in a shard and a
# truncated shard are found by `megatrain inspect` (exit 1, naming the file,
# the tensor and the chunk) and skipped by `megatrain resume`, which says so,
# moves the damaged checkpoint aside, falls back to the newest intact one
# and continues to the same losses as an uninterrupted run. A checkpoint
# named explicitly that is damaged is refused (exit 1), not replaced.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
run() {
  local dir=$1 steps=$2; shift 2
  "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$dir" --set train.steps="$steps" \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.eval_interval=0 \
    --set checkpoint.interval=10 --set checkpoint.keep_last=3 --set optimizer.schedule.decay_steps=40 \
    --set optimizer.schedule.warmup_steps=5 "$@" > /dev/null
}
losses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$1/metrics.jsonl"; }
# flip FILE OFFSET: invert one byte in place.
flip() { printf "$(printf '\\x%02x' $(( $(od -An -tu1 -j "$2" -N1 "$1") ^ 0xff )))" |
         dd of="$1" bs=1 seek="$2" conv=notrunc status=none; }

run "$WORK/straight" 40
run "$WORK/a" 30
ck="$WORK/a/checkpoints"
"$MEGATRAIN" inspect "$ck/iter_0000030" > "$WORK/ok.txt" || fail "inspect of an intact checkpoint failed"
grep -q "every checksum verified" "$WORK/ok.txt" || fail "inspect did not report success"
grep -q "^optimizer.v.lm_head.weight *\[256, 64\] *fp32" "$WORK/ok.txt" || fail "inspect does not list tensors: $(head "$WORK/ok.txt")"
# usage: an option inspect does not know is said so (exit 2, as every command); a file is not a missing directory
# (and, as a missing one, a usage error)
status=0; "$MEGATRAIN" inspect > "$WORK/usage.txt" 2>&1 || status=$? # no CKPT: said, as every command says it
[[ $status -eq 2 ]] && grep -q "^megatrain: error: inspect: missing CKPT" "$WORK/usage.txt" ||
  fail "inspect alone: $status $(cat "$WORK/usage.txt")"
status=0; "$MEGATRAIN" inspect --bogus > "$WORK/usage.txt" 2>&1 || status=$?
[[ $status -eq 2 ]] && grep -q "unknown option '--bogus'" "$WORK/usage.txt" || fail "inspect --bogus: $status $(cat "$WORK/usage.txt")"
status=0; "$MEGATRAIN" inspect "$ck" --json > "$WORK/usage.txt" 2>&1 || status=$? # an option after CKPT too
[[ $status -eq 2 ]] && grep -q "unknown option '--json'" "$WORK/usage.txt" || fail "inspect CKPT --json: $status $(cat "$WORK/usage.txt")"
status=0; "$MEGATRAIN" inspect "$ck/iter_0000030/metadata.mtck" > "$WORK/usage.txt" 2>&1 || status=$?
[[ $status -eq 2 ]] && grep -q "metadata.mtck: not a directory (expected a run directory" "$WORK/usage.txt" ||
  fail "inspect FILE: $status $(cat "$WORK/usage.txt")"
[[ $(grep -c " ok$" "$WORK/ok.txt") -eq $((21 * 3 + 3)) ]] || fail "expected 63 tensors and 3 files checked ok"

# A checkpoint deleted while inspect reads it (a live run's retention; tests/integration/vanish_on_open.c removes
# the directory at the first open of its shard) is said to be gone, not corrupt.
cc -shared -fPIC -o "$WORK/vanish.so" "$REPO/tests/integration/vanish_on_open.c" -ldl || fail "cannot build vanish.so"
cp -r "$WORK/straight" "$WORK/live"
status=0
LD_PRELOAD="$WORK/vanish.so" VANISH_MATCH=shard_ VANISH_DIR="$WORK/live/checkpoints/iter_0000040" \
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
  "$MEGATRAIN" inspect "$WORK/live" > "$WORK/live.txt" 2> "$WORK/live.err" || status=$?
[[ $status -eq 1 ]] && grep -q "iter_0000040: removed while it was read (by its run's checkpoint retention?" "$WORK/live.err" &&
  grep -q "REMOVED while read" "$WORK/live.txt" && ! grep -q "are corrupt" "$WORK/live.err" ||
  fail "a checkpoint deleted during inspect: $status $(tail -n 2 "$WORK/live.err")"

# A flipped byte in the middle of the newest shard.
shard="$ck/iter_0000030/shard_00000.zst"
flip "$shard" $(( $(stat -c %s "$shard") / 2 ))
status=0; "$MEGATRAIN" inspect "$ck/iter_0000030" > "$WORK/bad.txt" 2> "$WORK/bad.err" || status=$?
[[ $status -eq 1 ]] || fail "inspect of a flipped byte: exit $status, expected 1"
grep -q "shard_00000.zst: tensor '[a-z_.0-9]*' chunk 0 (bytes [0-9]*\.\.[0-9]*): \(checksum mismatch\|zstd frame does not decode\)" \
  "$WORK/bad.err" || fail "inspect does not name the damaged tensor: $(cat "$WORK/bad.err")"
grep -q "CORRUPT" "$WORK/bad.txt" || fail "inspect's listing does not mark the damage"
echo "flipped byte: $(grep -o "tensor '[^']*'" "$WORK/bad.err" | head -n 1)"

# Named explicitly: refused, left in place.
status=0; "$MEGATRAIN" resume "$ck/iter_0000030" > "$WORK/named.log" 2>&1 || status=$?
[[ $status -eq 1 && -d "$ck/iter_0000030" ]] || fail "resume of a damaged named checkpoint: exit $status"

# A truncated shard in the next one.
shard="$ck/iter_0000020/shard_00000.zst"
truncate -s $(( $(stat -c %s "$shard") - 1000 )) "$shard"
status=0; "$MEGATRAIN" inspect "$WORK/a" > /dev/null 2> "$WORK/trunc.err" || status=$?  # the run dir: its newest
[[ $status -eq 1 ]] || fail "inspect of the run directory with a damaged newest checkpoint: exit $status"
status=0; "$MEGATRAIN" inspect "$ck/iter_0000020" > /dev/null 2> "$WORK/trunc.err" || status=$?
[[ $status -eq 1 ]] || fail "inspect of a truncated shard: exit $status"
grep -q "shard_00000.zst: .* bytes, the metadata says .* (truncated or replaced)" "$WORK/trunc.err" \
  || fail "inspect does not report the truncation: $(cat "$WORK/trunc.err")"
size=$(stat -c %s "$shard")
grep -q "shard_00000.zst: tensor 'optimizer.v.lm_head.weight' chunk 0: cannot read bytes [0-9]*\.\.[0-9]*: the file is truncated: expected $((size + 1000)) bytes, found $size$" \
  "$WORK/trunc.err" || fail "inspect does not name the tensor cut off and the sizes: $(cat "$WORK/trunc.err")"
! grep -q "Input/output error" "$WORK/trunc.err" || fail "inspect blames the disk for a truncated file: $(cat "$WORK/trunc.err")"

# resume: skips 30 (flipped) and 20 (truncated), continues from 10.
"$MEGATRAIN" resume "$WORK/a" --set train.steps=40 > "$WORK/resume.log" 2>&1 || fail "resume failed: $(tail -n 5 "$WORK/resume.log")"
grep -q "warning: skipping checkpoint .*iter_0000030: .*checksum mismatch\|warning: skipping checkpoint .*iter_0000030: .*zstd" \
  "$WORK/resume.log" || fail "resume did not report skipping iter_0000030: $(head -n 5 "$WORK/resume.log")"
grep -q "warning: skipping checkpoint .*iter_0000020: .*truncated" "$WORK/resume.log" \
  || fail "resume did not report skipping iter_0000020"
grep -q "resume: from .*iter_0000010 at step 10" "$WORK/resume.log" || fail "resume did not fall back to step 10"
[[ -d "$ck/iter_0000030.invalid" && -d "$ck/iter_0000020.invalid" ]] || fail "damaged checkpoints not moved aside: $(ls "$ck")"
diff <(losses "$WORK/straight") <(losses "$WORK/a") > "$WORK/diff.txt" \
  || fail "losses after the fallback differ from the straight run: $(head -n 4 "$WORK/diff.txt")"
[[ $(losses "$WORK/a" | wc -l) -eq 40 ]] || fail "metrics.jsonl should list steps 1-40 once each"
"$MEGATRAIN" inspect "$ck/iter_0000030" > /dev/null || fail "the re-saved iter_0000030 does not verify"
echo "resume fell back to step 10 and matched the straight run"

# On 2 ranks (tp 2: each its shard), rank 1's shard damaged: the ranks fall back together, and the job says it once,
# naming the rank that met it and why (each rank printed its own lines, most "rank 1 could not load this checkpoint")
if command -v mpirun > /dev/null; then
  mpi() { OMP_NUM_THREADS=1 timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "$MEGATRAIN" "$@"; }
  mpi run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/tp2" --set train.steps=10 --set checkpoint.interval=5 \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set parallel.tp=2 \
    --set optimizer.schedule.warmup_steps=2 > /dev/null 2>&1 || fail "the tp 2 run failed"
  flip "$WORK/tp2/checkpoints/iter_0000010/shard_00001.zst" 100
  mpi resume "$WORK/tp2" --set train.steps=12 > "$WORK/tp2-resume.log" 2>&1 || fail "tp 2 resume: $(tail -n 5 "$WORK/tp2-resume.log")"
  [[ $(grep -c "skipping checkpoint" "$WORK/tp2-resume.log") -eq 1 && $(grep -c "falling back" "$WORK/tp2-resume.log") -eq 1 ]] &&
    grep -q "warning: rank 1: skipping checkpoint .*iter_0000010: .*shard_00001.zst: " "$WORK/tp2-resume.log" &&
    grep -q "resume: from .*iter_0000005 at step 5" "$WORK/tp2-resume.log" ||
    fail "tp 2, rank 1's shard damaged: $(grep -v '^step' "$WORK/tp2-resume.log" | head -n 8)"
  echo "tp 2, rank 1's shard damaged: said once, naming rank 1; resumed from step 5"
fi
