"""How a memfuse fusion region runs.

make_region_callable returns the function a fusion bound symbol calls
(`[t3, t4] = MemFuse0(t0, t1)` in the trace).  On CUDA tensors it runs the
region as one generated kernel (thunder_memfuse.kernels: NVRTC + cuBLAS); where
no kernel can be built, and on CPU, it runs the CPU fallback: the region's own
bound symbols as a small Python program, in the planned order, with Thunder's
_del_last_used dropping every intermediate as soon as it is dead.
"""
from __future__ import annotations

import functools
from inspect import Parameter, Signature

from thunder.core import prims
from thunder.core.trace import TraceCtx
from thunder.executors.passes import _del_last_used

from .errors import warn as _warn


def _fallback_callable(name, bsyms, inputs, outputs):
    def region_fn():
        pass

    region_fn.__signature__ = Signature(
        Parameter(getattr(p, "name", f"arg{i}"), Parameter.POSITIONAL_ONLY) for i, p in enumerate(inputs)
    )
    region_fn.__name__ = name
    trace = TraceCtx(region_fn)
    body = _del_last_used(list(bsyms), list(outputs))
    body.append(prims.python_return.bind(list(outputs), output=None))
    trace.bound_symbols = body
    trace.args = list(inputs)
    trace.kwargs = {}
    return trace.python_callable()


# NOTE [gemm regions]: on CUDA traces a lone matmul or linear becomes a one-op
# region too, so that it runs through our cuBLAS path (kernels.cuda_matmul /
# cuda_linear) on PyTorch's current stream, with its output from PyTorch's
# allocator.  Anything those do not cover raises NotImplementedError and the
# region falls back to the torch call, like any other region.
GEMM_SYMBOLS = {"matmul": "cuda_matmul", "linear": "cuda_linear"}

# NOTE [epilogue regions]: a GEMM followed by a ReLU of its result can be one
# region [gemm, relu] (the planner forms it where it is valid and does not raise
# the peak: mf_fuse.c NOTE [epilogue pairs]); it runs as one cuBLASLt call with
# the ReLU (and linear's bias) as epilogue, so the pre-activation is never
# materialized.  Where that call does not cover the case, the region falls
# back like any other.
EPILOGUE_SYMBOLS = {"matmul": "cuda_matmul_act", "linear": "cuda_linear_act"}
_EPILOGUE_DTYPES = ("float32", "float16", "bfloat16")


def epilogue_pair(gemm, act) -> bool:
    """Can bound symbol `act` run as the epilogue of bound symbol `gemm`?
    (trace.c NOTE [epilogue candidates] asks this of candidates.)"""
    from thunder.core.proxies import TensorProxy

    if gemm.sym.name not in EPILOGUE_SYMBOLS or gemm.kwargs or act.sym.name != "relu":
        return False
    outs = [o for o in gemm.flat_proxy_outs if isinstance(o, TensorProxy)]
    if len(outs) != 1 or not act.args or getattr(act.args[0], "name", None) != outs[0].name:
        return False
    if any(a is not False for a in act.args[1:]) or any(v is not False for v in act.kwargs.values()):
        return False  # relu(x, inplace=True) and anything unexpected
    out = outs[0]
    tensors = [a for a in gemm.flat_proxy_args if isinstance(a, TensorProxy)]
    devices = {t.device.type for t in tensors}
    if str(out.dtype).split(".")[-1].rstrip("_") not in _EPILOGUE_DTYPES or len(devices) != 1:
        return False
    # on CUDA the pair saves the pre-activation only if cuBLASLt runs it: without the library
    # every call would fall back, so the plan's figure would not hold
    return devices != {"cuda"} or _cublaslt_found()


@functools.lru_cache(maxsize=1)
def _cublaslt_found() -> bool:
    try:
        from .kernels import cuda_status

        return bool(cuda_status()["cublaslt"]["found"])
    except Exception:
        return False


def is_cuda_gemm(bsym) -> bool:
    """A matmul/linear bound symbol whose tensor arguments are CUDA proxies."""
    from thunder.core.proxies import TensorProxy

    if bsym.sym.name not in GEMM_SYMBOLS:
        return False
    tensors = [a for a in bsym.flat_proxy_args if isinstance(a, TensorProxy)]
    return bool(tensors) and all(t.device.type == "cuda" for t in tensors)


def _gemm_builder(bsym, inputs, *, act=None):
    """A builder for the cuBLAS call of one matmul/linear bound symbol (with
    act="relu": the cuBLASLt call of the region [bsym, relu])."""
    position = {p.name: i for i, p in enumerate(inputs)}

    def arg(a):
        return (lambda args: args[position[a.name]]) if hasattr(a, "name") else (lambda args: a)

    getters = [arg(a) for a in bsym.args]

    def build():
        from . import kernels

        if bsym.kwargs:
            raise NotImplementedError(f"{bsym.sym.name} with keyword arguments")
        if act is None:
            fn = getattr(kernels, GEMM_SYMBOLS[bsym.sym.name])

            def call(*args):
                return [fn(*(g(args) for g in getters))]
        else:
            fn = getattr(kernels, EPILOGUE_SYMBOLS[bsym.sym.name])

            def call(*args):
                return [fn(*(g(args) for g in getters), act=act)]

        return call

    return build


def _all_cuda(args) -> bool:
    """Kernels take CUDA tensors only: a region with any CPU tensor uses the fallback."""
    tensors = [a for a in args if hasattr(a, "is_cuda")]
    return bool(tensors) and all(t.is_cuda for t in tensors)


def make_region_callable(name, bsyms, inputs, outputs, *, backend="auto"):
    fallback = _fallback_callable(name, bsyms, inputs, outputs)
    if backend == "cpu":
        return fallback
    if len(bsyms) == 1 and bsyms[0].sym.name in GEMM_SYMBOLS:
        build = _gemm_builder(bsyms[0], inputs)
    elif len(bsyms) == 2 and epilogue_pair(*bsyms):
        build = _gemm_builder(bsyms[0], inputs, act="relu")
    else:
        def build():
            from .kernels import build_cuda_region

            return build_cuda_region(bsyms, inputs, outputs)

    # "proven": the kernel has run once.  Building only lowers a region; NVRTC, the module load
    # and the launch happen on the first call, so any error there also sends the region to the
    # fallback, for good (regions are pure: running them again is safe); an error after a first
    # success sends only that call there.  NotImplementedError from a built kernel is a case one
    # call's arguments fall outside of: that call falls back, the next tries again.  The fallback
    # runs after the except clause: the exception's traceback would otherwise keep the kernel's
    # frames, and any output it had allocated, alive next to the fallback's own.
    state = {"kernel": None, "failed": False, "proven": False}

    def run(*args):
        if state["failed"] or not _all_cuda(args):
            return fallback(*args)
        why = None
        try:
            if state["kernel"] is None:
                state["kernel"] = build()
            out = state["kernel"](*args)
        except NotImplementedError as e:  # unsupported: expected, said only with backend="cuda"
            why = (f"NotImplementedError: {e}", state["kernel"] is None, backend == "cuda")
        except Exception as e:  # failed to build, compile, load or launch
            why = (f"{type(e).__name__}: {e}", not state["proven"], True)
        if why is None:
            state["proven"] = True
            return out
        message, for_good, loud = why
        if for_good:
            state["failed"] = True
        if loud:
            what = "runs" if for_good else "call runs"
            _warn(f"memfuse: region {name} {what} on the fallback path: {message}")
        return fallback(*args)

    run.__name__ = name
    run.__qualname__ = name
    return run
