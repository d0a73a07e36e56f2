"""Loss modules: LinearCrossEntropyLoss (kiln's fused projection + loss, owning or sharing the
projection), CrossEntropyLoss and MSELoss."""
import numbers

from ... import _C
from .. import functional as F
from ..parameter import Parameter, _wrap_same
from .module import Module

__all__ = ["LinearCrossEntropyLoss", "CrossEntropyLoss", "MSELoss"]


class LinearCrossEntropyLoss(Module):
    """The fused projection + cross-entropy as a module owning (or sharing) the projection weight.

    LinearCrossEntropyLoss(in_features, num_classes, bias=False, *, dtype=None, device=None, **options)
      weight [num_classes, in_features] (and bias [num_classes]) drawn like nn.Linear, registered as
      parameters (parameters(), state_dict() and optimizers see them).
    LinearCrossEntropyLoss.tied(weight, bias=None, **options) shares an existing parameter (e.g. the
      token embedding [V, H]) instead: the same tensor, so gradients of both uses accumulate in it.
    forward(input, target): input [N, H] or [B, T, H], target [N] / [B, T] int -> loss [] (mean/sum)
      or target's shape (none). options: those of kiln.nn.functional.linear_cross_entropy
      (reduction, ignore_index, label_smoothing, z_loss, logit_softcap, strategy, ...); the
      [tokens, classes] logits are never materialised."""

    def __init__(self, in_features, num_classes, bias=False, *, dtype=None, device=None, **options):
        super().__init__()
        for name, value in (("in_features", in_features), ("num_classes", num_classes)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise ValueError(f"LinearCrossEntropyLoss: {name} must be a positive integer, got {value!r}")
        cpp = dict(_C._nn.Linear(in_features, num_classes, bias, dtype=dtype, device=device).named_parameters())
        self.weight = Parameter(cpp["weight"])
        if bias:
            self.bias = Parameter(cpp["bias"])
        else:
            self.register_parameter("bias", None)
        self.options = options

    @classmethod
    def tied(cls, weight, bias=None, **options):
        self = cls.__new__(cls)
        Module.__init__(self)
        self.weight = _wrap_same(weight) if weight.is_leaf else weight
        if bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = _wrap_same(bias) if bias.is_leaf else bias
        self.options = options
        return self

    def forward(self, input, target):
        return F.linear_cross_entropy(input, self.weight, target, self.bias, **self.options)

    def extra_repr(self):
        v, h = self.weight.shape
        return f"in_features={h}, num_classes={v}, bias={self.bias is not None}"


class CrossEntropyLoss(Module):
    """cross_entropy(input, target): input (logits) [N, C], target [N] int -> [] (mean/sum) or [N]."""

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                 label_smoothing=0.0):
        super().__init__()
        if weight is not None:
            self.register_buffer("weight", weight)
        else:
            self.weight = None
        self.ignore_index, self.reduction, self.label_smoothing = ignore_index, reduction, label_smoothing

    def forward(self, input, target):
        return F.cross_entropy(input, target, self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction, label_smoothing=self.label_smoothing)


class MSELoss(Module):
    """mean((input - target)^2) (reduction 'mean', 'sum' or 'none'); input and target: same shape."""

    def __init__(self, size_average=None, reduce=None, reduction="mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, input, target):
        return F.mse_loss(input, target, reduction=self.reduction)
