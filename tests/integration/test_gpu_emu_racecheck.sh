#!/usr/bin/env bash
# test_gpu_emu_racecheck.sh: the kernel-level GPU test programs on the CPU
# emulator's racecheck build (make gpu-emu-tsan-build: build/emu-tsan), the
# kernels under ThreadSanitizer with each CUDA thread of a block its own
# fibre, ordered only by __syncthreads, __syncwarp and the stream between
# kernels; the blocks of a kernel take turns among sets of fibres, each with
# its own shared memory, and only the blocks of one set are ordered (each
# after the one before it; tests/gpu/emu/emu_exec.cpp); each stream's work
# runs as a fibre of its own, ordered after another stream's only by an
# event (tests/gpu/emu/emu_streams.c).
# Two threads of a block touching the same memory with no barrier between
# are reported whatever order the emulator runs them in, which the two
# orders of test_gpu_emu.sh cannot promise (a cp.async prefetch moved above
# the barrier in attention.cu's forward passes test_cuda_ops in both orders
# there and is reported here), and so are two blocks on different sets
# touching the same global memory without atomics (an atomicAdd made a plain += passes there,
# blocks one after another losing no update, and is reported here: the
# atomic- mutants of tests/mutants/mutants.txt).
#   - each planted race of test_emu_checks (a broadcast read with no barrier,
#     a cp.async issued into a buffer another warp still reads, one pending
#     across a barrier while another warp reads its buffer, rows written by
#     one warp and read by another's ldmatrix, two blocks adding to one
#     global cell, one block's write before its barriers read by another
#     after its own) is reported, naming its kernel, in both orders;
#   - a kernel that uses every ordering correctly (barriers, __syncwarp,
#     shuffles, atomics in shared and global memory, a cp.async stage,
#     shared memory reused by later blocks, ten blocks on four sets) is not;
#   - a kernel on one stream reading what another stream's kernel wrote, with
#     no event between, is reported with the streams eager, lazy and
#     lazy-first, and not with the event;
#   - test_cuda_ops, test_cuda_moe_ops, test_cuda_moe_gemm, test_cuda_model
#     (without its 1.8 GB case and its recompute check), test_cuda_cublaslt_fp8 and the first
#     data-parallel grid of test_cuda_parallel_model (dp 2 x ep 2, the
#     gradient averages on the comm stream) pass with no report.
# test_cuda_parallel_model (the CUDA build's host code with ranks as threads)
# passes there too but takes about 10 minutes: run it by hand
# (build/emu-tsan/gpu-tests/test_cuda_parallel_model with the settings below).
# run_tests.sh: early (about 5 minutes on 2 cores)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO"
can_gpu_emu
make --no-print-directory -s -j"$(cores)" gpu-emu-tsan-build > "$WORK/build.txt" 2>&1 ||
  { tail -20 "$WORK/build.txt"; fail "build"; }
# Under tests/run_sanitize.sh a plain library is preloaded; ThreadSanitizer's runtime must come first.
unset LD_PRELOAD
# One thread a process besides the emulated ones: OpenMP's and OpenBLAS's threads (the CPU references) synchronise
# in code ThreadSanitizer does not see.
# test_cuda_model's recompute check reruns the plain backward's kernels (MT_GPU_TEST_RECOMPUTE=0: left out here; the
# plain, ASan and lazy-stream emulator runs keep it).
export MT_GPU_TEST_QUICK=1 MT_GPU_TEST_SMALL=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MT_GPU_TEST_RECOMPUTE=0
export TSAN_OPTIONS=halt_on_error=0:exitcode=66
checks=build/emu-tsan/test_emu_checks
reported() {  # reported KIND: test_emu_checks' planted race KIND is reported in both orders
  local k=$1 order status
  for order in forward reverse; do
    status=0
    EMU_ORDER=$order "$checks" racecheck "$k" > "$WORK/$k-$order.txt" 2>&1 || status=$?
    [[ $status -eq 66 ]] || { head -20 "$WORK/$k-$order.txt"; fail "racecheck $k ($order): exit $status, expected 66 (a report)"; }
    grep -q "WARNING: ThreadSanitizer: data race" "$WORK/$k-$order.txt" && grep -q "race_${k}_kernel" "$WORK/$k-$order.txt" ||
      { head -20 "$WORK/$k-$order.txt"; fail "racecheck $k ($order): no data race reported in race_${k}_kernel"; }
  done
  echo "racecheck $k: reported in both orders"
}
run_jobs reported broadcast cp_async cp_async_late ldmatrix blocks blocks_barrier streams
for order in forward reverse; do
  out=$(EMU_ORDER=$order "$checks" racecheck none 2>&1) || { echo "$out" | head -40; fail "racecheck none ($order): a report"; }
  [[ $out == ran ]] || fail "racecheck none ($order): $out"
done
echo "racecheck none: no report in either order"
for order in lazy lazy-first; do  # the streams' own orders: the race and its event, whichever stream runs first
  status=0
  EMU_STREAMS=$order "$checks" racecheck streams > "$WORK/streams-$order.txt" 2>&1 || status=$?
  [[ $status -eq 66 ]] && grep -q "race_streams_kernel" "$WORK/streams-$order.txt" ||
    { head -20 "$WORK/streams-$order.txt"; fail "racecheck streams (EMU_STREAMS=$order): exit $status, no report"; }
  out=$(EMU_STREAMS=$order "$checks" racecheck none 2>&1) || { echo "$out" | head -40; fail "racecheck none ($order): a report"; }
done
echo "racecheck streams: reported, and not with its event, with the streams eager, lazy and lazy-first"
raced() {  # raced PROGRAM[:PART]: one test program (test_cuda_model: its dense or MoE half, MT_GPU_TEST_PART) passes
  # with no report (MT_GPU_TEST_GRIDS=1: test_cuda_parallel_model's first grid alone, dp 2 x ep 2 with the gradient
  # averages on the comm stream, ordered by their events: without either wait it is reported, the stream- mutants; no
  # other program reads it)
  local t=${1%%:*} part= start=$SECONDS out label=$1
  [[ $1 != *:* ]] || part=${1#*:}
  [[ $t != test_cuda_parallel_model ]] || label="test_cuda_parallel_model's first grid (dp 2 x ep 2, the comm stream)"
  out=$(MT_GPU_TEST_PART=$part MT_GPU_TEST_GRIDS=1 build/emu-tsan/gpu-tests/$t 2>&1) || { echo "$out" | grep -A30 "WARNING: ThreadSanitizer" | head -40
    echo "$out" | grep -v " ok$" | tail -20; fail "$label under the racecheck"; }
  ! grep -q "ThreadSanitizer" <<< "$out" || { grep -A20 "ThreadSanitizer" <<< "$out" | head -40; fail "$label: a report"; }
  echo "$label under the racecheck: $(grep -E "passed, " <<< "$out" | tail -n 1) ($((SECONDS - start)) s)"
}
# each program's kernels run on one core: the programs run side by side (the longest first)
run_jobs raced test_cuda_model:dense test_cuda_model:moe test_cuda_moe_gemm test_cuda_parallel_model test_cuda_moe_ops \
  test_cuda_ops test_cuda_cublaslt_fp8

echo ok
