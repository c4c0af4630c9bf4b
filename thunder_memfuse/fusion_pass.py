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
Thunder's rematerialize and dce.  Then it dissolves its provisional regions back into their bound
symbols: memfuse regroups them later by memory (transform.py), and Thunder's always-executors claim
them right after this pass.  A consumer's recomputed values carry the producer's names; dissolved
into one trace they would be assigned twice, so they are renamed inside their region.

The provisional regions are formed with the replaced executor's own claim (its can_fuse, matmuls
included), so the cuts, and the activations saved for the backward, are the ones that executor's
pass would have made.  Any failure here returns the trace as it came (unfused, never wrong).
"""
from __future__ import annotations

import time


def fusion_pass(ex, trace):
    try:
        return _fuse_remat_dissolve(ex, trace)
    except Exception as e:
        from .errors import warn

        warn(f"memfuse: rematerialization skipped: {type(e).__name__}: {e}")
        return trace


def _fuse_remat_dissolve(ex, trace):
    from thunder.core import utils
    from thunder.core.rematerialization import rematerialize
    from thunder.core.trace import TraceProvenance, from_trace
    from thunder.core.transform_common import dce
    from thunder.executors.data_dependent_partition import fuse_bound_symbols
    from thunder.executors.utils import Region

    start = time.perf_counter_ns()
    producers, consumers = utils.producers_and_consumers(trace)

    def should_fuse(a, b):
        def ok(n):
            return len(n.group_bsyms) > 1 or ex.can_fuse(n.group_bsyms[0])

        return ok(a) and ok(b)

    fused = []
    counter = 0
    for bsyms in fuse_bound_symbols(trace, should_fuse):
        if len(bsyms) == 1 and not ex.can_fuse(bsyms[0]):
            fused.append(bsyms[0])
            continue
        fused.append(ex.fuse(Region(producers, consumers, bsyms), counter))
        counter += 1
    fused_trace = from_trace(trace)
    fused_trace.bound_symbols = fused
    fused_trace = dce(rematerialize(fused_trace))
    out = _dissolve(ex, fused_trace)
    out = dce(out)
    out.set_provenance(TraceProvenance(
        f"memfuse fusion pass: {counter} provisional regions, rematerialized, dissolved "
        f"(took {(time.perf_counter_ns() - start) // 1_000_000} ms)"))
    return out


def _dissolve(ex, trace):
    """The trace with ex's fusion bound symbols replaced by their subsymbols; values a region
    computes under a name already defined before it (a consumer's recomputation) are renamed
    inside that region."""
    from thunder.core.proxies import Proxy, variableify
    from thunder.core.trace import from_trace, tracectx

    new = from_trace(trace)
    taken = _all_names(trace)
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
                        swap[variableify(o)] = o.replace_name(_fresh(o.name, taken))
                if swap:
                    sb = sb.from_bsym_swap_proxies(swap)
                bsyms.append(sb)
                defined.update(o.name for o in sb.flat_proxy_outs if isinstance(o, Proxy))
    new.bound_symbols = bsyms
    return new


def _all_names(trace) -> set:
    names = set(getattr(trace, "names", ()) or ())
    stack = list(trace.bound_symbols)
    while stack:
        b = stack.pop()
        names.update(p.name for p in b.flat_proxy_outs)
        names.update(p.name for p in b.flat_proxy_args)
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
