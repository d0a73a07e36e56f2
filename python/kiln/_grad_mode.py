"""Grad-mode context managers (torch.no_grad and friends); the mode is per thread, as in kiln."""
import functools

from . import _C

__all__ = ["no_grad", "enable_grad", "set_grad_enabled", "inference_mode"]


class _GradMode:
    _mode = False

    def __enter__(self):
        self._prev = _C.is_grad_enabled()
        _C.set_grad_enabled(self._mode)
        return self

    def __exit__(self, *exc):
        _C.set_grad_enabled(self._prev)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with type(self)():
                return fn(*args, **kwargs)
        return wrapper


class no_grad(_GradMode):
    """Disables graph recording in its scope (a context manager and a decorator)."""
    _mode = False


class enable_grad(_GradMode):
    """Enables graph recording in its scope."""
    _mode = True


class inference_mode(no_grad):
    """kiln has no separate inference mode: the same as no_grad."""

    def __init__(self, mode=True):
        self._mode = not mode


class set_grad_enabled:
    """Sets grad mode now; used as a context manager, restores the previous mode on exit."""

    def __init__(self, mode):
        self._prev = _C.is_grad_enabled()
        _C.set_grad_enabled(mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _C.set_grad_enabled(self._prev)
        return False
