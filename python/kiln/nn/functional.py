"""kiln.nn.functional: torch.nn.functional's names and signatures over kiln's kernels."""
from collections import namedtuple

from .. import _C
from .._C import dropout, embedding, gelu, linear, log_softmax, relu, silu, softmax  # noqa: F401
from .._C import apply_rotary_emb, rotary_tables  # noqa: F401  (kiln extras)

__all__ = ["linear", "relu", "gelu", "silu", "softmax", "log_softmax", "embedding", "dropout", "rms_norm",
           "add_rms_norm", "swiglu",
           "cross_entropy", "linear_cross_entropy", "linear_cross_entropy_with_stats", "apply_rotary_emb",
           "rotary_tables"]

_EPS = {"float32": 1.1920928955078125e-07, "float64": 2.220446049250313e-16, "bfloat16": 0.0078125,
        "float16": 0.0009765625}

LinearCrossEntropyResult = namedtuple("LinearCrossEntropyResult",
                                      ["loss", "lse", "z_loss", "strategy", "token_accuracy", "predicted_tokens"],
                                      defaults=(None, None))
# linear_cross_entropy's result when token accuracy or predicted tokens are asked for (Liger-Kernel's
# CrossEntropyOutput fields).
LinearCrossEntropyOutput = namedtuple("LinearCrossEntropyOutput", ["loss", "z_loss", "token_accuracy",
                                                                   "predicted_tokens"])
_LCE_KILN = dict(z_loss=0.0, logit_softcap=0.0, strategy="auto", chunk_tokens=0, chunk_vocab=0, memory_budget=0)
_LCE_FLAGS = ("loss_in_input_dtype", "use_token_scaling", "return_token_accuracy", "return_predicted_tokens")


def _norm_eps(op, input, normalized_shape, eps):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) != 1 or input.ndim == 0 or shape[0] != input.shape[-1]:
        raise _C.KilnError(f"[{op}] normalized_shape {shape} must be the last dim of input "
                           f"{tuple(input.shape)} (kiln normalises over one trailing dim)")
    return _EPS.get(input.dtype.name, 1e-6) if eps is None else eps


def rms_norm(input, normalized_shape, weight=None, eps=None, *, dtype=None):
    """y = x / sqrt(mean(x^2, last dim) + eps) * weight; x [..., H], weight [H].
    normalized_shape must be the last dim (H or (H,)); eps defaults to the dtype's machine epsilon
    (as in PyTorch). dtype: y's dtype (default x's), e.g. kiln.bfloat16 for the matmul that reads
    it under autocast: the statistics stay in fp32 and the cast costs no pass of its own."""
    eps = _norm_eps("rms_norm", input, normalized_shape, eps)
    return _C.rms_norm(input, weight, eps, dtype)


def add_rms_norm(input, residual, normalized_shape, weight=None, eps=None, *, dtype=None):
    """The residual add and the RMSNorm after it, one pass each way: returns
    (h = input + residual, rms_norm(h, normalized_shape, weight, eps, dtype=dtype))."""
    eps = _norm_eps("add_rms_norm", input, normalized_shape, eps)
    return _C.add_rms_norm(input, residual, weight, eps, dtype)


def swiglu(gate, up):
    """silu(gate) * up (SwiGLU's gate), one pass each way; gate and up of one shape and dtype."""
    return _C.swiglu(gate, up)


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    """input (logits) [N, C], target [N] int64/int32 -> [] (mean/sum) or [N] (none)."""
    if size_average is not None or reduce is not None:
        raise _C.KilnError("[cross_entropy] size_average/reduce are deprecated; use reduction=")
    return _C.cross_entropy(input, target, weight, ignore_index, reduction, label_smoothing)


def linear_cross_entropy(input, linear_weight, target, linear_bias=None, weight=None, reduction="mean",
                         ignore_index=-100, label_smoothing=0.0, *, z_loss=0.0, logit_softcap=0.0,
                         strategy="auto", chunk_tokens=0, chunk_vocab=0, memory_budget=0, use_token_scaling=False,
                         return_token_accuracy=False, return_predicted_tokens=False, loss_in_input_dtype=False):
    """cross_entropy(input @ linear_weight.T + linear_bias, target) fused: the [tokens, vocab]
    logits are never materialised.

    input [N, H] or [B, T, H]; linear_weight [V, H]; target [N] / [B, T] int64/int32 in [0, V) or
    ignore_index; linear_bias [V]; weight [V] class weights -> loss [] (mean/sum) or target's shape
    (none), in float32 for bf16 / fp16 / fp32 inputs (float64 for float64); loss_in_input_dtype=True
    rounds it to the input's dtype. kiln extras: z_loss (coefficient of lse^2), logit_softcap
    (c * tanh(z / c)), strategy "auto" / "memory" / "speed", chunk sizes and a working-memory budget
    in bytes. Liger-Kernel's options: use_token_scaling (each token's loss times its detached
    probability of the target); return_token_accuracy / return_predicted_tokens make the result a
    LinearCrossEntropyOutput(loss, z_loss, token_accuracy, predicted_tokens): token_accuracy [] is
    the fraction of non-ignored tokens whose argmax is the target (per token 1/0 with reduction
    "none"), predicted_tokens the argmax per token (target's shape, int64, -1 where ignored)."""
    flags = dict(use_token_scaling=use_token_scaling, return_token_accuracy=return_token_accuracy,
                 return_predicted_tokens=return_predicted_tokens, loss_in_input_dtype=loss_in_input_dtype)
    extras = return_token_accuracy or return_predicted_tokens
    r = _C.linear_cross_entropy(input, linear_weight, target, linear_bias, weight, reduction, ignore_index,
                                label_smoothing, z_loss, logit_softcap, strategy, chunk_tokens, chunk_vocab,
                                memory_budget, extras, flags)
    if not extras:
        return r
    return LinearCrossEntropyOutput(r[0], r[2], r[4], r[5])


def linear_cross_entropy_with_stats(input, linear_weight, target, linear_bias=None, weight=None, reduction="mean",
                                    ignore_index=-100, label_smoothing=0.0, **kiln_options):
    """linear_cross_entropy plus, for logging, the per-token lse (fp32, detached), the z-loss term
    and the strategy that ran -> LinearCrossEntropyResult(loss, lse, z_loss, strategy,
    token_accuracy, predicted_tokens) (the last two None unless asked for)."""
    o = dict(_LCE_KILN)
    unknown = set(kiln_options) - set(o) - set(_LCE_FLAGS)
    if unknown:
        raise TypeError(f"linear_cross_entropy_with_stats() got unexpected keyword arguments {sorted(unknown)}")
    o.update(kiln_options)
    flags = {name: o.pop(name) for name in _LCE_FLAGS if name in o}
    r = _C.linear_cross_entropy(input, linear_weight, target, linear_bias, weight, reduction, ignore_index,
                                label_smoothing, o["z_loss"], o["logit_softcap"], o["strategy"], o["chunk_tokens"],
                                o["chunk_vocab"], o["memory_budget"], True, flags)
    return LinearCrossEntropyResult(*r)

from ._functional_extra import layer_norm, mse_loss  # noqa: E402
__all__ += ["layer_norm", "mse_loss"]
