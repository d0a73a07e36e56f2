#!/usr/bin/env bash
# The fused loss's round (carry [".device"]; binaries from scripts/device/pack.sh): test_lce's CUDA
# tests, torch's baselines (eager, torch.compile, its three GEMMs), then kiln's bench_lce with the
# speed strategy's overlaps on and off (LCE_AB settings; LCE_AB_VARIANTS, default speed), gemm3, the memory strategy and the
# per-chunk phases, at 8192 x 4096 x 128256 bf16 (LCE_SHAPE). Lines go to stdout and $OUT/lce.log
# as they come.
set -uo pipefail
LOG_NAME=lce.log
. scripts/device/prelude.sh
L=/tmp/kiln-bin/bin/bench_lce
shape=${LCE_SHAPE:-"--tokens 8192 --hidden 4096 --vocab 128256"}
log "commit $(cat .device/commit)  $(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader)"
if [ -z "${SKIP_TESTS:-}" ]; then
  run_gtest cuda build-gpu/tests/test_lce '*Cuda*' 240
fi
[ -z "${SKIP_TORCH:-}" ] && timeout 200 python3 .device/torch_baselines.py lce $shape 2>&1 | grep variant | while read -r l; do log "torch $l"; done
for setting in ${LCE_AB:-X=0 KILN_LCE_ROWPASS=0 KILN_LCE_SIDE_STREAM=0 KILN_LCE_ROWPASS=0,KILN_LCE_SIDE_STREAM=0}; do
  env ${setting//,/ } timeout 120 $L --device cuda --dtype bf16 --json --iters 5 $shape --variants ${LCE_AB_VARIANTS:-speed} 2>&1 |
    while read -r l; do log "kiln $setting $l"; done
done
timeout 200 $L --device cuda --dtype bf16 --json --iters 5 $shape --variants ${LCE_VARIANTS:-memory,gemm3,phases} 2>&1 |
  while read -r l; do log "kiln $l"; done
