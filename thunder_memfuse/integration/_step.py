"""The step's peak: a training step's forward regrouped within its backward's peak.

NOTE [the step's peak]  Thunder hands memfuse a step's traces one by one: the
augmented forward, then its backward (transform.py).  Each is planned for its
own peak, but a training step has one peak, the larger of the two, and where
activations are checkpointed that is the backward's by far.  A forward
grouping whose peak stays within the backward's then costs no memory, and
each region it saves is one compile (Inductor's, at the first call) and one
launch less per step.  So the forward is planned as soon as it comes (its
trace must be returned then), kept here on the compilation's compile data, and
once the backward is planned, planned again with the backward's planned peak
as its allowance (csrc/core/mf_fuse.c NOTE [peak allowance]): the fewest
regions whose fused peak is at most that.  Recomputation stays off in that
plan, since its copies would lower a peak that no longer matters.  The new
grouping replaces the first one's bound symbols in the very trace object
returned for the forward, which Thunder turns into a program only after the
backward's transform (thunder/__init__.py: the transforms run on the forward
and then the backward, and the callables are built after the loop); it is
kept only if it has fewer regions.

Why the allowance never raises the step's peak: both plans count from what
the caller holds (parameters, inputs).  The backward's planned peak counts
the saved activations and incoming gradients it starts with; while it runs
the caller also holds the forward's outputs, so the step's peak is at least
that planned peak.  The forward regrouped stays at or below it.  (A caller
that runs several forwards before one backward holds each forward's saved
tensors at once; the allowance is one backward's peak, so such a step can
peak higher than it would with the first plan: the caller's pattern, not the
trace, decides that.)
"""
from __future__ import annotations

from thunder.core.trace import TraceProvenance

from ..errors import warn as _warn


class Forward:
    """A planned forward awaiting its backward: the trace Thunder gave memfuse and the one
    memfuse returned (whose bound symbols a regrouping replaces)."""

    __slots__ = ("source", "returned")

    def __init__(self, source, returned):
        self.source = source
        self.returned = returned


def keep_forward(cd, source, returned) -> None:
    """Remember a planned augmented forward for the backward of the same compilation (on its
    compile data cd; nothing outside a compilation, or where memfuse formed at most one region
    of its own: there is nothing to merge, the other executors' regions being theirs)."""
    if cd is None:
        return
    info = getattr(returned, "_memfuse_info", None) or {}
    cd._memfuse_forward = Forward(source, returned) if info.get("own_regions", 0) > 1 else None


def take_forward(cd):
    """The forward kept for this compilation's backward, removed (None: none)."""
    if cd is None:
        return None
    fw = getattr(cd, "_memfuse_forward", None)
    cd._memfuse_forward = None
    return fw


def regroup_forward(fw: Forward, backward_peak: int, replan, *, strict: bool = False) -> bool:
    """NOTE [the step's peak]: plan fw's forward again with the backward's planned peak as its
    allowance (replan(trace, allowance) -> a planned trace) and keep that grouping, in fw.returned
    itself, when it forms fewer regions within the allowance.  True when it was kept.  A failure
    leaves the first grouping (a valid program) with a MemFuseWarning, or raises with strict."""
    first = fw.returned._memfuse_info
    if backward_peak <= first["plan"]["peak_bytes"]:
        return False  # the forward's own peak is the step's, or ties it: nothing to give away
    try:
        new = replan(fw.source, int(backward_peak))
        info = new._memfuse_info
        if info["regions_after"] >= first["regions_after"] or info["plan"]["peak_bytes"] > backward_peak:
            return False
    except Exception as e:
        if strict:
            raise
        _warn(f"memfuse kept the forward's first grouping (regrouping it within the backward's peak "
              f"failed: {type(e).__name__}: {e})")
        return False
    info["time_ms"] += first["time_ms"]
    if "stage_ms" in first and "stage_ms" in info:  # both plans of the forward, stage by stage
        info["stage_ms"] = {k: info["stage_ms"].get(k, 0.0) + first["stage_ms"].get(k, 0.0)
                            for k in {**first["stage_ms"], **info["stage_ms"]}}
        for once in ("fusion pass", "saved set"):  # the joint trace's pass ran once; each plan reads its time
            if once in first["stage_ms"]:
                info["stage_ms"][once] = first["stage_ms"][once]
    info["regions_without_allowance"] = first["regions_after"]
    fw.returned.bound_symbols = new.bound_symbols
    fw.returned._memfuse_info = info
    fw.returned.set_provenance(TraceProvenance(
        f"{new.get_provenance().pss if new.get_provenance() else 'memfuse'} (regrouped within the backward's "
        f"peak of {backward_peak} bytes)"))
    return True
