#!/usr/bin/env bash
# GPU round C (carry [".device"]): the wgmma kernels. Builds the flex/ops targets, then PARTS
# (default "probe tests rows"):
#   probe: scripts/device/wgmma_probe (the two wgmma products against a host reference, on sources
#          generated on the dev machine into .device/wgmma_probe/);
#   tests: the CUDA flex tests with the defaults (wgmma on sm_90), then with mma.sync forced;
#   rows:  the flex rows with the defaults (and with mma.sync forced when ROWS_MMA is set, and
#          with each wgmma forward tile in WG_TILES, and with each VAR=VALUE of ENV_ROWS), then
#          each row's forward phase profile (with PROFILE_ENV's VAR=VALUE,... when set);
#   ops:   the CUDA test_ops tests and the memory-bound table;
#   compare: python/bench/compare_torch.py beside torch (CMP_ONLY, CMP_ARGS, CMP_TIMEOUT; KILN_PY is
#          the kiln package's folder, round_d.sh's prebuilt one or build-gpu/python);
#   train: train_bench.py (kiln, eager, torch.compile; TRAIN_FRAMEWORKS, TRAIN_TIMEOUT, TRAIN_FW_TIMEOUT (each framework's, 70 s), and
#          TRAIN_ARGS for kiln train, e.g. TRAIN_ARGS="--mask-block 64").
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
[ -n "${SKIP_BUILD:-}" ] || BUILD_TARGETS=${BUILD_TARGETS:-"kiln_cli test_flex"} bash scripts/device/gpu_round.sh none || exit 1  # round_d.sh: prebuilt
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=/tmp/kiln-cache-c
. scripts/device/flex_rows.sh
rows=("${FLEX_ROWS[@]}")
run_tests() {  # $1 fwd mma, $2 bwd mma
  KILN_FLEX_FWD_MMA=$1 KILN_FLEX_BWD_MMA=$2 timeout 150 build-gpu/tests/test_flex --gtest_filter='FlexAttentionCuda*' > "$OUT/flex_tests_$1_$2.log" 2>&1
  echo "tests fwd $1 bwd $2: $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/flex_tests_$1_$2.log" | head -3 | tr '\n' ' ')"
  grep -E "Failure" -A4 "$OUT/flex_tests_$1_$2.log" | head -16
}
run_rows() {  # $1 fwd mma, $2 bwd mma
  for row in "${rows[@]}"; do
    name=${row%%|*}; args=${row#*|}
    KILN_FLEX_FWD_MMA=$1 KILN_FLEX_BWD_MMA=$2 timeout 60 build-gpu/kiln bench flex --device cuda $args --dtype bf16 --json --reps 10 > "$OUT/flex_${name}_$1_$2.jsonl" 2>&1
    echo "  fwd $1 bwd $2 $name $(grep -E '"variant": "flex"' "$OUT/flex_${name}_$1_$2.jsonl" | cut -c1-150)"
  done
}
for part in ${PARTS:-probe tests rows}; do
  case $part in
    probe)
      echo "== wgmma probe"
      for src in .device/wgmma_probe/generated_*.cu; do
        tag=$(basename "$src" .cu); d=/tmp/probe_$tag; mkdir -p "$d"; cp "$src" "$d/generated.cu"
        nvcc -gencode arch=compute_90a,code=sm_90a -I "$d" scripts/device/wgmma_probe/probe.cu -o "$d/probe" > "$d/build.log" 2>&1 \
          || { echo "$tag: probe build failed"; tail -5 "$d/build.log"; continue; }
        timeout 20 "$d/probe" 2>&1 | head -16
      done ;;
    tests) run_tests wgmma wgmma; run_tests mma mma ;;
    rows) run_rows wgmma wgmma; [ -z "${ROWS_MMA:-}" ] || run_rows mma mma
      for setting in ${ENV_ROWS:-}; do  # A/B of kernel switches, e.g. ENV_ROWS="KILN_FLEX_FWD_KBUF=2 A=1,B=2" (commas join)
        for row in "${rows[@]}"; do
          name=${row%%|*}; args=${row#*|}
          env ${setting//,/ } timeout 60 build-gpu/kiln bench flex --device cuda $args --dtype bf16 --json --reps 10 --flex-only > "$OUT/flex_${name}_${setting//[^A-Za-z0-9]/_}.jsonl" 2>&1
          echo "  $setting $name $(grep -E '"variant": "flex"' "$OUT/flex_${name}_${setting//[^A-Za-z0-9]/_}.jsonl" | cut -c1-150)"
        done
      done
      for row in "${rows[@]}"; do  # the forward's phase split (KILN_FLEX_PROFILE, thread 0 of each CTA)
        name=${row%%|*}; args=${row#*|}
        echo "  profile $name: $(KILN_FLEX_PROFILE=1 ${PROFILE_ENV:+env ${PROFILE_ENV//,/ }} timeout 60 build-gpu/kiln bench flex --device cuda $args --dtype bf16 --json --reps 3 --flex-only 2>&1 | grep -E 'flex (fwd|bwd dq|bwd dkdv) profile' | head -3 | sed 's/^/    /')"
      done
      for tile in ${WG_TILES:-}; do  # other wgmma forward tiles, KILN_FLEX_FWD_TILE=MxNx1
        for row in "${rows[@]}"; do
          name=${row%%|*}; args=${row#*|}
          KILN_FLEX_FWD_TILE=$tile timeout 60 build-gpu/kiln bench flex --device cuda $args --dtype bf16 --json --reps 10 --flex-only > "$OUT/flex_${name}_$tile.jsonl" 2>&1
          echo "  tile $tile $name $(grep -E '"variant": "flex"' "$OUT/flex_${name}_$tile.jsonl" | cut -c1-150)"
        done
      done ;;
    ops)
      echo "== test_ops CUDA tests"
      timeout 120 build-gpu/tests/test_ops --gtest_filter='*Cuda*' > "$OUT/test_ops_cuda.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|Failure" "$OUT/test_ops_cuda.log" | head -20
      timeout 150 build-gpu/bench/bench_memory_bound cuda > "$OUT/bench_memory_bound.jsonl" 2> "$OUT/bench_memory_bound.err"
      sed -n '/^$/,$p' "$OUT/bench_memory_bound.jsonl" | grep -E "softmax|copy" | head -10 ;;
    compare)  # torch side by side (compare_torch.py; CMP_ONLY flex|lce, CMP_ARGS e.g. "--rows 0,3,4")
      echo "== compare_torch --only ${CMP_ONLY:-flex} ${CMP_ARGS:-}"
      PYTHONPATH=${KILN_PY:-build-gpu/python} timeout ${CMP_TIMEOUT:-300} python3 python/bench/compare_torch.py \
        --only ${CMP_ONLY:-flex} ${CMP_ARGS:-} --out "$OUT/compare_${CMP_ONLY:-flex}.json" > "$OUT/compare_${CMP_ONLY:-flex}.txt" 2>&1
      grep -v Warning "$OUT/compare_${CMP_ONLY:-flex}.txt" | grep -v "torch_cbm\|tbm = " | tail -45 ;;
    train)
      echo "== train 125M"
      timeout ${TRAIN_TIMEOUT:-220} python3 scripts/device/train_bench.py --kiln build-gpu/kiln --frameworks ${TRAIN_FRAMEWORKS:-kiln,eager,compile} \
        --steps 6 --warmup 2 --timeout ${TRAIN_FW_TIMEOUT:-70} --out "$OUT/train_bench.json" ${TRAIN_ARGS:+--kiln-args="$TRAIN_ARGS"} > "$OUT/train.txt" 2>&1
      sed -n '/^framework/,$p' "$OUT/train.txt" | head -40 ;;
  esac
done
