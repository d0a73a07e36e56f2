#!/usr/bin/env bash
# GPU round B, right after ab_round.sh on the warm machine (build-gpu kept): the 125M training
# step kiln vs PyTorch eager, the Python suite against torch 2.11, and compare_torch.py --quick.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
[ -x build-gpu/kiln ] || BUILD_TARGETS="kiln_cli kiln_python" bash scripts/device/gpu_round.sh none || exit 1
mkdir -p /opt/deps; for f in .device/debs/*.deb; do dpkg -x "$f" /opt/deps; done
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=/tmp/kiln-cache
echo "== train 125M"
timeout ${TRAIN_TIMEOUT:-170} python3 scripts/device/train_bench.py --kiln build-gpu/kiln --frameworks kiln,eager --steps 6 --warmup 2 --timeout 80 --out "$OUT/train_bench.json" > "$OUT/train.txt" 2>&1
tail -30 "$OUT/train.txt"
echo "== pytest"
PYTHONPATH=build-gpu/python timeout ${PYTEST_TIMEOUT:-120} python3 -m pytest python/tests -q -rs > "$OUT/pytest.log" 2>&1
tail -15 "$OUT/pytest.log"
echo "== compare_torch --quick"
PYTHONPATH=build-gpu/python timeout ${CMP_TIMEOUT:-150} python3 python/bench/compare_torch.py --quick --out "$OUT/compare_torch.json" > "$OUT/compare.txt" 2>&1
tail -40 "$OUT/compare.txt"
