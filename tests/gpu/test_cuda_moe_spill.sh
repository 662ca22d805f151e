#!/usr/bin/env bash
# test_cuda_moe_spill.sh: a MoE layer's expert side past the arena's room
# under expert parallel (src/model/cuda/cuda_model_moe.c). The arena holds a
# balanced routing's rows for each rank's experts (micro-batch tokens x k); a
# layer routed more to one rank takes its expert side (the received rows,
# gate|up, the activation, their order) and the scratch from stream-ordered
# allocations, freed once used. MEGATRAIN_MOE_EP_ROOM=0.25 (a test hook: a
# quarter of that room) makes every layer of every micro-batch spill, so the
# spilled path must give the run with the room, bit for bit: the tiny Mixtral
# at ep 2 (ranks sharing the GPU) for S steps (12; 6 with
# MT_GPU_TEST_QUICK=1, as the CPU emulator runs it in CI) with an evaluation
# every 3 (a forward with no backward: its spill freed at the layer's next
# forward), plain and with full recompute (the first forward's spill freed
# at once, the rerun's after its backward), and at ep 2 x pp 2 (four ranks:
# two activation sets in flight, each its own spill). On the emulator every
# run also ends with no device memory left allocated (EMU_CHECK_FREED=1: a
# spill never freed, or overwritten, fails the run). The step's moe_spill_rate
# (metrics.jsonl, the step line's 'spilled') is 1 on every step of the
# spilled runs, below it on some of the others. Skips without mpirun.
set -euo pipefail
source "$(dirname "$0")/../integration/lib.sh"
MEGATRAIN=${MEGATRAIN:-build/cuda/megatrain}
command -v mpirun > /dev/null || { echo "skip: no mpirun on this machine"; exit 77; }
S=12
[[ ${MT_GPU_TEST_QUICK:-0} == 1 ]] && S=6
demo_data "$WORK/english"
common=(--set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.steps=$S
        --set train.eval_interval=3 --set optimizer.schedule.warmup_steps=2 --set run.device=cuda
        --set precision=bf16 --set parallel.ep=2 --set train.micro_batch_size=4)
# run NAME NP ROOM [--set ...]: the tiny Mixtral on NP ranks sharing the GPU, the arena's room times ROOM
run() {
  local name=$1 np=$2 room=$3; shift 3
  EMU_CHECK_FREED=1 MEGATRAIN_MOE_EP_ROOM=$room MEGATRAIN_DEVICE_COMM=host mpirun --allow-run-as-root --oversubscribe -np "$np" \
    "$MEGATRAIN" run "$REPO/recipes/tiny/mixtral.yaml" --set run.dir="$WORK/$name" "${common[@]}" "$@" \
    > "$WORK/$name.txt" 2>&1 || { tail -20 "$WORK/$name.txt"; fail "$name: the run failed"; }
}
# same A B: the training and evaluation losses of the two runs, bit for bit
same() {
  local a b
  a=$(grep -oE '"(loss|eval_loss)": *[^,}]*' "$WORK/$1/metrics.jsonl")
  b=$(grep -oE '"(loss|eval_loss)": *[^,}]*' "$WORK/$2/metrics.jsonl")
  [[ -n $a && $(grep -c '"loss"' <<< "$a") == "$S" && $(grep -c eval_loss <<< "$a") -ge 2 ]] ||
    fail "$1: expected $S losses and evaluations in its metrics"
  [[ $a == "$b" ]] || { diff <(echo "$a") <(echo "$b") | head; fail "$2 (spilled) differs from $1"; }
  echo "$2: the $S losses and evaluations of $1, bit for bit"
}
for layout in plain full pp2; do
  np=2 extra=()
  case $layout in
    full) extra=(--set train.recompute=full) ;;
    pp2) np=4 extra=(--set parallel.pp=2) ;;
  esac
  run "$layout-room" $np 1 "${extra[@]}"
  run "$layout-spill" $np 0.25 "${extra[@]}"
  same "$layout-room" "$layout-spill"
  # the step's spill rate: every layer forward of the spilled run (a rerun not counted again), some or none of the
  # other's, in metrics.jsonl and the step line
  spilled=$(grep -oE '"moe_spill_rate": *[^,}]*' "$WORK/$layout-spill/metrics.jsonl" | grep -cE ': *1(\.0*)?$' || true)
  [[ $spilled == "$S" ]] || fail "$layout-spill: moe_spill_rate 1 in $spilled of $S steps: \
$(grep -oE '"moe_spill_rate": *[^,}]*' "$WORK/$layout-spill/metrics.jsonl" | head -3)"
  grep -q "| spilled 100.0%" "$WORK/$layout-spill.txt" || fail "$layout-spill: no 'spilled 100.0%' in the step lines"
  room=$(grep -oE '"moe_spill_rate": *[^,}]*' "$WORK/$layout-room/metrics.jsonl" | grep -cvE ': *1(\.0*)?$' || true)
  [[ $room -ge 1 ]] || fail "$layout-room: every step spilled every layer with the arena's room"
done
echo "passed: the expert side spilled on every layer gives the same run (ep 2; full recompute; ep 2 x pp 2)"
