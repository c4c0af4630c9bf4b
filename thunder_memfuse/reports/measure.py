"""Peak-memory measurements used by the seed job, benchmarks and tests (thunder_memfuse.measure
re-exports them with compare and savings; this module imports no other of the package).

- cpu_peak_bytes(fn, *args) -> (peak bytes, fn's result): the peak of real CPU
  allocations during one call, above what was live before it, from
  torch.profiler's allocation events (each carries its size; the running sum's
  maximum is the peak).
- cpu_memory_timeline(fn, *args): the same events as a curve, live bytes over
  the call's wall time (for thunder_memfuse.plot.plot_memory_over_time).
- cuda_peak_bytes(fn, *args) -> (peak bytes, fn's result): torch.cuda.max_memory_allocated around one call
  (warm-up, gc, empty_cache, reset, call: the seed case's own measurement).
- trace_peak_bytes(trace): Thunder's own estimator on a final trace
  (thunder.examine.memory_calculation.get_alloc_memory), minus the arguments
  it counts, so that it is the peak above the inputs.
"""
from __future__ import annotations

import contextlib
import gc
import os
import sys


def _cpu_allocation_events(fn, args, kwargs):
    """(sorted [(time ns, signed bytes)], result): the profiler's CPU allocation
    events of one call (a free carries a negative size)."""
    import gc

    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    # NOTE [garbage outside the call]: a free the call's events show of a tensor made before the call
    # lowers the count below the call's start.  The cyclic collector, run within the call, frees
    # whatever garbage earlier code left (a previous compilation's traces and their tensors), at a
    # time no program decides, so the same call measured lower after other work.  So the garbage is
    # collected before the profiler starts, and the collector waits until the call is done.
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        with _quiet_native_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = fn(*args, **kwargs)
    finally:
        if was:
            gc.enable()
    sizes = []

    def walk(node):
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            sizes.append((node.start_time_ns, node.extra_fields.alloc_size))
        for c in node.children:
            walk(c)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    sizes.sort(key=lambda t: t[0])
    return sizes, out


def cpu_peak_bytes(fn, *args, **kwargs):
    """Call fn(*args, **kwargs) once on CPU; returns a pair (peak, result): the peak bytes
    allocated above what was live at the call, and fn's own result.

    Example::

        peak, out = cpu_peak_bytes(jfn, x)
    """
    sizes, out = _cpu_allocation_events(fn, args, kwargs)
    cur = peak = 0
    for _, s in sizes:
        cur += s
        peak = max(peak, cur)
    return peak, out


def cpu_memory_timeline(fn, *args, **kwargs):
    """(times_ms, live_bytes, result) for one call of fn on CPU: bytes allocated
    above the live set at the call, after each allocation or free, against
    milliseconds since the first event.  Measured (torch.profiler), not simulated."""
    sizes, out = _cpu_allocation_events(fn, args, kwargs)
    t0 = sizes[0][0] if sizes else 0
    times, live, cur = [0.0], [0], 0
    for t, s in sizes:
        cur += s
        times.append((t - t0) / 1e6)
        live.append(cur)
    return times, live, out


@contextlib.contextmanager
def _quiet_native_stderr():
    """Silence the profiler's native start/stop lines (written by C++ to fd 2,
    whatever sys.stderr is: a terminal, pytest's capture, a Jupyter kernel's stream)."""
    fd = 2
    try:
        os.fstat(fd)
    except OSError:  # no fd 2 at all: nothing to silence
        yield
        return
    try:
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass
    saved = os.dup(fd)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), fd)
            yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


def cuda_peak_bytes(fn, *args, warmup=True, **kwargs):
    """Call fn(*args, **kwargs) on CUDA (after one warm-up call unless warmup=False); returns a
    pair (peak, result): torch.cuda.max_memory_allocated during the call above its value before
    it, and fn's result."""
    import torch

    if warmup:
        fn(*args, **kwargs)
    gc.collect(0)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.max_memory_allocated()
    out = fn(*args, **kwargs)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before, out


def trace_peak_bytes(trace):
    """Thunder's estimate of a trace's peak, above the memory of its arguments."""
    from thunder.core.proxies import TensorProxy
    from thunder.examine.memory_calculation import get_alloc_memory

    peak, _ = get_alloc_memory(trace)
    args_bytes = 0
    seen = set()
    for bsym in trace.bound_symbols:
        if bsym.sym.name != "unpack_trivial":
            continue
        for o in bsym.flat_proxy_outs:
            if isinstance(o, TensorProxy) and o.name not in seen:
                seen.add(o.name)
                args_bytes += _tensor_bytes(o)
    for a in trace.args:
        for p in _flatten(a):
            if isinstance(p, TensorProxy) and p.name not in seen:
                seen.add(p.name)
                args_bytes += _tensor_bytes(p)
    return peak - args_bytes


def _flatten(x):
    if isinstance(x, (list, tuple)):
        for y in x:
            yield from _flatten(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _flatten(y)
    else:
        yield x


def _tensor_bytes(p):
    n = 1
    for d in p.shape:
        n *= int(d)
    return int(n * p.dtype.bytes)
