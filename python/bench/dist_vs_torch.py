"""kiln.distributed against torch.distributed (both Gloo, CPU), in the same processes on one machine.

    PYTHONPATH=build/python python python/bench/dist_vs_torch.py                 # 2 and 4 processes
    PYTHONPATH=build/python python python/bench/dist_vs_torch.py --nproc 2 --max-mib 16 --quick

The script starts --nproc copies of itself with torchrun's variables; each joins torch's process group
(store on MASTER_PORT) and a kiln communicator (store on MASTER_PORT + 1). Both frameworks work on
the same torch buffers (kiln views them through DLPack once, outside the timed loop), float32, sizes
1 KiB - 256 MiB (sizes grow 4x). all_gather's size is its output (nccl-tests' convention), so each rank gives size / n.
Each round times `iters` back-to-back ops of one framework after a barrier (rank 0's clock; the ops
are blocking collectives), the frameworks alternate order round by round, and the median round
counts; kiln / torch is the median over rounds of the ratio within the round.
Bus bandwidth as nccl-tests: busbw = algbw * 2(n-1)/n for all_reduce, algbw * (n-1)/n for all_gather.
Before timing, each size checks that both frameworks give the same result.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from kiln.distributed._ports import free_port_pair

KiB, MiB = 1 << 10, 1 << 20


def sizes(min_bytes, max_bytes):
    s, out = min_bytes, []
    while s <= max_bytes:
        out.append(s)
        s *= 4
    return out


def plan(nbytes, quick):
    """(iters per round, rounds): about 64 MiB moved per round, at least 3 ops, 5 rounds."""
    iters = max(3, min(200, (64 * MiB) // nbytes))
    rounds = 5
    if quick:
        iters, rounds = max(1, iters // 8), 3
    return iters, rounds


# ---------------------------------------------------------------- worker (one rank)

def worker(args):
    import torch
    import torch.distributed as tdist

    import kiln
    import kiln.distributed as kdist

    tdist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    comm = kdist.new_comm("gloo", device="cpu", name="bench", timeout=600.0, check_inputs=not args.no_input_check)
    rank, n = comm.get_rank(), comm.get_size()
    assert (rank, n) == (tdist.get_rank(), tdist.get_world_size())

    def timed(fn, iters):
        tdist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) / iters

    results = []
    for op in args.ops:
        for nbytes in sizes(args.min_kib * KiB, args.max_mib * MiB):
            if op == "all_reduce":
                t = torch.zeros(nbytes // 4)
                k = kiln.from_dlpack(t)
                runs = {"torch": lambda: tdist.all_reduce(t), "kiln": lambda: comm.all_reduce(k)}
                check_in, check_out = (t,), (t,)
                factor = 2 * (n - 1) / n
            else:
                out, inp = torch.zeros(nbytes // 4), torch.zeros(nbytes // 4 // n)
                ko, ki = kiln.from_dlpack(out), kiln.from_dlpack(inp)
                runs = {"torch": lambda: tdist.all_gather_into_tensor(out, inp),
                        "kiln": lambda: comm.all_gather_single(ko, ki)}
                check_in, check_out = (inp,), (out,)
                factor = (n - 1) / n
            # Same answer from both on rank-dependent data, then back to zeros (sums of zeros stay finite).
            got = {}
            for name, fn in runs.items():
                for x in check_in:
                    x.copy_(torch.arange(x.numel(), dtype=torch.float32).remainder_(97).add_(rank))
                fn()
                got[name] = check_out[0].clone()
            assert torch.equal(got["torch"], got["kiln"]), f"{op} {nbytes}: kiln and torch disagree"
            for x in check_in + check_out:
                x.zero_()
            iters, rounds = plan(nbytes, args.quick)
            times = {"torch": [], "kiln": []}
            for name, fn in runs.items():
                fn()  # warm-up
            for r in range(rounds):
                order = ("torch", "kiln") if r % 2 == 0 else ("kiln", "torch")
                for name in order:
                    times[name].append(timed(runs[name], iters))
            row = {"op": op, "bytes": nbytes, "iters": iters, "rounds": rounds}
            for name in ("torch", "kiln"):
                sec = statistics.median(times[name])
                row[name + "_us"] = sec * 1e6
                row[name + "_busbw"] = nbytes / sec * factor / 1e9
            # Paired: each round's torch time over the same round's kiln time, so load that drifts
            # between rounds (a shared machine) cancels out.
            row["ratio"] = statistics.median(t / k for t, k in zip(times["torch"], times["kiln"]))
            results.append(row)
            if rank == 0:
                print(f"  {op:10s} {fmt_size(nbytes):>8s}  torch {row['torch_busbw']:7.3f}  kiln {row['kiln_busbw']:7.3f} "
                      f"GB/s  {row['ratio']:.2f}x", file=sys.stderr, flush=True)
            del runs
    comm.barrier()
    tdist.barrier()
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    tdist.destroy_process_group()


# ---------------------------------------------------------------- launcher

def fmt_size(b):
    return f"{b // MiB} MiB" if b >= MiB else f"{b // KiB} KiB"


def launch(nproc, argv, limit):
    port = free_port_pair()
    procs = []
    for r in range(nproc):
        # OMP_NUM_THREADS=1 as torchrun sets it: idle OpenMP workers spinning after a tensor fill would
        # otherwise take the cores the collectives need.
        env = dict(os.environ, OMP_NUM_THREADS="1", RANK=str(r), WORLD_SIZE=str(nproc), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(nproc),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", *argv], env=env,
                                      stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL, text=True))
    try:
        out, _ = procs[0].communicate(timeout=limit)
        for p in procs[1:]:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    bad = [p.returncode for p in procs if p.returncode != 0]
    if bad:
        raise SystemExit(f"{nproc} processes: a rank failed (exit codes {[p.returncode for p in procs]})")
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def describe_machine():
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    p.add_argument("--min-kib", type=int, default=1)
    p.add_argument("--max-mib", type=int, default=256)
    p.add_argument("--ops", nargs="+", default=["all_reduce", "all_gather"], choices=["all_reduce", "all_gather"])
    p.add_argument("--quick", action="store_true", help="fewer iterations and rounds")
    p.add_argument("--no-input-check", action="store_true",
                   help="kiln without its per-op input check (check_inputs=False: one exchange less per op)")
    p.add_argument("--out", help="write every row as JSON here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    import torch

    import kiln  # noqa: F401  (fail here, not in every rank, when kiln is not importable)

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        commit = "?"
    print(f"date {datetime.date.today()}, commit {commit or '?'}, {describe_machine()}, torch {torch.__version__}")
    print("command: " + " ".join([os.path.basename(sys.executable)] + sys.argv))
    argv = ["--min-kib", str(args.min_kib), "--max-mib", str(args.max_mib), "--ops", *args.ops]
    argv += (["--quick"] if args.quick else []) + (["--no-input-check"] if args.no_input_check else [])
    everything = {}
    for nproc in args.nproc:
        print(f"{nproc} processes:", file=sys.stderr, flush=True)
        everything[nproc] = launch(nproc, argv, limit=3600)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(everything, f, indent=1)
    print("\n| processes | op | size | torch busbw GB/s | kiln busbw GB/s | kiln / torch |")
    print("| --- | --- | --- | --- | --- | --- |")
    for nproc, rows in everything.items():
        for r in rows:
            print(f"| {nproc} | {r['op']} | {fmt_size(r['bytes'])} | {r['torch_busbw']:.3f} | {r['kiln_busbw']:.3f} "
                  f"| {r['ratio']:.2f}x |")


if __name__ == "__main__":
    main()
