"""The op-by-op fallback: a region's own bound symbols as a small Python program (Thunder's
TraceCtx.python_callable), with Thunder's _del_last_used dropping every intermediate the moment it
is dead.  Results equal Thunder's without memfuse; inner values do exist for a moment, which the
cost model (made for compiled regions) does not count, so regions are formed for it only on request
(MemFuse(fuse=True)), and then they hold what a generated kernel could (nvrtc's fusible and
epilogue_pair).  It is also what every other compiler's region runs where that compiler cannot
(executor.make_region_callable)."""
from __future__ import annotations

from .base import Group, always, never, region_trace
from .nvrtc import epilogue_pair, epilogue_role, fusible  # noqa: F401  (the fallback plans as nvrtc does)

name = "fallback"
compiles_regions = False
expects_unsupported = False
region_of_one = never
accepts = always


def available(cuda: bool = False) -> bool:
    return True


def build(group: Group):
    from thunder.executors.passes import _del_last_used

    body = _del_last_used(list(group.bsyms), list(group.outputs))
    return region_trace(group.name, body, group.inputs, group.outputs).python_callable()
