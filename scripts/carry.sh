#!/usr/bin/env bash
# Lays out .carry/ (ignored by git) with what a build on the device machine needs and that machine
# lacks: CUTLASS headers and a prefix with GoogleTest, nlohmann-json and CLI11 from this machine's
# Debian packages, nanobind's sources for the Python module (cmake -DMOEKIT_PYTHON=ON
# -Dnanobind_DIR=$PWD/.carry/nanobind/nanobind/cmake). Pass `.carry` in the device tool's carry list.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/deps.sh
rm -rf .carry && mkdir -p .carry/prefix/include .carry/prefix/lib/x86_64-linux-gnu/cmake .carry/prefix/share/cmake
cp -r .deps/cutlass .carry/cutlass
cp -r /usr/include/gtest /usr/include/gmock /usr/include/nlohmann /usr/include/CLI .carry/prefix/include/
cp /usr/lib/x86_64-linux-gnu/libgtest*.a /usr/lib/x86_64-linux-gnu/libgmock*.a .carry/prefix/lib/x86_64-linux-gnu/
cp -r /usr/lib/x86_64-linux-gnu/cmake/GTest .carry/prefix/lib/x86_64-linux-gnu/cmake/
cp -r /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 .carry/prefix/share/cmake/
tmp=$(mktemp -d)
python3 -m pip download --no-deps -q nanobind -d "$tmp"
unzip -q -o "$tmp"/nanobind-*.whl 'nanobind/*' -d .carry/nanobind
rm -rf "$tmp"
du -sh .carry
