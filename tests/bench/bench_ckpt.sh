#!/usr/bin/env bash
# bench_ckpt.sh: the checkpoint benchmark (not part of `make test`).
# Trains a small llama on the demo data with a save every --interval steps,
# sync and async, then reports as a markdown table:
#   - bytes on disk against the raw fp32 state (params + AdamW m and v),
#     with the shuffle4 filter (the default) and without it;
#   - the time of a sync save (all threads, zstd level 3, fsync included)
#     against `zstd -T0 -3` on the same raw bytes (without and with an fsync
#     of its output), and the time of a load (read, decompress, verify);
#   - the step-time stall of a save: the training time a save adds (the time
#     to the last step with a save every --interval steps, minus the same
#     without saves, per save), sync and async.
# Other work on the machine skews all of it: the load average before and
# after is printed; record numbers only when it is low.
#
# Usage: tests/bench/bench_ckpt.sh [--hidden N] [--layers N] [--steps N] [--interval N] [--reps N] [--threads N]
#   defaults: hidden 256, layers 4 (3.3M parameters, 39 MB of state), 30 steps,
#   a save every 5, 3 repetitions, threads = nproc
set -euo pipefail
cd "$(dirname "$0")/../.."
hidden=256 layers=4 steps=30 interval=5 reps=3 threads=$(nproc)
while [[ $# -gt 0 ]]; do
  case $1 in
    --hidden) hidden=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_ckpt.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v zstd > /dev/null || { echo "bench_ckpt.sh: needs the zstd command" >&2; exit 2; }
export OMP_NUM_THREADS=$threads
make --no-print-directory -j2 build/megatrain > /dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The bench program links every object but main.o, with the Makefile's libraries.
blas=/usr/lib/x86_64-linux-gnu/openblas-openmp
objs=$(find build/obj/cpu/src -name '*.o' ! -path 'build/obj/cpu/src/main.o' | sort) # the CPU objects (Makefile: OBJDIR)
gcc -std=c11 -D_GNU_SOURCE -Isrc -O2 -fopenmp $(mpicc --showme:compile 2>/dev/null) -o "$work/bench_ckpt" \
  tests/bench/bench_ckpt.c $objs -L$blas -Wl,-rpath,$blas -lopenblas $(mpicc --showme:link 2>/dev/null) \
  -lyaml -lzstd -lm -lpthread
bash scripts/demo_data.sh data/demo/english > /dev/null

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
train() {  # train NAME ASYNC INTERVAL
  build/megatrain run recipes/tiny/llama.yaml --set run.dir="$work/$1" --set train.steps=$steps \
    --set model.hidden_size=$hidden --set model.num_layers=$layers --set model.intermediate_size=$((hidden * 3)) \
    --set model.num_attention_heads=8 --set model.num_key_value_heads=4 --set optimizer.schedule.warmup_steps=2 \
    --set "train.batch_schedule=null" --set train.global_batch_size=8 --set train.eval_interval=0 \
    --set logging.interval=1 --set checkpoint.interval=$3 --set checkpoint.async=$2 \
    --set checkpoint.keep_last=1 --set "data.train=[{path: data/demo/english, weight: 1.0}]" > "$work/$1.log"
}
# last_elapsed METRICS: elapsed_s of the last step (logged before the final save).
last_elapsed() { grep -o '"elapsed_s":[0-9.e+-]*' "$1" | tail -n 1 | cut -d: -f2; }
# Each twice, interleaved; the faster of the two counts (less noise from the machine).
for round in 1 2; do
  train none-$round false 0
  train sync-$round false "$interval"
  train async-$round true "$interval"
done
fastest() { printf '%s\n' "$(last_elapsed "$work/$1-1/metrics.jsonl")" "$(last_elapsed "$work/$1-2/metrics.jsonl")" | sort -g | head -n 1; }
saves=$(( (steps - 1) / interval ))  # the saves before the last step
t_none=$(fastest none)
t_sync=$(fastest sync)
t_async=$(fastest async)
per_save() { echo "scale=3; ($1 - $t_none) / $saves" | bc -l | sed 's/^\./0./; s/^-\./-0./'; }
stall_sync=$(per_save "$t_sync")
stall_async=$(per_save "$t_async")

ckpt=$(ls -d "$work/sync-1/checkpoints/iter_"* | tail -n 1)
"$work/bench_ckpt" "$ckpt" "$work" "$reps" > "$work/bench.txt"
val() { grep "^$1=" "$work/bench.txt" | cut -d= -f2; }
# zstd_time [--fsync]: median seconds of `zstd -T0 -3` on raw.bin (then fsync of its output).
zstd_time() {
  local times=()
  for _ in $(seq 1 "$reps"); do
    local start; start=$(date +%s.%N)
    zstd -q -T0 -3 -f "$work/raw.bin" -o "$work/raw.zst"
    [[ ${1:-} == --fsync ]] && sync "$work/raw.zst"
    times+=("$(echo "$(date +%s.%N) - $start" | bc -l)")
  done
  printf '%s\n' "${times[@]}" | sort -g | sed -n "$(( (reps + 1) / 2 ))p" | xargs printf '%.4f'
}
zstd_s=$(zstd_time)
zstd_sync_s=$(zstd_time --fsync)
zstd_bytes=$(stat -c %s "$work/raw.zst")
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

raw=$(val raw_bytes)
mb() { echo "scale=2; $1 / 1000000" | bc -l; }
pct() { echo "scale=1; 100 * $1 / $raw" | bc -l; }
echo "## Checkpoints: $(val params) parameters (hidden $hidden, $layers layers), $steps steps, a save every $interval"
echo
echo "machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); threads $threads;" \
     "load average before $load_before, after $load_after; commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)"
echo "command: tests/bench/bench_ckpt.sh --hidden $hidden --layers $layers --steps $steps --interval $interval --reps $reps --threads $threads"
echo
echo "| what | bytes | % of raw fp32 | seconds |"
echo "| --- | ---: | ---: | ---: |"
echo "| raw fp32 state (params + m + v) | $(mb "$raw") MB | 100.0 | |"
echo "| megatrain save, shuffle4 + zstd -3 (sync, fsync) | $(mb "$(val stored_bytes)") MB | $(pct "$(val stored_bytes)") | $(val save_s) |"
echo "| megatrain save, no filter, zstd -3 (sync, fsync) | $(mb "$(val stored_bytes_nofilter)") MB | $(pct "$(val stored_bytes_nofilter)") | $(val save_s_nofilter) |"
echo "| \`zstd -T0 -3\` on the raw bytes | $(mb "$zstd_bytes") MB | $(pct "$zstd_bytes") | $zstd_s |"
echo "| \`zstd -T0 -3\` on the raw bytes, then \`sync FILE\` | $(mb "$zstd_bytes") MB | $(pct "$zstd_bytes") | $zstd_sync_s |"
echo "| megatrain load (verify + decompress) | | | $(val load_s) |"
echo
echo "| training time added per save ($saves saves in $steps steps) | seconds |"
echo "| --- | ---: |"
echo "| no saves: $steps steps in | $(printf '%.3f' "$t_none") |"
echo "| sync (\`checkpoint.async: false\`) | $stall_sync |"
echo "| async (\`checkpoint.async: true\`) | $stall_async |"
