"""A trace handed to the C planner: plan_trace (the op records, then _C.plan_trace), and what a
training step's traces free early (saved_storages, incoming_gradients, backward_freeable).

What a bound symbol is (views, random ops, effects, the prologue) is base knowledge:
thunder_memfuse/_symbols.py.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import math
import time

from thunder.core.proxies import FutureTensorProxy, TensorProxy

from .. import _C
from .._symbols import DROP_IDS, PROLOGUE_IDS


@functools.lru_cache(maxsize=1)
def _fusible_predicate():
    # importing the code generator's predicate loads no CUDA library (they are opened at first use)
    from ..regions.nvrtc import fusible_bsym

    return fusible_bsym


# NOTE [collector paused]: reading a trace makes many small objects (records, the
# predicates' sets, the graph dicts), enough to start the cyclic collector's passes, and
# each pass walks every object Thunder and the model keep alive (traces, proxies,
# parameters), which the pass itself never makes garbage of.  A plan of a backward of
# thousands of ops ran into several.  So the collector waits while memfuse reads and
# plans one trace; reference counting frees as before, and what cyclic garbage the pass
# leaves is collected after it.
@contextlib.contextmanager
def collector_paused():
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def plan_trace(bsyms, *, max_states=None, fuse=True, fusible=None, freeable=None, epilogue_role=None,
               comm_overlap=True, recompute=0, peak_allowance=0, peak_target=0, donate=False, donatable_saved=None):
    """Run the C trace reader and planner on a list of bound symbols.

    fusible(bsym): the region compiler's fusible level (default: the nvrtc
    code generator's); it is never asked about an op with an effect, so a
    random op never joins a region (NOTE [random ops]).
    freeable: names of prologue tensors the trace frees after their last use
    (a backward's saved activations: trace.c NOTE [freeable saved tensors]),
    or saved_storages()'s mapping {name: (storage key, bytes)}, which also says
    which of them share one storage.
    epilogue_role(bsym): EPI_HEAD / EPI_TAIL bits (default: regions.nvrtc's;
    csrc/core/mf_build.c NOTE [epilogue candidates]).
    comm_overlap: issue collectives early and waits late within the planned
    peaks (csrc/core/mf_comm.c NOTE [collective overlap]).
    recompute: the bytes copies of cheap ops may write (csrc/core/mf_remat.c
    NOTE [recomputation]; 0: none); _recompute.emit turns the result's copies
    into bound symbols.  peak_allowance: a fused peak up to this many bytes costs
    nothing, so the fewest regions within it are formed (csrc/core/mf_fuse.c NOTE
    [peak allowance]; _step.py NOTE [the step's peak]).  peak_target: 0, or the
    bytes of MemFuse(memory_budget=...) (csrc/core/mf_pipeline.c NOTE [peak
    target]).  donate: the regions' compiler writes results over inputs that die with them
    (_regroup.py NOTE [donated inputs]), so the plan counts that (donatable_names; donatable_saved as
    regroup_trace takes it).  The records are _records.py's (NOTE [op records])."""
    from ._records import records

    if epilogue_role is None:
        from ..regions.nvrtc import epilogue_role
    bsyms = list(bsyms)
    with collector_paused():
        start = time.perf_counter()
        recs = records(bsyms, fusible=fusible or _fusible_predicate(), epilogue_role=epilogue_role,
                       recompute=bool(recompute))
        donatable = donatable_names(bsyms, freeable, donatable_saved) if donate and fuse else None
        records_ms = 1e3 * (time.perf_counter() - start)
        res = _C.plan_trace(
            bsyms,
            recs,
            # futures are sized like tensors (mf_build.c NOTE [collectives])
            tensor_type=(TensorProxy, FutureTensorProxy),
            max_states=max_states,
            fuse=fuse,
            freeable=dict(freeable) if isinstance(freeable, dict) else frozenset(freeable or ()),
            comm_overlap=comm_overlap,
            recompute=int(recompute),
            peak_allowance=int(peak_allowance),
            peak_target=int(peak_target),
            donatable=donatable,
        )
        res["stage_ms"]["reading"] += records_ms  # the op records are the reading's Python half
        return res


def saved_storages(forward_trace) -> dict:
    """The storages an augmented forward saves for backward (NOTE [saved storages]).

    Returns {saved name: (storage key, storage bytes)} for the saved tensors
    that are not (views of) the forward's inputs: names with the same key share
    one storage, of the given bytes (its root's, which need not be saved
    itself).  Parameters, inputs and their views are left out: they stay alive
    in the caller, while activations die with their last use in the backward."""
    from thunder.core.vjp_utils import get_saved_for_backward_tensors

    root = _root_of(forward_trace)
    out = {}
    for s in get_saved_for_backward_tensors(forward_trace):
        if not isinstance(s, TensorProxy) or s.name in out:
            continue
        r, is_input = root(s)
        if not is_input:
            out[s.name] = (r.name, _proxy_bytes(r))
    return out


def _root_of(forward_trace, *, donation=False):
    """root(proxy) -> (root proxy, is an input) along the forward's view chains.  donation: also
    through a may-alias (an alias whatever its strides or not) and the conversions that may return
    their argument (_MAY_RETURN_ARG; donation_root)."""
    from thunder.core.proxies import TensorProxy

    from ._aliases import aliases

    producer = {}

    def index(bsyms, outer=None):
        for b in bsyms:
            # a fusion's subsymbols say how its outputs were made (a view inside
            # a region is still a view of another output)
            if b.subsymbols and getattr(b.sym, "is_fusion", False):
                index(b.subsymbols, b)
            for o in b.flat_proxy_outs:
                producer.setdefault(o.name, b)

    index(forward_trace.bound_symbols)

    def root(p):
        """(root proxy, is an input) of p's view chain."""
        for _ in range(10_000):  # view chains are short; the bound guards a cycle
            b = producer.get(p.name)
            if b is None or b.sym.id in PROLOGUE_IDS:
                return p, True
            # a view in the memory model (_aliases NOTE [storage identity]): update_aliases,
            # copy_'s result and the view ops share their argument's storage
            found = aliases(b)
            j = next((j for j, o in enumerate(b.flat_proxy_outs) if getattr(o, "name", None) == p.name), None)
            e = found[j] if found and j is not None and j < len(found) else None
            if e is not None and (e[1] or donation):
                p = b.flat_proxy_args[e[0]]
                continue
            first = next((a for a in b.flat_proxy_args if isinstance(a, TensorProxy)), None)
            if donation and e is None and b.sym.name in _MAY_RETURN_ARG and first is not None:
                p = first
                continue
            return p, False
        return p, True

    return root


def held_output_bytes(forward_trace, saved: dict | None) -> int:
    """Bytes of the storages an augmented forward returns to its caller that are neither
    (views of) its inputs nor saved for the backward (NOTE [held outputs]).

    NOTE [held outputs]: a training step's backward runs while the caller still holds
    what the forward returned (the logits a loss was computed from: `out = model(x);
    loss_fn(out).backward()`), and those storages are in no trace's count: not the
    forward's saved set, not the backward's start.  MemFuse(memory_budget=) promises the
    step's peak, so the backward's target is the budget less these bytes."""
    out = forward_trace.output
    first = out[0] if isinstance(out, tuple) and out else None
    flat = first.get("flat_output") if isinstance(first, dict) else None
    if not flat:
        return 0
    root = _root_of(forward_trace)
    saved_roots = {key for key, _ in (saved or {}).values()}
    seen, total = set(), 0
    for o in flat:
        if not isinstance(o, TensorProxy):
            continue
        r, is_input = root(o)
        if is_input or r.name in seen or r.name in saved_roots:
            continue
        seen.add(r.name)
        total += _proxy_bytes(r)
    return total


def donatable_saved(forward_trace, saved: dict | None) -> dict:
    """{saved name: storage key} of the saved activations (saved_storages) whose storage is none of
    the outputs the forward returns to its caller: the storages its backward may write over
    (_regroup.py NOTE [donated inputs]), keyed by donation_root (so two saved tensors a no-op
    conversion made of one storage share a key).  {} where the outputs cannot be told."""
    from thunder.core.vjp_utils import get_saved_for_backward_tensors

    out = forward_trace.output
    first = out[0] if isinstance(out, tuple) and out else None
    flat = first.get("flat_output") if isinstance(first, dict) else None
    if flat is None or not saved:
        return {}
    root = donation_root(forward_trace)
    held = {root(o)[0].name for o in flat if isinstance(o, TensorProxy)}
    result = {}
    for s in get_saved_for_backward_tensors(forward_trace):
        if not isinstance(s, TensorProxy) or s.name not in saved:
            continue
        r, is_input = root(s)
        if not is_input and r.name not in held:
            result[s.name] = r.name
    return result


_MAY_RETURN_ARG = frozenset(f for n in ("contiguous", "to", "type_as", "stride_order", "convert_element_type")
                            for f in (n, f"torch_prims_{n}_impl", f"torch_{n}_prim_impl", f"torch_{n}_impl"))


def donation_keys(trace, donatable_saved):
    """key(proxy) -> (storage key, how) for _regroup.py NOTE [donated inputs]: the storage a tensor's
    donation_root names, and how a region may write over it: "made" (by this trace), "saved" (a
    saved activation in donatable_saved) or None (an input of the trace: never)."""
    root = donation_root(trace)

    def key(p):
        r, is_input = root(p)
        if not is_input:
            return ("made", r.name), "made"
        if r.name in donatable_saved:
            return ("saved", donatable_saved[r.name]), "saved"
        return ("input", r.name), None

    return key


def donatable_names(bsyms, freeable, donatable_saved) -> frozenset:
    """The proxies plan_trace marks donatable (csrc/core/mf_credit.c NOTE [donated inputs]): the
    memory model's storage roots that regroup_trace may donate to the region reading them last, and
    the views of them that keep their elements' order (reshapes, squeezes: a result computed from one
    may be written in place, which the core takes only through a view so marked).  A storage the
    donation keys join to another (a `contiguous` that may return its argument, two saved tensors of
    one forward storage) is none of them: the model counts two storages where a region may write over
    neither while the other is read."""
    import types

    from .._symbols import ORDER_KEEPING_VIEW_NAMES, is_view

    tr = types.SimpleNamespace(bound_symbols=list(bsyms))
    dkey = donation_keys(tr, donatable_saved or {})
    model_root = _root_of(tr)
    fr = freeable if isinstance(freeable, dict) else {}
    members, root_name = {}, {}  # donation key -> the model's storages in it; storage -> its root's name
    in_order = {}  # a view's name -> its storage, where it and every view it is made from keep the order
    for b in tr.bound_symbols:
        if is_view(b) and b.sym.name in ORDER_KEEPING_VIEW_NAMES:
            src = next((a for a in b.flat_proxy_args if isinstance(a, TensorProxy)), None)
            r, _ = model_root(src) if src is not None else (None, None)
            if src is not None and (src.name == r.name or src.name in in_order):
                for o in b.flat_proxy_outs:
                    if isinstance(o, TensorProxy):
                        in_order[o.name] = r.name
        for p in b.flat_proxy_outs:
            if not isinstance(p, TensorProxy):
                continue
            k, how = dkey(p)
            if how is None:
                continue
            r, is_input = model_root(p)
            if not is_input:
                sk, name = ("made", r.name), r.name
            elif r.name in fr:  # trace.c NOTE [saved storages]: the root is the value named by its key
                sk = ("saved", fr[r.name][0])
                name = r.name if fr[r.name][0] == r.name else None
            else:
                continue
            members.setdefault(k, set()).add(sk)
            root_name[sk] = name
    roots = frozenset(root_name[sk] for ks in members.values() if len(ks) == 1 for sk in ks
                      if root_name[sk] is not None)
    return roots | frozenset(v for v, r in in_order.items() if r in roots)


def donation_root(trace):
    """root(proxy) -> (root proxy, is an input): _root_of's view chains (_aliases NOTE [storage
    identity]), and through the conversions that may return their argument (_MAY_RETURN_ARG): the
    storages a region may write over (_regroup.py NOTE [donated inputs]) are told apart by it."""
    return _root_of(trace, donation=True)


def _proxy_bytes(p) -> int:
    n = 1
    for d in p.shape:
        n *= int(d if isinstance(d, int) else getattr(d, "value", d))
    return int(math.ceil(n * p.dtype.bytes))


def incoming_gradients(backward_trace) -> dict:
    """{name: (name, bytes)} for the tensors a backward trace unpacks from its
    second argument (the gradients of the forward's outputs).  Thunder's
    backward clears that collection, so, like the saved activations, each is
    freed after its last use (NOTE [saved storages])."""
    params = [a[0] if isinstance(a, tuple) else a for a in backward_trace.siginfo().args]
    if len(params) < 2:
        return {}
    collections, out = {str(params[1])}, {}
    for b in backward_trace.bound_symbols:
        if b.sym.id not in PROLOGUE_IDS and b.sym.id not in DROP_IDS:
            break
        args = b.flat_proxy_args
        if b.sym.id in PROLOGUE_IDS and args and getattr(args[0], "name", None) in collections:
            for o in b.flat_proxy_outs:
                if isinstance(o, TensorProxy):
                    out[o.name] = (o.name, _proxy_bytes(o))
                else:
                    collections.add(getattr(o, "name", None))
    return out


def backward_freeable(saved: dict | None, backward_trace) -> dict | None:
    """What a backward frees after last use: the forward's saved storages
    (saved_storages) and the incoming gradients (None: nothing known)."""
    if saved is None:
        return None
    out = dict(incoming_gradients(backward_trace))
    out.update(saved)
    return out


__all__ = ["plan_trace", "saved_storages", "donatable_saved", "donation_root", "donation_keys", "donatable_names", "held_output_bytes", "incoming_gradients", "backward_freeable", "collector_paused"]
