#!/usr/bin/env python3
"""bench_torch_gpu.py: the PyTorch peer of megatrain's CUDA backend.

Trains a Hugging Face LlamaForCausalLM / Qwen3ForCausalLM built from a config
(random init, no download, SDPA attention) on one GPU with megatrain's numerics
contract: fp32 master weights, bf16 compute under torch.autocast, fused AdamW
(lr 1e-4, betas 0.9/0.95, weight decay 0.1 on matrices), grad-norm clip 1.0;
one micro-batch of random tokens per step. Prints tokens/s over --steps steps
after --warmup steps, TFLOP/s by megatrain's FLOPs count
(src/model/model_flops.c), peak memory (max_memory_allocated) and the last
loss. --peak times an 8192^3 bf16 torch.matmul instead. The MoE and
fine-tuning peers (bench_torch_moe_gpu.py, bench_torch_finetune_gpu.py) keep
this contract and import their shared pieces from here.

Issue 18's levers (the peers of megatrain's train.recompute and bf16 states):
  --grad-ckpt full       transformers' activation (gradient) checkpointing of
                         every decoder layer, use_reentrant=False: keeps each
                         layer's input, reruns its forward in the backward
                         (megatrain's recompute: full).
  --grad-ckpt selective  the same checkpoint with torch's selective activation
                         checkpointing: the matmul outputs (q, k, v, o, gate,
                         up, down) are kept, the rest (the attention core,
                         SwiGLU, norms, RoPE, casts) rerun in the backward:
                         megatrain's selective (attention core and SwiGLU
                         recomputed), as close as op-level SAC gets.
  --weights bf16         weights, gradients and AdamW moments in bf16, no fp32
                         master: what fits where fp32 master weights and fp32
                         moments (16 bytes a parameter) do not (Llama 3 8B on
                         one H200). Weaker numerics than megatrain's bf16
                         states (which keep an fp32 master); plain PyTorch has
                         no fp32-master / bf16-moment AdamW.

Issue 20's peer (PyTorch float8 training, the peer of megatrain's precision: fp8):
  --float8 tensorwise    torchao's convert_to_float8_training with its tensorwise
                         recipe (current scaling: each tensor's amax just before
                         its cast; E4M3 forward, E5M2 gradients) on every decoder
                         linear layer; the lm_head stays bf16, as megatrain's does.
                         fp32 master weights cast to FP8 per use. Meant with
                         --mode compile (torchao's casts are only fused there).
                         rowwise: torchao's rowwise recipe (an extra row).
  --peak fp8             times an 8192^3 E4M3 torch._scaled_mm (bf16 output,
                         fast accumulation) instead: the FP8 matrix peak.
  torchao is imported, or installed from the carried wheels (.devwheels, made
  by tests/gpu/carry_wheels.sh) when the machine lacks it.

Usage: bench_torch_gpu.py --family llama|qwen3 --layers L --hidden C --intermediate I
         --heads H --kv-heads KVH --head-dim D --vocab V --seq-len T --micro-batch B
         [--steps 20] [--warmup 5] [--mode eager|compile] [--tie] [--rope-theta X]
         [--grad-ckpt [full|selective]] [--weights fp32|bf16] [--float8 none|tensorwise|rowwise] [--json]
       bench_torch_gpu.py --config configs/llama3-8b.yaml --seq-len 8192 --micro-batch 1 ...
         (the shape from a megatrain dense config; explicit flags override it)
       bench_torch_gpu.py --peak [bf16|fp8] [--json]
       CPU smoke test (no GPU): ... --device cpu [--config configs/llama3.2-1b.yaml --tiny]
"""
import argparse
import functools
import glob
import importlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import warnings

import torch

warnings.filterwarnings("ignore", message=".*TF32.*")  # legacy allow_tf32 deprecation notice
warnings.filterwarnings("ignore", message=".*gradient_checkpointing.* is deprecated")  # transformers 5.2x renamed it

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPE_FIELDS = ("family", "layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab")


def emit(result, as_json, text):
    print(json.dumps(result) if as_json else text, flush=True)


def cuda_time_ms(run, warmup=3, reps=20):
    """Mean milliseconds of reps CUDA-event-timed calls of run() after warmup untimed ones."""
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    events = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return sum(s.elapsed_time(e) for s, e in events) / len(events)


def matmul_peak(as_json, dtype="bf16"):
    """An 8192^3 product timed by cuda_time_ms: bf16 torch.matmul (the peak MFU is against), or (fp8)
    torch._scaled_mm of E4M3 operands with unit tensorwise scales, bf16 output, fast accumulation."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    if dtype == "bf16":
        c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        ms = cuda_time_ms(lambda: torch.matmul(a, b, out=c))
        impl = "torch-matmul-peak"
    else:
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn).t()  # _scaled_mm takes its second operand column-major
        one = torch.ones((), device="cuda", dtype=torch.float32)
        ms = cuda_time_ms(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                                   use_fast_accum=True))
        impl = "torch-scaled-mm-peak"
    tflops = 2.0 * n ** 3 / (ms * 1e-3) / 1e12
    result = {"impl": impl, "dtype": dtype, "m": n, "n": n, "k": n, "ms": round(ms, 4),
              "tflops": round(tflops, 1), "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    emit(result, as_json, f"{dtype} matmul {n}x{n}x{n}: {ms:.3f} ms, {tflops:.1f} TFLOP/s "
                          f"({result['device']}, torch {torch.__version__})")


def import_or_install(module):
    """Imports module; where the machine lacks it (the GPU machine has no internet), first installs every
    wheel that tests/gpu/carry_wheels.sh put in .devwheels (or $MT_WHEELS) into a temporary target.
    Returns where it came from."""
    try:
        importlib.import_module(module)
        return "installed"
    except ImportError:
        pass
    wheels = sorted(glob.glob(os.path.join(os.environ.get("MT_WHEELS", os.path.join(REPO, ".devwheels")), "*.whl")))
    if not wheels:
        sys.exit(f"{os.path.basename(sys.argv[0])}: no {module}, and no wheels in .devwheels "
                 "(run tests/gpu/carry_wheels.sh and carry .devwheels)")
    target = tempfile.mkdtemp(prefix="bench-wheels-")
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", target] + wheels
    if subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE).returncode != 0:
        import zipfile  # no pip: a wheel is a zip of what an install puts in site-packages

        for w in wheels:
            zipfile.ZipFile(w).extractall(target)
    sys.path.insert(0, target)
    importlib.import_module(module)
    return "from " + ", ".join(os.path.basename(w) for w in wheels)


def convert_float8(model, recipe):
    """torchao float8 training (recipe tensorwise or rowwise) on every decoder linear layer; the lm_head
    stays bf16. Returns (the number of layers converted, the torchao version, where it came from)."""
    source = import_or_install("torchao")
    import torchao
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def decoder_linear(mod, fqn):
        return (isinstance(mod, torch.nn.Linear) and not fqn.endswith("lm_head")
                and mod.in_features % 16 == 0 and mod.out_features % 16 == 0)

    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                               module_filter_fn=decoder_linear)
    converted = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
    return converted, torchao.__version__, source


def read_dense_config(path):
    """The shape of a megatrain dense config (configs/*.yaml) under this script's argument names.
    rope_scaling is left out (it changes no cost)."""
    import yaml

    if not os.path.isabs(path) and not os.path.exists(path):
        path = os.path.join(REPO, path)
    with open(path) as f:
        y = yaml.safe_load(f)
    if y["family"] not in ("llama", "qwen3"):
        sys.exit(f"{os.path.basename(sys.argv[0])}: family {y['family']!r}: these peers build llama or qwen3")
    heads = y["num_attention_heads"]
    return {"family": y["family"], "layers": y["num_layers"], "hidden": y["hidden_size"],
            "intermediate": y["intermediate_size"], "heads": heads, "kv_heads": y.get("num_key_value_heads", heads),
            "head_dim": y.get("head_dim") or y["hidden_size"] // heads, "vocab": y["vocab_size"],
            "tie": bool(y.get("tie_word_embeddings", False)), "rope_theta": float(y.get("rope_theta", 10000.0))}


def tiny_shape(shape):
    """The same family at a size a CPU trains in seconds (--tiny smoke tests)."""
    return {**shape, "layers": 2, "hidden": 64, "intermediate": 128, "heads": 4, "kv_heads": 2, "head_dim": 16,
            "vocab": 512}


def flops_per_token(a, lora_rank=0):
    """megatrain's model_flops_per_token: 6 * N_matmul + 12 * L * T * H * D (the
    lm_head counted also when tied; embedding lookup, norms, biases not). With LoRA on
    all seven projections (lora_rank > 0): 4 FLOPs per frozen matmul weight (no weight
    gradient) and 6 per adapter weight, rank * (in + out) per projection."""
    hd, kvd = a.heads * a.head_dim, a.kv_heads * a.head_dim
    per_layer = a.hidden * hd + 2 * a.hidden * kvd + hd * a.hidden + 3 * a.hidden * a.intermediate
    matmul_params = a.layers * per_layer + a.vocab * a.hidden
    attention = 12.0 * a.layers * a.seq_len * hd
    if not lora_rank:
        return 6.0 * matmul_params + attention
    C, I = a.hidden, a.intermediate
    adapters = a.layers * lora_rank * ((C + hd) + 2 * (C + kvd) + (hd + C) + 3 * (C + I))
    return 4.0 * matmul_params + 6.0 * adapters + attention


def build_model(a, device="cuda", dtype=torch.float32):
    """transformers' model of shape a (SHAPE_FIELDS, tie, rope_theta, seq_len), random init, SDPA."""
    import transformers
    from transformers import AutoModelForCausalLM

    cls = {"llama": transformers.LlamaConfig, "qwen3": transformers.Qwen3Config}[a.family]
    theta = a.rope_theta if a.rope_theta is not None else (500000.0 if a.family == "llama" else 1000000.0)
    cfg = cls(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
              num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
              head_dim=a.head_dim, max_position_embeddings=max(a.seq_len, 4096),
              rms_norm_eps=1e-5 if a.family == "llama" else 1e-6, tie_word_embeddings=a.tie,
              attention_bias=False, attention_dropout=0.0, use_cache=False, rope_theta=theta,
              attn_implementation="sdpa")
    rope = getattr(cfg, "rope_parameters", None)  # transformers 5 keeps rope_theta in here
    if isinstance(rope, dict) and rope.get("rope_theta") != theta:
        cfg.rope_parameters = {**rope, "rope_type": rope.get("rope_type", "default"), "rope_theta": theta}
    model = None
    for dtype_key in ("dtype", "torch_dtype"):  # transformers 5 renamed torch_dtype to dtype
        try:
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", **{dtype_key: dtype})
            break
        except TypeError:
            continue
    if model is None:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    model = model.to(device=device, dtype=dtype).train()
    attn = getattr(model.config, "_attn_implementation", "?")
    if attn != "sdpa":
        sys.exit(f"{os.path.basename(sys.argv[0])}: attention implementation is {attn!r}, expected 'sdpa'")
    return model, transformers.__version__


def enable_grad_ckpt(model, kind):
    """kind none, full or selective (the module header): transformers' checkpoint of every decoder layer."""
    if kind == "none":
        return
    kwargs = {"use_reentrant": False}
    if kind == "selective":
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

        keep = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}

        def policy(ctx, op, *args, **kw):
            return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE

        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, policy)
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the old name warns there
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def adamw(params):
    """The contract's optimizer: fused AdamW, weight decay 0.1 on matrices only."""
    params = [p for p in params if p.requires_grad]
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                             lr=1e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)


def timed_steps(step, batches, warmup, steps, device):
    """Runs step(batches[i]) warmup times untimed (torch.compile compiles there), then steps times timed.
    Returns (the last step's result, warm-up seconds, timed seconds)."""
    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    sync()
    t0 = time.perf_counter()
    for i in range(warmup):
        step(batches[i])
    sync()
    warmup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(warmup, warmup + steps):
        last = step(batches[i])
    sync()
    return last, warmup_s, time.perf_counter() - t0


def memory_stats(device):
    """Peak allocated and reserved GiB since the last reset (None on the CPU)."""
    if device != "cuda":
        return {"peak_mem_gib": None, "peak_reserved_gib": None}
    return {"peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2 ** 30, 2)}


def step_report(loss, warmup_s, seconds, steps, tokens_per_step, flops_per_tok, device, compiled, tflops_digits=1):
    """What every peer reports of its timed steps: the JSON fields (speed, peak memory, last loss, times; "error"
    on a non-finite loss) and the text from tok/s to the compile time."""
    tokens_per_s = tokens_per_step * steps / seconds
    tflops = flops_per_tok * tokens_per_s / 1e12
    mem = memory_stats(device)
    last = loss.item()
    fields = {"tokens_per_s": round(tokens_per_s, 1), "tflops": round(tflops, tflops_digits), **mem,
              "loss": round(last, 4), "compile_s": round(warmup_s, 1) if compiled else None,
              "warmup_s": round(warmup_s, 2), "step_ms": round(1e3 * seconds / steps, 2)}
    if last != last or abs(last) == float("inf"):
        fields["error"] = "non-finite loss"
    peak = f", peak {mem['peak_mem_gib']:.2f} GiB" if mem["peak_mem_gib"] is not None else ""
    compile_text = f", compile {warmup_s:.1f} s" if compiled else ""
    text = (f"{tokens_per_s:,.0f} tok/s, {tflops:.1f} TFLOP/s, {1e3 * seconds / steps:.1f} ms/step{peak}, "
            f"loss {last:.4f}{compile_text}")
    return fields, text


def device_name(device):
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def train(a):
    impl = f"torch-{a.mode}"
    base = {"impl": impl, "family": a.family, "seq_len": a.seq_len, "micro_batch": a.micro_batch,
            "grad_ckpt": a.grad_ckpt, "weights": a.weights, "float8": a.float8}
    model, tf_version = build_model(a, a.device, torch.bfloat16 if a.weights == "bf16" else torch.float32)
    float8 = {}
    if a.float8 != "none":
        n, version, source = convert_float8(model, a.float8)
        float8 = {"float8_layers": n, "torchao": version, "torchao_source": source}
    enable_grad_ckpt(model, a.grad_ckpt)
    n_params = sum(p.numel() for p in model.parameters())  # a tied embedding counted once
    optimizer = adamw(model.parameters())
    step_model = torch.compile(model) if a.mode == "compile" else model
    params = list(model.parameters())
    gen = torch.Generator(device=a.device).manual_seed(a.seed)
    batches = torch.randint(0, a.vocab, (a.warmup + a.steps, a.micro_batch, a.seq_len),
                            device=a.device, generator=gen)  # random tokens: speed only

    def step(tokens):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=torch.bfloat16):
            loss = step_model(input_ids=tokens, labels=tokens, use_cache=False).loss  # HF shifts labels
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        return loss

    loss, warmup_s, seconds = timed_steps(step, batches, a.warmup, a.steps, a.device)
    fpt = flops_per_token(a)
    fields, text = step_report(loss, warmup_s, seconds, a.steps, a.micro_batch * a.seq_len, fpt, a.device,
                               a.mode == "compile")
    result = {**base, **fields, "layers": a.layers, "hidden": a.hidden, "params": n_params, "flops_per_token": fpt,
              "steps": a.steps, "warmup": a.warmup, "tied": a.tie, **float8,
              "device": device_name(a.device), "torch": torch.__version__, "transformers": tf_version}
    fp8_text = f", float8 {a.float8} ({float8['float8_layers']} layers)" if float8 else ""
    emit(result, a.json,
         f"{impl} {a.family} L={a.layers} C={a.hidden} params={n_params / 1e9:.3f}B T={a.seq_len} "
         f"B={a.micro_batch} grad-ckpt {a.grad_ckpt}, {a.weights} weights{fp8_text}: {text}")


def is_oom(exc):
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def run_guarded(device, seed, run, oom_row):
    """Every peer's main: checks the device, seeds, runs run(); an out-of-memory error (OOM may come
    wrapped, e.g. by inductor) prints oom_row with "error": "oom" and exits 0 instead of failing."""
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit(f"{os.path.basename(sys.argv[0])}: no CUDA device (--device cpu for a smoke test)")
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls outside autocast (none hot; MoE: the router)
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        run()
    except Exception as exc:  # noqa: BLE001
        if not is_oom(exc):
            raise
        print(json.dumps({**oom_row, "error": "oom"}), flush=True)
        sys.exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peak", nargs="?", const="bf16", choices=("bf16", "fp8"),
                    help="only time an 8192^3 matmul: bf16 (bare flag) or fp8 (E4M3 torch._scaled_mm)")
    ap.add_argument("--config", help="take the shape from a megatrain dense config (configs/*.yaml)")
    ap.add_argument("--tiny", action="store_true", help="with --config: a tiny shape of its family (smoke tests)")
    ap.add_argument("--family", choices=("llama", "qwen3"))
    for name in ("layers", "hidden", "intermediate", "heads", "kv-heads", "head-dim", "vocab",
                 "seq-len", "micro-batch"):
        ap.add_argument(f"--{name}", type=int)
    ap.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    ap.add_argument("--mode", choices=("eager", "compile"), default="eager")
    ap.add_argument("--tie", action="store_true", help="tie the lm_head to the embedding")
    ap.add_argument("--rope-theta", type=float, default=None,
                    help="default 500000 (llama), 1000000 (qwen3)")
    ap.add_argument("--grad-ckpt", nargs="?", const="full", default="none", choices=("none", "full", "selective"),
                    help="activation checkpointing of every layer (bare flag: full; default none)")
    ap.add_argument("--weights", choices=("fp32", "bf16"), default="fp32",
                    help="fp32: fp32 master weights and moments (default); bf16: all in bf16")
    ap.add_argument("--float8", choices=("none", "tensorwise", "rowwise"), default="none",
                    help="torchao float8 training of the decoder's linear layers (default none)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: smoke tests only")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    a = ap.parse_args()

    if a.peak and a.device != "cuda":
        ap.error("--peak times a CUDA matmul")
    if a.tiny and not a.config:
        ap.error("--tiny needs --config")
    if a.config:
        shape = read_dense_config(a.config)
        shape = tiny_shape(shape) if a.tiny else shape
        for name in SHAPE_FIELDS + ("rope_theta",):
            if getattr(a, name) is None:
                setattr(a, name, shape[name])
        a.tie = a.tie or shape["tie"]
    missing = [n for n in SHAPE_FIELDS + ("seq_len", "micro_batch") if getattr(a, n) is None]
    if missing and not a.peak:
        ap.error("missing " + ", ".join("--" + n.replace("_", "-") for n in missing))
    if a.steps < 1 or a.warmup < (1 if a.mode == "compile" else 0):
        ap.error("--steps must be >= 1 (and --warmup >= 1 with --mode compile)")
    run_guarded(a.device, a.seed, lambda: matmul_peak(a.json, a.peak) if a.peak else train(a),
                {"impl": f"torch-{a.mode}", "family": a.family, "seq_len": a.seq_len, "micro_batch": a.micro_batch,
                 "grad_ckpt": a.grad_ckpt, "weights": a.weights, "float8": a.float8})

if __name__ == "__main__":
    main()
