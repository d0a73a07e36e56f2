#!/usr/bin/env bash
# FlexAttention CUDA round on the H200 (carry [".device"]): build, the CUDA flex tests with full
# output, every other test, then the flex benchmark rows beside torch's compiled flex_attention.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
bash scripts/device/gpu_round.sh ${FLEX_ROUND_TESTS:-tests} || exit 1
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=/tmp/kiln-cache
timeout 300 build-gpu/tests/test_flex --gtest_filter='FlexAttentionCuda*' 2>&1 | tee "$OUT/flex_cuda_tests.txt" | grep -E "^\[  (FAILED|PASSED|  OK|SKIPPED)|Failure|error|Expected|Which is|rel|Error" | head -60
rows=("4 16 8192 128 causal" "1 8 32768 64 sliding:256" "1 16 32768 128 document:16")
for row in "${rows[@]}"; do
  set -- $row
  echo "row B=$1 H=$2 S=$3 D=$4 mask=$5"
  timeout 120 build-gpu/bench/bench_flex --device cuda --batch $1 --heads $2 --seq $3 --head-dim $4 --mask $5 --dtype bf16 --json 2>&1 | tail -6
  timeout 200 python3 .device/torch_baselines.py flex --batch $1 --heads $2 --seq $3 --head-dim $4 --mask $5 2>&1 | tail -4
done | tee "$OUT/flex_bench.txt"
