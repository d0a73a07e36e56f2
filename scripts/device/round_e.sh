#!/usr/bin/env bash
# Session 7's GPU round on binaries built on the dev machine (carry [".device"]: bin.tar.xz of main,
# bin_id.tar.xz of branch int-divider): the CUDA flex tests under each forward variant in
# FWD_VARIANTS, the flex rows with each (ENV_ROWS), the training step of main and of the branch
# (kiln only), the branch's CUDA op and training tests; everything under $OUT as one all.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
T0=$(date +%s)
stamp() { echo "  [t=$(( $(date +%s) - T0 )) s]"; }
PARTS=none bash scripts/device/round_d.sh  # unpacks main's binaries into build-gpu/
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:$(dirname "$(find /usr/local /usr/lib -name 'libcudart.so.13*' 2>/dev/null | head -1)")
export KILN_CACHE_DIR=/tmp/kiln-cache-e
variants=${FWD_VARIANTS:-"X=1 KILN_FLEX_FWD_OVERLAP=1 KILN_FLEX_FWD_OVERLAP=1,KILN_FLEX_FWD_TILE=64x128x1"}
for v in $variants; do
  log="$OUT/flex_tests_${v//[^A-Za-z0-9]/_}.log"
  env ${v//,/ } timeout 150 build-gpu/tests/test_flex --gtest_filter='FlexAttentionCuda*' > "$log" 2>&1
  echo "tests $v: $(grep -E '^\[  PASSED|^\[  FAILED' "$log" | head -3 | tr '\n' ' ')"
  grep -E "Failure" -A4 "$log" | head -12
done
stamp
ENV_ROWS="${ENV_ROWS:-KILN_FLEX_FWD_OVERLAP=1 KILN_FLEX_FWD_TILE=64x128x1 KILN_FLEX_FWD_OVERLAP=1,KILN_FLEX_FWD_TILE=64x128x1}" \
  PROFILE_ENV=${PROFILE_ENV:-KILN_FLEX_FWD_OVERLAP=1} SKIP_BUILD=1 PARTS=rows bash scripts/device/round_c.sh
stamp
if [ -z "${SKIP_TRAIN:-}" ]; then
  echo "== training step, main"
  SKIP_BUILD=1 PARTS=train TRAIN_FRAMEWORKS=kiln TRAIN_TIMEOUT=150 TRAIN_FW_TIMEOUT=120 bash scripts/device/round_c.sh | head -30
  stamp
  if [ -f .device/bin_id.tar.xz ]; then
    echo "== int-divider branch ($(cat .device/commit_id 2>/dev/null))"
    BIN_TAR=.device/bin_id.tar.xz PARTS=train TRAIN_FRAMEWORKS=kiln TRAIN_TIMEOUT=150 TRAIN_FW_TIMEOUT=120 \
      bash scripts/device/round_d.sh | head -30
    timeout 120 /tmp/kiln-bin/bin/test_ops --gtest_filter='*Cuda*' > "$OUT/id_test_ops.log" 2>&1; tail -3 "$OUT/id_test_ops.log"
    timeout 120 /tmp/kiln-bin/bin/test_train --gtest_filter='*Cuda*' > "$OUT/id_test_train.log" 2>&1; tail -3 "$OUT/id_test_train.log"
    stamp
  fi
fi
cd "$OUT" && tar czf all.tgz --remove-files $(ls | grep -v all.tgz) && ls -la
