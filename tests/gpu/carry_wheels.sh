#!/usr/bin/env bash
# carry_wheels.sh: the Python packages that the GPU machine (torch and
# transformers installed, no internet) lacks for the PyTorch peers of the
# fine-tuning benchmark (tests/bench/bench_torch_finetune_gpu.py): the wheels
# of peft, accelerate and psutil, pinned as tests/python_env.sh pins its peft
# group, downloaded here (pip download --no-deps, about 1 MB) into .devwheels/
# (git-ignored). Carry .devwheels there; the bench installs them with
# pip --no-deps --no-index into a temporary directory when `import peft` fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
eval "$(grep '^PEFT_NO_DEPS=' tests/python_env.sh)"   # one place for the pins
rm -rf .devwheels
python3 -m pip download --quiet --no-deps --dest .devwheels "${PEFT_NO_DEPS[@]}"
ls .devwheels
du -sh .devwheels
