#!/usr/bin/env python3
"""Golden check: kiln's GPT training vs the same model in PyTorch (float32, CPU).

Runs `kiln train --golden-dump` for 10 steps (initial weights and the exact batches are saved as
safetensors), rebuilds the model in PyTorch from those weights (RMSNorm, half-split rotary,
causal + document mask through SDPA, SwiGLU, tied output head, cross-entropy with ignore_index),
trains it with torch.optim.AdamW on the same batches, learning-rate schedule and clipping, and
compares the ten training losses: max relative difference must be <= 1e-4.

usage: scripts/golden_check.py [--kiln build/kiln] [--run-dir runs/golden] [extra kiln train flags]
"""
import argparse, json, math, os, struct, subprocess, sys

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "I32": torch.int32}


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + a:base + b]), dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]).clone()
    return out


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotary(x, T, D, theta):  # x [B, T, H, D], half-split convention
    i = torch.arange(D // 2, dtype=torch.float64)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * theta ** (-2.0 * i / D)
    cos, sin = ang.cos().float()[None, :, None, :], ang.sin().float()[None, :, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def loss_fn(W, m, idx, target, docs):
    B, T = idx.shape
    D, H, L = m["dim"], m["n_heads"], m["n_layers"]
    Dh = D // H
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))[None] & (docs[:, :, None] == docs[:, None, :])
    if m["sliding_window"] > 0:
        q = torch.arange(T)
        mask = mask & ((q[:, None] - q[None, :]) < m["sliding_window"])[None]
    x = W["tok_emb"][idx]
    for l in range(L):
        p = lambda n: W[f"blocks.{l}.{n}"]
        a = rms_norm(x, p("attn_norm"), m["norm_eps"])
        qkv = (a @ p("wqkv").T).view(B, T, 3, H, Dh)
        q = rotary(qkv[:, :, 0], T, Dh, m["rope_theta"]).transpose(1, 2)
        k = rotary(qkv[:, :, 1], T, Dh, m["rope_theta"]).transpose(1, 2)
        v = qkv[:, :, 2].transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        x = x + o.transpose(1, 2).reshape(B, T, D) @ p("wo").T
        h = rms_norm(x, p("mlp_norm"), m["norm_eps"])
        x = x + (F.silu(h @ p("w_gate").T) * (h @ p("w_up").T)) @ p("w_down").T
    x = rms_norm(x, W["final_norm"], m["norm_eps"])
    return F.cross_entropy((x @ W["tok_emb"].T).reshape(B * T, -1), target.reshape(-1), ignore_index=-100)


def lr_at(step, warmup, total, max_lr, min_lr):
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    prog = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * prog))


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
