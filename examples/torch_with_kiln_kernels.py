"""A PyTorch model that calls kiln's fused kernels: kiln.torch.flex_attention for causal attention
with a learned relative-position bias, and kiln.torch.linear_cross_entropy for the output projection
+ loss (the [tokens, vocab] logits are never built). Gradients flow back into torch's parameters,
and a torch optimizer trains the model.

    PYTHONPATH=build/python python examples/torch_with_kiln_kernels.py [--steps 30]

Without PyTorch installed it prints a message and exits cleanly.
"""
import argparse
import sys

try:
    import torch  # imported before kiln, as a PyTorch program would
except ImportError:
    print("PyTorch is not installed: skipping this example (pip install torch)")
    sys.exit(0)

import kiln.torch  # noqa: E402
from kiln.nn.attention.flex_attention import causal_mask, create_block_mask  # noqa: E402

VOCAB, DIM, HEADS, SEQ = 96, 32, 2, 32


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.RMSNorm(DIM), torch.nn.RMSNorm(DIM)
        self.qkv = torch.nn.Linear(DIM, 3 * DIM, bias=False)
        self.out = torch.nn.Linear(DIM, DIM, bias=False)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(), torch.nn.Linear(4 * DIM, DIM))
        # bias[h, q_idx - kv_idx + SEQ - 1]: one learned value per head and relative position
        self.rel_bias = torch.nn.Parameter(torch.zeros(HEADS, 2 * SEQ - 1))

    def forward(self, x, block_mask):  # x [B, T, DIM] -> [B, T, DIM]
        B, T, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        bias = self.rel_bias
        o = kiln.torch.flex_attention(q.contiguous(), k.contiguous(), v.contiguous(),
                                      score_mod=lambda s, b, h, qi, kv: s + bias[h, qi - kv + SEQ - 1],
                                      block_mask=block_mask)
        x = x + self.out(o.transpose(1, 2).reshape(B, T, DIM))
        return x + self.mlp(self.norm2(x))


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        torch.nn.init.normal_(self.embed.weight, std=0.02)  # it is also the output projection
        self.block = Block()
        self.norm = torch.nn.RMSNorm(DIM)

    def forward(self, idx, targets, block_mask):  # idx, targets [B, T] -> mean loss []
        h = self.norm(self.block(self.embed(idx), block_mask))
        # the output projection is tied to the embedding and fused with the loss
        return kiln.torch.linear_cross_entropy(h.flatten(0, 1), self.embed.weight, targets.flatten())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(0)
    text = "the quick brown fox jumps over the lazy dog. " * 8
    data = torch.tensor([ord(c) - 32 for c in text])  # printable ASCII -> [0, 96)
    starts = torch.arange(0, len(data) - SEQ - 1, 7)
    idx = torch.stack([data[s:s + SEQ] for s in starts])
    targets = torch.stack([data[s + 1:s + SEQ + 1] for s in starts])
    block_mask = create_block_mask(causal_mask(), None, None, SEQ, SEQ, BLOCK_SIZE=16)

    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(args.steps):
        loss = model(idx, targets, block_mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 0:
            first = loss.item()
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:3d} | loss {loss.item():.4f}")
    assert model.block.rel_bias.grad is not None, "the captured bias got no gradient"
    print(f"loss {first:.4f} -> {loss.item():.4f}; relative-position bias trained through kiln's flex_attention")
    if not loss.item() < 0.7 * first:
        raise SystemExit("the model did not learn")


if __name__ == "__main__":
    main()
