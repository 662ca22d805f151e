#!/usr/bin/env bash
# test_cuda_zero1.sh: the distributed optimizer on GPUs (parallel.
# distributed_optimizer; src/model/cuda/cuda_model_zero1.c; the sharded AdamW
# chunks against the formula are test_cuda_ops' part). Ranks share the GPU
# (collectives staged through the host); S steps (30; 6 with
# MT_GPU_TEST_QUICK=1, as the CPU emulator runs it in CI). Each layout with
# ZeRO-1 against the same recipe on one GPU (the same 8 sequences a step):
# the log says the distributed optimizer runs and in how many buckets, the
# first loss within 2e-4 (the forward's; test_cuda_recompute.sh measured
# 1.9e-5 at most between layouts), the first 10 steps within
# 2e-3 (two GPU runs differ by their atomics: test_cuda_layouts.sh measured
# 1e-4 at most between layouts) and the grad norms within 0.5% (a gradient
# summed where it should be averaged, or a part left out, shows there first):
#   - dp 2, one bucket (the in-place collectives), and dp 2 with buckets of
#     16385 floats (MEGATRAIN_DP_BUCKET_BYTES: many buckets, so that the
#     backward reduce-scatters them layer by layer, each one ragged, through
#     the padded scratch), and with bf16 states (against one GPU's);
#   - tp 2 x dp 2 with sequence parallel (the norm of each rank's parts of the
#     weights it counts, summed over dp and tp);
#   - pp 2 x dp 2 with tied embeddings (the embedding's buckets held until its
#     gradient is summed over the two stages);
#   - Mixtral, ep 2 over dp 4 (the experts' region sharded over edp 2),
#     ep 2 x dp 2 (an edp group of one) and dp 2 at ep 1 (the experts at the
#     end of the one region: with the ranks sharing a GPU the gathers are
#     staged and done at once, so the wait for them is test_gpu_emu_nccl.sh's,
#     lazy streams, and a 2-GPU machine's).
# Then the checkpoints: a dp 2 ZeRO-1 checkpoint resumes on the GPU at dp 2
# (within 2e-3 of the uninterrupted run) and on the CPU at dp 1 (within 5e-3
# of that GPU resume: the CPU computes in fp32; measured on an H200 5e-4 over
# 15 steps, on the emulator 7e-4), and a one-GPU checkpoint resumes at dp 2 with
# ZeRO-1 (the whole moments sharded on load) within 2e-3 of its one-GPU resume.
# The short form (CI, on the emulator) leaves out the one-bucket run, bf16
# states, tp 2 x dp 2, ep 2 x dp 2, dp 2 at ep 1 and the one-GPU checkpoint's
# resume. Skips
# without mpirun.
set -euo pipefail
source "$(dirname "$0")/../integration/lib.sh"
MEGATRAIN=${MEGATRAIN:-build/cuda/megatrain}
command -v mpirun > /dev/null || { echo "skip: no mpirun on this machine"; exit 77; }
S=30
[[ ${MT_GPU_TEST_QUICK:-0} == 1 ]] && S=6
H=$((S / 2)) # the checkpoint the resumes start from
demo_data "$WORK/english"
common=(--set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.steps=$S
        --set train.eval_interval=1000 --set optimizer.schedule.warmup_steps=2 --set run.device=cuda
        --set precision=bf16 --set checkpoint.interval=$H)
Z=(--set parallel.distributed_optimizer=true)
SMALL=65540 # bytes: buckets of 16385 floats, an odd count: every bucket ragged over 2 or 4 ranks
launch() { # launch NP DIR RECIPE [--set ...]: a GPU run on NP ranks sharing the GPU
  local np=$1 dir=$2 recipe=$3; shift 3
  local cmd=("$MEGATRAIN" run "$REPO/recipes/tiny/$recipe.yaml" --set run.dir="$WORK/$dir" "${common[@]}" "$@")
  if [[ $np -eq 1 ]]; then "${cmd[@]}" > "$WORK/$dir.txt" 2>&1
  else MEGATRAIN_DEVICE_COMM=host mpirun --allow-run-as-root --oversubscribe -np "$np" "${cmd[@]}" > "$WORK/$dir.txt" 2>&1
  fi || { tail -20 "$WORK/$dir.txt"; fail "$dir: the run failed"; }
}
# from DIR STEP: "loss grad_norm" of DIR's steps from STEP on
from() { paste -d' ' <(json_field "$WORK/$1/metrics.jsonl" step) <(json_field "$WORK/$1/metrics.jsonl" loss) \
           <(json_field "$WORK/$1/metrics.jsonl" grad_norm) | awk -v from="$2" '$1 >= from { print $2, $3 }'; }
# tracks DIR REF [STEP [moe]]: DIR's losses and grad norms against REF's (the checks above), from step STEP (1) to
# S; moe: the first 10 steps only (once two MoE runs part, a token's routing may flip: test_cuda_moe.sh's rule)
tracks() {
  paste -d' ' <(from "$2" "${3:-1}") <(from "$1" "${3:-1}") |
    awk -v name="$1" -v steps=$((S - ${3:-1} + 1)) -v moe="${4:-}" 'function abs(x) { return x < 0 ? -x : x }
      NR == 1 { first = abs($3 - $1) }
      NR <= 10 { if (abs($3 - $1) > early) early = abs($3 - $1); if (abs($4 - $2) / $2 > gn) gn = abs($4 - $2) / $2 }
      { if (abs($4 - $2) / $2 > gnw) gnw = abs($4 - $2) / $2; if (abs($3 - $1) > worst) worst = abs($3 - $1); n++ }
      END { printf "%s: first loss %.2e, first 10 steps %.2e (grad norms %.2e), worst %.2e (%.2e) over %d steps\n",
                   name, first, early, gn, worst, gnw, n
            exit !(n == steps && NF == 4 && first < 2e-4 && early < 2e-3 && gn < 5e-3 &&
                   (moe != "" || (worst < 0.02 && gnw < 0.05))) }' ||
    fail "$1 does not track $2"
}
# zero1_log DIR BUCKETS: the log says the distributed optimizer runs, over more than (or exactly, =N) BUCKETS buckets
zero1_log() {
  local n
  n=$(grep -o "with the distributed optimizer: gradients reduce-scattered with MPI in [0-9]* buckets" "$WORK/$1.txt" |
      head -1 | grep -o "[0-9]* buckets" | cut -d' ' -f1)
  [[ -n $n ]] || fail "$1: no distributed-optimizer line in the log"
  if [[ $2 == =* ]]; then [[ $n -eq ${2#=} ]] || fail "$1: $n buckets, expected ${2#=}"
  else [[ $n -gt $2 ]] || fail "$1: $n buckets, expected more than $2"; fi
}

QUICK=${MT_GPU_TEST_QUICK:-0}
launch 1 llama llama
if [[ $QUICK != 1 ]]; then  # one bucket, reduced and gathered in place (the short form: test_gpu_emu_nccl.sh's)
  launch 2 dp2 llama "${Z[@]}" --set train.micro_batch_size=4
  zero1_log dp2 =1
  tracks dp2 llama
fi
MEGATRAIN_DP_BUCKET_BYTES=$SMALL launch 2 dp2-small llama "${Z[@]}" --set train.micro_batch_size=4
zero1_log dp2-small 4
tracks dp2-small llama
if [[ $QUICK != 1 ]]; then  # on a GPU (the short form leaves them out)
  launch 1 llama-bf16 llama --set optimizer.state_dtype=bf16
  MEGATRAIN_DP_BUCKET_BYTES=$SMALL launch 2 dp2-bf16 llama "${Z[@]}" --set train.micro_batch_size=4 \
    --set optimizer.state_dtype=bf16
  tracks dp2-bf16 llama-bf16
  MEGATRAIN_DP_BUCKET_BYTES=$SMALL launch 2 ep2dp2 mixtral "${Z[@]}" --set parallel.ep=2 --set train.micro_batch_size=4
  # ep 1: the routed experts in the one region's last buckets, gathered first, each MoE layer waiting for them
  MEGATRAIN_DP_BUCKET_BYTES=$SMALL launch 2 dp2-moe mixtral "${Z[@]}" --set train.micro_batch_size=4
fi
if [[ $QUICK != 1 ]]; then  # the short form: test_gpu_emu_nccl.sh runs tp 2 x dp 2 with ZeRO-1 over NCCL
  MEGATRAIN_DP_BUCKET_BYTES=$SMALL launch 4 tp2dp2 llama "${Z[@]}" --set parallel.tp=2 \
    --set parallel.sequence_parallel=true --set train.micro_batch_size=4
  zero1_log tp2dp2 2
  tracks tp2dp2 llama
fi

tied=(--set model.tie_word_embeddings=true --set model.num_layers=4 --set optimizer.lr=1.0e-3)
launch 1 tied llama "${tied[@]}"
MEGATRAIN_DP_BUCKET_BYTES=$SMALL launch 4 pp2dp2-tied llama "${tied[@]}" "${Z[@]}" --set parallel.pp=2 \
  --set train.micro_batch_size=2
zero1_log pp2dp2-tied 2
tracks pp2dp2-tied tied

launch 1 mixtral mixtral
MEGATRAIN_DP_BUCKET_BYTES=$SMALL launch 4 ep2dp4 mixtral "${Z[@]}" --set parallel.ep=2 --set train.micro_batch_size=2
zero1_log ep2dp4 4
tracks ep2dp4 mixtral 1 moe
[[ -d $WORK/ep2dp2 ]] && tracks ep2dp2 mixtral 1 moe
[[ -d $WORK/dp2-moe ]] && tracks dp2-moe mixtral 1 moe

# Checkpoints: dp 2 ZeRO-1 -> dp 2 ZeRO-1 on the GPU, and -> one rank on the CPU; one GPU -> dp 2 ZeRO-1.
resume_from() { # resume_from NAME CHECKPOINT NP [--set ...]: steps H+1..S from CHECKPOINT (step H) into NAME
  local name=$1 from=$2 np=$3; shift 3
  local cmd=("$MEGATRAIN" resume "$WORK/$from/checkpoints/iter_$(printf %07d $H)" --set run.dir="$WORK/$name" "$@")
  if [[ $np -eq 1 ]]; then "${cmd[@]}" > "$WORK/$name.txt" 2>&1
  else MEGATRAIN_DEVICE_COMM=host mpirun --allow-run-as-root --oversubscribe -np "$np" "${cmd[@]}" > "$WORK/$name.txt" 2>&1
  fi || { tail -20 "$WORK/$name.txt"; fail "$name: the resume failed"; }
  grep -q "^step *$S/$S" "$WORK/$name.txt" || fail "$name did not reach step $S"
}
resume_from dp2-gpu dp2-small 2 "${Z[@]}"
tracks dp2-gpu dp2-small $((H + 1))
resume_from dp2-cpu dp2-small 1 --set run.device=cpu --set precision=fp32 --set parallel.distributed_optimizer=false
paste -d' ' <(from dp2-gpu 1) <(from dp2-cpu 1) |
  awk '{ d = $3 - $1; if (d < 0) d = -d; if (d > worst) worst = d; n++ }
       END { printf "dp2-cpu: the ZeRO-1 checkpoint on the CPU, worst %.4f from its GPU resume over %d steps\n", worst, n
             exit !(n > 0 && worst < 5e-3) }' || fail "the GPU ZeRO-1 checkpoint resumed on the CPU left the tolerance"
if [[ $QUICK != 1 ]]; then
  resume_from llama-gpu llama 1
  resume_from llama-dp2 llama 2 "${Z[@]}" --set train.micro_batch_size=4
  zero1_log llama-dp2 =1
  tracks llama-dp2 llama-gpu $((H + 1))
fi
echo "ok"
