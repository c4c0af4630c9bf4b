"""The "nvfuser" region compiler: each memfuse region is handed to Thunder's nvFuser executor
(its `fuse`, the same call its own fusion pass makes).  Only where nvFuser is installed: the import
is guarded, and `available()` is False without it (and on traces without CUDA tensors)."""
from __future__ import annotations

import functools
from types import SimpleNamespace

from .base import Group, always, never, predicate, pure, tensor_op

name = "nvfuser"
compiles_regions = True
expects_unsupported = False
epilogue_pair = never
epilogue_role = never  # no epilogue pairs: 0 (False) for every op
region_of_one = never
accepts = always


@functools.lru_cache(maxsize=1)
def _executor():
    try:
        from thunder.executors.nvfuserex import nvfuserex
    except Exception as e:  # not installed, or an install that does not load: not available
        from .._options import LOG

        LOG.info("memfuse: nvFuser's executor is not available: %s: %s", type(e).__name__, e)
        return None
    return nvfuserex


def available(cuda: bool = False) -> bool:
    return bool(cuda) and _executor() is not None


@predicate(False)
def fusible(bsym) -> bool:
    """What nvFuser's executor can claim, less random ops and ordered effects (as for the other
    compilers: memfuse keeps their order and Thunder's numbers)."""
    ex = _executor()
    if ex is None or not tensor_op(bsym) or not pure(bsym):
        return False
    return bool(ex.can_fuse(bsym))


def build(group: Group):
    """nvFuser's callable for the region (its fusion definition is built on the first call)."""
    from thunder.core.proxies import variableify

    ex = _executor()
    if ex is None:
        raise NotImplementedError("nvFuser is not installed")
    region = SimpleNamespace(inputs=[variableify(p) for p in group.inputs],
                             outputs=[variableify(p) for p in group.outputs], bound_symbols=list(group.bsyms))
    fusion = ex.fuse(region, 0)
    return fusion._call_ctx[fusion.sym.name]
