"""The traces memfuse returned for a jitted function, and their two schedules: what report(),
compare() and the plots all start from (the lowest module of reports/: the others import it, it
imports none of them).

- _memfuse_traces(jfn, who): {"forward"/"backward": (trace, info)} for the last traces memfuse
  returned, each with the `_memfuse_info` memfuse leaves on it (the plan and the graph it planned);
  where there are none, the error that says why (_why_no_traces).
- _schedules(info): the C simulator's run of Thunder's order and of memfuse's plan.
"""
from __future__ import annotations

from .. import _plan


def _memfuse_traces(jfn, who=None):
    """{"forward"/"backward": (trace, info)} for the last traces memfuse returned.  who (the
    caller's name): when there are none, raise the error that says why and what to do."""
    import thunder

    out = {}
    for kind, getter in (("forward", thunder.last_traces), ("backward", thunder.last_backward_traces)):
        try:
            traces = getter(jfn) or []
        except Exception:
            traces = []
        for t in reversed(traces):
            info = getattr(t, "_memfuse_info", None)
            if info is not None:
                out[kind] = (t, info)
                break
    if not out and who is not None:
        _why_no_traces(jfn, who)
    return out


def _why_no_traces(jfn, who):
    """Raise the error for a function with no trace memfuse transformed: not jitted (TypeError),
    never called, jitted without memfuse, memfuse turned off, or every trace left unchanged."""
    import thunder

    from .. import _options
    from ..integration.transform import MemFuse

    cs, cd = thunder.compile_stats(jfn), thunder.compile_data(jfn)
    if cs is None or cd is None:
        raise TypeError(f"{who}: expected a function returned by thunder.jit(fn, transforms=[memfuse]), got "
                        f"{type(jfn).__name__} {getattr(jfn, '__name__', '')!s}".rstrip()
                        + "; jit it first: jfn = thunder.jit(fn, transforms=[memfuse]); jfn(*args)")
    if not any(isinstance(t, MemFuse) for t in (getattr(cd, "transforms", None) or ())):
        raise ValueError(f"{who}: this function was compiled without memfuse; pass it to thunder.jit: "
                         "thunder.jit(fn, transforms=[memfuse])")
    if cs.last_traces is None:
        raise ValueError(f"{who}: this function has not run yet; call it once (jfn(*args)), then ask again: "
                         "memfuse plans a trace when Thunder compiles it, at the first call")
    if _options.disabled():
        raise ValueError(f"{who}: memfuse is turned off in this process ({_options.ENV}="
                         f"{__import__('os').environ.get(_options.ENV)!r}); unset it and recompile")
    raise ValueError(f"{who}: memfuse left every trace of this function unchanged (a MemFuseWarning said why; "
                     "MemFuse(strict=True) raises it instead)")


def _schedules(info):
    g = info["graph"]
    plan = info["plan"]
    n = len(g["ops"])
    # stored inner values and epilogue pairs count as the planner counted them
    kw = dict(graph_inputs=g["graph_inputs"], graph_outputs=g["graph_outputs"], aliases=g["aliases"],
              fusible=g.get("fusible"), epilogues=g.get("epilogues", ()), donatable=g.get("donatable", ()))
    g0 = g.get("before_recompute")  # with recomputed copies: Thunder's order is that of the graph without them
    if g0 is not None:
        kw0 = dict(graph_inputs=g0["graph_inputs"], graph_outputs=g0["graph_outputs"], aliases=g0["aliases"],
                   fusible=g0.get("fusible"), epilogues=g0.get("epilogues", ()),
                   donatable=g0.get("donatable", ()))
        before = _plan.simulate(g0["ops"], g0["value_bytes"], list(range(len(g0["ops"]))), **kw0)
    else:
        before = _plan.simulate(g["ops"], g["value_bytes"], list(range(n)), **kw)
    after = _plan.simulate(g["ops"], g["value_bytes"], plan["order"], plan["groups"], **kw)
    return before, after
