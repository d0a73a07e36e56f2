"""Every rank all-reduces, all-gathers and reduce-scatters a small tensor and prints one line.

    PYTHONPATH=build/python build/kiln run --nproc 4 -- python examples/distributed/all_reduce.py
    PYTHONPATH=build/python torchrun --nproc-per-node 4 examples/distributed/all_reduce.py

Rank and world size come from the launcher's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT);
under torchrun kiln's store listens on MASTER_PORT + 1, beside torch's.
"""
import sys

import kiln
import kiln.distributed as dist


def main():
    comm = dist.new_comm("gloo", device="cpu", name="main", timeout=30.0)
    rank, size = comm.get_rank(), comm.get_size()

    total = kiln.full((4,), float(rank + 1))
    comm.all_reduce(total, dist.ReduceOp.SUM)  # 1 + 2 + ... + size on every rank

    gathered = kiln.empty(2 * size)
    comm.all_gather_single(gathered, kiln.full((2,), float(rank)))  # [0, 0, 1, 1, ...]

    mine = kiln.empty(2)
    # Every rank gives [0, 1, ..., 2 * size - 1] * (rank + 1); rank r keeps block r of the sum.
    comm.reduce_scatter_single(mine, kiln.arange(2 * size, dtype=kiln.float32) * float(rank + 1))

    comm.barrier()
    # One write per line: the ranks share the launcher's stdout, and whole lines never interleave.
    sys.stdout.write(f"rank {rank} of {size}: all_reduce {total.tolist()[0]:g}, "
                     f"all_gather {[int(v) for v in gathered.tolist()]}, "
                     f"reduce_scatter {[int(v) for v in mine.tolist()]}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
