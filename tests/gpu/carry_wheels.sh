#!/usr/bin/env bash
# carry_wheels.sh: the Python packages that the GPU machine (torch and
# transformers installed, no internet) lacks for the PyTorch peers of the
# fine-tuning benchmark (tests/bench/bench_torch_finetune_gpu.py) and the
# float8 one (bench_torch_gpu.py --float8): the wheels of peft, accelerate,
# psutil and torchao, pinned in tests/python_env.sh (PEFT_NO_DEPS,
# TORCHAO_NO_DEPS), downloaded here (pip download --no-deps, about 4.5 MB)
# into .devwheels/ (git-ignored). Carry .devwheels there; the benches install
# them with pip --no-deps --no-index into a temporary directory when the
# import fails (bench_torch_gpu.py's import_or_install).
set -euo pipefail
cd "$(dirname "$0")/../.."
eval "$(grep -E '^(PEFT|TORCHAO)_NO_DEPS=' tests/python_env.sh)"   # one place for the pins
rm -rf .devwheels
python3 -m pip download --quiet --no-deps --dest .devwheels "${PEFT_NO_DEPS[@]}" "${TORCHAO_NO_DEPS[@]}"
ls .devwheels
du -sh .devwheels
