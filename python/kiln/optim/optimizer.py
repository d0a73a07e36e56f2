"""kiln.optim.Optimizer: PyTorch's param_groups / state_dict protocol over a C++ optimizer object.

The Python dicts in `param_groups` hold the hyperparameters (a scheduler or the user changes
group["lr"]); before every step they are pushed to the C++ optimizer (kiln::optim), which holds
the per-parameter state and runs the update kernels."""
from .. import _C
from .._dlpack import from_dlpack
from .._grad_mode import enable_grad

__all__ = ["Optimizer"]


def _as_kiln(t):
    if t is None or isinstance(t, _C.Tensor):
        return t
    return from_dlpack(t)  # a torch / NumPy tensor from a PyTorch checkpoint


class Optimizer:
    """Base class: param_groups (list of dicts with "params" and hyperparameters), step(),
    zero_grad(set_to_none=True), add_param_group(), state_dict() / load_state_dict().
    Subclasses define _make_impl(groups of params), _push_group(index, group) and the state
    conversions _state_entry / _load_entries."""

    def __init__(self, params, defaults):
        self.defaults = dict(defaults)
        self.param_groups = []
        self._impl = None
        if isinstance(params, _C.Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, "
                            f"but got {type(params).__name__}")
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)

    def __repr__(self):
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {g[k]}" for k in sorted(g) if k != "params"]
        return "\n".join(lines) + "\n)"

    def add_param_group(self, param_group):
        """Adds a group ({"params": [...], hyperparameter overrides}); missing hyperparameters take
        the optimizer's defaults. The state of existing parameters is kept."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        params = param_group["params"]
        params = [params] if isinstance(params, _C.Tensor) else list(params)
        for p in params:
            if not isinstance(p, _C.Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, but one of the params is {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if len({id(p) for p in params}) != len(params) or any(id(p) in seen for p in params):
            raise ValueError("some parameters appear more than once in the optimizer's parameter groups")
        group = dict(param_group, params=params)
        for k, v in self.defaults.items():
            group.setdefault(k, v)
        self._check_group(group)
        old_state = self._impl.state() if self._impl is not None else []
        impl = self._make_impl([g["params"] for g in self.param_groups + [group]])
        impl.load_state(list(old_state) + [self._empty_entry()] * len(params))
        self.param_groups.append(group)
        self._impl = impl

    def zero_grad(self, set_to_none=True):
        """Drops (set_to_none=True, PyTorch's default) or zeroes every parameter's gradient."""
        self._impl.zero_grad(set_to_none)

    def step(self, closure=None):
        """One update of every parameter that has a gradient; closure (re-evaluating the loss) is
        called first, under grad mode, and its result returned."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        for i, g in enumerate(self.param_groups):
            self._check_group(g)
            self._push_group(i, g)
        self._impl.step()
        return loss

    @property
    def state(self):
        """{parameter: its state dict} for parameters that have state (read-only view)."""
        out = {}
        params = [p for g in self.param_groups for p in g["params"]]
        for i, entry in self.state_dict()["state"].items():
            out[params[i]] = entry
        return out

    def state_dict(self):
        """{"state": {flat index: per-parameter state}, "param_groups": [hyperparameters with
        "params": flat indices]}, as torch.optim (tensors are the optimizer's own, not copies)."""
        state = {}
        for i, entry in enumerate(self._impl.state()):
            s = self._state_entry(entry)
            if s:
                state[i] = s
        groups, index = [], 0
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = list(range(index, index + len(g["params"])))
            index += len(g["params"])
            groups.append(d)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Restores hyperparameters and per-parameter state from state_dict() (also from a saved
        nested dict whose integer keys came back as strings, or a torch optimizer's state_dict)."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for mine, theirs in zip(self.param_groups, groups):
            if len(mine["params"]) != len(theirs["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                                 "optimizer's group")
        saved = state_dict["state"]
        entries = []
        for theirs in groups:
            for key in theirs["params"]:
                entry = saved.get(key, saved.get(str(key)))
                entries.append(self._load_entry(entry) if entry else self._empty_entry())
        self._impl.load_state(entries)
        for mine, theirs in zip(self.param_groups, groups):
            for k, v in theirs.items():
                if k != "params":
                    mine[k] = tuple(v) if isinstance(v, list) and k == "betas" else v

    # ---- subclass hooks ----
    def _check_group(self, group):
        pass

    def _make_impl(self, param_lists):
        raise NotImplementedError

    def _push_group(self, index, group):
        raise NotImplementedError

    def _empty_entry(self):
        raise NotImplementedError

    def _state_entry(self, entry):
        raise NotImplementedError

    def _load_entry(self, entry):
        raise NotImplementedError


def _scalar(v):
    """A number from a state value that may be a tensor (torch keeps "step" as a 0-d tensor)."""
    return v.item() if hasattr(v, "item") else v
