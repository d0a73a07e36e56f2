#!/usr/bin/env bash
# Host time of kiln's Python adapters (carry [".device"]): the carried package (.device/py312.tar.xz,
# built by pack.sh) as "old", the same with this tree's python/kiln/*.py laid over it as "new";
# the torch adapter tests on "new", then scripts/device/flex_host.py on both (1x8x32768x64 window
# 256: event-timed and host-only ms per call, kiln's native API, torch flex, cProfile, the GPU's
# kernels; HOST_OLD=0 skips "old"). Then EXTRA (a command line) if set. Logs to stdout and $OUT/host.log.
set -uo pipefail
LOG_NAME=host.log
. scripts/device/prelude.sh
. scripts/device/flex_parts.sh
rm -rf /tmp/kiln-py-new && cp -r /tmp/kiln-py /tmp/kiln-py-new && cp python/kiln/*.py /tmp/kiln-py-new/kiln/
export KILN_CACHE_DIR=/tmp/kiln-cache-host
torch_pytest /tmp/kiln-py-new  # the new adapters
[ "${HOST_OLD:-1}" = 0 ] || FLEX_HOST_TAG=old FLEX_HOST_PARTS=times PYTHONPATH=/tmp/kiln-py timeout 120 python3 scripts/device/flex_host.py 2>&1 \
  | tee -a "$OUT/$LOG_NAME" | grep -v "^$" | head -8
FLEX_HOST_TAG=new PYTHONPATH=/tmp/kiln-py-new timeout 150 python3 scripts/device/flex_host.py > "$OUT/flex_host_new.log" 2>&1
grep -E "^new|skipped" "$OUT/flex_host_new.log" | tee -a "$OUT/$LOG_NAME"
grep -A26 "Name " "$OUT/flex_host_new.log" | cut -c1-200 | tee -a "$OUT/$LOG_NAME"
[ -z "${EXTRA:-}" ] || eval "$EXTRA"
