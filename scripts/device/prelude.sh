# Sourced by the short device rounds (quick_round.sh, lce_round.sh, flex_check.sh) after setting
# LOG_NAME: $OUT made, the carried binaries unpacked (round_d.sh's setup), the carried libraries
# and libcudart on the library path (the binaries need libhwy from .device/debs), log(), which
# prints a line and appends it to $OUT/$LOG_NAME, and run_gtest().
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT"
PARTS=none bash scripts/device/round_d.sh > /dev/null 2>&1
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:$(dirname "$(find /usr/local /usr/lib -name 'libcudart.so.13*' 2>/dev/null | head -1)")
log() { echo "$*" | tee -a "$OUT/$LOG_NAME"; }
# run_gtest LABEL BINARY FILTER TIMEOUT: one carried test binary's selection, its output in
# $OUT/<binary>_<label>.log; logs its summary (how many passed, failed, skipped) and the first failures.
run_gtest() {
  local label=$1 bin=$2 filter=$3 limit=$4 out="$OUT/$(basename "$2")_$1.log"
  timeout "$limit" "$bin" --gtest_filter="$filter" > "$out" 2>&1
  log "$(basename "$bin") $label: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$out" | tr '\n' ' ')"
  grep -E "Failure" -A8 "$out" | head -40 | tee -a "$OUT/$LOG_NAME"
}
