"""cuBLASLt GEMM + fused epilogue on CPU: the real libcublasLt's loader entry, argument checks, and the
whole path (kernels.cuda_linear_act / cuda_matmul_act -> _C.cublaslt_matmul ->
mf_cuda_lt_matmul_run) against stand-in libraries.

tests/stubs/fake_cuda.c and fake_cublaslt.c are built here (gcc) into libcuda.so.1 and
libcublasLt.so.13.  The fake cuBLASLt checks attribute sizes and layouts as cublasLt.h documents
them and computes D = epilogue(op(A) op(B) [+ bias]) on host memory, so CPU tensors' pointers can be
passed through the real C code.  Each check runs in a fresh interpreter whose loader only searches
the stub folder (library state is process-wide).  What this cannot show: that the real cuBLASLt
agrees with the stand-in; tests/test_gpu.py checks that on a GPU.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import thunder_memfuse  # noqa: F401
from thunder_memfuse import _C
from thunder_memfuse.regions import nvrtc as K

HERE = os.path.dirname(os.path.abspath(__file__))
STUBS = os.path.join(HERE, "stubs")


# ---------------------------------------------------------------------------------------------
# The real library (nvidia-cublas wheel, pinned in the test extras): loader and status


def _wheel_cublaslt():
    for d in K.library_search_dirs():
        hits = sorted(glob.glob(os.path.join(d, "libcublasLt.so.*")))
        if hits:
            return hits[0]
    return None


def test_status_has_cublaslt():
    st = K.cuda_status()
    entry = st["cublaslt"]
    assert entry["library"] == "cuBLASLt"
    assert set(entry) >= {"found", "path", "error", "how", "version"}
    if entry["found"]:
        assert os.path.exists(entry["path"]) and "libcublasLt.so" in entry["path"]
    else:
        assert entry["error"] and "libcublasLt.so.13" in entry["error"]


def test_loader_finds_wheel_cublaslt():
    wheel = _wheel_cublaslt()
    if wheel is None:
        pytest.skip("the nvidia cublas wheel is not installed (test extras pin nvidia-cublas==13.1.1.3)")
    st = K.cuda_status()
    entry = st["cublaslt"]
    # found means every required symbol of MF_CUDA_CUBLASLT_SYMBOLS resolved (mf_cuda_load.c resolve())
    assert entry["found"], entry["error"]
    assert os.path.realpath(entry["path"]) == os.path.realpath(wheel)
    # the optional cublasLtGetVersion resolved too, and agrees with the soname's major version
    major = int(wheel.rsplit(".so.", 1)[1].split(".")[0])
    assert entry["version"] and int(entry["version"].split(".")[0]) == major


def test_argument_checks_on_cpu():
    x, w, b = torch.randn(4, 3), torch.randn(5, 3), torch.randn(5)
    with pytest.raises(NotImplementedError, match="needs CUDA tensors"):
        K.cuda_linear_act(x, w, b)
    with pytest.raises(NotImplementedError, match="needs CUDA tensors"):
        K.cuda_matmul_act(x, w.t())
    with pytest.raises(NotImplementedError, match="only 'relu'"):
        K.cuda_linear_act(x, w, b, act="gelu")
    with pytest.raises(NotImplementedError, match="only 'relu'"):
        K.cuda_matmul_act(x, w.t(), act="tanh")
    with pytest.raises(TypeError, match="act must be a str"):
        K.cuda_matmul_act(x, w.t(), act=None)
    with pytest.raises(TypeError, match="w must be a torch.Tensor"):
        K.cuda_linear_act(x, [[1.0]])
    with pytest.raises(TypeError, match="bias must be a torch.Tensor"):
        K.cuda_linear_act(x, w, 1.0)
    with pytest.raises(ValueError, match="weight must be 2-D"):
        K.cuda_linear_act(x, torch.randn(5, 3, 1))
    with pytest.raises(ValueError, match="does not match weight"):
        K.cuda_linear_act(torch.randn(4, 2), w)
    with pytest.raises(ValueError, match="bias of shape"):
        K.cuda_linear_act(x, w, torch.randn(4))
    with pytest.raises(ValueError, match="cannot be multiplied"):
        K.cuda_matmul_act(x, w)
    with pytest.raises(ValueError, match="do not broadcast"):
        K.cuda_matmul_act(torch.randn(2, 4, 3), torch.randn(3, 3, 5))
    with pytest.raises(ValueError, match="at least one dimension"):
        K.cuda_matmul_act(torch.tensor(1.0), x)
    for name in ("cuda_linear_act", "cuda_matmul_act"):
        assert name in K.__all__


def test_binding_rejects_bad_arguments_before_loading():
    # (device, stream, ws, ws_bytes, transa, transb, m, n, k, A, lda, sa, B, ldb, sb, D, ldd, sd,
    #  batch, dtype, allow_tf32, bias, act)
    good = [0, 0, 0, 0, 0, 0, 4, 3, 2, 16, 4, 0, 32, 2, 0, 64, 4, 0, 1, "float32", False, 0, "relu"]

    def call(**kw):
        args = list(good)
        names = ["device", "stream", "ws", "ws_bytes", "transa", "transb", "m", "n", "k", "A", "lda", "sa",
                 "B", "ldb", "sb", "D", "ldd", "sd", "batch", "dtype", "tf32", "bias", "act"]
        for k, v in kw.items():
            args[names.index(k)] = v
        return _C.cublaslt_matmul(*args)

    with pytest.raises(ValueError, match="unsupported dtype float64"):
        call(dtype="float64")
    with pytest.raises(ValueError, match="unsupported activation gelu"):
        call(act="gelu")
    with pytest.raises(ValueError, match="bad sizes m=0"):
        call(m=0)
    with pytest.raises(ValueError, match="leading dimensions too small"):
        call(lda=3)
    with pytest.raises(ValueError, match="transa/transb"):
        call(transa=2)
    with pytest.raises(ValueError, match="D needs its own matrices"):
        call(batch=2)
    with pytest.raises(ValueError, match="null matrix pointer"):
        call(A=0)
    with pytest.raises(ValueError, match="workspace bytes at a null pointer"):
        call(ws_bytes=1024)
    with pytest.raises(TypeError):
        call(A="not a pointer")


# ---------------------------------------------------------------------------------------------
# The path against the stand-in libraries


@pytest.fixture(scope="module")
def stubdir(tmp_path_factory):
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        pytest.skip("no C compiler: the stand-in CUDA libraries cannot be built")
    d = tmp_path_factory.mktemp("fake_cuda")
    for src, name in (("fake_cuda.c", "libcuda.so.1"), ("fake_cublaslt.c", "libcublasLt.so.13")):
        subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", f"-Wl,-soname,{name}",
                        "-o", str(d / name), os.path.join(STUBS, src), "-lm"], check=True)
    return str(d)


PRELUDE = r'''
import ctypes, math, sys, types
import torch
from thunder_memfuse import _C
from thunder_memfuse.regions import nvrtc as K
from thunder_memfuse.regions.nvrtc import gemm as K_gemm, loader as K_loader

STUB = sys.argv[1]
_C.cuda_set_search_dirs([STUB])
K_loader._setup_done = True  # keep kernels from pointing the loader back at the real wheels
if sys.argv[2:] == ["stubs-only"]:
    _st = _C.cuda_status()
    for _lib in ("driver", "cublaslt"):
        # a CUDA build of torch may have loaded the real libraries at import: they would be shared
        if not (_st[_lib]["found"] and _st[_lib]["path"].startswith(STUB)):
            print("SKIP the real", _lib, "is already loaded in this process:", _st[_lib]["path"])
            sys.exit(0)

# The Python path on CPU tensors: the stand-in computes on host memory.
WS = torch.empty(1 << 16, dtype=torch.uint8)
torch.cuda.current_device = lambda: 0
torch.cuda.current_stream = lambda device=None: types.SimpleNamespace(cuda_stream=0x5EED)
K_gemm._workspace = lambda device, stream: (WS.data_ptr(), WS.numel())
_check = K_gemm._check_lt_inputs
K_gemm._check_lt_inputs = lambda *ts: _check(*ts, cuda=False)


def hooks():
    cu = ctypes.CDLL(STUB + "/libcuda.so.1")
    lt = ctypes.CDLL(STUB + "/libcublasLt.so.13")
    cu.fake_cu_current.restype = ctypes.c_size_t
    cu.fake_cu_set_current.argtypes = [ctypes.c_size_t]
    lt.fake_lt_last.restype = ctypes.c_char_p
    return cu, lt


TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
       torch.bfloat16: dict(rtol=1e-2, atol=1e-2)}


def check(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype)
    torch.testing.assert_close(got.float(), want.float(), **TOL[got.dtype])


def ref_linear(x, w, b):
    y = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    return torch.relu(y).to(x.dtype)


def ref_matmul(a, b):
    return torch.relu(torch.matmul(a.double(), b.double())).to(a.dtype)
'''


def run_stub(stubdir, body):
    code = PRELUDE + textwrap.dedent(body)
    res = subprocess.run([sys.executable, "-c", code, stubdir, "stubs-only"], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, f"stdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    if res.stdout.startswith("SKIP"):
        pytest.skip(res.stdout.strip())
    return res.stdout


def test_stub_status_and_handle_creation_failure(stubdir):
    run_stub(stubdir, r'''
    cu, lt = hooks()
    st = K.cuda_status()
    assert st["cublaslt"]["found"] and st["cublaslt"]["path"].startswith(STUB), st["cublaslt"]
    assert st["cublaslt"]["version"] == "99.1.2", st["cublaslt"]  # cublasLtGetVersion() == 990102
    assert st["driver"]["found"] and st["driver"]["device_count"] == 1
    x, w = torch.randn(4, 3), torch.randn(5, 3)
    # the per-device handle: a failed cublasLtCreate is reported and retried on the next call
    lt.fake_lt_fail_at(1)
    try:
        K.cuda_linear_act(x, w)
        raise AssertionError("no error")
    except RuntimeError as e:
        assert "cublasLtCreate failed: status 3" in str(e), e
    lt.fake_lt_fail_at(0)
    assert lt.fake_lt_creates() == 0 and lt.fake_lt_live() == 0
    check(K.cuda_linear_act(x, w), ref_linear(x, w, None))
    check(K.cuda_linear_act(x, w), ref_linear(x, w, None))
    assert lt.fake_lt_creates() == 1  # one handle per device, kept
    assert lt.fake_lt_live() == 0     # descriptors destroyed after every call
    ''')


def test_stub_linear_act_against_torch(stubdir):
    out = run_stub(stubdir, r'''
    cu, lt = hooks()
    torch.manual_seed(0)
    n = 0
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for (M, K_, N) in ((1, 1, 1), (7, 13, 5), (33, 17, 9), (64, 40, 24)):
            for bias in (False, True):
                for lead in ((), (2, 3)):
                    x = torch.randn(*lead, M, K_).to(dtype)
                    w = torch.randn(N, K_).to(dtype)
                    b = torch.randn(N).to(dtype) if bias else None
                    got = K.cuda_linear_act(x, w, b)
                    check(got, ref_linear(x, w, b))
                    last = lt.fake_lt_last().decode()
                    assert f"epilogue={6 if bias else 2} " in last, last
                    assert f"bias={int(bias)}" in last and "stream=0x5eed" in last, last
                    assert "ws=65536 " in last and "ws_bytes=65536" in last, last
                    n += 1
    # 1-D input, like torch.nn.functional.linear
    x, w, b = torch.randn(6), torch.randn(4, 6), torch.randn(4)
    check(K.cuda_linear_act(x, w, b), ref_linear(x, w, b))
    # the row-major problem as column-major: out^T (N x M) = op(w^T) (N x K) @ op(x^T) (K x M);
    # w (N, K) row-major is op T of a K x N column-major matrix, x (M, K) row-major is op N
    x, w = torch.randn(7, 13), torch.randn(5, 13)
    K.cuda_linear_act(x, w, torch.randn(5))
    last = lt.fake_lt_last().decode()
    assert "transa=1 transb=0 m=5 n=7 k=13 lda=13 ldb=13 ldd=5 batch=1" in last, last
    assert lt.fake_lt_live() == 0
    print(n)
    ''')
    assert int(out.split()[-1]) == 48


def test_stub_tf32_and_alignment(stubdir):
    run_stub(stubdir, r'''
    cu, lt = hooks()
    x, w = torch.randn(8, 16), torch.randn(4, 16)
    torch.backends.cuda.matmul.allow_tf32 = True
    K.cuda_linear_act(x, w)
    assert "compute=77 " in lt.fake_lt_last().decode()
    torch.backends.cuda.matmul.allow_tf32 = False
    K.cuda_linear_act(x, w)
    assert "compute=68 " in lt.fake_lt_last().decode()
    K.cuda_linear_act(x.half(), w.half())
    assert "compute=68 " in lt.fake_lt_last().decode()
    # the heuristic is told each pointer's real alignment (default would be 256)
    big = torch.randn(8 * 16 + 1)
    xs = big[1:].view(8, 16)  # 4 bytes past an aligned allocation
    out = K.cuda_linear_act(xs, w)
    check(out, ref_linear(xs, w, None))
    align = lambda t: min(256, t.data_ptr() & -t.data_ptr())  # noqa: E731
    last = lt.fake_lt_last().decode()
    # A is w, B is x (the column-major swap), C and D the output
    assert align(xs) == 4 and f"align={align(w)},4,{align(out)},{align(out)}" in last, last
    ''')


def test_stub_matmul_act_against_torch(stubdir):
    run_stub(stubdir, r'''
    cu, lt = hooks()
    torch.manual_seed(1)
    cases = [((1, 1), (1, 1)), ((7, 13), (13, 5)), ((33, 17), (17, 9)), ((6,), (6, 4)), ((4, 6), (6,)),
             ((6,), (6,)), ((3, 7, 5), (3, 5, 4)), ((3, 7, 5), (5, 4)), ((7, 5), (3, 5, 4)),
             ((2, 3, 4, 3), (3, 2)), ((1, 3, 4, 3), (1, 1, 3, 2)), ((0, 4), (4, 5)), ((4, 0), (0, 5)),
             ((2, 0, 3), (3, 4))]
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for sa, sb in cases:
            a, b = torch.randn(sa).to(dtype), torch.randn(sb).to(dtype)
            check(K.cuda_matmul_act(a, b), ref_matmul(a, b))
    # batched left operand times a 2-D right one: folded into ONE 2-D GEMM of 3*7 rows
    a, b = torch.randn(3, 7, 5), torch.randn(5, 4)
    check(K.cuda_matmul_act(a, b), ref_matmul(a, b))
    assert "m=4 n=21 k=5" in lt.fake_lt_last().decode() and "batch=1" in lt.fake_lt_last().decode()
    # a batch of column-major matrices does not fold: strided batch, the shared right operand at stride 0
    at = torch.randn(3, 5, 7).transpose(1, 2)
    check(K.cuda_matmul_act(at, b), ref_matmul(at, b))
    last = lt.fake_lt_last().decode()
    assert "batch=3 strides=0,35,28" in last and "transb=1" in last, last
    # shared left operand: stride 0 on cuBLASLt's B
    a2, bb = torch.randn(7, 5), torch.randn(3, 5, 4)
    check(K.cuda_matmul_act(a2, bb), ref_matmul(a2, bb))
    assert "batch=3 strides=20,0,28" in lt.fake_lt_last().decode()
    # batch dims that broadcast into strides no single batch stride describes: refused (a copy)
    try:
        K.cuda_matmul_act(torch.randn(2, 1, 4, 3), torch.randn(3, 3, 2))
        raise AssertionError("accepted")
    except NotImplementedError as e:
        assert "would need a copy" in str(e), e
    # k == 0: zeros without a call
    calls = lt.fake_lt_calls()
    z = K.cuda_matmul_act(torch.randn(3, 0), torch.randn(0, 2))
    assert torch.equal(z, torch.zeros(3, 2)) and lt.fake_lt_calls() == calls
    assert lt.fake_lt_live() == 0
    ''')


def test_stub_layouts_used_in_place_or_refused(stubdir):
    run_stub(stubdir, r'''
    cu, lt = hooks()
    w = torch.randn(6, 9)
    # column-major input and a transposed weight: in place
    xt = torch.randn(9, 11).t()
    check(K.cuda_linear_act(xt, w), ref_linear(xt, w, None))
    wt = torch.randn(9, 6).t()
    x = torch.randn(11, 9)
    check(K.cuda_linear_act(x, wt), ref_linear(x, wt, None))
    # rows with padding (row stride 16 > 9): in place, ld 16
    xp = torch.randn(11, 16)[:, :9]
    check(K.cuda_linear_act(xp, w), ref_linear(xp, w, None))
    assert "ldb=16" in lt.fake_lt_last().decode()
    # a leading-dims input whose dims merge: viewed, not copied
    x3 = torch.randn(2, 5, 9)
    check(K.cuda_linear_act(x3, w), ref_linear(x3, w, None))
    # layouts that would need a copy are refused (the caller falls back to torch)
    for bad_x, why in ((torch.randn(11, 9, 2)[:, :, 0], "would need a copy"),
                       (torch.randn(5, 2, 9).transpose(0, 1), "does not flatten")):
        try:
            K.cuda_linear_act(bad_x, w)
            raise AssertionError("accepted " + why)
        except NotImplementedError as e:
            assert why in str(e), e
    try:
        K.cuda_linear_act(torch.randn(4, 9), w, torch.randn(12)[::2])
        raise AssertionError("accepted a strided bias")
    except NotImplementedError as e:
        assert "contiguous vector" in str(e), e
    try:
        K.cuda_matmul_act(torch.randn(7, 5, 2)[:, :, 0], torch.randn(5, 4))
        raise AssertionError("accepted a strided operand")
    except NotImplementedError as e:
        assert "would need a copy" in str(e), e
    try:
        K.cuda_linear_act(torch.randn(4, 0), torch.randn(3, 0))
        raise AssertionError("accepted zero in_features")
    except NotImplementedError as e:
        assert "zero in_features" in str(e), e
    # zero-size outputs: no call
    calls = lt.fake_lt_calls()
    assert K.cuda_linear_act(torch.randn(0, 9), w).shape == (0, 6)
    assert K.cuda_linear_act(torch.randn(2, 0, 9), w).shape == (2, 0, 6)
    assert K.cuda_linear_act(torch.randn(3, 9), torch.randn(0, 9), torch.randn(0)).shape == (3, 0)
    assert lt.fake_lt_calls() == calls
    assert lt.fake_lt_live() == 0
    ''')


def test_stub_errors_leak_nothing_and_restore_the_context(stubdir):
    run_stub(stubdir, r'''
    cu, lt = hooks()
    x, w, b = torch.randn(8, 6), torch.randn(4, 6), torch.randn(4)
    want = ref_linear(x, w, b)
    xb = torch.randn(3, 5, 7).transpose(1, 2)  # strided batch: the layout attributes are set too
    for args, ref in (((x, w, b), want), ((xb, torch.randn(5, 4)), None)):
        fn = K.cuda_linear_act if ref is not None else K.cuda_matmul_act
        fn(*args)  # handle created; count the calls of one run
        lt.fake_lt_fail_at(0)
        fn(*args)
        total = lt.fake_lt_calls()
        assert total >= 10, total
        for i in range(1, total + 1):
            cu.fake_cu_set_current(0xC0FFEE)  # someone else's context is current
            lt.fake_lt_fail_at(i)
            try:
                fn(*args)
                raise AssertionError(f"call {i} of {total} failed but no error")
            except RuntimeError as e:
                assert "failed: status" in str(e) and "cublasLt" in str(e), e
            assert lt.fake_lt_live() == 0, (i, lt.fake_lt_live())
            assert cu.fake_cu_current() == 0xC0FFEE, hex(cu.fake_cu_current())
        lt.fake_lt_fail_at(0)
    # no algorithm (or no heuristic for the configuration): NotImplementedError, so the caller falls back
    for hook in (lt.fake_lt_no_algo, lt.fake_lt_not_supported):
        hook(1)
        try:
            K.cuda_linear_act(x, w, b)
            raise AssertionError("no error")
        except NotImplementedError as e:
            s = str(e)
            assert "found no algorithm" in s and "float32 m=4 n=8 k=6" in s and "relu+bias" in s, s
            assert "65536 workspace bytes" in s, s
        hook(0)
        assert lt.fake_lt_live() == 0
    cu.fake_cu_set_current(0)
    check(K.cuda_linear_act(x, w, b), want)
    assert cu.fake_cu_current() == 0
    # a device the driver does not have
    try:
        _C.cublaslt_matmul(3, 0, 0, 0, 0, 0, 4, 3, 2, 16, 4, 0, 32, 2, 0, 64, 4, 0, 1, "float32", False, 0, "relu")
        raise AssertionError("no error")
    except RuntimeError as e:
        assert "cuDeviceGet" in str(e), e
    # a device index no driver can have is bad input: ValueError, from every entry point (issue 19)
    for call in (lambda: _C.cuda_device_info(-1),
                 lambda: _C.cublaslt_matmul(-1, 0, 0, 0, 0, 0, 4, 3, 2, 16, 4, 0, 32, 2, 0, 64, 4, 0, 1,
                                            "float32", False, 0, "relu")):
        try:
            call()
            raise AssertionError("no error")
        except ValueError as e:
            assert "device index -1 out of range" in str(e), e
    ''')


def test_missing_cublaslt_is_not_implemented(tmp_path, stubdir):
    # the driver is there, libcublasLt is not: NotImplementedError with the loader's reason
    only_driver = tmp_path / "only_driver"
    only_driver.mkdir()
    shutil.copy(os.path.join(stubdir, "libcuda.so.1"), only_driver / "libcuda.so.1")
    code = PRELUDE + textwrap.dedent(r'''
    st = K.cuda_status()
    if st["cublaslt"]["found"]:
        print("SKIP a libcublasLt is on the default loader path:", st["cublaslt"]["path"])
        sys.exit(0)
    assert st["cublaslt"]["error"], st["cublaslt"]
    try:
        K.cuda_linear_act(torch.randn(4, 3), torch.randn(5, 3))
        raise AssertionError("no error")
    except NotImplementedError as e:
        assert "cuBLASLt not found" in str(e) and "libcublasLt.so.13" in str(e), e
    ''')
    env = dict(os.environ)
    for var in ("CUDA_HOME", "CUDA_PATH"):
        env.pop(var, None)
    res = subprocess.run([sys.executable, "-c", code, str(only_driver)], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0, f"stdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    if res.stdout.startswith("SKIP"):
        pytest.skip(res.stdout.strip())
