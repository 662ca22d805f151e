#!/usr/bin/env bash
# test_moe_gemm_emu.sh: kernels/moe_gemm.cu's grouped expert products (the
# `kernel` way of MEGATRAIN_MOE_GEMM) run on the CPU through the emulator of
# tests/gpu/moe_gemm_emu (one thread per CUDA thread; cp.async, ldmatrix and
# mma.m16n8k16 from their documented semantics): the three products against
# a double-precision reference on the tiny and ragged shapes (empty experts,
# one row, rows not a multiple of the tile, gate and up in one tile), that
# nothing is written outside the outputs and no copy reads outside a buffer.
# It checks the kernel's indexing in CI; the GPU run of
# tests/gpu/test_cuda_moe_gemm.c is what checks the hardware. The two large
# cases (5, 6: about 50 s on 2 cores) run by hand: bash tests/gpu/moe_gemm_emu/run.sh 5.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v g++ > /dev/null || { echo "skipped: no g++"; exit 77; }
for c in 0 1 2 3 4; do
  out=$(bash tests/gpu/moe_gemm_emu/run.sh "$c" 2>&1) || { echo "$out" | tail -20; echo "case $c failed"; exit 1; }
  line=$(echo "$out" | tail -n 1)
  echo "case $c: $line"
  [[ $line == *" 0 failed, 0 emulator failures" ]] || { echo "$out" | tail -20; exit 1; }
done
echo ok
