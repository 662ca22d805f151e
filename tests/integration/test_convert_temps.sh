#!/usr/bin/env bash
# test_convert_temps.sh: a convert killed midway (SIGKILL, or Ctrl-C / SIGTERM, which end it at once) leaves
# its temporary directory DST.tmp.HOST.PID, as large as the model. The next convert into DST removes those
# of this host's processes that are gone, with a log line, both ways (megatrain -> Hugging Face and back);
# a live process's (this shell's pid) and another host's are kept. A real SIGTERM in the middle of a
# convert leaves no DST (checked when the kill lands before the end).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
demo_data "$WORK/english"
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$WORK/run" --set train.steps=1 \
  --set optimizer.schedule.warmup_steps=0 --set "data.train=[{path: $WORK/english, weight: 1.0}]" > /dev/null 2>&1 ||
  fail "the run failed"
sleep 0 & dead=$!
wait "$dead"
host=$(hostname | tr -c 'A-Za-z0-9\n-' '_')
plant() {  # DST: a killed convert's temporary directory, a live one's, another host's
  mkdir -p "$1.tmp.$host.$dead/sub" "$1.tmp.$host.$$" "$1.tmp.otherhost.$dead"
  head -c 10000 /dev/zero > "$1.tmp.$host.$dead/model.safetensors"
  touch "$1.tmp.$host.$dead/sub/x"
}
check() {  # DST LOG
  [[ ! -e "$1.tmp.$host.$dead" ]] || fail "$1: the killed convert's temporary directory is still there"
  grep -q "convert: removed 1 temporary directory of an earlier convert into $1 that was killed ($1.tmp.$host.$dead)" \
    "$2" || fail "$1: no log line for the removed directory: $(cat "$2")"
  [[ -d "$1.tmp.$host.$$" && -d "$1.tmp.otherhost.$dead" ]] || fail "$1: a live process's or another host's was removed"
  [[ -z "$(compgen -G "$1.tmp.$host.[0-9]*" | grep -v "\.$$\$" || true)" ]] || fail "$1: temporaries left: $(ls "$WORK")"
}
plant "$WORK/hf"
"$MEGATRAIN" convert "$WORK/run" "$WORK/hf" > "$WORK/to_hf.log" 2>&1 || fail "convert to HF failed: $(cat "$WORK/to_hf.log")"
check "$WORK/hf" "$WORK/to_hf.log"
plant "$WORK/ckpt"
"$MEGATRAIN" convert "$WORK/hf" "$WORK/ckpt" > "$WORK/to_ckpt.log" 2>&1 ||
  fail "convert to a checkpoint failed: $(cat "$WORK/to_ckpt.log")"
check "$WORK/ckpt" "$WORK/to_ckpt.log"
"$MEGATRAIN" inspect "$WORK/ckpt" > /dev/null || fail "the converted checkpoint does not verify"

# SIGTERM at a random moment of a convert: DST is whole or absent; what is left is removed by the next one
for i in 1 2 3 4 5; do
  rm -rf "$WORK/hf2"
  "$MEGATRAIN" convert "$WORK/run" "$WORK/hf2" > /dev/null 2>&1 &
  pid=$!
  sleep "0.0$((RANDOM % 10))"
  kill -TERM "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  if [[ -e "$WORK/hf2" ]]; then
    "$MEGATRAIN" convert "$WORK/hf2" "$WORK/back$i" > /dev/null 2>&1 || fail "SIGTERM $i: $WORK/hf2 exists but is not whole"
  else
    "$MEGATRAIN" convert "$WORK/run" "$WORK/hf2" > /dev/null 2>&1 || fail "SIGTERM $i: the convert after it failed"
  fi
  [[ -z "$(compgen -G "$WORK/hf2.tmp.$host.[0-9]*" || true)" ]] || fail "SIGTERM $i: left $(ls "$WORK")"
done
echo "ok"
