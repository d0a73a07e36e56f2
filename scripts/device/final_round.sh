#!/usr/bin/env bash
# The session's closing GPU round on the H200 (carry [".device"]): build, every test, then the
# FlexAttention rows (each kernel generation in FLEX_KERNELS), the LCE shape and the 125M training
# step, each beside PyTorch in the same call. Short tables on stdout, everything under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
bash scripts/device/gpu_round.sh tests || exit 1
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
rows=("4 16 8192 128 causal" "1 8 32768 64 sliding:256" "1 16 32768 128 document:16")
first=1
for gen in ${FLEX_KERNELS:-default}; do
  if [ "$gen" = default ]; then unset KILN_FLEX_KERNELS; else export KILN_FLEX_KERNELS=$gen; fi
  export KILN_CACHE_DIR=/tmp/kiln-cache-$gen  # cold: the first call of each row compiles
  echo "== flex kernels: $gen"
  timeout 200 build-gpu/tests/test_flex --gtest_filter='FlexAttentionCuda*' --gtest_brief=1 2>&1 | grep -E "Failure|FAILED|PASSED|Expected|Which is" | head -12
  [ $first = 1 ] || rows=("${rows[0]}")  # later generations: the causal row only
  for row in "${rows[@]}"; do
    set -- $row
    echo "row B=$1 H=$2 S=$3 D=$4 mask=$5"
    timeout 100 build-gpu/kiln bench flex --device cuda --batch $1 --heads $2 --seq $3 --head-dim $4 --mask $5 --dtype bf16 --json --reps 10 2>&1 | grep -E '"flex"|first_call.*"flex"|block_mask|rror'
    [ $first = 1 ] && timeout 150 python3 .device/torch_baselines.py flex --batch $1 --heads $2 --seq $3 --head-dim $4 --mask $5 2>&1 | grep -E "torch_flex|torch_block|sdpa"
  done
  if [ $first = 1 ]; then
    echo "warm (second process, disk cache):"
    timeout 100 build-gpu/kiln bench flex --device cuda --batch 4 --heads 16 --seq 8192 --head-dim 128 --mask causal --dtype bf16 --json --reps 3 2>&1 | grep -E 'first_call.*"flex"'
  fi
  first=0
done 2>&1 | tee "$OUT/flex.txt"
{
  echo "== lce N=8192 H=4096 V=128256"
  build-gpu/bench/bench_lce --device cuda --dtype bf16 --json --iters 5 --tokens 8192 --hidden 4096 --vocab 128256 --variants gemm3,memory,speed
  timeout 90 python3 .device/torch_baselines.py lce --tokens 8192 --hidden 4096 --vocab 128256 | grep -E "compile|eager|gemm3"
} 2>&1 | tee "$OUT/lce.txt"
echo "== train 125M"
timeout ${TRAIN_TIMEOUT:-170} python3 scripts/device/train_bench.py --kiln build-gpu/kiln --steps 4 --warmup 2 --timeout 60 --out "$OUT/train_bench.json" 2>&1 | tail -25 | tee "$OUT/train.txt"
