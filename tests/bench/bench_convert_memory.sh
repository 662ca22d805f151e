#!/usr/bin/env bash
# bench_convert_memory.sh: the memory and time of `megatrain convert` both
# ways on a Qwen2.5 0.5B-shaped model (configs/qwen2.5-0.5b.yaml, 494M
# parameters, random weights after one training step on the demo data: made
# once under build/bench/convert/), and of a LoRA checkpoint of it (rank 16
# on every projection, one step from that model, its base referenced) to
# PEFT's adapters and --merge-lora's merged model. For each it prints the wall
# time and the peak resident memory split into anonymous memory (what the
# process allocated: buffers, the model when one is built) and file-backed
# pages (the mapped safetensors files, which the kernel can drop again under
# pressure), sampled every 20 ms from /proc/PID/status. Not part of `make
# test`; other work on the machine skews the times.
#
# Usage: tests/bench/bench_convert_memory.sh [MEGATRAIN ...]
#   MEGATRAIN  binaries to measure (default build/megatrain); give an older
#              build too to compare them in one run
set -euo pipefail
cd "$(dirname "$0")/../.."
binaries=("$@")
[[ ${#binaries[@]} -gt 0 ]] || binaries=(build/megatrain)
work=build/bench/convert
mkdir -p "$work"
if [[ ! -d $work/hf ]]; then
  [[ -f data/demo/english.bin ]] || bash scripts/demo_data.sh data/demo/english > /dev/null
  cat > "$work/make.yaml" <<EOF
run: {name: convert-bench, dir: $PWD/$work/run, device: cpu}
model: $PWD/configs/qwen2.5-0.5b.yaml
train: {steps: 1, seq_len: 16, micro_batch_size: 1, global_batch_size: 1, eval_interval: 0}
optimizer: {schedule: {warmup_steps: 0}}
precision: fp32
data: {train: [{path: $PWD/data/demo/english, weight: 1.0}]}
checkpoint: {interval: 1}
logging: {tensorboard: false}
EOF
  rm -rf "$work/run"
  "${binaries[0]}" run "$work/make.yaml" > "$work/make.log" 2>&1
  "${binaries[0]}" convert "$work/run" "$work/hf" --dtype bf16 > /dev/null
fi
if [[ ! -d $work/lora-run ]]; then
  rm -rf "$work/base"
  "${binaries[0]}" convert "$work/hf" "$work/base" > /dev/null
  sed -e "s|name: convert-bench, dir: $PWD/$work/run|name: convert-bench-lora, dir: $PWD/$work/lora-run|" \
    -e "s|^checkpoint:.*|checkpoint: {interval: 1, frozen_base: reference}|" "$work/make.yaml" > "$work/lora.yaml"
  printf 'init_from: %s\npeft: {type: lora, rank: 16, alpha: 32}\n' "$PWD/$work/base" >> "$work/lora.yaml"
  "${binaries[0]}" run "$work/lora.yaml" > "$work/lora.log" 2>&1
fi

# peak CMD...: runs CMD; prints "wall_s anon_MB file_MB"
peak() {
  local start=$EPOCHREALTIME anon=0 file=0 a f
  "$@" > /dev/null 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2> /dev/null; do
    a=$(awk '/^RssAnon/{print $2}' "/proc/$pid/status" 2> /dev/null || true)
    f=$(awk '/^RssFile/{print $2}' "/proc/$pid/status" 2> /dev/null || true)
    [[ -n $a && $a -gt $anon ]] && anon=$a
    [[ -n $f && $f -gt $file ]] && file=$f
    sleep 0.02
  done
  wait "$pid" || { echo "failed: $*" >&2; exit 1; }
  awk -v s="$start" -v e="$EPOCHREALTIME" -v a="$anon" -v f="$file" \
    'BEGIN { printf "%.1f %.0f %.0f\n", e - s, a / 1024, f / 1024 }'
}

printf '| binary | direction | wall s | anonymous MB | file-backed MB |\n| --- | --- | --- | --- | --- |\n'
rm -rf "$work"/merged-*
i=0
for bin in "${binaries[@]}"; do
  rm -rf "$work/ckpt" "$work/back"
  read -r t a f < <(peak "$bin" convert "$work/hf" "$work/ckpt")
  printf '| %s | Hugging Face -> checkpoint | %s | %s | %s |\n' "$bin" "$t" "$a" "$f"
  read -r t a f < <(peak "$bin" convert "$work/ckpt" "$work/back" --dtype bf16)
  printf '| %s | checkpoint -> Hugging Face (bf16) | %s | %s | %s |\n' "$bin" "$t" "$a" "$f"
  cmp -s "$work/hf/model.safetensors" "$work/back/model.safetensors" || { echo "round trip differs" >&2; exit 1; }
  rm -rf "$work/adapter"
  read -r t a f < <(peak "$bin" convert "$work/lora-run" "$work/adapter")
  printf '| %s | LoRA checkpoint -> PEFT adapters | %s | %s | %s |\n' "$bin" "$t" "$a" "$f"
  read -r t a f < <(peak "$bin" convert "$work/lora-run" "$work/merged-$i" --merge-lora --dtype bf16)
  printf '| %s | LoRA checkpoint -> merged model (bf16) | %s | %s | %s |\n' "$bin" "$t" "$a" "$f"
  [[ $i -eq 0 ]] || cmp -s "$work/merged-0/model.safetensors" "$work/merged-$i/model.safetensors" \
    || { echo "$bin: the merged model differs from ${binaries[0]}'s" >&2; exit 1; }
  i=$((i + 1))
done
