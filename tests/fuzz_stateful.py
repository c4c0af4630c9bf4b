"""Two families of the differential fuzzer (tests/fuzz_programs.py) about in-place writes.

NOTE [stateful programs]  Training steps of random modules that update their buffers and parameters in
place in the forward, as real models do: running averages (`mul_().add_()`), counters, `lerp_`,
`clamp_`, `copy_` from a computed value, a write into a view of a buffer, and parameters constrained
under `torch.no_grad()`; the forward reads the state before and after each update.  Two steps run back
to back, so a write the backward runs again shows in the second step's numbers.  The losses, the input
and parameter gradients and the final parameters and buffers are compared: with plain Thunder under the
same executors where that runs and agrees with eager, with eager where it cannot run the program
(Thunder's torchcompile executor cannot run many of them).  Every run also checks that memfuse planned
both traces, and that the backward writes none of its inputs (what the forward saved, the forward's own
inputs among them): a step's backward never updates a buffer.  The first family could not have found the
bug this one was written for (fusion_pass.py NOTE [writes stay put]): under autograd it writes only into
intermediates, never into an input that needs no gradient (a buffer), and it compares only where plain
Thunder with the same executors runs the program, which Thunder's torchcompile executor cannot for a module
that updates a buffer.

NOTE [recompute next to writes]  Inference programs built so that recomputation has something to do:
cheap values (elementwise ops, views) made early and read again only after a section of matmuls that
makes the peak, some of them made from a storage that a later op writes in place, with more writes into
inputs and intermediates around the peak.  memfuse runs them with recompute=1.0; they must give plain
Thunder's numbers, no op memfuse copied may read or make a storage something writes in place
(fusion_pass.pinned_ops: the same storages the planner orders by), and across the family some programs
must have ops copied next to writes (the test asserts it), so the family tests the recomputation it
is about.
"""
from __future__ import annotations

import random
import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch

from fuzz_programs import OVER_BUDGET, Outcome, _close, rebuilt_detail

N = 6
ROWS = 4

# {x} a computed value; {b} a buffer (b0 or b1); {h} a computed value whose detached data updates state
_UNARY = ["torch.tanh({x})", "{x}.relu()", "{x} * 2", "torch.sigmoid({x})", "{x}.sin()"]
_BINARY = ["{x} + {y}", "{x} * {y}", "{x} - {y}", "({x} @ self.w) / N"]
_READS = ["{x} * self.{b}", "{x} + self.{b}", "{x} * (1 + self.cnt / 8)", "torch.tanh({x}) * self.{b}",
          "{x} - self.{b}[: N // 2].sum()"]
_UPDATES = [
    "self.{b}.mul_(0.9).add_({h}.detach().mean(0) * 0.1)",  # a running average
    "self.cnt.add_(1)",  # a counter
    "with torch.no_grad():\n    self.{b}.lerp_({h}.mean(0), 0.25)",  # Thunder has no grad rule for lerp
    "self.{b}.clamp_(-0.5, 0.5)",
    "self.{b}.copy_({h}.detach().sum(0) / N)",
    "self.{b}[: N // 2].add_({h}.detach()[0, : N // 2])",  # through a view of the buffer
]
_PARAM_UPDATES = ["with torch.no_grad():\n    self.w.clamp_(-0.3, 0.3)", "with torch.no_grad():\n    self.w.mul_(0.99)"]


@dataclass
class StepProgram:
    seed: int
    family: str
    lines: list = field(default_factory=list)
    make: object = None  # stateful: a fresh module; recompute: the function
    options: dict = field(default_factory=dict)  # MemFuse's options besides strict=True

    def describe(self):
        return "\n".join(self.lines)


def make_stateful(seed: int) -> StepProgram:
    rng = random.Random(seed)
    vals = ["v1"]
    body = []
    if rng.random() < 0.15:  # a constrained parameter, updated before the forward uses it
        body.append(rng.choice(_PARAM_UPDATES))
    body.append("v1 = x @ self.w")
    updates = 0
    saved = set()  # buffers an op saved for backward: eager's autograd refuses a later write to them
    for _ in range(rng.randrange(4, 12)):
        r = rng.random()
        x, y, b = rng.choice(vals), rng.choice(vals), rng.choice(["b0", "b1"])
        if r < 0.25:
            expr = rng.choice(_UNARY).format(x=x)
        elif r < 0.45:
            expr = rng.choice(_BINARY).format(x=x, y=y)
        elif r < 0.65:
            expr = rng.choice(_READS).format(x=x, b=b)
            if "* self." in expr:
                saved.add(b)
        else:
            update = rng.choice(_UPDATES)
            if "{b}" in update and b in saved:
                continue
            body.append(update.format(b=b, h=x))
            updates += 1
            continue
        name = f"v{len(vals) + 1}"
        body.append(f"{name} = {expr}")
        vals.append(name)
    if not updates:
        body.append(_UPDATES[1])
    body.append(f"v{len(vals) + 1} = {vals[-1]} * self.b0 + self.b1")  # the state after its updates
    vals.append(f"v{len(vals) + 1}")
    outs = sorted(set(rng.sample(vals, k=min(len(vals), rng.randrange(1, 4))) + [vals[-1]]))
    body.append("return " + " + ".join(f"{o}.square().sum()" for o in outs))
    lines = ["class M(torch.nn.Module):",
             "    def __init__(self):",
             "        super().__init__()",
             f"        g = torch.Generator().manual_seed({seed})",
             "        self.w = torch.nn.Parameter(torch.randn(N, N, generator=g) / 2)",
             "        self.register_buffer('b0', torch.randn(N, generator=g) / 2)",
             "        self.register_buffer('b1', torch.randn(N, generator=g) / 2)",
             "        self.register_buffer('cnt', torch.zeros(()))",
             "",
             "    def forward(self, x):"] + ["        " + ln.replace("\n", "\n        ") for ln in body]
    ns = {"torch": torch, "N": N}
    exec(compile("\n".join(lines) + "\n", f"<stateful program {seed}>", "exec"), ns)
    options = {"recompute": 1.0} if rng.random() < 0.5 else {}
    return StepProgram(seed=seed, family="stateful", lines=lines, make=ns["M"], options=options)


def make_recompute(seed: int) -> StepProgram:
    rng = random.Random(seed)
    body, early, written = [], [], []
    for k in range(rng.randrange(2, 5)):  # cheap values, read again after the peak
        src = rng.choice(["a", "b", "a.t()", "s"])
        if rng.random() < 0.5:  # made from a storage written in place below
            body.append(f"f{k} = {src} * 1.5")
            written.append(f"f{k}")
            src = f"f{k}"
        body.append(f"c{k} = {rng.choice(['{x}.sin()', 'torch.tanh({x})', '{x}.t()', '{x} * 3'])}".format(x=src))
        early.append(f"c{k}")
    writes = [f"{t}.mul_(0.5)" for t in written] + ["s.add_(1)"] * rng.randrange(0, 2)
    # each cheap value is read early too, so no order alone can keep it out of the peak
    peak = [f"p0 = (a @ b + {' + '.join(early)}).relu()"]
    for j in range(1, rng.randrange(2, 5)):
        peak.append(f"p{j} = (p{j - 1} @ {rng.choice(['a', 'b'])}).{rng.choice(['tanh', 'sin', 'relu'])}()")
    rng.shuffle(writes)
    cut = rng.randrange(0, len(peak) + 1)  # writes before, inside or after the peak section
    body += peak[:cut] + writes + peak[cut:]
    last = f"p{len(peak) - 1}"
    terms = [f"({last} * {c}).sum()" for c in early] + [f"{t}.sum()" for t in written]
    body.append(f"return ({' + '.join(terms)},)")
    lines = ["def program(a, b, s):"] + ["    " + ln for ln in body]
    ns = {"torch": torch, "N": N}
    exec(compile("\n".join(lines) + "\n", f"<recompute program {seed}>", "exec"), ns)
    return StepProgram(seed=seed, family="recompute", lines=lines, make=ns["program"], options={"recompute": 1.0})


# ---- running ------------------------------------------------------------------------------


def _steps(p: StepProgram, module, call):
    """Two training steps: losses, input gradients, then the parameter's gradient and the state."""
    g = torch.Generator().manual_seed(p.seed + 1)
    res = []
    for step in range(2):
        x = torch.randn(ROWS, N, generator=g, requires_grad=True)
        loss = call(x)
        loss.backward()
        res += [loss.detach().clone(), x.grad.clone()]
    res += [module.w.grad.clone(), module.w.detach().clone()]
    res += [t.detach().clone() for t in module.buffers()]
    return res


def _inference(p: StepProgram, call):
    g = torch.Generator().manual_seed(p.seed)
    a, b, s = (torch.randn(N, N, generator=g) for _ in range(3))
    with torch.no_grad():
        outs = call(a, b, s)
    return [o.clone() for o in outs] + [a, b, s]


def _run(p: StepProgram, jit=None):
    """(results, the jitted callable or None); jit(fn) -> jitted fn."""
    if p.family == "stateful":
        m = p.make()
        call = m if jit is None else jit(m)
        return _steps(p, m, call), (None if jit is None else call)
    call = p.make if jit is None else jit(p.make)
    return _inference(p, call), (None if jit is None else call)


def check(p: StepProgram, executors=None, memory_budget="auto") -> Outcome:
    import thunder

    from thunder_memfuse import MemFuse, MemFuseWarning

    kw = {"executors": executors} if executors else {}
    try:
        ref, _ = _run(p)
    except Exception as e:
        return Outcome("skip", f"eager: {type(e).__name__}")
    # the reference: plain Thunder under these executors; where they cannot run it, plain Thunder under
    # its default ones (in place of the executors memfuse replaces); where neither can, eager
    cannot, plain, who = set(), None, "eager's (plain Thunder cannot run it)"
    for ex_kw in ([kw, {}] if kw else [kw]):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                plain, _ = _run(p, lambda f: thunder.jit(f, **ex_kw))
        except Exception as e:
            cannot.add(f"{type(e).__name__}: {e}")
            continue
        who = "plain Thunder's" if ex_kw is kw else "plain Thunder's (default executors)"
        break
    if plain is not None and not _close(plain, ref, exact=False):
        return Outcome("skip", "plain Thunder disagrees with eager")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", MemFuseWarning)
            warnings.filterwarnings("ignore", OVER_BUDGET, MemFuseWarning)
            ours, jm = _run(p, lambda f: thunder.jit(f, transforms=[MemFuse(
                strict=True, **{"memory_budget": memory_budget, **p.options})], **kw))
    except Exception as e:
        if f"{type(e).__name__}: {e}" in cannot:  # Thunder's own limit, not memfuse's
            return Outcome("skip", f"Thunder cannot run it: {type(e).__name__}: {str(e)[:80]}")
        return Outcome("error", f"{type(e).__name__}: {str(e)[:300]}")
    against, exact = (plain, not executors) if plain is not None else (ref, False)
    if not _close(ours, against, exact=exact):
        return Outcome("mismatch", f"memfuse's results differ from {who}")
    fw = [t for t in thunder.last_traces(jm) if getattr(t, "_memfuse_info", None)]
    bw = [t for t in (thunder.last_backward_traces(jm) or ()) if getattr(t, "_memfuse_info", None)]
    if not fw or (p.family == "stateful" and not bw):
        return Outcome("unplanned", "memfuse did not plan every trace")
    if bw and (w := backward_writes_its_inputs(bw[-1])):
        return Outcome("mismatch", f"the backward writes into its inputs: {w}")
    if p.family == "recompute":
        return _recompute_outcome(fw[-1], thunder.last_traces(jm))
    return Outcome("ok", rebuilt_detail(jm))


def _flat(trace):
    """The trace's ops with fusion regions read through their subsymbols."""
    out = []
    for b in trace.bound_symbols:
        if getattr(b.sym, "is_fusion", False) and b.subsymbols:
            out.extend(b.subsymbols)
        else:
            out.append(b)
    return out


def backward_writes_its_inputs(trace):
    """Names of the backward's inputs (unpacked, not made by an op) whose storage an op writes."""
    from thunder_memfuse.integration.fusion_pass import written_storages

    ops = _flat(trace)
    find, written = written_storages(ops)
    made = {o.name for b in ops if b.sym.name not in ("unpack_sequence", "unpack_trivial")
            for o in b.flat_proxy_outs}
    inputs = {a.name for b in ops for a in b.flat_proxy_args if getattr(a, "name", None) and a.name not in made}
    return sorted(n for n in inputs if find(n) in written)


def _signature(b):
    return (b.sym.name, tuple(getattr(a, "name", repr(a)) for a in b.flat_args))


def _recompute_outcome(planned, traces) -> Outcome:
    """ok with "copied=K writes=W" (ops memfuse copied, in-place writes in the trace), or a mismatch
    when a copied op reads or makes a storage something writes in place."""
    from thunder_memfuse.integration.fusion_pass import pinned_ops

    given = traces[traces.index(planned) - 1] if planned in traces and traces.index(planned) > 0 else None
    ops = _flat(planned)
    before = Counter(_signature(b) for b in _flat(given)) if given is not None else Counter()
    now = Counter(_signature(b) for b in ops)
    copied = {sig for sig, n in now.items() if n > before.get(sig, 0) and n > 1}
    pinned = pinned_ops(ops)
    bad = [b.sym.name for b in ops if _signature(b) in copied and id(b) in pinned]
    if bad:
        return Outcome("mismatch", f"ops copied next to a write of their storage: {bad}")
    info = planned._memfuse_info.get("recompute") or {}
    from thunder_memfuse.integration.fusion_pass import _writes

    return Outcome("ok", f"copied={info.get('copied_ops', 0)} writes={len(_writes(ops))}")


def copied_next_to_writes(res) -> int:
    """How many ok programs of a recompute fuzz had ops copied in a trace with in-place writes."""
    n = 0
    for _, detail in res.get("ok", ()):
        parts = dict(kv.split("=") for kv in detail.split())
        n += int(parts.get("copied", 0)) > 0 and int(parts.get("writes", 0)) > 0
    return n

