# lib.sh: helpers shared by the integration tests (sourced, not run).
MEGATRAIN=${MEGATRAIN:-build/megatrain}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# json_field FILE KEY: the values of KEY, one per line of a metrics.jsonl.
json_field() { grep -o "\"$2\":[^,}]*" "$1" | cut -d: -f2; }

# demo_data PREFIX: the demo English byte-level data set, built once per test.
demo_data() { (cd "$REPO" && bash scripts/demo_data.sh "$1") > /dev/null; }

# compare FIELD A B [FROM_A]: the values of FIELD in two metrics.jsonl (A
# from line FROM_A on, all of B) agree line by line to relative 1e-5; a
# missing line or value fails.
compare() {
  local field=$1 a=$2 b=$3 from=${4:-1}
  paste <(json_field "$a" "$field" | tail -n +"$from") <(json_field "$b" "$field") | awk -v f="$field" '
    { n++; if (NF != 2) { print "line " n ": " f " missing"; bad = 1; next }
      d = $1 - $2; if (d < 0) d = -d; s = $1 < 0 ? -$1 : $1;
      if (!(d <= 1e-5 * s)) { print "line " n ": " f " " $1 " vs " $2; bad = 1 } }
    END { if (n == 0) { print "no " f " values"; bad = 1 } exit bad }'
}
