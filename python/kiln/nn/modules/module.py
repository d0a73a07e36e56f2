"""kiln.nn.Module: torch.nn.Module's protocol (registration by attribute, parameters, state_dict, to)."""
from collections import OrderedDict, namedtuple

from ... import _C
from ..._grad_mode import no_grad
from ..parameter import Parameter

__all__ = ["Module"]


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    __slots__ = ()

    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


def _check_name(name, kind, owner):
    if not isinstance(name, str):
        raise TypeError(f"{kind} name should be a string. Got {type(name).__name__}")
    if name == "":
        raise KeyError(f'{kind} name can\'t be empty string ""')
    if "." in name:
        raise KeyError(f'{kind} name can\'t contain ".", got: {name}')
    if hasattr(owner, name) and name not in owner._parameters and name not in owner._buffers \
            and name not in owner._modules:
        raise KeyError(f"attribute '{name}' already exists")


def _parse_to(args, kwargs):
    """Module.to's arguments (device, dtype, tensor, in any of PyTorch's forms) -> (device, dtype)."""
    from ... import _dtype

    device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
    kwargs.pop("non_blocking", None)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
    for a in args:
        if isinstance(a, _C.Tensor):
            device, dtype = a.device, a.dtype
        elif isinstance(a, _dtype.dtype) or (a is not None and type(a).__name__ == "dtype"):
            dtype = a
        elif a is not None:
            device = a
    if dtype is not None:
        dtype = _dtype._by_name(str(dtype).split(".")[-1])
        if not dtype.is_floating_point:
            raise TypeError(f"nn.Module.to only accepts floating point dtypes, but got desired dtype={dtype}")
    if device is not None:
        device = _dtype.device(device if isinstance(device, (int, _dtype.device)) else str(device))
    return device, dtype


class Module:
    """Base class of every layer and model, as torch.nn.Module.

    Subclasses set parameters (kiln.nn.Parameter), buffers (register_buffer) and child modules as
    attributes in __init__ (after super().__init__()) and define forward(); calling the module runs
    forward. parameters() / named_parameters() list them depth-first in registration order with
    dotted names ("blocks.0.attn.weight"), each shared parameter once; state_dict() /
    load_state_dict() exchange them with kiln.save / kiln.load checkpoints; to() moves and casts
    them in place (an optimizer built before keeps working); train() / eval() set `training`.

        class MLP(kiln.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1 = kiln.nn.Linear(16, 64)
                self.fc2 = kiln.nn.Linear(64, 4)

            def forward(self, x):              # x: [N, 16] -> [N, 4]
                return self.fc2(kiln.nn.functional.relu(self.fc1(x)))
    """

    training: bool

    def __init__(self):
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers", set())
        object.__setattr__(self, "_modules", OrderedDict())

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ---- registration ----
    def _registries(self):
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"cannot assign to a {type(self).__name__} before Module.__init__() call")
        return self._parameters, self._buffers, self._modules

    def register_parameter(self, name, param):
        """Adds a parameter (a kiln.nn.Parameter, or None to reserve the name)."""
        params, _, _ = self._registries()
        _check_name(name, "parameter", self)
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                            "(kiln.nn.Parameter or None required)")
        params[name] = param

    def register_buffer(self, name, tensor, persistent=True):
        """Adds a buffer: a tensor that is state but not a parameter (moved by to(); in state_dict()
        unless persistent=False)."""
        _, buffers, _ = self._registries()
        _check_name(name, "buffer", self)
        if tensor is not None and not isinstance(tensor, _C.Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                            "(kiln.Tensor or None required)")
        buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers.discard(name)
        else:
            self._non_persistent_buffers.add(name)

    def add_module(self, name, module):
        """Adds a child module (or None) under `name`."""
        _, _, modules = self._registries()
        _check_name(name, "module", self)
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        modules[name] = module

    register_module = add_module

    def __setattr__(self, name, value):
        d = self.__dict__
        params, buffers, modules = d.get("_parameters"), d.get("_buffers"), d.get("_modules")

        def forget(*registries):
            for r in registries:
                if r is not None:
                    r.pop(name, None)
            d.pop(name, None)

        if isinstance(value, Parameter):
            self._registries()
            forget(buffers, modules)
            self.register_parameter(name, value)
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                                "(kiln.nn.Parameter or None expected)")
            params[name] = None
        elif isinstance(value, Module):
            self._registries()
            forget(params, buffers)
            modules[name] = value
        elif modules is not None and name in modules:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as child module '{name}' "
                                "(kiln.nn.Module or None expected)")
            modules[name] = None
        elif buffers is not None and name in buffers:
            if value is not None and not isinstance(value, _C.Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                                "(kiln.Tensor or None expected)")
            buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        d = self.__dict__
        for registry in ("_parameters", "_buffers", "_modules"):
            if registry in d and name in d[registry]:
                return d[registry][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for registry in (self._parameters, self._buffers, self._modules):
            if name in registry:
                del registry[name]
                self._non_persistent_buffers.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))

    # ---- traversal ----
    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        """(name, module) for this module and every descendant, depth-first; each module once."""
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, module in self._modules.items():
            if module is not None:
                yield from module.named_modules(memo, f"{prefix}.{name}" if prefix else name, remove_duplicate)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_children(self):
        seen = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in seen:
                seen.add(id(module))
                yield name, module

    def children(self):
        for _, m in self.named_children():
            yield m

    def _named_members(self, registry, prefix, recurse, remove_duplicate):
        seen = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for module_prefix, module in modules:
            for name, value in getattr(module, registry).items():
                if value is None or (remove_duplicate and id(value) in seen):
                    continue
                seen.add(id(value))
                yield (f"{module_prefix}.{name}" if module_prefix else name), value

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        """(dotted name, Parameter) pairs in registration order; a shared parameter appears once."""
        yield from self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        yield from self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def get_submodule(self, target):
        """The descendant at a dotted path ("blocks.0.attn"); "" is this module."""
        module = self
        for item in target.split(".") if target else []:
            if item not in module._modules or module._modules[item] is None:
                raise AttributeError(f"{type(module).__name__} has no attribute `{item}`")
            module = module._modules[item]
        return module

    def get_parameter(self, target):
        module_path, _, name = target.rpartition(".")
        module = self.get_submodule(module_path)
        if name not in module._parameters:
            raise AttributeError(f"`{name}` is not an nn.Parameter")
        return module._parameters[name]

    def get_buffer(self, target):
        module_path, _, name = target.rpartition(".")
        module = self.get_submodule(module_path)
        if name not in module._buffers:
            raise AttributeError(f"`{name}` is not a buffer")
        return module._buffers[name]

    def apply(self, fn):
        """Calls fn(module) on every child (recursively), then on this module; returns self."""
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    # ---- state ----
    def state_dict(self, *, destination=None, prefix="", keep_vars=False):
        """OrderedDict {dotted name: tensor} of parameters and persistent buffers, detached unless
        keep_vars. A tied parameter is listed under each of its names (as in PyTorch)."""
        out = OrderedDict() if destination is None else destination
        for name, p in self._parameters.items():
            if p is not None:
                out[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers:
                out[prefix + name] = b if keep_vars else b.detach()
        for name, module in self._modules.items():
            if module is not None:
                module.state_dict(destination=out, prefix=f"{prefix}{name}.", keep_vars=keep_vars)
        return out

    def _local_state(self, prefix):
        for name, p in self._parameters.items():
            if p is not None:
                yield prefix + name, self._parameters, name
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers:
                yield prefix + name, self._buffers, name
        for name, module in self._modules.items():
            if module is not None:
                yield from module._local_state(f"{prefix}{name}.")

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """Copies tensors from {dotted name: tensor} (e.g. kiln.load(path)) into the parameters and
        buffers, in place (assign=True replaces them instead). Values may be kiln tensors or any
        DLPack tensor (torch, NumPy). A shape mismatch raises; with strict=True (default) so do
        missing and unexpected keys. Returns (missing_keys, unexpected_keys)."""
        from ..._dlpack import from_dlpack

        if not hasattr(state_dict, "keys"):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict).__name__}.")
        errors, missing, expected = [], [], set()
        with no_grad():
            for key, registry, name in self._local_state(""):
                expected.add(key)
                if key not in state_dict:
                    missing.append(key)
                    continue
                value = state_dict[key]
                if not isinstance(value, _C.Tensor):
                    if not hasattr(value, "__dlpack__"):
                        errors.append(f'While copying the parameter named "{key}", expected a tensor from '
                                      f"the checkpoint but received {type(value).__name__}")
                        continue
                    value = from_dlpack(value)
                current = registry[name]
                if tuple(value.shape) != tuple(current.shape):
                    errors.append(f"size mismatch for {key}: copying a param with shape {tuple(value.shape)} "
                                  f"from checkpoint, the shape in current model is {tuple(current.shape)}.")
                    continue
                if assign:
                    if isinstance(current, Parameter):
                        value = Parameter(value.to(current.device), requires_grad=current.requires_grad)
                    registry[name] = value
                else:
                    current.copy_(value)
        unexpected = [k for k in state_dict.keys() if k not in expected]
        if strict:
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in missing)))
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in unexpected)))
        if errors:
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
                type(self).__name__, "\n\t".join(errors)))
        return _IncompatibleKeys(missing, unexpected)

    # ---- modes, gradients, devices ----
    def train(self, mode=True):
        """Sets training mode (dropout active) on this module and its descendants; returns self."""
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self):
        """train(False): dropout off. Returns self."""
        return self.train(False)

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none=True):
        """Drops every parameter's gradient (set_to_none=True, PyTorch's default) or zeroes it."""
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()

    def to(self, *args, **kwargs):
        """to(device), to(dtype), to(device, dtype), to(tensor): moves parameters in place (each
        Parameter object, and an optimizer holding it, sees the move; gradients move along) and
        replaces buffers. A dtype applies to floating-point tensors only. Returns self."""
        device, dtype = _parse_to(args, kwargs)
        if device is None and dtype is None:
            return self
        params = list(self.parameters())
        if params:
            _C._nn.move_(params, device, dtype)
        for m in self.modules():
            for name, b in m._buffers.items():
                if b is not None:
                    target = dtype if dtype is not None and b.is_floating_point() else None
                    m._buffers[name] = b.to(device=device, dtype=target)
        return self

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=None):
        return self.to("cuda" if device is None else device)

    def float(self):
        return self.to(dtype="float32")

    def double(self):
        return self.to(dtype="float64")

    def half(self):
        return self.to(dtype="float16")

    def bfloat16(self):
        return self.to(dtype="bfloat16")

    # ---- printing ----
    def extra_repr(self):
        """The text inside this module's parentheses in repr(); subclasses override it."""
        return ""

    def __repr__(self):
        lines = [line for line in self.extra_repr().split("\n") if line]
        for name, module in self._modules.items():
            text = repr(module).replace("\n", "\n  ")
            lines.append(f"({name}): {text}")
        if not lines:
            return f"{type(self).__name__}()"
        if not self._modules and len(lines) == 1:
            return f"{type(self).__name__}({lines[0]})"
        return f"{type(self).__name__}(\n  " + "\n  ".join(lines) + "\n)"

