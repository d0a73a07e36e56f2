"""kiln's GPT in PyTorch (shared by scripts/golden_check.py and bench/train_bench.py).

The same architecture as apps/train/model.cpp: token embedding, per block RMSNorm -> fused qkv
projection -> half-split rotary -> attention (causal + document mask) -> output projection ->
residual, RMSNorm -> SwiGLU -> residual, final RMSNorm, output head tied to the embedding,
cross-entropy with ignore_index -100 (unfused: the [tokens, vocab] logits are materialised).
Weights live in a flat dict named like kiln's parameters ("blocks.0.wqkv").
"""
import json, math, struct

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "I32": torch.int32,
          "BF16": torch.bfloat16, "F16": torch.float16}


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


_ROPE = {}


def rope_tables(T, D, theta, device):
    key = (T, D, theta, str(device))
    if key not in _ROPE:
        i = torch.arange(D // 2, dtype=torch.float64)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * theta ** (-2.0 * i / D)
        _ROPE[key] = (ang.cos().float()[None, :, None, :].to(device), ang.sin().float()[None, :, None, :].to(device))
    return _ROPE[key]


def rotary(x, T, D, theta):  # x [B, T, H, D], half-split convention
    cos, sin = rope_tables(T, D, theta, x.device)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)


def doc_mask(docs, sliding_window=0):
    """[B, T] document ids -> [B, T, T] bool: causal & same document (& window)."""
    T = docs.shape[1]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=docs.device))[None] & (docs[:, :, None] == docs[:, None, :])
    if sliding_window > 0:
        q = torch.arange(T, device=docs.device)
        mask = mask & ((q[:, None] - q[None, :]) < sliding_window)[None]
    return mask


def loss_fn(W, m, idx, target, docs, attn="mask"):
    """Mean cross-entropy. attn: "mask" (causal + document mask through SDPA's attn_mask) or
    "causal" (SDPA is_causal=True: lets PyTorch pick its flash kernel; ignores documents)."""
    B, T = idx.shape
    D, H, L = m["dim"], m["n_heads"], m["n_layers"]
    Dh = D // H
    mask = doc_mask(docs, m.get("sliding_window", 0))[:, None] if attn == "mask" else None
    x = W["tok_emb"][idx]
    for l in range(L):
        p = lambda n: W[f"blocks.{l}.{n}"]
        a = rms_norm(x, p("attn_norm"), m["norm_eps"])
        qkv = (a @ p("wqkv").T).view(B, T, 3, H, Dh)
        q = rotary(qkv[:, :, 0], T, Dh, m["rope_theta"]).transpose(1, 2)
        k = rotary(qkv[:, :, 1], T, Dh, m["rope_theta"]).transpose(1, 2)
        v = qkv[:, :, 2].transpose(1, 2)
        if mask is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + o.transpose(1, 2).reshape(B, T, D) @ p("wo").T
        h = rms_norm(x, p("mlp_norm"), m["norm_eps"])
        x = x + (F.silu(h @ p("w_gate").T) * (h @ p("w_up").T)) @ p("w_down").T
    x = rms_norm(x, W["final_norm"], m["norm_eps"])
    return F.cross_entropy((x @ W["tok_emb"].T).reshape(B * T, -1), target.reshape(-1), ignore_index=-100)


def init_weights(m, device, generator=None):
    """Fresh fp32 weights with kiln's init rules (N(0, 0.02) embedding, nn.Linear's uniform bound,
    residual outputs scaled by 1/sqrt(2 L)); for benchmarks (the golden check loads kiln's)."""
    D, L, V = m["dim"], m["n_layers"], m["vocab_size"]
    Hd = m.get("mlp_hidden") or (8 * D // 3 + 31) // 32 * 32
    g = generator

    def uni(shape, fan_in, scale=1.0):
        return (torch.rand(shape, generator=g) * 2 - 1) * (scale / math.sqrt(fan_in))

    W = {"tok_emb": torch.randn(V, D, generator=g) * 0.02, "final_norm": torch.ones(D)}
    for l in range(L):
        r = 1.0 / math.sqrt(2.0 * L)
        W[f"blocks.{l}.attn_norm"] = torch.ones(D)
        W[f"blocks.{l}.wqkv"] = uni((3 * D, D), D)
        W[f"blocks.{l}.wo"] = uni((D, D), D, r)
        W[f"blocks.{l}.mlp_norm"] = torch.ones(D)
        W[f"blocks.{l}.w_gate"] = uni((Hd, D), D)
        W[f"blocks.{l}.w_up"] = uni((Hd, D), D)
        W[f"blocks.{l}.w_down"] = uni((D, Hd), Hd, r)
    return {k: v.to(device).requires_grad_(True) for k, v in W.items()}


def param_groups(W, weight_decay):
    """kiln's AdamW groups: weight decay on matrices only."""
    return [{"params": [t for t in W.values() if t.dim() >= 2], "weight_decay": weight_decay},
            {"params": [t for t in W.values() if t.dim() < 2], "weight_decay": 0.0}]


def lr_at(step, warmup, total, max_lr, min_lr):
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    prog = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * prog))
