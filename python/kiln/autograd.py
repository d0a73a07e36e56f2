"""kiln.autograd.grad (torch.autograd.grad)."""
from . import _C

__all__ = ["grad", "backward"]


def _as_list(x):
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False):
    """Gradients of `outputs` w.r.t. `inputs` (a tuple), without touching .grad."""
    retain = create_graph if retain_graph is None else retain_graph
    return tuple(_C._autograd_grad(_as_list(outputs), _as_list(inputs), _as_list(grad_outputs), retain, create_graph))


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False):
    tensors, grads = _as_list(tensors), _as_list(grad_tensors)
    for i, t in enumerate(tensors):
        t.backward(grads[i] if i < len(grads) else None, retain_graph=True if i + 1 < len(tensors) else retain_graph,
                   create_graph=create_graph)
