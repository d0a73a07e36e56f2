"""kiln.nn.utils: clip_grad_norm_ over kiln's C++ clipping (one fp64 norm, deterministic)."""
import math

from .. import _C

__all__ = ["clip_grad_norm_"]


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scales every gradient in place by min(1, max_norm / (total_norm + 1e-6)), where total_norm is
    the L2 norm of all gradients together (parameters without .grad are skipped).

    parameters: a tensor or an iterable of tensors on one device -> total_norm [] float32 (before
    clipping). Only norm_type=2 is supported. error_if_nonfinite=True raises before touching the
    gradients when the norm is nan or inf."""
    if isinstance(parameters, _C.Tensor):
        parameters = [parameters]
    params = list(parameters)
    if float(norm_type) != 2.0:
        raise ValueError(f"clip_grad_norm_: kiln supports norm_type=2.0 only, got {norm_type}")
    max_norm = float(max_norm)
    if error_if_nonfinite:
        total = _C._optim.clip_grad_norm_(params, math.inf)  # the norm alone: a scale of min(1, inf)
        if not math.isfinite(total.item()):
            raise RuntimeError(
                "The total norm of order 2.0 for gradients from `parameters` is non-finite, so it cannot be "
                "clipped. To disable this error and scale the gradients by the non-finite norm anyway, set "
                "`error_if_nonfinite=False`")
    return _C._optim.clip_grad_norm_(params, max_norm)
