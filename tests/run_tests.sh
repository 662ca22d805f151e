#!/usr/bin/env bash
# run_tests.sh: runs every CI test (unit programs in build/tests, or MT_UNIT_DIR, then
# tests/integration/test_*.sh) and ends with one "N passed, N failed, N skipped"
# line. A test that exits 77 is counted as skipped.
# Usage: bash tests/run_tests.sh [NAME_FILTER]
# The tests run side by side, as many at a time as the machine has cores (MT_TEST_JOBS: another number; 1 runs them
# one after another), each line printed when its test ends. Every test works in a directory of its own (lib.sh's
# WORK); the emulator's build, which several share, is made under a lock (lib.sh's need_gpu_emu). A test whose
# header holds the line
# "# run_tests.sh: alone" (it rebuilds what the others run) runs first, with nothing beside it; one holding
# "# run_tests.sh: early" (the longest, about minutes) starts before the rest, so that no long one starts last.
set -u
cd "$(dirname "$0")/.."
export MEGATRAIN="${MEGATRAIN:-$PWD/build/megatrain}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
# OpenMP's threads sleep at a barrier rather than spin: beside another test, a spinning thread takes the core that
# test needs (test_sft_packed_runs alone: 25.3 s and 35.9 CPU-seconds spinning, 22.7 and 32.7 asleep)
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
# The fp32 tolerances of a few tests hold where OpenBLAS's sgemm gives each output row the same bits whatever the
# number of rows, as its Nehalem kernels do on every shape tests/blas_rows.c tries and its SkylakeX kernels on all
# but some A B^T shapes (their small-matrix path sums each product in one order; the tests pass on both). With
# its Haswell kernels, which OpenBLAS 0.3.21 picks on AVX2 CPUs (and which one sets on a CPU it does not know, such
# as AMD Zen 5: this project's machines do), the blocking depends on the shape: a packed row's gradients then
# differ from its samples' by 1.1e-6 relative (test_packing: 1e-6) and an fp8 trajectory by 2e-5 at step 2 on tp 2
# (test_fp8: 1e-6). So the tests run on the SkylakeX kernels where the CPU has AVX-512 and on the Nehalem kernels
# (SSE, any x86-64; about 1.5x slower) elsewhere, unless OPENBLAS_CORETYPE names another core than Haswell;
# megatrain itself keeps OpenBLAS's choice. On aarch64 (Grace Hopper) OpenBLAS's own choice stands: each of its
# arm64 kernel sets (0.3.21: ARMV8, Cortex-A57/A72, Neoverse N1/V1/N2, ThunderX2; measured under qemu) gives
# every product of tests/blas_rows.c with K up to 512 the same bits per row (1,044 of 16,080 differ, all at K 1000).
if [[ "${OPENBLAS_CORETYPE:-Haswell}" == [Hh][Aa][Ss][Ww][Ee][Ll][Ll] && $(uname -m) == x86_64 ]]; then
  if grep -qw avx512f /proc/cpuinfo 2>/dev/null && grep -qw avx512bw /proc/cpuinfo && grep -qw avx512dq /proc/cpuinfo &&
     grep -qw avx512vl /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=SKYLAKEX
  else
    export OPENBLAS_CORETYPE=NEHALEM
  fi
fi
filter="${1:-}"
jobs=${MT_TEST_JOBS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "MT_TEST_JOBS=$jobs: expected a number of tests at a time, 1 or more" >&2; exit 2; }
passed=0; failed=0; skipped=0; failed_names=()
logdir=$(mktemp -d)
declare -A running=()  # pid -> the test's number (its files in $logdir) and name: a unit program and an integration
                       # script may share a name (test_fp8, test_moe)

# report N NAME: counts and prints the test NAME that ended (its status and wall seconds in $logdir/N.rc, its
# processor time in N.times, its output in N.log)
report() {
  local n=$1 name=$2 rc secs cpu
  read -r rc secs < "$logdir/$n.rc"
  cpu=$(cpu_seconds "$logdir/$n.times")
  if [[ $rc -eq 0 ]]; then
    passed=$((passed + 1)); printf 'PASS  %-40s %3ds  (cpu %ds)\n' "$name" "$secs" "$cpu"
  elif [[ $rc -eq 77 ]]; then   # the test said it cannot run here (exit 77)
    skipped=$((skipped + 1)); printf 'SKIP  %-40s %s\n' "$name" "$(tail -n 1 "$logdir/$n.log")"
  else
    failed=$((failed + 1)); failed_names+=("$name")
    printf 'FAIL  %-40s %3ds  (cpu %ds)\n' "$name" "$secs" "$cpu"
    sed 's/^/      | /' "$logdir/$n.log" | tail -n 40
  fi
}
# cpu_seconds FILE: the processor seconds (user and system), whole, of the children in FILE (what `times` printed in
# the test's shell: its second line, "1m2.345s 0m0.678s"): what a test costs the machine, where its wall seconds
# beside the others say little
cpu_seconds() {
  awk 'NR == 2 { split($0, f, /[ ms]+/); printf "%d", f[1] * 60 + f[2] + f[3] * 60 + f[4] + 0.5 }' "$1"
}
# reap: waits for one running test to end and reports it
reap() {
  local pid
  wait -n -p pid "${!running[@]}" || true
  report ${running[$pid]}
  unset "running[$pid]"
}
# start N NAME CMD...: runs CMD in the background as the test NAME (number N) once fewer than $jobs tests run
start() {
  local n=$1 name=$2; shift 2
  while (( ${#running[@]} >= jobs )); do reap; done
  ( s=$SECONDS; "$@" > "$logdir/$n.log" 2>&1; rc=$?; times > "$logdir/$n.times"
    echo "$rc $((SECONDS - s))" > "$logdir/$n.rc" ) &
  running[$!]="$n $name"
}
drain() { while (( ${#running[@]} > 0 )); do reap; done; }

alone=(); early=(); rest=()
for t in "${MT_UNIT_DIR:-build/tests}"/test_*; do
  [[ -x "$t" ]] && rest+=("run|$(basename "$t")|$t")
done
for t in tests/integration/test_*.sh; do
  [[ -f "$t" ]] || continue
  entry="$(basename "$t" .sh)|$t"
  if grep -q '^# run_tests.sh: alone' "$t"; then alone+=("alone|$entry")
  elif grep -q '^# run_tests.sh: early' "$t"; then early+=("run|$entry")
  else rest+=("run|$entry"); fi
done
n=0
for entry in "${alone[@]}" "${early[@]}" "${rest[@]}"; do
  IFS='|' read -r kind name path <<< "$entry"
  [[ -n "$filter" && "$name" != *"$filter"* ]] && continue
  n=$((n + 1))
  if [[ $path == *.sh ]]; then start $n "$name" bash "$path"; else start $n "$name" "$path"; fi
  [[ $kind != alone ]] || drain
done
drain

rm -rf "$logdir"
echo
[[ $failed -gt 0 ]] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 && $passed -gt 0 ]]
