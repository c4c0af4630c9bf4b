"""thunder_memfuse.measure: measuring a step's peak memory and time (docs/API.md "Measuring").

- savings(fn, *args, executors=...): the same step eagerly and jitted with and without memfuse,
  measured: peak, step time (min / median / max), first call, outputs compared.
- compare(jfn, *args): the memory model against the measurement, step by step of the final traces.
- cpu_peak_bytes(fn, *args) / cuda_peak_bytes(fn, *args) -> (peak bytes, fn's result).
- cpu_memory_timeline(fn, *args) -> (times_ms, live_bytes, fn's result).
- trace_peak_bytes(trace): Thunder's own estimate of a final trace's peak, above its arguments.

A public module of re-exports: the code is in thunder_memfuse/reports/ (measure.py, _compare.py,
savings.py).
"""
from __future__ import annotations

from .reports._compare import compare
from .reports.measure import cpu_memory_timeline, cpu_peak_bytes, cuda_peak_bytes, trace_peak_bytes
from .reports.savings import savings

__all__ = ["savings", "compare", "cpu_peak_bytes", "cuda_peak_bytes", "cpu_memory_timeline", "trace_peak_bytes"]
