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


def regroup_trace(trace, groups, *, compiler, is_backward, name_prefix="MemFuse", donatable_saved=None):
    """A new trace whose bound symbols are `groups` in order, each given as (bound
    symbols, the plan's kind: csrc/core/mf_core.h NOTE [group kinds]).  A "single"
    group stays as it is (unless compiler.region_of_one(bsym) says it runs as a
    region of its own, regions/nvrtc NOTE [gemm regions]: regions.region_kind), any
    other becomes one fusion bound symbol of that kind built by `compiler`, a
    regions.base.RegionCompiler (inputs and outputs as Thunder's Region gives them); dels and
    collection clears are placed by Thunder's del_last_used.  Returns (trace, number
    of fusion regions made).  A group of views only stays unfused: it allocates
    nothing, and a compiled region would only add a call.  donatable_saved: a
    backward's {saved name: storage key} of the saved activations its regions may
    write over (NOTE [donated inputs])."""
    stripped = from_trace(trace)
    stripped.bound_symbols = [b for g, _ in groups for b in g]
    producers, consumers = tutils.producers_and_consumers(stripped)
    steps = []  # (group, kind, inputs, outputs): a region; (group, None, None, None): its ops as they are
    for group, plan_kind in groups:
        kind = regions.region_kind(plan_kind, group, compiler)
        if kind is None or _views_only(group):
            steps.append((group, None, None, None))
            continue
        region = _Region(producers, consumers, list(group))  # Region's inputs/outputs, in linear time
        inputs = sorted((unvariableify(x) for x in region.inputs), key=lambda p: p.name)
        outputs = sorted((unvariableify(x) for x in region.outputs), key=lambda p: p.name)
        steps.append((group, kind, inputs, outputs))
    donations = _donations(stripped, steps, donatable_saved or {}) if compiler.compiles_regions else {}
    new_bsyms = []
    n_regions = 0  # also numbers the regions: names are per trace, like Thunder's own fusion passes
    for k, (group, kind, inputs, outputs) in enumerate(steps):
        if kind is None:
            new_bsyms.extend(group)
            continue
        name = f"{name_prefix}{n_regions}"
        donated, donated_saved = donations.get(k, ((), ()))
        fn = make_region_callable(regions.make_group(name, group, inputs, outputs, kind, donated, donated_saved),
                                  compiler)
        sym = region_symbol(name, outputs)
        new_bsyms.append(BoundSymbol(sym, tuple(inputs), {}, tuple(outputs), list(group), _call_ctx={name: fn}))
        n_regions += 1
    new_trace = from_trace(trace)
    new_trace.bound_symbols = new_bsyms
    return del_last_used(new_trace, clear_mutable_collections=is_backward), n_regions


def _donations(stripped, steps, donatable_saved) -> dict:
    """NOTE [donated inputs]: {step index: (donated, donated_saved)}, the positions of a region's inputs
    whose storage no later step reads and no one outside the trace holds, which its compiled program
    may therefore write its results over (Inductor's donated buffers, as torch.compile's backward
    reuses the saved activations it frees).  A region compiled alone cannot know that an input dies
    with it; without this, a cross-entropy's gradient, say, took a buffer of its own beside the
    logits it was computed from, where torch.compile's program writes it over them.

    An input qualifies when its storage (its view chain's root, _aliases NOTE [storage identity])
    is made by this trace (`donated`), or is a saved activation the backward frees that is no
    forward output the caller holds (`donated_saved`, from donatable_saved: only while the running
    backward does not keep its graph, regions/torchcompile.py), and when: no later step reads that
    storage (the return included), no other input of the region is a view of it, and no output of
    the region is.  Never the trace's inputs (parameters, the batch, incoming gradients: a caller may
    hold them).  Storages are followed through the conversions that may return their argument itself
    (_planning.donation_root: `contiguous` of a contiguous tensor, `to` its own dtype: the memory model counts them as new
    tensors, which is only conservative there, but here it would let a region write over a storage
    another name still reads)."""
    from thunder.core.proxies import TensorProxy

    from ._planning import donation_keys

    storage = donation_keys(stripped, donatable_saved)

    last = {}
    for k, (group, kind, inputs, _) in enumerate(steps):
        for p in (inputs if kind is not None else [a for b in group for a in b.flat_proxy_args]):
            if isinstance(p, TensorProxy):
                last[storage(p)[0]] = k
    out = {}
    for k, (group, kind, inputs, outputs) in enumerate(steps):
        if kind is None:
            continue
        keys = [storage(p) if isinstance(p, TensorProxy) else (None, None) for p in inputs]
        counts = {}
        for key, _ in keys:
            counts[key] = counts.get(key, 0) + 1
        made_views = {storage(o)[0] for o in outputs if isinstance(o, TensorProxy)}
        donated, donated_saved = [], []
        for i, (key, how) in enumerate(keys):
            if how is None or last.get(key) != k or counts[key] > 1 or key in made_views:
                continue
            (donated if how == "made" else donated_saved).append(i)
        if donated or donated_saved:
            out[k] = (tuple(donated), tuple(donated_saved))
    return out


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
