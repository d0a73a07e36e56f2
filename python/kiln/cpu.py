"""kiln.cpu: memory statistics of the CPU allocator (the same numbers kiln.cuda gives per GPU)."""
from . import _C

__all__ = ["memory_allocated", "max_memory_allocated", "reset_peak_memory_stats", "memory_stats"]


def memory_allocated() -> int:
    return _C.memory_allocated("cpu")


def max_memory_allocated() -> int:
    return _C.max_memory_allocated("cpu")


def reset_peak_memory_stats() -> None:
    _C.reset_peak_memory_stats("cpu")


def memory_stats() -> dict:
    return _C.memory_stats("cpu")
