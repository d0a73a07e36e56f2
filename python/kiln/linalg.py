"""kiln.linalg: torch.linalg.vector_norm over kiln's norm (kiln.norm / Tensor.norm)."""
from . import _C

__all__ = ["vector_norm"]


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """(sum |x|^ord)^(1/ord) over dim (all dims by default); ord may be inf, -inf or 0 too.
    x: any floating tensor -> x with dim removed (kept as 1 with keepdim). Differentiable."""
    return _C.norm(x, ord, dim, keepdim, dtype)
