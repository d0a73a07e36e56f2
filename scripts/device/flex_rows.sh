# The flex rows the device rounds time, as name|`kiln bench flex` arguments (sourced by round_c.sh,
# round_g.sh and quick_round.sh), and ISSUE_ROWS: issue 4's seven rows as `kiln bench flex`
# arguments, in the order of compare_torch.py's FLEX_ROWS (sourced by flex_ab.sh, flex_tiles.sh and the
# session rounds), and flex_bench_line, one row timed by kiln alone.
FLEX_ROWS=(
  "causal|--batch 4 --heads 16 --seq 8192 --head-dim 128 --mask causal"
  "document16|--batch 1 --heads 16 --seq 32768 --head-dim 128 --mask document:16"
  "sliding256|--batch 1 --heads 8 --seq 32768 --head-dim 64 --mask sliding:256"
  "train_doc|--batch 4 --heads 12 --seq 4096 --head-dim 64 --mask document:4"
)
ISSUE_ROWS=(
  "--batch 1 --heads 8 --seq 32768 --head-dim 64 --mask sliding:256"
  "--batch 1 --heads 16 --seq 32768 --head-dim 128 --mask sliding:256"
  "--batch 4 --heads 16 --seq 8192 --head-dim 128 --mask sliding:1024"
  "--batch 4 --heads 16 --seq 8192 --head-dim 128 --mask causal"
  "--batch 1 --heads 16 --seq 32768 --head-dim 128 --mask document:16"
  "--batch 1 --heads 16 --seq 16384 --head-dim 128 --mask causal --score alibi"
  "--batch 1 --heads 16 --seq 16384 --head-dim 128 --mask causal --score softcap:30"
)

# kiln alone on one row (`kiln bench flex` arguments, 20 repetitions) in the caller's environment:
# its '"fwd_ms": ..., "fwd_bwd_ms": ...' (empty when the run failed).
flex_bench_line() {
  timeout 40 build-gpu/kiln bench flex --device cuda "$@" --dtype bf16 --json --reps 20 --flex-only 2>&1 |
    grep '"variant": "flex"' | grep -o '"fwd_ms": [0-9.]*, "fwd_bwd_ms": [0-9.]*'
}
