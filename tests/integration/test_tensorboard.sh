#!/usr/bin/env bash
# test_tensorboard.sh: a tiny run with logging.tensorboard on writes one event
# file in run.dir/tensorboard; tensorboard's own reader (EventAccumulator)
# reads back every scalar, equal to the metrics.jsonl values rounded to
# float32 within one float32 ulp (train/weight_decay with a weight decay schedule); the perf/ scalars (TFLOP/s, MFU with
# logging.peak_tflops set, memory) too (the event holds float32(value); the JSON
# holds value to 9 significant digits, and rounding that decimal to float32
# can land one ulp away from rounding the double itself), at the same steps (train/* at every logged step, eval/loss at the
# eval steps, test/loss after the last one); a MoE run (tiny mixtral with a capacity) also its moe/ scalars
# (aux loss, expert imbalance, drop rate); a run resumed from an earlier checkpoint shows each step once, the
# resumed run's values. logging.tensorboard=false writes no event file. Without the
# `tensorboard` Python package it installs one from PyPI into build/test-venv
# (tests/python_env.sh; once, about 5 s); it skips (77) only when that cannot
# be done, and fails then in CI (CI=true; lib.sh, need_python).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need_python tensorboard
demo_data "$WORK/english"
run() {  # run DIR [RECIPE_NAME] [--set ...]
  local recipe=llama
  [[ $# -ge 2 && $2 != --set ]] && { recipe=$2; set -- "$1" "${@:3}"; }
  "$MEGATRAIN" run "$REPO/recipes/tiny/$recipe.yaml" --set run.dir="$1" --set train.steps=12 \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=2 \
    --set train.eval_interval=6 --set checkpoint.interval=0 --set optimizer.schedule.warmup_steps=4 "${@:2}" > /dev/null
}
run "$WORK/on" --set logging.tensorboard=true --set logging.peak_tflops=1.0 --set "data.split=[90, 5, 5]" \
  --set optimizer.weight_decay=0.01 --set optimizer.weight_decay_end=0.1 --set optimizer.weight_decay_style=linear
run "$WORK/moe" mixtral --set logging.tensorboard=true --set logging.peak_tflops=1.0 --set model.moe.capacity_factor=1.0
run "$WORK/off" --set logging.tensorboard=false
[[ ! -e "$WORK/off/tensorboard" ]] || fail "logging.tensorboard=false still wrote $WORK/off/tensorboard"
files=("$WORK"/on/tensorboard/events.out.tfevents.*.megatrain)
[[ ${#files[@]} -eq 1 && -s "${files[0]}" ]] || fail "expected one event file, found: $(ls "$WORK/on/tensorboard")"

for dir in on moe; do
"$PY" - "$WORK/$dir" << 'PY' || fail "$dir: the event file does not read back as metrics.jsonl"
import json, struct, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

run_dir = sys.argv[1]
acc = EventAccumulator(run_dir + "/tensorboard", size_guidance={"scalars": 0})
acc.Reload()
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
rows = [json.loads(line) for line in open(run_dir + "/metrics.jsonl")]
tags = {"train/loss": "loss", "train/lr": "lr", "train/grad_norm": "grad_norm",
        "train/global_batch_size": "global_batch_size", "train/tokens_per_s": "tokens_per_s",
        "eval/loss": "eval_loss", "perf/tflops_per_device": "tflops", "perf/mfu_percent": "mfu",
        "perf/peak_mem_gib": "peak_mem_gib"}
if run_dir.endswith("/on"):  # a test share: its loss after the last step; a weight decay schedule
    tags["test/loss"] = "test_loss"
    tags["train/weight_decay"] = "weight_decay"
if run_dir.endswith("/moe"):
    tags.update({"moe/aux_loss": "moe_aux_loss", "moe/expert_imbalance": "moe_imbalance",
                 "moe/drop_rate": "moe_drop_rate", "moe/load_balancing_loss": "moe_load_balancing_loss"})
have = set(acc.Tags()["scalars"])
assert have == set(tags), f"scalar tags {sorted(have)} != {sorted(tags)}"
for tag, key in tags.items():
    want = [(r["step"], f32(r[key])) for r in rows if key in r]
    got = [(e.step, e.value) for e in acc.Scalars(tag)]
    assert want, f"metrics.jsonl has no {key}"
    same = [s == t and abs(v - w) <= abs(w) * 2.0**-23 for (s, v), (t, w) in zip(got, want)]
    assert len(got) == len(want) and all(same), f"{tag}: event file {got} != metrics.jsonl {want}"
    print(f"{tag}: {len(got)} values equal within one float32 ulp")
steps = [e.step for e in acc.Scalars("eval/loss")]
assert steps == [6, 12], f"eval/loss at steps {steps}, expected [6, 12]"
if run_dir.endswith("/on"):
    steps = [e.step for e in acc.Scalars("test/loss")]
    assert steps == [12], f"test/loss at steps {steps}, expected [12]"
PY
done
echo "ok: every scalar reads back equal (within one float32 ulp)"

# a run resumed from an earlier checkpoint trains steps 7-12 again: TensorBoard shows each step once, the resumed
# run's (its event file starts with a session start at step 7, and TensorBoard drops what earlier files hold from
# there); it showed steps 7-12 twice
run "$WORK/re" --set logging.tensorboard=true --set checkpoint.interval=6
rm -r "$WORK/re/checkpoints/iter_0000012" && echo 6 > "$WORK/re/checkpoints/latest_checkpointed_iteration.txt"
"$MEGATRAIN" resume "$WORK/re" > "$WORK/re-resume.log" 2>&1 || fail "resume: $(tail -n 3 "$WORK/re-resume.log")"
"$PY" - "$WORK/re" << 'PY' || fail "the resumed run's TensorBoard steps are not each once"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1] + "/tensorboard", size_guidance={"scalars": 0})
acc.Reload()
got = [(e.step, e.value) for e in acc.Scalars("train/loss")]
want = [json.loads(line) for line in open(sys.argv[1] + "/metrics.jsonl")]
assert [s for s, _ in got] == [1, 2, 4, 6, 8, 10, 12], f"train/loss at steps {[s for s, _ in got]}"
assert all(abs(v - r["loss"]) <= abs(r["loss"]) * 2.0**-23 for (_, v), r in zip(got, want)), f"{got} != {want}"
print("resumed: train/loss at steps 1, 2, 4, ..., 12, each once, the resumed run's values")
PY
