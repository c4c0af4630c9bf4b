"""thunder_memfuse.plot: plot_timeline, plot_comparison and plot_memory_over_time (the [plot]
extra: matplotlib).  A public module of re-exports: the code is thunder_memfuse/reports/plot.py."""
from __future__ import annotations

from .reports.plot import plot_comparison, plot_memory_over_time, plot_timeline

__all__ = ["plot_timeline", "plot_comparison", "plot_memory_over_time"]
