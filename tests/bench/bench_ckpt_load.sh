#!/usr/bin/env bash
# bench_ckpt_load.sh: how long loading a checkpoint takes: `megatrain eval CKPT --batches 1` (load every
# weight, verify every chunk's CRC, one forward of 16 tokens) on the Qwen2.5 0.5B-shaped checkpoint of
# tests/bench/bench_convert_memory.sh (build/bench/convert/base, 494M parameters, 1.98 GB of fp32; made by
# running that script once), REPS times per binary, printing each binary's median wall time. Not part of
# `make test`; other work on the machine skews the times.
#
# Usage: tests/bench/bench_ckpt_load.sh [REPS] [MEGATRAIN ...]   (default: 5 build/megatrain)
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-5}
shift || true
binaries=("$@")
[[ ${#binaries[@]} -gt 0 ]] || binaries=(build/megatrain)
ckpt=build/bench/convert/base
[[ -d $ckpt ]] || { echo "no $ckpt: run tests/bench/bench_convert_memory.sh first" >&2; exit 2; }
[[ -f data/demo/english.bin ]] || bash scripts/demo_data.sh data/demo/english > /dev/null
printf '| binary | OMP threads | median wall s (of %d) |\n| --- | --- | --- |\n' "$reps"
for bin in "${binaries[@]}"; do
  times=()
  for _ in $(seq 1 "$reps"); do
    start=$EPOCHREALTIME
    "$bin" eval "$ckpt" --data data/demo/english --batches 1 --seq-len 16 --micro-batch-size 1 > /dev/null
    times+=("$(awk -v s="$start" -v e="$EPOCHREALTIME" 'BEGIN { printf "%.2f", e - s }')")
  done
  median=$(printf '%s\n' "${times[@]}" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
  printf '| %s | %s | %s |\n' "$bin" "${OMP_NUM_THREADS:-all ($(nproc))}" "$median"
done
