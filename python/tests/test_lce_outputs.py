"""kiln.nn.functional.linear_cross_entropy's outputs besides the gradients: a float32 loss from bf16
inputs (the input's dtype only with loss_in_input_dtype=True), the predicted tokens and token
accuracy (exact; ties to the first maximum; -1 / not counted where ignored), and token scaling,
against a float64 NumPy reference; the same through kiln.torch where torch is importable."""
import numpy as np
import pytest

import kiln
import kiln.nn.functional as F

N, H, V = 37, 24, 61


def np_reference(x, w, y, reduction="mean", token_scaling=False, ignore_index=-100):
    """float64 loss, per-token argmax (first maximum, -1 where ignored)."""
    z = x @ w.T
    m = z.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(-1, keepdims=True)))[:, 0]
    valid = y != ignore_index
    yy = np.where(valid, y, 0)
    tok = np.where(valid, lse - z[np.arange(len(y)), yy], 0.0)
    if token_scaling:
        tok = tok * np.where(valid, np.exp(z[np.arange(len(y)), yy] - lse), 0.0)
    loss = tok if reduction == "none" else tok.sum() / (valid.sum() if reduction == "mean" else 1)
    return loss, np.where(valid, z.argmax(-1), -1)


def bf16_inputs(rng, integral=False):
    """x [N, H], w [V, H] rounded to bf16 (as float64 arrays and as kiln bf16 tensors), targets."""
    x, w = rng.standard_normal((N, H)), rng.standard_normal((V, H)) / np.sqrt(H)
    if integral:  # small integers: exact logits in fp32 and fp64, frequent ties
        x, w = np.round(x * 1.5), np.round(w * np.sqrt(H) * 1.5)
    kx, kw = kiln.tensor(x).to(kiln.bfloat16), kiln.tensor(w).to(kiln.bfloat16)
    y = rng.integers(0, V, N)
    y[::5] = -100
    return kx.float().double().numpy(), kw.float().double().numpy(), kx, kw, y


@pytest.mark.parametrize("strategy", ["memory", "speed"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_bf16_loss_is_float32_and_matches_float64(strategy, reduction):
    x, w, kx, kw, y = bf16_inputs(np.random.default_rng(0))
    kx.requires_grad_(True)
    loss = F.linear_cross_entropy(kx, kw, kiln.tensor(y), reduction=reduction, strategy=strategy, chunk_tokens=8,
                                  chunk_vocab=16)
    assert loss.dtype == kiln.float32
    ref, _ = np_reference(x, w, y, reduction)
    got = loss.detach().numpy().astype(np.float64)
    assert np.linalg.norm(got - ref) <= 1e-5 * np.linalg.norm(ref)
    # On request, the input's dtype (differentiable as before).
    low = F.linear_cross_entropy(kx, kw, kiln.tensor(y), reduction=reduction, strategy=strategy,
                                 loss_in_input_dtype=True)
    assert low.dtype == kiln.bfloat16
    low.sum().backward() if reduction == "none" else low.backward()
    assert kx.grad is not None


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_predicted_tokens_and_accuracy_are_exact(reduction):
    x, w, kx, kw, y = bf16_inputs(np.random.default_rng(1), integral=True)
    _, pred = np_reference(x, w, y)
    y[1::2] = np.where(pred[1::2] >= 0, pred[1::2], y[1::2])  # half the targets predicted right
    assert any((x @ w.T)[i].tolist().count((x @ w.T)[i].max()) > 1 for i in range(N)), "no tie exercised"
    r = F.linear_cross_entropy(kx, kw, kiln.tensor(y), reduction=reduction, return_token_accuracy=True,
                               return_predicted_tokens=True, chunk_vocab=16)
    assert isinstance(r, F.LinearCrossEntropyOutput) and r.loss.dtype == kiln.float32
    np.testing.assert_array_equal(r.predicted_tokens.numpy(), pred)
    hit = (pred == y) & (y != -100)
    if reduction == "none":
        np.testing.assert_array_equal(r.token_accuracy.numpy(), hit.astype(np.float32))
    else:
        assert r.token_accuracy.item() == np.float32(hit.sum()) / np.float32((y != -100).sum())


def test_token_scaling_matches_float64():
    x, w, kx, kw, y = bf16_inputs(np.random.default_rng(2))
    loss = F.linear_cross_entropy(kx.float(), kw.float(), kiln.tensor(y), use_token_scaling=True)
    ref, _ = np_reference(x, w, y, token_scaling=True)
    assert abs(loss.item() - ref) <= 1e-5 * abs(ref)
    assert abs(ref - np_reference(x, w, y)[0]) > 0.1 * abs(ref)  # the scaling matters


def test_torch_adapter_outputs():
    torch = pytest.importorskip("torch", reason="torch is not installed: checked through kiln only")
    import kiln.torch as kt

    x, w, _, _, y = bf16_inputs(np.random.default_rng(3), integral=True)
    tx = torch.tensor(x, dtype=torch.bfloat16, requires_grad=True)
    tw = torch.tensor(w, dtype=torch.bfloat16)
    r = kt.linear_cross_entropy(tx, tw, torch.tensor(y), return_token_accuracy=True, return_predicted_tokens=True)
    ref, pred = np_reference(x, w, y)
    assert r.loss.dtype == torch.float32 and abs(r.loss.item() - ref) <= 1e-5 * abs(ref)
    np.testing.assert_array_equal(r.predicted_tokens.numpy(), pred)
    hit = (pred == y) & (y != -100)
    assert r.token_accuracy.item() == np.float32(hit.sum()) / np.float32((y != -100).sum())
    r.loss.backward()
    assert tx.grad is not None and tx.grad.dtype == torch.bfloat16
