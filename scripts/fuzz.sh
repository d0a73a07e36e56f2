#!/usr/bin/env bash
# Builds the checkpoint parsers' libFuzzer targets with clang (AddressSanitizer +
# UndefinedBehaviorSanitizer) and runs each on its corpus in fuzz/corpus/<target>/.
#   scripts/fuzz.sh [SECONDS_PER_TARGET=60] [TARGET...]   (default: both targets)
# New inputs go to build-fuzz/corpus/<target> (the committed corpus is only read); crashes
# to build-fuzz/crash-*. One core, on purpose.
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
# The library sources the parsers need (no CUDA, no OpenMP: pragmas are ignored).
srcs=(src/core/*.cpp src/core/cpu/*.cpp src/autograd/*.cpp src/io/*.cpp src/ops/*.cpp)
objs=()
for s in "${srcs[@]}"; do
  o="$out/obj/$(echo "$s" | tr '/' '_').o"
  if [ ! -f "$o" ] || [ "$s" -nt "$o" ]; then
    "$CXX" "${flags[@]}" -fsanitize=fuzzer-no-link -c "$s" -o "$o"
  fi
  objs+=("$o")
done
for t in "${targets[@]}"; do
  "$CXX" "${flags[@]}" -fsanitize=fuzzer "fuzz/$t.cpp" "${objs[@]}" -o "$out/$t"
  mkdir -p "$out/corpus/$t"
  echo "== $t: ${secs}s"
  (cd "$out" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     "./$t" -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536 -timeout=10 -print_final_stats=1 \
     "corpus/$t" "../fuzz/corpus/$t")
done
