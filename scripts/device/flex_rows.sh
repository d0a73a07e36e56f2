# The flex rows the device rounds time, as name|`kiln bench flex` arguments (sourced by round_c.sh,
# round_g.sh and quick_round.sh).
FLEX_ROWS=(
  "causal|--batch 4 --heads 16 --seq 8192 --head-dim 128 --mask causal"
  "document16|--batch 1 --heads 16 --seq 32768 --head-dim 128 --mask document:16"
  "sliding256|--batch 1 --heads 8 --seq 32768 --head-dim 64 --mask sliding:256"
  "train_doc|--batch 4 --heads 12 --seq 4096 --head-dim 64 --mask document:4"
)
