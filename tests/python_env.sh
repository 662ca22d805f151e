#!/usr/bin/env bash
# python_env.sh: the Python environment of the tests that need third-party
# packages (build/test-venv, one venv for all of them), made on first use with
# pip from PyPI; prints the path of its python on stdout.
#
# Usage: bash tests/python_env.sh GROUP...      GROUP: tensorboard | torch | tokenizers | peft | fp8
#   tensorboard  the `tensorboard` package (test_tensorboard.sh)
#   fp8          ml_dtypes (Apache-2.0) and numpy: the E4M3 / E5M2 casts of
#                tests/fixtures/fp8/make_fixtures.py
#   tokenizers   Hugging Face `tokenizers` (tests/fixtures/tokenizers/make_fixtures.py)
#   torch        torch (used on the CPU), transformers and safetensors
#                (test_convert_transformers.sh, tests/fixtures/hf/make_fixtures.py)
#   peft         Hugging Face PEFT on top of the torch group, which it needs
#                first (test_peft_transformers.sh, tests/fixtures/peft/make_fixtures.py):
#                peft and its two packages the torch group lacks (accelerate,
#                psutil), --no-deps so that pip does not add the CUDA libraries
#                the torch group leaves out (see below)
# A group already importable in the venv is not installed again. Exits 1,
# with the end of pip's log on stderr, when a group cannot be installed.
# MT_TEST_VENV=DIR uses another venv (e.g. to time an install from scratch).
#
# torch from PyPI is the CUDA build: `pip install torch` also pulls about
# 4 GB of nvidia-* libraries and triton (5.3 GB installed, about 60 s). Its
# libraries are linked against the CUDA ones, so `import torch` needs those
# present even on a machine without a GPU, but not triton (1 GB, the GPU
# compiler that only torch.compile imports) nor the CUDA solver, NVTX and
# Python bindings. So torch is installed with --no-deps, with exactly the
# libraries it loads (pinned to what torch 2.15.0 declares) and its
# pure-Python dependencies: 4.0 GB, about 40 s on a fresh venv. These are the
# versions the fixtures in tests/fixtures/hf were made with (docs/parity.md).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${MT_TEST_VENV:-$REPO/build/test-venv}

TORCH_NO_DEPS=(torch==2.15.0 nvidia-cuda-runtime==13.2.86 nvidia-cublas==13.4.1.3 nvidia-cuda-cupti==13.2.86
               nvidia-cuda-nvrtc==13.2.86 nvidia-cufft==12.2.0.57 nvidia-cufile==1.17.1.22
               nvidia-cusparse==12.7.10.12 nvidia-nvjitlink==13.5.37 nvidia-cudnn-cu13==9.26.0.51
               nvidia-cusparselt-cu13==0.8.1 nvidia-nccl-cu13==2.30.7 nvidia-nvshmem-cu13==3.7.2)
TORCH_WITH_DEPS=(filelock typing-extensions sympy networkx jinja2 fsspec transformers==5.23.0 safetensors==0.8.0)
PEFT_NO_DEPS=(peft==0.21.2 accelerate==1.15.0 psutil==7.2.2)
FP8=(ml_dtypes==0.6.0 numpy==2.4.6)
# Not a group: the float8 training peer of issue 20's benchmark (bench_torch_gpu.py --float8) on the GPU machine,
# carried there as a wheel by tests/gpu/carry_wheels.sh. torchao 0.17 wants torch >= 2.11 (the machine's) and
# its float8 training is pure Python (its C++ extensions, built for one torch, are skipped where they do not fit).
TORCHAO_NO_DEPS=(torchao==0.17.0)

# check GROUP: the group's packages import (torch also computes a gradient on the CPU).
check() {
  case $1 in
    tensorboard) "$VENV/bin/python" -c "import tensorboard" ;;
    tokenizers) "$VENV/bin/python" -c "import tokenizers" ;;
    fp8) "$VENV/bin/python" -c "
import numpy as np, ml_dtypes
assert np.float32([1.0, -3.0]).astype(ml_dtypes.float8_e4m3fn).view(np.uint8).tolist() == [0x38, 0xc4]" ;;
    peft) "$VENV/bin/python" -c "
import torch, peft, transformers as tf
m = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                       num_attention_heads=2))
p = peft.get_peft_model(m, peft.LoraConfig(r=2, target_modules=['q_proj']))
p(torch.tensor([[1, 2]])).logits.sum().backward()" ;;
    torch) "$VENV/bin/python" -c "
import torch, transformers, safetensors
x = torch.arange(4.0, requires_grad=True)
(x * x).sum().backward()
assert x.grad.tolist() == [0.0, 2.0, 4.0, 6.0]" ;;
    *) echo "python_env.sh: unknown group '$1' (expected tensorboard, torch, tokenizers, peft or fp8)" >&2; exit 2 ;;
  esac
}

install() {
  case $1 in
    tensorboard) "$VENV/bin/pip" install tensorboard ;;
    tokenizers) "$VENV/bin/pip" install tokenizers==0.23.3 ;;
    fp8) "$VENV/bin/pip" install "${FP8[@]}" ;;
    torch) "$VENV/bin/pip" install --no-deps "${TORCH_NO_DEPS[@]}" && "$VENV/bin/pip" install "${TORCH_WITH_DEPS[@]}" ;;
    peft) { check torch || install torch; } && "$VENV/bin/pip" install --no-deps "${PEFT_NO_DEPS[@]}" ;;
  esac
}

[[ $# -ge 1 ]] || { echo "usage: bash tests/python_env.sh tensorboard|torch|tokenizers|peft|fp8 ..." >&2; exit 2; }
mkdir -p "$(dirname "$VENV")"
exec 9> "$VENV.lock"   # one installer at a time (tests may run side by side)
flock 9
log="$VENV.log"
for group in "$@"; do
  [[ -x "$VENV/bin/python" ]] && check "$group" > /dev/null 2>&1 && continue
  start=$SECONDS
  echo "python_env.sh: installing $group into $VENV (pip, from PyPI; log in $log)" >&2
  if ! { [[ -x "$VENV/bin/pip" ]] || python3 -m venv "$VENV"; } > "$log" 2>&1 \
      || ! install "$group" >> "$log" 2>&1 || ! check "$group" >> "$log" 2>&1; then
    tail -n 5 "$log" >&2
    echo "python_env.sh: cannot install $group into $VENV" >&2
    exit 1
  fi
  echo "python_env.sh: $group installed in $((SECONDS - start)) s" >&2
done
echo "$VENV/bin/python"
