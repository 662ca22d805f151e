#!/usr/bin/env bash
# test_install.sh: `make install` (DESTDIR and PREFIX as make's convention has them) puts an executable megatrain
# in PREFIX/bin, the program make built, and it runs from there (`--version`, a `plan` of a shipped recipe: the
# libraries it links are found without the build tree).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
# (make install copies the plain build, build/megatrain, which a sanitizer run does not test)
[[ ${MT_SANITIZE:-0} != 1 ]] || { echo "the sanitizer run tests build/sanitize, not what make install copies"; exit 77; }
cd "$REPO"
make --no-print-directory install DESTDIR="$WORK/root" PREFIX=/opt/mt > "$WORK/install.log" 2>&1 ||
  fail "make install: $(tail -n 5 "$WORK/install.log")"
bin="$WORK/root/opt/mt/bin/megatrain"
[[ -x $bin ]] || fail "make install left no executable at $bin: $(find "$WORK/root" | head)"
cmp -s "$bin" build/megatrain || fail "$bin is not build/megatrain"
[[ $(cd / && "$bin" --version) == "$(build/megatrain --version)" ]] || fail "the installed megatrain's --version differs"
(cd "$WORK" && "$bin" plan "$REPO/recipes/tiny/llama.yaml" > plan.txt) || fail "the installed megatrain cannot plan"
grep -q "^memory:" "$WORK/plan.txt" || fail "plan from the installed megatrain: $(tail -n 3 "$WORK/plan.txt")"
echo "make install: $bin runs"
