#!/usr/bin/env bash
# test_gpu_recipes.sh: the shipped GPU recipes (recipes/gpu/*.yaml) load and
# fit the machines their headers name: each recipe's `# plan: ARGS` line is
# run as `megatrain plan RECIPE ARGS`, which must exit 0 with no warning and
# end in "memory: fits:" (not "only barely"). The Llama 3 8B recipe's header
# says it does not fit an 80 GB H100: plan agrees. Plan reads no data, so the
# recipes' data paths need not exist.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO"
n=0
for recipe in recipes/gpu/*.yaml; do
  args=$(sed -n 's/^# plan: //p' "$recipe")
  [[ -n $args ]] || fail "$recipe: no '# plan: ARGS' line saying what it fits"
  # shellcheck disable=SC2086 # ARGS are words
  "$MEGATRAIN" plan "$recipe" $args > "$WORK/out" 2> "$WORK/err" || { cat "$WORK/err"; fail "$recipe: plan failed"; }
  [[ ! -s "$WORK/err" ]] || { cat "$WORK/err"; fail "$recipe: plan warned"; }
  last=$(tail -n 1 "$WORK/out")
  [[ $last == "memory: fits: "* ]] || fail "$recipe: plan $args: $last"
  echo "$recipe ($args): $last"
  n=$((n + 1))
done
(( n >= 2 )) || fail "expected the shipped GPU recipes, found $n"
"$MEGATRAIN" plan recipes/gpu/llama3-8b-h200.yaml --device-memory 79 > "$WORK/out" 2> /dev/null && fail "exit 0 but not fitting"
grep -q "^memory: does NOT fit" "$WORK/out" || fail "Llama 3 8B on 80 GB: $(tail -n 1 "$WORK/out")"
echo ok
