"""PyTorch on the GPU, the denominator of tools/device_check.sh's ratios: the
same card, the same run, the same shapes and the same FLOP count as Loom's
//train:bench and //core/cuda:bench.

Three parts, in this order (each with its own time limit inside --budget):

  1. GEMM rate: a 4096^3 bf16 torch.matmul on random data (best of 8), the
     reference of the `ratio` column, as //core/cuda:bench's ratio is to its
     own 4096^3 bf16 GEMM.
  2. SDPA microbench: F.scaled_dot_product_attention, causal, bf16, forward
     and forward+backward, s 2048 and 8192, d 64 and 128, MHA and GQA
     (enable_gqa), for the default backend and each of flash / cudnn forced.
     Printed in //core/cuda:bench's format:
       case  median-ms  TFLOP/s  ratio(= TFLOP/s / the GEMM rate above)
     FLOPs as //core/cuda:bench counts them (causal halving):
       fwd = 4 b h s^2 d / 2 = 2 b h s^2 d,  fwd+bwd = 3.5 x fwd
     (h = query heads; GQA does not change the count).
  3. Training steps, nanoGPT-style, timed as //train:bench times its step
     (one step = zero grads, forward with the loss, backward, grad-norm clip
     1.0, AdamW lr 1e-4 betas (0.9, 0.999) weight decay 0.01 (fused); median
     of --iters steps after warm-up; bf16 autocast over f32 weights, as
     Loom's --bf16 keeps f32 master weights; hidden dropout 0.1 as
     //train:bench's step has):
       gpt2-medium: 24 layers, hidden 1024, 16 heads, seq 1024, micro-batch 8,
                    learned positions, LayerNorm, GELU(tanh), tied output
                    (gpt_bench.Gpt), eager and torch.compile;
       llama-1b:    16 layers, hidden 2048, 32 heads / 8 K-V groups (SDPA
                    enable_gqa), ffn 8192 SwiGLU, RoPE (base 10000), RMSNorm,
                    no biases, untied output, seq 4096, micro-batch 1, eager
                    and (when the budget allows) torch.compile.
     Vocabulary 50257 for both (//train:bench's default).
     Model FLOPs per token exactly as Loom's train/metrics.cc
     ModelFlopsPerToken:
       6 N + 12 L h s
     N = every parameter (embeddings included; equals layers::ParameterCount
     for these architectures), L layers, h hidden size, s sequence length: the
     attention term counts the full s x s (no causal halving), as Loom does.
     model TFLOP/s = (6 N + 12 L h s) x tokens/s / 1e12.

Lines in //train:bench's table format ('| tokens/s | 1234 |') and a JSON file
(--json, rewritten after every result so a killed run keeps what it had).

  python gpu_bench.py --budget 110 --json out.json [--only sdpa,gpt2-medium]
  python gpu_bench.py --device cpu --tiny   (a seconds-long self-check on a CPU)
"""
import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_bench import Gpt  # noqa: E402  (GPT-2 as Loom builds it)

VOCAB = 50257


# ------------------------------------------------------------------ budget


class Overrun(Exception):
    pass


class Budget:
    def __init__(self, seconds):
        self.deadline = time.monotonic() + seconds

    def left(self):
        return self.deadline - time.monotonic()


@contextlib.contextmanager
def time_limit(seconds):
    """Raises Overrun in the main thread after `seconds` (SIGALRM)."""
    seconds = max(1, int(seconds))

    def on_alarm(signum, frame):
        raise Overrun(f"over its {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


class Results:
    def __init__(self, path):
        self.path = path
        self.data = {"torch": torch.__version__, "sdpa": [], "train": [], "skipped": []}

    def save(self):
        if not self.path:
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1)
        os.replace(tmp, self.path)

    def skip(self, what, why):
        print(f"skipped {what}: {why}", flush=True)
        self.data["skipped"].append({"what": what, "why": why})
        self.save()


# ------------------------------------------------------------------ timing


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def event_ms(fn, device, warmup, iters, reduce=statistics.median):
    """Median (or `reduce`) milliseconds of fn(), CUDA events on a GPU."""
    for _ in range(warmup):
        fn()
    sync(device)
    ms = []
    for _ in range(iters):
        if device.type == "cuda":
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            ms.append((time.perf_counter() - t0) * 1e3)
    return reduce(ms)


def gemm_tflops(device, dtype, n):
    """Best-of-8 n^3 matmul rate on random data (Loom: MeasureGemmFlops)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms = event_ms(lambda: a @ b, device, warmup=2, iters=8, reduce=min)
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12


# ------------------------------------------------------------------ SDPA


def sdpa_backends():
    """(label, context manager factory) for default, flash, cudnn."""
    out = [("default", contextlib.nullcontext)]
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return out
    for label, name in (("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION")):
        be = getattr(SDPBackend, name, None)
        if be is not None:
            out.append((label, lambda be=be: sdpa_kernel([be])))
    return out


def sdpa_cases(tiny):
    # (s, b, query heads, K/V heads, d): 2048 b4 h16 d64 is //core/cuda:bench's row.
    if tiny:
        return [(64, 2, 4, 4, 16), (64, 2, 4, 2, 16)]
    return [(2048, 4, 16, 16, 64), (2048, 4, 8, 8, 128), (8192, 1, 16, 16, 64),
            (8192, 1, 8, 8, 128), (2048, 4, 32, 8, 64), (8192, 1, 32, 8, 64),
            (2048, 4, 16, 4, 128), (8192, 1, 16, 4, 128)]


def run_sdpa(res, device, dtype, gemm, budget, tiny):
    print(f"{'case':<58} {'median ms':>10} {'TFLOP/s':>9} {'ratio':>7}", flush=True)
    gen = torch.Generator(device=device).manual_seed(1)
    for s, b, hq, hkv, d in sdpa_cases(tiny):
        q = torch.randn(b, hq, s, d, device=device, dtype=dtype, generator=gen)
        k = torch.randn(b, hkv, s, d, device=device, dtype=dtype, generator=gen)
        v = torch.randn(b, hkv, s, d, device=device, dtype=dtype, generator=gen)
        dout = torch.randn(b, hq, s, d, device=device, dtype=dtype, generator=gen)
        gqa = hkv != hq
        heads = f"{hq}/{hkv}" if gqa else f"{hq}"
        fwd_flops = 4.0 * b * hq * s * s * d / 2.0
        dt = "bf16" if dtype == torch.bfloat16 else str(dtype).replace("torch.", "")
        for label, ctx in sdpa_backends():
            if budget.left() < 3:
                res.skip(f"sdpa {label} s={s} h={heads} d={d}", "budget")
                continue
            kw = {"is_causal": True}
            if gqa:
                kw["enable_gqa"] = True

            def fwd():
                with ctx():
                    return F.scaled_dot_product_attention(q, k, v, **kw)

            qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))

            def both():
                with ctx():
                    o = F.scaled_dot_product_attention(qg, kg, vg, **kw)
                o.backward(dout)
                qg.grad = kg.grad = vg.grad = None

            for what, fn, flops in (("fwd", fwd, fwd_flops), ("fwd+bwd", both, 3.5 * fwd_flops)):
                name = f"sdpa[{label}] {what} s={s} b={b} h={heads} d={d} {dt} causal"
                try:
                    with time_limit(min(20, budget.left())):
                        ms = event_ms(fn, device, warmup=3, iters=10)
                except Overrun as e:
                    res.skip(name, f"time: {e}")
                    continue
                except Exception as e:  # backend does not take this case
                    res.skip(name, f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    continue
                tf = flops / (ms * 1e-3) / 1e12
                print(f"{name:<58} {ms:10.4f} {tf:9.2f} {tf / gemm:7.3f}", flush=True)
                res.data["sdpa"].append({"name": name, "backend": label, "pass": what, "s": s,
                                         "b": b, "hq": hq, "hkv": hkv, "d": d, "ms": ms,
                                         "tflops": tf, "ratio": tf / gemm})
                res.save()
        del q, k, v, dout
    print("ratio: TFLOP/s / torch's bf16 4096^3 matmul rate (same run). attention FLOPs count"
          " causal halving: fwd = 2 b h s^2 d, fwd+bwd = 3.5x fwd.", flush=True)


# ------------------------------------------------------------------ Llama


class Rope(nn.Module):
    """Rotary embedding over the whole head (rotate-half, Megatron/Llama)."""

    def __init__(self, d, s, base=10000.0):
        super().__init__()
        inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        f = torch.outer(torch.arange(s, dtype=torch.float32), inv)  # [s, d/2]
        self.register_buffer("cos", f.cos(), persistent=False)
        self.register_buffer("sin", f.sin(), persistent=False)

    def forward(self, x):  # [b, h, s, d]
        x1, x2 = x.float().chunk(2, dim=-1)
        c, s = self.cos[: x.shape[2]], self.sin[: x.shape[2]]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).type_as(x)


class LlamaBlock(nn.Module):
    def __init__(self, h, heads, groups, ffn, p, rope):
        super().__init__()
        self.heads, self.groups, self.d = heads, groups, h // heads
        self.norm1 = nn.RMSNorm(h, eps=1e-5)
        self.qkv = nn.Linear(h, (heads + 2 * groups) * self.d, bias=False)
        self.proj = nn.Linear(h, h, bias=False)
        self.norm2 = nn.RMSNorm(h, eps=1e-5)
        self.gate_up = nn.Linear(h, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, h, bias=False)
        self.drop = nn.Dropout(p)
        self.rope = rope

    def forward(self, x):  # [b, s, h]
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(
            [self.heads * self.d, self.groups * self.d, self.groups * self.d], dim=2)
        q = q.view(b, s, self.heads, self.d).transpose(1, 2)
        k = k.view(b, s, self.groups, self.d).transpose(1, 2)
        v = v.view(b, s, self.groups, self.d).transpose(1, 2)
        q, k = self.rope(q), self.rope(k)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.groups != self.heads)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, s, h)))
        g, u = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.drop(self.down(F.silu(g) * u))


class Llama(nn.Module):
    def __init__(self, layers, h, heads, groups, ffn, vocab, seq, p):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.drop = nn.Dropout(p)
        rope = Rope(h // heads, seq)
        self.blocks = nn.ModuleList(LlamaBlock(h, heads, groups, ffn, p, rope)
                                    for _ in range(layers))
        self.norm = nn.RMSNorm(h, eps=1e-5)
        self.out = nn.Linear(h, vocab, bias=False)  # untied
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids, targets):
        x = self.drop(self.wte(ids))
        for blk in self.blocks:
            x = blk(x)
        logits = self.out(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1))


# ------------------------------------------------------------------ training step


def model_flops_per_token(params, layers, hidden, seq):
    """Loom's ModelFlopsPerToken (train/metrics.cc): 6 N + 12 L h s."""
    return 6.0 * params + 12.0 * layers * hidden * seq


def shapes(tiny):
    if tiny:
        return {
            "gpt2-medium": dict(kind="gpt", layers=2, hidden=64, heads=4, seq=64, batch=2),
            "llama-1b": dict(kind="llama", layers=2, hidden=64, heads=4, groups=2, ffn=128,
                             seq=64, batch=1),
        }
    return {
        "gpt2-medium": dict(kind="gpt", layers=24, hidden=1024, heads=16, seq=1024, batch=8),
        "llama-1b": dict(kind="llama", layers=16, hidden=2048, heads=32, groups=8, ffn=8192,
                         seq=4096, batch=1),
    }


def build(cfg, vocab, device):
    torch.manual_seed(1)
    if cfg["kind"] == "gpt":
        m = Gpt(cfg["layers"], cfg["hidden"], cfg["heads"], vocab, cfg["seq"], 0.1)
    else:
        m = Llama(cfg["layers"], cfg["hidden"], cfg["heads"], cfg["groups"], cfg["ffn"], vocab,
                  cfg["seq"], 0.1)
    return m.to(device)


def run_train(res, name, cfg, compiled, device, dtype, vocab, iters, gemm, limit):
    mode = "torch.compile" if compiled else "eager"
    label = f"{name} {mode}"
    t_start = time.monotonic()
    model = opt = None
    try:
        with time_limit(limit):
            model = build(cfg, vocab, device)
            params = sum(p.numel() for p in model.parameters())
            fused = device.type == "cuda"
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8,
                                    weight_decay=0.01, fused=fused)
            fn = torch.compile(model) if compiled else model
            b, s = cfg["batch"], cfg["seq"]
            gen = torch.Generator(device=device).manual_seed(2)
            ids = torch.randint(0, vocab, (b, s), device=device, generator=gen)
            targets = torch.randint(0, vocab, (b, s), device=device, generator=gen)

            def step():
                opt.zero_grad(set_to_none=True)
                with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                    loss = fn(ids, targets)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=fused)
                opt.step()
                return loss

            t0 = time.monotonic()
            step()  # warm-up (and compilation)
            step()
            sync(device)
            warm_s = time.monotonic() - t0
            ms = []
            for _ in range(iters):
                sync(device)
                t = time.perf_counter()
                loss = step()
                sync(device)
                ms.append((time.perf_counter() - t) * 1e3)
            final_loss = float(loss.detach())
    except Overrun as e:
        res.skip(label, f"time: {e} (after {time.monotonic() - t_start:.0f} s)")
        return
    except Exception as e:  # torch.compile wraps an Overrun in its own error
        why = str(e).splitlines()[0][:160] if str(e) else ""
        kind = "time" if "Overrun" in str(e) else type(e).__name__
        res.skip(label, f"{kind}: {why} (after {time.monotonic() - t_start:.0f} s)")
        return
    finally:
        del model, opt
        if compiled:
            torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    med = statistics.median(ms)
    tokens = cfg["batch"] * cfg["seq"]
    fpt = model_flops_per_token(params, cfg["layers"], cfg["hidden"], cfg["seq"])
    tps = tokens / (med / 1e3)
    tflops = fpt * tps / 1e12
    shape = ", ".join(f"{k} {v}" for k, v in cfg.items() if k != "kind")
    print(f"\n{label}: {shape}, {params / 1e6:.1f}M parameters, "
          f"{fpt * tokens / 1e9:.2f} GFLOP per step (6N + 12Lhs per token); "
          f"warm-up {warm_s:.1f} s", flush=True)
    print("| metric | value |\n|---|---|")
    print(f"| ms/step (median of {iters}) | {med:.1f} |")
    print(f"| tokens/s | {tps:.0f} |")
    print(f"| model GFLOP/s | {tflops * 1e3:.1f} |")
    print(f"| model TFLOP/s | {tflops:.2f} |")
    print(f"| model / GEMM | {tflops / gemm:.2f} |")
    print(f"| loss after the timed steps | {final_loss:.4f} |", flush=True)
    res.data["train"].append({"name": name, "mode": mode, "ms": med, "tokens_per_s": tps,
                              "model_tflops": tflops, "params": params,
                              "flops_per_token": fpt, "model_over_gemm": tflops / gemm,
                              "warmup_s": warm_s, "iters": iters, "shape": cfg})
    res.save()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=float, default=110, help="seconds for everything")
    ap.add_argument("--json", default="", help="results file (rewritten after each result)")
    ap.add_argument("--only", default="", help="comma list of sdpa, gpt2-medium, llama-1b")
    ap.add_argument("--iters", type=int, default=5, help="timed steps per training bench")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="toy shapes (a self-check)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--compile-min-s", type=float, default=60,
                    help="torch.compile a training step only with this many seconds left")
    a = ap.parse_args()

    budget = Budget(a.budget)
    device = torch.device(a.device)
    dtype = torch.bfloat16
    res = Results(a.json)
    only = set(filter(None, a.only.split(",")))
    want = lambda what: not only or what in only  # noqa: E731
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        res.data["device"] = torch.cuda.get_device_name()
        res.data["cuda"] = torch.version.cuda
        res.data["cudnn"] = torch.backends.cudnn.version()
    else:
        res.data["device"] = "cpu"
    print(f"PyTorch {torch.__version__} on {res.data['device']} (CUDA {torch.version.cuda}, "
          f"cuDNN {res.data.get('cudnn')}), budget {a.budget:.0f} s", flush=True)

    n = 256 if a.tiny else 4096
    gemm = gemm_tflops(device, dtype, n)
    res.data["gemm_tflops"] = gemm
    res.data["gemm_n"] = n
    res.save()
    print(f"| GEMM TFLOP/s ({n}^3 bf16 torch.matmul, random data, same run) | {gemm:.1f} |",
          flush=True)

    if want("sdpa"):
        with contextlib.suppress(Overrun):
            run_sdpa(res, device, dtype, gemm, Budget(min(25, budget.left())), a.tiny)
    cfgs = shapes(a.tiny)
    # Eager first (the denominators), then compilation with what is left.
    plan = [(nm, False) for nm in cfgs] + [(nm, True) for nm in cfgs]
    for nm, compiled in plan:
        label = f"{nm} {'torch.compile' if compiled else 'eager'}"
        if not want(nm):
            continue
        if compiled and a.no_compile:
            res.skip(label, "--no-compile")
            continue
        need = a.compile_min_s if compiled and not a.tiny else 10
        if budget.left() < need:
            res.skip(label, f"budget: {budget.left():.0f} s left, needs {need:.0f} s")
            continue
        limit = budget.left() - 2
        run_train(res, nm, cfgs[nm], compiled, device, dtype, VOCAB if not a.tiny else 512,
                  a.iters, gemm, limit)
    res.data["seconds"] = a.budget - budget.left()
    res.save()
    assert math.isfinite(gemm)


if __name__ == "__main__":
    main()
