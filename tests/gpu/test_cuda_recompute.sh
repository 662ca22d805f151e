#!/usr/bin/env bash
# test_cuda_recompute.sh: activation recomputation on GPUs (train.recompute:
# selective | full; cuda_model_pass.c's layer_backward; the gradients of one
# micro-batch against the plain backward are test_cuda_model's part). The tiny
# recipes on the GPU, S steps (30; 5 with MT_GPU_TEST_QUICK=1, as the CPU
# emulator runs it in CI), each against the same recipe without recompute:
#   - one GPU, llama (selective, full) and qwen3 (qk-norm; full; not in the
#     short form): the first
#     loss the same bits (the forward is the same code; a layout's: within the
#     2e-3 below) and the first 10 steps
#     within 2e-3 of the run without recompute (two GPU runs differ by their
#     atomics only: test_cuda_layouts.sh measured 1e-4 at most between
#     layouts), the whole curve within 0.02;
#   - the layouts whose collectives a recompute runs again, ranks sharing the
#     GPU (collectives staged through the host): tp 2 with sequence parallel
#     (full: the all-gathers and reduce-scatters of the layer again), cp 2
#     (selective: the attention core from the kept keys and values of the
#     whole sequence; full: their all-gathers again), pp 2 x vpp 2 (full: the
#     working set shared by the micro-batches in flight), the same checks
#     against the one-GPU run without recompute;
#   - a MoE recipe (mixtral) takes selective and full and tracks its plain run
#     the same way; full reruns each MoE layer's routing in the backward,
#     which must record its statistics once: the first step's aux loss,
#     imbalance and drop rate are the plain run's digits (with expert_bias,
#     capacity dropping and z-loss on the qwen3_moe recipe too, not in the
#     short form); and at ep 2 (the all-to-alls again) and pp 2 (4 layers,
#     micro-batches in flight; neither in the short form) it tracks one GPU.
# Skips the layouts without mpirun.
set -euo pipefail
source "$(dirname "$0")/../integration/lib.sh"
MEGATRAIN=${MEGATRAIN:-build/cuda/megatrain}
S=30
[[ ${MT_GPU_TEST_QUICK:-0} == 1 ]] && S=5
demo_data "$WORK/english"
common=(--set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.steps=$S
        --set train.eval_interval=1000 --set optimizer.schedule.warmup_steps=2 --set run.device=cuda
        --set precision=bf16)
launch() { # launch NP DIR RECIPE [--set ...]: a GPU run on NP ranks
  local np=$1 dir=$2 recipe=$3; shift 3
  local cmd=("$MEGATRAIN" run "$REPO/recipes/tiny/$recipe.yaml" --set run.dir="$WORK/$dir" "${common[@]}" "$@")
  if [[ $np -eq 1 ]]; then "${cmd[@]}" > "$WORK/$dir.txt" 2>&1
  else MEGATRAIN_DEVICE_COMM=host mpirun --allow-run-as-root --oversubscribe -np "$np" "${cmd[@]}" > "$WORK/$dir.txt" 2>&1
  fi || { tail -20 "$WORK/$dir.txt"; fail "$dir: the run failed"; }
}
# tracks DIR REF [layout]: DIR's losses against REF's (the checks above; a layout's first loss is not the same bits)
tracks() {
  paste -d' ' <(json_field "$WORK/$2/metrics.jsonl" loss) <(json_field "$WORK/$1/metrics.jsonl" loss) |
    awk -v name="$1" -v steps=$S -v exact=$([[ ${3:-} == layout ]] && echo 0 || echo 1) 'function abs(x) { return x < 0 ? -x : x }
      NR == 1 { first = abs($2 - $1) }
      NR <= 10 { if (abs($2 - $1) > early) early = abs($2 - $1) }
      { if (abs($2 - $1) > worst) worst = abs($2 - $1); n++ }
      END { printf "%s: first loss %.2e, first 10 steps %.2e, worst %.2e over %d steps\n", name, first, early, worst, n
            exit !(n == steps && (first == 0 || !exact) && early < 2e-3 && worst < 0.02) }' ||
    fail "$1 does not track $2"
}

launch 1 llama llama
launch 1 llama-selective llama --set train.recompute=selective
launch 1 llama-full llama --set train.recompute=full
tracks llama-selective llama
tracks llama-full llama
if [[ ${MT_GPU_TEST_QUICK:-0} != 1 ]]; then  # the qk-norm recipe: on a GPU (the short form leaves it out)
  launch 1 qwen3 qwen3
  launch 1 qwen3-full qwen3 --set train.recompute=full
  tracks qwen3-full qwen3
fi

# same_stats DIR REF: the first step's MoE statistics of DIR are REF's, digit for digit (recorded once a forward)
same_stats() {
  local field
  for field in moe_aux_loss moe_imbalance moe_drop_rate; do
    [[ "$(json_field "$WORK/$1/metrics.jsonl" $field | head -1)" == "$(json_field "$WORK/$2/metrics.jsonl" $field | head -1)" ]] ||
      fail "$1: the first step's $field differs from $2's (a recomputed routing recorded twice?)"
  done
  echo "$1: the first step's aux loss, imbalance and drop rate are $2's"
}
launch 1 mixtral mixtral
launch 1 mixtral-selective mixtral --set train.recompute=selective
tracks mixtral-selective mixtral
launch 1 mixtral-full mixtral --set train.recompute=full
tracks mixtral-full mixtral
same_stats mixtral-full mixtral
if [[ ${MT_GPU_TEST_QUICK:-0} != 1 ]]; then  # expert_bias, capacity dropping and z-loss (the short form leaves it out)
  MOE=(--set model.moe.load_balancing=expert_bias --set model.moe.bias_update_rate=0.01
       --set model.moe.score_function=sigmoid --set model.moe.capacity_factor=1.0 --set model.moe.z_loss_coeff=0.01)
  launch 1 qwen3moe qwen3_moe "${MOE[@]}"
  launch 1 qwen3moe-full qwen3_moe "${MOE[@]}" --set train.recompute=full
  tracks qwen3moe-full qwen3moe
  same_stats qwen3moe-full qwen3moe
fi

command -v mpirun > /dev/null || { echo "no mpirun: the layouts are skipped"; echo ok; exit 0; }
launch 2 tp2sp-full llama --set parallel.tp=2 --set parallel.sequence_parallel=true --set train.recompute=full
tracks tp2sp-full llama layout
launch 2 cp2-selective llama --set parallel.cp=2 --set train.recompute=selective
tracks cp2-selective llama layout
launch 2 cp2-full llama --set parallel.cp=2 --set train.recompute=full
tracks cp2-full llama layout
# 4 micro-batches of 2 a step: several in flight on each stage, recomputing into the one working set
launch 1 llama4 llama --set model.num_layers=4 --set train.micro_batch_size=2
launch 2 pp2vpp2-full llama --set parallel.pp=2 --set parallel.vpp=2 --set model.num_layers=4 \
  --set train.micro_batch_size=2 --set train.recompute=full
tracks pp2vpp2-full llama4 layout
if [[ ${MT_GPU_TEST_QUICK:-0} != 1 ]]; then  # expert parallel: the recomputed layer's all-to-alls on both ranks
  launch 2 ep2-full mixtral --set parallel.ep=2 --set train.micro_batch_size=4 --set train.recompute=full
  tracks ep2-full mixtral layout
  # pipeline parallel: several micro-batches in flight, each MoE layer's host record per activation set, its
  # device buffers in the one working set
  launch 1 mixtral4 mixtral --set model.num_layers=4 --set train.micro_batch_size=2
  launch 2 pp2-moe-full mixtral --set parallel.pp=2 --set model.num_layers=4 --set train.micro_batch_size=2 \
    --set train.recompute=full
  tracks pp2-moe-full mixtral4 layout
fi
echo ok
