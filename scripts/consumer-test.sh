#!/usr/bin/env bash
# Installs a built tree (`cmake --install`) into a temporary prefix, then configures, builds and
# runs tests/consumer/ against it: a project outside this tree that does find_package(moekit) and
# links moekit::moekit. Works for either configuration (CUDA on: the package finds the CUDA
# runtime itself). Usage: bash scripts/consumer-test.sh BUILD_DIR   (e.g. build/nocuda)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: consumer-test.sh BUILD_DIR}
[[ "$build" = /* ]] || build="$root/$build"
[[ -f "$build/CMakeCache.txt" ]] || { echo "consumer-test: $build is not a configured build" >&2; exit 2; }
export PATH="$PATH:/usr/local/cuda/bin"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --build "$build" --target moekit moekit_cli >/dev/null
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$root/tests/consumer" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log" ||
  { cat "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" >"$work/build.log" || { cat "$work/build.log" >&2; exit 1; }
"$work/build/consumer"
echo "consumer-test: find_package(moekit) from $(basename "$build")'s install: ok"
