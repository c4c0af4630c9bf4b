"""thunder_memfuse: a memory-aware fusion pass for Lightning Thunder.

    import thunder
    from thunder_memfuse import memfuse
    jfn = thunder.jit(fn, transforms=[memfuse])

`plan()` gives direct access to the C scheduler for graphs of your own.
Thunder-dependent names (memfuse, MemFuse, report, plot_timeline) are loaded
lazily, so `plan()` works without importing Thunder; the plots need matplotlib
(the `[plot]` extra).  Errors derive from MemFuseError, warnings are
MemFuseWarning (thunder_memfuse.errors).  On a torch or Thunder version it does
not support, importing the package is an ImportError naming the versions and the
fix (thunder_memfuse/_versions.py).

Layout (docs/ARCHITECTURE.md "Layers of the package"; imports run downwards only):
the base modules here (errors, _options, _versions, _memo, _plan, _symbols, _C), regions/ (region
compilers), integration/ (the Thunder transform, executor and fusion pass), reports/ (measurement,
report, plots), and on top this module and the public re-export modules measure, savings, plot and
attention.
"""
from . import _versions
from ._versions import __version__  # noqa: F401

_versions.check()  # first: an unsupported torch must not fail later with an unrelated error

import _thunder_memfuse_boot  # noqa: E402

_thunder_memfuse_boot.apply()

from ._plan import Plan, plan, simulate  # noqa: E402
from .errors import KernelCompileError, MemFuseError, MemFuseWarning  # noqa: E402

__all__ = ["Plan", "plan", "simulate", "memfuse", "MemFuse", "report", "format_report", "plot_timeline",
           "plot_comparison", "cuda_status", "MemFuseError", "MemFuseWarning", "KernelCompileError"]

_LAZY = {
    "memfuse": ("thunder_memfuse.integration.transform", "memfuse"),
    "MemFuse": ("thunder_memfuse.integration.transform", "MemFuse"),
    "report": ("thunder_memfuse.reports._report", "report"),
    "plot_timeline": ("thunder_memfuse.reports.plot", "plot_timeline"),
    "plot_comparison": ("thunder_memfuse.reports.plot", "plot_comparison"),
    "format_report": ("thunder_memfuse.reports._report", "format_report"),
    "cuda_status": ("thunder_memfuse.regions.nvrtc", "cuda_status"),
}


def __dir__():
    return sorted(set(globals()) | set(__all__))


def __getattr__(name):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        try:
            value = getattr(importlib.import_module(mod), attr)
        except Exception as e:
            # An AttributeError escaping here (Thunder's import raises one on an unsupported torch)
            # would turn `from thunder_memfuse import memfuse` into "cannot import name 'memfuse'",
            # hiding the cause: name it, and chain it.
            raise ImportError(f"thunder_memfuse.{name} could not be loaded: importing {mod} failed with "
                              f"{type(e).__name__}: {e}", name=mod) from e
        globals()[name] = value
        return value
    raise AttributeError(f"module 'thunder_memfuse' has no attribute {name!r}")
