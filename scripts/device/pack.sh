#!/usr/bin/env bash
# Builds everything a device round carries into .device/ (git-ignored; carry [".device"]) from a
# fresh checkout on the dev machine: the Debian packages the GPU machine lacks, torch_baselines.py,
# kiln and the test / bench binaries of `build` (stripped, .device/bin.tar.xz, with .device/commit),
# and the Python package for the device's CPython 3.12 (.device/py312.tar.xz).
#   BASE=<commit> also packs that commit's kiln as .device/bin_base.tar.xz (round_g.sh's rows part
#   runs it beside the new build). SKIP_PY=1 skips the Python package.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .device
[ -d .device/debs ] || bash ../shared/device/fetch-debs.sh .device/debs
cp -f ../shared/bench/torch_baselines.py .device/ 2>/dev/null || true
make build
rm -rf .device/bin && mkdir -p .device/bin
for f in build/kiln build/tests/test_flex build/tests/test_ops build/tests/test_train build/tests/test_lce build/bench/bench_memory_bound \
         build/bench/bench_lce; do
  strip -o ".device/bin/$(basename "$f")" "$f"
done
(cd .device && tar cJf bin.tar.xz bin && rm -rf bin)
git rev-parse --short HEAD > .device/commit
if [ "${SKIP_PY:-0}" = 0 ]; then
  PY312=${PY312:-$HOME/.pyenv/versions/3.12.1/bin/python3.12}
  "$PY312" -m pip show -q nanobind > /dev/null 2>&1 || "$PY312" -m pip install -q nanobind
  launcher=$(command -v ccache > /dev/null && echo "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache" || true)
  [ -f build-py312/build.ninja ] || cmake -S . -B build-py312 -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF \
    -DKILN_BENCH=OFF -DKILN_PYTHON=ON -DPython_EXECUTABLE="$PY312" $launcher
  ninja -C build-py312 kiln_python
  (cd build-py312/python && strip kiln/_C*.so && tar cJf ../../.device/py312.tar.xz kiln)
fi
if [ -n "${BASE:-}" ]; then
  wt=$(mktemp -d /tmp/kiln-base.XXXX)
  git worktree add -q "$wt" "$BASE"
  cmake -S "$wt" -B "$wt/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF -DKILN_BENCH=OFF > /dev/null
  ninja -C "$wt/build" kiln_cli
  mkdir -p "$wt/pack/bin" && strip -o "$wt/pack/bin/kiln" "$wt/build/kiln"
  (cd "$wt/pack" && tar cJf "$OLDPWD/.device/bin_base.tar.xz" bin)
  echo "$BASE" > .device/commit_base
  git worktree remove --force "$wt"
fi
du -sh .device; ls -la .device
