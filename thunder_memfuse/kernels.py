"""CUDA kernels for memfuse regions: generated elementwise kernels (NVRTC), cuBLAS GEMMs and
cuBLASLt GEMMs with a fused activation epilogue.

Public:
    fusible_bsym(bsym) -> bool            can this bound symbol be part of a generated kernel?
    view_only_bsym(bsym) -> bool          does it only reshape/broadcast (no arithmetic)?
    build_cuda_region(bsyms, inputs, outputs) -> callable(*args) -> list[torch.Tensor]
    cuda_matmul(a, b), cuda_linear(x, w, bias=None)
    cuda_matmul_act(a, b, act="relu"), cuda_linear_act(x, w, bias=None, act="relu")
                                          ONE cuBLASLt call each, pre-activation never stored
    cuda_status() -> dict                 what CUDA pieces were found, or why not
    KernelCompileError                    NVRTC rejected a kernel (.log, .source)

Nothing here touches CUDA at import: the C side (csrc/cuda) dlopens the driver, NVRTC, cuBLAS
and cuBLASLt at first use.  The lowering from Thunder bound symbols to the flat region program of
csrc/cuda/mf_codegen.c (NOTE [region format]) is done here:

NOTE [lowering]
  1. Every bound symbol is flattened to its leaf prims (bsym.sym.id is a PrimIDs member).
  2. The iteration space S is the shape of the largest region output.  Each value is computed
     "at a point of S" through a mapping: for each of the value's dims, the axis of S it
     follows, or None (broadcast: index 0).  Outputs are seeded with an identity / right-aligned
     mapping; a backward pass over the leaves pushes mappings to the arguments
     (broadcast_in_dim, transpose, squeeze and size-1 reshapes only change the mapping;
     elementwise prims keep it).  A value needed under two mappings is computed twice.
  3. A forward pass emits one instruction per (value, mapping); region inputs become kernel
     inputs per (tensor, mapping), i.e. per stride vector over S.
  4. At call time the strides are computed from the real tensors, dims of S are collapsed where
     every operand allows it, and the kernel variant (ndim, 32/64-bit index, contiguous) is
     generated, compiled (cached) and launched on PyTorch's current stream.  Outputs are
     allocated with torch.empty, so the caching allocator sees every byte.
"""
from __future__ import annotations

import functools
import glob
import math
import os
import struct
import sys
import threading
from numbers import Number

from . import _C

KernelCompileError = _C.KernelCompileError

__all__ = [
    "fusible_bsym",
    "view_only_bsym",
    "build_cuda_region",
    "cuda_matmul",
    "cuda_linear",
    "cuda_matmul_act",
    "cuda_linear_act",
    "cuda_status",
    "library_search_dirs",
    "KernelCompileError",
    "SUPPORTED_DTYPES",
]

SUPPORTED_DTYPES = (
    "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
)
_INDEX32_LIMIT = 2**31

# ---------------------------------------------------------------------------------------------
# Loader setup and status


def library_search_dirs() -> list[str]:
    """lib folders of the nvidia pip wheels on sys.path (nvidia/*/lib, e.g. nvidia/cu13/lib for CUDA 13,
    nvidia/cuda_nvrtc/lib and nvidia/cublas/lib for CUDA 12), then torch/lib."""
    dirs: list[str] = []
    roots = [p for p in sys.path if p and os.path.isdir(p)]
    for root in roots:
        for d in sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib"))):
            if d not in dirs:
                dirs.append(d)
    for root in roots:
        d = os.path.join(root, "torch", "lib")
        if os.path.isdir(d) and d not in dirs:
            dirs.append(d)
    return dirs


_setup_lock = threading.Lock()
_setup_done = False


def _ensure_loader() -> None:
    global _setup_done
    if _setup_done:
        return
    with _setup_lock:
        if not _setup_done:
            _C.cuda_set_search_dirs(library_search_dirs())
            _setup_done = True


def cuda_status() -> dict:
    """What was found: {'driver': {...}, 'nvrtc': {...}, 'cublas': {...}, 'cublaslt': {...}, 'cache': {...},
    'cache_dir', 'search_dirs', 'can_compile', 'can_run', 'torch_cuda'}.  Each library entry has
    found/path/how/version or the loader's error text."""
    _ensure_loader()
    st = _C.cuda_status()
    st["search_dirs"] = [d for d in st.get("search_dirs", "").split(":") if d]
    try:
        import torch

        st["torch_cuda"] = {
            "available": bool(torch.cuda.is_available()),
            "version": torch.version.cuda,
            "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        }
    except Exception as e:  # pragma: no cover - torch is a dependency
        st["torch_cuda"] = {"available": False, "error": repr(e)}
    return st


def nvrtc_compile(source: str, arch: int, **kw) -> dict:
    """NVRTC compile through the kernel cache (see _C.nvrtc_compile)."""
    _ensure_loader()
    return _C.nvrtc_compile(source, arch, **kw)


# ---------------------------------------------------------------------------------------------
# Thunder side: leaves, dtypes, support


class _Unsupported(Exception):
    pass


@functools.lru_cache(maxsize=1)
def _thunder():
    import thunder.core.dtypes as dtypes
    from thunder.core.prims import PrimIDs
    from thunder.core.proxies import NumberProxy, TensorProxy

    return dtypes, PrimIDs, TensorProxy, NumberProxy


@functools.lru_cache(maxsize=1)
def _codegen_info() -> dict:
    return _C.cuda_codegen_info()


def _codegen_ops() -> dict:
    return _codegen_info()["ops"]


@functools.lru_cache(maxsize=None)
def _torch_dtype_name(tdtype) -> str | None:
    name = str(tdtype).replace("torch.", "")
    return name if name in SUPPORTED_DTYPES else None


def _dtype_name(dtype) -> str:
    """Thunder or torch dtype -> our dtype name; _Unsupported otherwise."""
    import torch

    if isinstance(dtype, torch.dtype):
        name = _torch_dtype_name(dtype)
    else:
        dtypes = _thunder()[0]
        try:
            name = _torch_dtype_name(dtypes.to_torch_dtype(dtype))
        except Exception:
            name = None
    if name is None:
        raise _Unsupported(f"dtype {dtype} is not supported")
    return name


_SHAPE_PRIMS = ("BROADCAST_IN_DIM", "TRANSPOSE", "SQUEEZE", "RESHAPE")
# Prims whose value is their argument's value (no instruction): clone materializes only where it
# is a region output, which is exactly a copy.
_PASS_PRIMS = ("CLONE",)
_SKIP_PRIMS = ("DEL", "COMMENT")


def _prim_name(bsym) -> str | None:
    PrimIDs = _thunder()[1]
    sid = bsym.sym.id
    return sid.name if isinstance(sid, PrimIDs) else None


def _leaves(bsym, out: list) -> list:
    """Leaf prims of bsym, in order (NOTE [lowering] 1)."""
    name = _prim_name(bsym)
    if name is not None:
        if name not in _SKIP_PRIMS:
            out.append(bsym)
        return out
    if not bsym.subsymbols:
        raise _Unsupported(f"{bsym.sym.name} has no prim decomposition")
    for s in bsym.subsymbols:
        _leaves(s, out)
    return out


def _is_tensor(x) -> bool:
    return isinstance(x, _thunder()[2])


def _is_number_proxy(x) -> bool:
    return isinstance(x, _thunder()[3])


def _shape(p) -> tuple:
    shape = tuple(p.shape)
    for s in shape:
        if not isinstance(s, int):
            raise _Unsupported(f"symbolic shape {shape} of {p.name}")
    return shape


def _leaf_kind(leaf) -> str:
    """'shape', 'elementwise' (codegen op name = prim name lower-cased); _Unsupported otherwise."""
    name = _prim_name(leaf)
    if name in _SHAPE_PRIMS:
        return "shape"
    if name in _PASS_PRIMS:
        return "pass"
    op = name.lower() if name else None
    if op is None or op == "const" or op not in _codegen_ops():
        raise _Unsupported(f"prim {leaf.sym.name} has no kernel code")
    return "elementwise"


def _leaf_output(leaf):
    out = leaf.output
    if not _is_tensor(out):
        raise _Unsupported(f"{leaf.sym.name} does not produce one tensor")
    return out


def view_only_bsym(bsym) -> bool:
    """True when every leaf of bsym is a shape prim (a view in PyTorch: better left outside
    kernels, since a kernel output would materialize it)."""
    try:
        leaves = _leaves(bsym, [])
    except _Unsupported:
        return False
    return bool(leaves) and all(_prim_name(l) in _SHAPE_PRIMS for l in leaves)


def fusible_bsym(bsym) -> bool:
    """Can bsym (at the level of a final execution trace, e.g. torch.nn.functional.relu) be part of
    one generated elementwise kernel?  All leaf prims supported, tensors of supported dtypes, at
    least one arithmetic leaf (pure views stay outside: see view_only_bsym), and the bound symbol
    on its own lowers to a valid region (shapes agree up to broadcasting)."""
    try:
        if getattr(bsym.sym, "is_fusion", False):
            return False
        outs = [o for o in bsym.flat_outs if o is not None]
        if not outs or not all(_is_tensor(o) for o in outs):
            return False
        leaves = _leaves(bsym, [])
        if all(_leaf_kind(l) == "shape" for l in leaves):
            return False
        inputs = []
        for a in bsym.flat_args:
            if (_is_tensor(a) or _is_number_proxy(a)) and all(a is not x for x in inputs):
                inputs.append(a)
        _lower([bsym], inputs, outs)
        return True
    except _Unsupported:
        return False
    except Exception:
        return False


# ---------------------------------------------------------------------------------------------
# Lowering (NOTE [lowering])


def _identity(n):
    return tuple(range(n))


def _seed_mapping(shape, S):
    """Right-aligned mapping of an output's dims onto S (numpy broadcasting)."""
    if len(shape) > len(S):
        raise _Unsupported(f"output of rank {len(shape)} in an iteration space of rank {len(S)}")
    off = len(S) - len(shape)
    m = []
    for i, s in enumerate(shape):
        ax = off + i
        if s == S[ax]:
            m.append(ax if s != 1 else ax)
        elif s == 1:
            m.append(None)
        else:
            raise _Unsupported(f"output shape {shape} does not broadcast to {S}")
    return tuple(m)


def _arg_mappings(leaf, m):
    """[(arg, mapping)] for the tensor arguments of leaf when its output is needed under m."""
    name = _prim_name(leaf)
    out = _leaf_output(leaf)
    out_shape = _shape(out)
    args = leaf.args
    if name == "BROADCAST_IN_DIM":
        a, bdims = args[0], tuple(args[2])
        a_shape = _shape(a)
        if len(bdims) != len(a_shape):
            raise _Unsupported("broadcast_in_dim: bad dims")
        am = []
        for i, d in enumerate(bdims):
            if a_shape[i] == 1 and out_shape[d] != 1:
                am.append(None)
            else:
                am.append(m[d])
        return [(a, tuple(am))]
    if name == "TRANSPOSE":
        a, perm = args[0], tuple(args[1])
        am = [None] * len(perm)
        for j, p in enumerate(perm):
            am[p] = m[j]
        return [(a, tuple(am))]
    if name == "SQUEEZE":
        a, dims = args[0], args[1]
        a_shape = _shape(a)
        dims = {d % len(a_shape) for d in (dims if isinstance(dims, (tuple, list)) else (dims,))}
        it = iter(m)
        return [(a, tuple(None if i in dims else next(it) for i in range(len(a_shape))))]
    if name in _PASS_PRIMS:
        if _shape(args[0]) != out_shape:
            raise _Unsupported(f"{leaf.sym.name} changes the shape")
        return [(args[0], m)]
    if name == "RESHAPE":
        a = args[0]
        a_shape = _shape(a)
        a_big = [i for i, s in enumerate(a_shape) if s != 1]
        o_big = [j for j, s in enumerate(out_shape) if s != 1]
        if [a_shape[i] for i in a_big] != [out_shape[j] for j in o_big]:
            raise _Unsupported("reshape other than adding/removing size-1 dims")
        am = [None] * len(a_shape)
        for i, j in zip(a_big, o_big):
            am[i] = m[j]
        return [(a, tuple(am))]
    # elementwise: tensor args have the output's shape
    res = []
    for a in args:
        if _is_tensor(a):
            if _shape(a) != out_shape:
                raise _Unsupported(f"{leaf.sym.name}: argument shape {a.shape} != output shape {out_shape}")
            res.append((a, m))
    return res


class _Program:
    """The lowered region: see csrc/cuda/mf_codegen.c NOTE [region format]."""

    def __init__(self):
        self.S = ()
        self.kinputs = []   # (kind, dtype name, arg position, mapping or None)
        self.instrs = []    # (op, args, dtype[, const])
        self.outputs = []   # (value id, guarded)
        self.out_info = []  # (shape, mapping, dtype name, position in the outputs list)
        self.n_out = 0      # len(outputs) given (duplicates map to the same kernel output)
        self.out_index = [] # per given output: index into self.outputs


def _lower(bsyms, inputs, outputs) -> _Program:
    leaves = []
    for b in bsyms:
        _leaves(b, leaves)
    if not leaves:
        raise _Unsupported("empty region")
    producer = {}
    for leaf in leaves:
        _leaf_kind(leaf)
        out = _leaf_output(leaf)
        _dtype_name(out.dtype)
        producer[out.name] = leaf
        for a in leaf.args:
            if _is_tensor(a):
                _dtype_name(a.dtype)
                _shape(a)
    in_pos = {}
    for i, p in enumerate(inputs):
        if _is_tensor(p) or _is_number_proxy(p):
            in_pos.setdefault(p.name, i)
    outs = list(outputs)
    if not outs:
        raise _Unsupported("region without outputs")
    for o in outs:
        if not _is_tensor(o):
            raise _Unsupported("non-tensor region output")
        if o.name not in producer:
            raise _Unsupported(f"output {o.name} is not computed in the region")
    shapes = [_shape(o) for o in outs]
    S = max(shapes, key=lambda s: (math.prod(s), len(s)))
    prog = _Program()
    prog.S = S

    # pass 1: backward, required mappings per value name
    required: dict[str, list] = {}

    def need(name, m):
        lst = required.setdefault(name, [])
        if m not in lst:
            lst.append(m)

    seen = {}
    for o, sh in zip(outs, shapes):
        if o.name in seen:
            continue
        m = _identity(len(S)) if sh == S else _seed_mapping(sh, S)
        seen[o.name] = m
        need(o.name, m)
    for leaf in reversed(leaves):
        out = leaf.output
        for m in list(required.get(out.name, ())):
            for a, am in _arg_mappings(leaf, m):
                if a.name not in producer and a.name not in in_pos:
                    raise _Unsupported(f"{a.name} is neither a region input nor computed in it")
                need(a.name, am)

    # pass 2: forward emission
    memo: dict = {}
    for name, pos in sorted(in_pos.items(), key=lambda kv: kv[1]):
        p = inputs[pos]
        if _is_tensor(p):
            for m in required.get(name, ()):
                memo[(name, m)] = len(prog.kinputs)
                prog.kinputs.append(("tensor", _dtype_name(p.dtype), pos, m))
    used_numbers = set()
    for leaf in leaves:
        for a in leaf.args:
            if _is_number_proxy(a):
                used_numbers.add(a.name)
    for name, pos in sorted(in_pos.items(), key=lambda kv: kv[1]):
        p = inputs[pos]
        if _is_number_proxy(p) and name in used_numbers:
            pt = getattr(p, "python_type", None)
            dt = "bool" if pt is bool else "int64" if pt is int else "float64" if pt is float else None
            if dt is None:
                raise _Unsupported(f"number input {name} of type {pt}")
            memo[(name, None)] = len(prog.kinputs)
            prog.kinputs.append(("scalar", dt, pos, None))
    n_in = len(prog.kinputs)
    consts: dict = {}

    def const_ref(x):
        if isinstance(x, bool):
            key, dt = ("b", bool(x)), "bool"
        elif isinstance(x, int):
            if not -(2**63) <= x < 2**63:
                raise _Unsupported("integer literal out of int64 range")
            key, dt = ("i", int(x)), "int64"
        elif isinstance(x, float):
            key, dt = ("f", struct.pack("<d", x)), "float64"
        else:
            raise _Unsupported(f"literal {x!r} of type {type(x).__name__}")
        if key not in consts:
            consts[key] = n_in + len(prog.instrs)
            prog.instrs.append(("const", (), dt, x if dt != "float64" else float(x)))
        return consts[key]

    def ref(a, m):
        if _is_tensor(a):
            return memo[(a.name, m)]
        if _is_number_proxy(a):
            if (a.name, None) in memo:
                return memo[(a.name, None)]
            v = getattr(a, "value", None)
            if isinstance(v, Number):
                return const_ref(v)
            raise _Unsupported(f"number {a.name} is not a region input")
        if isinstance(a, Number):
            return const_ref(a)
        raise _Unsupported(f"argument {a!r}")

    for leaf in leaves:
        out = leaf.output
        ms = required.get(out.name, ())
        if not ms:
            continue  # dead inside the region
        name = _prim_name(leaf)
        for m in ms:
            if name in _SHAPE_PRIMS or name in _PASS_PRIMS:
                (a, am), = _arg_mappings(leaf, m)
                memo[(out.name, m)] = memo[(a.name, am)]
                continue
            op = name.lower()
            if op == "convert_element_type":
                args = (ref(leaf.args[0], m),)
            else:
                if leaf.kwargs:
                    raise _Unsupported(f"{leaf.sym.name} with keyword arguments")
                if len(leaf.args) != _codegen_ops()[op]:
                    raise _Unsupported(f"{leaf.sym.name} with {len(leaf.args)} arguments")
                args = tuple(ref(a, m) for a in leaf.args)
            memo[(out.name, m)] = n_in + len(prog.instrs)
            prog.instrs.append((op, args, _dtype_name(out.dtype)))

    # outputs
    slot_of = {}
    for o, sh in zip(outs, shapes):
        if o.name in slot_of:
            prog.out_index.append(slot_of[o.name])
            continue
        m = seen[o.name]
        covered = {ax for ax in m if ax is not None}
        guarded = any(S[d] != 1 and d not in covered for d in range(len(S)))
        slot_of[o.name] = len(prog.outputs)
        prog.out_index.append(len(prog.outputs))
        prog.outputs.append((memo[(o.name, m)], guarded))
        prog.out_info.append((sh, m, _dtype_name(o.dtype)))
    prog.n_out = len(outs)
    # cheap structural check in C (also validates ops/dtypes combinations)
    try:
        _C.cuda_codegen(_region_tuple(prog, max(len(S), 1), False, False))
    except ValueError as e:
        raise _Unsupported(str(e)) from None
    return prog


def _region_tuple(prog: _Program, ndim: int, index64: bool, contiguous: bool):
    ins = [(k, dt) for k, dt, _, _ in prog.kinputs]
    return (ins, prog.instrs, prog.outputs, ndim, index64, contiguous)


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


@functools.lru_cache(maxsize=None)
def _device_info(device: int):
    _ensure_loader()
    return _C.cuda_device_info(device)  # (arch, sm count)


# NOTE [loaded kernels]: a loaded CUDA module is never unloaded (a kernel may still be
# queued on a stream when its region object dies, and cuModuleUnload would not wait for
# it).  So loads are shared process-wide: one module per (device, generated source),
# whatever region asked for it.  The source is a function of the region's program (ops,
# dtypes, scalars' kinds) and the variant, never of shapes or pointers, so recompiling a
# function, another trace with the same region, or a second instance of a model loads
# nothing new; the modules held are bounded by the distinct kernels the process generated.
_loaded_kernels: dict = {}  # (device, source) -> CUfunction int
_loaded_lock = threading.Lock()


def _shared(table: dict, lock, key, make):
    """table[key], made once by make() under lock (process-wide caches read without it)."""
    value = table.get(key)
    if value is None:
        with lock:
            value = table.get(key)
            if value is None:
                value = table[key] = make()
    return value


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


# ---------------------------------------------------------------------------------------------
# cuBLAS


_GEMM_DTYPES = ("float32", "float16", "bfloat16", "float64")
_INT_MAX = 2**31 - 1
_workspaces: dict = {}
_ws_lock = threading.Lock()


def _tf32_allowed() -> bool:
    """torch's setting for fp32 matmuls.  Reading the legacy allow_tf32 flag raises once a
    program has used the newer fp32_precision API (torch >= 2.9): then ask that one."""
    import torch

    matmul = torch.backends.cuda.matmul
    try:
        return bool(matmul.allow_tf32)
    except RuntimeError:
        return getattr(matmul, "fp32_precision", "ieee") == "tf32"


def _workspace(device, stream: int):
    """A PyTorch-allocated cuBLAS workspace per (device, stream) (NOTE [cublas workspace])."""
    import torch

    default = 4 << 20
    if device.type == "cuda":  # Hopper and later: cuBLAS's larger-tile kernels want 32 MiB
        arch, _ = _device_info(device.index if device.index is not None else torch.cuda.current_device())
        default = (32 << 20) if arch >= 90 else default
    nbytes = int(os.environ.get("THUNDER_MEMFUSE_CUBLAS_WORKSPACE", str(default)))
    if nbytes <= 0:
        return 0, 0
    ws = _shared(_workspaces, _ws_lock, (device, stream),
                 lambda: torch.empty(nbytes, dtype=torch.uint8, device=device))
    return ws.data_ptr(), ws.numel()


def _operand_layout(rows, cols, s0, s1):
    """('row', ld) or ('col', ld) for a rows x cols matrix with strides (s0, s1), or None."""
    if s1 == 1 or cols == 1:
        ld = s0 if rows > 1 else max(cols, 1)
        if ld >= max(1, cols):
            return "row", ld
    if s0 == 1 or rows == 1:
        ld = s1 if cols > 1 else max(rows, 1)
        if ld >= max(1, rows):
            return "col", ld
    return None


def _batch_stride(shape, strides):
    """One stride for all batch dims (after dropping size-1 dims), or None."""
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    if not dims:
        return 0
    for (n0, s0), (n1, s1) in zip(dims, dims[1:]):
        if s0 != s1 * n1:
            return None
    return dims[-1][1]


def _gemm(a, b, out, *, beta=0.0):
    """out[..., m, n] = a[..., m, k] @ b[..., k, n] (+ beta*out); batch dims already broadcast to
    out's; out contiguous."""
    import torch

    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    batch_shape = tuple(out.shape[:-2])
    batch = math.prod(batch_shape)
    if max(m, n, k, batch) > _INT_MAX:
        raise NotImplementedError("GEMM dimensions beyond 32-bit")

    def prep(t, rows, cols):
        lay = _operand_layout(rows, cols, t.stride(-2), t.stride(-1))
        bs = _batch_stride(t.shape[:-2], t.stride()[:-2]) if t.dim() > 2 else 0
        if lay is None or bs is None:
            t = t.contiguous()
            lay = _operand_layout(rows, cols, t.stride(-2), t.stride(-1))
            bs = _batch_stride(t.shape[:-2], t.stride()[:-2]) if t.dim() > 2 else 0
        return t, lay, bs

    a, (alay, lda), sa = prep(a, m, k)
    b, (blay, ldb), sb = prep(b, k, n)
    if max(lda, ldb, n) > _INT_MAX:
        raise NotImplementedError("GEMM leading dimension beyond 32-bit")
    # column-major: C^T (n x m) = op(B_cu) (n x k) @ op(A_cu) (k x m), with B_cu = b, A_cu = a
    transa = 0 if blay == "row" else 1
    transb = 0 if alay == "row" else 1
    dev = out.device.index if out.device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(out.device).cuda_stream
    ws, ws_bytes = _workspace(out.device, stream)
    dt = _torch_dtype_name(out.dtype)
    allow_tf32 = dt == "float32" and _tf32_allowed()
    _ensure_loader()
    _C.cublas_gemm(dev, stream, ws, ws_bytes, transa, transb, n, m, k,
                   b.data_ptr(), ldb, sb, a.data_ptr(), lda, sa, out.data_ptr(), n, m * n,
                   max(batch, 1), dt, 1.0, float(beta), allow_tf32)


def _check_blas_inputs(ts, path: str, dtypes, cuda: bool = True) -> None:
    """NotImplementedError for tensors the cuBLAS / cuBLASLt paths do not take (device, dtype,
    autograd).  cuda=False skips the CUDA-device check only (tests run the cuBLASLt path on a
    stand-in library)."""
    import torch

    dev, dtype = ts[0].device, ts[0].dtype
    for t in ts:
        if cuda and not t.is_cuda:
            raise NotImplementedError(f"{path} path needs CUDA tensors, got one on {t.device}")
        if t.device != dev:
            raise NotImplementedError(f"{path} path: tensors on {dev} and {t.device}")
        if t.dtype != dtype:
            raise NotImplementedError(f"{path} path: mixed dtypes {dtype} and {t.dtype}")
        if t.requires_grad and torch.is_grad_enabled():
            raise NotImplementedError(f"{path} path does not record autograd")
    if _torch_dtype_name(dtype) not in dtypes:
        raise NotImplementedError(f"{path} path: dtype {dtype} (covered: {', '.join(dtypes)})")


def _check_gemm_inputs(*ts):
    import torch

    if not all(isinstance(t, torch.Tensor) for t in ts):
        raise NotImplementedError("cuBLAS path takes tensors only")
    _check_blas_inputs(ts, "cuBLAS", _GEMM_DTYPES)


def _matmul_shapes(a, b, error):
    """torch.matmul's shape rules for a, b (at least 1-D each): (a2, b2, m, k, n, batch, result
    shape), a2/b2 with 1-D operands made 2-D; `error` (an exception class) for shapes that do not
    multiply or batch dims that do not broadcast."""
    import torch

    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    m, k = a2.shape[-2], a2.shape[-1]
    if b2.shape[-2] != k:
        raise error(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied")
    n = b2.shape[-1]
    ba, bb = tuple(a2.shape[:-2]), tuple(b2.shape[:-2])
    if ba == bb or not bb:  # the common cases, without torch.broadcast_shapes (~15 us a call)
        batch = ba
    elif not ba:
        batch = bb
    else:
        try:
            batch = tuple(torch.broadcast_shapes(ba, bb))
        except RuntimeError:
            raise error(f"matmul: batch dims of {tuple(a.shape)} and {tuple(b.shape)} do not broadcast") from None
    shape = list(batch) + ([m] if a.dim() != 1 else []) + ([n] if b.dim() != 1 else [])
    return a2, b2, m, k, n, batch, shape


def cuda_matmul(a, b):
    """torch.matmul(a, b) with cuBLAS on the current stream; output from PyTorch's allocator."""
    import torch

    _check_gemm_inputs(a, b)
    if a.dim() == 0 or b.dim() == 0:
        raise NotImplementedError("matmul of a 0-d tensor")
    a2, b2, m, k, n, batch, shape = _matmul_shapes(a, b, RuntimeError)
    a2 = a2.expand(*batch, m, k)
    b2 = b2.expand(*batch, k, n)
    out = torch.empty(*batch, m, n, dtype=a.dtype, device=a.device)
    if out.numel() != 0:
        if k == 0:
            out.zero_()
        else:
            _gemm(a2, b2, out)
    return out.view(shape)


def cuda_linear(x, w, bias=None):
    """torch.nn.functional.linear(x, w, bias) with cuBLAS (bias added as beta=1 on a pre-filled
    output, so no extra buffer); NotImplementedError for what it does not cover."""
    import torch

    _check_gemm_inputs(*([x, w] + ([bias] if bias is not None else [])))
    if w.dim() != 2 or x.dim() < 1 or x.shape[-1] != w.shape[1]:
        raise NotImplementedError("linear: unsupported shapes")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != w.shape[0]):
        raise NotImplementedError("linear: bias must be 1-D of out_features")
    n_in, n_out = w.shape[1], w.shape[0]
    if n_in == 0:
        raise NotImplementedError("linear: zero in_features")
    x2 = x.reshape(-1, n_in)
    M = x2.shape[0]
    out = torch.empty(M, n_out, dtype=x.dtype, device=x.device)
    if out.numel() != 0:
        if bias is not None:
            out.copy_(bias.expand(M, n_out))
        if n_in == 0:
            if bias is None:
                out.zero_()
        else:
            _gemm(x2, w.t(), out, beta=1.0 if bias is not None else 0.0)
    return out.view(*x.shape[:-1], n_out)


# ---------------------------------------------------------------------------------------------
# cuBLASLt: a GEMM with its activation (and bias) fused into the epilogue
#
# NOTE [cublasLt epilogue]
#   cuda_matmul_act / cuda_linear_act run relu(a @ b) / relu(x @ w.T + bias) as ONE cublasLtMatmul
#   (csrc/cuda/mf_cuda.c NOTE [cublasLt matmul]): the only memory they take is their output, from
#   torch.empty, so a planned region [matmul, relu] or [linear, relu] never materializes the
#   pre-activation.  The row-major problem is mapped to column-major as for cuBLAS (C^T = B^T A^T),
#   so the bias (out_features long) is a per-row vector of the column-major result, which is what
#   the BIAS epilogue adds.  Anything that would need another buffer (a copy of an operand with an
#   unsupported layout) or that cuBLASLt does not cover raises NotImplementedError, and the caller
#   runs the torch ops instead.

_LT_DTYPES = ("float32", "float16", "bfloat16")
_LT_ACTS = ("relu",)


def _check_act(act) -> None:
    if not isinstance(act, str):
        raise TypeError(f"act must be a str, not {type(act).__name__}")
    if act not in _LT_ACTS:
        raise NotImplementedError(f"cuBLASLt epilogue: activation {act!r} is not fused (only 'relu')")


def _check_tensor_args(**named) -> None:
    import torch

    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")


def _check_lt_inputs(*ts, cuda=True) -> None:
    _check_blas_inputs(ts, "cuBLASLt", _LT_DTYPES, cuda)


def _lt_problem(a, b, out, bias) -> tuple:
    """The problem part of _C.cublaslt_matmul's arguments for out[..., m, n] = a[..., m, k] @
    b[..., k, n] (+ bias[n]), row-major, as the column-major out^T = b^T a^T: (transa, transb, m, n,
    k, A, lda, stride_a, B, ldb, stride_b, D, ldd, stride_d, batch, dtype, bias pointer or 0).  Batch
    dims are already broadcast to out's (stride 0 where expanded); out is contiguous.  No copies:
    NotImplementedError for an operand that is neither row- nor column-major or whose batch dims do
    not collapse to one stride.  Pure (works on CPU tensors, for tests)."""
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    batch = math.prod(out.shape[:-2])
    if max(m, n, k, batch) > _INT_MAX:
        raise NotImplementedError("cuBLASLt path: GEMM dimensions beyond 32-bit")

    def layout(t, rows, cols, what):
        lay = _operand_layout(rows, cols, t.stride(-2), t.stride(-1))
        bs = _batch_stride(t.shape[:-2], t.stride()[:-2]) if t.dim() > 2 else 0
        if lay is None or bs is None:
            raise NotImplementedError(
                f"cuBLASLt path: {what} of shape {tuple(t.shape)} and strides {t.stride()} would need a copy")
        return lay, bs

    (alay, lda), sa = layout(a, m, k, "the left operand")
    (blay, ldb), sb = layout(b, k, n, "the right operand")
    if max(lda, ldb, n) > _INT_MAX:
        raise NotImplementedError("cuBLASLt path: leading dimension beyond 32-bit")
    bias_ptr = 0
    if bias is not None:
        if bias.shape != (n,) or (n > 1 and bias.stride(0) != 1):
            raise NotImplementedError(f"cuBLASLt path: bias must be a contiguous vector of {n}")
        bias_ptr = bias.data_ptr()
    # column-major: out^T (n x m) = op(b) (n x k) @ op(a) (k x m), so cuBLASLt's A is b and its B is a
    transa = 0 if blay == "row" else 1
    transb = 0 if alay == "row" else 1
    return (transa, transb, n, m, k, b.data_ptr(), ldb, sb, a.data_ptr(), lda, sa,
            out.data_ptr(), n, m * n, max(batch, 1), _torch_dtype_name(out.dtype), bias_ptr)


def _lt_gemm(a, b, out, bias, act) -> None:
    """One cublasLtMatmul on the current stream with PyTorch's workspace (NOTE [cublas workspace])."""
    import torch

    (transa, transb, m, n, k, pa, lda, sa, pb, ldb, sb, pd, ldd, sd, batch, dt,
     bias_ptr) = _lt_problem(a, b, out, bias)
    dev = out.device.index if out.device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(out.device).cuda_stream
    ws, ws_bytes = _workspace(out.device, stream)
    allow_tf32 = dt == "float32" and _tf32_allowed()
    _ensure_loader()
    _C.cublaslt_matmul(dev, stream, ws, ws_bytes, transa, transb, m, n, k, pa, lda, sa, pb, ldb, sb,
                       pd, ldd, sd, batch, dt, allow_tf32, bias_ptr, act)


def cuda_linear_act(x, w, bias=None, act="relu"):
    """torch.relu(torch.nn.functional.linear(x, w, bias)) as ONE cuBLASLt call (RELU or RELU_BIAS
    epilogue); the pre-activation is never stored.  x: any leading dims (flattened to 2-D without a
    copy), w: 2-D, bias: 1-D of out_features or None.  TypeError for non-tensors, ValueError for
    shapes that do not fit, NotImplementedError for what this path does not cover (the caller falls
    back to the torch ops): another act, CPU tensors, mixed devices/dtypes, dtypes other than
    float32/float16/bfloat16, autograd, zero in_features, operand layouts that would need a copy,
    libcublasLt missing or without an algorithm for the problem."""
    import torch

    _check_tensor_args(x=x, w=w, **({} if bias is None else {"bias": bias}))
    _check_act(act)
    if w.dim() != 2:
        raise ValueError(f"linear: weight must be 2-D, got shape {tuple(w.shape)}")
    if x.dim() < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear: input of shape {tuple(x.shape)} does not match weight {tuple(w.shape)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != w.shape[0]):
        raise ValueError(f"linear: bias of shape {tuple(bias.shape)} for {w.shape[0]} out_features")
    _check_lt_inputs(*([x, w] + ([bias] if bias is not None else [])))
    n_in, n_out = w.shape[1], w.shape[0]
    if n_in == 0:
        raise NotImplementedError("cuBLASLt path: linear with zero in_features")
    try:
        x2 = x.view(-1, n_in)
    except RuntimeError:
        raise NotImplementedError(
            f"cuBLASLt path: input of shape {tuple(x.shape)} and strides {x.stride()} does not flatten "
            "to 2-D without a copy") from None
    out = torch.empty(*x.shape[:-1], n_out, dtype=x.dtype, device=x.device)
    if out.numel() != 0:
        _lt_gemm(x2, w.t(), out.view(x2.shape[0], n_out), bias, act)
    return out


def cuda_matmul_act(a, b, act="relu"):
    """torch.relu(torch.matmul(a, b)) as ONE cuBLASLt call (RELU epilogue); the pre-activation is
    never stored.  1-D operands follow torch.matmul; batch dims broadcast (a batched left operand
    times a 2-D right one is one GEMM with the batch folded into the rows when a's layout allows,
    otherwise a strided-batched call, stride 0 for broadcast operands).  Errors as cuda_linear_act."""
    import torch

    _check_tensor_args(a=a, b=b)
    _check_act(act)
    if a.dim() == 0 or b.dim() == 0:
        raise ValueError("matmul: both operands need at least one dimension")
    a2, b2, m, k, n, batch, shape = _matmul_shapes(a, b, ValueError)
    _check_lt_inputs(a, b)
    out = torch.empty(*batch, m, n, dtype=a.dtype, device=a.device)
    if out.numel() != 0:
        if k == 0:
            out.zero_()  # relu(0) == 0
        else:
            folded = None
            if b2.dim() == 2 and a2.dim() > 2:
                try:
                    folded = a2.view(-1, k)
                except RuntimeError:
                    folded = None
            if folded is not None:
                _lt_gemm(folded, b2, out.view(-1, n), None, act)
            else:
                _lt_gemm(a2.expand(*batch, m, k), b2.expand(*batch, k, n), out, None, act)
    return out.view(shape)
