"""kiln: a C++/CUDA deep-learning engine with PyTorch's names.

    import kiln
    x = kiln.randn(4, 8, requires_grad=True)
    loss = (x @ x.T).sum()
    loss.backward()

Tensors exchange memory with NumPy and PyTorch without copies (kiln.from_dlpack(x),
torch.from_dlpack(t), t.numpy()). kiln.torch runs kiln's fused kernels inside PyTorch models.
"""
from . import _C
from ._C import KilnError, Tensor
from ._dtype import device, dtype

Tensor.__module__ = KilnError.__module__ = "kiln"  # shown as kiln.Tensor / kiln.KilnError

float32 = float = dtype(0)
float64 = double = dtype(1)
bfloat16 = dtype(2)
float16 = half = dtype(3)
int64 = long = dtype(4)
int32 = int = dtype(5)
int8 = dtype(6)
uint8 = dtype(7)
bool = dtype(8)
uint16 = dtype(9)
uint32 = dtype(10)
_DTYPES = (float32, float64, bfloat16, float16, int64, int32, int8, uint8, bool, uint16, uint32)
_C._register_types(list(_DTYPES), device)

from ._C import (  # noqa: E402
    abs, add, amax, amin, arange, are_deterministic_algorithms_enabled, argmax, bmm, cat, clamp,
    div, empty, empty_like, eq, erf, exp, full, full_like, gather, ge, gelu, get_float32_matmul_precision,
    gt, index_select, is_grad_enabled, le, log, log_softmax, logsumexp, lt, manual_seed, matmul, max,
    maximum, mean, minimum, mm, mul, ne, neg, ones, ones_like, pow, rand, rand_like, randint, randn,
    randn_like, relu, result_type, rsqrt, scatter_add, set_float32_matmul_precision, sigmoid, silu, softmax, sqrt,
    stack, sub, sum, tanh, use_deterministic_algorithms, where, zeros, zeros_like,
)
from ._C import get_num_threads, set_num_threads  # noqa: E402
from ._tensor_ops import *  # noqa: E402,F401,F403  (min/var/topk/einsum/Generator/... and Tensor methods)
from ._dlpack import from_dlpack, from_numpy  # noqa: E402
from . import _capture  # noqa: E402,F401  (torch / NumPy tensors captured by traced mods)
from ._grad_mode import enable_grad, inference_mode, no_grad, set_grad_enabled  # noqa: E402
from ._tensor import tensor  # noqa: E402
from ._io import RawTensor, load, save  # noqa: E402
from . import autograd, cpu, cuda, nn  # noqa: E402
from . import optim  # noqa: E402

true_divide = div  # torch.true_divide: div is true division
from . import linalg  # noqa: E402

__version__ = "0.1.0"


def is_tensor(obj) -> "builtins.bool":  # noqa: F821
    return isinstance(obj, Tensor)
