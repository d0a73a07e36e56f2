#!/usr/bin/env bash
# The memory strategy's fused-epilogue GEMMs (KILN_LCE_WGMMA=1, sm_90a) on the H200 (carry
# [".device"], binaries from `SKIP_PY=1 bash scripts/device/pack.sh`): test_lce's CUDA tests (the
# fused ones among them); at each of SHAPES (";"-separated) PASSES interleaved passes of the speed
# and memory strategies and gemm3 with the switch off, then both strategies with it on, in 1- and
# 2-CTA clusters; the fused kernels alone beside cuBLASLt's GEMM of their shape (bench_lce --variants
# phases); torch's baselines at the first shape. ~6-8 min. Logs to stdout and $OUT/lce_fused.log.
set -uo pipefail
LOG_NAME=lce_fused.log
. scripts/device/prelude.sh
L=/tmp/kiln-bin/bin/bench_lce
log "commit $(cat .device/commit)"
timeout 300 build-gpu/tests/test_lce --gtest_filter='*Cuda*' > "$OUT/test_lce_cuda.log" 2>&1
log "test_lce CUDA: $(grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED' "$OUT/test_lce_cuda.log" | head -3 | tr '\n' ' ')"
grep -E "Failure|SKIPPED \]" -A8 "$OUT/test_lce_cuda.log" | head -40 | tee -a "$OUT/$LOG_NAME"
default_shapes="--tokens 8192 --hidden 4096 --vocab 128256;--tokens 8192 --hidden 2304 --vocab 256000"
default_shapes="$default_shapes;--tokens 32768 --hidden 4096 --vocab 128256"
IFS=';' read -ra shapes <<< "${SHAPES:-$default_shapes}"
if [ -z "${SKIP_TORCH:-}" ]; then
  timeout 200 python3 .device/torch_baselines.py lce ${shapes[0]} 2>&1 | grep variant |
    while read -r l; do log "torch ${shapes[0]} $l"; done
fi
for sh in "${shapes[@]}"; do
  for pass in $(seq "${PASSES:-2}"); do
    for setting in off on on_c2; do
      variants=speed,memory
      [ $setting = off ] && variants=speed,memory,gemm3
      ( [ $setting != off ] && export KILN_LCE_WGMMA=1
        [ $setting = on_c2 ] && export KILN_LCE_WGMMA_CLUSTER=2
        timeout 200 $L --device cuda --dtype bf16 --json --iters 5 $sh --variants $variants 2>&1 ) |
        while read -r l; do log "$sh pass $pass $setting $l"; done
    done
  done
  for c in 1 2; do
    KILN_LCE_WGMMA=1 KILN_LCE_WGMMA_CLUSTER=$c timeout 150 $L --device cuda --dtype bf16 --json $sh --variants phases \
      2>&1 | grep -E '"fused|"memory"|rror' | while read -r l; do log "$sh phases cluster $c $l"; done
  done
done
