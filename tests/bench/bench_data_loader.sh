#!/usr/bin/env bash
# bench_data_loader.sh: the training data loader on a corpus larger than a
# test's: the time to open it, tokens/s read in training order with the corpus
# in the page cache (warm) and evicted from it (cold), the bytes a cold read
# takes from disk (/proc/self/io read_bytes), and, with --ranks N, each rank's
# peak anonymous memory (RssAnon) in a tiny-llama run at dp N with a large
# sample index (what each rank holds of the data, beside its model). Not part
# of `make test`. The corpus (uint16 tokens of random values, documents of
# lognormal lengths, median about 90 tokens) is made once under build/bench/.
# A cold read needs the page cache dropped for the corpus: posix_fadvise
# DONTNEED, which works for files no other process maps.
#
# Usage: tests/bench/bench_data_loader.sh [--docs N] [--ranks N] [--megatrain BIN] [--record]
#   --docs N        documents in the corpus (default 4000000: about 0.5 B tokens, 1 GB)
#   --ranks N       also the dp N run's memory (default 2; 0 skips it)
#   --megatrain BIN the binary of that run (default build/megatrain)
#   --record        append the table to tests/bench/RESULTS.md
set -euo pipefail
cd "$(dirname "$0")/../.."
docs=4000000 ranks=2 megatrain=build/megatrain record=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --docs) docs=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --megatrain) megatrain=$2; shift 2 ;;
    --record) record=1; shift ;;
    *) echo "bench_data_loader.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
out=build/bench/data_loader
mkdir -p "$out"
corpus=$out/corpus_$docs
if [[ ! -f $corpus.idx ]]; then
  echo "making $corpus.{bin,idx} ($docs documents)..."
  python3 - "$corpus" "$docs" <<'PY'
import array, os, random, struct, sys
prefix, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(0)
lengths = array.array("i", (min(4000, max(1, int(rng.lognormvariate(4.5, 0.8)))) for _ in range(n)))
pointers, at = array.array("q"), 0
for length in lengths:
    pointers.append(at)
    at += 2 * length
with open(prefix + ".bin", "wb") as f:
    left = at
    while left > 0:
        chunk = min(left, 1 << 26)
        f.write(os.urandom(chunk))
        left -= chunk
with open(prefix + ".idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, n, n + 1))
    f.write(lengths.tobytes()); f.write(pointers.tobytes()); f.write(array.array("q", range(n + 1)).tobytes())
for path in (prefix + ".bin", prefix + ".idx"):  # on disk, so that evict can drop the pages (dirty ones stay)
    fd = os.open(path, os.O_RDONLY); os.fsync(fd); os.close(fd)
PY
fi
cc -O2 -std=gnu11 -fopenmp -Isrc -o "$out/bench_data_loader" tests/bench/bench_data_loader.c src/data/data_loader.c \
  src/data/blend.c src/data/gpt_sampling.c src/data/indexed_dataset.c src/data/loss_mask.c src/data/packed_loader.c \
  src/data/sample_cache.c src/data/sft_packing.c src/core/*.c -lm -lzstd
evict() { python3 -c "import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)" "$corpus.bin" "$corpus.idx"; }
field() { tr ' ' '\n' <<< "$1" | sed -n "s/^$2=//p"; }
rows=()
for spec in "8192 100" "8192 2000" "2048 8000"; do
  read -r seq n <<< "$spec"
  evict
  cold=$("$out/bench_data_loader" "$seq" "$n" "$corpus")
  warm=$("$out/bench_data_loader" "$seq" "$n" "$corpus")
  rows+=("| $n x $seq | $(field "$warm" open_s) | $(awk -v t="$(field "$warm" tokens_per_s)" 'BEGIN { printf "%.1f", t / 1e6 }') | $(awk -v t="$(field "$cold" tokens_per_s)" 'BEGIN { printf "%.2f", t / 1e6 }') | $(awk -v b="$(field "$cold" read_bytes)" 'BEGIN { printf "%.0f", b / 1e6 }') | $(awk -v k="$(field "$warm" rss_anon_kb)" 'BEGIN { printf "%.0f", k / 1024 }') |")
done
memory=""
if [[ $ranks -gt 0 ]]; then
  run=$out/run_dp$ranks
  rm -rf "$run"
  mpirun --allow-run-as-root --oversubscribe -np "$ranks" "$megatrain" run recipes/tiny/llama.yaml --set run.dir="$run" \
    --set "data.train=[{path: $corpus, weight: 1.0}]" --set model.vocab_size=65536 \
    --set model.max_position_embeddings=1024 --set train.seq_len=1024 --set train.micro_batch_size=1 \
    --set "train.batch_schedule=[{step: 0, global_batch_size: $ranks}]" --set train.steps=$((4000000 / ranks)) \
    --set train.exit_interval=3 --set train.eval_interval=0 --set checkpoint.interval=0 \
    --set "data.split=[100, 0, 0]" --set optimizer.schedule.warmup_steps=10 > "$run.log" 2>&1 &
  job=$!
  declare -A peak
  while kill -0 "$job" 2> /dev/null; do
    for p in $(pgrep -f "run.dir=$run" | grep -vx "$job"); do
      a=$(awk '/RssAnon/ { print $2 }' "/proc/$p/status" 2> /dev/null || true)
      [[ -n "$a" && "$a" -gt "${peak[$p]:-0}" ]] && peak[$p]=$a
    done
    sleep 0.2
  done
  wait "$job" || { echo "the dp $ranks run failed: $(tail -n 3 "$run.log")" >&2; exit 1; }
  memory="each rank's peak RssAnon in the dp $ranks run (4M samples of 1024 tokens, tiny llama with a 65536 vocabulary):"
  for p in "${!peak[@]}"; do memory+=" $((peak[$p] / 1024)) MB"; done
fi
{
  echo
  echo "## Data loader: $docs documents, $(du -m "$corpus.bin" | cut -f1) MB of uint16 tokens ($(date -u +%Y-%m-%d), $(git rev-parse --short HEAD))"
  echo
  echo "machine: $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg); command: tests/bench/bench_data_loader.sh --docs $docs --ranks $ranks"
  echo
  echo "| samples | open (s, warm) | M tokens/s warm | M tokens/s cold | MB read cold | RssAnon MB |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
  printf '%s\n' "${rows[@]}"
  if [[ -n $memory ]]; then echo; echo "$memory"; fi
} | tee "$out/table.md"
if [[ $record -eq 1 ]]; then cat "$out/table.md" >> tests/bench/RESULTS.md; fi
