#!/usr/bin/env bash
# test_data_test.sh: data.test (Megatron's --test-data-path): test data of its own, scored as test_loss after the
# last step.
# - a run with data.test (another dataset than data.train) logs test_loss after the last step; `megatrain eval
#   RUN --test` takes the run's data.test and prints that loss, as does `eval CKPT --data PREFIX --test` with the
#   run's settings (PREFIX whole, as data.test);
# - with train.eval_batches all, dp 2 under mpirun gives the single rank's test_loss (each test sample once);
# - a resume gives the uninterrupted run's test_loss; one with another data.test is warned, as is one whose
#   data.test was rebuilt (its test_loss alone, not the training); data.test = data.train is noted; a relative
#   data.test is written absolute (a resume from another directory reads it);
# - Megatron's names: test_data_path is answered with data.test;
# - refused (exit 2, naming the keys): data.test beside a data.split test share; a data.test prefix that does not
#   exist (naming data.test[0]); `eval RUN --test` of a run with neither data.test nor a test share;
# - a run with data.test and evaluation off is told data.test is not read.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
"$MEGATRAIN" data build --input "$REPO/README.md" --output "$WORK/readme" --tokenizer byte > /dev/null 2>&1 \
  || fail "data build of README.md failed"
COMMON=(--set train.steps=4 --set optimizer.schedule.warmup_steps=1 --set "data.train=[$WORK/english]"
        --set "data.test=[$WORK/readme]" --set train.eval_interval=4 --set train.eval_batches=3
        --set checkpoint.async=false --set logging.tensorboard=false)
run() { "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$1" "${COMMON[@]}" "${@:2}"; }

run "$WORK/one" > "$WORK/one.log" 2>&1 || { cat "$WORK/one.log"; fail "the run with data.test failed"; }
test_loss=$(json_field "$WORK/one/metrics.jsonl" test_loss)
[[ $(wc -w <<< "$test_loss") -eq 1 && $(tail -n 1 "$WORK/one/metrics.jsonl") == *'"test_loss":'* ]] \
  || fail "expected one test_loss, after the last step: $(cat "$WORK/one/metrics.jsonl")"
eval_loss=$(json_field "$WORK/one/metrics.jsonl" eval_loss)
[[ -n $eval_loss && $eval_loss != "$test_loss" ]] || fail "eval_loss '$eval_loss' (data.split's share of english) \
should differ from test_loss '$test_loss' (README.md)"

# eval takes the run's data.test; its 6 decimals are the run's test_loss rounded
want=$(printf '%.6f' "$test_loss")
out=$("$MEGATRAIN" eval "$WORK/one" --test 2> "$WORK/eval.err") || { cat "$WORK/eval.err"; fail "eval --test failed"; }
[[ $out == "eval: loss $want over 3 batches of "* ]] || fail "eval RUN --test: '$out', expected the run's test_loss $want"
grep -q -- "--data $WORK/readme (its data.test)" "$WORK/eval.err" || fail "eval does not say it took data.test: $(cat "$WORK/eval.err")"
seq_len=$(grep -o 'seq_len: [0-9]*' "$WORK/one/recipe.yaml" | head -1 | cut -d' ' -f2)
mbs=$(grep -o 'micro_batch_size: [0-9]*' "$WORK/one/recipe.yaml" | head -1 | cut -d' ' -f2)
out=$("$MEGATRAIN" eval "$WORK/one/checkpoints/iter_0000004" --data "$WORK/readme" --test --batches 3 \
  --seq-len "$seq_len" --micro-batch-size "$mbs" --seed 1234 2> "$WORK/eval2.err") || { cat "$WORK/eval2.err"; fail "eval --data --test failed"; }
[[ $out == "eval: loss $want over 3 batches of "* ]] || fail "eval --data README --test: '$out', expected $want"

# a run stopped after step 2 and resumed gives the uninterrupted run's test_loss bit for bit; a resume that points
# data.test elsewhere is told its test_loss scores other samples
run "$WORK/part" --set train.exit_interval=2 > /dev/null 2>&1 || fail "the run stopped at step 2 failed"
"$MEGATRAIN" resume "$WORK/part" > "$WORK/resume.log" 2>&1 || { cat "$WORK/resume.log"; fail "resume failed"; }
[[ $(json_field "$WORK/part/metrics.jsonl" test_loss) == "$test_loss" ]] \
  || fail "the resumed run's test_loss $(json_field "$WORK/part/metrics.jsonl" test_loss) is not $test_loss"
"$MEGATRAIN" resume "$WORK/part" --set train.steps=5 --set "data.test=[$WORK/english]" > "$WORK/moved.log" 2>&1 \
  || { cat "$WORK/moved.log"; fail "resume with another data.test failed"; }
grep -q "warning: resume: data.test\[0\] changes the test samples" "$WORK/moved.log" \
  || fail "no warning of the changed data.test: $(grep -i warn "$WORK/moved.log")"
grep -q "data.test\[0\] is data.train\[0\]" "$WORK/moved.log" || fail "no note that data.test is training data"
! grep -q "record of its data is" "$WORK/moved.log" || fail "the checkpoint's DATA record (with data.test) did not read back"

# a relative data.test is taken from the directory the run started in and written absolute, as data.train's: a
# resume from another directory opens the same test data (it failed: data.test[0].path taken from the new one)
mkdir -p "$WORK/start/corpus" "$WORK/elsewhere"
cp "$WORK"/readme.* "$WORK/start/corpus/"
(cd "$WORK/start" && run "$WORK/rel" --set "data.test=[corpus/readme]" --set train.exit_interval=2 > /dev/null 2>&1) \
  || fail "the run with a relative data.test failed"
grep -qF "{path: \"$WORK/start/corpus/readme\"" "$WORK/rel/recipe.yaml" \
  || fail "recipe.yaml keeps the relative data.test: $(grep -A1 ' test:' "$WORK/rel/recipe.yaml")"
(cd "$WORK/elsewhere" && "$MEGATRAIN" resume "$WORK/rel" > "$WORK/rel.log" 2>&1) \
  || { cat "$WORK/rel.log"; fail "the resume from another directory of a run with a relative data.test failed"; }
[[ $(json_field "$WORK/rel/metrics.jsonl" test_loss) == "$test_loss" ]] \
  || fail "the resume from elsewhere: test_loss $(json_field "$WORK/rel/metrics.jsonl" test_loss), expected $test_loss"

# a data.test dataset rebuilt with other contents at the same prefix feeds only test_loss: resume's warning says
# so, not that the run reads other samples (data.train's warning)
"$MEGATRAIN" data build --input "$REPO/README.md" --output "$WORK/rebuilt-test" --tokenizer byte > /dev/null 2>&1 \
  || fail "data build of README.md failed"
run "$WORK/rebuilt" --set "data.test=[$WORK/rebuilt-test]" --set train.exit_interval=2 > /dev/null 2>&1 \
  || fail "the run stopped at step 2 (rebuilt data.test) failed"
rm -f "$WORK"/rebuilt-test.*
"$MEGATRAIN" data build --input "$REPO/docs/data.md" --output "$WORK/rebuilt-test" --tokenizer byte > /dev/null 2>&1 \
  || fail "data build of docs/data.md failed"
"$MEGATRAIN" resume "$WORK/rebuilt" > "$WORK/rebuilt.log" 2>&1 || { cat "$WORK/rebuilt.log"; fail "resume (rebuilt data.test) failed"; }
grep "data.test dataset $WORK/rebuilt-test has changed" "$WORK/rebuilt.log" | grep -q "test_loss.*training is not affected" \
  || fail "the rebuilt data.test is not said to change test_loss alone: $(grep -i warn "$WORK/rebuilt.log")"

# every sample of data.test once: dp 2 equals one rank
if command -v mpirun > /dev/null; then
  run "$WORK/all1" --set train.eval_batches=all --set train.micro_batch_size=4 > "$WORK/all1.log" 2>&1 || { cat "$WORK/all1.log"; fail "eval_batches all, 1 rank"; }
  timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" \
    --set run.dir="$WORK/all2" "${COMMON[@]}" --set train.eval_batches=all --set train.micro_batch_size=4 > "$WORK/all2.log" 2>&1 \
    || { cat "$WORK/all2.log"; fail "eval_batches all, dp 2"; }
  compare test_loss "$WORK/all1/metrics.jsonl" "$WORK/all2/metrics.jsonl" > "$WORK/cmp.txt" \
    || fail "dp 2's test_loss is not the single rank's: $(cat "$WORK/cmp.txt")"
  grep -q "data.test" "$WORK/all1.log" || fail "the start does not say what train.eval_batches all is for data.test"
fi

refused() {  # refused WHAT PATTERN ARGS...: megatrain ARGS exits 2 saying PATTERN
  local what=$1 pattern=$2 rc=0
  "$MEGATRAIN" "${@:3}" > "$WORK/refused.log" 2>&1 || rc=$?
  [[ $rc -eq 2 ]] || { cat "$WORK/refused.log"; fail "$what: exit $rc, expected 2"; }
  grep -q -- "$pattern" "$WORK/refused.log" || fail "$what: no '$pattern' in: $(cat "$WORK/refused.log")"
}
TINY=(run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/refused" "${COMMON[@]}")
refused "data.test beside a test share" "data.split: its test share (1) and data.test both give test data" \
  "${TINY[@]}" --set "data.split=[98, 1, 1]"
refused "Megatron's name" "did you mean 'data.test'?" "${TINY[@]}" --set "data.test_data_path=[$WORK/readme]"
rc=0
"$MEGATRAIN" "${TINY[@]}" --set "data.test=[$WORK/nope]" > "$WORK/nope.log" 2>&1 || rc=$?
[[ $rc -ne 0 ]] && grep -q "test data: data.test\[0\].*nope" "$WORK/nope.log" \
  || fail "a missing data.test prefix: exit $rc, $(cat "$WORK/nope.log")"
run "$WORK/no-test" --set "data.test=null" > /dev/null 2>&1 || fail "the run without data.test failed"
refused "eval --test without test data" "has no test data (no data.test, data.split 98,2,0" eval "$WORK/no-test" --test

run "$WORK/off" --set train.eval_interval=0 > "$WORK/off.log" 2>&1 || fail "the run with evaluation off failed"
grep -q "data.test is given but evaluation is off" "$WORK/off.log" || fail "not told data.test is unread: $(grep -i warn "$WORK/off.log")"
! grep -q test_loss "$WORK/off/metrics.jsonl" || fail "evaluation off still wrote a test_loss"
echo ok
