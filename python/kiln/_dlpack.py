"""kiln.from_dlpack / kiln.from_numpy: zero-copy import of anything that speaks DLPack.

CUDA streams: kiln asks the producer to order its pending work before kiln's current stream (it
passes that stream to __dlpack__), so kiln's kernels see the data without a host synchronisation.
"""
from . import _C

__all__ = ["from_dlpack", "from_numpy"]

_kDLCUDA, _kDLCUDAManaged = 2, 13


def from_dlpack(ext):
    """A kiln.Tensor viewing the memory of `ext` (a torch tensor, a NumPy array, any object with
    __dlpack__, or a DLPack capsule). No copy: writes through either side are seen by the other,
    and the producer's memory stays alive while kiln uses it."""
    if isinstance(ext, _C.Tensor):
        return ext
    if not hasattr(ext, "__dlpack__"):
        return _C._from_dlpack_capsule(ext)
    kwargs = {}
    dev_type, dev_id = ext.__dlpack_device__()
    if int(dev_type) in (_kDLCUDA, _kDLCUDAManaged):
        if not _C._cuda.is_available():
            raise _C.KilnError("[from_dlpack] a CUDA tensor was given but kiln was built without CUDA or sees no "
                               "CUDA device; move it to the CPU first (t.cpu())")
        kwargs["stream"] = _C._consumer_stream(int(dev_id))
    try:
        capsule = ext.__dlpack__(max_version=(1, 0), **kwargs)
    except TypeError:  # a producer that predates DLPack 1.0's keyword
        capsule = ext.__dlpack__(**kwargs)
    return _C._from_dlpack_capsule(capsule)


def from_numpy(ndarray):
    """A kiln.Tensor sharing the NumPy array's memory (torch.from_numpy)."""
    import numpy as np

    if not isinstance(ndarray, np.ndarray):
        raise TypeError(f"expected a numpy.ndarray, got {type(ndarray).__name__}")
    return from_dlpack(ndarray)
