#!/usr/bin/env bash
# device_check.sh: everything a lent GPU machine should run, in one call:
# the GPU tests, a profiled training run (time per kind of op), and the
# benchmark against PyTorch. Expects build/cuda and .devlibs.tgz from
# tests/gpu/carry_libs.sh (or a machine with our packages: then plain
# `make test-gpu` and `make bench-gpu` do the same). Logs go to $OUT (or
# /tmp/device-check). Usage: bash tests/gpu/device_check.sh [tests|profile|bench|moe-ways|bench-a3b|bench-mixtral ...]
# (bench: the dense shapes, about 7 minutes on an H100; moe-ways: megatrain alone on the MoE shapes with
# each MEGATRAIN_MOE_GEMM, about 5 minutes; bench-a3b and bench-mixtral: one MoE shape each,
# megatrain and its PyTorch peers; each in a device call of its own: a call is at most 10 minutes)
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
out=${OUT:-/tmp/device-check}
mkdir -p "$out"
parts=${*:-tests profile bench}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for part in $parts; do
  case $part in
    tests)
      bash tests/gpu/run_gpu_tests.sh > "$out/tests.log" 2>&1
      grep -E "^(PASS|FAIL|SKIP)|FAIL|passed|worst|loss cpu|steps 300|nccl run|first loss|skip" "$out/tests.log" | grep -v " ok$" | tail -60 ;;
    attention) # built by hand (see tests/gpu/attention_selftest.cu), carried as build/cuda/attention_selftest
      [[ -x build/cuda/attention_selftest ]] || { echo "no build/cuda/attention_selftest: nvcc -O3 -std=c++17 -arch=sm_90 \
tests/gpu/attention_selftest.cu kernels/attention.cu -o build/cuda/attention_selftest"; continue; }
      build/cuda/attention_selftest > "$out/attention.log" 2>&1; grep -E "FAIL|correctness|TFLOP" "$out/attention.log" ;;
    profile)
      python3 tests/bench/bench_gpu.py --no-torch --only llama3.2-1b-s4096 --steps 7 --warmup 2 --out /tmp/profile-run \
        --env MEGATRAIN_CUDA_PROFILE=5 > "$out/profile.log" 2>&1
      grep -A12 "CUDA profile" /tmp/profile-run/*.megatrain.log | head -14 ;;
    bench)
      python3 tests/bench/bench_gpu.py --group dense --out /tmp/bench-gpu > "$out/bench.log" 2>&1
      cp /tmp/bench-gpu/results.json "$out/" 2>/dev/null
      head -3 /tmp/bench-gpu/llama3.2-1b-s4096.megatrain.log > "$out/megatrain-head.log" 2>/dev/null
      grep -E "^(step|device)" /tmp/bench-gpu/llama3.2-1b-s4096.megatrain.log | head -4
      tail -14 "$out/bench.log" ;;
    moe-ways) # megatrain alone on both MoE shapes with each way of the expert products (MEGATRAIN_MOE_GEMM)
      for way in cublas cublas_grouped kernel; do
        python3 tests/bench/bench_gpu.py --no-torch --group moe --steps 8 --warmup 3 --out "/tmp/moe-$way" \
          --env MEGATRAIN_MOE_GEMM=$way > "$out/moe-$way.log" 2>&1
        echo "MEGATRAIN_MOE_GEMM=$way"; tail -4 "$out/moe-$way.log"
      done ;;
    bench-a3b|bench-mixtral)
      shape=${part#bench-}
      # a peer past 200 s (a slow compile) becomes a timeout row: the call stays within 10 minutes
      python3 tests/bench/bench_gpu.py --only "$shape" --torch-timeout 200 --out "/tmp/$part" > "$out/$part.log" 2>&1
      cp "/tmp/$part/results.json" "$out/results-$shape.json" 2>/dev/null
      grep -h "self-check" /tmp/$part/*grouped_mm-eager.log 2>/dev/null | head -2
      tail -9 "$out/$part.log" ;;
  esac
done
