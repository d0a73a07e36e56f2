"""kiln.distributed across real processes on 127.0.0.1 (Gloo).

Each test starts N copies of this file (`python test_distributed.py CASE SEED TRACE_DIR`) with
torchrun's variables, bounded in time; the rank functions below check every op against a float64
NumPy reference of all ranks' inputs (each rank regenerates every rank's input from the seed).
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

if __name__ != "__main__":
    import pytest

import kiln
import kiln.distributed as dist
from kiln.distributed._ports import free_port_pair

REPO = Path(__file__).resolve().parents[2]
TOL = {"float32": 1e-5, "float64": 1e-12, "bfloat16": 1e-2, "float16": 2e-3, "int64": 0.0}
SIZES = (1, 13, 1001, 40_003)  # odd; the small ones complete inside the input check, the last through Gloo


# ---------------------------------------------------------------- launching

def _child_env(extra=None):
    env = dict(os.environ)
    pkg_root = str(Path(kiln.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def _finish(procs, logs, deadline, what):
    """Waits for every process until deadline (killing all on overrun); returns [(rc, out, err)]."""
    try:
        for p in procs:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    results = []
    for p, (out, err) in zip(procs, logs):
        results.append((p.returncode, Path(out).read_text(), Path(err).read_text()))
    return results


def _report(results):
    return "\n".join(f"--- rank {r}: rc {rc}\n{out}{err}" for r, (rc, out, err) in enumerate(results))


def launch(case, nproc, tmp_path, *, limit=40.0, expect=None):
    """Runs CASE on nproc ranks; every rank must exit with expect[rank] (default 0)."""
    seed = int.from_bytes(os.urandom(4), "little")
    port = free_port_pair()
    trace = tmp_path / "trace"
    procs, logs = [], []
    for r in range(nproc):
        env = _child_env({"RANK": str(r), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(r),
                          "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        out, err = tmp_path / f"{case}.{r}.out", tmp_path / f"{case}.{r}.err"
        with open(out, "w") as fo, open(err, "w") as fe:
            procs.append(subprocess.Popen([sys.executable, __file__, case, str(seed), str(trace)], env=env,
                                          stdout=fo, stderr=fe, cwd=tmp_path))
        logs.append((out, err))
    results = _finish(procs, logs, time.monotonic() + limit, case)
    expect = expect or [0] * nproc
    assert [rc for rc, _, _ in results] == expect, f"{case} (seed {seed}):\n{_report(results)}"
    return results


def _kiln_cli():
    cli = Path(kiln.__file__).resolve().parents[2] / "kiln"  # build/python/kiln -> build/kiln
    return cli if cli.is_file() else None


# ---------------------------------------------------------------- rank side: helpers

def rel_error(out, ref):
    out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert not np.isnan(out).any(), "NaN in output"
    denom = np.linalg.norm(ref.ravel())
    return np.linalg.norm((out - ref).ravel()) / (denom if denom > 0 else 1.0)


def check(out, ref, dtype, what):
    got = out.to(kiln.float64).numpy() if isinstance(out, kiln.Tensor) else np.asarray(out, dtype=np.float64)
    err = rel_error(got.ravel(), np.asarray(ref, dtype=np.float64).ravel())
    assert err <= TOL[dtype], f"{what} {dtype}: relative error {err:.3g} > {TOL[dtype]:g}"


def inputs(seed, tag, n, dtype, size, ints=(-50, 50)):
    """Every rank's input for one check, as float64 values exactly representable in dtype."""
    rng = np.random.default_rng([seed, tag])
    if dtype == "int64":
        return [rng.integers(*ints, size=n).astype(np.float64) for _ in range(size)]
    vals = [rng.standard_normal(n) * rng.uniform(0.5, 4.0) for _ in range(size)]
    return [kiln.tensor(v, dtype=getattr(kiln, dtype)).to(kiln.float64).numpy().copy() for v in vals]


def as_kiln(values, dtype):
    return kiln.tensor(values, dtype=getattr(kiln, dtype))


REDUCE = {"SUM": lambda xs: np.sum(xs, axis=0), "AVG": lambda xs: np.mean(xs, axis=0),
          "MIN": lambda xs: np.min(xs, axis=0), "MAX": lambda xs: np.max(xs, axis=0),
          "PRODUCT": lambda xs: np.prod(xs, axis=0)}


def expect_raises(exc, fn, *words):
    try:
        fn()
    except exc as e:
        for w in words:
            assert w in str(e), f"{w!r} not in {e}"
        return e
    raise AssertionError(f"{exc.__name__} was not raised")


# ---------------------------------------------------------------- rank side: cases

def case_ops(seed, trace):
    comm = dist.new_comm("gloo", device="cpu", name="ops", timeout=20.0, trace_dir=trace)
    R, S = comm.get_rank(), comm.get_size()
    assert (comm.get_name(), comm.get_backend()) == ("ops", "gloo")
    tag = 0
    for dtype in ("float32", "float64", "int64", "bfloat16", "float16"):
        for n in SIZES:
            for op in ("SUM", "AVG", "MIN", "MAX", "PRODUCT"):
                if op == "AVG" and dtype == "int64":
                    continue
                tag += 1
                xs = inputs(seed, tag, n, dtype, S, ints=(-3, 4) if op == "PRODUCT" else (-50, 50))
                t = as_kiln(xs[R], dtype)
                assert comm.all_reduce(t, getattr(dist.ReduceOp, op)) is None
                check(t, REDUCE[op](np.stack(xs)), dtype, f"all_reduce {op} n={n}")

            tag += 1
            xs = inputs(seed, tag, n, dtype, S)
            out = kiln.empty(S * n, dtype=getattr(kiln, dtype))
            comm.all_gather_single(out, as_kiln(xs[R], dtype))
            check(out, np.concatenate(xs), dtype, f"all_gather_single n={n}")

            for op in ("SUM", "MAX"):
                tag += 1
                xs = inputs(seed, tag, S * n, dtype, S)
                out = kiln.empty(n, dtype=getattr(kiln, dtype))
                comm.reduce_scatter_single(out, as_kiln(xs[R], dtype), getattr(dist.ReduceOp, op))
                check(out, REDUCE[op](np.stack(xs))[R * n:(R + 1) * n], dtype, f"reduce_scatter_single {op} n={n}")

            tag += 1
            xs = inputs(seed, tag, n, dtype, S)
            t = as_kiln(xs[R], dtype)
            comm.broadcast(t, S - 1)
            check(t, xs[S - 1], dtype, f"broadcast n={n}")

            tag += 1
            xs = inputs(seed, tag, S * n, dtype, S)
            out = kiln.empty(S * n, dtype=getattr(kiln, dtype))
            comm.all_to_all_single(out, as_kiln(xs[R], dtype))
            check(out, np.concatenate([xs[j][R * n:(R + 1) * n] for j in range(S)]), dtype, f"all_to_all_single n={n}")

            tag += 1
            xs = inputs(seed, tag, n, dtype, 2)
            got = kiln.empty(n, dtype=getattr(kiln, dtype))
            if R == 0:  # 0 sends then receives; 1 receives then sends
                comm.send(as_kiln(xs[0], dtype), 1)
                comm.recv(got, 1)
                check(got, xs[1], dtype, f"recv n={n}")
            elif R == 1:
                comm.recv(got, 0)
                check(got, xs[0], dtype, f"recv n={n}")
                comm.send(as_kiln(xs[1], dtype), 0)
    comm.barrier()

    # In-place forms: all_gather from this rank's block of the output, NumPy arrays through DLPack.
    xs = inputs(seed, 9001, 7, "float32", S)
    buf = as_kiln(np.concatenate([xs[r] if r == R else np.full(7, np.nan) for r in range(S)]), "float32")
    comm.all_gather_single(buf, buf.narrow(0, R * 7, 7))
    check(buf, np.concatenate(xs), "float32", "all_gather_single in place")
    arr = np.asarray(xs[R], dtype=np.float64).copy()
    comm.all_reduce(arr, dist.ReduceOp.MAX)
    check(arr, np.max(np.stack(xs), axis=0), "float64", "all_reduce of a NumPy array in place")

    # Async: ops run in call order; each Work ends COMPLETED and the tensors hold the results.
    xs = [inputs(seed, 9100 + k, 50_001, "float32", S) for k in range(3)]
    ts = [as_kiln(x[R], "float32") for x in xs]
    works = [comm.all_reduce(t, dist.ReduceOp.SUM, async_op=True) for t in ts]
    assert all(isinstance(w, dist.Work) for w in works)
    assert [w.seq for w in works] == sorted(w.seq for w in works)
    works.append(comm.barrier(async_op=True))
    for w in works:
        w.wait()
        assert w.is_completed() and w.status == dist.WorkStatus.COMPLETED, w
    for k, t in enumerate(ts):
        check(t, np.sum(np.stack(xs[k]), axis=0), "float32", f"async all_reduce {k}")
    w = comm.all_gather_single(kiln.empty(S * 3), kiln.ones(3), async_op=True)
    w.wait(10.0)
    assert w.status == dist.WorkStatus.COMPLETED

    # Ranks that disagree get the same clear error on every rank; the communicator stays usable.
    e = expect_raises(kiln.KilnError, lambda: comm.all_reduce(kiln.ones(5 if R == 0 else 6)),
                      "ranks called different collectives", "numel 5", "numel 6")
    assert not isinstance(e, dist.CommError)
    expect_raises(kiln.KilnError, lambda: comm.all_reduce(kiln.ones(3, dtype=kiln.int64), dist.ReduceOp.AVG),
                  "AVG needs a floating-point tensor")
    expect_raises(kiln.KilnError, lambda: comm.broadcast(kiln.ones(3), S), "root")
    expect_raises(TypeError, lambda: comm.all_reduce([1.0, 2.0]), "__dlpack__")
    t = kiln.full((3,), float(R))
    comm.all_reduce(t)
    check(t, np.full(3, S * (S - 1) / 2), "float32", "all_reduce after rejected ops")

    # split: the listed ranks, renumbered in order; None elsewhere.
    members = [0, S - 1]
    sub = comm.split(members, "ends")
    if R in members:
        assert (sub.get_rank(), sub.get_size(), sub.get_name()) == (members.index(R), 2, "ends")
        t = kiln.full((5,), float(R + 1))
        sub.all_reduce(t)
        check(t, np.full(5, float(1 + S)), "float32", "all_reduce on a split")
    else:
        assert sub is None
    comm.barrier()
    path = comm.dump_flight_recorder()
    assert Path(path).is_file() and path.endswith(f"ops.rank{R}.json"), path
    print(f"rank {R}: ok", flush=True)


def case_timeout(seed, trace):
    timeout = 1.0
    comm = dist.new_comm("gloo", name="slow", timeout=timeout, trace_dir=trace)
    side = dist.new_comm("gloo", name="side", timeout=30.0, trace_dir=trace)
    R = comm.get_rank()
    if R == 0:
        # wait(timeout) on an op that rank 1 never joins: TIMED_OUT and a TimeoutError.
        w = side.all_reduce(kiln.ones(4), async_op=True)
        start = time.monotonic()
        expect_raises(dist.TimeoutError, lambda: w.wait(0.5), "all_reduce")
        assert w.status == dist.WorkStatus.TIMED_OUT and w.is_completed(), w
        assert time.monotonic() - start < 0.5 + 1.0
        assert side.is_aborted()
        # The communicator's own timeout: rank 1 is asleep.
        start = time.monotonic()
        e = expect_raises(dist.TimeoutError, lambda: comm.all_reduce(kiln.ones(4)), "slow", "all_reduce", "seq 0",
                          "1")
        took = time.monotonic() - start
        assert took < timeout + 1.0, f"TimeoutError after {took:.2f} s"
        assert isinstance(e, dist.CommError) and isinstance(e, kiln.KilnError)
        assert comm.is_aborted()
        expect_raises(dist.CommError, lambda: comm.barrier(), "aborted")
        dump = Path(trace, "slow.rank0.json")  # written by the aborting thread just after the error is raised
        while not dump.is_file() and time.monotonic() - start < 10:
            time.sleep(0.05)
        assert dump.is_file(), "no flight-recorder dump after the timeout"
    else:
        time.sleep(timeout + 2.5)
        # Rank 0 aborted meanwhile: this rank's op fails fast instead of waiting out its timeout.
        start = time.monotonic()
        expect_raises(dist.CommError, lambda: comm.all_reduce(kiln.ones(4)))
        assert time.monotonic() - start < timeout + 1.0
    print(f"rank {R}: ok", flush=True)


def case_shrink(seed, trace):
    timeout, victim = 3.0, 3
    comm = dist.new_comm("gloo", name="train", timeout=timeout, trace_dir=trace)
    R, S = comm.get_rank(), comm.get_size()
    for step in range(100):
        if step == 4 and R == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        t = kiln.full((1001,), float((R + 1) * (step + 1)))
        start = time.monotonic()
        try:
            comm.all_reduce(t)
        except dist.CommError as e:  # a TimeoutError too
            took = time.monotonic() - start
            assert took < timeout + 1.0, f"step {step}: {type(e).__name__} after {took:.2f} s: {e}"
            assert step == 4, f"failed at step {step}: {e}"
            break
        check(t, np.full(1001, S * (S + 1) / 2 * (step + 1)), "float32", f"step {step}")
    else:
        raise AssertionError("the all-reduces went on without the killed rank")
    assert comm.is_aborted()
    small = comm.shrink([victim])
    assert (small.get_size(), small.get_rank()) == (S - 1, R)
    for step in range(3):
        t = kiln.full((1001,), float((R + 1) * (step + 1)))
        small.all_reduce(t)
        check(t, np.full(1001, (S - 1) * S / 2 * (step + 1)), "float32", f"after shrink, step {step}")
    print(f"rank {R}: ok", flush=True)


def case_torch(seed, trace):
    import torch

    comm = dist.new_comm("gloo", device=torch.device("cpu"), name="torch", timeout=20.0, trace_dir=trace)
    R, S = comm.get_rank(), comm.get_size()
    tag = 0
    for dtype, tdt in (("float32", torch.float32), ("float64", torch.float64), ("int64", torch.int64),
                       ("bfloat16", torch.bfloat16)):
        for n in (13, 40_003):
            tag += 1
            xs = inputs(seed, tag, n, dtype, S)
            t = torch.tensor(xs[R]).to(tdt)
            ptr = t.data_ptr()
            comm.all_reduce(t, dist.ReduceOp.SUM)
            assert t.data_ptr() == ptr
            check(t.double().numpy(), np.sum(np.stack(xs), axis=0), dtype, f"torch all_reduce n={n}")

            tag += 1
            xs = inputs(seed, tag, n, dtype, S)
            out = torch.empty(S * n, dtype=tdt)
            comm.all_gather_single(out, torch.tensor(xs[R]).to(tdt))
            check(out.double().numpy(), np.concatenate(xs), dtype, f"torch all_gather_single n={n}")

            tag += 1
            xs = inputs(seed, tag, S * n, dtype, S)
            out = torch.empty(n, dtype=tdt)
            comm.reduce_scatter_single(out, torch.tensor(xs[R]).to(tdt), dist.ReduceOp.SUM)
            check(out.double().numpy(), np.sum(np.stack(xs), axis=0)[R * n:(R + 1) * n], dtype,
                  f"torch reduce_scatter_single n={n}")

            tag += 1
            xs = inputs(seed, tag, n, dtype, S)
            t = torch.tensor(xs[R]).to(tdt)
            w = comm.broadcast(t, 0, async_op=True)
            w.wait()
            check(t.double().numpy(), xs[0], dtype, f"torch broadcast n={n}")
    # A view into a larger torch tensor: the result lands in the base.
    base = torch.zeros(2, 8)
    base[1].fill_(float(R + 1))
    comm.all_reduce(base[1])
    assert torch.equal(base[1], torch.full((8,), S * (S + 1) / 2)) and torch.equal(base[0], torch.zeros(8))
    print(f"rank {R}: ok", flush=True)


CASES = {"ops": case_ops, "timeout": case_timeout, "shrink": case_shrink, "torch": case_torch}


# ---------------------------------------------------------------- pytest side

if __name__ != "__main__":

    def test_single_process_api(tmp_path):
        comm = dist.new_comm("gloo", device="cpu", name="solo", timeout=5, trace_dir=str(tmp_path))
        assert (comm.get_rank(), comm.get_size(), comm.get_timeout()) == (0, 1, 5.0)
        assert issubclass(dist.TimeoutError, dist.CommError) and issubclass(dist.CommError, kiln.KilnError)
        t = kiln.tensor([1.5, -2.0, 3.0])
        assert comm.all_reduce(t, dist.ReduceOp.AVG) is None
        assert t.tolist() == [1.5, -2.0, 3.0]
        w = comm.all_reduce(t, async_op=True)
        w.wait()
        assert w.status == dist.WorkStatus.COMPLETED and w.op == "all_reduce"
        import datetime

        comm.set_timeout(datetime.timedelta(seconds=2))
        assert comm.get_timeout() == 2.0
        with pytest.raises(kiln.KilnError, match="positive"):
            comm.set_timeout(0)
        with pytest.raises(kiln.KilnError, match="nccl"):
            dist.new_comm("nccl", device="cpu", name="bad", trace_dir=str(tmp_path))
        comm.abort()
        with pytest.raises(dist.CommError, match="aborted"):
            comm.all_reduce(t)

    def test_collectives_against_numpy(tmp_path):
        launch("ops", 3, tmp_path)

    def test_timeout_raises_on_every_waiting_rank(tmp_path):
        launch("timeout", 2, tmp_path)

    def test_shrink_after_a_rank_is_killed(tmp_path):
        launch("shrink", 4, tmp_path, expect=[0, 0, 0, -signal.SIGKILL])

    def test_torch_tensors_in_place(tmp_path):
        pytest.importorskip("torch", reason="torch is not installed (pip install torch to run this test)")
        launch("torch", 2, tmp_path)

    @pytest.mark.parametrize("launcher", ["kiln run", "torchrun"])
    def test_example_under_launcher(tmp_path, launcher):
        example = REPO / "examples" / "distributed" / "all_reduce.py"
        if launcher == "kiln run":
            cli = _kiln_cli()
            if cli is None:
                pytest.skip("the kiln command was not built next to the Python package (ninja kiln_cli)")
            cmd = [str(cli), "run", "--nproc", "4", "--", sys.executable, str(example)]
        else:
            pytest.importorskip("torch", reason="torch is not installed (torchrun comes with it)")
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
                   "--master-port", str(free_port_pair()), str(example)]
        out = subprocess.run(cmd, env=_child_env(), capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
        lines = sorted(out.stdout.splitlines())
        assert len(lines) == 4, repr(out.stdout)
        for r, line in enumerate(lines):
            assert line == (f"rank {r} of 4: all_reduce 10, all_gather [0, 0, 1, 1, 2, 2, 3, 3], "
                            f"reduce_scatter [{20 * r}, {20 * r + 10}]"), repr(out.stdout)


if __name__ == "__main__":
    CASES[sys.argv[1]](int(sys.argv[2]), sys.argv[3])


def test_torch_imports_after_kiln():
    """kiln opens NCCL at its first NCCL communicator, so `import kiln; import torch` leaves torch's
    own NCCL to torch (a linked, older libnccl made torch's import fail on a missing symbol)."""
    try:
        import importlib.util
        have_torch = importlib.util.find_spec("torch") is not None
    except ValueError:
        have_torch = False
    if not have_torch:
        pytest.skip("torch is not installed here: the import order cannot be tried")
    code = "import kiln, torch; print(torch.__version__)"
    r = subprocess.run([sys.executable, "-c", code], env=_child_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
