#!/usr/bin/env bash
# kiln's GPU driver: builds the tree on the GPU machine and runs named suites there.
#
#   scripts/gpu.sh [-n|--dry-run] SUITE...          SUITE: tests lce flex train ops all
#   scripts/gpu.sh [-n|--dry-run] ab VAR=V1,V2[,...] SUITE     SUITE: lce flex train
#   scripts/gpu.sh prepare                          (here, before the call: .device/debs, .device/commit)
#   PREBUILT=1 scripts/gpu.sh prepare               (also builds here and packs .device/prebuilt.tar.xz)
#
# Suites (run from the repository root of the GPU machine; `all` = tests lce flex train, built once):
#   tests  a full build for sm_90a with the Python extension, every CTest test (CUDA included), pytest
#   lce    python/bench/compare_torch.py --only lce: kiln's speed and memory strategies beside torch
#          eager / torch.compile at 8192x4096x128256, 8192x2304x256000, 32768x4096x128256 (time, memory)
#   flex   compare_torch.py --only flex: kiln beside torch's compiled flex_attention on seven rows
#          (windows 256 / 1024, causal, 16 documents, causal + ALiBi, causal + softcap)
#   train  bench/train_bench.py: the gpt125m training step, kiln beside torch eager and torch.compile
#   ops    bench_memory_bound and bench_matmul on CUDA (not in `all`)
#   norm   python/bench/fused_norm.py: RMSNorm fwd+bwd beside torch.compile and the copy bandwidth
#          (not in `all`)
#   ab     kiln's side of one suite once per value of one tuning variable, interleaved in one call:
#          scripts/gpu.sh ab KILN_FLEX_FWD_TILE=64x64,128x128 flex    (bench_flex / bench_lce /
#          train_bench.py --frameworks kiln; PASSES rounds, default 2; the table gives each value's best)
#
# Output: progress lines on stdout and in $OUT/gpu.log; the summary and the table (kiln ms, reference
# ms, ratio, memory per row) come LAST. $OUT (default /tmp/kiln-out; the device tool sets it) holds
# at most six files: gpu.log, results.json (everything measured, rewritten after each part, so a run
# cut short still returns what it reached), build.log, ctest.log, pytest.log, bench.log (the
# benchmarks' own output).
#
# Time: every part runs under `timeout`, and a call ends within DEADLINE seconds (default 570, for
# the device tool's 10 minutes). The build and the tests (CTest and pytest side by side) take what
# they need up to their caps (CAP_BUILD 360, CAP_TESTS 300) while leaving each later suite two fifths
# of its usual length; each benchmark suite then gets its share of the time left (CAP_LCE 300,
# CAP_FLEX 330, CAP_TRAIN 300, CAP_OPS 150 at most). A part cut short is marked "timeout" and keeps
# the rows it finished. One call of `all` (~200 s of build) therefore reaches every suite but may not
# finish the benchmarks. The build stays in $BUILD (default build-gpu, git-ignored), so a later call
# on the same warm machine only rebuilds what changed: for full figures run `tests`, then
# `lce flex`, then `train` as separate calls.
#
# Knobs (environment): OUT, BUILD, DEADLINE, JOBS (ninja, default nproc), CTEST_JOBS (12), CTEST_EXCLUDE,
# CTEST_INCLUDE (CTest regexes), PYTEST_PATHS (default python/tests), TESTS_SERIAL=1 (CTest, then pytest), ITERS / WARMUP (compare_torch.py; default 20 / 5, 10 / 3 under
# `all`), LCE_ROWS / FLEX_ROWS (row indices, e.g. 0,3), TRAIN_STEPS (6), TRAIN_WARMUP (2), TRAIN_COLD=1 (train: kiln's cold starts too), PASSES (ab,
# 2); KILN_* tuning variables pass through to every part. Exit status 0 when every part ran to its end.
#
# The GPU machine has no package registry: Highway, Gloo, fmt and CLI11 come as Debian packages in
# .device/debs (git-ignored), fetched here by `scripts/gpu.sh prepare`, carried with the call
# (carry [".device"]), unpacked with dpkg -x into /opt/deps and found through CMAKE_PREFIX_PATH.
# torch, nanobind and pytest are installed there.
#
# Prebuilt: where device time is short, `PREBUILT=1 scripts/gpu.sh prepare` builds the tree here (in
# build-pre, with CUDA, the tests, the benchmarks and the extension for that machine's Python 3.12)
# and packs the binaries, CTest files and the Python package into .device/prebuilt.tar.xz (~25 MiB:
# the statically linked binaries share most of their bytes). A call that finds the archive unpacks
# it instead of building, and links this machine's source path to its own checkout, since CTest
# files and test fixtures name absolute paths.
#
#   scripts/gpu.sh prepare                               # here
#   device run, carry [".device"]:  bash scripts/gpu.sh all
#   scripts/gpu.sh -n all                                # prints the commands and their time limits,
#                                                        # runs nothing (DRY_TAKES="build=300 ctest=200")
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
OUT=${OUT:-/tmp/kiln-out}
BUILD=${BUILD:-build-gpu}
WORK=${WORK:-/tmp/kiln-gpu-work}
DEPS=${DEPS:-/opt/deps}
DEADLINE=${DEADLINE:-570}
JOBS=${JOBS:-$(nproc)}
CTEST_JOBS=${CTEST_JOBS:-12}
PASSES=${PASSES:-2}
T0=$(date +%s)
DRY=0
LAST_TOOK=0
SIM=0  # dry run: the seconds the parts would have taken
# Dry run: how long each part is taken to last (DRY_TAKES="build=300 ctest=200" overrides), and each
# A/B run (ab_flex, ab_lce, ab_train).
declare -A TAKES=([configure]=15 [build]=220 [ctest]=130 [pytest]=60 [lce]=150 [flex]=200 [train]=200 [ops]=90
                  [ab_flex]=10 [ab_lce]=30 [ab_train]=60)
for kv in ${DRY_TAKES:-}; do TAKES[${kv%%=*}]=${kv#*=}; done

usage() { sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

# ---------------------------------------------------------------- rows
# compare_torch.py's FLEX_ROWS as bench_flex arguments, with the names the table uses (same order).
FLEX_NAMES=("1x8x32768x64 window 256" "1x16x32768x128 window 256" "4x16x8192x128 window 1024"
            "4x16x8192x128 causal" "1x16x32768x128 16 documents" "1x16x16384x128 causal+ALiBi"
            "1x16x16384x128 causal+softcap")
FLEX_ARGS=("--batch 1 --heads 8 --seq 32768 --head-dim 64 --mask sliding:256"
           "--batch 1 --heads 16 --seq 32768 --head-dim 128 --mask sliding:256"
           "--batch 4 --heads 16 --seq 8192 --head-dim 128 --mask sliding:1024"
           "--batch 4 --heads 16 --seq 8192 --head-dim 128 --mask causal"
           "--batch 1 --heads 16 --seq 32768 --head-dim 128 --mask document:16"
           "--batch 1 --heads 16 --seq 16384 --head-dim 128 --mask causal --score alibi"
           "--batch 1 --heads 16 --seq 16384 --head-dim 128 --mask causal --score softcap:30")
# compare_torch.py's LCE shapes: tokens x hidden x vocab.
LCE_SHAPES=("8192 4096 128256" "8192 2304 256000" "32768 4096 128256")

# ---------------------------------------------------------------- bookkeeping
elapsed() { echo $(($(date +%s) - T0 + SIM)); }
left() { echo $((DEADLINE - $(elapsed))); }
log() { echo "[$(printf '%4d' "$(elapsed)") s] $*" | tee -a "$OUT/gpu.log"; }

# record PART STATUS SECONDS [NOTE]: one line of $WORK/parts.jsonl for the report.
record() {
  local note=${4:-}
  note=${note//\\/\/}
  note=${note//\"/\'}
  printf '{"part": "%s", "status": "%s", "seconds": %s, "note": "%s"}\n' "$1" "$2" "$3" "$note" >> "$WORK/parts.jsonl"
}

# limit PART: the seconds PART may take. The build and the tests take what they need (at most their
# cap) but leave each later part two fifths of its usual length; a benchmark suite gets the share of
# the time left that its usual length is of the parts still to run. 10 s stay for the report.
declare -A WANT=([tests]=150 [lce]=100 [flex]=150 [train]=150 [ops]=90 [norm]=60 [ab]=0)
declare -A CAP=([build]=${CAP_BUILD:-360} [tests]=${CAP_TESTS:-300} [lce]=${CAP_LCE:-300} [flex]=${CAP_FLEX:-330}
                [train]=${CAP_TRAIN:-300} [ops]=${CAP_OPS:-150} [norm]=${CAP_NORM:-150} [ab]=100000)
limit() {
  local avail=$(($(left) - 10)) p on=0 later=0 pending=0 s
  [ "$1" = build ] && on=1
  for p in "${PLAN[@]}"; do
    if [ "$on" = 1 ]; then later=$((later + WANT[$p] * 2 / 5)); pending=$((pending + WANT[$p])); fi
    if [ "$p" = "$1" ]; then on=1; pending=$((pending + WANT[$p])); fi
  done
  if [ "$1" = build ] || [ "$1" = tests ] || [ "$pending" = 0 ]; then s=$((avail - later))
  else s=$((avail * WANT[$1] / pending)); fi
  [ "$s" -gt "${CAP[$1]}" ] && s=${CAP[$1]}
  echo "$s"
}

# part NAME SECONDS LOGFILE CMD...: CMD under `timeout`, its output appended to LOGFILE, its status
# (ok / failed / timeout / skipped) recorded; returns CMD's status.
part() {
  local name=$1 limit=$2 logfile=$3
  shift 3
  if [ "$limit" -lt 15 ]; then
    log "$name: skipped (${limit} s left for it)"
    record "$name" skipped 0 "out of time"
    return 1
  fi
  if [ "$DRY" = 1 ]; then
    local takes=${TAKES[$name]:-$limit}
    [ "$takes" -gt "$limit" ] && takes=$limit
    echo "+ [$(elapsed) s] timeout -k 10 $limit $* >> $logfile   (dry run: takes $takes s)"
    SIM=$((SIM + takes))
    LAST_TOOK=$takes
    record "$name" dry-run "$takes"
    return 0
  fi
  log "$name: up to $limit s"
  echo "=== $name: $*" >> "$logfile"
  local t=$SECONDS rc
  timeout -k 10 "$limit" "$@" >> "$logfile" 2>&1
  rc=$?
  local took=$((SECONDS - t)) status=ok
  LAST_TOOK=$took
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then status=timeout; elif [ "$rc" != 0 ]; then status=failed; fi
  record "$name" "$status" "$took" "rc $rc"
  log "$name: $status in $took s"
  return "$rc"
}

report() {  # results.json now; with --table, the summary and the table on stdout and in gpu.log
  [ "$DRY" = 1 ] && [ "${1:-}" != --table ] && return 0
  if [ "${1:-}" = --table ]; then
    python3 python/bench/gpu_report.py "$WORK" "$OUT" --table | tee -a "$OUT/gpu.log"
  else
    python3 python/bench/gpu_report.py "$WORK" "$OUT" > /dev/null 2>> "$OUT/gpu.log"
  fi
}

# ---------------------------------------------------------------- build
build() {  # build TARGET...: unpack the carried Debian packages, configure once, ninja
  local debs=(.device/debs/*.deb)
  [ -f .device/prebuilt.tar.xz ] && BUILD=build-pre
  if [ -e "${debs[0]}" ]; then
    if [ "$DRY" = 1 ]; then echo "+ dpkg -x <each of ${#debs[@]} .deb in .device/debs> $DEPS"
    else mkdir -p "$DEPS" && for f in "${debs[@]}"; do dpkg -x "$f" "$DEPS"; done; fi
  else
    log "no .device/debs: relying on the machine's own packages (scripts/gpu.sh prepare fetches them)"
  fi
  # Debian puts libgloo in usr/lib and libnl in lib/x86_64-linux-gnu, beside the multiarch folder.
  export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu:$DEPS/usr/lib:$DEPS/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  [ -f .device/prebuilt.tar.xz ] && { unpack_prebuilt; return; }
  if [ ! -f "$BUILD/build.ninja" ]; then
    part configure "$(limit build)" "$OUT/build.log" \
      cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$DEPS/usr" \
      -DCMAKE_CUDA_ARCHITECTURES=90a-real -DKILN_CUDA=ON -DKILN_PYTHON=ON -DKILN_TESTS=ON -DKILN_BENCH=ON ||
      { tail -20 "$OUT/build.log" 2> /dev/null | tee -a "$OUT/gpu.log"; return 1; }
  fi
  part build "$(limit build)" "$OUT/build.log" ninja -C "$BUILD" -j "$JOBS" "$@" ||
    { grep -s -E -A5 "error|FAILED" "$OUT/build.log" | head -40 | tee -a "$OUT/gpu.log"; return 1; }
}

unpack_prebuilt() {  # the binaries built here by `PREBUILT=1 scripts/gpu.sh prepare`, in place of a build
  local src nccl
  src=$(cat .device/prebuilt.path)
  [ "$DRY" = 1 ] && { echo "+ tar xJf .device/prebuilt.tar.xz; ln -s $ROOT $src"; return 0; }
  tar xJf .device/prebuilt.tar.xz || { log "prebuilt: cannot unpack"; return 1; }
  [ -e "$src" ] || { mkdir -p "$(dirname "$src")" && ln -s "$ROOT" "$src"; }
  # The CUDA libraries and NCCL as that machine has them (the toolkit, or the pip wheels).
  nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) + "/lib")' 2> /dev/null)
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cuda/lib64${nccl:+:$nccl}
  record build prebuilt 0 "built from $(cat .device/commit)"
  log "prebuilt binaries of $(cat .device/commit) unpacked"
}

# ---------------------------------------------------------------- suites
compare_args() {  # compare_torch.py's iteration arguments
  local iters=${ITERS:-} warm=${WARMUP:-}
  if [ "$ALL" = 1 ]; then iters=${iters:-10}; warm=${warm:-3}; fi
  echo "${iters:+--iters $iters} ${warm:+--warmup $warm}"
}

suite_tests() {  # CTest and pytest side by side (TESTS_SERIAL=1: one after the other)
  local limit
  limit=$(limit tests)
  if [ "${TESTS_SERIAL:-0}" = 1 ]; then
    run_ctest "$limit"
    run_pytest $((limit - LAST_TOOK))
  elif [ "$DRY" = 1 ]; then  # side by side: the part takes the longer of the two
    local sim=$SIM a
    run_ctest "$limit"
    a=$SIM SIM=$sim
    run_pytest "$limit"
    [ "$a" -gt "$SIM" ] && SIM=$a
  else
    run_ctest "$limit" &
    local job=$!
    run_pytest "$limit"
    wait "$job"
  fi
  [ "$DRY" = 1 ] && return
  grep -E "tests passed|tests failed" "$OUT/ctest.log" | tail -1 | tee -a "$OUT/gpu.log"
  grep -E "^ +[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception|Not Run)" "$OUT/ctest.log" | head -20 |
    tee -a "$OUT/gpu.log"
  tail -1 "$OUT/pytest.log" | tee -a "$OUT/gpu.log"
  grep -E "^(FAILED|ERROR) " "$OUT/pytest.log" | head -20 | tee -a "$OUT/gpu.log"
}
run_ctest() {
  # CTEST_EXCLUDE: a regex of tests to leave out (e.g. the NVRTC compile sweeps, which need no GPU).
  part ctest "$1" "$OUT/ctest.log" ctest --test-dir "$BUILD" -j "$CTEST_JOBS" --output-on-failure --timeout 200 \
    ${CTEST_EXCLUDE:+-E "$CTEST_EXCLUDE"} ${CTEST_INCLUDE:+-R "$CTEST_INCLUDE"}
}
run_pytest() {
  part pytest "$1" "$OUT/pytest.log" \
    env PYTHONPATH="$BUILD/python" python3 -m pytest ${PYTEST_PATHS:-python/tests} -q -rs -p no:cacheprovider
}

suite_compare() {  # suite_compare lce|flex
  local which=$1 rows flag=--rows
  if [ "$which" = lce ]; then rows=${LCE_ROWS:-} flag=--lce-rows; else rows=${FLEX_ROWS:-}; fi
  # shellcheck disable=SC2046  # compare_args' words are separate arguments
  part "$which" "$(limit "$which")" "$OUT/bench.log" \
    env PYTHONPATH="$BUILD/python" python3 python/bench/compare_torch.py --only "$which" \
    --out "$WORK/$which.json" $(compare_args) ${rows:+"$flag" "$rows"}
}

suite_train() {
  local limit
  limit=$(limit train)
  # kiln, then torch eager, then torch.compile (which compiles during its warm-up steps), each in its
  # own process under at most 150 s; the JSON keeps the frameworks that finished.
  local each=$((limit - 5))
  [ "$each" -gt 150 ] && each=150
  part train "$limit" "$OUT/bench.log" python3 bench/train_bench.py --kiln "$BUILD/kiln" \
    --frameworks kiln,eager,compile --steps "${TRAIN_STEPS:-6}" --warmup "${TRAIN_WARMUP:-2}" \
    --timeout "$each" --out "$WORK/train.json" ${TRAIN_COLD:+--cold-start}
}

suite_norm() {
  part norm "$(limit norm)" "$OUT/bench.log" \
    env PYTHONPATH="$BUILD/python" python3 python/bench/fused_norm.py --out "$OUT/fused_norm.json"
}

suite_ops() {
  local limit
  limit=$(limit ops)
  part ops "$limit" "$WORK/ops.jsonl" sh -c "'$BUILD/bench/bench_memory_bound' cuda; '$BUILD/bench/bench_matmul' cuda"
  [ "$DRY" = 1 ] || sed -n '/^$/,$p' "$WORK/ops.jsonl" | tee -a "$OUT/bench.log"
}

# ---------------------------------------------------------------- A/B
# ab_run SUITE ROW_INDEX VALUE PASS: kiln's side of one row with VAR=VALUE; one line of ab.jsonl.
ab_run() {
  local suite=$1 i=$2 value=$3 pass=$4 f="$WORK/ab_${1}_${2}_${4}_${#AB_DONE[@]}.txt" name limit rc=0 n h v
  [ "$suite" = lce ] && read -r n h v <<< "${LCE_SHAPES[$i]}"
  local cap=$(((DEADLINE - $(elapsed)) - 10))
  case $suite in
    flex) name=${FLEX_NAMES[$i]}; limit=60 ;;
    lce) name="${n}x${h}x$v"; limit=150 ;;
    train) name="gpt125m"; limit=200 ;;
  esac
  [ "$cap" -lt "$limit" ] && limit=$cap
  if [ "$limit" -lt 15 ]; then AB_CUT=1; return; fi
  local cmd
  case $suite in
    flex) cmd="$BUILD/bench/bench_flex --device cuda ${FLEX_ARGS[$i]} --dtype bf16 --json --reps 20 --flex-only" ;;
    lce) cmd="$BUILD/bench/bench_lce --device cuda --dtype bf16 --json --iters 5 --tokens $n --hidden $h --vocab $v --variants speed,memory" ;;
    train) cmd="python3 bench/train_bench.py --kiln $BUILD/kiln --frameworks kiln --steps ${TRAIN_STEPS:-6} --warmup ${TRAIN_WARMUP:-2} --timeout $((limit - 5)) --out $f" ;;
  esac
  AB_DONE+=("$f")
  if [ "$DRY" = 1 ]; then
    echo "+ [$(elapsed) s] $AB_VAR=$value timeout -k 10 $limit $cmd > $f"
    local key=ab_$suite
    SIM=$((SIM + TAKES[$key]))
    return
  fi
  # shellcheck disable=SC2086  # cmd is a word list
  if [ "$suite" = train ]; then
    env "$AB_VAR=$value" timeout -k 10 "$limit" $cmd >> "$OUT/bench.log" 2>&1 || rc=$?
  else
    env "$AB_VAR=$value" timeout -k 10 "$limit" $cmd > "$f" 2>&1 || rc=$?
    cat "$f" >> "$OUT/bench.log"
  fi
  printf '{"suite": "%s", "row": "%s", "var": "%s", "value": "%s", "pass": %d, "rc": %d, "file": "%s"}\n' \
    "$suite" "$name" "$AB_VAR" "$value" "$pass" "$rc" "$f" >> "$WORK/ab.jsonl"
  log "ab pass $pass $name $AB_VAR=$value: rc $rc"
}

suite_ab() {
  local suite=$1 pass i v n
  case $suite in flex) n=${#FLEX_ARGS[@]} ;; lce) n=${#LCE_SHAPES[@]} ;; train) n=1 ;; esac
  local rows
  if [ "$suite" = flex ] && [ -n "${FLEX_ROWS:-}" ]; then rows=${FLEX_ROWS//,/ }
  elif [ "$suite" = lce ] && [ -n "${LCE_ROWS:-}" ]; then rows=${LCE_ROWS//,/ }
  else rows=$(seq 0 $((n - 1))); fi
  AB_DONE=() AB_CUT=0
  local t=$SECONDS
  for pass in $(seq "$PASSES"); do
    for i in $rows; do
      for v in "${AB_VALUES[@]}"; do
        ab_run "$suite" "$i" "$v" "$pass"
        [ "$AB_CUT" = 1 ] && break 3
      done
    done
  done
  if [ "$AB_CUT" = 1 ]; then
    record ab timeout $((SECONDS - t)) "out of time after ${#AB_DONE[@]} runs"
    log "ab: out of time after ${#AB_DONE[@]} runs"
  else
    record ab "$([ "$DRY" = 1 ] && echo dry-run || echo ok)" $((SECONDS - t))
  fi
}

# ---------------------------------------------------------------- here, before a call
prepare() {  # the Debian packages the GPU machine lacks, and the commit the call measures
  local pkgs
  # Gloo's runtime needs hiredis and ibverbs (with libnl), which that machine lacks too.
  read -ra pkgs <<< "${DEBS:-libhwy-dev libhwy1 libgloo-dev libgloo0 libfmt-dev libfmt9 libcli11-dev libhiredis0.14 \
    libhiredis-dev libibverbs1 libibverbs-dev libnl-3-200 libnl-route-3-200}"
  mkdir -p .device/debs
  if ! ls .device/debs/*.deb > /dev/null 2>&1; then
    (cd .device/debs && apt-get download "${pkgs[@]}") || { echo "apt-get download failed"; return 1; }
  fi
  local commit
  commit=$(git rev-parse --short HEAD)
  [ -n "$(git status --porcelain --untracked-files=no)" ] && commit="$commit+changes"
  echo "$commit" > .device/commit
  if [ "${PREBUILT:-0}" = 1 ]; then prebuild || return 1; else rm -f .device/prebuilt.tar.xz; fi
  ls .device/debs
  echo "commit $commit; carry [\".device\"] and run: bash scripts/gpu.sh SUITE..."
}

prebuild() {  # here: build for the GPU machine and pack what its suites run
  local py=${PYTHON312:-$(command -v python3.12)} b=build-pre
  [ -x "$py" ] || { echo "prebuilt: needs Python 3.12 (PYTHON312=...) with nanobind for the extension"; return 1; }
  cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_PYTHON=ON -DKILN_TESTS=ON \
    -DKILN_BENCH=ON -DPython_EXECUTABLE="$py" -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
    -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache > /dev/null && ninja -C "$b" || return 1
  find "$b" \( -name CTestTestfile.cmake -o -name '*_tests.cmake' -o -name '*_include.cmake' \) > .device/files
  find "$b/tests" "$b/bench" -maxdepth 1 -type f -perm -u+x >> .device/files
  echo "$b/kiln" >> .device/files
  find "$b/python/kiln" -type f >> .device/files
  tar cf - -T .device/files | xz -T0 -6 --lzma2=dict=256MiB > .device/prebuilt.tar.xz
  echo "$PWD" > .device/prebuilt.path
  ls -la .device/prebuilt.tar.xz
}

# ---------------------------------------------------------------- main
while [ $# -gt 0 ]; do
  case $1 in
    -n|--dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { usage; exit 2; }
[ "$1" = prepare ] && { prepare; exit $?; }

ALL=0 AB_VAR="" AB_SUITE=""
AB_VALUES=()
SUITES=()
if [ "$1" = ab ]; then
  if [ $# != 3 ] || [[ $2 != *=* ]]; then echo "usage: scripts/gpu.sh ab VAR=V1,V2 lce|flex|train" >&2; exit 2; fi
  AB_VAR=${2%%=*}
  IFS=, read -ra AB_VALUES <<< "${2#*=}"
  AB_SUITE=$3
  [[ $AB_SUITE =~ ^(lce|flex|train)$ ]] || { echo "ab takes lce, flex or train, not '$AB_SUITE'" >&2; exit 2; }
  [[ $AB_VAR =~ ^[A-Z_][A-Z0-9_]*$ ]] || { echo "not a variable name: '$AB_VAR'" >&2; exit 2; }
  [ ${#AB_VALUES[@]} -ge 1 ] || { echo "no values for $AB_VAR" >&2; exit 2; }
else
  for s in "$@"; do
    case $s in
      all) ALL=1; SUITES+=(tests lce flex train) ;;
      tests|lce|flex|train|ops|norm) SUITES+=("$s") ;;
      *) echo "unknown suite '$s' (tests lce flex train ops norm all, or ab VAR=V1,V2 SUITE)" >&2; exit 2 ;;
    esac
  done
fi

# The parts in the order they run, without repeats, and what to build for them.
PLAN=()
TARGETS=()
add_plan() { local p; for p in "${PLAN[@]}"; do [ "$p" = "$1" ] && return; done; PLAN+=("$1"); }
add_targets() { local t p; for t in "$@"; do for p in "${TARGETS[@]}"; do [ "$p" = "$t" ] && continue 2; done; TARGETS+=("$t"); done; }
if [ -n "$AB_SUITE" ]; then
  PLAN=(ab)
  case $AB_SUITE in flex) TARGETS=(bench_flex) ;; lce) TARGETS=(bench_lce) ;; train) TARGETS=(kiln_cli) ;; esac
else
  full=0
  for s in "${SUITES[@]}"; do
    case $s in
      tests) add_plan tests; full=1 ;;
      lce) add_plan lce; add_targets kiln_python ;;
      flex) add_plan flex; add_targets kiln_python ;;
      train) add_plan train; add_targets kiln_cli ;;
      ops) add_plan ops; add_targets bench_memory_bound bench_matmul ;;
      norm) add_plan norm; add_targets kiln_python ;;
    esac
  done
  [ "$full" = 1 ] && TARGETS=()  # everything: tests, benchmarks, the Python package
fi

mkdir -p "$OUT"
rm -rf "$WORK" && mkdir -p "$WORK"
rm -f "$OUT/gpu.log" "$OUT/results.json" "$OUT/build.log" "$OUT/ctest.log" "$OUT/pytest.log" "$OUT/bench.log"
commit=$(git rev-parse --short HEAD 2>/dev/null || cat .device/commit 2>/dev/null || echo unknown)
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
printf '{"commit": "%s", "gpu": "%s", "date": "%s", "argv": "%s", "ab_var": "%s", "ab_suite": "%s", "deadline_s": %s}\n' \
  "$commit" "${gpu:-none}" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" "$AB_VAR" "$AB_SUITE" "$DEADLINE" > "$WORK/meta.json"
log "kiln $commit on ${gpu:-no GPU}: ${PLAN[*]}${AB_VAR:+ ($AB_VAR = ${AB_VALUES[*]})}; deadline $DEADLINE s"

if build "${TARGETS[@]}"; then
  report
  for p in "${PLAN[@]}"; do
    case $p in
      tests) suite_tests ;;
      lce|flex) suite_compare "$p" ;;
      train) suite_train ;;
      ops) suite_ops ;;
      norm) suite_norm ;;
      ab) suite_ab "$AB_SUITE" ;;
    esac
    report
  done
else
  log "build failed: nothing else runs"
fi
log "done in $(elapsed) s"
report --table
# Status: 0 when every part ran to its end without an error.
! grep -q -v '"status": "\(ok\|dry-run\)"' "$WORK/parts.jsonl" 2> /dev/null
