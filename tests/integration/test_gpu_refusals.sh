#!/usr/bin/env bash
# test_gpu_refusals.sh: what run.device: cuda does not run yet
# (src/model/model_device_limits.c) is refused before any GPU work, every
# such setting in one error, with exit 2, by the CPU build (which says so
# as well as that it lacks the CUDA backend) and by the CUDA build when one
# is built: no need to rebuild with CUDA=1, or rerun once per setting, to
# learn what a recipe asks of a GPU that megatrain cannot give yet. A
# recipe the GPU would run gets, from a CPU build, the one error that the
# build lacks the backend (exit 1).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
LORA=(--set "peft={type: lora, rank: 4, alpha: 8}")

# refused BINARY NAME ARGS...: `run` of the tiny llama on cuda with ARGS exits 2 with one error line
refused() {
  local bin=$1 name=$2 rc=0
  shift 2
  "$bin" run "$REPO/recipes/tiny/llama.yaml" --set run.device=cuda --set run.dir="$WORK/$name" "$@" \
    > "$WORK/$name.out" 2> "$WORK/$name.err" || rc=$?
  cat "$WORK/$name.err"
  [[ $rc -eq 2 ]] || fail "$name: exit $rc, expected 2"
  [[ $(grep -c '^megatrain: error: ' "$WORK/$name.err") -eq 1 ]] || fail "$name: expected one error"
  [[ ! -e "$WORK/$name" ]] || fail "$name: the refused run made its run.dir"
}

for bin in "$MEGATRAIN" "$REPO/build/cuda/megatrain"; do
  [[ -x $bin ]] || { echo "no $bin: its refusals are not checked here"; continue; }
  cpu_only=false
  "$bin" --version | grep -q "with the CUDA backend" || cpu_only=true
  name=all-$($cpu_only && echo cpu || echo cuda)
  refused "$bin" "$name" --set precision=fp8 --set data.pack=true --set train.loss=per_token "${LORA[@]}" \
    --set model.head_dim=48
  grep -q "^megatrain: error: run.device: cuda does not run 5 of this recipe's settings yet" "$WORK/$name.err" ||
    fail "$name: no summary line"
  for key in "precision: fp8" "peft: LoRA" "data.pack:" "train.loss: per_token" "model.head_dim: 48"; do
    grep -q "^  $key" "$WORK/$name.err" || fail "$name: $key is not among the refusals"
  done
  if $cpu_only; then
    grep -q "^  (and this build is CPU only: make CUDA=1 builds the GPU backend)$" "$WORK/$name.err" ||
      fail "$name: the CPU build does not say it lacks the backend"
  else
    grep -q "CPU only" "$WORK/$name.err" && fail "$name: the CUDA build says it is CPU only"
  fi
  # one setting: the error is that setting's line alone
  refused "$bin" "one-$name" --set precision=bf16 --set train.loss=per_token
  grep -q "^megatrain: error: train.loss: per_token is not implemented on GPUs yet" "$WORK/one-$name.err" ||
    fail "one-$name: not the setting's own message"
  echo "$name: every setting refused at once, exit 2"
done

# a recipe a GPU runs: a CPU build says only that it lacks the backend, exit 1
rc=0
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.device=cuda --set precision=bf16 \
  --set run.dir="$WORK/runs" > /dev/null 2> "$WORK/runs.err" || rc=$?
if "$MEGATRAIN" --version | grep -q "with the CUDA backend"; then
  echo "build/megatrain is a CUDA build: the CPU build's own error is not checked"
else
  [[ $rc -eq 1 ]] || fail "a recipe the GPU runs, CPU build: exit $rc, expected 1"
  grep -q "run.device: 'cuda' needs a build with the CUDA backend (make CUDA=1" "$WORK/runs.err" ||
    fail "no message that the build lacks the backend: $(cat "$WORK/runs.err")"
fi
echo ok
