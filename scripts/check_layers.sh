#!/usr/bin/env bash
# check_layers.sh: the include rule of docs/architecture.md, enforced. Every
# `#include "..."` of a file under src/ must point at its own directory or at
# one the table below lets it use: the arrows point down, so a low layer never
# learns about a higher one (ops know no model, the model knows no training
# loop, checkpoints take state rather than the loop). An include that must
# break the rule for a while goes into EXCEPTIONS with the issue that removes
# it (there are none now); one that no longer occurs must leave the list too,
# so it only shrinks. Prints each violation as FILE:LINE: FROM -> TO and
# exits 1.
# Usage: scripts/check_layers.sh [SRC_DIR] (default: src of this checkout).
# CHECK_LAYERS_EXCEPTIONS adds exceptions, "FILE INCLUDED;FILE INCLUDED"
# (for the test of the check).
set -euo pipefail
src=$(cd "${1:-$(dirname "$0")/../src}" && pwd)

# directory -> the directories it may include besides itself (version.h, at
# the top of src, anyone may include).
declare -A MAY=(
  [core]=""
  [backend]="core"
  [config]="core"
  [dist]="core backend"
  [model]="core config backend dist"
  [tokenize]="core"
  [data]="core config tokenize"
  [ckpt]="core config backend dist model"
  [obs]="core config backend dist model ckpt"
  [convert]="core config backend dist model ckpt"
  [plan]="core config backend dist model"
  [eval]="core config backend dist model data ckpt convert obs plan tokenize"
  [train]="core config backend dist model data ckpt convert obs plan tokenize"
  [version.h]=""
  [main.c]="core config backend dist model data ckpt convert obs train plan eval tokenize"
)
# "FILE INCLUDED", both under src: known exceptions, each with the issue that removes it.
EXCEPTIONS=()
if [[ -n "${CHECK_LAYERS_EXCEPTIONS:-}" ]]; then IFS=';' read -r -a extra <<< "$CHECK_LAYERS_EXCEPTIONS"; EXCEPTIONS+=("${extra[@]}"); fi

status=0
exceptions="|$(printf '%s|' "${EXCEPTIONS[@]+"${EXCEPTIONS[@]}"}")"
declare -A seen=()
while IFS= read -r file; do
  rel=${file#"$src"/}
  layer=${rel%%/*}
  [[ -n "${MAY[$layer]+x}" ]] || { echo "$rel: src/$layer is not in the layer table of scripts/check_layers.sh"; status=1; continue; }
  while IFS=: read -r line inc; do
    target=$(realpath -m --relative-to="$src" "$(dirname "$file")/$inc")
    to=${target%%/*}
    [[ "$to" == "$layer" || "$target" == version.h || "$target" == ../* ]] && continue
    [[ " ${MAY[$layer]} " == *" $to "* ]] && continue
    if [[ "$exceptions" == *"|$rel $target|"* ]]; then seen["$rel $target"]=1; continue; fi
    echo "src/$rel:$line: $layer -> $to ($inc): not allowed (docs/architecture.md, scripts/check_layers.sh)"
    status=1
  done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file" | sed -E 's/^([0-9]+):[^"]*"([^"]*)".*/\1:\2/')
done < <(find "$src" \( -name '*.c' -o -name '*.h' \) | sort)
for e in "${EXCEPTIONS[@]+"${EXCEPTIONS[@]}"}"; do
  [[ -n "${seen[$e]+x}" ]] || { echo "exception no longer needed, remove it from scripts/check_layers.sh: $e"; status=1; }
done
[[ $status -eq 0 ]] && echo "layers: every include points down ($(find "$src" \( -name '*.c' -o -name '*.h' \) | wc -l) files, ${#EXCEPTIONS[@]} known exceptions)"
exit $status
