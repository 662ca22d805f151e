#!/usr/bin/env bash
# test_eval_all.sh: train.eval_batches: all evaluates every validation sample once (src/data/eval_coverage.h).
# On tiny llama and the demo data (data.split 98,2,0: its validation share holds 94 samples of 32 tokens, 47 of
# 64):
# - where micro_batch_size 2 divides the samples (seq_len 32: 47 batches), the eval_loss of `all` is that of
#   eval_batches 47, and the log line says the 47 batches;
# - where it does not (seq_len 64: 24 batches, the last holding 1 sample and 1 of masked padding), the eval_loss
#   is the loss over every sample once: `megatrain eval` of the checkpoint with --batches 47 --micro-batch-size 1,
#   per micro-batch and per token, and `megatrain eval RUN` (which takes `all` from the run's recipe) prints it;
# - on dp 2, pp 2, pp 2 x vpp 2, tp 2, cp 2 and dp 2 x pp 2 under mpirun the eval_loss is the single rank's
#   (per token too, on dp 2 and pp 2), and data.split's test share is evaluated whole likewise (test_loss);
# - run.dir/recipe.yaml and the checkpoint's keep the word; a branch from the step-2 checkpoint resolves it again
#   to the same batches and gives the straight run's eval_loss at step 4; a resume that changes to a count is
#   warned of, one that changes micro_batch_size is not (the same samples);
# - a misspelt value (exit 2, naming the key and `all`), eval's --batches likewise, and validation data that
#   holds no whole sample are refused.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
command -v mpirun > /dev/null || { echo "mpirun not found"; exit 77; }
export OMP_NUM_THREADS=1
demo_data "$WORK/english"
COMMON=(--set train.steps=4 --set optimizer.schedule.warmup_steps=1 --set logging.interval=1
        --set train.micro_batch_size=2 --set "train.batch_schedule=[{step: 0, global_batch_size: 8}]"
        --set train.eval_interval=2 --set checkpoint.interval=2 --set checkpoint.async=false --set model.num_layers=4
        --set "data.train=[{path: $WORK/english, weight: 1.0}]")
# run NAME NP SETTINGS...: tiny llama into $WORK/NAME on NP ranks, its output in $WORK/NAME.log
run() {
  local name=$1 np=$2; shift 2
  local cmd=("$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/$name" "${COMMON[@]}" "$@")
  if [[ $np -gt 1 ]]; then cmd=(timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$np" "${cmd[@]}"); fi
  "${cmd[@]}" > "$WORK/$name.log" 2>&1 || { tail -n 20 "$WORK/$name.log"; fail "$name: the run failed"; }
}
# eval_at RUN STEP: the eval_loss RUN logged at STEP
eval_at() { grep "\"step\":$2[,}]" "$WORK/$1/metrics.jsonl" | grep -o '"eval_loss":[^,}]*' | cut -d: -f2; }
# close A B WHAT: A and B agree to relative 1e-6
close() {
  awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 1e-6 * (a < 0 ? -a : a)) }' ||
    fail "$3: $1 vs $2"
}
said() { grep -F "$2" "$WORK/$1.log" > /dev/null || fail "$1: the log does not say '$2': $(grep '^eval' "$WORK/$1.log")"; }

# 1. micro_batch_size 2 divides the 94 samples of 32 tokens: `all` is eval_batches 47
run all32 1 --set train.seq_len=32 --set train.eval_batches=all
run count32 1 --set train.seq_len=32 --set train.eval_batches=47
said all32 "eval: train.eval_batches all is 47 batches of 2: the 94 samples data.split's validation share holds, each once"
! grep -q "masked padding" "$WORK/all32.log" || fail "all32: padding said where the batches divide the samples"
compare eval_loss "$WORK/count32/metrics.jsonl" "$WORK/all32/metrics.jsonl" || fail "all at seq_len 32 is not eval_batches 47"
for f in "$WORK/all32/recipe.yaml" "$WORK/all32/checkpoints/iter_0000004/recipe.yaml"; do
  grep -q "^  eval_batches: all$" "$f" || fail "$f does not keep eval_batches: all: $(grep eval_batches "$f")"
done
echo "seq_len 32: all = 47 batches of 2, the eval_loss of eval_batches 47"

# 2. it does not divide the 47 samples of 64 tokens: the last batch holds 1 and 1 of padding; the loss is that of
# every sample once, as eval scores it one sample a batch
run all64 1 --set train.eval_batches=all
said all64 "eval: train.eval_batches all is 24 batches of 2: the 47 samples data.split's validation share holds, each once; the last batch holds 1 and 1 masked padding sample, which counts nothing"
ckpt="$WORK/all64/checkpoints/iter_0000004"
json() { "$MEGATRAIN" eval "$ckpt" "$@" --json 2> /dev/null | grep -o '"loss":[^,]*' | cut -d: -f2; }
once=$(json --batches 47 --micro-batch-size 1)
close "$(eval_at all64 4)" "$once" "all64: eval_loss is not the loss over every sample once (eval --batches 47 --micro-batch-size 1)"
out=$("$MEGATRAIN" eval "$WORK/all64" 2> "$WORK/eval-run.err") || { cat "$WORK/eval-run.err"; fail "eval RUN failed"; }
grep -q -- "--batches all" "$WORK/eval-run.err" || fail "eval RUN did not take the run's all: $(cat "$WORK/eval-run.err")"
[[ $out =~ ^eval:\ loss\ ([0-9.]+)\ over\ 24\ batches\ of\ 2\ x\ 64\ tokens,\ all\ 47\ samples\ once, ]] ||
  fail "eval RUN: unexpected line: $out"
[[ ${BASH_REMATCH[1]} == "$(printf '%.6f' "$(eval_at all64 4)")" ]] || fail "eval RUN: ${BASH_REMATCH[1]}, the run $(eval_at all64 4)"
close "$(json --batches all --micro-batch-size 5)" "$once" "eval --batches all --micro-batch-size 5"
"$MEGATRAIN" eval "$ckpt" --batches all --json 2> /dev/null | grep -q '"batches":24,"micro_batch_size":2,"seq_len":64,"tokens":3008,"samples":47,' ||
  fail "eval --batches all --json: $("$MEGATRAIN" eval "$ckpt" --batches all --json 2>&1)"
echo "seq_len 64: all = 24 batches of 2, the last padded: the loss over every sample once"

# 3. every layout gives the single rank's eval_loss
for layout in "dp2:2:" "pp2:2:--set parallel.pp=2" "vpp2:2:--set parallel.pp=2 --set parallel.vpp=2" \
              "tp2:2:--set parallel.tp=2" "cp2:2:--set parallel.cp=2" "dp2pp2:4:--set parallel.pp=2"; do
  IFS=: read -r name np settings <<< "$layout"
  # shellcheck disable=SC2086
  run "all64-$name" "$np" --set train.eval_batches=all $settings
  compare eval_loss "$WORK/all64/metrics.jsonl" "$WORK/all64-$name/metrics.jsonl" || fail "$name: eval_loss differs from one rank"
done
run token 1 --set train.eval_batches=all --set train.loss=per_token
close "$(eval_at token 4)" "$(json --batches 47 --micro-batch-size 1 --loss per_token)" "per_token: not the loss over every sample once"
for layout in "dp2:2:" "pp2:2:--set parallel.pp=2"; do
  IFS=: read -r name np settings <<< "$layout"
  # shellcheck disable=SC2086
  run "token-$name" "$np" --set train.eval_batches=all --set train.loss=per_token $settings
  compare eval_loss "$WORK/token/metrics.jsonl" "$WORK/token-$name/metrics.jsonl" || fail "per_token $name differs from one rank"
done
echo "dp 2, pp 2, pp 2 x vpp 2, tp 2, cp 2, dp 2 x pp 2 (and per_token on dp 2, pp 2): the single rank's eval_loss"

# 4. data.split's test share, whole: test_loss on dp 2 x pp 2 is the single rank's and eval --test's over each sample
run share 1 --set train.eval_batches=all --set "data.split=[90, 5, 5]"
run share-dp2pp2 4 --set train.eval_batches=all --set "data.split=[90, 5, 5]" --set parallel.pp=2
for field in eval_loss test_loss; do
  compare $field "$WORK/share/metrics.jsonl" "$WORK/share-dp2pp2/metrics.jsonl" || fail "dp 2 x pp 2: $field differs"
done
[[ $(grep '^eval: ' "$WORK/share.log") =~ test_loss:\ [0-9]+\ batches\ of\ 2:\ the\ ([0-9]+)\ samples ]] ||
  fail "share: the log does not say the test share's batches: $(grep '^eval' "$WORK/share.log")"
tests=${BASH_REMATCH[1]}
test_loss=$(grep -o '"test_loss":[^,}]*' "$WORK/share/metrics.jsonl" | cut -d: -f2)
ckpt="$WORK/share/checkpoints/iter_0000004"
close "$test_loss" "$(json --test --batches "$tests" --micro-batch-size 1)" "test_loss is not the loss over the test share once"
echo "the test share's $tests samples: test_loss of every sample once on one rank and dp 2 x pp 2"

# 5. a branch from step 2 resolves `all` again: the same batches, the straight run's eval_loss at step 4
"$MEGATRAIN" resume "$WORK/all64/checkpoints/iter_0000002" --set run.dir="$WORK/branch" > "$WORK/branch.log" 2>&1 ||
  { tail -n 20 "$WORK/branch.log"; fail "the branch from step 2 failed"; }
said branch "eval: train.eval_batches all is 24 batches of 2: the 47 samples"
close "$(eval_at all64 4)" "$(eval_at branch 4)" "the branch's eval_loss at step 4"
"$MEGATRAIN" resume "$WORK/all64/checkpoints/iter_0000002" --set run.dir="$WORK/branch-mbs" \
  --set train.micro_batch_size=1 > "$WORK/branch-mbs.log" 2>&1 || fail "the branch with micro_batch_size 1 failed"
! grep -q "eval_loss is now measured" "$WORK/branch-mbs.log" || fail "a warning of other samples where all reads the same"
"$MEGATRAIN" resume "$WORK/all64/checkpoints/iter_0000002" --set run.dir="$WORK/branch-count" \
  --set train.eval_batches=3 > "$WORK/branch-count.log" 2>&1 || fail "the branch with eval_batches 3 failed"
said branch-count "resume: eval_loss is now measured over the first 3 batches of 2 samples instead of every validation sample once (train.eval_batches: all)"
echo "resume: all resolved again to the same samples; a change to a count is said"

# 6. refusals
expect_refused "eval_batches: alll" "train.eval_batches: expected a positive integer or all, found 'alll' (did you mean all?)" 1 \
  run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/bad" "${COMMON[@]}" --set train.eval_batches=alll
expect_refused "eval --batches every" "eval: --batches: expected a positive integer up to 1073741824 or all, found 'every'" 1 \
  eval "$WORK/all64" --batches every
printf 'too short\n' > "$WORK/short.txt"
"$MEGATRAIN" data build --input "$WORK/short.txt" --output "$WORK/short" --tokenizer byte > /dev/null 2>&1
set +e
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/short-run" "${COMMON[@]}" \
  --set train.eval_batches=all --set "data.valid=[{path: $WORK/short, weight: 1.0}]" > "$WORK/short-run.log" 2>&1
rc=$?
set -e
[[ $rc -ne 0 ]] || fail "all over validation data shorter than one sample ran"
said short-run "train.eval_batches: all: the validation data (data.valid) holds no whole sample of train.seq_len + 1 = 65 tokens"
echo "refused: a misspelt all, eval's --batches likewise, validation data without a whole sample (exit $rc)"
