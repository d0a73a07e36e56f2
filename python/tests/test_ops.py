"""Math ops and autograd against NumPy float64 references, on fresh random inputs."""
import math

import numpy as np
import pytest

import kiln
from conftest import TOL, rel_error

DTYPES = [kiln.float32, kiln.float64, kiln.bfloat16]


def rand(shape, dtype=kiln.float32, positive=False):
    t = kiln.rand(shape, dtype=dtype) + 0.5 if positive else kiln.randn(shape, dtype=dtype)
    return t, t.double().numpy()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_binary_broadcast(dtype):
    a, an = rand((4, 1, 5), dtype)
    b, bn = rand((3, 5), dtype, positive=True)
    for out, ref in [(a + b, an + bn), (a - b, an - bn), (a * b, an * bn), (a / b, an / bn),
                     (kiln.add(a, b, alpha=2), an + 2 * bn), (kiln.maximum(a, b), np.maximum(an, bn)),
                     (a + 2, an + 2), (3 - a, 3 - an), (2 * a, 2 * an), (a / 4, an / 4), (1 / b, 1 / bn),
                     (b ** 2, bn ** 2), (-a, -an), (abs(a), np.abs(an))]:
        assert out.dtype is dtype
        assert rel_error(out.double().numpy(), ref) < TOL[dtype.name]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_unary(dtype):
    x, xn = rand((7, 9), dtype)
    p, pn = rand((7, 9), dtype, positive=True)
    erf = np.vectorize(math.erf)
    for out, ref in [(kiln.exp(x), np.exp(xn)), (kiln.log(p), np.log(pn)), (kiln.tanh(x), np.tanh(xn)),
                     (kiln.sqrt(p), np.sqrt(pn)), (kiln.rsqrt(p), 1 / np.sqrt(pn)),
                     (kiln.sigmoid(x), 1 / (1 + np.exp(-xn))), (kiln.relu(x), np.maximum(xn, 0)),
                     (kiln.silu(x), xn / (1 + np.exp(-xn))), (x.clamp(-0.5, 0.5), np.clip(xn, -0.5, 0.5)),
                     (kiln.erf(x), erf(xn))]:
        assert rel_error(out.double().numpy(), ref) < TOL[dtype.name]


def test_comparisons_and_where():
    a, an = rand((5, 6))
    b, bn = rand((5, 6))
    for out, ref in [(a < b, an < bn), (a <= b, an <= bn), (a > 0, an > 0), (a >= b, an >= bn),
                     (a == a, np.ones_like(an, bool)), (a != b, an != bn), (kiln.lt(a, 0.5), an < 0.5)]:
        assert out.dtype is kiln.bool
        np.testing.assert_array_equal(out.numpy(), ref)
    np.testing.assert_allclose(kiln.where(a > b, a, b).numpy(), np.where(an > bn, an, bn), rtol=1e-6)
    np.testing.assert_allclose(kiln.where(a > 0, a, 0.0).numpy(), np.where(an > 0, an, 0), rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_reductions(dtype):
    x, xn = rand((4, 5, 6), dtype)
    for out, ref in [(x.sum(), xn.sum()), (x.sum(1), xn.sum(1)), (kiln.sum(x, (0, 2), keepdim=True), xn.sum((0, 2), keepdims=True)),
                     (x.mean(-1), xn.mean(-1)), (x.amax(0), xn.max(0)), (kiln.amin(x, 2), xn.min(2)),
                     (x.logsumexp(1), np.log(np.exp(xn).sum(1))), (x.max(), xn.max())]:
        assert out.shape == np.shape(ref)
        assert rel_error(out.double().numpy(), ref) < TOL[dtype.name]
    v, i = x.max(1)
    np.testing.assert_array_equal(i.numpy(), xn.argmax(1))
    np.testing.assert_array_equal(x.argmax().item(), xn.argmax())


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_softmax(dtype):
    x, xn = rand((6, 11), dtype)
    e = np.exp(xn - xn.max(-1, keepdims=True))
    ref = e / e.sum(-1, keepdims=True)
    assert rel_error(kiln.softmax(x, -1).double().numpy(), ref) < TOL[dtype.name]
    assert rel_error(x.log_softmax(1).double().numpy(), np.log(ref)) < TOL[dtype.name]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_matmul(dtype):
    a, an = rand((2, 5, 7), dtype)
    b, bn = rand((7, 3), dtype)
    assert rel_error((a @ b).double().numpy(), an @ bn) < TOL[dtype.name]
    c, cn = rand((7, 4), dtype)
    assert rel_error(kiln.mm(c.t(), c).double().numpy(), cn.T @ cn) < TOL[dtype.name]  # transposed operand
    w, wn = rand((3, 7), dtype)
    bias, biasn = rand((3,), dtype)
    out = kiln.nn.functional.linear(a, w, bias)
    assert rel_error(out.double().numpy(), an @ wn.T + biasn) < TOL[dtype.name]
    v, vn = rand((7,), dtype)
    assert rel_error(kiln.matmul(v, v).double().numpy(), vn @ vn) < TOL[dtype.name]


def test_joining_and_indexing():
    a, an = rand((2, 3))
    b, bn = rand((4, 3))
    np.testing.assert_array_equal(kiln.cat([a, b]).numpy(), np.concatenate([an, bn]).astype(np.float32))
    np.testing.assert_array_equal(kiln.stack([a, a], 1).numpy(), np.stack([an, an], 1).astype(np.float32))
    idx = kiln.tensor([2, 0])
    np.testing.assert_array_equal(kiln.index_select(b, 0, idx).numpy(), bn[[2, 0]].astype(np.float32))
    g = kiln.tensor([[0, 1, 0], [1, 1, 0]])
    np.testing.assert_array_equal(kiln.gather(a, 0, g).numpy(), np.take_along_axis(an, g.numpy(), 0).astype(np.float32))
    with pytest.raises(kiln.KilnError, match="index_select"):
        kiln.index_select(b, 0, kiln.tensor([9]))


def test_autograd_matches_analytic():
    x, xn = rand((3, 4), kiln.float64)
    w, wn = rand((4, 2), kiln.float64)
    x.requires_grad_()
    w.requires_grad = True
    y = (kiln.tanh(x @ w) ** 2).sum()
    assert y.grad_fn is not None and x.is_leaf
    y.backward()
    t = np.tanh(xn @ wn)
    g = 2 * t * (1 - t * t)
    assert rel_error(x.grad.numpy(), g @ wn.T) < 1e-12
    assert rel_error(w.grad.numpy(), xn.T @ g) < 1e-12
    x.grad = None
    assert x.grad is None


def test_autograd_finite_differences():
    x, xn = rand((5,), kiln.float64)
    x.requires_grad_()

    def f(t):
        return (kiln.softmax(t * 2, 0) * kiln.sigmoid(t)).sum()

    (g,) = kiln.autograd.grad(f(x), x)
    eps = 1e-6
    fd = np.zeros(5)
    for i in range(5):
        d = np.zeros(5)
        d[i] = eps
        with kiln.no_grad():
            fd[i] = (f(kiln.tensor(xn + d)).item() - f(kiln.tensor(xn - d)).item()) / (2 * eps)
    assert rel_error(g.numpy(), fd) < 1e-7


def test_no_grad_and_grad_modes():
    x = kiln.randn(3, requires_grad=True)
    with kiln.no_grad():
        assert not kiln.is_grad_enabled()
        assert not (x * 2).requires_grad
        with kiln.enable_grad():
            assert (x * 2).requires_grad
    assert kiln.is_grad_enabled() and (x * 2).requires_grad

    @kiln.no_grad()
    def f():
        return x * 2
    assert not f().requires_grad
    with kiln.set_grad_enabled(False):
        assert not kiln.is_grad_enabled()
    assert kiln.is_grad_enabled()


def test_backward_errors_and_numpy_requires_grad():
    x = kiln.randn(3, requires_grad=True)
    with pytest.raises(kiln.KilnError):
        (x * 2).backward()  # non-scalar without a gradient
    with pytest.raises(kiln.KilnError, match="detach"):
        x.numpy()
    assert x.detach().numpy().shape == (3,)


def test_deterministic_switch():
    kiln.use_deterministic_algorithms(True)
    assert kiln.are_deterministic_algorithms_enabled()
    kiln.use_deterministic_algorithms(False)
    assert not kiln.are_deterministic_algorithms_enabled()


def test_gelu_and_dropout():
    x, xn = rand((50,), kiln.float64)
    ref = 0.5 * xn * (1 + np.vectorize(math.erf)(xn / math.sqrt(2)))
    assert rel_error(kiln.gelu(x).numpy(), ref) < 1e-12
    d = kiln.nn.functional.dropout(kiln.ones(10000), 0.25)
    vals = d.numpy()
    assert set(np.unique(vals)).issubset({0.0, np.float32(1 / 0.75)}) and abs((vals == 0).mean() - 0.25) < 0.03
