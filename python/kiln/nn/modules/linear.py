"""Linear, Embedding and Identity: kiln::nn's C++ layers (their constructors draw the weights)
adopted as Python modules whose forward calls the same C++ op the C++ layer's forward does."""
from ... import _C
from .. import functional as F
from ..parameter import Parameter
from .module import Module

__all__ = ["Identity", "Linear", "Embedding"]


def _adopt(module, cpp):
    """Registers the C++ module's parameters (same tensors) on the Python module, in its order."""
    for name, t in cpp.named_parameters():
        setattr(module, name, Parameter(t))


class Identity(Module):
    """Returns its input unchanged (any shape); extra constructor arguments are ignored."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, input):
        return input


class Linear(Module):
    """y = x @ weight.T + bias.

    Linear(in_features, out_features, bias=True, device=None, dtype=None)
      input [..., in_features] -> output [..., out_features]
      weight [out_features, in_features], bias [out_features], both ~ U(-1/sqrt(in), 1/sqrt(in))
      (PyTorch's init), drawn in float32 from kiln's generator by kiln::nn::Linear: the same seed
      gives the same weights in C++ and Python."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        _adopt(self, _C._nn.Linear(in_features, out_features, bias, dtype=dtype, device=device))
        if not bias:
            self.register_parameter("bias", None)

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """A lookup table of vectors.

    Embedding(num_embeddings, embedding_dim, device=None, dtype=None)
      input [...] int64/int32 indices in [0, num_embeddings) -> output [..., embedding_dim]
      weight [num_embeddings, embedding_dim] ~ N(0, 1) (kiln::nn::Embedding's init).
    padding_idx, max_norm and sparse gradients are not supported (they raise)."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=False, _weight=None, _freeze=False, device=None, dtype=None):
        super().__init__()
        for name, value in (("padding_idx", padding_idx), ("max_norm", max_norm)):
            if value is not None:
                raise ValueError(f"Embedding: {name} is not supported by kiln")
        if scale_grad_by_freq or sparse:
            raise ValueError("Embedding: scale_grad_by_freq and sparse are not supported by kiln")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        if _weight is None:
            _adopt(self, _C._nn.Embedding(num_embeddings, embedding_dim, dtype=dtype, device=device))
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ValueError("Shape of weight does not match num_embeddings and embedding_dim")
            self.weight = Parameter(_weight, requires_grad=not _freeze)

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, **kwargs):
        """An Embedding whose weight is `embeddings` [num, dim] (frozen unless freeze=False)."""
        if embeddings.ndim != 2:
            raise ValueError("Embeddings parameter is expected to be 2-dimensional")
        rows, cols = embeddings.shape
        return cls(rows, cols, _weight=embeddings, _freeze=freeze, **kwargs)

    def forward(self, input):
        return F.embedding(input, self.weight)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}"
