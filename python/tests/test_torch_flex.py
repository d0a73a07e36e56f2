"""kiln.torch.flex_attention: forward and backward parity with PyTorch's own unfused attention
(scores materialised in float64, mods and mask applied with torch ops) for the built-in mods, a
captured learned bias (a torch Parameter whose .grad must arrive), GQA, return_lse, and use inside
a torch model. Skips (with the reason) when torch is not installed. The CUDA section (bf16 / fp16
kernels vs float64, a learned bias on either device, GQA, the CPU fallback, zero-copy and memory
statistics, a non-default torch stream) runs only where torch and kiln both see a GPU."""
import gc
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


def test_no_grad_with_parameters_records_no_kiln_graph():
    # torch runs Function.forward with grad off and needs_input_grad from requires_grad alone: under
    # torch.no_grad, inputs that require grad must not make kiln record a node, which would keep
    # the lse [B, H, L] alive as long as the output.
    q = torch.randn(1, 2, 64, 8, requires_grad=True)
    with torch.no_grad():
        kt.flex_attention(q, q, q)  # warm-up: whatever a first call keeps is not what is measured
    before = kiln.cpu.memory_allocated()
    with torch.no_grad():
        out = kt.flex_attention(q, q, q)
    held = kiln.cpu.memory_allocated() - before
    assert out.grad_fn is None and not out.requires_grad
    assert held == out.numel() * out.element_size(), f"kiln holds {held} bytes beside the output"
    out2 = kt.flex_attention(q, q, q)  # with grad on, a node (and its lse) is recorded as before
    assert out2.grad_fn is not None


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


# ---- CUDA: the bf16 / fp16 kernels (NVRTC) vs torch's unfused attention in float64 ----
# These run only where torch and kiln both see a GPU (the lead's H200 machine); elsewhere they skip
# with the reason. The reference takes the SAME 16-bit inputs, widened to float64 on the CPU, so the
# difference is kiln's own rounding. Tolerances (norm-wise relative error, conftest.rel_error), as in
# tests/flex/test_attention_cuda.cpp: bf16 keeps 8 significant bits (unit roundoff u = 2^-8 = 3.9e-3);
# out is stored in bf16 and P is rounded to bf16 before P @ V, so out is within a few u: 2e-2. The
# gradients go through dS = P * (dP - delta) (cancellation) and sums of rounded products over a row
# or column: 4e-2. fp16 (u = 2^-11 = 4.9e-4): 5e-3 for out, 1e-2 for gradients.

def _cuda_skip_reason():
    if not torch.cuda.is_available():
        return "torch has no CUDA"
    if not kiln.cuda.is_available():
        return "kiln was built without CUDA or sees no CUDA device"
    return None


requires_cuda = pytest.mark.skipif(_cuda_skip_reason() is not None,
                                   reason=f"CUDA adapter tests skipped: {_cuda_skip_reason()}")
CUDA_TOL = {torch.bfloat16: (2e-2, 4e-2), torch.float16: (5e-3, 1e-2)}
CL, CH = 256, 4  # sequence length (4 tiles of 64), heads
CDOCS = torch.tensor([0] * 100 + [1] * 3 + [2] * 90 + [3] * 63)  # ragged, one shorter than a tile
CSLOPES = torch.tensor([2.0 ** -(i + 1) for i in range(CH)], dtype=torch.float64)

CUDA_CASES = {
    "causal": (None, causal_mask(), None, lambda b, h, qi, kv: qi >= kv),
    "sliding_window": (None, sliding_window_mask(96), None, lambda b, h, qi, kv: (qi >= kv) & (qi - kv < 96)),
    "document": (None, and_masks(document_mask(CDOCS), causal_mask()), None,
                 lambda b, h, qi, kv: (CDOCS[qi] == CDOCS[kv]) & (qi >= kv)),
    "alibi": (alibi(CSLOPES), causal_mask(), lambda s, b, h, qi, kv: s + CSLOPES[h] * (kv - qi),
              lambda b, h, qi, kv: qi >= kv),
    "softcap": (softcap(3.0), None, lambda s, b, h, qi, kv: 3.0 * torch.tanh(s / 3.0), None),
}


def rel_err(got, want):
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    assert torch.isfinite(got).all(), "non-finite values"
    return ((got - want).norm() / want.norm().clamp_min(1e-300)).item()


def cuda_randn(shape, dtype, scale=1.0):
    return (torch.randn(*shape, device="cuda", dtype=torch.float32) * scale).to(dtype).requires_grad_()


def as_f64_cpu(t):
    return t.detach().cpu().double().requires_grad_()


def check_parity(out, ref, ours, theirs, dtype, names):
    """out vs ref (forward), then the gradients of a common random upstream gradient."""
    tol, gtol = CUDA_TOL[dtype]
    assert out.is_cuda and out.dtype == dtype and out.shape == ref.shape
    assert rel_err(out, ref) < tol, f"out: {rel_err(out, ref):.3g}"
    g = torch.randn(out.shape, device="cuda", dtype=torch.float32).to(dtype)
    got = torch.autograd.grad(out, ours, g)
    want = torch.autograd.grad(ref, theirs, g.cpu().double())
    for name, a, b, t in zip(names, got, want, ours):
        assert a.device == t.device and a.dtype == t.dtype and a.shape == t.shape, name
        assert rel_err(a, b) < gtol, f"d{name}: {rel_err(a, b):.3g}"


@requires_cuda
@pytest.mark.parametrize("dtype,E", [(torch.bfloat16, 64), (torch.float16, 128)], ids=["bf16-E64", "fp16-E128"])
@pytest.mark.parametrize("case", list(CUDA_CASES))
def test_cuda_flex_matches_torch_float64(case, dtype, E):
    score_mod, mask_mod, score_ref, mask_ref = CUDA_CASES[case]
    torch.manual_seed(0)
    q, k, v = (cuda_randn((2, CH, CL, E), dtype) for _ in range(3))
    bm = create_block_mask(mask_mod, None, None, CL, CL) if mask_mod is not None else None
    out = kt.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)
    q64, k64, v64 = (as_f64_cpu(t) for t in (q, k, v))
    ref, _ = torch_reference(q64, k64, v64, score_ref, mask_ref)
    check_parity(out, ref, (q, k, v), (q64, k64, v64), dtype, "qkv")


@requires_cuda
@pytest.mark.parametrize("bias_device", ["cuda", "cpu"])
@pytest.mark.parametrize("dtype,E", [(torch.bfloat16, 64), (torch.float16, 128)], ids=["bf16-E64", "fp16-E128"])
def test_cuda_learned_bias_parameter(dtype, E, bias_device):
    # A relative-position bias Parameter captured by a torch-style lambda: its gradient reaches torch on
    # the Parameter's own device (a CUDA Parameter is mirrored on the CPU for kiln's IR).
    torch.manual_seed(1)
    q, k, v = (cuda_randn((2, CH, CL, E), dtype) for _ in range(3))
    bias = torch.nn.Parameter(torch.randn(CH, 2 * CL - 1, device=bias_device) * 0.5)
    bm = create_block_mask(causal_mask(), None, None, CL, CL, device="cuda", BLOCK_SIZE=64)
    out = kt.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + bias[h, qi - kv + CL - 1], block_mask=bm)
    q64, k64, v64, b64 = (as_f64_cpu(t) for t in (q, k, v, bias))
    ref, _ = torch_reference(q64, k64, v64, lambda s, b, h, qi, kv: s + b64[h, qi - kv + CL - 1],
                             lambda b, h, qi, kv: qi >= kv)
    check_parity(out, ref, (q, k, v, bias), (q64, k64, v64, b64), dtype, ("q", "k", "v", "bias"))
    # The mirror of a CUDA Parameter follows in-place updates (an optimizer step) on the next call.
    with torch.no_grad():
        bias.add_(1.0)
        b64.add_(1.0)
        out = kt.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + bias[h, qi - kv + CL - 1],
                                block_mask=bm)
        ref, _ = torch_reference(q64, k64, v64, lambda s, b, h, qi, kv: s + b64[h, qi - kv + CL - 1],
                                 lambda b, h, qi, kv: qi >= kv)
    assert rel_err(out, ref) < CUDA_TOL[dtype][0]
    # .backward() fills .grad on the Parameter's device (what an optimizer reads).
    out = kt.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + bias[h, qi - kv + CL - 1], block_mask=bm)
    out.float().square().mean().backward()
    assert bias.grad is not None and bias.grad.device == bias.device and bias.grad.abs().sum() > 0


@requires_cuda
def test_cuda_gqa_scale_lse():
    dtype, E, Hq, Hkv = torch.bfloat16, 128, 8, 2
    torch.manual_seed(2)
    q, k, v = cuda_randn((1, Hq, CL, E), dtype), cuda_randn((1, Hkv, CL, E), dtype), cuda_randn((1, Hkv, CL, E), dtype)
    bm = create_block_mask(causal_mask(), None, None, CL, CL)
    out, lse = kt.flex_attention(q, k, v, block_mask=bm, scale=0.05, enable_gqa=True, return_lse=True)
    q64, k64, v64 = (as_f64_cpu(t) for t in (q, k, v))
    ref, ref_lse = torch_reference(q64, k64, v64, None, lambda b, h, qi, kv: qi >= kv, scale=0.05, gqa=True)
    assert lse.is_cuda and lse.dtype == torch.float32 and lse.shape == (1, Hq, CL)
    assert rel_err(lse, ref_lse) < 1e-3  # fp32 logsumexp of exact-input scores
    check_parity(out, ref, (q, k, v), (q64, k64, v64), dtype, "qkv")


@requires_cuda
def test_cuda_flex_fallback_configuration():
    # E = 32 is outside the CUDA kernels: kiln runs its CPU kernels through copies; the result is
    # still a CUDA tensor with gradients on CUDA.
    torch.manual_seed(3)
    q, k, v = (cuda_randn((1, 2, 96, 32), torch.bfloat16) for _ in range(3))
    out = kt.flex_attention(q, k, v, score_mod=softcap(3.0))
    q64, k64, v64 = (as_f64_cpu(t) for t in (q, k, v))
    ref, _ = torch_reference(q64, k64, v64, lambda s, b, h, qi, kv: 3.0 * torch.tanh(s / 3.0))
    check_parity(out, ref, (q, k, v), (q64, k64, v64), torch.bfloat16, "qkv")


@requires_cuda
def test_cuda_zero_copy_and_memory_statistics():
    dtype, E = torch.bfloat16, 64
    q, k, v = (cuda_randn((2, CH, CL, E), dtype).detach() for _ in range(3))
    # The adapter's kiln views share torch's memory (same data pointer through DLPack) ...
    assert kt.to_kiln(q).data_ptr() == q.data_ptr() and kt.to_kiln(q).device == kiln.device("cuda:0")
    bm = create_block_mask(causal_mask(), None, None, CL, CL)
    kt.flex_attention(q, k, v, block_mask=bm)  # compiles the kernels, moves the BlockMask (cached)
    torch.cuda.synchronize()
    kiln.cuda.synchronize()
    kiln.cuda.reset_peak_memory_stats()
    kiln_before, torch_before = kiln.cuda.memory_allocated(), torch.cuda.memory_allocated()
    out = kt.flex_attention(q, k, v, block_mask=bm)
    torch.cuda.synchronize()
    out_bytes = out.numel() * out.element_size()
    kiln_during = kiln.cuda.memory_allocated()
    # ... the output is kiln's allocation, seen by torch without a copy: kiln's statistics move by
    # at least its size and torch's allocator allocates nothing for the call.
    assert kiln_during - kiln_before >= out_bytes
    assert kiln.cuda.max_memory_allocated() - kiln_before >= out_bytes
    assert torch.cuda.memory_allocated() == torch_before
    assert kt.to_kiln(out).data_ptr() == out.data_ptr()
    # Dropping the torch tensor frees kiln's memory (the DLPack deleter releases kiln's tensor).
    del out
    gc.collect()
    kiln.cuda.synchronize()
    assert kiln_during - kiln.cuda.memory_allocated() >= out_bytes


@requires_cuda
def test_cuda_adapter_on_a_non_default_torch_stream():
    # q is written on a side stream after a long sleep; kiln must see the write (its stream waits
    # for torch's current stream) and torch must see kiln's output on that stream (and the reverse
    # for the gradients), all without a host synchronisation in between.
    if not hasattr(torch.cuda, "_sleep"):
        pytest.skip("torch.cuda._sleep is unavailable")
    dtype, E = torch.bfloat16, 64
    torch.manual_seed(4)
    src = [torch.randn(1, CH, CL, E, device="cuda").to(dtype) for _ in range(3)]
    g = torch.randn(1, CH, CL, E, device="cuda").to(dtype)
    bm = create_block_mask(causal_mask(), None, None, CL, CL)
    kt.flex_attention(*src, block_mask=bm)  # warm up: compile outside the race
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.default_stream())  # src was made on the default stream
    with torch.cuda.stream(s):
        q = torch.zeros_like(src[0])
        k, v = (t.clone() for t in src[1:])
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time on s before q gets its values
        q.copy_(src[0])
        q.requires_grad_()
        k.requires_grad_()
        out = kt.flex_attention(q, k, v, block_mask=bm)
        seen = out.float() * 1.0  # consumed on s right away
        dq, dk = torch.autograd.grad(out, (q, k), g)
        dq_seen, dk_seen = dq.float() * 1.0, dk.float() * 1.0
    torch.cuda.synchronize()
    kiln.cuda.synchronize()
    q64, k64, v64 = (as_f64_cpu(t) for t in src)
    ref, _ = torch_reference(q64, k64, v64, None, lambda b, h, qi, kv: qi >= kv)
    rq, rk = torch.autograd.grad(ref, (q64, k64), g.cpu().double())
    tol, gtol = CUDA_TOL[dtype]
    assert rel_err(seen, ref) < tol
    assert rel_err(dq_seen, rq) < gtol and rel_err(dk_seen, rk) < gtol


def test_mirrored_capture_follows_its_source_and_returns_its_grad():
    # CUDA torch tensors are captured through CPU mirrors (kiln's IR reads captured tensors on the
    # CPU). The mirror machinery is device-independent, so it is exercised here with a CPU source:
    # one mirror per live tensor, refreshed by the adapter on every call (a prebuilt ScoreMod sees
    # an optimizer's in-place update), gradient routed back to the source.
    from kiln import _capture
    from kiln.nn.attention.flex_attention import ScoreMod

    bias = torch.nn.Parameter(torch.randn(H, 2 * L - 1, dtype=torch.float64) * 0.5)
    mirror = _capture._mirror(bias)
    assert mirror.data_ptr() != bias.data_ptr() and _capture._mirror(bias).data_ptr() == mirror.data_ptr()
    assert _capture.torch_source(mirror) is bias
    mod = ScoreMod(lambda s, b, h, qi, kv: s + mirror[h][qi - kv + L - 1])
    bm = create_block_mask(causal_mask(), None, None, L, L, BLOCK_SIZE=16)
    q, k, v = make((1, H, L, E)), make((1, H, L, E)), make((1, H, L, E))
    with torch.no_grad():
        bias.mul_(-2.0)  # after the mirror was taken: the adapter must refresh it
    out = kt.flex_attention(q, k, v, score_mod=mod, block_mask=bm)
    ref, _ = torch_reference(q, k, v, lambda s, b, h, qi, kv: s + bias[h, qi - kv + L - 1],
                             lambda b, h, qi, kv: qi >= kv)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    for g, r in zip(grads_of(out, (q, k, v, bias)), grads_of(ref, (q, k, v, bias))):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-10)


def test_in_place_updates_of_captured_torch_tensors_reach_the_next_call():
    # kiln caches compiled mods while their captured tensors keep their versions; torch's in-place
    # writes to memory kiln views (a CPU Parameter) or mirrors bypass kiln's version counter, so
    # the adapter marks them changed on every call. Two calls with an optimizer-like step between.
    from kiln.nn.attention.flex_attention import ScoreMod

    bias = torch.nn.Parameter(torch.randn(H, 2 * L - 1, dtype=torch.float64) * 0.5)
    mod = ScoreMod(lambda s, b, h, qi, kv: s + bias[h, qi - kv + L - 1])
    bm = create_block_mask(causal_mask(), None, None, L, L, BLOCK_SIZE=16)
    q, k, v = make((1, H, L, E)), make((1, H, L, E)), make((1, H, L, E))
    for step in range(3):
        out = kt.flex_attention(q, k, v, score_mod=mod, block_mask=bm)
        ref, _ = torch_reference(q, k, v, lambda s, b, h, qi, kv: s + bias[h, qi - kv + L - 1],
                                 lambda b, h, qi, kv: qi >= kv)
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10, msg=f"step {step}")
        with torch.no_grad():
            bias.add_(torch.randn_like(bias))
    # The same through kiln's own API with kiln tensors (the capture still views torch memory).
    from kiln.nn.attention.flex_attention import flex_attention as kiln_flex

    qk, kk, vk = (kiln.from_dlpack(t.detach()) for t in (q, k, v))
    for step in range(2):
        out = torch.from_dlpack(kiln_flex(qk, kk, vk, score_mod=mod, block_mask=bm))
        ref, _ = torch_reference(q, k, v, lambda s, b, h, qi, kv: s + bias[h, qi - kv + L - 1],
                                 lambda b, h, qi, kv: qi >= kv)
        torch.testing.assert_close(out, ref.detach(), rtol=1e-10, atol=1e-10, msg=f"kiln API, step {step}")
        with torch.no_grad():
            bias.add_(torch.randn_like(bias))


def test_unchanged_captured_torch_tensors_are_not_synced_again():
    # A call re-syncs a captured torch tensor only after torch's version counter of it moved: an
    # unchanged one keeps kiln's version, so the compiled mod and its device copy are reused.
    from kiln import _capture
    from kiln.nn.attention.flex_attention import ScoreMod

    bias = torch.randn(H, 2 * L - 1, dtype=torch.float64) * 0.5
    mod = ScoreMod(lambda s, b, h, qi, kv: s + bias[h, qi - kv + L - 1])
    (kb,) = mod.expr.captured_tensors
    bm = create_block_mask(causal_mask(), None, None, L, L, BLOCK_SIZE=16)
    q, k, v = make((1, H, L, E)), make((1, H, L, E)), make((1, H, L, E))
    kt.flex_attention(q, k, v, score_mod=mod, block_mask=bm)
    seen = kb._version
    out = kt.flex_attention(q, k, v, score_mod=mod, block_mask=bm)
    assert kb._version == seen, "an unchanged captured tensor was marked written"
    bias.add_(1.0)  # torch's counter moves: the next call sees the new values
    out = kt.flex_attention(q, k, v, score_mod=mod, block_mask=bm)
    assert kb._version > seen
    ref, _ = torch_reference(q, k, v, lambda s, b, h, qi, kv: s + bias[h, qi - kv + L - 1], lambda b, h, qi, kv: qi >= kv)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    assert _capture.torch_source(kb) is bias


@requires_cuda
def test_unchanged_cuda_capture_is_not_copied_back_again():
    # The CPU mirror of a CUDA tensor (ALiBi-like slopes) is refreshed, a device-to-host copy that
    # waits for the GPU, only after torch's version counter of it moved.
    from kiln.nn.attention.flex_attention import ScoreMod

    slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / CH) for i in range(CH)], device="cuda")
    mod = ScoreMod(lambda s, b, h, qi, kv: s + slopes[h] * (kv - qi))
    (ks,) = mod.expr.captured_tensors
    q, k, v = (cuda_randn((1, CH, CL, 64), torch.bfloat16) for _ in range(3))
    bm = create_block_mask(causal_mask(), None, None, CL, CL, device="cuda")
    kt.flex_attention(q, k, v, score_mod=mod, block_mask=bm)
    seen = ks._version
    kt.flex_attention(q, k, v, score_mod=mod, block_mask=bm)
    assert ks._version == seen
    with torch.no_grad():
        slopes.mul_(2.0)
    out = kt.flex_attention(q, k, v, score_mod=mod, block_mask=bm)
    assert ks._version > seen
    q64, k64, v64, s64 = (as_f64_cpu(t) for t in (q, k, v, slopes))
    ref, _ = torch_reference(q64, k64, v64, lambda s, b, h, qi, kv: s + s64[h] * (kv - qi), lambda b, h, qi, kv: qi >= kv)
    torch.testing.assert_close(out.double().cpu(), ref, rtol=2e-2, atol=2e-2)
