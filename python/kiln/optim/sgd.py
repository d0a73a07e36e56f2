"""kiln.optim.SGD over kiln::optim::SGD."""
from .. import _C
from .optimizer import Optimizer, _as_kiln

__all__ = ["SGD"]


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, exactly torch.optim.SGD's update:

        g = grad (-grad if maximize) + weight_decay * p
        b = g (first step), else momentum * b + (1 - dampening) * g      (when momentum > 0)
        p -= lr * (g + momentum * b if nesterov else b)

    SGD(params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False, *, maximize=False)
      params: an iterable of parameters (any shapes, floating point, leaves) or param-group dicts.
      State "momentum_buffer" has the parameter's shape (float32 for bfloat16 / float16
      parameters, whose update is computed in float32)."""

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False, fused=None):
        if differentiable:
            raise ValueError("SGD: differentiable=True is not supported by kiln")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize, foreach=foreach, differentiable=False, fused=fused)
        super().__init__(params, defaults)

    def _check_group(self, g):
        if not 0.0 <= g["lr"]:
            raise ValueError(f"Invalid learning rate: {g['lr']}")
        if not 0.0 <= g["momentum"]:
            raise ValueError(f"Invalid momentum value: {g['momentum']}")
        if not 0.0 <= g["weight_decay"]:
            raise ValueError(f"Invalid weight_decay value: {g['weight_decay']}")
        if g["nesterov"] and (g["momentum"] <= 0 or g["dampening"] != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")

    def _make_impl(self, param_lists):
        return _C._optim.SGD(param_lists)

    def _push_group(self, index, g):
        self._impl.set_group(index, float(g["lr"]), float(g["momentum"]), float(g["dampening"]),
                             float(g["weight_decay"]), bool(g["nesterov"]), bool(g["maximize"]))

    def _empty_entry(self):
        return None

    def _state_entry(self, entry):
        return None if entry is None else {"momentum_buffer": entry}

    def _load_entry(self, entry):
        return _as_kiln(entry.get("momentum_buffer"))
