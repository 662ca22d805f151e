#!/usr/bin/env python3
"""bench_torch_moe_gpu.py: the PyTorch peers of megatrain's mixture of experts on one GPU (issue 17).

Trains, on random tokens, one micro-batch per step, the architecture of a
megatrain MoE config (--config configs/qwen3-30b-a3b.yaml or
configs/mixtral-8x7b.yaml, with --layers L of its layers) as one of:

  --impl hf       transformers' Qwen3MoeForCausalLM / MixtralForCausalLM built
                  from a config (random init, no download, SDPA attention).
                  Its experts run through transformers' experts_implementation,
                  by default transformers' own default ('grouped_mm' in
                  transformers 5: stacked gate_up (E, 2I, C) and down (E, C, I),
                  assignments sorted by expert, torch grouped_mm). Note: grouped_mm
                  is not an autocast op and transformers casts its input to the
                  weights' dtype, so with fp32 master weights the experts' products
                  run in fp32 (torch's per-group fallback loop in eager mode,
                  transformers' per-expert custom op under torch.compile), not in
                  bf16 (TF32 matmuls: allow_tf32, as in the dense peer): that is what
                  transformers does under this contract, and the row says so
                  ("experts_dtype"). --hf-experts eager selects transformers'
                  per-expert loop of nn.functional.linear instead (bf16 under
                  autocast, a host synchronisation per expert).
  --impl grouped  our own torchtitan-style model: the same attention (q, k, v, o
                  projections, Qwen3's q/k RMSNorm, RoPE, SDPA causal with GQA) and
                  RMSNorms (fp32 statistics) as the transformers model, and a MoE
                  layer on torch._grouped_mm: a fp32 router (softmax, top-k,
                  renormalised with norm_topk_prob), stacked expert weights
                  gate_up (E, 2I, C) and down (E, C, I) cast to bf16, assignments
                  sorted by expert, offsets = cumsum of the per-expert row counts
                  as int32, torch._grouped_mm(x, w.transpose(-2, -1), offs=...)
                  for gate|up and for down, the outputs gathered back and summed
                  with the routing weights in fp32. Only if torch has
                  torch._grouped_mm (otherwise the row says 'skipped').

Alignment (torch._grouped_mm): strides must be multiples of 16 bytes (C, I
multiples of 8 in bf16, checked), and the backward's weight-gradient product
(2-D x 2-D, the groups along the token dimension) asserts on the device that
every group's row count is a multiple of 16 bytes when that operand is
row-major. As torchtitan does (TOKEN_GROUP_ALIGN_SIZE_M = 8 for bf16), every
expert's group is padded to a multiple of --align rows (default 8) with zero
rows, without a host synchronisation: the buffer has a static
E*(align-1) rows of slack past the last group, rows past offs[-1] are left
uninitialised by the kernel and never read (their gradients land in a
discarded zero row). Before timing, --impl grouped checks its layer against a
plain per-expert loop (reference_experts, used for nothing else) on a small
batch with one expert left empty: outputs and every gradient within 2% (bf16);
a wrong offsets convention or permutation fails it, and the row reports the
failure instead of a speed.

Numerics contract (as bench_torch_gpu.py, the dense peer): fp32 master
weights, bf16 compute under torch.autocast, fused AdamW (lr 1e-4, betas
0.9/0.95, weight decay 0.1 on matrices), grad-norm clip 1.0, micro-batch
--micro-batch (1 for the benchmark's shapes), no gradient accumulation.
--mode eager or compile (torch.compile of the whole model).

Auxiliary load-balancing loss, with megatrain's coefficient (moe.aux_loss_coeff:
0.001 for Qwen3-30B-A3B, 0.02 for Mixtral, as their configs; megatrain's
default when a config omits it is 0.01): the grouped model adds megatrain's
aux_loss per layer, coeff * E / (k N^2) * sum_e (sum_n p[n,e]) * count[e]
(src/model/moe_layer.c); the transformers model sets output_router_logits and
router_aux_loss_coef = coeff and adds transformers' load_balancing_loss_func,
which pools the layers' router logits and has no 1/k (E * sum_e f[e] P[e] over
all layers' tokens): a different formula with the same coefficient, of
negligible cost either way. No z-loss, no capacity limit (dropless), no shared
expert, every layer MoE: the configs' settings (others are refused).

TFLOP/s: megatrain's FLOPs count over the active parameters
(src/model/model_flops.c: 6 x (attention projections + router C*E + k experts
3*C*I_moe per layer + lm_head V*C) + 12 * L * T * H * D), the count
bench_gpu.py's megatrain rows use; padding rows are not counted. Prints
tokens/s over --steps steps after --warmup steps, TFLOP/s, peak memory
(max_memory_allocated), the last loss and the aux loss in it (with its
coefficient); a CUDA out-of-memory error prints {"error": "oom"} instead of
failing.

Usage: bench_torch_moe_gpu.py --config configs/qwen3-30b-a3b.yaml --layers 4 --impl hf|grouped
         [--seq-len 4096] [--micro-batch 1] [--steps 15] [--warmup 5] [--mode eager|compile]
         [--hf-experts NAME] [--align 8] [--json] [--self-check-only]
       CPU smoke test (tiny shape, no GPU): ... --device cpu --tiny
"""
import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_torch_gpu import (REPO, adamw, device_name, emit, run_guarded, step_report,  # noqa: E402
                             timed_steps)  # the dense peer's helpers


# ---------------------------------------------------------------- the shape

def read_config(path, layers=None):
    """The model fields of a megatrain config (configs/*.yaml), as a flat dict."""
    import yaml

    if not os.path.isabs(path) and not os.path.exists(path):
        path = os.path.join(REPO, path)
    with open(path) as f:
        y = yaml.safe_load(f)
    m = y.get("moe") or {}
    fam = y["family"]
    if fam not in ("qwen3_moe", "mixtral"):
        sys.exit(f"bench_torch_moe_gpu.py: family {fam!r} is not a MoE family")
    heads = y["num_attention_heads"]
    c = {
        "family": fam, "layers": layers or y["num_layers"], "hidden": y["hidden_size"],
        "intermediate": y.get("intermediate_size", 0), "heads": heads,
        "kv_heads": y.get("num_key_value_heads", heads),
        "head_dim": y.get("head_dim") or y["hidden_size"] // heads, "vocab": y["vocab_size"],
        "rope_theta": float(y.get("rope_theta", 10000.0)), "rms_eps": float(y.get("rms_norm_eps", 1e-5)),
        "tie": bool(y.get("tie_word_embeddings", False)), "attention_bias": bool(y.get("attention_bias", False)),
        "qk_norm": bool(y.get("qk_norm", fam == "qwen3_moe")),
        "experts": m["num_experts"], "top_k": m["num_experts_per_tok"], "moe_intermediate": m["moe_intermediate_size"],
        "shared": m.get("shared_expert_intermediate_size", 0) or 0, "norm_topk": bool(m.get("norm_topk_prob", True)),
        "score": m.get("score_function", "softmax"), "balancing": m.get("load_balancing", "aux_loss"),
        "aux_coeff": float(m.get("aux_loss_coeff", 1e-2)),  # megatrain's default (src/config/recipe_defaults.c)
        "z_coeff": float(m.get("z_loss_coeff", 0.0) or 0.0), "capacity": m.get("capacity_factor"),
        "layer_freq": m.get("layer_freq", 1) or 1,
    }
    refused = []
    if c["shared"]:
        refused.append("a shared expert")
    if c["score"] != "softmax":
        refused.append(f"score_function {c['score']}")
    if c["balancing"] not in ("aux_loss", "none"):
        refused.append(f"load_balancing {c['balancing']}")
    if c["z_coeff"]:
        refused.append("a z-loss")
    if c["capacity"] not in (None, 0):
        refused.append("a capacity factor")
    if c["layer_freq"] != 1 or "layer_mask" in m:
        refused.append("dense layers among the MoE ones")
    if c["attention_bias"]:
        refused.append("attention biases")
    if fam == "qwen3_moe" and not c["qk_norm"]:
        refused.append("qwen3_moe without qk_norm (transformers always has it)")
    if fam == "mixtral" and (c["qk_norm"] or not c["norm_topk"]):
        refused.append("mixtral with qk_norm or without norm_topk_prob (transformers has neither)")
    if refused:
        sys.exit("bench_torch_moe_gpu.py: not supported by these peers: " + ", ".join(refused))
    if c["balancing"] == "none":
        c["aux_coeff"] = 0.0
    return c


def tiny(c):
    """The same family and routing at a size a CPU trains in seconds (--tiny)."""
    e = min(c["experts"], 8)
    return {**c, "layers": min(c["layers"], 2), "hidden": 64, "intermediate": 128, "heads": 4, "kv_heads": 2,
            "head_dim": 16, "vocab": 512, "experts": e, "top_k": min(c["top_k"], e // 2), "moe_intermediate": 32}


def flops_per_token(c, seq_len):
    """megatrain's model_flops_per_token for an all-MoE model without a shared expert:
    6 * N_matmul + 12 * L * T * H * D, N_matmul counting the active weights: per layer
    q, k, v, o, the router C*E and k experts' gate, up and down 3*C*I_moe; the lm_head
    V*C (counted also when tied). The embedding lookup and norms are not matmuls."""
    C, L = c["hidden"], c["layers"]
    hd, kvd = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    attention = C * hd + 2 * C * kvd + hd * C
    moe = C * c["experts"] + c["top_k"] * 3 * C * c["moe_intermediate"] + 3 * C * c["shared"]
    return 6.0 * (c["vocab"] * C + L * (attention + moe)) + 12.0 * L * seq_len * hd


# ---------------------------------------------------------------- transformers

def build_hf(c, a, device):
    import transformers
    from transformers import AutoModelForCausalLM

    common = dict(vocab_size=c["vocab"], hidden_size=c["hidden"], num_hidden_layers=c["layers"],
                  num_attention_heads=c["heads"], num_key_value_heads=c["kv_heads"], head_dim=c["head_dim"],
                  max_position_embeddings=max(a.seq_len, 4096), rms_norm_eps=c["rms_eps"],
                  tie_word_embeddings=c["tie"], attention_bias=False, attention_dropout=0.0, use_cache=False,
                  rope_theta=c["rope_theta"], num_experts_per_tok=c["top_k"],
                  output_router_logits=c["aux_coeff"] > 0, router_aux_loss_coef=c["aux_coeff"],
                  attn_implementation="sdpa")
    if c["family"] == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(**common, intermediate_size=c["intermediate"] or 4 * c["hidden"],
                                          num_experts=c["experts"], moe_intermediate_size=c["moe_intermediate"],
                                          norm_topk_prob=c["norm_topk"], decoder_sparse_step=1, mlp_only_layers=[],
                                          use_sliding_window=False)
    else:  # Mixtral's intermediate_size is each expert's FFN size; its router always renormalises
        cfg = transformers.MixtralConfig(**common, intermediate_size=c["moe_intermediate"],
                                         num_local_experts=c["experts"], sliding_window=None, router_jitter_noise=0.0)
    theta = c["rope_theta"]
    rope = getattr(cfg, "rope_parameters", None)  # transformers 5 keeps rope_theta in here
    if isinstance(rope, dict) and rope.get("rope_theta") != theta:
        cfg.rope_parameters = {**rope, "rope_type": rope.get("rope_type", "default"), "rope_theta": theta}
    kwargs = {"attn_implementation": "sdpa"}
    if a.hf_experts:
        kwargs["experts_implementation"] = a.hf_experts
    model = None
    for dtype_key in ("dtype", "torch_dtype"):  # transformers 5 renamed torch_dtype to dtype
        try:
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(cfg, **kwargs, **{dtype_key: torch.float32})
            break
        except TypeError:
            continue
    if model is None:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, **kwargs)
    model = model.to(device=device, dtype=torch.float32).train()
    attn = getattr(model.config, "_attn_implementation", "?")
    if attn != "sdpa":
        sys.exit(f"bench_torch_moe_gpu.py: attention implementation is {attn!r}, expected 'sdpa'")
    experts = getattr(model.config, "_experts_implementation", None) or "eager (no experts_implementation)"
    if experts == "grouped_mm":
        # grouped_mm has no autocast kernel and transformers casts to the weights' dtype
        autocast = torch._C._dispatch_has_kernel_for_dispatch_key("aten::_grouped_mm", "AutocastCUDA")
        dtype = "bfloat16" if autocast else "float32"
    else:  # the per-expert loop of nn.functional.linear, which autocast casts to bf16
        dtype = "bfloat16"
    return model, {"transformers": transformers.__version__, "experts": experts, "experts_dtype": dtype}


# ---------------------------------------------------------------- the grouped_mm model

def round_up(x, m):
    return (x + m - 1) // m * m


class RMSNorm(nn.Module):
    """transformers' Llama/Qwen3/Mixtral RMSNorm: fp32 statistics, weight * x.to(input dtype)."""

    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        C, D = c["hidden"], c["head_dim"]
        self.h, self.kvh, self.d = c["heads"], c["kv_heads"], D
        self.q_proj = nn.Linear(C, self.h * D, bias=False)
        self.k_proj = nn.Linear(C, self.kvh * D, bias=False)
        self.v_proj = nn.Linear(C, self.kvh * D, bias=False)
        self.o_proj = nn.Linear(self.h * D, C, bias=False)
        self.q_norm = RMSNorm(D, c["rms_eps"]) if c["qk_norm"] else None
        self.k_norm = RMSNorm(D, c["rms_eps"]) if c["qk_norm"] else None

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.d)
        k = self.k_proj(x).view(B, T, self.kvh, self.d)
        v = self.v_proj(x).view(B, T, self.kvh, self.d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.h != self.kvh)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.h * self.d))


def grouped_experts(x, top_i, top_w, w_gu, w_d, align):
    """The experts on torch._grouped_mm, torchtitan's way, without a host synchronisation.

    x (N, C) fp32 or bf16, top_i / top_w (N, k): each token's experts and routing weights;
    w_gu (E, 2I, C) [gate; up], w_d (E, C, I), fp32 master weights (cast to bf16 here).
    Assignments are sorted by expert and each expert's rows padded to a multiple of
    `align` with zero rows, in a buffer of static size (N k + E (align - 1), rounded up);
    offs = cumsum of the padded counts as int32 (offs[e] = end row of expert e).
    Returns out (N, C) fp32 = sum_j top_w[n, j] * expert_{top_i[n, j]}(x[n]), and the
    per-expert assignment counts (E,) int64."""
    N, C = x.shape
    k = top_i.shape[1]
    E = w_gu.shape[0]
    A = N * k
    dev = x.device
    flat = top_i.reshape(-1)                                   # (A,) expert of each (token, slot)
    order = torch.argsort(flat, stable=True)                   # assignments grouped expert by expert
    counts = torch.zeros(E, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + (align - 1)) // align * align
    pad_end = torch.cumsum(padded, 0)
    pad_start = pad_end - padded
    cnt_start = torch.cumsum(counts, 0) - counts
    e_sorted = flat[order]
    pos_sorted = pad_start[e_sorted] + torch.arange(A, device=dev) - cnt_start[e_sorted]
    pos = torch.empty_like(pos_sorted).scatter_(0, order, pos_sorted)   # buffer row of each assignment
    rows = round_up(A + E * (align - 1), align)
    row_src = torch.full((rows,), N, dtype=torch.int64, device=dev)     # N: the zero row
    row_src = row_src.scatter(0, pos, torch.arange(A, device=dev) // k)
    xb = torch.cat([x.to(torch.bfloat16), x.new_zeros(1, C, dtype=torch.bfloat16)])
    xp = xb[row_src]                                                   # (rows, C) expert-major, padded
    offs = pad_end.to(torch.int32)
    h = torch._grouped_mm(xp, w_gu.to(torch.bfloat16).transpose(-2, -1), offs=offs)   # (rows, 2I)
    gate, up = h.chunk(2, dim=-1)
    act = F.silu(gate) * up
    y = torch._grouped_mm(act, w_d.to(torch.bfloat16).transpose(-2, -1), offs=offs)  # (rows, C)
    y_tok = y[pos].view(N, k, C)                                       # back in (token, slot) order
    return (y_tok.float() * top_w.unsqueeze(-1).float()).sum(1), counts


def reference_experts(x, top_i, top_w, w_gu, w_d):
    """The same layer as a plain loop over experts (bf16 products, fp32 sums). Used only
    by self_check, to test grouped_experts' permutation and offsets convention."""
    N, C = x.shape
    xb = x.to(torch.bfloat16)
    out = torch.zeros(N, C, dtype=torch.float32, device=x.device)
    for e in range(w_gu.shape[0]):
        tok, slot = (top_i == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        gate, up = (xb[tok] @ w_gu[e].to(torch.bfloat16).t()).chunk(2, dim=-1)
        y = (F.silu(gate) * up) @ w_d[e].to(torch.bfloat16).t()
        out = out.index_add(0, tok, y.float() * top_w[tok, slot].unsqueeze(-1).float())
    return out


class MoeLayer(nn.Module):
    def __init__(self, c, align):
        super().__init__()
        C, I, E = c["hidden"], c["moe_intermediate"], c["experts"]
        self.E, self.k, self.norm_topk, self.coeff, self.align = E, c["top_k"], c["norm_topk"], c["aux_coeff"], align
        self.router = nn.Parameter(torch.empty(E, C))
        self.gate_up = nn.Parameter(torch.empty(E, 2 * I, C))
        self.down = nn.Parameter(torch.empty(E, C, I))

    def route(self, x):
        with torch.autocast(x.device.type, enabled=False):  # the router in fp32, as megatrain's
            logits = x.float() @ self.router.float().t()
        scores = logits.softmax(dim=-1)
        top_w, top_i = scores.topk(self.k, dim=-1)
        if self.norm_topk:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        return scores, top_w, top_i

    def forward(self, x):
        B, T, C = x.shape
        xf = x.reshape(-1, C)
        scores, top_w, top_i = self.route(xf)
        out, counts = grouped_experts(xf, top_i, top_w, self.gate_up, self.down, self.align)
        N = xf.shape[0]
        # megatrain's aux_loss (moe_layer.c): coeff * E / (k N^2) * sum_e (sum_n p[n, e]) * count[e]
        aux = self.coeff * self.E / (self.k * N * N) * (scores.sum(0) * counts.to(scores.dtype)).sum()
        return out.view(B, T, C), aux


class Block(nn.Module):
    def __init__(self, c, align):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden"], c["rms_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden"], c["rms_eps"])
        self.mlp = MoeLayer(c, align)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        out, aux = self.mlp(self.post_attention_layernorm(x))
        return x + out, aux


class GroupedMoeLM(nn.Module):
    """Embedding, L x (attention, MoE on torch._grouped_mm), final norm, lm_head; the loss as
    transformers' causal LM loss (next-token cross entropy on fp32 logits, mean) plus the
    layers' aux losses."""

    def __init__(self, c, seq_len, align):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab"], c["hidden"])
        self.layers = nn.ModuleList(Block(c, align) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["hidden"], c["rms_eps"])
        self.lm_head = nn.Linear(c["hidden"], c["vocab"], bias=False)
        if c["tie"]:
            self.lm_head.weight = self.embed_tokens.weight
        D = c["head_dim"]
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
        freqs = torch.outer(torch.arange(seq_len).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        for name, p in self.named_parameters():  # transformers' init: normal(0, 0.02), norms 1
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, tokens):
        T = tokens.shape[1]
        x = self.embed_tokens(tokens)
        cos, sin = self.cos[:T].to(x.device), self.sin[:T].to(x.device)
        aux_total = x.new_zeros(())
        for layer in self.layers:
            x, aux = layer(x, cos, sin)
            aux_total = aux_total + aux
        logits = self.lm_head(self.norm(x))
        ce = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        return ce + aux_total, aux_total


def grouped_mm_problem(c):
    """Why torch._grouped_mm cannot run this shape, or None."""
    if not hasattr(torch, "_grouped_mm"):
        return f"skipped: torch {torch.__version__} has no torch._grouped_mm"
    for name in ("hidden", "moe_intermediate"):  # row strides of x, act and the weights: 16 bytes in bf16
        if c[name] % 8:
            return f"skipped: {name} {c[name]} is not a multiple of 8 (grouped_mm's 16-byte strides)"
    return None


def self_check(layer, device, tokens=256, seed=7):
    """grouped_experts against reference_experts on `tokens` random tokens with the layer's
    own weights and a random routing that leaves expert 1 empty and gives the others
    counts that are not multiples of the alignment: outputs, the input's, the routing
    weights' and both weight gradients within 2% (relative L2; bf16 products)."""
    g = torch.Generator(device=device).manual_seed(seed)
    E, k, C = layer.E, layer.k, layer.gate_up.shape[2]
    allowed = torch.tensor([e for e in range(E) if e != 1 or E - 1 < k], device=device)
    pick = torch.rand(tokens, allowed.numel(), generator=g, device=device).argsort(dim=-1)[:, :k]
    top_i = allowed[pick]
    top_w = torch.rand(tokens, k, generator=g, device=device).requires_grad_(True)
    x = torch.randn(tokens, C, generator=g, device=device).requires_grad_(True)
    grad_out = torch.randn(tokens, C, generator=g, device=device)
    results = []
    for fn in (lambda: grouped_experts(x, top_i, top_w, layer.gate_up, layer.down, layer.align)[0],
               lambda: reference_experts(x, top_i, top_w, layer.gate_up, layer.down)):
        out = fn()
        grads = torch.autograd.grad(out, (x, top_w, layer.gate_up, layer.down), grad_out)
        results.append((out.detach(),) + tuple(gr.detach() for gr in grads))
    worst = {}
    for name, got, ref in zip(("out", "d_x", "d_weights", "d_gate_up", "d_down"), *results):
        err = ((got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()
        worst[name] = err if err == err else float("inf")  # NaN counts as a failure
    return max(worst.values()) < 2e-2, worst


# ---------------------------------------------------------------- training

def train(a, c, device):
    impl = f"{'hf' if a.impl == 'hf' else 'grouped_mm'}-{a.mode}"
    base = {"impl": impl, "family": c["family"], "seq_len": a.seq_len, "micro_batch": a.micro_batch,
            "layers": c["layers"]}
    cuda = device == "cuda"
    info = {}
    if a.impl == "grouped":
        problem = grouped_mm_problem(c)
        if problem:
            emit({**base, "error": problem}, a.json, problem)
            return
        with torch.device(device):
            model = GroupedMoeLM(c, a.seq_len, a.align).to(device=device, dtype=torch.float32).train()
        ok, worst = self_check(model.layers[0].mlp, device)
        worst_text = ", ".join(f"{k} {v:.1e}" for k, v in worst.items())
        info = {"experts": f"torch._grouped_mm bf16, groups padded to {a.align} rows", "experts_dtype": "bfloat16",
                "self_check": worst}
        print(f"self-check of the grouped_mm layer against the per-expert loop: "
              f"{'ok' if ok else 'FAILED'} ({worst_text})", file=sys.stderr, flush=True)
        if not ok or a.self_check_only:
            emit({**base, **info, **({} if ok else {"error": "grouped_mm self-check failed: " + worst_text})},
                 a.json, f"self-check {'ok' if ok else 'FAILED'}: {worst_text}")
            return
        if cuda:  # the check's transient buffers are not the training step's memory
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    else:
        model, info = build_hf(c, a, device)
        if a.self_check_only:
            emit({**base, **info}, a.json, f"hf model built: {info}")
            return
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = adamw(model.parameters())
    step_model = torch.compile(model) if a.mode == "compile" else model
    params = list(model.parameters())
    gen = torch.Generator(device=device).manual_seed(a.seed)
    batches = torch.randint(0, c["vocab"], (a.warmup + a.steps, a.micro_batch, a.seq_len),
                            device=device, generator=gen)  # random tokens: speed only

    def step(tokens):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            if a.impl == "hf":
                out = step_model(input_ids=tokens, labels=tokens, use_cache=False)  # HF shifts labels
                aux = getattr(out, "aux_loss", None)  # transformers' aux loss, without its coefficient
                loss, aux = out.loss, (aux * c["aux_coeff"] if aux is not None else None)
            else:
                loss, aux = step_model(tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        return loss, aux

    (loss, aux), warmup_s, seconds = timed_steps(step, batches, a.warmup, a.steps, device)
    fpt = flops_per_token(c, a.seq_len)
    fields, text = step_report(loss, warmup_s, seconds, a.steps, a.micro_batch * a.seq_len, fpt, device,
                               a.mode == "compile", tflops_digits=2)
    aux_value = round(float(aux.detach()), 6) if torch.is_tensor(aux) else aux
    result = {**base, **fields, "aux_loss": aux_value,
              "hidden": c["hidden"], "experts_total": c["experts"], "top_k": c["top_k"],
              "params": n_params, "flops_per_token": fpt, "steps": a.steps, "warmup": a.warmup,
              "aux_coeff": c["aux_coeff"], "align": a.align if a.impl == "grouped" else None, **info,
              "device": device_name(device), "torch": torch.__version__}
    emit(result, a.json,
         f"{impl} {c['family']} L={c['layers']} C={c['hidden']} E={c['experts']} k={c['top_k']} "
         f"params={n_params / 1e9:.3f}B T={a.seq_len} B={a.micro_batch}: {text}; "
         f"experts: {info.get('experts')} ({info.get('experts_dtype')})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="a megatrain MoE config, e.g. configs/qwen3-30b-a3b.yaml")
    ap.add_argument("--layers", type=int, default=None, help="layers to keep (default: the config's)")
    ap.add_argument("--impl", choices=("hf", "grouped"), required=True)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=15, help="timed steps (default 15)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    ap.add_argument("--mode", choices=("eager", "compile"), default="eager")
    ap.add_argument("--hf-experts", default=None,
                    help="transformers' experts_implementation (default: transformers' default, grouped_mm in 5.x)")
    ap.add_argument("--align", type=int, default=8, help="rows per expert group rounded up to this (default 8: "
                    "16 bytes of bf16, torchtitan's TOKEN_GROUP_ALIGN_SIZE_M)")
    ap.add_argument("--self-check-only", action="store_true",
                    help="build the model (and, for --impl grouped, run the self-check), then stop")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: smoke tests only")
    ap.add_argument("--tiny", action="store_true", help="a tiny shape of the config's family (smoke tests)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < (1 if a.mode == "compile" else 0) or a.align < 1:
        ap.error("--steps and --align must be >= 1 (and --warmup >= 1 with --mode compile)")

    c = read_config(a.config, a.layers)
    if a.tiny:
        c = tiny(c)
    run_guarded(a.device, a.seed, lambda: train(a, c, a.device),
                {"impl": f"{'hf' if a.impl == 'hf' else 'grouped_mm'}-{a.mode}", "family": c["family"],
                 "seq_len": a.seq_len, "micro_batch": a.micro_batch})

if __name__ == "__main__":
    main()
