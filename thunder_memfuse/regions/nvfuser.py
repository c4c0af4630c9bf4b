"""The "nvfuser" region compiler: each memfuse region is handed to Thunder's nvFuser executor
(its `fuse`, the same call its own fusion pass makes).  Only where nvFuser is installed: the import
is guarded, and `available()` is False without it (and on traces without CUDA tensors)."""
from __future__ import annotations

import functools
from types import SimpleNamespace

NAME = "nvfuser"


@functools.lru_cache(maxsize=1)
def _executor():
    try:
        from thunder.executors.nvfuserex import nvfuserex
    except Exception:
        return None
    return nvfuserex


def available(cuda: bool = False) -> bool:
    return bool(cuda) and _executor() is not None


def fusible(bsym) -> bool:
    """What nvFuser's executor can claim, less random ops and ordered effects (as for the other
    compilers: memfuse keeps their order and Thunder's numbers)."""
    from thunder.core.proxies import TensorProxy

    from .. import _thunder

    ex = _executor()
    if ex is None or getattr(bsym.sym, "is_fusion", False):
        return False
    try:
        outs = [o for o in bsym.flat_outs if o is not None]
        if not outs or not all(isinstance(o, TensorProxy) for o in outs):
            return False
        if _thunder.is_random(bsym) or _thunder.effects(bsym):
            return False
        return bool(ex.can_fuse(bsym))
    except Exception:
        return False


def build(bsyms, inputs, outputs):
    """nvFuser's callable for the region (its fusion definition is built on the first call)."""
    from thunder.core.proxies import variableify

    ex = _executor()
    if ex is None:
        raise NotImplementedError("nvFuser is not installed")
    region = SimpleNamespace(inputs=[variableify(p) for p in inputs], outputs=[variableify(p) for p in outputs],
                             bound_symbols=list(bsyms))
    fusion = ex.fuse(region, 0)
    return fusion._call_ctx[fusion.sym.name]
