#!/usr/bin/env bash
# Builds the programs of several commits for one device run that compares them, and lays them
# out under .carry/variants/NAME/ as scripts/prebuild.sh lays out .prebuilt/ (moekit,
# moekit_tests, moekit_gemm_sweep, commit), gzipped to fit the carry's 64 MiB. One worktree and
# build folder serve every variant in turn, so each one recompiles only what its commit changed.
# Usage: bash scripts/variants.sh NAME=REV [NAME=REV ...]   (REV: anything git rev-parse takes;
#   NAME=REV:cli builds and carries the CLI alone, for forward A/Bs that need no tests)
# On the device: `bash scripts/device.sh variants` unpacks them into build/variants/NAME/; then
# MOEKIT_PREBUILT=build/variants/NAME runs that variant's `prebuilt test sanitize ...`, and
# MOEKIT_AB_ENVS="cli=build/variants/A/moekit;cli=build/variants/B/moekit" compares forwards.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
(($#)) || { sed -n 2,10p "$0" >&2; exit 2; }
bash scripts/deps.sh
export PATH="$PATH:/usr/local/cuda/bin"
work=${MOEKIT_VARIANTS_WORK:-/tmp/moekit-variants}
names=() shas=() cli_only=()
for spec in "$@"; do  # check every spec before building any
  [[ "$spec" =~ ^([A-Za-z0-9_.-]+)=([^:]+)(:cli)?$ ]] ||
    { echo "variants: '$spec' is not NAME=REV or NAME=REV:cli" >&2; exit 2; }
  sha=$(git rev-parse -q --verify --short "${BASH_REMATCH[2]}^{commit}") ||
    { echo "variants: '${BASH_REMATCH[2]}' (in '$spec') names no commit" >&2; exit 2; }
  names+=("${BASH_REMATCH[1]}") shas+=("$sha") cli_only+=("${BASH_REMATCH[3]}")
done
[[ -d "$work/src" ]] || git worktree add -q --detach "$work/src" HEAD
ln -sfn "$root/.deps" "$work/src/.deps"  # CUTLASS and the tools scripts/deps.sh fetched
rm -rf .carry/variants && mkdir -p .carry/variants  # one run's set: device.sh unpacks them all
for i in "${!names[@]}"; do
  name=${names[$i]} sha=${shas[$i]}
  git -C "$work/src" checkout -q --detach "$sha"
  targets=(moekit_cli)
  [[ -n "${cli_only[$i]}" ]] || targets+=(moekit_tests moekit_gemm_sweep)
  t0=$(date +%s)
  cmake -S "$work/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=ON \
    -DMOEKIT_ONE_TACTIC=OFF >"$work/$name.log"
  cmake --build "$work/build" --target "${targets[@]}" >>"$work/$name.log" ||
    { tail -30 "$work/$name.log" >&2; echo "variants: $name ($sha) failed to build" >&2; exit 1; }
  # A kernel whose wgmmas ptxas serialized is correct but slower: caught here, not on the device.
  if [[ -z "${MOEKIT_SKIP_PTXAS_CHECK:-}" ]]; then
    mkdir -p "$work/src/build"  # the check's object goes there
    (cd "$work/src" && bash scripts/ptxas-check.sh "$work/$name-ptxas.log") ||
      { echo "variants: $name ($sha) failed ptxas-check: $work/$name-ptxas.log" >&2; exit 1; }
  fi
  out=.carry/variants/$name
  rm -rf "$out" && mkdir -p "$out"
  gzip -c "$work/build/tools/moekit" >"$out/moekit.gz"
  if [[ -z "${cli_only[$i]}" ]]; then
    gzip -c "$work/build/tests/moekit_tests" >"$out/moekit_tests.gz"
    gzip -c "$work/build/bench/moekit_gemm_sweep" >"$out/moekit_gemm_sweep.gz"
  fi
  echo "$sha tree $(cd "$work/src" && bash scripts/tree-id.sh) (variant $name)" >"$out/commit"
  echo "variants: $name = $sha built in $(($(date +%s) - t0)) s"
done
du -sh .carry/variants
