#!/usr/bin/env bash
# test_recipe_errors.sh: bad recipes (tests/fixtures/recipes) and bad --set
# overrides make `megatrain run` exit 2 with one error naming the file, the
# line and the key, before any training starts.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
[[ $MEGATRAIN == */* ]] && MEGATRAIN="$(cd "$(dirname "$MEGATRAIN")" && pwd)/$(basename "$MEGATRAIN")"
cd "$REPO"
FIX=tests/fixtures/recipes

# expect_error RECIPE WHERE KEY [ARGS...]: exit status 2 and exactly one
# "megatrain: error: WHERE..." line on stderr that also contains KEY.
expect_error() {
  local recipe=$1 where=$2 key=$3
  shift 3
  local status=0
  "$MEGATRAIN" run "$recipe" "$@" > "$WORK/stdout" 2> "$WORK/stderr" || status=$?
  [[ $status == 2 ]] || fail "$recipe $*: exit status $status, expected 2; stderr: $(cat "$WORK/stderr")"
  local errors
  errors=$(grep -c '^megatrain: error: ' "$WORK/stderr" || true)
  [[ $errors == 1 ]] || fail "$recipe: expected one error line, found $errors: $(cat "$WORK/stderr")"
  grep -qF "megatrain: error: $where" "$WORK/stderr" ||
    fail "$recipe: error should start with '$where': $(cat "$WORK/stderr")"
  grep -qF "$key" "$WORK/stderr" || fail "$recipe: error should name '$key': $(cat "$WORK/stderr")"
  [[ ! -s $WORK/stdout ]] || fail "$recipe: nothing should run, but stdout has: $(cat "$WORK/stdout")"
}

# line_of FILE TEXT: the number of the first line of FILE containing TEXT.
line_of() { grep -n -m1 -F "$2" "$1" | cut -d: -f1; }

# another trainer's command and an option with underscores: said with megatrain's own
status=0; "$MEGATRAIN" train recipes/tiny/llama.yaml 2> "$WORK/stderr" > /dev/null || status=$?
[[ $status == 2 ]] && grep -qF "megatrain: error: unknown command 'train' (did you mean 'run'?)" "$WORK/stderr" ||
  fail "megatrain train: exit $status: $(head -n 2 "$WORK/stderr")"
expect_error recipes/tiny/llama.yaml "run: unknown option '--resume_if_exists'" "(did you mean --resume-if-exists?)" \
  --resume_if_exists

# a Megatron-LM user's names: run --help points to the page that maps them (which exists), and a Megatron flag
# written as a key is answered with megatrain's, saying what differs in unit
"$MEGATRAIN" run --help > "$WORK/help.txt" || fail "run --help failed"
grep -qF "docs/megatron.md maps a Megatron command line" "$WORK/help.txt" || fail "run --help: $(cat "$WORK/help.txt")"
[[ -f docs/megatron.md ]] || fail "run --help names docs/megatron.md, which is missing"
expect_error recipes/tiny/llama.yaml "--set train.eval_iters=10: unknown key 'train.eval_iters'" \
  "(did you mean 'train.eval_batches'? Megatron's eval_iters counts global batches" --set train.eval_iters=10

f=$FIX/bad_unknown_key.yaml
expect_error "$f" "$f:$(line_of "$f" "stpes:"): unknown key 'train.stpes'" "did you mean 'train.steps'?"
f=$FIX/bad_type.yaml
expect_error "$f" "$f:$(line_of "$f" ": four"): train.micro_batch_size:" "expected a positive integer, found 'four'"
f=$FIX/bad_kv_heads.yaml
expect_error "$f" "$f:$(line_of "$f" "num_key_value_heads:"): model.num_key_value_heads:" "expected a divisor of num_attention_heads (4), found 3"
f=$FIX/bad_range.yaml
expect_error "$f" "$f:$(line_of "$f" "compression_level:"): checkpoint.compression_level:" "expected an integer in 1..22, found '30'"
f=$FIX/bad_syntax.yaml
expect_error "$f" "$f:" "YAML syntax error"
grep -qE "megatrain: error: $f:[0-9]+: YAML syntax error" "$WORK/stderr" || fail "syntax error without a line: $(cat "$WORK/stderr")"
# model: PATH is found in a parent directory of the recipe; errors inside it name the model file
m=$FIX/models/bad_heads.yaml
expect_error "$FIX/nested/bad_model_file.yaml" "$m:$(line_of "$m" "num_key_value_heads:"): model.num_key_value_heads:" "found 3"
f=$FIX/nested/bad_batch.yaml
expect_error "$f" "$f:$(line_of "$f" "global_batch_size:"): train.global_batch_size:" "expected a multiple of micro_batch_size * dp = 2 * 1 = 2, found 5"
# bad overrides name the override
f=$FIX/good_minimal.yaml
expect_error "$f" "--set train.stpes=3: unknown key 'train.stpes'" "did you mean 'train.steps'?" --set train.stpes=3
# an empty value (an empty shell variable, most likely) is refused rather than read as null (the key's default)
expect_error "$f" "--set optimizer.lr=: no value after '='" "optimizer.lr=null" --set optimizer.lr=
# PEFT's names for the LoRA keys are answered with ours
for spec in "r|rank" "lora_alpha|alpha" "lora_dropout|dropout"; do
  expect_error "$f" "--set peft.${spec%%|*}=16: unknown key 'peft.${spec%%|*}'" "did you mean 'peft.${spec#*|}'?" \
    --set "peft.${spec%%|*}=16"
done
expect_error "$f" "--set optimizer.lr=-1: optimizer.lr:" "expected a number >= 0, found '-1'" --set optimizer.lr=-1
expect_error "$f" "--set precision=fp16: precision:" "expected one of fp32 | bf16" --set precision=fp16
# the errors a short command-line run meets say which --set resolves them
expect_error "$f" "--set train.batch_schedule=0:8 100:16: train.batch_schedule:" \
  "(on the command line, --set train.batch_schedule=null or train.global_batch_size=null drops the recipe's)" \
  --set train.global_batch_size=16 --set "train.batch_schedule=0:8 100:16"
expect_error "$f" "--set optimizer.schedule.warmup_steps=5: optimizer.schedule.warmup_steps:" \
  "(a short run needs --set optimizer.schedule.warmup_steps=2 or fewer, or a longer schedule's optimizer.schedule.decay_steps)" --set train.steps=2 \
  --set optimizer.schedule.warmup_steps=5
# a key missing from the recipe is blamed on its section's line, not on a --set of another key there
f=$WORK/no_seq_len.yaml
grep -v 'seq_len:' $FIX/good_minimal.yaml > "$f"
expect_error "$f" "$f:$(line_of "$f" "train:"): train.seq_len: missing required key" "train.seq_len" --set train.steps=3
# a directory given as the recipe is called one (libyaml alone says "input error")
mkdir -p "$WORK/recipe_dir.yaml"
expect_error "$WORK/recipe_dir.yaml" "$WORK/recipe_dir.yaml: is a directory, expected a YAML file" "directory"
# a model too large for this host is refused before anything is allocated, naming the key (not "out of memory")
f=$FIX/good_minimal.yaml
expect_error "$f" "model.intermediate_size: the model does not fit: stage 0 needs about" \
  "most of it is the MLP weights (model.intermediate_size = 2000000000)" \
  --set model.intermediate_size=2000000000 --set run.dir="$WORK/too_large"
# one that fits on more ranks says how many and how (plan_fit): an MLP sized to this host's memory and swap, so that
# one rank needs about 1.5 times it and two (tp 2 or pp 2: each half of the MLP) about 0.75 times
mem=$(awk '/^(MemTotal|SwapTotal):/ { kib += $2 } END { printf "%.0f", kib * 1024 }' /proc/meminfo)
# (plan's estimate: about 22 bytes an MLP parameter here, its fp32 weight, gradient, AdamW m and v and the MLP's
# activations of 2 x 32 tokens)
inter=$(( mem * 3 / 2 / (22 * 3 * 2 * 64) / 64 * 64 ))
expect_error "$f" "model.intermediate_size: the model does not fit: stage 0 needs about" "; it fits on 2 ranks as " \
  --set model.intermediate_size=$inter --set run.dir="$WORK/too_large"
# ... and a run refused before its first step leaves no run.dir it made (an existing one stays)
[[ ! -e "$WORK/too_large" ]] || fail "the refused run left its new run.dir behind: $(ls -A "$WORK/too_large")"
mkdir -p "$WORK/kept"
"$MEGATRAIN" run "$f" --set run.dir="$WORK/kept" --set "data.train=[{path: $WORK/no_such_data, weight: 1.0}]" \
  > /dev/null 2>&1 && fail "a run on missing data did not fail"
[[ -d "$WORK/kept" ]] || fail "a refused run removed a run.dir that existed before it"
# data with ids past the model's vocabulary (another tokenizer's) is refused before the first step, naming the
# dataset and the token (exit 1: the data, not the recipe), and the run.dir it made goes, with its index cache
demo_data "$WORK/english"
status=0
"$MEGATRAIN" run "$f" --set run.dir="$WORK/vocab" --set model.vocab_size=100 \
  --set "data.train=[{path: $WORK/english, weight: 1.0}]" > /dev/null 2> "$WORK/stderr" || status=$?
[[ $status == 1 ]] || fail "data outside the vocabulary: exit status $status, expected 1: $(cat "$WORK/stderr")"
grep -qF "megatrain: error: training data: $WORK/english: token 112 (token 34 of sequence 0) is outside the" \
  "$WORK/stderr" || fail "data outside the vocabulary: $(cat "$WORK/stderr")"
grep -qF "model's vocabulary [0, 100): was the dataset built with another tokenizer" "$WORK/stderr" ||
  fail "data outside the vocabulary: $(cat "$WORK/stderr")"
[[ ! -e "$WORK/vocab" ]] || fail "the refused run left its new run.dir behind: $(ls -A "$WORK/vocab")"
# ... and the parent directories it made for run.dir (runs/a/b where runs/ was not there: runs/ goes), but none that
# was there before it (kept/ stays)
"$MEGATRAIN" run "$f" --set run.dir="$WORK/kept/runs/a/b" --set model.vocab_size=100 \
  --set "data.train=[{path: $WORK/english, weight: 1.0}]" > /dev/null 2>&1 && fail "data outside the vocabulary ran"
[[ -d "$WORK/kept" && ! -e "$WORK/kept/runs" ]] ||
  fail "the refused run left the parents it made of run.dir: $(find "$WORK/kept" -mindepth 1)"
# a sample index larger than the memory the process may use (a 2 GB address-space limit here) is refused, naming
# what asks for the samples, instead of an allocation failing with a byte count (not under the sanitizers, whose
# runs cannot take an address-space limit)
if [[ ${MT_SANITIZE:-0} != 1 ]]; then
  status=0
  (ulimit -v 2000000; exec "$MEGATRAIN" run "$f" --set run.dir="$WORK/huge_index" --set train.steps=50000000 \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]" > /dev/null 2> "$WORK/stderr") || status=$?
  [[ $status == 1 ]] && grep -qF "need a sample index of" "$WORK/stderr" &&
    grep -qF "GiB of memory this process may use: ask for fewer samples (train.steps x the global batch size" \
      "$WORK/stderr" || fail "a huge sample index: exit $status: $(cat "$WORK/stderr")"
  [[ ! -e "$WORK/huge_index" ]] || fail "the refused run left its new run.dir behind"
fi
# the largest budgets the recipe takes are refused at once (the schedule is walked a stage at a time, the sample
# index sized before it is counted), not walked for ever; beyond them the keys refuse
for budget in "train.steps=9007199254740992" "train.tokens=9e15"; do
  status=0
  timeout 20 "$MEGATRAIN" run "$f" --set run.dir="$WORK/budget" --set train.steps=null --set "$budget" \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]" > /dev/null 2> "$WORK/stderr" || status=$?
  [[ $status == 1 ]] && grep -qF "too many for a sample index; ask for fewer samples" "$WORK/stderr" ||
    fail "$budget: exit $status (124: it hung): $(cat "$WORK/stderr")"
done
expect_error "$f" "--set train.tokens=1e30: train.tokens: expected a positive token count like 2400000000 or 2.4B, at most 2^53" \
  "" --set train.steps=null --set train.tokens=1e30
# one document a recipe (a second after --- is not ignored), and at most 1 MiB of YAML (libyaml holds a whole
# document before the node cap applies: 20 MB of a list took 1.6 GB)
{ cat "$FIX/good_minimal.yaml"; echo ---; echo 'train: {steps: 3}'; } > "$WORK/two_docs.yaml"
lines=$(($(wc -l < "$FIX/good_minimal.yaml") + 1))
expect_error "$WORK/two_docs.yaml" "$WORK/two_docs.yaml:$lines: a second YAML document (after ---)" "a recipe is one document"
expect_error "$FIX/good_minimal.yaml" "--set train.steps=3" "a second YAML document" --set $'train.steps=3\n---\nx: 1'
{ cat "$FIX/good_minimal.yaml"; echo ---; } > "$WORK/trailing_dashes.yaml"
"$MEGATRAIN" plan "$WORK/trailing_dashes.yaml" > /dev/null || fail "a trailing --- (an empty document) was refused"
{ cat "$FIX/good_minimal.yaml"; printf '# %01100000d\n' 0; } > "$WORK/big.yaml"
expect_error "$WORK/big.yaml" "$WORK/big.yaml: 1.0 MiB; a recipe is a few KiB" "at most 1 MiB"
# values that parse but mean nothing: a negative clip_grad (it disabled clipping, as 0 does), weights whose sum
# overflows, and a value of blanks or a comment (it reset the key to its default, as no value is refused for)
expect_error "$FIX/good_minimal.yaml" "--set optimizer.clip_grad=-1: optimizer.clip_grad: expected a number >= 0" \
  "optimizer.clip_grad" --set optimizer.clip_grad=-1
expect_error "$FIX/good_minimal.yaml" "--set data.split=[1e308, 1e308, 0]: data.split: expected weights whose sum is a number" \
  "data.split" --set "data.split=[1e308, 1e308, 0]"
for blank in "optimizer.lr= " "optimizer.lr=#x"; do
  expect_error "$FIX/good_minimal.yaml" "--set $blank: no value after '='" "optimizer.lr=null" --set "$blank"
done
# sizes each within its bound whose product is not (the registry's offsets overflowed: UBSan, and plan printed a
# wrapped total)
expect_error "$FIX/good_minimal.yaml" "model: its sizes make about 1.12e+20 parameters; at most 2^50" "supported" \
  --set model.num_layers=1024 --set model.hidden_size=16777216 --set model.num_attention_heads=2 \
  --set model.num_key_value_heads=2 --set model.intermediate_size=2147483646
# --set model=FILE, then --set model.KEY=...: the key changes the file's model (it was refused: 'model' not a
# mapping); the other order would drop the key, and is refused naming both
"$MEGATRAIN" plan recipes/gpu/llama3-8b-h200.yaml --set model=configs/llama3-8b.yaml --set model.num_layers=4 \
  > "$WORK/plan.txt" 2>&1 && grep -q "llama, 1.92B params, 4 layers" "$WORK/plan.txt" ||
  fail "--set model=FILE then model.num_layers: $(cat "$WORK/plan.txt")"
status=0
"$MEGATRAIN" plan recipes/gpu/llama3-8b-h200.yaml --set model.num_layers=4 --set model=configs/llama3-8b.yaml \
  > /dev/null 2> "$WORK/stderr" || status=$?
[[ $status == 2 ]] && grep -qF -- "--set model=configs/llama3-8b.yaml replaces the whole model section, so the earlier --set model.num_layers=4 would be lost" \
  "$WORK/stderr" || fail "model.num_layers then model=FILE: exit $status: $(cat "$WORK/stderr")"
# Megatron's and Hugging Face's names: parallel.dp is explained, num_hidden_layers points at num_layers
expect_error "$FIX/good_minimal.yaml" "--set parallel.dp=2: unknown key 'parallel.dp': the data-parallel size is not set" \
  "world size / (tp * cp * pp)" --set parallel.dp=2
expect_error "$FIX/good_minimal.yaml" "--set model.num_hidden_layers=3: unknown key 'model.num_hidden_layers'" \
  "did you mean 'model.num_layers'" --set model.num_hidden_layers=3
# Megatron-LM's MoE flags (docs/moe.md's list) and Hugging Face's config.json names point at the model.moe keys, in
# that section or written flat
for spec in "moe_router_topk|num_experts_per_tok" "moe_ffn_hidden_size|moe_intermediate_size" \
    "moe_aux_loss_coeff|aux_loss_coeff" "moe_z_loss_coeff|z_loss_coeff" "moe_expert_capacity_factor|capacity_factor" \
    "moe_router_load_balancing_type|load_balancing" "moe_router_score_function|score_function" \
    "moe_shared_expert_intermediate_size|shared_expert_intermediate_size" "moe_layer_freq|layer_freq" \
    "moe_router_bias_update_rate|bias_update_rate" "num_local_experts|num_experts" \
    "router_aux_loss_coef|aux_loss_coeff" "router_z_loss_coef|z_loss_coeff" "decoder_sparse_step|layer_freq" \
    "mlp_only_layers|layer_freq"; do
  expect_error recipes/tiny/mixtral.yaml "--set model.moe.${spec%|*}=1: unknown key 'model.moe.${spec%|*}'" \
    "did you mean 'model.moe.${spec#*|}'" --set "model.moe.${spec%|*}=1"
done
# etp must divide the experts' (and the shared expert's) intermediate: plan refuses it as run does, naming the key
for size in moe_intermediate_size=49 shared_expert_intermediate_size=33; do
  status=0
  "$MEGATRAIN" plan recipes/tiny/qwen3_moe.yaml --world 2 --set parallel.tp=2 --set parallel.etp=2 \
    --set "model.moe.$size" > "$WORK/stdout" 2> "$WORK/stderr" || status=$?
  [[ $status == 2 ]] && grep -qF "parallel.etp: expected a divisor of model.moe.${size%=*} (${size#*=})" "$WORK/stderr" ||
    fail "plan with etp 2 and $size: exit $status: $(cat "$WORK/stderr")"
done
expect_error recipes/tiny/mixtral.yaml "--set model.moe_router_topk=2: unknown key 'model.moe_router_topk'" \
  "did you mean 'model.moe.num_experts_per_tok'" --set model.moe_router_topk=2
# rope_scaling names its type: an empty or partial mapping used to turn Llama 3.1's scaling on with its defaults;
# Hugging Face's rope_type default is none, as in config.json
for value in "{}" "{factor: 4}"; do
  expect_error "$FIX/good_minimal.yaml" "--set model.rope_scaling=$value: model.rope_scaling: expected a type" \
    "or null for none" --set "model.rope_scaling=$value"
done
"$MEGATRAIN" plan "$FIX/good_minimal.yaml" --set "model.rope_scaling={rope_type: default}" > /dev/null ||
  fail "rope_scaling {rope_type: default} refused"
# warmup within the steps a token budget takes, as within train.steps
expect_error recipes/tiny/llama.yaml "recipes/tiny/llama.yaml:41: optimizer.schedule.warmup_steps: expected at most the 2 steps train.tokens (1024) takes, found 20" \
  "optimizer.schedule.warmup_steps=2 or fewer" --set train.steps=null --set train.tokens=1024
# alias bombs (nested aliases expanding to millions of nodes: tests/fuzz/crashes/recipe_yaml) are
# refused in milliseconds at the line of the alias that crossed the cap, by `plan` too, and in a --set
# (in a subshell limited to 1 GB, so that a regression fails instead of exhausting the machine)
(
limit_address_space 1000000
bombs=tests/fuzz/crashes/recipe_yaml
for spec in "bomb_d6.yaml|l4: &l4" "bomb_d7.yaml|l4: &l4" "bomb_toplevel.yaml|e: &e" "bomb_betas.yaml|_anch4:"; do
  f=$bombs/${spec%%|*}
  expect_error "$f" "$f:$(line_of "$f" "${spec#*|}"): YAML aliases expand the document past 100000 nodes" \
    "a recipe needs a few hundred"
  start=$(date +%s%N)
  status=0
  timeout 20 "$MEGATRAIN" plan "$f" > "$WORK/stdout" 2> "$WORK/stderr" || status=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  [[ $status == 2 ]] && grep -q "^megatrain: error: $f:[0-9]*: YAML aliases" "$WORK/stderr" ||
    fail "plan $f: exit status $status, expected 2 with the alias error: $(cat "$WORK/stderr")"
  # (tests/run_sanitize.sh: ASan's whole-stack unwinding at every allocation makes parsing ten times slower;
  # an expansion that is not cut off still takes minutes there)
  (( ms < (${MT_SANITIZE:-0} == 1 ? 20000 : 2000) )) || fail "plan $f: took $ms ms to refuse (expected milliseconds)"
done
ten() { local x=$1; echo "[$x,$x,$x,$x,$x,$x,$x,$x,$x,$x]"; }
set_bomb="optimizer.betas=[&a $(ten x), &b $(ten '*a'), &c $(ten '*b'), &d $(ten '*c'), &e $(ten '*d'), &f $(ten '*e')]"
expect_error "$FIX/good_minimal.yaml" "--set $set_bomb: YAML aliases expand the document past 100000 nodes" \
  "a recipe needs a few hundred" --set "$set_bomb"
)
# a missing recipe file is named
expect_error "$WORK/no-such-recipe.yaml" "$WORK/no-such-recipe.yaml" "No such file"
# a tiny recipe run where its demo data is missing: the error says which script builds it, for that path
mkdir -p "$WORK/elsewhere"
status=0
(cd "$WORK/elsewhere" && "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/elsewhere/run") \
  > /dev/null 2> "$WORK/demo.log" || status=$?
[[ $status == 1 ]] && grep -qF "data.train[0].path: $WORK/elsewhere/data/demo/english.idx: cannot open: No such file or directory (the demo data set of recipes/tiny: \`bash scripts/demo_data.sh $WORK/elsewhere/data/demo/english\` in the megatrain checkout builds it)" \
  "$WORK/demo.log" || fail "missing demo data: exit $status: $(cat "$WORK/demo.log")"
# the fine-tuning recipe run where no checkpoint was converted: its model file is said to be convert's to write
status=0
(cd "$WORK/elsewhere" && "$MEGATRAIN" run "$REPO/recipes/sft/lora_finetune.yaml") > /dev/null 2> "$WORK/nockpt.log" ||
  status=$?
[[ $status == 2 ]] && grep -qF "lora_finetune.yaml:23: model: expected a mapping or the path of a model file, found 'ckpt/base/model.yaml', which is neither in the current directory nor beside the recipe or in a directory above it (a checkpoint's model config: \`megatrain convert HF_MODEL_DIR ckpt/base\` run here writes it)" \
  "$WORK/nockpt.log" || fail "missing checkpoint model file: exit $status: $(cat "$WORK/nockpt.log")"
# any other missing dataset (the fine-tuning recipe's data/my-sft, not built yet) is said to be data build's to write
status=0
(cd "$WORK/elsewhere" && "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/elsewhere/run" \
  --set "data.train=[data/my-sft]") > /dev/null 2> "$WORK/nodata.log" || status=$?
[[ $status == 1 ]] && grep -qF "data.train[0].path: $WORK/elsewhere/data/my-sft.idx: cannot open: No such file or directory (no dataset at that prefix: \`megatrain data build --input FILE --output $WORK/elsewhere/data/my-sft\` writes one, with --format sft for conversations; or give another path)" \
  "$WORK/nodata.log" || fail "missing data: exit $status: $(cat "$WORK/nodata.log")"
# Under mpirun every rank refuses the recipe and exits 2, and the error is printed once (by the first rank), with no
# abort: 4 ranks, an expert layout refused against the world size, and a misspelt key; a resume on 3 ranks of a
# checkpoint whose tp 2 does not divide them (the recipe's layout hint printed once too).
if command -v mpirun > /dev/null && [[ -z ${TSAN_OPTIONS:-} ]]; then
  said_once_status() { # STATUS NAME NP ARGS...: megatrain ARGS on NP ranks, every rank exit STATUS, one error
    local status=$1 name=$2 np=$3
    shift 3
    ranks_end "$status" "$name" "$np" "$WORK/$name.log" "$MEGATRAIN" "$@"
    [[ $(grep -c '^megatrain: error: ' "$WORK/$name.log") -eq 1 ]] || fail "$name: not one error: $(cat "$WORK/$name.log")"
  }
  said_once() { said_once_status 2 "$@"; }
  said_once ep-layout 4 run recipes/tiny/qwen3_moe.yaml --set parallel.ep=4 --set parallel.tp=2 \
    --set train.micro_batch_size=4
  said_once misspelt 4 run recipes/tiny/llama.yaml --set train.stpes=3
  demo_data "$WORK/english"
  "$MEGATRAIN" run recipes/tiny/llama.yaml --set run.dir="$WORK/two" --set train.steps=2 \
    --set optimizer.schedule.warmup_steps=0 --set "data.train=[{path: $WORK/english, weight: 1.0}]" > /dev/null
  said_once resume-tp2 3 resume "$WORK/two" --set parallel.tp=2
  [[ $(grep -c "checkpoints resume on any layout" "$WORK/resume-tp2.log") -eq 1 ]] ||
    fail "resume-tp2: the layout hint not once: $(cat "$WORK/resume-tp2.log")"
  # a MoE checkpoint resumed with an expert split this launch cannot hold: the hint names ep and etp
  "$MEGATRAIN" run recipes/tiny/qwen3_moe.yaml --set run.dir="$WORK/moe1" --set train.steps=1 \
    --set optimizer.schedule.warmup_steps=0 --set "data.train=[{path: $WORK/english, weight: 1.0}]" > /dev/null
  status=0
  "$MEGATRAIN" resume "$WORK/moe1" --set parallel.ep=2 > /dev/null 2> "$WORK/resume-ep.log" || status=$?
  [[ $status == 2 ]] && grep -qF "parallel.ep: expected a divisor of dp" "$WORK/resume-ep.log" &&
    grep -qF "(checkpoints resume on any layout: set this launch's expert split, e.g. --set parallel.ep=1" \
      "$WORK/resume-ep.log" || fail "resume-ep: exit $status: $(cat "$WORK/resume-ep.log")"
  # a layout this launch cannot hold: the hint names the experts' keys for a MoE checkpoint, and for it only
  status=0
  "$MEGATRAIN" resume "$WORK/moe1" --set parallel.tp=2 > /dev/null 2> "$WORK/resume-moe-tp2.log" || status=$?
  [[ $status == 2 ]] && grep -qF "parallel.pp_layers=null; a MoE model's experts too, e.g. --set parallel.ep=1" \
    "$WORK/resume-moe-tp2.log" || fail "resume-moe-tp2: exit $status: $(cat "$WORK/resume-moe-tp2.log")"
  grep -q "experts too" "$WORK/resume-tp2.log" && fail "resume-tp2: a dense checkpoint's hint names the experts"
  echo "recipe errors under mpirun (run and resume): said once, every rank exit 2"
  # Refusals in setup after the recipe, before the model's collectives (a data path, the data's vocabulary, run.dir
  # rank 0 cannot make, a checkpoint that is not there or does not fit): the ranks agree, one says it, none aborts.
  two_ranks=(--set train.micro_batch_size=4 --set optimizer.schedule.warmup_steps=0 --set train.steps=2)
  said_once_status 1 run-data 2 run recipes/tiny/llama.yaml --set run.dir="$WORK/run-data" "${two_ranks[@]}" \
    --set "data.train=[{path: $WORK/no-such-data, weight: 1.0}]"
  grep -q "training data: data.train\[0\].path: $WORK/no-such-data.idx: cannot open" "$WORK/run-data.log" || fail "run-data: $(cat "$WORK/run-data.log")"
  [[ ! -e $WORK/run-data ]] || fail "run-data: the refused run left its run.dir"
  said_once_status 1 run-vocab 2 run recipes/tiny/llama.yaml --set run.dir="$WORK/run-vocab" "${two_ranks[@]}" \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set model.vocab_size=100
  grep -q "outside the model's vocabulary" "$WORK/run-vocab.log" || fail "run-vocab: $(cat "$WORK/run-vocab.log")"
  # (every rank lists run.dir/checkpoints, a path under a file fails them all; under /proc, rank 0's mkdir alone)
  said_once_status 1 run-dir 2 run recipes/tiny/llama.yaml --set run.dir=/proc/megatrain-test/run "${two_ranks[@]}" \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]"
  grep -q "error: rank 0: run.dir: " "$WORK/run-dir.log" || fail "run-dir: rank 0 alone failed, unnamed: $(cat "$WORK/run-dir.log")"
  said_once_status 2 resume-missing 2 resume "$WORK/no-such-run" # a missing path: usage, as every command's
  said_once_status 1 resume-data 2 resume "$WORK/two" --set train.micro_batch_size=4 --set train.steps=4 \
    --set "data.train=[{path: $WORK/no-such-data, weight: 1.0}]"
  said_once_status 2 resume-shape 2 resume "$WORK/two" --set train.micro_batch_size=4 --set model.hidden_size=128
  grep -q "model.hidden_size is 64 in the checkpoint" "$WORK/resume-shape.log" ||
    fail "resume-shape: $(cat "$WORK/resume-shape.log")"
  echo "setup refusals under mpirun (data, vocabulary, run.dir, resume's checkpoint): said once, no abort"
  # ranks given different recipes (mpirun's MPMD form): the first that differs from rank 0 says so, all exit 2,
  # before run.dir is made (it used to surface as a NaN and an MPI_ERR_TRUNCATE)
  rm -f "$WORK"/mpmd.status.*
  record='f=$1; shift; "$@"; echo $? > "$f.$OMPI_COMM_WORLD_RANK"'
  OMPI_MCA_orte_abort_on_non_zero_status=0 timeout 120 mpirun --allow-run-as-root --oversubscribe \
    -np 1 bash -c "$record" _ "$WORK/mpmd.status" "$MEGATRAIN" run recipes/tiny/llama.yaml --set run.dir="$WORK/mpmd" \
      "${two_ranks[@]}" --set "data.train=[{path: $WORK/english, weight: 1.0}]" : \
    -np 1 bash -c "$record" _ "$WORK/mpmd.status" "$MEGATRAIN" run recipes/tiny/llama.yaml --set run.dir="$WORK/mpmd" \
      "${two_ranks[@]}" --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set train.steps=4 \
    > "$WORK/mpmd.log" 2>&1 || true
  grep -qF "error: rank 1: its resolved recipe differs from rank 0's, first at train.steps: '4' here, '2' on rank 0" "$WORK/mpmd.log" &&
    [[ $(grep -c '^megatrain: error: ' "$WORK/mpmd.log") -eq 1 ]] && ! grep -qE "MPI_ABORT|stopping the job" "$WORK/mpmd.log" &&
    [[ "$(cat "$WORK"/mpmd.status.* | sort -u | tr '\n' ' ')" == "2 " && $(ls "$WORK"/mpmd.status.* | wc -l) -eq 2 ]] &&
    [[ ! -e $WORK/mpmd ]] ||
    fail "ranks with different recipes: $(cat "$WORK/mpmd.log") statuses: $(grep . "$WORK"/mpmd.status.*)"
  # ranks started in different directories (mpirun -wdir) with a relative data path: each makes it absolute from its
  # own, so they name other files (here the same through a link): refused naming the cause, not as another recipe
  mkdir -p "$WORK/wdir-a/corpus" "$WORK/wdir-b"
  cp "$WORK/english.bin" "$WORK/english.idx" "$WORK/wdir-a/corpus/"
  ln -sfn "$WORK/wdir-a/corpus" "$WORK/wdir-b/corpus"
  wdir_rank() { # DIR: one rank's arguments, started in DIR
    echo -np 1 -wdir "$1" "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/wdir-run" \
      "${two_ranks[@]}" --set "data.train=[corpus/english]"
  }
  OMPI_MCA_orte_abort_on_non_zero_status=0 timeout 120 mpirun --allow-run-as-root --oversubscribe \
    $(wdir_rank "$WORK/wdir-a") : $(wdir_rank "$WORK/wdir-b") > "$WORK/wdir.log" 2>&1 || true
  grep -qF "error: rank 1: it resolves the recipe's data paths to other files than rank 0 does (relative paths are taken from the current directory, here $WORK/wdir-b; data.train[0].path is $WORK/wdir-b/corpus/english)" \
    "$WORK/wdir.log" && [[ ! -e $WORK/wdir-run ]] || fail "ranks in different directories: $(cat "$WORK/wdir.log")"
  # a launcher's variable without the launcher (SLURM_NTASKS in a batch script run without srun): MPI starts one
  # rank, which is refused, naming the variable, rather than trained as one of two
  status=0
  SLURM_NTASKS=2 timeout 60 "$MEGATRAIN" run recipes/tiny/llama.yaml --set run.dir="$WORK/slurm" "${two_ranks[@]}" \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]" > "$WORK/slurm.log" 2>&1 || status=$?
  [[ $status == 2 ]] && grep -q "SLURM_NTASKS=2 says 2 ranks, but MPI started 1: start every rank with srun or mpirun" \
    "$WORK/slurm.log" && [[ ! -e $WORK/slurm ]] || fail "SLURM_NTASKS=2 alone: exit $status: $(cat "$WORK/slurm.log")"
fi
echo "recipe errors: ok"
