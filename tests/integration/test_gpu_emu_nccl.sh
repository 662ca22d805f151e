#!/usr/bin/env bash
# test_gpu_emu_nccl.sh: megatrain's NCCL transport (src/dist/comm_nccl.c, the
# layouts with one GPU a rank) on the CPU emulator (tests/gpu/emu/README.md),
# with as many emulated GPUs as ranks (EMU_GPUS), so that the collectives go
# through NCCL, not the host path a shared GPU takes:
#   - the emulator's NCCL on its own (test_emu_nccl under mpirun, 3 ranks):
#     every collective and the grouped all-to-all against known sums, and a
#     rank calling a different collective from the others is named and stops
#     the job;
#   - the tiny llama at tp 2 with sequence parallel, cp 2 and dp 2 (gradients
#     averaged layer by layer on the second stream), and the tiny mixtral at
#     ep 2 (the all-to-all of grouped sends and receives) on the emulated
#     GPUs: their logs say NCCL, and the first 10 losses and grad norms
#     follow the one-GPU run's (emu_tracks in lib.sh: 1e-3 and 0.5%; the grad
#     norm catches a gradient summed where it should be averaged, which
#     AdamW hides from the losses).
# A GPU run remains what counts (tests/gpu/PENDING.md's NCCL row).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO"
need_gpu_emu mpirun
mpi=(mpirun --allow-run-as-root --oversubscribe)

mkdir "$WORK/tmp" # the communicators' files: none may stay behind
TMPDIR=$WORK/tmp "${mpi[@]}" -x TMPDIR -np 3 build/emu/test_emu_nccl | tee "$WORK/unit.txt"
grep -q "all checks passed on 3 ranks" "$WORK/unit.txt" || fail "test_emu_nccl"
if TMPDIR=$WORK/tmp "${mpi[@]}" -x TMPDIR -np 3 build/emu/test_emu_nccl mismatch > "$WORK/mismatch.txt" 2>&1; then
  fail "ranks calling different collectives were not stopped"
fi
grep -q "calls ncclAllReduce #0 of 64 fp32 elements with rank 0, which called ncclAllGather #0" "$WORK/mismatch.txt" ||
  { tail "$WORK/mismatch.txt"; fail "no message naming the two calls"; }
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
moe=(--set model.moe.load_balancing=global_aux_loss) # the balancing counts summed over the ranks: as one GPU
emu_run gpu-moe 1 mixtral "${moe[@]}"
emu_run ep2 2 mixtral "${moe[@]}" --set parallel.ep=2 --set train.micro_batch_size=4 --set train.replica_check_interval=1
emu_tracks ep2 gpu-moe "tokens dispatched with NCCL all-to-all"
echo ok
