#!/usr/bin/env python3
"""bench_torch_cpu.py: the PyTorch baseline of the CPU benchmark.

Builds the same dense decoder as megatrain (Llama / Qwen2 / Qwen3: RMSNorm,
RoPE in the Hugging Face rotate_half convention with optional llama3
scaling, grouped-query causal attention, SwiGLU, Qwen2 q/k/v biases, Qwen3
per-head q/k RMSNorm, optionally tied embeddings) in plain PyTorch, fp32 on
the CPU, from a megatrain recipe YAML; trains it with AdamW on random tokens
and prints one JSON line with tokens/s measured after the warm-up steps.

Usage: bench_torch_cpu.py RECIPE.yaml [--steps N] [--warmup 3] [--threads N]
                          [--set key.path=value ...]
"""
import argparse
import json
import math
import os
import statistics
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch wheels without numpy
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import yaml  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


# ---------------------------------------------------------------- recipe

def apply_override(recipe, text, recipe_path):
    """--set a.b.c=value (value parsed as YAML), as megatrain's --set."""
    if "=" not in text:
        sys.exit(f"bench_torch_cpu.py: --set {text}: expected key.path=value")
    path, value = text.split("=", 1)
    keys = path.split(".")
    if len(keys) > 1 and keys[0] == "model" and not isinstance(recipe.get("model"), dict):
        recipe["model"] = resolve_model(recipe.get("model"), recipe_path)  # model.x of a configs/ file
    node = recipe
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = yaml.safe_load(value)


def resolve_model(model, recipe_path):
    """model: is a mapping, or a path to a configs/*.yaml file."""
    if isinstance(model, dict):
        return dict(model)
    if isinstance(model, str):
        for base in (os.getcwd(), os.path.dirname(os.path.abspath(recipe_path)), REPO_ROOT):
            path = os.path.join(base, model)
            if os.path.isfile(path):
                with open(path) as f:
                    return yaml.safe_load(f)
        sys.exit(f"bench_torch_cpu.py: {recipe_path}: model: file '{model}' not found")
    sys.exit(f"bench_torch_cpu.py: {recipe_path}: model: expected a mapping or a path")


def parse_tokens(text):
    """'2.4B' -> 2.4e9 (K, M, B, T suffixes), as Megatron's schedule strings."""
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}
    text = str(text).strip()
    if text and text[-1].upper() in scale:
        return float(text[:-1]) * scale[text[-1].upper()]
    return float(text)


def batch_schedule(train):
    """A function (step, consumed_tokens) -> global batch size."""
    if "batch_schedule" in train and train["batch_schedule"] is not None:
        stages = sorted((int(s["step"]), int(s["global_batch_size"])) for s in train["batch_schedule"])
        return lambda step, tokens: [g for start, g in stages if start <= step][-1]
    gbs = train.get("global_batch_size", 8)
    if isinstance(gbs, str):  # Megatron style "0:16 2.4B:320"
        stages = []
        for item in gbs.split():
            threshold, size = item.split(":")
            stages.append((parse_tokens(threshold), int(size)))
        stages.sort()
        return lambda step, tokens: [g for start, g in stages if start <= tokens][-1]
    return lambda step, tokens: int(gbs)


# ---------------------------------------------------------------- model

def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_inv_freq(cfg, head_dim):
    theta = float(cfg.get("rope_theta", 10000.0))
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    scaling = cfg.get("rope_scaling")
    if scaling:  # llama3 (transformers' _compute_llama3_parameters)
        factor = float(scaling.get("factor", 8.0))
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling.get("original_max_position_embeddings", 8192))
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq.float()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Block(nn.Module):
    def __init__(self, cfg, head_dim):
        super().__init__()
        C, I = cfg["hidden_size"], cfg["intermediate_size"]
        self.H, self.KVH, self.D = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim
        self.eps = float(cfg.get("rms_norm_eps", 1e-5))
        bias = bool(cfg.get("attention_bias", False))
        self.attn_norm = nn.Parameter(torch.ones(C))
        self.q_proj = nn.Linear(C, self.H * self.D, bias=bias)
        self.k_proj = nn.Linear(C, self.KVH * self.D, bias=bias)
        self.v_proj = nn.Linear(C, self.KVH * self.D, bias=bias)
        self.qk_norm = bool(cfg.get("qk_norm", False))
        if self.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(self.D))
            self.k_norm = nn.Parameter(torch.ones(self.D))
        self.o_proj = nn.Linear(self.H * self.D, C, bias=False)
        self.mlp_norm = nn.Parameter(torch.ones(C))
        self.gate_proj = nn.Linear(C, I, bias=False)
        self.up_proj = nn.Linear(C, I, bias=False)
        self.down_proj = nn.Linear(I, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h = rms_norm(x, self.attn_norm, self.eps)
        q = self.q_proj(h).view(B, T, self.H, self.D)
        k = self.k_proj(h).view(B, T, self.KVH, self.D)
        v = self.v_proj(h).view(B, T, self.KVH, self.D)
        if self.qk_norm:  # Qwen3: per-head RMSNorm before RoPE
            q = rms_norm(q, self.q_norm, self.eps)
            k = rms_norm(k, self.k_norm, self.eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, D)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.KVH != self.H:
            k = k.repeat_interleave(self.H // self.KVH, dim=1)
            v = v.repeat_interleave(self.H // self.KVH, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(B, T, self.H * self.D))
        h = rms_norm(x, self.mlp_norm, self.eps)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Decoder(nn.Module):
    def __init__(self, cfg, max_T):
        super().__init__()
        C, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_layers"]
        head_dim = cfg.get("head_dim") or C // cfg["num_attention_heads"]
        self.eps = float(cfg.get("rms_norm_eps", 1e-5))
        self.embed = nn.Embedding(V, C)
        self.layers = nn.ModuleList(Block(cfg, head_dim) for _ in range(L))
        self.final_norm = nn.Parameter(torch.ones(C))
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        self.lm_head = None if self.tied else nn.Linear(C, V, bias=False)
        freqs = torch.outer(torch.arange(max_T, dtype=torch.float32), rope_inv_freq(cfg, head_dim))
        emb = torch.cat((freqs, freqs), dim=-1)  # (T, D), rotate_half layout
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        self.init_weights(float(cfg.get("init_std", 0.02)), L)

    def init_weights(self, std, L):
        """As megatrain: normal(0, std), o_proj/down_proj std/sqrt(2L), norms 1, biases 0."""
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.zeros_(p) if name.endswith("bias") else nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * L))
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.embed(tokens)
        cos, sin = self.cos[:T], self.sin[:T]
        for layer in self.layers:
            x = layer(x, cos, sin)
        x = rms_norm(x, self.final_norm, self.eps)
        logits = F.linear(x, self.embed.weight) if self.tied else self.lm_head(x)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


# ---------------------------------------------------------------- training

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--steps", type=int, default=None, help="default: train.steps of the recipe")
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of tokens/s (default 3)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seed", type=int, default=None, help="default: run.seed")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()

    with open(args.recipe) as f:
        recipe = yaml.safe_load(f)
    for text in args.overrides:
        apply_override(recipe, text, args.recipe)
    cfg = resolve_model(recipe["model"], args.recipe)
    if cfg.get("family", "llama") not in ("llama", "qwen2", "qwen3"):
        sys.exit(f"bench_torch_cpu.py: family {cfg.get('family')}: only dense llama/qwen2/qwen3")
    train = recipe.get("train", {})
    opt = recipe.get("optimizer", {})
    T, mbs = int(train["seq_len"]), int(train["micro_batch_size"])
    steps = args.steps if args.steps is not None else int(train.get("steps", 100))
    if steps <= args.warmup:
        sys.exit(f"bench_torch_cpu.py: --steps {steps} must exceed --warmup {args.warmup}")
    gbs_at = batch_schedule(train)

    torch.set_num_threads(args.threads)
    seed = args.seed if args.seed is not None else int(recipe.get("run", {}).get("seed", 1234))
    torch.manual_seed(seed)
    model = Decoder(cfg, T)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    betas = tuple(float(b) for b in opt.get("betas", [0.9, 0.95]))
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": float(opt.get("weight_decay", 0.1))},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=float(opt.get("lr", 3e-4)), betas=betas, eps=float(opt.get("eps", 1e-8)), foreach=True)
    clip = float(opt.get("clip_grad", 1.0) or 0.0)
    V = int(cfg["vocab_size"])

    rates, step_times, losses, consumed = [], [], [], 0
    for step in range(steps):
        gbs = gbs_at(step, consumed)
        if gbs % mbs:
            sys.exit(f"bench_torch_cpu.py: global_batch_size {gbs} is not a multiple of micro_batch_size {mbs}")
        micro_batches = gbs // mbs
        batch = torch.randint(0, V, (micro_batches, mbs, T + 1))  # random tokens: speed only
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for micro in batch:
            loss = model(micro[:, :-1], micro[:, 1:]) / micro_batches
            loss.backward()
            total += loss.item()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        elapsed = time.perf_counter() - start
        tokens = gbs * T
        consumed += tokens
        losses.append(total)
        if step >= args.warmup:
            step_times.append(elapsed)
            rates.append(tokens / elapsed)

    result = {
        "impl": "torch",
        "recipe": args.recipe,
        "family": cfg.get("family", "llama"),
        "params": sum(p.numel() for p in model.parameters()),
        "seq_len": T,
        "micro_batch_size": mbs,
        "steps": steps,
        "warmup": args.warmup,
        "tokens_per_s": round(statistics.median(rates), 1),
        "tokens_per_s_mean": round(sum(r * t for r, t in zip(rates, step_times)) / sum(step_times), 1),
        "first_loss": round(losses[0], 4),
        "last_loss": round(losses[-1], 4),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
