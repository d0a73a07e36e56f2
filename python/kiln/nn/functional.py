"""kiln.nn.functional: torch.nn.functional's names and signatures over kiln's kernels."""
from collections import namedtuple

from .. import _C
from .._C import dropout, embedding, gelu, linear, log_softmax, relu, silu, softmax  # noqa: F401
from .._C import apply_rotary_emb, rotary_tables  # noqa: F401  (kiln extras)

__all__ = ["linear", "relu", "gelu", "silu", "softmax", "log_softmax", "embedding", "dropout", "rms_norm",
           "cross_entropy", "linear_cross_entropy", "linear_cross_entropy_with_stats", "apply_rotary_emb",
           "rotary_tables"]

_EPS = {"float32": 1.1920928955078125e-07, "float64": 2.220446049250313e-16, "bfloat16": 0.0078125,
        "float16": 0.0009765625}

LinearCrossEntropyResult = namedtuple("LinearCrossEntropyResult", ["loss", "lse", "z_loss", "strategy"])


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """y = x / sqrt(mean(x^2, last dim) + eps) * weight; x [..., H], weight [H].
    normalized_shape must be the last dim (H or (H,)); eps defaults to the dtype's machine epsilon
    (as in PyTorch)."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) != 1 or input.ndim == 0 or shape[0] != input.shape[-1]:
        raise _C.KilnError(f"[rms_norm] normalized_shape {shape} must be the last dim of input "
                           f"{tuple(input.shape)} (kiln normalises over one trailing dim)")
    if eps is None:
        eps = _EPS.get(input.dtype.name, 1e-6)
    return _C.rms_norm(input, weight, eps)


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    """input (logits) [N, C], target [N] int64/int32 -> [] (mean/sum) or [N] (none)."""
    if size_average is not None or reduce is not None:
        raise _C.KilnError("[cross_entropy] size_average/reduce are deprecated; use reduction=")
    return _C.cross_entropy(input, target, weight, ignore_index, reduction, label_smoothing)


def linear_cross_entropy(input, linear_weight, target, linear_bias=None, weight=None, reduction="mean",
                         ignore_index=-100, label_smoothing=0.0, *, z_loss=0.0, logit_softcap=0.0,
                         strategy="auto", chunk_tokens=0, chunk_vocab=0, memory_budget=0):
    """cross_entropy(input @ linear_weight.T + linear_bias, target) fused: the [tokens, vocab]
    logits are never materialised.

    input [N, H] or [B, T, H]; linear_weight [V, H]; target [N] / [B, T] int64/int32 in [0, V) or
    ignore_index; linear_bias [V]; weight [V] class weights -> loss [] (mean/sum) or target's shape
    (none). kiln extras: z_loss (coefficient of lse^2), logit_softcap (c * tanh(z / c)),
    strategy "auto" / "memory" / "speed", chunk sizes and a working-memory budget in bytes."""
    return _C.linear_cross_entropy(input, linear_weight, target, linear_bias, weight, reduction, ignore_index,
                                   label_smoothing, z_loss, logit_softcap, strategy, chunk_tokens, chunk_vocab,
                                   memory_budget, False)


def linear_cross_entropy_with_stats(input, linear_weight, target, linear_bias=None, weight=None, reduction="mean",
                                    ignore_index=-100, label_smoothing=0.0, **kiln_options):
    """linear_cross_entropy plus, for logging, the per-token lse (fp32, detached), the z-loss term
    and the strategy that ran -> LinearCrossEntropyResult(loss, lse, z_loss, strategy)."""
    o = dict(z_loss=0.0, logit_softcap=0.0, strategy="auto", chunk_tokens=0, chunk_vocab=0, memory_budget=0)
    unknown = set(kiln_options) - set(o)
    if unknown:
        raise TypeError(f"unexpected keyword arguments {sorted(unknown)}")
    o.update(kiln_options)
    r = _C.linear_cross_entropy(input, linear_weight, target, linear_bias, weight, reduction, ignore_index,
                                label_smoothing, o["z_loss"], o["logit_softcap"], o["strategy"], o["chunk_tokens"],
                                o["chunk_vocab"], o["memory_budget"], True)
    return LinearCrossEntropyResult(*r)

from ._functional_extra import layer_norm, mse_loss  # noqa: E402
__all__ += ["layer_norm", "mse_loss"]
