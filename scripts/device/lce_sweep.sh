#!/usr/bin/env bash
# LCE investigation round on the H200 (carry [".device"]): build, the LCE tests, the per-phase
# timing, a chunk-size sweep of both strategies beside the three GEMMs alone, torch's figures.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
bash scripts/device/gpu_round.sh none || exit 1
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
ctest --test-dir build-gpu -R -i lce --output-on-failure --timeout 300 2>&1 | tail -5
b="build-gpu/bench/bench_lce --device cuda --tokens 8192 --hidden 4096 --vocab 128256 --dtype bf16 --json --iters 5"
{
  for ct in 1024 8192; do $b --variants phases --chunk-tokens $ct; done
  $b --variants gemm3,memory,speed,unfused
  for cfg in ${LCE_MEMORY_CFGS:-"8192 4096" "4096 4096" "8192 8192"}; do
    set -- $cfg
    echo "memory chunk_tokens=$1 chunk_vocab=$2"; $b --variants memory --chunk-tokens $1 --chunk-vocab $2
  done
  for ct in ${LCE_SPEED_CFGS:-1024 2048 4096}; do echo "speed chunk_tokens=$ct"; $b --variants speed --chunk-tokens $ct; done
  timeout 150 python3 .device/torch_baselines.py lce --tokens 8192 --hidden 4096 --vocab 128256
} 2>&1 | tee "$OUT/lce_sweep.txt"
