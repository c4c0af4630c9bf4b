"""Region compilers on CPU: a small Llama-style training step (RMSNorm, rotary embedding, SwiGLU),
plain or with per-block activation checkpointing, under eager, Thunder, Thunder with
executors=["torchcompile"], and memfuse (alone and in torch.compile's place).

    python benchmarks/regions_step.py [--ckpt] [--layers 2] [--dim 128] [--seq 64] [--batch 4] VARIANT...
    python benchmarks/regions_step.py --first-call VARIANT     (one variant, fresh process: compile time)
    python benchmarks/regions_step.py --seed VARIANT...        (the seed's two functions instead)

Variants: eager, th (Thunder), tc (Thunder + executors=["torchcompile"]), mf (memfuse), tc+mf
(executors=["torchcompile"] + memfuse), mf-fallback (memfuse, kernels="fallback").  Prints per
variant the measured peak of one step (torch.profiler allocations), the median step time (variants
alternate), the first call's time in this process (later variants may reuse compiled regions: use
--first-call for a clean figure) and whether loss and gradients match eager.  Asserts nothing.
"""
from __future__ import annotations

import argparse
import functools
import time
import warnings


def build(args):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class RMSNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.w = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w

    class Block(nn.Module):
        def __init__(self, d, h):
            super().__init__()
            self.h, self.n1, self.n2 = h, RMSNorm(d), RMSNorm(d)
            self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
            self.g, self.u = nn.Linear(d, 4 * d, bias=False), nn.Linear(d, 4 * d, bias=False)
            self.dn = nn.Linear(4 * d, d, bias=False)

        @staticmethod
        def rope(x, cos, sin):
            x1, x2 = x.chunk(2, -1)
            return torch.cat((-x2, x1), -1) * sin + x * cos

        def forward(self, x, cos, sin):
            B, T, C = x.shape
            q, k, v = self.qkv(self.n1(x)).split(C, -1)
            q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
            q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
            att = (q @ k.transpose(-2, -1)) * (1.0 / (C // self.h) ** 0.5)
            att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
            x = x + self.o((att @ v).transpose(1, 2).reshape(B, T, C))
            h = self.n2(x)
            return x + self.dn(F.silu(self.g(h)) * self.u(h))

    class Model(nn.Module):
        def __init__(self, L, d, h, V, T):
            super().__init__()
            self.emb = nn.Embedding(V, d)
            self.blocks = nn.ModuleList(Block(d, h) for _ in range(L))
            self.n, self.head = RMSNorm(d), nn.Linear(d, V, bias=False)
            t = torch.arange(T)[:, None] * (10000 ** (-torch.arange(0, d // h, 2) / (d // h)))[None]
            t = torch.cat((t, t), -1)
            self.register_buffer("cos", t.cos())
            self.register_buffer("sin", t.sin())

        def forward(self, idx, tgt):
            x = self.emb(idx)
            for b in self.blocks:
                x = b(x, self.cos, self.sin)
            return F.cross_entropy(self.head(self.n(x)).flatten(0, 1), tgt.flatten())

    torch.manual_seed(0)
    model = Model(args.layers, args.dim, args.heads, args.vocab, args.seq)
    if args.ckpt:
        from torch.utils.checkpoint import checkpoint

        for b in model.blocks:
            b.forward = functools.partial(checkpoint, b.forward, use_reentrant=False)
    idx = torch.randint(0, args.vocab, (args.batch, args.seq))
    tgt = torch.randint(0, args.vocab, (args.batch, args.seq))
    return model, idx, tgt


def variant(name, model):
    import thunder

    from thunder_memfuse import MemFuse

    tc = dict(executors=["torchcompile"])
    return {
        "eager": lambda: model,
        "torch.compile": lambda: __import__("torch").compile(model),
        "th": lambda: thunder.jit(model),
        "tc": lambda: thunder.jit(model, **tc),
        "mf": lambda: thunder.jit(model, transforms=[MemFuse()]),
        "tc+mf": lambda: thunder.jit(model, transforms=[MemFuse()], **tc),
        "mf-fallback": lambda: thunder.jit(model, transforms=[MemFuse(kernels="fallback")]),
    }[name]()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", action="store_true", help="activation checkpointing per block")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--first-call", action="store_true", help="only the first call's time of one variant")
    ap.add_argument("--seed", action="store_true", help="the seed's two functions (10 paths, 256x256)")
    ap.add_argument("variants", nargs="+")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")

    import torch

    from thunder_memfuse.measure import cpu_peak_bytes

    if args.seed:
        return seed(args)
    model, idx, tgt = build(args)
    params = list(model.parameters())

    def step(f):
        for p in params:
            p.grad = None
        loss = f(idx, tgt)
        loss.backward()
        return loss.detach()

    kind = "checkpointed" if args.ckpt else "plain"
    if args.first_call:
        for v in args.variants:
            f = variant(v, model)
            t = time.perf_counter()
            step(f)
            print(f"{kind} {v:12s} first call {time.perf_counter() - t:7.1f} s", flush=True)
        return
    ref = step(model)
    ref_grads = [p.grad.clone() for p in params]
    fns, first, ok, times = {}, {}, {}, {v: [] for v in args.variants}
    for v in args.variants:
        fns[v] = variant(v, model)
        t = time.perf_counter()
        loss = step(fns[v])
        first[v] = time.perf_counter() - t
        ok[v] = bool(torch.allclose(loss, ref, rtol=1e-4, atol=1e-5)) and all(
            torch.allclose(p.grad, g, rtol=1e-3, atol=1e-4) for p, g in zip(params, ref_grads))
    for _ in range(args.iters):
        for v in args.variants:  # alternate, so load changes hit every variant alike
            t = time.perf_counter()
            step(fns[v])
            times[v].append(time.perf_counter() - t)
    for v in args.variants:
        peak, _ = cpu_peak_bytes(lambda: step(fns[v]))
        ts = sorted(times[v])
        print(f"{kind} {v:12s} peak {peak / 2**20:7.2f} MiB  step {ts[len(ts) // 2] * 1e3:7.1f} ms  "
              f"first call {first[v]:6.1f} s  matches eager: {ok[v]}", flush=True)


def seed(args):
    import torch

    from thunder_memfuse.measure import cpu_peak_bytes
    from thunder_memfuse.seed import FUNCTIONS

    torch.manual_seed(0)
    t0s, a = [torch.randn(256, 256) for _ in range(10)], torch.randn(256, 256)
    for fname, fn in FUNCTIONS.items():
        want = fn(list(t0s), a)
        for v in args.variants:
            f = variant(v, fn)
            t = time.perf_counter()
            f(list(t0s), a)
            first = time.perf_counter() - t
            ts = []
            for _ in range(max(args.iters, 5)):
                t = time.perf_counter()
                f(list(t0s), a)
                ts.append(time.perf_counter() - t)
            peak, out = cpu_peak_bytes(f, list(t0s), a)
            ok = bool(torch.allclose(out, want, rtol=1e-4, atol=1e-3))
            print(f"seed {fname:30s} {v:12s} peak {peak / 2**20:5.2f} MiB  call {sorted(ts)[len(ts) // 2] * 1e3:7.2f} ms"
                  f"  first call {first:5.1f} s  matches eager: {ok}", flush=True)


if __name__ == "__main__":
    main()
