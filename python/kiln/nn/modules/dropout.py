"""Dropout and the parameter-free activation modules."""
from .. import functional as F
from .module import Module

__all__ = ["Dropout", "ReLU", "GELU", "SiLU", "Tanh", "Sigmoid"]


class Dropout(Module):
    """Zeroes each element with probability p and scales the rest by 1/(1-p) while training
    (module.train()); the identity in eval mode. input: any shape -> same shape. The mask comes from
    kiln's generator and is regenerated in backward, never stored."""

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, input):
        return F.dropout(input, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class ReLU(Module):
    """max(x, 0) elementwise; any shape."""

    def __init__(self, inplace=False):
        super().__init__()

    def forward(self, input):
        return F.relu(input)


class GELU(Module):
    """x * Phi(x) elementwise (approximate='none' or 'tanh'); any shape."""

    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate='{self.approximate}'"


class SiLU(Module):
    """x * sigmoid(x) elementwise; any shape."""

    def __init__(self, inplace=False):
        super().__init__()

    def forward(self, input):
        return F.silu(input)


class Tanh(Module):
    """tanh elementwise; any shape."""

    def forward(self, input):
        return input.tanh()


class Sigmoid(Module):
    """1 / (1 + exp(-x)) elementwise; any shape."""

    def forward(self, input):
        return input.sigmoid()
