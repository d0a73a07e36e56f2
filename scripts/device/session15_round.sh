#!/usr/bin/env bash
# Session 15's GPU round (carry [".device"], built by pack.sh). PARTS (default all, in order):
#   tests:   the CUDA flex suite at the defaults (TEST_TIMEOUT, FLEX_FILTER);
#   ab:      kiln alone on ROWS (default 0; or AB_BENCH, `kiln bench flex` arguments) with AB_VAR
#            at each of AB_VALUES, interleaved, AB_PASSES passes (default 2);
#   ncu:     Nsight Compute (clocks left alone) on one launch of each NCU_KERNELS entry, kernel:row
#            (default flex_fwd:0 flex_bwd_dq:0 flex_bwd_dkdv:0 flex_fwd:4): headline lines here,
#            the whole report in $OUT/ncu_<kernel>_<row>.txt;
#   suites:  test_ops, test_train and test_lce, their *Cuda* tests (SUITE_TIMEOUT each);
#   pytest:  the torch adapter tests (test_torch_flex, test_torch_lce, test_dlpack) on the carried package;
#   compare: compare_torch.py's flex rows CMP_ROWS (default 0,1,2,4) beside torch.
# Logs to stdout and $OUT/$LOG_NAME (default session15.log; compare: $OUT/compare_flex.txt and JSON).
set -uo pipefail
LOG_NAME=${LOG_NAME:-session15.log}
. scripts/device/prelude.sh
. scripts/device/flex_rows.sh
. scripts/device/flex_parts.sh
export KILN_CACHE_DIR=/tmp/kiln-cache-s15
# PY_OVERLAY=1: this tree's python/kiln/*.py over the carried package (adapter changes without a re-pack)
[ "${PY_OVERLAY:-0}" = 1 ] && cp python/kiln/*.py /tmp/kiln-py/kiln/ && log "python/kiln/*.py laid over the carried package"
log "commit $(cat .device/commit)"
for part in ${PARTS:-tests ab ncu compare}; do
  case $part in
    tests) flex_tests ;;
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
    ncu)
      ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      for kr in ${NCU_KERNELS:-flex_fwd:0 flex_bwd_dq:0 flex_bwd_dkdv:0 flex_fwd:4}; do
        k=${kr%%:*} r=${kr#*:}
        f="$OUT/ncu_${k}_$r.txt"
        timeout ${NCU_TIMEOUT:-90} "$ncu" --clock-control none --target-processes all --kernel-name "$k" --launch-skip 2 \
          --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy \
          --section WarpStateStats --section SchedulerStats --section LaunchStats --section InstructionStats \
          --section MemoryWorkloadAnalysis --print-details all \
          build-gpu/kiln bench flex --device cuda ${ISSUE_ROWS[$r]} --dtype bf16 --reps 3 --flex-only > "$f" 2>&1
        log "== ncu $k row $r (rc $?)"
        grep -E "^ +(Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L2 Hit Rate|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Block Limit [A-Za-z ]+|Warp Cycles Per Issued Instruction|Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Executed Ipc Active|Grid Size|Waves Per SM|Dynamic Shared Memory Per Block) " "$f" | tee -a "$OUT/$LOG_NAME"
        grep -iE "^ *(==ERR|==WARN|error)" "$f" | head -4 | tee -a "$OUT/$LOG_NAME"
      done ;;
    suites) cuda_suites ;;
    pytest) torch_pytest ;;
    compare) flex_compare 400 ;;
  esac
done
