"""The interface every region compiler implements, and the checks they share.

A region compiler is a module of this package (nvrtc, torchcompile, nvfuser, fallback) that
satisfies RegionCompiler: regions.compiler(name) returns it.  transform.py and executor.py only
ask it questions (compiles_regions, available, fusible, epilogue_role, region_of_one, accepts,
build); neither knows a compiler by name.

A Group is what build() gets: one planned group of bound symbols with its name, its inputs and
outputs, and its kind.  The kind comes from the plan (csrc/core/mf_core.h NOTE [group kinds]: the
core decides it when it groups, the plan dict carries it as plan["kinds"]); region_kind turns it
into the kind of region, the one place a compiler's choice enters:

    plan's kind   region kind
    "single"      ONE where the compiler's region_of_one(bsym) holds (nvrtc's cuBLAS GEMMs), else
                  no region: the op runs as it is
    "region"      REGION    two or more fusible ops, compiled as one region
    "epilogue"    EPILOGUE  [gemm, act], act run as gemm's epilogue (the planner forms such pairs
                            only from the candidates of the compiler's epilogue_role: mf_build.c
                            NOTE [epilogue candidates], mf_fuse.c NOTE [epilogue pairs])

Shared helpers: tensor_op (the opening checks of every `fusible`), pure (no random draw, no
ordered effect), epilogue_result (the checks every epilogue_pair starts with), region_trace (a
TraceCtx holding a list of bound symbols) and predicate (a per-symbol predicate that answers no
where it raises, logged once per reason).
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

# the plan's kinds (csrc/core/mf_core.h NOTE [group kinds], the names plan.c gives them)
SINGLE = "single"
REGION = "region"
EPILOGUE = "epilogue"
# the region kind of a single op that the compiler runs as a region (region_of_one)
ONE = "one"


@dataclass(frozen=True)
class Group:
    """One group of the plan, as a compiler builds it."""

    name: str
    bsyms: tuple
    inputs: tuple
    outputs: tuple
    kind: str = REGION
    # NOTE [donated inputs] (integration/_regroup.py): positions of inputs whose storage dies with this
    # region, which its program may write over: `donated` always, `donated_saved` (the forward's saved
    # activations) only where the running backward does not keep its graph.  A compiler may ignore both.
    donated: tuple = ()
    donated_saved: tuple = ()


class InputsWritten(Exception):
    """A region's compiled program raised after it may have written over its donated inputs (Group's
    `donated`): the op-by-op fallback cannot run it again on them, so executor.make_region_callable
    lets this through instead of falling back."""


@runtime_checkable
class RegionCompiler(Protocol):
    """What builds the callable of a memfuse region (one module per compiler in regions/)."""

    name: str
    # does it compile regions at all?  The fallback does not: it only runs a region's ops
    compiles_regions: bool
    # NotImplementedError from build() or a call is a case the compiler does not cover, expected
    # and only logged; otherwise it is a failure like any other (executor.make_region_callable)
    expects_unsupported: bool

    def available(self, cuda: bool) -> bool:
        """Can it build regions of a trace here (cuda: the trace holds CUDA tensors)?"""

    def fusible(self, bsym) -> int:
        """May bsym be part of a region: 0 no, 1 yes, 2 yes with its tensors stored
        (regions/torchcompile.py NOTE [extern ops in regions])?"""

    def epilogue_role(self, bsym) -> int:
        """_C.EPI_HEAD (its kernel can apply an epilogue to its one output) and/or _C.EPI_TAIL
        (it can be applied as one); the core pairs them (csrc/core/mf_build.c NOTE [epilogue
        candidates])."""

    def epilogue_pair(self, gemm, act) -> bool:
        """May `act` run as the epilogue of `gemm`, the two as one region?  The roles, and `act`
        reading `gemm`'s result alone (pair_by_roles)."""

    def region_of_one(self, bsym) -> bool:
        """Does this lone op run as a region of its own?"""

    def accepts(self, args: Sequence[Any]) -> bool:
        """Can the built region take these call arguments (else that call runs the fallback)?"""

    def build(self, group: Group) -> Callable:
        """The region's callable: (*args) -> list of outputs."""


def region_kind(plan_kind: str, bsyms, compiler: RegionCompiler):
    """The kind of region planned group `bsyms` is, given its kind in the plan (SINGLE, REGION or
    EPILOGUE); None: no region, its one op runs as it is.  A single op is a region (ONE) only
    where `compiler` runs it as one (region_of_one); the plan's other kinds are taken as they
    are, never worked out again from the bound symbols."""
    if plan_kind == SINGLE:
        if len(bsyms) != 1:
            raise ValueError(f"memfuse: a group of {len(bsyms)} ops has the plan's kind {SINGLE!r}")
        return ONE if compiler.region_of_one(bsyms[0]) else None
    if plan_kind == EPILOGUE and len(bsyms) != 2:
        raise ValueError(f"memfuse: an epilogue group of {len(bsyms)} ops")
    if plan_kind in (REGION, EPILOGUE):
        return plan_kind
    raise ValueError(f"memfuse: unknown group kind {plan_kind!r}")


def make_group(name, bsyms, inputs, outputs, kind: str, donated=(), donated_saved=()) -> Group:
    """The Group of bound symbols `bsyms` as a region of kind `kind` (REGION, ONE or EPILOGUE:
    what region_kind gives for the plan's kind)."""
    if kind not in (REGION, ONE, EPILOGUE):
        raise ValueError(f"memfuse: {kind!r} is no region kind (one of {REGION!r}, {ONE!r}, {EPILOGUE!r})")
    return Group(name, tuple(bsyms), tuple(inputs), tuple(outputs), kind, tuple(donated), tuple(donated_saved))


# ------------------------------------------------------------------------------------------
# The defaults of a compiler that has no such case


def never(*args) -> bool:
    return False


def always(*args) -> bool:
    return True


# ------------------------------------------------------------------------------------------
# Shared checks


def tensor_op(bsym) -> bool:
    """The opening check of every compiler's `fusible`: bsym is not a fusion of its own and has
    outputs, all of them tensors."""
    from thunder.core.proxies import TensorProxy

    if getattr(bsym.sym, "is_fusion", False):
        return False
    outs = [o for o in bsym.flat_outs if o is not None]
    return bool(outs) and all(isinstance(o, TensorProxy) for o in outs)


def pure(bsym) -> bool:
    """Neither draws random numbers nor has an ordered effect (_symbols.py NOTE [random ops],
    mf_build.c NOTE [ordering edges]): a compiled region would change its numbers or its order."""
    from .. import _symbols

    return not _symbols.is_random(bsym) and not _symbols.effects(bsym)


def same_as_one_read(act) -> bool:
    """act makes one tensor, reads one tensor (any number of times) and nothing else sized, and
    its result has that tensor's shape and dtype: what an epilogue tail must be."""
    from thunder.core.proxies import TensorProxy

    outs = [o for o in act.flat_proxy_outs if isinstance(o, TensorProxy)]
    reads = {p.name: p for p in act.flat_proxy_args if isinstance(p, TensorProxy)}
    if len(outs) != 1 or len(reads) != 1:
        return False
    (x,) = reads.values()
    return tuple(x.shape) == tuple(outs[0].shape) and x.dtype == outs[0].dtype


def pair_by_roles(role, gemm, act) -> bool:
    """The epilogue pair the core would form from `role` (a compiler's epilogue_role): gemm a head,
    act a tail that reads gemm's one result alone."""
    from .. import _C

    if not (role(gemm) & _C.EPI_HEAD) or not (role(act) & _C.EPI_TAIL):
        return False
    return epilogue_result(gemm, act) is not None


def epilogue_result(gemm, act):
    """The checks every epilogue_pair starts with: gemm and act make one tensor each, act reads
    no tensor but gemm's, and the two have one shape and dtype.  Returns gemm's tensor, or None."""
    from thunder.core.proxies import TensorProxy

    g = [o for o in gemm.flat_proxy_outs if isinstance(o, TensorProxy)]
    a = [o for o in act.flat_proxy_outs if isinstance(o, TensorProxy)]
    if len(g) != 1 or len(a) != 1:
        return None
    reads = [p for p in act.flat_proxy_args if isinstance(p, TensorProxy)]
    if not all(p.name == g[0].name for p in reads):
        return None
    if tuple(g[0].shape) != tuple(a[0].shape) or g[0].dtype != a[0].dtype:
        return None
    return g[0]


def region_trace(name: str, bsyms, inputs, outputs, *, unpack: bool = False):
    """A TraceCtx `name(*inputs)` whose body is `bsyms`, returning `outputs` (unpack: the inputs
    are unpacked first, as in a trace Thunder's executors transform)."""
    from thunder.core import prims
    from thunder.core.codeutils import SigInfo
    from thunder.core.trace import TraceCtx, tracectx

    inputs = list(inputs)
    trace = TraceCtx(None)
    trace.args = inputs
    trace.kwargs = {}
    if unpack:
        trace.names = {a.name for a in inputs}
        with tracectx(trace):
            for a in inputs:
                prims.unpack_trivial(a, name=a.name)
    trace.bound_symbols += list(bsyms)
    trace.bound_symbols.append(prims.python_return.bind(list(outputs), output=None))
    trace._siginfo = SigInfo(name)
    trace._siginfo.args = [(a.name, None) for a in inputs]
    return trace


# ------------------------------------------------------------------------------------------
# Predicates that must not raise

_reasons: set = set()
_reasons_lock = threading.Lock()


def predicate(default):
    """Decorate a per-bound-symbol predicate (fusible, epilogue_pair, ...): where it raises, the
    answer is `default` (no: the op stays out of regions, which is never wrong) and the reason is
    logged as a WARNING on the "thunder_memfuse" logger, once per predicate, symbol and
    exception type (the C reader asks for every bound symbol of every trace)."""

    def wrap(fn):
        @functools.wraps(fn)
        def checked(*bsyms):
            try:
                return fn(*bsyms)
            except Exception as e:
                _say_once(fn, bsyms, e)
                return default

        return checked

    return wrap


def first_time(key) -> bool:
    """True the first time `key` is seen in this process (thread-safe): what says a reason once."""
    with _reasons_lock:
        if key in _reasons:
            return False
        _reasons.add(key)
        return True


def _say_once(fn, bsyms, e) -> None:
    ops = tuple(str(getattr(getattr(b, "sym", None), "name", b)) for b in bsyms)
    if not first_time((fn.__module__, fn.__qualname__, ops, type(e).__name__)):
        return
    from .._options import LOG

    LOG.warning("memfuse: %s.%s(%s) raised %s: %s; taken as no (those ops are not fused)", fn.__module__.rsplit(".", 1)[-1],
                fn.__qualname__, ", ".join(ops), type(e).__name__, e)
