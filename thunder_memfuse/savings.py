"""thunder_memfuse.savings: what memfuse saves on a step of yours, and its command line.

    from thunder_memfuse.measure import savings
    python -m thunder_memfuse.savings my_module:make_step [--executors torchcompile] [--iters 5] [--peers]

A public module of re-exports: the code is thunder_memfuse/reports/savings.py.
"""
from __future__ import annotations

import sys

from .reports.savings import Run, Savings, main, savings

__all__ = ["savings", "Savings", "Run", "main"]

if __name__ == "__main__":
    sys.exit(main())
