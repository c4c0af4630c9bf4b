"""The CUDA paths on a real GPU: generated kernels and cuBLAS against eager PyTorch.

Skipped with reason "CUDA not available" when torch.cuda.is_available() is False.  Run on a GPU
machine with benchmarks/gpu_check.sh.
"""
from __future__ import annotations

import math

import pytest
import torch

import thunder_memfuse  # noqa: F401
from thunder_memfuse import _C
from thunder_memfuse.regions import nvrtc as K

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available"),
]

from test_codegen import (  # noqa: E402  (shared tables and reference functions)
    CASES,
    DTYPES,
    EMU_OPS,
    TOL,
    _env,
    _thunder_region,
    make_input,
    op_region,
    pack_params,
    plan_inputs,
    torch_ref,
)

DEV = "cuda"


def _arch():
    return torch.cuda.get_device_capability()[0] * 10 + torch.cuda.get_device_capability()[1]


def run_raw_region_cuda(reg, tensors, scalars=(), out_shape=None):
    """Launch a hand-written region tuple on CUDA tensors whose shapes equal the iteration space."""
    inputs, instrs, outputs, ndim, index64, contiguous = reg
    S = tuple(out_shape or tensors[0].shape)
    numel = math.prod(S)
    vdt = [dt for _, dt in inputs] + [i[2] for i in instrs]
    outs = [torch.empty(S, dtype=getattr(torch, vdt[v]), device=DEV) for v, _ in outputs]
    if numel == 0:
        return outs
    nd = 1 if contiguous else len(S)
    params = pack_params(S, list(tensors) + outs, contiguous, scalars)
    src = _C.cuda_codegen((inputs, instrs, outputs, nd, index64, contiguous))
    res = K.nvrtc_compile(src, _arch())
    dev = torch.cuda.current_device()
    fn = _C.cuda_load_function(res["image"], "mf_kernel", dev)
    grid = max(1, min((numel + 255) // 256, 65535))
    _C.cuda_launch(fn, dev, grid, 256, torch.cuda.current_stream().cuda_stream, params)
    return outs


def test_status_on_gpu():
    st = K.cuda_status()
    assert st["driver"]["found"], st["driver"]["error"]
    assert st["driver"]["device_count"] >= 1
    assert st["nvrtc"]["found"], st["nvrtc"]["error"]
    assert st["can_run"]
    arch, sms = _C.cuda_device_info(torch.cuda.current_device())
    assert arch == _arch() and sms > 0


@pytest.mark.parametrize("variant", [(2, False, False), (1, False, True), (2, True, False)],
                         ids=["strided32", "contiguous", "strided64"])
@pytest.mark.parametrize("op", EMU_OPS)
def test_every_op_and_dtype_against_eager(op, variant):
    ndim, index64, contiguous = variant
    reg, plan = op_region(op, DTYPES, ndim=ndim, index64=index64, contiguous=contiguous)
    shape = (33, 65)
    tensors = [t.to(DEV) for t in plan_inputs(op, plan, shape)]
    if not contiguous:
        tensors[0] = tensors[0].t().contiguous().t()
    outs = run_raw_region_cuda(reg if contiguous else reg, tensors)
    pos = 0
    for (dt, od, args), got in zip(plan, outs):
        xs = tensors[pos:pos + len(args)]
        pos += len(args)
        want = torch_ref(op, od, *xs).to(got.dtype)
        if got.dtype.is_floating_point:
            torch.testing.assert_close(got, want, equal_nan=True, **TOL[od], msg=lambda m: f"{op} {dt}: {m}")
        else:
            assert torch.equal(got, want), (op, dt)


@pytest.mark.parametrize("case", sorted(CASES))
def test_thunder_regions_against_eager(case):
    fn, make = CASES[case]
    torch.manual_seed(0)
    args_cpu = make()
    tr, bsyms, inputs, outs, _ = _thunder_region(fn, *args_cpu)
    region = K.build_cuda_region(bsyms, inputs, outs)
    args = tuple(a.to(DEV) for a in args_cpu)
    env = _env(tr, args_cpu, inputs)
    call_args = [env[p.name].to(DEV) for p in inputs]
    got = region(*call_args)
    expected = fn(*args)
    exp = expected if isinstance(expected, (tuple, list)) else (expected,)
    ret = tr.bound_symbols[-1].args[0]
    ret = ret if isinstance(ret, (tuple, list)) else [ret]
    by_name = {o.name: g for o, g in zip(outs, got)}
    for proxy, want in zip(ret, exp):
        if proxy.name in by_name:
            g = by_name[proxy.name]
            assert g.is_cuda and g.shape == want.shape and g.dtype == want.dtype
            if g.dtype.is_floating_point:
                torch.testing.assert_close(g, want, **TOL[str(g.dtype).replace("torch.", "")])
            else:
                assert torch.equal(g, want)


def _relu_add_region():
    fn = lambda x, y: torch.nn.functional.relu(x) + y  # noqa: E731
    tr, bsyms, inputs, outs, _ = _thunder_region(fn, torch.randn(64, 48), torch.randn(48))
    return K.build_cuda_region(bsyms, inputs, outs)


def test_broadcast_strided_and_sliced_inputs():
    region = _relu_add_region()
    x = torch.randn(64, 96, device=DEV)[:, ::2]        # strided
    y = torch.randn(48, 2, device=DEV)[:, 1]           # strided 1-D
    (out,) = region(x, y)
    torch.testing.assert_close(out, torch.relu(x) + y)
    xt = torch.randn(48, 64, device=DEV).t()           # transposed
    (out,) = region(xt, y)
    torch.testing.assert_close(out, torch.relu(xt) + y)
    ye = torch.randn(1, device=DEV).expand(48)         # stride 0
    (out,) = region(xt, ye)
    torch.testing.assert_close(out, torch.relu(xt) + ye)


def test_empty_tensors():
    fn = lambda x, y: torch.nn.functional.relu(x) * y  # noqa: E731
    tr, bsyms, inputs, outs, _ = _thunder_region(fn, torch.randn(0, 5), torch.randn(0, 5))
    region = K.build_cuda_region(bsyms, inputs, outs)
    (out,) = region(torch.randn(0, 5, device=DEV), torch.randn(0, 5, device=DEV))
    assert out.shape == (0, 5) and out.is_cuda


def test_current_stream_is_used():
    region = _relu_add_region()
    x = torch.randn(64, 48, device=DEV)
    y = torch.randn(48, device=DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        (out,) = region(x, y)
    s.synchronize()
    torch.testing.assert_close(out, torch.relu(x) + y)


def test_compiled_kernel_is_cached():
    region = _relu_add_region()
    x = torch.randn(64, 48, device=DEV)
    y = torch.randn(48, device=DEV)
    region(x, y)
    before = _C.cuda_cache_stats()
    region2 = _relu_add_region()
    region2(x, y)
    after = _C.cuda_cache_stats()
    assert after["compiles"] == before["compiles"]  # same source: memory cache


def _free_bytes():
    free, _ = torch.cuda.mem_get_info()
    return free


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.mem_get_info()[0] < 12 * 2**30,
                    reason="needs 12 GiB free GPU memory")
def test_large_tensor_uses_64bit_indexing():
    n = 2**31 + 1000
    # a raw region, 64-bit contiguous variant
    reg = ([("tensor", "int8")], [("const", (), "int64", 1), ("add", (0, 1), "int8")], [(2, False)], 1, True, True)
    big = torch.full((n,), 3, dtype=torch.int8, device=DEV)
    (out,) = run_raw_region_cuda(reg, [big])
    assert out[-1].item() == 4 and out[0].item() == 4 and int(out.sum(dtype=torch.int64)) == 4 * n
    del big, out
    torch.cuda.empty_cache()
    # the region path picks the 64-bit variant by itself
    region_fn = lambda x: torch.nn.functional.relu(x)  # noqa: E731
    tr, bsyms, inputs, outs, _ = _thunder_region(region_fn, torch.zeros(2, 4, dtype=torch.int8))
    r = K.build_cuda_region(bsyms, inputs, outs)
    r.prog.S = (2, n // 2)  # same program, larger shape (shapes are kernel arguments)
    r._expect = {p: (dt, (2, n // 2)) for p, (dt, _) in r._expect.items()}
    r.prog.out_info = [((2, n // 2), m, d) for _, m, d in r.prog.out_info]
    big = torch.full((2, n // 2), -2, dtype=torch.int8, device=DEV)
    big[1, -1] = 7
    o, _ = r.allocate_outputs(big.device)
    variant, numel, _ = r.launch_params([big], o)
    assert variant[1] is True
    (out,) = r(big)
    assert out[1, -1].item() == 7 and out[0, 0].item() == 0


def test_region_memory_is_exactly_its_outputs():
    region = _relu_add_region()
    x = torch.randn(64, 48, device=DEV)
    y = torch.randn(48, device=DEV)
    region(x, y)  # warm up: compile and load
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.max_memory_allocated()
    (out,) = region(x, y)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    assert peak == torch.cuda.memory_allocated() - before
    assert peak == math.ceil(out.numel() * out.element_size() / 512) * 512


# ---------------------------------------------------------------------------------------------
# cuBLAS


MM_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
MM_TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float16: dict(rtol=2e-2, atol=2e-2),
          torch.bfloat16: dict(rtol=5e-2, atol=5e-2), torch.float64: dict(rtol=1e-10, atol=1e-10)}


@pytest.mark.parametrize("dtype", MM_DTYPES, ids=str)
@pytest.mark.parametrize(
    "sa, sb",
    [((64, 32), (32, 48)), ((1, 32), (32, 1)), ((32,), (32, 16)), ((16, 32), (32,)), ((32,), (32,)),
     ((3, 64, 32), (3, 32, 16)), ((3, 64, 32), (32, 16)), ((64, 32), (5, 32, 16)),
     ((2, 1, 8, 4), (3, 4, 6)), ((0, 4), (4, 5)), ((4, 0), (0, 5))],
)
def test_matmul_against_torch(dtype, sa, sb):
    a = torch.randn(sa, device=DEV, dtype=dtype)
    b = torch.randn(sb, device=DEV, dtype=dtype)
    got = K.cuda_matmul(a, b)
    want = torch.matmul(a, b)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, **MM_TOL[dtype])


@pytest.mark.parametrize("dtype", MM_DTYPES, ids=str)
def test_matmul_transposed_and_strided_operands(dtype):
    a = torch.randn(32, 64, device=DEV, dtype=dtype).t()          # column-major
    b = torch.randn(48, 32, device=DEV, dtype=dtype).t()
    torch.testing.assert_close(K.cuda_matmul(a, b), a @ b, **MM_TOL[dtype])
    c = torch.randn(64, 80, device=DEV, dtype=dtype)[:, 8:40]     # row stride 80
    torch.testing.assert_close(K.cuda_matmul(c, b), c @ b, **MM_TOL[dtype])
    d = torch.randn(64, 32, 2, device=DEV, dtype=dtype)[:, :, 0]  # neither layout: copied
    torch.testing.assert_close(K.cuda_matmul(d, b), d @ b, **MM_TOL[dtype])
    e = torch.randn(4, 32, 64, device=DEV, dtype=dtype).transpose(1, 2)  # batched, column-major
    f = torch.randn(4, 32, 16, device=DEV, dtype=dtype)
    torch.testing.assert_close(K.cuda_matmul(e, f), e @ f, **MM_TOL[dtype])


@pytest.mark.parametrize("dtype", MM_DTYPES, ids=str)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("xshape", [(64, 32), (2, 3, 32), (32,)])
def test_linear_against_torch(dtype, bias, xshape):
    x = torch.randn(xshape, device=DEV, dtype=dtype)
    w = torch.randn(48, 32, device=DEV, dtype=dtype)
    b = torch.randn(48, device=DEV, dtype=dtype) if bias else None
    got = K.cuda_linear(x, w, b)
    want = torch.nn.functional.linear(x, w, b)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, **MM_TOL[dtype])


def test_gemm_unsupported_dtypes_fall_back():
    a = torch.randint(0, 5, (4, 4), device=DEV)
    with pytest.raises(NotImplementedError):
        K.cuda_matmul(a, a)
    with pytest.raises(NotImplementedError):
        K.cuda_matmul(torch.randn(4, 4), torch.randn(4, 4))


def second_call_peak(f, *args):
    """(result, peak bytes allocated above the start) of f(*args), called once before to warm up
    (cuBLAS/cuBLASLt handle and workspace)."""
    f(*args)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.max_memory_allocated()
    out = f(*args)
    torch.cuda.synchronize()
    return out, torch.cuda.max_memory_allocated() - before


def test_matmul_memory_is_exactly_its_output():
    a = torch.randn(256, 256, device=DEV)
    b = torch.randn(256, 256, device=DEV)
    out, peak = second_call_peak(K.cuda_matmul, a, b)
    assert peak == out.numel() * out.element_size()
    torch.testing.assert_close(out, a @ b, **MM_TOL[torch.float32])


def test_matmul_on_side_stream():
    a = torch.randn(128, 128, device=DEV)
    b = torch.randn(128, 128, device=DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = K.cuda_matmul(a, b)
    s.synchronize()
    torch.testing.assert_close(out, a @ b, **MM_TOL[torch.float32])


# ---------------------------------------------------------------------------------------------
# cuBLASLt: GEMM with the relu (and bias) fused into the epilogue


LT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(scope="module")
def cublaslt():
    entry = K.cuda_status()["cublaslt"]
    # every CUDA build of torch ships libcublasLt (and has usually loaded it already)
    assert entry["found"], entry["error"]
    assert entry["version"], entry
    return entry


def _ref_linear_act(x, w, b):
    return torch.relu(torch.nn.functional.linear(x, w, b))


@pytest.mark.parametrize("dtype", LT_DTYPES, ids=str)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("mkn", [(1, 1, 1), (7, 13, 5), (257, 129, 65), (64, 32, 48)], ids=str)
def test_linear_act_against_torch(cublaslt, dtype, bias, mkn):
    M, K_, N = mkn
    x = torch.randn(M, K_, device=DEV, dtype=dtype)
    w = torch.randn(N, K_, device=DEV, dtype=dtype)
    b = torch.randn(N, device=DEV, dtype=dtype) if bias else None
    got = K.cuda_linear_act(x, w, b)
    want = _ref_linear_act(x, w, b)
    assert got.shape == want.shape and got.dtype == want.dtype and got.device == want.device
    torch.testing.assert_close(got, want, **MM_TOL[dtype])
    assert (got >= 0).all()


def test_linear_act_propagates_nan_like_torch(cublaslt):
    """torch.relu keeps NaN; if cuBLASLt's RELU epilogue computes max(x, 0) with fmaxf
    semantics it would turn a NaN pre-activation into 0.  Users debugging NaNs rely on them
    surviving, so a difference here means the epilogue must not be used for relu."""
    x = torch.randn(4, 32, device=DEV)
    x[1, 3] = float("nan")
    w = torch.randn(16, 32, device=DEV)
    got = K.cuda_linear_act(x, w)
    want = _ref_linear_act(x, w, None)
    assert torch.equal(torch.isnan(got), torch.isnan(want)), "NaN handling differs from torch.relu"


@pytest.mark.parametrize("dtype", LT_DTYPES, ids=str)
@pytest.mark.parametrize("xshape", [(2, 3, 32), (4, 1, 5, 32), (32,)], ids=str)
def test_linear_act_leading_dims(cublaslt, dtype, xshape):
    x = torch.randn(xshape, device=DEV, dtype=dtype)
    w = torch.randn(48, 32, device=DEV, dtype=dtype)
    b = torch.randn(48, device=DEV, dtype=dtype)
    got = K.cuda_linear_act(x, w, b)
    want = _ref_linear_act(x, w, b)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, **MM_TOL[dtype])


@pytest.mark.parametrize("dtype", LT_DTYPES, ids=str)
@pytest.mark.parametrize(
    "sa, sb",
    [((1, 1), (1, 1)), ((7, 13), (13, 5)), ((257, 129), (129, 65)), ((32,), (32, 16)), ((16, 32), (32,)),
     ((32,), (32,)), ((3, 64, 32), (3, 32, 16)), ((3, 64, 32), (32, 16)), ((64, 32), (5, 32, 16)),
     ((2, 3, 8, 4), (4, 6)), ((0, 4), (4, 5)), ((4, 0), (0, 5)), ((3, 0, 4), (4, 2))],
    ids=str,
)
def test_matmul_act_against_torch(cublaslt, dtype, sa, sb):
    a = torch.randn(sa, device=DEV, dtype=dtype)
    b = torch.randn(sb, device=DEV, dtype=dtype)
    got = K.cuda_matmul_act(a, b)
    want = torch.relu(torch.matmul(a, b))
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, **MM_TOL[dtype])


@pytest.mark.parametrize("dtype", LT_DTYPES, ids=str)
def test_act_non_contiguous_inputs(cublaslt, dtype):
    """Row- or column-major operands (any leading dimension) run in place; layouts that would need a
    copy raise NotImplementedError (the caller falls back to torch)."""
    tol = MM_TOL[dtype]
    w = torch.randn(48, 32, device=DEV, dtype=dtype)
    b = torch.randn(48, device=DEV, dtype=dtype)
    xt = torch.randn(32, 64, device=DEV, dtype=dtype).t()              # column-major
    torch.testing.assert_close(K.cuda_linear_act(xt, w, b), _ref_linear_act(xt, w, b), **tol)
    wt = torch.randn(32, 48, device=DEV, dtype=dtype).t()              # transposed weight
    x = torch.randn(64, 32, device=DEV, dtype=dtype)
    torch.testing.assert_close(K.cuda_linear_act(x, wt, b), _ref_linear_act(x, wt, b), **tol)
    xp = torch.randn(64, 40, device=DEV, dtype=dtype)[:, :32]         # padded rows (ld 40)
    torch.testing.assert_close(K.cuda_linear_act(xp, w, b), _ref_linear_act(xp, w, b), **tol)
    # a start one element past an aligned allocation: the heuristic is told the real alignment; it
    # may have no kernel for it, which must then be a clean NotImplementedError, never a bad launch
    x1 = torch.randn(64 * 32 + 1, device=DEV, dtype=dtype)[1:].view(64, 32)
    try:
        got = K.cuda_linear_act(x1, w, b)
    except NotImplementedError as e:
        assert "found no algorithm" in str(e), e
    else:
        torch.testing.assert_close(got, _ref_linear_act(x1, w, b), **tol)
    e = torch.randn(4, 32, 64, device=DEV, dtype=dtype).transpose(1, 2)  # batch of column-major
    f = torch.randn(32, 16, device=DEV, dtype=dtype)
    torch.testing.assert_close(K.cuda_matmul_act(e, f), torch.relu(e @ f), **tol)
    g = torch.randn(4, 32, 16, device=DEV, dtype=dtype)
    torch.testing.assert_close(K.cuda_matmul_act(e, g), torch.relu(e @ g), **tol)
    with pytest.raises(NotImplementedError, match="would need a copy"):
        K.cuda_linear_act(torch.randn(64, 32, 2, device=DEV, dtype=dtype)[:, :, 0], w, b)
    with pytest.raises(NotImplementedError, match="does not flatten"):
        K.cuda_linear_act(torch.randn(5, 2, 32, device=DEV, dtype=dtype).transpose(0, 1), w, b)
    with pytest.raises(NotImplementedError, match="contiguous vector"):
        K.cuda_linear_act(x, w, torch.randn(96, device=DEV, dtype=dtype)[::2])


def test_act_zero_sizes(cublaslt):
    w = torch.randn(48, 32, device=DEV)
    assert K.cuda_linear_act(torch.randn(0, 32, device=DEV), w).shape == (0, 48)
    assert K.cuda_linear_act(torch.randn(2, 0, 32, device=DEV), w).shape == (2, 0, 48)
    z = K.cuda_matmul_act(torch.randn(5, 0, device=DEV), torch.randn(0, 3, device=DEV))
    assert torch.equal(z, torch.zeros(5, 3, device=DEV))
    with pytest.raises(NotImplementedError, match="zero in_features"):
        K.cuda_linear_act(torch.randn(4, 0, device=DEV), torch.randn(3, 0, device=DEV))


def test_act_unsupported_fall_back(cublaslt):
    a = torch.randn(8, 8, device=DEV, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match="dtype torch.float64"):
        K.cuda_matmul_act(a, a)
    with pytest.raises(NotImplementedError, match="mixed dtypes"):
        K.cuda_matmul_act(a.float(), a.half())
    with pytest.raises(NotImplementedError, match="needs CUDA tensors"):
        K.cuda_matmul_act(a.float().cpu(), a.float())
    with pytest.raises(NotImplementedError, match="only 'relu'"):
        K.cuda_matmul_act(a.float(), a.float(), act="gelu")
    r = torch.randn(8, 8, device=DEV, requires_grad=True)
    with pytest.raises(NotImplementedError, match="autograd"):
        K.cuda_matmul_act(r, r)


@pytest.mark.parametrize("bias", [False, True])
def test_linear_act_memory_is_exactly_its_output(cublaslt, bias):
    x = torch.randn(256, 128, device=DEV)
    w = torch.randn(192, 128, device=DEV)
    b = torch.randn(192, device=DEV) if bias else None
    out, peak = second_call_peak(K.cuda_linear_act, x, w, b)
    assert peak == out.numel() * out.element_size()  # no pre-activation buffer
    torch.testing.assert_close(out, _ref_linear_act(x, w, b), **MM_TOL[torch.float32])


def test_matmul_act_memory_is_exactly_its_output(cublaslt):
    a = torch.randn(4, 64, 128, device=DEV, dtype=torch.float16)
    b = torch.randn(128, 256, device=DEV, dtype=torch.float16)
    out, peak = second_call_peak(K.cuda_matmul_act, a, b)
    assert peak == out.numel() * out.element_size()
    torch.testing.assert_close(out, torch.relu(a @ b), **MM_TOL[torch.float16])


def test_act_on_side_stream(cublaslt):
    x = torch.randn(128, 64, device=DEV)
    w = torch.randn(96, 64, device=DEV)
    b = torch.randn(96, device=DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = K.cuda_linear_act(x, w, b)
    s.synchronize()
    torch.testing.assert_close(out, _ref_linear_act(x, w, b), **MM_TOL[torch.float32])
