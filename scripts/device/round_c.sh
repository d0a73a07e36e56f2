#!/usr/bin/env bash
# GPU round C (carry [".device"]): the wgmma forward. Builds the flex/ops targets, runs the wgmma
# probe (scripts/device/wgmma_probe: the two products against a host reference, on sources
# generated on the dev machine into .device/wgmma_probe/), the CUDA flex tests with the wgmma
# forward for each tile in WG_TILES, the flex rows for mma.sync (64x64x1) and each wgmma tile,
# then the CUDA softmax tests and the memory-bound table.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
BUILD_TARGETS="kiln_cli test_flex test_ops bench_memory_bound" bash scripts/device/gpu_round.sh none || exit 1
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=/tmp/kiln-cache-c
echo "== wgmma probe"
for src in .device/wgmma_probe/generated_*.cu; do
  tag=$(basename "$src" .cu); d=/tmp/probe_$tag; mkdir -p "$d"; cp "$src" "$d/generated.cu"
  nvcc -gencode arch=compute_90a,code=sm_90a -I "$d" scripts/device/wgmma_probe/probe.cu -o "$d/probe" > "$d/build.log" 2>&1 \
    || { echo "$tag: probe build failed"; tail -5 "$d/build.log"; continue; }
  echo "$tag:"; timeout 20 "$d/probe" 2>&1 | head -16
done
WG_TILES=${WG_TILES:-64x128x1 128x128x1 128x64x1 64x64x1}
rows=(
  "causal|--batch 4 --heads 16 --seq 8192 --head-dim 128 --mask causal"
  "document16|--batch 1 --heads 16 --seq 32768 --head-dim 128 --mask document:16"
  "sliding256|--batch 1 --heads 8 --seq 32768 --head-dim 64 --mask sliding:256"
  "train_doc|--batch 4 --heads 12 --seq 4096 --head-dim 64 --mask document:4"
)
run_tests() {  # $1 mma, $2 tile
  KILN_FLEX_FWD_MMA=$1 KILN_FLEX_FWD_TILE=$2 timeout 150 build-gpu/tests/test_flex --gtest_filter='FlexAttentionCuda*' > "$OUT/flex_tests_$1_$2.log" 2>&1
  echo "tests $1 $2: $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/flex_tests_$1_$2.log" | head -3 | tr '\n' ' ')"
  grep -E "Failure" -A4 "$OUT/flex_tests_$1_$2.log" | head -12
}
run_rows() {  # $1 mma, $2 tile
  for row in "${rows[@]}"; do
    name=${row%%|*}; args=${row#*|}
    KILN_FLEX_FWD_MMA=$1 KILN_FLEX_FWD_TILE=$2 timeout 60 build-gpu/kiln bench flex --device cuda $args --dtype bf16 --json --reps 10 > "$OUT/flex_${name}_$1_$2.jsonl" 2>&1
    echo "  $1 $2 $name $(grep -E '"variant": "flex"' "$OUT/flex_${name}_$1_$2.jsonl" | cut -c1-110)"
  done
}
first=${WG_TILES%% *}
run_tests wgmma "$first"
run_rows mma 64x64x1
for tile in $WG_TILES; do run_rows wgmma "$tile"; done
for tile in ${WG_TILES#* }; do run_tests wgmma "$tile"; done
echo "== test_ops CUDA tests"
timeout 120 build-gpu/tests/test_ops --gtest_filter='*Cuda*' > "$OUT/test_ops_cuda.log" 2>&1
grep -E "^\[  (PASSED|FAILED)|Failure" "$OUT/test_ops_cuda.log" | head -20
echo "== memory-bound (CUDA)"
timeout 150 build-gpu/bench/bench_memory_bound cuda > "$OUT/bench_memory_bound.jsonl" 2> "$OUT/bench_memory_bound.err"
sed -n '/^$/,$p' "$OUT/bench_memory_bound.jsonl" | grep -E "softmax|copy" | head -10
