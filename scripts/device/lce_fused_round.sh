#!/usr/bin/env bash
# The fused-epilogue GEMMs (KILN_LCE_WGMMA=1, sm_90a) on the H200 (carry [".device"], binaries from
# `SKIP_PY=1 bash scripts/device/pack.sh`): test_lce's CUDA tests (the fused ones among them; SKIP_TESTS=1
# skips them); torch's baselines at the first shape (SKIP_TORCH=1 skips them); at each of SHAPES
# (";"-separated; default the issue's first) PASSES interleaved passes over SETTINGS:
#   off       speed, memory and gemm3 with the switch off (the cuBLASLt tile path)
#   on, on_c2 speed and memory, the epilogue in the consumers' registers, 1- / 2-CTA clusters
#   warps, warps_c2  the same with the epilogue staged to its own warps (KILN_LCE_WGMMA_EPILOGUE=warps)
# then the fused kernels alone beside cuBLASLt's GEMM of their shape (bench_lce --variants phases) for
# each of PHASES (1, 2: registers in 1- / 2-CTA clusters; w1, w2: staged).
# ~7 min at the defaults; the other shapes in a second call: SKIP_TESTS=1 SKIP_TORCH=1 PASSES=1
# SHAPES="--tokens 8192 --hidden 2304 --vocab 256000;--tokens 32768 --hidden 4096 --vocab 128256".
# Logs to stdout and $OUT/lce_fused.log.
set -uo pipefail
LOG_NAME=lce_fused.log
. scripts/device/prelude.sh
L=/tmp/kiln-bin/bin/bench_lce
log "commit $(cat .device/commit)"
if [ -z "${SKIP_TESTS:-}" ]; then
  run_gtest cuda build-gpu/tests/test_lce '*Cuda*' 300
fi
IFS=';' read -ra shapes <<< "${SHAPES:---tokens 8192 --hidden 4096 --vocab 128256}"
if [ -z "${SKIP_TORCH:-}" ]; then
  timeout 200 python3 .device/torch_baselines.py lce ${shapes[0]} 2>&1 | grep variant |
    while read -r l; do log "torch ${shapes[0]} $l"; done
fi
# Runs bench_lce under one setting's variables: $1 the setting, the rest bench_lce's arguments.
bench() {
  local setting=$1
  shift
  ( case $setting in
      off) ;;
      on) export KILN_LCE_WGMMA=1 ;;
      on_c2) export KILN_LCE_WGMMA=1 KILN_LCE_WGMMA_CLUSTER=2 ;;
      warps) export KILN_LCE_WGMMA=1 KILN_LCE_WGMMA_EPILOGUE=warps ;;
      warps_c2) export KILN_LCE_WGMMA=1 KILN_LCE_WGMMA_EPILOGUE=warps KILN_LCE_WGMMA_CLUSTER=2 ;;
    esac
    timeout 200 $L --device cuda --dtype bf16 --json "$@" 2>&1 )
}
for sh in "${shapes[@]}"; do
  for pass in $(seq "${PASSES:-2}"); do
    for setting in ${SETTINGS:-off on on_c2 warps warps_c2}; do
      variants=speed,memory
      [ $setting = off ] && variants=speed,memory,gemm3
      bench $setting --iters 5 $sh --variants $variants | while read -r l; do log "$sh pass $pass $setting $l"; done
    done
  done
  for p in ${PHASES:-1 2 w1 w2}; do
    case $p in 1) s=on ;; 2) s=on_c2 ;; w1) s=warps ;; w2) s=warps_c2 ;; esac
    bench $s $sh --variants phases | grep -E '"fused|"memory"|rror' | while read -r l; do log "$sh phases $s $l"; done
  done
done
