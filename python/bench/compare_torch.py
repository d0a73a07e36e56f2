"""kiln against PyTorch, side by side in one process: fused linear cross-entropy (three LLM head
shapes) and FlexAttention (seven mask / score rows).

    PYTHONPATH=build/python python3 python/bench/compare_torch.py            # on the GPU machine
    scripts/gpu.sh lce flex                                                  # the same, built there
    python3 python/bench/compare_torch.py --only flex --quick
    python3 python/bench/compare_torch.py --device cpu --quick               # tiny smoke run

LCE (bf16): torch eager (fp32 logits), torch.compile of the same, kiln's memory and speed strategies
(kiln.torch.linear_cross_entropy), and the three GEMMs alone (the floor). Flex (bf16): torch's
flex_attention compiled, SDPA with a dense boolean mask on the window rows (cuDNN causal for the
causal row), kiln.torch.flex_attention; block-mask creation times for both. Times: CUDA events after
warm-up, mean per iteration; fwd runs under no_grad, fwd+bwd backpropagates a fixed random gradient.
Memory: peak allocated during one fwd+bwd minus what was allocated before, torch's allocator
(torch.cuda.max_memory_allocated) plus kiln's (kiln.cuda.max_memory_allocated) — kiln's outputs and
gradients live in kiln's allocator. Prints one table; writes everything to $OUT/compare_torch.json
(or --out), rewritten after every row. A variant that fails (e.g. a kernel not implemented yet) is reported with its error.
"""
import argparse
import gc
import json
import math
import os
import platform
import sys
import time
import traceback

import torch
import torch.nn.functional as F

import kiln
import kiln.torch as kt
from kiln.nn.attention import flex_attention as kfa

MiB = 1 << 20


# ---------------------------------------------------------------- measurement

class Runner:
    def __init__(self, device, warmup, iters):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.warmup, self.iters = warmup, iters

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)
            kiln.cuda.synchronize()

    def time_ms(self, fn):
        for _ in range(self.warmup):
            fn()
        self.sync()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(self.iters):
                fn()
            end.record()
            end.synchronize()
            self.sync()
            return start.elapsed_time(end) / self.iters
        t0 = time.perf_counter()
        for _ in range(self.iters):
            fn()
        return (time.perf_counter() - t0) * 1e3 / self.iters

    def peak_extra(self, fn):
        """Extra peak bytes of one call over what was allocated before it: (torch, kiln)."""
        gc.collect()
        self.sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            t0 = torch.cuda.memory_allocated(self.device)
            kiln.cuda.reset_peak_memory_stats()
            k0 = kiln.cuda.memory_allocated()
        else:
            t0 = None
            kiln.cpu.reset_peak_memory_stats()
            k0 = kiln.cpu.memory_allocated()
        fn()
        self.sync()
        torch_extra = torch.cuda.max_memory_allocated(self.device) - t0 if self.cuda else None
        kiln_extra = (kiln.cuda.max_memory_allocated() if self.cuda else kiln.cpu.max_memory_allocated()) - k0
        return torch_extra, kiln_extra


def _error(e):
    return f"{type(e).__name__}: {e}".splitlines()[0][:300]


def median_call_ms(runner, fn, calls=5):
    """fn's last result and the median of `calls` timed calls, each synchronised: one timed BlockMask
    creation read 0.2 ms in one run and 9.0 in another on the H200, a host-side outlier."""
    times = []
    for _ in range(calls):
        runner.sync()
        t0 = time.perf_counter()
        out = fn()
        runner.sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return out, sorted(times)[calls // 2]


def _explain(e, note):
    msg = _error(e).lower()
    if "out of memory" in msg:
        return "out of memory"
    if isinstance(e, kiln.KilnError) and any(w in msg for w in ("not implemented", "without cuda", "for now",
                                                                "not supported")):
        return "kiln kernel not available on this device yet"
    return note


def run_variant(runner, fwd, fwd_bwd, note=None):
    """{fwd_ms, fwd_bwd_ms, peak_extra_mib, torch_peak_mib, kiln_peak_mib}; a part that fails gets
    fwd_error / fwd_bwd_error instead (e.g. a kernel not implemented yet)."""
    out = {"note": note} if note else {}
    if fwd_bwd is not None:
        # The first forward+backward alone: for compiled kernels (torch.compile, kiln's NVRTC with a
        # fresh cache directory, see main) this is the compile latency a training run pays once.
        try:
            t0 = time.perf_counter()
            fwd_bwd()
            runner.sync()
            out["first_call_ms"] = (time.perf_counter() - t0) * 1e3
        except Exception:  # reported by the timed run below
            pass
    for key, fn in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
        if fn is None:
            continue
        try:
            if key == "fwd":
                def fwd_nograd():
                    with torch.no_grad():
                        fn()
                out["fwd_ms"] = runner.time_ms(fwd_nograd)
            else:
                out["fwd_bwd_ms"] = runner.time_ms(fn)
                t_extra, k_extra = runner.peak_extra(fn)
                out["torch_peak_mib"] = None if t_extra is None else t_extra / MiB
                out["kiln_peak_mib"] = k_extra / MiB
                out["peak_extra_mib"] = None if t_extra is None else (t_extra + k_extra) / MiB
        except Exception as e:  # a variant that cannot run is reported, not fatal
            out[f"{key}_error"] = _error(e)
            if _explain(e, None):
                out["note"] = _explain(e, None)
            if os.environ.get("COMPARE_TORCH_TRACE"):
                traceback.print_exc()
        finally:
            gc.collect()
            if runner.cuda:
                torch.cuda.empty_cache()
    return out


def ratio(a, b, key):
    x, y = a.get(key), b.get(key)
    return x / y if x is not None and y else None


# ---------------------------------------------------------------- linear cross-entropy

def lce_shapes(args):
    if args.device == "cpu":
        return [dict(N=256, H=64, V=1000)] if args.quick else [dict(N=2048, H=1024, V=32000)]
    full = [dict(N=8192, H=4096, V=128256), dict(N=8192, H=2304, V=256000), dict(N=32768, H=4096, V=128256)]
    if getattr(args, "lce_rows", None):  # a subset, e.g. "0,2"
        return [full[int(i)] for i in args.lce_rows.split(",")]
    return full[:1] if args.quick else full


def bench_lce(runner, args, rows, save):
    """Appends one row per shape to rows, calling save() after each."""
    dev, dtype = runner.device, (torch.bfloat16 if runner.cuda else torch.float32)
    for shp in lce_shapes(args):
        N, H, V = shp["N"], shp["H"], shp["V"]
        g = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(N, H, device=dev, dtype=dtype, generator=g).requires_grad_()
        w = (torch.randn(V, H, device=dev, dtype=dtype, generator=g) * (1 / math.sqrt(H))).requires_grad_()
        t = torch.randint(0, V, (N,), device=dev, generator=g)

        def clear():
            x.grad = w.grad = None

        def eager_loss(x_, w_, t_):
            return F.cross_entropy((x_ @ w_.T).float(), t_)

        def step(loss_fn):
            def f():
                clear()
                loss_fn().backward()
            return f

        variants = {}
        variants["torch_eager"] = run_variant(runner, lambda: eager_loss(x, w, t), step(lambda: eager_loss(x, w, t)))
        if runner.cuda or args.compile_cpu:
            compiled = torch.compile(eager_loss)
            variants["torch_compile"] = run_variant(runner, lambda: compiled(x, w, t), step(lambda: compiled(x, w, t)))
        else:
            variants["torch_compile"] = {"note": "skipped on the CPU (inductor needs minutes; --compile-cpu runs it)"}
        if hasattr(torch.nn, "LinearCrossEntropyLoss"):
            tl = torch.nn.LinearCrossEntropyLoss
            variants["torch_linear_cross_entropy"] = run_variant(
                runner, None, step(lambda: F.linear_cross_entropy(x, w, t)) if hasattr(F, "linear_cross_entropy")
                else step(lambda: tl(H, V)(x, t)))
        for strategy in ("memory", "speed"):
            fn = (lambda s=strategy: kt.linear_cross_entropy(x, w, t, strategy=s))
            variants[f"kiln_{strategy}"] = run_variant(runner, fn, step(fn))
        # The three GEMMs of forward + backward alone: logits, d_input, d_weight (the floor).
        logits_grad = torch.randn(N, V, device=dev, dtype=dtype, generator=g)

        def gemm3():
            with torch.no_grad():
                x @ w.T
                logits_grad @ w
                logits_grad.T @ x
        variants["gemm3"] = run_variant(runner, None, gemm3)
        variants["gemm3"].pop("peak_extra_mib", None)
        del logits_grad
        ratios = {
            "kiln_memory_vs_gemm3": ratio(variants["kiln_memory"], variants["gemm3"], "fwd_bwd_ms"),
            "kiln_speed_vs_gemm3": ratio(variants["kiln_speed"], variants["gemm3"], "fwd_bwd_ms"),
            "kiln_speed_vs_compile": ratio(variants["kiln_speed"], variants["torch_compile"], "fwd_bwd_ms"),
            "kiln_memory_vs_compile": ratio(variants["kiln_memory"], variants["torch_compile"], "fwd_bwd_ms"),
            "kiln_speed_vs_eager": ratio(variants["kiln_speed"], variants["torch_eager"], "fwd_bwd_ms"),
            "kiln_memory_peak_vs_compile": ratio(variants["kiln_memory"], variants["torch_compile"], "peak_extra_mib"),
            "kiln_speed_peak_vs_compile": ratio(variants["kiln_speed"], variants["torch_compile"], "peak_extra_mib"),
        }
        rows.append({"name": f"lce N={N} H={H} V={V} {str(dtype).split('.')[-1]}", "shape": shp,
                     "variants": variants, "ratios": ratios})
        print_row(rows[-1])
        save()
        del x, w, t
        gc.collect()


# ---------------------------------------------------------------- flex attention

FLEX_ROWS = [
    dict(B=1, H=8, S=32768, D=64, mask="sliding", W=256, sdpa="dense"),
    dict(B=1, H=16, S=32768, D=128, mask="sliding", W=256, sdpa="dense"),
    dict(B=4, H=16, S=8192, D=128, mask="sliding", W=1024, sdpa="dense"),
    dict(B=4, H=16, S=8192, D=128, mask="causal", sdpa="causal"),
    dict(B=1, H=16, S=32768, D=128, mask="document", docs=16, sdpa=None),
    dict(B=1, H=16, S=16384, D=128, mask="causal", score="alibi", sdpa=None),
    dict(B=1, H=16, S=16384, D=128, mask="causal", score="softcap", cap=30.0, sdpa=None),
]


def flex_rows(args):
    if args.device == "cpu":
        tiny = [dict(B=1, H=2, S=256, D=32, mask="sliding", W=64, sdpa="dense"),
                dict(B=1, H=2, S=256, D=32, mask="causal", sdpa="causal"),
                dict(B=1, H=2, S=256, D=32, mask="document", docs=4, sdpa=None),
                dict(B=1, H=2, S=256, D=32, mask="causal", score="alibi", sdpa=None),
                dict(B=1, H=2, S=256, D=32, mask="causal", score="softcap", cap=30.0, sdpa=None)]
        return tiny[:3] if args.quick else tiny
    if getattr(args, "rows", None):  # a subset, e.g. "0,3,4", to fit one device call
        return [FLEX_ROWS[int(i)] for i in args.rows.split(",")]
    return [FLEX_ROWS[0], FLEX_ROWS[3], FLEX_ROWS[5]] if args.quick else FLEX_ROWS


def row_name(r):
    mask = {"sliding": f"causal window {r.get('W')}", "causal": "causal",
            "document": f"{r.get('docs')} packed documents, causal"}[r["mask"]]
    if r.get("score") == "alibi":
        mask += " + ALiBi"
    elif r.get("score") == "softcap":
        mask += f" + softcap {r['cap']:g}"
    return f"flex {r['B']}x{r['H']}x{r['S']}x{r['D']}, {mask}"


def kiln_capture_device(dev):
    """Where kiln's flex can read captured tensors: q's device if it can, else the CPU."""
    if dev.type != "cuda":
        return dev
    try:
        kfa.ScoreMod(lambda s, b, h, q, kv, t=torch.zeros(2, device=dev): s + t[h])
        return dev
    except kiln.KilnError:
        return torch.device("cpu")


def bench_flex(runner, args, rows, save):
    """Appends one row per mask / score row to rows, calling save() after each."""
    from torch.nn.attention.flex_attention import create_block_mask as torch_cbm
    from torch.nn.attention.flex_attention import flex_attention as torch_flex

    dev = runner.device
    dtype = torch.bfloat16 if runner.cuda else torch.float32
    if not runner.cuda:  # the CPU smoke run uses torch's eager flex on purpose
        import warnings
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    cap_dev = kiln_capture_device(dev)
    for r in flex_rows(args):
        B, H, S, D = r["B"], r["H"], r["S"], r["D"]
        # A fresh compile per row: one shared compiled function hit dynamo's recompile limit (8)
        # after four rows on the H200 and silently fell back to eager flex (64 GiB of scores).
        if runner.cuda:
            torch._dynamo.reset()
        compiled_flex = torch.compile(torch_flex) if runner.cuda else torch_flex
        g = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=dtype, generator=g).requires_grad_() for _ in range(3))
        dout = torch.randn(B, H, S, D, device=dev, dtype=dtype, generator=g)
        W = r.get("W")
        docs = slopes = None
        if r["mask"] == "sliding":
            def mask_mod(b, h, qi, kv):
                return (qi >= kv) & (qi - kv < W)
        elif r["mask"] == "causal":
            def mask_mod(b, h, qi, kv):
                return qi >= kv
        else:
            lengths = torch.randint(1, 1000, (r["docs"],), generator=torch.Generator().manual_seed(1)).double()
            lengths = (lengths / lengths.sum() * S).long().clamp(min=1)
            lengths[-1] += S - lengths.sum()
            docs = torch.repeat_interleave(torch.arange(r["docs"]), lengths)
        score_mod = None
        if r.get("score") == "alibi":
            slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / H) for i in range(H)])
        torch_docs = docs.to(dev) if docs is not None else None
        torch_slopes = slopes.to(dev) if slopes is not None else None
        kiln_docs = docs.to(cap_dev) if docs is not None else None
        kiln_slopes = slopes.to(cap_dev) if slopes is not None else None
        cap = r.get("cap")

        def make_mask(doc_ids):
            if r["mask"] != "document":
                return mask_mod
            return lambda b, h, qi, kv: (doc_ids[qi] == doc_ids[kv]) & (qi >= kv)

        def make_score(sl):
            if r.get("score") == "alibi":
                return lambda s, b, h, qi, kv: s + sl[h] * (kv - qi)
            if r.get("score") == "softcap":
                return lambda s, b, h, qi, kv: cap * torch.tanh(s / cap)
            return None

        def clear():
            q.grad = k.grad = v.grad = None

        def fb(f):
            def step():
                clear()
                f().backward(dout)
            return step

        variants, info = {}, {}
        # Forward-only timings on detached inputs for both (torch's CPU flex refuses inputs needing
        # grad; kiln then records no autograd node): the inference forward, side by side.
        qd, kd, vd = q.detach(), k.detach(), v.detach()
        # torch: compiled flex_attention with its BlockMask (creation timed after a warm-up).
        try:
            tm = make_mask(torch_docs)
            torch_cbm(tm, None, None, S, S, device=dev, _compile=runner.cuda)
            tbm, info["torch_block_mask_ms"] = median_call_ms(
                runner, lambda: torch_cbm(tm, None, None, S, S, device=dev, _compile=runner.cuda))
            tsm = make_score(torch_slopes)
            tf = (lambda: compiled_flex(q, k, v, score_mod=tsm, block_mask=tbm))
            tf_fwd = (lambda: compiled_flex(qd, kd, vd, score_mod=tsm, block_mask=tbm))
            variants["torch_flex"] = run_variant(runner, tf_fwd, fb(tf), note=None if runner.cuda else "eager (CPU)")
        except Exception as e:
            variants["torch_flex"] = {"error": _error(e)}
        # SDPA: a dense boolean mask on the window rows; cuDNN / flash causal for the causal row.
        if r["sdpa"] == "dense":
            need = B * S * S  # bool mask bytes (broadcast over heads)
            if need > args.dense_limit_gib * (1 << 30):
                variants["sdpa_dense_mask"] = {"note": f"dense mask of {need / (1 << 30):.1f} GiB skipped"}
            else:
                try:
                    i = torch.arange(S, device=dev)
                    dense = ((i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < W)).view(1, 1, S, S)
                    sf = (lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense))
                    variants["sdpa_dense_mask"] = run_variant(runner, sf, fb(sf))
                    del dense
                except Exception as e:
                    variants["sdpa_dense_mask"] = {"error": _error(e)}
        elif r["sdpa"] == "causal":
            sf = (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            variants["sdpa_causal"] = run_variant(runner, sf, fb(sf), note="is_causal=True (cuDNN / flash)")
        # kiln: kiln.torch.flex_attention with kiln's BlockMask (interval analysis, CPU-built).
        try:
            km = make_mask(kiln_docs)
            kfa.create_block_mask(km, None, None, S, S, device=str(dev), BLOCK_SIZE=128)  # warm-up, as torch's
            kbm, info["kiln_block_mask_ms"] = median_call_ms(
                runner, lambda: kfa.create_block_mask(km, None, None, S, S, device=str(dev), BLOCK_SIZE=128))
            info["kiln_block_mask_bytes"] = kbm.nbytes
            info["sparsity_percent"] = kbm.sparsity()
            ksm = kfa.ScoreMod(make_score(kiln_slopes)) if make_score(kiln_slopes) is not None else None
            kf = (lambda: kt.flex_attention(q, k, v, score_mod=ksm, block_mask=kbm))
            kf_fwd = (lambda: kt.flex_attention(qd, kd, vd, score_mod=ksm, block_mask=kbm))
            variants["kiln_flex"] = run_variant(runner, kf_fwd, fb(kf))
        except Exception as e:
            variants["kiln_flex"] = {"error": _error(e), "note": _explain(e, "kiln flex could not be set up")}
        ref = variants.get("torch_flex", {})
        ratios = {"kiln_vs_torch_flex_fwd": ratio(variants["kiln_flex"], ref, "fwd_ms"),
                  "kiln_vs_torch_flex_fwd_bwd": ratio(variants["kiln_flex"], ref, "fwd_bwd_ms"),
                  "kiln_vs_torch_flex_first_call": ratio(variants["kiln_flex"], ref, "first_call_ms")}
        for name in ("sdpa_dense_mask", "sdpa_causal"):
            if name in variants:
                ratios[f"kiln_vs_{name}_fwd_bwd"] = ratio(variants["kiln_flex"], variants[name], "fwd_bwd_ms")
        rows.append({"name": row_name(r), "shape": r, "variants": variants, "ratios": ratios, "info": info})
        print_row(rows[-1])
        save()
        del q, k, v, dout
        gc.collect()


# ---------------------------------------------------------------- report

def fmt(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def peak(v):
    if v.get("peak_extra_mib") is not None:
        return fmt(v["peak_extra_mib"], ".1f")
    # CPU: torch keeps no statistics; kiln's own peak is shown with a "k".
    return fmt(v["kiln_peak_mib"], ".1f") + "k" if v.get("kiln_peak_mib") is not None else "-"


def print_table(rows, file=sys.stdout, header=True):
    head = f"{'benchmark':<48} {'variant':<24} {'fwd ms':>9} {'fwd+bwd ms':>11} {'peak MiB':>10}  notes"
    if header:
        print(head, file=file)
        print("-" * len(head), file=file)
    for row in rows:
        for i, (name, v) in enumerate(row["variants"].items()):
            notes = "; ".join(v[k] for k in ("error", "fwd_error", "fwd_bwd_error") if v.get(k))
            if v.get("note"):
                notes = f"{v['note']}" + (f" ({notes})" if notes else "")
            print(f"{row['name'] if i == 0 else '':<48} {name:<24} {fmt(v.get('fwd_ms')):>9} "
                  f"{fmt(v.get('fwd_bwd_ms')):>11} {peak(v):>10}  {notes[:120]}", file=file)
        rs = ", ".join(f"{k}={fmt(x, '.2f')}" for k, x in row["ratios"].items() if x is not None)
        info = ", ".join(f"{k}={fmt(x, '.1f') if isinstance(x, float) else x}" for k, x in row.get("info", {}).items())
        if rs or info:
            print(f"{'':<48} {'ratios':<24} {'; '.join(x for x in (rs, info) if x)}", file=file)
    print(file=file)


def print_row(row):
    """One row as soon as it is measured (a run cut short by a time limit still reports it)."""
    print_table([row], header=False)
    sys.stdout.flush()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=["lce", "flex"], help="run one family only")
    p.add_argument("--quick", action="store_true", help="fewer shapes and iterations")
    p.add_argument("--rows", help="FlexAttention rows on CUDA by index into FLEX_ROWS, e.g. 0,3,4")
    p.add_argument("--lce-rows", help="LCE shapes on CUDA by index (0: 8192x4096x128256, 1: 8192x2304x256000, "
                   "2: 32768x4096x128256), e.g. 0,2")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (a tiny smoke run)")
    p.add_argument("--out", help="JSON path (default $OUT/compare_torch.json, else ./compare_torch.json)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--dense-limit-gib", type=float, default=8.0, help="largest dense SDPA mask to build")
    p.add_argument("--compile-cpu", action="store_true", help="also run torch.compile on the CPU")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("torch sees no CUDA device (use --device cpu for the smoke run)")
    if args.device.startswith("cuda") and not kiln.cuda.is_available():
        p.error("kiln was built without CUDA or sees no device")
    warmup = args.warmup if args.warmup is not None else (1 if args.device == "cpu" else 3 if args.quick else 5)
    iters = args.iters if args.iters is not None else (2 if args.device == "cpu" else 5 if args.quick else 20)
    runner = Runner(args.device, warmup, iters)
    if "KILN_CACHE_DIR" not in os.environ:  # cold NVRTC cache, so kiln's first calls compile like torch's
        import tempfile
        os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln_cache_")
    torch.manual_seed(0)
    result = {"meta": {"torch": torch.__version__, "kiln": kiln.__version__, "python": platform.python_version(),
                       "device": torch.cuda.get_device_name(runner.device) if runner.cuda else platform.processor()
                       or platform.machine(), "argv": sys.argv[1:] if argv is None else list(argv),
                       "warmup": warmup, "iters": iters,
                       "time": time.strftime("%Y-%m-%d %H:%M:%S")}}
    out = args.out or os.path.join(os.environ.get("OUT") or ".", "compare_torch.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)

    def save():  # after every row: a run stopped by a time limit keeps the rows it measured
        with open(out, "w") as f:
            json.dump(result, f, indent=1)

    if args.only in (None, "lce"):
        result["lce"] = []
        bench_lce(runner, args, result["lce"], save)
    if args.only in (None, "flex"):
        result["flex"] = []
        bench_flex(runner, args, result["flex"], save)
    rows = result.get("lce", []) + result.get("flex", [])
    print(f"kiln {kiln.__version__} vs torch {torch.__version__} on {result['meta']['device']} "
          f"(warm-up {warmup}, {iters} iterations; peak = extra allocated over the inputs, torch + kiln; "
          f"'k': kiln's allocator only)")
    print_table(rows)
    save()
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
