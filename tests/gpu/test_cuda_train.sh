#!/usr/bin/env bash
# test_cuda_train.sh: the tiny llama recipe trained on the GPU tracks the CPU
# run: same data, seed and weights at step 0; the GPU computes in bf16, so the
# curves agree within bf16 noise, not bit for bit. Checked: the first loss
# (same weights, one forward) within 1%, the mean |difference| over all 300
# steps below 0.05, the final losses within 0.1 and both below 2.5; the GPU
# run's log shows TFLOP/s and memory; the NCCL gradient path on one rank
# agrees (see below); `eval --device cuda` gives the CPU's loss of a GPU
# checkpoint; then a GPU checkpoint resumes on the GPU.
set -euo pipefail
source "$(dirname "$0")/../integration/lib.sh"
MEGATRAIN=${MEGATRAIN:-build/cuda/megatrain}
demo_data "$WORK/english"
common=(--set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1)
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/cpu" "${common[@]}" > "$WORK/cpu.txt"
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/gpu" --set run.device=cuda \
  --set precision=bf16 "${common[@]}" > "$WORK/gpu.txt"
grep -q "^device: " "$WORK/gpu.txt" || fail "no device line in the GPU run's log"
grep -q "TFLOP/s" "$WORK/gpu.txt" || fail "no TFLOP/s column in the GPU run's log"
grep -q '"peak_mem_gib"' "$WORK/gpu/metrics.jsonl" || fail "no peak_mem_gib in metrics.jsonl"
paste -d' ' <(json_field "$WORK/cpu/metrics.jsonl" loss) <(json_field "$WORK/gpu/metrics.jsonl" loss) > "$WORK/pairs"
awk '
  NR == 1 { first = ($2 - $1) / $1; if (first < 0) first = -first }
  { d = $2 - $1; if (d < 0) d = -d; sum += d; n++; cpu = $1; gpu = $2 }
  NR % 50 == 0 { printf "step %3d: cpu %.4f gpu %.4f\n", NR, $1, $2 }
  END {
    mean = sum / n; last = gpu - cpu; if (last < 0) last = -last
    printf "steps %d, first-loss difference %.2e, mean |difference| %.4f, final cpu %.4f gpu %.4f\n", n, first, mean, cpu, gpu
    exit !(n == 300 && first < 0.01 && mean < 0.05 && last < 0.1 && cpu < 2.5 && gpu < 2.5)
  }' "$WORK/pairs" || fail "the GPU loss curve does not track the CPU one"

# The NCCL gradient averaging (layer by layer on a second stream during the
# backward) on a group of one rank, which changes no value: a race between
# the streams would show at once, while atomics (attention dq, embedding)
# make any two GPU runs differ in the last bits, a difference that training
# amplifies over hundreds of steps. So: the first 10 steps agree with the
# plain GPU run within 0.01, and the whole curve tracks the CPU one as the
# plain GPU run must.
# NCCL_DEBUG=INFO with the ENV subsystem (INIT: its version) prints each NCCL_* variable NCCL reads ("NCCL_X set by environment to
# V."): the line for NCCL_LAUNCH_ORDER_IMPLICIT shows whether megatrain's setenv (src/dist/comm_nccl.c) came early
# enough for this NCCL (tests/gpu/PENDING.md asks); NCCL may read it only where the order matters, so its absence
# is reported, not failed.
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV MEGATRAIN_NCCL_SINGLE_RANK=1 "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" \
  --set run.dir="$WORK/nccl" --set run.device=cuda --set precision=bf16 "${common[@]}" > "$WORK/nccl.txt"
grep -q "gradients averaged with NCCL" "$WORK/nccl.txt" || fail "the NCCL path was not taken"
grep -m 1 "NCCL_LAUNCH_ORDER_IMPLICIT set by environment" "$WORK/nccl.txt" ||
  echo "NCCL_LAUNCH_ORDER_IMPLICIT: NCCL logged no read of it (NCCL_DEBUG=INFO, subsystem ENV)"
grep -m 1 "NCCL version" "$WORK/nccl.txt" || true  # the INIT subsystem's line: 2.26 or later reads the variable
paste -d' ' <(json_field "$WORK/gpu/metrics.jsonl" loss) <(json_field "$WORK/nccl/metrics.jsonl" loss) |
  awk 'NR <= 10 { d = $2 - $1; if (d < 0) d = -d; if (d > worst) worst = d; printf "step %2d: gpu %.5f nccl %.5f\n", NR, $1, $2 }
       END { printf "first 10 steps: max |difference| %.2e\n", worst; exit !(worst < 0.01) }' ||
  fail "the NCCL-averaged GPU run differs from the plain one within its first 10 steps"
paste -d' ' <(json_field "$WORK/cpu/metrics.jsonl" loss) <(json_field "$WORK/nccl/metrics.jsonl" loss) |
  awk '{ d = $2 - $1; if (d < 0) d = -d; sum += d; n++; cpu = $1; gpu = $2 }
       END { last = gpu - cpu; if (last < 0) last = -last
             printf "nccl run against the cpu: mean |difference| %.4f, final %.4f vs %.4f\n", sum / n, gpu, cpu
             exit !(n == 300 && sum / n < 0.05 && last < 0.1 && gpu < 2.5) }' ||
  fail "the NCCL-averaged GPU run does not track the CPU curve"

# `megatrain eval --device cuda` (the eval command through the CUDA ModelDevice) gives the CPU's loss of the
# same checkpoint within bf16 noise (1%).
ckpt=$(ls -d "$WORK/gpu/checkpoints"/iter_* | tail -n 1)
"$MEGATRAIN" eval "$ckpt" --data "$WORK/english" --batches 4 --seq-len 128 > "$WORK/eval_cpu.txt"
"$MEGATRAIN" eval "$ckpt" --data "$WORK/english" --batches 4 --seq-len 128 --device cuda > "$WORK/eval_gpu.txt"
paste -d' ' <(awk '{print $3}' "$WORK/eval_cpu.txt") <(awk '{print $3}' "$WORK/eval_gpu.txt") |
  awk '{ d = ($2 - $1) / $1; if (d < 0) d = -d; printf "eval: cpu %.4f gpu %.4f (%.2e)\n", $1, $2, d; exit !(d < 0.01) }' ||
  fail "eval --device cuda does not give the CPU's loss"

# A checkpoint written from the GPU resumes on the GPU to the same step count.
"$MEGATRAIN" resume "$WORK/gpu" --set train.steps=320 > "$WORK/resume.txt"
grep -q "^step *320/320" "$WORK/resume.txt" || fail "the resumed GPU run did not reach step 320"
echo "ok"
