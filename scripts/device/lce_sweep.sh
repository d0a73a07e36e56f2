#!/usr/bin/env bash
# LCE investigation round on the H200 (carry [".device"]): build, the torch-vs-kiln diagnostic,
# then a chunk-size sweep of the fused strategies beside the three GEMMs alone.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
bash scripts/device/gpu_round.sh none || exit 1
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
PYTHONPATH=build-gpu/python timeout 200 python3 scripts/device/lce_diag.py 2>&1 | tee "$OUT/lce_diag.txt"
b="build-gpu/bench/bench_lce --device cuda --tokens 8192 --hidden 4096 --vocab 128256 --dtype bf16 --json --iters 5"
{
  $b --variants gemm3
  for cfg in "4096 2048" "8192 1024" "8192 2048" "4096 4096" "2048 8192" "8192 4096"; do
    set -- $cfg
    echo "memory chunk_tokens=$1 chunk_vocab=$2"; $b --variants memory --chunk-tokens $1 --chunk-vocab $2
  done
  for ct in 1024 2048 4096 8192; do echo "speed chunk_tokens=$ct"; $b --variants speed --chunk-tokens $ct; done
} 2>&1 | tee "$OUT/lce_sweep.txt"
