# The device rounds' shared parts (sourced by session13_round.sh, session15_round.sh and host_round.sh
# after prelude.sh, which gives OUT, LOG_NAME and log; the rounds also source flex_rows.sh).

# The CUDA flex suite at the defaults (TEST_TIMEOUT, FLEX_FILTER): its summary line, and failures.
flex_tests() {
  timeout ${TEST_TIMEOUT:-260} build-gpu/tests/test_flex --gtest_filter="${FLEX_FILTER:-FlexAttentionCuda*}" > "$OUT/flex_tests.log" 2>&1
  log "flex tests (rc $?): $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/flex_tests.log" | tr '\n' ' ') $(grep 'test suite ran' "$OUT/flex_tests.log")"
  grep -E "Failure|^\[  FAILED" -A6 "$OUT/flex_tests.log" | head -40 | tee -a "$OUT/$LOG_NAME"
}

# The other CUDA suites (test_ops, test_train, test_lce; gtest filter *Cuda*): summary lines, failures.
cuda_suites() {
  for t in ops train lce; do
    timeout ${SUITE_TIMEOUT:-150} build-gpu/tests/test_$t --gtest_filter='*Cuda*' > "$OUT/test_$t.log" 2>&1
    log "test_$t *Cuda* (rc $?): $(grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED' "$OUT/test_$t.log" | tr '\n' ' ')"
    grep -E "Failure|^\[  FAILED" -A6 "$OUT/test_$t.log" | head -20 | tee -a "$OUT/$LOG_NAME"
  done
}

# The torch adapter tests (test_torch_flex, test_torch_lce, test_dlpack) on the package at $1
# (default the carried one, /tmp/kiln-py).
torch_pytest() {
  PYTHONPATH=${1:-/tmp/kiln-py} timeout ${PYTEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider python/tests/test_torch_flex.py \
    python/tests/test_torch_lce.py python/tests/test_dlpack.py > "$OUT/pytest_torch.log" 2>&1
  log "pytest torch adapters: $(tail -1 "$OUT/pytest_torch.log")"
  grep -E "^FAILED|Error" "$OUT/pytest_torch.log" | head -10 | tee -a "$OUT/$LOG_NAME"
}

# compare_torch.py's flex rows CMP_ROWS (default 0,1,2,4) beside torch, within CMP_TIMEOUT (default $1).
flex_compare() {
  KILN_PY=/tmp/kiln-py SKIP_BUILD=1 PARTS=compare CMP_TIMEOUT=${CMP_TIMEOUT:-$1} CMP_ARGS="--rows ${CMP_ROWS:-0,1,2,4}" \
    bash scripts/device/round_c.sh > "$OUT/compare.log" 2>&1
  grep -v Warn "$OUT/compare_flex.txt" 2>/dev/null | tee -a "$OUT/$LOG_NAME" | grep -A8 '^flex'
}
