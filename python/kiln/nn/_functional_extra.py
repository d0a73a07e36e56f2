"""F.layer_norm and F.mse_loss, composed of kiln ops (kiln has no fused kernel for them)."""
import numbers

__all__ = ["layer_norm", "mse_loss"]

_LOW_PRECISION = ("bfloat16", "float16")


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing normalized_shape dims
    (biased variance, as PyTorch). input [..., *normalized_shape]; weight, bias [*normalized_shape]
    -> input's shape and dtype (statistics in float32 for bfloat16 / float16)."""
    shape = (int(normalized_shape),) if isinstance(normalized_shape, numbers.Integral) else tuple(normalized_shape)
    k = len(shape)
    if k == 0 or input.ndim < k or tuple(input.shape[input.ndim - k:]) != shape:
        raise RuntimeError(f"Given normalized_shape={list(shape)}, expected input with shape [*, "
                           f"{', '.join(map(str, shape))}], but got input of size{list(input.shape)}")
    dims = tuple(range(-k, 0))
    x = input.float() if input.dtype.name in _LOW_PRECISION else input
    centred = x - x.mean(dims, keepdim=True)
    y = centred * ((centred * centred).mean(dims, keepdim=True) + eps).rsqrt()
    y = y.to(input.dtype)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """(input - target)^2 averaged ('mean'), summed ('sum') or elementwise ('none'); input and
    target of one shape (or broadcastable) -> [] or the broadcast shape. weight: optional
    elementwise weights multiplying the squared errors."""
    if size_average is not None or reduce is not None:
        raise ValueError("mse_loss: size_average and reduce are deprecated; use reduction=")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    diff = input - target
    loss = diff * diff
    if weight is not None:
        loss = loss * weight
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss
