"""How a memfuse fusion region runs, and memfuse's Thunder executor.

make_region_callable returns the function a fusion bound symbol calls
(`[t3, t4] = MemFuse0(t0, t1)` in the trace): the region built by its compiler
(a regions.base.RegionCompiler), or, where the compiler cannot build or run it,
the op-by-op fallback (regions.op_by_op).

memfuse_ex is the registered Thunder FusionExecutor that owns memfuse's fusion
symbols (so a trace's fusion symbols pickle) and, where memfuse replaces a
general fusion executor, runs its fusion pass (NOTE [memfuse fusion pass],
thunder_memfuse/integration/fusion_pass.py).
"""
from __future__ import annotations

import warnings


from thunder.core.symbol import Symbol
from thunder.extend import FusionExecutor, register_executor

from .. import regions
from .._options import LOG
from ..errors import warn as _warn


def _fallback_callable(group):
    return regions.op_by_op(group)


def make_region_callable(group, compiler):
    """The callable of region `group` (a regions.base.Group): built by `compiler` (a
    regions.base.RegionCompiler) on its first call, with the op-by-op fallback behind it; a
    compiler that compiles no regions: the fallback alone."""
    name = group.name
    if not compiler.compiles_regions:
        return _fallback_callable(group)
    built = []

    def fallback(*args):
        # built at its first use: most compiled regions never need it, and building one (a trace
        # printed and exec'd) is a share of the first call's time
        if not built:
            # Thunder's own deprecation notices while it prints the trace (torch API it calls) belong
            # to compile time, where a user never saw them; at run time they are not the user's
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                built.append(_fallback_callable(group))
        return built[0](*args)

    def build():
        return compiler.build(group)

    accepts = compiler.accepts

    # "proven": the region's callable has run once.  Building only lowers a region; NVRTC, the module load
    # and the launch happen on the first call, so any error there also sends the region to the
    # fallback, for good (regions are pure: running them again is safe); an error after a first
    # success sends only that call there.  NotImplementedError from a built kernel is a case one
    # call's arguments fall outside of: that call falls back, the next tries again.  The fallback
    # runs after the except clause: the exception's traceback would otherwise keep the kernel's
    # frames, and any output it had allocated, alive next to the fallback's own.
    #
    # NOTE [user errors in regions]: an error is the region's only if the fallback, plain Thunder's
    # own ops on the same arguments, then succeeds.  Where the fallback raises too (an index out of
    # range, a shape the user got wrong), the error is the user's: the fallback's exception, the one
    # plain Thunder raises, propagates, nothing is warned and the compiled region stays on for the
    # next call.
    state = {"kernel": None, "failed": False, "proven": False}

    def run(*args):
        if state["failed"] or not accepts(args):
            return fallback(*args)
        why = None
        try:
            if state["kernel"] is None:
                state["kernel"] = build()
            out = state["kernel"](*args)
        except regions.base.InputsWritten:
            raise  # its inputs may be overwritten: nothing can run it again (NOTE [donated inputs])
        except NotImplementedError as e:
            if compiler.expects_unsupported:  # a case its kernels do not cover: logged, not warned
                why = (f"NotImplementedError: {e}", state["kernel"] is None, False)
            else:
                why = (f"NotImplementedError: {e}", not state["proven"], True)
        except Exception as e:  # failed to build, compile, load or launch, or the user's error
            why = (f"{type(e).__name__}: {e}", not state["proven"], True)
        if why is None:
            state["proven"] = True
            return out
        out = fallback(*args)  # raises the user's own error (NOTE [user errors in regions])
        message, for_good, loud = why
        if for_good:
            state["failed"] = True
        what = "runs" if for_good else "call runs"
        if loud:
            _warn(f"memfuse: region {name} {what} on the fallback path: {message}")
        else:
            LOG.info("memfuse: region %s %s on the fallback path: %s", name, what, message)
        return out

    run.__name__ = name
    run.__qualname__ = name
    run.memfuse_state = state  # what the region built (state["kernel"]), for reports and tests
    run.memfuse_group = group
    return run


# ------------------------------------------------------------------------------------------
# memfuse's Thunder executor


class RegionSymbol(Symbol):
    """The symbol of a memfuse fusion bound symbol.  It pickles as (name, memfuse's registered
    executor) and loads back as an equal symbol; the region's callable lives in the bound symbol's
    call context, as for Thunder's own fusion symbols (whose symbols are not in any opmap)."""

    def __reduce__(self):
        return (_region_symbol, (self.name,))


def _region_symbol(name):
    return RegionSymbol(name, meta=None, is_fusion=True, executor=memfuse_ex)


def region_symbol(name, outputs):
    """A fusion symbol for a region with these output proxies; its meta gives them back, so
    Thunder can re-run the symbol on proxies (check_traces)."""
    outputs = tuple(outputs)

    def meta(*args, **kwargs):
        return outputs

    return RegionSymbol(name, meta=meta, is_fusion=True, executor=memfuse_ex)


class MemFuseExecutor(FusionExecutor):
    """memfuse as a Thunder fusion executor.  It owns memfuse's fusion symbols.  Placed in a
    compilation's executor list by the transform where memfuse replaces nvFuser or torch.compile
    (transform.py NOTE [replacing the fusion pass]), it claims what the chosen region compiler can
    hold and runs NOTE [memfuse fusion pass]; anywhere else it claims nothing."""

    def __init__(self):
        from .._versions import __version__

        super().__init__("memfuse", version=__version__)

    def _fusible(self):
        from thunder.core.compile_data import get_compile_data

        return getattr(get_compile_data(), "_memfuse_fusible", None)

    def can_execute(self, bsym) -> bool:
        pred = self._fusible()
        return bool(pred is not None and not bsym.sym.is_fusion and pred(bsym))

    def can_fuse(self, bsym) -> bool:
        return self.can_execute(bsym)

    def fuse(self, region, fusion_counter: int):
        """A provisional region (its symbols only; the pass dissolves it again after
        rematerialization, so nothing is compiled here)."""
        from thunder.core.proxies import unvariableify
        from thunder.core.symbol import BoundSymbol

        inputs = [unvariableify(x) for x in region.inputs]
        outputs = [unvariableify(x) for x in region.outputs]
        sym = region_symbol(f"MemFuseRemat{fusion_counter}", outputs)
        return BoundSymbol(sym, tuple(inputs), {}, tuple(outputs), list(region.bound_symbols))

    def fusion_pass(self, trace):
        if self._fusible() is None:
            return trace
        from .fusion_pass import fusion_pass

        return fusion_pass(self, trace)


memfuse_ex = register_executor(MemFuseExecutor())
