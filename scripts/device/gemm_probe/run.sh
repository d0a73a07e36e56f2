#!/usr/bin/env bash
# The GEMM probe on the GPU machine (no carry needed: nvcc is there): builds lse_gemm.cu for sm_90a
# and runs it; output to stdout and $OUT/lse_gemm.log. ~1 min (the 8192 x 256000 shape's buffers
# take 4 GB).
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT"
cd "$(dirname "$0")"
nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -o /tmp/lse_gemm lse_gemm.cu -lcublasLt -lcuda 2>&1 |
  grep -v "^$" | tee "$OUT/lse_gemm_build.log"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/lse_gemm.log"
timeout 300 /tmp/lse_gemm 2>&1 | tee -a "$OUT/lse_gemm.log"
