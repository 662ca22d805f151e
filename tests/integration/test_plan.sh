#!/usr/bin/env bash
# test_plan.sh: `megatrain plan` through the binary: Llama 3 8B at tp 2 pp 2
# on 8 ranks prints the grid (dp 2), both stages with their layers and
# shares, FLOPs per step, and exits 0; a device memory below the largest
# stage's estimate adds a warning on stderr naming what most of it is (still
# exit 0); a layout that does not divide the heads is refused with exit 2
# naming parallel.tp; --help answers. The last line says whether the largest
# stage fits (or that nothing was checked); where it does not, the advice
# offers the settings that would lower it on the same ranks, each with its
# estimate (ZeRO-1 only at dp > 1), then the ranks to raise; what `run`
# refuses on GPUs is listed, every setting at once. train.recompute lowers the
# activations (none > selective > full), and its line carries no GPU note
# (cuda runs every mode, MoE models' full recompute included). The table is
# in MiB where every stage is under a GiB. Where the recipe does not fit (or
# with --fit) a fit: line gives the fewest ranks that fit and the settings
# that give them (plan with them fits; Llama 3 70B at seq 4096 on 80 GB: 32
# ranks at tp 8 x pp 4), or says that none up to 4096 ranks does.
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
# the checkpoint's size: Llama 3 8B's 8,030,261,248 parameters x (4 bytes of weight + 8 of AdamW m and v) = 89.75 GiB,
# one saved in 10 steps; with bf16 states 8 bytes (59.83 GiB), and over 200 steps 2 kept and one being written
grep -q "^checkpoint: 89.75 GiB each before zstd (fp32 weights, AdamW m and v in fp32); at most 89.75 GiB on disk \
(1 kept)$" "$WORK/out" || fail "the checkpoint's size: $(grep checkpoint "$WORK/out")"
"$MEGATRAIN" plan "$WORK/r.yaml" --world 8 --set train.steps=200 --set optimizer.state_dtype=bf16 > "$WORK/ck.out"
grep -q "^checkpoint: 59.83 GiB each before zstd (fp32 weights, AdamW m and v in bf16); at most 179.49 GiB on disk (2 \
kept and one being written)$" "$WORK/ck.out" || fail "bf16 states, 200 steps: $(grep checkpoint "$WORK/ck.out")"
# a stage (or a chunk) of no layers, and one of one, as such (it printed "layers 0--1")
"$MEGATRAIN" plan "$REPO/recipes/tiny/llama.yaml" --world 2 --set parallel.pp=2 --set parallel.vpp=2 \
  --set model.num_layers=4 --set 'parallel.pp_layers=[0, 2, 1, 1]' --set train.micro_batch_size=4 \
  --set train.global_batch_size=16 --set train.batch_schedule=null > "$WORK/empty.out"
grep -q "^0 .*embedding, layers none, 2$" "$WORK/empty.out" && grep -q "^1 .*layers 0-1, 3, final norm, lm_head$" \
  "$WORK/empty.out" || fail "empty and one-layer chunks: $(cat "$WORK/empty.out")"
"$MEGATRAIN" plan "$REPO/recipes/tiny/llama.yaml" --world 2 --set parallel.pp=2 --set 'parallel.pp_layers=[0, 2]' \
  --set train.micro_batch_size=4 > "$WORK/empty.out"
grep -q "^0 .*embedding, no layers$" "$WORK/empty.out" || fail "an empty stage: $(cat "$WORK/empty.out")"
# the table's unit: GiB for the 8B, MiB where every stage is under a GiB (the tiny model's total is not 0.00)
grep -q "^stage .* total GiB  holds$" "$WORK/out" || fail "the 8B's table is not in GiB"
"$MEGATRAIN" plan "$REPO/recipes/tiny/llama.yaml" --device-memory 0.001 > "$WORK/tiny.out" 2> "$WORK/tiny.err" &&
  fail "the tiny model fits in 1 MiB?"
grep -q "^memory: does NOT fit: stage 0 needs [0-9.]* MiB per rank of 1.02 MiB$" "$WORK/tiny.out" &&
  grep -q "needs about [0-9.]* MiB per rank, more than the device's memory (1.0 MiB)" "$WORK/tiny.err" ||
  fail "a tiny model's verdict in MiB: $(cat "$WORK/tiny.out" "$WORK/tiny.err")"
grep -q "^stage .* total MiB  holds$" "$WORK/empty.out" &&
  awk '$1 == "1" { exit !($13 > 0.1 && $13 < 1024) }' "$WORK/empty.out" || fail "the tiny model's table: $(cat "$WORK/empty.out")"
[[ ! -s "$WORK/err" ]] || fail "unexpected warning: $(cat "$WORK/err")"
grep -q "device cuda (bf16 copy + fp32 master weights, fp32 grads, fp32 AdamW states)" "$WORK/out" || fail "no dtypes"
grep -q "^memory: not checked (--device-memory GiB" "$WORK/out" || fail "no line saying the memory was not checked"

status=0
"$MEGATRAIN" plan "$WORK/r.yaml" --world 8 --device-memory 16 > "$WORK/out16" 2> "$WORK/err" || status=$?
[[ $status -eq 1 ]] || fail "a plan that does not fit: exit $status, expected 1 (a job script gates on it)"
grep -q "warning: stage 0 needs about .* GiB per rank, more than the device's memory (16.0 GiB); most of it is the MLP weights (model.intermediate_size = 14336)" "$WORK/err" \
  || fail "no warning for a 16 GiB device: $(cat "$WORK/err")"
grep -q "^memory: does NOT fit: stage 0 needs .* GiB per rank of 16.00 GiB$" "$WORK/out16" || fail "no verdict line"
# what would make it fit: the levers on these ranks with their estimates (dp 2: ZeRO-1 among them), then more ranks
for lever in "optimizer.state_dtype: bf16" "parallel.distributed_optimizer: true" "train.recompute: full"; do
  grep -q "$lever ([0-9.]* GiB)" "$WORK/err" || fail "the advice does not offer $lever with its estimate: $(cat "$WORK/err")"
done
grep -q "; with more ranks: raise parallel.tp or parallel.pp$" "$WORK/err" || fail "the advice names no ranks to raise"
# ... and the fewest ranks that fit, on a line before the verdict (still the last), with the settings that give them:
# plan with those settings fits
fit_line=$(grep "^fit: " "$WORK/out16") || fail "no fit: line where the recipe does not fit: $(cat "$WORK/out16")"
fit_re='^fit: fits on ([0-9]+) ranks: tp [0-9]+( x cp [0-9]+)? x pp [0-9]+ x dp [0-9]+ '
fit_re+='\([0-9.]+ GiB of 16\.0 GiB per rank, [0-9.]+ GiB to spare\); (--world ([0-9]+)( --set parallel\.[a-z]+=[0-9]+)*)$'
[[ $fit_line =~ $fit_re ]] || fail "the fit: line: $fit_line"
[[ ${BASH_REMATCH[1]} == "${BASH_REMATCH[4]}" ]] || fail "the fit: line's ranks and --world differ: $fit_line"
read -ra fit_settings <<< "${BASH_REMATCH[3]}"
[[ $(tail -n 1 "$WORK/out16") == "memory: does NOT fit: "* ]] ||
  fail "the verdict is not the last line: $(tail -n 2 "$WORK/out16")"
"$MEGATRAIN" plan "$WORK/r.yaml" --device-memory 16 "${fit_settings[@]}" > "$WORK/fit16" 2> "$WORK/err" ||
  fail "plan with the fit: line's settings (${fit_settings[*]}) does not fit: $(tail -n 1 "$WORK/fit16")" \
    "$(cat "$WORK/err")"
grep -q "^memory: fits: " "$WORK/fit16" && ! grep -q "^fit:" "$WORK/fit16" ||
  fail "with the fit: line's settings: $(cat "$WORK/fit16")"
# Llama 3 70B at seq 4096 on 80 GB GPUs: 1270 GB of weights, gradients and AdamW states take more than 16 ranks
# with the activations; 32 at tp 8 x pp 4, within a node's tp
sed "s#llama3-8b#llama3-70b#; s#tp: 2, pp: 2#tp: 1, pp: 1#" "$WORK/r.yaml" > "$WORK/r70.yaml"
"$MEGATRAIN" plan "$WORK/r70.yaml" --device-memory 80 > "$WORK/fit70" 2> /dev/null && fail "Llama 3 70B fits one GPU?"
grep -q "^fit: fits on 32 ranks: tp 8 x pp 4 x dp 1 ([0-9.]* GiB of 80.0 GiB per rank, [0-9.]* GiB to spare); \
--world 32 --set parallel.tp=8 --set parallel.pp=4$" "$WORK/fit70" || fail "Llama 3 70B: $(grep "^fit" "$WORK/fit70")"
# --fit asks for it where the recipe fits (exit 0, no warning); it needs a memory to fit; nothing fitting, it says so
"$MEGATRAIN" plan "$WORK/r.yaml" --world 8 --device-memory 141 --fit > "$WORK/fit141" 2> "$WORK/err" ||
  fail "--fit where the recipe fits: $(cat "$WORK/err")"
grep -q "^fit: fits on [0-9]* ranks\?: " "$WORK/fit141" && [[ $(tail -n 1 "$WORK/fit141") == "memory: fits: "* ]] &&
  [[ ! -s "$WORK/err" ]] || fail "--fit where the recipe fits: $(tail -n 2 "$WORK/fit141") $(cat "$WORK/err")"
status=0; "$MEGATRAIN" plan "$REPO/recipes/tiny/llama.yaml" --fit > /dev/null 2> "$WORK/err" || status=$?
[[ $status -eq 2 ]] && grep -qF -- "--fit: no memory to fit: give --device-memory GiB" "$WORK/err" ||
  fail "--fit without a memory: exit $status: $(cat "$WORK/err")"
"$MEGATRAIN" plan "$REPO/recipes/tiny/llama.yaml" --device-memory 0.0001 > "$WORK/fitnone" 2> /dev/null &&
  fail "the tiny model fits in 100 KiB?"
grep -q "^fit: no layout of up to 4096 ranks fits 0.1 MiB a rank (tp up to 2, .*; the nearest: [0-9]* ranks, tp .* \
([0-9.]* MiB per rank)$" "$WORK/fitnone" || fail "nothing fits: $(grep "^fit" "$WORK/fitnone")"
# a memory that is no size is refused
for bad in inf nan 0 -3 16x 1e300; do
  status=0; "$MEGATRAIN" plan "$WORK/r.yaml" --device-memory "$bad" > /dev/null 2> "$WORK/err" || status=$?
  [[ $status -eq 2 ]] && grep -qF -- "--device-memory: expected GiB, more than 0 and at most 1048576 (1 PiB), found \
'$bad'" "$WORK/err" ||
    fail "--device-memory $bad: exit $status: $(cat "$WORK/err")"
done
# ... at dp 1 the distributed optimizer saves nothing and is not offered
"$MEGATRAIN" plan "$WORK/r.yaml" --world 4 --device-memory 16 > /dev/null 2> "$WORK/err4" && fail "fits in 16 GiB?"
grep -q "optimizer.state_dtype: bf16" "$WORK/err4" || fail "no advice at dp 1: $(cat "$WORK/err4")"
grep -q "distributed_optimizer" "$WORK/err4" && fail "ZeRO-1 offered at dp 1: $(cat "$WORK/err4")"
"$MEGATRAIN" plan "$WORK/r.yaml" --world 8 --device-memory 141 --set optimizer.state_dtype=bf16 > "$WORK/out141" \
  2> "$WORK/err"
grep -q "fp32 grads, bf16 AdamW states" "$WORK/out141" || fail "the header does not say bf16 states"
grep -q "^memory: fits: stage 0 needs .* GiB per rank of 141.00 GiB (.* GiB to spare)$" "$WORK/out141" \
  || fail "no 'fits' line: $(tail -2 "$WORK/out141")"
[[ ! -s "$WORK/err" ]] || fail "a warning where it fits: $(cat "$WORK/err")"
# what `run` refuses on GPUs, every setting at once, as run says it
"$MEGATRAIN" plan "$REPO/recipes/tiny/llama.yaml" --set run.device=cuda --set precision=fp8 --set data.pack=true \
  --set train.loss=per_token > "$WORK/refused.txt" || fail "plan of a recipe run refuses on cuda failed"
grep -q "^refused by \`run\` (exit 2): run.device: cuda does not run 3 of this recipe's settings yet" "$WORK/refused.txt" \
  || fail "plan does not list what run refuses on cuda: $(cat "$WORK/refused.txt")"
for key in "precision: fp8" "data.pack:" "train.loss: per_token"; do
  grep -q "^  $key" "$WORK/refused.txt" || fail "plan's refusals do not name $key"
done

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
grep -q "^grid: world 1 = tp 1 x cp 1 x dp 1 x pp 1 (.*); 8 experts over ep 1 x etp 1$" "$WORK/plan_moe.txt" \
  || fail "the MoE grid line does not say how the experts are split: $(grep grid "$WORK/plan_moe.txt")"
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
grep -q "^usage: megatrain plan" "$WORK/help.txt" && grep -q "^  --fit " "$WORK/help.txt" || fail "plan --help"
# without --world, a layout with expert parallel is planned on the fewest ranks that hold it: dp = ep (dp 1 refused
# the recipe: "parallel.ep: expected a divisor of dp ... 1 / 1 = 1")
"$MEGATRAIN" plan "$REPO/recipes/tiny/mixtral.yaml" --set parallel.ep=4 --set parallel.tp=2 --set train.micro_batch_size=2 > "$WORK/out" 2> "$WORK/err" ||
  fail "plan with ep 4 and no --world: $(cat "$WORK/err")"
grep -q "^grid: world 8 = tp 2 x cp 1 x dp 4 x pp 1 .*8 experts over ep 4 x etp 1" "$WORK/out" ||
  fail "plan with ep 4, tp 2 and no --world should take 8 ranks: $(cat "$WORK/out")"
# the distributed optimizer at dp 1 shards nothing: the table says so, and a line says why (without --world: the
# smallest world of the layout); at dp 2 it shards, and no line is said
"$MEGATRAIN" plan "$REPO/recipes/tiny/llama.yaml" --set parallel.distributed_optimizer=true > "$WORK/zero1.out" ||
  fail "plan with the distributed optimizer at dp 1 failed"
awk '$1 == "0" && $7 == "unsharded" { found = 1 } END { exit !found }' "$WORK/zero1.out" &&
  grep -q "^dist-opt: parallel.distributed_optimizer shards the AdamW states over the data-parallel ranks: at dp 1 it \
shards nothing (without --world, plan takes the layout's smallest world" "$WORK/zero1.out" ||
  fail "plan at dp 1 should say the distributed optimizer shards nothing: $(cat "$WORK/zero1.out")"
"$MEGATRAIN" plan "$REPO/recipes/tiny/llama.yaml" --world 2 --set parallel.distributed_optimizer=true \
  --set train.micro_batch_size=4 > "$WORK/zero1.out" ||
  fail "plan with the distributed optimizer at dp 2 failed"
awk '$1 == "0" && $7 == "yes" { found = 1 } END { exit !found }' "$WORK/zero1.out" && ! grep -q "^dist-opt:" "$WORK/zero1.out" ||
  fail "plan at dp 2: the distributed optimizer shards: $(cat "$WORK/zero1.out")"
echo "ok"
