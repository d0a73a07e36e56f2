#!/usr/bin/env bash
# Session 14's GPU round (carry [".device"], built by pack.sh). PARTS (default all, in order):
#   tests:   the CUDA flex suite at the defaults (TEST_TIMEOUT, FLEX_FILTER);
#   ab:      kiln alone on ROWS (default 0: the E = 64 window; or AB_BENCH, `kiln bench flex` arguments)
#            with AB_VAR at each of AB_VALUES, interleaved, AB_PASSES passes (default 2);
#   compare: compare_torch.py's flex rows CMP_ROWS (default 0,1,2,4) beside torch.
# Logs to stdout and $OUT/session14.log (compare: $OUT/compare_flex.txt and JSON).
set -uo pipefail
LOG_NAME=session14.log
. scripts/device/prelude.sh
. scripts/device/flex_rows.sh
export KILN_CACHE_DIR=/tmp/kiln-cache-s14
log "commit $(cat .device/commit)"
for part in ${PARTS:-tests ab compare}; do
  case $part in
    tests)
      timeout ${TEST_TIMEOUT:-260} build-gpu/tests/test_flex --gtest_filter="${FLEX_FILTER:-FlexAttentionCuda*}" > "$OUT/flex_tests.log" 2>&1
      log "flex tests (rc $?): $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/flex_tests.log" | tr '\n' ' ') $(grep 'test suite ran' "$OUT/flex_tests.log")"
      grep -E "Failure|^\[  FAILED" -A6 "$OUT/flex_tests.log" | head -40 | tee -a "$OUT/$LOG_NAME" ;;
    ab)
      for pass in $(seq "${AB_PASSES:-2}"); do
        for r in ${ROWS:-0}; do
          args=${AB_BENCH:-${ISSUE_ROWS[$r]}}
          for x in ${AB_VALUES:?}; do
            line=$(export "${AB_VAR:?}=$x"; flex_bench_line $args)
            log "row $r $AB_VAR=$x $line"
          done
        done
      done ;;
    compare)
      KILN_PY=/tmp/kiln-py SKIP_BUILD=1 PARTS=compare CMP_TIMEOUT=${CMP_TIMEOUT:-400} CMP_ARGS="--rows ${CMP_ROWS:-0,1,2,4}" \
        bash scripts/device/round_c.sh > "$OUT/compare.log" 2>&1
      grep -v Warn "$OUT/compare_flex.txt" 2>/dev/null | tee -a "$OUT/$LOG_NAME" | grep -A8 '^flex' ;;
  esac
done
