#!/usr/bin/env bash
# device_check.sh: what a lent GPU machine runs, in parts that each fit a
# device call: the GPU tests, a profiled training run (time per kind of op),
# the benchmarks against PyTorch. Expects .devlibs.tgz from tests/gpu/carry_libs.sh
# (megatrain, the GPU test programs and the libraries they need; or build/cuda
# on a machine with our packages: then plain
# `make test-gpu` and `make bench-gpu` do the same). Logs go to $OUT (or
# /tmp/device-check). Usage: bash tests/gpu/device_check.sh [backlog|states|recompute|zero1|cp-attention|moe-recompute|mixtral-ways|tests|attention|profile|bench|moe-ways|bench-a3b
#   |bench-mixtral|bench-finetune-peers|bench-recompute-peers|bench-8b-peer|bench-8b-compiled-peer|bench-fp8-peers|bench-fp8-8b-peer ...]
# (backlog: a GPU session's first call, sized for a session's 15 minutes of device time (tests/gpu/PENDING.md):
# the GPU tests, then megatrain's dense step beside RESULTS.md's, then the MoE expert-product ways, each only if
# the time it needs is left of BACKLOG_S seconds (default 420), stopping in time and saying what did not fit;
# states: issue 18's bf16 AdamW states, their tests and 1B's step with each state dtype; recompute: issue 18's
# activation recomputation, its tests, 1B's step with each mode and Llama 3 8B at seq 8192 on an H200;
# zero1: issue 18's distributed optimizer, its tests and 1B at dp 2 (ranks sharing the GPU) with and without it;
# cp-attention: issue 18's context-parallel attention kernel, its tests and its speed beside the dense kernel's;
# moe-recompute: issue 18's full recompute of MoE models, its tests;
# mixtral-ways: the Mixtral step with each MEGATRAIN_MOE_GEMM; all share backlog's deadline.
# (bench: the dense shapes, about 7 minutes on an H100; moe-ways: megatrain alone on the MoE shapes with
# each MEGATRAIN_MOE_GEMM, about 5 minutes; bench-a3b and bench-mixtral: one MoE shape each,
# megatrain and its PyTorch peers; each in a device call of its own: a call is at most 10 minutes.
# The *-peers parts and bench-8b-peer run only PyTorch peers (megatrain refuses LoRA, packing and FP8
# on GPUs for now), each within 9 minutes, and need no build: bench-finetune-peers
# (issue 21) needs .devwheels carried (tests/gpu/carry_wheels.sh) where the machine has no peft;
# bench-8b-peer (issue 18, Llama 3 8B at seq 8192) is meant for an H200, and so is bench-8b-compiled-peer (the same
# with torch.compile); bench-fp8-peers and bench-fp8-8b-peer
# (issue 20: torchao float8 against bf16, and the FP8 matrix peak) need .devwheels where the machine has no torchao)
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
out=${OUT:-/tmp/device-check}
mkdir -p "$out"
parts=${*:-tests profile bench}

# run_peers NAME SCRIPT "ARGS" ...: one PyTorch peer per ARGS, each in its own process (an OOM or a crash ends
# only it), all within 540 s (a peer gets at most 240 s, the last ones what is left, none under 60 s): their
# JSON lines in $out/NAME.jsonl (the bf16 matmul peak first, for MFU), their logs in $out/NAME-I.log; then a summary.
run_peers() {
  local name=$1 script=$2 deadline=$((SECONDS + 540)) i=0 left rc
  shift 2
  python3 tests/bench/bench_torch_gpu.py --peak --json > "$out/$name.jsonl" 2> "$out/$name-peak.log"
  for args in "$@"; do
    i=$((i + 1)); left=$((deadline - SECONDS))
    if (( left < 60 )); then echo "{\"args\": \"$args\", \"error\": \"skipped: no time left\"}" >> "$out/$name.jsonl"; continue; fi
    # shellcheck disable=SC2086  # ARGS are words
    timeout -k 10 $((left < 240 ? left : 240)) python3 "$script" $args --json >> "$out/$name.jsonl" 2> "$out/$name-$i.log"
    rc=$?
    (( rc == 0 )) || echo "{\"args\": \"$args\", \"error\": \"exit $rc (124: timeout), see $name-$i.log\"}" >> "$out/$name.jsonl"
  done
  python3 - "$out/$name.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
peak = next((r["tflops"] for r in rows if r.get("impl") == "torch-matmul-peak"), None)
fp8_peak = next((r["tflops"] for r in rows if r.get("impl") == "torch-scaled-mm-peak"), None)
print(f"bf16 matmul peak {peak} TFLOP/s" if peak else "no matmul peak")
if fp8_peak:
    print(f"fp8 (E4M3 _scaled_mm) peak {fp8_peak} TFLOP/s")
for r in rows:
    if r.get("impl", "").endswith("-peak"):
        continue
    what = " ".join(f"{k}={r[k]}" for k in ("impl", "layers", "seq_len", "micro_batch", "packing", "attn", "grad_ckpt",
                                           "weights", "float8", "args") if r.get(k) not in (None, "none"))
    if "error" in r:
        print(f"{what}: {r['error']}")
        continue
    mfu = f", MFU {100 * r['tflops'] / peak:.1f}%" if peak else ""
    if fp8_peak and r.get("float8") not in (None, "none"):
        mfu += f" ({100 * r['tflops'] / fp8_peak:.1f}% of the fp8 peak)"
    print(f"{what}: {r['tokens_per_s']:.0f} tok/s, {r['tflops']} TFLOP/s{mfu}, peak {r.get('peak_mem_gib')} GiB, "
          f"loss {r['loss']}" + (f", compile {r['compile_s']} s" if r.get("compile_s") else ""))
EOF
}
# test_summary: the lines of $out/tests.log worth reading in the call's reply (verdicts, measured differences, NCCL's
# read of the launch order, what the emulator is stricter about)
test_summary() {
  grep -E "^(PASS|FAIL|SKIP)|FAIL|passed|worst|loss cpu|steps 300|nccl run|first loss|skip|stricter|NCCL_LAUNCH" \
    "$out/tests.log" | grep -v " ok$" | tail -60
}
# The parts with steps (backlog, states, recompute, zero1, cp-attention, moe-recompute, mixtral-ways) share one deadline, BACKLOG_S seconds from the start (a
# device call is at most 600 s and a session has 900 s of device time, a machine's start included): each step is
# started only if its estimate fits in what is left and is stopped at the deadline; the table at the end
# ($out/backlog.txt) says what ran, passed, failed or was left.
deadline=$((SECONDS + ${BACKLOG_S:-420}))
summary=()
step() {  # step NAME LOG ESTIMATE_S COMMAND...: COMMAND > $out/LOG if ESTIMATE_S fits in what is left, until the deadline
  local name=$1 log=$2 need=$3 left rc start; shift 3
  left=$((deadline - SECONDS))
  if (( left < need )); then summary+=("$name: not started (needs about $need s, $left s left)"); return; fi
  start=$SECONDS
  timeout -k 10 "$left" "$@" > "$out/$log" 2>&1; rc=$?
  case $rc in
    0) summary+=("$name: passed in $((SECONDS - start)) s ($log)") ;;
    124|137) summary+=("$name: stopped at the deadline after $((SECONDS - start)) s ($log)") ;;
    *) summary+=("$name: FAILED (exit $rc) after $((SECONDS - start)) s ($log)") ;;
  esac
}
# backlog: the parts that unblock the most, in order.
backlog() {
  local way
  step "GPU tests (run_gpu_tests.sh)" tests.log 120 bash tests/gpu/run_gpu_tests.sh
  test_summary
  # the dense step every earlier GPU run measured (RESULTS.md: about 50,300 tokens/s on an H100 at 8baf628)
  step "dense step, Llama 3.2 1B seq 4096" dense.log 90 python3 tests/bench/bench_gpu.py --no-torch \
    --only llama3.2-1b-s4096 --steps 12 --warmup 4 --out /tmp/backlog-dense
  tail -3 "$out/dense.log" 2>/dev/null
  for way in cublas kernel cublas_grouped; do  # issue 17, item 3: which way of the expert products is fastest
    step "Qwen3-30B-A3B step, MEGATRAIN_MOE_GEMM=$way" "a3b-$way.log" 90 python3 tests/bench/bench_gpu.py --no-torch \
      --only a3b --steps 8 --warmup 3 --out "/tmp/backlog-a3b-$way" --env "MEGATRAIN_MOE_GEMM=$way"
    tail -3 "$out/a3b-$way.log" 2>/dev/null
  done
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for part in $parts; do
  case $part in
    backlog) backlog ;;
    tests)
      bash tests/gpu/run_gpu_tests.sh > "$out/tests.log" 2>&1
      test_summary ;;
    attention) # kernels/attention.cu against fp64, then its TFLOP/s, dense and context parallel (carry_libs.sh builds
      # build/cuda/attention_selftest and .devlibs.tgz carries it)
      build/cuda/attention_selftest > "$out/attention.log" 2>&1; grep -E "FAIL|correctness|TFLOP" "$out/attention.log" ;;
    cp-attention) # issue 18, item 6: the context-parallel attention on the tensor cores (kernels/attention.cu's AT
      # form): the tests that run it (test_cuda_ops against the CPU and bit-identical to the dense kernel at positions
      # 0..T-1, test_cuda_parallel_model's cp grids, test_cuda_layouts.sh's cp rows against one GPU), then its speed
      # beside the dense kernel's (attention_selftest: TFLOP/s over the pairs each sees; the same expected). The same
      # tests and test_cuda_plan check sequence parallel's norm outputs gathered again in the backward (2026-11-29)
      step "GPU tests: ops, parallel model, layouts, plan" tests-cp.log 150 bash tests/gpu/run_gpu_tests.sh \
        test_cuda_ops test_cuda_parallel_model test_cuda_layouts test_cuda_plan
      grep -E "^(PASS|FAIL)|FAIL|attention at|cp2|cp 2|sequence parallel" "$out/tests-cp.log" | grep -v " ok$" | head -30
      step "attention self-test and timing" attention.log 60 build/cuda/attention_selftest
      grep -E "FAIL|correctness|TFLOP" "$out/attention.log" ;;
    profile)
      python3 tests/bench/bench_gpu.py --no-torch --only llama3.2-1b-s4096 --steps 7 --warmup 2 --out /tmp/profile-run \
        --env MEGATRAIN_CUDA_PROFILE=5 > "$out/profile.log" 2>&1
      grep -A12 "CUDA profile" /tmp/profile-run/*.megatrain.log | head -14 ;;
    bench)
      python3 tests/bench/bench_gpu.py --group dense --out /tmp/bench-gpu > "$out/bench.log" 2>&1
      cp /tmp/bench-gpu/results.json "$out/" 2>/dev/null
      head -3 /tmp/bench-gpu/llama3.2-1b-s4096.megatrain.log > "$out/megatrain-head.log" 2>/dev/null
      grep -E "^(step|device)" /tmp/bench-gpu/llama3.2-1b-s4096.megatrain.log | head -4
      tail -14 "$out/bench.log" ;;
    moe-ways) # megatrain alone on both MoE shapes with each way of the expert products (MEGATRAIN_MOE_GEMM)
      for way in cublas cublas_grouped kernel; do
        python3 tests/bench/bench_gpu.py --no-torch --group moe --steps 8 --warmup 3 --out "/tmp/moe-$way" \
          --env MEGATRAIN_MOE_GEMM=$way > "$out/moe-$way.log" 2>&1
        echo "MEGATRAIN_MOE_GEMM=$way"; tail -4 "$out/moe-$way.log"
      done ;;
    bench-a3b|bench-mixtral)
      shape=${part#bench-}
      # a peer past 200 s (a slow compile) becomes a timeout row: the call stays within 10 minutes
      python3 tests/bench/bench_gpu.py --only "$shape" --torch-timeout 200 --out "/tmp/$part" > "$out/$part.log" 2>&1
      cp "/tmp/$part/results.json" "$out/results-$shape.json" 2>/dev/null
      grep -h "self-check" /tmp/$part/*grouped_mm-eager.log 2>/dev/null | head -2
      tail -9 "$out/$part.log" ;;
    bench-finetune-peers) # issue 21: Llama 3.2 1B, seq 4096, micro-batch 2, packed rows; LoRA rank 16 and full
      run_peers finetune tests/bench/bench_torch_finetune_gpu.py "--mode lora" "--mode full" "--mode lora --compile" \
        "--mode full --compile" "--mode lora --packing none" "--mode lora --attn flex_attention" ;;
    bench-recompute-peers) # issue 18's levers: Llama 3.2 1B, seq 4096, micro-batch 2, recompute none / selective / full
      run_peers recompute tests/bench/bench_torch_gpu.py \
        "--config configs/llama3.2-1b.yaml --seq-len 4096 --micro-batch 2 --steps 10 --warmup 3 --grad-ckpt none" \
        "--config configs/llama3.2-1b.yaml --seq-len 4096 --micro-batch 2 --steps 10 --warmup 3 --grad-ckpt selective" \
        "--config configs/llama3.2-1b.yaml --seq-len 4096 --micro-batch 2 --steps 10 --warmup 3 --grad-ckpt full" ;;
    bench-8b-peer) # issue 18: Llama 3 8B, seq 8192, micro-batch 1, on an H200: fp32 master weights if they fit, then bf16
      run_peers 8b tests/bench/bench_torch_gpu.py \
        "--config configs/llama3-8b.yaml --seq-len 8192 --micro-batch 1 --steps 8 --warmup 2 --grad-ckpt full" \
        "--config configs/llama3-8b.yaml --seq-len 8192 --micro-batch 1 --steps 8 --warmup 2 --grad-ckpt full --weights bf16" \
        "--config configs/llama3-8b.yaml --seq-len 8192 --micro-batch 1 --steps 8 --warmup 2 --grad-ckpt selective --weights bf16" \
        "--config configs/llama3-8b.yaml --seq-len 8192 --micro-batch 1 --steps 8 --warmup 2 --weights bf16" ;;
    bench-8b-compiled-peer) # issue 18: the same 8B shape with torch.compile, the configurations of bench-8b-peer that
      # were fastest eager (fp32 master with full checkpointing; bf16 weights without); a compile takes minutes
      run_peers 8b-compiled tests/bench/bench_torch_gpu.py \
        "--config configs/llama3-8b.yaml --seq-len 8192 --micro-batch 1 --steps 6 --warmup 3 --grad-ckpt full --mode compile" \
        "--config configs/llama3-8b.yaml --seq-len 8192 --micro-batch 1 --steps 6 --warmup 3 --weights bf16 --mode compile" ;;
    bench-fp8-peers) # issue 20: PyTorch bf16 against torchao float8 (tensorwise), compiled, Llama 3.2 1B and 3B, seq 4096
      s="--seq-len 4096 --micro-batch 2 --steps 10 --warmup 3 --mode compile"
      run_peers fp8 tests/bench/bench_torch_gpu.py "--peak fp8" \
        "--config configs/llama3.2-1b.yaml $s" "--config configs/llama3.2-1b.yaml $s --float8 tensorwise" \
        "--config configs/llama3.2-3b.yaml $s" "--config configs/llama3.2-3b.yaml $s --float8 tensorwise" ;;
    bench-fp8-8b-peer) # issue 20: the same on the Llama 3 8B shape with 8 of its 32 layers (fp32 master weights fit)
      s="--config configs/llama3-8b.yaml --layers 8 --seq-len 4096 --micro-batch 1 --steps 10 --warmup 3 --mode compile"
      run_peers fp8-8b tests/bench/bench_torch_gpu.py "--peak fp8" "$s" "$s --float8 tensorwise" ;;
    states) # issue 18, item 4: bf16 AdamW states on the GPU: the tests that check them, then Llama 3.2 1B's step
      # (seq 4096) with fp32 and with bf16 states: tokens/s and peak memory (4 bytes a parameter less: 4.6 GiB)
      step "GPU tests: ops, model, bf16 states" tests-states.log 60 bash tests/gpu/run_gpu_tests.sh test_cuda_ops \
        test_cuda_model test_cuda_bf16_states
      grep -E "^(PASS|FAIL)|FAIL|bf16 (states|moments)|adamw|gpu vs cpu|worst" "$out/tests-states.log" | grep -v " ok$"
      for dtype in fp32 bf16; do
        step "1B seq 4096, optimizer.state_dtype=$dtype" "states-$dtype.log" 60 python3 tests/bench/bench_gpu.py \
          --no-torch --only llama3.2-1b-s4096 --steps 12 --warmup 4 --out "/tmp/states-$dtype" \
          --set "optimizer.state_dtype=$dtype"
        tail -1 "$out/states-$dtype.log" 2>/dev/null
      done ;;
    recompute) # issue 18, item 3: activation recomputation on GPUs: its tests, Llama 3.2 1B's step (seq 4096) with
      # each mode (tokens/s, peak memory), then Llama 3 8B at seq 8192 with full recompute and bf16 AdamW states on
      # one H200 (plan: 110 GiB of its 139)
      step "GPU tests: model, recompute" tests-recompute.log 120 bash tests/gpu/run_gpu_tests.sh test_cuda_model \
        test_cuda_recompute
      grep -E "^(PASS|FAIL)|FAIL|recompute|first 10 steps" "$out/tests-recompute.log" | grep -v " ok$"
      for mode in none selective full; do
        step "1B seq 4096, train.recompute=$mode" "recompute-$mode.log" 60 python3 tests/bench/bench_gpu.py \
          --no-torch --only llama3.2-1b-s4096 --steps 12 --warmup 4 --out "/tmp/recompute-$mode" \
          --set "train.recompute=$mode"
        tail -1 "$out/recompute-$mode.log" 2>/dev/null
      done
      step "Llama 3 8B seq 8192, recompute full, bf16 states" 8b.log 180 python3 tests/bench/bench_gpu.py --no-torch \
        --only llama3-8b-s8192 --steps 6 --warmup 2 --out /tmp/8b --set train.recompute=full \
        --set optimizer.state_dtype=bf16
      tail -1 "$out/8b.log" 2>/dev/null ;;
    zero1) # issue 18, item 2: the distributed optimizer on GPUs (ranks sharing the one GPU): its tests (the sharded
      # AdamW chunks, the arena's saving, the layouts against one GPU, checkpoints between dp 2 ZeRO-1, one GPU and the
      # CPU), test_cuda_moe.sh (the expert-parallel checkpoints now saved from every ep rank), then Llama 3.2 1B at
      # seq 4096 on 2 ranks without and with it: one rank's allocation (fp32 states: 6.9 GiB less, the master's and the moments' other half) and the loss
      step "GPU tests: ops, model, zero1" tests-zero1.log 150 bash tests/gpu/run_gpu_tests.sh test_cuda_ops \
        test_cuda_model test_cuda_zero1
      grep -E "^(PASS|FAIL)|FAIL|distributed|adamw.*shard|first 10 steps|worst" "$out/tests-zero1.log" | grep -v " ok$"
      for z in false true; do
        step "1B seq 4096, dp 2 on one GPU, distributed_optimizer=$z" "zero1-$z.log" 70 python3 tests/bench/bench_gpu.py \
          --no-torch --only llama3.2-1b-s4096 --ranks 2 --steps 4 --warmup 2 --out "/tmp/zero1-$z" \
          --set "parallel.distributed_optimizer=$z"
        grep -h "megatrain {" "$out/zero1-$z.log" 2>/dev/null | cut -c1-400
        grep -h "data parallel" /tmp/zero1-$z/*.megatrain.log 2>/dev/null | head -1
      done
      step "GPU tests: moe" tests-moe.log 150 bash tests/gpu/run_gpu_tests.sh test_cuda_moe
      grep -E "^(PASS|FAIL)|FAIL|ep 2 checkpoint" "$out/tests-moe.log" | grep -v " ok$" ;;
    moe-recompute) # issue 18: full recompute of MoE models on the GPU (test_cuda_model's MoE case: the loss bits, the
      # gradients, the statistics recorded once; test_cuda_recompute.sh: mixtral, qwen3_moe, ep 2 and pp 2 with full)
      step "GPU tests: model, recompute" tests-moe-recompute.log 150 bash tests/gpu/run_gpu_tests.sh test_cuda_model \
        test_cuda_recompute
      grep -E "^(PASS|FAIL)|FAIL|recompute|first step|first 10 steps" "$out/tests-moe-recompute.log" | grep -v " ok$" ;;
    mixtral-ways) # issue 17's choice of MEGATRAIN_MOE_GEMM on the other MoE shape (8 experts of 14336, top 2)
      for way in cublas kernel cublas_grouped; do
        step "Mixtral 8x7B step, MEGATRAIN_MOE_GEMM=$way" "mixtral-$way.log" 90 python3 tests/bench/bench_gpu.py \
          --no-torch --only mixtral --steps 8 --warmup 3 --out "/tmp/mixtral-$way" --env "MEGATRAIN_MOE_GEMM=$way"
        tail -1 "$out/mixtral-$way.log" 2>/dev/null
      done ;;
    *) echo "device_check.sh: unknown part '$part'" >&2 ;;
  esac
done
if (( ${#summary[@]} )); then
  printf '\nsteps, %s s of BACKLOG_S %s:\n' "$SECONDS" "${BACKLOG_S:-420}"
  printf '  %s\n' "${summary[@]}" | tee "$out/backlog.txt"
fi
