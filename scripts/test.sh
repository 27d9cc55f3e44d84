#!/usr/bin/env bash
# The whole test suite on this machine: installs what is missing, then builds and tests each
# configuration and prints one summary line per configuration. Exits non-zero on any failure.
#   cuda      CUDA on (one tactic): every kernel compiles and links, GPU tests skip without a GPU;
#             then ptxas-check.sh.
#   nocuda    pure C++.
#   sanitize  CUDA off, clang, AddressSanitizer + UndefinedBehaviorSanitizer (any finding fails
#             the test that made it): the whole suite, then the libFuzzer targets (fuzz/): their
#             saved crashes replayed and each fuzzed for MOEKIT_FUZZ_SECONDS (default 60).
#   tsan      CUDA off, ThreadSanitizer: the library and the layer's tests only (its concurrency
#             tests among them).
#   python    the Python package: `pip install .` CUDA off into a venv (build/python-venv; the
#             CMake build in build/python shares the compiler cache with nocuda), pytest
#             tests/python against the `moekit` command of that build, then `pip wheel .`.
# MOEKIT_TEST_CONFIGS="nocuda tsan" picks configurations; MOEKIT_JOBS the build's jobs.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/deps.sh || exit 1
jobs=${MOEKIT_JOBS:-$(nproc)}
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}
# Sanitizer findings stop the program at once, with the whole stack.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
configs=(cuda nocuda sanitize tsan python)
[[ -n "${MOEKIT_TEST_CONFIGS:-}" ]] && read -r -a configs <<<"$MOEKIT_TEST_CONFIGS"
status=0
summary=()

# build CFG TARGET... : configures build/CFG with the flags in `flags` and builds the targets.
build() {
  local cfg=$1; shift
  cmake -S . -B "build/$cfg" -G Ninja -DCMAKE_BUILD_TYPE=Release "${flags[@]}" >/dev/null &&
    cmake --build "build/$cfg" -j "$jobs" "$@"
}
ctest_all() { (cd "build/$1" && ctest --output-on-failure -j "$jobs"); }

for cfg in "${configs[@]}"; do
  echo "== configuration: $cfg"
  start=$SECONDS
  result=FAILED
  case $cfg in
    cuda)
      if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
        echo "test: no CUDA toolkit here; the CUDA configuration is not built" >&2
        result="FAILED (no CUDA toolkit)"
      else
        export PATH="$PATH:/usr/local/cuda/bin"
        flags=(-DMOEKIT_CUDA=ON -DMOEKIT_ONE_TACTIC=ON)
        if ! build cuda; then result="FAILED (build)"
        elif ! ctest_all cuda; then result="FAILED (tests)"
        # The prefill kernels' wgmmas stay in flight (ptxas's report; no GPU needed).
        elif ! MOEKIT_ONE_TACTIC=1 bash scripts/ptxas-check.sh; then result="FAILED (ptxas-check)"
        elif ! bash scripts/consumer-test.sh build/cuda; then result="FAILED (find_package consumer)"
        else result="passed (build, tests, ptxas-check, find_package consumer)"; fi
      fi
      ;;
    nocuda)
      flags=(-DMOEKIT_CUDA=OFF)
      if ! build nocuda; then result="FAILED (build)"
      elif ! ctest_all nocuda; then result="FAILED (tests)"
      elif ! bash scripts/consumer-test.sh build/nocuda; then result="FAILED (find_package consumer)"
      else result="passed (build, tests, find_package consumer)"; fi
      ;;
    sanitize)
      # fuzz.sh configures the same build folder with the same flags.
      flags=(-DCMAKE_CXX_COMPILER=clang++ -DMOEKIT_CUDA=OFF -DMOEKIT_SANITIZE=address,undefined
             -DMOEKIT_FUZZ=ON -DMOEKIT_BENCH=OFF)
      if ! build sanitize; then result="FAILED (build)"
      elif ! ctest_all sanitize; then result="FAILED (tests under ASan + UBSan)"
      elif ! MOEKIT_FUZZ_BUILD=build/sanitize bash scripts/fuzz.sh "${MOEKIT_FUZZ_SECONDS:-60}"; then
        result="FAILED (fuzz targets: crash replays or new crashes)"
      else result="passed (tests under ASan + UBSan, fuzz replays, ${MOEKIT_FUZZ_SECONDS:-60}s per fuzz target)"; fi
      ;;
    tsan)
      flags=(-DMOEKIT_CUDA=OFF -DMOEKIT_SANITIZE=thread -DMOEKIT_BENCH=OFF)
      if ! build tsan --target moekit_layer_tests; then result="FAILED (build)"
      elif ! build/tsan/tests/moekit_layer_tests; then result="FAILED (layer tests under TSan)"
      else result="passed (layer and concurrency tests under TSan)"; fi
      ;;
    python)
      venv=build/python-venv
      pip_build=(--no-build-isolation --config-settings=cmake.define.MOEKIT_CUDA=OFF)
      export CMAKE_BUILD_PARALLEL_LEVEL=$jobs
      if ! { [[ -x $venv/bin/python ]] || python3 -m venv "$venv"; } ||
         ! "$venv/bin/pip" install -q nanobind scikit-build-core numpy pytest mypy; then
        result="FAILED (venv and the build's Python packages)"
      elif ! "$venv/bin/pip" install -q "${pip_build[@]}" .; then result="FAILED (pip install .)"
      elif ! cmake --build build/python -j "$jobs" --target moekit_cli; then
        result="FAILED (build of the moekit command)"
      elif ! MOEKIT_CLI="$root/build/python/tools/moekit" "$venv/bin/python" -m pytest -q tests/python; then
        result="FAILED (pytest tests/python)"
      elif ! "$venv/bin/pip" wheel -q --no-deps "${pip_build[@]}" -w build/python-wheel .; then
        result="FAILED (pip wheel .)"
      else result="passed (pip install ., pytest tests/python, pip wheel .)"; fi
      ;;
    *)
      echo "test: unknown configuration '$cfg' (cuda, nocuda, sanitize, tsan, python)" >&2
      result="FAILED (unknown configuration)"
      ;;
  esac
  [[ $result == passed* ]] || status=1
  summary+=("test: $cfg: $result in $((SECONDS - start))s")
done
# The tree is formatted as .clang-format says.
if bash scripts/format-check.sh; then summary+=("test: format: passed")
else status=1; summary+=("test: format: FAILED (scripts/format-check.sh lists the files)"); fi
echo "== summary"
for line in "${summary[@]}"; do echo "$line"; done
exit $status
