#!/usr/bin/env bash
# demo.sh: the README's first command (`make demo`): builds megatrain, prepares a
# small English byte-level data set, trains recipes/tiny/llama.yaml on the CPU
# and shows the loss falling.
set -euo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory -j2 build/megatrain
bash scripts/demo_data.sh data/demo/english
rm -rf runs/demo-llama
build/megatrain run recipes/tiny/llama.yaml --set run.dir=runs/demo-llama
python3 - runs/demo-llama/metrics.jsonl <<'PY' 2>/dev/null || true
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
first, last = rows[0], rows[-1]
print(f"\nloss: {first['loss']:.3f} at step {first['step']} -> {last['loss']:.3f} at step {last['step']}"
      f" (ln 256 = 5.545); metrics in {sys.argv[1]}")
PY
