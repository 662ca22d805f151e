#!/usr/bin/env bash
# test_missing_paths.sh: a path named on the command line (a command's
# argument or an option's value) that does not exist is a usage error for
# every command: exit 2, the message naming the path (README, "Exit
# status"). inspect, resume, eval and convert exited 1 where run, plan and
# data inspect exited 2. A file where a directory is expected is usage too
# (convert said so already); a directory without checkpoints stays a
# failure (exit 1), as the contents of a path that is there, and so does a
# path stat(2) cannot read for another reason (a loop of links, no
# permission: convert, eval, resume, inspect and data exited 2).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

# missing STATUS PATH CMD...: `megatrain CMD...` exits STATUS and its message names PATH
missing() {
  local want=$1 path=$2 rc=0; shift 2
  "$MEGATRAIN" "$@" > "$WORK/out.txt" 2>&1 || rc=$?
  [[ $rc -eq $want ]] || fail "megatrain $*: exit $rc, expected $want: $(cat "$WORK/out.txt")"
  grep -q "^megatrain: error: .*$path" "$WORK/out.txt" ||
    fail "megatrain $*: the error does not name $path: $(cat "$WORK/out.txt")"
  echo "megatrain $1 ...: exit $rc naming $path"
}

N=$WORK/nothere
ln -s loopdata.idx "$WORK/loopdata.idx" # a dataset's index that cannot be read (a link to itself)
# what the commands that take one read: a checkpoint (converted from a fixture), a dataset, a text file
"$MEGATRAIN" convert "$REPO/tests/fixtures/hf/llama_tied" "$WORK/ckpt" > /dev/null 2>&1
printf 'hello world\nsecond line\n' > "$WORK/in.txt"
"$MEGATRAIN" data build --input "$WORK/in.txt" --output "$WORK/data" --tokenizer byte > /dev/null

missing 2 "$N/recipe.yaml" run "$N/recipe.yaml"
missing 2 "$N/recipe.yaml" plan "$N/recipe.yaml"
missing 2 "$N/run" resume "$N/run"
missing 2 "$N/run" inspect "$N/run"
missing 2 "$N/run" eval "$N/run" --data "$WORK/data"
missing 2 "$N/data" eval "$WORK/ckpt" --data "$N/data" --seq-len 16
# ... said before the checks of the options and the model (a --seq-len above the model's positions was said instead)
missing 2 "eval: --data: $N/data.idx: cannot open: No such file or directory" eval "$WORK/ckpt" --data "$N/data" \
  --seq-len 1000000
missing 1 "eval: --data: $WORK/loopdata.idx: cannot open: Too many levels of symbolic links" \
  eval "$WORK/ckpt" --data "$WORK/loopdata" --seq-len 16
missing 2 "$N/hf" convert "$N/hf" "$WORK/out"
[[ ! -e $WORK/out ]] || fail "convert of a missing SRC wrote DST"
missing 2 "$N/data" data inspect "$N/data"
missing 2 "$N/tokenizer" data inspect "$WORK/data" --tokenizer "$N/tokenizer"
missing 2 "$N/in.txt" data build --input "$N/in.txt" --output "$WORK/built"
missing 2 "$N/tokenizer" data build --input "$WORK/in.txt" --output "$WORK/built" --tokenizer "$N/tokenizer"
[[ -z $(ls -d "$WORK/built"* 2> /dev/null) ]] || fail "data build with a missing path wrote output"

# a file where a directory is expected: usage as well, for each command that takes a checkpoint or model directory
missing 2 "$WORK/in.txt" resume "$WORK/in.txt"
missing 2 "$WORK/in.txt" inspect "$WORK/in.txt"
missing 2 "$WORK/in.txt" eval "$WORK/in.txt" --data "$WORK/data"
missing 2 "$WORK/in.txt" convert "$WORK/in.txt" "$WORK/out"
# a directory that is there but holds no checkpoint: what it holds is wrong, not the command line (exit 1)
mkdir "$WORK/empty"
missing 1 "$WORK/empty" resume "$WORK/empty"
missing 1 "$WORK/empty" inspect "$WORK/empty"
missing 1 "$WORK/empty" eval "$WORK/empty" --data "$WORK/data"
missing 1 "$WORK/empty" convert "$WORK/empty" "$WORK/out"
echo "a missing path on the command line: exit 2 naming it, for every command"
# a path that is there but cannot be read (stat fails with another error than ENOENT / ENOTDIR: here ELOOP, a link
# to itself, which root meets as well; EACCES alike): a failure (exit 1) saying why, not a usage error
ln -s loop "$WORK/loop"
missing 1 "$WORK/loop: Too many levels of symbolic links" convert "$WORK/loop" "$WORK/out"
missing 1 "$WORK/loop: cannot read the checkpoint directory (Too many levels of symbolic links)" \
  eval "$WORK/loop" --data "$WORK/data"
[[ ! -e $WORK/out ]] || fail "convert of an unreadable SRC wrote DST"
missing 1 "$WORK/loop: cannot read it: Too many levels of symbolic links" resume "$WORK/loop"
missing 1 "$WORK/loop: cannot read it: Too many levels of symbolic links" inspect "$WORK/loop"
missing 1 "$WORK/loop: Too many levels of symbolic links" data build --input "$WORK/loop" --output "$WORK/built"
[[ -z $(ls -d "$WORK/built"* 2> /dev/null) ]] || fail "data build with an unreadable input wrote output"
missing 1 "$WORK/loopdata.idx" data inspect "$WORK/loopdata"
echo "a command-line path that cannot be read: exit 1 with the reason (convert, eval, resume, inspect, data)"
