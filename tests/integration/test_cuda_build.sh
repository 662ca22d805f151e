#!/usr/bin/env bash
# test_cuda_build.sh: `make CUDA=1` compiles the kernels and links build/cuda/megatrain.
# Nothing CUDA runs here; this only proves the CUDA path still builds (skip without nvcc).
set -euo pipefail
cd "$(dirname "$0")/../.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[[ -x "$NVCC" ]] || { echo "skipped: nvcc not found"; exit 77; }
make --no-print-directory -j2 CUDA=1 BUILD=build/cuda build/cuda/megatrain
test -x build/cuda/megatrain
grep -q ' T cuda_describe_devices' < <(nm build/cuda/megatrain) || { echo "CUDA host code not linked"; exit 1; }
build/cuda/megatrain --version
