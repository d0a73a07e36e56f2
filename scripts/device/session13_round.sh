#!/usr/bin/env bash
# Session 13's GPU round (carry [".device"], built by pack.sh): PARTS (default all, in order)
#   tests:  the CUDA flex suite at the defaults (TEST_TIMEOUT, FLEX_FILTER);
#   host:   the torch adapter tests (pytest) and scripts/device/flex_host.py (times, GPU kernels);
#   blocks: kiln alone with a 128- and a 64-block BlockMask on BLOCK_ROWS (default 0 1 2: the
#           windows), interleaved, two passes;
#   compare: compare_torch.py's flex rows CMP_ROWS (default 0,1,2,4) beside torch.
# Logs to stdout and $OUT/session13.log (compare: $OUT/compare_flex.txt and JSON).
set -uo pipefail
LOG_NAME=session13.log
. scripts/device/prelude.sh
. scripts/device/flex_rows.sh
. scripts/device/flex_parts.sh
export KILN_CACHE_DIR=/tmp/kiln-cache-s13
log "commit $(cat .device/commit)"
for part in ${PARTS:-tests host blocks compare}; do
  case $part in
    tests) flex_tests ;;
    host)
      torch_pytest
      FLEX_HOST_PARTS=times,kernels PYTHONPATH=/tmp/kiln-py timeout 120 python3 scripts/device/flex_host.py > "$OUT/flex_host.log" 2>&1
      grep -E "kiln.torch" "$OUT/flex_host.log" | tee -a "$OUT/$LOG_NAME"
      grep -E "flex_(fwd|bwd)" "$OUT/flex_host.log" | grep -v Flex | cut -c1-60,120-175 | tee -a "$OUT/$LOG_NAME" ;;
    blocks)
      for pass in 1 2; do
        for r in ${BLOCK_ROWS:-0 1 2}; do
          for bs in 128 64; do
            line=$(flex_bench_line ${ISSUE_ROWS[$r]} --block-size $bs)
            log "row $r block $bs $line"
          done
        done
      done ;;
    compare) flex_compare 260 ;;
  esac
done
