"""kiln.load / kiln.save: safetensors and PyTorch zip checkpoints, format detected from the bytes."""
import os

from . import _C

__all__ = ["load", "save"]


def load(f, map_location=None, *, mmap=False, names=None, return_metadata=False):
    """Loads the tensors of a safetensors or torch (.pt zip) checkpoint -> {name: Tensor} (file order).
    Nothing in the file is executed. map_location: a device ("cuda:0"); mmap=True maps a CPU load
    lazily (copy-on-write). return_metadata=True gives (tensors, metadata dict, format name)."""
    device = "cpu" if map_location is None else map_location
    tensors, metadata, fmt = _C._load(os.fspath(f), device, mmap, list(names or []))
    return (tensors, metadata, fmt) if return_metadata else tensors


def save(obj, f, *, format=None, metadata=None):
    """Saves a {name: Tensor} dict. format: "safetensors" or "torch" (a zip torch.load reads with
    weights_only=True); default from the extension (.pt / .pth / .bin -> torch, else safetensors)."""
    path = os.fspath(f)
    if format is None:
        format = "torch" if path.endswith((".pt", ".pth", ".bin")) else "safetensors"
    if not isinstance(obj, dict):
        raise _C.KilnError("[save] expected a dict of name -> kiln.Tensor")
    _C._save(obj, path, format, {str(k): str(v) for k, v in (metadata or {}).items()})
