"""kiln.nn.Parameter: a Tensor that a Module registers as a parameter when assigned as an attribute."""
from .. import _C

__all__ = ["Parameter"]


class Parameter(_C.Tensor):
    """Parameter(data=None, requires_grad=True): a leaf tensor that Modules list in parameters().

    It shares `data`'s memory (as torch.nn.Parameter does) but is a new autograd leaf: gradients of
    computations that use the parameter land in `param.grad`. `data` of any shape and floating
    dtype; None gives an empty float32 tensor."""

    def __new__(cls, data=None, requires_grad=True):
        if data is None:
            data = _C.empty(0)
        if not isinstance(data, _C.Tensor):
            raise TypeError(f"Parameter: data must be a kiln.Tensor, got {type(data).__name__}")
        t = data.detach()
        t.requires_grad_(requires_grad)
        return _C._make_subclass(cls, t)

    def __init__(self, data=None, requires_grad=True):
        pass  # everything happens in __new__ (kiln.Tensor has no Python constructor)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    def __deepcopy__(self, memo):
        if id(self) not in memo:
            memo[id(self)] = Parameter(self.detach().clone(), self.requires_grad)
        return memo[id(self)]

    def __reduce_ex__(self, protocol):
        raise TypeError("kiln.nn.Parameter cannot be pickled; save a state_dict with kiln.save instead")


def _wrap_same(t, requires_grad=True):
    """A Parameter that is `t` itself (same autograd leaf, gradients shared), for weight tying."""
    if isinstance(t, Parameter):
        return t
    t.requires_grad_(requires_grad)
    return _C._make_subclass(Parameter, t)
