#!/usr/bin/env bash
# Forward tiles and stages on the E = 128 rows, kiln alone (carry [".device"]): each setting of
# SETTINGS (env assignments, commas join; X=0 is the default) on the rows ROWS (compare_torch.py's
# FLEX_ROWS indices, default 1 2 4: window 256, window 1024, 16 documents), AB_PASSES interleaved
# passes; forward ms to stdout and $OUT/flex_tiles.log. Short rows (3 blocks a row at window 256)
# run one 128 x 128 CTA a SM with two K / V stages: the question is whether smaller tiles or one
# stage (two CTAs a SM) pay there.
set -uo pipefail
LOG_NAME=flex_tiles.log
. scripts/device/prelude.sh
log "commit $(cat .device/commit)"
. scripts/device/flex_rows.sh
for pass in $(seq "${AB_PASSES:-2}"); do
  for r in ${ROWS:-1 2 4}; do
    for s in ${SETTINGS:-X=0 KILN_FLEX_FWD_TILE=64x128x1 KILN_FLEX_FWD_TILE=128x64x1 KILN_FLEX_FWD_KBUF=1 KILN_FLEX_FWD_TILE=64x64x1}; do
      ms=$(env ${s//,/ } timeout 30 build-gpu/kiln bench flex --device cuda ${ISSUE_ROWS[$r]} --dtype bf16 --json --reps 20 \
           --flex-only 2>&1 | grep -o '"fwd_ms": [0-9.]*')
      log "row $r $s $ms"
    done
  done
done
