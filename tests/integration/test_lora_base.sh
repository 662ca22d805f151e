#!/usr/bin/env bash
# test_lora_base.sh: LoRA checkpoints that reference their frozen base instead
# of storing it (checkpoint.frozen_base; docs/finetune.md, docs/checkpoints.md).
#   - auto (the default: it references here) and store, both from init_from a
#     full run's checkpoint copied out of its run: the reference checkpoint holds no base tensor
#     and names the base (absolute), its shard is far smaller (sizes printed);
#     the losses are the same; `eval` of it gives the run's eval_loss;
#     --merge-lora of both gives the same safetensors byte for byte;
#   - resume: bit for bit on one rank; a tp 2 x dp 2 ZeRO-1 run's checkpoint
#     (no writer stores the base) resumes on one rank, and a one-rank
#     checkpoint on pp 2, with the one-rank losses; --set
#     checkpoint.frozen_base=store on resume stores it from then on;
#   - init_from a referencing checkpoint references the same base (one level);
#   - the base moved away: the PEFT export works (and equals store's);
#     resume (also on 2 ranks), eval, --merge-lora, init_from and inspect
#     exit 1 naming the base and saying it is missing, and nothing on disk
#     changes; moved back, they work; the base replaced by another
#     checkpoint at the same path: refused, the CRC named; a damaged base
#     shard: refused, the checkpoint not set aside;
#   - store: the checkpoint holds the base and resumes with the init_from
#     directory gone; a LoRA run without init_from stores its (random) base;
#     resumed, its --set report names no frozen_base change the user did not
#     make (it said "auto -> store"), and a --set of it is still named;
#   - auto (the default) references a base outside any run's checkpoints/
#     (the cases above) and stores one that is a run's checkpoint; reference
#     to such a base warns.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1
demo_data "$WORK/english"
lora_settings "$WORK/english"
COMMON+=(--set checkpoint.interval=3 --set "data.valid=[{path: $WORK/english, weight: 1.0}]")
losses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$1/metrics.jsonl"; }
run() { "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/$1" "${COMMON[@]}" "${@:2}"; }
mpi() { timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$@"; }
shard_bytes() { cat "$1"/shard_*.zst | wc -c; }
# inspect_says CKPT TEXT: `megatrain inspect CKPT` succeeds and prints TEXT (a fixed string).
inspect_says() { "$MEGATRAIN" inspect "$1" > "$WORK/inspect.log" && grep -qF -- "$2" "$WORK/inspect.log"; }
# expect_exit1 WHAT PATTERN... -- ARGS: `megatrain ARGS` exits 1 with every PATTERN (fixed strings) in its output.
expect_exit1() {
  local what=$1 rc=0 patterns=()
  shift
  while [[ $1 != -- ]]; do patterns+=("$1"); shift; done
  shift
  timeout 60 "$@" > "$WORK/exit1.log" 2>&1 || rc=$?
  [[ $rc -eq 1 ]] || { cat "$WORK/exit1.log"; fail "$what: expected exit 1, got $rc"; }
  for p in "${patterns[@]}"; do
    grep -qF -- "$p" "$WORK/exit1.log" || { cat "$WORK/exit1.log"; fail "$what: the message does not say '$p'"; }
  done
  echo "$what: exit 1, naming the base"
}

# The base: a full run's checkpoint copied out of the run (as `megatrain convert` would leave one: no run's
# retention deletes it); LoRA from it in both modes.
run base-run --set train.steps=2 > /dev/null
cp -r "$WORK/base-run/checkpoints/iter_0000002" "$WORK/base"
base=$(realpath "$WORK/base")
run ref "${LORA[@]}" --set init_from="$WORK/base" --set train.steps=6 > "$WORK/ref.log"
run store "${LORA[@]}" --set init_from="$WORK/base" --set train.steps=6 --set checkpoint.frozen_base=store \
  > "$WORK/store.log"
grep -qF "reference the frozen base in $base (" "$WORK/ref.log" && grep -qF "checkpoint.frozen_base: auto)" "$WORK/ref.log" \
  || fail "reference: no log line: $(cat "$WORK/ref.log")"
grep -qF "every checkpoint stores the frozen base (checkpoint.frozen_base: store)" "$WORK/store.log" \
  || fail "store: no log line"
ref6="$WORK/ref/checkpoints/iter_0000006" store6="$WORK/store/checkpoints/iter_0000006"
"$MEGATRAIN" inspect "$ref6" > "$WORK/inspect-ref.log" || fail "inspect of the reference checkpoint failed"
"$MEGATRAIN" inspect "$store6" > "$WORK/inspect-store.log" || fail "inspect of the store checkpoint failed"
grep -qF "frozen base: not stored here, referenced: $base (metadata.mtck CRC-32C " "$WORK/inspect-ref.log" \
  && grep -q "^  frozen base: .*) ok$" "$WORK/inspect-ref.log" || fail "inspect: $(head -n 5 "$WORK/inspect-ref.log")"
! grep -qE '^ *(embed\.weight|norm\.weight|layers\.[0-9]+\.[a-z_]+\.[a-z_]+\.weight) ' "$WORK/inspect-ref.log" \
  || fail "the reference checkpoint holds base tensors"
grep -q "^  frozen base: stored in this checkpoint$" "$WORK/inspect-store.log" \
  && grep -qE '^ *embed\.weight ' "$WORK/inspect-store.log" || fail "the store checkpoint lacks its base"
for mode in ref store; do
  [[ $(grep -cE '^ *optimizer\.m\.' "$WORK/inspect-$mode.log") -eq 56 ]] || fail "$mode: not 56 adapters' moments"
done
r=$(shard_bytes "$ref6") s=$(shard_bytes "$store6")
echo "checkpoint shard of the tiny LoRA run (249.41K parameters, 19.46K trained): reference $r bytes, store $s bytes"
((r * 4 < s)) || fail "the reference checkpoint ($r bytes) is not far smaller than the stored one ($s bytes)"
diff <(losses "$WORK/ref") <(losses "$WORK/store") > /dev/null || fail "reference and store runs' losses differ"
want=$(grep '"step":6,' "$WORK/ref/metrics.jsonl" | grep -o '"eval_loss":[^,}]*' | cut -d: -f2)
out=$("$MEGATRAIN" eval "$ref6" --data "$WORK/english" --batches 2 --seq-len 32 --micro-batch-size 2) \
  || fail "eval of the reference checkpoint failed"
[[ $out == "eval: loss $(printf '%.6f' "$want") "* ]] || fail "eval says '$out', the run's eval_loss is $want"
"$MEGATRAIN" convert "$ref6" "$WORK/merged-ref" --merge-lora > /dev/null
"$MEGATRAIN" convert "$store6" "$WORK/merged-store" --merge-lora > /dev/null
cmp "$WORK/merged-ref/model.safetensors" "$WORK/merged-store/model.safetensors" \
  || fail "--merge-lora of the reference checkpoint differs from the store one"
echo "reference: the losses of store, eval = the run's eval_loss ($want), --merge-lora = store's byte for byte"

# Resume: bit for bit on one rank; other layouts with the one-rank losses.
run ref3 "${LORA[@]}" --set init_from="$WORK/base" --set train.steps=3 > /dev/null
"$MEGATRAIN" resume "$WORK/ref3/checkpoints/iter_0000003" --set train.steps=6 --set run.dir="$WORK/ref3-again" \
  > "$WORK/resume.log" 2>&1 || fail "resume failed: $(tail -n 3 "$WORK/resume.log")"
grep -qF "resume: the checkpoints keep referencing the frozen base in $base" "$WORK/resume.log" \
  || fail "resume: no reference line"
diff <(losses "$WORK/ref" | tail -n 3) <(losses "$WORK/ref3-again") > /dev/null || fail "resumed losses differ"
inspect_says "$WORK/ref3-again/checkpoints/iter_0000006" "referenced: $base (" \
  || fail "the resumed run's checkpoint does not reference the base"
"$MEGATRAIN" resume "$WORK/ref3/checkpoints/iter_0000003" --set train.steps=6 --set run.dir="$WORK/ref3-store" \
  --set checkpoint.frozen_base=store > "$WORK/resume-store.log" 2>&1 || fail "resume with frozen_base store failed"
grep -q "resume: --set changes .*checkpoint.frozen_base auto -> store" "$WORK/resume-store.log" \
  || fail "the --set report does not name checkpoint.frozen_base: $(grep 'changes' "$WORK/resume-store.log")"
inspect_says "$WORK/ref3-store/checkpoints/iter_0000006" "frozen base: stored in this checkpoint" \
  || fail "resume with --set checkpoint.frozen_base=store: the checkpoint does not store the base"
diff <(losses "$WORK/ref" | tail -n 3) <(losses "$WORK/ref3-store") > /dev/null || fail "resumed losses differ (store)"
echo "resume: steps 4-6 bit for bit, the reference kept (or the base stored with --set checkpoint.frozen_base=store)"
if command -v mpirun > /dev/null; then
  mpi 4 "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/zero1" "${COMMON[@]}" "${LORA[@]}" \
    --set init_from="$WORK/base" --set train.steps=3 --set parallel.tp=2 --set parallel.distributed_optimizer=true \
    > "$WORK/zero1.log" 2>&1 || { tail -n 20 "$WORK/zero1.log"; fail "tp 2 x dp 2 with ZeRO-1: the run failed"; }
  "$MEGATRAIN" inspect "$WORK/zero1" > "$WORK/inspect-zero1.log" || fail "inspect of the tp 2 x dp 2 checkpoint failed"
  grep -qF "referenced: $base (" "$WORK/inspect-zero1.log" && ! grep -qE '^ *embed\.weight ' "$WORK/inspect-zero1.log" \
    || fail "the tp 2 x dp 2 checkpoint stores its base: $(head -n 8 "$WORK/inspect-zero1.log")"
  "$MEGATRAIN" resume "$WORK/zero1" --set train.steps=6 --set parallel.tp=1 --set parallel.distributed_optimizer=false \
    > "$WORK/zero1-resume.log" 2>&1 || fail "resume on one rank: $(tail -n 3 "$WORK/zero1-resume.log")"
  for field in loss grad_norm eval_loss; do
    compare $field "$WORK/ref/metrics.jsonl" "$WORK/zero1/metrics.jsonl" || fail "tp 2 x dp 2, resumed: $field differs"
  done
  mpi 2 "$MEGATRAIN" resume "$WORK/ref3/checkpoints/iter_0000003" --set train.steps=6 --set run.dir="$WORK/pp2" \
    --set parallel.pp=2 > "$WORK/pp2.log" 2>&1 || { tail -n 20 "$WORK/pp2.log"; fail "resume on pp 2 failed"; }
  compare loss "$WORK/ref/metrics.jsonl" "$WORK/pp2/metrics.jsonl" 4 || fail "resumed on pp 2: the losses differ"
  echo "a tp 2 x dp 2 ZeRO-1 reference checkpoint resumes on one rank, a one-rank one on pp 2, with the losses"
else
  echo "no mpirun: other layouts not checked"
fi

# init_from a referencing checkpoint: the run references its base (the checkpoint that holds the weights).
run chain "${LORA[@]}" --set init_from="$ref6" --set train.steps=1 --set checkpoint.interval=1 > "$WORK/chain.log"
inspect_says "$WORK/chain" "referenced: $base (" || fail "init_from a LoRA checkpoint: not its base"
echo "init_from a referencing checkpoint: its base is referenced"

# The base moved away: nothing needs it but the PEFT export; nothing on disk changes.
"$MEGATRAIN" convert "$store6" "$WORK/peft-store" > /dev/null
mv "$WORK/base" "$WORK/base.away"
"$MEGATRAIN" convert "$ref6" "$WORK/peft-ref" > /dev/null || fail "the PEFT export needs the base"
cmp "$WORK/peft-ref/adapter_model.safetensors" "$WORK/peft-store/adapter_model.safetensors" \
  || fail "the PEFT export of the reference checkpoint differs from the store one"
echo "base moved away: the PEFT export works and equals store's"
# (run.dir/.megatrain.lock aside: every run and resume takes that lock, writing its pid there, before anything else)
snapshot() { (cd "$WORK" && find ref chain -not -name .megatrain.lock -printf '%p %s %T@\n' | sort && cat ref/metrics.jsonl); }
before=$(snapshot)
missing=("references those of $base" "which is missing" "restore $base" "checkpoint.frozen_base: store")
expect_exit1 "resume" "${missing[@]}" "$ref6" -- "$MEGATRAIN" resume "$WORK/ref" --set train.steps=8
if command -v mpirun > /dev/null; then
  expect_exit1 "resume on 2 ranks" "${missing[@]}" -- mpirun --allow-run-as-root --oversubscribe -np 2 "$MEGATRAIN" resume "$WORK/ref" --set train.steps=8 \
    --set parallel.tp=2
fi
expect_exit1 "eval" "${missing[@]}" -- "$MEGATRAIN" eval "$ref6" --data "$WORK/english" --batches 1
expect_exit1 "convert --merge-lora" "${missing[@]}" -- "$MEGATRAIN" convert "$ref6" "$WORK/merged2" --merge-lora
[[ ! -e "$WORK/merged2" ]] || fail "convert --merge-lora left $WORK/merged2"
expect_exit1 "init_from the LoRA checkpoint" "${missing[@]}" -- "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" \
  --set run.dir="$WORK/chain2" "${COMMON[@]}" "${LORA[@]}" --set init_from="$ref6" --set train.steps=1
expect_exit1 "inspect" "NOT USABLE" "${missing[@]}" -- "$MEGATRAIN" inspect "$ref6"
[[ "$(snapshot)" == "$before" ]] || fail "a refused command changed the run directories: $(diff <(echo "$before") <(snapshot))"
echo "nothing on disk changed"
mv "$WORK/base.away" "$WORK/base"
"$MEGATRAIN" eval "$ref6" --data "$WORK/english" --batches 1 > /dev/null || fail "eval after the base came back"
"$MEGATRAIN" resume "$WORK/ref" --set train.steps=7 > "$WORK/back.log" 2>&1 \
  || fail "resume after the base came back: $(tail -n 3 "$WORK/back.log")"
echo "base moved back: eval and resume work"

# The base replaced by another checkpoint at the same path: refused by its CRC.
run other --set train.steps=2 --set run.seed=7 > /dev/null
mv "$WORK/base" "$WORK/base.orig"
cp -r "$WORK/other/checkpoints/iter_0000002" "$WORK/base"
changed=("references those of $base" "CRC-32C" "the reference recorded" "put the original checkpoint back at $base")
expect_exit1 "resume, base replaced" "${changed[@]}" -- "$MEGATRAIN" resume "$WORK/ref" --set train.steps=8
expect_exit1 "eval, base replaced" "${changed[@]}" -- "$MEGATRAIN" eval "$ref6" --data "$WORK/english" --batches 1
expect_exit1 "convert --merge-lora, base replaced" "${changed[@]}" -- "$MEGATRAIN" convert "$ref6" "$WORK/merged3" \
  --merge-lora
rm -rf "$WORK/base"
# A damaged shard of the base (same size, same metadata): its chunk's CRC stops the load, and the checkpoint,
# which is fine, is not set aside as invalid.
cp -r "$WORK/base.orig" "$WORK/base"
printf 'XXXXXXXX' | dd of="$base/shard_00000.zst" bs=1 seek=1000 conv=notrunc status=none
expect_exit1 "resume, base damaged" "references those of $base" "which cannot be read" "$base/shard_00000.zst" \
  -- "$MEGATRAIN" resume "$WORK/ref" --set train.steps=8
if command -v mpirun > /dev/null; then # the load fails on every rank: all stop together (agree_on_load)
  expect_exit1 "resume on 2 ranks, base damaged" "which cannot be read" -- mpirun --allow-run-as-root --oversubscribe \
    -np 2 "$MEGATRAIN" resume "$WORK/ref" --set train.steps=8 --set parallel.pp=2
fi
[[ -z "$(ls -d "$WORK"/ref/checkpoints/*.invalid* 2> /dev/null)" ]] || fail "a checkpoint was set aside for its base"
rm -rf "$WORK/base"
mv "$WORK/base.orig" "$WORK/base"

# store: self-contained, resumes with the init_from directory gone.
mv "$WORK/base" "$WORK/base.away"
"$MEGATRAIN" resume "$WORK/store/checkpoints/iter_0000003" --set run.dir="$WORK/store-again" --set train.steps=6 \
  > "$WORK/store-again.log" 2>&1 || fail "store: resume without the init_from directory: $(tail -n 3 "$WORK/store-again.log")"
grep -q "stores its frozen base: the checkpoints of this run store it too" "$WORK/store-again.log" || fail "store: no line"
diff <(losses "$WORK/store" | tail -n 3) <(losses "$WORK/store-again") > /dev/null || fail "store: resumed losses differ"
mv "$WORK/base.away" "$WORK/base"
run random "${LORA[@]}" --set train.steps=1 --set checkpoint.interval=1 > "$WORK/random.log"
grep -q "the frozen base is random (no init_from): every checkpoint stores it" "$WORK/random.log" \
  || fail "no init_from: no line"
inspect_says "$WORK/random" "frozen base: stored in this checkpoint" \
  || fail "no init_from: the base is not stored"
# resumed, its checkpoints store the base as before: that is no change of checkpoint.frozen_base (auto) to report
"$MEGATRAIN" resume "$WORK/random" --set train.steps=2 > "$WORK/random-resume.log" 2>&1 \
  || fail "resume of the random-base run: $(tail -n 3 "$WORK/random-resume.log")"
[[ $(grep "resume: --set changes" "$WORK/random-resume.log") == "resume: --set changes train.steps 1 -> 2" ]] \
  || fail "the --set report of a resume that changes train.steps alone: $(grep 'changes' "$WORK/random-resume.log")"
# reference asked where there is nothing to reference: said, not silently stored (run and resume)
run random-ref "${LORA[@]}" --set train.steps=1 --set checkpoint.interval=1 --set checkpoint.frozen_base=reference \
  > "$WORK/random-ref.log" 2> "$WORK/random-ref.err"
grep -qF "warning: checkpoint.frozen_base: reference is not done: the frozen base is random (no init_from)" \
  "$WORK/random-ref.err" || fail "reference without init_from: no warning: $(cat "$WORK/random-ref.err")"
inspect_says "$WORK/random-ref" "frozen base: stored in this checkpoint" || fail "reference without init_from: not stored"
"$MEGATRAIN" resume "$WORK/random" --set train.steps=3 --set checkpoint.frozen_base=reference \
  > "$WORK/random-resume-ref.log" 2>&1 || fail "resume --set frozen_base=reference: $(tail -n 3 "$WORK/random-resume-ref.log")"
grep -qF "warning: resume: --set checkpoint.frozen_base=reference is not done: $WORK/random/checkpoints/iter_0000002 stores its frozen base" \
  "$WORK/random-resume-ref.log" || fail "resume --set reference of a stored base: no warning: $(grep -i 'frozen' "$WORK/random-resume-ref.log")"
inspect_says "$WORK/random" "frozen base: stored in this checkpoint" || fail "resume --set reference: not stored"
"$MEGATRAIN" resume "$WORK/random" --set train.steps=4 > "$WORK/random-resume-4.log" 2>&1 || fail "resume after --set reference"
grep -q "frozen_base=reference is not done" "$WORK/random-resume-4.log" && fail "a resume without the --set warns of reference"
# ... and the section form of the --set, checkpoint={frozen_base: reference}, is the same request: warned of alike
"$MEGATRAIN" resume "$WORK/random" --set train.steps=5 --set 'checkpoint={frozen_base: reference, interval: 1}' \
  > "$WORK/random-resume-sect.log" 2>&1 || fail "resume --set checkpoint={frozen_base: reference}: $(tail -n 3 "$WORK/random-resume-sect.log")"
grep -qF "warning: resume: --set checkpoint.frozen_base=reference is not done: $WORK/random/checkpoints/iter_0000004 stores its frozen base" \
  "$WORK/random-resume-sect.log" || fail "resume --set checkpoint={frozen_base: reference}: no warning: $(grep -i 'frozen' "$WORK/random-resume-sect.log")"
inspect_says "$WORK/random/checkpoints/iter_0000005" "frozen base: stored in this checkpoint" ||
  fail "resume --set checkpoint={frozen_base: reference}: not stored"
echo "store: resumes bit for bit without the init_from directory; without init_from the base is stored"

# auto (the default) stores a base that is a run's checkpoint, which that run's retention may delete; reference
# asked for such a base warns. A LoRA run resumed into its base run's directory is refused (the two runs'
# checkpoints would be mixed there, as a branch into any run's directory is), and the base stays.
run auto-run "${LORA[@]}" --set init_from="$WORK/base-run" --set train.steps=3 > "$WORK/auto-run.log"
grep -qF "every checkpoint stores the frozen base, because $(realpath "$WORK/base-run/checkpoints/iter_0000002") is a checkpoint of a training run" \
  "$WORK/auto-run.log" || fail "auto, a run's checkpoint as the base: no line: $(grep checkpoint: "$WORK/auto-run.log")"
inspect_says "$WORK/auto-run" "frozen base: stored in this checkpoint" || fail "auto: a run's checkpoint not stored"
run pinned "${LORA[@]}" --set init_from="$WORK/base-run" --set train.steps=3 --set checkpoint.frozen_base=reference \
  > "$WORK/pinned.log" 2> "$WORK/pinned.err"
grep -qF "is a checkpoint of a training run: if that run's retention deletes it" "$WORK/pinned.err" \
  || fail "reference to a run's checkpoint: no warning: $(cat "$WORK/pinned.err")"
rc=0; "$MEGATRAIN" resume "$WORK/pinned" --set run.dir="$WORK/base-run" --set train.steps=12 > "$WORK/pinned-resume.log" \
  2>&1 || rc=$?
[[ $rc -eq 2 ]] && grep -q "base-run' already holds checkpoints (the newest at step 2) of another run" "$WORK/pinned-resume.log" ||
  fail "resume into the base's run directory: $rc $(tail -n 3 "$WORK/pinned-resume.log")"
[[ -d "$WORK/base-run/checkpoints/iter_0000002" ]] || fail "the refused resume touched the base"
echo "auto: a run's checkpoint as the base is stored; reference to one warns; a resume into the base's run refused"
