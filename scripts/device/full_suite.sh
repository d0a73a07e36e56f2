#!/usr/bin/env bash
# The whole suite on the GPU machine (carry [".device"] for the Debian packages): a full ninja
# build for sm_90a with the Python extension, every CTest test (CUDA included), pytest against
# torch, then the CUDA memory-bound table. Logs go straight to $OUT, so a run cut short by its
# time limit still returns what it reached.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT" /opt/deps
for f in .device/debs/*.deb; do dpkg -x "$f" /opt/deps; done
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "commit $(cat .device/commit 2>/dev/null)  $(nvidia-smi --query-gpu=name --format=csv,noheader)"
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=/opt/deps/usr \
  -DCMAKE_CUDA_ARCHITECTURES=90a-real -DKILN_CUDA=ON -DKILN_PYTHON=ON > "$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
ninja -C build-gpu -j16 > "$OUT/build.log" 2>&1 || { grep -E -A5 "error|FAILED" "$OUT/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
t1=$(date +%s)
ctest --test-dir build-gpu -j12 --output-on-failure --timeout 200 > "$OUT/ctest.log" 2>&1
echo "ctest: $(( $(date +%s) - t1 )) s"
grep -E "tests passed|tests failed" "$OUT/ctest.log"
grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|Subprocess|Exception)" "$OUT/ctest.log" | head -20
grep -E "\*\*\*Skipped|Not Run" "$OUT/ctest.log" | head -10
t2=$(date +%s)
PYTHONPATH=build-gpu/python timeout 240 python3 -m pytest python/tests -q -rs -p no:cacheprovider > "$OUT/pytest.log" 2>&1
echo "pytest: $(( $(date +%s) - t2 )) s"
tail -6 "$OUT/pytest.log"
timeout 120 build-gpu/bench/bench_memory_bound cuda > "$OUT/bench_memory_bound.jsonl" 2>&1
sed -n '/^$/,$p' "$OUT/bench_memory_bound.jsonl"
