"""kiln.save of many small tensors: safetensors against kiln's torch-zip writer (same tensors, same
disk). The safetensors header is written in one linear pass; its time must stay within 2x the
torch format's at 100k tensors.

    PYTHONPATH=build/python python3 bench/save_many_tensors.py [N ...]
"""
import os
import sys
import tempfile
import time

import kiln


def best_of(fn, repeats=3):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(counts):
    with tempfile.TemporaryDirectory() as d:
        print(f"{'tensors':>8} {'safetensors s':>14} {'torch s':>9} {'ratio':>6} {'+checksums s':>13} {'load s':>7}")
        for n in counts:
            tensors = {f"layer.{i}.weight": kiln.full((2,), float(i)) for i in range(n)}
            st, pt = os.path.join(d, "m.safetensors"), os.path.join(d, "m.pt")
            t_st = best_of(lambda: kiln.save(tensors, st))
            t_pt = best_of(lambda: kiln.save(tensors, pt))
            t_crc = best_of(lambda: kiln.save(tensors, st, checksums=True))
            t_load = best_of(lambda: kiln.load(st))
            print(f"{n:>8} {t_st:>14.3f} {t_pt:>9.3f} {t_st / t_pt:>6.2f} {t_crc:>13.3f} {t_load:>7.3f}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [10_000, 40_000, 100_000])
