"""RMSNorm (kiln::nn::RMSNorm's weight, the fused rms_norm kernel) and LayerNorm (kiln ops)."""
import numbers

from ... import _C
from .. import functional as F
from ..parameter import Parameter
from .module import Module

__all__ = ["RMSNorm", "LayerNorm"]


def _shape(normalized_shape):
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(int(s) for s in normalized_shape)


class RMSNorm(Module):
    """y = x / sqrt(mean(x^2, last dim) + eps) * weight (one fused kernel each way).

    RMSNorm(normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None)
      input [..., H] -> output [..., H]; normalized_shape H or (H,) (kiln normalises over one
      trailing dim); weight [H] initialised to ones; eps None: the dtype's machine epsilon (as
      PyTorch)."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        if len(self.normalized_shape) != 1:
            raise ValueError(f"RMSNorm: kiln normalises over one trailing dim, got normalized_shape "
                             f"{self.normalized_shape}")
        self.eps, self.elementwise_affine = eps, elementwise_affine
        if elementwise_affine:
            cpp = _C._nn.RMSNorm(self.normalized_shape[0], dtype=dtype, device=device)
            self.weight = Parameter(dict(cpp.named_parameters())["weight"])
        else:
            self.register_parameter("weight", None)

    def forward(self, input):
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class LayerNorm(Module):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the trailing normalized_shape dims.

    LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None)
      input [..., *normalized_shape] -> same shape; weight ones, bias zeros, of normalized_shape.
    Statistics in float32 for 16-bit inputs (kiln.nn.functional.layer_norm)."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        kw = dict(dtype=dtype or "float32", device=device or "cpu")
        if elementwise_affine:
            self.weight = Parameter(_C.ones(self.normalized_shape, **kw))
        else:
            self.register_parameter("weight", None)
        if elementwise_affine and bias:
            self.bias = Parameter(_C.zeros(self.normalized_shape, **kw))
        else:
            self.register_parameter("bias", None)

    def forward(self, input):
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
