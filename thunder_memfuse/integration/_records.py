"""One record per bound symbol, for the C trace reader (csrc/python/trace.c).

NOTE [op records]  Everything the core's graph builder (csrc/core/mf_build.c) needs to know about a
bound symbol that a trace does not spell out is collected here, in one pass over the trace, before
any C runs: what kind of bound symbol it is, its effects, its fusible level, which outputs share an
argument's storage, whether it may be recomputed, and its epilogue role.  The reader then calls
nothing back; the builder derives storage roots, ordering edges, the saved-tensor op and epilogue
candidates from the records.  A record is the tuple

    (kind, effects, fusible, aliases, cheap, epilogue)

(trace.c's header says what each field means).  Each question is asked once per bound symbol: an op
with an effect is never fused nor recomputed, so neither predicate is asked about it.
"""
from __future__ import annotations

from thunder.core.proxies import TensorProxy

from .. import _C
from .. import _symbols
from .._memo import one_answer_each


def records(bsyms, *, fusible, epilogue_role, recompute: bool) -> list:
    """The record of each of `bsyms` (NOTE [op records]).  fusible(bsym) -> 0, 1 or 2 (the region
    compiler's level); epilogue_role(bsym) -> EPI_HEAD / EPI_TAIL bits; recompute: ask which ops
    are cheap to recompute (_recompute NOTE [cheap ops])."""
    from ._aliases import aliases
    from ._recompute import cheap_op

    with one_answer_each():
        return _records(bsyms, fusible, epilogue_role, recompute, aliases, cheap_op)


def _records(bsyms, fusible, epilogue_role, recompute, aliases, cheap_op):
    out = []
    seen_op = False
    for b in bsyms:
        sid = b.sym.id
        if _member(sid, _symbols.DROP_IDS):
            out.append((_C.RECORD_DROP, 0, 0, None, 0, 0))
        elif _member(sid, _symbols.RETURN_IDS):
            out.append((_C.RECORD_RETURN, 0, 0, None, 0, 0))
        elif not seen_op and _member(sid, _symbols.PROLOGUE_IDS):
            out.append((_C.RECORD_PROLOGUE, 0, 0, None, 0, 0))
        else:
            seen_op = True
            out.append(_op_record(b, fusible, epilogue_role, recompute, aliases, cheap_op))
    return out


def _member(sid, ids) -> bool:
    """sid in ids, where an unhashable id (a symbol some extension made) is in none of them."""
    try:
        return sid in ids
    except TypeError:
        return False


def _op_record(b, fusible, epilogue_role, recompute, aliases, cheap_op):
    eff = _symbols.effects(b)
    if not b.flat_proxy_outs:
        eff |= _C.EFF_ORDERED  # an op without outputs is there for its effect
    al = _wait_aliases(b) if eff & _C.EFF_WAIT else aliases(b)
    if eff:
        return (_C.RECORD_OP, eff, 0, al, 0, 0)
    return (_C.RECORD_OP, 0, fusible(b), al, int(bool(recompute and cheap_op(b))), int(epilogue_role(b)))


def _wait_aliases(b):
    """A wait's tensor results are its future's tensor (csrc/core/mf_build.c NOTE [collectives]):
    views of the first tensor-like argument, which the collective allocated."""
    from thunder.core.proxies import FutureTensorProxy

    args = b.flat_proxy_args
    first = next((i for i, a in enumerate(args) if isinstance(a, (TensorProxy, FutureTensorProxy))), None)
    if first is None:
        return None
    return tuple((first, True) if isinstance(o, TensorProxy) else None for o in b.flat_proxy_outs)
