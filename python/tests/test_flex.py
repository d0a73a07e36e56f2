"""FlexAttention from Python: mods traced from lambdas, built-in mods, block masks, and the output
and gradients against a dense NumPy float64 reference."""
import numpy as np
import pytest

import kiln
from conftest import rel_error
from kiln.nn.attention.flex_attention import (BlockMask, Expr, MaskMod, alibi, and_masks, causal_mask,
                                              create_block_mask, document_mask, flex_attention, or_masks,
                                              sliding_window_mask, softcap)


def dense_reference(q, k, v, score_fn=None, mask_fn=None, scale=None):
    B, H, L, E = q.shape
    S = k.shape[2]
    scale = scale or 1 / np.sqrt(E)
    s = np.einsum("bhle,bhse->bhls", q, k) * scale
    b, h, qi, kv = np.meshgrid(np.arange(B), np.arange(H), np.arange(L), np.arange(S), indexing="ij")
    if score_fn is not None:
        s = score_fn(s, b, h, qi, kv)
    if mask_fn is not None:
        s = np.where(mask_fn(b, h, qi, kv), s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))
    denom = p.sum(-1, keepdims=True)
    return np.einsum("bhls,bhse->bhle", p / np.where(denom > 0, denom, 1), v)


def qkv(B=1, H=2, L=96, E=16, dtype=kiln.float64):
    return [kiln.randn(B, H, L, E, dtype=dtype) for _ in range(3)]


def np_(t):
    return t.detach().double().numpy()


def test_tracing_builds_ir():
    m = MaskMod(lambda b, h, q, kv: (q >= kv) & (q - kv < 8))
    assert repr(m) == "MaskMod(((q_idx >= kv_idx) & ((q_idx - kv_idx) < 8)))"
    m2 = MaskMod(lambda b, h, q, kv: q // 32 == kv // 32)
    assert "q_idx" in repr(m2)
    score, b, h, q, kv = kiln._C._flex_leaves()
    assert isinstance(q, Expr) and q.kind == "int" and score.kind == "float"
    assert (q / 2).kind == "float" and (q // 2).kind == "int" and (q < kv).kind == "bool"
    assert (2 - q).kind == "int" and (score * 0.5).kind == "float"


def test_control_flow_error_names_the_line():
    def bad(b, h, q, kv):
        if q > kv:  # data-dependent: cannot be traced
            return True
        return False

    with pytest.raises(kiln.KilnError, match=r"test_flex.py:\d+.*control flow"):
        create_block_mask(bad, 1, 1, 128, 128)
    with pytest.raises(kiln.KilnError, match="and / or"):
        MaskMod(lambda b, h, q, kv: q >= kv and q < 5)
    with pytest.raises(kiln.KilnError, match="bool"):
        MaskMod(lambda b, h, q, kv: q + kv)  # not a bool


@pytest.mark.parametrize("case", ["causal", "sliding", "document", "alibi", "softcap", "bias", "lambda_mix"])
def test_flex_attention_matches_dense(case):
    B, H, L, E = 1, 2, 96, 16
    q, k, v = qkv(B, H, L, E)
    docs = kiln.tensor([0] * 40 + [1] * 30 + [2] * 26)
    slopes = kiln.tensor([0.5, 0.25], dtype=kiln.float64)
    bias = kiln.randn(H, 2 * L - 1, dtype=kiln.float64, requires_grad=True)
    dn = docs.numpy()
    cases = {
        "causal": (None, causal_mask(), None, lambda b, h, qi, kv: qi >= kv),
        "sliding": (None, sliding_window_mask(17), None, lambda b, h, qi, kv: (qi >= kv) & (qi - kv < 17)),
        "document": (None, and_masks(document_mask(docs), causal_mask()), None,
                     lambda b, h, qi, kv: (dn[qi] == dn[kv]) & (qi >= kv)),
        "alibi": (alibi(slopes), causal_mask(), lambda s, b, h, qi, kv: s + slopes.numpy()[h] * (kv - qi),
                  lambda b, h, qi, kv: qi >= kv),
        "softcap": (softcap(2.0), None, lambda s, b, h, qi, kv: 2.0 * np.tanh(s / 2.0), None),
        "bias": (lambda s, b, h, qi, kv: s + bias[h][qi - kv + L - 1], None,
                 lambda s, b, h, qi, kv: s + np_(bias)[h, qi - kv + L - 1], None),
        "lambda_mix": (lambda s, b, h, qi, kv: kiln.where(qi - kv < 4, s * 2, s),
                       or_masks(lambda b, h, qi, kv: kv == 0, sliding_window_mask(8)),
                       lambda s, b, h, qi, kv: np.where(qi - kv < 4, s * 2, s),
                       lambda b, h, qi, kv: (kv == 0) | ((qi >= kv) & (qi - kv < 8))),
    }
    score_mod, mask_mod, score_ref, mask_ref = cases[case]
    bm = create_block_mask(mask_mod, None, None, L, L, BLOCK_SIZE=32) if mask_mod is not None else None
    out = flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)
    ref = dense_reference(np_(q), np_(k), np_(v), score_ref, mask_ref)
    assert rel_error(np_(out), ref) < 1e-10
    if case == "bias":
        out.sum().backward()
        assert bias.grad is not None and bias.grad.shape == bias.shape


def test_flex_gradients_finite_difference():
    q, k, v = qkv(1, 1, 40, 8)
    q.requires_grad_()
    bm = create_block_mask(causal_mask(), 1, 1, 40, 40, BLOCK_SIZE=16)
    out, lse = flex_attention(q, k, v, block_mask=bm, return_lse=True)
    assert lse.shape == (1, 1, 40)
    (out * out).sum().backward()
    qn, kn, vn = np_(q), np_(k), np_(v)
    eps, i = 1e-6, (0, 0, 13, 5)

    def f(qa):
        o = dense_reference(qa, kn, vn, mask_fn=lambda b, h, qi, kv: qi >= kv)
        return (o * o).sum()

    qp, qm = qn.copy(), qn.copy()
    qp[i] += eps
    qm[i] -= eps
    fd = (f(qp) - f(qm)) / (2 * eps)
    assert abs(q.grad.numpy()[i] - fd) < 1e-6 * max(1, abs(fd))


def test_block_mask_structure():
    bm = create_block_mask(lambda b, h, q, kv: q >= kv, 2, None, 256, 256, BLOCK_SIZE=64)
    assert isinstance(bm, BlockMask)
    assert bm.shape == (2, 1, 256, 256) and bm.BLOCK_SIZE == (64, 64)
    dense = bm.to_dense().numpy()
    assert dense.shape == (2, 1, 4, 4)
    np.testing.assert_array_equal(dense[0, 0], np.tril(np.ones((4, 4), np.int32)))
    assert abs(bm.sparsity() - 37.5) < 1e-9
    assert "#" in repr(bm)
    full = bm.full_kv_num_blocks.numpy()
    assert full[0, 0].tolist() == [0, 1, 2, 3]  # the diagonal blocks are partial


def test_flex_errors():
    q, k, v = qkv(1, 2, 32, 8)
    with pytest.raises(kiln.KilnError, match="flex_attention"):
        flex_attention(q, kiln.randn(1, 2, 32, 4, dtype=kiln.float64), v)
    bm = create_block_mask(causal_mask(), 1, 1, 64, 64, BLOCK_SIZE=32)
    with pytest.raises(kiln.KilnError, match="block_mask"):
        flex_attention(q, k, v, block_mask=bm)
    with pytest.raises(kiln.KilnError, match=r"test_flex.py:\d+.*list"):
        flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + [1.0, 2.0][h])  # a list: no capture


# ---- captured torch tensors and NumPy arrays ----

NP_BIAS = np.linspace(-1, 1, 2 * (2 * 48 - 1)).reshape(2, -1)  # read from the module's globals


def test_numpy_captures_closure_and_globals():
    L = 48
    q, k, v = qkv(1, 2, L, 8)
    local = NP_BIAS.copy()
    kb = kiln.from_numpy(NP_BIAS)
    ref = flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + kb[h][qi - kv + L - 1])
    for mod in (lambda s, b, h, qi, kv: s + local[h, qi - kv + L - 1],      # closure
                lambda s, b, h, qi, kv: s + NP_BIAS[h][qi - kv + L - 1]):   # module global
        out = flex_attention(q, k, v, score_mod=mod)
        assert (out - ref).abs().max().item() == 0.0
    docs = np.array([0] * 20 + [1] * 28)
    bm = create_block_mask(lambda b, h, qi, kv: docs[qi] == docs[kv], None, None, L, L, BLOCK_SIZE=16)
    np.testing.assert_array_equal(bm.to_dense().numpy()[0, 0], [[1, 1, 0], [1, 1, 1], [0, 1, 1]])


def test_uncapturable_numpy_names_the_line():
    class Holder:
        arr = np.zeros((2, 100))

    q, k, v = qkv(1, 2, 32, 8)
    with pytest.raises(kiln.KilnError, match=r"test_flex.py:\d+.*IndexError"):
        flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + Holder.arr[h, qi])
    with pytest.raises(kiln.KilnError, match=r"score_mod defined at .*test_flex.py:\d+ returned numpy.ndarray"):
        flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: Holder.arr)


def test_torch_captures_and_torch_functions():
    torch = pytest.importorskip("torch", reason="torch is not installed: torch captures untested")
    L = 40
    q, k, v = qkv(1, 2, L, 8)
    tb = torch.randn(2, 2 * L - 1, dtype=torch.float64)
    slopes = torch.tensor([0.5, 0.25], dtype=torch.float64)
    kb = kiln.from_dlpack(tb)
    ref = flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + kb[h][qi - kv + L - 1])
    out = flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + tb[h, qi - kv + L - 1])
    assert (out - ref).abs().max().item() == 0.0
    # PyTorch-style mods (torch.where / tanh / clamp on the symbolic arguments) trace unchanged.
    torch_style = flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: torch.where(
        qi >= kv, torch.tanh(s / 2.0) * 2.0, torch.clamp(s, min=-1.0, max=1.0)))
    kiln_style = flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: kiln.where(
        qi >= kv, kiln.tanh(s / 2.0) * 2.0, kiln.minimum(kiln.maximum(s, -1.0), 1.0)))
    assert (torch_style - kiln_style).abs().max().item() == 0.0
    assert (flex_attention(q, k, v, score_mod=alibi(slopes)) -
            flex_attention(q, k, v, score_mod=alibi(kiln.from_dlpack(slopes)))).abs().max().item() == 0.0
    with pytest.raises(kiln.KilnError, match=r"torch.sin cannot be traced.*test_flex.py:\d+"):
        flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: torch.sin(s))
    with pytest.raises(kiln.KilnError, match=r"cannot capture.*1-d to 3-d.*test_flex.py:\d+"):
        t4 = torch.zeros(1, 1, 1, 4)
        flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + t4[b, h, qi, kv])
