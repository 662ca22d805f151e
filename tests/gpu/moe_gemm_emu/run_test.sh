#!/usr/bin/env bash
# run_test.sh: tests/gpu/test_cuda_moe_gemm.c on the CPU, no GPU needed, linked against fake_cuda.c (the CUDA
# runtime and cuBLAS on host memory; cublasGemmEx and the grouped call through OpenBLAS, column-major as cuBLAS)
# and the kernel's emulator (launches of up to FAKE_EMU_FLOPS flops, default 5e7; larger ones through a
# per-expert reference), with src/backend/cuda/cuda_gemm.c as it is. It checks the test and the host code (the
# three ways' dispatch, cuBLAS's arguments, the fallbacks), not cuBLAS or the GPU; its times mean nothing
# (FAKE_SKIP_FLOPS=1 skips the products of --timing-only). FAKE_GROUPED_FP32=0: the grouped call refuses fp32
# output (the loop fallback). Needs the CUDA headers and OpenBLAS; about 5 minutes on 2 cores with --no-timing.
# Usage: bash tests/gpu/moe_gemm_emu/run_test.sh [--no-timing | --timing-only]
set -eu
cd "$(dirname "$0")/../../.."
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
objs=$(ls src/core/*.c src/backend/cpu/*.c | sed 's|^|build/obj/cpu/|; s|\.c$|.o|')
make -s $objs
blas_dir=/usr/lib/x86_64-linux-gnu/openblas-openmp
blas_inc=/usr/include/x86_64-linux-gnu/openblas-openmp
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags="-std=c11 -D_GNU_SOURCE -Isrc -Itests/gpu -O1 -fopenmp -DMT_CUDA -I$CUDA_HOME/include -I$blas_inc"
for f in tests/gpu/test_cuda_moe_gemm.c src/backend/cuda/cuda_gemm.c src/backend/cuda/cuda_context.c \
         tests/gpu/moe_gemm_emu/fake_cuda.c; do
  gcc $flags -c "$f" -o "$tmp/$(basename "$f" .c).o"
done
gcc -c tests/gpu/moe_gemm_emu/fake_lt_stubs.c -o "$tmp/fake_lt_stubs.o"
python3 tests/gpu/moe_gemm_emu/gen.py kernels/moe_gemm.cu "$tmp/emu_kernel.inc" --library
g++ -std=c++20 -O2 -pthread -Wno-unknown-pragmas -DEMU_LIBRARY -I"$tmp" -c tests/gpu/moe_gemm_emu/emu.cpp -o "$tmp/emu.o"
g++ -o "$tmp/test_cuda_moe_gemm" "$tmp"/*.o $objs -L$blas_dir -Wl,-rpath,$blas_dir -lopenblas -fopenmp -lm -lpthread
"$tmp/test_cuda_moe_gemm" "$@"
