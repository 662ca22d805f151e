#!/usr/bin/env bash
# test_data_cache_temps.sh: what a run killed while writing its sample index cache left behind
# (data.cache_dir/FILE.gptidx.tmp.HOST.PID, as large as the index: 392 MB for 4M samples) is removed by
# the next run that writes FILE, with a log line naming it; a live process's temporary file (this
# shell's pid) and another host's are kept (a shared cache_dir), and the next run's files are byte for
# byte the first run's.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
cache="$WORK/cache"
args=("$REPO/recipes/tiny/llama.yaml" --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set train.steps=2
      --set optimizer.schedule.warmup_steps=1 --set checkpoint.interval=0 --set data.cache_dir="$cache")
"$MEGATRAIN" run "${args[@]}" --set run.dir="$WORK/first" > "$WORK/first.log" 2>&1 ||
  fail "the first run failed: $(tail -n 3 "$WORK/first.log")"
files=("$cache"/*.gptidx)
[[ ${#files[@]} -ge 2 ]] || fail "expected the train and valid caches in $cache, found: $(ls "$cache")"
mkdir "$WORK/good"
cp "${files[@]}" "$WORK/good/"
[[ -z "$(ls "$cache" | grep '\.tmp\.' || true)" ]] || fail "a finished run left temporary files: $(ls "$cache")"

# a killed writer's file (a pid that is not running: a child that has ended), a live one's, another host's
sleep 0 & dead=$!
wait "$dead"
host=$(hostname | tr -c 'A-Za-z0-9\n-' '_')
rm "${files[@]}"
for f in "${files[@]}"; do
  head -c 5000 /dev/zero > "$f.tmp.$host.$dead"
  touch "$f.tmp.$host.$$" "$f.tmp.otherhost.$dead"
done
"$MEGATRAIN" run "${args[@]}" --set run.dir="$WORK/second" > "$WORK/second.log" 2>&1 ||
  fail "the run after a killed one failed: $(tail -n 3 "$WORK/second.log")"
for f in "${files[@]}"; do
  [[ ! -e "$f.tmp.$host.$dead" ]] || fail "the killed writer's $f.tmp.$host.$dead is still there"
  grep -q "data: removed 1 temporary file(s) of a sample index cache write that was killed ($f.tmp.$host.$dead)" \
    "$WORK/second.log" || fail "no log line for $f.tmp.$host.$dead: $(grep -v '^step' "$WORK/second.log")"
  [[ -e "$f.tmp.$host.$$" && -e "$f.tmp.otherhost.$dead" ]] || fail "a live process's or another host's file was removed"
  cmp -s "$f" "$WORK/good/$(basename "$f")" || fail "$f differs from the first run's"
done
echo "ok"
