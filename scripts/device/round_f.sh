#!/usr/bin/env bash
# Next round after session 7 (carry [".device"]): main's binaries (.device/bin.tar.xz: the TMA
# forward as the default) through every CUDA flex test with wgmma and with mma.sync, the CUDA op
# and training tests; then branch flex-bwd-tma's (.device/bin_btma.tar.xz) flex tests and rows
# with KILN_FLEX_BWD_TMA=0 and =1 side by side; all logs under $OUT as all.tgz. Torch side by side
# and the training job are round_c.sh's compare / train parts (PARTS=none round_d.sh first).
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
T0=$(date +%s)
stamp() { echo "  [t=$(( $(date +%s) - T0 )) s]"; }
PARTS=tests bash scripts/device/round_d.sh  # main: FlexAttentionCuda with wgmma, then mma.sync forced
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:$(dirname "$(find /usr/local /usr/lib -name 'libcudart.so.13*' 2>/dev/null | head -1)")
timeout 120 build-gpu/tests/test_ops --gtest_filter='*Cuda*' > "$OUT/test_ops_cuda.log" 2>&1; tail -1 "$OUT/test_ops_cuda.log"
timeout 120 build-gpu/tests/test_train --gtest_filter='*Cuda*' > "$OUT/test_train_cuda.log" 2>&1; tail -1 "$OUT/test_train_cuda.log"
stamp
if [ -f .device/bin_btma.tar.xz ]; then
  echo "== flex-bwd-tma ($(cat .device/commit_btma 2>/dev/null))"
  BIN_TAR=.device/bin_btma.tar.xz PARTS=none bash scripts/device/round_d.sh
  export KILN_CACHE_DIR=/tmp/kiln-cache-f
  KILN_FLEX_BWD_TMA=1 timeout 150 build-gpu/tests/test_flex --gtest_filter='FlexAttentionCuda*' > "$OUT/btma_tests.log" 2>&1
  echo "tests with KILN_FLEX_BWD_TMA=1: $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/btma_tests.log" | head -3 | tr '\n' ' ')"
  grep -E "Failure" -A4 "$OUT/btma_tests.log" | head -12
  ENV_ROWS="KILN_FLEX_BWD_TMA=0 KILN_FLEX_BWD_TMA=1 KILN_FLEX_BWD_TMA=0 KILN_FLEX_BWD_TMA=1" PROFILE_ENV=KILN_FLEX_BWD_TMA=1 \
    SKIP_BUILD=1 PARTS=rows bash scripts/device/round_c.sh
  stamp
fi
cd "$OUT" && tar czf all.tgz --remove-files $(ls | grep -v all.tgz)
