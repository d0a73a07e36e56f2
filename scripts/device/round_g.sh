#!/usr/bin/env bash
# Session 8's rounds (carry [".device"]) on dev-built binaries (.device/bin.tar.xz; round_d.sh's
# recipe). PARTS (default "tests rows"):
#   tests:   every CUDA flex test with wgmma and with mma.sync, then with KILN_FLEX_FWD_KBUF=2 and
#            KILN_FLEX_BWD_TMA=1 set for the whole suite; the CUDA op and training tests;
#   rows:    kiln's flex rows with the defaults and with ENV_ROWS' switches (default: two-stage TMA
#            forward, TMA backward, both), and each row's phase profile;
#   compare: torch side by side on the issue's flex rows (CMP_ROWS, default 0,1,2,3,4,5,6);
#   ab:      interleaved A/B rounds of AB_SETTINGS (default: the defaults, FWD_PERSIST=1, WALK_AHEAD=1) on
#            the four kiln rows, 50 repetitions each, AB_ROUNDS (3) rounds;
#   swtests: the CUDA flex suite (or SWTEST_FILTER's tests) once more with SWTEST_ENV (e.g. "KILN_FLEX_MASK_BITS=1,KILN_FLEX_WALK_AHEAD=1");
#   train:   the training job beside torch eager and torch.compile (round_c.sh's train part);
#   lcetests: test_lce's CUDA tests;
#   lce:     (LCE_SETTINGS: default and KILN_LCE_TILE32=1) bench_lce speed / memory / gemm3 / phases at 8192 x 4096 x 128256, nsys kernel sums;
#   ncu:     Nsight Compute on the forward of the 16-document row and on the three kernels of the
#            causal row (NCU_ENV: switches for it).
# Logs under $OUT as all.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
T0=$(date +%s)
stamp() { echo "  [t=$(( $(date +%s) - T0 )) s]"; }
PARTS=none bash scripts/device/round_d.sh
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:$(dirname "$(find /usr/local /usr/lib -name 'libcudart.so.13*' 2>/dev/null | head -1)")
[ -d /tmp/kiln-py ] && export KILN_PY=/tmp/kiln-py
. scripts/device/flex_rows.sh
for part in ${PARTS:-tests rows}; do
  case $part in
    tests)
      SKIP_BUILD=1 PARTS=tests bash scripts/device/round_c.sh; stamp
      KILN_FLEX_FWD_KBUF=${SWITCH_FWD_KBUF:-2} KILN_FLEX_BWD_TMA=${SWITCH_BWD_TMA:-1} timeout 150 build-gpu/tests/test_flex --gtest_filter='FlexAttentionCuda*' > "$OUT/flex_tests_switches.log" 2>&1
      echo "tests with FWD_KBUF=${SWITCH_FWD_KBUF:-2} BWD_TMA=${SWITCH_BWD_TMA:-1}: $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/flex_tests_switches.log" | head -3 | tr '\n' ' ')"
      grep -E "Failure" -A4 "$OUT/flex_tests_switches.log" | head -12
      timeout 120 build-gpu/tests/test_ops --gtest_filter='*Cuda*' > "$OUT/test_ops_cuda.log" 2>&1; echo "test_ops CUDA: $(tail -1 "$OUT/test_ops_cuda.log")"
      grep -E "Failure" -A4 "$OUT/test_ops_cuda.log" | head -12
      timeout 120 build-gpu/tests/test_train --gtest_filter='*Cuda*' > "$OUT/test_train_cuda.log" 2>&1; echo "test_train CUDA: $(tail -1 "$OUT/test_train_cuda.log")"
      grep -E "Failure" -A4 "$OUT/test_train_cuda.log" | head -12
      stamp ;;
    rows)
      ENV_ROWS=${ENV_ROWS:-"KILN_FLEX_FWD_KBUF=2 KILN_FLEX_BWD_TMA=1 KILN_FLEX_FWD_KBUF=2,KILN_FLEX_BWD_TMA=1"} \
        SKIP_BUILD=1 PARTS=rows bash scripts/device/round_c.sh; stamp
      if [ -f .device/bin_base.tar.xz ]; then  # an earlier commit's kiln (.device/commit_base) on the same rows
        rm -rf /tmp/kiln-base && mkdir -p /tmp/kiln-base && tar xJf .device/bin_base.tar.xz -C /tmp/kiln-base
        echo "== base $(cat .device/commit_base 2>/dev/null)"
        for row in "${FLEX_ROWS[@]}"; do
          name=${row%%|*}; args=${row#*|}
          KILN_CACHE_DIR=/tmp/kiln-cache-base timeout 60 /tmp/kiln-base/bin/kiln bench flex --device cuda $args --dtype bf16 --json --reps 10 --flex-only > "$OUT/base_$name.jsonl" 2>&1
          echo "  base $name $(grep -E '"variant": "flex"' "$OUT/base_$name.jsonl" | cut -c1-150)"
        done
        stamp
      fi ;;
    ab)  # interleaved A/B of switch settings on the flex rows (AB_SETTINGS, AB_ROUNDS rounds, 50 reps each)
      for round in $(seq ${AB_ROUNDS:-3}); do
        for setting in ${AB_SETTINGS:-X=0 KILN_FLEX_FWD_PERSIST=1 KILN_FLEX_WALK_AHEAD=1}; do  # unquoted: one setting a word
          for row in "${FLEX_ROWS[@]}"; do
            name=${row%%|*}; args=${row#*|}
            f="$OUT/ab_${name}_${setting//[^A-Za-z0-9]/_}_$round.jsonl"
            env ${setting//,/ } timeout 60 build-gpu/kiln bench flex --device cuda $args --dtype bf16 --json --reps 50 --flex-only > "$f" 2>&1
            echo "  ab $round $setting $name $(grep -E '"variant": "flex"' "$f" | cut -c1-110)"
          done
        done
      done
      stamp ;;
    swtests)  # the CUDA flex suite with SWTEST_ENV's switches set (commas join)
      log="$OUT/flex_tests_swtests_${SWTEST_ENV//[^A-Za-z0-9]/_}.log"
      env ${SWTEST_ENV//,/ } timeout 200 build-gpu/tests/test_flex --gtest_filter="${SWTEST_FILTER:-FlexAttentionCuda*}" > "$log" 2>&1
      echo "tests with $SWTEST_ENV (${SWTEST_FILTER:-all}): $(grep -E '^\[  PASSED|^\[  FAILED' "$log" | head -3 | tr '\n' ' ')"
      grep -E "Failure" -A4 "$log" | head -12; stamp ;;
    lcetests)  # the fused loss's CUDA tests
      timeout 200 build-gpu/tests/test_lce --gtest_filter='*Cuda*' > "$OUT/test_lce_cuda.log" 2>&1
      echo "test_lce CUDA: $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/test_lce_cuda.log" | head -3 | tr '\n' ' ')"
      grep -E "Failure" -A6 "$OUT/test_lce_cuda.log" | head -30; stamp ;;
    train) SKIP_BUILD=1 PARTS=train bash scripts/device/round_c.sh; stamp ;;
    compare)
      SKIP_BUILD=1 PARTS=compare CMP_TIMEOUT=${CMP_TIMEOUT:-330} CMP_ARGS="--rows ${CMP_ROWS:-0,1,2,3,4,5,6}" bash scripts/device/round_c.sh
      stamp ;;
    lce)  # the fused loss's speed strategy against the three GEMMs, its phases, and an nsys kernel summary
      L=/tmp/kiln-bin/bin/bench_lce
      a="--device cuda --dtype bf16 --tokens 8192 --hidden 4096 --vocab 128256"
      for setting in ${LCE_SETTINGS:-X=0 KILN_LCE_TILE32=1}; do  # 16-bit logit tiles (the default) and fp32 tiles
        f="$OUT/lce_${setting//[^A-Za-z0-9]/_}.jsonl"
        env $setting timeout 120 $L $a --json --iters 3 --variants gemm3,speed,memory,phases > "$f" 2>&1
        echo "== lce $setting"; cut -c1-160 "$f"
      done
      for ch in ${LCE_CHUNKS:-}; do  # the speed strategy at other token chunks (default settings)
        echo "== lce speed, chunk $ch: $(timeout 60 $L $a --json --iters 3 --variants speed --chunk-tokens $ch 2>&1 | cut -c1-160)"
      done
      nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
      if [ -n "$nsys" ]; then
        for v in speed memory; do
          timeout 120 $nsys profile -t cuda -o "$OUT/lce_$v" $L $a --iters 1 --variants $v > "$OUT/nsys_$v.log" 2>&1
          timeout 60 $nsys stats -r cuda_gpu_kern_sum,cuda_api_sum --format csv "$OUT/lce_$v.nsys-rep" > "$OUT/nsys_${v}_stats.csv" 2>&1
          echo "== nsys $v (kernels: total ns, count, name)"; grep -v "^$" "$OUT/nsys_${v}_stats.csv" | awk -F, 'NR<3 || /Time/ {print} NR>=3 && NR<18 {print $2","$3","$9}' | cut -c1-160
          rm -f "$OUT/lce_$v.nsys-rep" "$OUT/lce_$v.sqlite"
        done
      else echo "no nsys"; fi
      stamp ;;
    ncu)
      [ -x /usr/local/cuda/bin/ncu ] || { echo "no ncu"; continue; }
      export NCU_ENV=${NCU_ENV:-}
      NCU_ROWS="document16|--batch 1 --heads 16 --seq 32768 --head-dim 128 --mask document:16" timeout 100 bash scripts/device/ncu_flex.sh
      for k in flex_bwd_dq flex_bwd_dkdv flex_fwd; do
        KERNEL=$k NCU_ROWS="causal|--batch 4 --heads 16 --seq 8192 --head-dim 128 --mask causal" timeout 100 bash scripts/device/ncu_flex.sh
      done
      stamp ;;
  esac
done
cd "$OUT" && tar czf all.tgz --remove-files $(ls | grep -v all.tgz)
