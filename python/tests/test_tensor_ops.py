"""The everyday tensor functions and methods (min/argmin, var/std/norm, chunk/split/unbind, masks,
boolean-mask indexing, in-place updates, topk/sort, einsum, isclose, Generator, multinomial,
uint16/uint32) against NumPy float64 references, and against torch where it is importable."""
import math

import numpy as np
import pytest

import kiln
from conftest import rel_error, requires_cuda


def randn(*shape, dtype=kiln.float64):
    t = kiln.randn(*shape, dtype=dtype)
    return t, t.double().numpy()


def finite_difference_grad(f, xn, eps=1e-6):
    """d f(x).sum() / dx by central differences in float64."""
    g = np.zeros_like(xn)
    for i in np.ndindex(xn.shape):
        d = np.zeros_like(xn)
        d[i] = eps
        with kiln.no_grad():
            g[i] = (f(kiln.tensor(xn + d)).sum().item() - f(kiln.tensor(xn - d)).sum().item()) / (2 * eps)
    return g


def check_grad(f, shape, tol=1e-6):
    x, xn = randn(*shape)
    x.requires_grad_()
    f(x).sum().backward()
    assert rel_error(x.grad.numpy(), finite_difference_grad(f, xn)) < tol


def test_min_argmin_and_max_named_results():
    x, xn = randn(4, 6)
    v, i = kiln.min(x, 1)
    assert np.array_equal(v.numpy(), xn.min(1)) and np.array_equal(i.numpy(), xn.argmin(1))
    r = x.min(dim=0, keepdim=True)
    assert r.values.shape == (1, 6) and np.array_equal(r.indices.numpy()[0], xn.argmin(0))
    assert x.min().item() == xn.min() and x.argmin().item() == xn.argmin()
    assert np.array_equal(x.argmin(1).numpy(), xn.argmin(1))
    y, yn = randn(4, 6)
    assert np.array_equal(kiln.min(x, y).numpy(), np.minimum(xn, yn))
    check_grad(lambda t: t.min(1).values, (3, 5))


@pytest.mark.parametrize("dim,correction", [(None, 1), (1, 0), ((0, 1), 1), (0, 2)])
def test_var_std(dim, correction):
    x, xn = randn(5, 7)
    ddof = correction
    axis = dim if not isinstance(dim, tuple) else tuple(dim)
    assert rel_error(kiln.var(x, dim, correction=correction).numpy(), np.var(xn, axis=axis, ddof=ddof)) < 1e-12
    assert rel_error(x.std(dim, correction=correction).numpy(), np.std(xn, axis=axis, ddof=ddof)) < 1e-12
    assert x.var(dim, keepdim=True, correction=correction).ndim == 2


def test_var_unbiased_forms_and_grad():
    x, xn = randn(6, 3)
    assert rel_error(x.var(unbiased=False).numpy(), np.var(xn)) < 1e-12
    assert rel_error(kiln.var(x, False).numpy(), np.var(xn)) < 1e-12  # torch.var(x, unbiased)
    assert rel_error(x.std(1, True, True).numpy(), np.std(xn, 1, ddof=1, keepdims=True)) < 1e-12
    with pytest.raises(TypeError):
        x.var(unbiased=True, correction=0)
    b = x.to(kiln.bfloat16)
    assert b.var(1).dtype is kiln.bfloat16 and rel_error(b.var(1).double().numpy(), np.var(xn, 1, ddof=1)) < 2e-2
    check_grad(lambda t: t.var(1), (3, 4))
    check_grad(lambda t: t.std(0), (4, 3))


@pytest.mark.parametrize("p", [2, 1, 3, 0.5, math.inf, -math.inf, 0, "fro"])
def test_norm(p):
    x, xn = randn(4, 5)
    ord_ = 2 if p == "fro" else p
    ref = np.linalg.norm(xn, ord=ord_, axis=1)
    assert rel_error(x.norm(p, dim=1).numpy(), ref) < 1e-12
    assert rel_error(kiln.norm(x, p).numpy(), np.linalg.norm(xn.ravel(), ord=ord_)) < 1e-12
    if p not in (0, -math.inf):
        check_grad(lambda t: t.norm(p, dim=1), (3, 4))


def test_norm_zero_gradient_is_zero():
    z = kiln.zeros(2, 3, dtype=kiln.float64, requires_grad=True)
    z.norm(dim=1).sum().backward()
    assert np.array_equal(z.grad.numpy(), np.zeros((2, 3)))


def test_chunk_split_unbind():
    x = kiln.arange(20).reshape(4, 5)
    xn = np.arange(20).reshape(4, 5)
    parts = x.chunk(3, dim=1)
    assert isinstance(parts, tuple) and [p.shape for p in parts] == [(4, 2), (4, 2), (4, 1)]
    assert np.array_equal(parts[1].numpy(), xn[:, 2:4])
    assert [p.shape[0] for p in kiln.split(x, [1, 3])] == [1, 3]
    assert [p.shape[1] for p in x.split(2, 1)] == [2, 2, 1]
    rows = x.unbind()
    assert len(rows) == 4 and np.array_equal(rows[2].numpy(), xn[2])
    assert np.array_equal(kiln.unbind(x, 1)[4].numpy(), xn[:, 4])
    with pytest.raises(kiln.KilnError):
        kiln.split(x, [1, 2])


def test_masked_fill_tril_triu():
    x, xn = randn(3, 4)
    mask = x > 0
    assert np.array_equal(x.masked_fill(mask, -1.5).numpy(), np.where(xn > 0, -1.5, xn))
    assert np.array_equal(kiln.masked_fill(x, mask, kiln.tensor(2.0, dtype=kiln.float64)).numpy(),
                          np.where(xn > 0, 2.0, xn))
    y = x.clone()
    assert y.masked_fill_(mask, 0.0) is y and np.array_equal(y.numpy(), np.where(xn > 0, 0, xn))
    for k in (-1, 0, 2):
        assert np.array_equal(x.tril(k).numpy(), np.tril(xn, k))
        assert np.array_equal(kiln.triu(x, k).numpy(), np.triu(xn, k))
    check_grad(lambda t: t.tril(), (3, 3))
    check_grad(lambda t: t.masked_fill(t > 0.3, 0.0) * 2, (3, 3))
    with pytest.raises(kiln.KilnError, match="bool mask"):
        x.masked_fill(kiln.ones(3, 4), 1.0)


def test_predicates_and_isclose():
    xn = np.array([1.0, np.nan, np.inf, -np.inf, 0.0])
    x = kiln.tensor(xn)
    for f, g in [(kiln.isnan, np.isnan), (kiln.isinf, np.isinf), (kiln.isfinite, np.isfinite)]:
        assert np.array_equal(f(x).numpy(), g(xn))
    assert np.array_equal(x.isnan().numpy(), np.isnan(xn))
    a = np.array([1.0, 1.0, np.nan, np.inf, 1.0, 100.0])
    b = np.array([1.0 + 1e-6, 1.1, np.nan, np.inf, -np.inf, 100.0005])
    for equal_nan in (False, True):
        got = kiln.isclose(kiln.tensor(a), kiln.tensor(b), equal_nan=equal_nan).numpy()
        assert np.array_equal(got, np.isclose(a, b, equal_nan=equal_nan))
    assert kiln.allclose(kiln.tensor(a[:2]), kiln.tensor(a[:2])) is True
    assert not kiln.allclose(kiln.tensor(a), kiln.tensor(b))
    assert kiln.tensor([1.0, 2.0]).allclose(kiln.tensor([1.0, 2.0 + 1e-9]))
    t = kiln.tensor([[True, False], [True, True]])
    assert np.array_equal(t.all(1).numpy(), [False, True]) and t.any().item() is True
    assert np.array_equal(kiln.logical_xor(t, kiln.tensor([True, True])).numpy(), [[False, True], [False, False]])
    assert np.array_equal(kiln.logical_not(t).numpy(), ~t.numpy())


def test_boolean_mask_indexing():
    x, xn = randn(3, 4, 2)
    mask = x[:, :, 0] > 0
    mn = mask.numpy()
    assert np.array_equal(x[mask].numpy(), xn[mn])
    assert np.array_equal(x[x > 0].numpy(), xn[xn > 0])
    assert np.array_equal(kiln.masked_select(x, x > 0).numpy(), xn[xn > 0])
    assert np.array_equal(kiln.nonzero(mask).numpy(), np.argwhere(mn))
    assert all(np.array_equal(a.numpy(), b) for a, b in zip(mask.nonzero(as_tuple=True), np.nonzero(mn)))
    y, yn = x.clone(), xn.copy()
    y[mask] = 0.5
    yn[mn] = 0.5
    assert np.array_equal(y.numpy(), yn)
    z, zn = x.clone(), xn.copy()
    k = int(mn.sum())
    z[mask] = kiln.arange(2 * k, dtype=kiln.float64).reshape(k, 2)
    zn[mn] = np.arange(2 * k).reshape(k, 2)
    assert np.array_equal(z.numpy(), zn)
    w, wn = x.clone(), xn.copy()
    w[w < 0] = kiln.tensor(7.0, dtype=kiln.float64)
    wn[wn < 0] = 7.0
    assert np.array_equal(w.numpy(), wn)
    x.requires_grad_()
    x[mask].sum().backward()
    assert np.array_equal(x.grad.numpy(), np.repeat(mn[:, :, None], 2, 2).astype(float))
    with pytest.raises(IndexError, match="shape of the mask"):
        x[kiln.ones(3, 5, dtype=kiln.bool)]


def test_inplace_updates():
    p, pn = randn(6)
    p, pn = p.abs() + 0.5, np.abs(pn) + 0.5
    a, an = randn(6)
    b, bn = randn(6)
    b, bn = b.abs() + 0.5, np.abs(bn) + 0.5
    cases = [(lambda t: t.sqrt_(), np.sqrt(pn)), (lambda t: t.addcmul_(a, b, value=0.5), pn + 0.5 * an * bn),
             (lambda t: t.addcdiv_(a, b, value=-2), pn - 2 * an / bn), (lambda t: t.lerp_(a, 0.25), pn + 0.25 * (an - pn)),
             (lambda t: t.lerp_(a, b), pn + bn * (an - pn)), (lambda t: t.clamp_(max=0.9), np.minimum(pn, 0.9)),
             (lambda t: t.clamp_(0.7, 0.9), np.clip(pn, 0.7, 0.9)), (lambda t: t.add_(a, alpha=3), pn + 3 * an),
             (lambda t: t.mul_(b), pn * bn)]
    for op, ref in cases:
        t = p.clone()
        assert op(t) is t
        assert rel_error(t.numpy(), ref) < 1e-15
    t = p.clone()
    assert t.add_(2.0, alpha=3) is t and t.sub_(1.0, alpha=0.5) is t and t.sub_(1.0) is t
    assert rel_error(t.numpy(), pn + 4.5) < 1e-15
    assert rel_error(p.add(2.0, alpha=3).numpy(), pn + 6) < 1e-15 and rel_error(p.sub(1.0, alpha=2).numpy(), pn - 2) < 1e-15
    leaf = kiln.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"\[sqrt_\]"):
        leaf.sqrt_()
    with pytest.raises(RuntimeError, match="normal_"):
        leaf.normal_()
    with kiln.no_grad():
        leaf.mul_(3.0).sqrt_()
    assert rel_error(leaf.detach().numpy(), np.sqrt([3.0, 3.0])) < 1e-7


def test_data_property():
    w = kiln.ones(3, requires_grad=True)
    assert not w.data.requires_grad
    w.data.mul_(2.0)  # the optimizer idiom: writes reach w, no graph is recorded
    assert np.array_equal(w.detach().numpy(), [2.0, 2.0, 2.0]) and w.requires_grad
    w.data = kiln.zeros(2, 2)
    assert w.shape == (2, 2) and w.requires_grad and w.is_leaf


@pytest.mark.parametrize("largest", [True, False])
def test_topk_sort(largest):
    x, xn = randn(5, 8)
    v, i = x.topk(3, dim=1, largest=largest)
    order = np.argsort(-xn if largest else xn, axis=1, kind="stable")[:, :3]
    assert np.array_equal(i.numpy(), order) and np.array_equal(v.numpy(), np.take_along_axis(xn, order, 1))
    r = kiln.topk(x, 2, dim=0)
    assert r.values.shape == (2, 8) and r.indices.dtype is kiln.int64
    s = x.sort(dim=0, descending=not largest)
    assert np.array_equal(s.indices.numpy(), np.argsort(xn if largest else -xn, axis=0, kind="stable"))
    assert np.array_equal(kiln.argsort(x, 1).numpy(), np.argsort(xn, 1, kind="stable"))
    check_grad(lambda t: t.topk(2, largest=largest).values, (3, 5))


@pytest.mark.parametrize("eq,shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 2)]), ("ij->ji", [(3, 4)]),
    ("ii->i", [(4, 4)]), ("ii", [(4, 4)]), ("ij->", [(3, 4)]), ("i,j->ij", [(3,), (4,)]), ("i,i->", [(5,), (5,)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]), ("...ij,...jk->...ik", [(2, 3, 4), (4, 2)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]), ("ij,jk", [(2, 3), (3, 4)]), ("bij->bj", [(2, 3, 4)]),
])
def test_einsum_matches_numpy(eq, shapes):
    ts = [randn(*s) for s in shapes]
    got = kiln.einsum(eq, *[t for t, _ in ts])
    ref = np.einsum(eq, *[n for _, n in ts])
    assert got.shape == ref.shape and rel_error(got.numpy(), ref) < 1e-12
    assert rel_error(kiln.einsum(eq, [t for t, _ in ts]).numpy(), ref) < 1e-12
    if len(shapes) == 2:
        other = ts[1][0]
        check_grad(lambda t: kiln.einsum(eq, t, other), shapes[0])


def test_einsum_integer_operands():
    a, b = np.arange(6).reshape(2, 3), np.arange(12).reshape(3, 4)
    got = kiln.einsum("ij,jk->ik", kiln.tensor(a), kiln.tensor(b))
    assert got.dtype is kiln.int64 and np.array_equal(got.numpy(), a @ b)


def test_einsum_errors():
    a = kiln.randn(2, 3)
    with pytest.raises(kiln.KilnError, match="'z'"):
        kiln.einsum("ij->iz", a)
    with pytest.raises(kiln.KilnError, match="number of subscripts"):
        kiln.einsum("ijk->i", a)
    with pytest.raises(kiln.KilnError, match="'j'"):
        kiln.einsum("ij,jk->ik", a, a)


def test_generator_and_random_functions():
    g = kiln.Generator().manual_seed(3)
    assert isinstance(g, kiln.Generator) and g.initial_seed() == 3 and g.device == kiln.device("cpu")
    a = kiln.rand(4, 5, generator=g)
    b = kiln.randn((4, 5), generator=g, dtype=kiln.float64)
    c = kiln.randint(0, 10, (100,), generator=g)
    d = kiln.randint(7, (3,), generator=g)
    g.manual_seed(3)
    assert np.array_equal(kiln.rand(4, 5, generator=g).numpy(), a.numpy())
    assert np.array_equal(kiln.randn(4, 5, generator=g, dtype=kiln.float64).numpy(), b.numpy())
    assert np.array_equal(kiln.randint(0, 10, (100,), generator=g).numpy(), c.numpy())
    assert d.shape == (3,) and 0 <= d.min().item() and d.max().item() < 7
    state = g.get_state()
    x = kiln.empty(1000, dtype=kiln.float64).normal_(2.0, 3.0, generator=g)
    g.set_state(state)
    assert np.array_equal(kiln.empty(1000, dtype=kiln.float64).normal_(2.0, 3.0, generator=g).numpy(), x.numpy())
    assert abs(x.mean().item() - 2.0) < 0.4 and abs(x.std().item() - 3.0) < 0.3
    u = kiln.empty(1000).uniform_(-1, 3, generator=g)
    assert -1 <= u.min().item() and u.max().item() < 3
    assert kiln.rand(3, generator=kiln.Generator().manual_seed(4)).tolist() != a[0, :3].tolist()


def test_multinomial():
    g = kiln.Generator().manual_seed(0)
    w = kiln.tensor([1.0, 0.0, 3.0, 4.0])
    s = kiln.multinomial(w, 20000, replacement=True, generator=g)
    freq = np.bincount(s.numpy(), minlength=4) / 20000
    assert np.abs(freq - np.array([1, 0, 3, 4]) / 8).max() < 0.015
    rows = w.expand(5, 4).multinomial(3, generator=g)
    assert rows.shape == (5, 3) and rows.dtype is kiln.int64
    for r in rows.tolist():
        assert len(set(r)) == 3 and 1 not in r
    with pytest.raises(kiln.KilnError, match="not enough"):
        kiln.multinomial(w, 4)
    g.manual_seed(0)
    assert np.array_equal(kiln.multinomial(w, 20000, True, generator=g).numpy(), s.numpy())


def test_uint16_uint32(tmp_path):
    assert kiln.uint16.itemsize == 2 and kiln.uint32.itemsize == 4 and not kiln.uint32.is_floating_point
    a = kiln.tensor([1, 40000, 65535], dtype=kiln.uint16)
    assert repr(a.dtype) == "kiln.uint16" and a.tolist() == [1, 40000, 65535]
    assert (a + kiln.tensor([1, 2, 0], dtype=kiln.uint16)).tolist() == [2, 40002, 65535]
    assert (a * 1).dtype is kiln.uint16
    assert (a - kiln.tensor([2, 0, 1], dtype=kiln.uint16)).tolist() == [65535, 40000, 65534]  # wraps, as uint8 does
    assert (a > 2).tolist() == [False, True, True] and a.sum().item() == 105536
    b = kiln.tensor(np.array([4000000000, 5], dtype=np.uint32))
    assert b.dtype is kiln.uint32 and b.numpy().dtype == np.uint32 and b.max().item() == 4000000000
    assert b.long().tolist() == [4000000000, 5] and b.to(kiln.float64).tolist() == [4e9, 5.0]
    assert (a[:2].to(kiln.uint32) + b).dtype is kiln.uint32
    assert (a + kiln.tensor([1, 1, 1], dtype=kiln.int8)).dtype is kiln.int32
    kiln.save({"a": a, "b": b}, tmp_path / "u.safetensors")
    back = kiln.load(tmp_path / "u.safetensors")
    assert back["a"].dtype is kiln.uint16 and back["a"].tolist() == a.tolist()
    assert back["b"].dtype is kiln.uint32 and back["b"].tolist() == b.tolist()
    header = open(tmp_path / "u.safetensors", "rb").read(200)
    assert b'"U16"' in header and b'"U32"' in header


def test_against_torch_where_installed():
    torch = pytest.importorskip("torch")
    x, xn = randn(4, 6)
    tx = torch.from_numpy(xn)
    assert np.allclose(x.var(1).numpy(), tx.var(1).numpy(), rtol=1e-12)
    assert np.allclose(x.std(correction=0).numpy(), tx.std(correction=0).numpy(), rtol=1e-12)
    assert np.allclose(x.norm(3, dim=0).numpy(), tx.norm(3, dim=0).numpy(), rtol=1e-12)
    assert np.array_equal(x.tril(-1).numpy(), tx.tril(-1).numpy())
    assert np.array_equal(x.topk(3).indices.numpy(), tx.topk(3).indices.numpy())
    assert np.array_equal(x.min(0).indices.numpy(), tx.min(0).indices.numpy())
    assert np.array_equal(x[x > 0.5].numpy(), tx[tx > 0.5].numpy())
    assert [c.shape for c in x.chunk(4, 1)] == [tuple(c.shape) for c in tx.chunk(4, 1)]
    a, an = randn(3, 4, 5)
    assert np.allclose(kiln.einsum("bij,bkj->bik", a, a).numpy(), torch.einsum("bij,bkj->bik", *(torch.from_numpy(an),) * 2))
    y = x.clone().requires_grad_()
    ty = tx.clone().requires_grad_()
    (y.norm(dim=1) * y.std(0).sum()).sum().backward()
    (ty.norm(dim=1) * ty.std(0).sum()).sum().backward()
    assert rel_error(y.grad.numpy(), ty.grad.numpy()) < 1e-12


def test_readme_snippet_runs():
    import os
    import re
    readme = os.path.join(os.path.dirname(__file__), "..", "README.md")
    text = open(readme).read().split("## Everyday tensor functions", 1)[1]
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})


def test_max_named_result_and_elementwise_form():
    x, xn = randn(3, 5)
    r = x.max(1)
    assert np.array_equal(r.values.numpy(), xn.max(1)) and np.array_equal(r.indices.numpy(), xn.argmax(1))
    v, i = kiln.max(x, dim=0, keepdim=True)
    assert v.shape == (1, 5) and np.array_equal(i.numpy()[0], xn.argmax(0))
    y, yn = randn(3, 5)
    assert np.array_equal(x.max(y).numpy(), np.maximum(xn, yn)) and x.max().item() == xn.max()


def test_generator_seeds_are_unsigned_64_bit():
    g = kiln.Generator()
    assert g.seed() >= 0 and g.initial_seed() >= 0
    assert g.manual_seed(-1).initial_seed() == 2**64 - 1
    assert repr(g) == "kiln.Generator(device='cpu')"
    a = kiln.rand(5, generator=g)
    assert np.array_equal(kiln.rand(5, generator=kiln.Generator().manual_seed(2**64 - 1)).numpy(), a.numpy())


def test_randperm():
    g = kiln.Generator().manual_seed(9)
    p = kiln.randperm(50, generator=g)
    assert p.dtype is kiln.int64 and sorted(p.tolist()) == list(range(50)) and p.tolist() != list(range(50))
    assert kiln.randperm(50, generator=kiln.Generator().manual_seed(9)).tolist() == p.tolist()
    assert kiln.randperm(4, dtype=kiln.float32).dtype is kiln.float32


def test_uint_dlpack_with_torch():
    torch = pytest.importorskip("torch")
    k = kiln.tensor([1, 65535, 3], dtype=kiln.uint16)
    t = torch.from_dlpack(k)
    assert t.dtype == torch.uint16 and t.tolist() == [1, 65535, 3]
    back = kiln.from_dlpack(torch.tensor([1, 4000000000], dtype=torch.uint32))
    assert back.dtype is kiln.uint32 and back.tolist() == [1, 4000000000]


@requires_cuda
def test_cuda_matches_cpu():
    x = kiln.randn(6, 9)
    xc = x.cuda()
    mask = x > 0
    assert np.array_equal(xc[mask.cuda()].cpu().numpy(), x[mask].numpy())
    assert np.array_equal(xc.topk(3).indices.cpu().numpy(), x.topk(3).indices.numpy())
    assert np.array_equal(xc.argmin(1).cpu().numpy(), x.argmin(1).numpy())
    assert rel_error(xc.var(1).cpu().numpy(), x.var(1).numpy()) < 1e-5
    assert rel_error(xc.norm(dim=0).cpu().numpy(), x.norm(dim=0).numpy()) < 1e-5
    assert rel_error(kiln.einsum("ij,kj->ik", xc, xc).cpu().numpy(), kiln.einsum("ij,kj->ik", x, x).numpy()) < 1e-5
    y = xc.clone()
    y[y < 0] = 0.0
    assert np.array_equal(y.cpu().numpy(), np.maximum(x.numpy(), 0))
    g = kiln.Generator("cuda").manual_seed(1)
    h = kiln.Generator().manual_seed(1)
    assert np.array_equal(kiln.rand(16, generator=g, device="cuda").cpu().numpy(), kiln.rand(16, generator=h).numpy())
    assert kiln.multinomial(kiln.ones(5, device="cuda"), 5, generator=g).device == kiln.device("cuda:0")
    u = kiln.tensor([1, 2, 65535], dtype=kiln.uint16).cuda()
    assert (u + u).cpu().tolist() == [2, 4, 65534]


def test_var_mean_std_mean_and_linalg_vector_norm():
    x, xn = randn(4, 5)
    v, m = kiln.var_mean(x, 1)
    assert rel_error(v.numpy(), np.var(xn, 1, ddof=1)) < 1e-12 and rel_error(m.numpy(), xn.mean(1)) < 1e-12
    s, m = x.std_mean(0, correction=0, keepdim=True)
    assert s.shape == (1, 5) and rel_error(s.numpy(), np.std(xn, 0, keepdims=True)) < 1e-12
    assert rel_error(kiln.linalg.vector_norm(x, 3, dim=(0, 1)).numpy(), np.sum(np.abs(xn) ** 3) ** (1 / 3)) < 1e-12
    assert rel_error(kiln.linalg.vector_norm(x, math.inf, dim=1).numpy(), np.abs(xn).max(1)) < 1e-12
