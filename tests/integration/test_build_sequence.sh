#!/usr/bin/env bash
# test_build_sequence.sh: `make`, `make CUDA=1`, `make test` and `make test-gpu`
# follow each other in one tree (issue 15: `make CUDA=1` after the demo's CPU
# build once linked CPU objects and failed). Each configuration has its own
# objects (build/obj/cpu, build/obj/cuda) and a program is linked again when
# the configuration changes, and only then. Checked in this tree, in the order
# a user takes: the CPU build (done by `make test` before this runs), then
# `make CUDA=1` links a CUDA build/megatrain, then `make test-build` links the
# CPU one again, a second `make test-build` does nothing, and
# `make gpu-test-build` only links (its objects are those of `make CUDA=1`).
# Leaves build/megatrain the CPU program. Skips without nvcc.
# run_tests.sh: alone (it links build/megatrain for CUDA and back, which the other tests run)
set -euo pipefail
cd "$(dirname "$0")/../.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[[ -x "$NVCC" ]] || { echo "skipped: nvcc not found"; exit 77; }
work=$(mktemp -d); trap 'rm -rf "$work"; make --no-print-directory -j2 test-build > /dev/null' EXIT
has_cuda() { nm "${1:-build/megatrain}" > "$work/nm" && grep -q ' T cuda_describe_devices' "$work/nm"; }
fail() { echo "FAIL: $*"; exit 1; }

make --no-print-directory -j2 test-build > "$work/cpu1.log"
has_cuda && fail "make test-build left a CUDA build/megatrain"
make --no-print-directory -j2 CUDA=1 > "$work/cuda.log" 2>&1 || { tail -20 "$work/cuda.log"; fail "make CUDA=1 after the CPU build"; }
has_cuda || fail "make CUDA=1 did not link the CUDA code into build/megatrain"
build/megatrain --version > /dev/null
make --no-print-directory -j2 test-build > "$work/cpu2.log" 2>&1 || { tail -20 "$work/cpu2.log"; fail "make test-build after make CUDA=1"; }
has_cuda && fail "make test-build after make CUDA=1 kept the CUDA build/megatrain"
grep -q "LINK  build/megatrain" "$work/cpu2.log" || fail "build/megatrain was not linked again for the CPU"
grep -q "  CC " "$work/cpu2.log" && fail "the CPU objects were compiled again after make CUDA=1: $(grep -m1 '  CC ' "$work/cpu2.log")"
make --no-print-directory -j2 test-build > "$work/cpu3.log" 2>&1
grep -q "LINK\|  CC \|  TEST" "$work/cpu3.log" && fail "a second make test-build did work: $(head -3 "$work/cpu3.log")"
make --no-print-directory gpu-test-build > "$work/gpu.log" 2>&1 || { tail -20 "$work/gpu.log"; fail "make gpu-test-build after make test-build"; }
grep -q "  CC \|  NVCC" "$work/gpu.log" && fail "gpu-test-build compiled again what make CUDA=1 had: $(grep -m1 '  CC \|  NVCC' "$work/gpu.log")"
has_cuda build/cuda/megatrain || fail "build/cuda/megatrain has no CUDA code"
echo "ok"
