#!/usr/bin/env bash
# test_cli_options.sh: an option a command does not know (src/core/cli.c):
# every command exits 2 naming it and, for a typo, the option meant (one
# dash short, '_' for '-', a letter off or two: read from the command's own
# usage's synopsis and option table, so a new option is suggested without a
# list to keep, and not one its examples or prose name for another command),
# then its synopsis and where --help is, not the whole help text that buried
# the error; an option nothing is near gets no suggestion; long arguments.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
# typo COMMAND... -- BAD MEANT: `megatrain COMMAND... BAD` exits 2, its first line the error naming BAD and MEANT
typo() {
  local cmd=() rc=0
  while [[ $1 != -- ]]; do cmd+=("$1"); shift; done
  local bad=$2 meant=$3 name=${cmd[0]}
  [[ $name == data ]] && name="data ${cmd[1]}"
  "$MEGATRAIN" "${cmd[@]}" "$bad" > "$WORK/out.txt" 2>&1 || rc=$?
  [[ $rc -eq 2 ]] || fail "$name $bad: exit $rc, expected 2: $(cat "$WORK/out.txt")"
  local want="megatrain: error: $name: unknown option '$bad'"
  [[ -n $meant ]] && want+=" (did you mean $meant?)"
  [[ $(head -n 1 "$WORK/out.txt") == "$want" ]] || fail "$name $bad: first line '$(head -n 1 "$WORK/out.txt")', expected '$want'"
  grep -q "^usage: megatrain $name" "$WORK/out.txt" || fail "$name $bad: no synopsis: $(cat "$WORK/out.txt")"
  [[ $(tail -n 1 "$WORK/out.txt") == "run \`megatrain $name --help\` for the options" ]] ||
    fail "$name $bad: the last line does not say where --help is: $(tail -n 1 "$WORK/out.txt")"
  (( $(wc -l < "$WORK/out.txt") <= 6 )) || fail "$name $bad: more than the synopsis: $(cat "$WORK/out.txt")"
  echo "$name $bad -> ${meant:-(none)}"
}
R=$REPO/recipes/tiny/llama.yaml
typo run "$R" -- --resume-if-exist --resume-if-exists
typo run "$R" -- -resume-if-exists --resume-if-exists
typo run "$R" -- --resume_if_exists --resume-if-exists
typo run "$R" -- --frobnicate ""
typo resume "$WORK/none" -- --sett --set
typo plan "$R" -- --device-memmory --device-memory
typo plan "$R" -- --word=8 --world
typo eval "$WORK/none" -- --batch --batches
typo eval "$WORK/none" -- --micro_batch_size=2 --micro-batch-size
typo convert "$WORK/a" "$WORK/b" -- --merge_lora --merge-lora
typo convert "$WORK/a" "$WORK/b" -- --drop-expert-biases --drop-expert-bias
typo data build --input x --output y -- --inptu --input
typo data inspect "$WORK/none" -- --doc --docs
typo inspect "$WORK/none" -- --jsn ""
# only the command's own options: run's help names plan's --world in an example and eval's prose data build's
# --format, which neither command takes
typo run "$R" -- --wrld ""
typo eval "$WORK/none" -- --formt ""
# the longest argument compared (63 bytes, one dash short: the dash added must fit) and a longer one
typo run "$R" -- "-$(printf 'a%.0s' $(seq 62))" ""
typo run "$R" -- "--$(printf 'a%.0s' $(seq 100))" ""
echo "passed: unknown options named with the one meant, the synopsis and --help"
