#!/usr/bin/env bash
# test_fifo_inputs.sh: a FIFO (named pipe) where megatrain expects a regular
# input file (a Hugging Face model's files, a recipe, a checkpoint's files, an
# indexed dataset, a tokenizer) is refused at once with an error naming it and
# exit status 1 or 2; it is never opened for a blocking read, which would wait
# forever for a writer. A FIFO as a run's latest-checkpoint pointer is ignored
# with a warning (as a damaged pointer is), and resume goes on. A FIFO as the
# run's metrics.jsonl (an output) is refused too, by run and by resume.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
FIX="$REPO/tests/fixtures/hf"
[[ -f "$FIX/llama_tied/config.json" && -f "$FIX/llama3_export/tokenizer.json" ]] ||
  { echo "no Hugging Face fixtures in $FIX"; exit 77; }
cd "$WORK"

# expect_fifo_refused FIFO CMD [ARGS...]: CMD ends within 20 s with exit status 1
# or 2 and a "megatrain: error:" line that names FIFO as a FIFO.
expect_fifo_refused() {
  local fifo=$1 status=0
  shift
  [[ -p $fifo ]] || fail "setup: $fifo is not a FIFO"
  timeout 20 "$@" > "$WORK/stdout" 2> "$WORK/stderr" || status=$?
  [[ $status != 124 ]] || fail "$*: blocked on the FIFO $fifo (killed after 20 s)"
  [[ $status == 1 || $status == 2 ]] || fail "$*: exit status $status, expected 1 or 2; stderr: $(cat "$WORK/stderr")"
  grep -qF "megatrain: error: " "$WORK/stderr" || fail "$*: no error line; stderr: $(cat "$WORK/stderr")"
  grep -qF "$fifo: is a FIFO, expected " "$WORK/stderr" ||
    fail "$*: the error should name the FIFO $fifo; stderr: $(cat "$WORK/stderr")"
}

# fifo_copy SRC DST FILE: DST is a copy of the directory SRC with FILE replaced by a FIFO.
fifo_copy() {
  cp -r "$1" "$2"
  rm -f "$2/$3"
  mkfifo "$2/$3"
}

# --- convert: a Hugging Face directory ------------------------------------------
fifo_copy "$FIX/llama_tied" hf_weights model.safetensors
expect_fifo_refused hf_weights/model.safetensors "$MEGATRAIN" convert hf_weights out1
fifo_copy "$FIX/llama_tied" hf_config config.json
expect_fifo_refused hf_config/config.json "$MEGATRAIN" convert hf_config out2
fifo_copy "$FIX/llama3_export" hf_index model.safetensors.index.json
expect_fifo_refused hf_index/model.safetensors.index.json "$MEGATRAIN" convert hf_index out3
fifo_copy "$FIX/llama3_export" hf_shard model-00002-of-00005.safetensors
expect_fifo_refused hf_shard/model-00002-of-00005.safetensors "$MEGATRAIN" convert hf_shard out4
fifo_copy "$FIX/llama3_export" hf_tokenizer tokenizer.json
expect_fifo_refused hf_tokenizer/tokenizer.json "$MEGATRAIN" convert hf_tokenizer out5
for out in out1 out2 out3 out4 out5; do [[ ! -e $out ]] || fail "convert left $out behind"; done

# --- plan / run: the recipe -----------------------------------------------------
mkfifo recipe.yaml
expect_fifo_refused recipe.yaml "$MEGATRAIN" plan recipe.yaml
expect_fifo_refused recipe.yaml "$MEGATRAIN" run recipe.yaml

# --- a checkpoint's files: inspect, convert back to Hugging Face --------------------
"$MEGATRAIN" convert "$FIX/llama3_export" ck > /dev/null 2>&1 || fail "convert $FIX/llama3_export failed"
[[ -f ck/metadata.mtck && -f ck/model.yaml && -f ck/shard_00000.zst && -f ck/tokenizer.json ]] ||
  fail "unexpected checkpoint layout: $(ls ck)"
fifo_copy ck ck_meta metadata.mtck
expect_fifo_refused ck_meta/metadata.mtck "$MEGATRAIN" inspect ck_meta
expect_fifo_refused ck_meta/metadata.mtck "$MEGATRAIN" convert ck_meta back1
fifo_copy ck ck_model model.yaml
expect_fifo_refused ck_model/model.yaml "$MEGATRAIN" inspect ck_model
expect_fifo_refused ck_model/model.yaml "$MEGATRAIN" convert ck_model back2
fifo_copy ck ck_shard shard_00000.zst
expect_fifo_refused ck_shard/shard_00000.zst "$MEGATRAIN" inspect ck_shard
expect_fifo_refused ck_shard/shard_00000.zst "$MEGATRAIN" convert ck_shard back3
fifo_copy ck ck_tok tokenizer.json
expect_fifo_refused ck_tok/tokenizer.json "$MEGATRAIN" inspect ck_tok

# --- an indexed dataset: data inspect, eval --data --------------------------------
printf 'hello\nworld\n' > text.txt
"$MEGATRAIN" data build --input text.txt --output data/t > /dev/null 2>&1 || fail "data build failed"
mkdir idx_fifo bin_fifo
cp data/t.bin idx_fifo/
mkfifo idx_fifo/t.idx
cp data/t.idx bin_fifo/
mkfifo bin_fifo/t.bin
expect_fifo_refused idx_fifo/t.idx "$MEGATRAIN" data inspect idx_fifo/t
expect_fifo_refused bin_fifo/t.bin "$MEGATRAIN" data inspect bin_fifo/t
expect_fifo_refused idx_fifo/t.idx "$MEGATRAIN" eval ck --data idx_fifo/t --seq-len 8
expect_fifo_refused bin_fifo/t.bin "$MEGATRAIN" eval ck --data bin_fifo/t --seq-len 8

# --- data build --tokenizer -------------------------------------------------------
mkdir tok_json tok_config
mkfifo tok_json/tokenizer.json
expect_fifo_refused tok_json/tokenizer.json "$MEGATRAIN" data build --input text.txt --output built/a --tokenizer tok_json
expect_fifo_refused tok_json/tokenizer.json "$MEGATRAIN" data build --input text.txt --output built/b \
  --tokenizer tok_json/tokenizer.json
cp "$FIX/llama3_export/tokenizer.json" tok_config/
mkfifo tok_config/tokenizer_config.json
expect_fifo_refused tok_config/tokenizer_config.json "$MEGATRAIN" data build --input text.txt --output built/c \
  --tokenizer tok_config
[[ ! -e built ]] || [[ -z $(ls -A built) ]] || fail "data build left files behind: $(ls -A built)"

# --- resume: a run's latest-checkpoint pointer -------------------------------------
# Not an error: like a pointer that holds no step number, it is ignored with a
# warning naming it, and the newest checkpoint directory is used.
demo_data "$WORK/english"
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/run" --set train.steps=2 \
  --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set optimizer.schedule.warmup_steps=1 \
  --set checkpoint.interval=2 > "$WORK/run.log" 2>&1 || fail "the tiny run failed: $(tail -n 3 "$WORK/run.log")"
pointer="$WORK/run/checkpoints/latest_checkpointed_iteration.txt"
[[ -f $pointer ]] || fail "the run wrote no $pointer"
rm "$pointer"
mkfifo "$pointer"
status=0
timeout 60 "$MEGATRAIN" resume "$WORK/run" --set train.steps=3 > "$WORK/resume.log" 2>&1 || status=$?
[[ $status != 124 ]] || fail "resume blocked on the FIFO $pointer (killed after 60 s)"
[[ $status == 0 ]] || fail "resume: exit status $status: $(tail -n 3 "$WORK/resume.log")"
grep -qF "warning: $pointer holds nothing readable (it is a FIFO), not a step number; ignoring it" "$WORK/resume.log" ||
  fail "no warning naming the FIFO $pointer: $(head -n 3 "$WORK/resume.log")"
grep -q "resume: from .*iter_0000002 at step 2" "$WORK/resume.log" || fail "did not resume from step 2"

# an output that is a FIFO: the run's metrics.jsonl (written by run, read and rewritten by resume) is refused, not
# opened to block forever for a reader
mkfifo "$WORK/run/metrics.jsonl.fifo"
rm "$WORK/run/metrics.jsonl" && mv "$WORK/run/metrics.jsonl.fifo" "$WORK/run/metrics.jsonl"
expect_fifo_refused "$WORK/run/metrics.jsonl" "$MEGATRAIN" resume "$WORK/run" --set train.steps=4
mkdir -p "$WORK/fresh" && mkfifo "$WORK/fresh/metrics.jsonl"
expect_fifo_refused "$WORK/fresh/metrics.jsonl" "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" \
  --set run.dir="$WORK/fresh" --set train.steps=2 --set "data.train=[{path: $WORK/english, weight: 1.0}]" \
  --set optimizer.schedule.warmup_steps=1
echo "PASS test_fifo_inputs"
