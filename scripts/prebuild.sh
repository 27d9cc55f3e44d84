#!/usr/bin/env bash
# Builds every tactic here (no GPU needed) and lays out .prebuilt/ (ignored by git) with the three
# programs scripts/device.sh runs and the commit and tree they were built from. Pass `.prebuilt`
# in the device tool's carry list and run `bash scripts/device.sh prebuilt test sanitize bench`:
# the device has the same CUDA 13 libraries, so no device minutes go to compiling (a full build
# there takes ~3 of them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/deps.sh
export PATH="$PATH:/usr/local/cuda/bin"
cmake -S . -B build/prebuilt -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=ON \
  -DMOEKIT_ONE_TACTIC=OFF
cmake --build build/prebuilt --target moekit_cli moekit_tests moekit_gemm_sweep
# A kernel whose wgmmas ptxas serialized is correct but slower: caught here, not on the device.
[[ -n "${MOEKIT_SKIP_PTXAS_CHECK:-}" ]] || bash scripts/ptxas-check.sh
rm -rf .prebuilt && mkdir -p .prebuilt
cp build/prebuilt/tools/moekit build/prebuilt/tests/moekit_tests \
  build/prebuilt/bench/moekit_gemm_sweep .prebuilt/
dirty=$(git diff --quiet HEAD -- . && echo "" || echo "+changes")
echo "$(git rev-parse --short HEAD)$dirty tree $(bash scripts/tree-id.sh)" >.prebuilt/commit
du -sh .prebuilt
