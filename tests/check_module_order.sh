#!/usr/bin/env bash
# Module-order check: each file of src/<module>/ and each include/shardlm/<module>.hpp belongs to a
# module; an include of a module later in ORDER than the includer's, and any include in src/device
# of train/, fsdp/, optim/ or model/, is reported. Exit status 1 when anything is reported.
# Usage: tests/check_module_order.sh [REPOSITORY_ROOT]   (default: the folder above this script)

# Lower never includes higher (docs/design.md's table, top to bottom).
ORDER=(core dist device model config data io optim fsdp train app)
# What the device backends must never include, whatever the order says.
DEVICE_FORBIDDEN=(train fsdp optim model)

set -u
root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
cd "$root" || exit 2

rank_of() {  # position of module $1 in ORDER, or nothing for an unknown one
  local i
  for i in "${!ORDER[@]}"; do [[ ${ORDER[$i]} == "$1" ]] && { echo "$i"; return; }; done
}

module_of() {  # the module a repository path belongs to, or nothing
  case $1 in
    src/*/*) local rest=${1#src/}; echo "${rest%%/*}" ;;
    include/shardlm/*.hpp) local name=${1#include/shardlm/}; echo "${name%.hpp}" ;;
  esac
}

# The repository path a quoted include names, as the build finds it: shardlm/X.hpp in include/,
# else beside the includer, else in src/device/cuda (on the CUDA build's include path).
resolve() {
  local from=$1 inc=$2 path
  if [[ $inc == shardlm/* && -f include/$inc ]]; then echo "include/$inc"; return; fi
  path=$(realpath -m --relative-to="$root" "$(dirname "$from")/$inc")
  if [[ -f $path ]]; then echo "$path"; return; fi
  if [[ -f src/device/cuda/$inc ]]; then echo "src/device/cuda/$inc"; return; fi
}

found=0
while IFS= read -r file; do
  mod=$(module_of "$file")
  [[ -n $mod ]] || continue
  rank=$(rank_of "$mod")
  [[ -n $rank ]] || { echo "$file: module '$mod' is not in ORDER"; found=$((found + 1)); continue; }
  while IFS= read -r inc; do
    target=$(resolve "$file" "$inc")
    [[ -n $target ]] || continue
    to=$(module_of "$target")
    [[ -n $to && $to != "$mod" ]] || continue
    to_rank=$(rank_of "$to")
    if [[ -z $to_rank ]]; then
      echo "$file: includes $inc of module '$to', which is not in ORDER"
      found=$((found + 1))
    elif ((to_rank > rank)); then
      echo "$file: $mod includes $to ($inc), a module above it"
      found=$((found + 1))
    fi
    if [[ $file == src/device/* ]] && [[ " ${DEVICE_FORBIDDEN[*]} " == *" $to "* ]]; then
      echo "$file: device includes $to ($inc); device/ never includes ${DEVICE_FORBIDDEN[*]}"
      found=$((found + 1))
    fi
  done < <(grep -oE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"[^"]+"' "$file" | sed -E 's/.*"([^"]+)"/\1/')
done < <(find src include/shardlm -type f \( -name '*.hpp' -o -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) | sort)

if ((found > 0)); then
  echo "module order: $found finding(s); order is ${ORDER[*]}"
  exit 1
fi
echo "module order: clean (${ORDER[*]})"
