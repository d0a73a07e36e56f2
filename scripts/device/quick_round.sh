#!/usr/bin/env bash
# A short round for the last seconds of a session's device budget (carry [".device"]): the flex
# rows with and without QUICK_ENV (default the persistent forward), its bitwise test, the LCE chunk
# test and the LCE speed strategy against gemm3. Output lines go to stdout and $OUT/quick.log as
# they come, so a run cut short still reports what it finished.
set -uo pipefail
LOG_NAME=quick.log
. scripts/device/prelude.sh
log "commit $(cat .device/commit)"
. scripts/device/flex_rows.sh
for row in "${FLEX_ROWS[@]}"; do
  name=${row%%|*}; args=${row#*|}
  for setting in X=0 ${QUICK_ENV:-KILN_FLEX_FWD_PERSIST=1}; do
    log "  $setting $name $(env ${setting//,/ } timeout 30 build-gpu/kiln bench flex --device cuda $args --dtype bf16 --json --reps 30 --flex-only 2>&1 | grep -E '"variant": "flex"' | cut -c1-80)"
  done
done
log "persistent test: $(timeout 60 build-gpu/tests/test_flex --gtest_filter='*Persistent*' 2>&1 | grep -E '^\[  (PASSED|FAILED)' | tr '\n' ' ')"
log "lce chunk test: $(timeout 60 build-gpu/tests/test_lce --gtest_filter='*SixteenBit*' 2>&1 | grep -E '^\[  (PASSED|FAILED)|Failure|Expected|Which' | head -6 | tr '\n' ' ')"
log "lce: $(timeout 60 /tmp/kiln-bin/bin/bench_lce --device cuda --dtype bf16 --json --iters 3 --tokens 8192 --hidden 4096 --vocab 128256 --variants gemm3,speed 2>&1 | cut -c1-110 | tr '\n' ' ')"
