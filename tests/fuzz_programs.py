"""A differential fuzzer: random straight-line programs run by plain Thunder and by Thunder with memfuse.

Each program is a random sequence of elementwise ops, views (slices, transposes, `view`), may-alias
ops (`reshape`, `contiguous`), matmuls, reductions, random draws and in-place ops on intermediates,
on inputs and on views of either, with inputs that do or do not require grad.  Eager runs it first;
where plain Thunder disagrees with eager (or cannot run it) the program says nothing about memfuse
and is skipped.  Otherwise memfuse, under the same executors and the same seed, must give plain
Thunder's outputs and input gradients: bit for bit where memfuse only reorders (plain thunder.jit),
within float tolerance where its regions are compiled (executors=["torchcompile"]).  Every run also
checks that memfuse planned each trace (its `_memfuse_info`), so a pass that silently did nothing
fails here.

Three more families (NOTE [stateful programs], NOTE [recompute next to writes], NOTE [attention
programs]): training steps of modules that update buffers and parameters in place, programs built so
that recomputation copies ops next to in-place writes, and the plain programs with attention among their
ops (compared within float tolerance: memfuse runs it on fused kernels, plain Thunder decomposes it).

    python tests/fuzz_programs.py --programs 3000 --seconds 1800 [--executors torchcompile]
    python tests/fuzz_programs.py --family stateful --programs 200 [--executors torchcompile]
    python tests/fuzz_programs.py --family attention --programs 500 [--executors torchcompile]

tests/test_fuzz.py runs a seeded, time-bounded slice of each in the test command.
"""
from __future__ import annotations

import argparse
import functools
import random
import sys
import time
import warnings
from dataclasses import dataclass, field

import torch

N = 6  # every full value is N x N; partial views are slices of one


# Source templates: {x}, {y} are values, {t} an in-place target.  Programs are generated as
# straight-line source, which Thunder's interpreter traces far faster than a loop over closures.
_UNARY = ["{x}.sin()", "{x}.cos()", "torch.tanh({x})", "{x}.relu()", "-{x}", "{x} * 2", "torch.sigmoid({x})",
          "torch.exp({x}.clamp(-3, 3))"]
_BINARY = ["{x} + {y}", "{x} * {y}", "{x} - {y}", "({x} @ {y}) / N", "{x} + {y}.sum(0, keepdim=True) / N",
           "torch.where({x} > 0, {x}, {y})"]
# full-shape views and may-alias ops
_VIEWS = ["{x}[:, :]", "{x}.t()", "{x}.view(N, N)", "{x}.view(-1).view(N, N)", "{x}.reshape(N * N).reshape(N, N)",
          "{x}.contiguous()", "{x}.t().contiguous()", "{x}.t().reshape(N, N)", "{x}.to(torch.float32)"]
# partial views, targets of in-place ops
_PARTS = ["{x}[:, : N // 2]", "{x}[N // 3:]", "{x}.diagonal()", "{x}[0]", "{x}.t()[:, 1:]"]
_INPLACE = ["{t}.add_({y})", "{t}.mul_(0.5)", "{t}.sin_()", "{t}.relu_()", "{t}.copy_({y})", "{t}.clamp_(-0.5, 0.5)"]
# NOTE [attention programs]: the attention family's ops, whose masks and biases are values the program made
# (so they may need a gradient that no proxy announces): scaled_dot_product_attention (masked, causal, plain),
# and the chains attention_match.py rewrites (BERT's written out, Bloom's baddbmm over 3-D views)
_ATTENTION = [
    "F.scaled_dot_product_attention({x}.view(1, 1, N, N), {y}.view(1, 1, N, N), {z}.view(1, 1, N, N), "
    "attn_mask={m}.view(1, 1, N, N)).view(N, N)",
    "F.scaled_dot_product_attention({x}.view(1, 1, N, N), {y}.view(1, 1, N, N), {z}.view(1, 1, N, N), "
    "is_causal=True).view(N, N)",
    "(torch.softmax(({x}.view(1, 1, N, N) @ {y}.view(1, 1, N, N).transpose(-1, -2)) / 3 + {m}.view(1, 1, N, N), -1)"
    " @ {z}.view(1, 1, N, N)).view(N, N)",
    "torch.bmm(torch.softmax({m}[0].view(1, 1, N).baddbmm({x}.view(1, N, N), {y}.view(1, N, N).transpose(-1, -2), "
    "beta=1.0, alpha=0.3).view(1, 1, N, N) + {w}.view(1, 1, N, N), -1, dtype=torch.float32).to(torch.float32)"
    ".view(1, N, N), {z}.view(1, N, N)).view(N, N)",
]


@dataclass
class Program:
    seed: int
    grad: bool
    attention: bool = False
    lines: list = field(default_factory=list)
    fn: object = None

    def __call__(self, a, b):
        return self.fn(a, b)

    def describe(self):
        return "\n".join(self.lines)


def make_program(seed: int, attention: bool = False) -> Program:
    """attention: the attention family (NOTE [attention programs]), compared within float tolerance."""
    rng = random.Random(seed)
    p = Program(seed=seed, grad=rng.random() < 0.4, attention=attention)
    vals = ["a", "b"]
    computed = []  # intermediates (targets for in-place ops)
    body = []
    for _ in range(rng.randrange(4, 14)):
        r = rng.random()
        x, y = rng.choice(vals), rng.choice(vals)
        if attention and r < 0.2:
            z, m, w = (rng.choice(vals) for _ in range(3))
            expr = rng.choice(_ATTENTION).format(x=x, y=y, z=z, m=m, w=w)
        elif r < 0.25:
            expr = rng.choice(_UNARY).format(x=x)
        elif r < 0.5:
            expr = rng.choice(_BINARY).format(x=x, y=y)
        elif r < 0.62:
            src = rng.choice(computed) if computed and rng.random() < 0.8 else x
            expr = rng.choice(_VIEWS).format(x=src)
        elif r < 0.66:
            expr = f"torch.rand_like({x})"
        else:
            # in-place writes: intermediates (and their views); inputs when nothing requires grad
            targets = computed + ([] if p.grad else ["a", "b"])
            if not targets:
                continue
            t = rng.choice(targets)
            if rng.random() < 0.15:
                body.append(f"{t}[: N // 2] = {y}[: N // 2] * 0.5")
                continue
            if rng.random() < 0.4:
                part = rng.choice(_PARTS)
                t, y = part.format(x=t), part.format(x=y)
            body.append(rng.choice(_INPLACE).format(t=t, y=y))
            continue
        name = f"v{len(vals)}"
        body.append(f"{name} = {expr}")
        vals.append(name)
        computed.append(name)
    if not computed:
        body.append("v2 = a + b")
        computed.append("v2")
    outs = sorted(set(rng.sample(computed, k=min(len(computed), rng.randrange(1, 4))) + [computed[-1]]))
    body.append(f"return ({', '.join(outs)},)")
    p.lines = ["def program(a, b):"] + ["    " + ln for ln in body]
    src = "\n".join(p.lines) + "\n"
    ns = {"torch": torch, "N": N, "F": torch.nn.functional}
    exec(compile(src, f"<fuzz program {seed}>", "exec"), ns)
    p.fn = ns["program"]
    return p


def _inputs(p: Program):
    g = torch.Generator().manual_seed(p.seed)
    a = torch.randn(N, N, generator=g)
    b = torch.randn(N, N, generator=g)
    return a, b


def _run(fn, p: Program):
    """Outputs (detached) and, when the program's inputs require grad, their gradients."""
    a, b = _inputs(p)
    if p.grad:
        a.requires_grad_(True)
        b.requires_grad_(True)
    torch.manual_seed(1234)
    outs = fn(a, b)
    res = [o.detach().clone() for o in outs]
    if p.grad:
        w = torch.Generator().manual_seed(p.seed + 1)
        diff = [o for o in outs if o.requires_grad]
        if diff:
            loss = sum((o * torch.randn(o.shape, generator=w)).sum() for o in diff)
            loss.backward()
        res += [x.grad.clone() if x.grad is not None else torch.zeros(N, N) for x in (a, b)]
    res += [a.detach().clone(), b.detach().clone()]  # in-place writes to the inputs count too
    return res


def _close(xs, ys, exact):
    if len(xs) != len(ys):
        return False
    for x, y in zip(xs, ys):
        if x.shape != y.shape:
            return False
        if exact:
            if not torch.equal(x, y):
                return False
        elif not torch.allclose(x, y, rtol=1e-4, atol=1e-5, equal_nan=True):
            return False
    return True


@dataclass
class Outcome:
    status: str  # "ok", "skip" (plain Thunder wrong or unable), "mismatch", "unplanned", "error"
    detail: str = ""


# MemFuse(memory_budget=) below every plan: the lowest plan is used with a warning, which the fuzzer
# allows (every other MemFuseWarning is an error); a forward that rebuilt saved tensors in the
# backward (integration/_saved_set.py NOTE [the saved set]) says so in its outcome's detail
OVER_BUDGET = r"MemFuse\(memory_budget="


def rebuilt_detail(jm) -> str:
    import thunder

    n = max((len(((getattr(t, "_memfuse_info", None) or {}).get("saved_set") or {}).get("rebuilt", ()))
             for t in thunder.last_traces(jm)), default=0)
    return f"rebuilt {n}" if n else ""


def check(p: Program, executors=None, memory_budget="auto") -> Outcome:
    import thunder

    from thunder_memfuse import MemFuse, MemFuseWarning

    kw = {"executors": executors} if executors else {}
    try:
        ref = _run(p.fn, p)
    except Exception as e:  # the program itself is invalid in eager (a leaf written in place, ...)
        return Outcome("skip", f"eager: {type(e).__name__}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plain = _run(thunder.jit(p.fn, **kw), p)
    except Exception as e:
        return Outcome("skip", f"plain Thunder: {type(e).__name__}: {str(e)[:80]}")
    if not _close(plain, ref, exact=False):
        return Outcome("skip", "plain Thunder disagrees with eager")
    jm = thunder.jit(p.fn, transforms=[MemFuse(strict=True, memory_budget=memory_budget)], **kw)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", MemFuseWarning)
            warnings.filterwarnings("ignore", OVER_BUDGET, MemFuseWarning)
            ours = _run(jm, p)
    except Exception as e:
        return Outcome("error", f"{type(e).__name__}: {str(e)[:300]}")
    if not _close(ours, plain, exact=not executors and not p.attention):  # fused attention: a kernel of its own
        return Outcome("mismatch", "memfuse's results differ from plain Thunder's")
    kinds = ["forward"] + (["backward"] if p.grad and thunder.last_backward_traces(jm) else [])
    for kind, getter in (("forward", thunder.last_traces), ("backward", thunder.last_backward_traces)):
        if kind in kinds and not any(getattr(t, "_memfuse_info", None) for t in getter(jm)):
            return Outcome("unplanned", f"memfuse did not plan the {kind} trace")
    return Outcome("ok", rebuilt_detail(jm))


def fuzz(seeds, *, seconds=None, executors=None, log=None, family="plain", memory_budget="auto"):
    """Check programs of the given seeds until done or `seconds` pass; {status: [(seed, detail)]}.
    family: "plain" or "attention" (make_program), "stateful" or "recompute" (fuzz_stateful.py); memory_budget:
    MemFuse's."""
    import fuzz_stateful

    make, chk = {"plain": (make_program, check), "attention": (functools.partial(make_program, attention=True), check),
                 "stateful": (fuzz_stateful.make_stateful, fuzz_stateful.check),
                 "recompute": (fuzz_stateful.make_recompute, fuzz_stateful.check)}[family]
    t0 = time.monotonic()
    out: dict = {}
    for s in seeds:
        if seconds is not None and time.monotonic() - t0 > seconds:
            break
        p = make(s)
        o = chk(p, executors, memory_budget)
        out.setdefault(o.status, []).append((s, o.detail))
        if log and o.status not in ("ok", "skip"):
            log(f"seed {s}: {o.status}: {o.detail}\n    {p.describe()}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--programs", type=int, default=2000)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--executors", nargs="*", default=None, help="e.g. torchcompile")
    ap.add_argument("--family", choices=("plain", "attention", "stateful", "recompute"), default="plain")
    ap.add_argument("--memory-budget", type=int, default=None, help="MemFuse(memory_budget=) in bytes")
    a = ap.parse_args(argv)
    res = fuzz(range(a.first_seed, a.first_seed + a.programs), seconds=a.seconds, executors=a.executors,
               log=lambda m: print(m, flush=True), family=a.family, memory_budget=a.memory_budget or "auto")
    print({k: len(v) for k, v in res.items()})
    if a.family == "recompute":
        import fuzz_stateful

        print(f"programs with ops copied next to in-place writes: {fuzz_stateful.copied_next_to_writes(res)}")
    return 1 if any(k in res for k in ("mismatch", "unplanned", "error")) else 0


if __name__ == "__main__":
    sys.path.insert(0, __import__("os").path.dirname(__file__))
    sys.exit(main())
