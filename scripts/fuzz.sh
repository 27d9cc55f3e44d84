#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang, ASan + UBSan), replays every saved crash under
# fuzz/regressions/<target>/, then fuzzes each target for SECONDS (default 60; hours when asked).
#   bash scripts/fuzz.sh [SECONDS]          MOEKIT_FUZZ_TARGETS="safetensors spec_json" to choose
# The corpus grows in build/sanitize/fuzz/corpus/<target>/ (kept between runs, never committed),
# seeded from fuzz/corpus/<target>/. A crash is written to build/sanitize/fuzz/crashes/<target>/;
# add it to fuzz/regressions/<target>/ so that every later run replays it. Exits non-zero on any
# crash, leak, timeout or failed replay.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
seconds=${1:-60}
build=${MOEKIT_FUZZ_BUILD:-build/sanitize}
jobs=${MOEKIT_JOBS:-$(nproc)}
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
# The same configuration as scripts/test.sh's "sanitize" one, so the two share one build.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
  -DMOEKIT_CUDA=OFF -DMOEKIT_SANITIZE=address,undefined -DMOEKIT_FUZZ=ON -DMOEKIT_BENCH=OFF \
  >/dev/null || exit 1
cmake --build "$build" -j "$jobs" --target moekit_fuzzers || exit 1
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
targets=()
for bin in "$build"/fuzz/fuzz_*; do
  [[ -x $bin ]] && targets+=("${bin##*/fuzz_}")
done
[[ -n "${MOEKIT_FUZZ_TARGETS:-}" ]] && read -r -a targets <<<"$MOEKIT_FUZZ_TARGETS"
status=0
summary=()
for t in "${targets[@]}"; do
  bin="$build/fuzz/fuzz_$t"
  [[ -x $bin ]] || { echo "fuzz: no target $t" >&2; status=1; continue; }
  dict=()
  [[ -f fuzz/$t.dict ]] && dict=(-dict="fuzz/$t.dict")
  # Replays: each saved crash, run once (libFuzzer runs the files it is given and exits).
  replays=(fuzz/regressions/"$t"/*)
  replay_result=none
  if [[ -e ${replays[0]} ]]; then
    replay_result="${#replays[@]} replayed, ok"
    echo "== fuzz $t: replaying ${#replays[@]} saved crash(es)"
    "$bin" -timeout=20 "${replays[@]}" >"$build/fuzz/replay-$t.log" 2>&1 || {
      replay_result="${#replays[@]} replayed, FAILED"; status=1; tail -n 40 "$build/fuzz/replay-$t.log"; }
  fi
  corpus="$build/fuzz/corpus/$t" crashes="$build/fuzz/crashes/$t"
  mkdir -p "$corpus" "$crashes"
  echo "== fuzz $t: ${seconds}s"
  fuzz_result=ok
  "$bin" "${dict[@]}" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$crashes/" "$corpus" "fuzz/corpus/$t" \
    >"$build/fuzz/fuzz-$t.log" 2>&1 || {
    fuzz_result=FAILED; status=1; tail -n 40 "$build/fuzz/fuzz-$t.log"; }
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/fuzz/fuzz-$t.log" | grep -o '[0-9]*$')
  summary+=("fuzz $t: saved crashes: $replay_result; ${seconds}s of fuzzing: $fuzz_result (${execs:-0} inputs)")
done
for line in "${summary[@]}"; do echo "$line"; done
((status == 0)) || echo "fuzz: crashes are in $build/fuzz/crashes/<target>/ (logs: $build/fuzz/*.log)"
exit $status
