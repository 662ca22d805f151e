#!/usr/bin/env bash
# test_convert_init_from.sh: fine-tuning from converted weights. A short run
# saves a checkpoint; `convert` takes the run directory to Hugging Face and
# back; a fresh run with `init_from:` that checkpoint starts from exactly its
# weights (the same first loss, bit for bit, as init_from the original
# checkpoint, and far below a run from random weights); a recipe model that
# differs from the checkpoint's, or a missing checkpoint, is refused; a Hugging Face directory named by init_from or
# eval says to convert it first.
# The tokenizer files and generation_config.json of the Hugging Face
# directory survive HF -> checkpoint -> run (init_from; async saves) ->
# resume -> HF byte for byte, in every checkpoint on the way, and the token
# ids the first run's recipe set (eos a list) reach the last config.json
# through a recipe that sets none; so does a bf16 model's dtype (model.export_dtype).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
"$MEGATRAIN" convert --help > /dev/null 2>&1 || { echo "skip: megatrain has no convert command (src/main.c)"; exit 77; }
demo_data "$WORK/english"
# the tiny byte-level model below carries another tokenizer's files on purpose (to test carrying them): the byte
# data opts out of the check against the model's tokenizer (docs/data.md) by losing its record
rm "$WORK/english.build.json"
DATA="data.train=[{path: $WORK/english, weight: 1.0}]"
# run DIR [--set ...]: tiny llama on the demo data, one log line per step.
run() {
  local dir=$1; shift
  "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$dir" --set "$DATA" --set logging.interval=1 \
    --set train.eval_interval=0 --set optimizer.schedule.warmup_steps=1 "$@"
}
first_loss() { json_field "$1/metrics.jsonl" loss | head -n 1; }

run "$WORK/a" --set train.steps=40 --set checkpoint.interval=40 --set checkpoint.async=false \
  --set model.bos_token_id=1 --set "model.eos_token_id=[2, 10]" > /dev/null
[[ -d "$WORK/a/checkpoints/iter_0000040" ]] || fail "the run saved no checkpoint at step 40"
"$MEGATRAIN" convert "$WORK/a" "$WORK/a.hf" > /dev/null       # a run directory: its newest checkpoint
tr -d ' \n' < "$WORK/a.hf/config.json" | grep -q '"bos_token_id":1,.*"eos_token_id":\[2,10\],' \
  || fail "a.hf/config.json lacks the recipe's token ids: $(cat "$WORK/a.hf/config.json")"
# as a Hugging Face directory comes: with its tokenizer and its own generation_config.json
for f in tokenizer.json tokenizer_config.json chat_template.jinja generation_config.json; do
  cp "$REPO/tests/fixtures/hf/llama3_export/$f" "$WORK/a.hf/$f"
done
printf 'sentencepiece \000\001\377 bytes' > "$WORK/a.hf/tokenizer.model"
printf '{"bos_token": "<s>"}' > "$WORK/a.hf/special_tokens_map.json"
"$MEGATRAIN" convert "$WORK/a.hf" "$WORK/a.ckpt" > /dev/null

run "$WORK/b" --set train.steps=1 --set init_from="$WORK/a.ckpt" > "$WORK/b.log"
run "$WORK/c" --set train.steps=1 --set init_from="$WORK/a/checkpoints/iter_0000040" > /dev/null
run "$WORK/d" --set train.steps=1 > /dev/null
b=$(first_loss "$WORK/b"); c=$(first_loss "$WORK/c"); d=$(first_loss "$WORK/d")
echo "first loss: init_from converted $b, init_from original $c, random init $d"
[[ -n "$b" && "$b" == "$c" ]] || fail "init_from the converted checkpoint gives loss $b, the original $c"
awk -v b="$b" -v d="$d" 'BEGIN { exit !(b < d - 0.5) }' || fail "init_from loss $b is not well below the random-init loss $d"
grep -q "^init_from: \"$WORK/a.ckpt\"" "$WORK/b/recipe.yaml" || fail "recipe.yaml does not record init_from"

# The carried files through a run (init_from, async saves every 2 steps), a resume and back to Hugging Face.
carried="chat_template.jinja generation_config.json special_tokens_map.json tokenizer.json tokenizer.model tokenizer_config.json"
run "$WORK/g" --set train.steps=4 --set checkpoint.interval=2 --set checkpoint.keep_last=5 \
  --set init_from="$WORK/a.ckpt" > /dev/null
"$MEGATRAIN" resume "$WORK/g" --set train.steps=6 > /dev/null
for step in 2 4 6; do
  iter=$(printf '%s/g/checkpoints/iter_%07d' "$WORK" $step)
  for f in $carried; do
    cmp "$WORK/a.hf/$f" "$iter/$f" || fail "$f differs in $(basename "$iter")"
  done
done
"$MEGATRAIN" convert "$WORK/g" "$WORK/g.hf" > /dev/null
[[ "$(ls "$WORK/g.hf" | tr '\n' ' ')" == "chat_template.jinja config.json generation_config.json model.safetensors \
special_tokens_map.json tokenizer.json tokenizer.model tokenizer_config.json " ]] || fail "g.hf holds $(ls "$WORK/g.hf")"
for f in $carried; do
  cmp "$WORK/a.hf/$f" "$WORK/g.hf/$f" || fail "$f differs after HF -> checkpoint -> run -> resume -> HF"
done
tr -d ' \n' < "$WORK/g.hf/config.json" | grep -q '"bos_token_id":1,.*"eos_token_id":\[2,10\],.*"pad_token_id":null,' \
  || fail "g.hf/config.json lacks the token ids of the checkpoint the run started from: $(cat "$WORK/g.hf/config.json")"

# A bf16 Hugging Face model comes back bf16 after a run from it and a resume (model.export_dtype auto takes the
# init_from checkpoint's, then the resumed one's); a recipe's export_dtype wins.
"$MEGATRAIN" convert "$WORK/a.ckpt" "$WORK/a16.hf" --dtype bf16 > /dev/null
"$MEGATRAIN" convert "$WORK/a16.hf" "$WORK/a16.ckpt" > /dev/null
run "$WORK/g16" --set train.steps=1 --set checkpoint.interval=1 --set init_from="$WORK/a16.ckpt" > /dev/null
"$MEGATRAIN" resume "$WORK/g16" --set train.steps=2 > /dev/null
grep -q "^export_dtype: bf16$" "$WORK/g16/checkpoints/iter_0000002/model.yaml" || fail "g16: export_dtype not carried on"
"$MEGATRAIN" convert "$WORK/g16" "$WORK/g16.hf" > /dev/null
grep -q '"torch_dtype": "bfloat16"' "$WORK/g16.hf/config.json" || fail "g16.hf: not bf16: $(cat "$WORK/g16.hf/config.json")"
[[ $(stat -c %s "$WORK/g16.hf/model.safetensors") -lt $(stat -c %s "$WORK/g.hf/model.safetensors") ]] \
  || fail "g16.hf's tensors are not smaller than fp32's"
run "$WORK/g32" --set train.steps=1 --set checkpoint.interval=1 --set init_from="$WORK/a16.ckpt" \
  --set model.export_dtype=fp32 > /dev/null
"$MEGATRAIN" convert "$WORK/g32" "$WORK/g32.hf" > /dev/null
grep -q '"torch_dtype": "float32"' "$WORK/g32.hf/config.json" || fail "g32.hf: the recipe's export_dtype fp32 lost"
# a resume may change it: reported, not warned of as another model
"$MEGATRAIN" resume "$WORK/g32" --set train.steps=2 --set model.export_dtype=fp16 > "$WORK/g32r.log" 2>&1
grep -q "model.export_dtype fp32 -> fp16" "$WORK/g32r.log" && ! grep -q "computes" "$WORK/g32r.log" \
  || fail "resume --set model.export_dtype: $(cat "$WORK/g32r.log")"
"$MEGATRAIN" convert "$WORK/g32" "$WORK/g32r.hf" > /dev/null
grep -q '"torch_dtype": "float16"' "$WORK/g32r.hf/config.json" || fail "g32r.hf: the resume's export_dtype fp16 lost"
echo "export_dtype: bf16 from Hugging Face, through init_from and resume, and back; the recipe's fp32 wins"

# A recipe model that is not the checkpoint's: a recipe error (exit 2) naming the key.
status=0
run "$WORK/e" --set train.steps=1 --set init_from="$WORK/a.ckpt" --set model.intermediate_size=128 \
  > "$WORK/e.log" 2>&1 || status=$?
[[ $status -eq 2 ]] || fail "mismatched model: exit $status, expected 2: $(cat "$WORK/e.log")"
grep -q "model.intermediate_size is 192 in the checkpoint but 128 in the recipe" "$WORK/e.log" \
  || fail "mismatch message: $(cat "$WORK/e.log")"
status=0
run "$WORK/f" --set train.steps=1 --set init_from="$WORK/nothing" > "$WORK/f.log" 2>&1 || status=$?
[[ $status -eq 1 ]] && grep -q "init_from: .*nothing" "$WORK/f.log" || fail "missing checkpoint: exit $status: $(cat "$WORK/f.log")"
# A Hugging Face directory where a checkpoint is expected (what an HF user tries first): init_from and eval say
# to convert it, naming the command
for cmd in init_from eval; do
  status=0
  if [[ $cmd == init_from ]]; then
    run "$WORK/h" --set train.steps=1 --set init_from="$WORK/a.hf" > "$WORK/h.log" 2>&1 || status=$?
  else
    "$MEGATRAIN" eval "$WORK/a.hf" --data "$WORK/english" > "$WORK/h.log" 2>&1 || status=$?
  fi
  [[ $status -eq 1 ]] && grep -qF "$WORK/a.hf: holds no checkpoints: it is a Hugging Face model directory (config.json); convert it first: megatrain convert $WORK/a.hf DST" "$WORK/h.log" ||
    fail "$cmd of a Hugging Face directory: exit $status: $(cat "$WORK/h.log")"
done
