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
