#!/usr/bin/env bash
# Session 14's GPU round (carry [".device"], built by pack.sh): session15_round.sh's tests, ab and
# compare parts (the same variables: TEST_TIMEOUT, FLEX_FILTER, AB_VAR, AB_VALUES, ROWS or AB_BENCH,
# AB_PASSES, CMP_ROWS, CMP_TIMEOUT), logging to $OUT/session14.log.
PARTS=${PARTS:-tests ab compare} LOG_NAME=session14.log exec bash scripts/device/session15_round.sh
