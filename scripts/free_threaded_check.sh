#!/usr/bin/env bash
# Runs kiln's Python tests under a free-threaded interpreter (python3.13t): the extension
# is built with nanobind's FREE_THREADED option, and python/tests/test_threads.py checks that
# concurrent calls give bit-identical results and that `import kiln` leaves the GIL disabled.
#
# Neither Debian (bookworm, trixie, sid, experimental) nor Ubuntu ships a free-threaded
# interpreter package, and python.org/GitHub may be unreachable, so this builds CPython 3.13
# with --disable-gil from Debian trixie's source package (fetched through a private apt state:
# the system's sources, package lists and installed packages are not touched; the orig tarball's
# hash is checked by apt against the signed Sources index). It needs the -dev packages CPython's
# stdlib builds against (libssl-dev, libffi-dev, zlib1g-dev, ... present on kiln's build machines).
#
# Steps (each skipped when already done, so reruns are cheap):
#   1. CPython 3.13 (--disable-gil) into $FT_PREFIX (default /opt/py313t), ~10 min on 2 cores
#   2. pip (ensurepip) + pytest, numpy, nanobind, ml_dtypes into it, from PyPI
#   3. CPU-only CMake build of the `kiln_python` target in $FT_BUILD (default build-ft), ccache
#   4. pytest python/tests under it, then a check that `import kiln` kept the GIL off
#
# Usage: scripts/free_threaded_check.sh [extra pytest args]
#   FT_PYTHON=/path/to/python3.13t   use an existing free-threaded interpreter (skips steps 1-2's
#                                    build; its pip must reach an index or have the packages)
#   FT_PREFIX, FT_WORK, FT_BUILD, JOBS (default 2)
# Exits 0 when every test passes (or, with a "SKIP:" message, when the downloads are
# unreachable), non-zero on any failure. Not part of `make test`.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=${JOBS:-2}
FT_BUILD=${FT_BUILD:-$ROOT/build-ft}
if [ -z "${FT_PREFIX:-}" ]; then
  if [ -w /opt ]; then FT_PREFIX=/opt/py313t; else FT_PREFIX=${XDG_CACHE_HOME:-$HOME/.cache}/kiln/py313t; fi
fi
FT_WORK=${FT_WORK:-$FT_PREFIX-work}
CPY_SRC_PKG=python3.13  # Debian source package; its orig tarball is upstream CPython

log() { echo "free_threaded_check: $*"; }
skip() { echo "free_threaded_check: SKIP: $*"; exit 0; }
die() { echo "free_threaded_check: FAIL: $*" >&2; exit 1; }

is_free_threaded() { "$1" -c 'import sysconfig, sys; sys.exit(not sysconfig.get_config_var("Py_GIL_DISABLED"))' 2>/dev/null; }

# --- 1. the interpreter -------------------------------------------------------------------------
fetch_cpython_source() {  # -> $FT_WORK/src/python3.13_<version>.orig.tar.xz
  command -v apt-get >/dev/null || skip "no apt-get to fetch Debian's $CPY_SRC_PKG source (set FT_PYTHON)"
  local s=$FT_WORK/apt
  mkdir -p "$s/lists/partial" "$s/cache/archives/partial" "$s/empty.d" "$FT_WORK/src"
  : >"$s/status"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
    >"$s/sources.list"
  local apt_opts=(-o Dir::Etc::sourcelist="$s/sources.list" -o Dir::Etc::sourceparts=- -o Dir::State="$s"
                  -o Dir::State::lists="$s/lists" -o Dir::State::status="$s/status" -o Dir::Cache="$s/cache"
                  -o Dir::Etc::preferencesparts="$s/empty.d" -o Dir::Etc::parts="$s/empty.d"
                  -o Debug::NoLocking=1 -o APT::Sandbox::User="$(id -un)" -qq)
  if ! ls "$FT_WORK"/src/${CPY_SRC_PKG}_*.orig.tar.xz >/dev/null 2>&1; then
    apt-get "${apt_opts[@]}" --error-on=any update >&2 || skip "deb.debian.org unreachable (apt-get update failed)"
    (cd "$FT_WORK/src" && apt-get "${apt_opts[@]}" source --download-only "$CPY_SRC_PKG" >&2) \
      || skip "could not download Debian's $CPY_SRC_PKG source"
  fi
}

build_cpython() {
  local tarball version dir
  fetch_cpython_source
  tarball=$(ls "$FT_WORK"/src/${CPY_SRC_PKG}_*.orig.tar.xz | tail -1)
  version=$(basename "$tarball" | sed -E 's/.*_([0-9.]+)\.orig\.tar\.xz/\1/')
  dir=$FT_WORK/src/Python-$version
  log "building CPython $version --disable-gil into $FT_PREFIX (logs in $FT_WORK/src)"
  rm -rf "$dir" && tar -C "$FT_WORK/src" -xf "$tarball"
  (cd "$dir" && ./configure --disable-gil --prefix="$FT_PREFIX" --with-ensurepip=no >"$FT_WORK/src/configure.log" 2>&1 \
     && make -j"$JOBS" >"$FT_WORK/src/make.log" 2>&1 && make install >"$FT_WORK/src/install.log" 2>&1) \
    || die "CPython build failed (see $FT_WORK/src/*.log)"
  # The modules pip and the tests need must have been built (their -dev packages present).
  "$FT_PREFIX/bin/python3.13t" -c 'import ssl, ctypes, zlib, lzma, bz2, sqlite3' \
    || die "CPython built without ssl/ctypes/zlib/...: install libssl-dev libffi-dev zlib1g-dev liblzma-dev libbz2-dev libsqlite3-dev, then rm -rf $FT_PREFIX"
}

if [ -n "${FT_PYTHON:-}" ]; then
  PY=$FT_PYTHON
else
  PY=$FT_PREFIX/bin/python3.13t
  is_free_threaded "$PY" || build_cpython
fi
is_free_threaded "$PY" || die "$PY is not a free-threaded interpreter"
log "interpreter: $("$PY" -VV | head -1) ($PY)"

# --- 2. pip and the test dependencies -------------------------------------------------------------
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
"$PY" -m pip --version >/dev/null 2>&1 || "$PY" -m ensurepip >/dev/null 2>&1 || die "$PY -m ensurepip failed"
# nanobind as in the dev environment (3.x: FREE_THREADED support); numpy/ml_dtypes as cp313t wheels.
PKGS=(pytest "nanobind>=2.2" numpy ml_dtypes)
missing=()
for p in "${PKGS[@]}"; do
  mod=${p%%[<>=]*}
  "$PY" -c "import $mod" 2>/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  index=${PIP_INDEX_URL:-https://pypi.org/simple}
  "$PY" -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1] + '/pip/', timeout=15)" "$index" 2>/dev/null \
    || skip "package index $index unreachable (needed for ${missing[*]})"
  log "pip install ${missing[*]}"
  "$PY" -m pip install -q --only-binary numpy,ml_dtypes "${missing[@]}" \
    || die "pip install ${missing[*]} failed"
fi

# --- 3. the extension ------------------------------------------------------------------------------
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(dirname "$ROOT")}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
mkdir -p "$FT_BUILD"
cmake -S . -B "$FT_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=OFF -DKILN_PYTHON=ON \
  -DKILN_TESTS=OFF -DKILN_BENCH=OFF -DPython_EXECUTABLE="$PY" "${launcher[@]}" >"$FT_BUILD/configure.log" 2>&1 \
  || { cat "$FT_BUILD/configure.log" >&2; die "cmake configure failed"; }
cmake --build "$FT_BUILD" -j "$JOBS" --target kiln_python || die "building kiln_python failed"

# --- 4. the tests ----------------------------------------------------------------------------------
# PYTHON_GIL unset: the interpreter decides, so an extension that re-enables the GIL is caught.
export PYTHONPATH=$FT_BUILD/python${PYTHONPATH:+:$PYTHONPATH}
env -u PYTHON_GIL "$PY" -m pytest python/tests -q -rs -p no:cacheprovider "$@" || die "pytest failed"
env -u PYTHON_GIL "$PY" -W error::RuntimeWarning -c '
import sys, numpy, kiln
try:
    import ml_dtypes  # noqa: F401  (bf16 arrays; must not re-enable the GIL either)
except ImportError:
    pass
assert not sys._is_gil_enabled(), "the GIL is enabled after import kiln"
print("free_threaded_check: after import kiln: sys._is_gil_enabled() =", sys._is_gil_enabled())
' || die "importing kiln re-enabled the GIL"
log "OK"
