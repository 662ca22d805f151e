#!/usr/bin/env bash
# test_plan.sh: `megatrain plan` through the binary: Llama 3 8B at tp 2 pp 2
# on 8 ranks prints the grid (dp 2), both stages with their layers and
# shares, FLOPs per step, and exits 0; a device memory below the largest
# stage's estimate adds a warning on stderr naming what most of it is (still
# exit 0); a layout that does not divide the heads is refused with exit 2
# naming parallel.tp; --help answers. train.recompute lowers the
# activations (none > selective > full), and its line carries no GPU note
# (cuda runs every mode, MoE models' full recompute included).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cat > "$WORK/r.yaml" <<EOF2
run: {name: p, device: cuda}
model: $REPO/configs/llama3-8b.yaml
parallel: {tp: 2, pp: 2}
train: {steps: 10, seq_len: 4096, micro_batch_size: 1, global_batch_size: 64}
data: {train: [{path: x, weight: 1.0}]}
EOF2
"$MEGATRAIN" plan "$WORK/r.yaml" --world 8 > "$WORK/out" 2> "$WORK/err"
cat "$WORK/out"
grep -q "^grid: world 8 = tp 2 x cp 1 x dp 2 x pp 2" "$WORK/out" || fail "no grid line"
grep -q "^0 .*0-3 .*embedding, layers 0-15$" "$WORK/out" || fail "stage 0 should hold ranks 0-3, the embedding and layers 0-15"
grep -q "^1 .*4-7 .*layers 16-31, final norm, lm_head$" "$WORK/out" || fail "stage 1 should hold ranks 4-7 and layers 16-31 with the head"
grep -q "PFLOP per step" "$WORK/out" || fail "no FLOPs per step"
[[ ! -s "$WORK/err" ]] || fail "unexpected warning: $(cat "$WORK/err")"

"$MEGATRAIN" plan "$WORK/r.yaml" --world 8 --device-memory 16 > /dev/null 2> "$WORK/err"
grep -q "warning: stage 0 needs about .* GiB per rank, more than the device's memory (16.0 GiB); most of it is the MLP weights (model.intermediate_size = 14336)" "$WORK/err" \
  || fail "no warning for a 16 GiB device: $(cat "$WORK/err")"

# train.recompute: stage 0's activations (GiB) fall from none to selective to full; on cuda plan says run refuses full
# of a MoE model.
acts() { "$MEGATRAIN" plan "$WORK/r.yaml" --world 8 --set train.recompute="$1" "${@:2}" | awk '$1 == "0" { print $8 }'; }
none=$(acts none); selective=$(acts selective); full=$(acts full)
echo "stage 0 activations (GiB): none $none, selective $selective, full $full"
awk -v a="$none" -v b="$selective" -v c="$full" 'BEGIN { exit !(a > b && b > c && c > 0) }' \
  || fail "activations should fall from none ($none) to selective ($selective) to full ($full)"
# (to a file first: grep -q on a pipe may exit before the writer ends, and pipefail would see its SIGPIPE)
"$MEGATRAIN" plan "$WORK/r.yaml" --world 8 --set train.recompute=full > "$WORK/plan_full.txt" || fail "plan failed"
awk '/^recompute: full/ && !/GPUs/ { found = 1 } END { exit !found }' "$WORK/plan_full.txt" \
  || fail "plan on cuda should print the recompute line of a dense model without a GPU note"
"$MEGATRAIN" plan "$REPO/recipes/tiny/mixtral.yaml" --set run.device=cuda --set train.recompute=full \
  > "$WORK/plan_moe.txt" || fail "plan of the MoE recipe failed"
awk '/^recompute: full/ && !/GPUs/ { found = 1 } END { exit !found }' "$WORK/plan_moe.txt" \
  || fail "plan on cuda should print the recompute line of a MoE model without a GPU note (cuda runs it)"
"$MEGATRAIN" plan "$REPO/recipes/tiny/mixtral.yaml" --set train.recompute=full > "$WORK/plan_cpu.txt" \
  || fail "plan on the CPU failed"
awk '/^recompute: full/ && !/GPUs/ { found = 1 } END { exit !found }' "$WORK/plan_cpu.txt" \
  || fail "plan on the CPU should print the recompute line without the GPU note"

set +e
"$MEGATRAIN" plan "$WORK/r.yaml" --set parallel.tp=3 > /dev/null 2> "$WORK/err"
rc=$?
set -e
[[ $rc -eq 2 ]] || fail "tp 3 (does not divide 32 heads) exited $rc, expected 2"
grep -q "parallel.tp" "$WORK/err" || fail "the error does not name parallel.tp: $(cat "$WORK/err")"
"$MEGATRAIN" plan --help > "$WORK/help.txt" || fail "plan --help failed"
grep -q "^usage: megatrain plan" "$WORK/help.txt" || fail "plan --help"
echo "ok"
