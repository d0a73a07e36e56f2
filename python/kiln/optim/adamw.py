"""kiln.optim.AdamW over kiln::optim::AdamW (one fused kernel per parameter per step)."""
from .. import _C
from .optimizer import Optimizer, _as_kiln, _scalar

__all__ = ["AdamW"]


class AdamW(Optimizer):
    """AdamW (decoupled weight decay), exactly torch.optim.AdamW's update (amsgrad=False):

        p *= 1 - lr * weight_decay
        m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
        p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

    AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
      params: an iterable of parameters (any shapes, floating point, leaves) or of param-group
      dicts ({"params": [...], "lr": ..., ...}). Each parameter is updated in place by one kernel
      (CPU or CUDA) reading p, g, m, v once. The moments (state "exp_avg", "exp_avg_sq") have the
      parameter's shape, in float32 for bfloat16 / float16 parameters. foreach / fused are accepted
      and ignored (kiln's update is always fused); amsgrad, maximize, capturable and differentiable
      are not supported."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None):
        for name, value in (("amsgrad", amsgrad), ("maximize", maximize), ("capturable", capturable),
                            ("differentiable", differentiable)):
            if value:
                raise ValueError(f"AdamW: {name}=True is not supported by kiln")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=False,
                        maximize=False, foreach=foreach, capturable=False, differentiable=False, fused=fused)
        super().__init__(params, defaults)

    def _check_group(self, g):
        lr, (beta1, beta2), eps, wd = g["lr"], g["betas"], g["eps"], g["weight_decay"]
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= beta1 < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {beta1}")
        if not 0.0 <= beta2 < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {beta2}")
        if not 0.0 <= wd:
            raise ValueError(f"Invalid weight_decay value: {wd}")

    def _make_impl(self, param_lists):
        return _C._optim.AdamW(param_lists)

    def _push_group(self, index, g):
        beta1, beta2 = g["betas"]
        self._impl.set_group(index, float(g["lr"]), float(beta1), float(beta2), float(g["eps"]),
                             float(g["weight_decay"]))

    def _empty_entry(self):
        return (0, None, None)

    def _state_entry(self, entry):
        step, m, v = entry
        if step == 0 and m is None:
            return None
        # torch keeps "step" as a float32 0-d tensor; so does this state_dict (kiln.save can store it).
        return {"step": _C.full((), float(step), dtype="float32"), "exp_avg": m, "exp_avg_sq": v}

    def _load_entry(self, entry):
        return (int(_scalar(entry["step"])), _as_kiln(entry.get("exp_avg")), _as_kiln(entry.get("exp_avg_sq")))
