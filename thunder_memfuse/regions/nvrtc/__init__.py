"""The "nvrtc" region compiler: memfuse's own CUDA kernels.

    lowering.py   which bound symbols a generated elementwise kernel can hold, and their lowering
                  to the flat region program of csrc/cuda/mf_codegen.c (NOTE [lowering])
    kernel.py     CudaRegion: one region as one NVRTC-compiled kernel (cached, shared loads)
    gemm.py       cuBLAS GEMMs, cuBLASLt GEMMs with a fused ReLU (and bias) epilogue
    loader.py     finding the CUDA libraries (dlopen at first use, never at import), cuda_status

Public:
    fusible_bsym(bsym) -> bool            can this bound symbol be part of a generated kernel?
    view_only_bsym(bsym) -> bool          does it only reshape/broadcast (no arithmetic)?
    build_cuda_region(bsyms, inputs, outputs) -> callable(*args) -> list[torch.Tensor]
    cuda_matmul(a, b), cuda_linear(x, w, bias=None)
    cuda_matmul_act(a, b, act="relu"), cuda_linear_act(x, w, bias=None, act="relu")
                                          ONE cuBLASLt call each, pre-activation never stored
    cuda_status() -> dict                 what CUDA pieces were found, or why not
    available() -> bool                   can generated kernels run in this process?
    KernelCompileError                    NVRTC rejected a kernel (.log, .source)

As a region compiler (thunder_memfuse.regions.base.RegionCompiler): fusible, region_of_one (a lone
CUDA GEMM is a region: NOTE [gemm regions]), epilogue_pair (NOTE [epilogue regions]), accepts (CUDA
tensors only) and build(group).  Its NotImplementedError is a case the kernels do not cover
(expects_unsupported): the region's call runs on the fallback, logged, not warned.
"""
from __future__ import annotations

import functools

from .gemm import cuda_linear, cuda_linear_act, cuda_matmul, cuda_matmul_act
from .kernel import CudaRegion, build_cuda_region
from .loader import KernelCompileError, cuda_status, library_search_dirs, nvrtc_compile
from .lowering import SUPPORTED_DTYPES, fusible_bsym, view_only_bsym
from ..base import EPILOGUE, ONE, Group, pair_by_roles, same_as_one_read

name = "nvrtc"
compiles_regions = True
expects_unsupported = True

__all__ = [
    "fusible_bsym",
    "view_only_bsym",
    "build_cuda_region",
    "CudaRegion",
    "cuda_matmul",
    "cuda_linear",
    "cuda_matmul_act",
    "cuda_linear_act",
    "cuda_status",
    "available",
    "library_search_dirs",
    "nvrtc_compile",
    "KernelCompileError",
    "SUPPORTED_DTYPES",
]


def available(cuda: bool = True) -> bool:
    """Can memfuse's generated kernels run in this process: the driver and NVRTC found and a CUDA
    device visible to PyTorch?  Any failure to tell counts as no.  cuda=False (a trace without
    CUDA tensors): no, its kernels are CUDA kernels."""
    if not cuda:
        return False
    try:
        st = cuda_status()
        return bool(st["can_run"] and st["torch_cuda"]["available"])
    except Exception:
        return False


fusible = fusible_bsym


# NOTE [gemm regions]: on CUDA traces a lone matmul or linear becomes a one-op
# region too, so that it runs through our cuBLAS path (cuda_matmul / cuda_linear)
# on PyTorch's current stream, with its output from PyTorch's allocator.  Anything
# those do not cover raises NotImplementedError and the region falls back to the
# torch call, like any other region.
GEMM_SYMBOLS = {"matmul": "cuda_matmul", "linear": "cuda_linear"}

# NOTE [epilogue regions]: a GEMM followed by a ReLU of its result can be one
# region [gemm, relu] (the planner forms it where it is valid and does not raise
# the peak: mf_fuse.c NOTE [epilogue pairs]); it runs as one cuBLASLt call with
# the ReLU (and linear's bias) as epilogue, so the pre-activation is never
# materialized.  Where that call does not cover the case, the region falls
# back like any other.
EPILOGUE_SYMBOLS = {"matmul": "cuda_matmul_act", "linear": "cuda_linear_act"}
_EPILOGUE_DTYPES = ("float32", "float16", "bfloat16")


def epilogue_role(bsym) -> int:
    """EPI_HEAD: a matmul or linear whose one tensor result cuBLASLt can write through an
    activation; EPI_TAIL: a plain relu of one tensor (csrc/core/mf_build.c NOTE [epilogue
    candidates] pairs them)."""
    from thunder.core.proxies import TensorProxy

    from ... import _C

    outs = [o for o in bsym.flat_proxy_outs if isinstance(o, TensorProxy)]
    if len(outs) != 1:
        return 0
    if bsym.sym.name in EPILOGUE_SYMBOLS and not bsym.kwargs:
        tensors = [a for a in bsym.flat_proxy_args if isinstance(a, TensorProxy)]
        devices = {t.device.type for t in tensors}
        if str(outs[0].dtype).split(".")[-1].rstrip("_") not in _EPILOGUE_DTYPES or len(devices) != 1:
            return 0
        # on CUDA the pair saves the pre-activation only if cuBLASLt runs it: without the library
        # every call would fall back, so the plan's figure would not hold
        return _C.EPI_HEAD if devices != {"cuda"} or _cublaslt_found() else 0
    if bsym.sym.name == "relu" and bsym.args and isinstance(bsym.args[0], TensorProxy):
        if any(a is not False for a in bsym.args[1:]) or any(v is not False for v in bsym.kwargs.values()):
            return 0  # relu(x, inplace=True) and anything unexpected
        return _C.EPI_TAIL if same_as_one_read(bsym) else 0
    return 0


def epilogue_pair(gemm, act) -> bool:
    """Can bound symbol `act` run as the epilogue of bound symbol `gemm`?"""
    return pair_by_roles(epilogue_role, gemm, act)


@functools.lru_cache(maxsize=1)
def _cublaslt_found() -> bool:
    try:
        return bool(cuda_status()["cublaslt"]["found"])
    except Exception:
        return False


def region_of_one(bsym) -> bool:
    """A matmul/linear bound symbol whose tensor arguments are CUDA proxies (NOTE [gemm regions])."""
    from thunder.core.proxies import TensorProxy

    if bsym.sym.name not in GEMM_SYMBOLS:
        return False
    tensors = [a for a in bsym.flat_proxy_args if isinstance(a, TensorProxy)]
    return bool(tensors) and all(t.device.type == "cuda" for t in tensors)


def gemm_builder(bsym, inputs, *, act=None):
    """A builder for the cuBLAS call of one matmul/linear bound symbol (with
    act="relu": the cuBLASLt call of the region [bsym, relu])."""
    position = {p.name: i for i, p in enumerate(inputs)}

    def arg(a):
        return (lambda args: args[position[a.name]]) if hasattr(a, "name") else (lambda args: a)

    getters = [arg(a) for a in bsym.args]
    module = globals()

    def build():
        if bsym.kwargs:
            raise NotImplementedError(f"{bsym.sym.name} with keyword arguments")
        if act is None:
            fn = module[GEMM_SYMBOLS[bsym.sym.name]]

            def call(*args):
                return [fn(*(g(args) for g in getters))]
        else:
            fn = module[EPILOGUE_SYMBOLS[bsym.sym.name]]

            def call(*args):
                return [fn(*(g(args) for g in getters), act=act)]

        return call

    return build


def accepts(args) -> bool:
    """Kernels take CUDA tensors only: a region with any CPU tensor uses the fallback."""
    tensors = [a for a in args if hasattr(a, "is_cuda")]
    return bool(tensors) and all(t.is_cuda for t in tensors)


def build(group: Group):
    """The region's callable: cuBLAS for a lone GEMM, cuBLASLt for a GEMM + ReLU pair, else one
    generated kernel (NotImplementedError where unsupported)."""
    bsyms, inputs = list(group.bsyms), list(group.inputs)
    if group.kind == ONE and bsyms[0].sym.name in GEMM_SYMBOLS:
        return gemm_builder(bsyms[0], inputs)()
    if group.kind == EPILOGUE:
        return gemm_builder(bsyms[0], inputs, act="relu")()
    return build_cuda_region(bsyms, inputs, list(group.outputs))
