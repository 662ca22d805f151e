#!/usr/bin/env bash
# test_convert.sh: `megatrain convert` through the binary, on the committed
# Hugging Face fixtures (written by transformers' save_pretrained):
# HF -> megatrain -> HF gives back the very same safetensors bytes for every
# family, and a config.json with the same architecture and token ids; the
# *_export fixtures (sharded by transformers 5, MoE included, with their
# tokenizer files and generation_config.json) come back file for file, byte
# for byte; without a generation_config.json one is made from the ids; bf16
# and fp16 (sharded, with the index) survive megatrain and come back
# identical; a run directory converts from its latest checkpoint; a
# checkpoint whose carried tokenizer files are damaged still converts, with
# a warning naming each; each error exits 1, names the problem and leaves
# nothing at DST; --help lists every family. PEFT's adapter directories
# (tests/fixtures/peft) with their base convert to a LoRA checkpoint and
# back to PEFT's very bytes (onto a checkpoint of the base: the adapters
# alone, referencing it, the same merged model); a base named in adapter_config.json is taken
# when it is a directory, and an adapter directory holding a copied
# config.json is still an adapter; the wrong base, settings PEFT computes
# otherwise (rsLoRA, a PiSSA initialisation), adapters the config does not
# list, a pickled adapter_model.bin and a MoE base are refused. Launched on
# two ranks, rank 0 alone converts.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
"$MEGATRAIN" convert --help > /dev/null 2>&1 || { echo "skip: megatrain has no convert command (src/main.c)"; exit 77; }
FIX="$REPO/tests/fixtures/hf"
[[ -f "$FIX/llama_tied/config.json" ]] || { echo "no Hugging Face fixtures in $FIX"; exit 77; }

# field FILE KEY: the first value of "KEY" in a JSON file (as written).
field() { grep -o "\"$2\": [^,}]*" "$1" | head -n 1 | sed 's/^[^:]*: *//'; }

# ids FILE KEY: the value of "KEY" in a JSON file with the whitespace removed (an id, null or [a,b]).
ids() { tr -d ' \n' < "$1" | grep -o "\"$2\":\(\[[0-9,]*\]\|[0-9]*\|null\)" | head -n 1; }

# --- every family: HF -> megatrain -> HF, byte for byte -----------------------
for dir in "$FIX"/*/; do
  name=$(basename "$dir")
  [[ -f "$dir/model.safetensors" ]] || continue
  "$MEGATRAIN" convert "$dir" "$WORK/$name.ckpt" > "$WORK/log.txt" || fail "$name: HF -> megatrain failed"
  grep -q "converted" "$WORK/log.txt" || fail "$name: no summary line"
  "$MEGATRAIN" convert "$WORK/$name.ckpt" "$WORK/$name.hf" > /dev/null || fail "$name: megatrain -> HF failed"
  cmp "$dir/model.safetensors" "$WORK/$name.hf/model.safetensors" \
    || fail "$name: model.safetensors differs after HF -> megatrain -> HF"
  for key in model_type hidden_size intermediate_size num_hidden_layers num_attention_heads num_key_value_heads \
             vocab_size rms_norm_eps rope_theta tie_word_embeddings factor low_freq_factor high_freq_factor \
             original_max_position_embeddings; do
    [[ "$(field "$dir/config.json" $key)" == "$(field "$WORK/$name.hf/config.json" $key)" ]] \
      || fail "$name: config.json $key is '$(field "$WORK/$name.hf/config.json" $key)', expected '$(field "$dir/config.json" $key)'"
  done
  grep -q '"architectures"' "$WORK/$name.hf/config.json" || fail "$name: no architectures in config.json"
  [[ "$(ls "$WORK/$name.hf" | tr '\n' ' ')" == "config.json generation_config.json model.safetensors " ]] \
    || fail "$name: unexpected files $(ls "$WORK/$name.hf")"
  # no generation_config.json to carry: one made from the ids as transformers makes it (those that are set)
  gen="$WORK/$name.hf/generation_config.json" want='{"_from_model_config":true,'
  for key in bos_token_id eos_token_id; do
    [[ "$(ids "$dir/config.json" $key)" == *null ]] || want+="$(ids "$dir/config.json" $key),"
  done
  want+='"output_attentions":false,"output_hidden_states":false,'
  [[ "$(ids "$dir/config.json" pad_token_id)" == *null ]] || want+="$(ids "$dir/config.json" pad_token_id),"
  want+='"use_cache":true}'
  [[ "$(tr -d ' \n' < "$gen")" == "$want" ]] || fail "$name: generation_config.json: $(cat "$gen"), expected $want"
  for key in bos_token_id eos_token_id pad_token_id; do # as the fixture says (null explicitly)
    [[ "$(ids "$WORK/$name.hf/config.json" $key)" == "$(ids "$dir/config.json" $key)" ]] \
      || fail "$name: config.json $key: $(ids "$WORK/$name.hf/config.json" $key)"
  done
done

# --- as transformers 5 saves a model for a user: sharded (8KB), MoE too, with
# token ids, generation_config.json and tokenizer files: every file back ------
n_export=0
for dir in "$FIX"/*_export/; do
  name=$(basename "$dir")
  "$MEGATRAIN" convert "$dir" "$WORK/$name.ckpt" > "$WORK/log.txt" || fail "$name: HF -> megatrain failed"
  grep -q "carried files: generation_config.json, tokenizer.json, tokenizer_config.json, chat_template.jinja" \
    "$WORK/log.txt" || fail "$name: the summary does not list the carried files: $(cat "$WORK/log.txt")"
  "$MEGATRAIN" inspect "$WORK/$name.ckpt" > "$WORK/inspect.txt" || fail "$name: inspect failed"
  grep -q "file tokenizer.json .* ok" "$WORK/inspect.txt" || fail "$name: inspect does not list tokenizer.json"
  "$MEGATRAIN" convert "$WORK/$name.ckpt" "$WORK/$name.hf" --max-shard-size 8KB > /dev/null \
    || fail "$name: megatrain -> HF failed"
  [[ "$(ls "$dir")" == "$(ls "$WORK/$name.hf")" ]] || fail "$name: files $(ls "$WORK/$name.hf"), expected $(ls "$dir")"
  for f in "$dir"/*; do
    [[ $(basename "$f") == config.json ]] && continue # rewritten in our spelling
    cmp "$f" "$WORK/$name.hf/$(basename "$f")" || fail "$name: $(basename "$f") differs after HF -> megatrain -> HF"
  done
  for key in bos_token_id eos_token_id pad_token_id model_type num_hidden_layers vocab_size; do
    [[ "$(ids "$dir/config.json" $key)" == "$(ids "$WORK/$name.hf/config.json" $key)" ]] \
      || fail "$name: config.json $key: '$(ids "$WORK/$name.hf/config.json" $key)', expected '$(ids "$dir/config.json" $key)'"
  done
  n_export=$((n_export + 1))
done
[[ $n_export -eq 3 ]] || fail "expected 3 *_export fixtures, found $n_export"
[[ "$(ids "$WORK/llama3_export.hf/config.json" eos_token_id)" == '"eos_token_id":[887,895]' ]] \
  || fail "llama3_export: eos_token_id is not the list [887, 895]"

# --- damaged carried files: still converts, each named in a warning ------------
cp -r "$WORK/llama3_export.ckpt" "$WORK/damaged.ckpt"
head -c 100 "$FIX/llama3_export/tokenizer.json" > "$WORK/damaged.ckpt/tokenizer.json"   # truncated
printf 'X' | dd of="$WORK/damaged.ckpt/generation_config.json" bs=1 seek=10 conv=notrunc 2> /dev/null # corrupt
status=0
"$MEGATRAIN" convert "$WORK/damaged.ckpt" "$WORK/damaged.hf" > /dev/null 2> "$WORK/damaged.log" || status=$?
[[ $status -eq 0 ]] || fail "damaged tokenizer files: exit $status: $(cat "$WORK/damaged.log")"
grep -q "damaged.ckpt/tokenizer.json: 100 bytes, the metadata says .*; it is left out" "$WORK/damaged.log" \
  || fail "no warning naming tokenizer.json: $(cat "$WORK/damaged.log")"
grep -q "damaged.ckpt/generation_config.json: checksum mismatch.*it is left out" "$WORK/damaged.log" \
  || fail "no warning naming generation_config.json: $(cat "$WORK/damaged.log")"
[[ ! -e "$WORK/damaged.hf/tokenizer.json" ]] || fail "a truncated tokenizer.json was written"
cmp "$FIX/llama3_export/tokenizer_config.json" "$WORK/damaged.hf/tokenizer_config.json" || fail "intact files lost"
grep -q '"_from_model_config": true' "$WORK/damaged.hf/generation_config.json" && \
  ! grep -q temperature "$WORK/damaged.hf/generation_config.json" \
  || fail "generation_config.json is not made from the ids: $(cat "$WORK/damaged.hf/generation_config.json")"
status=0
"$MEGATRAIN" inspect "$WORK/damaged.ckpt" > /dev/null 2> "$WORK/inspect.log" || status=$?
[[ $status -eq 1 ]] && grep -q "tokenizer.json" "$WORK/inspect.log" || fail "inspect: exit $status: $(cat "$WORK/inspect.log")"

# --- bf16 and fp16, sharded: -> megatrain (fp32, exact) -> the same files -----
for dtype in bf16 fp16; do
  "$MEGATRAIN" convert "$WORK/llama_gqa_rope3.ckpt" "$WORK/$dtype.a" --dtype $dtype --max-shard-size 40KB > /dev/null
  [[ -f "$WORK/$dtype.a/model.safetensors.index.json" ]] || fail "$dtype: no index file for a sharded model"
  [[ $(ls "$WORK/$dtype.a" | grep -c '^model-0000[0-9]-of-0000[0-9].safetensors$') -ge 3 ]] \
    || fail "$dtype: expected at least 3 shards under 40KB, found: $(ls "$WORK/$dtype.a")"
  grep -q "\"torch_dtype\": \"$( [[ $dtype == bf16 ]] && echo bfloat16 || echo float16)\"" "$WORK/$dtype.a/config.json" \
    || fail "$dtype: torch_dtype not set in config.json"
  "$MEGATRAIN" convert "$WORK/$dtype.a" "$WORK/$dtype.ckpt" > /dev/null
  grep -q "^export_dtype: $dtype$" "$WORK/$dtype.ckpt/model.yaml" || fail "$dtype: model.yaml's export_dtype"
  # back without --dtype: the source's dtype (model.export_dtype), the same files
  "$MEGATRAIN" convert "$WORK/$dtype.ckpt" "$WORK/$dtype.b" --max-shard-size=40KB > /dev/null
  for f in "$WORK/$dtype.a"/*; do
    cmp "$f" "$WORK/$dtype.b/$(basename "$f")" || fail "$dtype: $(basename "$f") differs after the round trip"
  done
  [[ $(ls "$WORK/$dtype.a" | wc -l) -eq $(ls "$WORK/$dtype.b" | wc -l) ]] || fail "$dtype: different file sets"
  # --dtype still chooses
  "$MEGATRAIN" convert "$WORK/$dtype.ckpt" "$WORK/$dtype.f32" --dtype fp32 > /dev/null
  grep -q '"torch_dtype": "float32"' "$WORK/$dtype.f32/config.json" || fail "$dtype: --dtype fp32 not written as float32"
done
# an fp32 source comes back fp32
grep -q "^export_dtype: fp32$" "$WORK/llama_gqa_rope3.ckpt/model.yaml" || fail "fp32 source: export_dtype is not fp32"

# --- a run directory: its latest checkpoint -----------------------------------
mkdir -p "$WORK/run/checkpoints"
cp -r "$WORK/qwen3_qknorm.ckpt" "$WORK/run/checkpoints/iter_0000003"
echo 3 > "$WORK/run/checkpoints/latest_checkpointed_iteration.txt"
"$MEGATRAIN" convert "$WORK/run" "$WORK/run.hf" > /dev/null
cmp "$FIX/qwen3_qknorm/model.safetensors" "$WORK/run.hf/model.safetensors" || fail "run dir: wrong checkpoint converted"

# --- errors: exit 1, a message naming the problem, nothing at DST -------------
# expect_error NAME PATTERN SRC [OPTIONS...]: convert SRC to $WORK/NAME.out fails as described (exit 1, or $STATUS).
expect_error() {
  local name=$1 pattern=$2 src=$3 status=0
  shift 3
  "$MEGATRAIN" convert "$src" "$WORK/$name.out" "$@" > "$WORK/$name.log" 2>&1 || status=$?
  [[ $status -eq ${STATUS:-1} ]] || fail "$name: exit status $status, expected ${STATUS:-1}: $(cat "$WORK/$name.log")"
  grep -q -- "$pattern" "$WORK/$name.log" || fail "$name: message lacks '$pattern': $(cat "$WORK/$name.log")"
  [[ ! -e "$WORK/$name.out" ]] || fail "$name: DST was written"
  [[ -z "$(ls -d "$WORK/$name.out".* 2>/dev/null)" ]] || fail "$name: a temporary DST was left behind"
}
# spoiled NAME FIXTURE SED: a copy of a fixture with config.json edited by SED.
spoiled() {
  cp -r "$FIX/$2" "$WORK/$1"
  sed -i "$3" "$WORK/$1/config.json"
}

cp -r "$FIX/llama_tied" "$WORK/no_weights" && rm "$WORK/no_weights/model.safetensors"
expect_error no_weights "no_weights: missing model.safetensors" "$WORK/no_weights"
# a SRC that is not there: usage (exit 2), as every command's missing path
STATUS=2 expect_error no_src "does_not_exist: No such file or directory" "$WORK/does_not_exist"
# a file of a Hugging Face directory given as SRC: the directory is named (usage, exit 2)
STATUS=2 expect_error a_file "llama_tied/config.json is a file; SRC is a directory: a Hugging Face model's (the one \
holding config.json and the .safetensors: $FIX/llama_tied?)" "$FIX/llama_tied/config.json"
spoiled gpt2 llama_tied 's/"model_type": "llama"/"model_type": "gpt2"/'
expect_error gpt2 "model_type 'gpt2' is not a supported family (supported: llama, qwen2, qwen3, mixtral, qwen3_moe)" "$WORK/gpt2"
I=$(field "$FIX/llama_gqa_rope3/config.json" intermediate_size)
C=$(field "$FIX/llama_gqa_rope3/config.json" hidden_size)
spoiled shape llama_gqa_rope3 "s/\"intermediate_size\": $I/\"intermediate_size\": $((I + 32))/"
expect_error shape "has shape \[$I, $C\], but config.json makes it \[$((I + 32)), $C\]" "$WORK/shape"
spoiled untied llama_tied 's/"tie_word_embeddings": true/"tie_word_embeddings": false/'
expect_error untied "missing tensor 'lm_head.weight'" "$WORK/untied"
spoiled biases qwen2_bias 's/"model_type": "qwen2"/"model_type": "llama"/'
expect_error biases "unexpected tensor 'model.layers.0.self_attn.[qkv]_proj.bias'" "$WORK/biases"
# values config.json may hold but a checkpoint's model.yaml may not are refused before anything is written (a
# checkpoint that convert writes always loads)
spoiled eps0 llama_tied 's/"rms_norm_eps": 1e-06/"rms_norm_eps": 0/'
expect_error eps0 "eps0/config.json: a value the checkpoint cannot hold (model.yaml: rms_norm_eps: expected a number > 0, found '0')" "$WORK/eps0"
spoiled eps_subnormal llama_tied 's/"rms_norm_eps": 1e-06/"rms_norm_eps": 1e-320/'
expect_error eps_subnormal "eps_subnormal/config.json: a value the checkpoint cannot hold (model.yaml: rms_norm_eps:" "$WORK/eps_subnormal"
cp -r "$FIX/llama_tied" "$WORK/truncated"
head -c 1000 "$FIX/llama_tied/model.safetensors" > "$WORK/truncated/model.safetensors"
expect_error truncated "truncated/model.safetensors: header length" "$WORK/truncated"
mkdir "$WORK/not_a_checkpoint"
expect_error not_a_checkpoint "not_a_checkpoint: holds no checkpoints .* (.*not_a_checkpoint has no config.json, so it was read as a megatrain checkpoint)" "$WORK/not_a_checkpoint"
# a PEFT adapter directory is called one; a checkpoint's own errors come without the config.json hint
mkdir "$WORK/adapter" && echo '{"peft_type": "LORA", "target_modules": "all-linear"}' > "$WORK/adapter/adapter_config.json"
STATUS=2 expect_error adapter "adapter is a PEFT adapter directory: name the Hugging Face directory of the model it \
was trained on with --base-model DIR (its adapter_config.json's base_model_name_or_path is null)" "$WORK/adapter"
status=0
"$MEGATRAIN" convert "$WORK/llama_tied.ckpt" "$WORK/merge.out" --merge-lora > "$WORK/merge.log" 2>&1 || status=$?
[[ $status -eq 1 ]] && grep -q -- "--merge-lora: .*llama_tied.ckpt has no LoRA adapters" "$WORK/merge.log" ||
  fail "--merge-lora on a plain checkpoint: $status $(cat "$WORK/merge.log")"
! grep -q "has no config.json" "$WORK/merge.log" || fail "a checkpoint's error carries the config.json hint"

# DST exists: refused, untouched.
mkdir "$WORK/taken" && echo keep > "$WORK/taken/file"
status=0
"$MEGATRAIN" convert "$FIX/llama_tied" "$WORK/taken" > "$WORK/taken.log" 2>&1 || status=$?
[[ $status -eq 2 ]] && grep -q "already exists" "$WORK/taken.log" || fail "existing DST (exit $status, expected 2): $(cat "$WORK/taken.log")"
[[ "$(ls "$WORK/taken")" == file ]] || fail "existing DST was touched"

# A file-size limit (ulimit -f, in KiB) below the output: each direction exits 1 naming the file it could not
# write (megatrain ignores SIGXFSZ, which would kill it mid-write), and leaves neither DST nor its temporary.
"$MEGATRAIN" convert "$FIX/llama_gqa_rope3" "$WORK/big.ckpt" > /dev/null || fail "llama_gqa_rope3: HF -> megatrain"
for pair in "$FIX/llama_gqa_rope3:$WORK/limited.ckpt" "$WORK/big.ckpt:$WORK/limited.hf"; do
  status=0
  (ulimit -f 100; exec "$MEGATRAIN" convert "${pair%%:*}" "${pair#*:}") > /dev/null 2> "$WORK/limited.log" || status=$?
  [[ $status -eq 1 ]] && grep -q "\.tmp\.[A-Za-z0-9_-]*\.[0-9]*/[a-z_0-9]*\.[a-z]*: .*File too large" "$WORK/limited.log" ||
    fail "${pair#*:} under ulimit -f: exit $status: $(cat "$WORK/limited.log")"
  [[ -z "$(ls -d "${pair#*:}"* 2> /dev/null)" ]] || fail "${pair#*:} under ulimit -f: left $(ls -d "${pair#*:}"*)"
done

# Usage.
status=0; "$MEGATRAIN" convert "$FIX/llama_tied" "" > /dev/null 2> "$WORK/err.txt" || status=$?
[[ $status -eq 2 ]] && grep -q "DST is empty" "$WORK/err.txt" || fail "an empty DST: $status $(cat "$WORK/err.txt")"
# (to a file first: grep -q on a pipe may exit before the writer ends, and pipefail would see its SIGPIPE)
"$MEGATRAIN" convert --help > "$WORK/help.txt" || fail "--help failed"
grep -q "usage: megatrain convert SRC DST" "$WORK/help.txt" || fail "--help"
grep -q "Families (config.json model_type): llama, qwen2, qwen3, mixtral, qwen3_moe\.$" "$WORK/help.txt" \
  || fail "--help does not list every family: $(cat "$WORK/help.txt")"
status=0; "$MEGATRAIN" convert "$FIX/llama_tied" > /dev/null 2>&1 || status=$?
[[ $status -eq 2 ]] || fail "missing DST: exit $status, expected 2"
status=0; "$MEGATRAIN" convert "$WORK/llama_tied.ckpt" "$WORK/x" --dtype fp8 > /dev/null 2>&1 || status=$?
[[ $status -eq 2 && ! -e "$WORK/x" ]] || fail "--dtype fp8: exit $status, expected 2"
# A MoE model trained with a capacity factor is exported (the weights are the model's) with a warning that
# transformers drops no tokens (it was exported without a word)
demo_data "$WORK/english"
"$MEGATRAIN" run "$REPO/recipes/tiny/mixtral.yaml" --set run.dir="$WORK/capacity" --set train.steps=1 \
  --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set model.moe.capacity_factor=1.5 \
  --set train.eval_interval=0 --set optimizer.schedule.warmup_steps=0 --set checkpoint.interval=1 > /dev/null
"$MEGATRAIN" convert "$WORK/capacity" "$WORK/capacity.hf" > /dev/null 2> "$WORK/capacity.log" ||
  fail "a capacity-factor model was not exported: $(cat "$WORK/capacity.log")"
grep -q "model.moe.capacity_factor 1.5: transformers drops no tokens" "$WORK/capacity.log" ||
  fail "no warning of the capacity factor: $(cat "$WORK/capacity.log")"

# --- PEFT adapter directories (tests/fixtures/peft, saved by PEFT): PEFT -> megatrain -> PEFT, byte for byte -----
PEFT="$REPO/tests/fixtures/peft"
for name in llama qwen3; do
  "$MEGATRAIN" convert "$PEFT/$name/adapter" "$WORK/peft-$name.ckpt" --base-model "$PEFT/$name/base" \
    > "$WORK/log.txt" 2>&1 || fail "PEFT $name -> megatrain: $(cat "$WORK/log.txt")"
  grep -q "^peft:" "$WORK/peft-$name.ckpt/model.yaml" || fail "PEFT $name: the checkpoint's model has no peft:"
  "$MEGATRAIN" convert "$WORK/peft-$name.ckpt" "$WORK/peft-$name.back" > /dev/null
  cmp "$PEFT/$name/adapter/adapter_model.safetensors" "$WORK/peft-$name.back/adapter_model.safetensors" ||
    fail "PEFT $name -> megatrain -> PEFT: adapter_model.safetensors differs"
  "$MEGATRAIN" convert "$WORK/peft-$name.ckpt" "$WORK/peft-$name.merged" --merge-lora > /dev/null
  ! cmp -s "$PEFT/$name/base/model.safetensors" "$WORK/peft-$name.merged/model.safetensors" ||
    fail "PEFT $name: the merged model is the base"
done
# onto a megatrain checkpoint of the base: the adapters alone, referencing it; the same model as from the Hugging Face
# base (their --merge-lora exports are the same bytes), back to PEFT's bytes
"$MEGATRAIN" convert "$PEFT/llama/base" "$WORK/peft-base.ckpt" > /dev/null 2>&1
"$MEGATRAIN" convert "$PEFT/llama/adapter" "$WORK/peft-small.ckpt" --base-model "$WORK/peft-base.ckpt" > "$WORK/log.txt" \
  2>&1 || fail "PEFT onto a checkpoint: $(cat "$WORK/log.txt")"
grep -q "reference the base's weights in $WORK/peft-base.ckpt" "$WORK/log.txt" || fail "PEFT onto a checkpoint: $(cat "$WORK/log.txt")"
"$MEGATRAIN" inspect "$WORK/peft-small.ckpt" | grep -q "frozen base: not stored here, referenced: $WORK/peft-base.ckpt" ||
  fail "PEFT onto a checkpoint: the base is not referenced"
"$MEGATRAIN" convert "$WORK/peft-small.ckpt" "$WORK/peft-small.merged" --merge-lora > /dev/null
cmp "$WORK/peft-llama.merged/model.safetensors" "$WORK/peft-small.merged/model.safetensors" ||
  fail "PEFT onto a checkpoint: the merged model differs from the one onto the Hugging Face base"
"$MEGATRAIN" convert "$WORK/peft-small.ckpt" "$WORK/peft-small.back" > /dev/null
cmp "$PEFT/llama/adapter/adapter_model.safetensors" "$WORK/peft-small.back/adapter_model.safetensors" ||
  fail "PEFT onto a checkpoint -> PEFT: adapter_model.safetensors differs"
expect_error lora_base "a LoRA checkpoint (its model has adapters); give the model the adapter was trained on" \
  "$PEFT/llama/adapter" --base-model "$WORK/peft-llama.ckpt"
expect_error no_base "--base-model $WORK/adapter: neither a Hugging Face model directory (no config.json) nor a megatrain \
checkpoint" "$PEFT/llama/adapter" --base-model "$WORK/adapter"
# the base from adapter_config.json's base_model_name_or_path, when it is a directory here
spoiled_peft() { cp -r "$PEFT/llama/adapter" "$WORK/$1" && sed -i "$2" "$WORK/$1/adapter_config.json"; }
spoiled_peft named_base "s|\"base_model_name_or_path\": null|\"base_model_name_or_path\": \"$PEFT/llama/base\"|"
"$MEGATRAIN" convert "$WORK/named_base" "$WORK/named_base.ckpt" > /dev/null 2>&1 ||
  fail "PEFT: the base named by base_model_name_or_path was not taken"
# ... with a layers_to_transform that lists every layer of it (checked once the base is read: [0] alone is refused)
spoiled_peft all_layers "s|\"base_model_name_or_path\": null|\"base_model_name_or_path\": \"$PEFT/llama/base\"|; \
s|\"layers_to_transform\": null|\"layers_to_transform\": [1, 0]|"
"$MEGATRAIN" convert "$WORK/all_layers" "$WORK/all_layers.ckpt" > "$WORK/all_layers.log" 2>&1 ||
  fail "PEFT: layers_to_transform listing every layer, the base named: $(cat "$WORK/all_layers.log")"
spoiled_peft one_layer "s|\"base_model_name_or_path\": null|\"base_model_name_or_path\": \"$PEFT/llama/base\"|; \
s|\"layers_to_transform\": null|\"layers_to_transform\": [0]|"
expect_error one_layer "one_layer/adapter_config.json: layers_to_transform: expected null (megatrain adapts every \
layer: a list may only name them all), found an array" "$WORK/one_layer"
# ... also when it is a megatrain checkpoint of the base (as --base-model takes one): the adapters reference it
"$MEGATRAIN" convert "$PEFT/llama/base" "$WORK/named_ckpt_base" > /dev/null
spoiled_peft named_ckpt "s|\"base_model_name_or_path\": null|\"base_model_name_or_path\": \"$WORK/named_ckpt_base\"|"
"$MEGATRAIN" convert "$WORK/named_ckpt" "$WORK/named_ckpt.ckpt" > "$WORK/named_ckpt.log" 2>&1 ||
  fail "PEFT: a megatrain checkpoint named by base_model_name_or_path was not taken: $(cat "$WORK/named_ckpt.log")"
"$MEGATRAIN" inspect "$WORK/named_ckpt.ckpt" > "$WORK/named_ckpt.inspect" # (grep -q on a pipe: SIGPIPE)
grep -qF "frozen base: not stored here, referenced: $WORK/named_ckpt_base" "$WORK/named_ckpt.inspect" ||
  fail "PEFT onto the named checkpoint: no reference to it"
spoiled_peft hub_base 's|"base_model_name_or_path": null|"base_model_name_or_path": "meta-llama/Llama-3.2-1B"|'
STATUS=2 expect_error hub_base "base_model_name_or_path 'meta-llama/Llama-3.2-1B' is not a model directory here" \
  "$WORK/hub_base"
STATUS=2 expect_error peft_dtype "--dtype, --max-shard-size, --merge-lora and --drop-expert-bias apply to megatrain -> Hugging Face only" \
  "$PEFT/llama/adapter" --base-model "$PEFT/llama/base" --dtype bf16
expect_error wrong_base "has shape \[16, 4\], but r = 4 and the base's config make it \[32, 4\] (is the base model \
the one the adapter was trained on?)" "$PEFT/llama/adapter" --base-model "$PEFT/qwen3/base"
spoiled_peft rslora 's|"use_rslora": false|"use_rslora": true|'
expect_error rslora "rslora/adapter_config.json: use_rslora: expected false (rank-stabilised LoRA" "$WORK/rslora" \
  --base-model "$PEFT/llama/base"
spoiled_peft fewer_targets 's|"k_proj",||'
expect_error fewer_targets "unexpected tensor 'base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight' (not a \
LoRA adapter of the target_modules" "$WORK/fewer_targets" --base-model "$PEFT/llama/base"
expect_error moe_base "LoRA on a mixture-of-experts model adapts the attention projections only (target_modules q_proj, \
k_proj, v_proj, o_proj): the routed experts have no adapters (Hugging Face mixtral)" \
  "$PEFT/llama/adapter" --base-model "$FIX/mixtral_hd16"
spoiled_peft pissa 's|"init_lora_weights": true|"init_lora_weights": "pissa"|'
expect_error pissa "pissa/adapter_config.json: init_lora_weights: expected true, false, .* (\"pissa\", \"olora\", \
\"corda\", \"loftq\", \"lora_ga\" rewrite the base weights" "$WORK/pissa" --base-model "$PEFT/llama/base"
spoiled_peft pickled 's|x|x|' && mv "$WORK/pickled/adapter_model.safetensors" "$WORK/pickled/adapter_model.bin"
expect_error pickled "pickled holds adapter_model.bin (a pickle, which megatrain does not read) and no \
adapter_model.safetensors: save the adapter again with PEFT's save_pretrained(..., safe_serialization=True)" \
  "$WORK/pickled" --base-model "$PEFT/llama/base"
# a config.json copied beside the adapter (some tools do) does not make it a model: it has no weights
spoiled_peft with_config 's|x|x|' && cp "$PEFT/llama/base/config.json" "$WORK/with_config/"
"$MEGATRAIN" convert "$WORK/with_config" "$WORK/with_config.ckpt" --base-model "$PEFT/llama/base" > /dev/null 2>&1 ||
  fail "PEFT: an adapter directory holding a config.json was not read as an adapter"
# a Hub snapshot whose tokenizer.json blob is missing (an interrupted download: a link to nothing) converts, saying
# that the file is not carried
cp -r "$FIX/llama3_export" "$WORK/dangling" && rm "$WORK/dangling/tokenizer.json"
ln -s "$WORK/blobs/missing" "$WORK/dangling/tokenizer.json"
"$MEGATRAIN" convert "$WORK/dangling" "$WORK/dangling.ckpt" > "$WORK/dangling.log" 2>&1 || fail "dangling: $(cat "$WORK/dangling.log")"
grep -q "warning: $WORK/dangling/tokenizer.json -> $WORK/blobs/missing: a link to nothing (an interrupted download?); \
not carried" "$WORK/dangling.log" || fail "a dangling tokenizer.json link not said: $(cat "$WORK/dangling.log")"
# a --base-model that is not UTF-8: adapter_config.json (JSON) could not hold it
set +e; "$MEGATRAIN" convert "$WORK/x" "$WORK/y" --base-model "$(printf 'base\xff')" > "$WORK/utf8.log" 2>&1; rc=$?; set -e
[[ $rc -eq 2 ]] && grep -q "the path is not UTF-8, which adapter_config.json (JSON text) cannot hold" "$WORK/utf8.log" ||
  fail "--base-model not UTF-8: exit $rc: $(cat "$WORK/utf8.log")"
# launched on 2 ranks (a job script's `mpirun -np N` before every step): rank 0 converts, the other leaves at once
# (before, both wrote DST and one failed with "cannot rename ... File exists")
if command -v mpirun > /dev/null; then
  OMP_NUM_THREADS=1 timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "$MEGATRAIN" convert \
    "$FIX/llama_tied" "$WORK/mpi.ckpt" > "$WORK/mpi.log" 2>&1 || { cat "$WORK/mpi.log"; fail "convert under mpirun -np 2"; }
  grep -q "convert runs in one process; this launch has 2 ranks (OMPI_COMM_WORLD_SIZE): rank 0 does the work" \
    "$WORK/mpi.log" || fail "convert under mpirun: no line saying rank 0 does the work"
  [[ $(grep -c "^converted " "$WORK/mpi.log") -eq 1 ]] || { cat "$WORK/mpi.log"; fail "convert under mpirun: not one conversion"; }
  "$MEGATRAIN" inspect "$WORK/mpi.ckpt" > /dev/null || fail "convert under mpirun: the checkpoint does not load"
fi
echo "convert: all fixtures round-trip byte for byte; errors checked; under mpirun rank 0 alone converts"
