"""PyTorch's everyday tensor functions and their method forms: min/argmin, var/std/norm,
chunk/split/unbind, masks, in-place updates, topk/sort, einsum, and kiln.Generator with the
generator= argument of the random functions. The work happens in C++ (kiln._C)."""
import builtins
from collections import namedtuple

from . import _C
from ._C import (  # noqa: F401  (re-exported by kiln)
    Generator, all, allclose, any, argmin, argsort, chunk, isclose, isfinite, isinf, isnan, logical_and,
    logical_not, logical_or, logical_xor, masked_fill, masked_select, multinomial, nonzero, norm, split, tril,
    triu, unbind,
)

__all__ = [
    "Generator", "all", "allclose", "any", "argmin", "argsort", "chunk", "einsum", "isclose", "isfinite", "isinf",
    "isnan", "logical_and", "logical_not", "logical_or", "logical_xor", "masked_fill", "masked_select", "max", "min",
    "multinomial", "nonzero", "norm", "rand", "randint", "randn", "randperm", "sort", "split", "std", "std_mean",
    "topk", "tril", "triu", "unbind", "var", "var_mean",
]

# torch.return_types-style results: unpack like a tuple, or read .values / .indices.
topk_result = namedtuple("topk", ["values", "indices"])
sort_result = namedtuple("sort", ["values", "indices"])
min_result = namedtuple("min", ["values", "indices"])
max_result = namedtuple("max", ["values", "indices"])


def min(input, dim=None, keepdim=False):
    """min() -> [] ; min(dim, keepdim=False) -> (values, int64 indices of the first minimum);
    min(other) -> the elementwise minimum."""
    if isinstance(dim, _C.Tensor):
        return _C.minimum(input, dim)
    if dim is None:
        return _C.min(input)
    return min_result(*_C.min(input, dim, keepdim))


def max(input, dim=None, keepdim=False):
    """max() -> [] ; max(dim, keepdim=False) -> (values, int64 indices of the first maximum);
    max(other) -> the elementwise maximum."""
    if isinstance(dim, _C.Tensor):
        return _C.maximum(input, dim)
    if dim is None:
        return _C.max(input)
    return max_result(*_C.max(input, dim, keepdim))


def _correction(name, dim, unbiased, correction):
    # torch accepts var(x, unbiased), var(x, dim, unbiased, keepdim) and var(x, dim, correction=c).
    if isinstance(dim, builtins.bool):
        unbiased, dim = dim, None
    if unbiased is not None and correction is not None:
        raise TypeError(f"{name}(): pass either unbiased or correction, not both")
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    return dim, float(correction)


def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """Variance over dim (all dims by default), divided by N - correction (correction=1, or
    unbiased=True, is the sample variance; 0 the population variance)."""
    dim, c = _correction("var", dim, unbiased, correction)
    return _C._var(input, dim, c, keepdim)


def std(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """Standard deviation: sqrt of var with the same arguments."""
    dim, c = _correction("std", dim, unbiased, correction)
    return _C._std(input, dim, c, keepdim)


def var_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """(var, mean) over dim, with var's arguments."""
    dim, c = _correction("var_mean", dim, unbiased, correction)
    return _C._var(input, dim, c, keepdim), _C.mean(input, dim, keepdim)


def std_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """(std, mean) over dim, with std's arguments."""
    dim, c = _correction("std_mean", dim, unbiased, correction)
    return _C._std(input, dim, c, keepdim), _C.mean(input, dim, keepdim)


def topk(input, k, dim=-1, largest=True, sorted=True):
    """The k largest (or smallest) values along dim, in order -> (values, int64 indices)."""
    return topk_result(*_C._topk(input, k, dim, largest, sorted))


def sort(input, dim=-1, descending=False, stable=False):
    """Stable sort along dim -> (values, int64 indices)."""
    return sort_result(*_C._sort(input, dim, descending))


def einsum(equation, *operands):
    """torch.einsum over one or more operands ("ij,jk->ik", "bhqd,bhkd->bhqk", "ii->i", "...ij->...ji");
    operands may also be given as one list. Differentiable."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    return _C._einsum(equation, list(operands))


def _shape(size, name):
    if len(size) == 1 and not isinstance(size[0], builtins.int):
        size = tuple(size[0])
    try:
        return [builtins.int(s) for s in size]
    except TypeError:
        raise TypeError(f"{name}(): size must be ints or one sequence of ints") from None


def rand(*size, generator=None, dtype=None, device=None, requires_grad=False):
    """Uniform in [0, 1); generator: a kiln.Generator (default: the global stream)."""
    if generator is None:
        return _C.rand(*size, dtype=dtype, device=device, requires_grad=requires_grad)
    return _C._rand_gen(_shape(size, "rand"), generator, dtype, device, requires_grad)


def randn(*size, generator=None, dtype=None, device=None, requires_grad=False):
    """Standard normal; generator: a kiln.Generator (default: the global stream)."""
    if generator is None:
        return _C.randn(*size, dtype=dtype, device=device, requires_grad=requires_grad)
    return _C._randn_gen(_shape(size, "randn"), generator, dtype, device, requires_grad)


def randint(*args, generator=None, dtype=None, device=None, requires_grad=False, size=None):
    """randint(high, size) / randint(low, high, size): integers uniform in [low, high)."""
    if size is not None:
        args = args + (size,)
    if generator is None:
        return _C.randint(*args, dtype=dtype, device=device, requires_grad=requires_grad)
    if len(args) == 2:
        args = (0,) + args
    if len(args) != 3:
        raise TypeError("randint(): expected (high, size) or (low, high, size)")
    low, high, shape = args
    return _C._randint_gen(low, high, _shape((shape,), "randint"), generator, dtype, device)


def randperm(n, *, generator=None, dtype=None, device=None, requires_grad=False):
    """A random permutation of 0 .. n-1 (int64 by default)."""
    out = _C._randperm(n, generator, dtype, device)
    return out.requires_grad_() if requires_grad else out


# ---- method forms on kiln.Tensor ----

def _normal_(self, mean=0.0, std=1.0, *, generator=None):
    return _C._normal_(self, mean, std, generator)


def _uniform_(self, a=0.0, b=1.0, *, generator=None, **kwargs):
    return _C._uniform_(self, kwargs.get("from", a), kwargs.get("to", b), generator)


def _clamp_(self, min=None, max=None):
    return _C._clamp_(self, min, max)


def _addcmul_(self, tensor1, tensor2, *, value=1.0):
    return _C._addcmul_(self, tensor1, tensor2, value)


def _addcdiv_(self, tensor1, tensor2, *, value=1.0):
    return _C._addcdiv_(self, tensor1, tensor2, value)


def _multinomial(self, num_samples, replacement=False, *, generator=None):
    return _C.multinomial(self, num_samples, replacement, generator=generator)


def _split(self, split_size, dim=0):
    return _C.split(self, split_size, dim)


def _data_get(self):
    return self.detach()


def _data_set(self, value):
    _C._set_data(self, value)


_METHODS = {
    "min": min, "max": max, "argmin": argmin, "var": var, "std": std, "var_mean": var_mean, "std_mean": std_mean,
    "norm": norm, "all": all, "any": any,
    "chunk": chunk, "split": _split, "unbind": unbind, "topk": topk, "sort": sort, "argsort": argsort,
    "masked_fill": masked_fill, "masked_fill_": _C._masked_fill_, "tril": tril, "triu": triu,
    "isnan": isnan, "isinf": isinf, "isfinite": isfinite, "isclose": isclose, "allclose": allclose,
    "logical_and": logical_and, "logical_or": logical_or, "logical_xor": logical_xor, "logical_not": logical_not,
    "nonzero": nonzero, "masked_select": masked_select, "sqrt_": _C._sqrt_, "clamp_": _clamp_,
    "addcmul_": _addcmul_, "addcdiv_": _addcdiv_, "lerp_": _C._lerp_, "normal_": _normal_,
    "uniform_": _uniform_, "multinomial": _multinomial,
}


def _method(fn, name):
    def method(self, *args, **kwargs):
        return fn(self, *args, **kwargs)
    method.__name__ = method.__qualname__ = name
    method.__doc__ = fn.__doc__
    return method


for _name, _fn in _METHODS.items():
    setattr(_C.Tensor, _name, _method(_fn, _name))
_C.Tensor.data = property(_data_get, _data_set, doc="this tensor without autograd history (same storage); "
                          "assigning swaps in another tensor's storage, shape and dtype")
_C.Generator.__module__ = "kiln"
del _name, _fn
