"""NOTE [memfuse fusion pass]: what nvFuser's and torch.compile's fusion passes do to the joint
forward-backward trace, done where memfuse takes their place.

Thunder runs a fusion executor's pass on the joint trace, before it is split into forward and
backward.  Besides grouping ops, those passes rematerialize (thunder.core.rematerialization): for
each producer/consumer pair of fusions, a min-cut decides which values the consumer recomputes from
cheaper inputs instead of reading them, so the split saves fewer activations for the backward.  That
is where Thunder + torch.compile's memory advantage over plain Thunder comes from, and memfuse's own
planning runs later, on the split traces, when the saved set is fixed.

So memfuse_ex's pass does the same first steps: the same dataflow grouping of what it can claim
(thunder.executors.data_dependent_partition.fuse_bound_symbols, as the torchcompile executor), then
Thunder's rematerialize (its cuts solved in C, NOTE [rematerialization in C] in _rematerialize.py)
and dce.  Then it dissolves its provisional regions back into their bound
symbols: memfuse regroups them later by memory (transform.py), and Thunder's always-executors claim
them right after this pass.  A consumer's recomputed values carry the producer's names; dissolved
into one trace they would be assigned twice, so they are renamed inside their region.

The provisional regions are formed with the replaced executor's own claim (its can_fuse, matmuls
included), so the cuts, and the activations saved for the backward, are the ones that executor's
pass would have made.  Any failure here returns the trace as it came (unfused, never wrong).

NOTE [writes stay put]  Thunder's rematerialize copies any op of a producer region into its
consumer, except reductions, random ops and matmuls; it knows nothing of storage.  A training
forward that updates a buffer in place (`self.ema.mul_(0.9).add_(...)`) has in its joint trace
`update_aliases(t_ema)`, `mul`, `copy_` into the buffer; with those inside a provisional region, the
min-cut copied the read and the write into the consumer region, and after the split the backward
ran the forward's update a second time (wrong buffers, wrong gradients, no error).  So an op that
writes a storage in place, and every op that reads or makes (a view of) a storage something writes
in place, is pinned: it never joins a provisional region, so rematerialization cannot copy it across
the write.  Which names share a storage comes from the same probe as the planner's ordering edges
(_aliases.py NOTE [storage identity]), a may-alias counted as an alias; a write is what the planner
counts as one (_symbols.effects EFF_WRITES), all of its tensor arguments written.  After the pass,
the writes must be the input's, each once: anything else is an internal failure, and the trace is
returned as it came.
"""
from __future__ import annotations

import time


def fusion_pass(ex, trace):
    from .._memo import one_answer_each

    try:
        with one_answer_each():  # effects and the alias probe: each bound symbol asked once
            return _fuse_remat_dissolve(ex, trace)
    except Exception as e:
        from ..errors import warn

        warn(f"memfuse: rematerialization skipped: {type(e).__name__}: {e}")
        return trace


def _fuse_remat_dissolve(ex, trace):
    from thunder.core.trace import TraceProvenance
    from thunder.core.transform_common import dce

    from ._rematerialize import rematerialize  # NOTE [rematerialization in C]

    start = time.perf_counter_ns()
    fused_trace, counter = provisional_regions(ex, trace)
    # no dce before the regions are dissolved: its no-op pruning drops any non-prim subsymbol without
    # subsymbols of its own (a grad rule's ltorch.zeros), a real op inside a provisional region
    fused_trace = rematerialize(fused_trace)
    out = _dissolve(ex, fused_trace)
    out = dce(out)
    if _writes(out.bound_symbols) != _writes(trace.bound_symbols):
        raise RuntimeError("rematerialization moved or copied an in-place write")
    from thunder.core.compile_data import get_compile_data

    cd = get_compile_data()
    t = time.perf_counter_ns()
    out, saved_set = _saved_set_within_budget(cd, out)  # _saved_set.py NOTE [the saved set]
    saved_set_ms = (time.perf_counter_ns() - t) / 1e6
    elapsed_ms = (time.perf_counter_ns() - start) / 1e6 - saved_set_ms
    out.set_provenance(TraceProvenance(
        f"memfuse fusion pass: {counter} provisional regions, rematerialized, dissolved"
        f"{_rebuilt_note(saved_set)} (took {int(elapsed_ms)} ms)"))
    if cd is not None:  # the forward's report counts them (transform.py stage_ms)
        cd._memfuse_fusion_pass_ms = elapsed_ms
        cd._memfuse_saved_set = saved_set
        cd._memfuse_saved_set_ms = saved_set_ms if saved_set is not None else None
    return out


def _saved_set_within_budget(cd, joint):
    """(joint, what _saved_set.choose did, or None): where this compilation's MemFuse has a
    memory_budget in bytes and the trace is a joint forward-backward one, the saved set that
    fits it.  A failure keeps the joint trace (a MemFuseWarning; MemFuseError with strict)."""
    from . import _saved_set

    # this compilation's MemFuse (transform.py, which imports this module: known by its method)
    ours = [t for t in (getattr(cd, "transforms", None) or ()) if callable(getattr(t, "_step_fits", None))]
    if not ours or ours[0].memory_budget == "auto" or not _saved_set.is_joint(joint):
        return joint, None
    try:
        return _saved_set.choose(joint, ours[0]._step_fits, pinned_ops=pinned_ops, all_names=_all_names,
                                 fresh=_fresh)
    except Exception as e:
        if ours[0].strict:
            from ..errors import MemFuseError

            raise MemFuseError(f"memfuse could not choose the saved set: {e}") from e
        from ..errors import warn

        warn(f"memfuse kept Thunder's saved set: {type(e).__name__}: {e}")
        return joint, None


def _rebuilt_note(info) -> str:
    if not info or not info["rebuilt"]:
        return ""
    return f", {len(info['rebuilt'])} saved tensors rebuilt in the backward"


def provisional_regions(ex, trace):
    """(the trace with ex's provisional regions, how many): the dataflow grouping of what ex claims,
    pinned ops (NOTE [writes stay put]) left out."""
    from thunder.core import utils
    from thunder.core.trace import from_trace
    from thunder.executors.data_dependent_partition import fuse_bound_symbols

    producers, consumers = utils.producers_and_consumers(trace)
    pinned = pinned_ops(trace.bound_symbols)  # NOTE [writes stay put]

    def claims(b):
        return id(b) not in pinned and ex.can_fuse(b)

    def should_fuse(a, b):
        def ok(n):
            return len(n.group_bsyms) > 1 or claims(n.group_bsyms[0])

        return ok(a) and ok(b)

    fused = []
    counter = 0
    for bsyms in fuse_bound_symbols(trace, should_fuse):
        if len(bsyms) == 1 and not claims(bsyms[0]):
            fused.append(bsyms[0])
            continue
        fused.append(ex.fuse(_Region(producers, consumers, bsyms), counter))
        counter += 1
    fused_trace = from_trace(trace)
    fused_trace.bound_symbols = fused
    return fused_trace, counter


class _Region:
    """thunder.executors.utils.Region's inputs and outputs (ordered as it orders them), found in time
    linear in the region: Region asks `producer in bound_symbols` of a list, by BoundSymbol equality,
    for every value, which made the pass quadratic in the size of a region."""

    def __init__(self, producers, consumers, bound_symbols):
        from thunder.core import utils
        from thunder.core.proxies import Proxy, variableify
        from thunder.core.transform_common import order_proxies
        from thunder.executors.utils import comment_symbols

        self.bound_symbols = bound_symbols
        inside = {id(b) for b in bound_symbols}
        inputs, outputs, seen = [], [], set()
        for b in bound_symbols:
            for x in b.flat_outs:
                if not isinstance(x, Proxy) or id(producers[x]) not in inside:
                    continue
                if any(id(c) not in inside for c in consumers.get(x, ())) and x.name not in seen:
                    seen.add(x.name)
                    outputs.append(x)
            if b.sym.id in comment_symbols:
                continue
            for x in b.flat_args:
                if isinstance(x, Proxy) and id(producers[x]) not in inside and x.name not in seen:
                    seen.add(x.name)
                    inputs.append(x)
        order = order_proxies(bound_symbols)
        self.inputs = utils.OrderedSet(variableify(x) for x in sorted(inputs, key=lambda p: order[p.name]))
        self.outputs = utils.OrderedSet(variableify(x) for x in sorted(outputs, key=lambda p: order[p.name]))


def pinned_ops(bsyms) -> set:
    """ids of the bound symbols that write a storage in place, or read or make a name of a storage
    something in `bsyms` writes in place (NOTE [writes stay put]); empty where nothing writes."""
    from thunder.core.proxies import TensorProxy

    find, written = written_storages(bsyms)
    if not written:
        return set()

    def touches(b):
        return any(isinstance(p, TensorProxy) and find(p.name) in written
                   for p in (*b.flat_proxy_args, *b.flat_proxy_outs))

    return {id(b) for b in bsyms if _writes_in_place(b) or touches(b)}


def written_storages(bsyms):
    """(find, written): find(name) is the storage of a tensor name (a name no op aliases is its own
    storage), written the storages an op of `bsyms` writes in place (all of its tensor arguments)."""
    from thunder.core.proxies import TensorProxy

    from .. import _symbols
    from ._aliases import aliases

    parent = {}

    def find(n):
        root = n
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(n, n) != root:  # path compression
            parent[n], n = root, parent[n]
        return root

    writers = [b for b in bsyms if _writes_in_place(b)]
    if not writers:
        return find, set()
    for b in bsyms:
        if b.sym.id in _symbols.PROLOGUE_IDS:
            continue
        found = aliases(b)
        if not found:
            continue
        args = b.flat_proxy_args
        for o, e in zip(b.flat_proxy_outs, found):
            if e is not None and isinstance(o, TensorProxy):
                parent[find(o.name)] = find(args[e[0]].name)
    return find, {find(a.name) for b in writers for a in b.flat_proxy_args if isinstance(a, TensorProxy)}


def _writes_in_place(b) -> bool:
    from .. import _C, _symbols

    sid = b.sym.id
    if sid in _symbols.DROP_IDS or sid in _symbols.RETURN_IDS or sid in _symbols.PROLOGUE_IDS:
        return False  # del, the return and the unpacks carry DONT_DCE, and write nothing
    return bool(_symbols.effects(b) & _C.EFF_WRITES)


def _writes(bsyms):
    """The in-place writes of a trace, in order: (symbol, argument names, output names) each."""
    return [(b.sym.name, tuple(a.name for a in b.flat_proxy_args), tuple(o.name for o in b.flat_proxy_outs))
            for b in bsyms if _writes_in_place(b)]


def _dissolve(ex, trace):
    """The trace with ex's fusion bound symbols replaced by their subsymbols; values a region
    computes under a name already defined before it (a consumer's recomputation) are renamed
    inside that region."""
    from thunder.core.proxies import Proxy, variableify
    from thunder.core.trace import from_trace, tracectx

    new = from_trace(trace)
    taken = None  # every name in the trace, made the first time a value is renamed
    defined = set()
    bsyms = []
    with tracectx(new):
        for b in trace.bound_symbols:
            if not (b.sym.is_fusion and b.sym.executor is ex):
                bsyms.append(b)
                defined.update(o.name for o in b.flat_proxy_outs)
                continue
            outputs = {o.name for o in b.flat_proxy_outs}
            swap = {}
            for sb in b.subsymbols:
                for o in sb.flat_proxy_outs:
                    if o.name in defined and variableify(o) not in swap:
                        if o.name in outputs:
                            raise RuntimeError(f"region output {o.name} is defined twice")
                        if taken is None:
                            taken = _all_names(trace)
                        swap[variableify(o)] = o.replace_name(_fresh(o.name, taken))
                if swap:
                    sb = sb.from_bsym_swap_proxies(swap)
                bsyms.append(sb)
                defined.update(o.name for o in sb.flat_proxy_outs if isinstance(o, Proxy))
    new.bound_symbols = bsyms
    return new


def _all_names(trace) -> set:
    """The trace's names: what it registered, and every output at any depth (a name an op reads is
    an output of another, or an input the top level unpacks)."""
    names = set(getattr(trace, "names", ()) or ())
    stack = list(trace.bound_symbols)
    for b in stack:
        names.update(p.name for p in b.flat_proxy_args)
    while stack:
        b = stack.pop()
        names.update(p.name for p in b.flat_proxy_outs)
        stack.extend(b.subsymbols)
    return names


def _fresh(name: str, taken: set) -> str:
    """A name not in `taken` (which it joins): the recomputed value's name, suffixed."""
    k = 0
    while f"{name}_rm{k}" in taken:
        k += 1
    new = f"{name}_rm{k}"
    taken.add(new)
    return new
