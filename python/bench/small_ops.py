"""Small CPU ops: kiln with its default threads, kiln pinned to one thread, and PyTorch's CPU eager
with its default threads, side by side in one process. Twenty ops at [512, 64] and [64, 64] (fp32),
then a few large ones to show they still spread over every core.

    PYTHONPATH=build/python /work/venv-torch/bin/python python/bench/small_ops.py
    PYTHONPATH=build/python python3 python/bench/small_ops.py --no-torch      # kiln alone

Times: the best of --repeats batches of calls (each batch long enough to time), in microseconds per
call; the best batch is the least disturbed by neighbours on a shared machine (kiln's default and
one-thread batches alternate). Ratios of the best times: kiln-default / kiln-1-thread (the grain
sizes should keep it near 1) and kiln-default / torch.
"""
import argparse
import os
import platform
import sys
import time

if "--no-torch" not in sys.argv:
    import torch
    import torch.nn.functional as TF
else:
    torch = TF = None

import kiln  # noqa: E402
import kiln.nn.functional as KF  # noqa: E402


def batch_size(fn, min_batch_s=0.01):
    fn()
    n = 1
    while True:  # a batch size that lasts at least min_batch_s
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t0 >= min_batch_s or n >= 1 << 16:
            return n
        n *= 2


def best_us(fn, repeats):
    """Best microseconds per call of fn over `repeats` batches."""
    n = batch_size(fn)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def paired_us(fn, repeats, setup_a, setup_b):
    """(best us under setup_a, best us under setup_b): the batches alternate A B A B ..., so that a
    neighbour's burst of load hits both alike."""
    n = batch_size(fn)
    times = ([], [])
    for _ in range(repeats):
        for i, setup in enumerate((setup_a, setup_b)):
            setup()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[i].append((time.perf_counter() - t0) / n)
    return min(times[0]) * 1e6, min(times[1]) * 1e6


def small_ops(lib, F, x, y, w, cond):
    """The twenty ops, for either library (kiln or torch share these names)."""
    return [
        ("add", lambda: x + y), ("sub", lambda: x - y), ("mul", lambda: x * y), ("div", lambda: x / y),
        ("add scalar", lambda: x + 0.5), ("mul scalar", lambda: x * 2.0), ("maximum", lambda: lib.maximum(x, y)),
        ("where", lambda: lib.where(cond, x, y)), ("relu", lambda: F.relu(x)), ("gelu", lambda: F.gelu(x)),
        ("silu", lambda: F.silu(x)), ("exp", lambda: lib.exp(x)), ("tanh", lambda: lib.tanh(x)),
        ("sigmoid", lambda: lib.sigmoid(x)), ("sum", lambda: x.sum()), ("sum(-1)", lambda: x.sum(-1)),
        ("amax(-1)", lambda: x.amax(-1)), ("softmax(-1)", lambda: F.softmax(x, -1)),
        ("rms_norm", lambda: F.rms_norm(x, (x.shape[-1],), w[0], 1e-6)), ("linear", lambda: F.linear(x, w)),
    ]


def inputs(lib, shape, seed):
    lib.manual_seed(seed)
    x, y = lib.randn(*shape), lib.rand(*shape) + 0.5
    w = lib.randn(shape[-1], shape[-1])
    return x, y, w, x > 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    default_threads = kiln.get_num_threads()
    print(f"kiln threads {default_threads}, torch threads {torch.get_num_threads() if torch else '-'}, "
          f"{platform.machine()} {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}")
    print(f"{'shape':<9} {'op':<12} {'kiln us':>8} {'1-thr us':>8} {'torch us':>8} {'kiln/1thr':>9} "
          f"{'kiln/torch':>10}")
    worst_thr = worst_torch = 0.0
    for shape in ((512, 64), (64, 64)):
        kx = inputs(kiln, shape, 0)
        kops = small_ops(kiln, KF, *kx)
        tops = small_ops(torch, TF, *(torch.from_dlpack(a) for a in kx)) if torch else [None] * len(kops)
        for (name, kf), top in zip(kops, tops):
            k_def, k_one = paired_us(kf, args.repeats, lambda: kiln.set_num_threads(default_threads),
                                            lambda: kiln.set_num_threads(1))
            kiln.set_num_threads(default_threads)
            ratio = k_def / k_one
            t_us = best_us(top[1], args.repeats) if torch else float("nan")
            worst_thr, worst_torch = max(worst_thr, ratio), max(worst_torch, k_def / t_us if torch else 0)
            print(f"{'x'.join(map(str, shape)):<9} {name:<12} {k_def:8.1f} {k_one:8.1f} {t_us:8.1f} "
                  f"{ratio:9.2f} {k_def / t_us:10.2f}")
    print(f"worst kiln/1-thread {worst_thr:.2f} (bound 1.5), worst kiln/torch {worst_torch:.2f} (bound 2)")

    # Large ops: the default spreads them over every thread; speed-up = 1-thread time / default time
    # (near the thread count when every thread works). On a loaded machine a parallel op can still be
    # slower than one thread (a descheduled thread holds up the others at the barrier).
    print(f"\n{'large op':<22} {'kiln us':>9} {'1-thr us':>9} {'speed-up':>9}")
    big = kiln.randn(2048, 2048)
    wbig = kiln.randn(1024, 2048)
    for name, fn in (("mul [2048,2048]", lambda: big * big), ("exp [2048,2048]", lambda: kiln.exp(big)),
                     ("sum(-1) [2048,2048]", lambda: big.sum(-1)), ("softmax [2048,2048]", lambda: KF.softmax(big, -1)),
                     ("linear 2048x2048x1024", lambda: KF.linear(big, wbig))):
        k_def = best_us(fn, 3)
        kiln.set_num_threads(1)
        k_one = best_us(fn, 3)
        kiln.set_num_threads(default_threads)
        print(f"{name:<22} {k_def:9.1f} {k_one:9.1f} {k_one / k_def:9.2f}")

if __name__ == "__main__":
    main()
