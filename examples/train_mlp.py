"""Train a small classifier with kiln.nn modules and kiln.optim.AdamW, as one would in PyTorch.

    PYTHONPATH=build/python python examples/train_mlp.py [--steps 300]

Three interleaved spiral arms (not linearly separable) learned by a two-layer MLP, full batch, with
a warm-up + cosine learning rate and gradient clipping; then the weights go through kiln.save /
kiln.load into a fresh model that must give the same predictions.
"""
import argparse
import os
import tempfile

import numpy as np

import kiln
import kiln.nn as nn
import kiln.nn.functional as F


def spirals(points_per_class=200, classes=3, seed=0):
    """x [N, 2] float32 on `classes` spiral arms, y [N] int64 arm labels."""
    rng = np.random.default_rng(seed)
    r = np.tile(np.arange(points_per_class) / points_per_class, classes)
    k = np.repeat(np.arange(classes), points_per_class)
    t = 4.0 * (k + r) + 0.2 * rng.standard_normal(r.size)
    x = np.stack([r * np.sin(t), r * np.cos(t)], axis=1).astype(np.float32)
    return kiln.tensor(x), kiln.tensor(k)


class MLP(nn.Module):
    def __init__(self, d_in=2, hidden=64, classes=3):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, classes))

    def forward(self, x):  # [N, 2] -> logits [N, classes]
        return self.net(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    kiln.manual_seed(0)
    x, y = spirals()
    model = MLP()
    print(model)
    opt = kiln.optim.AdamW(model.parameters(), lr=2e-2, weight_decay=1e-4)
    sched = kiln.optim.lr_scheduler.WarmupCosineLR(opt, warmup_steps=20, total_steps=args.steps, min_lr=2e-3)
    first = None
    for step in range(args.steps):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        first = first if first is not None else loss.item()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:4d} | loss {loss.item():.4f} | lr {sched.get_last_lr()[0]:.2e}")
    model.eval()
    with kiln.no_grad():
        accuracy = (model(x).argmax(-1) == y).float().mean().item()
    print(f"loss {first:.4f} -> {loss.item():.4f}, training accuracy {100 * accuracy:.1f}%")

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "mlp.safetensors")
        kiln.save(model.state_dict(), path)
        restored = MLP()
        restored.load_state_dict(kiln.load(path))
    with kiln.no_grad():
        same = (restored.eval()(x) - model(x)).abs().max().item() == 0
    print(f"reloaded from safetensors: identical outputs = {same}")
    if loss.item() > 0.5 * first or not same:
        raise SystemExit("training did not converge or the checkpoint did not round-trip")


if __name__ == "__main__":
    main()
