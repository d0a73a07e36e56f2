"""kiln.dtype and kiln.device: PyTorch-like value objects (kiln.float32, kiln.device("cuda:0"))."""
from . import _C

__all__ = ["dtype", "device"]


class dtype:
    """An element type. The instances are kiln.float32, kiln.bfloat16, ... (PyTorch's names)."""

    __slots__ = ("_kiln_code", "name", "itemsize", "is_floating_point")

    def __init__(self, code: int):
        name, itemsize, is_float = _C._dtype_info(code)
        self._kiln_code = code
        self.name = name
        self.itemsize = itemsize
        self.is_floating_point = is_float

    def __repr__(self) -> str:
        return f"kiln.{self.name}"

    def __reduce__(self):
        return (_by_name, (self.name,))


def _by_name(name: str) -> "dtype":
    from . import _DTYPES
    for d in _DTYPES:
        if d.name == name:
            return d
    raise ValueError(f"unknown kiln dtype {name!r}")


class device:
    """Where a tensor lives: kiln.device("cpu"), kiln.device("cuda:1"), kiln.device("cuda", 1)."""

    __slots__ = ("type", "index")

    def __init__(self, type, index=None):
        if isinstance(type, device):
            self.type, self.index = type.type, type.index
            return
        if isinstance(type, int) and not isinstance(type, bool):
            type, index = "cuda", type
        spec = str(type) if index is None else f"{type}:{index}"
        kind, idx = _C._parse_device(spec)
        self.type = kind
        self.index = idx if kind == "cuda" else None

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        if self.index is None:
            return f"device(type='{self.type}')"
        return f"device(type='{self.type}', index={self.index})"

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            other = device(other)
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __reduce__(self):
        return (device, (str(self),))
