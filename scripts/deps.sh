#!/usr/bin/env bash
# Installs what the build needs and is missing: Debian packages (clang 14 and its sanitizer and
# libFuzzer runtimes for the sanitized build), and CUTLASS's headers from the nvidia-cutlass==4.2.0.0
# wheel into .deps/cutlass. Idempotent: does nothing when all is there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
need=()
for pkg in cmake ninja-build g++ ccache libgtest-dev googletest nlohmann-json3-dev libcli11-dev python3-pip python3-venv python3-dev \
    unzip python3-matplotlib clang-format-14 clang libclang-rt-14-dev; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
cutlass="$root/.deps/cutlass"
if [[ ! -f "$cutlass/include/cutlass/cutlass.h" ]]; then
  echo "deps: fetching CUTLASS 4.2.0 headers"
  tmp=$(mktemp -d)
  python3 -m pip download --no-deps -q nvidia-cutlass==4.2.0.0 -d "$tmp"
  unzip -q -o "$tmp"/nvidia_cutlass-4.2.0.0-*.whl 'cutlass_library/source/include/*' \
    'cutlass_library/source/tools/util/include/*' -d "$tmp/x"
  mkdir -p "$cutlass/tools/util"
  rm -rf "$cutlass/include" "$cutlass/tools/util/include"
  mv "$tmp/x/cutlass_library/source/include" "$cutlass/include"
  mv "$tmp/x/cutlass_library/source/tools/util/include" "$cutlass/tools/util/include"
  rm -rf "$tmp"
fi
