#!/usr/bin/env python3
"""GPU training benchmark: kiln's GPT vs the same model in PyTorch eager and torch.compile.

Same shapes and precision on every side: the gpt125m preset (12 layers, d 768, 12 heads, SwiGLU
2048, vocabulary 131072, sequence 4096), bf16 autocast with fp32 master weights, AdamW (PyTorch:
fused=True), gradient clipping, synthetic data (random tokens in documents of random lengths,
mean seq/4). kiln runs `kiln train --synthetic --bench-steps N` (FlexAttention with the causal +
document mask, fused linear cross-entropy) and reports a per-phase breakdown from CUDA events.
PyTorch runs scripts/torch_gpt.py: SDPA (is_causal=True by default, so PyTorch gets its flash
kernel; --torch-attn mask adds the document mask as a dense attn_mask) and the unfused loss
(materialised [tokens, vocab] logits, as F.cross_entropy needs). Each framework runs in its own
process, so peak memory (max_memory_allocated, reset after the model is built) is its own.

Prints a table (tokens/s, peak memory, kiln's ratios) and kiln's phase breakdown; writes the full
JSON to $OUT/train_bench.json (or --out), rewritten after each framework, so a run cut short keeps
what it measured. `scripts/gpu.sh train` runs it on the GPU machine.

  python3 bench/train_bench.py --kiln build/kiln             # the GPU benchmark
  python3 bench/train_bench.py --kiln build/kiln --tiny      # CPU smoke test with tiny shapes
"""
import argparse, json, os, subprocess, sys, tempfile, time

T_PROCESS = time.time()  # a torch worker's start: its startup_s runs from here

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "scripts"))  # torch_gpt.py

PRESET = {"vocab_size": 131072, "dim": 768, "n_layers": 12, "n_heads": 12, "mlp_hidden": 2048, "seq_len": 4096,
          "sliding_window": 0, "rope_theta": 10000.0, "norm_eps": 1e-5}
TINY = {"vocab_size": 1024, "dim": 64, "n_layers": 2, "n_heads": 2, "seq_len": 256}


def model_config(args):
    m = dict(PRESET)
    if args.tiny:
        m.update(TINY)
    for k, a in (("vocab_size", args.vocab_size), ("seq_len", args.seq_len), ("dim", args.dim),
                 ("n_layers", args.layers), ("n_heads", args.heads)):
        if a:
            m[k] = a
    m["mlp_hidden"] = (8 * m["dim"] // 3 + 31) // 32 * 32  # kiln's rule (2048 at d 768)
    return m


# ---- kiln ----

def run_kiln(args, m, device, cache_dir=None, env_extra=None, steps=None, warmup=None, label="kiln"):
    """cache_dir: kiln's cache folder (KILN_CACHE_DIR; a fresh one is a cold start); steps/warmup
    override the benchmark's (the cold-start runs take one step)."""
    run_dir = tempfile.mkdtemp(prefix="kiln_train_bench_")
    steps = args.steps if steps is None else steps
    warmup = args.warmup if warmup is None else warmup
    cmd = [args.kiln, "train", "--preset", "gpt125m", "--synthetic", "--device", device,
           "--vocab-size", str(m["vocab_size"]), "--seq-len", str(m["seq_len"]), "--dim", str(m["dim"]),
           "--layers", str(m["n_layers"]), "--heads", str(m["n_heads"]),
           "--batch-size", str(args.batch_size), "--bench-steps", str(steps), "--bench-warmup", str(warmup),
           "--autocast", "bf16", "--progress", "plain", "--log-every", "1", "--run-dir", run_dir,
           "--seed", str(args.seed),
           # PyTorch's schedule below (peak 3e-4, floor 3e-5, warm-up min(30, steps)); kiln's
           # default (5e-3, meant for the tiny CPU model) made the 125M losses climb.
           "--lr", "3e-4", "--min-lr", "3e-5", "--warmup-steps", str(min(30, warmup + steps))]
    cmd += ["--threads", "0"]  # all cores: on CUDA the host builds each step's BlockMask
    cmd += args.kiln_args.split()
    env = dict(os.environ)
    if cache_dir:
        env["KILN_CACHE_DIR"] = cache_dir
    env.update(env_extra or {})
    print("$", " ".join(f"{k}={v}" for k, v in (env_extra or {}).items()), " ".join(cmd), flush=True)
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"framework": label, "error": f"timed out after {args.timeout} s"}
    except OSError as e:  # e.g. no kiln binary at --kiln
        return {"framework": label, "error": str(e)}
    sys.stdout.write(p.stdout[-4000:])
    if p.returncode != 0:
        sys.stdout.write(p.stderr[-4000:])
        return {"framework": label, "error": (p.stderr or p.stdout)[-2000:], "returncode": p.returncode}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith('{"'):
            r = json.loads(line)
            r["wall_s"] = time.time() - t0
            r["framework"] = label
            return r
    return {"framework": label, "error": "no JSON line in kiln's output"}


def cold_start_runs(args, m, device, cache_dir):
    """kiln's start without a compile cache: the pool's default workers (the benchmark run's own
    cache_dir, already filled by it, is the warm start) and one worker in a fresh cache (serial)."""
    serial = run_kiln(args, m, device, tempfile.mkdtemp(prefix="kiln_cache_"), {"KILN_JIT_WORKERS": "1"}, 1, 0,
                      "kiln-cold-serial")
    warm = run_kiln(args, m, device, cache_dir, None, 1, 0, "kiln-warm")
    return [serial, warm]


# ---- PyTorch (a worker process per variant) ----

def synthetic_batch(torch, B, T, V, mean_doc, gen, device):
    idx = torch.randint(0, V, (B, T + 1), generator=gen)
    lengths = torch.randint(1, 2 * mean_doc, (B, T + 1), generator=gen)
    docs = torch.zeros(B, T + 1, dtype=torch.int64)
    for b in range(B):  # document starts at cumulative random lengths
        starts = torch.cumsum(lengths[b], 0)
        starts = starts[starts < T + 1]
        docs[b, starts] = 1
    docs = torch.cumsum(docs, 1)
    inp, tgt = idx[:, :-1].clone(), idx[:, 1:].clone()
    tgt[docs[:, 1:] != docs[:, :-1]] = -100  # no target across a document boundary, as kiln's loader
    return inp.to(device), tgt.to(device), docs[:, :-1].contiguous().to(device)


def torch_worker(args):
    import torch
    from torch_gpt import init_weights, loss_fn, lr_at, param_groups
    m = json.loads(args.model_json)
    device = torch.device(args.worker_device)
    cuda = device.type == "cuda"
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    W = init_weights(m, device, gen)
    opt = torch.optim.AdamW(param_groups(W, 0.1), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=cuda)
    fn = loss_fn
    if args.worker == "compile":
        fn = torch.compile(loss_fn)
    B, T, V = args.batch_size, m["seq_len"], m["vocab_size"]
    batches = [synthetic_batch(torch, B, T, V, max(1, T // 4), gen, device) for _ in range(4)]
    params = list(W.values())
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    losses, step_s, first_step_s, startup_s = [], [], 0.0, 0.0
    total = args.warmup + args.steps
    for step in range(total):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, min(30, total), total, 3e-4, 3e-5)
        inp, tgt, docs = batches[step % len(batches)]
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = fn(W, m, inp, tgt, docs, args.torch_attn)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # syncs, as kiln's loop does
        if cuda:
            torch.cuda.synchronize()
        if step == 0:  # torch.compile compiles here
            first_step_s, startup_s = time.perf_counter() - t0, time.time() - T_PROCESS
        if step >= args.warmup:
            step_s.append(time.perf_counter() - t0)
    mean_s = sum(step_s) / max(1, len(step_s))
    r = {"kind": "torch_train_bench", "framework": "torch-" + args.worker, "device": str(device),
         "torch": torch.__version__, "attention": args.torch_attn, "batch_size": B, "seq_len": T,
         "tokens_per_step": B * T, "steps": len(step_s), "step_s": step_s, "step_s_mean": mean_s,
         "tokens_per_s": B * T / mean_s, "losses": losses, "first_step_s": first_step_s, "startup_s": startup_s,
         "params": sum(t.numel() for t in params)}
    if cuda:
        r["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        r["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    print(json.dumps(r), flush=True)


def run_torch(args, m, variant, device):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", variant, "--worker-device", device,
           "--model-json", json.dumps(m), "--batch-size", str(args.batch_size), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--torch-attn", args.torch_attn, "--seed", str(args.seed)]
    print(f"$ torch {variant} ({args.torch_attn} attention) on {device}", flush=True)
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"framework": "torch-" + variant, "error": f"timed out after {args.timeout} s"}
    if p.returncode != 0:
        sys.stdout.write(p.stderr[-4000:])
        return {"framework": "torch-" + variant, "error": p.stderr[-2000:], "returncode": p.returncode}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith('{"'):
            r = json.loads(line)
            r["wall_s"] = time.time() - t0
            return r
    return {"framework": "torch-" + variant, "error": "no JSON line"}


# ---- report ----

def gib(b):
    return f"{b / 2**30:8.2f}" if b else "     n/a"


def report(results):
    kiln = next((r for r in results if r.get("framework") == "kiln" and "error" not in r), None)
    print("\n%-16s %14s %11s %14s %14s" % ("framework", "tokens/s", "peak GiB", "kiln tok/s x", "kiln mem x"))
    for r in results:
        if "error" in r:
            print("%-16s  failed: %s" % (r["framework"], r["error"].strip().splitlines()[-1] if r["error"].strip() else "?"))
            continue
        tr = mr = ""
        if kiln and r is not kiln:
            tr = "%.2f" % (kiln["tokens_per_s"] / r["tokens_per_s"])
            if r.get("peak_allocated_bytes") and kiln.get("peak_allocated_bytes"):
                mr = "%.2f" % (kiln["peak_allocated_bytes"] / r["peak_allocated_bytes"])
        print("%-16s %14.0f %11s %14s %14s" % (r["framework"], r["tokens_per_s"], gib(r.get("peak_allocated_bytes")), tr, mr))
    if kiln:
        ph = kiln["phases_ms_per_step"]
        step_ms = kiln["step_s_mean"] * 1e3
        print("\nkiln step %.1f ms, per phase (ms/step, %% of step):" % step_ms)
        for k, v in sorted(ph.items(), key=lambda kv: -kv[1]):
            print("  %-12s %9.2f  %5.1f%%" % (k, v, 100 * v / step_ms if step_ms else 0))
        starts = [r for r in results if "error" not in r and r.get("startup_s")]
        if starts:
            print("\nstart to the end of the first step (s; kiln: compile cache empty unless 'warm'):")
            for r in starts:
                j = r.get("jit", {})
                extra = (f"  jit compiles {j.get('compiles')} in {j.get('compile_s', 0):.2f} s, disk hits "
                         f"{j.get('disk_hits')}, workers {j.get('workers_started')}") if j else ""
                print("  %-18s %8.2f%s" % (r["framework"], r["startup_s"], extra))
        eager = next((r for r in results if r.get("framework") == "torch-eager" and "error" not in r), None)
        if eager:
            ok_t = kiln["tokens_per_s"] >= eager["tokens_per_s"]
            ok_m = (eager.get("peak_allocated_bytes") or 0) > 0 and \
                kiln["peak_allocated_bytes"] <= 0.5 * eager["peak_allocated_bytes"]
            print("\ntargets: tokens/s >= eager: %s; peak memory <= 1/2 eager: %s"
                  % ("yes" if ok_t else "NO", "yes" if ok_m else "NO (or not measured)"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--kiln-args", default="", help="extra arguments for kiln train (e.g. '--mask-block 64')")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 10; 2 with --tiny)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed steps first, where torch.compile compiles (default 3; 1 with --tiny)")
    ap.add_argument("--vocab-size", type=int, default=0)
    ap.add_argument("--seq-len", type=int, default=0)
    ap.add_argument("--dim", type=int, default=0)
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--heads", type=int, default=0)
    ap.add_argument("--frameworks", default="kiln,eager,compile", help="comma list of kiln, eager, compile")
    ap.add_argument("--torch-attn", default="causal", choices=["causal", "mask"],
                    help="PyTorch attention: SDPA is_causal (flash) or the causal + document mask as attn_mask")
    ap.add_argument("--device", default="", help="cuda or cpu (default: cuda when torch sees one, else cpu)")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke test)")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--timeout", type=int, default=200, help="seconds per framework run")
    ap.add_argument("--out", default="", help="JSON path (default: $OUT/train_bench.json when OUT is set)")
    ap.add_argument("--cold-start", action="store_true",
                    help="kiln also starts with one compile worker in an empty cache, and with the warm cache")
    # worker mode (internal)
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    ap.add_argument("--worker-device", default="", help=argparse.SUPPRESS)
    ap.add_argument("--model-json", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return torch_worker(args)

    device = args.device
    if not device:
        try:
            import torch
            device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            device = "cpu"
    if args.tiny:
        args.batch_size = min(args.batch_size, 2)
    if args.steps is None:
        args.steps = 2 if args.tiny else 10
    if args.warmup is None:
        args.warmup = 1 if args.tiny else 3
    m = model_config(args)
    print(f"model {json.dumps(m)}; batch {args.batch_size}; {args.warmup} warm-up + {args.steps} timed steps on {device}",
          flush=True)
    out = args.out or (os.path.join(os.environ["OUT"], "train_bench.json") if os.environ.get("OUT") else "")
    results = []
    cache_dir = tempfile.mkdtemp(prefix="kiln_cache_")  # kiln starts cold, like a fresh torch.compile
    for fw in [f.strip() for f in args.frameworks.split(",") if f.strip()]:
        if fw == "kiln":
            results.append(run_kiln(args, m, device, cache_dir))
            if args.cold_start:
                results += cold_start_runs(args, m, device, cache_dir)
        else:
            results.append(run_torch(args, m, fw, device))
        if out:  # after each framework: a run stopped by its time limit keeps what it measured
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
            with open(out, "w") as f:
                json.dump({"model": m, "batch_size": args.batch_size, "device": device, "results": results}, f,
                          indent=1)
    report(results)
    if out:
        print("JSON:", out)
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
