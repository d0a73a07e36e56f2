#!/usr/bin/env bash
# One full GPU round on the H200 machine, run from the repository root through the device tool:
#   carry: [".device"]   command: bash scripts/device/gpu_round.sh [tests|bench|all|train]
# (train: only the training benchmark, kiln vs PyTorch eager and torch.compile: train_bench.py)
# Unpacks the carried Debian packages (../shared/device/fetch-debs.sh .device/debs), builds with
# ninja for sm_90a, runs every test (CUDA included), runs the benchmarks (with PyTorch's figures
# beside them when .device/torch_baselines.py is there), writes logs and JSON under $OUT and
# prints a short table last.
set -uo pipefail
# BUILD_TARGETS (env): only these ninja targets (e.g. "kiln_app kiln_python"), for short rounds.
what=${1:-all}
OUT=${OUT:-/tmp/kiln-out}
LOG=/tmp/kiln-logs  # logs travel back as one archive ($OUT/logs.tgz): the tool returns at most 8 files
mkdir -p "$OUT" "$LOG" /opt/deps
for f in .device/debs/*.deb; do dpkg -x "$f" /opt/deps; done
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.draw --format=csv > "$LOG/gpu.txt" 2>&1
commit=$(cat .device/commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)  # .device/commit: written before the call (no .git travels)

t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=/opt/deps/usr \
  -DCMAKE_CUDA_ARCHITECTURES=90a-real -DKILN_CUDA=ON -DKILN_PYTHON=ON > "$LOG/configure.log" 2>&1 || { tail -30 "$LOG/configure.log"; exit 1; }
ninja -C build-gpu -j16 ${BUILD_TARGETS:-} > "$LOG/build.log" 2>&1 || { grep -E -A5 "error|FAILED" "$LOG/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

summary=()
if [ "$what" = tests ] || [ "$what" = all ]; then
  ctest --test-dir build-gpu -j8 --output-on-failure --timeout 120 > "$LOG/ctest.log" 2>&1
  grep -E "tests passed|tests failed|Total Test time" "$LOG/ctest.log"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|Subprocess|Exception)" "$LOG/ctest.log" | head -40
  summary+=("tests: $(grep -E 'tests passed' "$LOG/ctest.log")")
  # Python: the same extension the build made, against torch 2.11 on the GPU.
  PYTHONPATH=build-gpu/python timeout 300 python3 -m pytest python/tests -q -rs > "$LOG/pytest.log" 2>&1
  tail -15 "$LOG/pytest.log"
  summary+=("pytest: $(tail -1 "$LOG/pytest.log")")
  # Skipped tests on a GPU machine mean a check did not run: list them.
  grep -E "\*\*\*Skipped|Not Run" "$LOG/ctest.log" | head -20
fi

if [ "$what" = bench ] || [ "$what" = all ]; then
  # name | command: each benchmark prints JSON lines, then a blank line and a table.
  benches=(
    "memory_bound|build-gpu/bench/bench_memory_bound cuda"
    "elementwise|build-gpu/bench/bench_elementwise 28"
    "matmul|build-gpu/bench/bench_matmul cuda"
    "lce|build-gpu/bench/bench_lce --device cuda --tokens 8192 --hidden 4096 --vocab 128256 --dtype bf16 --json"
  )
  for entry in "${benches[@]}"; do
    name=${entry%%|*}; cmd=${entry#*|}
    timeout 150 $cmd > "$OUT/bench_$name.jsonl" 2> "$LOG/bench_$name.err" || echo "bench $name failed: $(tail -3 "$LOG/bench_$name.err")"
  done
  if [ -f .device/torch_baselines.py ]; then
    timeout 150 python3 .device/torch_baselines.py lce --tokens 8192 --hidden 4096 --vocab 128256 > "$OUT/torch_lce.jsonl" 2>&1 || echo "torch lce baseline failed"
  fi
  for f in "$OUT"/bench_*.jsonl; do sed -n '/^$/,$p' "$f" | head -30; done
  grep -h '"variant"' "$OUT/bench_lce.jsonl" "$OUT/torch_lce.jsonl" 2>/dev/null
fi
if [ "$what" = train ]; then
  timeout 480 python3 scripts/device/train_bench.py --kiln build-gpu/kiln --out "$OUT/train_bench.json" \
    > "$LOG/train_bench.log" 2>&1 || echo "train bench failed: $(tail -5 "$LOG/train_bench.log")"
  sed -n '/^framework/,$p' "$LOG/train_bench.log"
fi
tar czf "$OUT/logs.tgz" -C "$LOG" .
echo "commit $commit  $(head -2 "$LOG/gpu.txt" | tail -1)"
printf '%s\n' "${summary[@]}"
