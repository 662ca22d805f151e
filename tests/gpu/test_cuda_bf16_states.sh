#!/usr/bin/env bash
# test_cuda_bf16_states.sh: AdamW moments in bf16 on the GPU
# (optimizer.state_dtype: bf16; kernels/adamw.cu against optimizer.c is
# test_cuda_ops' and test_cuda_model's part). The tiny llama recipe at lr 1e-3
# (min 1e-4), S steps (300; 8 with MT_GPU_TEST_QUICK=1, as the CPU emulator
# runs it in CI):
#   - the GPU run with bf16 states tracks the CPU run with bf16 states: the
#     first loss within 1%, the mean |difference| below 0.02, the final losses
#     within 0.05 (and below 2.5 after 300 steps); measured on an H200,
#     2026-11-28: 0.0042 and 0.0144;
#   - it is not the GPU's curve with fp32 states (the states really are bf16)
#     and stays within 0.02 of it at every step (measured: 0.0038);
#   - its checkpoint holds bf16 moments and fp32 weights (inspect);
#   - it resumes on the GPU (bf16 states), on the CPU (bf16 states) and on the
#     GPU with fp32 states (the moments widened; saved as fp32 again), 10 (4)
#     steps each, the three within 0.02 of each other at every step; and a
#     CPU checkpoint with bf16 states resumes on the GPU within 0.02 of its
#     CPU resume (measured: 0.0005 at most).
# Why lr 1e-3: at the recipe's 3e-3 this model's loss spikes, and bf16
# moments amplify any difference through them. Measured at 3e-3 over 300
# steps: the CPU's bf16 and fp32 states differ by 0.048 on average (0.139 at
# most, 0.084 between the last 20 steps' means), the same CPU run on two
# machines (OpenBLAS's kernels differ by CPU) ended 0.04 apart, and the H200's
# GPU run against the CPU's differed by 0.085 on average (2026-11-28); at
# 1e-3 the CPU's bf16 and fp32 states differ by 0.0003 on average, 0.0016 at
# most.
set -euo pipefail
source "$(dirname "$0")/../integration/lib.sh"
MEGATRAIN=${MEGATRAIN:-build/cuda/megatrain}
S=300
R=10 # steps a resume runs
[[ ${MT_GPU_TEST_QUICK:-0} == 1 ]] && S=8 R=4
demo_data "$WORK/english"
common=(--set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.steps=$S
        --set checkpoint.interval=$S --set train.eval_interval=1000 --set optimizer.schedule.warmup_steps=$((S < 40 ? 2 : 20))
        --set optimizer.lr=1e-3 --set optimizer.min_lr=1e-4)
GPU=(--set run.device=cuda --set precision=bf16)
BF16=(--set optimizer.state_dtype=bf16)
run() { local name=$1; shift; "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/$name" "${common[@]}" \
          "$@" > "$WORK/$name.txt" 2>&1 || { tail -20 "$WORK/$name.txt"; fail "$name failed"; }; }
resume() { local name=$1 from=$2; shift 2; "$MEGATRAIN" resume "$WORK/$from" --set run.dir="$WORK/$name" \
             --set train.steps=$((S + R)) "$@" > "$WORK/$name.txt" 2>&1 || { tail -20 "$WORK/$name.txt"; fail "$name failed"; }
           grep -q "^step *$((S + R))/$((S + R))" "$WORK/$name.txt" || fail "$name did not reach step $((S + R))"; }
# within A B TOL: at every step both have, |loss difference| <= TOL; prints the worst
within() {
  paste -d' ' <(json_field "$WORK/$1/metrics.jsonl" loss) <(json_field "$WORK/$2/metrics.jsonl" loss) |
    awk -v what="$1 vs $2" -v tol="$3" '{ d = $2 - $1; if (d < 0) d = -d; if (d > worst) worst = d; n++ }
      END { printf "%s: %d steps, worst |loss difference| %.4f\n", what, n, worst; exit !(n > 0 && worst <= tol) }'
}

run cpu16 "${BF16[@]}"
run gpu16 "${GPU[@]}" "${BF16[@]}"
run gpu32 "${GPU[@]}"
if [[ -n ${OUT:-} ]]; then  # on a device call: the three curves, a line a step, for the session's notes
  paste -d' ' <(json_field "$WORK/cpu16/metrics.jsonl" loss) <(json_field "$WORK/gpu16/metrics.jsonl" loss) \
    <(json_field "$WORK/gpu32/metrics.jsonl" loss) > "$OUT/bf16-states-curves.txt"
fi
paste -d' ' <(json_field "$WORK/cpu16/metrics.jsonl" loss) <(json_field "$WORK/gpu16/metrics.jsonl" loss) |
  awk -v steps=$S '
    NR == 1 { first = ($2 - $1) / $1; if (first < 0) first = -first }
    { d = $2 - $1; if (d < 0) d = -d; sum += d; n++; cpu = $1; gpu = $2 }
    END { last = gpu - cpu; if (last < 0) last = -last
          printf "bf16 states, gpu vs cpu: %d steps, first-loss difference %.2e, mean |difference| %.4f, final cpu %.4f gpu %.4f\n",
                 n, first, sum / n, cpu, gpu
          exit !(n == steps && first < 0.01 && sum / n < 0.02 && last < 0.05 && (steps < 300 || gpu < 2.5)) }' ||
  fail "the GPU run with bf16 states does not track the CPU run with bf16 states"
within gpu32 gpu16 0.02 || fail "bf16 states on the GPU left the tolerance of fp32 states"
! diff -q <(json_field "$WORK/gpu32/metrics.jsonl" loss) <(json_field "$WORK/gpu16/metrics.jsonl" loss) > /dev/null ||
  fail "the GPU's curves with bf16 and fp32 states are the same (were the states bf16?)"

"$MEGATRAIN" inspect "$WORK/gpu16" > "$WORK/inspect.txt" || fail "inspect of the GPU checkpoint failed"
grep -Eq '^optimizer\.m\.embed\.weight +\[256, 64\] +bf16 ' "$WORK/inspect.txt" || fail "the GPU checkpoint's moments are not bf16"
grep -Eq '^embed\.weight +\[256, 64\] +fp32 ' "$WORK/inspect.txt" || fail "the GPU checkpoint's weights are not fp32"
[[ $(grep -c '^optimizer\..* bf16 ' "$WORK/inspect.txt") -eq $(grep -c '^optimizer\.' "$WORK/inspect.txt") ]] ||
  fail "not every moment of the GPU checkpoint is bf16"

resume gpu16-gpu gpu16
resume gpu16-cpu gpu16 --set run.device=cpu --set precision=fp32
resume gpu16-gpu32 gpu16 --set optimizer.state_dtype=fp32
within gpu16-gpu gpu16-cpu 0.02 || fail "the GPU checkpoint resumed on the CPU left the GPU resume's tolerance"
within gpu16-gpu gpu16-gpu32 0.02 || fail "the GPU checkpoint resumed with fp32 states left the bf16 resume's tolerance"
grep -Eq '^optimizer\.m\.embed\.weight .* fp32 ' <("$MEGATRAIN" inspect "$WORK/gpu16-gpu32") ||
  fail "resumed with fp32 states, the GPU run did not save fp32 moments"
resume cpu16-cpu cpu16
resume cpu16-gpu cpu16 "${GPU[@]}"
within cpu16-cpu cpu16-gpu 0.02 || fail "the CPU checkpoint with bf16 states resumed on the GPU left the CPU resume's tolerance"
echo "ok"
