"""kiln.load / kiln.save: safetensors and PyTorch zip checkpoints, format detected from the bytes."""
import os

from . import _C

__all__ = ["load", "save", "RawTensor"]


class RawTensor:
    """A tensor of a dtype kiln has no tensor type for (I16, U64, F8_*, F4, F6_*, C64):
    its bytes as a 1-D kiln.uint8 tensor, its safetensors dtype name and its logical shape.
    kiln.load(..., raw=True) returns these; kiln.save writes them back as that dtype, byte for byte."""

    __slots__ = ("data", "dtype", "shape")

    def __init__(self, data, dtype, shape):
        self.data = data
        self.dtype = str(dtype)
        self.shape = tuple(int(s) for s in shape)

    def __repr__(self):
        return f"kiln.RawTensor(dtype={self.dtype}, shape={list(self.shape)}, {self.data.numel()} bytes)"

    def __eq__(self, other):
        return (isinstance(other, RawTensor) and self.dtype == other.dtype and self.shape == other.shape
                and self.data.tolist() == other.data.tolist())


def load(f, map_location=None, *, mmap=False, names=None, return_metadata=False, raw=False):
    """Loads the tensors of a safetensors or torch (.pt zip) checkpoint -> {name: Tensor} (file order).
    Nothing in the file is executed. map_location: a device ("cuda:0"); mmap=True maps a CPU load
    lazily (copy-on-write; a file truncated while mapped raises SIGBUS on access). A tensor of a
    dtype kiln has no type for (int16, uint64, float8, ...) raises a KilnError
    naming it, unless raw=True: then it comes back as a kiln.RawTensor. return_metadata=True gives
    (tensors, metadata dict, format name)."""
    device = "cpu" if map_location is None else map_location
    tensors, metadata, fmt, raw_info = _C._load(os.fspath(f), device, mmap, list(names or []))
    if raw_info:
        if not raw:
            name, (dtype, shape) = next(iter(raw_info.items()))
            more = f" (and {len(raw_info) - 1} more)" if len(raw_info) > 1 else ""
            raise _C.KilnError(
                f"[load] tensor {name!r}{more} has dtype {dtype} (shape {list(shape)}), which kiln has no "
                f"tensor type for; pass raw=True to get it as a kiln.RawTensor (its bytes, dtype and shape)")
        for name, (dtype, shape) in raw_info.items():
            tensors[name] = RawTensor(tensors[name], dtype, shape)
    return (tensors, metadata, fmt) if return_metadata else tensors


def _check_text(kind, text):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _C.KilnError(f"[save] {kind} {text!r} is not valid Unicode text (it holds a lone surrogate at "
                           f"index {e.start}) and cannot be saved") from None


def save(obj, f, *, format=None, metadata=None, checksums=False):
    """Saves a {name: Tensor or kiln.RawTensor} dict. format: "safetensors" or "torch" (a zip
    torch.load reads with weights_only=True); default from the extension (.pt / .pth / .bin ->
    torch, else safetensors). checksums=True stores a CRC-32 per tensor in the safetensors
    metadata; kiln.load then checks every tensor it reads against it."""
    path = os.fspath(f)
    if format is None:
        format = "torch" if path.endswith((".pt", ".pth", ".bin")) else "safetensors"
    if not isinstance(obj, dict):
        raise _C.KilnError("[save] expected a dict of name -> kiln.Tensor")
    tensors = {}
    for name, value in obj.items():
        if isinstance(name, str):
            _check_text("tensor name", name)
        tensors[name] = (value.data, value.dtype, value.shape) if isinstance(value, RawTensor) else value
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    for k, v in meta.items():
        _check_text("metadata key", k)
        _check_text(f"metadata value of {k!r}:", v)
    _C._save(tensors, path, format, meta, checksums)
