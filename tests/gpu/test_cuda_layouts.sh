#!/usr/bin/env bash
# test_cuda_layouts.sh: tensor parallel (with and without sequence parallel),
# context parallel and pipeline parallel on GPUs track one GPU and the CPU
# under mpirun. With fewer GPUs than ranks the device
# collectives are staged through the host over MPI (MEGATRAIN_DEVICE_COMM=host,
# src/dist/device_comm.h), so a machine with one GPU runs every layout here;
# with two GPUs or more, tp 2, cp 2, pp 2 and the MoE ep 2 (all-to-all)
# also run over NCCL.
# For each layout, against the same recipe on one GPU and on the CPU (same
# data, seed, weights at step 0; the GPU computes in bf16 and its atomics
# make two GPU runs differ in the last bits):
#   - the first loss within 1% of the CPU's and the first grad norm within 2%
#     (a gradient summed twice or missed over tp shows at once);
#   - the first 10 steps within 2e-3 of the one-GPU run (measured on an H100,
#     2026-11-24: 1e-4 at most over every layout here);
#   - over 60 steps, mean |difference| to the CPU curve below 0.05 and the
#     last loss within 0.1.
# Then a tp 2 GPU checkpoint resumes on one GPU, one made on one GPU resumes
# at tp 2 and at pp 2 (tied embeddings), and a pp 2 one at tp 2. Skips
# without mpirun or a GPU.
set -euo pipefail
source "$(dirname "$0")/../integration/lib.sh"
MEGATRAIN=${MEGATRAIN:-build/cuda/megatrain}
command -v mpirun > /dev/null || { echo "skip: no mpirun on this machine"; exit 77; }
gpus=${MT_GPU_COUNT:-$(nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true)}  # MT_GPU_COUNT: the emulator's one
[[ $gpus -ge 1 ]] || { echo "skip: no GPU"; exit 77; }
demo_data "$WORK/english"
common=(--set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.steps=60
        --set train.eval_interval=30 --set precision=bf16)
launch() { # launch NP DIR RECIPE [--set ...]: a GPU run on NP ranks
  local np=$1 dir=$2 recipe=$3; shift 3
  local cmd=("$MEGATRAIN" run "$REPO/recipes/tiny/$recipe.yaml" --set run.dir="$WORK/$dir" --set run.device=cuda
             "${common[@]}" "$@")
  if [[ $np -eq 1 ]]; then "${cmd[@]}" > "$WORK/$dir.txt" 2>&1
  else mpirun --allow-run-as-root --oversubscribe -np "$np" "${cmd[@]}" > "$WORK/$dir.txt" 2>&1; fi ||
    { tail -20 "$WORK/$dir.txt"; fail "$dir: the run failed"; }
}
# track DIR REF_GPU REF_CPU: the checks above
track() {
  paste -d' ' <(json_field "$WORK/$3/metrics.jsonl" loss) <(json_field "$WORK/$2/metrics.jsonl" loss) \
    <(json_field "$WORK/$1/metrics.jsonl" loss) <(json_field "$WORK/$3/metrics.jsonl" grad_norm) \
    <(json_field "$WORK/$1/metrics.jsonl" grad_norm) > "$WORK/$1.pairs"
  awk -v name="$1" '
    function abs(x) { return x < 0 ? -x : x }
    NR == 1 { first = abs($3 - $1) / $1; gn = abs($5 - $4) / $4 }
    NR <= 10 { d = abs($3 - $2); if (d > early) early = d }
    { sum += abs($3 - $1); n++; cpu = $1; got = $3 }
    END {
      printf "%s: first loss %.2e, first grad norm %.2e, first 10 steps vs one GPU %.2e, mean |diff| to cpu %.4f, final %.4f vs %.4f\n",
        name, first, gn, early, sum / n, got, cpu
      exit !(n == 60 && first < 0.01 && gn < 0.02 && early < 2e-3 && sum / n < 0.05 && abs(got - cpu) < 0.1)
    }' "$WORK/$1.pairs" || fail "$1 does not track the one-GPU and CPU runs"
}

for recipe in llama qwen2 qwen3; do
  "$MEGATRAIN" run "$REPO/recipes/tiny/$recipe.yaml" --set run.dir="$WORK/cpu-$recipe" "${common[@]}" \
    --set precision=fp32 > "$WORK/cpu-$recipe.txt"
  launch 1 "gpu-$recipe" "$recipe"
  export MEGATRAIN_DEVICE_COMM=host
  launch 2 "tp2-$recipe" "$recipe" --set parallel.tp=2
  grep -q "tensor parallel: 2 GPUs, activations summed with MPI" "$WORK/tp2-$recipe.txt" ||
    fail "tp2-$recipe: no tensor-parallel line in the log"
  track "tp2-$recipe" "gpu-$recipe" "cpu-$recipe"
  launch 2 "tp2sp-$recipe" "$recipe" --set parallel.tp=2 --set parallel.sequence_parallel=true
  track "tp2sp-$recipe" "gpu-$recipe" "cpu-$recipe"
  unset MEGATRAIN_DEVICE_COMM
done

# tp 2 x dp 2 (four ranks): gradients averaged over dp next to the tp sums.
MEGATRAIN_DEVICE_COMM=host launch 4 tp2dp2-llama llama --set parallel.tp=2 --set parallel.sequence_parallel=true \
  --set train.micro_batch_size=4 # the same 8 sequences a step: 4 on each dp rank
grep -q "data parallel: 2 GPU(s)" "$WORK/tp2dp2-llama.txt" || fail "tp2dp2: no data-parallel line in the log"
track tp2dp2-llama gpu-llama cpu-llama

# Context parallel, alone and with tensor parallel.
MEGATRAIN_DEVICE_COMM=host launch 2 cp2-llama llama --set parallel.cp=2
grep -q "context parallel: 2 GPUs" "$WORK/cp2-llama.txt" || fail "cp2: no context-parallel line in the log"
track cp2-llama gpu-llama cpu-llama
MEGATRAIN_DEVICE_COMM=host launch 4 tp2cp2-qwen3 qwen3 --set parallel.tp=2 --set parallel.cp=2 \
  --set parallel.sequence_parallel=true
track tp2cp2-qwen3 gpu-qwen3 cpu-qwen3
MEGATRAIN_DEVICE_COMM=host launch 4 cp2dp2-llama llama --set parallel.cp=2 --set train.micro_batch_size=4
track cp2dp2-llama gpu-llama cpu-llama

# Pipeline parallel (transfers through the host): 1F1B alone, with dp, tp 2 x pp 2 with tied embeddings, and
# the interleaved schedule.
# (MEGATRAIN_DEVICE_COMM=host: on a machine with 2 GPUs or more these would otherwise send GPU to GPU, which the
# NCCL runs below check)
MEGATRAIN_DEVICE_COMM=host launch 2 pp2-llama llama --set parallel.pp=2
grep -q "pipeline parallel: 2 stages on cuda" "$WORK/pp2-llama.txt" || fail "pp2: no pipeline line in the log"
track pp2-llama gpu-llama cpu-llama
MEGATRAIN_DEVICE_COMM=host launch 4 pp2dp2-llama llama --set parallel.pp=2 --set train.micro_batch_size=2
track pp2dp2-llama gpu-llama cpu-llama
# Tied, four layers (two a stage) at lr 1e-3: at the recipe's 3e-3 this model's loss spikes near step 32 (grad norm
# 7 to 14 before clipping), which blows up rounding noise: two one-GPU runs then differ by 0.07 on average and 1F1B,
# vpp and one GPU by as much, although they agree to 1e-4 before it (H100, 2026-11-24). At 1e-3 they agree to 1e-3.
tied=(--set model.tie_word_embeddings=true --set model.num_layers=4 --set optimizer.lr=1.0e-3)
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/cpu-tied" "${common[@]}" --set precision=fp32 \
  "${tied[@]}" > "$WORK/cpu-tied.txt"
launch 1 gpu-tied llama "${tied[@]}"
MEGATRAIN_DEVICE_COMM=host launch 4 tp2pp2-tied llama "${tied[@]}" --set parallel.tp=2 --set parallel.pp=2 \
  --set parallel.sequence_parallel=true --set train.micro_batch_size=4 # two micro-batches in flight
track tp2pp2-tied gpu-tied cpu-tied
MEGATRAIN_DEVICE_COMM=host launch 2 pp2vpp2-tied llama "${tied[@]}" --set parallel.pp=2 --set parallel.vpp=2 \
  --set train.micro_batch_size=4
track pp2vpp2-tied gpu-tied cpu-tied # the interleaved schedule: a layer a chunk, two chunks a stage

if [[ $gpus -ge 2 ]]; then
  launch 2 tp2sp-nccl llama --set parallel.tp=2 --set parallel.sequence_parallel=true
  grep -q "activations summed with NCCL" "$WORK/tp2sp-nccl.txt" || fail "tp2sp-nccl: NCCL was not used"
  track tp2sp-nccl gpu-llama cpu-llama
  launch 2 cp2-nccl llama --set parallel.cp=2
  grep -q "keys and values all-gathered with NCCL" "$WORK/cp2-nccl.txt" || fail "cp2-nccl: NCCL was not used"
  track cp2-nccl gpu-llama cpu-llama
  launch 2 pp2-gpus llama --set parallel.pp=2 --set train.micro_batch_size=4 # 2 micro-batches in flight
  grep -q "activations sent with NCCL, GPU to GPU" "$WORK/pp2-gpus.txt" || fail "pp2-gpus: not sent GPU to GPU"
  track pp2-gpus gpu-llama cpu-llama
  launch 2 pp2vpp2-gpus llama "${tied[@]}" --set parallel.pp=2 --set parallel.vpp=2 --set train.micro_batch_size=4
  track pp2vpp2-gpus gpu-tied cpu-tied # the interleaved groups: a gradient sent and one received at once
  # MoE expert parallel over NCCL (grouped send/receive): tracks the one-GPU run over its first 10 steps
  launch 1 gpu-mixtral mixtral
  launch 2 ep2-nccl mixtral --set parallel.ep=2 --set train.micro_batch_size=4
  grep -q "tokens dispatched with NCCL all-to-all" "$WORK/ep2-nccl.txt" || fail "ep2-nccl: NCCL was not used"
  paste -d' ' <(json_field "$WORK/gpu-mixtral/metrics.jsonl" loss) <(json_field "$WORK/ep2-nccl/metrics.jsonl" loss) |
    awk 'NR <= 10 { d = $2 - $1; if (d < 0) d = -d; if (d > worst) worst = d } { n++ }
         END { printf "ep2-nccl: first 10 steps vs one GPU %.2e over %d steps\n", worst, n; exit !(n == 60 && worst < 2e-3) }' ||
    fail "ep2-nccl does not track the one-GPU run"
else
  echo "one GPU: the NCCL transport of tensor and context parallel is not run here"
fi

# A failure every rank agrees on (more non-finite steps than train.max_nonfinite_steps: a NaN planted in step 5's
# gradients, every rank seeing the grad norm) ends every rank with exit 1 at step 5, each tearing its device down
# (its NCCL communicators with two GPUs or more), nothing aborted.
nan_stop() { # nan_stop NAME [env ...]: tp 2 stopped at step 5
  local name=$1
  shift
  (export "$@" MEGATRAIN_TEST_NAN_STEP=5
   stop_together "$name" 2 "$WORK/$name.txt" "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/$name" \
     --set run.device=cuda "${common[@]}" --set train.steps=10 --set optimizer.schedule.warmup_steps=2 \
     --set parallel.tp=2) || fail "$name: not stopped together"
  grep -q "step 5: .*stopping after 1 non-finite step" "$WORK/$name.txt" || fail "$name: no stop message at step 5"
  echo "$name: every rank stopped at step 5 with exit 1"
}
nan_stop nan-tp2-host MEGATRAIN_DEVICE_COMM=host
[[ $gpus -lt 2 ]] || nan_stop nan-tp2-nccl

# Checkpoints move between layouts: tp 2 -> one GPU, one GPU -> tp 2.
"$MEGATRAIN" resume "$WORK/tp2sp-llama" --set train.steps=70 --set parallel.tp=1 \
  --set parallel.sequence_parallel=false > "$WORK/resume1.txt" 2>&1 ||
  { tail "$WORK/resume1.txt"; fail "the tp 2 checkpoint did not resume on one GPU"; }
grep -q "^step *70/70" "$WORK/resume1.txt" || fail "the tp 2 checkpoint's resume on one GPU did not reach step 70"
MEGATRAIN_DEVICE_COMM=host mpirun --allow-run-as-root --oversubscribe -np 2 "$MEGATRAIN" resume "$WORK/gpu-llama" \
  --set train.steps=70 --set parallel.tp=2 > "$WORK/resume2.txt" 2>&1 ||
  { tail "$WORK/resume2.txt"; fail "the one-GPU checkpoint did not resume at tp 2"; }
grep -q "^step *70/70" "$WORK/resume2.txt" || fail "the one-GPU checkpoint's resume at tp 2 did not reach step 70"
MEGATRAIN_DEVICE_COMM=host mpirun --allow-run-as-root --oversubscribe -np 2 "$MEGATRAIN" resume "$WORK/pp2-llama" \
  --set train.steps=70 --set parallel.pp=1 --set parallel.tp=2 > "$WORK/resume3.txt" 2>&1 ||
  { tail "$WORK/resume3.txt"; fail "the pp 2 checkpoint did not resume at tp 2"; }
grep -q "^step *70/70" "$WORK/resume3.txt" || fail "the pp 2 checkpoint's resume at tp 2 did not reach step 70"
mpirun --allow-run-as-root --oversubscribe -np 2 "$MEGATRAIN" resume "$WORK/gpu-tied" --set train.steps=70 \
  --set parallel.pp=2 > "$WORK/resume4.txt" 2>&1 || { tail "$WORK/resume4.txt"; fail "a one-GPU checkpoint did not resume at pp 2"; }
grep -q "^step *70/70" "$WORK/resume4.txt" || fail "the one-GPU checkpoint's resume at pp 2 did not reach step 70"
echo "ok"
