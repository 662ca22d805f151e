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
m=runs/demo-llama/metrics.jsonl
first=$(head -n 1 "$m" | grep -o '"loss":[^,]*' | cut -d: -f2)
last=$(tail -n 1 "$m" | grep -o '"loss":[^,]*' | cut -d: -f2)
echo
echo "loss fell from $first (first logged step) to $last (step 300); ln 256 = 5.545. Metrics: $m"
