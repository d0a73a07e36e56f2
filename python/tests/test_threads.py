"""Several Python threads calling kiln at once (ops, autograd, LCE, FlexAttention with mods traced
concurrently, the kiln.torch adapters): every thread must get the single-threaded results bit for
bit. kiln releases the GIL inside its ops, so this runs kernels concurrently under any interpreter;
under a free-threaded one (python3.13t) the whole calls overlap, and importing kiln must keep the
GIL disabled (nanobind's FREE_THREADED build)."""
import sys
import sysconfig
import threading

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from kiln.nn.attention.flex_attention import causal_mask, create_block_mask, flex_attention

THREADS, ROUNDS = 4, 3


def run_threads(fn, inputs):
    """fn(inputs) in THREADS threads, ROUNDS times each, started together; returns every result."""
    barrier = threading.Barrier(THREADS)
    results, errors = [[] for _ in range(THREADS)], []

    def worker(i):
        try:
            barrier.wait()
            for _ in range(ROUNDS):
                results[i].append(fn(inputs))
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return [r for rs in results for r in rs]


def assert_all_equal(results, reference):
    for r in results:
        for a, b in zip(r, reference):
            np.testing.assert_array_equal(a, b)


def test_free_threaded_interpreter_keeps_the_gil_off():
    if not sysconfig.get_config_var("Py_GIL_DISABLED"):
        pytest.skip("not a free-threaded interpreter")
    assert not sys._is_gil_enabled(), "importing kiln re-enabled the GIL"


def test_concurrent_ops_and_lce():
    x = kiln.randn(64, 32, dtype=kiln.float64)
    w = kiln.randn(300, 32, dtype=kiln.float64)
    t = kiln.randint(0, 300, (64,))

    def body(inp):
        x, w, t = inp
        xs, ws = x.detach().requires_grad_(), w.detach().requires_grad_()
        y = kiln.softmax(xs @ ws.T, -1).sum()
        loss = F.linear_cross_entropy(xs, ws, t, label_smoothing=0.1) + y
        loss.backward()
        return loss.detach().numpy(), xs.grad.numpy(), ws.grad.numpy()

    assert_all_equal(run_threads(body, (x, w, t)), body((x, w, t)))


def test_concurrent_backward_into_a_shared_leaf():
    # Every thread's graph ends in the same leaf w: each gradient must land in w.grad exactly once
    # (a race lost some and tore others, under python3.13t and, less often, with the GIL). All
    # additions add the same c, so the sum is the same bits in any order.
    c = kiln.randn(128, 128, dtype=kiln.float64)
    w = kiln.randn(128, 128, dtype=kiln.float64).requires_grad_()
    steps = 64  # per call: THREADS * ROUNDS * steps backward passes per trial

    def body(_):
        for _ in range(steps):
            (w * c).sum().backward()  # a cheap graph: mostly the accumulation
        return ()

    for _ in range(THREADS * ROUNDS):
        body(None)
    reference = w.grad.numpy().copy()
    for _ in range(8):  # on 2 cores the race showed in about half the trials (or crashed: double free)
        w.grad = None
        run_threads(body, None)
        np.testing.assert_array_equal(w.grad.numpy(), reference)


def test_concurrent_flex_with_traced_mods():
    L = 64
    q, k, v = (kiln.randn(1, 2, L, 16) for _ in range(3))
    bias = kiln.randn(2, 2 * L - 1, dtype=kiln.float32)

    def body(inp):
        q, k, v = (a.detach().requires_grad_() for a in inp)
        # Both mods are traced in every call (tracing state is per thread).
        bm = create_block_mask(lambda b, h, qi, kv: (qi >= kv) & (qi - kv < 40), None, None, L, L, BLOCK_SIZE=16)
        out = flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + bias[h][qi - kv + L - 1], block_mask=bm)
        out.sum().backward()
        return out.detach().numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()

    assert_all_equal(run_threads(body, (q, k, v)), body((q, k, v)))
    bm = create_block_mask(causal_mask(), None, None, L, L, BLOCK_SIZE=16)
    shared = run_threads(lambda inp: (flex_attention(*inp, block_mask=bm).numpy(),), (q, k, v))  # one BlockMask
    assert_all_equal(shared, (flex_attention(q, k, v, block_mask=bm).numpy(),))


def test_concurrent_torch_adapters():
    torch = pytest.importorskip("torch")
    import kiln.torch as kt

    L = 64
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, L, 16) for _ in range(3))
    rel = torch.randn(2, 2 * L - 1) * 0.3
    x, w, t = torch.randn(32, 16), torch.randn(100, 16), torch.randint(0, 100, (32,))
    bm = create_block_mask(causal_mask(), None, None, L, L, BLOCK_SIZE=16)

    def body(_):
        qs, ks, vs, rs = (a.clone().requires_grad_() for a in (q, k, v, rel))
        out = kt.flex_attention(qs, ks, vs, score_mod=lambda s, b, h, qi, kv: s + rs[h, qi - kv + L - 1],
                                block_mask=bm)
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        loss = kt.linear_cross_entropy(xs, ws, t) + out.square().mean()
        loss.backward()
        return tuple(a.detach().numpy() for a in (loss, qs.grad, rs.grad, xs.grad, ws.grad))

    assert_all_equal(run_threads(body, None), body(None))
