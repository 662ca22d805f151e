#!/usr/bin/env python3
"""bench_torch_finetune_gpu.py: the PyTorch peer of megatrain's fine-tuning on one GPU (issue 21).

Issue 21's benchmark: Llama 3.2 1B SFT on packed rows, LoRA rank 16 on all
seven linear layers (q, k, v, o, gate, up, down) and full fine-tuning beside
it: tokens/s and peak memory (torch.cuda.max_memory_allocated), against
megatrain on the same GPU. This is the transformers + PEFT half; the shape
comes from a megatrain config (configs/llama3.2-1b.yaml), random weights
(speed only, no download).

The configuration (the strongest fair peer of megatrain's contract, fp32
trained weights and bf16 compute):
  --mode lora  transformers' LlamaForCausalLM with every base weight in bf16
               (frozen: no master copy needed, half the bytes to read),
               peft LoraConfig(r=16, lora_alpha=32, the seven projections,
               lora_dropout=0, bias none), the adapters in fp32 (PEFT's
               autocast_adapter_dtype), bf16 compute under torch.autocast,
               fused AdamW on the adapters only.
  --mode full  fp32 master weights, bf16 compute under torch.autocast, fused
               AdamW on every weight (bench_torch_gpu.py's contract).
Both: SDPA attention, AdamW lr 1e-4, betas 0.9/0.95, weight decay 0.1 on
matrices, grad-norm clip 1.0, one micro-batch per step.

Packing (--packing docs, the default): each row of --seq-len positions is
filled with samples of random lengths (--doc-len MIN,MAX, uniform; the last
one cut to fit, so every position is a token), position_ids restarting at 0
at each sample, attention_mask None: transformers (masking_utils'
find_packed_sequence_indices) then builds a block-diagonal causal mask, so
each token attends only within its sample and RoPE restarts, as megatrain's
data.pack; the first token of each sample has no target (label -100).
transformers has no varlen path for SDPA: the mask is a dense (B, 1, T, T)
boolean, which SDPA's flash kernel does not take (it runs a masked kernel,
and GQA's keys and values are repeated first); the output's "attention"
field says which attention ran. --attn flex_attention lets transformers build a
block-sparse FlexAttention mask instead (cross-sample blocks skipped).
--packing none trains plain causal rows (tokens attend across samples:
the speed of unmasked flash SDPA, not the same attention).

TFLOP/s: megatrain's FLOPs count (src/model/model_flops.c, the full T x T
attention square whatever the packing; with LoRA 4 FLOPs per frozen weight
and 6 per adapter weight). --compile: torch.compile of the model.
--grad-ckpt [full|selective]: as bench_torch_gpu.py's.

peft on a GPU machine without internet: if `import peft` fails, the wheels
that tests/gpu/carry_wheels.sh downloaded into .devwheels/ (or $MT_WHEELS)
are installed with pip --no-deps --no-index into a temporary target.

Usage: bench_torch_finetune_gpu.py --mode lora|full [--config configs/llama3.2-1b.yaml] [--seq-len 4096]
         [--micro-batch 2] [--steps 10] [--warmup 3] [--compile] [--packing docs|none]
         [--attn sdpa|flex_attention] [--doc-len 256,2048] [--grad-ckpt [full|selective]] [--json]
       CPU smoke test (no GPU): ... --device cpu --tiny
"""
import argparse
import os
import sys
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_torch_gpu import (adamw, build_model, device_name, emit, enable_grad_ckpt,  # noqa: E402
                             flops_per_token, import_or_install, read_dense_config, run_guarded, step_report, timed_steps, tiny_shape)

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def packed_rows(n, rows, seq, vocab, doc_len, gen, device):
    """n batches of `rows` rows: tokens, position_ids restarting per sample, labels (-100 at each sample's
    first token), and the mean number of samples per row."""
    tokens = torch.randint(0, vocab, (n, rows, seq), generator=gen)
    positions = torch.empty(n, rows, seq, dtype=torch.long)
    lo, hi = doc_len
    samples = 0
    for b in range(n):
        for r in range(rows):
            t = 0
            while t < seq:
                length = min(int(torch.randint(lo, hi + 1, (1,), generator=gen)), seq - t)
                positions[b, r, t:t + length] = torch.arange(length)
                t += length
                samples += 1
    labels = tokens.masked_fill(positions == 0, -100)
    return tokens.to(device), positions.to(device), labels.to(device), samples / (n * rows)


def apply_lora(model, rank):
    import peft

    cfg = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=LORA_TARGETS, lora_dropout=0.0, bias="none",
                          task_type="CAUSAL_LM")
    return peft.get_peft_model(model, cfg), peft.__version__


def train(a, shape):
    impl = f"torch-{a.mode}-{'compile' if a.compile else 'eager'}"
    base = {"impl": impl, "mode": a.mode, "family": shape.family, "seq_len": a.seq_len, "micro_batch": a.micro_batch,
            "packing": a.packing, "attn": a.attn, "grad_ckpt": a.grad_ckpt}
    info = {}
    if a.mode == "lora":
        info["peft_source"] = import_or_install("peft")
    model, tf_version = build_model(shape, a.device, torch.bfloat16 if a.mode == "lora" else torch.float32)
    if a.attn != "sdpa":
        model.set_attn_implementation(a.attn)
    enable_grad_ckpt(model, a.grad_ckpt)
    if a.mode == "lora":
        model, info["peft"] = apply_lora(model, a.lora_rank)
    trainable = [p for p in model.parameters() if p.requires_grad]
    info["trainable_params"] = sum(p.numel() for p in trainable)
    info["trainable_dtype"] = str(trainable[0].dtype).replace("torch.", "")
    info["frozen_dtype"] = str(next(p for p in model.parameters() if not p.requires_grad).dtype).replace(
        "torch.", "") if a.mode == "lora" else None
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = adamw(trainable)
    step_model = torch.compile(model) if a.compile else model

    gen = torch.Generator().manual_seed(a.seed)
    n = a.warmup + a.steps
    if a.packing == "docs":
        tokens, positions, labels, per_row = packed_rows(n, a.micro_batch, a.seq_len, shape.vocab, a.doc_len, gen,
                                                         a.device)
        info["samples_per_row"] = round(per_row, 2)
        info["attention"] = (f"{a.attn}, block-diagonal causal mask from position_ids" if a.attn == "sdpa" else
                             f"{a.attn}, block mask from position_ids")
    else:
        tokens = torch.randint(0, shape.vocab, (n, a.micro_batch, a.seq_len), generator=gen).to(a.device)
        positions, labels = None, tokens
        info["attention"] = f"{a.attn}, plain causal rows (samples not separated)"

    def step(i):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=torch.bfloat16):
            loss = step_model(input_ids=tokens[i], labels=labels[i], use_cache=False,
                              position_ids=None if positions is None else positions[i]).loss  # HF shifts labels
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        return loss

    loss, warmup_s, seconds = timed_steps(step, range(n), a.warmup, a.steps, a.device)
    fpt = flops_per_token(shape, a.lora_rank if a.mode == "lora" else 0)
    fields, text = step_report(loss, warmup_s, seconds, a.steps, a.micro_batch * a.seq_len, fpt, a.device,
                               a.compile, tflops_digits=2)
    result = {**base, **fields, "layers": shape.layers, "hidden": shape.hidden, "params": n_params,
              "flops_per_token": fpt, "lora_rank": a.lora_rank if a.mode == "lora" else None, **info,
              "steps": a.steps, "warmup": a.warmup,
              "device": device_name(a.device), "torch": torch.__version__, "transformers": tf_version}
    emit(result, a.json,
         f"{impl} L={shape.layers} C={shape.hidden} T={a.seq_len} B={a.micro_batch} trainable "
         f"{info['trainable_params'] / 1e6:.2f}M of {n_params / 1e9:.3f}B: {text}; attention: {info['attention']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("lora", "full"), required=True)
    ap.add_argument("--config", default="configs/llama3.2-1b.yaml", help="a megatrain dense config")
    ap.add_argument("--layers", type=int, default=None, help="layers to keep (default: the config's)")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--packing", choices=("docs", "none"), default="docs")
    ap.add_argument("--attn", choices=("sdpa", "flex_attention"), default="sdpa")
    ap.add_argument("--doc-len", default="256,2048", help="MIN,MAX sample length when packing (default 256,2048)")
    ap.add_argument("--lora-rank", type=int, default=16, help="LoRA rank (alpha = 2 x rank; default 16)")
    ap.add_argument("--grad-ckpt", nargs="?", const="full", default="none", choices=("none", "full", "selective"))
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: smoke tests only")
    ap.add_argument("--tiny", action="store_true", help="a tiny shape of the config's family (smoke tests)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    a = ap.parse_args()
    a.doc_len = tuple(int(x) for x in a.doc_len.split(","))
    if len(a.doc_len) != 2 or not 1 <= a.doc_len[0] <= a.doc_len[1]:
        ap.error("--doc-len MIN,MAX with 1 <= MIN <= MAX")
    if a.steps < 1 or a.warmup < (1 if a.compile else 0):
        ap.error("--steps must be >= 1 (and --warmup >= 1 with --compile)")

    shape = read_dense_config(a.config)
    shape = tiny_shape(shape) if a.tiny else shape
    shape = types.SimpleNamespace(**{**shape, "layers": a.layers or shape["layers"], "seq_len": a.seq_len})
    run_guarded(a.device, a.seed, lambda: train(a, shape),
                {"impl": f"torch-{a.mode}-{'compile' if a.compile else 'eager'}", "mode": a.mode,
                 "seq_len": a.seq_len, "micro_batch": a.micro_batch, "packing": a.packing})

if __name__ == "__main__":
    main()
