#!/usr/bin/env bash
# Nsight Compute on the flex kernels (carry [".device"]; run after round_d.sh has unpacked the
# binaries into build-gpu/): one launch of KERNEL (default flex_fwd) per row of NCU_ROWS
# (name|bench args), the speed-of-light, occupancy, warp-state and memory sections; full text
# under $OUT/ncu_<row>.txt, a few headline lines printed. Extra env: NCU_ENV (VAR=VALUE,...).
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=/tmp/kiln-cache-c
NCU_ENV=${NCU_ENV:-}
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
kernel=${KERNEL:-flex_fwd}
IFS=';' read -ra rows <<< "${NCU_ROWS:-causal|--batch 4 --heads 16 --seq 8192 --head-dim 128 --mask causal;document16|--batch 1 --heads 16 --seq 32768 --head-dim 128 --mask document:16}"
for row in "${rows[@]}"; do
  name=${row%%|*}; args=${row#*|}
  f="$OUT/ncu_${kernel}_${name}${NCU_ENV:+_${NCU_ENV//[^A-Za-z0-9]/_}}.txt"
  env ${NCU_ENV//,/ } timeout 120 "$ncu" --clock-control none --target-processes all --kernel-name "$kernel" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
    --section LaunchStats --section SchedulerStats --print-details all \
    build-gpu/kiln bench flex --device cuda $args --dtype bf16 --reps 3 --flex-only > "$f" 2>&1
  echo "== ncu $kernel $name ${NCU_ENV:-}"
  grep -E "^ +(Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Hit Rate|L1/TEX Hit Rate|Achieved Occupancy|Registers Per Thread|Warp Cycles Per Issued Instruction|Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Stall [A-Za-z ]+) " "$f" | head -40
  grep -iE "stall|error|ERR" "$f" | grep -v "^ +Stall" | head -8
done
