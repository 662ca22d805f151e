#!/usr/bin/env bash
# run_bench.sh: the CPU benchmark. Trains each tiny recipe for a fixed number
# of steps with megatrain and with the same model in PyTorch
# (bench_torch_cpu.py), and prints a markdown table of tokens/s (median of the
# steps after the warm-up) with the machine and the exact command. Not part of
# `make test`; `make bench` runs it.
#
# Usage: tests/bench/run_bench.sh [--steps N] [--warmup N] [--threads N] [--record] [RECIPE.yaml ...]
#   --steps N    steps per run (default 60)
#   --warmup N   first steps left out of tokens/s (default 3)
#   --threads N  threads for both (default: nproc)
#   --record     also append the result to tests/bench/RESULTS.md
#   RECIPE ...   default: recipes/tiny/*.yaml
set -euo pipefail
cd "$(dirname "$0")/../.."
command_line="tests/bench/run_bench.sh $*"

steps=60 warmup=3 threads=$(nproc) record=0 recipes=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --record) record=1; shift ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run_bench.sh: unknown option $1" >&2; exit 2 ;;
    *) recipes+=("$1"); shift ;;
  esac
done
[[ ${#recipes[@]} -gt 0 ]] || recipes=(recipes/tiny/*.yaml)
[[ $steps -gt $warmup ]] || { echo "run_bench.sh: --steps must exceed --warmup" >&2; exit 2; }
python3 -c 'import torch, yaml' 2>/dev/null \
  || { echo "run_bench.sh: needs PyTorch and PyYAML (pip install torch pyyaml)" >&2; exit 2; }

MEGATRAIN=${MEGATRAIN:-build/megatrain}
[[ $MEGATRAIN != build/megatrain ]] || make --no-print-directory -j"$threads" build/megatrain >&2

# Other work on the machine skews both columns; say so in the report.
load_before=$(cut -d' ' -f1 /proc/loadavg)
if python3 -c 'import sys; sys.exit(float(sys.argv[1]) <= 0.5 * int(sys.argv[2]))' "$load_before" "$(nproc)"; then
  echo "run_bench.sh: warning: load average $load_before on $(nproc) CPUs before the run; numbers will be noisy" >&2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Data: the demo set when its script exists, else the GPL text alone.
if [[ -x scripts/demo_data.sh || -f scripts/demo_data.sh ]]; then
  data=data/demo/english
  bash scripts/demo_data.sh "$data" >&2
else
  data=$work/bench
  "$MEGATRAIN" data build --input /usr/share/common-licenses/GPL-3 --output "$data" --tokenizer byte >&2
fi

# median tokens_per_s of the steps after the warm-up in a metrics.jsonl
median_rate() {
  python3 - "$1" "$warmup" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
rates = [r["tokens_per_s"] for r in rows if r.get("step", 0) > int(sys.argv[2]) and r.get("tokens_per_s")]
print(f"{statistics.median(rates):.1f}" if rates else "")
EOF
}

rows=() failures=0
for recipe in "${recipes[@]}"; do
  name=$(basename "$recipe" .yaml)
  run_dir=$work/run-$name
  sets=(--set "run.dir=$run_dir" --set "train.steps=$steps" --set "logging.interval=1"
        --set "logging.tensorboard=false" --set "train.eval_interval=0"
        --set "checkpoint.interval=$((steps * 10))" --set "optimizer.schedule.warmup_steps=$warmup"
        --set "data.train=[{path: $data, weight: 1.0}]")
  mt_rate=""
  if OMP_NUM_THREADS=$threads "$MEGATRAIN" run "$recipe" "${sets[@]}" > "$work/$name.megatrain.log" 2>&1 \
     && [[ -f $run_dir/metrics.jsonl ]]; then
    mt_rate=$(median_rate "$run_dir/metrics.jsonl" || true)
  fi
  if [[ -z $mt_rate ]]; then
    failures=$((failures + 1))
    echo "run_bench.sh: megatrain failed on $recipe; its log:" >&2
    tail -n 20 "$work/$name.megatrain.log" | sed 's/^/  | /' >&2
  fi
  torch_json=$(python3 tests/bench/bench_torch_cpu.py "$recipe" --steps "$steps" --warmup "$warmup" \
                 --threads "$threads" "${sets[@]}" 2> "$work/$name.torch.log") \
    || { failures=$((failures + 1)); echo "run_bench.sh: PyTorch failed on $recipe:" >&2;
         tail -n 20 "$work/$name.torch.log" | sed 's/^/  | /' >&2; torch_json='{}'; }
  torch_rate=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("tokens_per_s", ""))' "$torch_json")
  ratio=$(python3 -c 'import sys; a, b = sys.argv[1], sys.argv[2]; print(f"{float(a)/float(b):.2f}" if a and b else "n/a")' \
            "$mt_rate" "$torch_rate")
  rows+=("| $recipe | ${mt_rate:-failed} | ${torch_rate:-failed} | $ratio |")
done

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)
torch_version=$(python3 -c 'import warnings; warnings.simplefilter("ignore"); import torch; print(torch.__version__)' 2>/dev/null)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo "uncommitted")
report=$(
  echo "### $(date -u +%Y-%m-%d) — $commit"
  echo
  echo "Machine: $cpu, nproc $(nproc), threads $threads, load average $load_before before / $(cut -d' ' -f1 /proc/loadavg) after;"
  echo "torch $torch_version; $steps steps, median tokens/s of the steps after the first $warmup."
  echo "Command: \`$command_line\`"
  echo
  echo "| recipe | megatrain tok/s | torch tok/s | ratio (megatrain / torch) |"
  echo "|---|---:|---:|---:|"
  printf '%s\n' "${rows[@]}"
)
echo "$report"
if [[ $record -eq 1 ]]; then
  { echo; echo "$report"; } >> tests/bench/RESULTS.md
  echo "(appended to tests/bench/RESULTS.md)" >&2
fi
[[ $failures -eq 0 ]]
