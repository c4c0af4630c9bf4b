"""The memfuse Thunder transform: trace in, regrouped bound symbols out.

Thunder calls transform_trace_post_optimization with each final trace (the
forward, then the backward; docs/ARCHITECTURE.md).  We:
  1. hand the bound symbols to the C reader/planner (csrc/python/trace.c),
  2. rebuild the trace: prologue, then one bound symbol per planned group
     (a fusion bound symbol for groups of two or more ops), then the return,
  3. let Thunder's own del_last_used place the dels (and the backward's
     collection clears) for the new order.
Any failure leaves the user's trace unchanged with a MemFuseWarning (a
RuntimeWarning, at the user's line), or raises MemFuseError with
MemFuse(strict=True).
"""
from __future__ import annotations

import logging
import time
from abc import ABCMeta

from thunder.core.compile_data import get_compile_data
from thunder.core.trace import TraceProvenance, TraceTag
from thunder.core.transform_common import Transform

from .. import _C, _options, _symbols, regions
from . import _misuse, _planning, _recompute, _step, attention, attention_match, broadcasts
from .._options import LOG
from ..errors import MemFuseError, warn as _warn
from ._regroup import _planned_groups, _with_comments, regroup_trace
from .executor import memfuse_ex

# NOTE [replacing the fusion pass]: memfuse is a drop-in replacement for Thunder's
# fusion pass, not a post-processor of it.  nvFuser (Thunder's default fusion
# executor on CUDA when installed) and the general torch.compile executor fuse
# the joint trace before memfuse sees it, and memfuse keeps other executors'
# regions whole (docs/ARCHITECTURE.md), so with them in the executor list the
# horizontal fusion that raises the peak is already fixed in place.  Before
# Thunder claims ops for executors (transform_traces_pre_prologue runs first),
# memfuse therefore takes these two out of the compilation's executor list and
# puts its own fusion executor (executor.memfuse_ex) where the first of them was.
# That executor claims what memfuse's region compiler can hold and runs NOTE
# [memfuse fusion pass] on the joint trace: the replaced pass's grouping and
# Thunder's rematerialization, so the same activations are saved for the backward
# as with the executor it replaces.  Narrow fusion executors (torchcompile_cat,
# torchcompile_xentropy: one op family each) stay; their regions are planned as
# single ops.  By default (replace_fusion="auto") the replacement happens where
# memfuse's regions are really compiled: regions on (fuse not False) and a
# compiler that works for the trace (nvrtc for CUDA tensors, else torch.compile,
# else nvFuser: regions.resolve; on a CPU, executors=["torchcompile"] with memfuse
# means memfuse's regions compiled by torch.compile: regions NOTE [auto on CPU]).
# With only the op-by-op fallback, taking nvFuser
# or torch.compile away would leave their work to single torch ops.  True
# replaces them everywhere; False keeps them and plans around their regions.
GENERAL_FUSION_EXECUTORS = ("nvfuser", "torchcompile")


# MemFuseError: raised by MemFuse(strict=True) when the pass cannot run on a trace
# (the C binding's base error, thunder_memfuse.errors).

# NOTE [the class passed as a transform]: thunder.jit(fn, transforms=[MemFuse]) (the class, not
# an instance) used to fail deep inside Thunder, whose first step is check_type(transform,
# Transform).  MemFuse's metaclass is registered as a virtual Transform, so the class passes
# that check, and Thunder's first call of a hook on it (transform_module at jit time for a
# module, transform_traces_pre_prologue at the first call for a function) meets _instance_only,
# which raises a TypeError naming the fix.  On an instance the hooks are ordinary methods.


class _MemFuseType(ABCMeta):
    pass


Transform.register(_MemFuseType)


class _instance_only:
    """A Thunder hook of MemFuse: a method on an instance, a clear TypeError on the class."""

    def __init__(self, fn):
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, cls=None):
        if obj is not None:
            return self.fn.__get__(obj, cls)
        cname = getattr(cls, "__name__", "MemFuse")

        fn = self.fn

        def class_passed(*args, **kwargs):
            if args and isinstance(args[0], cls):  # called through the class on an instance (super(), Thunder)
                return fn(*args, **kwargs)
            raise TypeError(f"thunder.jit(..., transforms=[{cname}]) passes the class {cname}, not a transform: "
                            f"use transforms=[memfuse] (thunder_memfuse.memfuse, the default instance) or "
                            f"transforms=[{cname}(...)] with options")

        class_passed.__doc__ = self.fn.__doc__
        return class_passed


class MemFuse(_misuse.MisuseHints, Transform, metaclass=_MemFuseType):
    """Memory-aware reordering and fusion of Thunder traces.

    Args:
        max_states: cap on the exact DP's states: None (the core's default) or an int in
            [1, 2**63 - 1], checked exactly as plan() checks it.  The DP also stops at a
            memory budget, whatever the cap.
        strict: raise MemFuseError instead of warning and returning the trace unchanged.
        kernels: what compiles the regions (thunder_memfuse.regions): "auto" (default:
            "nvrtc" for CUDA traces where the driver and NVRTC are found, else
            "torchcompile" where torch.compile works, else the fallback, with one
            warning), "nvrtc" (memfuse's own CUDA kernels), "torchcompile" (Thunder's
            torch.compile executor: Inductor C++ on CPU, Triton on GPU), "nvfuser"
            (where installed) or "fallback" (the region's ops one by one).  What a
            region may hold follows the compiler (with torchcompile: reductions,
            norms, softmax, matmuls, ...).
            A forced compiler that cannot work for a trace (kernels="nvrtc" on CPU
            tensors, "torchcompile" without a C++ compiler) warns once and runs the
            fallback; with strict=True it raises MemFuseError.
        backend: deprecated spelling of kernels: "cpu" is kernels="fallback", "cuda" is
            kernels="nvrtc" (a DeprecationWarning; a contradicting kernels= is a ValueError).
        fuse: "auto" (default): form fusion regions where a compiler builds them
            (NOTE [fusion on CPU]); only reorder elsewhere.  True: always form regions
            (not with kernels="fallback": ValueError).  False: only reorder.
        replace_fusion: "auto" (default): where memfuse's regions are compiled, it is
            the compilation's fusion pass: nvFuser and the general torch.compile
            executor are replaced by memfuse's own fusion executor, which keeps their
            rematerialization (NOTE [replacing the fusion pass]); elsewhere they are
            kept.  True: replace them everywhere (not with fuse=False or
            kernels="fallback": ValueError).  False: keep them, and plan around their regions.
        comm_overlap: True (default): in traces with asynchronous collectives (Thunder's
            DDP and FSDP), issue each collective as early and run each wait as late as
            the graph allows without raising the planned peak (csrc/core/mf_comm.c
            NOTE [collective overlap]); the collectives keep Thunder's order.  False:
            leave them where the memory plan puts them.
        recompute: "auto" (default) or True: where a cheap op's result is kept alive across the
            peak, run the op again right before its later readers (csrc/core/mf_remat.c NOTE
            [recomputation]), if that lowers the planned peak; the copies may write at most a
            share of what the trace's ops write (integration/_recompute.py DEFAULT_SHARE).  A
            float: that share instead.  False: never.
        memory_budget: "auto" (default): each trace gets the lowest plan memfuse finds.  A number
            of bytes: each trace gets, among the plans memfuse finds, the one with the least
            recomputation (the fewest bytes its copies write) whose planned peak is at most
            that (csrc/core/mf_pipeline.c NOTE [peak target]); so a generous budget buys speed
            (fewer ops run twice), and a smaller budget never gives a higher plan.  The planned
            peak is the one report() gives: a trace's live bytes above what the caller holds
            (parameters, the batch, optimizer state), a backward's saved activations included;
            a training step fits where its forward and backward both do.  Where no plan fits,
            the lowest one, with a MemFuseWarning that names the shortfall.  The copies stay
            within what `recompute` allows.  Where memfuse is the fusion pass and the step's
            planned peak is above the budget, fewer activations are saved: saved tensors are
            rebuilt in the backward, the least work per freed byte first
            (integration/_saved_set.py NOTE [the saved set]).

    The instance holds these options only.  What it learns about a compilation
    is stored on that compilation's compile data (the forward's saved
    activations, for the backward Thunder hands over right after it) and on
    the traces it returns (see report()), so one instance can serve many
    thunder.jit calls.
    """

    def __init__(self, *, max_states: int | None = None, strict: bool = False, backend: str = "auto",
                 fuse: bool | str = "auto", replace_fusion: bool | str = "auto", kernels: str = "auto",
                 comm_overlap: bool = True, recompute: bool | str | float = "auto",
                 memory_budget: int | str = "auto", _fallback_regions: bool = False):
        super().__init__()
        # _fallback_regions (tests only): form regions with kernels="fallback" and run them op by op
        self.kernels = _options.check_options(kernels=kernels, backend=backend, fuse=fuse,
                                              replace_fusion=replace_fusion, comm_overlap=comm_overlap,
                                              fallback_regions=_fallback_regions)
        self.max_states = _C._validate_max_states(max_states)  # the same check as plan()'s
        self.strict = _options.check_bool("strict", strict)
        self.fuse = fuse
        self.replace_fusion = replace_fusion
        self.comm_overlap = comm_overlap
        self.recompute = _options.check_recompute(recompute)
        self.memory_budget = _options.check_memory_budget(memory_budget)

    def __repr__(self):
        return (f"MemFuse(max_states={self.max_states!r}, strict={self.strict!r}, "
                f"fuse={self.fuse!r}, replace_fusion={self.replace_fusion!r}, kernels={self.kernels!r}, "
                f"comm_overlap={self.comm_overlap!r}, recompute={self.recompute!r}, "
                f"memory_budget={self.memory_budget!r})")

    # Thunder's hooks ----------------------------------------------------------------
    @_instance_only
    def transform_module(self, model):
        """Thunder's module hook: nothing to do (the class passed instead of an instance is
        refused here, at thunder.jit(module, ...) time: NOTE [the class passed as a transform])."""
        return super().transform_module(model)

    @_instance_only
    def transform_traces_pre_prologue(self, prologue_trace, computation_trace, epilogue_trace, **kwargs):
        """Runs before Thunder claims ops for executors: take the general fusion
        executors out of this compilation (NOTE [replacing the fusion pass]).
        The traces themselves are returned unchanged."""
        _one_memfuse(get_compile_data())
        if _options.disabled():
            LOG.info("memfuse is off (%s=0): traces left as Thunder made them", _options.ENV)
            return prologue_trace, computation_trace, epilogue_trace
        try:
            attention.add_to(get_compile_data())  # attention.py NOTE [attention kept whole]
            if self.replace_fusion is True or (self.replace_fusion == "auto" and self._replaces(computation_trace)):
                _replace_fusion_executors(get_compile_data())
        except Exception as e:  # the compilation goes on with its executors
            if self.strict:
                raise MemFuseError(f"memfuse could not replace the fusion executors: {e}") from e
            _warn(f"memfuse kept the fusion executors: {type(e).__name__}: {e}")
        try:  # broadcasts.py NOTE [broadcasts kept small]
            computation_trace, _ = broadcasts.keep_broadcasts_small(computation_trace)
        except Exception as e:  # the ops stay as the user wrote them
            if self.strict:
                raise MemFuseError(f"memfuse could not keep broadcasts small: {e}") from e
            _warn(f"memfuse left elementwise ops on broadcasts as they are: {type(e).__name__}: {e}")
        try:  # attention_match.py NOTE [attention written out]
            computation_trace, n = attention_match.match_attention(computation_trace)
            attention.note_written_out(get_compile_data(), n)
            computation_trace, _ = attention_match.keep_apart_from_writes(computation_trace)  # NOTE [attention read again]
        except Exception as e:  # the chains stay as the user wrote them
            if self.strict:
                raise MemFuseError(f"memfuse could not match attention written out: {e}") from e
            _warn(f"memfuse left attention written out as it is: {type(e).__name__}: {e}")
        return prologue_trace, computation_trace, epilogue_trace

    @_instance_only
    def transform_trace_post_optimization(self, computation_trace, **kwargs):
        if _options.disabled():
            return computation_trace
        try:
            with _planning.collector_paused():  # _planning.py NOTE [collector paused]
                return self._transform(computation_trace)
        except Exception as e:  # never make the user's program wrong: keep the trace
            if self.strict:
                raise MemFuseError(f"memfuse failed on trace {_trace_name(computation_trace)!r}: {e}") from e
            _warn(f"memfuse left trace {_trace_name(computation_trace)!r} unchanged: {type(e).__name__}: {e}")
            return computation_trace

    # -------------------------------------------------------------------------------
    def _replaces(self, computation_trace) -> bool:
        """replace_fusion="auto": will memfuse's compiled regions take over the fusion
        of this trace?  Regions on (fuse not False) and a compiler that works here."""
        bsyms = computation_trace.bound_symbols
        if self.fuse is False:
            return False
        return self._compiles(regions.resolve(self.kernels, cuda=_has_cuda_tensors(bsyms), quiet=True), bsyms)

    def _compiler_for(self, bsyms) -> str:
        """The region compiler for a trace (regions.resolve; a forced compiler that cannot work
        here warns once, or raises with strict=True)."""
        return regions.resolve(self.kernels, cuda=_has_cuda_tensors(bsyms), compiling_peer=_compiling_peer(),
                               strict=self.strict)

    @staticmethod
    def _compiles(compiler: str, bsyms) -> bool:
        return regions.compiles(compiler, _has_cuda_tensors(bsyms))

    def _fusible_for(self, bsyms):
        """What a region may hold: the chosen compiler's predicate (the fallback's regions, formed
        only on request, hold what a generated kernel could: regions/fallback.py)."""
        return regions.compiler(self._compiler_for(bsyms)).fusible

    def _fuses(self, bsyms, compiler: str) -> bool:
        """NOTE [fusion on CPU]: the cost model says a region's inner values are
        never materialized, which holds for a compiled region (a generated kernel,
        an Inductor or nvFuser program; extern calls inside such a program, a
        matmul's input, are the exception).  The op-by-op fallback runs the
        region's torch ops one by one, so its inner values do exist for a moment,
        while the region's inputs are held to its end: there a region can only
        cost memory (and saves no time).  So by default regions are formed only
        where a compiler builds them."""
        if self.fuse != "auto":
            return bool(self.fuse)
        return self._compiles(compiler, bsyms)

    def _transform(self, trace):
        is_backward = TraceTag.BACKWARD in trace.tags or trace.siginfo().name == "backward_fn"
        freeable, held, donatable = None, 0, None
        if TraceTag.AUGMENTED_FORWARD in trace.tags:
            # remembered for the backward, which Thunder hands over right after:
            # which saved tensors are activations, and which share a storage
            # (_planning.py saved_storages, trace.c NOTE [saved storages]), and which of them
            # its regions may write over (_regroup.py NOTE [donated inputs])
            saved = _forward_saved(trace)
            _carry_saved(saved, _held_outputs(trace, saved), _donatable(trace, saved))
        elif is_backward:
            saved, held, donatable = _carry_saved(None)
            freeable = _planning.backward_freeable(saved, trace)  # and the incoming gradients
        else:  # an inference forward: no backward follows
            _carry_saved(None)
        forward = _step.take_forward(get_compile_data())
        new_trace = self._plan(trace, is_backward=is_backward, freeable=freeable, held=held,
                               donatable_saved=donatable)
        _warn_over_budget(trace, new_trace._memfuse_info.get("memory_budget"))
        if TraceTag.AUGMENTED_FORWARD in trace.tags:
            _step.keep_forward(get_compile_data(), trace, new_trace)
        elif is_backward and forward is not None:
            # NOTE [the step's peak] (_step.py): the forward regrouped within the backward's peak
            _step.regroup_forward(forward, new_trace._memfuse_info["plan"]["peak_bytes"],
                                  lambda t, allowance: self._plan(t, is_backward=False, freeable=None,
                                                                  peak_allowance=allowance, recompute=False),
                                  strict=self.strict)
        return new_trace

    def _plan(self, trace, *, is_backward, freeable, peak_allowance=0, recompute=None, held=0, donatable_saved=None):
        """trace planned and regrouped: a new trace with its _memfuse_info.  peak_allowance: a
        fused peak up to it costs nothing (csrc/core/mf_fuse.c NOTE [peak allowance]); recompute:
        this option's value instead of the instance's; held: bytes the caller holds beside this
        trace that memory_budget counts (_planning.py NOTE [held outputs])."""
        start = time.perf_counter_ns()
        bsyms = list(trace.bound_symbols)
        res, compiler, fuse = self._planned(bsyms, freeable=freeable, peak_allowance=peak_allowance,
                                            recompute=recompute, held=held, donatable_saved=donatable_saved)
        comp = regions.compiler(compiler)
        # no regions by design (fuse=False, or regions.reorder_only), not for want of a compiler
        reorder_only = not fuse and (self.fuse is False or regions.reorder_only(
            self.kernels, cuda=_has_cuda_tensors(bsyms), compiling_peer=_compiling_peer()))
        stage_ms = dict(res["stage_ms"])
        t = time.perf_counter_ns()
        res = _recompute.emit(res, trace)
        stage_ms["planning"] += (time.perf_counter_ns() - t) / 1e6  # the copies made bound symbols
        plan = res["plan"]
        if plan["peak_bytes"] > max(plan["baseline_peak_bytes"], peak_allowance):
            raise MemFuseError("internal: planned order is worse than the input order")

        single = regions.base.SINGLE
        groups = ([([b], single) for b in res["prologue"]] + _planned_groups(res)
                  + [([b], single) for b in res["epilogue"]])
        groups = _with_comments(bsyms, groups)
        t = time.perf_counter_ns()
        new_trace, n_regions = regroup_trace(trace, groups, compiler=comp, is_backward=is_backward,
                                             donatable_saved=donatable_saved)
        stage_ms["regrouping"] += (time.perf_counter_ns() - t) / 1e6
        elapsed_ms = (time.perf_counter_ns() - start) / 1e6
        stage_ms["reading"] += elapsed_ms - sum(stage_ms.values())  # the rest: the compiler's choice, checks
        if not is_backward:
            fusion_ms = getattr(get_compile_data(), "_memfuse_fusion_pass_ms", None)
            if fusion_ms is not None:  # the joint trace's fusion pass, before the split (fusion_pass.py)
                stage_ms["fusion pass"] = fusion_ms
            saved_ms = getattr(get_compile_data(), "_memfuse_saved_set_ms", None)
            if saved_ms is not None:  # the saved set chosen within memory_budget (_saved_set.py)
                stage_ms["saved set"] = saved_ms
        _log_plan(trace, is_backward, plan, "reorder-only" if reorder_only else compiler, n_regions, res["groups"],
                  elapsed_ms)
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
            "own_regions": n_regions,  # the regions memfuse formed itself
            "ops": sum(len(g) for g in res["groups"]),
            "time_ms": elapsed_ms,
            "stage_ms": stage_ms,  # report()'s time_ms: memfuse's time on this trace by stage
            "replaced_executors": list(getattr(get_compile_data(), "_memfuse_replaced", ())),
            "kernels": compiler,
            "reorder_only": reorder_only,
            "recompute": res.get("recompute"),
            "peak_allowance": peak_allowance or None,
            "memory_budget": self._budget_info(plan, res.get("recompute"), held),
            # what the joint trace's fusion pass did to the saved set (_saved_set.py NOTE [the saved set])
            "saved_set": (getattr(get_compile_data(), "_memfuse_saved_set", None)
                          if TraceTag.AUGMENTED_FORWARD in trace.tags else None),
        }
        return new_trace

    def _planned(self, bsyms, *, freeable, peak_allowance=0, recompute=None, held=0, donatable_saved=None):
        """(_planning.plan_trace's result for bsyms under this instance's options, the region
        compiler's name, whether regions are formed).  donatable_saved: as regroup_trace takes it;
        where the compiler compiles regions, the plan counts their donated inputs (_regroup.py
        NOTE [donated inputs])."""
        compiler = self._compiler_for(bsyms)
        comp = regions.compiler(compiler)
        fuse = self._fuses(bsyms, compiler)
        recompute = self.recompute if recompute is None else recompute
        res = _planning.plan_trace(bsyms, max_states=self.max_states, fuse=fuse,
                                   freeable=freeable, fusible=self._fusible_for(bsyms),
                                   epilogue_role=comp.epilogue_role,
                                   comm_overlap=self.comm_overlap,
                                   recompute=_recompute.budget_bytes(bsyms, recompute),
                                   peak_allowance=peak_allowance, peak_target=self._peak_target(held),
                                   donate=comp.compiles_regions, donatable_saved=donatable_saved)
        return res, compiler, fuse

    def _step_fits(self, joint):
        """(fits memory_budget, planned step peak, the forward's saved storages) of a joint
        forward-backward trace split as Thunder splits it (_saved_set.py NOTE [the saved set]):
        the step's peak is the larger of the forward's planned peak and the backward's plus the
        outputs the caller holds beside it."""
        from thunder.transforms.autodiff import split_into_forward_and_backward

        fw, bw = split_into_forward_and_backward(joint)
        saved = _planning.saved_storages(fw)
        held = _planning.held_output_bytes(fw, saved)
        f = self._planned(list(fw.bound_symbols), freeable=None)[0]["plan"]["peak_bytes"]
        b = self._planned(list(bw.bound_symbols), freeable=_planning.backward_freeable(saved, bw),
                          held=held, donatable_saved=_donatable(fw, saved))[0]["plan"]["peak_bytes"]
        peak = max(f, b + held)
        return peak <= self.memory_budget, peak, saved

    def _peak_target(self, held: int = 0) -> int:
        """The planner's peak target: memory_budget's bytes less what the caller holds beside the
        trace (at least one byte), 0 for "auto" (NOTE [peak target], NOTE [held outputs])."""
        return 0 if self.memory_budget == "auto" else max(1, self.memory_budget - held)

    def _budget_info(self, plan, rc, held=0):
        """report()'s memory_budget of a trace: None for "auto", else the budget, whether the plan
        fits it (its planned peak plus what the caller holds beside the trace), the planned peak,
        those held bytes and the bytes the copies write again."""
        if self.memory_budget == "auto":
            return None
        return {"bytes": self.memory_budget, "fits": plan["peak_bytes"] + held <= self.memory_budget,
                "planned_peak_bytes": plan["peak_bytes"], "held_bytes": held,
                "copied_bytes": rc["copied_bytes"] if rc else 0}


def _warn_over_budget(trace, budget) -> None:
    """A MemFuseWarning where a trace's lowest plan is above MemFuse(memory_budget=...)."""
    if budget is None or budget["fits"]:
        return
    mib = 1 << 20
    held = budget["held_bytes"]
    short = budget["planned_peak_bytes"] + held - budget["bytes"]
    beside = f" beside {held / mib:.2f} MiB of outputs the caller holds" if held else ""
    _warn(f"MemFuse(memory_budget={budget['bytes']}): no plan of trace {_trace_name(trace)!r} fits; its lowest "
          f"peaks at {budget['planned_peak_bytes'] / mib:.2f} MiB{beside}, {short / mib:.2f} MiB ({short} bytes) "
          f"above the budget of {budget['bytes'] / mib:.2f} MiB; that plan is used (a larger recompute= share may "
          f"let more ops run twice)")


def _one_memfuse(cd) -> None:
    """Two memfuse transforms in one transforms= list would plan each trace twice (the second
    planning Thunder's order through the first one's regions): a TypeError naming the fix.  So is
    a MemFuse option given to thunder.jit itself (_misuse.py NOTE [misuse hooks])."""
    _misuse.check_compile_options(cd)
    ours = [t for t in (getattr(cd, "transforms", None) or ()) if isinstance(t, MemFuse)]
    if len(ours) > 1:
        raise TypeError(f"thunder.jit(..., transforms=[...]) holds {len(ours)} memfuse transforms "
                        f"({', '.join(map(repr, ours))}); pass one: transforms=[memfuse] or "
                        f"transforms=[MemFuse(...)] with all the options in it")


def _log_plan(trace, is_backward, plan, compiler, n_regions, groups, elapsed_ms) -> None:
    if not LOG.isEnabledFor(logging.INFO):
        return
    mib = 1 << 20
    LOG.info("planned %s trace %r: %d ops, peak %.2f -> %.2f MiB unfused (lower bound %.2f), %.2f MiB with "
             "%d regions (%s), %s (%s), took %.1f ms", "backward" if is_backward else "forward",
             _trace_name(trace), sum(len(g) for g in groups), plan["baseline_peak_bytes"] / mib,
             plan["unfused_peak_bytes"] / mib, plan["lower_bound_bytes"] / mib, plan["peak_bytes"] / mib,
             n_regions, compiler, "proven optimal" if plan["optimal"] else "not proven optimal", plan["method"],
             elapsed_ms)
    if LOG.isEnabledFor(logging.DEBUG):
        for i, g in enumerate(x for x in groups if len(x) > 1):
            LOG.debug("  region %d (%s): %s", i, compiler, " ".join(str(b.sym.name) for b in g))


def _replace_fusion_executors(cd, remat: bool = True) -> None:
    """Replace GENERAL_FUSION_EXECUTORS in compile data `cd` (None: not inside a
    thunder.jit compilation, nothing to do) by memfuse_ex, at the first one's place
    (remat=False: only drop them); remember their names on cd.  memfuse_ex claims
    what the first replaced executor would have claimed, so its fusion pass groups
    and rematerializes as that executor's did (NOTE [memfuse fusion pass]); memfuse
    regroups by its own compiler's predicate later."""
    if cd is None:
        return
    executors = tuple(cd.executors_list)
    replaced = [ex for ex in executors if ex.name in GENERAL_FUSION_EXECUTORS]
    if not replaced:
        return
    kept = []
    for ex in executors:
        if ex.name not in GENERAL_FUSION_EXECUTORS:
            kept.append(ex)
        elif remat and memfuse_ex not in kept:
            kept.append(memfuse_ex)
    cd._memfuse_replaced = tuple(ex.name for ex in replaced)
    cd._memfuse_fusible = replaced[0].can_fuse if remat else None
    cd.executors_list = tuple(kept)


def _carry_saved(saved, held=0, donatable=None):
    """Hand the forward's saved storages, the bytes of its outputs the caller holds
    (_planning.py NOTE [held outputs]) and the saved storages its backward may write over
    (_regroup.py NOTE [donated inputs]) to the backward of the same compilation, which Thunder
    transforms right after it: kept on the compilation's compile data (so two thunder.jit
    functions sharing one MemFuse never see each other's), never on the instance.  Returns what
    was kept before, (saved, held, donatable) ((None, 0, None): nothing known; also outside a
    compilation)."""
    cd = get_compile_data()
    if cd is None:
        return None, 0, None
    before = (getattr(cd, "_memfuse_saved", None), getattr(cd, "_memfuse_held", 0),
              getattr(cd, "_memfuse_donatable", None))
    cd._memfuse_saved, cd._memfuse_held, cd._memfuse_donatable = saved, held, donatable
    return before


def _donatable(trace, saved):
    """_planning.donatable_saved of an augmented forward; None (its backward then writes over no saved
    activation) where it cannot tell, with the reason logged."""
    try:
        return _planning.donatable_saved(trace, saved)
    except Exception as e:
        LOG.warning("memfuse: could not tell which saved tensors of trace %r the backward may write over "
                    "(%s: %s); it writes over none", _trace_name(trace), type(e).__name__, e)
        return None


def _held_outputs(trace, saved) -> int:
    """_planning.held_output_bytes of an augmented forward; 0 (with the reason logged) where it
    cannot tell."""
    try:
        return _planning.held_output_bytes(trace, saved)
    except Exception as e:
        LOG.warning("memfuse: could not tell which outputs of trace %r the caller holds (%s: %s); "
                    "memory_budget counts none", _trace_name(trace), type(e).__name__, e)
        return 0


def _forward_saved(trace):
    """_planning.saved_storages of an augmented forward; None (the backward then counts every
    saved tensor as an input, a conservative plan) where it cannot tell, with the reason logged."""
    try:
        return _planning.saved_storages(trace)
    except Exception as e:
        LOG.warning("memfuse: could not tell which saved tensors of trace %r are activations (%s: %s); "
                    "its backward is planned with all of them as inputs", _trace_name(trace),
                    type(e).__name__, e)
        return None


def _compiling_peer() -> bool:
    """Is memfuse this compilation's fusion pass, in the place of a general fusion executor
    it replaced (regions NOTE [auto on CPU])?  Outside a compilation: yes."""
    cd = get_compile_data()
    if cd is None:
        return True
    return "memfuse" in {getattr(ex, "name", None) for ex in cd.executors_list}


def _has_cuda_tensors(bsyms) -> bool:
    from thunder.core.proxies import TensorProxy

    return any(isinstance(p, TensorProxy) and p.device.type == "cuda" for b in bsyms for p in b.flat_proxy_outs)


def _trace_name(trace) -> str:
    """The trace's function name, for messages.  It names the trace in the warning that says why
    the pass failed, which may be a trace without a signature: then "<trace>", and that warning
    carries the reason."""
    try:
        return trace.siginfo().name
    except Exception:
        return "<trace>"


memfuse = MemFuse()
"""The default memfuse transform: thunder.jit(fn, transforms=[memfuse])."""
