#!/usr/bin/env bash
# GPU round A (carry [".device"]): build, the whole CTest suite, the flex CUDA kernels A/B
# (KILN_FLEX_KERNELS=v1|v2: tests then three rows each, cold NVRTC cache for the first call),
# and kiln's LCE variants at the main shape. Round B (ab_round_b.sh) follows on the warm
# machine. Logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
bash scripts/device/gpu_round.sh none || exit 1
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
ctest --test-dir build-gpu -j12 --output-on-failure --timeout 120 > "$OUT/ctest.log" 2>&1
grep -E "tests passed|tests failed|Total Test time" "$OUT/ctest.log"
grep -E "\((Failed|Timeout|Subprocess|Exception)" "$OUT/ctest.log" | head -20
grep -E "\*\*\*Skipped" "$OUT/ctest.log" | head -20
flex_rows=(
  "causal|--batch 4 --heads 16 --seq 8192 --head-dim 128 --mask causal"
  "sliding256|--batch 1 --heads 8 --seq 32768 --head-dim 64 --mask sliding:256"
  "document16|--batch 1 --heads 16 --seq 32768 --head-dim 128 --mask document:16"
)
for v in v1 v2; do
  export KILN_FLEX_KERNELS=$v KILN_CACHE_DIR=/tmp/kiln-cache-$v
  echo "== flex kernels $v"
  timeout 150 build-gpu/tests/test_flex --gtest_filter='FlexAttentionCuda*' > "$OUT/flex_tests_$v.log" 2>&1
  grep -E "PASSED|FAILED|Failure" "$OUT/flex_tests_$v.log" | head -12
  for row in "${flex_rows[@]}"; do
    name=${row%%|*}; args=${row#*|}
    echo "row $name"
    timeout 60 build-gpu/kiln bench flex --device cuda $args --dtype bf16 --json --reps 10 > "$OUT/flex_${v}_$name.jsonl" 2>&1
    grep -E '"flex"|block_mask|rror' "$OUT/flex_${v}_$name.jsonl" | cut -c1-300
  done
done
unset KILN_FLEX_KERNELS
echo "== lce N=8192 H=4096 V=128256"
timeout 120 build-gpu/bench/bench_lce --device cuda --dtype bf16 --json --iters 3 --tokens 8192 --hidden 4096 --vocab 128256 --variants gemm3,memory,speed 2>&1 | tee "$OUT/lce.txt" | grep variant
