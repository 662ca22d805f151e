#!/usr/bin/env bash
# test_per_token_loss.sh: train.loss per_token on SFT data whose samples have
# very uneven counted targets (llama3 chat template, byte tokenizer: most
# tokens masked). The same global batch of 4 split as micro-batches 1 x 4,
# 2 x 2, 4 x 1 and over dp 2 (with and without ZeRO-1) trains the same
# losses and grad norms for 6 steps (relative 1e-6), while per_micro_batch
# does not (the check has teeth); every CPU layout (tp 2 with sequence
# parallel, cp 2, pp 2, tp 2 x cp 2) gives the one-rank per_token losses, with
# LoRA too on cp 2 and pp 2; the eval loss is the per-token mean over all eval
# batches, the same for any batch split and layout; the cuda build (when there is one) refuses
# per_token on cuda.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1

python3 - "$WORK/chat.jsonl" <<'PY'
import json, random, sys
rng = random.Random(7)
words = "the a cat dog sat on mat ran far quick brown fox jumps over lazy river stone tree".split()
with open(sys.argv[1], "w") as f:
    for i in range(200):
        user = " ".join(rng.choice(words) for _ in range(rng.randint(3, 40)))
        reply = " ".join(rng.choice(words) for _ in range(rng.randint(1, 25 if i % 3 else 2)))
        f.write(json.dumps({"messages": [{"role": "user", "content": user},
                                         {"role": "assistant", "content": reply}]}) + "\n")
PY
"$MEGATRAIN" data build --format sft --chat-template llama3 --input "$WORK/chat.jsonl" --output "$WORK/sft" > /dev/null

# the mask named as data (its 0/1 bytes would train as tokens) is refused, naming the tokens to give instead
set +e
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/on_mask" --set train.steps=1 \
  --set optimizer.schedule.warmup_steps=0 --set "data.train=[$WORK/sft_mask]" > "$WORK/on_mask.log" 2>&1
rc=$?
set -e
[[ $rc -eq 1 ]] && grep -q "data.train\[0\].path: $WORK/sft_mask is the loss mask of $WORK/sft (its bytes are 0 and 1, \
not tokens): give $WORK/sft" "$WORK/on_mask.log" || fail "training on the loss mask: $rc, $(cat "$WORK/on_mask.log")"
echo "the loss mask named as training data: refused"

COMMON=(--set train.steps=6 --set logging.interval=1 --set model.num_layers=2 --set train.seq_len=64
        --set "train.batch_schedule=[{step: 0, global_batch_size: 4}]" --set optimizer.schedule.warmup_steps=2
        --set checkpoint.interval=0 --set train.eval_interval=0 --set "data.train=[{path: $WORK/sft, weight: 1.0}]"
        --set data.split=[100,0,0])

# run NAME NP LOSS SETTINGS...: a run of the tiny llama on NP ranks.
run() {
  local name=$1 np=$2 loss=$3; shift 3
  local cmd=("$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/$name" "${COMMON[@]}"
             --set train.loss="$loss" "$@")
  if [[ $np -gt 1 ]]; then cmd=(timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$np" "${cmd[@]}"); fi
  "${cmd[@]}" > "$WORK/$name.log" 2>&1 || { tail -20 "$WORK/$name.log"; fail "$name: the run failed"; }
}

# same FIELD A B TOL: every value of FIELD in runs A and B agrees to relative TOL.
same() {
  paste <(json_field "$WORK/$2/metrics.jsonl" "$1") <(json_field "$WORK/$3/metrics.jsonl" "$1") | awk -v tol="$4" '
    { n++; d = $1 - $2; if (d < 0) d = -d; s = $1 < 0 ? -$1 : $1; if (NF != 2 || !(d <= tol * s)) bad = 1 }
    END { exit (n == 6 && !bad) ? 0 : 1 }'
}

run mb1 1 per_token --set train.micro_batch_size=1
grep -q '"loss":' "$WORK/mb1/metrics.jsonl" || fail "no losses logged"
for split in "mb2 1 --set train.micro_batch_size=2" "mb4 1 --set train.micro_batch_size=4" \
             "dp2 2 --set train.micro_batch_size=1" \
             "dp2mb2 2 --set train.micro_batch_size=2 --set parallel.distributed_optimizer=true"; do
  read -r name np settings <<< "$split"
  # shellcheck disable=SC2086
  run "$name" "$np" per_token $settings
  for field in loss grad_norm; do
    same $field mb1 "$name" 1e-6 || fail "per_token $name: $field differs from micro-batches of 1: $(paste \
      <(json_field "$WORK/mb1/metrics.jsonl" $field) <(json_field "$WORK/$name/metrics.jsonl" $field) | head -3)"
  done
done
echo "per_token: micro-batches 1 x 4, 2 x 2, 4 x 1, dp 2 and dp 2 x ZeRO-1 give the same losses and grad norms"

# per_micro_batch averages means of unequal counts: the split changes it
run pmb1 1 per_micro_batch --set train.micro_batch_size=1
run pmb4 1 per_micro_batch --set train.micro_batch_size=4
if same loss pmb1 pmb4 1e-6; then fail "per_micro_batch does not depend on the split: the data's masks are not uneven"; fi
same loss pmb4 mb4 1e-6 || fail "one micro-batch: per_micro_batch and per_token should agree"

if command -v mpirun > /dev/null; then
  for layout in "tp2 2 --set parallel.tp=2 --set parallel.sequence_parallel=true" "cp2 2 --set parallel.cp=2" \
                "pp2 2 --set parallel.pp=2" "tp2cp2 4 --set parallel.tp=2 --set parallel.cp=2"; do
    read -r name np settings <<< "$layout"
    # shellcheck disable=SC2086
    run "$name" "$np" per_token --set train.micro_batch_size=1 $settings
    for field in loss grad_norm; do
      compare $field "$WORK/mb1/metrics.jsonl" "$WORK/$name/metrics.jsonl" || fail "per_token $name: $field differs"
    done
  done
  echo "per_token: tp 2 + sp, cp 2, pp 2 and tp 2 x cp 2 give the one-rank losses"
fi
# Evaluation with per_token is the per-token mean over all eval batches (as Megatron's evaluate): the
# same four validation samples as 4 batches of 1 or 1 batch of 4, and over dp 2 and pp 2, give one
# eval_loss; per_micro_batch averages the batches' means, which the split changes.
EVAL=(--set "data.valid=[{path: $WORK/sft, weight: 1.0}]" --set train.eval_interval=3)
# eval_same A B TOL: the eval losses of runs A and B (two each) agree to relative TOL.
eval_same() {
  paste <(json_field "$WORK/$1/metrics.jsonl" eval_loss) <(json_field "$WORK/$2/metrics.jsonl" eval_loss) |
    awk -v tol="$3" '{ n++; d = $1 - $2; if (d < 0) d = -d; s = $1 < 0 ? -$1 : $1;
                       if (NF != 2 || !(d <= tol * s)) bad = 1 } END { exit (n == 2 && !bad) ? 0 : 1 }'
}
run ev1 1 per_token --set train.micro_batch_size=1 --set train.eval_batches=4 "${EVAL[@]}"
run ev4 1 per_token --set train.micro_batch_size=4 --set train.eval_batches=1 "${EVAL[@]}"
eval_same ev1 ev4 1e-6 || fail "per_token eval: 4 batches of 1 and 1 batch of 4 differ: $(paste \
  <(json_field "$WORK/ev1/metrics.jsonl" eval_loss) <(json_field "$WORK/ev4/metrics.jsonl" eval_loss))"
run pev1 1 per_micro_batch --set train.micro_batch_size=1 --set train.eval_batches=4 "${EVAL[@]}"
run pev4 1 per_micro_batch --set train.micro_batch_size=4 --set train.eval_batches=1 "${EVAL[@]}"
if eval_same pev1 pev4 1e-6; then fail "per_micro_batch eval does not depend on the split: the check has no teeth"; fi
if command -v mpirun > /dev/null; then
  for layout in "evdp2 2 --set train.micro_batch_size=1" "evpp2 2 --set parallel.pp=2 --set train.micro_batch_size=1" \
                "evcp2dp2 4 --set parallel.cp=2 --set train.micro_batch_size=1"; do
    read -r name np settings <<< "$layout"
    # shellcheck disable=SC2086
    run "$name" "$np" per_token --set train.eval_batches=4 "${EVAL[@]}" $settings
    eval_same ev1 "$name" 1e-6 || fail "per_token eval on $name differs from one rank"
  done
fi
echo "per_token eval: one per-token mean for batches 1 x 4 and 4 x 1, dp 2, pp 2, cp 2 x dp 2; per_micro_batch differs"

# LoRA with per_token on cp 2 and pp 2 (the packed SFT recipe covers tp and dp: test_sft_packed_runs.sh)
LORA=(--set "peft={type: lora, rank: 4, alpha: 8}")
run lora1 1 per_token --set train.micro_batch_size=1 "${LORA[@]}"
if command -v mpirun > /dev/null; then
  for layout in "loracp2 2 --set parallel.cp=2" "lorapp2 2 --set parallel.pp=2"; do
    read -r name np settings <<< "$layout"
    # shellcheck disable=SC2086
    run "$name" "$np" per_token --set train.micro_batch_size=1 "${LORA[@]}" $settings
    for field in loss grad_norm; do
      compare $field "$WORK/lora1/metrics.jsonl" "$WORK/$name/metrics.jsonl" || fail "LoRA per_token $name: $field differs"
    done
  done
  echo "per_token with LoRA: cp 2 and pp 2 give the one-rank losses"
fi
# the cuda build refuses per_token before touching a GPU
if [[ -x "$REPO/build/cuda/megatrain" ]]; then
  MEGATRAIN="$REPO/build/cuda/megatrain" expect_refused "per_token on cuda" \
    "train.loss: per_token is not implemented on GPUs yet" 1 run "$REPO/recipes/tiny/llama.yaml" \
    --set run.dir="$WORK/cuda" "${COMMON[@]}" --set train.micro_batch_size=1 --set train.loss=per_token \
    --set run.device=cuda --set precision=bf16
else
  echo "no build/cuda/megatrain: the cuda refusal is not checked here"
fi
echo "PASS test_per_token_loss"
