"""cuBLAS GEMMs and cuBLASLt GEMMs with a fused activation epilogue, on PyTorch's current stream,
outputs from PyTorch's allocator (regions/nvrtc/__init__.py NOTE [gemm regions], NOTE [epilogue regions])."""
from __future__ import annotations

import math
import os
import threading

from ... import _C
from .loader import _device_info, _ensure_loader, _shared
from .lowering import _torch_dtype_name

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
    if ba == bb or not bb:  # the common cases, without torch.broadcast_shapes (a costly call here)
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


def _check_linear_shapes(x, w, bias):
    """ValueError for shapes torch.nn.functional.linear rejects too (both linear paths)."""
    if w.dim() != 2:
        raise ValueError(f"linear: weight must be 2-D, got shape {tuple(w.shape)}")
    if x.dim() < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear: input of shape {tuple(x.shape)} does not match weight {tuple(w.shape)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != w.shape[0]):
        raise ValueError(f"linear: bias of shape {tuple(bias.shape)} for {w.shape[0]} out_features")


def cuda_linear(x, w, bias=None):
    """torch.nn.functional.linear(x, w, bias) with cuBLAS (bias added as beta=1 on a pre-filled
    output, so no extra buffer); ValueError for shapes that do not fit, NotImplementedError for
    what it does not cover."""
    import torch

    _check_gemm_inputs(*([x, w] + ([bias] if bias is not None else [])))
    _check_linear_shapes(x, w, bias)
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
#   (csrc/cuda/mf_cuda_blas.c NOTE [cublasLt matmul]): the only memory they take is their output, from
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
    _check_linear_shapes(x, w, bias)
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
