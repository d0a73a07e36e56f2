"""kiln.torch: kiln's kernels inside PyTorch models, as torch.autograd.Function adapters.

    import kiln.torch
    loss = kiln.torch.linear_cross_entropy(hidden, lm_head.weight, target)  # torch tensors
    loss.backward()                                                          # grads reach torch

    bm = kiln.nn.attention.flex_attention.create_block_mask(causal, None, None, L, L)
    out = kiln.torch.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + bias[h, qi - kv],
                                    block_mask=bm)  # bias: a torch Parameter; its grad reaches torch

Tensors cross in both directions through DLPack without copies. On CUDA the adapters run kiln's
kernels on torch's current stream (kiln's current stream is switched to it for the call, through
a non-owning handle), so kiln's work, allocations and temporaries' frees are ordered with torch's
work on that stream, with no host synchronisation. Importing kiln never imports torch; importing
this module does.

Caveat (CUDA): tensors kiln hands to torch (the loss, the gradients) are freed by kiln's
stream-ordered allocator on kiln's current stream when torch drops them (the legacy default
stream unless changed); as with torch's own allocator, using them on another non-blocking stream
needs that stream synchronised before they are dropped.
"""
import contextlib

import torch

from . import _C, _capture
from ._dlpack import from_dlpack
from .nn.attention import flex_attention as _fa

__all__ = ["to_kiln", "to_torch", "linear_cross_entropy", "flex_attention"]


def to_kiln(t: "torch.Tensor"):
    """A kiln.Tensor viewing a torch tensor's memory (detached; no copy)."""
    return from_dlpack(t.detach())


def to_torch(t) -> "torch.Tensor":
    """A torch tensor viewing a kiln.Tensor's memory (no copy)."""
    return torch.from_dlpack(t.detach())


# torch's C entry points, where this torch has them: torch.cuda.current_stream, Tensor.__dlpack__
# and torch.from_dlpack spend tens of microseconds of Python each (device-index lookups, Stream
# objects), a large part of a short flex_attention call's host time (H200).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_torch_to_capsule = getattr(torch._C, "_to_dlpack", None)
_torch_from_capsule = getattr(torch._C, "_from_dlpack", None)


def _on_torch_stream(device):
    """For the block, kiln's current stream on this CUDA device is torch's current stream there, so
    kiln's kernels, allocations and temporaries' frees are ordered on it (no-op on the CPU)."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    dev = device.index if device.index is not None else torch.cuda.current_device()
    handle = _raw_stream(dev) if _raw_stream is not None else torch.cuda.current_stream(dev).cuda_stream
    return _C._cuda.ExternalStream(handle, dev)


# Inside _on_torch_stream both libraries queue on one stream, so the views below need no stream
# ordering (DLPack's stream -1) and skip the Python layers of the public conversions.
def _kiln_view(t):
    """to_kiln for use inside _on_torch_stream."""
    if _torch_to_capsule is None:
        return to_kiln(t)
    return _C._from_dlpack_capsule(_torch_to_capsule(t.detach()))


def _torch_view(t):
    """to_torch for use inside _on_torch_stream."""
    if _torch_from_capsule is None:
        return to_torch(t)
    return _torch_from_capsule(t.detach().__dlpack__(stream=-1))


def _leaf(t, needs_grad):
    if t is None:
        return None
    k = _kiln_view(t.contiguous())
    if needs_grad:
        k.requires_grad_(True)
    return k


class _LinearCrossEntropy(torch.autograd.Function):
    # grad_enabled: torch's grad mode at the call (forward runs with grad off, and needs_input_grad
    # follows requires_grad alone, so under torch.no_grad kiln would record a graph for nothing).
    @staticmethod
    def forward(ctx, grad_enabled, input, linear_weight, linear_bias, target, weight, options):
        from .nn import functional as F

        needs = ctx.needs_input_grad[1:] if grad_enabled else (False,) * 6
        with _on_torch_stream(input.device):
            x, w, b = _leaf(input, needs[0]), _leaf(linear_weight, needs[1]), _leaf(linear_bias, needs[2])
            kt = _kiln_view(target.contiguous())
            kw = _kiln_view(weight.contiguous()) if weight is not None else None
            with _C_grad(any(needs[:3])):
                r = F.linear_cross_entropy(x, w, kt, b, kw, **options)
            loss = r.loss if isinstance(r, tuple) else r
            ctx.kiln = (loss, x, w, b)
            if not isinstance(r, tuple):
                return _torch_view(loss)
            # token_accuracy, predicted_tokens: outputs without gradients (None when not asked for).
            extras = tuple(_torch_view(t) if t is not None else None for t in (r.token_accuracy, r.predicted_tokens))
            ctx.mark_non_differentiable(*(t for t in extras if t is not None))
            return (_torch_view(loss), *extras)

    @staticmethod
    def backward(ctx, grad_loss, *_extras):
        loss, x, w, b = _take(ctx, "linear_cross_entropy")  # kiln's graph is freed by its backward; drop our handles too
        if not loss.requires_grad:
            return None, None, None, None, None, None, None
        with _on_torch_stream(grad_loss.device):
            loss.backward(_kiln_view(grad_loss.contiguous()))
            grads = [_torch_view(t.grad) if t is not None and t.grad is not None else None for t in (x, w, b)]
        return None, grads[0], grads[1], grads[2], None, None, None


def _take(ctx, name):
    # kiln's graph is freed by its backward (as torch frees saved tensors): drop our handles too.
    state = getattr(ctx, "kiln", None)
    if state is None:
        raise RuntimeError(f"Trying to backward through kiln.torch.{name} a second time (its kiln graph was freed "
                           "by the first backward); retain_graph is not supported by kiln's adapters")
    del ctx.kiln
    return state


class _C_grad:
    def __init__(self, mode):
        self.mode = mode

    def __enter__(self):
        self.prev = _C.is_grad_enabled()
        _C.set_grad_enabled(self.mode)

    def __exit__(self, *exc):
        _C.set_grad_enabled(self.prev)


def linear_cross_entropy(input, linear_weight, target, linear_bias=None, weight=None, reduction="mean",
                         ignore_index=-100, label_smoothing=0.0, **kiln_options):
    """kiln.nn.functional.linear_cross_entropy on torch tensors, differentiable through torch's
    autograd (gradients to input, linear_weight and linear_bias). input [N, H] or [B, T, H],
    linear_weight [V, H], target [N] / [B, T] -> loss [] (mean/sum) or target's shape (none), float32
    for bf16 / fp16 inputs (loss_in_input_dtype=True: the input's dtype).
    kiln_options: z_loss, logit_softcap, strategy, chunk_tokens, chunk_vocab, memory_budget,
    loss_in_input_dtype, use_token_scaling, return_token_accuracy, return_predicted_tokens. With
    return_token_accuracy / return_predicted_tokens the result is a
    kiln.nn.functional.LinearCrossEntropyOutput(loss, z_loss, token_accuracy, predicted_tokens)
    (z_loss None) as Liger-Kernel's CrossEntropyOutput."""
    from .nn import functional as F

    options = dict(reduction=reduction, ignore_index=ignore_index, label_smoothing=label_smoothing, **kiln_options)
    r = _LinearCrossEntropy.apply(torch.is_grad_enabled(), input, linear_weight, linear_bias, target, weight, options)
    if not isinstance(r, tuple):
        return r
    return F.LinearCrossEntropyOutput(r[0], None, r[1], r[2])


class _FlexAttention(torch.autograd.Function):
    # apply(grad_enabled, score_mod, block_mask, scale, enable_gqa, return_lse, captured_kiln, query, key,
    #       value, *captured_torch): the torch tensors a score_mod captured are inputs, so torch routes
    # their gradients; captured_kiln are the kiln views of them inside score_mod's IR.
    @staticmethod
    def forward(ctx, grad_enabled, score_mod, block_mask, scale, enable_gqa, return_lse, captured_kiln, query, key,
                value, *captured):
        needs = ctx.needs_input_grad[7:] if grad_enabled else (False,) * (3 + len(captured))
        with _on_torch_stream(query.device):
            out, lse, qkv = _flex_forward(needs, score_mod, block_mask, scale, enable_gqa, return_lse, captured_kiln,
                                          query, key, value)
            # q, k, v's gradients are kiln's on their device; a captured tensor's may come back from a
            # CPU mirror, so only those carry a device to return to.
            ctx.kiln = (out, lse, [*qkv, *captured_kiln], needs, [None] * 3 + [t.device for t in captured])
            ctx.set_materialize_grads(False)
            ctx.kiln_device = query.device
            return (_torch_view(out), _torch_view(lse)) if return_lse else _torch_view(out)

    @staticmethod
    def backward(ctx, *grads):
        out, lse, inputs, needs, devices = _take(ctx, "flex_attention")
        with _on_torch_stream(ctx.kiln_device):
            return _flex_backward(out, lse, inputs, needs, devices, grads)


def _flex_forward(needs, score_mod, block_mask, scale, enable_gqa, return_lse, captured_kiln, query, key, value):
    """kiln's forward on views of query, key, value (inside _on_torch_stream), recording kiln's graph
    only for what `needs` (per q, k, v, *captured) asks -> (out, lse or None, [q, k, v] views)."""
    q, k, v = (_leaf(t, n) for t, n in zip((query, key, value), needs))
    for kt, n in zip(captured_kiln, needs[3:]):
        kt.requires_grad_(bool(n))
    with _C_grad(any(needs)):
        r = _C.flex_attention(q, k, v, score_mod, block_mask, scale, enable_gqa, return_lse)
    out, lse = r if return_lse else (r, None)
    return out, lse, (q, k, v)


def _flex_backward(out, lse, inputs, needs, devices, grads):
    outs, gouts = [], []
    for o, g in zip((out, lse), grads):
        if o is not None and g is not None and o.requires_grad:
            outs.append(o)
            gouts.append(_kiln_view(g.contiguous()))
    result = [None] * len(inputs)
    want = [i for i, (t, n) in enumerate(zip(inputs, needs)) if n and t.requires_grad]
    if outs and want:
        gs = _C._autograd_grad(outs, [inputs[i] for i in want], gouts, False, False)
        for i, g in zip(want, gs):
            # A CUDA tensor captured by score_mod is mirrored on the CPU: its gradient goes back.
            if g is not None:
                result[i] = _torch_view(g) if devices[i] is None else _torch_view(g).to(devices[i])
    return (None,) * 7 + tuple(result)


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                   return_lse=False, kernel_options=None):
    """kiln.nn.attention.flex_attention.flex_attention on torch tensors, differentiable through torch's
    autograd: gradients to query, key, value and to torch tensors score_mod captures (a learned
    bias `bias[h, q_idx - kv_idx]` that is a torch Parameter gets its .grad).

    query [B, Hq, L, E], key [B, Hkv, S, E], value [B, Hkv, S, Ev] -> out [B, Hq, L, Ev] (+ lse
    [B, Hq, L] fp32 with return_lse=True). score_mod: a function (score, b, h, q_idx, kv_idx) ->
    score, traced once into kiln's IR (torch.where / tanh / ... on its arguments are fine), or a
    kiln ScoreMod. block_mask: a kiln BlockMask (kiln.nn.attention.flex_attention.create_block_mask).
    Captured tensors are read on the CPU for now: a CUDA tensor score_mod captures (a learned bias on
    the GPU) is mirrored there, refreshed from its source on a call after torch's version counter of
    it moved (an in-place write such as an optimizer step; a write through `.data` is not seen), and
    its gradient is returned on its own device.
    kernel_options is accepted for PyTorch compatibility and ignored."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"kiln.torch.flex_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
    if block_mask is not None and not isinstance(block_mask, _fa.BlockMask):
        raise TypeError("kiln.torch.flex_attention: block_mask must be a kiln BlockMask "
                        "(kiln.nn.attention.flex_attention.create_block_mask), got " + type(block_mask).__name__)
    if score_mod is not None and not isinstance(score_mod, _fa.ScoreMod):
        score_mod = _fa.ScoreMod(score_mod)
    captured_kiln, captured = [], []
    if score_mod is not None:
        for kt in score_mod.expr.captured_tensors:
            src = _capture.torch_source(kt)
            if src is None:
                continue
            _capture.sync_from_torch(kt, src)  # a mirror of a CUDA tensor, or a view of a CPU one
            if src.is_floating_point():
                captured_kiln.append(kt)
                captured.append(src)
    grad_enabled = torch.is_grad_enabled()
    if not (grad_enabled and any(t.requires_grad for t in (query, key, value, *captured))):
        # Nothing to differentiate (inference, torch.no_grad): no autograd.Function, which costs
        # ~40 us of host time a call (H200 host), as much as kiln's own forward.
        with _on_torch_stream(query.device):
            out, lse, _ = _flex_forward((False,) * (3 + len(captured)), score_mod, block_mask, scale, enable_gqa,
                                        return_lse, captured_kiln, query, key, value)
            return (_torch_view(out), _torch_view(lse)) if return_lse else _torch_view(out)
    return _FlexAttention.apply(grad_enabled, score_mod, block_mask, scale, enable_gqa, return_lse,
                                captured_kiln, query, key, value, *captured)
