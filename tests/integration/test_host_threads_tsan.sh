#!/usr/bin/env bash
# test_host_threads_tsan.sh: megatrain's own threads under ThreadSanitizer
# (make tsan-build: build/tsan/megatrain). Two parts of megatrain run
# threads of their own: the asynchronous checkpoint writer (checkpoint.async,
# src/ckpt/ckpt_async.c), which compresses and writes while training goes
# on, and `data build --workers N` (src/data/build_pipeline.c), whose workers
# tokenize batches that the reader hands out and the writer takes back in
# order. The integration tests that drive them run again on that binary:
#   - test_resume_options (async saves, one of them failing in the writer),
#     test_ckpt_kill (async and sync saves killed midway), test_resume (its
#     async saves, resumes and SIGTERM: MT_SANITIZE=1 leaves out the rest);
#   - test_data_build (a FIFO build stopped by signals), test_data_build_sft,
#     test_data_build_tokenizer, test_data_build_scale (--workers 1, 3 and
#     7 give the same bytes, on its text input; its address-space limits are skipped, as under
#     the other sanitizers: ThreadSanitizer reserves terabytes);
# each must pass with no ThreadSanitizer report (a save that no longer
# waits for the writer before refilling the snapshot, planted by hand, was
# reported in test_ckpt_kill, at the copy and at the writer's read). OpenMP's threads (the CPU
# ops) are held to one: libgomp synchronises in code the sanitizer does not
# see. Runs under mpirun are left out (Open MPI's own threads).
# run_tests.sh: early (about 5 minutes on 2 cores)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO"
make --no-print-directory -s -j"$(cores)" tsan-build > "$WORK/build.txt" 2>&1 ||
  { tail -20 "$WORK/build.txt"; fail "build"; }
unset LD_PRELOAD
export MEGATRAIN=$REPO/build/tsan/megatrain MT_SANITIZE=1 OMP_NUM_THREADS=1
threaded() {  # threaded TEST: an integration test passes on the ThreadSanitizer build, with no report in its own folder
  local t=$1 start=$SECONDS
  mkdir -p "$WORK/reports/$t"
  TSAN_OPTIONS="log_path=$WORK/reports/$t/tsan:halt_on_error=0" bash "tests/integration/$t.sh" > "$WORK/$t.txt" 2>&1 ||
    { tail -20 "$WORK/$t.txt"; fail "$t on the ThreadSanitizer build"; }
  if compgen -G "$WORK/reports/$t/tsan*" > /dev/null; then
    head -60 "$WORK/reports/$t"/tsan*
    fail "$t: a ThreadSanitizer report"
  fi
  echo "$t under ThreadSanitizer: passed, no report ($((SECONDS - start)) s)"
}
# side by side, the longest first (each runs megatrain with one OpenMP thread)
run_jobs threaded test_resume test_data_build_scale test_resume_options test_ckpt_kill test_data_build_tokenizer \
  test_data_build test_data_build_sft
echo ok
