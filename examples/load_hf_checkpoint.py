"""Load a Hugging Face-style safetensors checkpoint (Llama layout, bfloat16) into kiln modules.

    PYTHONPATH=build/python python examples/load_hf_checkpoint.py

The script first writes a tiny checkpoint the way the `safetensors` library lays one out (JSON
header with dtype / shape / offsets, then raw little-endian bytes; weights in bfloat16, metadata
{"format": "pt"}), then builds a kiln.nn model whose module names match the checkpoint's keys
(model.layers.0.self_attn.q_proj.weight, ...), loads it with load_state_dict(kiln.load(path)) and
checks one forward pass against a NumPy float64 reference.
"""
import json
import os
import struct
import tempfile

import numpy as np

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
from kiln.nn.attention.flex_attention import causal_mask, create_block_mask, flex_attention

VOCAB, DIM, HEADS, HIDDEN, LAYERS, EPS = 128, 64, 4, 128, 2, 1e-5


# ---- a checkpoint as the safetensors library would write it ----

def bf16_bytes(a):
    """float32 array -> bfloat16 bytes (round to nearest even), and the values they hold."""
    bits = a.astype(np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return rounded.tobytes(), (rounded.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, blob, shape in tensors:
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the header is padded to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def make_checkpoint(path, rng):
    shapes = {"model.embed_tokens.weight": (VOCAB, DIM), "model.norm.weight": (DIM,), "lm_head.weight": (VOCAB, DIM)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (DIM,), p + "post_attention_layernorm.weight": (DIM,),
                       **{p + f"self_attn.{n}_proj.weight": (DIM, DIM) for n in "qkvo"},
                       p + "mlp.gate_proj.weight": (HIDDEN, DIM), p + "mlp.up_proj.weight": (HIDDEN, DIM),
                       p + "mlp.down_proj.weight": (DIM, HIDDEN)})
    entries, values = [], {}
    for name, shape in shapes.items():
        a = 1.0 + 0.1 * rng.standard_normal(shape) if name.endswith("norm.weight") else 0.05 * rng.standard_normal(shape)
        blob, values[name] = bf16_bytes(a)
        entries.append((name, blob, shape))
    write_safetensors(path, entries)
    return {k: v.astype(np.float64) for k, v in values.items()}


# ---- the model, with the checkpoint's module names ----

class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        for n in "qkvo":
            setattr(self, f"{n}_proj", nn.Linear(DIM, DIM, bias=False))

    def forward(self, x, cos, sin):  # x [B, T, DIM] -> [B, T, DIM]
        B, T, _ = x.shape
        q, k, v = (getattr(self, f"{n}_proj")(x).view(B, T, HEADS, DIM // HEADS) for n in "qkv")
        q, k = F.apply_rotary_emb(q, cos, sin), F.apply_rotary_emb(k, cos, sin)
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        block_mask = create_block_mask(causal_mask(), None, None, T, T, BLOCK_SIZE=16)
        o = flex_attention(q, k, v, block_mask=block_mask)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, DIM))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(DIM, HIDDEN, bias=False)
        self.up_proj = nn.Linear(DIM, HIDDEN, bias=False)
        self.down_proj = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn, self.mlp = Attention(), MLP()
        self.input_layernorm = nn.RMSNorm(DIM, eps=EPS)
        self.post_attention_layernorm = nn.RMSNorm(DIM, eps=EPS)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(DecoderLayer() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(DIM, eps=EPS)


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Backbone()
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx):  # idx [B, T] int64 -> logits [B, T, VOCAB]
        cos, sin = F.rotary_tables(idx.shape[1], DIM // HEADS)
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))


# ---- a float64 NumPy reference of the same forward ----

def reference_logits(w, idx):
    def rms(x, g):
        return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + EPS) * g

    def rotate(x, cos, sin):  # half-split rotary on [B, T, H, D]
        h = x.shape[-1] // 2
        a, b = x[..., :h], x[..., h:]
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return np.concatenate([a * c - b * s, b * c + a * s], -1)

    B, T = idx.shape
    D = DIM // HEADS
    ang = np.arange(T)[:, None] * 10000.0 ** (-np.arange(0, D, 2) / D)
    cos, sin = np.cos(ang), np.sin(ang)
    x = w["model.embed_tokens.weight"][idx]
    causal = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q, k, v = (h @ w[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
        q, k, v = (t.reshape(B, T, HEADS, D) for t in (q, k, v))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D) + causal
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("bhqk,bkhd->bqhd", a, v).reshape(B, T, DIM)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def main():
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.safetensors")
        weights = make_checkpoint(path, rng)
        state, metadata, fmt = kiln.load(path, return_metadata=True)
    print(f"{fmt} checkpoint: {len(state)} tensors, metadata {metadata}, dtype {state['lm_head.weight'].dtype}")

    model = LlamaForCausalLM()
    result = model.load_state_dict(state)  # bfloat16 values copied into the float32 parameters
    print(f"load_state_dict: {result}")
    print(f"{sum(p.numel() for p in model.parameters())} parameters")

    idx = kiln.tensor(rng.integers(0, VOCAB, (2, 16)))
    with kiln.no_grad():
        logits = model(idx)
    ref = reference_logits(weights, idx.numpy())
    err = np.linalg.norm(logits.double().numpy() - ref) / np.linalg.norm(ref)
    print(f"logits {tuple(logits.shape)}, relative error vs NumPy float64: {err:.2e}")
    print("greedy next tokens:", logits[:, -1].argmax(-1).tolist())
    if err > 1e-5:
        raise SystemExit("the loaded model does not match the reference")


if __name__ == "__main__":
    main()
