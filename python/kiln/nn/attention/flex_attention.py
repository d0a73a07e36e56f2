"""FlexAttention (torch.nn.attention.flex_attention's names).

score_mod(score, b, h, q_idx, kv_idx) and mask_mod(b, h, q_idx, kv_idx) may be Python functions:
they are traced once with symbolic arguments into kiln's IR: operators + - * / // % (Python's floor
semantics), comparisons, & | ~, indexing captured tensors by computed indices (`bias[h, q_idx -
kv_idx]`), and torch's tensor methods and functions abs, sign, clamp / clamp_min / clamp_max,
minimum / maximum, where, exp, log, tanh, sigmoid, floor, remainder, float / long / int / bool / to,
eq / ne / lt / le / gt / ge, logical_and / or / not (as Expr methods, kiln.* functions, or torch.*
functions on the arguments), so PyTorch's own mods run unchanged. Captured tensors may be kiln
tensors, torch tensors (zero-copy) or NumPy arrays read from the function's closure or globals.
Python control flow on the arguments (if / and / or), or an operation outside the IR, raises an
error naming it and the mod's line. Built-in mods (causal_mask, sliding_window_mask, document_mask,
prefix_lm_mask, chunked_mask, alibi, softcap, relative_position_bias) are kiln extras.
"""
from ... import _C
from ..._C import BlockMask, Expr, MaskMod, ScoreMod  # noqa: F401
from ..._C import (  # noqa: F401
    and_masks, causal_mask, chunked_mask, noop_mask, or_masks, prefix_lm_mask, sliding_window_mask, softcap,
)
from ..._capture import to_capture as _to_capture

__all__ = ["flex_attention", "create_block_mask", "BlockMask", "MaskMod", "ScoreMod", "Expr", "and_masks",
           "or_masks", "noop_mask", "causal_mask", "sliding_window_mask", "document_mask", "prefix_lm_mask",
           "chunked_mask", "alibi", "softcap", "relative_position_bias"]


def document_mask(doc_ids):
    """doc_ids [L] int (kiln, torch or NumPy): attend within a document, doc[q_idx] == doc[kv_idx]."""
    return _C.document_mask(_to_capture(doc_ids))


def alibi(slopes):
    """slopes [H] float (kiln, torch or NumPy): score + slopes[h] * (kv_idx - q_idx)."""
    return _C.alibi(_to_capture(slopes))


def relative_position_bias(bias, offset):
    """bias [H, n] float, learned (kiln or torch tensor): score + bias[h][q_idx - kv_idx + offset].
    Gradients flow into bias (through kiln.torch.flex_attention for a torch tensor)."""
    return _C.relative_position_bias(_to_capture(bias), offset)


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
    if score_mod is not None:
        _mark_shared_captures(score_mod)
    return _C.flex_attention(query, key, value, score_mod, block_mask, scale, enable_gqa, return_lse)


def _mark_shared_captures(score_mod):
    """Captured tensors whose memory torch owns may have been written by torch since the last call."""
    from ... import _capture

    expr = getattr(score_mod, "expr", None)
    for kt in (expr.captured_tensors if expr is not None else ()):
        src = _capture.torch_source(kt)
        if src is not None:
            _capture.sync_from_torch(kt, src)
