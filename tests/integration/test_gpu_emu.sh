#!/usr/bin/env bash
# test_gpu_emu.sh: the emulator's checks against kernels that break them
# (tests/gpu/emu/test_emu_checks.cu: races in both orders, a cp.async past an
# allocation, 64 KB of shared memory without the opt-in, a bad warp mask, a
# misaligned vector load, a deadlock; a host pointer as cuBLASLt's FP8 scale,
# as a kernel's argument, a copy's or memset's device side or a grouped
# product's pointer array; overlapping copy ranges or product operands; a
# host-to-device copy landing in its stream's order), then the GPU test programs (tests/gpu/test_cuda_*.c) on the CPU
# emulator (tests/gpu/emu/README.md), so that CI runs every CUDA kernel and the
# whole CUDA model against the CPU reference without a GPU: cuBLASLt's FP8
# products as the emulator models them (test_cuda_cublaslt_fp8), the ops and the MoE
# ops launcher by launcher, the grouped expert products (small shapes), the
# transformers fixtures, the CUDA model (dense and MoE, one rank), the
# parallel grids (tp, sp, cp, dp, ep, etp; ranks as threads, the collectives
# staged) and `plan`'s estimate against the CUDA model's arena. The kernels are the real ones, rewritten only where CUDA syntax
# must become C++ (launches, shared memory, the PTX helpers); the emulator
# also fails on what a GPU leaves to chance (shared memory read before it is
# written, unaligned or out-of-place cp.async and ldmatrix, divergent warp
# exchanges, deadlocks). Then the kernel-level programs again with blocks,
# warps and lanes run in descending order (EMU_ORDER=reverse; the whole model
# runs under the racecheck instead, test_gpu_emu_racecheck.sh): a read of
# another thread's or block's write that no barrier orders gives a different
# result in one of the two orders (a missing __syncthreads after thread 0's
# scan in moe_scan_kernel passed in ascending order and crashed in
# descending). What it cannot show: speed, stream-order races and
# the hardware's own rounding (tests/gpu/PENDING.md keeps the GPU runs). The
# megatrain runs of tests/gpu/test_*.sh take half an hour here: `make
# test-gpu-emu` runs them; this runs three in their short form
# (MT_GPU_TEST_QUICK=1): test_cuda_bf16_states.sh (8 steps a run: bf16 AdamW
# states through megatrain, its checkpoints between the CPU and the GPU and
# the dtypes), test_cuda_recompute.sh (5 steps a run: train.recompute on
# one GPU and at tp 2 + sp, cp 2, pp 2 x vpp 2, the same losses as without)
# and test_cuda_zero1.sh (6 steps a run: the distributed optimizer at dp 2
# with ragged buckets, tied pp 2 x dp 2 and Mixtral ep 2 over dp 4 against
# one GPU, its checkpoints on the GPU and the CPU) and
# test_cuda_moe_spill.sh (6 steps a run: a MoE layer's expert side past the
# arena's room under ep, spilled on every layer, gives the run with the room
# bit for bit, and no device memory is left allocated at the end).
# run_tests.sh: early (about 3 minutes on 2 cores)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO"
need_gpu_emu
# The emulator's own checks first (tests/gpu/emu/test_emu_checks.cu: a kernel breaking each rule).
checks=build/emu/test_emu_checks
out=$($checks order)
[[ $out == "broadcast read wrong by 0 threads; thread 0 read before the write; block 1 read 1 (right)" ]] ||
  fail "order, ascending: $out"
out=$(EMU_ORDER=reverse $checks order)
[[ $out == "broadcast read wrong by 255 threads; thread 0 read 7 (right); block 1 read before the write" ]] ||
  fail "order, EMU_ORDER=reverse: $out"
out=$($checks smem_optin)
[[ $out == "64 KB without the attribute: cudaErrorInvalidValue; with it: cudaSuccess, result 255" ]] ||
  fail "smem_optin: $out"
for spec in "cp_async_oob|cp.async of 16 bytes from .*, outside every cudaMalloc allocation" \
            "warp_mask|warp exchange with mask 0x0000ffff" "misaligned|a vector access at .*, not aligned to its 16 bytes" \
            "deadlock|deadlock: some threads wait at __syncthreads"; do
  # an inner shell waits for it, so that the abort's "Aborted" goes to the file, not the test's log
  if bash -c '"$@"; exit $?' _ $checks "${spec%%|*}" > "$WORK/check.txt" 2>&1; then fail "${spec%%|*}: not stopped"; fi
  grep -q "EMU: kernel .*: ${spec#*|}" "$WORK/check.txt" || { cat "$WORK/check.txt"; fail "${spec%%|*}: no message"; }
done
# cuBLASLt reads its FP8 scales from device memory: a host pointer there must stop the emulator too.
if bash -c '"$@"; exit $?' _ build/emu/gpu-tests/test_cuda_cublaslt_fp8 host_scale > "$WORK/check.txt" 2>&1; then
  fail "host_scale: not stopped"
fi
grep -q "EMU: cublasLtMatmul: A's scale .* is not inside one cudaMalloc allocation" "$WORK/check.txt" ||
  { cat "$WORK/check.txt"; fail "host_scale: no message"; }
# what the runtime and cuBLAS calls and kernels must be given (test_emu_checks' call_case)
for spec in "host_arg|EMU: kernel copy_kernel: argument 1 is .*, not inside a cudaMalloc allocation" \
            "copy_kind|EMU: cudaMemcpyHostToDevice's destination .* is not inside one cudaMalloc allocation" \
            "copy_overlap|EMU: cudaMemcpyDeviceToDevice of 64 bytes from .*: the ranges overlap" \
            "memset_host|EMU: cudaMemsetAsync's destination .* is not inside one cudaMalloc allocation" \
            "gemm_overlap|EMU: a matrix product (m 8, n 8, k 8) writes D at .* over its input A" \
            "grouped_host|EMU: cublasGemmGroupedBatchedEx's array of A pointers .* is not inside one cudaMalloc"; do
  if bash -c '"$@"; exit $?' _ $checks "${spec%%|*}" > "$WORK/check.txt" 2>&1; then fail "${spec%%|*}: not stopped"; fi
  grep -q "${spec#*|}" "$WORK/check.txt" || { cat "$WORK/check.txt"; fail "${spec%%|*}: no message"; }
done
# a host-to-device copy staged at the call and landing in its stream's order: another stream without an event sees
# the allocation's poison (-1), after the copy's event the value the host had at the call (1, not the 2 it wrote
# after)
out=$(EMU_STREAMS=lazy $checks staged_copy)
[[ $out == "without an event: -1; after the copy's event: 1" ]] || fail "staged_copy: $out"
# a stream with queued work is "not ready" to cudaStreamQuery, as a GPU still working through it is, so polling loops
# (megatrain's check for a failed peer) take that branch: two queued copies, two questions; run at once, none
for order in lazy:2 eager:0; do
  out=$(EMU_STREAMS=${order%:*} $checks stream_query)
  [[ $out == "not ready ${order#*:} times, then ready with 5" ]] || fail "stream_query under ${order%:*}: $out"
done
echo "the emulator's checks: 15 planted faults seen; cudaStreamQuery not ready while work is queued"
# MT_GPU_TEST_SMALL=1: test_cuda_model's wide llama left out (about a minute of a core and 1.3 GB touched here): it
# is there for a GPU, whose long zeroing of its arena overtook copies not ordered after it; the emulator runs each
# stream's work as it is queued (the stream orders are test_gpu_emu_streams.sh's, which leaves it out too)
export MT_GPU_TEST_QUICK=1 MT_GPU_TEST_SMALL=1
emulated() {  # emulated ORDER:PROGRAM[:PART]: one test program (test_cuda_model: its dense or MoE half) passes, its
  # blocks, warps and lanes in ORDER
  local order=${1%%:*} t=${1#*:} part= start=$SECONDS out label=${1#*:}
  [[ $t != *:* ]] || { part=${t#*:}; t=${t%%:*}; }
  [[ $order == forward ]] || label+=", EMU_ORDER=$order"
  out=$(EMU_ORDER=$order MT_GPU_TEST_PART=$part build/emu/gpu-tests/$t 2>&1) || { echo "$out" | grep -v " ok$" | tail -30; fail "$label failed"; }
  echo "$label: $(echo "$out" | grep -E "passed, |PASSED" | tail -n 1) ($((SECONDS - start)) s)"
}
# job ORDER:PROGRAM[:PART] (emulated) or SCRIPT.sh: a megatrain test of tests/gpu with the emulator's build
job() {
  [[ $1 == *.sh ]] || { emulated "$1"; return; }
  local start=$SECONDS out
  out=$(MEGATRAIN="$REPO/build/emu/megatrain" bash "tests/gpu/$1" 2>&1) || { echo "$out" | tail -30; fail "$1 failed"; }
  echo "$1: $(echo "$out" | tail -n 1) ($((SECONDS - start)) s)"
}
# each program's kernels run on one core: the programs run side by side (the longest first); the kernel-level ones
# again in descending order (the whole model's kernels are those, and test_gpu_emu_racecheck.sh runs the model with
# blocks unordered, which reports what either order would show)
run_jobs job forward:test_cuda_model:dense forward:test_cuda_model:moe test_cuda_recompute.sh test_cuda_zero1.sh \
  test_cuda_bf16_states.sh test_cuda_moe_spill.sh forward:test_cuda_parallel_model forward:test_cuda_hf_parity forward:test_cuda_moe_gemm \
  reverse:test_cuda_moe_gemm forward:test_cuda_ops reverse:test_cuda_ops forward:test_cuda_moe_ops \
  reverse:test_cuda_moe_ops forward:test_cuda_cublaslt_fp8 forward:test_cuda_plan
echo ok
