# Sourced by the short device rounds (quick_round.sh, lce_round.sh, flex_check.sh) after setting
# LOG_NAME: $OUT made, the carried binaries unpacked (round_d.sh's setup), the carried libraries
# and libcudart on the library path (the binaries need libhwy from .device/debs), and log(), which
# prints a line and appends it to $OUT/$LOG_NAME.
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT"
PARTS=none bash scripts/device/round_d.sh > /dev/null 2>&1
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:$(dirname "$(find /usr/local /usr/lib -name 'libcudart.so.13*' 2>/dev/null | head -1)")
log() { echo "$*" | tee -a "$OUT/$LOG_NAME"; }
