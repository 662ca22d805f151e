#!/usr/bin/env bash
# test_fp8.sh: precision: fp8 on the CPU (the exact emulation of Hopper's FP8
# products, tensorwise current scaling; docs/fp8.md).
# - The tiny llama trained 100 steps in fp8 tracks fp32: the mean loss of
#   steps 81-100 within 2% (measured 0.24% on 2026-11-24; the largest single
#   step 4.4%), and fp8 does change the numbers (some step differs by > 1e-3).
# - Layouts: tp 2 + sp, cp 2, pp 2 and dp 2 give the one-rank fp8 losses and
#   grad norms to 1e-6 on steps 1-2 (same weights: the amaxes reduced over tp
#   and cp give the one-rank scales; a per-rank scale would differ at once),
#   and after that losses within 5e-4 and grad norms within 1e-2 (an fp32
#   difference of 1e-7 upstream can move a value across an FP8 rounding
#   boundary; measured on 2026-11-24 over 12 steps: losses 4.2e-5, grad norms
#   2.0e-3 on tp 2, 2.3e-4 on cp 2, 5.7e-5 on dp 2, 0 on pp 2).
# - Resume of an fp8 run equals the uninterrupted run bit for bit (current
#   scaling keeps no state).
# - Refused with exit 2 naming the key: fp8 with peft, fp8.recipe delayed
#   (not wired yet); the cuda build refuses fp8. (MoE in fp8: test_fp8_moe.sh.)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1
demo_data "$WORK/english"
COMMON=(--set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.eval_interval=0
        --set checkpoint.interval=0 --set train.micro_batch_size=4 --set optimizer.schedule.warmup_steps=2
        --set "train.batch_schedule=[{step: 0, global_batch_size: 8}]")

# run NAME NP SETTINGS...: the tiny llama on NP ranks.
run() {
  local name=$1 np=$2; shift 2
  local cmd=("$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/$name" "${COMMON[@]}" "$@")
  if [[ $np -gt 1 ]]; then cmd=(timeout 180 mpirun --allow-run-as-root --oversubscribe -np "$np" "${cmd[@]}"); fi
  "${cmd[@]}" > "$WORK/$name.log" 2>&1 || { tail -20 "$WORK/$name.log"; fail "$name: the run failed"; }
}
values() { json_field "$WORK/$1/metrics.jsonl" "$2"; }

run fp32 1 --set train.steps=100 --set optimizer.schedule.warmup_steps=10 --set precision=fp32
run fp8 1 --set train.steps=100 --set optimizer.schedule.warmup_steps=10 --set precision=fp8
paste <(values fp32 loss) <(values fp8 loss) | awk '
  { n++; d = ($2 - $1) / $1; if (d < 0) d = -d; if (d > worst) worst = d; if (n > 80) { a += $1; b += $2 } }
  END { rel = (b - a) / a; if (rel < 0) rel = -rel
        printf "fp8 vs fp32: mean loss of steps 81-100 %.4f vs %.4f (relative %.4f), largest step difference %.4f\n", b / 20, a / 20, rel, worst
        exit !(n == 100 && rel <= 0.02 && worst > 1e-3) }' || fail "fp8 does not track fp32 within 2% (or equals it)"

FP8=(--set precision=fp8 --set train.steps=12)
run one 1 "${FP8[@]}"
if command -v mpirun > /dev/null; then
  for layout in "tp2sp 2 --set parallel.tp=2 --set parallel.sequence_parallel=true" "cp2 2 --set parallel.cp=2" \
                "pp2 2 --set parallel.pp=2" "dp2 2"; do
    read -r name np settings <<< "$layout"
    # shellcheck disable=SC2086
    run "$name" "$np" "${FP8[@]}" $settings
    for field in loss grad_norm; do
      paste <(values one $field) <(values "$name" $field) | awk -v f="$field" -v L="$name" '
        { n++; d = ($2 - $1) / $1; if (d < 0) d = -d; tol = n <= 2 ? 1e-6 : (f == "loss" ? 5e-4 : 1e-2)
          if (NF != 2 || !(d <= tol)) { printf "%s: step %d %s %s vs %s\n", L, n, f, $1, $2; bad = 1 } }
        END { exit !(n == 12 && !bad) }' || fail "fp8 $name: $field is not the one-rank run's"
    done
  done
  echo "fp8: tp 2 + sp, cp 2, pp 2 and dp 2 give the one-rank losses (1e-6 on steps 1-2, then FP8 noise)"
fi

run straight 1 "${FP8[@]}" --set checkpoint.interval=6
"$MEGATRAIN" resume "$WORK/straight/checkpoints/iter_0000006" --set run.dir="$WORK/resumed" > "$WORK/resumed.log" 2>&1 ||
  { tail -5 "$WORK/resumed.log"; fail "the fp8 resume failed"; }
steps_after_6() { grep -o '"step":[0-9]*,"loss":[^,]*,"lr":[^,]*,"global_batch_size":[^,]*,"grad_norm":[^,]*' "$1" |
  awk -F'[:,]' '$2 > 6'; }
[[ $(steps_after_6 "$WORK/resumed/metrics.jsonl" | wc -l) -eq 6 ]] || fail "the resumed run logged no steps 7-12"
diff <(steps_after_6 "$WORK/straight/metrics.jsonl") <(steps_after_6 "$WORK/resumed/metrics.jsonl") > /dev/null ||
  fail "the resumed fp8 run differs from the uninterrupted one"
echo "fp8: resume equals the uninterrupted run bit for bit"

expect_refused "fp8 with LoRA" "precision: fp8 with peft (LoRA) is not implemented yet" 1 run \
  "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/lora" "${COMMON[@]}" --set precision=fp8 \
  --set "peft={type: lora, rank: 4, alpha: 8}"
expect_refused "fp8 delayed scaling" "fp8.recipe: delayed scaling is not wired into training yet" 1 run \
  "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/delayed" "${COMMON[@]}" --set precision=fp8 \
  --set fp8.recipe=delayed
if [[ -x "$REPO/build/cuda/megatrain" ]]; then
  MEGATRAIN="$REPO/build/cuda/megatrain" expect_refused "fp8 on cuda" "precision: fp8 runs as the exact CPU emulation only" \
    1 run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/cuda" "${COMMON[@]}" --set precision=fp8 \
    --set run.device=cuda
else
  echo "no build/cuda/megatrain: the cuda refusal is not checked here"
fi
echo "PASS test_fp8"
