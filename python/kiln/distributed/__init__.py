"""kiln.distributed: communicators over Gloo (CPU tensors) and NCCL (CUDA tensors), in torchcomms' shape.

    import kiln.distributed as dist
    comm = dist.new_comm("gloo", device="cpu", name="main", timeout=30.0)
    comm.all_reduce(t, dist.ReduceOp.SUM)           # in place, on every rank
    work = comm.all_gather_single(out, t, async_op=True)
    work.wait()

Rank and world size come from the launcher: `kiln run --nproc N -- python script.py`, torchrun or
Slurm. Tensors are kiln tensors or any DLPack producer (torch, NumPy), worked on in place without
copies. An op that does not complete within the timeout raises TimeoutError on every rank that is
waiting for it; after a TimeoutError or CommError the survivors go on with comm.shrink(failed_ranks).
"""
from .._C import _dist as _d

CommError = _d.CommError
TimeoutError = _d.TimeoutError  # noqa: A001  (a CommError; shadows the builtin inside this package only)
Communicator = _d.Communicator
ReduceOp = _d.ReduceOp
Work = _d.Work
WorkStatus = _d.WorkStatus
new_comm = _d.new_comm
dump_flight_recorders = _d.dump_flight_recorders
enable_dump_on_signal = _d.enable_dump_on_signal

for _cls in (CommError, TimeoutError, Communicator, ReduceOp, Work, WorkStatus):
    _cls.__module__ = __name__  # shown as kiln.distributed.X
del _cls

__all__ = ["CommError", "Communicator", "ReduceOp", "TimeoutError", "Work", "WorkStatus", "dump_flight_recorders",
           "enable_dump_on_signal", "new_comm"]
