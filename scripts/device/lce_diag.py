"""Diagnose kiln's CUDA linear cross-entropy against torch on the same inputs (GPU machine).

PYTHONPATH=build-gpu/python python3 scripts/device/lce_diag.py
Prints, per shape, torch's unfused loss, kiln's loss per strategy, and the max error of kiln's
plain matmul of the same operands, so a wrong result can be pinned to the GEMM or the kernels.
"""
import torch
import kiln
import kiln.torch as kt

torch.manual_seed(0)
shapes = [(64, 64, 128256), (64, 4096, 1024), (64, 4096, 32000), (64, 4096, 128256), (64, 1024, 128256),
          (64, 2048, 128256), (8192, 4096, 128256)]
for n, h, v in shapes:
    x = torch.randn(n, h, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(v, h, device="cuda") * h ** -0.5).to(torch.bfloat16)
    y = torch.randint(0, v, (n,), device="cuda")
    ref = torch.nn.functional.cross_entropy(x.float() @ w.float().T, y).item()
    res = {}
    for s in ("memory", "speed"):
        res[s] = kt.linear_cross_entropy(x, w, y, strategy=s).float().item()
    res["speed1chunk"] = kt.linear_cross_entropy(x, w, y, strategy="speed", chunk_tokens=n).float().item()
    rows = min(n, 64)
    km = kiln.matmul(kt.to_kiln(x[:rows]), kt.to_kiln(w).t())
    err = (kt.to_torch(km).float() - (x[:rows].float() @ w.float().T)).abs().max().item()
    print(f"N={n} H={h} V={v}: torch {ref:.4f} | " + " ".join(f"{k} {val:.4f}" for k, val in res.items())
          + f" | kiln matmul bf16 max abs err {err:.3g}", flush=True)
# kiln's own random inputs, as bench_lce makes them
kiln.manual_seed(0)
kx = kiln.randn(64, 4096, dtype=kiln.bfloat16, device="cuda")
kw = (kiln.randn(128256, 4096) * 4096 ** -0.5).to(device="cuda", dtype=kiln.bfloat16)
tx, tw = kt.to_torch(kx).float(), kt.to_torch(kw).float()
print(f"kiln randn x std {tx.std().item():.4f} mean {tx.mean().item():.4f}; w std {tw.std().item():.5f} "
      f"(expect {4096 ** -0.5:.5f}); w rows 0/-1 std {tw[0].std().item():.5f} {tw[-1].std().item():.5f}", flush=True)
