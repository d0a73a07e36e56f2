#!/usr/bin/env bash
# Backward switches on the GPU in one call (carry [".device"]): the CUDA flex suite at the defaults
# (their tests included), then kiln alone with each switch of SWITCHES (default
# KILN_FLEX_BWD_SPLIT_P; session 12/13's round also ran the two-warpgroup dK/dV and dQ units and the
# sub-tile skip, since removed) off / on, interleaved, on ROWS of the seven (flex_ab.sh;
# default 0 1 3 4 5: both windows at 256, causal, 16 documents, ALiBi), AB_PASSES passes. Logs to
# stdout and $OUT/flex_ab.log.
set -uo pipefail
first=1
for var in ${SWITCHES:-KILN_FLEX_BWD_SPLIT_P}; do
  SKIP_TESTS=$([ $first = 1 ] || echo 1) AB_VAR=$var AB_VALUES="${AB_VALUES:-0 1}" ROWS="${ROWS:-0 1 3 4 5}" \
    TEST_TIMEOUT=${TEST_TIMEOUT:-260} bash scripts/device/flex_ab.sh
  first=0
done
