#!/usr/bin/env bash
# Final round, part B, right after final_a.sh (warm machine, build-gpu kept; rebuilt when
# missing): the 125M training step beside PyTorch eager, then compare_torch.py on the issues'
# shapes.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
[ -x build-gpu/kiln ] || BUILD_TARGETS="kiln_cli kiln_python" bash scripts/device/gpu_round.sh none || exit 1
mkdir -p /opt/deps; for f in .device/debs/*.deb; do dpkg -x "$f" /opt/deps; done
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=/tmp/kiln-cache-b
echo "== train 125M"
timeout ${TRAIN_TIMEOUT:-150} python3 scripts/device/train_bench.py --kiln build-gpu/kiln --frameworks kiln,eager --steps 6 --warmup 2 --timeout 70 --out "$OUT/train_bench.json" > "$OUT/train.txt" 2>&1
sed -n '/^framework/,$p' "$OUT/train.txt" | head -40
for fam in flex lce; do
  echo "== compare_torch --only $fam"
  PYTHONPATH=build-gpu/python timeout ${CMP_TIMEOUT:-200} python3 python/bench/compare_torch.py --only $fam ${CMP_ARGS:-} \
    --out "$OUT/compare_$fam.json" > "$OUT/compare_$fam.txt" 2>&1
  grep -v Warning "$OUT/compare_$fam.txt" | grep -v "torch_cbm\|tbm = " | tail -45
done
