"""Tensors captured by traced score_mod / mask_mod functions: kiln tensors, torch tensors, NumPy arrays.

While a mod is traced its arguments are kiln Exprs. Indexing a captured tensor with one turns the
tensor into a load in the mod's IR:
  - kiln.Tensor.__getitem__ handles kiln tensors (python/src/index.cpp);
  - torch tensors dispatch to Expr.__torch_function__ (torch consults it for any index holding an
    Expr), which views the tensor as a kiln tensor (DLPack, no copy); torch.where / minimum /
    maximum / abs / sign / clamp / exp / log / tanh / sigmoid / floor / remainder / ... on Exprs
    map to kiln's IR too, so PyTorch's own score_mod examples trace unchanged;
  - NumPy arrays have no such hook: before tracing, prepare() rebinds the arrays a function reads
    from its closure or module globals to zero-copy kiln views. An array reached another way (an
    attribute, a container) fails at its first index with the line named.
A torch tensor captured this way is remembered (weakly, by the kiln view's storage) so that
kiln.torch.flex_attention can send the captured tensor's gradient back to torch. Captured tensors
live on the CPU for now (the CUDA kernels copy them to the device per call): a CUDA torch tensor is
captured as a CPU mirror, which kiln.torch.flex_attention refreshes from the source on every call
(a prebuilt ScoreMod used through kiln.nn.attention.flex_attention keeps the values it was built with).
"""
import os
import sys
import threading
import types
import weakref

from . import _C
from ._dlpack import from_dlpack

__all__ = ["call", "definition", "prepare", "refresh_mirror", "sync_from_torch", "to_capture", "torch_source",
           "user_location"]

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()  # guards _torch_sources (free-threaded builds run tracers concurrently)
_torch_sources = {}        # kiln view key -> weakref to the torch tensor it views (or mirrors)
_mirrors = {}              # id(non-CPU torch tensor) -> (weakref to it, its _key, its CPU mirror)
_synced = {}               # kiln view / mirror key -> (torch _version, data_ptr) of its source when last synced


def user_location():
    """file:line of the innermost frame outside kiln and torch (the user's mod)."""
    f = sys._getframe(1)
    while f is not None:
        path = os.path.abspath(f.f_code.co_filename)
        if not path.startswith(_PKG_DIR) and f"{os.sep}torch{os.sep}" not in path:
            return f"{f.f_code.co_filename}:{f.f_lineno}"
        f = f.f_back
    return "<unknown>"


def _fail(msg):
    raise _C.KilnError(f"[flex] {msg} at {user_location()}")


def _key(t):
    return (t.data_ptr(), str(t.device), tuple(t.shape), tuple(t.stride()), t.dtype.name)


def _is_torch(obj):
    mod = type(obj).__module__
    return mod.startswith("torch") and hasattr(obj, "__dlpack__") and hasattr(obj, "requires_grad")


def _is_numpy(obj):
    return type(obj).__module__ == "numpy" and type(obj).__name__ == "ndarray"


def to_capture(obj):
    """A kiln tensor viewing `obj` (kiln / torch / NumPy) for use as a captured tensor."""
    if isinstance(obj, _C.Tensor):
        return obj
    try:
        if _is_torch(obj):
            if obj.device.type != "cpu":
                return _mirror(obj)
            k = from_dlpack(obj.detach())
            with _lock:
                _sweep()
                _torch_sources[_key(k)] = weakref.ref(obj)
            return k
        if _is_numpy(obj):
            import numpy as np
            return from_dlpack(obj if obj.flags.writeable and all(s >= 0 for s in obj.strides)
                               else np.ascontiguousarray(obj).copy())
    except _C.KilnError as e:
        _fail(f"cannot capture a {type(obj).__module__}.{type(obj).__name__} ({e})")
    _fail(f"cannot capture a {type(obj).__module__}.{type(obj).__name__}: captured tensors are kiln tensors, "
          "torch tensors or NumPy arrays")


def _sweep():
    # Under _lock: forget torch tensors that died (and free their mirrors).
    for dead in [key for key, ref in _torch_sources.items() if ref() is None]:
        del _torch_sources[dead]
    for dead in [key for key, (ref, _, _) in _mirrors.items() if ref() is None]:
        del _mirrors[dead]
    for dead in [key for key in _synced if key not in _torch_sources]:
        del _synced[dead]


def _mirror(obj):
    """The CPU mirror of a CUDA (or other non-CPU) torch tensor, refreshed from it: one per live
    tensor, held here while the tensor lives, so its address cannot be reused by another captured
    tensor and mistaken for it (torch_source looks tensors up by address)."""
    key = (obj.data_ptr(), str(obj.device), tuple(obj.shape), tuple(obj.stride()), str(obj.dtype))
    with _lock:
        _sweep()
        entry = _mirrors.get(id(obj))
        k = entry[2] if entry is not None and entry[0]() is obj and entry[1] == key else None
        if k is None:
            if entry is not None:  # the tensor's storage or shape changed (bias.data = ...): remap
                _torch_sources.pop(_key(entry[2]), None)
            k = from_dlpack(obj.detach().to("cpu", copy=True))
            _mirrors[id(obj)] = (weakref.ref(obj), key, k)
            _torch_sources[_key(k)] = weakref.ref(obj)
            _synced[_key(k)] = _mark(obj)
            return k
    sync_from_torch(k, obj)
    return k


def _mark(src):
    # torch bumps _version on every in-place write through the tensor or a view of it. Inference
    # tensors have no counter: a fresh object each time, so they are synced on every call.
    try:
        return (src._version, src.data_ptr())
    except RuntimeError:
        return object()


def refresh_mirror(mirror, obj):
    """Copies a non-CPU torch tensor's current values into its CPU mirror (kiln.Tensor)."""
    import torch

    torch.from_dlpack(mirror.detach()).copy_(obj.detach())
    mirror._bump_version()  # a write kiln did not make: its caches keyed on the version refresh


def sync_from_torch(kiln_tensor, src):
    """Before a call that reads a captured kiln tensor whose memory torch owns (src): when torch's
    version counter of src moved since the last call (an in-place write, an optimizer step),
    refresh a mirror from its source or mark a view written, since torch's writes bypass kiln's
    version counter (which keys the compiled-mod and device-copy caches). Unchanged, nothing
    happens: no device-to-host copy (which would wait for the GPU), no recompiled mod. A write that
    bypasses torch's counter too (through `.data`) is not seen."""
    key, mark = _key(kiln_tensor), _mark(src)
    with _lock:
        if _synced.get(key) == mark:
            return
    if kiln_tensor.data_ptr() != src.data_ptr():
        refresh_mirror(kiln_tensor, src)
    else:
        kiln_tensor._bump_version()
    with _lock:
        _synced[key] = mark


def torch_source(kiln_tensor):
    """The live torch tensor a captured kiln tensor views (or mirrors, for a CUDA tensor), or None."""
    with _lock:
        ref = _torch_sources.get(_key(kiln_tensor))
    return ref() if ref is not None else None


def _swap(value):
    return to_capture(value) if _is_numpy(value) and value.ndim >= 1 else value


def prepare(fn):
    """`fn` with the NumPy arrays it reads from its closure and globals replaced by kiln views (the
    function itself when it reads none). Called by the tracer before it calls fn."""
    if isinstance(fn, types.MethodType):
        f = prepare(fn.__func__)
        return fn if f is fn.__func__ else types.MethodType(f, fn.__self__)
    if not isinstance(fn, types.FunctionType):
        return fn
    closure, changed = fn.__closure__, False
    if closure:
        cells = []
        for cell in closure:
            try:
                v = cell.cell_contents
            except ValueError:  # an empty cell
                cells.append(cell)
                continue
            nv = _swap(v)
            changed |= nv is not v
            cells.append(types.CellType(nv) if nv is not v else cell)
        closure = tuple(cells)
    g = fn.__globals__
    repl = {n: _swap(g[n]) for n in fn.__code__.co_names if n in g and _is_numpy(g[n])}
    repl = {n: v for n, v in repl.items() if v is not g[n]}
    if not changed and not repl:
        return fn
    if repl:
        g = dict(g)
        g.update(repl)
    out = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, closure)
    out.__kwdefaults__ = fn.__kwdefaults__
    return out


def definition(fn):
    """file:line where a mod function is defined (for errors about its result)."""
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__func__", None), "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else repr(fn)


def call(fn, args):
    """Calls mod `fn` with symbolic arguments (the tracer's entry point)."""
    try:
        return prepare(fn)(*args)
    except (IndexError, TypeError) as e:  # e.g. NumPy refusing an Expr index: name the user's line
        tb, where = e.__traceback__, None
        while tb is not None:
            path = os.path.abspath(tb.tb_frame.f_code.co_filename)
            if not path.startswith(_PKG_DIR) and f"{os.sep}torch{os.sep}" not in path:
                where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
            tb = tb.tb_next
        raise _C.KilnError(f"[flex] tracing the mod failed at {where or definition(fn)}: {type(e).__name__}: {e} "
                           "(captured tensors are kiln tensors, torch tensors, or NumPy arrays read from the "
                           "mod's closure or globals; index them with index expressions)") from None


# ---- torch interop: torch consults Expr.__torch_function__ whenever an Expr meets a torch API ----

def _torch_function(cls, func, types_=(), args=(), kwargs=None):
    kwargs = kwargs or {}
    name = getattr(func, "__name__", str(func))
    if name == "__getitem__" and len(args) == 2 and not kwargs:
        return to_capture(args[0])[args[1]]
    if name in _TORCH_FUNCS and not kwargs:
        return _TORCH_FUNCS[name](*args)
    if name in ("clamp", "clip", "clamp_min", "clamp_max"):
        x, lo, hi = (list(args) + [None, None])[:3]
        if name == "clamp_max":
            lo, hi = None, lo
        lo, hi = _scalar(kwargs.get("min", lo)), _scalar(kwargs.get("max", hi))
        return _C.clamp(x, lo, hi)
    if name in ("div", "true_divide", "divide") and len(args) == 2:
        mode = kwargs.get("rounding_mode")
        a, b = args[0], _scalar(args[1])
        if mode == "floor":
            return a // b
        if mode is None:
            return a / b
    if name in ("min", "max") and len(args) == 2 and not kwargs and isinstance(args[1], (_C.Expr,)):
        return (_C.minimum if name == "min" else _C.maximum)(*args)
    if name in ("full_like", "zeros_like", "ones_like"):
        value = {"zeros_like": 0, "ones_like": 1}.get(name, args[1] if len(args) > 1 else kwargs.get("fill_value"))
        dtype = kwargs.get("dtype")
        return _constant_like(args[0], _scalar(value), dtype)
    _fail(f"torch.{name} cannot be traced into kiln's IR (supported on index expressions: operators, indexing "
          f"captured tensors, {', '.join(sorted(_SUPPORTED))})")


def _torch_where(c, x, y):
    return _C.where(c, _scalar(x), _scalar(y))


def _scalar(v):
    # torch.tensor(-inf) and friends: 0-d torch tensors become Python numbers.
    if _is_torch(v) and v.dim() == 0:
        return v.item()
    return v


def _binary(f):
    return lambda a, b: f(a, _scalar(b)) if isinstance(a, _C.Expr) else f(b, _scalar(a))


def _constant_like(like, value, dtype):
    """torch.full_like(expr, v) and friends: the constant v, of like's kind unless dtype is given."""
    value = int(value) if isinstance(value, bool) else value
    e = like.to(int) * 0 + value
    return e.to(dtype if dtype is not None else {"int": int, "float": float, "bool": bool}[like.kind])


_TORCH_FUNCS = {
    "where": _torch_where, "minimum": _binary(_C.minimum), "maximum": _binary(_C.maximum),
    "abs": _C.abs, "absolute": _C.abs, "sign": _C.sign, "tanh": _C.tanh, "exp": _C.exp, "log": _C.log,
    "sigmoid": _C.sigmoid, "floor": _C.floor, "neg": lambda a: -a, "negative": lambda a: -a,
    "remainder": lambda a, b: a % _scalar(b), "floor_divide": lambda a, b: a // _scalar(b),
    "add": lambda a, b: a + _scalar(b), "sub": lambda a, b: a - _scalar(b), "subtract": lambda a, b: a - _scalar(b),
    "mul": lambda a, b: a * _scalar(b), "multiply": lambda a, b: a * _scalar(b),
    "eq": lambda a, b: a == _scalar(b), "ne": lambda a, b: a != _scalar(b), "lt": lambda a, b: a < _scalar(b),
    "le": lambda a, b: a <= _scalar(b), "gt": lambda a, b: a > _scalar(b), "ge": lambda a, b: a >= _scalar(b),
    "logical_and": lambda a, b: a.logical_and(b), "logical_or": lambda a, b: a.logical_or(b),
    "logical_not": lambda a: a.logical_not(),
}
_SUPPORTED = set(_TORCH_FUNCS) | {"clamp", "clip", "clamp_min", "clamp_max", "div", "min", "max", "full_like",
                                  "zeros_like", "ones_like"}


def _missing_attr(self, name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(f"'{name}' cannot be traced into kiln's IR: a score_mod / mask_mod argument is a kiln "
                         f"Expr, whose methods are {', '.join(sorted(_EXPR_METHODS))} (at {user_location()})")


_EXPR_METHODS = {n for n in dir(_C.Expr) if not n.startswith("_") and callable(getattr(_C.Expr, n, None))}
_C.Expr.__torch_function__ = classmethod(_torch_function)
_C.Expr.__getattr__ = _missing_attr
