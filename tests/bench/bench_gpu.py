#!/usr/bin/env python3
"""bench_gpu.py: megatrain's CUDA backend against PyTorch on the same GPU, in one run.

For each shape (dense: Llama 3.2 1B at seq 2048 and 4096, Qwen3 1.7B at seq
4096; mixture of experts, issue 17: Qwen3-30B-A3B with 4 layers and Mixtral
8x7B with 2, seq 4096, micro-batch 1):
megatrain trains the configs/ architecture with one micro-batch per step
(global batch = micro batch, as the PyTorch peers do) on byte-level data, and
is stopped after --steps steps (the end-of-run checkpoint is not part of the
measurement); tokens/s is the mean over the steps after --warmup. Then the
PyTorch peers train the same shape, each in its own process, eager and with
torch.compile: for the dense shapes tests/bench/bench_torch_gpu.py
(transformers' LlamaForCausalLM / Qwen3ForCausalLM); for the MoE shapes
tests/bench/bench_torch_moe_gpu.py, as 'hf' (transformers'
Qwen3MoeForCausalLM / MixtralForCausalLM with its default experts
implementation) and 'grouped_mm' (a torchtitan-style model on
torch._grouped_mm, self-checked against a per-expert loop before timing;
'skipped' where torch has no _grouped_mm). MFU = TFLOP/s / the bf16 matmul
peak measured in the same run (8192^3 torch.matmul). FLOPs per token:
megatrain's count (6N + attention, src/model/model_flops.c; over the active
parameters for MoE: router, k experts, attention, lm_head), used by every
row. A peer that runs out of GPU memory shows as OOM, one that fails or
passes --torch-timeout as its error; the other rows still run.

Usage: python3 tests/bench/bench_gpu.py [--megatrain build/cuda/megatrain] [--steps 20] [--warmup 5]
         [--only NAME[,NAME...]] [--group all|dense|moe] [--no-torch] [--moe-peers LIST]
         [--torch-timeout S] [--out DIR] [--env NAME=VALUE ...] [--set KEY=VALUE ...] [--ranks N]
--set adds a recipe setting to the megatrain runs (a lever: train.recompute=full,
optimizer.state_dtype=bf16). --ranks N runs megatrain under mpirun on N
data-parallel ranks (the global batch N micro-batches; ranks sharing a GPU
stage their collectives through the host, so tokens/s there is not a
speed): each row also gets arena_gib, one rank's allocation from its log
(the distributed optimizer's saving: --set parallel.distributed_optimizer=true). LARGE_SHAPES run only when --only names them:
llama3-8b-s8192, Llama 3 8B at seq 8192, which fits one H200 with
--set train.recompute=full --set optimizer.state_dtype=bf16.
Prints a Markdown table last; DIR gets results.json (written after each
shape) and the logs. Time: the dense group took about 7 minutes on an H100;
the MoE shapes' PyTorch rows have not run on a GPU yet (estimate: 4 to 6
minutes a shape, the two compiles most of it). A device call is at most 10
minutes: run the dense group (--group dense) and each MoE shape (--only
qwen3-30b-a3b, --only mixtral) in calls of their own.
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

SHAPES = [  # name, config, torch args (dense: bench_torch_gpu.py's; "moe": bench_torch_moe_gpu.py), seq_len,
    # micro_batch[, num_layers]
    ("llama3.2-1b-s2048", "configs/llama3.2-1b.yaml",
     "--family llama --layers 16 --hidden 2048 --intermediate 8192 --heads 32 --kv-heads 8 --head-dim 64 "
     "--vocab 128256 --tie --rope-theta 500000", 2048, 4),
    ("llama3.2-1b-s4096", "configs/llama3.2-1b.yaml",
     "--family llama --layers 16 --hidden 2048 --intermediate 8192 --heads 32 --kv-heads 8 --head-dim 64 "
     "--vocab 128256 --tie --rope-theta 500000", 4096, 2),
    ("qwen3-1.7b-s4096", "configs/qwen3-1.7b.yaml",
     "--family qwen3 --layers 28 --hidden 2048 --intermediate 6144 --heads 16 --kv-heads 8 --head-dim 128 "
     "--vocab 151936 --tie --rope-theta 1000000", 4096, 2),
    # Mixture of experts (issue 17): the real layer shapes, few layers, so that fp32 master weights and AdamW fit
    # one GPU. TFLOP/s count the active parameters (the k routed experts, the router, attention). The PyTorch
    # peers read the same config and layer count (bench_torch_moe_gpu.py --config ... --layers ...).
    ("qwen3-30b-a3b-4l-s4096", "configs/qwen3-30b-a3b.yaml", "moe", 4096, 1, 4),
    ("mixtral-8x7b-2l-s4096", "configs/mixtral-8x7b.yaml", "moe", 4096, 1, 2),
]
# Run only when --only names them (no group holds them): issue 18's Llama 3 8B on one H200, which fits with
# `--set train.recompute=full --set optimizer.state_dtype=bf16` (plan: 110 GiB); its PyTorch peer is
# device_check.sh's bench-8b-peer.
LARGE_SHAPES = [
    ("llama3-8b-s8192", "configs/llama3-8b.yaml",
     "--family llama --layers 32 --hidden 4096 --intermediate 14336 --heads 32 --kv-heads 8 --head-dim 128 "
     "--vocab 128256 --rope-theta 500000", 8192, 1),
]
MOE_PEERS = ("hf-eager", "hf-compile", "grouped_mm-eager", "grouped_mm-compile")  # bench_torch_moe_gpu.py's rows


def make_data(megatrain, prefix):
    """About 4M byte tokens of pseudo-words (the content does not matter for speed)."""
    if os.path.exists(prefix + ".bin"):
        return
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    text = prefix + ".txt"
    with open(text, "w") as f:
        for _ in range(4000):
            f.write(" ".join(rng.choice(words) for _ in range(180)) + "\n")
    subprocess.run([megatrain, "data", "build", "--input", text, "--output", prefix], check=True,
                   stdout=subprocess.DEVNULL)


def with_layers(config, layers, out):
    """A copy of config (in out) with num_layers: layers."""
    lines = open(os.path.join(REPO, config)).read().splitlines()
    path = os.path.join(out, f"{os.path.basename(config)[:-5]}-{layers}l.yaml")
    with open(path, "w") as f:
        f.write("\n".join(f"num_layers: {layers}" if l.startswith("num_layers:") else l for l in lines) + "\n")
    return path


def run_megatrain(a, name, config, seq, mbs, data, out, layers=None):
    run_dir = os.path.join(out, "run-" + name)
    if layers:
        config = with_layers(config, layers, out)
    subprocess.run(["rm", "-rf", run_dir])
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(a.ranks)] if a.ranks > 1 else []
    cmd = mpirun + [a.megatrain, "run", os.path.join(REPO, "recipes/bench/gpu.yaml"), "--set", f"model={config}",
           "--set", f"run.dir={run_dir}", "--set", f"train.seq_len={seq}", "--set", f"train.micro_batch_size={mbs}",
           "--set", f"train.global_batch_size={mbs * a.ranks}", "--set", f"train.steps={a.steps + 1000}",
           "--set", f"data.train=[{{path: {data}, weight: 1.0}}]"]
    for kv in a.overrides:  # --set: a lever of the recipe (optimizer.state_dtype=bf16, ...)
        cmd += ["--set", kv]
    log = open(os.path.join(out, name + ".megatrain.log"), "w")
    env = dict(os.environ, **dict(kv.split("=", 1) for kv in a.env))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env,
                            start_new_session=True)
    steps_seen, arena = 0, None
    for line in proc.stdout:
        log.write(line)
        found = re.search(r"^device: .*, ([0-9.]+) GiB allocated", line)
        if found and arena is None:
            arena = float(found.group(1))
        if line.startswith("step "):
            steps_seen += 1
            if steps_seen >= a.steps:
                break
    os.killpg(proc.pid, signal.SIGKILL)  # mpirun's ranks too
    proc.wait()
    log.close()
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if l.strip()]
    timed = [r for r in rows if r["step"] > a.warmup]
    if not timed:
        return {"impl": "megatrain", "error": "no steps (see %s.megatrain.log)" % name}
    tps = sum(r["tokens_per_s"] for r in timed) / len(timed)
    return {"impl": "megatrain", "tokens_per_s": tps, "tflops": sum(r["tflops"] for r in timed) / len(timed),
            "peak_mem_gib": timed[-1].get("peak_mem_gib"), "arena_gib": arena, "first_loss": rows[0]["loss"],
            "loss": timed[-1]["loss"], "steps": len(timed)}


def run_peer(cmd, impl, log_path, timeout):
    """One PyTorch peer in its own process (its own CUDA context: an OOM or a crash ends only it),
    killed with its process group (inductor's compile workers too) after timeout seconds."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        timed_out = True
    with open(log_path, "w") as f:
        f.write(stdout + stderr)
    if timed_out:
        return {"impl": impl, "error": f"timeout after {timeout} s"}
    lines = [l for l in stdout.splitlines() if l.startswith("{")]
    if lines:
        return json.loads(lines[-1])
    tail = [l for l in stderr.strip().splitlines() if l.strip()]
    return {"impl": impl, "error": (tail[-1] if tail else f"exit {proc.returncode}")[-300:]}


def run_torch(a, torch_args, seq, mbs, mode, out, name):
    cmd = [sys.executable, os.path.join(HERE, "bench_torch_gpu.py")] + torch_args.split() + [
        "--seq-len", str(seq), "--micro-batch", str(mbs), "--steps", str(a.steps - a.warmup),
        "--warmup", str(a.warmup), "--mode", mode, "--json"]
    return run_peer(cmd, "torch-" + mode, os.path.join(out, f"{name}.torch-{mode}.log"), a.torch_timeout)


def run_torch_moe(a, config, layers, seq, mbs, peer, out, name):
    """peer: hf-eager, hf-compile, grouped_mm-eager or grouped_mm-compile."""
    impl, mode = peer.rsplit("-", 1)
    cmd = [sys.executable, os.path.join(HERE, "bench_torch_moe_gpu.py"), "--config", os.path.join(REPO, config),
           "--layers", str(layers), "--impl", "hf" if impl == "hf" else "grouped", "--seq-len", str(seq),
           "--micro-batch", str(mbs), "--steps", str(a.steps - a.warmup), "--warmup", str(a.warmup),
           "--mode", mode, "--json"]
    return run_peer(cmd, peer, os.path.join(out, f"{name}.{peer}.log"), a.torch_timeout)


def print_table(results):
    peak = results["peak"]
    print(f"\nGPU: {peak['device']}, bf16 matmul peak {peak['tflops']} TFLOP/s (torch {peak['torch']})\n")
    print("| shape | seq | mbs | impl | tokens/s | TFLOP/s | MFU | peak mem GiB | vs megatrain |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in results["rows"]:
        ours = row["impls"][0].get("tokens_per_s") if row["impls"] else None
        for r in row["impls"]:
            if "error" in r:
                err = "OOM" if r["error"] == "oom" else r["error"][:60].replace("|", "/")
                print(f"| {row['name']} | {row['seq_len']} | {row['micro_batch']} | {r['impl']} | {err} | | | | |")
                continue
            mfu = 100.0 * r["tflops"] / peak["tflops"]
            rel = f"{ours / r['tokens_per_s']:.2f}x" if ours and r["impl"] != "megatrain" else ""
            mem = r.get("peak_mem_gib")
            print(f"| {row['name']} | {row['seq_len']} | {row['micro_batch']} | {r['impl']} | {r['tokens_per_s']:.0f} | "
                  f"{r['tflops']:.1f} | {mfu:.1f}% | {mem if mem is None else round(mem, 1)} | {rel} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--megatrain", default=os.path.join(REPO, "build/cuda/megatrain"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--only", default="", help="run the shapes whose name contains NAME (comma-separated: any)")
    ap.add_argument("--group", choices=("all", "dense", "moe"), default="all",
                    help="the dense shapes, the MoE shapes, or all (default)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--moe-peers", default=",".join(MOE_PEERS),
                    help="the PyTorch rows of a MoE shape, comma-separated (default: %(default)s)")
    ap.add_argument("--torch-timeout", type=int, default=300, help="seconds per PyTorch peer (default 300)")
    ap.add_argument("--out", default=os.path.join(REPO, "runs/bench-gpu"))
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the megatrain runs (repeatable)")
    ap.add_argument("--set", action="append", default=[], dest="overrides",
                    help="KEY=VALUE added to the megatrain runs' recipe, as megatrain's --set (repeatable)")
    ap.add_argument("--ranks", type=int, default=1, help="megatrain on N data-parallel ranks under mpirun (default 1)")
    a = ap.parse_args()
    moe_peers = [p for p in a.moe_peers.split(",") if p]
    unknown = [p for p in moe_peers if p not in MOE_PEERS]
    if unknown:
        ap.error(f"--moe-peers: unknown {', '.join(unknown)} (known: {', '.join(MOE_PEERS)})")
    os.makedirs(a.out, exist_ok=True)
    data = os.path.join(a.out, "words")
    make_data(a.megatrain, data)
    peak = json.loads(subprocess.run([sys.executable, os.path.join(HERE, "bench_torch_gpu.py"), "--peak", "--json"],
                                     capture_output=True, text=True, check=True).stdout.splitlines()[-1])
    results = {"peak": peak, "rows": []}
    for name, config, torch_args, seq, mbs, *extra in SHAPES + LARGE_SHAPES:
        if a.only and not any(o in name for o in a.only.split(",") if o):
            continue
        if not a.only and (name, config, torch_args, seq, mbs, *extra) in LARGE_SHAPES:
            continue
        moe = torch_args == "moe"
        if a.group != "all" and (a.group == "moe") != moe:
            continue
        layers = extra[0] if extra else None
        row = {"name": name, "seq_len": seq, "micro_batch": mbs, "impls": []}
        t0 = time.time()
        row["impls"].append(run_megatrain(a, name, config, seq, mbs, data, a.out, layers))
        print(f"{name}: megatrain {row['impls'][-1]} ({time.time() - t0:.0f}s)", flush=True)
        if not a.no_torch:
            for peer in (moe_peers if moe else ("eager", "compile")):
                t0 = time.time()
                row["impls"].append(run_torch_moe(a, config, layers, seq, mbs, peer, a.out, name) if moe else
                                    run_torch(a, torch_args, seq, mbs, peer, a.out, name))
                print(f"{name}: torch {peer} {row['impls'][-1]} ({time.time() - t0:.0f}s)", flush=True)
        results["rows"].append(row)
        with open(os.path.join(a.out, "results.json"), "w") as f:  # after each shape: a cut-off run keeps its rows
            json.dump(results, f, indent=1)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print_table(results)


if __name__ == "__main__":
    main()
