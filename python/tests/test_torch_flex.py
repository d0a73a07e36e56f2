"""kiln.torch.flex_attention: forward and backward parity with PyTorch's own unfused attention
(scores materialised in float64, mods and mask applied with torch ops) for the built-in mods, a
captured learned bias (a torch Parameter whose .grad must arrive), GQA, return_lse, and use inside
a torch model. Skips (with the reason) when torch is not installed."""
import math

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: kiln.torch adapters untested")

import kiln  # noqa: E402
import kiln.torch as kt  # noqa: E402
from kiln.nn.attention.flex_attention import (alibi, and_masks, causal_mask, create_block_mask,  # noqa: E402
                                              document_mask, sliding_window_mask, softcap)


def torch_reference(q, k, v, score_fn=None, mask_fn=None, scale=None, gqa=False):
    """Unfused attention with torch ops (PyTorch's semantics: fully masked rows give 0)."""
    B, Hq, L, E = q.shape
    S = k.shape[2]
    if gqa:
        k = k.repeat_interleave(Hq // k.shape[1], dim=1)
        v = v.repeat_interleave(Hq // v.shape[1], dim=1)
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(E))
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(Hq).view(1, Hq, 1, 1)
    qi = torch.arange(L).view(1, 1, L, 1)
    kv = torch.arange(S).view(1, 1, 1, S)
    if score_fn is not None:
        s = score_fn(s, b, h, qi, kv)
    if mask_fn is not None:
        s = s.masked_fill(~mask_fn(b, h, qi, kv).expand_as(s), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)).unsqueeze(-1))
    return p @ v, lse


def make(shape, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype, requires_grad=True)


def grads_of(out, tensors, seed=0):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad(out, tensors, g)


L, H, E = 72, 2, 16
DOCS = torch.tensor([0] * 30 + [1] * 25 + [2] * 17)
SLOPES = torch.tensor([0.5, 0.125], dtype=torch.float64)

CASES = {
    "causal": (None, causal_mask(), None, lambda b, h, qi, kv: qi >= kv),
    "sliding_window": (None, sliding_window_mask(20), None, lambda b, h, qi, kv: (qi >= kv) & (qi - kv < 20)),
    "document": (None, and_masks(document_mask(DOCS), causal_mask()), None,
                 lambda b, h, qi, kv: (DOCS[qi] == DOCS[kv]) & (qi >= kv)),
    "alibi": (alibi(SLOPES), causal_mask(), lambda s, b, h, qi, kv: s + SLOPES[h] * (kv - qi),
              lambda b, h, qi, kv: qi >= kv),
    "softcap": (softcap(3.0), None, lambda s, b, h, qi, kv: 3.0 * torch.tanh(s / 3.0), None),
    "torch_style_lambda": (lambda s, b, h, qi, kv: torch.where(qi - kv < 5, s * 1.5, s),
                           lambda b, h, qi, kv: (qi >= kv) | (kv == 0),
                           lambda s, b, h, qi, kv: torch.where(qi - kv < 5, s * 1.5, s),
                           lambda b, h, qi, kv: (qi >= kv) | (kv == 0)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_flex_forward_backward_matches_torch(case):
    score_mod, mask_mod, score_ref, mask_ref = CASES[case]
    q, k, v = make((1, H, L, E)), make((1, H, L, E)), make((1, H, L, E))
    bm = create_block_mask(mask_mod, None, None, L, L, BLOCK_SIZE=16) if mask_mod is not None else None
    out = kt.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)
    ref, _ = torch_reference(q, k, v, score_ref, mask_ref)
    assert isinstance(out, torch.Tensor) and out.shape == ref.shape and out.dtype == torch.float64
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    for g, r in zip(grads_of(out, (q, k, v)), grads_of(ref, (q, k, v))):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-10)


def test_learned_bias_parameter_gets_its_grad():
    q, k, v = make((2, H, L, E)), make((2, H, L, E)), make((2, H, L, E))
    bias = torch.nn.Parameter(torch.randn(H, 2 * L - 1, dtype=torch.float64) * 0.5)
    bm = create_block_mask(causal_mask(), None, None, L, L, BLOCK_SIZE=16)
    out = kt.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + bias[h, qi - kv + L - 1], block_mask=bm)
    ref, _ = torch_reference(q, k, v, lambda s, b, h, qi, kv: s + bias[h, qi - kv + L - 1],
                             lambda b, h, qi, kv: qi >= kv)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    ours = grads_of(out, (q, k, v, bias))
    theirs = grads_of(ref, (q, k, v, bias))
    for g, r in zip(ours, theirs):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-10)
    with pytest.raises(RuntimeError, match="second time"):
        out.sum().backward()  # grads_of consumed the graph (as in PyTorch without retain_graph)
    # .backward() fills the Parameter's .grad (what an optimizer reads).
    out = kt.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + bias[h, qi - kv + L - 1], block_mask=bm)
    out.sum().backward()
    assert bias.grad is not None and bias.grad.shape == bias.shape and bias.grad.abs().sum() > 0
    # Gradients are bitwise reproducible run to run (kiln's deterministic backward).
    again = grads_of(kt.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + bias[h, qi - kv + L - 1],
                                       block_mask=bm), (q, k, v, bias))
    for a, b_ in zip(ours, again):
        assert torch.equal(a, b_)


def test_gqa_scale_lse_and_float32():
    Hq, Hkv, S = 4, 2, 56
    q, k, v = make((1, Hq, L, E), torch.float32), make((1, Hkv, S, E), torch.float32), make((1, Hkv, S, 8), torch.float32)
    bm = create_block_mask(lambda b, h, qi, kv: qi >= kv, None, None, L, S, BLOCK_SIZE=16)
    out, lse = kt.flex_attention(q, k, v, block_mask=bm, scale=0.3, enable_gqa=True, return_lse=True)
    ref, ref_lse = torch_reference(q.double(), k.double(), v.double(), None, lambda b, h, qi, kv: qi >= kv,
                                   scale=0.3, gqa=True)
    assert out.shape == (1, Hq, L, 8) and lse.shape == (1, Hq, L) and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-4, atol=1e-5)
    # Gradients through both outputs (lse is differentiable, as in PyTorch).
    loss = out.square().sum() + lse.sum()
    ref_loss = ref.square().sum() + ref_lse.sum()
    for g, r in zip(torch.autograd.grad(loss, (q, k, v)), torch.autograd.grad(ref_loss, (q, k, v))):
        torch.testing.assert_close(g.double(), r.double(), rtol=1e-3, atol=1e-4)


def test_zero_copy_inputs_and_no_grad():
    q = torch.randn(1, 1, 32, 8)
    with torch.no_grad():
        out = kt.flex_attention(q, q, q)
    assert out.grad_fn is None and not out.requires_grad
    # The adapter's kiln view of a torch tensor shares its memory.
    assert kt.to_kiln(q).data_ptr() == q.data_ptr()


def test_inside_a_torch_model_training_step():
    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(E * H, 3 * E * H)
            self.rel = torch.nn.Parameter(torch.zeros(H, 2 * L - 1))
            self.bm = create_block_mask(causal_mask(), None, None, L, L, BLOCK_SIZE=16)

        def forward(self, x):
            q, k, v = self.qkv(x).view(1, L, 3, H, E).permute(2, 0, 3, 1, 4)
            o = kt.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + self.rel[h, qi - kv + L - 1],
                                  block_mask=self.bm)
            return o.transpose(1, 2).reshape(1, L, H * E)

    torch.manual_seed(0)
    model = Attn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(1, L, H * E)
    before = model.rel.detach().clone()
    loss = model(x).square().mean()
    loss.backward()
    assert model.rel.grad is not None and model.qkv.weight.grad is not None
    opt.step()
    assert not torch.equal(before, model.rel.detach())


def test_bad_calls_raise():
    q = torch.randn(1, 1, 32, 8)
    with pytest.raises(TypeError, match="query must be a torch.Tensor"):
        kt.flex_attention(kiln.randn(1, 1, 32, 8), q, q)
    with pytest.raises(TypeError, match="kiln BlockMask"):
        kt.flex_attention(q, q, q, block_mask=object())
    with pytest.raises(kiln.KilnError, match="flex_attention"):
        kt.flex_attention(q, torch.randn(1, 1, 32, 4), q)  # head dims differ
    with pytest.raises(kiln.KilnError, match=r"test_torch_flex.py:\d+"):
        kt.flex_attention(q, q, q, score_mod=lambda s, b, h, qi, kv: s + torch.sin(s))
