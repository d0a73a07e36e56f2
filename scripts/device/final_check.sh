#!/usr/bin/env bash
# A session's closing GPU round (carry [".device"]; `bash scripts/device/pack.sh` with the Python
# package): the CUDA tests of flex, lce, ops and train, the fused loss beside torch (lce_round.sh:
# speed and memory once, then gemm3) at the issue's three shapes (LCE_MORE=' ' for the first only),
# and, when CMP_ROWS is set (e.g. 0,3,4,5), compare_torch.py's flex rows.
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
skip=
for shape in "8192 4096 128256" ${LCE_MORE:-"8192 2304 256000" "32768 4096 128256"}; do
  set -- $shape
  SKIP_TESTS=$skip LCE_SHAPE="--tokens $1 --hidden $2 --vocab $3" LCE_AB=X=0 LCE_AB_VARIANTS=speed,memory \
    LCE_VARIANTS=gemm3 bash scripts/device/lce_round.sh 2>&1 | cut -c1-200 | sed "s/^/[$1x$2x$3] /" | tee -a "$OUT/$LOG_NAME"
  skip=1
done
if [ -n "${CMP_ROWS:-}" ]; then
  KILN_PY=/tmp/kiln-py SKIP_BUILD=1 PARTS=compare CMP_TIMEOUT=${CMP_TIMEOUT:-260} CMP_ARGS="--rows $CMP_ROWS" \
    bash scripts/device/round_c.sh > "$OUT/compare.log" 2>&1
  grep -A40 "^benchmark" "$OUT/compare.log" | tee -a "$OUT/$LOG_NAME"
fi
