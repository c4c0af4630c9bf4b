"""A planned trace rebuilt: its groups of bound symbols turned into memfuse's fusion bound symbols
(regroup_trace), with the comments other transforms left put back, and Thunder's del_last_used
placing the dels for the new order."""
from __future__ import annotations

from thunder.core import utils as tutils
from thunder.core.proxies import unvariableify
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import from_trace
from thunder.executors.passes import del_last_used

from .. import _symbols, regions
from ..errors import MemFuseError
from .executor import make_region_callable, region_symbol
from .fusion_pass import _Region


def regroup_trace(trace, groups, *, compiler, is_backward, name_prefix="MemFuse"):
    """A new trace whose bound symbols are `groups` in order, each given as (bound
    symbols, the plan's kind: csrc/core/mf_core.h NOTE [group kinds]).  A "single"
    group stays as it is (unless compiler.region_of_one(bsym) says it runs as a
    region of its own, regions/nvrtc NOTE [gemm regions]: regions.region_kind), any
    other becomes one fusion bound symbol of that kind built by `compiler`, a
    regions.base.RegionCompiler (inputs and outputs as Thunder's Region gives them); dels and
    collection clears are placed by Thunder's del_last_used.  Returns (trace, number
    of fusion regions made).  A group of views only stays unfused: it allocates
    nothing, and a compiled region would only add a call."""
    stripped = from_trace(trace)
    stripped.bound_symbols = [b for g, _ in groups for b in g]
    producers, consumers = tutils.producers_and_consumers(stripped)
    new_bsyms = []
    n_regions = 0  # also numbers the regions: names are per trace, like Thunder's own fusion passes
    for group, plan_kind in groups:
        kind = regions.region_kind(plan_kind, group, compiler)
        if kind is None or _views_only(group):
            new_bsyms.extend(group)
            continue
        region = _Region(producers, consumers, list(group))  # Region's inputs/outputs, in linear time
        inputs = sorted((unvariableify(x) for x in region.inputs), key=lambda p: p.name)
        outputs = sorted((unvariableify(x) for x in region.outputs), key=lambda p: p.name)
        name = f"{name_prefix}{n_regions}"
        fn = make_region_callable(regions.make_group(name, group, inputs, outputs, kind), compiler)
        sym = region_symbol(name, outputs)
        new_bsyms.append(BoundSymbol(sym, tuple(inputs), {}, tuple(outputs), list(group), _call_ctx={name: fn}))
        n_regions += 1
    new_trace = from_trace(trace)
    new_trace.bound_symbols = new_bsyms
    return del_last_used(new_trace, clear_mutable_collections=is_backward), n_regions


def _planned_groups(res):
    """plan_trace's groups of bound symbols, each with the kind the plan gave it
    (csrc/core/mf_core.h NOTE [group kinds]; trace.c gives them side by side)."""
    if len(res["kinds"]) != len(res["groups"]):
        raise MemFuseError(f"internal: {len(res['groups'])} planned groups but {len(res['kinds'])} kinds")
    return list(zip(res["groups"], res["kinds"]))


def _with_comments(bsyms, groups):
    """Put back the comments (dropped by the reader) that other transforms left:
    each one goes just before the step holding the bound symbol that followed it
    (groups: (bound symbols, kind) pairs; a comment is a "single" group)."""
    from thunder.core.prims import PrimIDs

    before, pending = {}, []
    for b in bsyms:
        if b.sym.id == PrimIDs.COMMENT:
            pending.append(b)
        elif pending and b.sym.id not in _symbols.DROP_IDS:
            before[id(b)] = pending
            pending = []
    if not before and not pending:
        return groups
    single = regions.base.SINGLE
    out = []
    for g, kind in groups:
        for b in g:
            out.extend(([c], single) for c in before.get(id(b), ()))
        out.append((g, kind))
    if pending:  # trailing comments: before the return, which stays last
        out[len(out) - 1:len(out) - 1] = [([c], single) for c in pending]
    return out


def _views_only(group) -> bool:
    return all(b.sym.name in _symbols.VIEW_NAMES for b in group)
