"""The PyTorch side of `tools/pytorch_reference/compare.sh`: the model and step
that `//train:bench` times, built in PyTorch, timed the same way.

GPT-2 architecture as Loom builds it: learned positions, pre-LayerNorm blocks,
GELU (tanh), tied input/output embedding, hidden dropout 0.1 (embedding,
attention output, MLP output; none on attention probabilities), causal
attention through scaled_dot_product_attention, f32, AdamW (lr 1e-4). One
step = zero grads, forward, cross-entropy, backward, AdamW; one warm-up step,
then --iters timed steps; prints the median like //train:bench:

  | ms/step (median of 5) | 812.3 |
  | tokens/s | 315 |

Run it through compare.sh (it makes the virtual environment), or directly:
  python gpt_bench.py --threads 2 [--compile] [--num-layers 12 ...]
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, h, heads, p):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)
        self.drop = nn.Dropout(p)

    def forward(self, x):  # x: [b, s, h]
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        shape = (b, s, self.heads, h // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, s, h)))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh")))


class Gpt(nn.Module):
    def __init__(self, layers, h, heads, vocab, seq, p):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(seq, h)
        self.drop = nn.Dropout(p)
        self.blocks = nn.ModuleList(Block(h, heads, p) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h)
        for m in self.modules():  # GPT-2's init (as Loom's: std 0.02)
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, ids, targets):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.drop(self.wte(ids) + self.wpe(pos))
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied output layer
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-layers", type=int, default=12)
    ap.add_argument("--hidden-size", type=int, default=768)
    ap.add_argument("--num-attention-heads", type=int, default=12)
    ap.add_argument("--vocab-size", type=int, default=50257)
    ap.add_argument("--seq-length", type=int, default=64)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = Gpt(a.num_layers, a.hidden_size, a.num_attention_heads, a.vocab_size, a.seq_length,
                0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step_fn = torch.compile(model) if a.compile else model
    b, s = a.micro_batch_size, a.seq_length
    ids = torch.randint(0, a.vocab_size, (b, s))
    targets = torch.randint(0, a.vocab_size, (b, s))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = step_fn(ids, targets)
        loss.backward()
        opt.step()
        return loss.item()

    step()  # warm-up (and compilation)
    if a.compile:
        step()
    ms = []
    for _ in range(a.iters):
        t0 = time.perf_counter()
        step()
        ms.append((time.perf_counter() - t0) * 1e3)
    med = statistics.median(ms)
    params = sum(p.numel() for p in model.parameters())
    print(f"PyTorch {torch.__version__} ({torch.get_num_threads()} threads"
          f"{', torch.compile' if a.compile else ''}): {params / 1e6:.1f}M parameters")
    print(f"| ms/step (median of {a.iters}) | {med:.1f} |")
    print(f"| tokens/s | {b * s / (med / 1e3):.0f} |")
    assert math.isfinite(med)


if __name__ == "__main__":
    main()
