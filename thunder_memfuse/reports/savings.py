"""What memfuse saves on a step of yours: the same step jitted with and without memfuse, measured,
beside eager PyTorch.

    from thunder_memfuse.measure import savings
    s = savings(fn, *args, executors=["torchcompile"])   # prints a table and a one-line summary
    s.with_memfuse.peak_bytes, s.without.peak_bytes, s.eager.peak_bytes, s.results_match

    python -m thunder_memfuse.savings my_module:make_step [--executors torchcompile] [--iters 5] [--peers]

savings() runs fn eagerly and jits it twice in this process, with the same executors:
thunder.jit(fn, executors=...) and thunder.jit(fn, executors=..., transforms=[MemFuse()]); with
peers=True also torch.compile(fn).  For each it measures the first call (compile and run), then the
peak of one more call above what was live before it (torch.profiler's allocations on CPU,
torch.cuda.max_memory_allocated on CUDA: thunder_memfuse.measure), then the step time over `iters`
rounds, one call of each variant per round, the order reversed every other round (so a machine that
slows down or warms up over the run weighs on every variant alike): min, median and max.  It checks
that Thunder gives the same outputs with and without memfuse, and says plainly when memfuse's peak is
above eager's.  When the output requires grad, each call also runs the backward of the sum of the
outputs (loss_fn= to choose), so the figures are a training step's.  What it is doing goes to stderr
as it happens (thunder_memfuse/reports/_progress.py: on where stderr is a terminal; progress= or
THUNDER_MEMFUSE_PROGRESS=1 / 0).  The command-line form imports make_step from a module (or a file
path: path/to/file.py:make_step); make_step() returns (fn, args) or (fn, args, kwargs).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import statistics
import sys
import time
from dataclasses import dataclass, field

from ._compare import _tensors, default_loss  # _tensors: every tensor in nested lists, tuples and dicts

MIB = float(1 << 20)


@dataclass
class Run:
    """One variant's measurements (None where it could not run: see error).  step_ms is the median
    over the rounds, step_ms_min / step_ms_max the spread."""

    name: str
    peak_bytes: int | None = None
    step_ms: float | None = None
    first_call_ms: float | None = None
    error: str | None = None
    step_ms_min: float | None = None
    step_ms_max: float | None = None


@dataclass
class Savings:
    """savings()'s result: every variant's run, whether memfuse's outputs match Thunder's without
    it, and how it was measured.  eager: fn run as it is (None if not measured); peers: torch.compile
    (peers=True)."""

    without: Run
    with_memfuse: Run
    results_match: bool | None
    executors: list | None
    measured_by: str
    notes: list = field(default_factory=list)
    eager: Run | None = None
    peers: list = field(default_factory=list)
    rounds: int = 0

    @property
    def saved_bytes(self) -> int | None:
        a, b = self.without.peak_bytes, self.with_memfuse.peak_bytes
        return None if a is None or b is None else a - b

    @property
    def above_eager_bytes(self) -> int | None:
        """How far memfuse's peak is above eager PyTorch's (0 if not above; None if not measured)."""
        e = self.eager.peak_bytes if self.eager is not None else None
        w = self.with_memfuse.peak_bytes
        return None if e is None or w is None else max(0, w - e)

    def runs(self) -> list:
        return [r for r in (self.eager, *self.peers, self.without, self.with_memfuse) if r is not None]

    def summary(self) -> str:
        """One line: memfuse's peak against Thunder's without it and eager's, step time (medians, with
        the spread), first call, whether the outputs match."""
        w, o = self.with_memfuse, self.without
        ex = ", ".join(self.executors) if self.executors else "Thunder's default"
        if w.error or o.error:
            return (f"memfuse savings could not be measured (executors: {ex}): "
                    f"{w.error or o.error}")
        saved = self.saved_bytes
        pct = f", {-100.0 * saved / o.peak_bytes:+.0f}%" if o.peak_bytes else ""
        match = {True: "outputs match", False: "OUTPUTS DIFFER", None: "outputs not compared"}[self.results_match]
        eager = ""
        if self.eager is not None and self.eager.peak_bytes is not None:
            eager = f", eager PyTorch {self.eager.peak_bytes / MIB:.2f} MiB"
            if self.above_eager_bytes:
                eager += f" (memfuse's peak is ABOVE eager's by {self.above_eager_bytes / MIB:.2f} MiB)"
        spread = ""
        if w.step_ms_min is not None and o.step_ms_min is not None:
            spread = (f" (medians of {self.rounds} alternating rounds; min-max {w.step_ms_min:.2f}-"
                      f"{w.step_ms_max:.2f} vs {o.step_ms_min:.2f}-{o.step_ms_max:.2f})")
        return (f"memfuse: peak {w.peak_bytes / MIB:.2f} MiB vs {o.peak_bytes / MIB:.2f} MiB without "
                f"({-saved / MIB:+.2f} MiB{pct}){eager}, step {w.step_ms:.2f} vs {o.step_ms:.2f} ms{spread}, "
                f"first call {w.first_call_ms / 1e3:.2f} vs {o.first_call_ms / 1e3:.2f} s, {match} "
                f"(executors: {ex})")

    def table(self) -> str:
        """A markdown table: one row per variant (eager first)."""
        out = [f"| variant | peak above inputs ({self.measured_by}) | step min / median / max "
               f"({self.rounds} rounds) | first call (compile + run) |",
               "|---|---|---|---|"]
        for r in self.runs():
            if r.error:
                out.append(f"| {r.name} | could not run: {r.error} | - | - |")
                continue
            if r.step_ms_min is not None:
                step = f"{r.step_ms_min:.2f} / {r.step_ms:.2f} / {r.step_ms_max:.2f} ms"
            else:
                step = f"{r.step_ms:.2f} ms"
            out.append(f"| {r.name} | {r.peak_bytes / MIB:.2f} MiB | {step} | {r.first_call_ms / 1e3:.2f} s |")
        return "\n".join(out)

    def __str__(self) -> str:
        lines = [self.table(), *self.notes]
        if self.above_eager_bytes:
            lines.append(f"Note: with memfuse this step still peaks above eager PyTorch "
                         f"({self.with_memfuse.peak_bytes / MIB:.2f} vs {self.eager.peak_bytes / MIB:.2f} MiB): "
                         f"memfuse lowered Thunder's peak, not to eager's. Running it eagerly uses less memory.")
        return "\n".join([*lines, self.summary()])


def savings(fn, *args, executors=None, memfuse=None, iters: int = 5, backward: bool | None = None,
            loss_fn=None, rtol: float = 1e-4, atol: float = 1e-4, print_result: bool = True,
            peers: bool = False, progress: bool | None = None, **kwargs) -> Savings:
    """Measure fn(*args, **kwargs) eagerly and jitted by Thunder with and without memfuse.

    fn: a plain function or torch.nn.Module (not one already returned by thunder.jit: it is jitted
    twice here).  executors: thunder.jit's executors for both (None: Thunder's default).
    memfuse: the transform to add (default MemFuse()).  iters: timed rounds, one call of each
    variant per round (min, median, max).  backward / loss_fn: as in measure.compare (default: a
    backward of the outputs' sum when they require grad).  rtol / atol: the outputs' comparison.
    print_result: print the table and the one-line summary.  peers: also torch.compile(fn).
    progress: say what runs on stderr (None: where stderr is a terminal, or as
    THUNDER_MEMFUSE_PROGRESS says).  Returns a Savings (.with_memfuse, .without, .eager, .peers,
    .results_match, .summary()).

    Example::

        s = savings(step, x, executors=["torchcompile"])
        assert s.with_memfuse.peak_bytes <= s.without.peak_bytes
    """
    import thunder
    import torch

    from ._progress import Progress
    from ..integration.transform import MemFuse

    if thunder.compile_stats(fn) is not None:
        raise TypeError("savings: pass the function or module itself, not thunder.jit's result: savings jits it "
                        "twice, with and without memfuse (savings(fn, *args, executors=[...]))")
    if not callable(fn):
        raise TypeError(f"savings: fn must be a function or a torch.nn.Module, got {type(fn).__name__}")
    if memfuse is None:
        memfuse = MemFuse()
    elif not isinstance(memfuse, MemFuse):
        raise TypeError(f"savings: memfuse must be a MemFuse instance (MemFuse(...)), got {memfuse!r}")
    if not isinstance(iters, int) or iters < 1:
        raise ValueError(f"savings: iters must be an int >= 1, got {iters!r}")
    say = Progress("savings", progress)
    from . import measure

    tensors = list(_tensors((args, kwargs)))
    cuda = any(t.device.type == "cuda" for t in tensors)
    measured_by = "torch.cuda.max_memory_allocated" if cuda else "torch.profiler allocations"
    ex = list(executors) if executors is not None else None
    jit_kw = {} if ex is None else {"executors": ex}
    suffix = f" ({', '.join(ex)})" if ex else ""
    variants = [("eager", fn)]
    if peers:
        variants.append(("torch.compile", torch.compile(fn)))
    variants += [("thunder" + suffix, thunder.jit(fn, **jit_kw)),
                 ("thunder + memfuse" + suffix, thunder.jit(fn, transforms=[memfuse], **jit_kw))]
    compiles = {"torch.compile", "thunder" + suffix, "thunder + memfuse" + suffix}
    runs, steps, outs, times = [], [], [], []
    for name, f in variants:
        step = _step(f, fn, args, kwargs, backward, loss_fn)
        run = Run(name)
        try:
            say(f"{name}: first call{' (compiles)' if name in compiles else ''} ...")
            t = time.perf_counter()
            out = step()
            _sync(cuda)
            run.first_call_ms = (time.perf_counter() - t) * 1e3
            say(f"{name}: first call took {run.first_call_ms / 1e3:.1f} s; measuring its peak")
            if cuda:
                peak, _ = measure.cuda_peak_bytes(step, warmup=False)
            else:
                peak, _ = measure.cpu_peak_bytes(step)
            run.peak_bytes = int(peak)
            outs.append(_detached(out))
        except Exception as e:
            run.error = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            outs.append(None)
            say(f"{name}: could not run: {run.error}")
        runs.append(run)
        steps.append(step)
        times.append([])
    live = [i for i, r in enumerate(runs) if r.error is None]
    for k in range(iters):  # alternating rounds: one call of each variant, the order reversed every other round
        say(f"timing: round {k + 1}/{iters}")
        for i in (live if k % 2 == 0 else live[::-1]):
            try:
                t = time.perf_counter()
                steps[i]()
                _sync(cuda)
                times[i].append((time.perf_counter() - t) * 1e3)
            except Exception as e:
                runs[i].error = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        live = [i for i in live if runs[i].error is None]
    for r, ts in zip(runs, times):
        if r.error is None and ts:
            r.step_ms, r.step_ms_min, r.step_ms_max = statistics.median(ts), min(ts), max(ts)
    without, with_memfuse = runs[-2], runs[-1]
    match = None
    if outs[-2] is not None and outs[-1] is not None:
        match = _same(outs[-2], outs[-1], rtol, atol)
    notes = []
    if outs[0] is not None and outs[-1] is not None and not _same(outs[0], outs[-1], rtol, atol):
        notes.append(f"Note: thunder + memfuse's outputs differ from eager's beyond rtol={rtol}, atol={atol}.")
    result = Savings(without, with_memfuse, match, ex, measured_by, notes, eager=runs[0],
                     peers=runs[1:-2], rounds=iters)
    say("done")
    if print_result:
        print(result)
    return result


def _step(jfn, fn, args, kwargs, backward, loss_fn):
    import torch

    params = list(fn.parameters()) if isinstance(fn, torch.nn.Module) else []

    def step():
        for p in params:  # each call starts without gradients, as a training step after zero_grad
            p.grad = None
        out = jfn(*args, **kwargs)
        diff = [t for t in _tensors(out) if t.requires_grad]
        if (backward if backward is not None else bool(diff)) and diff:
            loss = loss_fn(out) if loss_fn else default_loss(out)
            loss.backward()
            del loss
        return out

    return step


def _sync(cuda):
    if cuda:
        import torch

        torch.cuda.synchronize()


def _detached(x):
    return [t.detach().clone() for t in _tensors(x)]


def _same(a, b, rtol, atol) -> bool:
    import torch

    return len(a) == len(b) and all(x.shape == y.shape and torch.allclose(x, y, rtol=rtol, atol=atol)
                                    for x, y in zip(a, b))


def _load(target: str):
    """make_step from "module:make_step" or "path/to/file.py:make_step"."""
    mod_name, sep, attr = target.rpartition(":")
    if not sep or not mod_name or not attr:
        raise ValueError(f"expected MODULE:FUNCTION (my_module:make_step or path/to/file.py:make_step), got {target!r}")
    if mod_name.endswith(".py"):
        spec = importlib.util.spec_from_file_location("_memfuse_savings_target", mod_name)
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot load {mod_name!r}")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(mod_name)
    return getattr(mod, attr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m thunder_memfuse.savings", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", help="MODULE:FUNCTION, a make_step() returning (fn, args) or (fn, args, kwargs)")
    ap.add_argument("--executors", nargs="*", default=None, help="thunder.jit's executors for both runs")
    ap.add_argument("--iters", type=int, default=5,
                    help="timed rounds, one call of each variant per round (min / median / max)")
    ap.add_argument("--peers", action="store_true", help="also measure torch.compile(fn)")
    ap.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="say what runs on stderr (default: where stderr is a terminal, or as "
                         "THUNDER_MEMFUSE_PROGRESS=1 / 0 says)")
    a = ap.parse_args(argv)
    sys.path.insert(0, "")
    made = _load(a.target)()
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise SystemExit(f"{a.target}() must return (fn, args) or (fn, args, kwargs), got {type(made).__name__}")
    fn, args, kw = (*made, {}) if len(made) == 2 else made
    s = savings(fn, *args, executors=a.executors, iters=a.iters, peers=a.peers, progress=a.progress, **kw)
    return 1 if s.results_match is False else 0


if __name__ == "__main__":
    sys.exit(main())
