#!/usr/bin/env bash
# run_mutants.sh: mutation testing (`make mutants`; not part of CI). Plants
# each one-line bug of tests/mutants/mutants.txt in turn into a scratch copy
# of the tree (build/mutants/tree: the working tree's tracked and untracked,
# not ignored, files; the working tree itself is never changed), builds
# there, runs only the tests the list names for that mutant and reports it
# killed (a test failed or timed out; the report names which, and any listed
# test that still passed) or survived (they all passed). First
# the unmutated copy must build and pass every test named (else exit 2).
# Exit status 0 when every mutant was killed, 1 when one survived or did not
# apply or build (the list has gone stale), 2 on a usage or setup error.
#
# Usage: bash tests/mutants/run_mutants.sh [NAME_FILTER]   (mutants whose name contains it)
#        bash tests/mutants/run_mutants.sh --check [NAME_FILTER]: only that each mutant still applies to the
#        working tree (its line once in its file, or its sed changing one line) and names tests that exist; no
#        build, a second or two: exit 1 naming the stale ones (test_mutants_list.sh runs it in CI, so that a
#        change to a mutated line updates the list with it)
# Environment: MUTANTS_LIST (default tests/mutants/mutants.txt), MUTANTS_DIR
# (default build/mutants), MUTANTS_TEST_TIMEOUT (seconds per test, 600),
# MUTANTS_JOBS (make -j, 2). The scratch copy is kept between runs (its
# build is incremental); the table is also written to MUTANTS_DIR/report.txt.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LIST=${MUTANTS_LIST:-$REPO/tests/mutants/mutants.txt}
SCRATCH=${MUTANTS_DIR:-$REPO/build/mutants}
TREE=$SCRATCH/tree
LOGS=$SCRATCH/logs
CHECK=0
[[ ${1:-} == --check ]] && { CHECK=1; shift; }
FILTER=${1:-}
TEST_TIMEOUT=${MUTANTS_TEST_TIMEOUT:-600}
JOBS=${MUTANTS_JOBS:-2}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export MT_TEST_VENV=${MT_TEST_VENV:-$REPO/build/test-venv} # the tests that need Python share the tree's venv
unset MAKEFLAGS MFLAGS MAKELEVEL                              # make here is not a sub-make of `make mutants`

die() { echo "run_mutants.sh: $*" >&2; exit 2; }
[[ -f $LIST ]] || die "no list $LIST"

# ---- the list ----
names=() files=() finds=() repls=() seds=() tests=()
add_record() {
  [[ -z ${r_name:-}${r_file:-}${r_tests:-}${r_line:-}${r_sed:-} ]] && return
  local where="$LIST: the record ending at line $lineno"
  [[ -n ${r_name:-} && -n ${r_file:-} && -n ${r_tests:-} ]] || die "$where: needs name, file and tests"
  if [[ -n ${r_sed:-} ]]; then
    [[ -z ${r_line:-} && -z ${r_replace+x} ]] || die "$where ($r_name): give either sed or line + replace"
  else
    [[ -n ${r_line:-} && -n ${r_replace+x} ]] || die "$where ($r_name): needs line and replace (or sed)"
  fi
  local n
  for n in "${names[@]}"; do [[ $n != "$r_name" ]] || die "$where: the name $r_name appears twice"; done
  names+=("$r_name") files+=("$r_file") finds+=("${r_line:-}") repls+=("${r_replace:-}") seds+=("${r_sed:-}")
  tests+=("$r_tests")
  unset r_name r_file r_line r_replace r_sed r_tests
}
lineno=0
while IFS= read -r text || [[ -n $text ]]; do
  lineno=$((lineno + 1))
  [[ $text =~ ^[[:space:]]*# ]] && continue
  if [[ $text =~ ^[[:space:]]*$ ]]; then add_record; continue; fi
  key=${text%%:*} value=${text#*:}
  value=${value#"${value%%[![:space:]]*}"}  # leading blanks
  case $key in
    name) r_name=$value ;; file) r_file=$value ;; line) r_line=$value ;; replace) r_replace=$value ;;
    sed) r_sed=$value ;; tests) r_tests=$value ;;
    *) die "$LIST:$lineno: unknown key '$key' (expected name, file, line, replace, sed, tests)" ;;
  esac
done < "$LIST"
add_record

selected=()
for i in "${!names[@]}"; do [[ -z $FILTER || ${names[i]} == *"$FILTER"* ]] && selected+=("$i"); done
[[ ${#selected[@]} -gt 0 ]] || die "no mutant's name contains '$FILTER'"

apply() {  # apply I: plant mutant I into the copy; 0, or 1 with the reason in $why
  local i=$1 f=$TREE/${files[i]}
  why=""
  [[ -f $f ]] || { why="no file ${files[i]}"; return 1; }
  cp "$f" "$ORIGINAL" || return 1
  current=${files[i]}
  if [[ -n ${seds[i]} ]]; then
    sed -e "${seds[i]}" "$ORIGINAL" > "$f" || { why="sed failed"; return 1; }
  else
    WANT=${finds[i]} REPL=${repls[i]} awk '
      { s = $0; sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s)
        if (s == ENVIRON["WANT"]) { match($0, /^[ \t]*/); print substr($0, 1, RLENGTH) ENVIRON["REPL"]; n++ }
        else print }
      END { exit n == 1 ? 0 : 3 }' "$ORIGINAL" > "$f" \
      || { why="the line is not in the file exactly once"; return 1; }
  fi
  local changed
  changed=$(diff "$ORIGINAL" "$f" | grep -c '^[<>]')
  [[ $changed -eq 2 ]] || { why="changes $((changed / 2)) lines, not one"; return 1; }
}

# ---- --check: the list against the working tree, nothing built ----
if [[ $CHECK == 1 ]]; then
  TREE=$(mktemp -d) || die "mktemp failed"
  ORIGINAL=$TREE/.original
  trap 'rm -rf "$TREE"' EXIT
  stale=0
  for i in "${selected[@]}"; do
    why=""
    mkdir -p "$(dirname "$TREE/${files[i]}")"
    if [[ -f $REPO/${files[i]} ]]; then cp "$REPO/${files[i]}" "$TREE/${files[i]}"; fi
    apply "$i" || { echo "STALE  ${names[i]}: ${files[i]}: $why"; stale=$((stale + 1)); }
    for t in ${tests[i]}; do
      [[ $t != *.sh && -f $REPO/tests/unit/$t.c ]] || [[ -f $REPO/tests/integration/${t%.sh}.sh ]] ||
        { echo "STALE  ${names[i]}: no test '$t' (tests/unit/$t.c or tests/integration/$t.sh)"; stale=$((stale + 1)); }
    done
  done
  echo "run_mutants.sh --check: ${#selected[@]} mutants, $stale stale"
  [[ $stale -eq 0 ]]
  exit
fi

# ---- the scratch copy ----
mkdir -p "$TREE" "$LOGS" || die "cannot create $TREE"
rm -f "$LOGS"/*.log
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard) > "$SCRATCH/files" || die "git ls-files failed in $REPO"
# Copy what differs (a fresh mtime, so make rebuilds it), keep the rest and its objects, drop what is gone.
while IFS= read -r -d '' f; do
  [[ -f $REPO/$f ]] || continue
  if ! cmp -s "$REPO/$f" "$TREE/$f"; then
    mkdir -p "$(dirname "$TREE/$f")" && cp --preserve=mode "$REPO/$f" "$TREE/$f" || die "cannot copy $f"
  fi
done < "$SCRATCH/files"
tr '\0' '\n' < "$SCRATCH/files" | sort > "$SCRATCH/files.sorted"
(cd "$TREE" && find . -path ./build -prune -o -type f -print | sed 's|^\./||' | sort) \
  | comm -23 - "$SCRATCH/files.sorted" | while IFS= read -r f; do rm -f "$TREE/$f"; done

# ---- building and running tests in the copy ----
# NAME.sh is always the integration script (test_fp8.sh: tests/integration/test_fp8.sh, where test_fp8 alone is
# the unit test of the same name)
is_unit() { [[ $1 != *.sh && -f $TREE/tests/unit/$1.c ]]; }
is_integration() { [[ -f $TREE/tests/integration/${1%.sh}.sh ]]; }

build() {  # build LOG TEST...: megatrain and the unit tests among TEST
  local log=$1 targets=(build/megatrain) t
  shift
  for t in "$@"; do is_unit "$t" && targets+=("build/tests/$t"); done
  make -C "$TREE" -j"$JOBS" --no-print-directory BUILD=build "${targets[@]}" > "$log" 2>&1
}

run_test() {  # run_test NAME LOG: the test's exit status (124: timed out)
  local name=$1 log=$2
  if is_unit "$name"; then
    (cd "$TREE" && timeout "$TEST_TIMEOUT" "build/tests/$name") > "$log" 2>&1
  else
    (cd "$TREE" && MEGATRAIN="$TREE/build/megatrain" timeout "$TEST_TIMEOUT" bash "tests/integration/${name%.sh}.sh") > "$log" 2>&1
  fi
}

all_tests=()
for i in "${selected[@]}"; do
  for t in ${tests[i]}; do
    is_unit "$t" || is_integration "$t" || die "${names[i]}: no test '$t' (tests/unit/$t.c or tests/integration/$t.sh)"
    [[ " ${all_tests[*]} " == *" $t "* ]] || all_tests+=("$t")
  done
done

echo "run_mutants.sh: ${#selected[@]} mutants in a copy of the tree at $TREE"
build "$LOGS/baseline.build.log" "${all_tests[@]}" \
  || { tail -n 20 "$LOGS/baseline.build.log"; die "the unmutated copy does not build"; }
for t in "${all_tests[@]}"; do
  start=$SECONDS
  run_test "$t" "$LOGS/baseline.$t.log"
  rc=$?
  [[ $rc -eq 0 ]] || { tail -n 20 "$LOGS/baseline.$t.log"; die "the unmutated copy fails $t (exit $rc): fix that first"; }
  printf '  baseline: %-28s passes (%d s)\n' "$t" $((SECONDS - start))
done

# ---- the mutants ----
ORIGINAL=$SCRATCH/original
current=""
restore() { [[ -n $current ]] && cp "$ORIGINAL" "$TREE/$current" && current=""; }
trap 'restore' EXIT
trap 'restore; exit 130' INT TERM


results=() killed=0 survived=0 broken=0 not_caught=0
for i in "${selected[@]}"; do
  start=$SECONDS
  if ! apply "$i"; then
    result="NOT APPLIED: $why"; broken=$((broken + 1))
  elif ! build "$LOGS/${names[i]}.build.log" ${tests[i]}; then
    result="DOES NOT BUILD (see $LOGS/${names[i]}.build.log)"; broken=$((broken + 1))
  else
    by=() passed=()
    for t in ${tests[i]}; do
      run_test "$t" "$LOGS/${names[i]}.$t.log"
      rc=$?
      if [[ $rc -eq 124 ]]; then by+=("$t (timed out)")
      elif [[ $rc -ne 0 && $rc -ne 77 ]]; then by+=("$t")
      else passed+=("$t"); fi
    done
    if [[ ${#by[@]} -gt 0 ]]; then
      result="killed by ${by[*]}"
      [[ ${#passed[@]} -gt 0 ]] && result+="; ${passed[*]} passed" && not_caught=$((not_caught + ${#passed[@]}))
      killed=$((killed + 1))
    else
      result="SURVIVED ${tests[i]}"; survived=$((survived + 1))
    fi
  fi
  restore
  results+=("$(printf '%-36s %-34s %s (%d s)' "${names[i]}" "${files[i]}" "$result" $((SECONDS - start)))")
  echo "  ${results[-1]}"
done

{
  echo
  printf '%-36s %-34s %s\n' mutant file result
  printf '%s\n' "${results[@]}"
  echo
  echo "${#selected[@]} mutants: $killed killed, $survived survived, $broken not applied or not built"
  [[ $not_caught -eq 0 ]] || echo "($not_caught listed tests passed with their mutant: another listed test killed it)"
} | tee "$SCRATCH/report.txt"
[[ $survived -eq 0 && $broken -eq 0 ]]
