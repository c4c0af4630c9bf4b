"""Training steps at the sizes people train, side by side with the peers (CPU), one process per variant.

    python benchmarks/real_sizes.py [--only prelm1024,llama1024] [--variants eager,tc,...] [--configs plain,ckpt]

Workloads (issue 33's):
- prelm1024 / prelm2048: a pre-LN transformer (LayerNorm, F.scaled_dot_product_attention causal, tanh
  GELU MLP), d 256, 4 heads, 2 layers, batch 2 x 1024 (2048) tokens.
- small128: issue 33's small user model: the same pre-LN transformer at d 128, 4 heads, 4 layers, batch 8 x
  128 tokens (its target is the checkpointed step below eager's peak).
- llama1024: the Llama-style decoder of benchmarks/workloads.py, n_embd 1024, 8 heads, 2 layers, seq 512,
  batch 2.
A workload named with "+loss" (prelm1024+loss) computes the cross-entropy inside the compiled module,
so every compiler, and memfuse's memory_budget, sees the whole step (without it the loss runs outside
the compiled function, beside the saved activations, where no compiler's plan counts it).
Variants: eager; torch.compile (compile; compile-ambX: with torch._functorch.config.activation_memory_budget
X, e.g. compile-amb0.5); thunder (thunder.jit); tc (executors=["torchcompile"]); memfuse (transforms=[memfuse]);
tc+memfuse; tc+memfuse@M: the same with MemFuse(memory_budget=M MiB).
Per row: the measured peak of the second step (torch.profiler's CPU allocations above what is live at
the call), the median step time of the next rounds, the loss and its difference from eager's (every
variant starts from the same weights); for memfuse variants also report()'s planned backward peak and its
compiled_peak_bytes (the backward's Inductor regions counted by their programs' buffers).
Configs: plain, ckpt (torch.utils.checkpoint around each block).

    python benchmarks/real_sizes.py --budgets 1.0,0.5,0.2 [--only ...] [--configs ...]

runs, per workload and config, torch.compile at each activation_memory_budget, then torchcompile +
memfuse with memory_budget set to each of those measured peaks (and "auto"), and prints them side by
side: the peak and step time memfuse reaches within the peak torch.compile reached.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import own_process  # noqa: E402
MIB = float(1 << 20)
VARIANTS = ("eager", "compile", "compile-amb0.5", "thunder", "tc", "memfuse", "tc+memfuse")


class PreLNBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class PreLM(nn.Module):
    def __init__(self, vocab=1024, dim=256, heads=4, layers=2, seq=1024, checkpoint=False):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(PreLNBlock(dim, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
        self.checkpoint = checkpoint

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False) if self.checkpoint else blk(x)
        return self.head(self.ln(x))


class WithLoss(nn.Module):
    """The model and its cross-entropy in one module: the loss inside the compiled function."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, targets):
        out = self.model(idx)
        logits = out[0] if isinstance(out, tuple) else out
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build(name, ckpt):
    import workloads

    if name.endswith("+loss"):
        model, idx, targets = build(name[:-len("+loss")], ckpt)
        return WithLoss(model), idx, targets
    torch.manual_seed(0)
    if name == "small128":
        model = PreLM(dim=128, layers=4, seq=128, checkpoint=ckpt)
        idx = torch.randint(0, 1024, (8, 128))
    elif name.startswith("prelm"):
        seq = int(name[len("prelm"):])
        model = PreLM(seq=seq, checkpoint=ckpt)
        idx = torch.randint(0, 1024, (2, seq))
    elif name == "llama1024":
        w = workloads.llama(batch=2, seq=512, dim=1024, layers=2, heads=8, checkpoint=ckpt)
        model, idx = w.fn, w.inputs[0]
    else:
        raise SystemExit(f"unknown workload {name!r}")
    return model, idx, torch.roll(idx, -1, dims=1)


def compiled(model, variant):
    if variant == "eager":
        return model
    if variant.startswith("compile"):
        if variant.startswith("compile-amb"):
            from torch._functorch import config as functorch_config

            functorch_config.activation_memory_budget = float(variant[len("compile-amb"):])
        return torch.compile(model)
    import thunder
    from thunder_memfuse import MemFuse, memfuse

    kw = {}
    base, _, budget = variant.partition("@")
    if base in ("tc", "tc+memfuse"):
        kw["executors"] = ["torchcompile"]
    if base.endswith("memfuse"):
        kw["transforms"] = [MemFuse(memory_budget=int(float(budget) * MIB)) if budget else memfuse]
    return thunder.jit(model, **kw)


def one(name, ckpt, variant, rounds):
    from workloads import training_step
    from thunder_memfuse.measure import cpu_peak_bytes

    warnings.simplefilter("ignore")
    model, idx, targets = build(name, ckpt)
    fn = compiled(model, variant)

    def step():
        for p in model.parameters():
            p.grad = None
        if isinstance(model, WithLoss):
            loss = fn(idx, targets)
            loss.backward()
            return loss
        return training_step(fn, idx, targets)

    t0 = time.perf_counter()
    loss = step()
    first = time.perf_counter() - t0
    peak, loss = cpu_peak_bytes(step)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    out = {"peak_mib": peak / MIB, "step_ms": 1e3 * statistics.median(times), "first_s": first, "loss": float(loss)}
    if "memfuse" in variant:  # what memfuse planned for the backward, and its regions' compiled buffers
        from thunder_memfuse import report

        bw = report(fn).get("backward") or {}
        out["bw_planned_mib"] = bw.get("peak_after_bytes", 0) / MIB
        out["bw_compiled_mib"] = (bw.get("compiled_peak_bytes") or 0) / MIB
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="prelm1024,llama1024")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--configs", default="plain,ckpt")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budgets", help="activation_memory_budget values: torch.compile at each, then torchcompile + "
                                          "memfuse with memory_budget at each of those peaks")
    ap.add_argument("--memfuse-mib", help="with --budgets: also torchcompile + memfuse at these budgets (MiB)")
    ap.add_argument("--one", nargs=3, metavar=("WORKLOAD", "CONFIG", "VARIANT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        name, cfg, variant = a.one
        own_process.emit(one(name, cfg == "ckpt", variant, a.rounds))
        return 0
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; peak of the second step, MiB; step ms (median of "
          f"{a.rounds}); first call s; |loss - eager's|")
    for name in a.only.split(","):
        for cfg in a.configs.split(","):
            print(f"\n{name} {cfg}")
            if a.budgets:
                _budget_sweep(a, name, cfg)
                continue
            eager_loss = None
            for variant in a.variants.split(","):
                r = _run(a, name, cfg, variant)
                if r and variant == "eager":
                    eager_loss = r["loss"]
                _row(variant, r, eager_loss)
    return 0


def _run(a, name, cfg, variant):
    """One variant in a process of its own: its result dict, or None (the error printed)."""
    r, why = own_process.run(__file__, ["--rounds", a.rounds, "--one", name, cfg, variant])
    if r is None:
        print(f"  {variant:22s} failed: {why}", flush=True)
    return r


def _row(variant, r, ref_loss):
    if r is None:
        return
    d = "" if ref_loss is None else f"  dloss {abs(r['loss'] - ref_loss):.1e}"
    bw = (f"  backward planned {r['bw_planned_mib']:.2f} / compiled {r['bw_compiled_mib']:.2f} MiB"
          if "bw_planned_mib" in r else "")
    print(f"  {variant:22s} peak {r['peak_mib']:8.1f}  step {r['step_ms']:8.0f} ms  first {r['first_s']:6.1f} s{d}{bw}",
          flush=True)


def _budget_sweep(a, name, cfg):
    """torch.compile at each activation_memory_budget; torchcompile + memfuse within each peak it reached."""
    peers = []
    for amb in a.budgets.split(","):
        r = _run(a, name, cfg, f"compile-amb{amb}")
        _row(f"compile-amb{amb}", r, None)
        if r:
            peers.append((amb, r))
    ref = peers[0][1]["loss"] if peers else None
    auto = _run(a, name, cfg, "tc+memfuse")
    _row("tc+memfuse (auto)", auto, ref)
    for amb, r in peers:
        v = f"tc+memfuse@{r['peak_mib']:.1f}"
        m = _run(a, name, cfg, v)
        _row(v, m, ref)
        if m:
            print(f"    vs compile-amb{amb}: peak {m['peak_mib'] / r['peak_mib']:.2f}x, "
                  f"step {m['step_ms'] / r['step_ms']:.2f}x", flush=True)
    for mib in (a.memfuse_mib.split(",") if a.memfuse_mib else ()):
        v = f"tc+memfuse@{float(mib):.1f}"
        _row(v, _run(a, name, cfg, v), ref)


if __name__ == "__main__":
    sys.exit(main())
