"""The forward's saved set under a memory budget: saved activations recomputed in the backward.

NOTE [the saved set]  What a training step's forward saves for its backward is decided on the
joint trace: Thunder's split (thunder.transforms.autodiff.split_into_forward_and_backward) saves
every forward value a backward op reads, after the fusion pass's min-cut has moved cheap
producers into the backward (fusion_pass.py).  What is left saved on real models is matmul
outputs, residual sums, attention outputs and norm statistics: values with no cheap producer
whose inputs are saved.  Saving fewer of them costs work (a matmul or an attention run again in
the backward), which memfuse never spends on its own ("auto": a user must not lose speed).  With
MemFuse(memory_budget=bytes) the user has said what they would rather spend, so where the step's
planned peak does not fit the budget, the fusion pass (memfuse's, where it replaced the fusion
executor) saves fewer activations:

- A candidate is one saved storage (its saved names together: a tensor and its views), rebuilt in
  the backward from what stays available there: the other saved tensors and the step's inputs
  (parameters, the batch).  Its chain of forward ops is copied, never an op that writes in place,
  reads or makes a storage something writes (fusion_pass.py NOTE [writes stay put]) or draws
  random numbers; a chain longer than MAX_CHAIN ops is not a candidate.  So the saved set only
  shrinks: nothing new is saved, and nothing the user's checkpointing recomputes is saved.
- Candidates are taken cheapest first: the chain's work (multiply-adds for matmuls and attention,
  elements for the rest) per byte the storage frees.  The step's planned peak, the larger of the
  forward's and the backward's plus what the caller holds beside it (_planning.py NOTE [held
  outputs]), is planned by the same planner for prefixes of that list: they double until one fits,
  then a binary search below it finds the shortest that fits (so a trace is planned O(log n)
  times; the peak is not monotone in the prefix, as every copy at once can plan higher than the
  saved set).  Where none fits, the lowest prefix tried, if it plans lower than saving everything.
- The copies are bound symbols of the joint trace placed right before the first backward op that
  reads what they rebuild, under fresh names; the split then saves what they read instead.  The
  backward's own planner (transform.py) orders them with the rest.

Any failure leaves the joint trace as it came (a MemFuseWarning, fusion_pass.py).
"""
from __future__ import annotations

import math

MAX_CHAIN = 32  # ops one candidate may copy: the step's chains are a matmul behind a norm or a split


def is_joint(trace) -> bool:
    """Is trace a joint forward-backward trace (its return holds the forward's outputs)?"""
    from thunder.core import prims

    if not trace.bound_symbols:
        return False
    ret = trace.bound_symbols[-1]
    return (ret.sym == prims.python_return and bool(ret.args) and isinstance(ret.args[0], dict)
            and "fw_flat_out" in ret.args[0] and "flat_args" in ret.args[0])


def _parts(joint):
    """(forward names, indices of the backward part's bound symbols) of a joint trace, as
    Thunder's split_into_forward_and_backward assigns them."""
    from thunder.core import prims
    from thunder.core.pytree import tree_iter
    from thunder.core.proxies import Proxy

    ret = joint.bound_symbols[-1]
    if ret.sym != prims.python_return:
        raise ValueError("a joint trace ends with its return")
    fw_names = {o.name for o in tree_iter(ret.args[0]["fw_flat_out"]) if isinstance(o, Proxy)}
    fw_names.update(a.name for a in ret.args[0]["flat_args"] if isinstance(a, Proxy))
    backward = []
    for i in range(len(joint.bound_symbols) - 2, -1, -1):
        b = joint.bound_symbols[i]
        if b.sym == prims.get_grad:
            continue
        if any(o.name in fw_names for o in b.flat_proxy_outs) or b.sym == prims.unpack_trivial:
            args = {a.name for a in b.flat_proxy_args}
            fw_names.update(args)
            fw_names.update(o.name for o in b.flat_proxy_outs if o.name not in args)
            continue
        if (b.sym == prims.copy_ or b.sym.name == "copy_") and b.args[1].name in fw_names:
            fw_names.update(a.name for a in b.flat_proxy_args)
            continue
        backward.append(i)
    backward.reverse()
    return fw_names, backward


def backward_indices(joint) -> list:
    """Indices of the bound symbols of a joint trace's backward part (_parts)."""
    return _parts(joint)[1]


def _producers(joint, fw_names) -> dict:
    """{forward name: the bound symbol of the joint trace that makes it}."""
    producer = {}
    for b in joint.bound_symbols:
        for o in b.flat_proxy_outs:
            if o.name in fw_names:
                producer.setdefault(o.name, b)
    return producer


def _read_by(joint, indices) -> set:
    """The tensor names the bound symbols at `indices` read."""
    from thunder.core.proxies import TensorProxy

    return {a.name for i in indices for a in joint.bound_symbols[i].flat_proxy_args if isinstance(a, TensorProxy)}


def _inputs(joint) -> set:
    from thunder.core.proxies import Proxy

    return {a.name for a in joint.bound_symbols[-1].args[0]["flat_args"] if isinstance(a, Proxy)}


def _work(b) -> int:
    """A bound symbol's work in elements: multiply-adds for matmuls and attention, else the
    elements it writes."""
    from thunder.core.proxies import TensorProxy

    outs = [o for o in b.flat_proxy_outs if isinstance(o, TensorProxy)]
    n = sum(math.prod(int(s) for s in o.shape) for o in outs)
    args = [a for a in b.flat_proxy_args if isinstance(a, TensorProxy)]
    name = b.sym.name
    if args and ("linear" in name or "matmul" in name) and args[0].ndim:
        return n * int(args[0].shape[-1])
    if "sdpa" in name or "scaled_dot_product" in name:
        q, k = args[0], args[1] if len(args) > 1 else args[0]
        return 2 * math.prod(int(s) for s in q.shape) * int(k.shape[-2])
    return n


def _copyable(b, pinned) -> bool:
    from .. import _C, _symbols

    sid = b.sym.id
    if (sid in _symbols.PROLOGUE_IDS or sid in _symbols.DROP_IDS or sid in _symbols.RETURN_IDS
            or id(b) in pinned or _symbols.is_random(b)):
        return False
    return not (_symbols.effects(b) & (_C.EFF_WRITES | _C.EFF_ORDERED | _C.EFF_COMM | _C.EFF_WAIT))


def _chain_work(names, available, producer, pinned):
    """The work of the forward ops that rebuild `names` from `available`; None where an op cannot
    be copied or the chain is longer than MAX_CHAIN."""
    seen, work, stack = set(), 0, list(names)
    while stack:
        n = stack.pop()
        if n in available:
            continue
        b = producer.get(n)
        if b is None or not _copyable(b, pinned):
            return None
        if id(b) in seen:
            continue
        seen.add(id(b))
        if len(seen) > MAX_CHAIN:
            return None
        work += _work(b)
        stack.extend(a.name for a in b.flat_proxy_args)
    return work


class Candidate:
    __slots__ = ("names", "bytes", "work")

    def __init__(self, names, nbytes, work):
        self.names, self.bytes, self.work = names, nbytes, work


def candidates(joint, saved: dict, pinned_ops):
    """The saved storages that can be rebuilt in the backward, cheapest work per byte first.
    saved: _planning.saved_storages of the joint trace's split forward; pinned_ops(bsyms): the ids
    of the ops never to copy (fusion_pass.py NOTE [writes stay put])."""
    fw_names, backward = _parts(joint)
    producer = _producers(joint, fw_names)
    read = _read_by(joint, backward)
    available = (read & fw_names) | _inputs(joint)
    if not set(saved) <= available:  # _parts no longer splits as Thunder's split does
        raise RuntimeError(f"saved tensors {sorted(set(saved) - available)[:4]} are not read by the backward part")
    pinned = pinned_ops(joint.bound_symbols)
    groups = {}
    for name, (root, nbytes) in saved.items():
        groups.setdefault(root, (nbytes, []))[1].append(name)
    out = []
    for root, (nbytes, names) in groups.items():
        if not nbytes:
            continue
        work = _chain_work(names, available - set(names), producer, pinned)
        if work is not None:
            out.append(Candidate(tuple(sorted(names)), nbytes, work))
    out.sort(key=lambda c: (c.work / c.bytes, c.names))
    return out


def rebuilt(joint, names, all_names, fresh):
    """The joint trace with the saved `names` rebuilt in the backward (NOTE [the saved set]):
    each backward op reading one reads a copy made right before it, under a fresh name
    (all_names(trace): its names; fresh(name, taken): a new one, fusion_pass.py's)."""
    from thunder.core.proxies import Proxy, TensorProxy, variableify
    from thunder.core.trace import from_trace, tracectx

    names = set(names)
    if not names:
        return joint
    fw_names, backward = _parts(joint)
    producer = _producers(joint, fw_names)
    backward_set = set(backward)
    read = _read_by(joint, backward)
    available = ((read & fw_names) | _inputs(joint)) - names
    taken = all_names(joint)
    swap = {}  # variableified forward proxy -> its copy's
    copied = set()
    new = from_trace(joint)
    bsyms = []

    def emit(b):
        if id(b) in copied:
            return
        copied.add(id(b))
        for a in b.flat_proxy_args:
            if isinstance(a, TensorProxy) and a.name not in available and variableify(a) not in swap:
                emit(producer[a.name])
        for o in b.flat_proxy_outs:
            if isinstance(o, Proxy):
                swap[variableify(o)] = o.replace_name(fresh(o.name, taken))
        bsyms.append(b.from_bsym_swap_proxies(swap))

    with tracectx(new):
        for i, b in enumerate(joint.bound_symbols):
            if i not in backward_set:
                bsyms.append(b)
                continue
            for a in b.flat_proxy_args:
                if isinstance(a, TensorProxy) and a.name in names and variableify(a) not in swap:
                    emit(producer[a.name])
            bsyms.append(b.from_bsym_swap_proxies(swap, skip_output=True) if swap else b)
    new.bound_symbols = bsyms
    return new


def choose(joint, evaluate, *, pinned_ops, all_names, fresh):
    """NOTE [the saved set]: the joint trace with the fewest saved storages rebuilt whose step
    plan fits.  evaluate(trace) -> (fits, planned step peak, saved_storages of its forward);
    pinned_ops, all_names, fresh: fusion_pass.py's (candidates, rebuilt).
    Returns (trace, what was done: a dict for report())."""
    ok, peak0, saved = evaluate(joint)
    info = {"rebuilt": [], "rebuilt_bytes": 0, "extra_work": 0, "candidates": 0,
            "first_peak_bytes": peak0, "planned_step_peak_bytes": peak0, "fits": ok}
    if ok:
        return joint, info
    cands = candidates(joint, saved, pinned_ops)
    info["candidates"] = len(cands)
    if not cands:
        return joint, info

    def at(k):
        t = rebuilt(joint, [n for c in cands[:k] for n in c.names], all_names, fresh)
        ok, peak, _ = evaluate(t)
        return t, ok, peak

    # the peak is not monotone in the prefix (every copy rebuilt at once can plan higher than
    # the saved set), so prefixes double until one fits, then a binary search below it
    best, lowest, k = None, None, 1
    while best is None:
        t, ok, peak = at(k)
        if ok:
            best = (k, t, peak, True)
        elif peak < peak0 and (lowest is None or peak < lowest[2]):
            lowest = (k, t, peak, False)
        if k == len(cands):
            break
        k = min(2 * k, len(cands))
    if best is not None:
        lo, hi = best[0] // 2 + 1, best[0]
        while lo < hi:
            mid = (lo + hi) // 2
            t, ok, peak = at(mid)
            if ok:
                best, hi = (mid, t, peak, True), mid
            else:
                lo = mid + 1
    best = best or lowest
    if best is None:
        return joint, info
    k, t, peak, ok = best
    info.update(rebuilt=[n for c in cands[:k] for n in c.names], rebuilt_bytes=sum(c.bytes for c in cands[:k]),
                extra_work=sum(c.work for c in cands[:k]), planned_step_peak_bytes=peak, fits=ok)
    return t, info
