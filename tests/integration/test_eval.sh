#!/usr/bin/env bash
# test_eval.sh: `megatrain eval CKPT --data PREFIX` on a checkpoint written by a
# short run of tiny llama: the output line's format (the loss with 6
# decimals), a finite loss below ln(vocab) = ln 256, the same loss as the
# run's own evaluation at that step (same data, seed, seq_len, micro-batch
# size and batch count), also with those left out: `eval RUN` alone takes
# them from the run's recipe (its data.valid, or data.train with data.split;
# a blend needs --data), and a conversion's checkpoint takes the defaults and
# needs --data; the run directory and its checkpoints/ directory
# evaluate the newest checkpoint; --json prints one object with the same
# loss; errors for a missing checkpoint, missing data, data outside the
# model's vocabulary and bad options.
# On SFT data (data build --format sft: a loss mask), runs with data.valid =
# that data, train.loss per_token or per_micro_batch, data.pack true or
# false: eval with the run's settings and --pack / --loss gives the run's
# eval_loss at its checkpoint; the same tokens without the mask, or the
# other --loss, do not; the line and --json say the mask and the counted
# targets; bad --pack-overlong / --loss values exit 2 naming the option;
# the cuda build (when there is one) refuses --pack and per_token (exit 2).
# More batches than the validation set's packed rows: eval and a run's setup
# warn once of the rows read twice, naming the batches that read each once.
source "$(dirname "$0")/lib.sh"

"$MEGATRAIN" eval --help > /dev/null 2>&1 || { echo "skip: megatrain has no eval command"; exit 77; }

demo_data "$WORK/english"
run="$WORK/run"
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$run" --set train.steps=10 \
  --set optimizer.schedule.warmup_steps=2 --set checkpoint.interval=5 --set checkpoint.async=false \
  --set "data.train=[{path: $WORK/english, weight: 1.0}]" \
  --set "data.valid=[{path: $WORK/english, weight: 1.0}]" \
  --set train.eval_interval=10 --set train.eval_batches=3 --set logging.interval=5 \
  > "$WORK/run.log" 2>&1 || { cat "$WORK/run.log"; fail "training run failed"; }
# data.split beside data.valid is not used (all of data.train trains), and the run says so: the recipe's [98, 2, 0]
# above; with [100, 0, 0] nothing is said, and the run trains on the same samples
grep -q "warning: data.split \[98, 2, 0\] is not used: data.valid gives the validation data" "$WORK/run.log" ||
  fail "no warning of data.split beside data.valid: $(grep -i warning "$WORK/run.log")"
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/split-valid" --set train.steps=1 \
  --set optimizer.schedule.warmup_steps=0 --set "data.train=[{path: $WORK/english, weight: 1.0}]" \
  --set "data.valid=[{path: $WORK/english, weight: 1.0}]" --set "data.split=[100, 0, 0]" > "$WORK/split-valid.log" 2>&1 ||
  fail "the run with data.split [100, 0, 0] and data.valid failed: $(tail -n 3 "$WORK/split-valid.log")"
! grep -q "data.split .* is not used" "$WORK/split-valid.log" || fail "a warning of data.split [100, 0, 0]"
of() { grep -o "train samples (of [0-9]*)" "$1"; }
[[ -n $(of "$WORK/run.log") && $(of "$WORK/split-valid.log") == $(of "$WORK/run.log") ]] ||
  fail "data.split changed the training samples: $(of "$WORK/split-valid.log") against $(of "$WORK/run.log")"
ckpt="$run/checkpoints/iter_0000010"
if [[ ! -d "$ckpt" ]]; then
  ls -R "$run" >&2
  echo "skip: the run wrote no checkpoint $ckpt (checkpoint saving not available)"; exit 77
fi

# 1. the run's settings: the loss equals the run's eval_loss at step 10, to the printed digits
out=$("$MEGATRAIN" eval "$ckpt" --data "$WORK/english" --batches 3 --seq-len 64 --micro-batch-size 8 \
  --seed 1234 2> "$WORK/eval.err") || { cat "$WORK/eval.err"; fail "eval exited non-zero"; }
echo "$out"
[[ $(printf '%s\n' "$out" | wc -l) -eq 1 ]] || fail "eval printed more than one line: $out"
[[ "$out" =~ ^eval:\ loss\ ([0-9]+\.[0-9]{6})\ over\ 3\ batches\ of\ 8\ x\ 64\ tokens\ \((.*)\)$ ]] \
  || fail "unexpected output line: $out"
loss=${BASH_REMATCH[1]}
[[ "${BASH_REMATCH[2]}" == "$ckpt" ]] || fail "the line names '${BASH_REMATCH[2]}', not the checkpoint $ckpt"
awk -v l="$loss" 'BEGIN { exit !(l > 0 && l < log(256)) }' || fail "loss $loss is not in (0, ln 256)"
run_eval=$(grep '"step":10[,}]' "$run/metrics.jsonl" | grep -o '"eval_loss":[^,}]*' | cut -d: -f2)
[[ -n "$run_eval" ]] || fail "the run logged no eval_loss at step 10: $(cat "$run/metrics.jsonl")"
[[ "$(printf '%.6f' "$run_eval")" == "$loss" ]] || fail "eval says $loss, the run's eval_loss at step 10 is $run_eval"

# 1a. the run alone: what the command line leaves out is the run's (its data.valid, seq_len, micro_batch_size,
# eval_batches, seed), said on stderr: the same line, its eval_loss
alone=$("$MEGATRAIN" eval "$run" 2> "$WORK/alone.err") || fail "eval RUN alone: $(cat "$WORK/alone.err")"
[[ "$alone" == "$out" ]] || fail "eval RUN alone printed '$alone', expected '$out'"
grep -qF "eval: the run's settings ($ckpt/recipe.yaml): --data $WORK/english (its data.valid) --seq-len 64 \
--micro-batch-size 8 --batches 3 --seed 1234" "$WORK/alone.err" || fail "eval RUN alone: $(cat "$WORK/alone.err")"
# what the command line gives is kept: another batch count, another loss
fewer=$("$MEGATRAIN" eval "$run" --batches 1 2> /dev/null) || fail "eval RUN --batches 1 exited non-zero"
[[ "$fewer" == "eval: loss "*" over 1 batch of 8 x 64 tokens ($ckpt)" && "$fewer" != "$out" ]] ||
  fail "eval RUN --batches 1: '$fewer'"

# 1b. the run directory and its checkpoints/ directory: the newest checkpoint (iter_0000010), the same line
for dir in "$run" "$run/checkpoints"; do
  out_dir=$("$MEGATRAIN" eval "$dir" --data "$WORK/english" --batches 3 --seq-len 64 --micro-batch-size 8 --seed 1234) \
    || fail "eval of $dir exited non-zero"
  [[ "$out_dir" == "$out" ]] || fail "eval of $dir printed '$out_dir', expected '$out'"
done

# 1c. --json: one object; the loss is the line's, all digits; the fields as documented
json=$("$MEGATRAIN" eval "$run" --data "$WORK/english" --batches 3 --seq-len 64 --micro-batch-size 8 --json) \
  || fail "eval --json exited non-zero"
echo "$json"
[[ $(printf '%s\n' "$json" | wc -l) -eq 1 ]] || fail "eval --json printed more than one line"
want='^\{"checkpoint":"'"$ckpt"'","step":10,"loss":([0-9.e-]+),"perplexity":([0-9.e+-]+),"batches":3,'
want+='"micro_batch_size":8,"seq_len":64,"tokens":1536,"samples":24,"data":"'"$WORK/english"'","split":null,"share":null,"seed":1234,"device":"cpu",'
want+='"loss_reduction":"per_micro_batch","pack":false,"masked":false,"counted":1536\}$'
[[ "$json" =~ $want ]] || fail "eval --json: unexpected object: $json"
json_loss=${BASH_REMATCH[1]} ppl=${BASH_REMATCH[2]}
[[ "$(printf '%.6f' "$json_loss")" == "$loss" ]] || fail "--json loss $json_loss, the line says $loss"
awk -v l="$json_loss" -v p="$ppl" 'BEGIN { d = exp(l) - p; exit !(d < 1e-9 * p && d > -1e-9 * p) }' \
  || fail "perplexity $ppl is not exp($json_loss)"

# 1d. a run validating on data.split's share of its training data (no data.valid): --split gives its eval_loss,
# the whole dataset another loss; --split's weights must give a validation share
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/split" --set train.steps=4 \
  --set optimizer.schedule.warmup_steps=2 --set checkpoint.interval=4 --set checkpoint.async=false \
  --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set data.split=90,10,0 \
  --set train.eval_interval=4 --set train.eval_batches=2 > "$WORK/split.log" 2>&1 ||
  { cat "$WORK/split.log"; fail "the data.split run failed"; }
want=$(grep '"step":4[,}]' "$WORK/split/metrics.jsonl" | grep -o '"eval_loss":[^,}]*' | cut -d: -f2)
[[ -n "$want" ]] || fail "the data.split run logged no eval_loss at step 4"
out=$("$MEGATRAIN" eval "$WORK/split" --data "$WORK/english" --split 90,10,0 --batches 2 --seq-len 64 \
  --micro-batch-size 8) || fail "eval --split exited non-zero"
[[ "$out" == "eval: loss $(printf '%.6f' "$want") over 2 batches of 8 x 64 tokens, the validation share of split 90,10,0 ("* ]] ||
  fail "eval --split: '$out', the run's eval_loss at step 4 is $want"
whole=$("$MEGATRAIN" eval "$WORK/split" --data "$WORK/english" --batches 2 --seq-len 64 --micro-batch-size 8 \
  2> "$WORK/note.txt")
# a note says what reproduces the run's eval_loss (here the split; then every setting the defaults change), none
# when the settings are the run's
grep -qF "eval: note: the run of $WORK/split/checkpoints/iter_0000004 evaluated with other settings; its eval_loss is \
this command with --split 90,10,0 (" "$WORK/note.txt" || fail "no note of the run's split: $(cat "$WORK/note.txt")"
(cd "$WORK" && "$MEGATRAIN" eval split --data ./english --batches 1 2> "$WORK/note.txt" > /dev/null) # any spelling
grep -qF "its eval_loss is this command with --batches 2 --split 90,10,0 (" \
  "$WORK/note.txt" || fail "no note of the run's settings: $(cat "$WORK/note.txt")"
# without --data, its data.train's validation share by its data.split: its eval_loss; --test: its test share
out=$("$MEGATRAIN" eval "$WORK/split" 2> "$WORK/note.txt") || fail "eval of the split run alone: $(cat "$WORK/note.txt")"
[[ "$out" == "eval: loss $(printf '%.6f' "$want") over 2 batches of 8 x 64 tokens, the validation share of split 90,10,0 ("* ]] ||
  fail "eval of the split run alone: '$out', the run's eval_loss at step 4 is $want"
grep -qF -- "--data $WORK/english --split 90,10,0 (its data.train and data.split)" "$WORK/note.txt" ||
  fail "eval of the split run alone: $(cat "$WORK/note.txt")"
status=0; "$MEGATRAIN" eval "$WORK/split" --test > /dev/null 2> "$WORK/note.txt" || status=$?
[[ $status -eq 2 ]] && grep -qF "eval: --test: the run of $WORK/split/checkpoints/iter_0000004 has no test data \
(no data.test, data.split 90,10,0; " "$WORK/note.txt" ||
  fail "--test on a run with no test share: exit $status: $(cat "$WORK/note.txt")"
# ... a --split given is the one read: with a test share, its data.train's
out=$("$MEGATRAIN" eval "$WORK/split" --split 90,5,5 --test 2> "$WORK/note.txt") ||
  fail "--split 90,5,5 --test on the split run: $(cat "$WORK/note.txt")"
[[ "$out" == *", the test share of split 90,5,5 ("* ]] && grep -qF -- "--data $WORK/english (its data.train)" \
  "$WORK/note.txt" || fail "--split 90,5,5 --test on the split run: '$out' $(cat "$WORK/note.txt")"
# ... and a --split with no validation share is that option's error, not the run's (which validated on 90,10,0)
status=0; "$MEGATRAIN" eval "$WORK/split" --split 100,0,0 > /dev/null 2> "$WORK/note.txt" || status=$?
[[ $status -eq 2 ]] && grep -qF "eval: --split: expected TRAIN,VALID,TEST weights with positive TRAIN and VALID" \
  "$WORK/note.txt" && ! grep -q "had no validation data" "$WORK/note.txt" ||
  fail "--split 100,0,0 on the split run: exit $status: $(cat "$WORK/note.txt")"
cp "$WORK/english.bin" "$WORK/other.bin" && cp "$WORK/english.idx" "$WORK/other.idx" # not what the run evaluated
"$MEGATRAIN" eval "$WORK/split" --data "$WORK/other" --batches 1 2> "$WORK/note.txt" > /dev/null
! grep -q "eval: note:" "$WORK/note.txt" || fail "a note for another dataset than the run's: $(cat "$WORK/note.txt")"
# a run that evaluated on a blend: eval scores one of its datasets alone, and a note says that is not its eval_loss;
# --data given twice is refused (the last would win, silently)
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/blend" --set train.steps=1 \
  --set optimizer.schedule.warmup_steps=1 --set checkpoint.async=false --set data.split=90,10,0 \
  --set "data.train=[{path: $WORK/english, weight: 0.5}, {path: $WORK/other, weight: 0.5}]" \
  --set train.eval_interval=1 --set train.eval_batches=1 > "$WORK/blend.log" 2>&1 ||
  { cat "$WORK/blend.log"; fail "the blended run failed"; }
"$MEGATRAIN" eval "$WORK/blend" --data "$WORK/other" --batches 1 2> "$WORK/note.txt" > /dev/null
grep -qF "eval: note: the run of $WORK/blend/checkpoints/iter_0000001 evaluated on a blend of 2 datasets (data.train); \
eval scores --data alone, so this is not its eval_loss (" "$WORK/note.txt" || fail "no note of the blend: $(cat "$WORK/note.txt")"
status=0; "$MEGATRAIN" eval "$WORK/blend" > /dev/null 2> "$WORK/note.txt" || status=$? # no --data: which one?
[[ $status -eq 2 ]] && grep -qF "eval: the run of $WORK/blend/checkpoints/iter_0000001 evaluated on a blend of 2 datasets \
(data.train; " "$WORK/note.txt" || fail "eval of the blended run alone: exit $status: $(cat "$WORK/note.txt")"
status=0
"$MEGATRAIN" eval "$WORK/blend" --data "$WORK/english" --data "$WORK/other" > /dev/null 2> "$WORK/note.txt" || status=$?
[[ $status -eq 2 ]] && grep -qF "eval: --data given twice (eval scores one dataset: a blend's datasets are evaluated one \
at a time)" "$WORK/note.txt" || fail "--data twice: exit $status: $(cat "$WORK/note.txt")"
"$MEGATRAIN" eval "$WORK/split" --data "$WORK/english" --split 90,10,0 --batches 2 --seq-len 64 --micro-batch-size 8 \
  2> "$WORK/note.txt" > /dev/null
! grep -q "eval: note:" "$WORK/note.txt" || fail "a note with the run's own settings: $(cat "$WORK/note.txt")"
[[ "$(echo "$whole" | awk '{print $3}')" != "$(printf '%.6f' "$want")" ]] ||
  fail "the whole dataset gave the validation share's loss: $whole"
"$MEGATRAIN" eval "$WORK/split" --data "$WORK/english" --split 90,10,0 --json > "$WORK/split.json" ||
  fail "eval --split --json failed"
grep -qF '"split":[90.0,10.0,0.0],"share":"valid",' "$WORK/split.json" || fail "--json lacks the split: $(cat "$WORK/split.json")"
# (90,10 is 90,10,0, as data.split pads a short split: the same share)
short=$("$MEGATRAIN" eval "$WORK/split" --data "$WORK/english" --split 90,10 --json) || fail "--split 90,10 refused"
[[ "$(sed 's/"split":[^]]*\],//' <<< "$short")" == "$(sed 's/"split":[^]]*\],//' "$WORK/split.json")" ]] ||
  fail "--split 90,10 differs from 90,10,0: $short"
for bad in 90,0,10 0,10,0 90 a,b,c 1e309,1,1 inf,1,0 1e308,1e308,0 90,10,0,1; do
  rc=0; "$MEGATRAIN" eval "$WORK/split" --data "$WORK/english" --split "$bad" > /dev/null 2> "$WORK/eval.err" || rc=$?
  [[ $rc -eq 2 ]] && grep -qF "eval: --split: expected TRAIN,VALID,TEST weights with positive TRAIN and VALID" \
    "$WORK/eval.err" || fail "--split $bad: exit $rc, $(cat "$WORK/eval.err")"
done

# 1e. the test share (data.split's third, a run's test_loss after its last step): --split with --test gives it;
# a --split with --test needs a test share; --test without --split scores all of --data as test data (data.test:
# test_data_test.sh), another sample order than the validation data's
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/test-share" --set train.steps=4 \
  --set optimizer.schedule.warmup_steps=2 --set checkpoint.interval=4 --set checkpoint.async=false \
  --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set data.split=85,10,5 \
  --set train.eval_interval=4 --set train.eval_batches=2 > "$WORK/test-share.log" 2>&1 ||
  { cat "$WORK/test-share.log"; fail "the test-share run failed"; }
want=$(grep -o '"test_loss":[^,}]*' "$WORK/test-share/metrics.jsonl" | cut -d: -f2)
[[ -n "$want" ]] || fail "the run with a test share logged no test_loss"
out=$("$MEGATRAIN" eval "$WORK/test-share" --data "$WORK/english" --split 85,10,5 --test --batches 2 --seq-len 64 \
  --micro-batch-size 8) || fail "eval --split --test exited non-zero"
[[ "$out" == "eval: loss $(printf '%.6f' "$want") over 2 batches of 8 x 64 tokens, the test share of split 85,10,5 ("* ]] ||
  fail "eval --split --test: '$out', the run's test_loss is $want"
rc=0
"$MEGATRAIN" eval "$WORK/test-share" --data "$WORK/english" --split 90,10,0 --test > /dev/null 2> "$WORK/eval.err" || rc=$?
[[ $rc -eq 2 ]] && grep -qE "positive TRAIN and TEST" "$WORK/eval.err" ||
  fail "eval --split 90,10,0 --test: exit $rc, $(cat "$WORK/eval.err")"
whole=$("$MEGATRAIN" eval "$WORK/test-share" --data "$WORK/english" --batches 2 2> /dev/null) || fail "eval --data"
as_test=$("$MEGATRAIN" eval "$WORK/test-share" --data "$WORK/english" --batches 2 --test --json 2> /dev/null) ||
  fail "eval --data --test"
[[ $as_test == *'"split":null,"share":"test"'* ]] || fail "eval --data --test --json: $as_test"
as_test=$("$MEGATRAIN" eval "$WORK/test-share" --data "$WORK/english" --batches 2 --test 2> /dev/null)
[[ $as_test == *", as test data ("* && ${as_test%% over*} != "${whole%% over*}" ]] ||
  fail "eval --data --test: '$as_test' should say test data and score other samples than '$whole'"

# 2. an earlier checkpoint of the same run gives a different (higher) loss: the weights are really loaded
out5=$("$MEGATRAIN" eval "$run/checkpoints/iter_0000005" --data "$WORK/english" --batches 3 --seq-len 64 \
  --micro-batch-size 8) || fail "eval of iter_0000005 exited non-zero"
loss5=$(echo "$out5" | awk '{print $3}')
awk -v a="$loss5" -v b="$loss" 'BEGIN { exit !(a > b) }' || fail "step 5 loss $loss5 is not above step 10 loss $loss"

# 3. the defaults, for a checkpoint without a run's recipe (a conversion's): 8 batches of 4 x 256 tokens, --data needed
"$MEGATRAIN" convert "$ckpt" "$WORK/hf" > /dev/null && "$MEGATRAIN" convert "$WORK/hf" "$WORK/conv" > /dev/null ||
  fail "the conversions for a checkpoint without a recipe failed"
out=$("$MEGATRAIN" eval "$WORK/conv" --data="$WORK/english" 2> "$WORK/conv.err") ||
  fail "eval with default options exited non-zero: $(cat "$WORK/conv.err")"
[[ "$out" =~ ^eval:\ loss\ [0-9]+\.[0-9]{6}\ over\ 8\ batches\ of\ 4\ x\ 256\ tokens\ \(.*\)$ && ! -s "$WORK/conv.err" ]] \
  || fail "unexpected output line with defaults: $out $(cat "$WORK/conv.err")"

# 4. errors name what is missing or wrong, exit non-zero, print no result line
expect_error() { # STATUS NEEDLE ARGS...: exit status STATUS and NEEDLE in stderr
  local status=$1 needle=$2; shift 2
  local rc=0
  "$MEGATRAIN" eval "$@" > "$WORK/err.out" 2> "$WORK/err.txt" || rc=$?
  [[ $rc -eq $status ]] || fail "eval $*: exit status $rc, expected $status ($(cat "$WORK/err.txt"))"
  grep -qF -- "$needle" "$WORK/err.txt" || fail "eval $*: message does not name '$needle': $(cat "$WORK/err.txt")"
  [[ ! -s "$WORK/err.out" ]] || fail "eval $*: printed a result on error: $(cat "$WORK/err.out")"
}
# a path the command line names that is not there: usage (exit 2), as every command's
expect_error 2 "$WORK/no-such-ckpt" "$WORK/no-such-ckpt" --data "$WORK/english"
expect_error 2 "eval: --data: $WORK/no-such-data.idx: cannot open" "$ckpt" --data "$WORK/no-such-data"
mkdir "$WORK/empty-dir"
expect_error 1 "$WORK/empty-dir" "$WORK/empty-dir" --data "$WORK/english"
expect_error 2 "eval: --data PREFIX is required: $WORK/conv is no run's checkpoint with one dataset to evaluate on" \
  "$WORK/conv"
# a batch that cannot fit is refused before anything is allocated (an allocator failure, or the OOM killer, before),
# naming the options: 65536 x 256 tokens need about 130 GiB (skipped on a host with that much memory and swap)
if (( $(awk '/^(MemTotal|SwapTotal):/ { kb += $2 } END { print int(kb / 1048576) }' /proc/meminfo) < 120 )); then
  expect_error 2 "eval: --micro-batch-size 65536 x --seq-len 256: the model and its batch need about" "$ckpt" \
    --data "$WORK/english" --batches 1 --micro-batch-size 65536 --seq-len 256
fi
expect_error 2 "--batches" "$ckpt" --data "$WORK/english" --batches zero
expect_error 2 "--seq-len" "$ckpt" --data "$WORK/english" --seq-len -3
expect_error 2 "--seq-len: expected at most the model's max_position_embeddings (256), found 257" "$ckpt" \
  --data "$WORK/english" --seq-len 257
! grep -q "the default" "$WORK/err.txt" || fail "an explicit --seq-len called the default: $(cat "$WORK/err.txt")"
# the default --seq-len (256) beyond a model's positions: the message says it was the default
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/short-ctx" --set model.max_position_embeddings=128 \
  --set train.steps=1 --set optimizer.schedule.warmup_steps=0 --set "data.train=[{path: $WORK/english, weight: 1.0}]" \
  > /dev/null 2>&1 || fail "the run of a model with 128 positions failed"
# a run's checkpoint takes the run's seq_len; without a recipe (converted) the default, which is too long here
"$MEGATRAIN" eval "$WORK/short-ctx" --data "$WORK/english" > /dev/null 2>&1 || fail "eval of the 128-position run"
"$MEGATRAIN" convert "$WORK/short-ctx" "$WORK/short-hf" > /dev/null &&
  "$MEGATRAIN" convert "$WORK/short-hf" "$WORK/short-conv" > /dev/null || fail "converting the 128-position model"
expect_error 2 "found 256 (the default: give --seq-len, e.g. the run's train.seq_len)" "$WORK/short-conv" \
  --data "$WORK/english"
expect_error 2 "--bogus" "$ckpt" --data "$WORK/english" --bogus 1
expect_error 2 "--device: expected cpu or cuda, found 'tpu'" "$ckpt" --data "$WORK/english" --device tpu
# a dataset with ids outside the model's vocabulary (half its documents: late_bad_data) is refused at the first batch
# that reads one, with a run's message: the dataset, the token, its sequence and place, how to inspect it
late_bad_data "$WORK/late" 4096
expect_error 1 "eval: $WORK/late: token 300 (token " "$ckpt" --data "$WORK/late" --batches 4
grep -qE "of sequence [0-9]+\) is outside the model's vocabulary \[0, 256\): was the dataset built with another \
tokenizer than the model's\? \(\`megatrain data inspect $WORK/late --tokenizer MODEL_DIR\` shows its ids\)$" \
  "$WORK/err.txt" || fail "eval of data outside the vocabulary: $(cat "$WORK/err.txt")"
# without a GPU, --device cuda fails cleanly: a CPU-only build says how to get a CUDA one, a CUDA build names the
# device it lacks
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi > /dev/null 2>&1; then
  expect_error 1 "eval (--device cuda): " "$ckpt" --data "$WORK/english" --device cuda
fi

# 5. SFT data: prompt/completion records (prompt masked), short enough for packed rows of 64 positions
python3 - "$WORK/chat.jsonl" <<'PY'
import json, random, sys
rng = random.Random(5)
words = "the a cat dog sat on mat ran far quick brown fox jumps".split()
with open(sys.argv[1], "w") as f:
    for i in range(120):
        prompt = " ".join(rng.choice(words) for _ in range(rng.randint(1, 6)))
        completion = " ".join(rng.choice(words) for _ in range(rng.randint(1, 5 if i % 3 else 1)))
        f.write(json.dumps({"prompt": prompt, "completion": completion}) + "\n")
PY
"$MEGATRAIN" data build --format sft --input "$WORK/chat.jsonl" --output "$WORK/sft" > "$WORK/build.log" 2>&1 \
  || { cat "$WORK/build.log"; fail "data build --format sft failed"; }
[[ -f "$WORK/sft_mask.idx" ]] || fail "data build --format sft wrote no loss mask"
for ext in bin idx; do cp "$WORK/sft.$ext" "$WORK/nomask.$ext"; done # the same tokens, every target counted
SFT_EVAL=(--batches 3 --seq-len 64 --micro-batch-size 2 --seed 77)

# sft_case NAME PACK LOSS: a run evaluating at its last step (4) on the SFT data; eval of its checkpoint with the
# run's settings prints its eval_loss, says the loss mask, and differs without the mask and with the other --loss.
sft_case() {
  local name=$1 pack=$2 loss=$3 other=per_token
  [[ $loss == per_token ]] && other=per_micro_batch
  local opts=("${SFT_EVAL[@]}" --loss "$loss")
  [[ $pack == true ]] && opts+=(--pack)
  "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/$name" --set run.seed=77 \
    --set train.steps=4 --set optimizer.schedule.warmup_steps=1 --set checkpoint.interval=4 \
    --set checkpoint.async=false --set train.micro_batch_size=2 \
    --set "train.batch_schedule=[{step: 0, global_batch_size: 4}]" --set train.eval_interval=4 \
    --set train.eval_batches=3 --set train.loss="$loss" --set data.pack="$pack" --set logging.interval=1 \
    --set "data.train=[{path: $WORK/sft, weight: 1.0}]" --set "data.valid=[{path: $WORK/sft, weight: 1.0}]" \
    > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name: the run failed"; }
  local want
  want=$(grep '"step":4[,}]' "$WORK/$name/metrics.jsonl" | grep -o '"eval_loss":[^,}]*' | cut -d: -f2)
  [[ -n "$want" ]] || fail "$name: the run logged no eval_loss at step 4"
  local out
  out=$("$MEGATRAIN" eval "$WORK/$name" --data "$WORK/sft" "${opts[@]}" 2> "$WORK/eval.err") \
    || { cat "$WORK/eval.err"; fail "$name: eval exited non-zero"; }
  echo "$name: $out (the run's eval_loss $want)"
  local re='^eval: loss ([0-9]+\.[0-9]{6}) over 3 batches of 2 x 64 tokens'
  [[ $pack == true ]] && re+=', packed'
  re+=', loss mask: ([0-9.]+)% of targets counted'
  [[ $loss == per_token ]] && re+=', per-token mean'
  re+=' \('"$WORK/$name"'/checkpoints/iter_0000004\)$'
  [[ "$out" =~ $re ]] || fail "$name: unexpected line: $out"
  local got=${BASH_REMATCH[1]} share=${BASH_REMATCH[2]}
  [[ "$(printf '%.6f' "$want")" == "$got" ]] || fail "$name: eval says $got, the run's eval_loss at step 4 is $want"
  awk -v p="$share" 'BEGIN { exit !(p > 0 && p < 100) }' || fail "$name: $share% of targets counted: the mask?"
  local json
  json=$("$MEGATRAIN" eval "$WORK/$name" --data "$WORK/sft" "${opts[@]}" --json) || fail "$name: --json failed"
  [[ "$json" =~ \"loss_reduction\":\"$loss\",\"pack\":$pack,\"masked\":true,\"counted\":([0-9]+)\}$ ]] \
    || fail "$name: --json: unexpected object: $json"
  awk -v c="${BASH_REMATCH[1]}" -v p="$share" 'BEGIN { d = 100 * c / 384 - p; exit !(d < 0.05 && d > -0.05) }' \
    || fail "$name: --json counts ${BASH_REMATCH[1]} of 384 targets, the line says $share%"
  # teeth: the same tokens scored on every target, and the other reduction, give other losses
  local nomask
  nomask=$("$MEGATRAIN" eval "$WORK/$name" --data "$WORK/nomask" "${opts[@]}" 2> /dev/null | awk '{print $3}')
  [[ -n "$nomask" && "$nomask" != "$got" ]] || fail "$name: without the mask the loss is '$nomask', as with it"
  local reduced
  reduced=$("$MEGATRAIN" eval "$WORK/$name" --data "$WORK/sft" "${opts[@]}" --loss "$other" 2> /dev/null \
    | awk '{print $3}')
  echo "$name: without the mask $nomask, --loss $other $reduced"
  [[ -n "$reduced" && "$reduced" != "$got" ]] || fail "$name: --loss $other gives '$reduced', as --loss $loss"
}
sft_case sft_token false per_token
sft_case sft_packed true per_token
sft_case sft_micro false per_micro_batch

# 5b. packing: an overlong document is an error naming the options (as data.pack_overlong), or truncated
expect_error 1 "--pack-overlong" "$WORK/sft_packed" --data "$WORK/sft" --pack --seq-len 8
out=$("$MEGATRAIN" eval "$WORK/sft_packed" --data "$WORK/sft" --pack --pack-overlong truncate --seq-len 8 --batches 8 \
  --micro-batch-size 4 2> "$WORK/trunc.err") || { cat "$WORK/trunc.err"; fail "--pack-overlong truncate exited non-zero"; }
grep -q "truncated" "$WORK/trunc.err" || fail "--pack-overlong truncate: no warning of truncated documents"
[[ "$out" =~ ^eval:\ loss\ [0-9.]+\ over\ 8\ batches\ of\ 4\ x\ 8\ tokens,\ packed,\ loss\ mask: ]] \
  || fail "--pack-overlong truncate: unexpected line: $out"
# ... and when the truncation leaves no counted target (every completion past the first 9 tokens), no loss: an error
# (it printed loss 0 and exited 0)
printf '{"prompt": "a long prompt of many bytes", "completion": "x"}\n%.0s' 1 2 3 > "$WORK/past9.jsonl"
"$MEGATRAIN" data build --format sft --input "$WORK/past9.jsonl" --output "$WORK/past9" > /dev/null
expect_error 1 "eval: no target counted in the 2 batches of 4 x 8 tokens" "$WORK/sft_packed" --data "$WORK/past9" \
  --pack --pack-overlong truncate --seq-len 8 --batches 2 --micro-batch-size 4

# 5e. more batches than the validation set holds: they wrap around and the loss counts some samples twice; eval and
# a run's setup warn, naming the numbers and the batches that read each sample once (none at that many)
"$MEGATRAIN" eval "$WORK/sft_packed" --data "$WORK/sft" --pack --seq-len 64 --micro-batch-size 2 --batches 100 \
  > /dev/null 2> "$WORK/repeat.err" || { cat "$WORK/repeat.err"; fail "eval --batches 100 exited non-zero"; }
re="warning: eval: --data $WORK/sft holds ([0-9]+) packed rows; --batches 100 x --micro-batch-size 2 reads 200, so "
re+="([0-9]+) are read again and the loss counts their tokens twice or more: --batches ([0-9]+) reads"
[[ "$(cat "$WORK/repeat.err")" =~ $re ]] || fail "eval --batches 100: no warning of repeated rows: $(cat "$WORK/repeat.err")"
rows=${BASH_REMATCH[1]}
[[ ${BASH_REMATCH[2]} == $((200 - rows)) && ${BASH_REMATCH[3]} == $((rows / 2)) ]] \
  || fail "eval --batches 100: the numbers of $rows rows: $(cat "$WORK/repeat.err")"
"$MEGATRAIN" eval "$WORK/sft_packed" --data "$WORK/sft" --pack --seq-len 64 --micro-batch-size 2 \
  --batches $((rows / 2)) > /dev/null 2> "$WORK/once.err" || fail "eval --batches $((rows / 2)) exited non-zero"
! grep -q "read again" "$WORK/once.err" || fail "eval --batches $((rows / 2)) of $rows rows: $(cat "$WORK/once.err")"
! grep -q "read again" "$WORK/sft_packed.log" || fail "a warning of repeated rows for 3 x 2 of $rows: $(grep warning "$WORK/sft_packed.log")"
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/repeat_run" --set train.steps=1 --set optimizer.schedule.warmup_steps=1 \
  --set checkpoint.interval=0 --set train.micro_batch_size=2 --set "train.batch_schedule=[{step: 0, global_batch_size: 2}]" \
  --set train.eval_interval=1 --set train.eval_batches=$((rows / 2 + 1)) --set data.pack=true \
  --set "data.train=[{path: $WORK/sft, weight: 1.0}]" --set "data.valid=[{path: $WORK/sft, weight: 1.0}]" \
  > "$WORK/repeat_run.log" 2>&1 || { cat "$WORK/repeat_run.log"; fail "the run with more eval batches failed"; }
grep -qF "warning: data.valid holds $rows packed rows; train.eval_batches $((rows / 2 + 1)) x train.micro_batch_size 2 reads $((rows / 2 * 2 + 2)), so $((rows / 2 * 2 + 2 - rows)) are read again and eval_loss counts their tokens twice or more: train.eval_batches $((rows / 2))" \
  "$WORK/repeat_run.log" || fail "the run: no warning of repeated rows: $(grep warning "$WORK/repeat_run.log")"
[[ $(grep -c "read again" "$WORK/repeat_run.log") == 1 ]] || fail "the run warned of repeated rows more than once"

# 5c. bad values of the new options: exit 2 naming the option
expect_error 2 "--loss: expected per_micro_batch or per_token, found 'mean'" "$ckpt" --data "$WORK/sft" --loss mean
expect_error 2 "--pack-overlong: expected error or truncate, found 'drop'" "$ckpt" --data "$WORK/sft" --pack \
  --pack-overlong drop
expect_error 2 "--pack-overlong: only with --pack" "$ckpt" --data "$WORK/sft" --pack-overlong truncate
expect_error 2 "--loss needs a value" "$ckpt" --data "$WORK/sft" --loss
expect_error 2 "unknown option '--pack=true'" "$ckpt" --data "$WORK/sft" --pack=true

# 5d. the cuda build refuses packing and per_token (as run.device: cuda does) before touching a GPU: exit 2
if [[ -x "$REPO/build/cuda/megatrain" ]]; then
  # (the run packed, per token: each refusal alone, the other setting given otherwise)
  MEGATRAIN="$REPO/build/cuda/megatrain" expect_error 2 "eval (--device cuda --pack): data.pack" \
    "$WORK/sft_packed" --data "$WORK/sft" --device cuda --pack --loss per_micro_batch
  MEGATRAIN="$REPO/build/cuda/megatrain" expect_error 2 "eval (--device cuda --loss per_token): train.loss" \
    "$WORK/sft_packed" --data "$WORK/sft" --device cuda --no-pack --loss per_token
  # taken from the run, both are named
  MEGATRAIN="$REPO/build/cuda/megatrain" expect_error 2 "eval (--device cuda --pack --loss per_token): " \
    "$WORK/sft_packed" --device cuda
else
  echo "no build/cuda/megatrain: the cuda refusal of --pack and per_token is not checked here"
fi
# the settings and the note for the checkpoint of an expert-parallel run (it reloads the run's recipe, whose ep needs dp >= ep: the
# note was silently left out)
if command -v mpirun > /dev/null; then
  OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 "$MEGATRAIN" run "$REPO/recipes/tiny/qwen3_moe.yaml" \
    --set run.dir="$WORK/moe-ep2" --set train.steps=2 --set optimizer.schedule.warmup_steps=1 --set parallel.ep=2 \
    --set train.micro_batch_size=4 --set train.eval_interval=2 --set train.eval_batches=1 \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]" > "$WORK/moe-ep2.log" 2>&1 ||
    { cat "$WORK/moe-ep2.log"; fail "the ep 2 run failed"; }
  "$MEGATRAIN" eval "$WORK/moe-ep2" --data "$WORK/english" --batches 1 2> "$WORK/note.txt" > /dev/null
  grep -qF "its eval_loss is this command with --split 98,2,0 (" "$WORK/note.txt" &&
    grep -qF "eval: the run's settings ($WORK/moe-ep2/checkpoints/iter_0000002/recipe.yaml): --seq-len 64" \
    "$WORK/note.txt" || fail "no note of the ep 2 run's settings: $(cat "$WORK/note.txt")"
fi
echo "ok"
