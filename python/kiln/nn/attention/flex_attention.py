"""FlexAttention (torch.nn.attention.flex_attention's names).

score_mod(score, b, h, q_idx, kv_idx) and mask_mod(b, h, q_idx, kv_idx) may be Python functions:
they are traced once with symbolic arguments into kiln's IR (operators + - * / // %, comparisons,
& | ~, kiln.where / minimum / maximum / abs / exp / log / tanh, and indexing captured kiln
tensors, e.g. `bias[h][q_idx - kv_idx]`). Python control flow on the arguments (if / and / or)
cannot be traced and raises a KilnError naming the line. Built-in mods (causal_mask,
sliding_window_mask, document_mask, prefix_lm_mask, chunked_mask, alibi, softcap,
relative_position_bias) are kiln extras.
"""
from ... import _C
from ..._C import BlockMask, Expr, MaskMod, ScoreMod  # noqa: F401
from ..._C import (  # noqa: F401
    alibi, and_masks, causal_mask, chunked_mask, document_mask, noop_mask, or_masks, prefix_lm_mask,
    relative_position_bias, sliding_window_mask, softcap,
)

__all__ = ["flex_attention", "create_block_mask", "BlockMask", "MaskMod", "ScoreMod", "Expr", "and_masks",
           "or_masks", "noop_mask", "causal_mask", "sliding_window_mask", "document_mask", "prefix_lm_mask",
           "chunked_mask", "alibi", "softcap", "relative_position_bias"]


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device="cpu", BLOCK_SIZE=128, _compile=False):
    """Classifies every (q-block, kv-block) as empty / partial / full by analysing mask_mod's IR.
    B, H: None (or 1) broadcasts over batch / heads. BLOCK_SIZE: an int (q and kv alike)."""
    if isinstance(BLOCK_SIZE, tuple):
        if BLOCK_SIZE[0] != BLOCK_SIZE[1]:
            raise _C.KilnError("[create_block_mask] kiln uses one block size for q and kv")
        BLOCK_SIZE = BLOCK_SIZE[0]
    return _C.create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device, BLOCK_SIZE)


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                   return_lse=False, kernel_options=None):
    """query [B, Hq, L, E], key [B, Hkv, S, E], value [B, Hkv, S, Ev] -> out [B, Hq, L, Ev]
    (and lse [B, Hq, L], fp32, with return_lse=True). Differentiable in q, k, v and captured float
    tensors of score_mod."""
    return _C.flex_attention(query, key, value, score_mod, block_mask, scale, enable_gqa, return_lse)
