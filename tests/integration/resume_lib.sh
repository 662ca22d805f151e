# resume_lib.sh: what test_resume_options.sh, test_resume_requeue.sh and test_run_dir.sh share (sourced after
# lib.sh and demo_data "$WORK/english").
# run DIR STEPS [--set ...]: tiny llama into DIR for STEPS steps, a checkpoint every 10 (the last 3 kept), the lr
# decaying over 30 steps after 5 of warmup, no evaluation (with EXEC=exec, megatrain replaces the shell: for
# signals to reach it).
run() {
  local dir=$1 steps=$2; shift 2
  ${EXEC:-} "$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$dir" --set train.steps="$steps" \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set logging.interval=1 --set train.eval_interval=0 \
    --set checkpoint.interval=10 --set checkpoint.keep_last=3 --set optimizer.schedule.decay_steps=30 \
    --set optimizer.schedule.warmup_steps=5 "$@"
}
losses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$1/metrics.jsonl"; }
# expect STATUS PATTERN CMD...: CMD exits with STATUS and prints PATTERN (its output in $WORK/out.log).
expect() {
  local want=$1 pattern=$2 status=0; shift 2
  "$@" > "$WORK/out.log" 2>&1 || status=$?
  [[ $status -eq $want ]] || fail "$*: exit $status, expected $want: $(tail -n 3 "$WORK/out.log")"
  grep -q -- "$pattern" "$WORK/out.log" || fail "$*: output lacks '$pattern': $(tail -n 3 "$WORK/out.log")"
}
