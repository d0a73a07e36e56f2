#!/usr/bin/env python3
"""Golden check: kiln's GPT training vs the same model in PyTorch (float32, CPU).

Runs `kiln train --golden-dump` for 10 steps (initial weights and the exact batches are saved as
safetensors), rebuilds the model in PyTorch from those weights (RMSNorm, half-split rotary,
causal + document mask through SDPA, SwiGLU, tied output head, cross-entropy with ignore_index),
trains it with torch.optim.AdamW on the same batches, learning-rate schedule and clipping, and
compares the ten training losses: max relative difference must be <= 1e-4.

usage: scripts/golden_check.py [--kiln build/kiln] [--run-dir runs/golden] [extra kiln train flags]
"""
import argparse, json, os, subprocess, sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import load_safetensors, loss_fn, lr_at  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--run-dir", default="runs/golden")
    args, extra = ap.parse_known_args()
    steps = 10
    cmd = [args.kiln, "train", "--steps", str(steps), "--run-dir", args.run_dir, "--golden-dump", "--eval-every", "0",
           "--sample-tokens", "0", "--progress", "none", "--checkpoint-every", "0"] + extra
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd)  # exit status 1 only means the held-out loss did not halve in 10 steps
    cfg = json.load(open(os.path.join(args.run_dir, "config.json")))
    m, tr = cfg["model"], cfg["train"]
    W = load_safetensors(os.path.join(args.run_dir, "golden", "init.safetensors"))
    batches = load_safetensors(os.path.join(args.run_dir, "golden", "batches.safetensors"))
    kiln_losses = [json.loads(l)["loss"] for l in open(os.path.join(args.run_dir, "metrics.jsonl")) if '"loss"' in l]

    torch.manual_seed(0)
    names = list(W.keys())
    for t in W.values():
        t.requires_grad_(True)
    decay = [W[n] for n in names if W[n].dim() >= 2]
    no_decay = [W[n] for n in names if W[n].dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tr["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=tr["lr"], betas=(0.9, tr["beta2"]), eps=1e-8)
    accum = tr["grad_accum"]
    warmup = min(tr["warmup_steps"], tr["steps"])
    worst = 0.0
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, warmup, tr["steps"], tr["lr"], tr["min_lr"])
        total = 0.0
        for micro in range(accum):
            k = f"step{step}.micro{micro}."
            loss = loss_fn(W, m, batches[k + "input"], batches[k + "target"], batches[k + "doc_ids"])
            (loss / accum).backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(list(W.values()), tr["grad_clip"])
        opt.step()
        opt.zero_grad()
        ref = total / accum
        rel = abs(kiln_losses[step] - ref) / abs(ref)
        worst = max(worst, rel)
        print(f"step {step + 1:2d}: kiln {kiln_losses[step]:.7f}  torch {ref:.7f}  rel {rel:.2e}")
    ok = worst <= 1e-4
    print(f"max relative difference {worst:.2e}: {'OK (<= 1e-4)' if ok else 'FAIL (> 1e-4)'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
