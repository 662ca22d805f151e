#!/usr/bin/env bash
# test_layers.sh: every include under src/ points down the layers
# (scripts/check_layers.sh, docs/architecture.md), and the check notices when
# one does not: copies of src/ with a backend file including the model, a core
# header including the recipe config, a model file including the training
# loop and a checkpoint file including a new training header each fail,
# naming the file and line; a known exception that no longer occurs fails too.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bash "$REPO/scripts/check_layers.sh" || fail "the tree breaks the include rule"

# plant FILE LINE_PATTERN INCLUDE EXPECTED: a copy of src/ with INCLUDE added after the first line of FILE that
# matches LINE_PATTERN must fail the check with EXPECTED in its output.
plant() {
  local file=$1 pattern=$2 include=$3 expected=$4
  rm -rf "$WORK/src"; cp -r "$REPO/src" "$WORK/src"
  grep -q "$pattern" "$WORK/src/$file" || fail "plant: no '$pattern' in src/$file"
  awk -v p="$pattern" -v inc="#include \"$include\"" '{ print } !done && index($0, p) { print inc; done = 1 }' \
    "$REPO/src/$file" > "$WORK/src/$file"
  if bash "$REPO/scripts/check_layers.sh" "$WORK/src" > "$WORK/out" 2>&1; then fail "the check passed src/$file including $include"; fi
  grep -qF "$expected" "$WORK/out" || { cat "$WORK/out"; fail "the check did not say '$expected'"; }
}
plant backend/cpu/cpu_rope.c '#include "cpu_ops.h"' ../../model/model.h "src/backend/cpu/cpu_rope.c:12: backend -> model"
plant core/fs.h '#include <stddef.h>' ../config/recipe.h "core -> config"
plant model/model_forward.c '#include "model_parallel.h"' ../train/train_state.h "model -> train"
plant ckpt/ckpt_reader.c '#include "ckpt_reader.h"' ../train/metrics.h "ckpt -> train"
plant dist/zero1.c '#include "zero1.h"' ../model/model.h "dist -> model"

# a listed exception lets its include through; one that no longer occurs must leave the list
rm -rf "$WORK/src"; cp -r "$REPO/src" "$WORK/src"
echo '#include "../train/train_state.h"' >> "$WORK/src/ckpt/ckpt_fs.h"
CHECK_LAYERS_EXCEPTIONS="ckpt/ckpt_fs.h train/train_state.h" bash "$REPO/scripts/check_layers.sh" "$WORK/src" \
  > "$WORK/out" 2>&1 || { cat "$WORK/out"; fail "a listed exception was refused"; }
if CHECK_LAYERS_EXCEPTIONS="ckpt/ckpt_fs.h train/train_state.h;ckpt/ckpt_api.c train/train.h" \
  bash "$REPO/scripts/check_layers.sh" "$WORK/src" > "$WORK/out" 2>&1; then fail "a stale exception passed"; fi
grep -q "exception no longer needed.*ckpt/ckpt_api.c train/train.h" "$WORK/out" || { cat "$WORK/out"; fail "no stale-exception message"; }
echo ok
