#!/usr/bin/env bash
# LCE round on the H200 (carry [".device"]): build, the LCE tests, per-phase timing, then each
# shape of the LCE issue with kiln's variants and torch's figures side by side in one run.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
bash scripts/device/gpu_round.sh none || exit 1
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
build-gpu/tests/test_lce --gtest_brief=1 2>&1 | tail -5
b="build-gpu/bench/bench_lce --device cuda --dtype bf16 --json --iters 5"
{
  $b --tokens 8192 --hidden 4096 --vocab 128256 --variants phases --chunk-tokens 1024
  for shape in "8192 4096 128256" "8192 2304 256000" "32768 4096 128256"; do
    set -- $shape
    echo "shape N=$1 H=$2 V=$3"
    variants=gemm3,memory,speed; [ "$1" = 8192 ] && [ "$2" = 4096 ] && variants=$variants,unfused
    $b --tokens $1 --hidden $2 --vocab $3 --variants $variants
    for extra in ${LCE_EXTRA:-}; do $b --tokens $1 --hidden $2 --vocab $3 ${extra//,/ }; done
    timeout 200 python3 .device/torch_baselines.py lce --tokens $1 --hidden $2 --vocab $3
  done
} 2>&1 | tee "$OUT/lce_sweep.txt"
