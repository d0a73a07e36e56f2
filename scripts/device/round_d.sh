#!/usr/bin/env bash
# (scripts/device/pack.sh builds all of .device/ from a fresh checkout.)
# round_c.sh's parts without the ~200 s build, for a nearly spent device budget: kiln, test_flex,
# test_ops, test_train and bench_memory_bound built on the dev machine (CUDA 13.0, sm_90a cubins;
# the flex kernels compile at run time anyway), stripped and carried as .device/bin.tar.xz:
#   mkdir -p .device/bin; for f in build/kiln build/tests/test_{flex,ops,train} build/bench/bench_memory_bound; do
#     strip -o .device/bin/$(basename $f) $f; done; (cd .device && tar cJf bin.tar.xz bin && rm -rf bin)
# carry [".device"]. PARTS from: tests rows ops compare train (as in round_c.sh). BIN_TAR picks another
# tarball (default .device/bin.tar.xz; e.g. a branch's build for an A/B in the same call).
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT" /opt/deps /tmp/kiln-bin build-gpu/tests build-gpu/bench
for f in .device/debs/*.deb; do dpkg -x "$f" /opt/deps; done
rm -rf /tmp/kiln-bin/bin
tar xJf "${BIN_TAR:-.device/bin.tar.xz}" -C /tmp/kiln-bin
cudart=$(dirname "$(find /usr/local /usr/lib -name 'libcudart.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:$cudart:${LD_LIBRARY_PATH:-}
B=/tmp/kiln-bin/bin
# round_c.sh's paths
ln -sf $B/kiln build-gpu/kiln; ln -sf $B/test_flex build-gpu/tests/test_flex; ln -sf $B/test_ops build-gpu/tests/test_ops
ln -sf $B/bench_memory_bound build-gpu/bench/bench_memory_bound
[ -x $B/test_train ] && ln -sf $B/test_train build-gpu/tests/test_train
[ -x $B/test_lce ] && ln -sf $B/test_lce build-gpu/tests/test_lce
# The Python package built on the dev machine for CPython 3.12 (the device's), when carried:
#   cmake -S . -B build-py312 -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF -DKILN_BENCH=OFF -DKILN_PYTHON=ON \
#     -DPython_EXECUTABLE=$HOME/.pyenv/versions/3.12.1/bin/python3.12 && ninja -C build-py312 kiln_python
#   (cd build-py312/python && strip kiln/_C*.so && tar cJf ../../.device/py312.tar.xz kiln)
if [ -f .device/py312.tar.xz ]; then
  rm -rf /tmp/kiln-py && mkdir -p /tmp/kiln-py && tar xJf .device/py312.tar.xz -C /tmp/kiln-py && export KILN_PY=/tmp/kiln-py
fi
echo "commit $(cat .device/commit 2>/dev/null)  $(nvidia-smi --query-gpu=name --format=csv,noheader)"
build-gpu/kiln --help > /dev/null 2>&1 || { echo "prebuilt kiln does not run:"; build-gpu/kiln --help 2>&1 | head -5; exit 1; }
SKIP_BUILD=1 bash scripts/device/round_c.sh
