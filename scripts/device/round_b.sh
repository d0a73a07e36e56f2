#!/usr/bin/env bash
# GPU round, part B, right after round_a.sh (warm machine, build-gpu kept; rebuilt when
# missing): CUDA memory-bound ops vs copy, the 125M training step beside PyTorch eager and
# torch.compile, then compare_torch.py on the issues' shapes (PARTS picks; CMP_ARGS, timeouts).
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
[ -x build-gpu/kiln ] || BUILD_TARGETS="kiln_cli kiln_python bench_memory_bound" bash scripts/device/gpu_round.sh none || exit 1
mkdir -p /opt/deps; for f in .device/debs/*.deb; do dpkg -x "$f" /opt/deps; done
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=/tmp/kiln-cache-b
for part in ${PARTS:-memory train flex}; do
  case $part in
    ops)
      echo "== test_ops CUDA tests"
      ninja -C build-gpu -j16 test_ops > "$OUT/build_test_ops.log" 2>&1 || tail -20 "$OUT/build_test_ops.log"
      timeout 120 build-gpu/tests/test_ops --gtest_filter='*Cuda*' > "$OUT/test_ops_cuda.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|Failure" "$OUT/test_ops_cuda.log" | head -20 ;;
    memory)
      echo "== memory-bound (CUDA)"
      timeout 150 build-gpu/bench/bench_memory_bound cuda > "$OUT/bench_memory_bound.jsonl" 2> "$OUT/bench_memory_bound.err"
      sed -n '/^$/,$p' "$OUT/bench_memory_bound.jsonl" | grep -E "softmax|sum|ratio" | head -20 ;;
    train)
      echo "== train 125M"
      timeout ${TRAIN_TIMEOUT:-220} python3 scripts/device/train_bench.py --kiln build-gpu/kiln --frameworks ${TRAIN_FRAMEWORKS:-kiln,eager,compile} \
        --steps 6 --warmup 2 --timeout 70 --out "$OUT/train_bench.json" > "$OUT/train.txt" 2>&1
      sed -n '/^framework/,$p' "$OUT/train.txt" | head -40 ;;
    flex|lce)
      echo "== compare_torch --only $part"
      PYTHONPATH=build-gpu/python timeout ${CMP_TIMEOUT:-200} python3 python/bench/compare_torch.py --only $part ${CMP_ARGS:-} \
        --out "$OUT/compare_$part.json" > "$OUT/compare_$part.txt" 2>&1
      grep -v Warning "$OUT/compare_$part.txt" | grep -v "torch_cbm\|tbm = " | tail -45 ;;
  esac
done
