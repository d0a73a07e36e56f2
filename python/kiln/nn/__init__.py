"""kiln.nn: functional ops, attention, and LinearCrossEntropyLoss (torch.nn names)."""
import math
import numbers

from . import attention, functional
from .. import _C

__all__ = ["functional", "attention", "LinearCrossEntropyLoss"]


class LinearCrossEntropyLoss:
    """The fused projection + cross-entropy as a module owning (or sharing) the projection weight.

    LinearCrossEntropyLoss(in_features, num_classes, bias=False, **options) draws weight
    [num_classes, in_features] (and bias [num_classes]) like nn.Linear; `tied(weight, bias)` shares
    an existing parameter (e.g. the token embedding) instead. Calling it with input [N, H] or
    [B, T, H] and target [N] / [B, T] gives the loss; options are those of
    kiln.nn.functional.linear_cross_entropy (reduction, ignore_index, label_smoothing, z_loss,
    logit_softcap, strategy, ...)."""

    def __init__(self, in_features, num_classes, bias=False, *, dtype=None, device=None, **options):
        for name, value in (("in_features", in_features), ("num_classes", num_classes)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise ValueError(f"LinearCrossEntropyLoss: {name} must be a positive integer, got {value!r}")
        bound = 1.0 / math.sqrt(in_features)
        w = _C.rand(num_classes, in_features, dtype="float32", device=device) * (2 * bound) - bound
        self.weight = (w.to(dtype) if dtype is not None else w).detach().requires_grad_(True)
        self.bias = None
        if bias:
            b = _C.rand(num_classes, dtype="float32", device=device) * (2 * bound) - bound
            self.bias = (b.to(dtype) if dtype is not None else b).detach().requires_grad_(True)
        self.options = options

    @classmethod
    def tied(cls, weight, bias=None, **options):
        self = cls.__new__(cls)
        self.weight, self.bias, self.options = weight, bias, options
        return self

    def parameters(self):
        return [p for p in (self.weight, self.bias) if p is not None]

    def forward(self, input, target):
        return functional.linear_cross_entropy(input, self.weight, target, self.bias, **self.options)

    __call__ = forward

    def __repr__(self):
        v, h = self.weight.shape
        return f"LinearCrossEntropyLoss(in_features={h}, num_classes={v}, bias={self.bias is not None})"
