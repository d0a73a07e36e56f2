"""CUDA from Python (skipped without a GPU): devices, memory statistics, ops and LCE vs the CPU."""
import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from conftest import rel_error, requires_cuda

pytestmark = requires_cuda


def test_device_and_transfers():
    assert kiln.cuda.device_count() >= 1
    x = kiln.randn(64, 32)
    g = x.cuda()
    assert g.is_cuda and g.device == kiln.device("cuda:0")
    np.testing.assert_array_equal(g.cpu().numpy(), x.numpy())
    assert kiln.ones(3, device="cuda").to("cpu").tolist() == [1.0, 1.0, 1.0]
    kiln.cuda.synchronize()


def test_memory_stats():
    kiln.cuda.synchronize()
    base = kiln.cuda.memory_allocated()
    kiln.cuda.reset_peak_memory_stats()
    x = kiln.empty(1 << 20, device="cuda")
    assert kiln.cuda.memory_allocated() - base == 4 << 20
    assert kiln.cuda.max_memory_allocated() >= base + (4 << 20)
    del x
    assert kiln.cuda.memory_allocated() == base
    assert kiln.cuda.memory_stats()["allocated_bytes.all.current"] == base


def test_ops_match_cpu():
    a, b = kiln.randn(33, 65), kiln.randn(65, 17)
    assert rel_error((a.cuda() @ b.cuda()).cpu().numpy(), (a @ b).numpy()) < 1e-5
    assert rel_error(kiln.softmax(a.cuda(), -1).cpu().numpy(), kiln.softmax(a, -1).numpy()) < 1e-6


def test_lce_cuda_matches_cpu():
    x = kiln.randn(64, 32, requires_grad=True)
    w = kiln.randn(500, 32, requires_grad=True)
    t = kiln.randint(0, 500, (64,))
    xc, wc = x.detach().cuda().requires_grad_(), w.detach().cuda().requires_grad_()
    lc = F.linear_cross_entropy(xc, wc, t.cuda())
    l = F.linear_cross_entropy(x, w, t)
    assert abs(lc.item() - l.item()) < 1e-4 * abs(l.item())
    lc.backward()
    l.backward()
    assert rel_error(xc.grad.cpu().numpy(), x.grad.numpy()) < 1e-4
    assert rel_error(wc.grad.cpu().numpy(), w.grad.numpy()) < 1e-4


def test_kiln_torch_adapter_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    import kiln.torch as kt

    x = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(1000, 64, device="cuda") * 0.1).bfloat16().requires_grad_()
    t = torch.randint(0, 1000, (128,), device="cuda")
    loss = kt.linear_cross_entropy(x, w, t)
    loss.backward()
    ref_x, ref_w = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    ref = torch.nn.functional.cross_entropy(ref_x @ ref_w.T, t)
    ref.backward()
    assert abs(loss.item() - ref.item()) < 2e-2 * abs(ref.item())
    assert rel_error(x.grad.float().cpu().numpy(), ref_x.grad.cpu().numpy()) < 2e-2
    assert rel_error(w.grad.float().cpu().numpy(), ref_w.grad.cpu().numpy()) < 2e-2
