"""Pure-Python parts of kiln.Tensor (numpy(), tolist(), __array__, __iter__) and kiln.tensor()."""
import builtins

from . import _C
from ._dlpack import from_dlpack

__all__ = ["tensor"]

_NUMPY_TO_KILN = {"float32": "float32", "float64": "float64", "float16": "float16", "int64": "int64",
                  "int32": "int32", "int8": "int8", "uint8": "uint8", "bool": "bool",
                 "uint16": "uint16", "uint32": "uint32"}


def _ml_dtypes():
    # NumPy has no bfloat16; ml_dtypes provides one. Without it, fail like torch does (TypeError)
    # rather than hand back raw uint16 bit patterns that would be read as integers.
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError("[numpy] Got unsupported ScalarType BFloat16: NumPy has no bfloat16; convert first "
                        "(t.float().numpy()) or install ml_dtypes (pip install ml_dtypes) to get an "
                        "ml_dtypes.bfloat16 array sharing the tensor's memory") from None
    return ml_dtypes


def _numpy(self, *, force=False):
    """A NumPy array sharing this CPU tensor's memory (strides kept). bfloat16 gives an
    ml_dtypes.bfloat16 array when ml_dtypes is installed, else a TypeError (use t.float().numpy()).
    force=True detaches and copies to the CPU first, as in PyTorch."""
    t = self.detach().cpu() if force else self
    arr = t._numpy_view()
    if t.dtype.name == "bfloat16":
        arr = arr.view(_ml_dtypes().bfloat16)
    return arr


def _array(self, dtype=None, copy=None):
    arr = _numpy(self.detach(), force=True)
    if dtype is not None:
        arr = arr.astype(dtype, copy=False)
    return arr.copy() if copy else arr


def _tolist(self):
    t = self.detach().cpu()
    if t.dtype.name in ("bfloat16", "float16"):
        t = t.float()
    return t._numpy_view().tolist()


def _iter(self):
    """Iterates dim 0 (views), as PyTorch does: for row in t, list(t), a, b = t."""
    if self.ndim == 0:
        raise TypeError("iteration over a 0-d tensor")
    return (self[i] for i in range(self.shape[0]))


_C.Tensor.__iter__ = _iter
_C.Tensor.numpy = _numpy
_C.Tensor.__array__ = _array
_C.Tensor.tolist = _tolist
_C.Tensor.__array_priority__ = 1000  # ndarray (op) tensor defers to the tensor's reflected operator


def tensor(data, *, dtype=None, device=None, requires_grad=False):
    """A new tensor (owning its memory) with a copy of `data`: nested lists / tuples of numbers, a
    NumPy array, a number, or a tensor from any DLPack producer. Python floats give float32, ints
    int64, bools bool (as in PyTorch); arrays keep their dtype."""
    import numpy as np

    from . import _DTYPES, empty

    if isinstance(data, _C.Tensor) or (hasattr(data, "__dlpack__") and not isinstance(data, np.ndarray)):
        src = from_dlpack(data).detach()
        out = empty(src.shape, dtype=dtype or src.dtype, device=device or src.device)
    else:
        arr = np.asarray(data)
        if arr.dtype.name == "bfloat16":  # ml_dtypes: exact through float32
            arr = arr.astype(np.float32)
            target = dtype or _DTYPES[2]
        elif isinstance(data, np.ndarray) and arr.dtype.name in _NUMPY_TO_KILN:
            target = dtype or _NUMPY_TO_KILN[arr.dtype.name]
        elif arr.dtype.kind == "b":
            target = dtype or "bool"
        elif arr.dtype.kind in "iu":
            target, arr = dtype or "int64", arr.astype(np.int64)
        elif arr.dtype.kind == "f":
            target = dtype or "float32"
        else:
            raise _C.KilnError(f"[tensor] cannot make a tensor from data of NumPy dtype {arr.dtype}")
        src = from_dlpack(arr if arr.flags.c_contiguous else arr.copy())
        out = empty(src.shape, dtype=target, device=device or "cpu")
    out.copy_(src)
    if requires_grad:
        out.requires_grad_(True)
    return out


del builtins
