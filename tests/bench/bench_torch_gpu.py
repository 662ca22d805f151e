#!/usr/bin/env python3
"""bench_torch_gpu.py: the PyTorch peer of megatrain's CUDA backend.

Trains a Hugging Face LlamaForCausalLM / Qwen3ForCausalLM built from a config
(random init, no download, SDPA attention) on one GPU with megatrain's numerics
contract: fp32 master weights, bf16 compute under torch.autocast, fused AdamW
(lr 1e-4, betas 0.9/0.95, weight decay 0.1 on matrices), grad-norm clip 1.0;
one micro-batch of random tokens per step. Prints tokens/s over --steps steps
after --warmup steps, TFLOP/s by megatrain's FLOPs count
(src/model/model_flops.c), peak memory and the last loss. --peak times an
8192^3 bf16 torch.matmul instead. The MoE peers (bench_torch_moe_gpu.py) keep
this contract and import emit and is_oom from here.

Usage: bench_torch_gpu.py --family llama|qwen3 --layers L --hidden C --intermediate I
         --heads H --kv-heads KVH --head-dim D --vocab V --seq-len T --micro-batch B
         [--steps 20] [--warmup 5] [--mode eager|compile] [--tie] [--rope-theta X] [--json]
       bench_torch_gpu.py --peak [--json]
"""
import argparse
import json
import random
import sys
import time
import warnings

import torch

warnings.filterwarnings("ignore", message=".*TF32.*")  # legacy allow_tf32 deprecation notice


def emit(result, as_json, text):
    print(json.dumps(result) if as_json else text, flush=True)


def matmul_peak(as_json):
    """Mean of 20 CUDA-event-timed 8192^3 bf16 products after 3 warm-ups."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    events = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(a, b, out=c)
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    ms = sum(s.elapsed_time(e) for s, e in events) / len(events)
    tflops = 2.0 * n ** 3 / (ms * 1e-3) / 1e12
    result = {"impl": "torch-matmul-peak", "m": n, "n": n, "k": n, "ms": round(ms, 4),
              "tflops": round(tflops, 1), "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    emit(result, as_json, f"bf16 matmul {n}x{n}x{n}: {ms:.3f} ms, {tflops:.1f} TFLOP/s "
                          f"({result['device']}, torch {torch.__version__})")


def flops_per_token(a):
    """megatrain's model_flops_per_token: 6 * N_matmul + 12 * L * T * H * D (the
    lm_head counted also when tied; embedding lookup, norms, biases not)."""
    hd, kvd = a.heads * a.head_dim, a.kv_heads * a.head_dim
    per_layer = a.hidden * hd + 2 * a.hidden * kvd + hd * a.hidden + 3 * a.hidden * a.intermediate
    matmul_params = a.layers * per_layer + a.vocab * a.hidden
    return 6.0 * matmul_params + 12.0 * a.layers * a.seq_len * hd


def build_model(a):
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
            with torch.device("cuda"):
                model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa",
                                                         **{dtype_key: torch.float32})
            break
        except TypeError:
            continue
    if model is None:
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    model = model.to(device="cuda", dtype=torch.float32).train()
    attn = getattr(model.config, "_attn_implementation", "?")
    if attn != "sdpa":
        sys.exit(f"bench_torch_gpu.py: attention implementation is {attn!r}, expected 'sdpa'")
    return model, transformers.__version__


def train(a):
    impl = f"torch-{a.mode}"
    base = {"impl": impl, "family": a.family, "seq_len": a.seq_len, "micro_batch": a.micro_batch}
    model, tf_version = build_model(a)
    n_params = sum(p.numel() for p in model.parameters())  # a tied embedding counted once
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=1e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step_model = torch.compile(model) if a.mode == "compile" else model
    params = list(model.parameters())
    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    batches = torch.randint(0, a.vocab, (a.warmup + a.steps, a.micro_batch, a.seq_len),
                            device="cuda", generator=gen)  # random tokens: speed only

    def step(tokens):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(input_ids=tokens, labels=tokens, use_cache=False).loss  # HF shifts labels
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        return loss

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(a.warmup):  # in compile mode this is where dynamo/inductor compile
        step(batches[i])
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(a.warmup, a.warmup + a.steps):
        loss = step(batches[i])
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0

    tokens_per_s = a.micro_batch * a.seq_len * a.steps / seconds
    fpt = flops_per_token(a)
    tflops = fpt * tokens_per_s / 1e12
    peak_gib = torch.cuda.max_memory_allocated() / 2 ** 30
    last_loss = loss.item()
    result = {**base, "tokens_per_s": round(tokens_per_s, 1), "tflops": round(tflops, 1),
              "peak_mem_gib": round(peak_gib, 2), "loss": round(last_loss, 4),
              "compile_s": round(warmup_s, 1) if a.mode == "compile" else None,
              "warmup_s": round(warmup_s, 2), "step_ms": round(1e3 * seconds / a.steps, 2),
              "layers": a.layers, "hidden": a.hidden, "params": n_params, "flops_per_token": fpt,
              "steps": a.steps, "warmup": a.warmup, "tied": a.tie,
              "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2 ** 30, 2),
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": tf_version}
    if last_loss != last_loss or abs(last_loss) == float("inf"):
        result["error"] = "non-finite loss"
    compile_text = f", compile {warmup_s:.1f} s" if a.mode == "compile" else ""
    emit(result, a.json,
         f"{impl} {a.family} L={a.layers} C={a.hidden} params={n_params / 1e9:.3f}B T={a.seq_len} "
         f"B={a.micro_batch}: {tokens_per_s:,.0f} tok/s, {tflops:.1f} TFLOP/s, "
         f"{1e3 * seconds / a.steps:.1f} ms/step, peak {peak_gib:.2f} GiB, loss {last_loss:.4f}{compile_text}")


def is_oom(exc):
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peak", action="store_true", help="only time an 8192^3 bf16 matmul")
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
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    a = ap.parse_args()

    if not torch.cuda.is_available():
        sys.exit("bench_torch_gpu.py: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls outside autocast (none hot)
    random.seed(a.seed)
    torch.manual_seed(a.seed)
    if a.peak:
        return matmul_peak(a.json)
    missing = [n for n in ("family", "layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim",
                           "vocab", "seq_len", "micro_batch") if getattr(a, n) is None]
    if missing:
        ap.error("missing " + ", ".join("--" + n.replace("_", "-") for n in missing))
    if a.steps < 1 or a.warmup < (1 if a.mode == "compile" else 0):
        ap.error("--steps must be >= 1 (and --warmup >= 1 with --mode compile)")
    try:
        train(a)
    except Exception as exc:  # noqa: BLE001 -- OOM may come wrapped (e.g. by inductor)
        if not is_oom(exc):
            raise
        print(json.dumps({"impl": f"torch-{a.mode}", "family": a.family, "seq_len": a.seq_len,
                          "micro_batch": a.micro_batch, "error": "oom"}), flush=True)
        sys.exit(0)


if __name__ == "__main__":
    main()
