"""How a memfuse fusion region runs.

make_region_callable returns the function a fusion bound symbol calls
(`[t3, t4] = MemFuse0(t0, t1)` in the trace).  On CUDA tensors it runs the
region as one generated kernel (thunder_memfuse.kernels: NVRTC + cuBLAS); where
no kernel can be built, and on CPU, it runs the CPU fallback: the region's own
bound symbols as a small Python program, in the planned order, with Thunder's
_del_last_used dropping every intermediate as soon as it is dead.
"""
from __future__ import annotations

import warnings
from inspect import Parameter, Signature

from thunder.core import prims
from thunder.core.trace import TraceCtx
from thunder.executors.passes import _del_last_used


def _fallback_callable(name, bsyms, inputs, outputs):
    def region_fn():
        pass

    region_fn.__signature__ = Signature(
        Parameter(getattr(p, "name", f"arg{i}"), Parameter.POSITIONAL_ONLY) for i, p in enumerate(inputs)
    )
    region_fn.__name__ = name
    trace = TraceCtx(region_fn)
    body = _del_last_used(list(bsyms), list(outputs))
    body.append(prims.python_return.bind(list(outputs), output=None))
    trace.bound_symbols = body
    trace.args = list(inputs)
    trace.kwargs = {}
    return trace.python_callable()


def make_region_callable(name, bsyms, inputs, outputs, *, backend="auto"):
    fallback = _fallback_callable(name, bsyms, inputs, outputs)
    if backend == "cpu":
        return fallback

    state = {"kernel": None, "failed": False}

    def run(*args):
        if not state["failed"] and any(getattr(a, "is_cuda", False) for a in args):
            kernel = state["kernel"]
            if kernel is None:
                try:
                    from .kernels import build_cuda_region

                    kernel = state["kernel"] = build_cuda_region(bsyms, inputs, outputs)
                except Exception as e:  # unsupported or failed to compile: fall back, once
                    state["failed"] = True
                    if backend == "cuda":
                        warnings.warn(f"memfuse: region {name} runs on the fallback path: {e}", RuntimeWarning)
                    return fallback(*args)
            return kernel(*args)
        return fallback(*args)

    run.__name__ = name
    run.__qualname__ = name
    return run
