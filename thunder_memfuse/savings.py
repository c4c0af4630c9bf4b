"""What memfuse saves on a step of yours: the same step jitted with and without memfuse, measured.

    from thunder_memfuse.measure import savings
    s = savings(fn, *args, executors=["torchcompile"])   # prints a table and a one-line summary
    s.with_memfuse.peak_bytes, s.without.peak_bytes, s.results_match

    python -m thunder_memfuse.savings my_module:make_step [--executors torchcompile] [--iters 5]

savings() jits fn twice in this process, with the same executors: thunder.jit(fn, executors=...)
and thunder.jit(fn, executors=..., transforms=[MemFuse()]).  For each it measures the first call
(compile and run), then the peak of one more call above what was live before it (torch.profiler's
allocations on CPU, torch.cuda.max_memory_allocated on CUDA: thunder_memfuse.measure), then the
median time of `iters` calls; and it checks that both give the same outputs.  When the output
requires grad, each call also runs the backward of the sum of the outputs (loss_fn= to choose), so
the figures are a training step's.  The command-line form imports make_step from a module (or a
file path: path/to/file.py:make_step); make_step() returns (fn, args) or (fn, args, kwargs).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import statistics
import sys
import time
from dataclasses import dataclass, field

from ._compare import _tensors  # every tensor in nested lists, tuples and dicts

MIB = float(1 << 20)


@dataclass
class Run:
    """One variant's measurements (None where it could not run: see error)."""

    name: str
    peak_bytes: int | None = None
    step_ms: float | None = None
    first_call_ms: float | None = None
    error: str | None = None


@dataclass
class Savings:
    """savings()'s result: both runs, whether their outputs match, and how it was measured."""

    without: Run
    with_memfuse: Run
    results_match: bool | None
    executors: list | None
    measured_by: str
    notes: list = field(default_factory=list)

    @property
    def saved_bytes(self) -> int | None:
        a, b = self.without.peak_bytes, self.with_memfuse.peak_bytes
        return None if a is None or b is None else a - b

    def summary(self) -> str:
        """One line: memfuse's peak, step time and first call against Thunder's without it."""
        w, o = self.with_memfuse, self.without
        ex = ", ".join(self.executors) if self.executors else "Thunder's default"
        if w.error or o.error:
            return (f"memfuse savings could not be measured (executors: {ex}): "
                    f"{w.error or o.error}")
        saved = self.saved_bytes
        pct = f", {-100.0 * saved / o.peak_bytes:+.0f}%" if o.peak_bytes else ""
        match = {True: "outputs match", False: "OUTPUTS DIFFER", None: "outputs not compared"}[self.results_match]
        return (f"memfuse: peak {w.peak_bytes / MIB:.2f} MiB vs {o.peak_bytes / MIB:.2f} MiB without "
                f"({-saved / MIB:+.2f} MiB{pct}), step {w.step_ms:.2f} vs {o.step_ms:.2f} ms, first call "
                f"{w.first_call_ms / 1e3:.2f} vs {o.first_call_ms / 1e3:.2f} s, {match} (executors: {ex})")

    def table(self) -> str:
        """A markdown table: one row per variant."""
        out = [f"| variant | peak above inputs ({self.measured_by}) | step (median) | first call (compile + run) |",
               "|---|---|---|---|"]
        for r in (self.without, self.with_memfuse):
            if r.error:
                out.append(f"| {r.name} | could not run: {r.error} | - | - |")
            else:
                out.append(f"| {r.name} | {r.peak_bytes / MIB:.2f} MiB | {r.step_ms:.2f} ms | "
                           f"{r.first_call_ms / 1e3:.2f} s |")
        return "\n".join(out)

    def __str__(self) -> str:
        return "\n".join([self.table(), *self.notes, self.summary()])


def savings(fn, *args, executors=None, memfuse=None, iters: int = 5, backward: bool | None = None,
            loss_fn=None, rtol: float = 1e-4, atol: float = 1e-4, print_result: bool = True,
            **kwargs) -> Savings:
    """Measure fn(*args, **kwargs) jitted by Thunder with and without memfuse.

    fn: a plain function or torch.nn.Module (not one already returned by thunder.jit: it is jitted
    twice here).  executors: thunder.jit's executors for both (None: Thunder's default).
    memfuse: the transform to add (default MemFuse()).  iters: calls timed per variant (median).
    backward / loss_fn: as in measure.compare (default: a backward of the outputs' sum when they
    require grad).  rtol / atol: the outputs' comparison.  print_result: print the table and the
    one-line summary.  Returns a Savings (.with_memfuse, .without, .results_match, .summary()).

    Example::

        s = savings(step, x, executors=["torchcompile"])
        assert s.with_memfuse.peak_bytes <= s.without.peak_bytes
    """
    import thunder
    import torch

    from .transform import MemFuse

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
    from . import measure

    tensors = list(_tensors((args, kwargs)))
    cuda = any(t.device.type == "cuda" for t in tensors)
    measured_by = "torch.cuda.max_memory_allocated" if cuda else "torch.profiler allocations"
    ex = list(executors) if executors is not None else None
    jit_kw = {} if ex is None else {"executors": ex}
    variants = [("thunder" + (f" ({', '.join(ex)})" if ex else ""), thunder.jit(fn, **jit_kw)),
                ("thunder + memfuse" + (f" ({', '.join(ex)})" if ex else ""),
                 thunder.jit(fn, transforms=[memfuse], **jit_kw))]
    runs, outs = [], []
    for name, jfn in variants:
        step = _step(jfn, fn, args, kwargs, backward, loss_fn)
        run = Run(name)
        try:
            t = time.perf_counter()
            out = step()
            _sync(cuda)
            run.first_call_ms = (time.perf_counter() - t) * 1e3
            if cuda:
                peak, _ = measure.cuda_peak_bytes(step, warmup=False)
            else:
                peak, _ = measure.cpu_peak_bytes(step)
            run.peak_bytes = int(peak)
            times = []
            for _ in range(iters):
                t = time.perf_counter()
                step()
                _sync(cuda)
                times.append((time.perf_counter() - t) * 1e3)
            run.step_ms = statistics.median(times)
            outs.append(_detached(out))
        except Exception as e:
            run.error = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            outs.append(None)
        runs.append(run)
    match = None
    if outs[0] is not None and outs[1] is not None:
        match = _same(outs[0], outs[1], rtol, atol)
    result = Savings(runs[0], runs[1], match, ex, measured_by)
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
            loss = loss_fn(out) if loss_fn else sum(t.float().sum() for t in diff)
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
    ap.add_argument("--iters", type=int, default=5, help="timed calls per variant (median)")
    a = ap.parse_args(argv)
    sys.path.insert(0, "")
    made = _load(a.target)()
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise SystemExit(f"{a.target}() must return (fn, args) or (fn, args, kwargs), got {type(made).__name__}")
    fn, args, kw = (*made, {}) if len(made) == 2 else made
    s = savings(fn, *args, executors=a.executors, iters=a.iters, **kw)
    return 1 if s.results_match is False else 0


if __name__ == "__main__":
    sys.exit(main())
