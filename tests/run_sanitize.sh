#!/usr/bin/env bash
# run_sanitize.sh: every CI test (tests/run_tests.sh) against build/sanitize, megatrain and the unit
# programs built with AddressSanitizer, LeakSanitizer and UndefinedBehaviorSanitizer (`make
# test-sanitize` builds them, then runs this). Every process, each mpirun rank included, writes its
# reports under one folder; the run fails when a test fails or any report exists, and prints them.
# Open MPI's own allocations at exit are not ours: tests/sanitize/lsan.supp leaves them out, and
# nothing else. Not part of `make test` (about 20 minutes on 2 cores against 7).
# Usage: bash tests/run_sanitize.sh [NAME_FILTER]
set -u
cd "$(dirname "$0")/.."
[[ -x build/sanitize/megatrain && -f build/sanitize/keep_plugins.so ]] || { echo "run_sanitize.sh: no build/sanitize/megatrain: run make test-sanitize"; exit 2; }
reports=$(mktemp -d)
export MEGATRAIN=$PWD/build/sanitize/megatrain MT_UNIT_DIR=build/sanitize/tests MT_SANITIZE=1
# fast_unwind_on_malloc=0: whole allocation stacks through libraries built without frame pointers (Open
# MPI's), so that the suppressions see them.
# intercept_tls_get_addr=0: the sanitizer runtime of GCC 12 (and up to GCC 13 / LLVM 16) takes some of glibc's
# dynamic TLS blocks for glibc 2.19's, reads a bogus range from them and LeakSanitizer's tracer crashes at exit
# ("LeakSanitizer has encountered a fatal error", exit 1, no report): test_lora's 8-rank run did so in 4 of 5 runs,
# none of 4 with it.
export ASAN_OPTIONS=detect_leaks=1:intercept_tls_get_addr=0:fast_unwind_on_malloc=0:verify_asan_link_order=0:log_path=$reports/asan
# Open MPI unloads its plugins at MPI_Finalize, and their leaks would then have no names to suppress
# by: keep_plugins.so (tests/sanitize/keep_plugins.c) keeps them loaded; put before the sanitizer's
# runtime, it needs verify_asan_link_order=0.
export LD_PRELOAD=$PWD/build/sanitize/keep_plugins.so
export LSAN_OPTIONS=suppressions=$PWD/tests/sanitize/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan
bash tests/run_tests.sh "$@"
status=$?
# A report says ERROR (ASan, LSan) or "runtime error" (UBSan). A test's forked child that exits from a
# threaded parent leaves only LSan's warning "Running thread N was not suspended", which is none.
found=$(grep -l -E 'ERROR: |runtime error' -r "$reports" | sort)
if [[ -n $found ]]; then
  echo
  echo "sanitizer reports ($(wc -l <<< "$found")):"
  for f in $found; do echo "== $f"; head -n 60 "$f"; done
  status=1
else
  echo "no sanitizer reports"
fi
# Anything else the sanitizers wrote (LeakSanitizer's "fatal error" when it cannot stop a process's threads, which
# exits 1 with no report), but for the forked children's warning above: shown, so that a test failing on it says why.
other=$(grep -L -E 'ERROR: |runtime error' -r "$reports" | sort)
for f in $other; do
  grep -q -v 'Running thread [0-9]* was not suspended' "$f" && { echo "== sanitizer output in $f:"; head -n 20 "$f"; }
done
rm -rf "$reports"
exit $status
