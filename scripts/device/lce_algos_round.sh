#!/usr/bin/env bash
# Does a different cuBLASLt algorithm serve the fused loss's GEMMs better? (carry [".device"],
# binaries from scripts/device/pack.sh). At LCE_SHAPE (default 8192 x 4096 x 128256 bf16): test_ops'
# LinalgCuda tests (the ranked candidates') and test_lce's CUDA tests; `bench_lce --variants algos`
# (every ranked candidate of each GEMM timed alone; its last line is the KILN_GEMM_PICK value), then
# the sweep alone at SWEEP_SHAPES; torch's baselines; PASSES (default 2) interleaved passes of speed,
# memory and gemm3 with the defaults and with that pick (and the memory strategy with
# KILN_LCE_SHORT_ROWS=1, the speed strategy at SPEED_CHUNKS tokens); the memory strategy at other tile
# widths (MEM_VOCAB); the phases of a speed chunk and a memory tile.
# Logs to stdout and $OUT/lce_algos.log; the sweep's lines also to $OUT/lce_algos.jsonl.
set -uo pipefail
LOG_NAME=lce_algos.log
. scripts/device/prelude.sh
L=/tmp/kiln-bin/bin/bench_lce
shape=${LCE_SHAPE:-"--tokens 8192 --hidden 4096 --vocab 128256"}
log "commit $(cat .device/commit)  shape $shape"
run_gtest linalg_cuda build-gpu/tests/test_ops 'LinalgCuda.*' 120
run_gtest cuda build-gpu/tests/test_lce '*Cuda*' 240
timeout 300 $L --device cuda --dtype bf16 --json $shape --variants algos > "$OUT/lce_algos.jsonl" 2>&1
grep -E '"algo_best"|"algo_pick"|rror' "$OUT/lce_algos.jsonl" | while read -r l; do log "sweep $l"; done
pick=$(grep '"algo_pick"' "$OUT/lce_algos.jsonl" | sed -E 's/.*"env": "([^"]*)".*/\1/')
# The sweep alone at the issue's other shapes (SWEEP_SHAPES, ";"-separated; "-" for none).
default_shapes="--tokens 8192 --hidden 2304 --vocab 256000;--tokens 32768 --hidden 4096 --vocab 128256"
IFS=';' read -ra other_shapes <<< "${SWEEP_SHAPES:-$default_shapes}"
for sh in "${other_shapes[@]}"; do
  [ "$sh" = - ] && continue
  timeout 300 $L --device cuda --dtype bf16 --json $sh --variants algos > "$OUT/lce_algos_other.jsonl" 2>&1
  grep -E '"algo_best"|"algo_pick"|rror' "$OUT/lce_algos_other.jsonl" | while read -r l; do log "sweep $sh $l"; done
  cat "$OUT/lce_algos_other.jsonl" >> "$OUT/lce_algos_all.jsonl"
done
[ -z "${SKIP_TORCH:-}" ] && timeout 200 python3 .device/torch_baselines.py lce $shape 2>&1 | grep variant |
  while read -r l; do log "torch $l"; done
for pass in $(seq "${PASSES:-2}"); do
  for setting in default pick short_rows; do
    if [ $setting = pick ] && [ -z "$pick" ]; then continue; fi
    variants=speed,memory,gemm3
    [ $setting = short_rows ] && variants=memory  # KILN_LCE_SHORT_ROWS: the memory strategy's tiles only
    ( [ $setting = pick ] && export KILN_GEMM_PICK="$pick"
      [ $setting = short_rows ] && export KILN_LCE_SHORT_ROWS=1
      timeout 200 $L --device cuda --dtype bf16 --json --iters 5 $shape --variants $variants 2>&1 ) |
      while read -r l; do log "pass $pass $setting $l"; done
  done
  # Speed chunks in whole 128-row GEMM tiles (the default rounds to 64: 2752 = 21.5 tiles at 8192 x 128256).
  for ct in ${SPEED_CHUNKS:-2816}; do
    timeout 120 $L --device cuda --dtype bf16 --json --iters 5 $shape --variants speed --chunk-tokens "$ct" 2>&1 |
      while read -r l; do log "pass $pass chunk-tokens $ct $l"; done
  done
done
# The memory strategy's tile width (its fp32 dx accumulator is read and written once a tile):
# MEM_VOCAB widths beside the default (peaks above the bound at wider tiles; for the trade-off only).
for vc in ${MEM_VOCAB:-4096 7680}; do
  timeout 120 $L --device cuda --dtype bf16 --json --iters 5 $shape --variants memory --chunk-vocab "$vc" 2>&1 |
    while read -r l; do log "memory chunk-vocab $vc $l"; done
done
# One speed chunk's and one memory tile's phases (GEMMs and passes, each alone), with the defaults.
timeout 120 $L --device cuda --dtype bf16 --json $shape --variants phases 2>&1 |
  while read -r l; do log "phases $l"; done
KILN_LCE_SHORT_ROWS=1 timeout 120 $L --device cuda --dtype bf16 --json $shape --variants phases 2>&1 |
  grep '"memory"' | while read -r l; do log "phases short_rows $l"; done
