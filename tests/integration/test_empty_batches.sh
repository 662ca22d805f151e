#!/usr/bin/env bash
# test_empty_batches.sh: micro-batches in which no target counts (an SFT loss mask that leaves nothing: here
# packed documents cut to their prompts) are said, once a run for training and once for evaluation, with their
# number over the whole global batch on every layout.
#
# The data: 8 prompt/completion documents, each longer than a row of seq_len 32 + 1, cut to it
# (data.pack_overlong: truncate), so each is a row of its own; 4 have a prompt longer than the row (no target
# left), 4 a short one. A step of 8 rows (mbs 1) is the whole epoch: 4 of its 8 micro-batches hold no target,
# whichever order the rows come in, on one rank, dp 2, pp 2 (the last stage loads each micro-batch twice), cp 2
# (each rank holds half a row) and pp 2 x vpp 2; the 8 evaluation batches likewise, and 7 of them at dp 2 (a
# rank pads with a batch that is no data) count the same as on one rank, and `megatrain eval` of the run notes its 4. Under train.loss per_token nothing is
# said until a step has no counted target at all (every document cut to its prompt): then its loss is 0.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1

# docs FILE EMPTY FULL: EMPTY documents whose prompt fills the row, FULL whose prompt is short
docs() {
  python3 - "$@" <<'PY'
import json, sys
path, empty, full = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "w") as f:
    for i in range(empty):
        f.write(json.dumps({"prompt": "a long question %d " % i + "which never ends " * 4, "completion": " yes"}) + "\n")
    for i in range(full):
        f.write(json.dumps({"prompt": "q%d? " % i, "completion": "an answer long enough to fill the row " * 2}) + "\n")
PY
}
docs "$WORK/half.jsonl" 4 4
docs "$WORK/none.jsonl" 8 0
for d in half none; do
  "$MEGATRAIN" data build --format sft --input "$WORK/$d.jsonl" --output "$WORK/$d" > /dev/null
done

COMMON=(--set train.steps=2 --set logging.interval=1 --set model.num_layers=4 --set train.seq_len=32
        --set train.micro_batch_size=1 --set "train.batch_schedule=[{step: 0, global_batch_size: 8}]"
        --set optimizer.schedule.warmup_steps=0 --set checkpoint.interval=0 --set data.pack=true
        --set data.pack_overlong=truncate --set train.eval_interval=1 --set train.eval_batches=8
        --set "data.split=[100, 0, 0]")

# run NAME NP DATA SETTINGS...: the tiny llama on NP ranks, trained and evaluated on DATA
run() {
  local name=$1 np=$2 data=$3; shift 3
  local cmd=("$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/$name" "${COMMON[@]}"
             --set "data.train=[$WORK/$data]" --set "data.valid=[$WORK/$data]" "$@")
  if [[ $np -gt 1 ]]; then cmd=(timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$np" "${cmd[@]}"); fi
  "${cmd[@]}" > "$WORK/$name.log" 2>&1 || { tail -20 "$WORK/$name.log"; fail "$name: the run failed"; }
}

# said NAME COUNT TEXT: TEXT is in NAME's log COUNT times
said() {
  local n
  n=$(grep -c -F -- "$3" "$WORK/$1.log" || true)
  [[ $n -eq $2 ]] || { grep warning "$WORK/$1.log" >&2 || true; fail "$1: '$3' said $n times, not $2"; }
}

TRAIN="megatrain: warning: step 1: 4 of its 8 micro-batches hold no target that counts (every target masked by \
the data's loss mask, or padding): each counts as loss 0 in the step's mean (train.loss: per_micro_batch), which \
lowers the loss logged and scales the others' gradients down; train.loss: per_token weighs every counted token \
alike; said once"
EVAL="megatrain: warning: eval_loss at step 1: 4 of its 8 batches hold no target that counts"

run one 1 half --set checkpoint.interval=2
grep -q "4 of those 8 truncated documents keep no target" "$WORK/one.log" || fail "the data is not as planned: $(cat "$WORK/one.log")"
said one 1 "$TRAIN"
said one 1 "$EVAL"
said one 2 "hold no target"
echo "one rank: 4 of 8 micro-batches and 4 of 8 evaluation batches said, once each"
# megatrain eval of the run (its settings: the packed validation rows, batches of 1) notes them too
"$MEGATRAIN" eval "$WORK/one" > "$WORK/eval.out" 2> "$WORK/eval.err" || fail "eval: $(cat "$WORK/eval.err")"
grep -q "^eval: note: 4 of the 8 batches hold no target that counts" "$WORK/eval.err" || fail "eval: $(cat "$WORK/eval.err")"
"$MEGATRAIN" eval "$WORK/one" --loss per_token > "$WORK/eval.out" 2> "$WORK/eval.err" || fail "eval: $(cat "$WORK/eval.err")"
! grep -q "hold no target" "$WORK/eval.err" || fail "eval --loss per_token: $(cat "$WORK/eval.err")"
echo "megatrain eval: the same 4 of 8 noted under per_micro_batch, nothing under per_token"

for layout in "dp2 2" "pp2 2 --set parallel.pp=2" "cp2 2 --set parallel.cp=2" \
              "pp2vpp2 2 --set parallel.pp=2 --set parallel.vpp=2"; do
  read -r name np settings <<< "$layout"
  # shellcheck disable=SC2086
  run "$name" "$np" half $settings
  said "$name" 1 "$TRAIN"
  said "$name" 1 "$EVAL"
  echo "$name: the same counts, said once"
done

# 7 evaluation batches: dp 2's second rank pads its fourth; one rank's first 7 rows are the same 7
run one7 1 half --set train.eval_batches=7
run dp7 2 half --set train.eval_batches=7
line=$(grep -o "eval_loss at step 1: [0-9]* of its 7 batches" "$WORK/one7.log" || echo "eval_loss: nothing empty")
grep -q -F "$line" "$WORK/dp7.log" || fail "7 evaluation batches: one rank said '$line', dp 2: $(grep warning "$WORK/dp7.log")"
echo "7 evaluation batches, dp 2 padding one: as one rank ($line)"

# per_token: a partly empty batch is weighed right, nothing said; a batch with no target at all is said
run tok 1 half --set train.loss=per_token
said tok 0 "hold no target"
said tok 0 "no target of the global batch"
run none 1 none --set train.loss=per_token
said none 1 "megatrain: warning: step 1: no target of the global batch counts (every target masked by the data's \
loss mask, or padding): its loss is 0 and its gradient zero, but AdamW's moments and weight decay still moved the \
weights; said once"
said none 1 "megatrain: warning: eval_loss at step 1 is 0: no target of its 8 batches counts"
[[ $(json_field "$WORK/none/metrics.jsonl" loss | head -1) == 0 ]] || fail "none: the loss is not 0"
echo "per_token: nothing said for partly empty batches; a step and an evaluation with no target at all said"
