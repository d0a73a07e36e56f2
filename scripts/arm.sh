#!/usr/bin/env bash
# kiln on Arm from an x86-64 Debian machine: an aarch64 cross build of the CPU library, the `kiln`
# command and the CPU tests (cmake/toolchains/aarch64-linux-gnu.cmake), run under qemu-aarch64 with
# SVE vector lengths of 128, 256 and 512 bits and with SVE off (NEON only). `kiln info` runs first
# in every pass, so the log shows the Highway target each kernel family dispatched to.
#
#   scripts/arm.sh [all|setup|build|test [PASS...]]   (all: the three in order; `make test-arm`)
#
# The arm64 dependencies are not installed into the system (their -dev packages would clash with
# the amd64 ones): their .debs are unpacked into $BUILD_ARM/sysroot, which the toolchain file
# searches and qemu loads libraries from. Host packages (cross compiler, qemu-user) and the arm64
# package lists are installed when running as root, as scripts/setup.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_ARM=${BUILD_ARM:-build-arm}
JOBS=${JOBS:-$(nproc)}
SYSROOT=$PWD/$BUILD_ARM/sysroot
CROSS_ROOT=/usr/aarch64-linux-gnu     # libc, libstdc++, libgomp of the cross toolchain
TRIPLET=aarch64-linux-gnu

HOST_DEBS=(g++-aarch64-linux-gnu qemu-user ccache cmake ninja-build)
# arm64 builds of kiln's dependencies (scripts/setup.sh's list) and what their libraries load.
# Gloo (kiln::dist's CPU backend) loads hiredis and ibverbs, and ibverbs libnl.
ARM_DEBS=(libopenblas0-pthread:arm64 libopenblas-pthread-dev:arm64 libgfortran5:arm64 libhwy1:arm64
          libhwy-dev:arm64 libgtest-dev:arm64 nlohmann-json3-dev libcli11-dev libgloo0:arm64 libgloo-dev:arm64
          libhiredis0.14:arm64 libibverbs1:arm64 libnl-3-200:arm64 libnl-route-3-200:arm64)

# The qemu configurations: name, QEMU_CPU, the Highway target the kernels must dispatch to and,
# optionally, the test labels to run (default: all). `max` is a CPU with SVE2; sveN=on caps the
# vector length at N bits (the process starts at that length), sve=off leaves NEON only. Highway
# prefers its fixed-width SVE2_128 and SVE_256 targets to the length-agnostic SVE2 where the
# length allows. The last pass covers plain SVE (A64FX: 512 bits, no SVE2) with the tests of the
# Highway kernel families only, so every target libkiln is built with runs.
PASSES=("sve128 max,sve128=on SVE2_128" "sve256 max,sve256=on SVE_256" "sve512 max,sve512=on SVE2"
        "neon max,sve=off NEON" "a64fx a64fx SVE ops|lce")

# The tests that run under qemu: every test binary (CUDA tests skip), less the install check
# (it builds a consumer for the host) and FlexBlockMask.MillionTokenSlidingWindowIsFastAndSmall (a
# wall-clock bound set for native speed). Tests that start child copies of their binary start them
# through qemu too (testing::self_command), so no binfmt_misc registration is needed.
# ARM_TESTS="test_lce test_flex ..." narrows the build and the passes to those binaries.
ARM_TESTS=${ARM_TESTS:-}
# The `kiln` command's own tests (tests/cli) and the docs check run natively: nothing in them
# depends on the SIMD target, and each pass would repeat them under qemu.
QEMU_EXCLUDE='^(FlexBlockMask\.MillionTokenSlidingWindowIsFastAndSmall|Cli\..*|docs\.api_reference)$'

log() { echo "arm: $*"; }

as_root_or_fail() {  # what to install, and why it cannot be
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "arm: missing: $1 (run as root to install)" >&2
    exit 1
  fi
}

setup_host() {
  local missing=()
  for pkg in "${HOST_DEBS[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    as_root_or_fail "${missing[*]}"
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
  fi
}

# Unpacks the arm64 .debs into $SYSROOT (once; the stamp records the list), then points the
# symlinks that dpkg's alternatives would make (libopenblas.so -> openblas-pthread) and turns the
# packages' absolute symlinks into relative ones, so nothing inside resolves to the host's files.
setup_sysroot() {
  local stamp=$SYSROOT/.debs
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${ARM_DEBS[*]}" ]; then return; fi
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    as_root_or_fail "the arm64 package lists (dpkg --add-architecture arm64 && apt-get update)"
    log "adding the arm64 package lists"
    dpkg --add-architecture arm64
    apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
  fi
  local debs=$PWD/$BUILD_ARM/debs
  rm -rf "$SYSROOT" "$debs"
  mkdir -p "$SYSROOT" "$debs"
  log "downloading arm64 packages: ${ARM_DEBS[*]}"
  (cd "$debs" && apt-get -o APT::Sandbox::User=root download -qq "${ARM_DEBS[@]}" >/dev/null) || {
    # The lists may predate the packages' current versions.
    as_root_or_fail "up-to-date arm64 package lists (apt-get update)"
    apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
    (cd "$debs" && apt-get -o APT::Sandbox::User=root download -qq "${ARM_DEBS[@]}" >/dev/null)
  }
  for deb in "$debs"/*.deb; do dpkg -x "$deb" "$SYSROOT"; done
  local lib=$SYSROOT/usr/lib/$TRIPLET inc=$SYSROOT/usr/include/$TRIPLET
  for f in libopenblas.so libopenblas.so.0 libblas.so libblas.so.3; do ln -sf "openblas-pthread/$f" "$lib/$f"; done
  for f in cblas.h f77blas.h openblas_config.h; do ln -sf "openblas-pthread/$f" "$inc/$f"; done
  find "$SYSROOT" -type l -lname '/*' | while read -r link; do
    ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$SYSROOT$(readlink "$link")")" "$link"
  done
  # Gloo's CMake files name its library by absolute path (/usr/lib, the host's): make it the sysroot's.
  sed -i 's|"/usr/lib/libgloo|"${_IMPORT_PREFIX}/lib/libgloo|g' "$SYSROOT"/usr/share/cmake/Gloo/GlooTargets-*.cmake
  echo "${ARM_DEBS[*]}" >"$stamp"
}

build() {
  local launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  if [ ! -f "$BUILD_ARM/build.ninja" ]; then
    cmake -S . -B "$BUILD_ARM" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake -DKILN_ARM_SYSROOT="$SYSROOT" \
      -DKILN_CUDA=OFF -DKILN_PYTHON=OFF -DKILN_BENCH=OFF "${launcher[@]}"
  fi
  local start=$SECONDS
  # shellcheck disable=SC2086
  cmake --build "$BUILD_ARM" -j "$JOBS" ${ARM_TESTS:+--target kiln_cli $ARM_TESTS}
  log "cross build took $((SECONDS - start)) s"
}

# One qemu pass: `kiln info` (the dispatched targets; the pass fails unless it is the expected
# one), then the tests through CTest, whose emulator (the toolchain's CMAKE_CROSSCOMPILING_EMULATOR)
# takes its CPU from QEMU_CPU.
run_pass() {
  local name=$1 cpu=$2 expected=$3 pass_labels=${4:-} start=$SECONDS info
  log "== pass $name: qemu-aarch64 -cpu $cpu"
  info=$(QEMU_CPU=$cpu qemu-aarch64 -L "$CROSS_ROOT" -E LD_LIBRARY_PATH="$(guest_lib_path)" "$BUILD_ARM/kiln" info)
  echo "$info"
  if ! grep -q "dispatched $expected," <<<"$info"; then
    echo "arm: pass $name: expected the kernels on $expected" >&2
    return 1
  fi
  local select=(-LE '^install$') labels=$pass_labels
  if [ -n "$ARM_TESTS" ]; then
    labels=$(for t in $ARM_TESTS; do printf '%s|' "${t#test_}"; done)
    labels=${labels%|}
  fi
  [ -n "$labels" ] && select=(-L "^(${labels})\$")
  QEMU_CPU=$cpu ctest --test-dir "$BUILD_ARM" --output-on-failure -j "$JOBS" "${select[@]}" -E "$QEMU_EXCLUDE"
  log "pass $name took $((SECONDS - start)) s"
}

guest_lib_path() {  # as the toolchain file's emulator has it
  echo "$SYSROOT/usr/lib/$TRIPLET:$SYSROOT/usr/lib/$TRIPLET/openblas-pthread:$SYSROOT/lib/$TRIPLET:$SYSROOT/usr/lib"
}

run_tests() {  # [pass names...]: all when none given
  local total=$SECONDS
  for pass in "${PASSES[@]}"; do
    [ $# -gt 0 ] && [[ " $* " != *" ${pass%% *} "* ]] && continue
    # shellcheck disable=SC2086
    run_pass $pass
  done
  log "all passes took $((SECONDS - total)) s"
}

case "${1:-all}" in
  setup) setup_host; setup_sysroot ;;
  build) build ;;
  test) shift; run_tests "$@" ;;
  all) setup_host; setup_sysroot; build; run_tests ;;
  *) echo "usage: scripts/arm.sh [all|setup|build|test [PASS...]]" >&2; exit 2 ;;
esac
