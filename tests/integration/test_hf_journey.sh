#!/usr/bin/env bash
# test_hf_journey.sh: the README's "From a Hugging Face model to training and
# back" with the binary alone, on a Llama 3 style model directory
# (tests/fixtures/hf/llama3_export: config.json with an eos list, sharded
# safetensors, tokenizer.json, tokenizer_config.json, chat_template.jinja,
# generation_config.json):
#   1. data build --tokenizer MODEL_DIR on a JSONL corpus: uint16 ids of the
#      model's own tokenizer, each document ending with its eos_token;
#   2. convert MODEL_DIR CKPT;
#   3. run a recipe whose model: is CKPT/model.yaml and init_from: CKPT: the
#      loss falls from the converted weights' loss; data that another
#      tokenizer made (the byte-level one, another tokenizer.json) is refused
#      by run and resume, from what data build recorded (PREFIX.build.json);
#   4. convert RUN_DIR OUT_DIR: every carried file comes back byte for byte,
#      config.json keeps the token ids, and OUT_DIR's tokenizer builds the same
#      dataset bytes;
#   4b. a LoRA run's adapters exported for PEFT carry the tokenizer's files;
#   4c. recipes/sft/lora_finetune.yaml by the commands of its header;
#   5. eval RUN_DIR --json reads the run's newest checkpoint, and refuses data
#      another tokenizer made.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
HF="$REPO/tests/fixtures/hf/llama3_export"

# A JSONL corpus with accents, CJK and digits (JSON escapes included).
for i in $(seq 1 400); do
  printf '{"text": "Document %d: the quick brown fox jumps over %d lazy dogs, caf\\u00e9 na\\u00efve \\u4e2d\\u6587."}\n' \
    "$i" $((i * 7))
done > "$WORK/corpus.jsonl"

# 1. The model directory's tokenizer.
"$MEGATRAIN" data build --input "$WORK/corpus.jsonl" --output "$WORK/ds" --tokenizer "$HF" > "$WORK/build.log"
"$MEGATRAIN" data inspect "$WORK/ds" --tokenizer "$HF" --docs 1 --json > "$WORK/inspect.json"
grep -q '"dtype":"uint16"' "$WORK/inspect.json" || fail "the dataset is not uint16: $(cat "$WORK/inspect.json")"
grep -q '"documents":400,' "$WORK/inspect.json" || fail "not 400 documents: $(cat "$WORK/inspect.json")"
grep -q '"end_of_document_id":887,"documents_ending_with_it":400,' "$WORK/inspect.json" ||
  fail "documents do not end with <|end_of_text|> (887): $(cat "$WORK/inspect.json")"
grep -q '"text":"Document 1: the quick brown fox jumps over 7 lazy dogs, café naïve 中文.<|end_of_text|>"' \
  "$WORK/inspect.json" || fail "the first document does not decode to its text: $(cat "$WORK/inspect.json")"

# 2. Into a checkpoint.
"$MEGATRAIN" convert "$HF" "$WORK/ckpt" > /dev/null

# 3. Fine-tune from it; the model section is the checkpoint's own model.yaml.
cat > "$WORK/finetune.yaml" <<EOF
run: {name: journey, dir: $WORK/run, seed: 7, device: cpu}
init_from: $WORK/ckpt
model: $WORK/ckpt/model.yaml
train:
  steps: 30
  seq_len: 32
  micro_batch_size: 4
  batch_schedule: [{step: 0, global_batch_size: 8}]
  eval_interval: 0
optimizer:
  type: adamw
  lr: 1.0e-2
  min_lr: 1.0e-3
  schedule: {warmup_steps: 2, decay: cosine}
precision: fp32
data:
  train: [{path: $WORK/ds, weight: 1.0}]
  split: [100, 0, 0]
logging: {interval: 1}
checkpoint: {interval: 30}
EOF
"$MEGATRAIN" run "$WORK/finetune.yaml" > "$WORK/run.log"
first=$(json_field "$WORK/run/metrics.jsonl" loss | head -n 1)
last=$(json_field "$WORK/run/metrics.jsonl" loss | tail -n 1)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }' || fail "the loss did not fall: $first -> $last"

# 3b. Data another tokenizer made is refused: data build records its tokenizer in PREFIX.build.json, and a run
# whose model carries a tokenizer.json compares them (exit 1, naming the key, the dataset and the record, before
# any step; the refused run leaves no run.dir). Without the record (deleted) the data trains.
grep -q '"kind": "tokenizer.json"' "$WORK/ds.build.json" &&
  grep -q "\"bytes\": $(stat -c %s "$HF/tokenizer.json")," "$WORK/ds.build.json" ||
  fail "ds.build.json does not record the model's tokenizer.json: $(cat "$WORK/ds.build.json")"
"$MEGATRAIN" data build --input "$WORK/corpus.jsonl" --output "$WORK/ds-bytes" --tokenizer byte > /dev/null
"$MEGATRAIN" data build --input "$WORK/corpus.jsonl" --output "$WORK/ds-other" \
  --tokenizer "$REPO/tests/fixtures/tokenizers/llama3" > /dev/null
refused_data() { # NAME EXPECTED: a run on dataset NAME exits 1 saying EXPECTED
  local rc=0
  "$MEGATRAIN" run "$WORK/finetune.yaml" --set run.dir="$WORK/run-$1" --set train.steps=2 \
    --set "data.train=[{path: $WORK/$1, weight: 1.0}]" > "$WORK/refused.log" 2>&1 || rc=$?
  [[ $rc -eq 1 ]] && grep -qF -- "$2" "$WORK/refused.log" && grep -qF "delete $WORK/$1.build.json" "$WORK/refused.log" ||
    fail "$1: expected exit 1 saying '$2', got $rc: $(cat "$WORK/refused.log")"
  [[ ! -e "$WORK/run-$1" ]] || fail "$1: the refused run left its run.dir"
}
refused_data ds-bytes "data.train[0]: $WORK/ds-bytes was built with the byte-level tokenizer (ids are byte values), not the model's tokenizer (init_from $WORK/ckpt"
refused_data ds-other "data.train[0]: $WORK/ds-other was built with another tokenizer.json"
rc=0
"$MEGATRAIN" resume "$WORK/run" --set train.steps=31 --set "data.train=[{path: $WORK/ds-bytes, weight: 1.0}]" \
  > "$WORK/refused.log" 2>&1 || rc=$?
[[ $rc -eq 1 ]] && grep -qF "not the model's tokenizer (resume from $WORK/run/checkpoints/iter_0000030" "$WORK/refused.log" ||
  fail "resume onto byte-level data: expected exit 1, got $rc: $(cat "$WORK/refused.log")"
rm "$WORK/ds-bytes.build.json"
"$MEGATRAIN" run "$WORK/finetune.yaml" --set run.dir="$WORK/run-bytes" --set train.steps=2 \
  --set "data.train=[{path: $WORK/ds-bytes, weight: 1.0}]" > /dev/null || fail "the dataset without its record was refused"
echo "data of another tokenizer: refused (byte-level, another tokenizer.json, on resume); without its record it trains"

# 4. Back to Hugging Face.
"$MEGATRAIN" convert "$WORK/run" "$WORK/out" > /dev/null
for f in tokenizer.json tokenizer_config.json chat_template.jinja generation_config.json; do
  cmp -s "$HF/$f" "$WORK/out/$f" || fail "$f did not come back byte for byte"
done
tr -d ' \n' < "$WORK/out/config.json" | grep -q '"bos_token_id":886,.*"eos_token_id":\[887,895\],' ||
  fail "config.json lost the token ids: $(cat "$WORK/out/config.json")"
"$MEGATRAIN" data build --input "$WORK/corpus.jsonl" --output "$WORK/ds2" --tokenizer "$WORK/out" > /dev/null
cmp -s "$WORK/ds.bin" "$WORK/ds2.bin" || fail "the exported tokenizer builds other ids"

# 4b. LoRA from the same checkpoint: the PEFT adapter directory carries the tokenizer's files byte for byte
# (generation_config.json, which describes the model, stays with the merged model's export).
"$MEGATRAIN" run "$WORK/finetune.yaml" --set run.dir="$WORK/lora" --set train.steps=2 \
  --set "peft={type: lora, rank: 4, alpha: 8}" --set optimizer.schedule.warmup_steps=0 > /dev/null
"$MEGATRAIN" convert "$WORK/lora" "$WORK/adapter" > "$WORK/adapter.log"
for f in tokenizer.json tokenizer_config.json chat_template.jinja; do
  cmp -s "$HF/$f" "$WORK/adapter/$f" || fail "the adapter directory lacks $f, or it differs"
done
[[ ! -e "$WORK/adapter/generation_config.json" && -f "$WORK/adapter/adapter_config.json" ]] ||
  fail "the adapter directory: $(ls "$WORK/adapter")"
grep -q "the tokenizer's files: tokenizer.json, " "$WORK/adapter.log" || fail "convert did not list them: $(cat "$WORK/adapter.log")"

# 4c. The shipped LoRA fine-tuning recipe (recipes/sft/lora_finetune.yaml), by the commands its header gives, from
# a project directory: convert into ckpt/base, SFT data with the model's template and the checkpoint's tokenizer,
# plan, run (shorter: 2 steps of 128-token rows), the adapter and the merged model for Hugging Face.
mkdir -p "$WORK/proj"
python3 - "$WORK/proj/conversations.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(40):
        f.write(json.dumps({"messages": [{"role": "user", "content": f"What is {i} plus {i}?"},
                                         {"role": "assistant", "content": f"{2 * i}."}]}) + "\n")
PY
# the model directory with Llama 3.2 Instruct's own chat template (the fixture's is a stand-in), which
# --chat-template auto recognizes through the converted checkpoint
cp -r "$HF" "$WORK/proj/model" && cp "$REPO/tests/fixtures/chat_templates/templates/llama3.1.jinja" \
  "$WORK/proj/model/chat_template.jinja"
(
  cd "$WORK/proj" &&
  "$MEGATRAIN" convert model ckpt/base > /dev/null &&
  "$MEGATRAIN" data build --format sft --chat-template auto --tokenizer ckpt/base \
    --input conversations.jsonl --output data/my-sft > build.log &&
  short=(--set train.steps=2 --set train.seq_len=128 --set optimizer.schedule.warmup_steps=1) &&
  "$MEGATRAIN" plan "$REPO/recipes/sft/lora_finetune.yaml" "${short[@]}" > plan.txt &&
  "$MEGATRAIN" run "$REPO/recipes/sft/lora_finetune.yaml" "${short[@]}" > run.log &&
  "$MEGATRAIN" convert runs/lora-finetune out/adapter --base-model model > /dev/null &&
  "$MEGATRAIN" convert runs/lora-finetune out/merged --merge-lora > /dev/null
) || fail "the lora_finetune.yaml journey failed"
grep -q "auto: llama3.1, from ckpt/base/chat_template.jinja" "$WORK/proj/build.log" ||
  fail "--chat-template auto through the checkpoint: $(cat "$WORK/proj/build.log")"
grep -q "done: 2 steps" "$WORK/proj/run.log" && grep -q "init_from: " "$WORK/proj/run.log" ||
  fail "lora_finetune.yaml: $(cat "$WORK/proj/run.log")"
[[ -f "$WORK/proj/out/adapter/adapter_model.safetensors" && -f "$WORK/proj/out/merged/config.json" ]] ||
  fail "lora_finetune.yaml: no adapter or merged model: $(ls -R "$WORK/proj/out")"
# its run evaluated on nothing (data.split 100,0,0, no data.valid): eval of the run without --data says so and names
# the dataset that --data takes (it called the run "no run's checkpoint"), and scores it when given
rc=0
(cd "$WORK/proj" && "$MEGATRAIN" eval runs/lora-finetune) > "$WORK/proj/eval.log" 2>&1 || rc=$?
[[ $rc -eq 2 ]] && grep -qF "eval: --data PREFIX is required: the run of runs/lora-finetune/checkpoints/iter_0000002 had no validation data to take (no data.valid, and data.split 100,0,0 leaves data.train no validation share; runs/lora-finetune/checkpoints/iter_0000002/recipe.yaml): give --data PREFIX (--data $WORK/proj/data/my-sft scores the run's training data)" "$WORK/proj/eval.log" ||
  fail "eval of a run without validation data: expected exit 2, got $rc: $(cat "$WORK/proj/eval.log")"
(cd "$WORK/proj" && "$MEGATRAIN" eval runs/lora-finetune --data data/my-sft --batches 1) > "$WORK/proj/eval.log" 2>&1 ||
  fail "eval --data data/my-sft: $(cat "$WORK/proj/eval.log")"
echo "recipes/sft/lora_finetune.yaml: its header's commands work"

# 5. eval of the run directory.
"$MEGATRAIN" eval "$WORK/run" --data "$WORK/ds" --batches 2 --seq-len 32 --json > "$WORK/eval.json"
grep -q '"step":30,' "$WORK/eval.json" || fail "eval did not take the run's newest checkpoint: $(cat "$WORK/eval.json")"
rc=0
"$MEGATRAIN" eval "$WORK/run" --data "$WORK/ds-other" --batches 2 --seq-len 32 > "$WORK/refused.log" 2>&1 || rc=$?
[[ $rc -eq 1 ]] && grep -qF "eval: --data: $WORK/ds-other was built with another tokenizer.json" "$WORK/refused.log" ||
  fail "eval of another tokenizer's data: expected exit 1, got $rc: $(cat "$WORK/refused.log")"
echo "journey: data build -> convert -> run (loss $first -> $last) -> convert back: ok"
