"""kiln.torch: kiln's kernels inside PyTorch models, as torch.autograd.Function adapters.

    import kiln.torch
    loss = kiln.torch.linear_cross_entropy(hidden, lm_head.weight, target)  # torch tensors
    loss.backward()                                                          # grads reach torch

Tensors cross in both directions through DLPack without copies. On CUDA, kiln orders its work
after torch's current stream (torch passes kiln's stream a wait) and torch's stream after kiln's
(kiln passes torch's stream an event wait): no host synchronisation. Importing kiln never imports
torch; importing this module does.

Caveat (CUDA): tensors kiln produces (the loss, the gradients) are freed by kiln's stream-ordered
allocator on kiln's stream when torch drops them; kiln's current stream is the legacy default
stream unless changed, which orders with torch's default stream.
"""
import torch

from . import _C
from ._dlpack import from_dlpack

__all__ = ["to_kiln", "to_torch", "linear_cross_entropy"]


def to_kiln(t: "torch.Tensor"):
    """A kiln.Tensor viewing a torch tensor's memory (detached; no copy)."""
    return from_dlpack(t.detach())


def to_torch(t) -> "torch.Tensor":
    """A torch tensor viewing a kiln.Tensor's memory (no copy)."""
    return torch.from_dlpack(t.detach())


def _leaf(t, needs_grad):
    if t is None:
        return None
    k = to_kiln(t.contiguous())
    if needs_grad:
        k.requires_grad_(True)
    return k


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, linear_weight, linear_bias, target, weight, options):
        from .nn import functional as F

        needs = ctx.needs_input_grad
        x, w, b = _leaf(input, needs[0]), _leaf(linear_weight, needs[1]), _leaf(linear_bias, needs[2])
        kt = to_kiln(target.contiguous())
        kw = to_kiln(weight.contiguous()) if weight is not None else None
        with _C_grad(any(needs[:3])):
            loss = F.linear_cross_entropy(x, w, kt, b, kw, **options)
        ctx.kiln = (loss, x, w, b)
        return to_torch(loss)

    @staticmethod
    def backward(ctx, grad_loss):
        loss, x, w, b = ctx.kiln
        del ctx.kiln  # kiln's graph is freed by its backward; drop our handles too
        if not loss.requires_grad:
            return None, None, None, None, None, None
        loss.backward(to_kiln(grad_loss.contiguous()))
        grads = [to_torch(t.grad) if t is not None and t.grad is not None else None for t in (x, w, b)]
        return grads[0], grads[1], grads[2], None, None, None


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
    linear_weight [V, H], target [N] / [B, T] -> loss [] (mean/sum) or target's shape (none).
    kiln_options: z_loss, logit_softcap, strategy, chunk_tokens, chunk_vocab, memory_budget."""
    options = dict(reduction=reduction, ignore_index=ignore_index, label_smoothing=label_smoothing, **kiln_options)
    return _LinearCrossEntropy.apply(input, linear_weight, linear_bias, target, weight, options)
