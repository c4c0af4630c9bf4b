"""The op-by-op fallback: a region's own bound symbols as a small Python program (Thunder's
TraceCtx.python_callable), with Thunder's _del_last_used dropping every intermediate the moment it
is dead.  Results equal Thunder's without memfuse; inner values do exist for a moment, which the
cost model (made for compiled regions) does not count, so regions are formed for it only on request
(MemFuse(fuse=True))."""
from __future__ import annotations

from inspect import Parameter, Signature

NAME = "fallback"


def available(cuda: bool = False) -> bool:
    return True


def build(name, bsyms, inputs, outputs):
    from thunder.core import prims
    from thunder.core.trace import TraceCtx
    from thunder.executors.passes import _del_last_used

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
