#!/usr/bin/env bash
# Fails where a C++ or CUDA file of the tree differs from what clang-format makes of it under the
# tree's .clang-format (clang-format-14, Debian 12's; scripts/deps.sh installs it). Lists the
# files and prints the first differences. Fix them with: clang-format-14 -i FILE...
# Usage: bash scripts/format-check.sh [file ...]   (default: every tracked source file)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
format=${CLANG_FORMAT:-clang-format-14}
command -v "$format" >/dev/null || { echo "format-check: $format not found; run scripts/deps.sh" >&2; exit 2; }
if (($#)); then
  files=("$@")
else
  mapfile -t files < <(git ls-files -- 'include/*' 'src/*' 'tests/*' 'tools/*' 'bench/*' 'fuzz/*' 'python/*' |
    grep -E '\.(cpp|hpp|cu|cuh|h)$')
fi
bad=()
for f in "${files[@]}"; do
  "$format" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "format-check: ${#bad[@]} of ${#files[@]} files are not formatted (clang-format-14 -i to fix):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  "$format" --dry-run -Werror "${bad[0]}" 2>&1 | head -20 >&2
  exit 1
fi
echo "format-check: ${#files[@]} files formatted"
