"""kiln.nn's modules (torch.nn names)."""
from .container import ModuleDict, ModuleList, Sequential
from .dropout import GELU, Dropout, ReLU, Sigmoid, SiLU, Tanh
from .linear import Embedding, Identity, Linear
from .loss import CrossEntropyLoss, LinearCrossEntropyLoss, MSELoss
from .module import Module
from .normalization import LayerNorm, RMSNorm

__all__ = ["Module", "Linear", "Identity", "Embedding", "RMSNorm", "LayerNorm", "Dropout", "ReLU", "GELU",
           "SiLU", "Tanh", "Sigmoid", "Sequential", "ModuleList", "ModuleDict", "LinearCrossEntropyLoss",
           "CrossEntropyLoss", "MSELoss"]
