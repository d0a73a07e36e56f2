#!/usr/bin/env bash
# The session's closing GPU round on the H200 (carry [".device"]): build, every test, then the
# LCE shape, the FlexAttention rows and the 125M training step, each beside PyTorch in one run.
# FLEX_KERNELS lists kernel generations to compare (KILN_FLEX_KERNELS values; empty = default).
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
bash scripts/device/gpu_round.sh tests || exit 1
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=/tmp/kiln-cache
for gen in ${FLEX_KERNELS:-default}; do
  [ "$gen" = default ] && unset KILN_FLEX_KERNELS || export KILN_FLEX_KERNELS=$gen
  echo "flex kernels: $gen"
  timeout 200 build-gpu/tests/test_flex --gtest_filter='FlexAttentionCuda*' --gtest_brief=1 2>&1 | grep -E "Failure|FAILED|PASSED|Expected|Which|rel" | head -12
  for row in "4 16 8192 128 causal" "1 8 32768 64 sliding:256" "1 16 32768 128 document:16"; do
    set -- $row
    echo "row B=$1 H=$2 S=$3 D=$4 mask=$5"
    timeout 100 build-gpu/bench/bench_flex --device cuda --batch $1 --heads $2 --seq $3 --head-dim $4 --mask $5 --dtype bf16 --json 2>&1 | grep -E '"flex"|block_mask|rror'
    [ "$gen" = "${FLEX_KERNELS%% *}" ] || [ "$gen" = default ] && timeout 150 python3 .device/torch_baselines.py flex --batch $1 --heads $2 --seq $3 --head-dim $4 --mask $5 2>&1 | grep -E "torch_flex|torch_block|sdpa"
  done
done 2>&1 | tee "$OUT/flex.txt"
{
  echo "lce N=8192 H=4096 V=128256"
  build-gpu/bench/bench_lce --device cuda --dtype bf16 --json --iters 5 --tokens 8192 --hidden 4096 --vocab 128256 --variants gemm3,memory,speed
  timeout 150 python3 .device/torch_baselines.py lce --tokens 8192 --hidden 4096 --vocab 128256 | grep -E "compile|eager|gemm3"
} 2>&1 | tee "$OUT/lce.txt"
timeout 330 python3 scripts/device/train_bench.py --kiln build-gpu/kiln --steps 5 --warmup 2 --timeout 100 --out "$OUT/train_bench.json" 2>&1 | tail -30 | tee "$OUT/train.txt"
