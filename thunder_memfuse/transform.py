"""The memfuse Thunder transform: trace in, regrouped bound symbols out.

Thunder calls transform_trace_post_optimization with each final trace (the
forward, then the backward; shared/THUNDER_NOTES.md).  We:
  1. hand the bound symbols to the C reader/planner (csrc/python/trace.c),
  2. rebuild the trace: prologue, then one bound symbol per planned group
     (a fusion bound symbol for groups of two or more ops), then the return,
  3. let Thunder's own del_last_used place the dels (and the backward's
     collection clears) for the new order.
Any failure leaves the user's trace unchanged with a RuntimeWarning, or raises
with MemFuse(strict=True).
"""
from __future__ import annotations

import time
import warnings

from thunder.core.compile_data import get_compile_data
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceProvenance, TraceTag, from_trace
from thunder.core.transform_common import Transform
from thunder.core import utils as tutils
from thunder.executors.passes import del_last_used
from thunder.executors.utils import Region
from thunder.core.proxies import unvariableify

from . import _thunder
from .executor import is_cuda_gemm, make_region_callable

_BACKENDS = ("auto", "cuda", "cpu")

# NOTE [replacing the fusion pass]: memfuse is a drop-in replacement for Thunder's
# fusion pass, not a post-processor of it.  nvFuser (Thunder's default fusion
# executor on CUDA when installed) and the general torch.compile executor fuse
# the joint trace before memfuse sees it, and memfuse keeps other executors'
# regions whole (docs/ARCHITECTURE.md), so with them in the executor list the
# horizontal fusion that raises the peak is already fixed in place.  Before
# Thunder claims ops for executors (transform_traces_pre_prologue runs first),
# memfuse therefore takes these two out of the compilation's executor list.
# Narrow fusion executors (torchcompile_cat, torchcompile_xentropy: one op
# family each) stay; their regions are planned as single ops.  The price: those
# passes also rematerialize between their own regions, which memfuse does not.
# So by default (replace_fusion="auto") they are replaced only where memfuse's
# own kernels take their work over: regions on (fuse not False), CUDA tensors
# in the trace, a CUDA device with the driver and NVRTC found, a backend other
# than "cpu".  Elsewhere taking nvFuser or torch.compile away would leave their
# work to single torch ops.  True
# replaces them everywhere; False keeps them and plans around their regions.
GENERAL_FUSION_EXECUTORS = ("nvfuser", "torchcompile")


class MemFuseError(RuntimeError):
    """Raised by MemFuse(strict=True) when the pass cannot run on a trace."""


class MemFuse(Transform):
    """Memory-aware reordering and fusion of Thunder traces.

    Args:
        max_states: cap on the exact DP's states (None: the core's default).
        strict: raise MemFuseError instead of warning and returning the trace unchanged.
        backend: "auto" (CUDA kernels for CUDA tensors, the CPU fallback otherwise),
            "cuda" (CUDA kernels; the fallback only where a kernel cannot be built),
            or "cpu" (always the fallback).
        fuse: "auto" (default): form fusion regions where they run as real kernels,
            that is on traces with CUDA tensors and a backend other than "cpu"; only
            reorder elsewhere (NOTE [fusion on CPU]).  True: always form regions
            (on CPU they run through the fallback).  False: only reorder.
        replace_fusion: "auto" (default): where memfuse's CUDA kernels can run, it is
            the compilation's fusion pass: nvFuser and the general torch.compile
            executor are taken out of its executor list (NOTE [replacing the fusion
            pass]); elsewhere they are kept.  True: take them out everywhere.
            False: keep them, and plan around their regions.

    The instance holds these options and, between an augmented forward and the
    backward Thunder hands over right after it, the names of the forward's
    saved activations; everything else it learns about a compilation is stored
    on the traces it returns (see report()), so one instance can serve many
    thunder.jit calls.
    """

    def __init__(self, *, max_states: int | None = None, strict: bool = False, backend: str = "auto",
                 fuse: bool | str = "auto", replace_fusion: bool | str = "auto"):
        super().__init__()
        if backend not in _BACKENDS:
            raise ValueError(f"MemFuse: backend must be one of {_BACKENDS}, got {backend!r}")
        if max_states is not None and (not isinstance(max_states, int) or max_states <= 0):
            raise ValueError(f"MemFuse: max_states must be a positive int or None, got {max_states!r}")
        self.max_states = max_states
        self.strict = bool(strict)
        self.backend = backend
        if fuse not in (True, False, "auto"):
            raise ValueError(f"MemFuse: fuse must be True, False or 'auto', got {fuse!r}")
        self.fuse = fuse
        if replace_fusion not in (True, False, "auto"):
            raise ValueError(f"MemFuse: replace_fusion must be True, False or 'auto', got {replace_fusion!r}")
        self.replace_fusion = replace_fusion

    def __repr__(self):
        return (f"MemFuse(max_states={self.max_states!r}, strict={self.strict!r}, backend={self.backend!r}, "
                f"fuse={self.fuse!r}, replace_fusion={self.replace_fusion!r})")

    # Thunder's hooks ----------------------------------------------------------------
    def transform_traces_pre_prologue(self, prologue_trace, computation_trace, epilogue_trace, **kwargs):
        """Runs before Thunder claims ops for executors: take the general fusion
        executors out of this compilation (NOTE [replacing the fusion pass]).
        The traces themselves are returned unchanged."""
        try:
            if self.replace_fusion is True or (self.replace_fusion == "auto" and self._replaces(computation_trace)):
                _replace_fusion_executors(get_compile_data())
        except Exception as e:  # the compilation goes on with its executors
            if self.strict:
                raise MemFuseError(f"memfuse could not replace the fusion executors: {e}") from e
            warnings.warn(f"memfuse kept the fusion executors: {type(e).__name__}: {e}", RuntimeWarning,
                          stacklevel=2)
        return prologue_trace, computation_trace, epilogue_trace

    def transform_trace_post_optimization(self, computation_trace, **kwargs):
        try:
            return self._transform(computation_trace)
        except Exception as e:  # never make the user's program wrong: keep the trace
            if self.strict:
                raise MemFuseError(f"memfuse failed on trace {_trace_name(computation_trace)!r}: {e}") from e
            warnings.warn(
                f"memfuse left trace {_trace_name(computation_trace)!r} unchanged: {type(e).__name__}: {e}",
                RuntimeWarning,
                stacklevel=2,
            )
            return computation_trace

    # -------------------------------------------------------------------------------
    def _replaces(self, computation_trace) -> bool:
        """replace_fusion="auto": will memfuse's own kernels take over the fusion of
        this trace?  Regions on (fuse not False), CUDA tensors in the trace, and the
        kernels can run in this process."""
        return (self.fuse is not False and _has_cuda_tensors(computation_trace.bound_symbols)
                and self._kernels_run_here())

    def _kernels_run_here(self) -> bool:
        """Can memfuse's generated kernels run in this process (NOTE [replacing the
        fusion pass])?  Any failure to tell counts as no."""
        if self.backend == "cpu":
            return False
        try:
            from .kernels import cuda_status

            st = cuda_status()
            return bool(st["can_run"] and st["torch_cuda"]["available"])
        except Exception:
            return False

    def _fuses(self, bsyms) -> bool:
        """NOTE [fusion on CPU]: the cost model says a region's inner values are
        never materialized, which holds for a generated kernel.  The CPU
        fallback runs the region's torch ops one by one, so its inner values do
        exist for a moment, while the region's inputs are held to its end: on
        CPU a region can only cost memory (and saves no time).  So by default
        regions are formed only where kernels run them."""
        if self.fuse != "auto":
            return bool(self.fuse)
        return self.backend != "cpu" and _has_cuda_tensors(bsyms)

    def _transform(self, trace):
        start = time.perf_counter_ns()
        is_backward = TraceTag.BACKWARD in trace.tags or trace.siginfo().name == "backward_fn"
        bsyms = list(trace.bound_symbols)
        freeable = None
        if TraceTag.AUGMENTED_FORWARD in trace.tags:
            # remembered for the backward, which Thunder hands over right after:
            # which saved tensors are activations, and which share a storage
            # (_thunder.py saved_storages, trace.c NOTE [saved storages])
            try:
                self._saved_activations = _thunder.saved_storages(trace)
            except Exception:  # then the backward treats every saved tensor as an input
                self._saved_activations = None
        elif is_backward:
            freeable, self._saved_activations = getattr(self, "_saved_activations", None), None
            freeable = _thunder.backward_freeable(freeable, trace)  # and the incoming gradients
        else:  # an inference forward: no backward follows
            self._saved_activations = None
        res = _thunder.plan_trace(bsyms, max_states=self.max_states, fuse=self._fuses(bsyms), freeable=freeable)
        plan = res["plan"]
        if plan["peak_bytes"] > plan["baseline_peak_bytes"]:
            raise MemFuseError("internal: planned order is worse than the input order")

        groups = [[b] for b in res["prologue"]] + res["groups"] + [[b] for b in res["epilogue"]]
        groups = _with_comments(bsyms, groups)
        new_trace, n_regions = regroup_trace(trace, groups, backend=self.backend, executor=self,
                                             is_backward=is_backward,
                                             region_of_one=None if self.backend == "cpu" else is_cuda_gemm)
        elapsed_ms = (time.perf_counter_ns() - start) / 1e6
        new_trace.set_provenance(
            TraceProvenance(
                f"memfuse (peak {plan['baseline_peak_bytes']} -> {plan['peak_bytes']} bytes, "
                f"{'proven optimal' if plan['optimal'] else 'not proven optimal'}, {n_regions} regions, "
                f"took {elapsed_ms:.1f} ms)"
            )
        )
        new_trace._memfuse_info = {
            "trace": "backward" if is_backward else "forward",
            "plan": plan,
            "graph": res["graph"],
            "names": res["names"],
            "saved_op": res.get("saved_op", False),  # op 0 makes the saved tensors (trace.c)
            "regions_before": sum(1 for b in bsyms if getattr(b.sym, "is_fusion", False)),
            "regions_after": n_regions + sum(
                1 for g in res["groups"] if len(g) == 1 and getattr(g[0].sym, "is_fusion", False)),
            "ops": sum(len(g) for g in res["groups"]),
            "time_ms": elapsed_ms,
            "replaced_executors": list(getattr(get_compile_data(), "_memfuse_replaced", ())),
        }
        return new_trace


def regroup_trace(trace, groups, *, backend, executor, is_backward, name_prefix="MemFuse", region_of_one=None):
    """A new trace whose bound symbols are `groups` in order: a group of one stays
    as it is (unless region_of_one(bsym) says it runs as a region of its own,
    executor.py NOTE [gemm regions]), a larger group becomes one fusion bound
    symbol (inputs and outputs from Thunder's Region); dels and collection
    clears are placed by Thunder's del_last_used.  Returns (trace, number of
    fusion regions made)."""
    stripped = from_trace(trace)
    stripped.bound_symbols = [b for g in groups for b in g]
    producers, consumers = tutils.producers_and_consumers(stripped)
    new_bsyms = []
    n_regions = 0  # also numbers the regions: names are per trace, like Thunder's own fusion passes
    for group in groups:
        if len(group) == 1 and not (region_of_one and region_of_one(group[0])):
            new_bsyms.append(group[0])
            continue
        region = Region(producers, consumers, list(group))
        inputs = sorted((unvariableify(x) for x in region.inputs), key=lambda p: p.name)
        outputs = sorted((unvariableify(x) for x in region.outputs), key=lambda p: p.name)
        name = f"{name_prefix}{n_regions}"
        fn = make_region_callable(name, list(group), inputs, outputs, backend=backend)
        # the meta lets Thunder re-run the symbol on proxies (check_traces)
        sym = Symbol(name, meta=_outputs_meta(tuple(outputs)), is_fusion=True, executor=executor)
        new_bsyms.append(BoundSymbol(sym, tuple(inputs), {}, tuple(outputs), list(group), _call_ctx={name: fn}))
        n_regions += 1
    new_trace = from_trace(trace)
    new_trace.bound_symbols = new_bsyms
    return del_last_used(new_trace, clear_mutable_collections=is_backward), n_regions


def _with_comments(bsyms, groups):
    """Put back the comments (dropped by the reader) that other transforms left:
    each one goes just before the step holding the bound symbol that followed it."""
    from thunder.core.prims import PrimIDs

    before, pending = {}, []
    for b in bsyms:
        if b.sym.id == PrimIDs.COMMENT:
            pending.append(b)
        elif pending and b.sym.id not in _thunder.DROP_IDS:
            before[id(b)] = pending
            pending = []
    if not before and not pending:
        return groups
    out = []
    for g in groups:
        for b in g:
            out.extend([c] for c in before.get(id(b), ()))
        out.append(g)
    if pending:  # trailing comments: before the return, which stays last
        out[len(out) - 1:len(out) - 1] = [[c] for c in pending]
    return out


def _replace_fusion_executors(cd) -> None:
    """Drop GENERAL_FUSION_EXECUTORS from compile data `cd` (None: not inside a
    thunder.jit compilation, nothing to do); remember their names on it."""
    if cd is None:
        return
    executors = tuple(cd.executors_list)
    kept = tuple(ex for ex in executors if ex.name not in GENERAL_FUSION_EXECUTORS)
    if len(kept) != len(executors):
        cd._memfuse_replaced = tuple(ex.name for ex in executors if ex.name in GENERAL_FUSION_EXECUTORS)
        cd.executors_list = kept


def _has_cuda_tensors(bsyms) -> bool:
    from thunder.core.proxies import TensorProxy

    return any(isinstance(p, TensorProxy) and p.device.type == "cuda" for b in bsyms for p in b.flat_proxy_outs)


def _outputs_meta(outputs):
    def meta(*args, **kwargs):
        return outputs

    return meta


def _trace_name(trace) -> str:
    try:
        return trace.siginfo().name
    except Exception:
        return "<trace>"


memfuse = MemFuse()
"""The default memfuse transform: thunder.jit(fn, transforms=[memfuse])."""
