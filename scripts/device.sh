#!/usr/bin/env bash
# Runs on the H200 device machine, from the repository root, with .carry/ (scripts/carry.sh)
# carried along: builds every tactic, runs the GPU tests, compute-sanitizer's four tools over the
# GPU tests (step "sanitize", below), and the benchmarks. Logs go to $OUT (at most 8 files come back). Usage:
#   MOEKIT_COMMIT=<sha> bash scripts/device.sh [variants] [build | prebuilt] [check] [test] [python] [sanitize] [bench] [sweep] [torch] [ab] [clocks] [tune] [envab] [ncu] [ncu-gemm] [ncu-source] [ncu-forward] [hang]
#   (default: build test sanitize bench sweep torch)
# Step "prebuilt" instead of "build": the programs from .prebuilt/ (scripts/prebuild.sh, a full
# build on the CPU machine, carried along), which saves the ~3 minutes of a build here. The
# tests then run the CLI and the sweep from MOEKIT_TEST_CLI / MOEKIT_TEST_SWEEP
# (tests/support/command.hpp), not from the paths they were built at.
# The summary's first line also prints scripts/tree-id.sh: run that here on a commit to check the
# label (the device's copy of .git is not current).
# Step "clocks": the bench at MOEKIT_CLOCK_TOKENS (default 16384) with nvidia-smi logging the SM
# clock, power and throttle reasons every 100 ms (clocks.csv), to tell lower clocks under load
# from launch gaps.
# Step "ab": builds the tree in .carry/base-src (git archive <sha> | tar -x -C .carry/base-src;
# its .commit file names the sha) into build/base and runs the bench for MOEKIT_BENCH_PRESETS x
# MOEKIT_BENCH_TOKENS alternately with both builds, twice each, in one process per run on this
# machine: H200 machines differ by ~2% on bandwidth-bound rows, so only such an A/B shows 1-2%.
# Step "ncu-gemm": one grouped GEMM of the sweep under ncu (the third launch of the CUTLASS
# kernel; tensor-pipe activity, L2 and DRAM throughput, warp stall reasons): MOEKIT_SWEEP_PRESETS
# (one preset), MOEKIT_SWEEP_TOKENS (one count), MOEKIT_SWEEP_TACTICS (one tactic) and
# MOEKIT_SWEEP_GEMMS (fc1, fc1+act or fc2) choose it.
# Step "ncu-source": the same GEMM's warp-stall samples by SASS line (ncu's source page; the
# 30 lines with the most samples, scripts/ncu_top_stalls.py), to tell MMA waits from data waits
# and epilogue barriers.
# Step "ncu": kernel durations of one forward per preset at MOEKIT_NCU_TOKENS (default 1) under
# ncu (kernels serialized, caches flushed before each), with the bench's inputs (seed 1 + T, so
# the same experts are hit; deepseek's correction bias comes with the weights and still differs). `moekit bench --trace N` times the kernels inside the
# replays instead (PDL overlap and gaps included).
# Environment: MOEKIT_TEST_FILTER (gtest filter), MOEKIT_SANITIZER_FILTER (gtest filter; default
# every GPU suite), MOEKIT_SANITIZER_TIMEOUT (s, per tool; default 540), MOEKIT_TEST_TIMEOUT (s,
# for the test step; a hang shows as rc=124), MOEKIT_BENCH_PRESETS, MOEKIT_BENCH_TOKENS,
# MOEKIT_FLUSH (read|write|none: how bench and torch empty the L2 before each rep; default read),
# MOEKIT_BENCH_FORMAT and MOEKIT_BENCH_ROUTING (bench and torch: --weights-format, --routing),
# MOEKIT_SWEEP_TOKENS, MOEKIT_SWEEP_PRESETS, MOEKIT_SWEEP_ROUTING (random | even), MOEKIT_SWEEP_TACTICS,
# MOEKIT_SWEEP_GEMMS (bench/gemm_sweep.cu).
set -uo pipefail
OUT=${OUT:-/tmp/moekit-out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH="$PATH:/usr/local/cuda/bin"
steps=("$@"); ((${#steps[@]})) || steps=(build test sanitize bench sweep torch)
want() { [[ " ${steps[*]} " == *" $1 "* ]]; }
bin=build/device
summary="$OUT/summary.txt"
{
  echo "commit ${MOEKIT_COMMIT:-unknown}  tree $(bash scripts/tree-id.sh)  date $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
  nvcc --version | tail -1
} >"$summary" 2>&1

base=build/base
if want ab; then  # the base build runs alongside the main one
  { cmake -S .carry/base-src -B $base -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=ON \
      -DMOEKIT_CUTLASS_DIR="$PWD/.carry/cutlass" -DCMAKE_PREFIX_PATH="$PWD/.carry/prefix" \
      -DCMAKE_CUDA_COMPILER=$(command -v nvcc) && cmake --build $base -j "$(nproc)" --target moekit_cli; } \
    >"$OUT/base-build.log" 2>&1 &
  base_pid=$!
fi

# Step "variants": unpacks .carry/variants/NAME/ (scripts/variants.sh) into build/variants/NAME/.
if want variants; then
  for dir in .carry/variants/*/; do
    name=$(basename "$dir"); mkdir -p "build/variants/$name"
    for gz in "$dir"*.gz; do gunzip -c "$gz" >"build/variants/$name/$(basename "$gz" .gz)"; done
    chmod +x "build/variants/$name"/moekit*; cp "$dir/commit" "build/variants/$name/"
    echo "variant $name: $(cat "$dir/commit")" >>"$summary"
  done
fi

# MOEKIT_PREBUILT: where step "prebuilt" takes the programs from (default .prebuilt; a variant's
# build/variants/NAME after step "variants").
if want prebuilt; then
  pre=${MOEKIT_PREBUILT:-.prebuilt}
  mkdir -p $bin/tools $bin/tests $bin/bench
  # --remove-destination: a program still running from an earlier step cut by its time limit
  # ("Text file busy") keeps its old file and does not stop this one (H200, 2026-12-02).
  if cp --remove-destination "$pre"/moekit $bin/tools/ &&
    cp --remove-destination "$pre"/moekit_tests $bin/tests/ &&
    cp --remove-destination "$pre"/moekit_gemm_sweep $bin/bench/; then
    echo "prebuilt: $(cat "$pre"/commit)" >>"$summary"
  else
    echo "prebuilt: $pre is incomplete; run scripts/prebuild.sh (or variants.sh) and carry it" | tee -a "$summary"
    exit 1
  fi
  export MOEKIT_TEST_CLI="$PWD/$bin/tools/moekit" MOEKIT_TEST_SWEEP="$PWD/$bin/bench/moekit_gemm_sweep"
fi

if want build; then
  t0=$(date +%s)
  cmake -S . -B $bin -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=ON \
    -DMOEKIT_CUTLASS_DIR="$PWD/.carry/cutlass" -DCMAKE_PREFIX_PATH="$PWD/.carry/prefix" \
    -DCMAKE_CUDA_COMPILER=$(command -v nvcc) >"$OUT/build.log" 2>&1 &&
    cmake --build $bin -j "$(nproc)" >>"$OUT/build.log" 2>&1
  rc=$?
  echo "build: rc=$rc in $(( $(date +%s) - t0 )) s" | tee -a "$summary"
  ((rc == 0)) || { tail -40 "$OUT/build.log"; exit 1; }
fi

if want test; then
  timeout "${MOEKIT_TEST_TIMEOUT:-900}" $bin/tests/moekit_tests --gtest_color=no ${MOEKIT_TEST_FILTER:+--gtest_filter=$MOEKIT_TEST_FILTER} >"$OUT/tests.log" 2>&1
  echo "tests: rc=$?" >>"$summary"
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|FAILED  \]' "$OUT/tests.log" | tail -40 >>"$summary"
fi

# Step "sanitize": compute-sanitizer's memcheck, racecheck, initcheck and synccheck, all four at
# once (16 cores, one GPU), each over every GPU test: the suites of tests/*/*_test.cu (or
# MOEKIT_SANITIZER_FILTER). MOEKIT_SANITIZER_RUN=1 makes the tests whose sizes only add time
# under the tools run smaller (tests/support/gpu.hpp: sanitizer_run(); the engine's largest
# token counts and repeat counts, the GEMV's repeats) and skips the one past 2^31 elements,
# which no tool needs to see at that size. No test is excluded. Each tool has
# MOEKIT_SANITIZER_TIMEOUT seconds (default 540, inside the device's 10-minute command) and its
# own log while it runs; the logs are then joined into sanitizer.log (one file of the 8 that
# come back). summary.txt gets one line per tool (exit code: 9 errors found, 124 time out;
# errors; tests passed / failed; the test running at a time-out) and its slowest tests.
if want sanitize; then
  suites=$(sed -nE 's/^(TEST|TEST_F|TEST_P)\(([A-Za-z0-9_]+),.*/\2/p' tests/*/*_test.cu | sort -u)
  gpu_filter=$(for s in $suites; do printf '*%s.*:' "$s"; done)
  san_filter=${MOEKIT_SANITIZER_FILTER:-${gpu_filter%:}}
  read -r -a tools <<<"${MOEKIT_SANITIZER_TOOLS:-memcheck racecheck initcheck synccheck}"
  # Racecheck and initcheck run several times slower than the others: each runs as gtest shards
  # in parallel processes (MOEKIT_SANITIZER_SHARDS, e.g. "racecheck=6 initcheck=3"; by default
  # eight processes in all: sixteen on one H100 slowed every tool, 2026-12-07).
  declare -A shards=([memcheck]=1 [racecheck]=4 [initcheck]=2 [synccheck]=1)
  for kv in ${MOEKIT_SANITIZER_SHARDS:-}; do shards[${kv%%=*}]=${kv#*=}; done
  declare -A pids
  for tool in "${tools[@]}"; do
    pids[$tool]=""
    n=${shards[$tool]:-1}
    for ((i = 0; i < n; ++i)); do
      GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i MOEKIT_SANITIZER_RUN=1 \
        timeout --kill-after=20 "${MOEKIT_SANITIZER_TIMEOUT:-540}" \
        compute-sanitizer --tool "$tool" --error-exitcode 9 --print-limit 20 \
        $bin/tests/moekit_tests --gtest_color=no --gtest_filter="$san_filter" \
        >"$OUT/sanitizer-$tool.$i.log" 2>&1 &
      pids[$tool]+=" $!"
    done
  done
  for tool in "${tools[@]}"; do
    rc=0
    for pid in ${pids[$tool]}; do
      wait "$pid"
      r=$?
      ((r > rc)) && rc=$r
    done
    log="$OUT/sanitizer-$tool.log"
    cat "$OUT/sanitizer-$tool".*.log >"$log" && rm -f "$OUT/sanitizer-$tool".*.log
    errors=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | sort | uniq -c | tr -s ' ' | paste -sd';')
    passed=$(grep -c '^\[       OK \]' "$log")
    failed=$(grep -c '^\[  FAILED  \] [A-Za-z0-9_/]*\.[A-Za-z0-9_/]* (' "$log")
    running=""
    ((rc == 124 || rc == 137)) && running=" timed out in $(grep '^\[ RUN      \]' "$log" | tail -1 | cut -c14-)"
    echo "compute-sanitizer $tool: rc=$rc; ${errors:-no summary}; tests ok $passed, failed $failed$running" >>"$summary"
    # The first reports (kind, where, by which thread), to tell them apart without the log.
    grep -v 'COMPUTE-SANITIZER' "$log" | grep -E -A2 '^========= [A-Z]' | grep -vE '^--$|SUMMARY' |
      head -9 | cut -c1-220 | sed 's/^/    /' >>"$summary"
    echo "  slowest under $tool:" >>"$summary"
    sed -nE 's/^\[       OK \] (.*) \(([0-9]+) ms\)$/\2 \1/p' "$log" | sort -rn | head -5 |
      sed 's/^/    /' >>"$summary"
  done
  for tool in "${tools[@]}"; do
    echo "######## compute-sanitizer --tool $tool"
    cat "$OUT/sanitizer-$tool.log"
  done >"$OUT/sanitizer.log"
  rm -f "$OUT"/sanitizer-*.log
fi

# Step "check": `moekit run --check` (the GPU's forward against the CPU reference, relative error
# under 1e-2) for each of MOEKIT_CHECK_PRESETS x MOEKIT_CHECK_FORMATS x MOEKIT_CHECK_TOKENS, at the
# presets' real shapes with random weights.
if want check; then
  for preset in ${MOEKIT_CHECK_PRESETS:-qwen3-30b-a3b}; do
    for fmt in ${MOEKIT_CHECK_FORMATS:-fp8_block128 fp8 int4_group int8_group}; do
      for t in ${MOEKIT_CHECK_TOKENS:-1 7 64 513}; do
        echo "== $preset $fmt T=$t"
        timeout 120 $bin/tools/moekit run --preset "$preset" --weights-format "$fmt" --tokens "$t" --check 2>&1 | tail -4
      done
    done
  done >"$OUT/check.txt" 2>&1
  cat "$OUT/check.txt" >>"$summary"
fi

# Step "python": the Python module and the CLI built into build/python (with .carry/nanobind
# from scripts/carry.sh; MOEKIT_ONE_TACTIC=ON builds one tactic per GEMM, in about half the
# time) and the package's GPU tests (tests/python -k gpu: torch tensors in and out without
# copies, the caller's stream, graph capture, torch.compile, the call's overhead beside that
# build's `moekit bench`).
if want python; then
  t0=$(date +%s)
  python3 -c 'import sys, sysconfig, os; i = sysconfig.get_paths()["include"]; print("python:", sys.version.split()[0], i, "Python.h", os.path.exists(i + "/Python.h"))' >>"$summary" 2>&1
  pybin=build/python
  { cmake -S . -B $pybin -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=ON \
      -DMOEKIT_ONE_TACTIC="${MOEKIT_ONE_TACTIC:-OFF}" \
      -DMOEKIT_CUTLASS_DIR="$PWD/.carry/cutlass" -DCMAKE_PREFIX_PATH="$PWD/.carry/prefix" \
      -DCMAKE_CUDA_COMPILER=$(command -v nvcc) -DMOEKIT_PYTHON=ON \
      -Dnanobind_DIR="$PWD/.carry/nanobind/nanobind/cmake" -DPython_EXECUTABLE="$(command -v python3)" &&
    cmake --build $pybin -j "$(nproc)" --target _moekit moekit_cli &&
    echo "python: built in $(( $(date +%s) - t0 )) s" &&
    PYTHONPATH=$pybin/python MOEKIT_CLI=$pybin/tools/moekit timeout 400 python3 -m pytest tests/python -k gpu -s -q; } \
    >"$OUT/python.log" 2>&1
  echo "python: rc=$? in $(( $(date +%s) - t0 )) s" >>"$summary"
  tail -30 "$OUT/python.log" >>"$summary"
fi

# MOEKIT_BENCH_FORMAT and MOEKIT_BENCH_ROUTING: the bench's --weights-format and --routing.
if want bench; then
  $bin/tools/moekit bench --preset "${MOEKIT_BENCH_PRESETS:-qwen3-30b-a3b,mixtral-8x7b,deepseek-v3,gpt-oss-120b}" \
    ${MOEKIT_BENCH_TOKENS:+--tokens "$MOEKIT_BENCH_TOKENS"} --flush "${MOEKIT_FLUSH:-read}" \
    ${MOEKIT_BENCH_FORMAT:+--weights-format "$MOEKIT_BENCH_FORMAT"} ${MOEKIT_BENCH_ROUTING:+--routing "$MOEKIT_BENCH_ROUTING"} \
    --json "$OUT/bench.json" >"$OUT/bench.txt" 2>&1
  echo "bench: rc=$?" >>"$OUT/bench.txt"
  cat "$OUT/bench.txt" >>"$summary"
fi

if want sweep; then
  $bin/bench/moekit_gemm_sweep "${MOEKIT_SWEEP_TOKENS:-${MOEKIT_BENCH_TOKENS:-1,8,64,512,4096,16384}}" \
    ${MOEKIT_SWEEP_PRESETS:+"$MOEKIT_SWEEP_PRESETS"} >"$OUT/sweep.txt" 2>&1
  echo "sweep: rc=$?" >>"$OUT/sweep.txt"
  cat "$OUT/sweep.txt" >>"$summary"
fi

if want torch; then
  python3 bench/torch_moe.py --moekit-json "$OUT/bench.json" --json-out "$OUT/torch.json" --flush "${MOEKIT_FLUSH:-read}" ${MOEKIT_BENCH_TOKENS:+--tokens "$MOEKIT_BENCH_TOKENS"} \
    ${MOEKIT_BENCH_PRESETS:+--presets "$MOEKIT_BENCH_PRESETS"} \
    ${MOEKIT_BENCH_FORMAT:+--weights-format "$MOEKIT_BENCH_FORMAT"} ${MOEKIT_BENCH_ROUTING:+--routing "$MOEKIT_BENCH_ROUTING"} \
    >"$OUT/torch.txt" 2>&1 || echo "torch: rc=$?" >>"$OUT/torch.txt"
  cat "$OUT/torch.txt" >>"$summary"
fi
if want ab; then
  wait $base_pid || { echo "ab: base build failed" >>"$summary"; tail -20 "$OUT/base-build.log" >>"$summary"; }
  one() {  # prints "preset T median_us;" per row
    "$1"/tools/moekit bench --preset "${MOEKIT_BENCH_PRESETS:-qwen3-30b-a3b,mixtral-8x7b,deepseek-v3,gpt-oss-120b}" \
      --tokens "${MOEKIT_BENCH_TOKENS:-1,8}" --flush "${MOEKIT_FLUSH:-read}" 2>&1 |
      awk '$2 ~ /^[0-9]+$/ && $3 ~ /^[0-9.]+$/ {printf "%s %s %s; ", $1, $2, $3} END {print ""}'
  }
  { echo "A/B: base $(cat .carry/base-src/.commit 2>/dev/null) vs device ${MOEKIT_COMMIT:-unknown} (preset T median_us)"
    for i in 1 2; do
      echo "base   $i: $(one $base)"
      echo "device $i: $(one $bin)"
    done; } >>"$summary"
fi

# Step "tune": for each routing profile of MOEKIT_TUNE_PROFILES (default "uniform zipf:1.2"),
# `moekit tune` of MOEKIT_BENCH_PRESETS up to MOEKIT_TUNE_MAX_TOKENS (default 4096) into
# tuning-<profile>.json, then `moekit bench --compare-tuning` at MOEKIT_TUNE_BENCH_TOKENS (default
# 1,8,64,512,4096) with the same profile: each row's forward without and with that file, the two
# replayed in turn in one process (MOEKIT_AB_ROUNDS processes, default 1). tune-<profile>.txt
# has the tuner's table and the bench's; the summary one line per row. MOEKIT_TUNE_TIMEOUT (s,
# default 240) bounds each tune and each bench; MOEKIT_TUNE_BUDGET_MS is tune's --budget-ms, 50
# here by default (at least 30 replays per tactic either way; at 200 ms, 60 of the four presets'
# 104 measurements took 200 s on an H100, 2026-12-07).
if want tune; then
  presets=${MOEKIT_BENCH_PRESETS:-qwen3-30b-a3b,mixtral-8x7b,deepseek-v3,gpt-oss-120b}
  for profile in ${MOEKIT_TUNE_PROFILES:-uniform zipf:1.2}; do
    tag=${profile/:/-}
    file="$OUT/tuning-$tag.json" txt="$OUT/tune-$tag.txt"
    timeout "${MOEKIT_TUNE_TIMEOUT:-240}" $bin/tools/moekit tune --preset "$presets" \
      --max-tokens "${MOEKIT_TUNE_MAX_TOKENS:-4096}" --routing-profile "$profile" \
      --budget-ms "${MOEKIT_TUNE_BUDGET_MS:-50}" --out "$file" >"$txt" 2>&1
    echo "tune $profile: rc=$? ($(grep -c '"tactic"' "$file" 2>/dev/null || echo 0) entries)" >>"$summary"
    for ((r = 1; r <= ${MOEKIT_AB_ROUNDS:-1}; r++)); do
      echo "######## bench $profile round $r, without and with the tuning file" >>"$txt"
      timeout "${MOEKIT_TUNE_TIMEOUT:-240}" $bin/tools/moekit bench --preset "$presets" \
        --tokens "${MOEKIT_TUNE_BENCH_TOKENS:-1,8,64,512,4096}" --flush "${MOEKIT_FLUSH:-read}" \
        --routing-profile "$profile" --tuning-file "$file" --compare-tuning 2>&1 | tee -a "$txt" |
        awk -v p="$profile" -v r="$r" '$2 ~ /^[0-9]+$/ && $3 ~ /^[0-9.]+$/ {
          printf "tune %s round %s: %s T=%s without %s with %s (%s)\n", p, r, $1, $2, $3, $4, $5 }' >>"$summary"
    done
  done
fi

# Step "envab": the bench for MOEKIT_BENCH_PRESETS x MOEKIT_BENCH_TOKENS (default 4096,16384; in
# MOEKIT_BENCH_FORMAT with MOEKIT_BENCH_ROUTING where set) with
# each environment of MOEKIT_AB_ENVS in turn (';' between them, each 'VAR=value VAR2=value' or
# '-' for none; 'cli=<path>' runs that moekit instead, e.g. an older build carried in
# .prebuilt/), MOEKIT_AB_ROUNDS rounds (default 2), one process per run, so variants compare on
# one machine, interleaved.
if want envab; then
  IFS=';' read -ra envs <<<"${MOEKIT_AB_ENVS:--}"
  for ((r = 1; r <= ${MOEKIT_AB_ROUNDS:-2}; r++)); do
    for e in "${envs[@]}"; do
      vars=(); [[ "$e" == "-" ]] || read -ra vars <<<"$e"
      cli=$bin/tools/moekit
      for v in "${vars[@]}"; do [[ "$v" == cli=* ]] && cli=${v#cli=}; done
      line=$(env "${vars[@]}" timeout 300 "$cli" bench \
        --preset "${MOEKIT_BENCH_PRESETS:-qwen3-30b-a3b,mixtral-8x7b,deepseek-v3,gpt-oss-120b}" \
        --tokens "${MOEKIT_BENCH_TOKENS:-4096,16384}" --flush "${MOEKIT_FLUSH:-read}" \
        ${MOEKIT_BENCH_FORMAT:+--weights-format "$MOEKIT_BENCH_FORMAT"} ${MOEKIT_BENCH_ROUTING:+--routing "$MOEKIT_BENCH_ROUTING"} 2>&1 |
        awk '$2 ~ /^[0-9]+$/ && $3 ~ /^[0-9.]+$/ {printf "%s %s %s; ", $1, $2, $3} END {print ""}')
      echo "round $r [$e]: $line"
    done
  done >"$OUT/envab.txt" 2>&1
  cat "$OUT/envab.txt" >>"$summary"
fi

if want ncu; then
  for preset in $(echo "${MOEKIT_BENCH_PRESETS:-qwen3-30b-a3b,mixtral-8x7b,deepseek-v3,gpt-oss-120b}" | tr , ' '); do
    for t in $(echo "${MOEKIT_NCU_TOKENS:-1}" | tr , ' '); do
      echo "== ncu $preset T=$t"
      ncu --clock-control none --metrics gpu__time_duration.sum $bin/tools/moekit run --preset "$preset" \
        --weights-format bf16 --tokens "$t" --seed $((1 + t)) 2>&1 | grep -E '^  [a-zA-Z]|gpu__time_duration' |
        sed -E 's/\(unnamed namespace\)|<unnamed>:://g; s/^ +//' | paste - - | awk -F'\t' '{n=split($2, a, " +"); printf "  %-70.70s %8s %s\n", $1, a[n], a[n-1]}'
    done
  done >"$OUT/ncu.txt" 2>&1
  cat "$OUT/ncu.txt" >>"$summary"
fi

# ncu on one sweep GEMM (the third launch of the CUTLASS kernel); the arguments are ncu's.
ncu_sweep_gemm() {
  ncu --clock-control none -k regex:device_kernel --launch-skip 2 --launch-count 1 "$@" \
    $bin/bench/moekit_gemm_sweep "${MOEKIT_SWEEP_TOKENS:-16384}" "${MOEKIT_SWEEP_PRESETS:-qwen3-30b-a3b}"
}

if want ncu-gemm; then
  ncu_sweep_gemm --section SpeedOfLight --section WarpStateStats \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct \
    >"$OUT/ncu-gemm.txt" 2>&1
  echo "ncu-gemm: rc=$?" >>"$OUT/ncu-gemm.txt"
  grep -v '^==PROF==' "$OUT/ncu-gemm.txt" | tail -60 >>"$summary"
fi

if want ncu-source; then
  ncu_sweep_gemm --section SourceCounters --section WarpStateStats --page source --print-source sass \
    --csv >"$OUT/ncu-source.csv" 2>"$OUT/ncu-source.err"
  echo "ncu-source: rc=$?" >>"$summary"
  python3 scripts/ncu_top_stalls.py "$OUT/ncu-source.csv" 30 >>"$summary" 2>&1
fi

# Step "ncu-forward": one kernel of one forward (`moekit run`) under ncu: its first launch whose
# demangled name matches MOEKIT_NCU_KERNEL (default "device_kernel": FC1's CUTLASS kernel at
# prefill), for MOEKIT_BENCH_PRESETS' first preset at MOEKIT_NCU_TOKENS' first count (default
# 16384). Speed of light, pipe utilization, memory workload and warp states, then the
# warp-stall samples by SASS line (the 30 lines with the most). For kernels the sweep cannot run
# alone (the 2026-12-02 gathering FC1).
if want ncu-forward; then
  preset=$(echo "${MOEKIT_BENCH_PRESETS:-qwen3-30b-a3b}" | cut -d, -f1)
  t=$(echo "${MOEKIT_NCU_TOKENS:-16384}" | cut -d, -f1)
  ncu_forward() {
    ncu --clock-control none --kernel-name-base demangled -k "regex:${MOEKIT_NCU_KERNEL:-device_kernel}" \
      --launch-count 1 "$@" \
      $bin/tools/moekit run --preset "$preset" --weights-format bf16 --tokens "$t" --seed $((1 + t))
  }
  { echo "== ncu-forward $preset T=$t kernel ${MOEKIT_NCU_KERNEL:-device_kernel}"
    ncu_forward --section SpeedOfLight --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis --section WarpStateStats 2>&1 | grep -v '^==PROF=='
  } >"$OUT/ncu-forward.txt" 2>&1
  tail -80 "$OUT/ncu-forward.txt" >>"$summary"
  ncu_forward --section SourceCounters --section WarpStateStats --page source --print-source sass \
    --csv >"$OUT/ncu-forward-source.csv" 2>"$OUT/ncu-forward-source.err"
  echo "ncu-forward source: rc=$?" >>"$summary"
  python3 scripts/ncu_top_stalls.py "$OUT/ncu-forward-source.csv" 30 >>"$summary" 2>&1
fi

# Step "hang": for a forward that hangs. `moekit bench` runs MOEKIT_BENCH_PRESETS' first preset
# at MOEKIT_BENCH_TOKENS' first count in the background. If it still runs after MOEKIT_HANG_WAIT
# seconds (default 30), cuda-gdb attaches three times: the kernels and the SMs still busy
# (hang-sms.txt), those SMs' warps with their PCs (hang-warps.txt), and each PC as symbol +
# offset (hang-pcs.txt; the offset is the address in `cuobjdump -sass` of the same program).
# The summary lists each warp (block, first thread, PC, offset). The run is killed after that.
# H200, 2026-12-02 found its hang this way: one warp of a warp group a tile behind the others.
if want hang; then
  preset=$(echo "${MOEKIT_BENCH_PRESETS:-deepseek-v3}" | cut -d, -f1)
  t=$(echo "${MOEKIT_BENCH_TOKENS:-16384}" | cut -d, -f1)
  $bin/tools/moekit bench --preset "$preset" --tokens "$t" --flush none >"$OUT/hang-bench.txt" 2>&1 &
  pid=$!
  sleep "${MOEKIT_HANG_WAIT:-30}"
  if kill -0 $pid 2>/dev/null; then
    echo "hang: $preset T=$t still running after ${MOEKIT_HANG_WAIT:-30} s" >>"$summary"
    attached() { timeout 200 cuda-gdb -batch -p $pid "$@" 2>&1; }  # one batch of commands
    attached -ex "info cuda kernels" -ex "info cuda sms" >"$OUT/hang-sms.txt"
    # `info cuda sms` rows: [*] SM mask
    sms=$(awk '$1 == "*" {$1 = ""} {$0 = $0} NF == 2 && $1 ~ /^[0-9]+$/ && $2 ~ /^0x/ {print $1}' "$OUT/hang-sms.txt")
    gdb_args=()
    for sm in $sms; do gdb_args+=(-ex "cuda sm $sm" -ex "info cuda warps"); done
    attached "${gdb_args[@]}" >"$OUT/hang-warps.txt"
    # `info cuda warps` rows: [*] warp lanes divergent PC kernel (block) (first thread)
    awk '$1 == "*" {$1 = ""} {$0 = $0} NF == 7 && $4 ~ /^0x/ {print $6, $7, $4}' "$OUT/hang-warps.txt" |
      sort -u >"$OUT/hang-warp-pcs.txt"
    gdb_args=()
    for pc in $(awk '{print $3}' "$OUT/hang-warp-pcs.txt" | sort -u); do gdb_args+=(-ex "x/1i $pc"); done
    attached "${gdb_args[@]}" >"$OUT/hang-pcs.txt"
    kill -9 $pid 2>/dev/null
    { grep -m3 -A2 "Kernel Parent" "$OUT/hang-sms.txt" | cut -c1-200
      echo "busy SMs: $(echo $sms)"
      echo "warps (block, first thread, PC, offset in the kernel's SASS):"
      while read -r block thread pc; do
        # x/1i prints "0x<pc> <kernel+offset>:" (the kernel's name holds '<' and '>' itself)
        off=$(grep -m1 "0x$(printf %x "$((pc))") " "$OUT/hang-pcs.txt" | grep -oE '\+[0-9]+>:' | tr -dc 0-9)
        printf '  %s %s %s %s\n' "$block" "$thread" "$pc" "${off:+0x$(printf %x "$off")}"
      done <"$OUT/hang-warp-pcs.txt" | head -80; } >>"$summary"  # all of them in hang-warp-pcs.txt
  else
    echo "hang: $preset T=$t ended within ${MOEKIT_HANG_WAIT:-30} s" >>"$summary"
    tail -5 "$OUT/hang-bench.txt" >>"$summary"
  fi
fi

if want clocks; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 100 >"$OUT/clocks.csv" 2>&1 &
  smi=$!
  sleep 1
  $bin/tools/moekit bench --preset "${MOEKIT_BENCH_PRESETS:-qwen3-30b-a3b,gpt-oss-120b}" \
    --tokens "${MOEKIT_CLOCK_TOKENS:-16384}" --flush "${MOEKIT_FLUSH:-read}" >"$OUT/clocks-bench.txt" 2>&1
  sleep 1
  kill $smi
  { cat "$OUT/clocks-bench.txt"
    echo "SM clock under the bench (MHz; nvidia-smi every 100 ms): distribution of readings"
    awk -F', ' 'NR > 1 {print $2}' "$OUT/clocks.csv" | sort | uniq -c | sort -k2 -n | tail -25
    echo "power (W) max: $(awk -F', ' 'NR > 1 {gsub(/ W/, "", $4); if ($4 + 0 > m + 0) m = $4} END {print m}' "$OUT/clocks.csv")"
    awk -F', ' 'NR > 1 {print $6}' "$OUT/clocks.csv" | sort | uniq -c; } >>"$summary"
fi
cat "$summary"
