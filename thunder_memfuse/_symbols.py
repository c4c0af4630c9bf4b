"""What thunder_memfuse knows about Thunder's symbols.

The C trace reader (csrc/python/trace.c) knows no symbol by name; this module
holds the sets and predicates that classify bound symbols, which
integration/_records.py turns into one record per bound symbol (NOTE [op
records]) and the region compilers (regions/) ask.  Everything here is read
from Thunder itself (prims.PrimIDs, OpTags, ltorch's view tables) so it follows
the installed Thunder.  A base module: it imports no other layer of the package
(integration/_planning.py hands a trace to the planner).
"""
from __future__ import annotations

import thunder.torch as ltorch
from thunder.core.prims import OpTags, PrimIDs
from thunder.core.proxies import FutureTensorProxy, TensorProxy
from thunder.core.symbol import gather_tags

from . import _C
from ._memo import memoized

# Dropped by the reader and re-created by del_last_used on the new order.
DROP_IDS = frozenset({PrimIDs.DEL, "clear_mutable_collection", PrimIDs.COMMENT})
# Kept first when they lead the trace (the prologue); their outputs are graph inputs.
PROLOGUE_IDS = frozenset(getattr(PrimIDs, n) for n in dir(PrimIDs) if n.startswith("UNPACK"))
RETURN_IDS = frozenset({PrimIDs.RETURN})

# NOTE [view names]: a tensor output of these symbols shares its first tensor
# argument's storage.  `to` and `contiguous` are left out: they allocate unless
# they are no-ops, and counting an allocation that does not happen only makes
# the plan conservative.
_MAY_COPY = {"to", "contiguous", "type_as"}
_VIEW_BASE = frozenset(
    {s.name for s in ltorch._syms_returning_views | ltorch._syms_that_may_return_views if s.name not in _MAY_COPY}
    | {"broadcast_in_dim", "reshape", "transpose", "squeeze", "slice", "slice_prim", "view", "shallow_copy",
       "expand", "permute", "unsqueeze", "flatten", "split", "chunk", "getitem", "select"}
)
# The torch executor runs some view prims under names of its own
# (torch_prims_reshape_impl, torch_slice_prim_impl): the final trace holds those.
def _with_impls(names) -> frozenset:
    return frozenset(names) | frozenset(
        f for n in names for f in (f"torch_prims_{n}_impl", f"torch_{n}_prim_impl", f"torch_{n}_impl"))


VIEW_NAMES = _with_impls(_VIEW_BASE)
# views whose elements keep their storage's linear order, all of them (of a dense storage)
ORDER_KEEPING_VIEW_NAMES = _with_impls({"reshape", "view", "unsqueeze", "squeeze", "flatten", "shallow_copy", "to",
                                        "type_as", "convert_element_type"})



def is_view(bsym) -> bool:
    """Does bsym's tensor output share its first tensor argument's storage?
    A view op by name (VIEW_NAMES), or a conversion that is a no-op: `to` or
    `type_as` to the argument's own dtype and device, which returns the
    argument itself unless a copy is asked for."""
    name = bsym.sym.name
    if name in VIEW_NAMES:
        return True
    if name not in ("to", "type_as"):
        return False
    if bsym.kwargs.get("copy") or bsym.kwargs.get("memory_format") not in (None, _preserve_format()):
        return False
    args = [a for a in bsym.flat_proxy_args if isinstance(a, TensorProxy)]
    outs = [o for o in bsym.flat_proxy_outs if isinstance(o, TensorProxy)]
    if not args or len(outs) != 1:
        return False
    a, o = args[0], outs[0]
    return a.dtype == o.dtype and a.device == o.device and tuple(a.shape) == tuple(o.shape)


def _preserve_format():
    import torch

    return torch.preserve_format


_ORDER_TAGS = frozenset(
    {OpTags.RANDOM_OP, OpTags.DONT_DCE, OpTags.DEVICE_SYNC_OP, OpTags.IN_PLACE, OpTags.CTX_MANAGER_ENTER_EXIT_OP}
)
_WRITE_TAGS = frozenset({OpTags.IN_PLACE, OpTags.DONT_DCE})
_WRITE_IDS = frozenset({PrimIDs.COPY_, PrimIDs.COPY_WITH_SETITEM})


def _ids(bsym):
    yield bsym.sym.id
    for s in bsym.subsymbols:
        yield from _ids(s)


# NOTE [random ops]: an op whose result depends on the RNG state must keep its
# place among the other such ops, or a fixed seed gives different numbers than
# plain Thunder.  The final trace does not tag them (an executor's `uniform`
# carries no RANDOM_OP tag and no subsymbols), so they are found by what they
# are: the symbol's name or id, at any depth, with any executor prefix
# ("torch.bernoulli", "PrimIDs.UNIFORM") removed.  Over-matching only adds an
# ordering edge, which never makes a program wrong.  effects() marks them ordered, and
# an op with an effect never joins a region (_records.py NOTE [op records]), so
# no region compiler draws them its own way.
RANDOM_NAMES = frozenset(
    {
        "uniform", "uniform_", "uniform_like", "uniform_philox", "rand", "rand_like", "randn", "randn_like",
        "randint", "randint_like", "randperm", "bernoulli", "bernoulli_", "multinomial", "normal", "normal_",
        "exponential", "exponential_", "poisson", "random_", "cauchy_", "geometric_", "log_normal_",
        "dropout", "dropout1d", "dropout2d", "dropout3d", "native_dropout", "alpha_dropout",
        "feature_alpha_dropout", "feature_dropout", "rrelu", "get_and_update_rng_state", "get_rng_state",
        "set_rng_state", "manual_seed", "seed",
    }
)


def _base_name(x) -> str:
    return str(x).rsplit(".", 1)[-1].lower()


@memoized
def is_random(bsym) -> bool:
    """Does bsym (or anything it is made of) draw from or touch the RNG state?"""
    stack = [bsym]
    while stack:
        b = stack.pop()
        for n in (_base_name(b.sym.id), _base_name(b.sym.name)):
            if n in RANDOM_NAMES or "philox" in n or "rng" in n:
                return True
        stack.extend(b.subsymbols)
    return False


@memoized
def effects(bsym) -> int:
    """Ordering flags of a bound symbol (csrc/core/mf_build.c NOTE [ordering edges]
    and NOTE [collectives])."""
    comm = comm_kind(bsym)
    if comm == "issue":
        # NOTE [collectives]: kept in trace order by the core, placed for overlap;
        # an all_reduce told to skip its clone reduces its argument in place
        return _C.EFF_COMM | (_C.EFF_WRITES if _may_write_in_place(bsym) else 0)
    if comm == "wait":
        return _C.EFF_WAIT
    tags = gather_tags(bsym)
    flags = 0
    ids = set(_ids(bsym))
    if not _ORDER_TAGS.isdisjoint(tags) or PrimIDs.ITEM in ids or _is_collective(bsym) or is_random(bsym):
        flags |= _C.EFF_ORDERED
    if not _WRITE_TAGS.isdisjoint(tags) or not _WRITE_IDS.isdisjoint(ids):
        flags |= _C.EFF_WRITES
    return flags


def _is_collective(bsym) -> bool:
    mod = getattr(bsym.sym, "module", None)
    modname = getattr(mod, "__name__", "") or ""
    if "distributed" in modname or "distributed" in str(bsym.sym.id):
        return True
    return any(isinstance(o, FutureTensorProxy) for o in bsym.flat_proxy_outs)


@memoized
def comm_kind(bsym) -> str | None:
    """"issue" for an asynchronous collective (it returns futures and nothing
    else), "wait" for a wait on one future (it reads a future and returns
    tensors), else None.  Told apart by their proxies, which every executor's
    version of Thunder's distributed prims keeps; any other distributed symbol
    (synchronize, pack, a blocking collective) stays an ordered op."""
    outs = bsym.flat_proxy_outs
    if outs and all(isinstance(o, FutureTensorProxy) for o in outs):
        return "issue"
    args = [a for a in bsym.flat_proxy_args if isinstance(a, (TensorProxy, FutureTensorProxy))]
    if (len(args) == 1 and isinstance(args[0], FutureTensorProxy) and outs
            and all(isinstance(o, TensorProxy) for o in outs)):
        return "wait"
    return None


def _may_write_in_place(bsym) -> bool:
    """An all_reduce with skip_clone=True reduces its argument in place (Thunder's
    torch executor); the other collectives write a new tensor."""
    if "all_reduce" not in _base_name(bsym.sym.name):
        return False
    args, kwargs = bsym.args, bsym.kwargs or {}
    skip = args[4] if len(args) >= 5 else kwargs.get("skip_clone", False)
    return skip is not False and skip != 0  # unknown (a proxy): assume it does


__all__ = ["is_view", "effects", "comm_kind", "is_random", "RANDOM_NAMES", "VIEW_NAMES", "DROP_IDS", "PROLOGUE_IDS", "RETURN_IDS"]
