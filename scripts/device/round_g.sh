#!/usr/bin/env bash
# Session 8's first round (carry [".device"]): main's dev-built binaries (.device/bin.tar.xz, TMA
# forward as the default) through every CUDA flex test (wgmma and mma.sync), the CUDA op and
# training tests; torch side by side on every flex row of the issue (compare_torch.py); Nsight
# Compute on the forward of the causal and 16-document rows. Logs under $OUT as all.tgz.
#   CMP_ROWS (default 0,1,2,3,4,5,6), SKIP_NCU=1, SKIP_TESTS=1.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
T0=$(date +%s)
stamp() { echo "  [t=$(( $(date +%s) - T0 )) s]"; }
PARTS=${PRE_PARTS:-tests} bash scripts/device/round_d.sh
[ -n "${SKIP_TESTS:-}" ] && PARTS=none bash scripts/device/round_d.sh > /dev/null
stamp
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:$(dirname "$(find /usr/local /usr/lib -name 'libcudart.so.13*' 2>/dev/null | head -1)")
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout 120 build-gpu/tests/test_ops --gtest_filter='*Cuda*' > "$OUT/test_ops_cuda.log" 2>&1; echo "test_ops CUDA: $(tail -1 "$OUT/test_ops_cuda.log")"
  grep -E "Failure" -A4 "$OUT/test_ops_cuda.log" | head -12
  timeout 120 build-gpu/tests/test_train --gtest_filter='*Cuda*' > "$OUT/test_train_cuda.log" 2>&1; echo "test_train CUDA: $(tail -1 "$OUT/test_train_cuda.log")"
  grep -E "Failure" -A4 "$OUT/test_train_cuda.log" | head -12
  stamp
fi
[ -d /tmp/kiln-py ] && export KILN_PY=/tmp/kiln-py
SKIP_BUILD=1 PARTS=compare CMP_TIMEOUT=${CMP_TIMEOUT:-330} CMP_ARGS="--rows ${CMP_ROWS:-0,1,2,3,4,5,6}" bash scripts/device/round_c.sh
stamp
if [ -z "${SKIP_NCU:-}" ] && [ -x /usr/local/cuda/bin/ncu ]; then
  NCU_ROWS="document16|--batch 1 --heads 16 --seq 32768 --head-dim 128 --mask document:16" timeout 100 bash scripts/device/ncu_flex.sh
  for k in flex_bwd_dq flex_bwd_dkdv flex_fwd; do
    KERNEL=$k NCU_ROWS="causal|--batch 4 --heads 16 --seq 8192 --head-dim 128 --mask causal" timeout 100 bash scripts/device/ncu_flex.sh
  done
  stamp
fi
cd "$OUT" && tar czf all.tgz --remove-files $(ls | grep -v all.tgz)
