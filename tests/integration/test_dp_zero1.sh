#!/usr/bin/env bash
# test_dp_zero1.sh: the distributed optimizer (parallel.distributed_optimizer,
# ZeRO-1) in a dp=2 MPI job on the CPU. Its losses, grad norms and eval
# losses equal the single-rank run's (relative error < 1e-5, step by step);
# its checkpoints hold the full AdamW moments, so a dp=2 ZeRO-1 checkpoint
# resumes on one rank, and a one-rank checkpoint resumes under dp=2 ZeRO-1,
# both continuing as the uninterrupted run (relative error < 1e-5).
# Skips without mpirun.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
command -v mpirun > /dev/null || { echo "mpirun not found"; exit 77; }
export OMP_NUM_THREADS=1
demo_data "$WORK/english"
MPIRUN=(timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2)
COMMON=(--set train.steps=10 --set logging.interval=1 --set train.micro_batch_size=2
        --set "train.batch_schedule=[{step: 0, global_batch_size: 8}]" --set train.eval_interval=5
        --set train.eval_batches=2 --set optimizer.schedule.warmup_steps=3 --set checkpoint.interval=5
        --set checkpoint.keep_last=5 --set "data.train=[{path: $WORK/english, weight: 1.0}]")
ZERO1=(--set parallel.distributed_optimizer=true)

run1() { "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$1" "${COMMON[@]}" "${@:2}"; }
run2() { "${MPIRUN[@]}" "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$1" "${COMMON[@]}" "${@:2}"; }

run1 "$WORK/one" > "$WORK/one.log"
run2 "$WORK/zero1" "${ZERO1[@]}" > "$WORK/zero1.log" 2>&1 || { cat "$WORK/zero1.log"; fail "the dp=2 ZeRO-1 run failed"; }
for field in loss grad_norm eval_loss; do
  compare $field "$WORK/one/metrics.jsonl" "$WORK/zero1/metrics.jsonl" || fail "dp=2 ZeRO-1: $field differs from one rank"
done
echo "dp=2 ZeRO-1 = one rank (losses, grad norms, eval losses)"

# ZeRO-1 checkpoint (step 5) -> one rank, in a new run directory (metrics from step 6).
"$MEGATRAIN" resume "$WORK/zero1/checkpoints/iter_0000005" --set run.dir="$WORK/z-to-one" > "$WORK/z-to-one.log" 2>&1 \
  || { cat "$WORK/z-to-one.log"; fail "resuming the ZeRO-1 checkpoint on one rank failed"; }
compare loss "$WORK/zero1/metrics.jsonl" "$WORK/z-to-one/metrics.jsonl" 6 || fail "ZeRO-1 -> one rank: losses after step 5 differ"
# One-rank checkpoint (step 5) -> dp=2 ZeRO-1.
"${MPIRUN[@]}" "$MEGATRAIN" resume "$WORK/one/checkpoints/iter_0000005" --set run.dir="$WORK/one-to-z" "${ZERO1[@]}" \
  > "$WORK/one-to-z.log" 2>&1 || { head -5 "$WORK/one-to-z.log"; fail "resuming a one-rank checkpoint under dp=2 ZeRO-1 failed"; }
compare loss "$WORK/one/metrics.jsonl" "$WORK/one-to-z/metrics.jsonl" 6 || fail "one rank -> ZeRO-1: losses after step 5 differ"
echo "ok: checkpoints move between one rank and dp=2 ZeRO-1"
