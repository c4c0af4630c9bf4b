"""Region compilers: what builds the callable of a region memfuse forms.

One module per compiler, each a RegionCompiler (regions/base.py: name, compiles_regions,
available(cuda), fusible(bsym), epilogue_role(bsym), epilogue_pair(gemm, act), region_of_one(bsym), accepts(args),
build(group)); compiler(name) returns it:

    nvrtc         memfuse's own CUDA kernels (NVRTC elementwise kernels, cuBLAS / cuBLASLt GEMMs)
    torchcompile  Thunder's torch.compile executor builds the region: Inductor C++ on CPU, Triton on GPU
    nvfuser       Thunder's nvFuser executor (only where nvFuser is installed)
    fallback      the region's own ops, one by one (always there; it compiles nothing)

`MemFuse(kernels=...)` picks one; "auto" (resolve) takes the best that works for a trace: nvrtc for
CUDA traces where the driver and NVRTC are found, else torchcompile where torch.compile works
(a C++ compiler on CPU, Triton on GPU), else the fallback, said once per process in a warning.
What a region may hold follows the chosen compiler (its `fusible`); the cost model does not.
"""
from __future__ import annotations

import importlib

from .._options import COMPILERS, KERNELS  # noqa: F401  (the names: _options.py, below this package)
from .base import Group, RegionCompiler, make_group, region_kind  # noqa: F401  (the interface: regions/base.py)


def compiler(name: str):
    """Compiler `name` (one of COMPILERS): its module, a base.RegionCompiler."""
    if name not in COMPILERS:
        raise ValueError(f"memfuse: unknown region compiler {name!r} (one of {COMPILERS})")
    return importlib.import_module(f"{__name__}.{name}")


def compiles(name: str, cuda: bool) -> bool:
    """Does compiler `name` really compile regions of a trace on this machine (cuda: the trace holds
    CUDA tensors)?  The fallback never does; nvrtc only for CUDA traces (its available())."""
    comp = compiler(name)
    return bool(comp.compiles_regions and comp.available(cuda))


def reorder_only(kernels: str, *, cuda: bool, compiling_peer: bool = True) -> bool:
    """Is the op-by-op fallback this trace's choice by design, not for want of a compiler: asked
    for (kernels="fallback"), or "auto" on a CPU trace where memfuse is not the fusion pass (NOTE
    [auto on CPU] in resolve)?  Then memfuse reorders only, and reports call it "reorder-only";
    "fallback" is left for a compiler that was wanted and could not work."""
    return kernels == "fallback" or (kernels == "auto" and not cuda and not compiling_peer)


def resolve(kernels: str, *, cuda: bool, compiling_peer: bool = True, strict: bool = False,
            quiet: bool = False) -> str:
    """The compiler for one trace.  An explicit choice that cannot work here (kernels="nvrtc" for
    CPU tensors, "torchcompile" without a C++ compiler, ...) falls back with ONE warning per process
    and reason, or raises MemFuseError with strict=True; so does "auto" with nothing that works
    (a warning only: nothing was asked for).  quiet: neither (a question, not the compilation).

    compiling_peer: is memfuse this compilation's fusion pass, in the place of a general fusion
    executor it replaced?  NOTE [auto on CPU]: on a CPU trace "auto" compiles regions only then:
    where the user runs Thunder's torchcompile executor (executors=["torchcompile"]), memfuse
    replaces it by default and its regions are compiled by torch.compile, matmuls and norms
    included, so the step keeps that executor's speed at a lower peak (benchmarks/RESULTS.md).
    Plain thunder.jit runs a CPU trace op by op with eager's kernels; Inductor regions in its
    place would cost a compile on the first call and round differently (an ulp here and there),
    so adding memfuse would change such a user's numbers and first-call time.  There memfuse only
    reorders, which is exact and never slower; kernels="torchcompile" compiles regions on
    request."""
    if reorder_only(kernels, cuda=cuda, compiling_peer=compiling_peer):
        return "fallback"
    if kernels == "auto":
        if cuda and compiles("nvrtc", True):
            return "nvrtc"
        if compiles("torchcompile", cuda):
            return "torchcompile"
        if cuda and compiles("nvfuser", True):
            return "nvfuser"
        what = ("no region compiler works for CUDA tensors here (NVRTC / the CUDA driver not found, "
                "no Triton, no nvFuser)" if cuda else
                "torch.compile cannot build regions here (no working C++ compiler for Inductor; "
                "set CXX or install g++)")
        if not quiet:
            _warn_once(what, f"memfuse: {what}; fusion regions are not formed, memfuse only reorders "
                             "(kernels='auto' fell back to 'fallback').")
        return "fallback"
    if not compiles(kernels, cuda):
        if kernels == "nvrtc" and not cuda:
            why = (": memfuse's own kernels are CUDA kernels and this trace holds no CUDA tensors; use "
                   "kernels='auto' or kernels='torchcompile' for CPU tensors")
        elif kernels == "torchcompile" and not cuda:
            why = ": no working C++ compiler for Inductor; set CXX or install g++, or use kernels='auto'"
        else:
            why = f": {kernels} is not available here; use kernels='auto'"
        message = (f"memfuse: kernels={kernels!r} cannot build regions for this {'CUDA' if cuda else 'CPU'} "
                   f"trace{why}")
        if strict and not quiet:
            from ..errors import MemFuseError

            raise MemFuseError(message + " (strict=True)")
        if not quiet:
            _warn_once((kernels, cuda), message + "; its regions run on the op-by-op fallback.")
        return "fallback"
    return kernels


def _warn_once(key, message: str) -> None:
    """Once per process and reason, unless the user's warning filters changed what they do with
    it since (errors.py NOTE [once, within the user's filters])."""
    from ..errors import warn

    warn(message, once=(__name__, key))


def reset_warnings() -> None:
    """Forget which fall-back warnings were given, and which predicate failures were logged (tests)."""
    from . import base
    from ..errors import forget_said

    forget_said()
    with base._reasons_lock:
        base._reasons.clear()


def op_by_op(group):
    """The fallback's callable of a region (base.Group): its ops one by one, what every compiled
    region runs where its compiler cannot (executor.make_region_callable)."""
    return compiler("fallback").build(group)
