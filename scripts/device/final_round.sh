#!/usr/bin/env bash
# The session's closing GPU round on the H200 (carry [".device"]), ordered by what has no GPU
# figure yet: build, CTest, the FlexAttention rows beside torch, the 125M training step beside
# PyTorch eager, pytest (bounded), the LCE shape beside torch. Logs and JSON under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
LOG=/tmp/kiln-logs
bash scripts/device/gpu_round.sh none || exit 1
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=/tmp/kiln-cache
ctest --test-dir build-gpu -j8 --output-on-failure --timeout 120 > "$OUT/ctest.log" 2>&1
grep -E "tests passed|tests failed" "$OUT/ctest.log"; grep -E "\((Failed|Timeout)" "$OUT/ctest.log" | head
grep -E "^\[  FAILED|Failure" "$OUT/ctest.log" | head -10
{
  for row in "4 16 8192 128 causal" "1 8 32768 64 sliding:256" "1 16 32768 128 document:16"; do
    set -- $row
    echo "row B=$1 H=$2 S=$3 D=$4 mask=$5"
    timeout 60 build-gpu/kiln bench flex --device cuda --batch $1 --heads $2 --seq $3 --head-dim $4 --mask $5 --dtype bf16 --json --reps 10 2>&1 | grep -E '"flex"|first_call.*"flex"|block_mask|rror'
    [ "$5" = document:16 ] || timeout 60 python3 .device/torch_baselines.py flex --batch $1 --heads $2 --seq $3 --head-dim $4 --mask $5 2>&1 | grep -E "torch_flex|torch_block|sdpa"
  done
  echo "warm (second process, disk cache):"
  timeout 60 build-gpu/kiln bench flex --device cuda --batch 4 --heads 16 --seq 8192 --head-dim 128 --mask causal --dtype bf16 --json --reps 3 2>&1 | grep -E 'first_call.*"flex"'
} 2>&1 | tee "$OUT/flex.txt"
echo "== train 125M"
timeout ${TRAIN_TIMEOUT:-110} python3 scripts/device/train_bench.py --kiln build-gpu/kiln --frameworks ${TRAIN_FRAMEWORKS:-kiln,eager} --steps 4 --warmup 2 --timeout 50 --out "$OUT/train_bench.json" 2>&1 | tail -25 | tee "$OUT/train.txt"
PYTHONPATH=build-gpu/python timeout ${PYTEST_TIMEOUT:-80} python3 -m pytest python/tests -q -x -rs > "$OUT/pytest.log" 2>&1; tail -3 "$OUT/pytest.log"
{
  echo "== lce N=8192 H=4096 V=128256"
  build-gpu/bench/bench_lce --device cuda --dtype bf16 --json --iters 5 --tokens 8192 --hidden 4096 --vocab 128256 --variants gemm3,memory,speed
  timeout 90 python3 .device/torch_baselines.py lce --tokens 8192 --hidden 4096 --vocab 128256 | grep -E "compile|eager|gemm3"
} 2>&1 | tee "$OUT/lce.txt"
