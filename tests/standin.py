"""A test-only stand-in for a horizontal fusion pass (no compiler needed).

Thunder's real fusion executors (nvFuser with fusion_type="dataflow" on a GPU,
the torchcompile executor on a CPU) fuse the seed's 10 independent relus into
one region and keep every path's output alive.  Measuring that on the real
peers needs a compiler (benchmarks/models.py and the seed job do it); the
tests need a pass with the same grouping that costs nothing to run: this one
fuses elementwise ops (memfuse's own predicate), grouped by Thunder's own
partitioner (data_dependent_partition.fuse_bound_symbols, which honours
fusion_type="dataflow"), each region run by memfuse's CPU path.

    thunder.jit(fn, transforms=[ElementwiseFusion()], fusion_type="dataflow")
"""
from __future__ import annotations

from thunder.core.trace import TraceTag, from_trace
from thunder.core.transform_common import Transform
from thunder.executors.data_dependent_partition import fuse_bound_symbols

from thunder_memfuse import _symbols, regions
from thunder_memfuse.integration import _planning
from thunder_memfuse.integration._regroup import regroup_trace


class ElementwiseFusion(Transform):
    """Thunder-style fusion of elementwise ops, with no regard for memory."""

    def transform_trace_post_optimization(self, trace, **kwargs):
        is_backward = TraceTag.BACKWARD in trace.tags
        fusible = _planning._fusible_predicate()
        stripped = from_trace(trace)
        stripped.bound_symbols = [b for b in trace.bound_symbols if b.sym.id not in _symbols.DROP_IDS]

        def can_fuse(node):
            return len(node.group_bsyms) > 1 or fusible(node.group_bsyms[0])

        groups = fuse_bound_symbols(stripped, lambda a, b: can_fuse(a) and can_fuse(b))
        flat = []
        for g in groups:  # a group with a non-fusible symbol (prologue, return) is not a region
            if len(g) > 1 and all(fusible(b) for b in g):
                flat.append((list(g), regions.base.REGION))
            else:
                flat.extend(([b], regions.base.SINGLE) for b in g)
        new_trace, _ = regroup_trace(trace, flat, compiler=regions.compiler("fallback"), is_backward=is_backward,
                                     name_prefix="ElementwiseFusion")
        return new_trace
