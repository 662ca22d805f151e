#!/usr/bin/env bash
# test_gpu_emu_asan.sh: the kernel-level GPU test programs on the CPU emulator
# built with AddressSanitizer and UndefinedBehaviorSanitizer (make
# gpu-emu-asan-build: build/emu-asan). Device memory is host memory allocated
# to the byte (emu_runtime.c), so a kernel that reads or writes past its
# buffer, or a launcher that sizes one too small, is reported where it
# happens, with the kernel's source line; the fibres' stacks are announced to
# AddressSanitizer at each switch (emu_exec.cpp). The CUDA build's host code
# (src/backend/cuda, src/model/cuda) runs under both sanitizers too, which the
# CPU build's `make test-sanitize` does not reach.
#   - a planted write past an allocation (test_emu_checks oob_write) must be
#     reported, naming the kernel's line;
#   - a new host thread's fibre stacks carry none of the marks a finished
#     thread's fibres left at the same addresses (test_emu_checks
#     fresh_stacks; AddressSanitizer keeps an unmapped range's shadow);
#   - test_cuda_ops, test_cuda_moe_ops, test_cuda_moe_gemm, test_cuda_model
#     and test_cuda_parallel_model (the tp / cp / ep / dp grids' host code,
#     ranks as threads) pass with no report.
# Leaks are not checked here (LeakSanitizer and the fibre stacks).
# run_tests.sh: early (about 3 minutes on 2 cores)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO"
can_gpu_emu
make --no-print-directory -s -j"$(cores)" gpu-emu-asan-build > "$WORK/build.txt" 2>&1 ||
  { tail -20 "$WORK/build.txt"; fail "build"; }
# Under tests/run_sanitize.sh a plain library is preloaded (keep_plugins.so, for Open MPI's plugins): the
# sanitizers' runtime must come first in these programs, so it goes.
unset LD_PRELOAD
# MT_GPU_TEST_SMALL=1: test_cuda_model without its wide case (a large arena for the zeroing's order; its shapes take
# no path of a kernel the small cases' odd shapes do not: the kernels branch on alignment, V % 8, not on size), which
# was most of this run's time; the plain emulator's run keeps it
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 MT_GPU_TEST_QUICK=1 MT_GPU_TEST_SMALL=1
if build/emu-asan/test_emu_checks oob_write > "$WORK/oob.txt" 2>&1; then fail "oob_write: not stopped"; fi
grep -q "ERROR: AddressSanitizer: heap-buffer-overflow" "$WORK/oob.txt" &&
  grep -q "in oob_write_kernel(float\*, int) tests/gpu/emu/test_emu_checks.cu" "$WORK/oob.txt" ||
  { head -20 "$WORK/oob.txt"; fail "oob_write: no AddressSanitizer report naming the kernel"; }
echo "a write past an allocation: reported at its kernel's line"
out=$(build/emu-asan/test_emu_checks fresh_stacks 2>&1) || { echo "$out" | head -20; fail "fresh_stacks: $out"; }
[[ $out == clean ]] || fail "fresh_stacks: $out"
echo "a new thread's fibre stacks: none of a finished thread's marks"
sanitized() {  # sanitized PROGRAM[:PART]: one test program (test_cuda_model: its dense or MoE half) passes with no report
  local t=${1%%:*} part= start=$SECONDS out
  [[ $1 != *:* ]] || part=${1#*:}
  out=$(MT_GPU_TEST_PART=$part build/emu-asan/gpu-tests/$t 2>&1) || { echo "$out" | grep -A24 "ERROR: AddressSanitizer\|runtime error" | head -40
    echo "$out" | grep -v " ok$" | tail -40; fail "$t under the sanitizers"; }
  ! echo "$out" | grep -q "runtime error\|AddressSanitizer" || { echo "$out" | grep -A8 "runtime error\|AddressSanitizer" | head -40; fail "$t: a sanitizer report"; }
  echo "$1 under ASan + UBSan: $(echo "$out" | grep -E "passed, " | tail -n 1) ($((SECONDS - start)) s)"
}
# each program's kernels run on one core: the programs run side by side (the longest first)
run_jobs sanitized test_cuda_model:dense test_cuda_model:moe test_cuda_parallel_model test_cuda_moe_gemm test_cuda_ops \
  test_cuda_moe_ops test_cuda_cublaslt_fp8
echo ok
