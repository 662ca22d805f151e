#!/usr/bin/env bash
# demo_data.sh: builds the demo data set data/demo/english (Megatron .bin/.idx,
# byte tokens) from the English license texts every Debian system ships in
# /usr/share/common-licenses. Usage: scripts/demo_data.sh [OUTPUT_PREFIX]
# (default: data/demo/english in the checkout, where recipes/tiny read it run from there; a relative
# OUTPUT_PREFIX is taken from the current directory, as megatrain's paths are)
set -euo pipefail
prefix=${1:-}
[[ -n "$prefix" && "$prefix" != /* ]] && prefix="$PWD/$prefix"
cd "$(dirname "$0")/.."
prefix=${prefix:-data/demo/english}
[[ -f "$prefix.bin" && -f "$prefix.idx" ]] && exit 0
mkdir -p "$(dirname "$prefix")"
src=/usr/share/common-licenses
text=$(mktemp)
trap 'rm -f "$text"' EXIT
for f in Apache-2.0 Artistic BSD GFDL-1.3 GPL-2 GPL-3 LGPL-2.1 LGPL-3 MPL-1.1 MPL-2.0; do
  [[ -f "$src/$f" ]] && cat "$src/$f" >> "$text"
done
[[ -s "$text" ]] || { echo "demo_data.sh: no texts found in $src" >&2; exit 1; }
# --overwrite: only a half prefix (a lone .bin or .idx) gets here, and is rebuilt
"${MEGATRAIN:-build/megatrain}" data build --input "$text" --output "$prefix" --tokenizer byte --overwrite
