"""One memfuse region as one generated CUDA kernel: NVRTC compile (cached), module load (shared
process-wide), launch on PyTorch's current stream with outputs from PyTorch's allocator."""
from __future__ import annotations

import math
import struct
import threading

from ... import _C
from .loader import _device_info, _shared, nvrtc_compile
from .lowering import _codegen_info, _Program, _Unsupported, _lower, _region_tuple

_INDEX32_LIMIT = 2**31

# ---------------------------------------------------------------------------------------------
# Running a region


def _s_strides(t_shape, t_strides, mapping, ndim):
    st = [0] * ndim
    for i, ax in enumerate(mapping):
        if ax is not None and t_shape[i] != 1:
            st[ax] = t_strides[i]
    return st


def _collapse(S, strides):
    """Drop size-1 dims and merge neighbours where every operand allows it.
    Returns (sizes, [per-operand strides])."""
    dims = [d for d in range(len(S)) if S[d] != 1]
    sizes = [S[d] for d in dims]
    sts = [[s[d] for d in dims] for s in strides]
    if not sizes:
        return [1], [[0] for _ in strides]
    out_sizes = [sizes[-1]]
    out_sts = [[s[-1]] for s in sts]
    for d in range(len(sizes) - 2, -1, -1):
        if all(s[d] == o[0] * out_sizes[0] for s, o in zip(sts, out_sts)):
            out_sizes[0] *= sizes[d]
        else:
            out_sizes.insert(0, sizes[d])
            for s, o in zip(sts, out_sts):
                o.insert(0, s[d])
    return out_sizes, out_sts


# NOTE [loaded kernels]: a loaded CUDA module is never unloaded (a kernel may still be
# queued on a stream when its region object dies, and cuModuleUnload would not wait for
# it).  So loads are shared process-wide: one module per (device, generated source),
# whatever region asked for it.  The source is a function of the region's program (ops,
# dtypes, scalars' kinds) and the variant, never of shapes or pointers, so recompiling a
# function, another trace with the same region, or a second instance of a model loads
# nothing new; the modules held are bounded by the distinct kernels the process generated.
_loaded_kernels: dict = {}  # (device, source) -> CUfunction int
_loaded_lock = threading.Lock()


def _load_kernel(device: int, source: str):
    """The CUfunction of `source` on `device`: compiled (through the NVRTC cache) and
    loaded on first use, then shared (NOTE [loaded kernels])."""

    def load():
        res = nvrtc_compile(source, _device_info(device)[0])
        return _C.cuda_load_function(res["image"], _codegen_info()["kernel_name"], device)

    return _shared(_loaded_kernels, _loaded_lock, (device, source), load)


class CudaRegion:
    """Callable running one region as one generated kernel (see build_cuda_region)."""

    def __init__(self, prog: _Program, inputs):
        import torch

        self.prog = prog
        self._lock = threading.Lock()
        self._functions = {}  # (device, ndim, index64, contiguous) -> CUfunction int
        self._broken = {}     # the same keys -> why compiling or loading failed
        self.sources = {}     # (ndim, index64, contiguous) -> source (for inspection)
        self._torch_dtypes = [getattr(torch, dt) for _, _, dt in prog.out_info]
        self._expect = {}
        for kind, dt, pos, _ in prog.kinputs:
            if kind == "tensor":
                self._expect[pos] = (getattr(torch, dt), tuple(inputs[pos].shape))
        self._tensor_pos = [pos for kind, _, pos, _ in prog.kinputs if kind == "tensor"]
        self._scalar_pos = [(pos, "<d", float) if dt == "float64" else (pos, "<q", int)
                            for kind, dt, pos, _ in prog.kinputs if kind != "tensor"]
        self._layouts = {}  # operand strides -> launch_params layout

    def source(self, ndim: int, index64: bool = False, contiguous: bool = False) -> str:
        key = (ndim, bool(index64), bool(contiguous))
        src = self.sources.get(key)
        if src is None:
            src = self.sources[key] = _C.cuda_codegen(_region_tuple(self.prog, ndim, index64, contiguous))
        return src

    def _function(self, device: int, ndim: int, index64: bool, contiguous: bool):
        """The loaded kernel of one variant.  A variant that failed to compile or load once
        raises NotImplementedError from then on (its call falls back) instead of trying again."""
        key = (device, ndim, index64, contiguous)
        fn = self._functions.get(key)
        if fn is None:
            with self._lock:
                fn = self._functions.get(key)
                if fn is None:
                    if key in self._broken:
                        raise NotImplementedError(f"kernel variant {key} failed before: {self._broken[key]}")
                    try:
                        fn = _load_kernel(device, self.source(ndim, index64, contiguous))
                    except Exception as e:
                        self._broken[key] = f"{type(e).__name__}: {str(e)[:500]}"
                        raise
                    self._functions[key] = fn
        return fn

    def check_args(self, args, *, cuda=True):
        """Validate tensor arguments; returns their device."""
        import torch

        device = None
        for pos, (tdt, shape) in self._expect.items():
            t = args[pos]
            if not isinstance(t, torch.Tensor) or (cuda and not t.is_cuda):
                raise NotImplementedError("memfuse CUDA region needs CUDA tensors")
            if t.dtype != tdt or tuple(t.shape) != shape:
                raise NotImplementedError(f"argument {pos}: {t.dtype}{tuple(t.shape)} != {tdt}{shape}")
            if device is None:
                device = t.device
            elif t.device != device:
                raise NotImplementedError("region inputs on different devices")
        if device is None:
            raise NotImplementedError("region without tensor inputs")
        return device

    def allocate_outputs(self, device):
        """(kernel outputs, the list to return: duplicates of an output share its tensor)."""
        import torch

        outs = [
            torch.empty(sh, dtype=tdt, device=device)
            for (sh, _, _), tdt in zip(self.prog.out_info, self._torch_dtypes)
        ]
        return outs, [outs[i] for i in self.prog.out_index]

    def launch_params(self, args, outs):
        """(variant (ndim, index64, contiguous), numel, packed parameter bytes) for one launch
        (csrc/cuda/mf_codegen.c NOTE [kernel parameters]).  Works on CPU tensors too (tests).
        Everything but the data pointers and scalars depends on the operands' strides alone
        (shapes are fixed by check_args), so it is computed once per stride pattern."""
        tensors = [args[pos] for pos in self._tensor_pos] + list(outs)
        key = tuple(t.stride() for t in tensors)
        layout = self._layouts.get(key)
        if layout is None:
            if len(self._layouts) >= 64:  # a region meets few stride patterns; bound it anyway
                self._layouts.clear()
            layout = self._layouts[key] = self._layout(tensors)
        variant, numel, head, ptr_fmt, tail = layout
        params = head + struct.pack(ptr_fmt, *(t.data_ptr() for t in tensors)) + tail
        if self._scalar_pos:
            params += b"".join(struct.pack(fmt, conv(args[pos])) for pos, fmt, conv in self._scalar_pos)
        return variant, numel, params

    def _layout(self, tensors):
        """(variant, numel, bytes before the pointers, pointer format, bytes after them)."""
        prog = self.prog
        S = prog.S
        numel = math.prod(S)
        ndim0 = len(S)
        mappings = [m for kind, _, _, m in prog.kinputs if kind == "tensor"] + [m for _, m, _ in prog.out_info]
        strides = [_s_strides(t.shape, t.stride(), m, ndim0) for t, m in zip(tensors, mappings)]
        sizes, sts = _collapse(S, strides)
        contiguous = numel == 1 or (len(sizes) == 1 and all(s[0] == 1 for s in sts))
        index64 = (
            numel >= _INDEX32_LIMIT
            or any(n >= _INDEX32_LIMIT for n in sizes)
            or any(sum((n - 1) * st for n, st in zip(sizes, s)) >= _INDEX32_LIMIT for s in sts)
        )
        ndim = len(sizes)
        ptr_fmt = f"<{len(tensors)}Q"
        if contiguous:
            head, tail = struct.pack("<q", numel), b""
        else:
            flat = [x for s in sts for x in s]
            head = struct.pack(f"<q{ndim}q", numel, *sizes)
            tail = struct.pack(f"<{len(flat)}q", *flat)
        return (ndim, bool(index64), bool(contiguous)), numel, head, ptr_fmt, tail

    def prepare(self, args, *, cuda=True):
        """Everything a launch needs but the driver: (device, result, launch) where launch is
        None for an empty iteration space, else launch_params' (variant, numel, params)."""
        device = self.check_args(args, cuda=cuda)
        outs, result = self.allocate_outputs(device)
        if math.prod(self.prog.S) == 0:
            return device, result, None
        return device, result, self.launch_params(args, outs)

    def __call__(self, *args):
        import torch

        device, result, launch = self.prepare(args)
        if launch is None:
            return result
        (ndim, index64, contiguous), numel, params = launch
        dev = device.index if device.index is not None else torch.cuda.current_device()
        fn = self._function(dev, ndim, index64, contiguous)
        block = _codegen_info()["block"]
        _, sms = _device_info(dev)
        grid = max(1, min((numel + block - 1) // block, max(sms, 1) * 32))
        stream = torch.cuda.current_stream(device).cuda_stream
        _C.cuda_launch(fn, dev, grid, block, stream, params)
        return result


def build_cuda_region(bsyms, inputs, outputs):
    """A callable(*args) -> list of CUDA tensors running the region (bound symbols in order, with
    the given input proxies / values and output proxies) as ONE generated kernel.  Raises
    NotImplementedError for anything unsupported (the caller falls back)."""
    try:
        prog = _lower(list(bsyms), list(inputs), list(outputs))
    except _Unsupported as e:
        raise NotImplementedError(f"memfuse CUDA region: {e}") from None
    return CudaRegion(prog, list(inputs))
