#!/usr/bin/env bash
# GPU round, part A (carry [".device"]): full build, the whole CTest suite, the CUDA flex tests
# and the flex rows for each forward tile in FWD_TILES (kiln alone, KILN_FLEX_FWD_TILE=MxNxMT;
# torch beside it comes from compare_torch.py in part B, round_b.sh, on the warm machine).
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
bash scripts/device/gpu_round.sh none || exit 1
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
ctest --test-dir build-gpu -j12 --output-on-failure --timeout 120 > "$OUT/ctest.log" 2>&1
grep -E "tests passed|tests failed|Total Test time" "$OUT/ctest.log"
grep -E "\((Failed|Timeout|Subprocess|Exception)" "$OUT/ctest.log" | head -20
grep -E "^\[  FAILED|Failure|Expected|Which is|actual" "$OUT/ctest.log" | head -30
rows=(
  "causal|--batch 4 --heads 16 --seq 8192 --head-dim 128 --mask causal"
  "document16|--batch 1 --heads 16 --seq 32768 --head-dim 128 --mask document:16"
  "sliding256|--batch 1 --heads 8 --seq 32768 --head-dim 64 --mask sliding:256"
  "train_doc|--batch 4 --heads 12 --seq 4096 --head-dim 64 --mask document:4"
)
export KILN_CACHE_DIR=/tmp/kiln-cache-a
for tile in ${FWD_TILES:-64x64x1}; do
  KILN_FLEX_FWD_TILE=$tile timeout 100 build-gpu/tests/test_flex --gtest_filter='FlexAttentionCuda*' > "$OUT/flex_tests_$tile.log" 2>&1
  echo "tile $tile: $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/flex_tests_$tile.log" | head -3 | tr '\n' ' ')"
  grep -E "Failure" -A4 "$OUT/flex_tests_$tile.log" | head -12
  for row in "${rows[@]}"; do
    name=${row%%|*}; args=${row#*|}
    KILN_FLEX_FWD_TILE=$tile timeout 60 build-gpu/kiln bench flex --device cuda $args --dtype bf16 --json --reps 10 > "$OUT/flex_${name}_$tile.jsonl" 2>&1
    echo "  $name $(grep -E '"variant": "flex"' "$OUT/flex_${name}_$tile.jsonl" | cut -c1-110)"
  done
done
