"""Nested objects for kiln.save / kiln.load: dicts, lists and tuples of tensors and Python
primitives become a flat {dotted path: tensor} dict plus a JSON description of the structure, and
back. Only these types are ever written or rebuilt; nothing is imported or called on load.

Structure nodes: {"tensor": name}, {"value": int | float | bool | str | None}, {"list": [node]},
{"tuple": [node]}, {"dict": [[key, node]]} with keys int, float, bool, str or None (JSON keeps
their types, so an optimizer state's int parameter ids come back as ints)."""
from . import _C

STRUCTURE_KEY = "kiln.structure"
_PRIMITIVES = (bool, int, float, str, type(None))
_MAX_DEPTH = 100


def is_flat_tensor_dict(obj, raw_type):
    return isinstance(obj, dict) and all(isinstance(k, str) and isinstance(v, (_C.Tensor, raw_type))
                                         for k, v in obj.items())


def flatten(obj, raw_type):
    """-> ({path: tensor}, structure). Raises TypeError for anything but the types above."""
    tensors = {}

    def name_for(path):
        name = ".".join(path) or "tensor"
        if name in tensors:  # a key holding a dot can collide with a deeper path
            n = 1
            while f"{name}#{n}" in tensors:
                n += 1
            name = f"{name}#{n}"
        return name

    def walk(x, path, depth):
        if depth > _MAX_DEPTH:
            raise ValueError(f"kiln.save: the object nests deeper than {_MAX_DEPTH} levels (a cycle?)")
        if isinstance(x, (_C.Tensor, raw_type)):
            name = name_for(path)
            tensors[name] = x
            return {"tensor": name}
        if isinstance(x, _PRIMITIVES):
            return {"value": x}
        if isinstance(x, dict):
            items = []
            for k, v in x.items():
                if not isinstance(k, _PRIMITIVES):
                    raise TypeError(f"kiln.save: dict keys must be str, int, float, bool or None, got {type(k).__name__}")
                items.append([k, walk(v, path + [str(k)], depth + 1)])
            return {"dict": items}
        if isinstance(x, (list, tuple)):
            kind = "tuple" if isinstance(x, tuple) else "list"
            return {kind: [walk(v, path + [str(i)], depth + 1) for i, v in enumerate(x)]}
        raise TypeError(f"kiln.save: cannot save an object of type {type(x).__name__} at "
                        f"{'.'.join(path) or 'the top level'}; kiln saves tensors, numbers, strings, None "
                        f"and dicts / lists / tuples of them")

    structure = walk(obj, [], 0)
    return tensors, structure


def rebuild(node, tensors, depth=0):
    """The object a structure describes, its tensors taken from `tensors`."""
    if depth > _MAX_DEPTH or not isinstance(node, dict) or len(node) != 1:
        raise _C.KilnError("[load] the file's kiln.structure metadata is malformed")
    (kind, body), = node.items()
    if kind == "tensor":
        if body not in tensors:
            raise _C.KilnError(f"[load] the file's structure names a tensor {body!r} it does not hold")
        return tensors[body]
    if kind == "value":
        if not isinstance(body, _PRIMITIVES):
            raise _C.KilnError("[load] the file's kiln.structure metadata is malformed")
        return body
    if kind in ("list", "tuple") and isinstance(body, list):
        items = [rebuild(v, tensors, depth + 1) for v in body]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict" and isinstance(body, list):
        out = {}
        for item in body:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], _PRIMITIVES)):
                raise _C.KilnError("[load] the file's kiln.structure metadata is malformed")
            out[item[0]] = rebuild(item[1], tensors, depth + 1)
        return out
    raise _C.KilnError("[load] the file's kiln.structure metadata is malformed")
