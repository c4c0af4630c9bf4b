"""Recomputation's Python side: which bound symbols are cheap to run again, the budget, and the
copies as bound symbols (csrc/core/mf_remat.c NOTE [recomputation]).

NOTE [cheap ops]  An op may be copied when running it again costs little and gives the same values
wherever it runs: every prim it decomposes into is elementwise (Thunder's elementwise unary and
binary prims, `where`, type conversion) or a shape op (reshape, broadcast, transpose, slice, ...,
tagged SHAPE_OP), and it has tensor outputs only.  Never: matmuls, convolutions, attention,
reductions, random ops, in-place writes and other effects, collectives, other executors' fusion
regions.  The core's graph builder also refuses any op that reads or makes a storage something writes in place
(csrc/core/mf_build.c NOTE [recompute candidates]).

NOTE [emitting copies]  plan_trace gives an op whose graph node reads or makes a value the copies
introduced as (bound symbol, ((value, new value), ...)).  Each new value gets a fresh proxy like the
value it copies, and the bound symbol is rebound with Thunder's from_bsym_swap_proxies (its
subsymbols too), so a copy is the same call on the same inputs under new output names, and a reader
of a copy reads it under its new name.  Thunder's del_last_used then frees the copies like any value.
"""
from __future__ import annotations

import functools

from thunder.core.prims import OpTags, PrimIDs
from thunder.core.proxies import TensorProxy, variableify

# the budget, as a share of the bytes the trace's ops write, when recompute="auto"
DEFAULT_SHARE = 0.25
BUDGET_MAX = 2**63 - 1  # the planner's budget is an int64


@functools.lru_cache(maxsize=1)
def _cheap_prims() -> frozenset:
    import thunder.core.prims as prims

    out = {PrimIDs.CONVERT_ELEMENT_TYPE, PrimIDs.WHERE}
    for n in dir(prims):
        s = getattr(prims, n)
        sid = getattr(s, "id", None)
        if not isinstance(sid, PrimIDs) or not hasattr(s, "meta"):
            continue
        q = getattr(s.meta, "__qualname__", "") or ""
        tags = getattr(s, "tags", None) or ()
        if "_elementwise_unary_meta_factory" in q or "_elementwise_binary_meta_factory" in q:
            out.add(sid)
        elif OpTags.SHAPE_OP in tags:
            out.add(sid)
    out -= {PrimIDs.COPY_, PrimIDs.COPY_WITH_SETITEM}
    return frozenset(out)


def _leaf_ok(b) -> bool:
    sid = b.sym.id
    if sid in _cheap_prims():
        return True
    from ..regions.torchcompile import _torch_impl_of

    orig = _torch_impl_of().get(sid)  # the torch executor's own names for prims
    return orig in _cheap_prims()


def recomputable(bsym) -> bool:
    """NOTE [cheap ops]."""
    from .. import _symbols

    if _symbols.is_random(bsym) or _symbols.effects(bsym):
        return False
    return cheap_op(bsym)


def cheap_op(bsym) -> bool:
    """NOTE [cheap ops], for an op already known to have no effect (no random draw, no write, no
    ordered effect: _records.py asks only about those)."""
    if getattr(bsym.sym, "is_fusion", False):
        return False
    outs = bsym.flat_proxy_outs
    if not outs or not all(isinstance(o, TensorProxy) for o in outs):
        return False
    if not any(isinstance(a, TensorProxy) for a in bsym.flat_proxy_args):
        return False
    stack = [bsym]
    while stack:
        b = stack.pop()
        if b.subsymbols:
            stack.extend(b.subsymbols)
        elif not _leaf_ok(b):
            return False
    return True


def budget_bytes(bsyms, setting) -> int:
    """The bytes the copies of one trace may write: a share of what its ops write."""
    if setting is False or setting is None:
        return 0
    share = DEFAULT_SHARE if setting is True or (isinstance(setting, str) and setting == "auto") else float(setting)
    total = 0
    for b in bsyms:
        for o in b.flat_proxy_outs:
            if isinstance(o, TensorProxy):
                total += _bytes(o)
    # exact integer arithmetic (a float product of a huge trace overflows), clamped to what the planner
    # takes: a trace too large to plan then gets the planner's own message about its size
    from fractions import Fraction

    return min(int(total * Fraction(share)), BUDGET_MAX)


def _bytes(p) -> int:
    n = 1
    for d in p.shape:
        n *= int(d if isinstance(d, int) else getattr(d, "value", 1))
    return int(n * p.dtype.bytes)


def emit(res, trace):
    """Replace plan_trace's (bsym, pairs) entries by bound symbols (NOTE [emitting copies]); fills
    res["names"] for the new values and res["recompute"] with what was copied.  Returns res."""
    info = res["plan"].get("recompute")
    if not info:
        return res
    from thunder.core.trace import tracectx

    names = list(res["names"])
    proxies = {}  # new value id -> proxy
    by_name = {}
    for g in res["groups"]:
        for b in g:
            if isinstance(b, tuple):
                b = b[0]
            for p in list(b.flat_proxy_args) + list(b.flat_proxy_outs):
                if getattr(p, "name", None) is not None:
                    by_name.setdefault(p.name, p)
    copies = []
    with tracectx(trace):
        groups = []
        for g in res["groups"]:
            ng = []
            for b in g:
                if not isinstance(b, tuple):
                    ng.append(b)
                    continue
                bsym, pairs = b
                swap = {}
                is_copy = False
                out_names = {o.name for o in bsym.flat_proxy_outs if getattr(o, "name", None)}
                for old, new in pairs:
                    p = proxies.get(new)
                    if p is None:
                        like = by_name[names[old]]
                        p = proxies[new] = TensorProxy(like=like)
                    swap[variableify(by_name[names[old]])] = p
                    is_copy = is_copy or names[old] in out_names
                nb = bsym.from_bsym_swap_proxies(swap)
                if is_copy:
                    copies.append(nb)
                ng.append(nb)
            groups.append(ng)
    while len(names) < len(info["value_origin"]):
        names.append(None)
    for v, p in proxies.items():
        names[v] = p.name
    res["groups"] = groups
    res["names"] = names
    res["recompute"] = {
        "copies": [str(c.sym.name) for c in copies],
        "copied_ops": len(copies),
        "splits": info["splits"],
        "copied_bytes": info["copied_bytes"],
        "peak_bytes_without": res["plan"].get("peak_bytes_without_recompute"),
        "peak_bytes": res["plan"]["peak_bytes"],
    }
    return res
