#!/usr/bin/env bash
# test_peft_transformers.sh: what a LoRA run writes, Hugging Face PEFT loads.
# Needs torch, transformers and peft: without them in python3 it installs
# them into build/test-venv (tests/python_env.sh torch peft, from PyPI); it
# skips (77) only when that cannot be done, and fails then in CI (CI=true;
# lib.sh, need_python).
# For a tiny llama (every linear layer adapted), qwen3 (q/k norm, a
# subset of the layers) and qwen3_moe (the attention projections: the
# experts and router frozen), made and saved by transformers:
#   convert it, fine-tune it with LoRA from it (init_from) on one document
#   of seq_len = 44 tokens, so that every sample is the same (the document
#   and the next copy's first token), one per step, checkpoints every step;
#   step 1's loss is the base model's (transformers', on that document):
#   the adapters start as PEFT starts them (B = 0);
#   convert step 3's checkpoint to PEFT's adapter directory and, with
#   --merge-lora, to a merged model;
#   PeftModel.from_pretrained(base, adapter) loads it (B not zero), and its
#   loss on the document is step 4's logged loss (computed with step 3's
#   weights), relative error < 1e-5;
#   transformers loads the merged model (no missing or unexpected weights)
#   with the PEFT model's logits (< 1e-5), and PEFT's own merge_and_unload
#   gives our merged weights (< 1e-6 per tensor) and logits (< 1e-5);
#   with --base-model the base directory, AutoPeftModelForCausalLM loads
#   the adapters by themselves (the base from adapter_config.json), same loss.
# And the other way: an adapter PEFT made (random A and B, lora_dropout 0.05;
#   llama's target_modules "all-linear", which PEFT saves as every path)
#   converted with its base (`convert ADAPTER DST --base-model BASE`, the
#   dropout note said; onto the base's checkpoint, referencing it, the same
#   eval loss): `eval` of it and step 1 of a LoRA run from it
#   (init_from the one onto the base's checkpoint, with model: its
#   model.yaml, whose peft: the recipe takes)
#   give PEFT's loss on the document (relative error < 1e-5),
#   and converting it back gives PEFT's adapter_model.safetensors byte for
#   byte.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need_python peft
export MEGATRAIN PYTHONWARNINGS=ignore TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

printf 'The quick brown fox jumps over the lazy dog\n' > "$WORK/doc.txt"   # 43 bytes + end of document: 44 tokens
"$MEGATRAIN" data build --input "$WORK/doc.txt" --output "$WORK/doc" > /dev/null

cat > "$WORK/peft_check.py" <<'EOF'
import json, sys, torch, transformers as tf, peft
from safetensors.torch import load_file
tf.utils.logging.disable_progress_bar()
FAMILIES = {
    "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, dict(num_key_value_heads=2, head_dim=16)),
    "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM, dict(num_key_value_heads=2, head_dim=16, num_experts=4,
                                                                  num_experts_per_tok=2, moe_intermediate_size=24,
                                                                  norm_topk_prob=True)),
}
DOC = list(b"The quick brown fox jumps over the lazy dog\n")
SAMPLE = DOC + DOC[:1]  # every sample of the run: seq_len + 1 tokens of the repeated document

def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()

def loss_of(model):
    ids = torch.tensor([SAMPLE])
    logits = model(ids[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits[0], ids[0, 1:]).item(), logits

def make(root, name):
    Config, Model, extra = FAMILIES[name]
    torch.manual_seed(3)
    cfg = Config(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=64, rms_norm_eps=1e-5, **extra)
    model = Model(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn(p.shape) if "norm" in n else 0.1 * torch.randn(p.shape))
    model.save_pretrained(f"{root}/{name}.base")
    adapter(root, name)

def adapter(root, name):
    """A PEFT adapter made by PEFT itself (A and B random, lora_dropout 0.05 as PEFT users often set it), saved for
    `megatrain convert ADAPTER DST --base-model BASE`, with its loss on the document in NAME.peft/loss."""
    Config, Model, extra = FAMILIES[name]
    base = Model.from_pretrained(f"{root}/{name}.base", attn_implementation="eager")
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=12, lora_dropout=0.05,
                                                      target_modules=TARGETS[name], task_type="CAUSAL_LM"))
    torch.manual_seed(11)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(0.3 * torch.randn(p.shape))
        loss, _ = loss_of(model.eval())
    model.save_pretrained(f"{root}/{name}.peft")
    with open(f"{root}/{name}.peft/loss", "w") as f:
        f.write(f"{loss:.9g}\n")

# llama: "all-linear", which PEFT saves expanded to every projection's path in every layer
TARGETS = {"llama": "all-linear", "qwen3": ["q_proj", "v_proj", "o_proj", "down_proj"],
           "qwen3_moe": ["q_proj", "k_proj", "v_proj", "o_proj"]}

def check(root, name):
    Config, Model, extra = FAMILIES[name]
    losses = [json.loads(line)["loss"] for line in open(f"{root}/{name}.run/metrics.jsonl")]
    base = Model.from_pretrained(f"{root}/{name}.base", attn_implementation="eager").eval()
    with torch.no_grad():
        base_loss, base_logits = loss_of(base)
    e = abs(losses[0] - base_loss) / base_loss
    assert e < 1e-5, f"{name}: step 1 loss {losses[0]} vs the base model's {base_loss} ({e:.2e})"
    model = peft.PeftModel.from_pretrained(base, f"{root}/{name}.adapter").eval()
    b_norm = sum(p.abs().sum().item() for n, p in model.named_parameters() if "lora_B" in n)
    assert b_norm > 0, f"{name}: every lora_B is zero: the check would be vacuous"
    with torch.no_grad():
        peft_loss, peft_logits = loss_of(model)
    e = abs(losses[3] - peft_loss) / peft_loss
    assert e < 1e-5, f"{name}: PEFT's loss {peft_loss} vs megatrain's {losses[3]} at step 4 ({e:.2e})"
    assert (peft_logits - base_logits).abs().max().item() > 1e-3, f"{name}: the adapters change nothing"
    merged, info = Model.from_pretrained(f"{root}/{name}.merged", attn_implementation="eager",
                                         output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"{name}: loading the merged model: {bad}"
    with torch.no_grad():
        _, merged_logits = loss_of(merged.eval())
        theirs = model.merge_and_unload()
        _, theirs_logits = loss_of(theirs)
    ours_sd, theirs_sd = merged.state_dict(), theirs.state_dict()
    assert ours_sd.keys() == theirs_sd.keys(), f"{name}: merged parameter names differ"
    worst = max(rel(ours_sd[k], theirs_sd[k]) for k in ours_sd)
    assert worst < 1e-6, f"{name}: merged weights differ from merge_and_unload's by {worst:.2e}"
    # convert --base-model: AutoPeftModelForCausalLM finds the base by itself, with the same loss
    auto = peft.AutoPeftModelForCausalLM.from_pretrained(f"{root}/{name}.adapter-auto", attn_implementation="eager")
    with torch.no_grad():
        auto_loss, _ = loss_of(auto.eval())
    assert abs(auto_loss - peft_loss) <= 1e-6 * peft_loss, f"{name}: AutoPeftModelForCausalLM's loss {auto_loss}"
    e1, e2 = rel(merged_logits, peft_logits), rel(merged_logits, theirs_logits)
    assert e1 < 1e-5 and e2 < 1e-5, f"{name}: merged logits vs PEFT {e1:.2e}, vs merge_and_unload {e2:.2e}"
    print(f"{name}: step 1 loss = the base model's; PEFT loads the adapters: loss {peft_loss:.6f} = step 4's "
          f"{losses[3]:.6f} ({abs(losses[3] - peft_loss) / peft_loss:.1e}); merged weights = merge_and_unload's "
          f"({worst:.1e}), logits {e1:.1e} / {e2:.1e}")

{"make": make, "check": check}[sys.argv[1]](sys.argv[2], sys.argv[3])
EOF

for family in llama qwen3 qwen3_moe; do
  targets="[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]"
  [[ $family == qwen3 ]] && targets="[q_proj, v_proj, o_proj, down_proj]"
  [[ $family == qwen3_moe ]] && targets="[q_proj, k_proj, v_proj, o_proj]" # the experts have no adapters
  "$PY" "$WORK/peft_check.py" make "$WORK" $family > "$WORK/$family.make.log" 2>&1 || fail "$(tail -n 5 "$WORK/$family.make.log")"
  "$MEGATRAIN" convert "$WORK/$family.base" "$WORK/$family.ckpt" > /dev/null
  cat > "$WORK/$family.yaml" <<EOF
run: {name: peft-$family, dir: $WORK/$family.run, seed: 5, device: cpu}
model: $WORK/$family.ckpt/model.yaml
init_from: $WORK/$family.ckpt
peft: {type: lora, rank: 4, alpha: 8, target_modules: $targets}
train: {steps: 4, seq_len: 44, micro_batch_size: 1, global_batch_size: 1, eval_interval: 0}
optimizer: {lr: 1.0e-2, schedule: {warmup_steps: 0, decay: constant}}
precision: fp32
data: {train: [{path: $WORK/doc, weight: 1.0}], split: [1, 0, 0]}
checkpoint: {interval: 1, keep_last: 4}
logging: {tensorboard: false}
EOF
  "$MEGATRAIN" run "$WORK/$family.yaml" > "$WORK/$family.run.log" 2>&1 || { cat "$WORK/$family.run.log"; fail "$family: the run failed"; }
  "$MEGATRAIN" convert "$WORK/$family.run/checkpoints/iter_0000003" "$WORK/$family.adapter" > /dev/null
  "$MEGATRAIN" convert "$WORK/$family.run/checkpoints/iter_0000003" "$WORK/$family.merged" --merge-lora > /dev/null
  (cd "$WORK" && "$MEGATRAIN" convert "$WORK/$family.run/checkpoints/iter_0000003" "$WORK/$family.adapter-auto" \
    --base-model "$family.base" > /dev/null) # a relative directory: written absolute
  grep -q "\"base_model_name_or_path\": \"$WORK/$family.base\"" "$WORK/$family.adapter-auto/adapter_config.json" ||
    fail "$family: --base-model not written: $(cat "$WORK/$family.adapter-auto/adapter_config.json")"
  [[ -f "$WORK/$family.adapter/adapter_model.safetensors" && -f "$WORK/$family.adapter/adapter_config.json" ]] \
    || fail "$family: the adapter directory is incomplete"
  "$PY" "$WORK/peft_check.py" check "$WORK" $family > "$WORK/$family.check.log" 2>&1 \
    || fail "$(tail -n 5 "$WORK/$family.check.log")"
  cat "$WORK/$family.check.log"

  # PEFT -> megatrain: an adapter PEFT made and saved, converted with its base, scores PEFT's loss in `eval`, trains
  # from it (init_from, step 1's loss PEFT's), and converts back to PEFT's own bytes
  peft_loss=$(cat "$WORK/$family.peft/loss") # made by peft_check.py make
  "$MEGATRAIN" convert "$WORK/$family.peft" "$WORK/$family.imported" --base-model "$WORK/$family.base" \
    > "$WORK/$family.import.log" 2>&1 || fail "$family: import: $(tail -n 3 "$WORK/$family.import.log")"
  grep -q "lora_dropout 0.05 is read as 0" "$WORK/$family.import.log" || fail "$family: import: no dropout note"
  [[ $family != llama ]] || grep -q '"model.layers.1.mlp.down_proj"' "$WORK/$family.peft/adapter_config.json" ||
    fail "PEFT no longer saves all-linear as paths: $(grep -A3 target_modules "$WORK/$family.peft/adapter_config.json")"
  eval_loss=$("$MEGATRAIN" eval "$WORK/$family.imported" --data "$WORK/doc" --seq-len 44 --micro-batch-size 1 \
    --batches 1 --json | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["loss"])')
  # onto the base's checkpoint (the adapters alone, referencing it): the same loss
  "$MEGATRAIN" convert "$WORK/$family.peft" "$WORK/$family.small" --base-model "$WORK/$family.ckpt" > /dev/null 2>&1 ||
    fail "$family: import onto the base's checkpoint failed"
  small_loss=$("$MEGATRAIN" eval "$WORK/$family.small" --data "$WORK/doc" --seq-len 44 --micro-batch-size 1 \
    --batches 1 --json | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["loss"])')
  [[ $small_loss == "$eval_loss" ]] || fail "$family: eval onto the base's checkpoint $small_loss, onto its directory $eval_loss"
  # model: the imported checkpoint's model.yaml, whose peft: section the recipe (which has none) takes
  # (from the checkpoint that references the base's checkpoint)
  sed -e "s|$WORK/$family.run|$WORK/$family.tuned|; s|init_from: .*|init_from: $WORK/$family.small|" \
    -e "s|^model: .*|model: $WORK/$family.small/model.yaml|; /^peft:/d; s|steps: 4|steps: 1|" "$WORK/$family.yaml" \
    > "$WORK/$family.tuned.yaml"
  "$MEGATRAIN" run "$WORK/$family.tuned.yaml" > "$WORK/$family.tuned.log" 2>&1 \
    || fail "$family: init_from the imported adapter: $(tail -n 3 "$WORK/$family.tuned.log")"
  grep -q "peft: LoRA rank 4, alpha 12 from the peft: section of $WORK/$family.small/model.yaml" \
    "$WORK/$family.tuned.log" || fail "$family: the run does not say where its peft: came from"
  step1=$("$PY" -c 'import json, sys; print(json.loads(open(sys.argv[1]).readline())["loss"])' \
    "$WORK/$family.tuned/metrics.jsonl")
  awk -v p="$peft_loss" -v e="$eval_loss" -v s="$step1" -v f=$family 'function rel(x) { d = (x - p) / p; return d < 0 ? -d : d }
    BEGIN { if (rel(e) >= 1e-5 || rel(s) >= 1e-5) { print "FAIL: " f ": PEFT loss " p ", eval " e ", step 1 " s; exit 1 }
            printf "%s: a PEFT-made adapter imported: eval loss %s, init_from step 1 %s = PEFT'"'"'s %s (%.1e, %.1e)\n",
                   f, e, s, p, rel(e), rel(s) }' || exit 1
  "$MEGATRAIN" convert "$WORK/$family.imported" "$WORK/$family.reexported" > /dev/null
  cmp "$WORK/$family.peft/adapter_model.safetensors" "$WORK/$family.reexported/adapter_model.safetensors" \
    || fail "$family: PEFT -> megatrain -> PEFT changed adapter_model.safetensors"
  echo "$family: PEFT -> megatrain -> PEFT gives back PEFT's adapter_model.safetensors byte for byte"
done
