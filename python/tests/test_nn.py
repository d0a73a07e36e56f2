"""kiln.nn.functional (rms_norm, cross_entropy, embedding, LCE) vs NumPy float64 and torch's unfused
computation. The kiln.torch adapter is tested in test_torch_lce.py."""
import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from conftest import TOL, rel_error


def lse(z):
    m = z.max(-1, keepdims=True)
    return (m + np.log(np.exp(z - m).sum(-1, keepdims=True)))[..., 0]


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64, kiln.bfloat16], ids=lambda d: d.name)
def test_rms_norm(dtype):
    x = kiln.randn(4, 3, 16, dtype=dtype)
    w = kiln.rand(16, dtype=dtype) + 0.5
    xn, wn = x.double().numpy(), w.double().numpy()
    ref = xn / np.sqrt((xn ** 2).mean(-1, keepdims=True) + 1e-5) * wn
    assert rel_error(F.rms_norm(x, 16, w, eps=1e-5).double().numpy(), ref) < TOL[dtype.name]
    assert F.rms_norm(x, (16,)).shape == x.shape
    with pytest.raises(kiln.KilnError, match="rms_norm"):
        F.rms_norm(x, (3, 16))


def test_add_rms_norm_swiglu_and_out_dtype():
    x = kiln.randn(5, 32, dtype=kiln.float64, requires_grad=True)
    r = kiln.randn(5, 32, dtype=kiln.float64, requires_grad=True)
    w = kiln.rand(32, dtype=kiln.float64) + 0.5
    h, y = F.add_rms_norm(x, r, 32, w, eps=1e-5)
    hn = x.detach().numpy() + r.detach().numpy()
    ref = hn / np.sqrt((hn ** 2).mean(-1, keepdims=True) + 1e-5) * w.numpy()
    assert rel_error(h.detach().numpy(), hn) < 1e-12 and rel_error(y.detach().numpy(), ref) < 1e-12
    (h.sum() + y.sum()).backward()
    assert rel_error(x.grad.numpy(), r.grad.numpy()) == 0.0  # both inputs of the sum share a gradient
    # dtype: the output in bf16 from fp32 statistics, as the next matmul under autocast reads it.
    x32 = kiln.randn(4, 64)
    yb = F.rms_norm(x32, 64, dtype=kiln.bfloat16)
    assert yb.dtype == kiln.bfloat16
    assert rel_error(yb.double().numpy(), F.rms_norm(x32, 64).double().numpy()) < TOL["bfloat16"]
    g, u = kiln.randn(3, 8, dtype=kiln.float64), kiln.randn(3, 8, dtype=kiln.float64)
    gn = g.numpy()
    assert rel_error(F.swiglu(g, u).numpy(), gn / (1 + np.exp(-gn)) * u.numpy()) < 1e-12
    with pytest.raises(kiln.KilnError, match="add_rms_norm"):
        F.add_rms_norm(x, kiln.randn(5, 31, dtype=kiln.float64), 32)


def test_embedding_and_grad():
    w = kiln.randn(10, 4, dtype=kiln.float64, requires_grad=True)
    idx = kiln.tensor([[1, 3], [3, 9]])
    out = F.embedding(idx, w)
    np.testing.assert_array_equal(out.detach().numpy(), w.detach().numpy()[idx.numpy()])
    out.sum().backward()
    ref = np.zeros((10, 4))
    np.add.at(ref, idx.numpy().ravel(), 1.0)
    np.testing.assert_array_equal(w.grad.numpy(), ref)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(reduction):
    z = kiln.randn(12, 7, dtype=kiln.float64, requires_grad=True)
    t = kiln.randint(0, 7, (12,))
    t[3] = -100
    zn, tn = z.detach().numpy(), t.numpy()
    per = lse(zn) - zn[np.arange(12), np.clip(tn, 0, 6)]
    per[tn == -100] = 0
    ref = {"mean": per.sum() / (tn != -100).sum(), "sum": per.sum(), "none": per}[reduction]
    out = F.cross_entropy(z, t, reduction=reduction)
    assert rel_error(out.detach().numpy(), ref) < 1e-12
    out.sum().backward()
    assert z.grad.shape == (12, 7)


def lce_reference(x, w, t, b=None, ls=0.0, z_loss=0.0, cap=0.0, ignore=-100, reduction="mean"):
    z = x @ w.T + (0 if b is None else b)
    if cap > 0:
        z = cap * np.tanh(z / cap)
    V = z.shape[-1]
    L = lse(z)
    keep = t != ignore
    tt = np.where(keep, t, 0)
    nll = L - np.take_along_axis(z, tt[..., None], -1)[..., 0]
    smooth = L - z.mean(-1)
    per = ((1 - ls) * nll + ls * smooth) * keep
    zl = z_loss * L ** 2 * keep
    if reduction == "none":
        return per + zl
    if reduction == "sum":
        return per.sum() + zl.sum()
    return per.sum() / keep.sum() + zl.sum() / keep.sum()


@pytest.mark.parametrize("strategy", ["memory", "speed"])
@pytest.mark.parametrize("opts", [{}, {"label_smoothing": 0.1, "z_loss": 1e-3, "logit_softcap": 5.0},
                                  {"reduction": "sum"}, {"reduction": "none"}])
def test_linear_cross_entropy_float64(strategy, opts):
    N, H, V = 24, 16, 50
    x = kiln.randn(N, H, dtype=kiln.float64, requires_grad=True)
    w = (kiln.randn(V, H, dtype=kiln.float64) * 0.3).requires_grad_()
    b = kiln.randn(V, dtype=kiln.float64, requires_grad=True)
    t = kiln.randint(0, V, (N,))
    t[5] = -100
    loss = F.linear_cross_entropy(x, w, t, b, strategy=strategy, **opts)
    ref = lce_reference(x.detach().numpy(), w.detach().numpy(), t.numpy(), b.detach().numpy(),
                        ls=opts.get("label_smoothing", 0), z_loss=opts.get("z_loss", 0),
                        cap=opts.get("logit_softcap", 0), reduction=opts.get("reduction", "mean"))
    assert rel_error(loss.detach().numpy(), ref) < 1e-10
    loss.sum().backward()
    assert x.grad.shape == (N, H) and w.grad.shape == (V, H) and b.grad.shape == (V,)


def test_linear_cross_entropy_stats_and_module():
    x = kiln.randn(2, 5, 8)
    head = kiln.nn.LinearCrossEntropyLoss(8, 30, bias=True, z_loss=1e-4)
    t = kiln.randint(0, 30, (2, 5))
    loss = head(x, t)
    assert loss.shape == () and loss.requires_grad
    loss.backward()
    assert head.weight.grad.shape == (30, 8) and head.bias.grad.shape == (30,)
    r = F.linear_cross_entropy_with_stats(x, head.weight, t, head.bias, z_loss=1e-4)
    assert r.lse.shape == (2, 5) and r.lse.dtype is kiln.float32 and r.strategy in ("memory", "speed")
    assert abs(r.loss.item() - loss.item()) < 1e-5
    with pytest.raises(kiln.KilnError, match="linear_cross_entropy"):
        F.linear_cross_entropy(x, head.weight, t, strategy="fast")
    with pytest.raises(kiln.KilnError, match="linear_cross_entropy"):
        F.linear_cross_entropy(x, kiln.randn(30, 7), t)


def test_lce_never_materialises_logits():
    N, H, V = 256, 32, 4096
    x = kiln.randn(N, H, requires_grad=True)
    w = kiln.randn(V, H, requires_grad=True)
    t = kiln.randint(0, V, (N,))
    kiln.cpu.reset_peak_memory_stats()
    base = kiln.cpu.memory_allocated()
    F.linear_cross_entropy(x, w, t, strategy="memory", chunk_tokens=64, chunk_vocab=512).backward()
    assert kiln.cpu.max_memory_allocated() - base < N * V * 4 // 2


# ---- torch: parity with torch's unfused computation, and the autograd adapter ----

@pytest.mark.parametrize("opts", [{}, {"label_smoothing": 0.1}, {"reduction": "sum"}, {"reduction": "none"}])
def test_lce_matches_torch(opts):
    torch = pytest.importorskip("torch")
    N, H, V = 32, 24, 100
    x = torch.randn(N, H, dtype=torch.float64, requires_grad=True)
    w = (torch.randn(V, H, dtype=torch.float64) * 0.3).requires_grad_()
    t = torch.randint(0, V, (N,))
    t[0] = -100
    ref = torch.nn.functional.cross_entropy(x @ w.T, t, **opts)
    kx, kw = kiln.from_dlpack(x.detach()).requires_grad_(), kiln.from_dlpack(w.detach()).requires_grad_()
    out = F.linear_cross_entropy(kx, kw, kiln.from_dlpack(t), **opts)
    assert rel_error(out.detach().numpy(), ref.detach().numpy()) < 1e-10
    g = torch.randn_like(ref)
    ref.backward(g)
    out.backward(kiln.from_dlpack(g))
    assert rel_error(kx.grad.numpy(), x.grad.numpy()) < 1e-10
    assert rel_error(kw.grad.numpy(), w.grad.numpy()) < 1e-10


# The kiln.torch adapter (CPU and CUDA, every option): test_torch_lce.py.
