#!/usr/bin/env bash
# Session 18's GPU round (carry [".device"], built by pack.sh). PARTS (default "tests combos"):
#   tests:   the CUDA flex suite (FLEX_FILTER, TEST_TIMEOUT) under TEST_ENV (VAR=VALUE,... or empty);
#   combos:  kiln alone (`kiln bench flex`, flex_bench_line) on ROWS (issue rows, default "0 1 2") with
#            each setting of COMBOS (space-separated; a setting is VAR=VALUE,VAR=VALUE or "-" for the
#            defaults), interleaved, PASSES passes (default 2);
#   profile: KILN_FLEX_PROFILE's phase split on PROFILE_ROWS under each COMBOS setting, of the kernels
#            PROFILE_GREP names (default "fwd profile"; e.g. "bwd dq profile");
#   compare: compare_torch.py's flex rows CMP_ROWS beside torch (the carried Python package);
#   suites:  test_ops, test_train and test_lce, their *Cuda* tests; pytest: the torch adapter tests.
# Logs to stdout and $OUT/session18.log.
set -uo pipefail
LOG_NAME=session18.log
. scripts/device/prelude.sh
. scripts/device/flex_rows.sh
. scripts/device/flex_parts.sh
export KILN_CACHE_DIR=/tmp/kiln-cache-s18
log "commit $(cat .device/commit)"
# Runs "$@" with the setting $1 (VAR=VALUE,... or -) exported in a subshell.
with_setting() {
  local setting=$1
  shift
  (
    [ "$setting" = - ] || for kv in ${setting//,/ }; do export "$kv"; done
    "$@"
  )
}
for part in ${PARTS:-tests combos}; do
  case $part in
    tests) with_setting "${TEST_ENV:--}" flex_tests ;;
    combos)
      for pass in $(seq "${PASSES:-2}"); do
        for r in ${ROWS:-0 1 2}; do
          for c in ${COMBOS:--}; do log "row $r pass $pass $c $(with_setting "$c" flex_bench_line ${ISSUE_ROWS[$r]})"; done
        done
      done ;;
    profile)
      for r in ${PROFILE_ROWS:-0 1}; do
        for c in ${COMBOS:--}; do
          line=$(with_setting "$( [ "$c" = - ] && echo KILN_FLEX_PROFILE=1 || echo "$c,KILN_FLEX_PROFILE=1")" timeout 60 build-gpu/kiln bench flex --device cuda ${ISSUE_ROWS[$r]} \
            --dtype bf16 --json --reps 3 --flex-only 2>&1 | grep -E "${PROFILE_GREP:-fwd profile}" | tail -2)
          log "row $r $c $line"
        done
      done ;;
    compare) flex_compare 400 ;;
    suites) cuda_suites ;;
    pytest) torch_pytest ;;
  esac
done
