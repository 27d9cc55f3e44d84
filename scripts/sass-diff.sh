#!/usr/bin/env bash
# Compares, kernel by kernel, the SASS of one CUDA source at a git ref with the working tree's:
#   bash scripts/sass-diff.sh <ref> <src/....cu> [build dir, default build/prebuilt (prebuild.sh)]
# Prints "same" or "DIFF" and the instruction counts for every kernel of either side (labels,
# the anonymous namespace's hash and internal helper numbers normalised). SASS_DIFF_RENAME, a sed
# expression, maps the working tree's kernel names onto the ref's where a signature changed, e.g.
# 's/ELb0EEEv/EEEv/; s/NS0_9TokenRowsE$//' (a new template flag and argument). For changes that must
# leave some kernels as they were: timing alone cannot tell a code change from where the code
# lands (qwen3 T=1 moved 0.35 us with the module loading mode alone on an H200, 2026-12-01, and four
# more GemvParams fields had changed every standalone GEMV's code). Needs no GPU. The compile command
# is the build's own (ninja), so flags follow CMake; nvdisasm comes from NVIDIA's wheel into
# .deps (the toolkit here ships none).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ref=${1:?usage: sass-diff.sh <ref> <source.cu> [build dir]}
src=${2:?usage: sass-diff.sh <ref> <source.cu> [build dir]}
build=${3:-build/prebuilt}
cd "$root"
export PATH="$PATH:/usr/local/cuda/bin"

nvdisasm="$root/.deps/nvdisasm/nvidia/cu13/bin/nvdisasm"
if [[ ! -x "$nvdisasm" ]]; then
  tmp=$(mktemp -d)
  python3 -m pip download --no-deps -q nvidia-cuda-nvdisasm==13.5.37 -d "$tmp"
  mkdir -p "$root/.deps/nvdisasm"
  unzip -q -o "$tmp"/nvidia_cuda_nvdisasm-*.whl 'nvidia/*' -d "$root/.deps/nvdisasm"
  chmod +x "$nvdisasm"
  rm -rf "$tmp"
fi

obj=$(ninja -C "$build" -t targets all | grep -oE "^[^:]*/${src#src/}\.o" | head -1) ||
  true
[[ -n "$obj" ]] || { echo "sass-diff: $src is not compiled in $build" >&2; exit 1; }
cmd=$(ninja -C "$build" -t commands "$obj" | tail -1 | sed -E 's/^[^ ]*ccache //')

work=$(mktemp -d)
trap 'git worktree remove --force "$work/ref" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add -q --detach "$work/ref" "$ref"

# One side: the build's command on that tree's copy of the source, to a cubin, then one line per
# instruction: "<kernel> <instruction>".
sass() {  # tree out
  local c=${cmd//$root\/src/$1\/src}
  c=${c//$root\/include/$1\/include}
  c=$(sed -E "s# -MD -MT [^ ]+ -MF [^ ]+##; s# -c [^ ]+ -o [^ ]+# -cubin $1/$src -o $2.cubin#" <<<"$c")
  (cd "$root/$build" && eval "$c")
  # shellcheck disable=SC2016 # the backquotes are nvdisasm's, not the shell's
  "$nvdisasm" -c "$2.cubin" |
    awk '/^\/\/-+ \.text\./ {k = $2; sub(/^\.text\./, "", k)}
         /\/\*[0-9a-f]+\*\// {l = $0; sub(/^ *\/\*[0-9a-f]+\*\/ */, "", l); print k "\t" l}' |
    sed -E 's/\.L_x_[0-9]+//g; s/_GLOBAL__N__[0-9a-f]+_//g; s/`\([^)]*\)/`()/g;
            s/BRX (R[0-9]+) -0x[0-9a-f]+/BRX \1/; s/ +/ /g' >"$2.sass"
}
sass "$work/ref" "$work/a"
sass "$root" "$work/b"
if [[ -n "${SASS_DIFF_RENAME:-}" ]]; then
  paste <(cut -f1 "$work/b.sass" | sed -E "$SASS_DIFF_RENAME") <(cut -f2- "$work/b.sass") \
    >"$work/b.renamed" && mv "$work/b.renamed" "$work/b.sass"
fi

cut -f1 "$work/a.sass" "$work/b.sass" | sort -u | while read -r k; do
  a=$(grep -F "$k"$'\t' "$work/a.sass" || true)
  b=$(grep -F "$k"$'\t' "$work/b.sass" || true)
  na=$(grep -c . <<<"$a" || true)
  nb=$(grep -c . <<<"$b" || true)
  [[ -z "$a" ]] && na=0
  [[ -z "$b" ]] && nb=0
  [[ "$a" == "$b" ]] && verdict=same || verdict=DIFF
  printf '%-4s %6s %6s  %s\n' "$verdict" "$na" "$nb" "$k"
done
