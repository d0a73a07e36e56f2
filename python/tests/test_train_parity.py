"""A two-layer MLP and a one-block transformer written with kiln.nn / kiln.optim as a PyTorch user
writes them train to the same losses as the same models built from kiln's C++ modules (kiln._C._nn)
and C++ optimizer driven step by step, and, where torch is importable, as the same models in
PyTorch started from the same weights."""
import math

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F

STEPS = 25
LR, WARMUP, MIN_LR, CLIP = 2e-2, 5, 2e-3, 1.0


def lr_at(step):
    return kiln.optim.lr_scheduler.warmup_cosine_lr(step, WARMUP, STEPS, LR, MIN_LR)


def train_kiln(model, loss_fn, groups):
    """The PyTorch user's loop: AdamW, a warm-up + cosine schedule, clipping -> losses per step."""
    opt = kiln.optim.AdamW(groups, lr=LR, weight_decay=0.1)
    sched = kiln.optim.lr_scheduler.WarmupCosineLR(opt, WARMUP, STEPS, min_lr=MIN_LR)
    losses = []
    for _ in range(STEPS):
        loss = loss_fn(model)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


def train_cpp(params_by_group, wd_by_group, loss_fn):
    """The same loop over kiln::optim's AdamW, clip_grad_norm_ and warmup_cosine_lr directly."""
    opt = kiln._C._optim.AdamW(params_by_group)
    every = [p for g in params_by_group for p in g]
    losses = []
    for step in range(STEPS):
        for i, wd in enumerate(wd_by_group):
            opt.set_group(i, kiln._C._optim.warmup_cosine_lr(step, WARMUP, STEPS, LR, MIN_LR), 0.9, 0.999, 1e-8, wd)
        loss = loss_fn()
        opt.zero_grad()
        loss.backward()
        kiln._C._optim.clip_grad_norm_(every, CLIP)
        opt.step()
        losses.append(loss.item())
    return losses


def assert_same_weights(py_model, cpp_params):
    py = [p.detach().numpy() for p in py_model.parameters()]
    assert len(py) == len(cpp_params)
    for a, b in zip(py, cpp_params):
        np.testing.assert_array_equal(a, b.detach().numpy())


def assert_trained(losses):
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.8 * losses[0], losses


# ---- two-layer MLP ----

class MLP(nn.Module):
    def __init__(self, d_in, hidden, classes):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):  # [N, d_in] -> [N, classes]
        return self.fc2(self.act(self.fc1(x)))


def mlp_data():
    x = kiln.randn(96, 8)
    y = (x[:, 0] * x[:, 1] > 0).long() + (x[:, 2] > 0.5).long()  # 3 classes, not linearly separable
    return x, y


def run_mlp():
    """-> (kiln.nn losses, C++ losses, initial state_dict as NumPy, x, y)."""
    kiln.manual_seed(7)
    x, y = mlp_data()
    kiln.manual_seed(11)
    model = MLP(8, 32, 3)
    kiln.manual_seed(11)
    cpp = kiln._C._nn.Sequential()
    for m in (kiln._C._nn.Linear(8, 32), kiln._C._nn.Activation("gelu"), kiln._C._nn.Linear(32, 3)):
        cpp.append(m)
    cpp_params = cpp.parameters()
    assert_same_weights(model, cpp_params)
    init = {k: v.numpy().copy() for k, v in model.state_dict().items()}

    py_losses = train_kiln(model, lambda m: F.cross_entropy(m(x), y), model.parameters())
    cpp_losses = train_cpp([cpp_params], [0.1], lambda: F.cross_entropy(cpp(x), y))
    assert_same_weights(model, cpp_params)
    return py_losses, cpp_losses, init, x, y


def test_mlp_matches_cpp_modules():
    py_losses, cpp_losses, _, _, _ = run_mlp()
    assert_trained(py_losses)
    np.testing.assert_allclose(py_losses, cpp_losses, rtol=1e-6)


def test_mlp_matches_torch():
    torch = pytest.importorskip("torch")
    py_losses, _, init, x, y = run_mlp()
    tm = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 3))
    tm.load_state_dict({k.replace("fc1", "0").replace("fc2", "2"): torch.from_numpy(v) for k, v in init.items()})
    tx, ty = torch.from_numpy(x.numpy()), torch.from_numpy(y.numpy())
    torch_losses = train_torch(tm, lambda: torch.nn.functional.cross_entropy(tm(tx), ty), tm.parameters())
    np.testing.assert_allclose(py_losses, torch_losses, rtol=2e-5)


def train_torch(model, loss_fn, groups):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only contend with kiln's on a small machine
    try:
        opt = torch.optim.AdamW(groups, lr=LR, weight_decay=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_at(step) / LR)
        losses = []
        for _ in range(STEPS):
            loss = loss_fn()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            sched.step()
            losses.append(loss.item())
        return losses
    finally:
        torch.set_num_threads(threads)


# ---- one-block transformer ----

B, T, DIM, HEADS, VOCAB = 4, 16, 32, 2, 64


def causal_attention(qkv, mask):
    """qkv [B, T, 3 * DIM] -> [B, T, DIM]: softmax(q k^T / sqrt(d) + causal mask) v per head."""
    q, k, v = (qkv[:, :, i * DIM:(i + 1) * DIM].reshape(B, T, HEADS, DIM // HEADS).transpose(1, 2) for i in range(3))
    att = (q @ k.transpose(-2, -1) * (1.0 / math.sqrt(DIM // HEADS)) + mask).softmax(-1)
    return (att @ v).transpose(1, 2).reshape(B, T, DIM)


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.norm1 = nn.RMSNorm(DIM, eps=1e-5)
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.proj = nn.Linear(DIM, DIM, bias=False)
        self.norm2 = nn.RMSNorm(DIM, eps=1e-5)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
        self.norm_f = nn.RMSNorm(DIM, eps=1e-5)
        self.head = nn.LinearCrossEntropyLoss(DIM, VOCAB)  # fused projection + loss
        self.register_buffer("mask", kiln.tensor(np.triu(np.full((T, T), -np.inf, np.float32), 1)), persistent=False)

    def forward(self, idx, targets):  # idx, targets [B, T] int64 -> loss []
        x = self.tok(idx)
        x = x + self.proj(causal_attention(self.qkv(self.norm1(x)), self.mask))
        x = x + self.mlp(self.norm2(x))
        return self.head(self.norm_f(x).reshape(B * T, DIM), targets.reshape(B * T))


def cpp_transformer():
    """The same layers as kiln::nn C++ modules, created in the same order (so the same weights)."""
    C = kiln._C._nn
    m = dict(tok=C.Embedding(VOCAB, DIM), norm1=C.RMSNorm(DIM, 1e-5), qkv=C.Linear(DIM, 3 * DIM, False),
             proj=C.Linear(DIM, DIM, False), norm2=C.RMSNorm(DIM, 1e-5), mlp=C.Sequential(), norm_f=C.RMSNorm(DIM, 1e-5))
    for layer in (C.Linear(DIM, 4 * DIM), C.Activation("gelu"), C.Linear(4 * DIM, DIM)):
        m["mlp"].append(layer)
    head = C.Linear(DIM, VOCAB, False).parameters()[0]
    mask = kiln.tensor(np.triu(np.full((T, T), -np.inf, np.float32), 1))

    def loss(idx, targets):
        x = m["tok"](idx)
        x = x + m["proj"](causal_attention(m["qkv"](m["norm1"](x)), mask))
        x = x + m["mlp"](m["norm2"](x))
        return F.linear_cross_entropy(m["norm_f"](x).reshape(B * T, DIM), head, targets.reshape(B * T))

    order = ["tok", "norm1", "qkv", "proj", "norm2", "mlp", "norm_f"]
    params = [p for name in order for p in m[name].parameters()] + [head]
    return params, loss


def no_decay(name):
    return "norm" in name or name.endswith("bias")


def run_transformer():
    """-> (kiln.nn losses, C++ losses, initial state_dict as NumPy, parameter names, inputs, targets)."""
    kiln.manual_seed(5)
    idx = kiln.randint(0, VOCAB, (B, T + 1))
    inputs, targets = idx[:, :T].contiguous(), idx[:, 1:].contiguous()
    kiln.manual_seed(13)
    model = TinyTransformer()
    kiln.manual_seed(13)
    cpp_params, cpp_loss = cpp_transformer()
    assert_same_weights(model, cpp_params)
    names = [n for n, _ in model.named_parameters()]
    init = {k: v.numpy().copy() for k, v in model.state_dict().items()}

    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if not no_decay(n)]},
              {"params": [p for n, p in named if no_decay(n)], "weight_decay": 0.0}]
    py_losses = train_kiln(model, lambda m: m(inputs, targets), groups)
    cpp_groups = [[p for n, p in zip(names, cpp_params) if not no_decay(n)],
                  [p for n, p in zip(names, cpp_params) if no_decay(n)]]
    cpp_losses = train_cpp(cpp_groups, [0.1, 0.0], lambda: cpp_loss(inputs, targets))
    return py_losses, cpp_losses, init, names, inputs, targets


def test_one_block_transformer_matches_cpp_modules():
    py_losses, cpp_losses, _, _, _, _ = run_transformer()
    assert_trained(py_losses)
    np.testing.assert_allclose(py_losses, cpp_losses, rtol=1e-6)


def test_one_block_transformer_matches_torch():
    torch = pytest.importorskip("torch")
    py_losses, _, init, names, inputs, targets = run_transformer()
    tmodel = torch_transformer(torch, init)
    tnamed = list(tmodel.named_parameters())
    assert [n for n, _ in tnamed] == names
    tgroups = [{"params": [p for n, p in tnamed if not no_decay(n)]},
               {"params": [p for n, p in tnamed if no_decay(n)], "weight_decay": 0.0}]
    ti, tt = torch.from_numpy(inputs.numpy()), torch.from_numpy(targets.numpy())
    torch_losses = train_torch(tmodel, lambda: tmodel(ti, tt), tgroups)
    np.testing.assert_allclose(py_losses, torch_losses, rtol=2e-5)


def torch_transformer(torch, init):
    tnn = torch.nn

    class Head(tnn.Module):
        def __init__(self):
            super().__init__()
            self.weight = tnn.Parameter(torch.empty(VOCAB, DIM))

        def forward(self, h, t):
            return tnn.functional.cross_entropy(h @ self.weight.T, t)

    class Model(tnn.Module):
        def __init__(self):
            super().__init__()
            self.tok = tnn.Embedding(VOCAB, DIM)
            self.norm1 = tnn.RMSNorm(DIM, eps=1e-5)
            self.qkv = tnn.Linear(DIM, 3 * DIM, bias=False)
            self.proj = tnn.Linear(DIM, DIM, bias=False)
            self.norm2 = tnn.RMSNorm(DIM, eps=1e-5)
            self.mlp = tnn.Sequential(tnn.Linear(DIM, 4 * DIM), tnn.GELU(), tnn.Linear(4 * DIM, DIM))
            self.norm_f = tnn.RMSNorm(DIM, eps=1e-5)
            self.head = Head()
            self.register_buffer("mask", torch.full((T, T), float("-inf")).triu(1), persistent=False)

        def forward(self, idx, targets):
            x = self.tok(idx)
            x = x + self.proj(causal_attention(self.qkv(self.norm1(x)), self.mask))
            x = x + self.mlp(self.norm2(x))
            return self.head(self.norm_f(x).reshape(B * T, DIM), targets.reshape(B * T))

    model = Model()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in init.items()})
    return model
