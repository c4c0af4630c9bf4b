"""A baseline that reproduces the seed's problem on CPU.

On a GPU, Thunder's nvFuser executor with fusion_type="dataflow" fuses the 10
independent relus of the seed into one region and keeps all their outputs alive
(2.25 MiB instead of 0.75 MiB).  On CPU, Thunder has no general fusion executor
but torch.compile, which also fuses matmuls.  This transform fuses what nvFuser
would here: elementwise ops (the same predicate memfuse uses), grouped by
Thunder's own partitioner (data_dependent_partition.fuse_bound_symbols, which
honours fusion_type="consecutive" / "dataflow"), each region run by the same
CPU path as memfuse's regions.  Use:

    thunder.jit(fn, transforms=[ElementwiseFusion()], fusion_type="dataflow")
"""
from __future__ import annotations

from thunder.core.trace import TraceTag, from_trace
from thunder.core.transform_common import Transform
from thunder.executors.data_dependent_partition import fuse_bound_symbols

from . import _thunder
from .transform import regroup_trace


class ElementwiseFusion(Transform):
    """Thunder-style fusion of elementwise ops, with no regard for memory."""

    def transform_trace_post_optimization(self, trace, **kwargs):
        is_backward = TraceTag.BACKWARD in trace.tags
        fusible = _thunder._fusible_predicate()
        stripped = from_trace(trace)
        stripped.bound_symbols = [b for b in trace.bound_symbols if b.sym.id not in _thunder.DROP_IDS]

        def can_fuse(node):
            return len(node.group_bsyms) > 1 or fusible(node.group_bsyms[0])

        groups = fuse_bound_symbols(stripped, lambda a, b: can_fuse(a) and can_fuse(b))
        flat = []
        for g in groups:  # a group with a non-fusible symbol (prologue, return) is not a region
            if len(g) > 1 and all(fusible(b) for b in g):
                flat.append(list(g))
            else:
                flat.extend([b] for b in g)
        new_trace, _ = regroup_trace(trace, flat, backend="cpu", is_backward=is_backward,
                                     name_prefix="ElementwiseFusion")
        return new_trace
