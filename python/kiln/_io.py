"""kiln.load / kiln.save: safetensors and PyTorch zip checkpoints, format detected from the bytes,
to and from paths or file objects. Nested dicts / lists / tuples of tensors and Python primitives
(an optimizer's state_dict) save as safetensors: the tensors under their dotted paths, the
structure as JSON in the metadata key "kiln.structure"; kiln.load rebuilds it. Nothing read is
ever executed."""
import json
import os

from . import _C
from ._nested import STRUCTURE_KEY, flatten, is_flat_tensor_dict, rebuild

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


def load(f, map_location=None, *, weights_only=None, mmap=False, names=None, return_metadata=False, raw=False):
    """Loads a safetensors or torch (.pt zip) checkpoint from a path or a binary file object
    (io.BytesIO, open(..., "rb")) -> {name: Tensor} in file order, or the nested object kiln.save
    wrote (an optimizer's state_dict: dicts, lists, tuples, tensors, numbers, strings, None).
    Nothing in the file is executed: kiln only ever loads tensors and primitive containers, so
    weights_only (True, the default in PyTorch 2.6+, or False, accepted for scripts that pass it)
    changes nothing. map_location: a device ("cuda:0"); mmap=True maps a CPU load from a path
    lazily (copy-on-write; a file truncated while mapped raises SIGBUS on access). A tensor of a
    dtype kiln has no type for (int16, uint64, float8, ...) raises a KilnError
    naming it, unless raw=True: then it comes back as a kiln.RawTensor. return_metadata=True gives
    (tensors, metadata dict, format name)."""
    del weights_only  # always the safe loader (see above)
    device = "cpu" if map_location is None else map_location
    if hasattr(f, "read"):
        if mmap:
            raise ValueError("kiln.load: mmap=True needs a path, not a file object")
        data = f.read()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError("kiln.load: the file object must be opened in binary mode ('rb')")
        tensors, metadata, fmt, raw_info = _C._load_bytes(bytes(data), list(names or []))
        if str(device) != "cpu":
            tensors = {k: v.to(device) for k, v in tensors.items()}
    else:
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
    structure = metadata.pop(STRUCTURE_KEY, None)
    if structure is not None and not names:
        tensors = rebuild(json.loads(structure), tensors)
    return (tensors, metadata, fmt) if return_metadata else tensors


def _check_text(kind, text):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _C.KilnError(f"[save] {kind} {text!r} is not valid Unicode text (it holds a lone surrogate at "
                           f"index {e.start}) and cannot be saved") from None


def save(obj, f, *, format=None, metadata=None, checksums=False):
    """Saves a {name: Tensor or kiln.RawTensor} dict, or a nested object of dicts / lists / tuples
    holding tensors and Python primitives (int, float, bool, str, None), such as an optimizer's
    state_dict, to a path or a binary file object (io.BytesIO, open(..., "wb")).
    format: "safetensors" or "torch" (a zip torch.load reads with weights_only=True); default from
    the extension (.pt / .pth / .bin -> torch, else safetensors; a file object: safetensors). A
    nested object is always safetensors (its structure lives in the metadata; format="torch" raises).
    checksums=True stores a CRC-32 per tensor in the safetensors metadata; kiln.load then checks
    every tensor it reads against it."""
    path = None if hasattr(f, "write") else os.fspath(f)
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    if STRUCTURE_KEY in meta:
        raise ValueError(f"kiln.save: the metadata key {STRUCTURE_KEY!r} is reserved for nested objects")
    if is_flat_tensor_dict(obj, RawTensor):
        if format is None:
            format = "torch" if path is not None and path.endswith((".pt", ".pth", ".bin")) else "safetensors"
        flat = obj
    else:
        if format == "torch":
            raise ValueError("kiln.save: format='torch' holds a flat {name: tensor} dict; nested objects "
                             "(dicts, lists, numbers) are saved as safetensors (leave format unset)")
        format = "safetensors"
        flat, structure = flatten(obj, RawTensor)
        meta[STRUCTURE_KEY] = json.dumps(structure, allow_nan=True)
    tensors = {}
    for name, value in flat.items():
        if isinstance(name, str):
            _check_text("tensor name", name)
        tensors[name] = (value.data, value.dtype, value.shape) if isinstance(value, RawTensor) else value
    for k, v in meta.items():
        _check_text("metadata key", k)
        _check_text(f"metadata value of {k!r}:", v)
    if path is None:
        f.write(_C._save_bytes(tensors, format, meta, checksums))
    else:
        _C._save(tensors, path, format, meta, checksums)
