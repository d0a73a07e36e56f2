#!/usr/bin/env bash
# A session's closing GPU round (carry [".device"]; `bash scripts/device/pack.sh` with the Python
# package): the CUDA tests of flex, lce, ops and train, the fused loss beside torch (lce_round.sh,
# speed and memory once, then gemm3), and compare_torch.py's flex rows CMP_ROWS (default 0,3,4,5).
set -uo pipefail
LOG_NAME=final_check.log
. scripts/device/prelude.sh
log "commit $(cat .device/commit)"
for t in "test_flex FlexAttentionCuda*" "test_ops *Cuda*" "test_train TrainCuda*"; do
  set -- $t
  timeout 200 build-gpu/tests/$1 --gtest_filter="$2" > "$OUT/$1.log" 2>&1
  log "$1 $2: $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/$1.log" | tr '\n' ' ')"
  grep -E "Failure" -A6 "$OUT/$1.log" | head -20 | tee -a "$OUT/$LOG_NAME"
done
LCE_AB=X=0 LCE_AB_VARIANTS=speed,memory LCE_VARIANTS=gemm3 bash scripts/device/lce_round.sh 2>&1 | cut -c1-200 |
  tee -a "$OUT/$LOG_NAME"
KILN_PY=/tmp/kiln-py SKIP_BUILD=1 PARTS=compare CMP_TIMEOUT=${CMP_TIMEOUT:-260} CMP_ARGS="--rows ${CMP_ROWS:-0,3,4,5}" \
  bash scripts/device/round_c.sh > "$OUT/compare.log" 2>&1
grep -A40 "^benchmark" "$OUT/compare.log" | tee -a "$OUT/$LOG_NAME"
