#!/usr/bin/env bash
# A branch's CUDA op kernels beside main's in one call (carry [".device"]): TARBALL holds
# bin/test_ops and bin/bench_memory_bound built on the dev machine from the branch, e.g.
#   mkdir -p /tmp/b/bin; for f in build/tests/test_ops build/bench/bench_memory_bound; do strip -o /tmp/b/bin/$(basename $f) $f; done
#   (cd /tmp/b && tar cJf /work/main/.device/bin_sp.tar.xz bin)
# Runs the branch's CUDA op tests and memory-bound table; main's table comes from round_d.sh's
# PARTS=ops in the same call.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
tarball=${1:?usage: ab_ops.sh TARBALL}
name=$(basename "$tarball" .tar.xz)
mkdir -p "$OUT" /opt/deps "/tmp/$name"
for f in .device/debs/*.deb; do dpkg -x "$f" /opt/deps; done
cudart=$(dirname "$(find /usr/local /usr/lib -name 'libcudart.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:$cudart:${LD_LIBRARY_PATH:-}
tar xJf "$tarball" -C "/tmp/$name"
echo "== $name: test_ops CUDA tests"
timeout 120 "/tmp/$name/bin/test_ops" --gtest_filter='*Cuda*' > "$OUT/${name}_test_ops.log" 2>&1
grep -E "^\[  (PASSED|FAILED)|Failure" "$OUT/${name}_test_ops.log" | head -20
timeout 150 "/tmp/$name/bin/bench_memory_bound" cuda > "$OUT/${name}_memory_bound.jsonl" 2>&1
sed -n '/^$/,$p' "$OUT/${name}_memory_bound.jsonl" | grep -E "softmax|copy"
