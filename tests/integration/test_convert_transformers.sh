#!/usr/bin/env bash
# test_convert_transformers.sh: what `megatrain convert` writes, transformers
# loads. Without torch, transformers and safetensors in python3 it installs
# them from PyPI into build/test-venv (tests/python_env.sh: PyPI's torch, used
# on the CPU; once, about 60 s and 4 GB); it skips (77) only when that cannot
# be done, and fails then in CI (CI=true; lib.sh, need_python).
# transformers saves tiny random models of each family, MoE included
# (sharded by its own save_pretrained, fp32 and bf16); we convert each to a
# megatrain checkpoint and back, and get the same shard files and index,
# byte for byte; from_pretrained then loads our directory
# with no missing, unexpected or mismatched weights, the same weights and
# the same logits bit for bit (fp32; bf16 through megatrain and back), and
# a MoE model's state_dict saved as it is in memory (transformers 5's fused
# experts, safetensors' save_file) converts to the same checkpoint, and
# our fp32 -> bf16 rounding gives the weights torch's .to(bfloat16) gives;
# generation_config.json comes back byte for byte. A Llama 3.1-like
# directory (tokenizer saved by transformers, eos_token_id a list) comes back
# with its tokenizer files and generation_config.json byte for byte, loads
# in AutoTokenizer with the same ids, and generate() on the exported model
# stops at the eos ids (and runs on without them).
# run_tests.sh: early (about 3 minutes on 2 cores)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
"$MEGATRAIN" convert --help > /dev/null 2>&1 || { echo "skip: megatrain has no convert command (src/main.c)"; exit 77; }
need_python torch
export MEGATRAIN REPO PYTHONWARNINGS=ignore TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

cat > "$WORK/models.py" <<'EOF'
import os, subprocess, sys, torch, transformers as tf
tf.utils.logging.disable_progress_bar()
FAMILIES = {
    "llama_gqa_rope3": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(num_key_value_heads=2, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}, rope_theta=500000.0)),
    "llama_tied": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, dict(num_key_value_heads=2)),
    "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, dict(num_key_value_heads=1, head_dim=8)),
    # MoE: transformers 5 sorts the names and keeps each projection's experts in one storage when it
    # shards; 11 layers put layer 10 after layer 9, 12 experts expert 10 after expert 9
    "mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM, dict(num_key_value_heads=2, num_local_experts=3,
                                                               num_hidden_layers=11, intermediate_size=24)),
    "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM, dict(num_key_value_heads=2, head_dim=8, num_experts=12,
                                                                  moe_intermediate_size=16, norm_topk_prob=True)),
}
IDS = (torch.arange(24).reshape(2, 12) * 7) % 96

def make(root):
    for name, (Config, Model, extra) in FAMILIES.items():
        torch.manual_seed(len(name))
        cfg = Config(**{**dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                               vocab_size=96, max_position_embeddings=64, rms_norm_eps=1e-5), **extra})
        model = Model(cfg).eval()
        model.save_pretrained(f"{root}/{name}.src", max_shard_size="30KB")
        if "moe" in name or name == "mixtral":  # the in-memory layout: fused experts, Mixtral's block as mlp
            import safetensors.torch
            os.makedirs(f"{root}/{name}.fused")
            cfg.save_pretrained(f"{root}/{name}.fused")
            state = model.state_dict()
            assert any(k.endswith("mlp.experts.gate_up_proj") for k in state), f"{name}: no fused experts"
            safetensors.torch.save_file({k: v.contiguous() for k, v in state.items()},
                                        f"{root}/{name}.fused/model.safetensors")
        model.to(torch.bfloat16).save_pretrained(f"{root}/{name}.src_bf16", max_shard_size="30KB")

def check(root):
    for name, (Config, Model, extra) in FAMILIES.items():
        # (our directory, the reference it must equal, compare logits too)
        cases = (("out", Model.from_pretrained(f"{root}/{name}.src"), True),
                 ("out_bf16", Model.from_pretrained(f"{root}/{name}.src_bf16", dtype="auto"), True),
                 ("out_rounded", Model.from_pretrained(f"{root}/{name}.src").to(torch.bfloat16), False))
        for suffix, ref, logits in cases:
            ours, info = Model.from_pretrained(f"{root}/{name}.{suffix}", output_loading_info=True, dtype="auto")
            bad = {k: v for k, v in info.items() if v}
            assert not bad, f"{name}.{suffix}: loading info {bad}"
            assert ours.dtype == ref.dtype, f"{name}.{suffix}: dtype {ours.dtype}, expected {ref.dtype}"
            want, got = ref.state_dict(), ours.state_dict()
            assert want.keys() == got.keys(), f"{name}.{suffix}: parameter names differ"
            for k in want:
                assert torch.equal(want[k], got[k]), f"{name}.{suffix}: {k} differs"
            if logits:
                with torch.no_grad():
                    a, b = ref.eval()(IDS).logits, ours.eval()(IDS).logits
                assert torch.equal(a, b), f"{name}.{suffix}: logits differ by {(a - b).abs().max().item()}"
            print(f"{name}.{suffix}: loaded by {type(ours).__name__} ({ours.dtype}), weights"
                  f"{' and logits' if logits else ''} identical")

def convert(*args):
    subprocess.run([os.environ["MEGATRAIN"], "convert", *args], check=True, stdout=subprocess.DEVNULL)

def run(root):
    make(root)
    for name in FAMILIES:
        src = f"{root}/{name}"
        assert os.path.exists(f"{src}.src/model.safetensors.index.json"), f"{name}: transformers did not shard"
        convert(f"{src}.src", f"{src}.ckpt")
        convert(f"{src}.ckpt", f"{src}.out", "--max-shard-size", "30KB")
        convert(f"{src}.src_bf16", f"{src}.ckpt_bf16")
        convert(f"{src}.ckpt_bf16", f"{src}.out_bf16", "--dtype", "bf16", "--max-shard-size", "30KB")
        assert os.path.exists(f"{src}.out_bf16/model.safetensors.index.json"), f"{name}: bf16 output not sharded"
        convert(f"{src}.ckpt", f"{src}.out_rounded", "--dtype", "bf16")  # our fp32 -> bf16 rounding
        for a, b in ((".src", ".out"), (".src_bf16", ".out_bf16")):  # the same files, byte for byte
            theirs = sorted(f for f in os.listdir(src + a) if f.startswith("model"))
            assert theirs == sorted(f for f in os.listdir(src + b) if f.startswith("model")), f"{name}{b}: files"
            for f in theirs + ["generation_config.json"]:  # the generation config is carried through
                assert open(f"{src}{a}/{f}", "rb").read() == open(f"{src}{b}/{f}", "rb").read(), f"{name}{b}/{f}"
        print(f"{name}: the safetensors shards, index and generation_config.json are save_pretrained's, byte for byte")
        if os.path.exists(f"{src}.fused"):  # read from the fused layout: the same checkpoint, so the same files back
            convert(f"{src}.fused", f"{src}.ckpt_fused")
            convert(f"{src}.ckpt_fused", f"{src}.out_fused", "--max-shard-size", "30KB")
            for f in sorted(f for f in os.listdir(f"{src}.src") if f.startswith("model")):
                assert open(f"{src}.src/{f}", "rb").read() == open(f"{src}.out_fused/{f}", "rb").read(), \
                    f"{name}: {f} differs when read from the fused experts"
            print(f"{name}: save_file(model.state_dict()) (fused experts) converts to the same model")
    check(root)
    generation(root)

# A Llama 3.1-like directory: the tokenizer (the llama3 fixture's tokenizer.json) saved by
# transformers, eos_token_id a list [<|end_of_text|>, <|eot_id|>] in config.json and in a
# generation_config.json of its own (sampling settings), and weights that make greedy decoding
# emit <|eot_id|> (the list's second id, not the tokenizer's eos_token) at once: the layers add
# nothing (o_proj, down_proj zero), every embedding points along dimension 0, the final norm
# keeps only that dimension, and only the <|eot_id|> row of lm_head reads it.
def generation(root):
    fixture = os.path.join(os.environ["REPO"], "tests/fixtures/tokenizers/llama3/tokenizer.json")
    tok = tf.PreTrainedTokenizerFast(tokenizer_file=fixture, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    bos, eos = tok.convert_tokens_to_ids("<|begin_of_text|>"), tok.convert_tokens_to_ids(["<|end_of_text|>", "<|eot_id|>"])
    cfg = tf.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=len(tok), bos_token_id=bos, eos_token_id=eos)
    torch.manual_seed(7)
    model = tf.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()[:, 0] = 1.0
        model.model.norm.weight.zero_()[0] = 1.0
        model.lm_head.weight.zero_()[eos[1], 0] = 1.0
    model.generation_config.do_sample = True  # settings of its own (decoding below is greedy)
    model.generation_config.temperature, model.generation_config.top_p = 0.6, 0.9
    src, ckpt, out = f"{root}/gen.src", f"{root}/gen.ckpt", f"{root}/gen.out"
    model.save_pretrained(src)
    tok.save_pretrained(src)
    convert(src, ckpt)
    convert(ckpt, out)
    carried = sorted(f for f in os.listdir(src) if not f.startswith("model") and f != "config.json")
    assert carried == ["chat_template.jinja", "generation_config.json", "tokenizer.json", "tokenizer_config.json"], carried
    assert sorted(os.listdir(out)) == sorted(os.listdir(src)), f"files {sorted(os.listdir(out))}"
    for f in carried:
        assert open(f"{src}/{f}", "rb").read() == open(f"{out}/{f}", "rb").read(), f"{f} differs"
    theirs, ours = tf.AutoTokenizer.from_pretrained(src), tf.AutoTokenizer.from_pretrained(out)
    text = "Hello wörld, 123 <|eot_id|>"
    assert ours(text).input_ids == theirs(text).input_ids, "the tokenizers differ"
    assert ours.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "hi"
    loaded = tf.LlamaForCausalLM.from_pretrained(out).eval()
    assert loaded.config.eos_token_id == eos and loaded.config.bos_token_id == bos, "config.json lost the ids"
    assert loaded.generation_config.eos_token_id == eos, f"generation eos {loaded.generation_config.eos_token_id}"
    assert loaded.generation_config.temperature == 0.6, "generation_config.json is not the carried one"
    prompt = ours("Hello", return_tensors="pt").input_ids
    with torch.no_grad():
        stopped = loaded.generate(prompt, max_new_tokens=20, do_sample=False)
        loaded.generation_config.eos_token_id = None  # the control: without the eos ids it runs to max_new_tokens
        endless = loaded.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0)
    new = stopped[0, prompt.shape[1]:].tolist()
    assert new == [eos[1]], f"generate() gave {new}, expected it to stop at <|eot_id|> {eos[1]}"
    assert endless.shape[1] == prompt.shape[1] + 20, "the control did not run to max_new_tokens"
    print(f"generate: stops at <|eot_id|> ({eos[1]}, the second id of eos_token_id {eos}) after 1 token "
          f"(20 without the ids); tokenizer and generation_config.json carried byte for byte")

run(sys.argv[1])
EOF

"$PY" "$WORK/models.py" "$WORK" > "$WORK/check.log" 2>&1 || fail "$(tail -n 5 "$WORK/check.log")"
cat "$WORK/check.log"
[[ $(grep -c "identical" "$WORK/check.log") -eq 18 && $(grep -c "byte for byte" "$WORK/check.log") -eq 7 ]] \
  || fail "transformers did not load everything"
grep -q "^generate: stops at <|eot_id|>" "$WORK/check.log" || fail "generate() did not stop at eos"
