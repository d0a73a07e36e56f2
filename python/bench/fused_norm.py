"""RMSNorm forward + backward on CUDA: kiln's fused kernels beside torch eager and torch.compile,
and against the device's copy bandwidth, side by side in one process.

    PYTHONPATH=build/python python3 python/bench/fused_norm.py        # on the GPU machine
    scripts/gpu.sh norm                                               # the same, built there

Each row: x [rows, H], weight [H] and the output gradient in bf16 (or --dtype); one iteration is the
forward and the backward with both gradients (x and weight). Bytes moved (the floor any kernel must
move): the forward reads x and writes y, the backward reads dy and x and writes dx, 5 * rows * H
elements; weight, rstd and the weight partials are under 1 % at these shapes and not counted. Copy
bandwidth: torch's device-to-device copy of a 1 GiB tensor, (read + write) bytes per second. Times:
CUDA events on torch's stream (kiln runs on it), after warm-up, median of --repeats means of --iters
iterations. Prints one table; writes $OUT/fused_norm.json (or --out).
"""
import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

import kiln
import kiln.torch as kt

EPS = 1e-5


def time_ms(fn, warmup, iters, repeats):
    for _ in range(warmup):
        fn()
    means = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        means.append(start.elapsed_time(end) / iters)
    return statistics.median(means)


def copy_bandwidth(args):
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), 3, 20, args.repeats)
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def torch_step(fn, x, w, g):
    def step():
        y = fn(x, w)
        torch.autograd.grad(y, (x, w), g)
    return step


def kiln_step(x, w, g):
    dev = x.device
    with kt._on_torch_stream(dev):
        xk, wk, gk = kt._kiln_view(x.detach()), kt._kiln_view(w.detach()), kt._kiln_view(g)
        xk.requires_grad_(True)
        wk.requires_grad_(True)

    def step():
        with kt._on_torch_stream(dev):
            y = kiln.nn.functional.rms_norm(xk, (x.shape[-1],), wk, EPS)
            kiln.autograd.grad([y], [xk, wk], [gk])
    return step


def check_kiln(x, w, g):
    """kiln's output and gradients against torch's fp32 composition (the benchmark's sanity check)."""
    dev = x.device
    with kt._on_torch_stream(dev):
        xk, wk = kt._kiln_view(x.detach()).requires_grad_(True), kt._kiln_view(w.detach()).requires_grad_(True)
        y = kiln.nn.functional.rms_norm(xk, (x.shape[-1],), wk, EPS)
        dx, dw = kiln.autograd.grad([y], [xk, wk], [kt._kiln_view(g)])
        got = [kt._torch_view(t).float() for t in (y, dx, dw)]
    x32, w32 = x.detach().float().requires_grad_(True), w.detach().float().requires_grad_(True)
    y32 = F.rms_norm(x32, (x.shape[-1],), w32, EPS)
    ref = [y32] + list(torch.autograd.grad(y32, (x32, w32), g.float()))
    return max(((a - b).norm() / b.norm()).item() for a, b in zip(got, ref))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="16384x768,16384x4096")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "fused_norm.json"))
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    bw = copy_bandwidth(args)
    result = {"device": torch.cuda.get_device_name(), "dtype": args.dtype, "copy_bytes_per_s": bw, "rows": []}
    compiled = torch.compile(lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS))
    eager = lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS)
    for shape in args.shapes.split(","):
        rows, H = (int(v) for v in shape.split("x"))
        x = torch.randn(rows, H, device="cuda", dtype=dtype, requires_grad=True)
        w = (torch.rand(H, device="cuda") + 0.5).to(dtype).requires_grad_(True)
        g = torch.randn(rows, H, device="cuda", dtype=dtype)
        moved = 5 * rows * H * x.element_size()
        row = {"shape": [rows, H], "bytes": moved, "kiln_rel_error_vs_fp32": check_kiln(x, w, g)}
        for name, step in (("kiln", kiln_step(x, w, g)), ("torch_eager", torch_step(eager, x, w, g)),
                           ("torch_compile", torch_step(compiled, x, w, g))):
            ms = time_ms(step, args.warmup, args.iters, args.repeats)
            row[name + "_ms"] = ms
            row[name + "_fraction_of_copy"] = moved / (ms * 1e-3) / bw
        row["kiln_vs_compile"] = row["torch_compile_ms"] / row["kiln_ms"]
        result["rows"].append(row)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(f"\nRMSNorm fwd+bwd ({args.dtype}, {result['device']}), copy bandwidth {bw / 1e12:.2f} TB/s")
    print(f"{'shape':>12} {'kiln ms':>8} {'kiln %copy':>10} {'compile ms':>10} {'compile %copy':>13} "
          f"{'eager ms':>8} {'compile/kiln':>12} {'kiln err':>9}")
    for r in result["rows"]:
        print(f"{'x'.join(map(str, r['shape'])):>12} {r['kiln_ms']:8.4f} {100 * r['kiln_fraction_of_copy']:9.1f}% "
              f"{r['torch_compile_ms']:10.4f} {100 * r['torch_compile_fraction_of_copy']:12.1f}% "
              f"{r['torch_eager_ms']:8.4f} {r['kiln_vs_compile']:11.2f}x {r['kiln_rel_error_vs_fp32']:9.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
