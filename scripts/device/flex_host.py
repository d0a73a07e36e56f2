"""Where kiln.torch.flex_attention's host time goes on a short row (1x8x32768x64, causal window 256,
bf16), beside the GPU time. Run on the GPU machine with PYTHONPATH=/tmp/kiln-py (round_d.sh's
unpacked package; prelude.sh sets it up). Prints, per path, the event-timed ms of a call loop
(GPU- or host-bound, whichever is slower) and the host ms of one call measured while the GPU is
kept busy by a long kernel queued first (so host work cannot hide behind the GPU); then cProfile's
top entries for the fwd+bwd loop, and torch.profiler's GPU kernel totals (CUPTI sees kiln's
kernels too) for the same loop. FLEX_HOST_TAG labels the lines (e.g. old / new adapters);
FLEX_HOST_PARTS picks "times,native,floor,split,torch,cprofile,kernels" (default all; floor: a torch
Function that runs nothing, and one with the adapter's DLPack views, for torch's share; split: the
host time of forwards and backwards apart, and of the adapter's pieces)."""
import os
import cProfile
import pstats
import sys
import time

import torch

import kiln
import kiln.torch as kt
from kiln.nn.attention import flex_attention as kfa

B, H, S, D, W = 1, 8, 32768, 64, 256
ITERS = 50
dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)
q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_() for _ in range(3))
dout = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16, generator=g)
bm = kfa.create_block_mask(lambda b, h, qi, kv: (qi >= kv) & (qi - kv < W), None, None, S, S, device="cuda",
                           BLOCK_SIZE=128)
qd, kd, vd = q.detach(), k.detach(), v.detach()


def sync():
    torch.cuda.synchronize()
    kiln.cuda.synchronize()


def fwd():
    kt.flex_attention(qd, kd, vd, block_mask=bm)


def fwd_bwd():
    q.grad = k.grad = v.grad = None
    kt.flex_attention(q, k, v, block_mask=bm).backward(dout)


def event_ms(fn):
    for _ in range(5):
        fn()
    sync()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(ITERS):
        fn()
    b.record()
    b.synchronize()
    sync()
    return a.elapsed_time(b) / ITERS


def host_ms(fn):
    # A ~100 ms matmul chain queued first keeps the GPU busy: the loop's wall time is host work.
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    sync()
    for _ in range(60):
        x = x @ x
        x = x / x.norm()
    t0 = time.perf_counter()
    for _ in range(ITERS):
        fn()
    t = (time.perf_counter() - t0) * 1e3 / ITERS
    sync()
    return t


TAG = os.environ.get("FLEX_HOST_TAG", "")
PARTS = os.environ.get("FLEX_HOST_PARTS", "times,native,floor,split,torch,cprofile,kernels").split(",")


def report(name, fn):
    print(f"{TAG} {name:24s} events {event_ms(fn):7.3f} ms/call   host {host_ms(fn):7.3f} ms/call", flush=True)


if "times" in PARTS:
    report("kiln.torch fwd", fwd)
    report("kiln.torch fwd+bwd", fwd_bwd)

if "native" in PARTS:  # kiln's own Python API on kiln tensors: no torch adapter, kiln's autograd
    nq, nk, nv = (kt.to_kiln(t) for t in (q, k, v))
    for t in (nq, nk, nv):
        t.requires_grad_(True)
    ndq, ndk, ndv = (kt.to_kiln(t) for t in (qd, kd, vd))
    ndout = kt.to_kiln(dout)

    def nfwd():
        kfa.flex_attention(ndq, ndk, ndv, block_mask=bm)

    def nfwd_bwd():
        nq.grad = nk.grad = nv.grad = None
        kfa.flex_attention(nq, nk, nv, block_mask=bm).backward(ndout)

    # kiln's own stream here is its current one (the legacy default stream, as torch's)
    report("kiln native fwd", nfwd)
    report("kiln native fwd+bwd", nfwd_bwd)

if "floor" in PARTS:  # torch's own share: an autograd.Function of the same signature that runs nothing
    class _Nothing(torch.autograd.Function):
        @staticmethod
        def forward(ctx, grad_enabled, score_mod, block_mask, scale, enable_gqa, return_lse, captured_kiln, query,
                    key, value):
            ctx.set_materialize_grads(False)
            return torch.empty_like(query)

        @staticmethod
        def backward(ctx, g):
            return (None,) * 7 + (torch.empty_like(g), torch.empty_like(g), torch.empty_like(g))

    def floor_fwd_bwd():
        q.grad = k.grad = v.grad = None
        _Nothing.apply(True, None, bm, None, False, False, [], q, k, v).backward(dout)

    def views_fwd_bwd():  # the Function plus the adapter's DLPack views and stream switch, no kiln op
        q.grad = k.grad = v.grad = None
        _Views.apply(True, None, bm, None, False, False, [], q, k, v).backward(dout)

    class _Views(torch.autograd.Function):
        @staticmethod
        def forward(ctx, grad_enabled, score_mod, block_mask, scale, enable_gqa, return_lse, captured_kiln, query,
                    key, value):
            ctx.set_materialize_grads(False)
            with kt._on_torch_stream(query.device):
                ks = [kt._leaf(t, True) for t in (query, key, value)]
                return kt._torch_view(ks[0])

        @staticmethod
        def backward(ctx, g):
            with kt._on_torch_stream(g.device):
                kg = kt._kiln_view(g.contiguous())
                return (None,) * 7 + tuple(kt._torch_view(kg).to(g.device) for _ in range(3))

    report("torch Function, nothing", floor_fwd_bwd)
    report("Function + views", views_fwd_bwd)

if "split" in PARTS:  # host ms of the forward (with a graph) and of the backward apart, per path
    def busy():  # ~100 ms of queued matmuls: the host's loop below never waits for the GPU
        x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        sync()
        for _ in range(60):
            x = x @ x
            x = x / x.norm()

    def split(name, make, back):
        make(), back(make())  # warm
        sync()
        busy()
        t0 = time.perf_counter()
        outs = [make() for _ in range(ITERS)]
        t1 = time.perf_counter()
        for o in outs:
            back(o)
        t2 = time.perf_counter()
        sync()
        print(f"{TAG} {name:24s} host fwd {(t1 - t0) * 1e3 / ITERS:7.3f}   bwd {(t2 - t1) * 1e3 / ITERS:7.3f} ms/call",
              flush=True)

    def clear_and(fn):
        def f(o):
            q.grad = k.grad = v.grad = None
            fn(o)
        return f

    sq, sk, sv = (kt.to_kiln(t) for t in (q, k, v))
    for t in (sq, sk, sv):
        t.requires_grad_(True)
    sdout = kt.to_kiln(dout)
    split("kiln.torch", lambda: kt.flex_attention(q, k, v, block_mask=bm), clear_and(lambda o: o.backward(dout)))
    split("kiln.torch, grad()", lambda: kt.flex_attention(q, k, v, block_mask=bm),
          lambda o: torch.autograd.grad(o, (q, k, v), dout))
    def native_back(o):
        sq.grad = sk.grad = sv.grad = None
        o.backward(sdout)

    split("kiln native", lambda: kfa.flex_attention(sq, sk, sv, block_mask=bm), native_back)
    with kt._on_torch_stream(dev):  # the adapter's kiln calls alone: DLPack views, torch's stream
        vq, vk, vv = (kt._leaf(t, True) for t in (q, k, v))
        vdout = kt._kiln_view(dout)
        split("kiln on views", lambda: kt._C.flex_attention(vq, vk, vv, None, bm, None, False, False),
              lambda o: kt._C._autograd_grad([o], [vq, vk, vv], [vdout], False, False))
    if "floor" in PARTS:
        split("torch Function, nothing", lambda: _Nothing.apply(True, None, bm, None, False, False, [], q, k, v),
              clear_and(lambda o: o.backward(dout)))
        split("Function + views", lambda: _Views.apply(True, None, bm, None, False, False, [], q, k, v),
              clear_and(lambda o: o.backward(dout)))
    g0 = torch.empty_like(q)
    t0 = time.perf_counter()
    for _ in range(1000):
        kt._kiln_view(q)
    t1 = time.perf_counter()
    for _ in range(1000):
        kt._torch_view(sq)
    t2 = time.perf_counter()
    for _ in range(1000):
        with kt._on_torch_stream(dev):
            pass
    t3 = time.perf_counter()
    for _ in range(1000):
        g0.contiguous().to(dev)
    t4 = time.perf_counter()
    print(f"{TAG} pieces, us: _kiln_view {(t1 - t0) * 1e3:.2f}, _torch_view {(t2 - t1) * 1e3:.2f}, "
          f"_on_torch_stream {(t3 - t2) * 1e3:.2f}, contiguous+to {(t4 - t3) * 1e3:.2f}", flush=True)

tbm = None
try:
    if "torch" not in PARTS:
        raise RuntimeError("not asked for")
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    tf = torch.compile(flex_attention)
    tbm = create_block_mask(lambda b, h, qi, kv: (qi >= kv) & (qi - kv < W), None, None, S, S, device=dev)

    def tfwd():
        tf(qd, kd, vd, block_mask=tbm)

    def tfwd_bwd():
        q.grad = k.grad = v.grad = None
        tf(q, k, v, block_mask=tbm).backward(dout)

    for _ in range(3):
        tfwd_bwd()
    for name, fn in (("torch flex fwd", tfwd), ("torch flex fwd+bwd", tfwd_bwd)):
        print(f"{name:24s} events {event_ms(fn):7.3f} ms/call   host {host_ms(fn):7.3f} ms/call", flush=True)
except Exception as e:  # the kiln figures above stand alone
    print("torch flex skipped:", repr(e)[:200])

if "cprofile" in PARTS:
    prof = cProfile.Profile()
    sync()
    prof.enable()
    for _ in range(ITERS):
        fwd_bwd()
    prof.disable()
    sync()
    pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)

if "kernels" in PARTS:  # the GPU's own time per fwd+bwd, kernel by kernel (20 calls)
    from torch.profiler import ProfilerActivity, profile
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(20):
            fwd_bwd()
        sync()
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=60))
    out = os.environ.get("OUT")
    if out:
        p.export_chrome_trace(os.path.join(out, f"flex_host_trace{TAG}.json"))
