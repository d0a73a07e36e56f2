#!/usr/bin/env bash
# Codegen fast mods on the GPU (carry [".device"]): the CUDA flex suite with KILN_FLEX_FAST_MODS=1,
# kiln-alone A/B rows (fast mods off/on, interleaved twice) on the score_mod and sliding rows, then
# torch side by side on CMP_ROWS (default 5,6) with the fast mods on. Logs to $OUT/fast_mods.log.
set -uo pipefail
LOG_NAME=fast_mods.log
. scripts/device/prelude.sh
log "commit $(cat .device/commit)"
KILN_FLEX_FAST_MODS=1 timeout ${TEST_TIMEOUT:-150} build-gpu/tests/test_flex --gtest_filter="${FLEX_FILTER:-FlexAttentionCuda*}" > "$OUT/flex_tests.log" 2>&1
log "flex tests (fast mods): $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/flex_tests.log" | tr '\n' ' ') $(tail -1 "$OUT/flex_tests.log")"
grep -E "Failure" -A6 "$OUT/flex_tests.log" | head -30 | tee -a "$OUT/$LOG_NAME"
row() {  # row <name> <bench args...>
  local name=$1; shift
  for fast in 0 1; do
    log "$name fast=$fast $(KILN_FLEX_FAST_MODS=$fast timeout 40 build-gpu/kiln bench flex --device cuda "$@" --dtype bf16 --json --reps 20 --flex-only 2>&1 | grep '"variant": "flex"' | cut -c1-100)"
  done
}
for pass in 1 2; do
  row alibi --batch 1 --heads 16 --seq 16384 --head-dim 128 --mask causal --score alibi
  row softcap --batch 1 --heads 16 --seq 16384 --head-dim 128 --mask causal --score softcap:30
  row windowE64 --batch 1 --heads 8 --seq 32768 --head-dim 64 --mask sliding:256
  row doc16 --batch 1 --heads 16 --seq 32768 --head-dim 128 --mask document:16
done
if [ -n "${CMP_ROWS:-5,6}" ]; then
  export KILN_FLEX_FAST_MODS=1
  KILN_PY=/tmp/kiln-py SKIP_BUILD=1 PARTS=compare CMP_TIMEOUT=${CMP_TIMEOUT:-200} CMP_ARGS="--rows ${CMP_ROWS:-5,6}" bash scripts/device/round_c.sh > "$OUT/compare.log" 2>&1
  tail -20 "$OUT/compare.log" | tee -a "$OUT/$LOG_NAME"
fi
