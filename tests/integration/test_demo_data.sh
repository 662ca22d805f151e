#!/usr/bin/env bash
# test_demo_data.sh: scripts/demo_data.sh run from another directory with a
# relative OUTPUT_PREFIX builds the data set there, where a recipe's relative
# data path (taken from the current directory) finds it, not under the
# checkout (it cd'ed to the checkout first, wrote data/demo/english there and
# printed "wrote: data/demo/english.bin", which the run then could not open);
# an absolute prefix is used as it is.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
rel="mt-demo-test-$$/english"
(cd "$WORK" && MEGATRAIN="$MEGATRAIN" bash "$REPO/scripts/demo_data.sh" "$rel") > "$WORK/out"
in_repo=$([[ -e "$REPO/mt-demo-test-$$" ]] && echo yes || echo no)
rm -rf "${REPO:?}/mt-demo-test-$$"
[[ $in_repo == no ]] || fail "demo_data.sh $rel from $WORK wrote under the checkout $REPO"
[[ -s "$WORK/$rel.bin" && -s "$WORK/$rel.idx" ]] || fail "demo_data.sh $rel from $WORK: no $WORK/$rel.{bin,idx}"
"$MEGATRAIN" data inspect "$WORK/$rel" --docs 0 > /dev/null || fail "$WORK/$rel is not a readable data set"
(cd / && MEGATRAIN="$MEGATRAIN" bash "$REPO/scripts/demo_data.sh" "$WORK/abs/english") > /dev/null
[[ -s "$WORK/abs/english.bin" ]] || fail "demo_data.sh $WORK/abs/english: no $WORK/abs/english.bin"
cmp -s "$WORK/$rel.bin" "$WORK/abs/english.bin" || fail "the relative and absolute builds differ"
echo "ok"
