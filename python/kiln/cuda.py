"""kiln.cuda: devices and memory statistics (torch.cuda names). Statistics are exact: every byte a
tensor holds goes through kiln's allocators."""
from . import _C

__all__ = ["is_available", "device_count", "current_device", "set_device", "synchronize", "memory_allocated",
           "max_memory_allocated", "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats",
           "empty_cache", "memory_stats"]


def _dev(device):
    if device is None:
        return f"cuda:{_C._cuda.current_device()}"
    if isinstance(device, int) and not isinstance(device, bool):
        return f"cuda:{device}"
    return device


def is_available() -> bool:
    """True when kiln was built with CUDA and a device is present."""
    return _C._cuda.is_available()


def device_count() -> int:
    return _C._cuda.device_count() if _C._cuda.is_available() else 0


def current_device() -> int:
    return _C._cuda.current_device()


def set_device(device) -> None:
    _C._cuda.set_device(device if isinstance(device, int) else int(str(device).split(":")[1]))


def synchronize(device=None) -> None:
    """Waits for all work queued on the device."""
    _C._cuda.synchronize(None if device is None else int(str(_dev(device)).split(":")[1]))


def memory_allocated(device=None) -> int:
    return _C.memory_allocated(_dev(device))


def max_memory_allocated(device=None) -> int:
    return _C.max_memory_allocated(_dev(device))


def memory_reserved(device=None) -> int:
    return _C.memory_reserved(_dev(device))


def max_memory_reserved(device=None) -> int:
    return _C.max_memory_reserved(_dev(device))


def reset_peak_memory_stats(device=None) -> None:
    _C.reset_peak_memory_stats(_dev(device))


def empty_cache() -> None:
    if is_available():
        _C.empty_cache(_dev(None))


def memory_stats(device=None) -> dict:
    return _C.memory_stats(_dev(device))
