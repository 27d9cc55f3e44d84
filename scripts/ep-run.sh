#!/usr/bin/env bash
# The expert-parallel run on a machine with several GPUs (one process per GPU), from the
# repository root: what the single-GPU calls cannot check. Programs from $MOEKIT_BIN (a folder
# holding moekit and moekit_tests: build/variants/NAME after `scripts/device.sh variants`, or a
# build's tools/ and tests/ copied together); logs and a summary under $OUT. Usage:
#   MOEKIT_BIN=build/variants/head OUT=/tmp/ep bash scripts/ep-run.sh [tests] [launch] [dead] [bench]
#   (default: all four, in that order)
# - tests: the NCCL path's GPU tests (one process, every visible GPU): NcclWorld*, EpLayerDevice*.
# - launch: `moekit run --ep-size N --check` against the CPU reference under torchrun, and under
#   mpirun where the machine has it, for bf16 and fp8_block128 (every strategy: auto and forced).
# - dead: ranks started by hand (torchrun's agent would end the others itself) with
#   MOEKIT_COMM_TIMEOUT_MS=10000; one rank killed (SIGKILL) or paused (SIGSTOP) after the layer
#   is built, mid-run: every other rank must exit with kComm naming the wait within the timeout
#   and a margin, never hang (a `timeout` around each rank says which did).
# - bench: the peer-copy rate between GPU 0 and 1 (PyTorch, 1 GiB), then `moekit bench --ep-size
#   N` for deepseek-v3 (bf16 and fp8_block128) and qwen3-30b-a3b at T = 1 .. 16384 per rank.
# NVLink multicast stays off (the device notes), also in every environment a launcher builds.
set -uo pipefail
: "${OUT:?set OUT}" "${MOEKIT_BIN:?set MOEKIT_BIN}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT"
steps=("$@"); ((${#steps[@]})) || steps=(tests launch dead bench)
want() { [[ " ${steps[*]} " == *" $1 "* ]]; }
summary="$OUT/ep-summary.txt"
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
{
  echo "date $(date -u +%FT%TZ), $gpus GPUs, programs $(cat "$MOEKIT_BIN/commit" 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sort | uniq -c
  nvidia-smi topo -m 2>/dev/null | head -n $((gpus + 2))
} >"$summary"
if ((gpus < 2)); then
  echo "ep-run: $gpus GPU visible; expert parallelism over NCCL needs at least two" | tee -a "$summary"
  exit 0
fi
moekit="$PWD/$MOEKIT_BIN/moekit"
sizes=(2); ((gpus >= 4)) && sizes+=(4); ((gpus >= 8)) && sizes+=(8)

if want tests; then
  timeout 900 "$MOEKIT_BIN/moekit_tests" --gtest_filter='NcclWorld*:EpLayerDevice*:EpDispatchKernels*' \
    >"$OUT/ep-tests.log" 2>&1
  echo "tests rc=$?: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/ep-tests.log" | tr '\n' ' ')" >>"$summary"
fi

if want launch; then
  for n in "${sizes[@]}"; do
    for fmt in bf16 fp8_block128; do
      for strategy in auto all_to_all all_to_all_low_latency all_gather_reduce_scatter; do
        log="$OUT/launch-torchrun-$n-$fmt-$strategy.log"
        timeout 600 torchrun --no-python --nproc-per-node "$n" "$moekit" run --preset deepseek-v3 \
          --weights-format "$fmt" --experts 64 --hidden 2048 --intermediate 512 --ep-size "$n" --tokens 64 --check \
          --ep-strategy "$strategy" >"$log" 2>&1
        echo "torchrun n=$n $fmt $strategy rc=$?: $(grep -m1 -iE 'rel|error' "$log")" >>"$summary"
      done
    done
    if command -v mpirun >/dev/null; then
      log="$OUT/launch-mpirun-$n.log"
      timeout 600 mpirun --allow-run-as-root -np "$n" -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS "$moekit" run \
        --preset deepseek-v3 --experts 64 --hidden 2048 --intermediate 512 --ep-size "$n" --tokens 64 --check >"$log" 2>&1
      echo "mpirun n=$n rc=$?: $(grep -m1 -iE 'rel|error' "$log")" >>"$summary"
    else
      echo "mpirun n=$n: no mpirun on this machine" >>"$summary"
    fi
  done
fi

# Starts rank r of a world of 2 by hand, as torchrun would (its own log).
start_rank() {
  RANK=$1 WORLD_SIZE=2 LOCAL_RANK=$1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29600 \
    MOEKIT_COMM_TIMEOUT_MS=10000 timeout 120 "$moekit" bench --preset qwen3-30b-a3b --ep-size 2 \
    --tokens 4096,4096,4096,4096,4096,4096,4096,4096 >"$OUT/dead-$2-rank$1.log" 2>&1 &
  echo $!
}
if want dead; then
  for how in KILL STOP; do
    r0=$(start_rank 0 "$how"); r1=$(start_rank 1 "$how")
    sleep 20  # the rendezvous and the layer are done; the bench loop runs
    kill -"$how" "$r1"
    t0=$(date +%s); wait "$r0"; rc=$?; t1=$(date +%s)
    kill -KILL "$r1" 2>/dev/null; wait "$r1" 2>/dev/null
    echo "dead rank ($how): rank 0 rc=$rc after $((t1 - t0)) s (124: it hung until timeout):" \
      "$(grep -m1 -E 'kComm|waited|did not finish|Error' "$OUT/dead-$how-rank0.log")" >>"$summary"
  done
fi

if want bench; then
  python3 - >>"$summary" 2>&1 <<'EOF'
import torch
n = 1 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda:0")
b = torch.empty(n, dtype=torch.uint8, device="cuda:1")
for src, dst, name in ((a, b, "0 -> 1"), (b, a, "1 -> 0")):
    dst.copy_(src); torch.cuda.synchronize(0); torch.cuda.synchronize(1)
    start = torch.cuda.Event(enable_timing=True); stop = torch.cuda.Event(enable_timing=True)
    start.record(); [dst.copy_(src) for _ in range(5)]; stop.record(); stop.synchronize()
    print(f"peer copy {name}: {5 * n / (start.elapsed_time(stop) * 1e-3) / 1e9:.0f} GB/s")
EOF
  for n in "${sizes[@]}"; do
    for run in "deepseek-v3 bf16" "deepseek-v3 fp8_block128" "qwen3-30b-a3b bf16"; do
      set -- $run
      timeout 600 torchrun --no-python --nproc-per-node "$n" "$moekit" bench --preset "$1" --weights-format "$2" \
        --ep-size "$n" --tokens 1,8,64,512,4096,16384 >"$OUT/bench-$n-$1-$2.log" 2>&1
      echo "bench n=$n $1 $2 rc=$?" >>"$summary"
      grep -vE '^\s*$' "$OUT/bench-$n-$1-$2.log" | tail -n 14 >>"$summary"
    done
  done
fi
cat "$summary"
