"""kiln.nn: modules, parameters, functional ops, init and attention (torch.nn names)."""
from . import attention, functional, init, utils
from .modules import (
    GELU, CrossEntropyLoss, Dropout, Embedding, Identity, LayerNorm, Linear, LinearCrossEntropyLoss, Module,
    ModuleDict, ModuleList, MSELoss, ReLU, RMSNorm, Sequential, Sigmoid, SiLU, Tanh,
)
from .parameter import Parameter

__all__ = ["functional", "attention", "init", "utils", "Parameter", "Module", "Linear", "Identity", "Embedding",
           "RMSNorm", "LayerNorm", "Dropout", "ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "Sequential", "ModuleList",
           "ModuleDict", "LinearCrossEntropyLoss", "CrossEntropyLoss", "MSELoss"]
