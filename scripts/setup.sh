#!/usr/bin/env bash
# Installs what is missing, builds moekit (with CUDA where the toolkit is present), and runs the
# main job: one forward of the default preset (`moekit run`). Extra arguments go to `moekit run`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/deps.sh
export PATH="$PATH:/usr/local/cuda/bin"
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
if command -v nvcc >/dev/null; then
  cfg=cuda; flags=(-DMOEKIT_CUDA=ON)
  # Without a GPU here the tactics only need to link: one per family builds in a fraction of the time.
  nvidia-smi -L >/dev/null 2>&1 || flags+=(-DMOEKIT_ONE_TACTIC=ON)
else
  cfg=nocuda; flags=(-DMOEKIT_CUDA=OFF)
fi
cmake -S . -B "build/$cfg" -G Ninja -DCMAKE_BUILD_TYPE=Release "${flags[@]}" >/dev/null
cmake --build "build/$cfg" -j "$(nproc)" --target moekit_cli
"build/$cfg/tools/moekit" run "$@"
