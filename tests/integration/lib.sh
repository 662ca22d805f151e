# lib.sh: helpers shared by the integration tests (sourced, not run).
MEGATRAIN=${MEGATRAIN:-build/megatrain}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=$(mktemp -d)
# Processes a test starts in the background and records in BACKGROUND are killed when it ends, pass or fail
# (a failed check must not leave a run training on).
BACKGROUND=()
trap 'for p in "${BACKGROUND[@]}"; do kill -9 "$p" 2> /dev/null || true; done; rm -rf "$WORK"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# need_python GROUP: sets PY to a python3 that has GROUP's packages
# (tensorboard, torch + transformers + safetensors, or those and peft): the system's python3
# when it imports them, else build/test-venv, which tests/python_env.sh makes
# from PyPI the first time. When that fails the test skips (exit 77), except
# in CI (CI=true), where a test that cannot run must fail.
need_python() {
  local modules=$1
  [[ $1 == torch ]] && modules="torch, transformers, safetensors"
  [[ $1 == peft ]] && modules="torch, transformers, safetensors, peft"
  if python3 -c "import $modules" > /dev/null 2>&1; then PY=python3; return; fi
  PY=$(bash "$REPO/tests/python_env.sh" "$1") && return
  [[ ${CI:-} == true ]] && fail "CI=true: cannot install $1 with tests/python_env.sh (pip, from PyPI)"
  echo "skip: cannot install $1 with tests/python_env.sh (pip, from PyPI)"
  exit 77
}

# limit_address_space KB: `ulimit -v KB` in the calling (sub)shell, so that a regression fails instead of
# exhausting the machine; a no-op under tests/run_sanitize.sh (MT_SANITIZE=1), whose AddressSanitizer reserves
# terabytes of shadow address space at start. The normal run of `make test` checks the bound.
limit_address_space() { [[ ${MT_SANITIZE:-0} == 1 ]] || ulimit -v "$1"; }

# json_field FILE KEY: the values of KEY, one per line of a metrics.jsonl.
json_field() { grep -o "\"$2\":[^,}]*" "$1" | cut -d: -f2; }

# demo_data PREFIX: the demo English byte-level data set, built once per test.
demo_data() { (cd "$REPO" && bash scripts/demo_data.sh "$1") > /dev/null; }

# lora_settings DATA: sets COMMON, the tiny llama's settings of the LoRA tests (test_lora.sh, test_lora_base.sh: 4
# layers, seq_len 32, 8 samples a step on DATA, lr 1e-2 decaying over 6 steps, 2 eval batches every 3 steps), and
# LORA, their adapters (rank 4, alpha 8 on all seven projections).
lora_settings() {
  COMMON=(--set logging.interval=1 --set train.micro_batch_size=2 --set model.num_layers=4 --set train.seq_len=32
          --set "train.batch_schedule=[{step: 0, global_batch_size: 8}]" --set optimizer.schedule.warmup_steps=1
          --set optimizer.lr=1.0e-2 --set optimizer.schedule.decay_steps=6 --set train.eval_interval=3
          --set train.eval_batches=2 --set "data.train=[{path: $1, weight: 1.0}]")
  LORA=(--set "peft={type: lora, rank: 4, alpha: 8}")
}

# compare FIELD A B [FROM_A]: the values of FIELD in two metrics.jsonl (A
# from line FROM_A on, all of B) agree line by line to relative 1e-5; a
# missing line or value fails.
compare() {
  local field=$1 a=$2 b=$3 from=${4:-1}
  paste <(json_field "$a" "$field" | tail -n +"$from") <(json_field "$b" "$field") | awk -v f="$field" '
    { n++; if (NF != 2) { print "line " n ": " f " missing"; bad = 1; next }
      d = $1 - $2; if (d < 0) d = -d; s = $1 < 0 ? -$1 : $1;
      if (!(d <= 1e-5 * s)) { print "line " n ": " f " " $1 " vs " $2; bad = 1 } }
    END { if (n == 0) { print "no " f " values"; bad = 1 } exit bad }'
}

# check_checkpoints CK_DIR [SHARDS]: after a kill, every iter_* directory of
# CK_DIR is a complete checkpoint that `inspect` verifies (with SHARDS shard
# files when given) and the latest pointer names one of them; prints how many.
check_checkpoints() {
  local ck=$1 shards=${2:-} n=0
  for d in "$ck"/iter_*; do
    [[ -d "$d" && "$d" =~ iter_[0-9]{7}$ ]] || continue
    "$MEGATRAIN" inspect "$d" > "$WORK/inspect.log" 2>&1 \
      || fail "$(basename "$d") is not a complete checkpoint: $(tail -n 3 "$WORK/inspect.log")"
    [[ -z "$shards" || $(ls "$d" | grep -c '^shard_') -eq $shards ]] \
      || fail "$(basename "$d"): expected $shards shard files"
    n=$((n + 1))
  done
  if [[ -f "$ck/latest_checkpointed_iteration.txt" ]]; then
    local latest; latest=$(printf 'iter_%07d' "$(cat "$ck/latest_checkpointed_iteration.txt")")
    [[ -d "$ck/$latest" ]] || fail "the latest pointer names $latest, which does not exist"
  fi
  echo "$n"
}

# rank_pid MPIRUN_PID RANK: the pid of world rank RANK among mpirun's children (empty when not started yet).
rank_pid() {
  local p
  for p in $(pgrep -P "$1"); do
    # (not a pipe: grep -q may end before tr has written the whole environment, and pipefail sees tr's SIGPIPE)
    grep -qx "OMPI_COMM_WORLD_RANK=$2" < <(tr '\0' '\n' < /proc/"$p"/environ 2> /dev/null) && { echo "$p"; return; }
  done
  return 0
}

# wait_gone PID SECONDS: wait until PID has exited; fails with MESSAGE after SECONDS.
wait_gone() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do kill -0 "$1" 2> /dev/null || return 0; sleep 0.1; done
  fail "$3"
}

# ranks_end STATUS NAME NP LOG CMD...: CMD (megatrain and its arguments, or a command that ends by running it) on
# NP ranks under mpirun, told to wait for every rank rather than end the job at the first non-zero status, each
# rank's exit status recorded; output in LOG. Fails unless mpirun ends within 120 s, every rank exits STATUS and
# nothing was aborted (a stop every rank agreed on: no "MPI_ABORT", no "stopping the job").
ranks_end() {
  local want=$1 name=$2 np=$3 log=$4 rc=0 statuses
  shift 4
  rm -f "$WORK/$name".status.*
  OMPI_MCA_orte_abort_on_non_zero_status=0 timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$np" \
    bash -c 'f=$1; shift; "$@"; echo $? > "$f.$OMPI_COMM_WORLD_RANK"' _ "$WORK/$name.status" "$@" > "$log" 2>&1 ||
    rc=$?
  [[ $rc -eq 0 ]] || { cat "$log"; fail "$name: mpirun exited $rc (124: timeout)"; }
  statuses=$(cat "$WORK/$name".status.* | sort -u | tr '\n' ' ')
  [[ $(ls "$WORK/$name".status.* | wc -l) -eq $np && $statuses == "$want " ]] ||
    { cat "$log"; fail "$name: each rank should exit $want: $(grep . "$WORK/$name".status.*)"; }
  ! grep -qE "MPI_ABORT|stopping the job" "$log" || { cat "$log"; fail "$name: not a clean stop (an abort)"; }
}
# stop_together NAME NP LOG CMD...: ranks_end with every rank exiting 1 (a failure every rank agreed on).
stop_together() { ranks_end 1 "$@"; }

# expect_refused WHAT PATTERN NP ARGS...: `megatrain ARGS` on NP ranks (1:
# without mpirun) exits 2 within 60 s with PATTERN (grep) in its output.
expect_refused() {
  local what=$1 pattern=$2 np=$3 rc log="$WORK/refused.log"
  shift 3
  set +e
  if [[ $np -eq 1 ]]; then timeout 60 "$MEGATRAIN" "$@" > "$log" 2>&1
  else timeout 60 mpirun --allow-run-as-root --oversubscribe -np "$np" "$MEGATRAIN" "$@" > "$log" 2>&1; fi
  rc=$?
  set -e
  [[ $rc -eq 2 ]] || { cat "$log"; fail "$what: expected exit 2, got $rc"; }
  grep -q -- "$pattern" "$log" || { cat "$log"; fail "$what: the message does not say why (expected: $pattern)"; }
  echo "$what: refused with exit 2"
}

# train_run RECIPE NAME NP SETTINGS...: `megatrain run RECIPE` into $WORK/NAME on NP ranks (mpirun when NP > 1,
# 180 s at most) with the test's COMMON settings, then SETTINGS; its output in $WORK/NAME.log, the tail shown
# when it fails.
train_run() {
  local recipe=$1 name=$2 np=$3
  shift 3
  local cmd=("$MEGATRAIN" run "$recipe" --set run.dir="$WORK/$name" "${COMMON[@]}" "$@")
  if [[ $np -gt 1 ]]; then cmd=(timeout 180 mpirun --allow-run-as-root --oversubscribe -np "$np" "${cmd[@]}"); fi
  "${cmd[@]}" > "$WORK/$name.log" 2>&1 || { tail -20 "$WORK/$name.log"; fail "$name: the run failed"; }
}

# loss_tracks WHAT REF RUN: the 100 logged losses of $WORK/RUN against $WORK/REF's: the mean of steps 81-100
# within 2%, and some step differs by more than 1e-3 (RUN does change the numbers). Prints the numbers.
loss_tracks() {
  paste <(json_field "$WORK/$2/metrics.jsonl" loss) <(json_field "$WORK/$3/metrics.jsonl" loss) | awk -v W="$1" '
    { n++; d = ($2 - $1) / $1; if (d < 0) d = -d; if (d > worst) worst = d; if (n > 80) { a += $1; b += $2 } }
    END { rel = (b - a) / a; if (rel < 0) rel = -rel
          printf "%s: mean loss of steps 81-100 %.4f vs %.4f (relative %.4f), largest step difference %.4f\n", W, b / 20, a / 20, rel, worst
          exit !(n == 100 && rel <= 0.02 && worst > 1e-3) }' || fail "$1: does not track within 2% (or equals it)"
}

# loss_tracks_seeds WHAT REF RUN SEED...: loss_tracks over several seeds: the runs $WORK/REF-SEED and $WORK/RUN-SEED;
# the mean over the seeds of each one's mean loss of steps 81-100 within 2%, and some step of some seed differing
# by more than 1e-3. One seed's 100 steps of a tiny model are chaotic (an fp32 difference of 1e-7 can flip an FP8
# rounding and send the curve elsewhere: one seed ended 2.5% from fp32 with OpenBLAS's Haswell kernels, 0.24%
# with its SkylakeX ones); the mean over seeds measures the precision, not the trajectory. Prints each seed.
loss_tracks_seeds() {
  local what=$1 ref=$2 run=$3 seed
  shift 3
  for seed in "$@"; do
    paste <(json_field "$WORK/$ref-$seed/metrics.jsonl" loss) <(json_field "$WORK/$run-$seed/metrics.jsonl" loss)
    echo "end $seed"
  done | awk -v W="$what" '
    $1 == "end" { if (n != 100) short = 1; seeds++; A += a / 20; Bm += b / 20
                  printf "  %s, seed %s: %.4f vs %.4f\n", W, $2, b / 20, a / 20; n = 0; a = 0; b = 0; next }
    { n++; d = ($2 - $1) / $1; if (d < 0) d = -d; if (d > worst) worst = d; if (n > 80) { a += $1; b += $2 } }
    END { rel = (Bm - A) / A; if (rel < 0) rel = -rel
          printf "%s: mean over %d seeds of the mean loss of steps 81-100 %.4f vs %.4f (relative %.4f), largest step difference %.4f\n", W, seeds, Bm / seeds, A / seeds, rel, worst
          exit !(!short && seeds > 0 && rel <= 0.02 && worst > 1e-3) }' || fail "$what: does not track within 2% (or equals it)"
}

# resume_exact RUN STEP LAST [NP]: `megatrain resume` of $WORK/RUN's checkpoint of step STEP (into
# $WORK/RUN-resumed, on NP ranks: 1) logs steps STEP+1..LAST as the uninterrupted run did, bit for bit (step, loss,
# lr, batch size, grad norm).
resume_exact() {
  local run=$1 step=$2 last=$3 np=${4:-1} ckpt
  ckpt=$(printf '%s/%s/checkpoints/iter_%07d' "$WORK" "$run" "$step")
  local cmd=("$MEGATRAIN" resume "$ckpt" --set run.dir="$WORK/$run-resumed")
  if [[ $np -gt 1 ]]; then cmd=(timeout 180 mpirun --allow-run-as-root --oversubscribe -np "$np" "${cmd[@]}"); fi
  "${cmd[@]}" > "$WORK/$run-resumed.log" 2>&1 ||
    { tail -5 "$WORK/$run-resumed.log"; fail "$run: the resume from step $step failed"; }
  local lines=()
  for dir in "$run" "$run-resumed"; do
    lines+=("$(grep -o '"step":[0-9]*,"loss":[^,]*,"lr":[^,]*,"global_batch_size":[^,]*,"grad_norm":[^,]*' \
      "$WORK/$dir/metrics.jsonl" | awk -F'[:,]' -v s="$step" '$2 > s')")
  done
  [[ $(wc -l <<< "${lines[1]}") -eq $((last - step)) && -n ${lines[1]} ]] ||
    fail "$run: the resumed run logged no steps $((step + 1))-$last"
  [[ ${lines[0]} == "${lines[1]}" ]] || fail "$run: the resumed run differs from the uninterrupted one"
}

# near_one_rank NAME FIELD EARLY TOL_EARLY TOL_LATE [STEPS]: $WORK/NAME's logged FIELD against $WORK/$ONE's (ONE:
# one), step by step, relative: steps 1..EARLY within TOL_EARLY, the later ones within TOL_LATE; STEPS (12) values.
near_one_rank() {
  local name=$1 field=$2
  paste <(json_field "$WORK/${ONE:-one}/metrics.jsonl" "$field") <(json_field "$WORK/$name/metrics.jsonl" "$field") |
    awk -v f="$field" -v L="$name" -v early="$3" -v te="$4" -v tl="$5" -v steps="${6:-12}" '
      { n++; d = ($2 - $1) / $1; if (d < 0) d = -d; tol = n <= early ? te : tl
        if (NF != 2 || !(d <= tol)) { printf "%s: step %d %s %s vs %s\n", L, n, f, $1, $2; bad = 1 } }
      END { exit !(n == steps && !bad) }' || fail "$name: $field is not the one-rank run's"
}

# cores: the cores this process may use (nproc without OMP_NUM_THREADS and OMP_THREAD_LIMIT, which it obeys).
cores() { env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc; }

# run_jobs FUNCTION ARG...: FUNCTION ARG for each ARG, as many at a time as the machine has cores (MT_JOBS: another
# number), each in a subshell of its own with errexit on (a fail or a failing command ends only that one) and its
# output kept apart; then each one's output in the order given, and the test fails naming the first that failed.
# For the emulator's test programs, which run their kernels on one core each (tests/gpu/emu/README.md).
run_jobs() {
  local fn=$1 max=${MT_JOBS:-$(cores)} i=0 arg bad=
  shift
  for arg in "$@"; do
    while (( $(jobs -rp | wc -l) >= max )); do wait -n || true; done
    ( set +e; ( set -e; "$fn" "$arg" ) > "$WORK/job$i.txt" 2>&1; echo $? > "$WORK/job$i.rc" ) &
    i=$((i + 1))
  done
  wait
  i=0
  for arg in "$@"; do
    cat "$WORK/job$i.txt"
    [[ -n $bad || $(cat "$WORK/job$i.rc") == 0 ]] || bad=$arg
    i=$((i + 1))
  done
  [[ -z $bad ]] || fail "$fn $bad"
}

# can_gpu_emu [mpirun]: skips (exit 77) where the CUDA build's CPU emulator cannot be built or run: off x86-64
# (its fibres switch stacks in x86-64 assembly), without g++ or the CUDA headers (and mpirun, when named).
# Holds OpenMP and OpenBLAS to one thread: the emulator's programs run side by side (run_jobs), one core each, and
# the CPU reference's threads spinning at their barriers took the core of the program beside them (test_gpu_emu:
# 179 s and 344 CPU-seconds with two threads, 130 s and 247 with one, on 2 cores).
can_gpu_emu() {
  export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
  [[ $(uname -m) == x86_64 ]] || { echo "skipped: the GPU emulator runs on x86-64 only"; exit 77; }
  command -v g++ > /dev/null || { echo "skipped: no g++"; exit 77; }
  [[ ${1:-} != mpirun ]] || command -v mpirun > /dev/null || { echo "skipped: no mpirun"; exit 77; }
  [[ -f "${CUDA_HOME:-/usr/local/cuda}/include/cuda_runtime_api.h" ]] || { echo "skipped: no CUDA headers"; exit 77; }
}

# need_gpu_emu [mpirun]: can_gpu_emu, then builds the emulator (make gpu-emu-build: build/emu).
need_gpu_emu() {
  can_gpu_emu "$@"
  # under a lock: run_tests.sh runs the emulator's tests side by side, and two makes of one target collide
  mkdir -p "$REPO/build"
  flock "$REPO/build/.gpu-emu-build.lock" make -C "$REPO" --no-print-directory -s -j"$(cores)" gpu-emu-build > /dev/null
}

# emu_run NAME NP RECIPE [--set ...]: 10 steps of recipes/tiny/RECIPE on the CUDA build's CPU emulator
# (build/emu/megatrain, tests/gpu/emu/README.md) on NP ranks, data $WORK/english (demo_data), into $WORK/NAME
# (log $WORK/NAME.txt). The emulator's switches (EMU_GPUS, EMU_STREAMS) come from the environment.
emu_run() {
  emu_try "$@" || { tail -20 "$WORK/$1.txt"; emu_messages "$WORK/$1.txt"; fail "$1 failed"; }
}
# emu_messages LOG: the emulator's and megatrain's own error lines of LOG, printed last (run_tests.sh shows a failed
# test's last 40 lines, which an aborting rank's backtrace and mpirun's notice can fill)
emu_messages() {
  grep -E "^(EMU|megatrain: |error)" "$1" | head -5 | sed 's/^/  => /' || true
}
# emu_try: emu_run's run, returning its exit status instead of failing the test.
emu_try() {
  local name=$1 np=$2 recipe=$3; shift 3
  local cmd=(build/emu/megatrain run "$REPO/recipes/tiny/$recipe.yaml" --set run.dir="$WORK/$name" --set run.device=cuda
             --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.steps=10
             --set optimizer.schedule.warmup_steps=2 --set train.eval_interval=100 --set precision=bf16 "$@")
  if [[ $np -eq 1 ]]; then "${cmd[@]}" > "$WORK/$name.txt" 2>&1
  else timeout -k 5 600 mpirun --allow-run-as-root --oversubscribe -np "$np" "${cmd[@]}" > "$WORK/$name.txt" 2>&1
  fi
}

# emu_tracks NAME REF LOG_LINE: $WORK/NAME.txt has LOG_LINE, and NAME's 10 losses are within 1e-3 of REF's (one
# GPU) and its grad norms within 0.5% relative (AdamW hides a gradient summed where it should be averaged; the norm
# shows it). Measured on the emulator, 2026-11-25: 2.8e-4 and 4.1e-4 at worst (tp 2's bf16 partial sums), against
# 3.1e-2 and 1.0 for the missing stream waits and the sum-for-average that the tests were tried on.
emu_tracks() {
  grep -q "$3" "$WORK/$1.txt" || fail "$1: no '$3' in its log"
  paste -d' ' <(json_field "$WORK/$2/metrics.jsonl" loss) <(json_field "$WORK/$1/metrics.jsonl" loss) \
    <(json_field "$WORK/$2/metrics.jsonl" grad_norm) <(json_field "$WORK/$1/metrics.jsonl" grad_norm) |
    awk -v name="$1" 'function abs(x) { return x < 0 ? -x : x }
      { d = abs($2 - $1); if (d > worst) worst = d; g = abs($4 - $3) / $3; if (g > gworst) gworst = g; n++ }
      END { printf "%s: 10 steps against one GPU, worst |loss difference| %.2e, worst grad norm %.2e relative\n",
                   name, worst, gworst
            exit !(n == 10 && worst < 1e-3 && gworst < 5e-3) }' || fail "$1 does not track the one-GPU run"
}

# late_bad_data PREFIX BAD_DOCS: a uint16 dataset whose first 2^24 tokens (4096 documents of 4096 tokens: the
# reach of the vocabulary check before the first step) are byte-level English, followed by BAD_DOCS documents of
# 4096 tokens in which every 8th token is 300, outside the tiny models' vocabulary of 256. The documents share
# their tokens (every good one points at the same bytes of .bin, every bad one at the same others, as an index may),
# so the files take a few kilobytes.
late_bad_data() {
  python3 - "$1" "$2" <<'PY'
import struct, sys
prefix, bad_docs = sys.argv[1], int(sys.argv[2])
n, good_docs = 4096, 4096
text = b"The quick brown fox jumps over the lazy dog; she sells sea shells by the sea shore. "
good = [text[i % len(text)] for i in range(n)]
bad = [300 if i % 8 == 7 else t for i, t in enumerate(good)]
with open(prefix + ".bin", "wb") as f:
    f.write(struct.pack("<%dH" % (2 * n), *(good + bad)))
docs = good_docs + bad_docs
with open(prefix + ".idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, docs, docs + 1))
    f.write(struct.pack("<%di" % docs, *([n] * docs)))
    f.write(struct.pack("<%dq" % docs, *([0] * good_docs + [2 * n] * bad_docs)))
    f.write(struct.pack("<%dq" % (docs + 1), *range(docs + 1)))
PY
}

# bigid_tokenizer DIR: writes DIR/tokenizer.json, the qwen2 fixture tokenizer with model.vocab padded by "<fN>"
# entries up to id 69999 and its added tokens moved to ids 70000..70005 (70006 ids: `data build` writes int32)
bigid_tokenizer() {
  local dir=$1 fix="$REPO/tests/fixtures/tokenizers/qwen2" count
  mkdir -p "$dir"
  count=$(grep -o '"id":[0-9]*,"content":"<|endoftext|>"' "$fix/tokenizer.json" | sed -E 's/"id":([0-9]*).*/\1/')
  awk -v from="$count" 'BEGIN { for (i = from; i < 70000; i++) printf "\"<f%d>\":%d,", i, i }' > "$dir/fillers"
  { sed 's/"vocab":{.*//' "$fix/tokenizer.json" | tr -d '\n'; printf '"vocab":{'; cat "$dir/fillers";
    sed 's/.*"vocab":{//' "$fix/tokenizer.json"; } |
    sed -E "s/\"id\":$count,/\"id\":70000,/; s/\"id\":$((count + 1)),/\"id\":70001,/; s/\"id\":$((count + 2)),/\"id\":70002,/;
            s/\"id\":$((count + 3)),/\"id\":70003,/; s/\"id\":$((count + 4)),/\"id\":70004,/; s/\"id\":$((count + 5)),/\"id\":70005,/" \
    > "$dir/tokenizer.json"
  rm -f "$dir/fillers"
}
