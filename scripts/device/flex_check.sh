#!/usr/bin/env bash
# A short flex round (carry [".device"]): the CUDA flex suite, then kiln alone on the score_mod rows
# (ALiBi, softcap 30) at 1x16x16384x128 causal; logs to stdout and $OUT/flex_check.log as it goes.
set -uo pipefail
LOG_NAME=flex_check.log
. scripts/device/prelude.sh
log "commit $(cat .device/commit)"
timeout ${TEST_TIMEOUT:-100} build-gpu/tests/test_flex --gtest_filter="${FLEX_FILTER:-FlexAttentionCuda*}" > "$OUT/flex_tests.log" 2>&1
log "flex tests: $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/flex_tests.log" | tr '\n' ' ') $(tail -1 "$OUT/flex_tests.log")"
grep -E "Failure" -A6 "$OUT/flex_tests.log" | head -30 | tee -a "$OUT/flex_check.log"
for score in alibi softcap:30; do
  log "$score $(timeout 30 build-gpu/kiln bench flex --device cuda --batch 1 --heads 16 --seq 16384 --head-dim 128 --mask causal --score $score --dtype bf16 --json --reps 20 --flex-only 2>&1 | grep '"variant": "flex"' | cut -c1-90)"
done
