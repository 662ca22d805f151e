#!/usr/bin/env bash
# run.sh: kernels/moe_gemm.cu's kernel emulated on the CPU, no GPU needed: gen.py
# swaps the kernel's PTX primitives, shared memory and launch for emu.cpp's
# (one std::thread per CUDA thread; cp.async copies land at wait_group;
# ldmatrix and mma.m16n8k16 from their documented fragment layouts, the same
# ones kernels/attention.cu passes with on GPUs), then emu.cpp checks the
# three products against a double-precision reference on the tiny and
# ragged shapes of tests/gpu/test_cuda_moe_gemm.c, that nothing is written
# outside the outputs and that no copy reads outside its buffer. It checks
# the kernel's indexing, not the hardware: a GPU run of test_cuda_moe_gemm
# is still what counts. About 2 minutes on 2 cores (all cases), seconds for
# one: `bash tests/gpu/moe_gemm_emu/run.sh [case 0-6]`.
set -eu
cd "$(dirname "$0")/../../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 tests/gpu/moe_gemm_emu/gen.py kernels/moe_gemm.cu "$tmp/emu_kernel.inc"
g++ -std=c++20 -O2 -pthread -Wall -Wno-unknown-pragmas -I"$tmp" tests/gpu/moe_gemm_emu/emu.cpp -o "$tmp/emu"
"$tmp/emu" "$@"
