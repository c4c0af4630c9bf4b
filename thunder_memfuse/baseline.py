"""A baseline that reproduces the seed's problem on CPU.

On a GPU, Thunder's nvFuser executor with fusion_type="dataflow" fuses the 10
independent relus of the seed into one region and keeps all their outputs alive
(2.25 MiB instead of 0.75 MiB).  On CPU Thunder has no general fusion executor
but torch.compile, which also fuses matmuls.  This executor fuses exactly what
nvFuser would here: elementwise ops (the same predicate memfuse uses), grouped
by Thunder's own fusion pass (TorchCompileExecutor.fusion_pass, so
fusion_type="dataflow" applies), and runs each region with plain PyTorch ops,
like memfuse's CPU fallback.  Use:

    thunder.jit(fn, executors=[elementwise_dataflow_executor()], fusion_type="dataflow")
"""
from __future__ import annotations

import functools

from thunder.core.proxies import unvariableify
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.executors.torch_compile import TorchCompileExecutor

from ._thunder import _fusible_predicate
from .executor import _fallback_callable


class ElementwiseDataflowExecutor(TorchCompileExecutor):
    def __init__(self, name="memfuse_elementwise_baseline"):
        super().__init__(name)

    def can_execute(self, bsym) -> bool:
        return not bsym.sym.is_fusion and _fusible_predicate()(bsym)

    def can_fuse(self, bsym) -> bool:
        return self.can_execute(bsym)

    def fuse(self, region, fusion_counter: int) -> BoundSymbol:
        inputs = [unvariableify(x) for x in region.inputs]
        outputs = [unvariableify(x) for x in region.outputs]
        name = f"ElementwiseFusion{fusion_counter}"
        fn = _fallback_callable(name, region.bound_symbols, inputs, outputs)
        sym = Symbol(name, meta=None, is_fusion=True, executor=self)
        return BoundSymbol(sym, inputs, {}, outputs, region.bound_symbols, _call_ctx={name: fn})


@functools.lru_cache(maxsize=1)
def elementwise_dataflow_executor():
    return ElementwiseDataflowExecutor()
