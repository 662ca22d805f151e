#!/usr/bin/env bash
# test_resume_data_cache.sh: a damaged sample index cache (run.dir/data-cache/*.gptidx) is never used.
# A crash can leave a cache file whose body is zeros (its blocks never reached the disk), and zeros
# keep every index in range; the file's CRC-32C catches that, a flipped byte and a truncation alike.
# A run is resumed from step 4 after damaging each cache file: every one is warned about by name
# and rebuilt (byte for byte the file of the first run), and steps 5-8 have the straight run's losses
# bit for bit. A resume with the rebuilt files says nothing about the cache.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
dir="$WORK/run"
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$dir" --set train.steps=8 \
  --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.eval_interval=4 \
  --set train.eval_batches=2 --set checkpoint.interval=4 --set checkpoint.keep_last=5 \
  --set optimizer.schedule.warmup_steps=2 --set optimizer.schedule.decay_steps=8 > "$WORK/straight.log" 2>&1 \
  || fail "the straight run failed: $(tail -n 3 "$WORK/straight.log")"
losses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$dir/metrics.jsonl"; }
losses > "$WORK/straight.txt"
[[ $(wc -l < "$WORK/straight.txt") -eq 8 ]] || fail "straight run: expected 8 logged steps"
grep -q "warning" "$WORK/straight.log" && fail "the straight run warned: $(grep warning "$WORK/straight.log")"

cache="$dir/data-cache"
files=("$cache"/*.gptidx)
[[ ${#files[@]} -ge 2 ]] || fail "expected the train and valid caches in $cache, found: $(ls "$cache")"
mkdir "$WORK/good"
cp "${files[@]}" "$WORK/good/"

# damage FILE HOW: zero (the body after the 72-byte header), flip (one byte of the arrays), truncate (8 bytes).
damage() {
  python3 - "$1" "$2" <<'PY'
import sys
path, how = sys.argv[1], sys.argv[2]
b = bytearray(open(path, 'rb').read())
if how == 'zero': b[72:] = bytes(len(b) - 72)
elif how == 'flip': b[len(b) // 2] ^= 0x10
else: b = b[:-8]
open(path, 'wb').write(b)
PY
}

for how in zero flip truncate; do
  rm -rf "$dir/checkpoints/iter_0000008"
  echo 4 > "$dir/checkpoints/latest_checkpointed_iteration.txt"
  for f in "${files[@]}"; do damage "$f" "$how"; done
  "$MEGATRAIN" resume "$dir" > "$WORK/resume-$how.log" 2>&1 || fail "$how: resume failed: $(tail -n 3 "$WORK/resume-$how.log")"
  grep -q "resume: from .*iter_0000004 at step 4" "$WORK/resume-$how.log" || fail "$how: did not resume at step 4"
  for f in "${files[@]}"; do
    grep -qF "warning: data: the sample index cache $f is damaged (" "$WORK/resume-$how.log" \
      || fail "$how: no warning about $f: $(grep -i warning "$WORK/resume-$how.log" | head -n 3)"
    cmp -s "$f" "$WORK/good/$(basename "$f")" || fail "$how: $f was not rebuilt"
  done
  diff "$WORK/straight.txt" <(losses) > "$WORK/diff.txt" \
    || fail "$how: the resumed losses differ from the straight run's: $(head -n 4 "$WORK/diff.txt")"
  echo "$how: ${#files[@]} cache files warned about and rebuilt, steps 5-8 identical"
done

rm -rf "$dir/checkpoints/iter_0000008"
echo 4 > "$dir/checkpoints/latest_checkpointed_iteration.txt"
"$MEGATRAIN" resume "$dir" > "$WORK/resume-intact.log" 2>&1 || fail "intact: resume failed"
grep -q "sample index cache" "$WORK/resume-intact.log" && fail "an intact cache was warned about"
diff "$WORK/straight.txt" <(losses) > /dev/null || fail "intact: the resumed losses differ"
[[ -z "$(ls "$cache" | grep -v '\.gptidx$')" ]] || fail "files other than caches left in $cache: $(ls "$cache")"
echo "PASS test_resume_data_cache"
