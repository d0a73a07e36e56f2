#!/usr/bin/env bash
# A flex switch on the GPU (carry [".device"]): the CUDA flex suite at the defaults, then kiln alone
# on the issue's seven rows with AB_VAR at each of AB_VALUES (default "0 1") interleaved (AB_PASSES
# times, default 2; ROWS, default all). Logs to stdout and $OUT/flex_ab.log. e.g.
#   AB_VAR=KILN_FLEX_BWD_CONCURRENT bash scripts/device/flex_ab.sh
set -uo pipefail
LOG_NAME=flex_ab.log
. scripts/device/prelude.sh
var=${AB_VAR:?AB_VAR names the switch}
values=${AB_VALUES:-0 1}
log "commit $(cat .device/commit), $var: $values"
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout ${TEST_TIMEOUT:-150} build-gpu/tests/test_flex --gtest_filter="${FLEX_FILTER:-FlexAttentionCuda*}" > "$OUT/flex_tests.log" 2>&1
  log "flex tests: $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/flex_tests.log" | tr '\n' ' ') $(tail -1 "$OUT/flex_tests.log")"
  grep -E "Failure" -A6 "$OUT/flex_tests.log" | head -30 | tee -a "$OUT/$LOG_NAME"
fi
. scripts/device/flex_rows.sh
for pass in $(seq "${AB_PASSES:-2}"); do
  for r in ${ROWS:-0 1 2 3 4 5 6}; do
    for x in $values; do
      line=$(export "$var=$x"; flex_bench_line ${ISSUE_ROWS[$r]})
      log "row $r $var=$x $line"
    done
  done
done
