#!/usr/bin/env bash
# A short GPU round (carry [".device"]) for a nearly spent device budget, ordered by what has no GPU
# figure yet (the device budget was nearly spent): build, CTest, the causal FlexAttention row
# beside torch and the sliding row, the 125M training step beside PyTorch eager, pytest
# (bounded), kiln's LCE variants. Logs and JSON under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
bash scripts/device/gpu_round.sh none || exit 1
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=/tmp/kiln-cache
ctest --test-dir build-gpu -j12 --output-on-failure --timeout 90 > "$OUT/ctest.log" 2>&1
grep -E "tests passed|tests failed" "$OUT/ctest.log"; grep -E "\((Failed|Timeout)" "$OUT/ctest.log" | head
grep -E "^\[  FAILED|Failure" "$OUT/ctest.log" | head -10
{
  echo "row causal 4x16x8192x128"
  timeout 40 build-gpu/kiln bench flex --device cuda --batch 4 --heads 16 --seq 8192 --head-dim 128 --mask causal --dtype bf16 --json --reps 10 2>&1 | grep -E '"flex"|first_call.*"flex"|block_mask|rror'
  timeout 50 python3 .device/torch_baselines.py flex --batch 4 --heads 16 --seq 8192 --head-dim 128 --mask causal 2>&1 | grep -E "torch_flex|sdpa"
  echo "row sliding:256 1x8x32768x64"
  timeout 30 build-gpu/kiln bench flex --device cuda --batch 1 --heads 8 --seq 32768 --head-dim 64 --mask sliding:256 --dtype bf16 --json --reps 10 2>&1 | grep -E '"flex"|first_call.*"flex"|block_mask|rror'
} 2>&1 | tee "$OUT/flex.txt"
echo "== train 125M"
timeout ${TRAIN_TIMEOUT:-100} python3 scripts/device/train_bench.py --kiln build-gpu/kiln --frameworks kiln,eager --steps 4 --warmup 2 --timeout 45 --out "$OUT/train_bench.json" 2>&1 | tail -25 | tee "$OUT/train.txt"
PYTHONPATH=build-gpu/python timeout ${PYTEST_TIMEOUT:-45} python3 -m pytest python/tests -q -rs > "$OUT/pytest.log" 2>&1; tail -3 "$OUT/pytest.log"
echo "== lce N=8192 H=4096 V=128256"
build-gpu/bench/bench_lce --device cuda --dtype bf16 --json --iters 3 --tokens 8192 --hidden 4096 --vocab 128256 --variants gemm3,memory,speed 2>&1 | tee "$OUT/lce.txt"
