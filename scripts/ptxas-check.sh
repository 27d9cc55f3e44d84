#!/usr/bin/env bash
# Compiles the BF16 grouped-GEMM tactics (src/gemm/sm90_bf16_bf16.cu; FP16 shares their code)
# and the microscaling tensor-core tactic (src/gemm/sm90_mx_wgmma.cu) with ptxas's report and fails where ptxas says it serialized the wgmmas or spilled more than
# MOEKIT_MAX_SPILL bytes (default 64) in a kernel. Such a build is correct, only slower: narrow
# column tiles as a compile-time path once made ptxas serialize FC1's wgmmas (C7511), +4% on
# gpt-oss's forward (H200, 2026-12-02), seen only on the device. scripts/prebuild.sh runs this on
# every tactic; scripts/test.sh (CI) on the prefill pick's (MOEKIT_ONE_TACTIC=1, as its build).
# Usage: [MOEKIT_ONE_TACTIC=1] bash scripts/ptxas-check.sh [log file]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
log=${1:-build/ptxas-check.log}
mkdir -p "$(dirname "$log")"
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
launcher=$(command -v ccache || true)  # ccache replays ptxas's report on a hit
: >"$log"
for src in src/gemm/sm90_bf16_bf16.cu src/gemm/sm90_mx_wgmma.cu; do
  $launcher "$nvcc" -I include -I src -isystem .deps/cutlass/include \
    -isystem .deps/cutlass/tools/util/include -O3 -DNDEBUG -DMOEKIT_WITH_CUDA=1 \
    -DMOEKIT_WITH_CUTLASS=1 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
    -std=c++17 ${MOEKIT_ONE_TACTIC:+-DMOEKIT_ONE_TACTIC} -Xptxas -v -c "$src" -o build/ptxas-check.o >>"$log" 2>&1
done
serialized=$(grep -c '(C75[0-9][0-9])' "$log" || true)
spills=$(grep -oE '[0-9]+ bytes spill stores' "$log" | awk -v max="${MOEKIT_MAX_SPILL:-64}" \
  '$1 > max' | wc -l)
kernels=$(grep -c 'Compiling entry function' "$log" || true)
echo "ptxas-check: $kernels kernels, $serialized with serialized wgmmas, $spills spilling over ${MOEKIT_MAX_SPILL:-64} bytes ($log)"
if ((serialized > 0 || spills > 0)); then
  grep -E '\(C75[0-9][0-9]\)' "$log" | sed 's/ in the function.*//' | sort | uniq -c >&2
  exit 1
fi
