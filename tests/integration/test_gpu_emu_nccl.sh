#!/usr/bin/env bash
# test_gpu_emu_nccl.sh: megatrain's NCCL transport (src/dist/comm_nccl.c, the
# layouts with one GPU a rank) on the CPU emulator (tests/gpu/emu/README.md),
# with as many emulated GPUs as ranks (EMU_GPUS), so that the collectives go
# through NCCL, not the host path a shared GPU takes:
#   - the emulator's NCCL on its own (test_emu_nccl under mpirun, 3 ranks):
#     every collective, the grouped all-to-all and groups of two messages to one
#     peer (matched in order) against known values; a rank
#     calling a different collective from the others is named and stops the
#     job, and so do the hangs: two communicators used in opposite orders, two
#     ranks that each send before they receive, and two communicators on two
#     streams that the ranks run in different orders (EMU_STREAMS=lazy,eager),
#     which NCCL_LAUNCH_ORDER_IMPLICIT=1 turns into a pass; an all-reduce whose
#     buffers overlap other than in place is stopped (a GPU's ring corrupts it);
#   - the tiny llama at tp 2 with sequence parallel, cp 2 and dp 2 (gradients
#     averaged layer by layer on the second stream; and with the distributed
#     optimizer: buckets reduce-scattered and all-gathered in place), and the tiny mixtral at
#     ep 2 (the all-to-all of grouped sends and receives) and at dp 2 with the distributed
#     optimizer, its streams lazy (each MoE layer waits for its experts' gather) on the emulated
#     GPUs: their logs say NCCL, and the first 10 losses and grad norms
#     follow the one-GPU run's (emu_tracks in lib.sh: 1e-3 and 0.5%; the grad
#     norm catches a gradient summed where it should be averaged, which
#     AdamW hides from the losses);
#   - two communicators in flight (the dp averages on the second stream while
#     tp, cp or ep collectives run on the compute stream) with each rank's
#     streams in another order (EMU_STREAMS=eager,lazy,lazy,eager on 4 ranks,
#     as GPUs whose timings differ run them): the tiny llama at tp 2 x dp 2
#     hangs with NCCL_LAUNCH_ORDER_IMPLICIT=0 (the hazard is real in
#     megatrain's schedule) and, with the launch order megatrain sets
#     (src/dist/comm_nccl.c), tracks one GPU; so do the tiny mixtral at
#     ep 2 over dp 4 and the tiny llama at tp 2 x dp 2 with the distributed
#     optimizer (its reduce-scatters and all-gathers on the second stream);
#   - pipeline stages sending GPU to GPU (grouped ncclSend / ncclRecv): pp 2
#     with vpp 2 tracks one GPU; a group whose receive overlaps one of its
#     sends (test_emu_nccl overlap) is refused, as the interleaved schedule's
#     gradient send and receive would be without the send's copy.
# A GPU run remains what counts (tests/gpu/PENDING.md's NCCL row).
# run_tests.sh: early (about 2 minutes on 2 cores)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO"
need_gpu_emu mpirun
mpi=(mpirun --allow-run-as-root --oversubscribe)

mkdir "$WORK/tmp" # the communicators' files: none may stay behind
TMPDIR=$WORK/tmp "${mpi[@]}" -x TMPDIR -np 3 build/emu/test_emu_nccl | tee "$WORK/unit.txt"
grep -q "all checks passed on 3 ranks" "$WORK/unit.txt" || fail "test_emu_nccl"
if TMPDIR=$WORK/tmp timeout -k 5 120 "${mpi[@]}" -x TMPDIR -np 3 build/emu/test_emu_nccl mismatch > "$WORK/mismatch.txt" 2>&1; then
  fail "ranks calling different collectives were not stopped"
fi
grep -q "calls ncclAllReduce #0 of 64 fp32 elements with rank 0, which called ncclAllGather #0" "$WORK/mismatch.txt" ||
  { tail "$WORK/mismatch.txt"; fail "no message naming the two calls"; }
# must_hang NAME [VAR=VALUE...] -- CASE: test_emu_nccl CASE stops with the emulator's hang message
must_hang() {
  local name=$1; shift
  if env EMU_NCCL_TIMEOUT=3 "$@" TMPDIR="$WORK/tmp" timeout -k 5 120 "${mpi[@]}" -np 3 \
       build/emu/test_emu_nccl "$name" > "$WORK/$name.txt" 2>&1; then
    fail "$name: the hang was not stopped"
  fi
  grep -q "has not moved for 3 s" "$WORK/$name.txt" || { tail "$WORK/$name.txt"; fail "$name: no hang message"; }
  echo "$name: stopped as a hang"
}
must_hang cross_order
must_hang sends_first
must_hang two_streams EMU_STREAMS=lazy,eager NCCL_LAUNCH_ORDER_IMPLICIT=0
TMPDIR=$WORK/tmp "${mpi[@]}" -np 3 build/emu/test_emu_nccl overlap > "$WORK/overlap.txt" 2>&1 ||
  { tail "$WORK/overlap.txt"; fail "overlap: a group whose receive overlaps its send was not refused"; }
grep -q "overlaps its ncclSend to rank" "$WORK/overlap.txt" || { tail "$WORK/overlap.txt"; fail "overlap: no message"; }
echo "overlap: a group's receive into its own send's buffer refused"
if TMPDIR=$WORK/tmp timeout -k 5 120 "${mpi[@]}" -np 2 build/emu/test_emu_nccl shifted > "$WORK/shifted.txt" 2>&1; then
  fail "shifted: an all-reduce into its own input one float on was not stopped"
fi
grep -q "ncclAllReduce's send buffer .* overlaps its receive buffer .* other than in place" "$WORK/shifted.txt" ||
  { tail "$WORK/shifted.txt"; fail "shifted: no message"; }
echo "shifted: an all-reduce overlapping its input other than in place stopped"
EMU_STREAMS=lazy,eager NCCL_LAUNCH_ORDER_IMPLICIT=1 TMPDIR=$WORK/tmp "${mpi[@]}" -np 3 build/emu/test_emu_nccl \
  two_streams | tee "$WORK/two_streams.txt"
grep -q "two streams in launch order on 3 ranks" "$WORK/two_streams.txt" || fail "two_streams in launch order"
left=$(find "$WORK/tmp" -name "mt-emu-nccl-*")
[[ -z $left ]] || fail "the emulator's NCCL left files behind: $left"

demo_data "$WORK/english"
export EMU_GPUS=2 # one emulated GPU a rank: NCCL, not the host path of a shared GPU
emu_run gpu 1 llama
emu_run tp2sp 2 llama --set parallel.tp=2 --set parallel.sequence_parallel=true
emu_tracks tp2sp gpu "tensor parallel: 2 GPUs with sequence parallel, activations summed with NCCL"
emu_run cp2 2 llama --set parallel.cp=2
emu_tracks cp2 gpu "keys and values all-gathered with NCCL"
emu_run dp2 2 llama --set train.micro_batch_size=4
emu_tracks dp2 gpu "gradients averaged with NCCL layer by layer"
# the distributed optimizer: 9 buckets of 16384 floats, each reduce-scattered and all-gathered in place
MEGATRAIN_DP_BUCKET_BYTES=65536 emu_run dp2-zero1 2 llama --set train.micro_batch_size=4 \
  --set parallel.distributed_optimizer=true
emu_tracks dp2-zero1 gpu "with the distributed optimizer: gradients reduce-scattered with NCCL in 9 buckets"
moe=(--set model.moe.load_balancing=global_aux_loss) # the balancing counts summed over the ranks: as one GPU
emu_run gpu-moe 1 mixtral "${moe[@]}"
emu_run ep2 2 mixtral "${moe[@]}" --set parallel.ep=2 --set train.micro_batch_size=4 --set train.replica_check_interval=1
emu_tracks ep2 gpu-moe "tokens dispatched with NCCL all-to-all"
# the distributed optimizer on a MoE model at ep 1: the routed experts sit after every layer, in the last buckets;
# a MoE layer's forward must wait for their all-gather too. With the streams lazy (the comm stream's gathers run only
# when the host waits), a layer that waited for its own last float's bucket alone read the last step's experts
# (5.6e-3 off by step 3; found by a review, 2026-11-29)
EMU_STREAMS=lazy MEGATRAIN_DP_BUCKET_BYTES=65536 emu_run dp2-moe-zero1 2 mixtral "${moe[@]}" \
  --set train.micro_batch_size=4 --set parallel.distributed_optimizer=true
emu_tracks dp2-moe-zero1 gpu-moe "with the distributed optimizer: gradients reduce-scattered with NCCL"
# the pipeline's transfers GPU to GPU: the interleaved schedule's groups send and receive a gradient at once (into
# and out of the shared gradient buffer: the send's copy set aside, or the overlap check above stops it)
emu_run gpu4 1 llama --set model.num_layers=4
emu_run pp2vpp2 2 llama --set model.num_layers=4 --set parallel.pp=2 --set parallel.vpp=2 --set train.micro_batch_size=2 \
  --set train.eval_interval=5 --set train.eval_batches=4
emu_tracks pp2vpp2 gpu4 "activations sent with NCCL, GPU to GPU"
# ... and its evaluations, whose forward-only groups send a chunk's output and receive the next chunk's input of the
# same micro-batch, one buffer (the send set aside first, or the overlap check stops it): the eval losses those of
# the host path's (ranks sharing one emulated GPU)
EMU_GPUS=1 emu_run pp2vpp2-host 2 llama --set model.num_layers=4 --set parallel.pp=2 --set parallel.vpp=2 \
  --set train.micro_batch_size=2 --set train.eval_interval=5 --set train.eval_batches=4
[[ $(json_field "$WORK/pp2vpp2/metrics.jsonl" eval_loss | wc -l) -eq 2 ]] || fail "pp2vpp2: not two evaluations"
[[ "$(json_field "$WORK/pp2vpp2/metrics.jsonl" eval_loss)" == "$(json_field "$WORK/pp2vpp2-host/metrics.jsonl" eval_loss)" ]] ||
  fail "pp2vpp2: the eval losses over NCCL differ from the host path's"

export EMU_GPUS=4 EMU_STREAMS=eager,lazy,lazy,eager # rank i takes entry i: tp pairs (0 1) (2 3), dp pairs (0 2) (1 3)
# the same timeout on both runs: what stops the first is a hang, not a slow rank (the second has none)
export EMU_NCCL_TIMEOUT=20
if NCCL_LAUNCH_ORDER_IMPLICIT=0 emu_try tp2dp2-unordered 4 llama --set parallel.tp=2 \
     --set train.micro_batch_size=4; then
  fail "tp2dp2 with the ranks' streams in different orders did not hang without NCCL_LAUNCH_ORDER_IMPLICIT"
fi
grep -q "has not moved for 20 s" "$WORK/tp2dp2-unordered.txt" || fail "tp2dp2-unordered: no hang message"
grep -q "warning: NCCL_LAUNCH_ORDER_IMPLICIT is 0, not 1" "$WORK/tp2dp2-unordered.txt" || fail "no warning of the order"
echo "tp2dp2, ranks' stream orders differing, NCCL_LAUNCH_ORDER_IMPLICIT=0: hangs, as it may on GPUs"
emu_run tp2dp2-mixed 4 llama --set parallel.tp=2 --set train.micro_batch_size=4
emu_tracks tp2dp2-mixed gpu "operations in launch order (NCCL_LAUNCH_ORDER_IMPLICIT=1)"
emu_run ep2dp4-mixed 4 mixtral "${moe[@]}" --set parallel.ep=2 --set train.micro_batch_size=2
emu_tracks ep2dp4-mixed gpu-moe "tokens dispatched with NCCL all-to-all"

# the distributed optimizer's all-gathers stay in flight past the step's end, while the host runs its MPI
# collectives: a lazy rank (its streams run only when the host waits) would hold them back there while an eager one
# (each call runs, and blocks its host, when enqueued) waits in them, a hang GPUs cannot have (their streams go on
# without the host); lazy-first keeps the comm stream eager and the compute stream lazy on ranks 1 and 2, so their
# tp and dp calls still meet the others' in another order
EMU_STREAMS=eager,lazy-first,lazy-first,eager MEGATRAIN_DP_BUCKET_BYTES=65536 emu_run tp2dp2-zero1-mixed 4 llama \
  --set parallel.tp=2 --set train.micro_batch_size=4 --set parallel.distributed_optimizer=true
emu_tracks tp2dp2-zero1-mixed gpu "with the distributed optimizer: gradients reduce-scattered with NCCL"
echo ok
