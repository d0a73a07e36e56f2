"""The traced score_mod / mask_mod vocabulary (abs, sign, clamp, minimum / maximum, where, exp, log,
tanh, sigmoid, floor, % and // on indices and floats, conversions, comparisons and & | ~, captured
tensors indexed by computed indices): each mod's forward and gradients (q and a captured bias)
against a float64 NumPy reference (gradients by central differences of it), and, where torch is
importable, the same Python function run by PyTorch's flex_attention (forward; its CPU backward is
not implemented) and by torch autograd on dense scores (gradients). Unsupported operations name
themselves and the mod's line."""
import inspect
import math
import re

import numpy as np
import pytest

import kiln
from kiln.nn.attention.flex_attention import create_block_mask, flex_attention

B, H, L, E = 1, 2, 12, 4
SCALE = 1 / math.sqrt(E)


def np_attention(q, k, v, score_fn, mask_fn, bias):
    """Dense float64 attention; score_fn(s, b, h, qi, kv, bias) and mask_fn(b, h, qi, kv) on NumPy grids."""
    s = np.einsum("bhle,bhse->bhls", q, k) * SCALE
    b, h, qi, kv = np.ix_(np.arange(B), np.arange(H), np.arange(L), np.arange(L))
    if score_fn is not None:
        s = score_fn(s, b, h, qi, kv, bias)
    if mask_fn is not None:
        s = np.where(np.broadcast_to(mask_fn(b, h, qi, kv), s.shape), s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))
    p = p / np.maximum(p.sum(-1, keepdims=True), 1e-300)
    return np.einsum("bhls,bhse->bhle", p, v)


def numeric_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        up = f()
        x[i] = old - eps
        down = f()
        x[i] = old
        g[i] = (up - down) / (2 * eps)
    return g


# name -> (score_mod written as a PyTorch user writes it (tensor methods and operators), its NumPy
# form, mask_mod, its NumPy form). The mods run unchanged on kiln Exprs and on torch tensors.
def _bias_index(qi, kv):
    return np.minimum(np.abs(qi - kv), 7)


CASES = {
    "abs": (lambda s, b, h, qi, kv, t: s - 0.25 * (qi - kv).abs(),
            lambda s, b, h, qi, kv, t: s - 0.25 * np.abs(qi - kv), None, None),
    "sign": (lambda s, b, h, qi, kv, t: s + 0.3 * (qi - kv).sign() + 0.2 * s.sign(),
             lambda s, b, h, qi, kv, t: s + 0.3 * np.sign(qi - kv) + 0.2 * np.sign(s), None, None),
    "clamp": (lambda s, b, h, qi, kv, t: s.clamp(-0.6, 0.6) + 0.1 * (qi - kv).clamp(-3, 3) + s.clamp(min=0.1),
              lambda s, b, h, qi, kv, t: np.clip(s, -0.6, 0.6) + 0.1 * np.clip(qi - kv, -3, 3) + np.maximum(s, 0.1),
              None, None),
    "minimum_maximum": (lambda s, b, h, qi, kv, t: s.minimum(t[h, kv % 8]) + s.maximum(0.5 * s + 0.1),
                        lambda s, b, h, qi, kv, t: np.minimum(s, t[h, kv % 8]) + np.maximum(s, 0.5 * s + 0.1),
                        None, None),
    "where": (lambda s, b, h, qi, kv, t: s.where(qi >= kv, s * 0.5 - 1.0),
              lambda s, b, h, qi, kv, t: np.where(qi >= kv, s, s * 0.5 - 1.0), None, None),
    "exp_log": (lambda s, b, h, qi, kv, t: s + (-0.1 * (qi - kv).abs().float()).exp() + (1.0 + s * s).log(),
                lambda s, b, h, qi, kv, t: s + np.exp(-0.1 * np.abs(qi - kv)) + np.log(1.0 + s * s), None, None),
    "tanh_sigmoid": (lambda s, b, h, qi, kv, t: 2.0 * (s / 2.0).tanh() + s * s.sigmoid(),
                     lambda s, b, h, qi, kv, t: 2.0 * np.tanh(s / 2.0) + s / (1 + np.exp(-s)), None, None),
    "floor_remainder": (lambda s, b, h, qi, kv, t: s + 0.1 * ((qi // 3) % 2).float() + 0.05 * (s * 2.0).floor()
                        + (kv.float() * 0.37) % 1.0 + 0.2 * (s % 0.75) + 0.1 * (s / 0.5).floor(),
                        lambda s, b, h, qi, kv, t: s + 0.1 * ((qi // 3) % 2) + 0.05 * np.floor(s * 2.0)
                        + np.mod(kv * 0.37, 1.0) + 0.2 * np.mod(s, 0.75) + 0.1 * np.floor_divide(s, 0.5),
                        None, None),
    "captured_by_computed_index": (lambda s, b, h, qi, kv, t: s + t[h, (qi - kv).abs().clamp(max=7)],
                                   lambda s, b, h, qi, kv, t: s + t[h, _bias_index(qi, kv)], None, None),
    "conversions": (lambda s, b, h, qi, kv, t: s + (qi > kv).float() * 0.3 - (s * 3.0).long().float() * 0.01,
                    lambda s, b, h, qi, kv, t: s + (qi > kv) * 0.3 - np.trunc(s * 3.0) * 0.01, None, None),
    "mask_bool_ops": (None, None,
                      lambda b, h, qi, kv: ((qi >= kv) & ~((qi - kv) > 5)) | (kv < 2) | (qi - kv).eq(-1),
                      lambda b, h, qi, kv: ((qi >= kv) & ~((qi - kv) > 5)) | (kv < 2) | (qi - kv == -1)),
    "mask_natten": (None, None,
                    lambda b, h, qi, kv: ((qi % 4).clamp(1, 2) - kv % 4).abs() + ((qi // 4).clamp(1, 1)
                                                                                  - kv // 4).abs() <= 2,
                    lambda b, h, qi, kv: np.abs(np.clip(qi % 4, 1, 2) - kv % 4) + np.abs(np.clip(qi // 4, 1, 1)
                                                                                         - kv // 4) <= 2),
}


def _inputs(seed):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((B, H, L, E)) for _ in range(3))
    bias = rng.standard_normal((H, 8)) * 0.5
    return q, k, v, bias


def _kiln_run(q, k, v, bias, score, mask, dout):
    kq, kk, kvv = (kiln.tensor(a, requires_grad=True) for a in (q, k, v))
    kb = kiln.tensor(bias, requires_grad=True)
    score_mod = None if score is None else (lambda s, b, h, qi, kv: score(s, b, h, qi, kv, kb))
    bm = create_block_mask(mask, None, None, L, L, BLOCK_SIZE=4) if mask is not None else None
    out = flex_attention(kq, kk, kvv, score_mod=score_mod, block_mask=bm)
    out.backward(kiln.tensor(dout))
    gb = kb.grad.numpy() if kb.grad is not None else np.zeros_like(bias)
    return out.detach().numpy(), kq.grad.numpy(), gb


@pytest.mark.parametrize("name", list(CASES))
def test_mod_matches_numpy(name):
    score, np_score, mask, np_mask = CASES[name]
    q, k, v, bias = _inputs(1)
    dout = np.random.default_rng(2).standard_normal((B, H, L, E))
    out, gq, gb = _kiln_run(q, k, v, bias, score, mask, dout)
    ref = np_attention(q, k, v, np_score, np_mask, bias)
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-10)
    loss = lambda: float((np_attention(q, k, v, np_score, np_mask, bias) * dout).sum())  # noqa: E731
    np.testing.assert_allclose(gq, numeric_grad(loss, q), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gb, numeric_grad(loss, bias), rtol=1e-5, atol=1e-6)


def _torch_dense(q, k, v, score, mask, bias):
    import torch

    s = (q @ k.transpose(-1, -2)) * SCALE
    b, h = torch.arange(B).view(B, 1, 1, 1), torch.arange(H).view(1, H, 1, 1)
    qi, kv = torch.arange(L).view(1, 1, L, 1), torch.arange(L).view(1, 1, 1, L)
    if score is not None:
        s = score(s, b, h, qi, kv, bias)
    if mask is not None:
        s = s.masked_fill(~mask(b, h, qi, kv).expand_as(s), float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("name", list(CASES))
def test_mod_matches_torch(name):
    torch = pytest.importorskip("torch", reason="torch is not installed: checked against NumPy only")
    from torch.nn.attention import flex_attention as tfa
    import kiln.torch as kt

    score, _, mask, _ = CASES[name]
    q, k, v, bias = (torch.tensor(a) for a in _inputs(3))
    # PyTorch's flex_attention (forward on the CPU) and kiln's, on the same Python mods.
    tbm = tfa.create_block_mask(mask, None, None, L, L, device="cpu", BLOCK_SIZE=4) if mask is not None else None
    t_score = None if score is None else (lambda s, b, h, qi, kv: score(s, b, h, qi, kv, bias))
    with torch.no_grad():
        ref = tfa.flex_attention(q, k, v, score_mod=t_score, block_mask=tbm)
    kbm = create_block_mask(mask, None, None, L, L, BLOCK_SIZE=4) if mask is not None else None
    qg, kg, vg, bg = (t.clone().requires_grad_(True) for t in (q, k, v, bias))
    k_score = None if score is None else (lambda s, b, h, qi, kv: score(s, b, h, qi, kv, bg))
    out = kt.flex_attention(qg, kg, vg, score_mod=k_score, block_mask=kbm)
    # torch evaluates int index arithmetic promoted to float32 (its default dtype: 0.3 * sign(qi - kv)
    # is a float32 term) where kiln keeps the attention's float64: agreement to float32 resolution.
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-7)
    # Gradients: torch autograd through the same mod on dense scores.
    dout = torch.randn(out.shape, dtype=torch.float64)
    grads = torch.autograd.grad(out, [qg, bg] if score is not None else [qg], dout, allow_unused=True)
    rq, rb = (t.clone().requires_grad_(True) for t in (q, bias))
    dense = _torch_dense(rq, k, v, score, mask, rb)
    ref_grads = torch.autograd.grad(dense, [rq, rb] if score is not None else [rq], dout, allow_unused=True)
    for g, r in zip(grads, ref_grads):
        if r is None:
            assert g is None or float(g.abs().max()) == 0.0
        else:
            torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-7)


def _line_of(fn, text):
    src, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(src) if text in line)


def test_unsupported_method_names_itself_and_the_line():
    def mod(score, b, h, q_idx, kv_idx):
        return score + (q_idx - kv_idx).cos()  # no cos in the IR

    with pytest.raises(AttributeError, match=rf"'cos' cannot be traced.*{re.escape(__file__)}:{_line_of(mod, '.cos()')}"):
        flex_attention(kiln.randn(1, 1, 8, 4), kiln.randn(1, 1, 8, 4), kiln.randn(1, 1, 8, 4), score_mod=mod)


def test_kind_error_names_the_line():
    def mask(b, h, q_idx, kv_idx):
        return q_idx & kv_idx  # bitwise & on ints is not in the IR

    with pytest.raises(kiln.KilnError, match=rf"operator & needs bools.*at {re.escape(__file__)}:{_line_of(mask, 'q_idx & kv_idx')}"):
        create_block_mask(mask, None, None, 8, 8)


def test_unsupported_torch_function_names_itself_and_the_line():
    torch = pytest.importorskip("torch")

    def mod(score, b, h, q_idx, kv_idx):
        return torch.cos(score)

    with pytest.raises(kiln.KilnError, match=rf"torch.cos cannot be traced.*at {re.escape(__file__)}:{_line_of(mod, 'torch.cos')}"):
        flex_attention(kiln.randn(1, 1, 8, 4), kiln.randn(1, 1, 8, 4), kiln.randn(1, 1, 8, 4), score_mod=mod)


def test_torch_functions_trace():
    torch = pytest.importorskip("torch")
    q, k, v, bias = _inputs(4)
    tb = torch.tensor(bias)

    def mod(s, b, h, qi, kv):
        return (torch.clamp(s, min=-0.5) + torch.sign(qi - kv) * 0.1 + torch.sigmoid(s) + torch.floor(s)
                + torch.remainder(kv, 3) * 0.1 + torch.where(qi > kv, tb[h, kv % 8], torch.zeros_like(s))
                + torch.min(s, torch.full_like(s, 0.3)) + torch.div(qi, 4, rounding_mode="floor") * 0.05
                + (s // 0.5) * 0.1)

    def np_mod(s, b, h, qi, kv, t):
        return (np.maximum(s, -0.5) + np.sign(qi - kv) * 0.1 + 1 / (1 + np.exp(-s)) + np.floor(s)
                + np.mod(kv, 3) * 0.1 + np.where(qi > kv, t[h, kv % 8], 0.0) + np.minimum(s, 0.3)
                + (qi // 4) * 0.05 + np.floor_divide(s, 0.5) * 0.1)

    out = flex_attention(*(kiln.tensor(a) for a in (q, k, v)), score_mod=mod)
    np.testing.assert_allclose(out.numpy(), np_attention(q, k, v, np_mod, None, bias), rtol=1e-10, atol=1e-10)
