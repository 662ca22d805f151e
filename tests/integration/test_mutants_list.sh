#!/usr/bin/env bash
# test_mutants_list.sh: every mutant of tests/mutants/mutants.txt still plants
# its bug in the tree as it reads now (its line once in its file, or its sed
# changing one line) and names tests that exist (`run_mutants.sh --check`: no
# build). `make mutants` is not in CI, so without this a change to a mutated
# line left its mutant reporting NOT APPLIED until someone ran it (eight had
# gone stale by 2026-12-01). And the check notices: a list whose mutant names
# a line no longer there, a file that moved and a test that does not exist
# fails, naming each.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
out=$(bash "$REPO/tests/mutants/run_mutants.sh" --check 2>&1) || fail "stale mutants: $out"
grep -q "^run_mutants.sh --check: [0-9]* mutants, 0 stale$" <<< "$out" || fail "no verdict line: $out"

cat > "$WORK/list.txt" <<'LIST'
name: gone-line
file: src/model/optimizer.c
line: this line is in no file
replace: x
tests: test_optimizer

name: moved-file
file: src/nowhere/optimizer.c
line: x
replace: y
tests: test_optimizer

name: no-such-test
file: src/model/optimizer.c
sed: 1s/^/\/\/ /
tests: test_no_such_thing
LIST
rc=0
out=$(MUTANTS_LIST="$WORK/list.txt" bash "$REPO/tests/mutants/run_mutants.sh" --check 2>&1) || rc=$?
[[ $rc -eq 1 ]] || fail "a stale list: exit $rc, expected 1: $out"
for want in "STALE  gone-line: src/model/optimizer.c: the line is not in the file exactly once" \
            "STALE  moved-file: src/nowhere/optimizer.c: no file src/nowhere/optimizer.c" \
            "STALE  no-such-test: no test 'test_no_such_thing'" "3 mutants, 3 stale"; do
  grep -qF "$want" <<< "$out" || fail "the check does not say '$want': $out"
done
echo "passed: every mutant applies to the tree; a stale list is named"
