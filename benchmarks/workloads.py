"""The workloads of benchmarks/models.py, importable (a notebook can reuse them).

    import sys; sys.path.insert(0, "benchmarks")
    from workloads import llama, nanogpt, seed_workloads, training_step

- llama(...): a small Llama-style decoder written here (RMSNorm, rotary
  position embedding, SwiGLU MLP, causal attention through
  scaled_dot_product_attention, tied nothing), optionally with per-block
  activation checkpointing.
- nanogpt(...): Thunder's own test model (thunder.tests.nanogpt_model).
- training_step(model, x): the step every variant runs: forward, cross-entropy
  loss against the shifted tokens, backward.  Returns the loss.
- seed_workloads(...): the seed's two functions with their inputs.

Each workload is a Workload: a name, a callable to compile and its inputs, how
to build the step for a compiled callable, and the values the step returns
(loss and gradients) for the matches-eager check.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn


# ---- the Llama-style model -----------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_tables(seq, head_dim, base=10000.0):
    """cos and sin tables, (seq, head_dim), for the rotate-half form of RoPE."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rotary(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        hd = d // self.heads
        q = self.wq(x).view(b, t, self.heads, hd).transpose(1, 2)
        k = self.wk(x).view(b, t, self.heads, hd).transpose(1, 2)
        v = self.wv(x).view(b, t, self.heads, hd).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.attn_norm = RMSNorm(dim)
        self.attn = Attention(dim, heads)
        self.mlp_norm = RMSNorm(dim)
        self.mlp = SwiGLU(dim, hidden)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """A small Llama-style decoder: token embedding, blocks, final RMSNorm, LM head."""

    def __init__(self, vocab=1024, dim=256, layers=4, heads=4, hidden=None, seq=128, checkpoint=False):
        super().__init__()
        hidden = hidden or 256 * math.ceil(8 * dim / 3 / 256)
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        cos, sin = rotary_tables(seq, dim // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.checkpoint = checkpoint

    def forward(self, idx):
        t = idx.shape[1]
        x = self.embed(idx)
        cos, sin = self.cos[:t], self.sin[:t]
        for blk in self.blocks:
            if self.checkpoint:
                x = torch.utils.checkpoint.checkpoint(blk, x, cos, sin, use_reentrant=False)
            else:
                x = blk(x, cos, sin)
        return self.head(self.norm(x))


# ---- workloads -----------------------------------------------------------------------------
@dataclass
class Workload:
    name: str
    fn: Any                      # what each variant compiles (a module or a function)
    inputs: tuple                # the call's arguments
    step: Callable               # step(compiled) -> a zero-argument callable running one step
    result: Callable             # result(compiled) -> tensors to compare with eager (runs one step)
    reset: Callable = lambda: None  # clears state between steps (gradients)
    training: bool = False


def _model_workload(name, model, idx, targets):
    params = [p for p in model.parameters() if p.requires_grad]

    def reset():
        for p in params:
            p.grad = None

    def step(compiled):
        def run():
            return training_step(compiled, idx, targets)

        return run

    def result(compiled):
        reset()
        loss = training_step(compiled, idx, targets)
        out = [loss.detach()] + [p.grad.detach().clone() for p in params]
        reset()
        return out

    return Workload(name, model, (idx,), step, result, reset, training=True)


def training_step(model, idx, targets):
    """One training step: logits, cross-entropy against the targets, backward."""
    out = model(idx)
    logits = out[0] if isinstance(out, tuple) else out
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    return loss


def llama(batch=4, seq=128, dim=256, layers=4, heads=4, vocab=1024, checkpoint=False, seed=0):
    torch.manual_seed(seed)
    model = Llama(vocab=vocab, dim=dim, layers=layers, heads=heads, seq=seq, checkpoint=checkpoint)
    idx = torch.randint(0, vocab, (batch, seq))
    targets = torch.roll(idx, -1, dims=1)
    name = f"llama {layers}x{dim}, {batch}x{seq}" + (", checkpointed" if checkpoint else "")
    return _model_workload(name, model, idx, targets)


def nanogpt(batch=4, seq=128, dim=256, layers=4, heads=4, vocab=1024, checkpoint=False, seed=0):
    from nanogpt_cpu import make_model  # the same model benchmarks/nanogpt_cpu.py and the notebook run

    model = make_model(layers=layers, embd=dim, heads=heads, seq=seq, vocab=vocab, checkpoint=checkpoint, seed=seed)
    idx = torch.randint(0, vocab, (batch, seq))
    targets = torch.roll(idx, -1, dims=1)
    name = f"nanogpt {layers}x{dim}, {batch}x{seq}" + (", checkpointed" if checkpoint else "")
    return _model_workload(name, model, idx, targets)


class NewGELU(torch.nn.Module):
    """GPT-2's activation as Hugging Face's GPT-2 writes it (NewGELUActivation): the tanh GELU as
    explicit elementwise ops, which Thunder keeps as a chain of primitives."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gpt2(batch=4, seq=128, dim=256, layers=4, heads=4, vocab=1024, checkpoint=False, seed=0):
    """A GPT-2-style model: nanoGPT's blocks with Hugging Face GPT-2's explicit tanh GELU."""
    from nanogpt_cpu import make_model

    model = make_model(layers=layers, embd=dim, heads=heads, seq=seq, vocab=vocab, checkpoint=checkpoint, seed=seed)
    for block in model.transformer.h:
        block.mlp.gelu = NewGELU()
    idx = torch.randint(0, vocab, (batch, seq))
    targets = torch.roll(idx, -1, dims=1)
    name = f"gpt2 {layers}x{dim}, {batch}x{seq}" + (", checkpointed" if checkpoint else "")
    return _model_workload(name, model, idx, targets)


def backward_plan_call(w, **jit_kwargs):
    """One step of workload w under thunder.jit(w.fn, transforms=[MemFuse()], **jit_kwargs), with the
    backward's call of thunder_memfuse.integration._planning.plan_trace caught on its way in: (its bound symbols,
    its keyword arguments, the real plan_trace), to plan that backward again."""
    import thunder
    from thunder_memfuse import MemFuse
    from thunder_memfuse.integration import _planning

    calls, orig = [], _planning.plan_trace

    def spy(bsyms, **kw):
        calls.append((list(bsyms), dict(kw)))
        return orig(bsyms, **kw)

    _planning.plan_trace = spy
    try:
        w.step(thunder.jit(w.fn, transforms=[MemFuse()], **jit_kwargs))()
    finally:
        _planning.plan_trace = orig
    # the backward's is the last call planned without an allowance: the forward is planned again after
    # it, within the backward's peak (thunder_memfuse/integration/_step.py NOTE [the step's peak])
    bsyms, kw = [c for c in calls if not c[1].get("peak_allowance")][-1]
    return bsyms, kw, orig


def seed_workloads(paths=10, size=256, seed=0):
    if __package__:  # imported as benchmarks.workloads
        from .seed import FUNCTIONS
    else:  # import workloads, benchmarks/ on sys.path (the scripts here, notebooks/05_memory_model.ipynb)
        from seed import FUNCTIONS

    torch.manual_seed(seed)
    t0s = [torch.randn(size, size) for _ in range(paths)]
    a = torch.randn(size, size)
    out = []
    for fname, fn in FUNCTIONS.items():
        def step(compiled):
            return lambda: compiled(list(t0s), a)

        def result(compiled, fn=fn):
            return [compiled(list(t0s), a)]

        out.append(Workload(f"seed {fname}", fn, (list(t0s), a), step, result))
    return out


def all_workloads(quick=False, batch=4, seq=128, dim=256, layers=4, paths=10, size=256, only=None):
    """The benchmark's workloads in order (only: substrings of names to keep)."""
    if quick:
        batch, seq, dim, layers, size = min(batch, 2), min(seq, 64), min(dim, 128), min(layers, 2), min(size, 128)
    ws = list(seed_workloads(paths, size))
    for make in (nanogpt, llama):
        for ckpt in (False, True):
            ws.append(make(batch=batch, seq=seq, dim=dim, layers=layers, heads=4, checkpoint=ckpt))
    ws.append(gpt2(batch=batch, seq=seq, dim=dim, layers=layers, heads=4))
    if only:
        ws = [w for w in ws if any(o in w.name for o in only)]
    return ws
