#!/usr/bin/env bash
# A GPU round without the ~200 s build, for a nearly spent device budget: binaries built on the
# dev machine (its CUDA 13.0 toolkit, sm_90a cubins), stripped and carried as .device/bin.tar.xz:
#   strip -o .device/bin/test_ops build/tests/test_ops   (same for bench_memory_bound)
#   (cd .device && tar cJf bin.tar.xz bin && rm -rf bin)
# carry [".device"]. Runs test_ops' CUDA tests (CUDA vs CPU) and bench_memory_bound on CUDA.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT" /opt/deps /tmp/kiln-bin
for f in .device/debs/*.deb; do dpkg -x "$f" /opt/deps; done
tar xJf .device/bin.tar.xz -C /tmp/kiln-bin
cudart=$(dirname "$(find /usr/local /usr/lib -name 'libcudart.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:$cudart:${LD_LIBRARY_PATH:-}
B=/tmp/kiln-bin/bin
echo "commit $(cat .device/commit 2>/dev/null)  $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 120 $B/test_ops --gtest_filter='*Cuda*' > "$OUT/test_ops_cuda.log" 2>&1; echo "test_ops *Cuda* rc $?"
grep -E "^\[  (PASSED|FAILED|SKIPPED)|Failure|tests? ran" "$OUT/test_ops_cuda.log" | head -20
timeout 150 $B/bench_memory_bound cuda > "$OUT/bench_memory_bound.jsonl" 2> "$OUT/bench_memory_bound.err"; echo "bench rc $?"
sed -n '/^$/,$p' "$OUT/bench_memory_bound.jsonl" | head -40
tail -3 "$OUT/bench_memory_bound.err"
