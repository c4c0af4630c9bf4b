"""MemFuse's options, checked together; the THUNDER_MEMFUSE switch; the package's logger.

- check_options(...): each option's own values, then the combinations that cannot work, each
  rejected with a ValueError that names the fix.  `backend` (the option that predates `kernels`)
  is folded into `kernels` here: backend="cpu" is kernels="fallback", backend="cuda" is
  kernels="nvrtc".
- Each option accepts exactly the values docs/API.md lists, by type: True and False are bools (0, 1
  and strings are not), names are str, recompute's share a finite float in (0, MAX_SHARE].  What is
  checked is what is stored, so validation and behaviour read the same value.
- disabled(): THUNDER_MEMFUSE=0 (or off / false / no) in the environment turns the pass off
  everywhere: both hooks return what they were given (read at each compilation, so it can be
  set in a running process before a function's first call).  1 / on / true / yes or unset (empty)
  leave it on; any other value is a ValueError at the next compilation that names the accepted values.
- LOG: logging.getLogger("thunder_memfuse").  INFO: one line per planned trace (peaks, regions,
  the compiler, the plan's time); WARNING: every fallback (also given as a MemFuseWarning), and
  what only weakens a plan (a region compiler's per-op check that raised: regions/base.py
  predicate; saved activations that could not be told apart); DEBUG: each region's ops.  The logger has a NullHandler, so nothing is printed unless the
  application configures logging (logging.basicConfig(level=logging.INFO)).
"""
from __future__ import annotations

import logging
import os
import warnings

LOG = logging.getLogger("thunder_memfuse")
LOG.addHandler(logging.NullHandler())

ENV = "THUNDER_MEMFUSE"
_OFF = ("0", "off", "false", "no")
_ON = ("", "1", "on", "true", "yes")

_BACKENDS = {"auto": None, "cpu": "fallback", "cuda": "nvrtc"}

# The region compilers by name (regions/<name>.py each; regions.COMPILERS and regions.KERNELS are
# these): kept here, below regions/, so that checking an option imports no compiler.
COMPILERS = ("nvrtc", "torchcompile", "nvfuser", "fallback")
KERNELS = ("auto",) + COMPILERS

# recompute's largest share: copies writing a hundred times what the trace's ops write are no longer a
# cheap recomputation; the limit keeps the budget in bytes finite (and in the planner's int64)
MAX_SHARE = 100.0


def disabled() -> bool:
    """Is memfuse turned off by THUNDER_MEMFUSE=0 (off, false, no)?  A value that is neither on nor
    off is a ValueError naming them."""
    raw = os.environ.get(ENV, "")
    v = raw.strip().lower()
    if v in _OFF:
        return True
    if v in _ON:
        return False
    raise ValueError(f"{ENV}={raw!r}: use {ENV}=0 (or off, false, no) to turn memfuse off, {ENV}=1 (or on, "
                     f"true, yes, or unset) to leave it on")


def _is_bool(v) -> bool:
    return v is True or v is False


def _tri(name, v):
    """An option that is True, False or 'auto' (bools by type: 0 and 1 are not)."""
    if _is_bool(v) or (type(v) is str and v == "auto"):
        return v
    raise ValueError(f"MemFuse: {name} must be True, False or 'auto', got {v!r}")


def check_bool(name, v) -> bool:
    if not _is_bool(v):
        raise ValueError(f"MemFuse: {name} must be True or False, got {v!r}")
    return v


def check_options(*, kernels, backend, fuse, replace_fusion, comm_overlap, fallback_regions=False) -> str:
    """Validate MemFuse's options; returns `kernels` with `backend` folded into it."""
    if type(kernels) is not str or kernels not in KERNELS:
        raise ValueError(f"MemFuse: kernels must be one of {KERNELS}, got {kernels!r}")
    if type(backend) is not str or backend not in _BACKENDS:
        raise ValueError(f"MemFuse: backend must be one of {tuple(_BACKENDS)}, got {backend!r} "
                         "(backend is the older spelling of kernels: use kernels=...)")
    _tri("fuse", fuse)
    _tri("replace_fusion", replace_fusion)
    check_bool("comm_overlap", comm_overlap)
    folded = _BACKENDS[backend]
    if folded is not None:
        if kernels not in ("auto", folded):
            raise ValueError(f"MemFuse(backend={backend!r}, kernels={kernels!r}): backend={backend!r} means "
                             f"kernels={folded!r}, which contradicts kernels={kernels!r}; drop backend= "
                             "(kernels= alone chooses the compiler)")
        warnings.warn(f"MemFuse(backend={backend!r}) is MemFuse(kernels={folded!r}); backend= will go away",
                      DeprecationWarning, stacklevel=3)
        kernels = folded
    if fallback_regions:  # tests: regions formed and run op by op (the region machinery on CPU)
        return kernels
    if fuse is True and kernels == "fallback":
        raise ValueError("MemFuse(fuse=True, kernels='fallback'): the fallback runs a region's ops one by one, "
                         "so its regions only hold their inputs longer (more memory, no speed); use "
                         "fuse='auto' (memfuse then only reorders) or a compiler: kernels='torchcompile' "
                         "(CPU or GPU) or kernels='nvrtc' (CUDA)")
    if replace_fusion is True and fuse is False:
        raise ValueError("MemFuse(replace_fusion=True, fuse=False): replace_fusion=True takes nvFuser and "
                         "Thunder's torchcompile executor out of the compilation, and fuse=False forms no regions "
                         "in their place, so their ops would run one by one; use replace_fusion=False (keep them, "
                         "memfuse plans around their regions) or fuse='auto'")
    if replace_fusion is True and kernels == "fallback":
        raise ValueError("MemFuse(replace_fusion=True, kernels='fallback'): replace_fusion=True takes the fusion "
                         "executors away, and the fallback compiles nothing in their place; use "
                         "replace_fusion='auto' or a compiler (kernels='torchcompile')")
    return kernels


BYTES_MAX = 2**63 - 1  # the planner's int64


def check_memory_budget(memory_budget):
    """memory_budget: "auto" (the lowest plan) or a number of bytes, an int in [1, 2**63 - 1] (bools
    are not ints here).  csrc/core/mf_pipeline.c NOTE [peak target] says what a budget does."""
    if type(memory_budget) is str and memory_budget == "auto":
        return memory_budget
    if isinstance(memory_budget, int) and not isinstance(memory_budget, bool) and 1 <= memory_budget <= BYTES_MAX:
        return int(memory_budget)
    hint = ""
    if isinstance(memory_budget, float) and memory_budget.is_integer() and 1 <= memory_budget <= BYTES_MAX:
        hint = f" (an int: memory_budget={int(memory_budget)})"
    raise ValueError(f"MemFuse: memory_budget must be 'auto' or a number of bytes, an int in [1, 2**63 - 1] "
                     f"(2 * 2**30: 2 GiB), got {memory_budget!r}{hint}")


def check_recompute(recompute):
    """recompute: "auto", True, False, or a share (a finite number in (0, MAX_SHARE]) of the bytes a
    trace's ops write."""
    import math

    # identity, not equality: 1 and 1.0 equal True, and are shares
    if _is_bool(recompute) or (type(recompute) is str and recompute == "auto"):
        return recompute
    if isinstance(recompute, (int, float)) and not isinstance(recompute, bool):
        try:
            share = float(recompute)
        except OverflowError:  # an int past float's range
            share = math.inf
        if math.isfinite(share) and 0 < share <= MAX_SHARE:  # NaN fails both
            return share
    raise ValueError(f"MemFuse: recompute must be 'auto', True, False or a share in (0, {MAX_SHARE:g}] of the "
                     f"bytes a trace writes (0.25: the copies may write a quarter of that), got {recompute!r}")
