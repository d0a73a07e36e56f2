#!/usr/bin/env bash
# Builds the checkpoint parsers' libFuzzer targets with clang (AddressSanitizer +
# UndefinedBehaviorSanitizer) and runs each on its corpus in fuzz/corpus/<target>/.
#   scripts/fuzz.sh [SECONDS_PER_TARGET=60] [TARGET...]   (default: both targets)
# New inputs go to build-fuzz/corpus/<target> (the committed corpus is only read); crashes
# to build-fuzz/crash-*. fuzz/<target>.dict, where present, seeds the mutations with the format's
# tokens. The build uses every core; the fuzzers run on one.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(fuzz_safetensors fuzz_torch_zip)
out=build-fuzz
mkdir -p "$out/obj"
CXX=${CXX:-clang++}
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
       -Iinclude -Isrc -w)
# The CPU library the parsers reach (core, autograd, ops, io; no CUDA; no OpenMP pragmas, only
# libgomp's API), compiled in parallel and reused across runs.
mapfile -t srcs < <(find src/core src/autograd src/ops src/io -name '*.cpp' -not -path '*/cuda/*' | sort)
# The SIMD math kernels (*_simd.cpp: Highway code for every x86 target) are not on the parsers'
# paths and take clang over 15 minutes under the sanitizers: they build plain, at -O2.
# An object is rebuilt when its source or any header is newer (a header change can change any
# object: reusing stale ones linked against changed signatures, or worse, silently).
newest_header=$(find include src/core src/autograd src/ops src/io -name '*.h' | xargs stat -c %Y | sort -n | tail -1)
export CXX out newest_header
export FLAGS="${flags[*]}" PLAIN_FLAGS="-std=c++20 -O2 -Iinclude -Isrc -w"
printf '%s\n' "${srcs[@]}" | xargs -P "$(nproc)" -I{} sh -c '
  o="$out/obj/$(echo "{}" | tr / _).o"
  case "{}" in *_simd.cpp) f="$PLAIN_FLAGS" ;; *) f="$FLAGS -fsanitize=fuzzer-no-link" ;; esac
  if [ ! -f "$o" ] || [ "{}" -nt "$o" ] || [ "$(stat -c %Y "$o")" -lt "$newest_header" ]; then
    $CXX $f -c "{}" -o "$o" || exit 255
  fi'
objs=()
for s in "${srcs[@]}"; do objs+=("$out/obj/$(echo "$s" | tr '/' '_').o"); done
libs=(-lopenblas -lhwy -lhwy_contrib -lgomp -ldl)
for t in "${targets[@]}"; do
  "$CXX" "${flags[@]}" -fsanitize=fuzzer "fuzz/$t.cpp" "${objs[@]}" "${libs[@]}" -o "$out/$t"
  mkdir -p "$out/corpus/$t"
  dict=()
  [ -f "fuzz/$t.dict" ] && dict=(-dict="../fuzz/$t.dict")
  echo "== $t: ${secs}s"
  (cd "$out" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     "./$t" -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536 -timeout=10 -print_final_stats=1 \
     "${dict[@]}" "corpus/$t" "../fuzz/corpus/$t")
done
