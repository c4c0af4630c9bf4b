"""Which outputs of a bound symbol share storage with its arguments at run time.

NOTE [storage identity]  A reorder is safe only if every in-place write keeps its place against
every read of the storage it writes, under any name.  The names of a trace do not say which names
share a storage: Thunder's `update_aliases` returns its arguments themselves, `copy_` returns its
destination, `contiguous` returns its argument when that already is contiguous, and `reshape` a
view when one exists.  So the storage identity comes from what the executor really runs: the op's
own callable (the line of Python Thunder would run for it) is called on meta tensors, which have
storages but no data, once with contiguous arguments and once with strided ones, and each tensor
output is matched against the arguments' storages (`torch._C._is_alias_of`, or the very object).

- An output that shares an argument's storage in both layouts (or in one, where the op refuses
  the other, as `view` refuses a strided argument) always aliases it: a view for the memory model
  as well (mf_build.c NOTE [views]).
- One that shares it in one layout only *may* alias it: for ordering it is an alias (mf_build.c NOTE
  [ordering edges] follows storages), for memory a new allocation.  The model then over-counts
  where the op was a no-op, which never makes a plan wrong.
- A fusion region (another executor's, or one an earlier pass formed) is read through its
  subsymbols: an output reached from an input by a chain of (may-)aliases may alias it.
- The memory model keeps Thunder's view table on top (`_symbols.is_view`): `reshape`, which the probe
  finds a may-alias, counts as a view there, as before; `contiguous` is the may-alias the model counts
  as an allocation.
- Where the probe cannot run (an op that fails on meta tensors, a non-tensor proxy argument), the
  names Thunder publishes for views decide (`_symbols.VIEW_NAMES`), and the conversions that may
  return their argument (`to`, `contiguous`, `type_as`, ...) may alias it.

Ops whose probe would touch state outside the tensors are never called: random ops, collectives
and waits, and ops with ordered effects other than in-place writes.  Results are cached per
symbol and argument signature, so a model's repeated layers are probed once.
"""
from __future__ import annotations

import threading
import warnings
from collections import OrderedDict

import torch
from thunder.core.proxies import NumberProxy, Proxy, TensorProxy

from .. import _symbols

# Conversions that return their argument itself when there is nothing to convert; where the probe
# cannot run they count as may-alias (ordering only).
_MAY_ALIAS_NAMES = frozenset({"to", "contiguous", "type_as", "reshape", "flatten", "view_as", "expand_as",
                              "clone_if_needed", "float", "double", "half", "bfloat16", "int", "long", "type",
                              "cpu", "cuda"})
_CACHE_MAX = 4096
_cache: OrderedDict = OrderedDict()
_lock = threading.Lock()
_stats = {"probes": 0, "hits": 0, "unprobed": 0}


def aliases(bsym):
    """None when no tensor output can share an argument's storage, else a tuple with one entry per
    `bsym.flat_proxy_outs` item: None (new storage) or (k, always) where k indexes
    `bsym.flat_proxy_args` and `always` says the output aliases argument k whatever its strides."""
    outs = bsym.flat_proxy_outs
    if not outs or not any(isinstance(o, TensorProxy) for o in outs):
        return None
    args = bsym.flat_proxy_args
    if not any(isinstance(a, TensorProxy) for a in args):
        return None
    if bsym.subsymbols and getattr(bsym.sym, "is_fusion", False):
        return _through_subsymbols(bsym, args, outs)
    found = _probe_cached(bsym, args, outs)
    if found is None:
        found = _by_name(bsym, args, outs)
    if _symbols.is_view(bsym):
        first = next(i for i, a in enumerate(args) if isinstance(a, TensorProxy))
        found = tuple((first, True) if isinstance(o, TensorProxy) else e for o, e in zip(outs, found))
    return found if any(e is not None for e in found) else None


def _by_name(bsym, args, outs):
    name = bsym.sym.name
    tensors = [i for i, a in enumerate(args) if isinstance(a, TensorProxy)]
    if name == "update_aliases":  # returns its arguments, in order
        return tuple((tensors[i], True) if isinstance(o, TensorProxy) and i < len(tensors) else None
                     for i, o in enumerate(outs))
    if name in _symbols.VIEW_NAMES:
        return tuple((tensors[0], True) if isinstance(o, TensorProxy) else None for o in outs)
    if name in _MAY_ALIAS_NAMES or name.endswith("_"):
        # an in-place op by torch's naming returns (a view of) its first argument
        return tuple((tensors[0], name.endswith("_")) if isinstance(o, TensorProxy) else None for o in outs)
    if bsym.sym.id == _symbols.PrimIDs.COPY_ and len(tensors) >= 2:  # copy_(src, dst) returns dst
        return tuple((tensors[1], True) if isinstance(o, TensorProxy) else None for o in outs)
    return tuple(None for _ in outs)


def _through_subsymbols(bsym, args, outs):
    """(k, False) for each output a chain of aliases inside the region leads from argument k."""
    origin = {a.name: {i} for i, a in enumerate(args) if isinstance(a, TensorProxy)}
    for sub in bsym.subsymbols:
        sargs = sub.flat_proxy_args
        found = aliases(sub) if any(getattr(a, "name", None) in origin for a in sargs) else None
        if not found:
            continue
        for o, e in zip(sub.flat_proxy_outs, found):
            if e is not None and isinstance(o, Proxy):
                src = origin.get(getattr(sargs[e[0]], "name", None))
                if src:
                    origin.setdefault(o.name, set()).update(src)
    res = []
    for o in outs:
        src = origin.get(o.name) if isinstance(o, TensorProxy) else None
        res.append((min(src), False) if src else None)
    return tuple(res)


def _skip_probe(bsym) -> bool:
    if _symbols.is_random(bsym) or _symbols.comm_kind(bsym) is not None:
        return True
    eff = _symbols.effects(bsym)
    return bool(eff & _symbols._C.EFF_ORDERED) and not bsym.sym.name.endswith("_") and \
        bsym.sym.id != _symbols.PrimIDs.COPY_ and bsym.sym.name != "copy_"


def _key(bsym):
    parts = []
    for x in bsym.flat_args:  # Thunder's own flattening of (args, kwargs), kept on the bound symbol
        if isinstance(x, TensorProxy):
            parts.append(("T", x.name, tuple(_dim(d) for d in x.shape), str(x.dtype), str(x.device)))
        elif isinstance(x, NumberProxy):
            parts.append(("N", x.name, x.value))
        elif isinstance(x, Proxy):
            return None
        else:
            try:
                hash(x)
                parts.append(x)
            except TypeError:
                parts.append(repr(x))
    # names repeat within a key only where one proxy is passed twice; rename by first appearance
    seen = {}
    key = []
    for p in parts:
        if isinstance(p, tuple) and p and p[0] in ("T", "N"):
            p = (p[0], seen.setdefault(p[1], len(seen))) + p[2:]
        key.append(p)
    return (bsym.sym.id, bsym.sym.name, tuple(key), tuple(type(o).__name__ for o in bsym.flat_proxy_outs))


def _dim(d):
    return d if isinstance(d, int) else int(getattr(d, "value", -1))


def _probe_cached(bsym, args, outs):
    if _skip_probe(bsym):
        return None
    try:
        key = _key(bsym)
        hash(key)
    except Exception:
        key = None
    if key is None:
        _stats["unprobed"] += 1
        return None
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            _stats["hits"] += 1
            return _cache[key]
    res = _probe(bsym, args, outs)
    with _lock:
        _stats["probes"] += 1
        _cache[key] = res
        while len(_cache) > _CACHE_MAX:
            _cache.popitem(last=False)
    return res


def _meta(p, strided):
    shape = tuple(_dim(d) for d in p.shape)
    dtype = _torch_dtype(p.dtype)
    n = 1
    for d in shape:
        n *= d
    if not strided or n < 2:
        return torch.empty(shape, dtype=dtype, device="meta")
    # column-major with every stride doubled: no two dims merge and no dim is dense, so an op
    # that can only return its argument for some layouts (contiguous, reshape) copies here
    strides, s = [], 2
    for d in shape:
        strides.append(s)
        s *= max(d, 1)
    return torch.empty(2 * n, dtype=dtype, device="meta").as_strided(shape, tuple(strides))


def _torch_dtype(d):
    from thunder.core.dtypes import to_torch_dtype

    return to_torch_dtype(d)


def _callable(bsym, inputs, outs):
    from thunder.core import prims
    from thunder.core.trace import TraceCtx, tracectx

    def probe_fn():
        pass

    from inspect import Parameter, Signature

    probe_fn.__signature__ = Signature(Parameter(p.name, Parameter.POSITIONAL_ONLY) for p in inputs)
    trace = TraceCtx(probe_fn)
    with tracectx(trace):
        ret = prims.python_return.bind(list(outs), output=None)
    trace.bound_symbols = [bsym, ret]
    trace.args = list(inputs)
    trace.kwargs = {}
    return trace.python_callable()


def _probe(bsym, args, outs):
    """Run bsym on meta tensors in two layouts (NOTE [storage identity]); None if it cannot run."""
    inputs, seen = [], set()
    for a in args:
        if a.name in seen:
            continue
        if not isinstance(a, (TensorProxy, NumberProxy)):
            return None
        seen.add(a.name)
        inputs.append(a)
    try:
        fn = _callable(bsym, inputs, outs)
    except Exception:
        return None
    hits = []
    for strided in (False, True):
        try:
            vals = {p.name: (_meta(p, strided) if isinstance(p, TensorProxy) else p.value) for p in inputs}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with torch.no_grad():
                    res = fn(*[vals[p.name] for p in inputs])
        except Exception:
            if not strided:
                return None  # the op does not run on meta tensors: the names decide
            hits.append(None)  # refuses strided arguments (view): aliases wherever it runs
            continue
        if not isinstance(res, (list, tuple)) or len(res) != len(outs):
            return None
        row = []
        for o, r in zip(outs, res):
            k = None
            if isinstance(o, TensorProxy) and isinstance(r, torch.Tensor):
                for i, a in enumerate(args):
                    t = vals.get(a.name)
                    if isinstance(a, TensorProxy) and isinstance(t, torch.Tensor) and (
                            r is t or (r.numel() and t.numel() and torch._C._is_alias_of(r, t))):
                        k = i
                        break
            row.append(k)
        hits.append(row)
    found = []
    for j in range(len(outs)):
        a = hits[0][j]
        b = hits[1][j] if hits[1] is not None else a
        if a is None and b is None:
            found.append(None)
        else:
            found.append((a if a is not None else b, a is not None and b is not None and a == b))
    return tuple(found)


def probe_stats() -> dict:
    """Counters of the probe cache (tests and benchmarks read them)."""
    return dict(_stats, cached=len(_cache))
