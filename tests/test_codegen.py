"""The CUDA code generator, NVRTC compilation and the kernel cache, on a machine without a GPU.

- golden-source and determinism tests of csrc/cuda/mf_codegen.c;
- every op x dtype compiled by NVRTC (from the nvidia-cuda-nvrtc wheel) for sm_90, in the three
  kernel variants (skipped only when NVRTC cannot be found);
- KernelCompileError carries the NVRTC log and the source; memory and disk cache;
- CPU emulation: the generated CUDA C is compiled as C++ with g++ and a few shims (one thread, one
  block), run on CPU tensors and compared with eager PyTorch: this checks the lowering, the
  strides, the parameter packing and the arithmetic of every op x dtype without a GPU;
- fusible_bsym on real Thunder traces.
"""
from __future__ import annotations

import ctypes
import hashlib
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import warnings
import zlib

import pytest
import torch

import thunder_memfuse  # noqa: F401  (applies the Thunder compat shims)
from thunder_memfuse import _C
from thunder_memfuse.regions import nvrtc as K
from thunder_memfuse.regions.nvrtc import kernel as K_kernel

INFO = _C.cuda_codegen_info()
OPS = {k: v for k, v in INFO["ops"].items() if k != "const"}
DTYPES = list(K.SUPPORTED_DTYPES)
FLOATS = ("float16", "bfloat16", "float32", "float64")
INTS = ("uint8", "int8", "int16", "int32", "int64")
ARCH = 90

MATH1 = {
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt", "sin", "cos", "tan", "sinh",
    "cosh", "tanh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "erfcinv",
    "lgamma", "ndtri", "reciprocal",
}
SAME1 = {"floor", "ceil", "trunc", "round", "abs", "neg", "sign"}
BOOL1 = {"signbit", "isfinite", "logical_not"}
ARITH2 = {"add", "sub", "mul", "div", "fmod", "remainder", "pow", "maximum", "minimum"}
FLOAT2 = {"atan2", "nextafter"}
BIT2 = {"bitwise_and", "bitwise_or", "bitwise_xor"}
SHIFT2 = {"bitwise_left_shift", "bitwise_right_shift"}
CMP2 = {"eq", "ne", "lt", "le", "gt", "ge"}
LOGIC2 = {"logical_and", "logical_or", "logical_xor"}


def out_dtype(op, dt):
    """Result dtype of op on tensors of dtype dt (as Thunder's prims would give), None if invalid."""
    if op in MATH1:
        return dt if dt in FLOATS else "float32"
    if op in SAME1:
        return None if (op == "neg" and dt == "bool") else dt
    if op in BOOL1 or op in CMP2 or op in LOGIC2:
        return "bool"
    if op == "bitwise_not" or op in BIT2:
        return None if dt in FLOATS else dt
    if op in SHIFT2:
        return dt if dt in INTS else None
    if op in ARITH2:
        if dt == "bool":
            return dt if op in ("add", "mul", "maximum", "minimum") else None
        return dt
    if op in FLOAT2 or op == "lerp":
        return dt if dt in FLOATS else None
    if op == "where":
        return dt
    if op == "convert_element_type":
        return dt
    raise AssertionError(f"op {op} has no rule in this test")


def test_every_op_has_a_rule():
    for op in OPS:
        out_dtype(op, "float32")
    # the ops that transformer code needs are all there
    for op in ("add", "sub", "mul", "div", "remainder", "eq", "ne", "lt", "le", "gt", "ge", "where",
               "convert_element_type", "exp", "log", "tanh", "erf", "sqrt", "rsqrt", "pow", "abs", "neg",
               "maximum", "minimum", "sin", "cos", "logical_and", "logical_or", "logical_not", "fmod",
               "floor", "reciprocal", "bitwise_and", "bitwise_xor", "signbit"):
        assert op in OPS, op


def op_region(op, dtypes, *, ndim=2, index64=False, contiguous=False, scalar=None):
    """One region applying op to tensors of each dtype in dtypes (one output per dtype)."""
    inputs, instrs, outputs = [], [], []
    plan = []
    for dt in dtypes:
        od = out_dtype(op, dt)
        if od is None:
            continue
        arity = OPS[op]
        first = len(inputs)
        if op == "where":
            inputs += [("tensor", "bool"), ("tensor", dt), ("tensor", dt)]
        else:
            inputs += [("tensor", dt)] * arity
        plan.append((dt, od, list(range(first, first + arity))))
    if scalar is not None:
        inputs.append(("scalar", scalar))
    n_in = len(inputs)
    for dt, od, args in plan:
        if scalar is not None and len(args) == 2:
            args = [args[0], n_in - 1]
        instrs.append((op, tuple(args), od))
        outputs.append((n_in + len(instrs) - 1, False))
    return (inputs, instrs, outputs, ndim, index64, contiguous), plan


# ---------------------------------------------------------------------------------------------
# golden source, determinism, validation


RELU_ADD = (
    [("tensor", "float32"), ("tensor", "float32")],
    [("const", (), "float64", 0.0), ("gt", (0, 2), "bool"), ("where", (3, 0, 2), "float32"), ("add", (4, 1), "float32")],
    [(5, False)],
    2,
    False,
    False,
)


def test_golden_relu_add():
    src = _C.cuda_codegen(RELU_ADD)
    assert "#include" not in src
    assert src.startswith("// thunder_memfuse generated kernel: 2 inputs, 4 instructions, 1 outputs;\n")
    assert "// ops: const gt where add\n" in src
    expected_lines = [
        "struct MfParams {",
        "  long long numel;",
        "  long long size[2];",
        "  void* ptr[3];",
        "  long long stride[6];",
        "};",
        'extern "C" __global__ void __launch_bounds__(MF_BLOCK) mf_kernel(const MfParams P) {',
        "  typedef unsigned int mf_idx;",
        "  const float* __restrict__ p0 = (const float*)P.ptr[0];",
        "  float* __restrict__ q0 = (float*)P.ptr[2];",
        "    const float v0 = p0[o0];",
        "    const double v2 = 0.0;",
        "    const bool v3 = (bool)(v0 > ((float)v2));",
        "    const float v4 = (v3 ? v0 : ((float)v2));",
        "    const float v5 = (float)(v4 + v1);",
        "    q0[o2] = v5;",
    ]
    lines = src.splitlines()
    for line in expected_lines:
        assert line in lines, line
    # no helper is emitted when none is needed
    assert "mf_h2f" not in src and "mf_max" not in src


def test_contiguous_and_index64_variants():
    contig = _C.cuda_codegen(RELU_ADD[:3] + (1, False, True))
    assert "stride" not in contig and "q0[i] = v5;" in contig and "p0[i]" in contig
    wide = _C.cuda_codegen(RELU_ADD[:3] + (2, True, False))
    assert "typedef unsigned long long mf_idx;" in wide


def test_deterministic():
    a = _C.cuda_codegen(RELU_ADD)
    b = _C.cuda_codegen(tuple(list(x) if isinstance(x, list) else x for x in RELU_ADD))
    assert a == b
    reg, _ = op_region("add", DTYPES)
    assert _C.cuda_codegen(reg) == _C.cuda_codegen(reg)


def test_half_helpers_only_when_needed():
    reg, _ = op_region("add", ["float16"])
    src = _C.cuda_codegen(reg)
    assert "mf_h2f" in src and "mf_f2h" in src and "mf_bf2f" not in src
    assert "cuda_fp16" not in src


@pytest.mark.parametrize(
    "region, message",
    [
        (([("tensor", "int32")], [("exp", (0,), "int32")], [(1, False)], 1, False, False), "not floating"),
        (([("tensor", "bool")], [("neg", (0,), "bool")], [(1, False)], 1, False, False), "bool"),
        (([("tensor", "float32")], [("bitwise_not", (0,), "float32")], [(1, False)], 1, False, False), "floating"),
        (([("tensor", "float32")], [("add", (0, 5), "float32")], [(1, False)], 1, False, False), "not defined before"),
        (([("tensor", "float32")], [("nope", (0,), "float32")], [(1, False)], 1, False, False), "unsupported op"),
        (([("tensor", "float33")], [], [(0, False)], 1, False, False), "unknown dtype"),
        (([("tensor", "float32")], [("exp", (0,), "float32")], [], 1, False, False), "at least one output"),
        (([("tensor", "float32")], [("exp", (0,), "float32")], [(1, False)], 0, False, False), "ndim"),
        (([("scalar", "float32")], [("exp", (0,), "float32")], [(1, False)], 1, False, False), "scalar input"),
    ],
)
def test_invalid_regions(region, message):
    with pytest.raises(ValueError, match=message):
        _C.cuda_codegen(region)


def test_param_limit():
    n = 200
    reg = ([("tensor", "float32")] * n, [], [(i, False) for i in range(2)], 4, False, False)
    with pytest.raises(ValueError, match="parameters"):
        _C.cuda_codegen(reg)


# ---------------------------------------------------------------------------------------------
# NVRTC


@pytest.fixture(scope="module")
def nvrtc():
    st = K.cuda_status()
    if not st["nvrtc"]["found"]:
        pytest.skip(f"NVRTC not found (pip install nvidia-cuda-nvrtc): {st['nvrtc']['error']}")
    if ARCH not in st["nvrtc"]["supported_archs"]:
        pytest.skip(f"this NVRTC cannot target sm_{ARCH}")
    return st


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "kernels"
    monkeypatch.setenv("THUNDER_MEMFUSE_CACHE", str(d))
    return d


VARIANTS = [(2, False, False), (1, False, True), (3, True, False)]


@pytest.mark.parametrize("variant", VARIANTS, ids=["strided32", "contiguous", "strided64"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_nvrtc_compiles_every_op_and_dtype(nvrtc, op, variant):
    ndim, index64, contiguous = variant
    if op == "convert_element_type":
        inputs = [("tensor", dt) for dt in DTYPES]
        instrs = [("convert_element_type", (i,), od) for i in range(len(DTYPES)) for od in DTYPES]
        outs = [(len(DTYPES) + j, False) for j in range(len(instrs))]
        reg = (inputs, instrs, outs, ndim, index64, contiguous)
        n = len(instrs)
    else:
        reg, plan = op_region(op, DTYPES, ndim=ndim, index64=index64, contiguous=contiguous)
        n = len(plan)
        assert n >= 1
    src = _C.cuda_codegen(reg)
    res = _C.nvrtc_compile(src, ARCH, cache=False)
    assert res["kind"] == "cubin" and res["target"] == f"sm_{ARCH}"
    assert len(res["image"]) > 0
    assert "error" not in (res["log"] or "").lower(), res["log"]
    assert n >= 1


@pytest.mark.parametrize("scalar", ["float64", "int64", "bool"])
@pytest.mark.parametrize("op", ["add", "mul", "div", "pow", "maximum", "gt", "eq", "remainder", "logical_and"])
def test_nvrtc_scalar_arguments(nvrtc, op, scalar):
    reg, plan = op_region(op, ["float32", "float16", "bfloat16", "int32", "int64"], scalar=scalar)
    src = _C.cuda_codegen(reg)
    assert f"P.s{len(reg[0]) - 1}" in src
    _C.nvrtc_compile(src, ARCH, cache=False)


def test_nvrtc_literals(nvrtc):
    reg = (
        [("tensor", "float32"), ("tensor", "int64"), ("tensor", "bfloat16")],
        [
            ("const", (), "float64", float("inf")),
            ("const", (), "float64", float("-inf")),
            ("const", (), "float64", float("nan")),
            ("const", (), "int64", -(2**63)),
            ("const", (), "bool", True),
            ("const", (), "float32", 0.1),
            ("const", (), "float16", 65504.0),
            ("const", (), "bfloat16", 3),
            ("maximum", (0, 3), "float32"),
            ("minimum", (0, 4), "float32"),
            ("add", (0, 5), "float32"),
            ("maximum", (1, 6), "int64"),
            ("where", (7, 2, 10), "bfloat16"),
        ],
        [(11, False), (12, False), (13, False), (14, False), (15, False)],
        1,
        False,
        True,
    )
    src = _C.cuda_codegen(reg)
    assert "__longlong_as_double(0x7ff0000000000000LL)" in src
    assert "(-9223372036854775807LL - 1LL)" in src
    _C.nvrtc_compile(src, ARCH, cache=False)


def test_compile_error_has_log_and_source(nvrtc):
    bad = 'extern "C" __global__ void mf_kernel(int x) { this is not cuda; }\n'
    with pytest.raises(K.KernelCompileError) as info:
        _C.nvrtc_compile(bad, ARCH, cache=False)
    e = info.value
    assert "error" in e.log
    assert e.source == bad
    assert "NVRTC log" in str(e)
    assert isinstance(e, RuntimeError)


def test_ptx_and_auto_modes(nvrtc):
    src = _C.cuda_codegen(RELU_ADD)
    ptx = _C.nvrtc_compile(src, ARCH, mode="ptx", cache=False)
    assert ptx["kind"] == "ptx" and ptx["image"].endswith(b"\0") and b".entry mf_kernel" in ptx["image"]
    # a device newer than anything this NVRTC knows gets PTX of the newest supported arch
    newest = max(nvrtc["nvrtc"]["supported_archs"])
    res = _C.nvrtc_compile(src, newest + 1, cache=False)
    assert res["kind"] == "ptx" and res["target"] == f"compute_{newest}"
    with pytest.raises(RuntimeError, match="older"):
        _C.nvrtc_compile(src, 30, cache=False)
    with pytest.raises(ValueError):
        _C.nvrtc_compile(src, ARCH, mode="fatbin")
    with pytest.raises(ValueError, match="bad compute capability"):  # bad input: ValueError (issue 19)
        _C.nvrtc_compile(src, 0, cache=False)


def test_cache_memory_and_disk(nvrtc, cache_dir):
    src = _C.cuda_codegen(RELU_ADD) + "// cache test %s\n" % os.urandom(8).hex()
    before = _C.cuda_cache_stats()
    first = _C.nvrtc_compile(src, ARCH)
    assert first["origin"] == "compiled"
    files = list(cache_dir.iterdir())
    assert len(files) == 1 and files[0].name.endswith(f"-sm_{ARCH}.cubin")
    assert files[0].read_bytes().startswith(b"MFK1")
    second = _C.nvrtc_compile(src, ARCH)
    assert second["origin"] == "memory" and second["image"] == first["image"]
    after = _C.cuda_cache_stats()
    assert after["compiles"] == before["compiles"] + 1
    assert after["memory_hits"] == before["memory_hits"] + 1
    assert after["disk_writes"] == before["disk_writes"] + 1
    _C.cuda_cache_clear()
    third = _C.nvrtc_compile(src, ARCH)
    assert third["origin"] == "disk" and third["image"] == first["image"]
    # an entry whose stored key differs (e.g. a hash collision) is not used
    data = bytearray(files[0].read_bytes())
    data[-len(first["image"]) - 20] ^= 0xFF  # inside the stored source text
    files[0].write_bytes(bytes(data))
    _C.cuda_cache_clear()
    assert _C.nvrtc_compile(src, ARCH)["origin"] == "compiled"
    # an explicit cache_dir and cache=False
    other = cache_dir.parent / "other"
    assert _C.nvrtc_compile(src, ARCH, cache_dir=str(other))["origin"] == "memory"
    _C.cuda_cache_clear()
    assert _C.nvrtc_compile(src, ARCH, cache_dir=str(other))["origin"] == "compiled"
    assert any(other.iterdir())
    assert _C.nvrtc_compile(src, ARCH, cache=False)["origin"] == "compiled"


def test_unwritable_cache_dir_is_not_fatal(nvrtc, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    src = _C.cuda_codegen(RELU_ADD) + "// unwritable %s\n" % os.urandom(8).hex()
    before = _C.cuda_cache_stats()["disk_errors"]
    assert _C.nvrtc_compile(src, ARCH, cache_dir=str(blocker / "sub"))["origin"] == "compiled"
    assert _C.cuda_cache_stats()["disk_errors"] == before + 1


def test_status_shape():
    st = K.cuda_status()
    for lib in ("driver", "nvrtc", "cublas"):
        entry = st[lib]
        assert set(entry) >= {"found", "path", "error", "how", "version"}
        if entry["found"]:
            assert os.path.exists(entry["path"])
        else:
            assert entry["error"]  # the dlerror() text is kept
    assert isinstance(st["search_dirs"], list)
    assert "can_run" in st and "can_compile" in st and "cache" in st
    if not st["driver"]["found"]:
        assert "libcuda.so.1" in st["driver"]["error"]
        assert st["can_run"] is False


def test_import_loads_no_cuda_library():
    code = (
        "import sys, thunder_memfuse, thunder_memfuse.regions.nvrtc\n"
        "maps = open('/proc/self/maps').read()\n"
        "assert 'libnvrtc' not in maps and 'libcuda.so' not in maps and 'libcublas' not in maps, maps\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------
# CPU emulation of the generated kernels (g++)

SHIM = r"""
#include <math.h>
#include <string.h>
#include <stddef.h>
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __restrict__ __restrict
struct mf_dim3 { unsigned int x, y, z; };
static const mf_dim3 threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0}, blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }
static inline long long __double_as_longlong(double d) { long long i; memcpy(&i, &d, 8); return i; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline double mf_erfinv_d(double y) {
  if (!(y >= -1.0 && y <= 1.0)) return NAN;
  if (y == -1.0) return -INFINITY;
  if (y == 1.0) return INFINITY;
  double w = -log((1.0 - y) * (1.0 + y)), x;
  x = (w < 5.0) ? (w - 2.5) * 0.0001 + y * 0.886 : copysign(sqrt(w) - 1.0, y);
  for (int k = 0; k < 60; k++) x -= (erf(x) - y) / (1.1283791670955126 * exp(-x * x));
  return x;
}
static inline double erfinv(double y) { return mf_erfinv_d(y); }
static inline float erfinvf(float y) { return (float)mf_erfinv_d(y); }
static inline double erfcinv(double y) { return mf_erfinv_d(1.0 - y); }
static inline float erfcinvf(float y) { return (float)mf_erfinv_d(1.0 - (double)y); }
static inline double normcdfinv(double p) { return -1.4142135623730951 * mf_erfinv_d(1.0 - 2.0 * p); }
static inline float normcdfinvf(float p) { return (float)normcdfinv(p); }
"""

TAIL = r"""
extern "C" void mf_run(const void *p) { MfParams P; memcpy(&P, p, sizeof P); mf_kernel(P); }
extern "C" size_t mf_param_size(void) { return sizeof(MfParams); }
"""

_EMU_DIR = None
_EMU_LIBS: dict = {}


def emulate_lib(src):
    global _EMU_DIR
    if shutil.which("g++") is None:
        pytest.skip("g++ not found: the CPU emulation of generated kernels needs a C++ compiler")
    key = hashlib.sha256(src.encode()).hexdigest()[:20]
    if key in _EMU_LIBS:
        return _EMU_LIBS[key]
    if _EMU_DIR is None:
        _EMU_DIR = tempfile.mkdtemp(prefix="mf_emu_")
    cpp = os.path.join(_EMU_DIR, key + ".cpp")
    so = os.path.join(_EMU_DIR, key + ".so")
    with open(cpp, "w") as f:
        f.write(SHIM + src + TAIL)
    r = subprocess.run(["g++", "-O1", "-std=c++17", "-fno-fast-math", "-ffp-contract=off", "-w", "-shared",
                        "-fPIC", cpp, "-o", so], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:] + "\n" + src
    lib = ctypes.CDLL(so)
    lib.mf_run.argtypes = [ctypes.c_char_p]
    lib.mf_param_size.restype = ctypes.c_size_t
    _EMU_LIBS[key] = lib
    return lib


def run_region_on_cpu(region: K.CudaRegion, *args):
    """What the GPU path does, with the kernel compiled for the CPU."""
    _, result, launch = region.prepare(args, cuda=False)
    if launch is None:
        return result
    (ndim, index64, contiguous), numel, params = launch
    lib = emulate_lib(region.source(ndim, index64, contiguous))
    assert lib.mf_param_size() == len(params)
    lib.mf_run(params)
    return result


def pack_params(shape, operands, contiguous, scalars=()):
    """The kernel's parameter bytes (NOTE [kernel parameters] in csrc/cuda/mf_codegen.c) for the
    iteration space shape, the tensor operands (inputs, then outputs) and (dtype, value) scalars."""
    numel = math.prod(shape)
    ptrs = [t.data_ptr() for t in operands]
    if contiguous:
        params = struct.pack(f"<q{len(ptrs)}Q", numel, *ptrs)
    else:
        strides = [s for t in operands for s in t.stride()]
        params = struct.pack(f"<q{len(shape)}q{len(ptrs)}Q{len(strides)}q", numel, *shape, *ptrs, *strides)
    for dt, v in scalars:
        params += struct.pack("<d" if dt == "float64" else "<q", v)
    return params


def run_raw_region(reg, tensors, scalars=()):
    """Run a hand-written region tuple on CPU tensors whose shapes all equal the iteration space."""
    inputs, instrs, outputs, ndim, index64, contiguous = reg
    S = tensors[0].shape
    outs = []
    vdt = [dt for _, dt in inputs] + [i[2] for i in instrs]
    for v, _ in outputs:
        outs.append(torch.empty(S, dtype=getattr(torch, vdt[v])))
    params = pack_params(S, list(tensors) + outs, contiguous, scalars)
    lib = emulate_lib(_C.cuda_codegen((inputs, instrs, outputs, len(S) if not contiguous else 1, index64, contiguous)))
    assert lib.mf_param_size() == len(params)
    lib.mf_run(params)
    return outs


TOL = {
    "float16": dict(rtol=2e-3, atol=2e-3),
    "bfloat16": dict(rtol=1.6e-2, atol=1.6e-2),
    "float32": dict(rtol=2e-5, atol=2e-6),
    "float64": dict(rtol=1e-10, atol=1e-12),
}


def plan_inputs(op, plan, shape):
    """The input tensors of an op_region plan, seeded per op (stable across runs)."""
    gen = torch.Generator().manual_seed(zlib.crc32(op.encode()) % 1000)
    tensors = []
    for dt, od, args in plan:
        if op == "where":
            tensors += [make_input(op, "bool", shape, gen), make_input(op, dt, shape, gen, 1),
                        make_input(op, dt, shape, gen, 2)]
        else:
            tensors += [make_input(op, dt, shape, gen, k) for k in range(len(args))]
    return tensors


def make_input(op, dt, shape, gen, slot=0):
    tdt = getattr(torch, dt)
    if dt == "bool":
        return torch.rand(shape, generator=gen) > 0.5
    if dt in INTS:
        lo, hi = (0, 100) if dt == "uint8" else (-100, 100)
        if op in MATH1:  # keep float results away from overflow (libm differences near FLT_MAX)
            lo, hi = (0, 10) if dt == "uint8" else (-10, 10)
        if op in ("div", "fmod", "remainder") and slot == 1:
            t = torch.randint(1, 20, shape, generator=gen)
            if dt != "uint8":
                t = t * (torch.randint(0, 2, shape, generator=gen) * 2 - 1)
            return t.to(tdt)
        if op == "pow":
            lo, hi = (0, 5) if slot == 1 else (-4, 5)
            if dt == "uint8":
                lo = 0
        if op in SHIFT2:
            lo, hi = (0, 7) if slot == 1 else (0 if dt == "uint8" else -50, 50)
        return torch.randint(lo, hi, shape, generator=gen).to(tdt)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    if op in ("log", "log2", "log10", "sqrt", "rsqrt", "lgamma"):
        x = x.abs() + 0.1
    elif op in ("log1p",):
        x = x.abs()
    elif op == "acosh":
        x = x.abs() + 1.0
    elif op in ("asin", "acos", "atanh", "erfinv"):
        x = x.clamp(-0.9, 0.9)
    elif op in ("ndtri",):
        x = torch.rand(shape, generator=gen, dtype=torch.float64) * 0.9 + 0.05
    elif op == "erfcinv":
        x = torch.rand(shape, generator=gen, dtype=torch.float64) * 1.8 + 0.1
    elif op == "pow" and slot == 0:
        x = x.abs() + 0.1
    elif op in ("div", "fmod", "remainder") and slot == 1:
        x = x.sign() * (x.abs() + 0.5)
    elif op in ("exp", "exp2", "expm1", "sinh", "cosh"):
        x = x.clamp(-5, 5)
    elif op == "lerp" and slot == 2:
        x = torch.rand(shape, generator=gen, dtype=torch.float64)
    if op in ("floor", "ceil", "trunc", "round"):
        x = x * 4
    return x.to(tdt)


def torch_ref(op, od, *xs):
    """Eager PyTorch for op with result dtype od (arguments converted as the kernel does)."""
    tdt = getattr(torch, od)
    f = {
        "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1, "log": torch.log, "log1p": torch.log1p,
        "log2": torch.log2, "log10": torch.log10, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sin": torch.sin,
        "cos": torch.cos, "tan": torch.tan, "sinh": torch.sinh, "cosh": torch.cosh, "tanh": torch.tanh,
        "asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "asinh": torch.asinh, "acosh": torch.acosh,
        "atanh": torch.atanh, "erf": torch.erf, "erfc": torch.erfc, "erfinv": torch.erfinv,
        "erfcinv": lambda x: torch.erfinv(1 - x), "lgamma": torch.lgamma, "ndtri": torch.special.ndtri,
        "reciprocal": torch.reciprocal, "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc,
        "round": torch.round, "abs": torch.abs, "neg": torch.neg, "sign": torch.sign,
        "signbit": torch.signbit, "isfinite": torch.isfinite, "logical_not": torch.logical_not,
        "bitwise_not": torch.bitwise_not,
        "add": torch.add, "sub": torch.sub, "mul": torch.mul, "fmod": torch.fmod, "remainder": torch.remainder,
        "pow": torch.pow, "maximum": torch.maximum, "minimum": torch.minimum, "atan2": torch.atan2,
        "nextafter": torch.nextafter, "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
        "bitwise_xor": torch.bitwise_xor, "bitwise_left_shift": torch.bitwise_left_shift,
        "bitwise_right_shift": torch.bitwise_right_shift, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt,
        "le": torch.le, "gt": torch.gt, "ge": torch.ge, "logical_and": torch.logical_and,
        "logical_or": torch.logical_or, "logical_xor": torch.logical_xor, "where": torch.where,
        "lerp": torch.lerp,
    }.get(op)
    if op == "div":
        if tdt.is_floating_point:
            return torch.true_divide(*[x.to(tdt) for x in xs])
        return torch.div(*xs, rounding_mode="trunc")
    if op in MATH1:
        x = xs[0].to(tdt)
        if od in ("float16", "bfloat16") and op in ("erfinv", "erfcinv", "ndtri", "lgamma", "acosh", "asinh", "atanh"):
            return f(x.float()).to(tdt)  # CPU half kernels missing for some
        return f(x)
    if op in SAME1 and xs[0].dtype == torch.bool and op in ("floor", "ceil", "trunc", "round", "sign", "abs"):
        return xs[0]
    if op in CMP2 and len({x.dtype for x in xs}) == 1 and xs[0].dtype in (torch.float16, torch.bfloat16):
        return f(*xs)
    return f(*xs)


EMU_OPS = sorted(o for o in OPS if o != "convert_element_type")


@pytest.mark.parametrize("op", EMU_OPS)
def test_cpu_emulation_every_op_and_dtype(op):
    reg, plan = op_region(op, DTYPES, ndim=2)
    tensors = plan_inputs(op, plan, (5, 7))
    # a transposed (non-contiguous) view for the first input: exercises strides
    tensors[0] = tensors[0].t().contiguous().t()
    outs = run_raw_region(reg, tensors)
    pos = 0
    for (dt, od, args), got in zip(plan, outs):
        xs = tensors[pos:pos + len(args)]
        pos += len(args)
        want = torch_ref(op, od, *xs)
        assert want.dtype == got.dtype or op in MATH1, (op, dt, want.dtype, got.dtype)
        want = want.to(got.dtype)
        if got.dtype.is_floating_point:
            torch.testing.assert_close(got, want, equal_nan=True, **TOL[od], msg=lambda m: f"{op} {dt}: {m}")
        else:
            assert torch.equal(got, want), (op, dt, xs, got, want)


def test_cpu_emulation_convert_all_pairs():
    gen = torch.Generator().manual_seed(0)
    inputs = [("tensor", dt) for dt in DTYPES]
    instrs = [("convert_element_type", (i,), od) for i in range(len(DTYPES)) for od in DTYPES]
    reg = (inputs, instrs, [(len(DTYPES) + j, False) for j in range(len(instrs))], 1, False, True)
    xs = []
    for dt in DTYPES:
        if dt in FLOATS:
            x = (torch.randn(64, generator=gen, dtype=torch.float64) * 30).to(getattr(torch, dt))
            x[:4] = torch.tensor([0.0, -0.0, 1.5, -2.5]).to(x.dtype)
            xs.append(x)
        else:
            xs.append(make_input("convert", dt, (64,), gen))
    outs = run_raw_region(reg, xs)
    k = 0
    for x in xs:
        for od in DTYPES:
            got = outs[k]
            k += 1
            tdt = getattr(torch, od)
            if x.dtype.is_floating_point and not tdt.is_floating_point and tdt != torch.bool:
                # float -> int is undefined outside the target range; compare in range only
                lo, hi = (0, 255) if od == "uint8" else (-128, 127)
                m = (x.double() > lo) & (x.double() < hi)
                assert torch.equal(got[m], x[m].to(tdt)), (x.dtype, od)
            else:
                assert torch.equal(got, x.to(tdt)) or torch.allclose(got.double(), x.to(tdt).double()), (x.dtype, od)


def test_cpu_emulation_half_conversions_exhaustive():
    """float16/bfloat16 <-> float by bit operations, against PyTorch for every 16-bit pattern."""
    bits = torch.arange(0, 65536, dtype=torch.int32).to(torch.int16)
    for dt in ("float16", "bfloat16"):
        h = bits.view(getattr(torch, dt)).clone()
        reg = ([("tensor", dt)], [("convert_element_type", (0,), "float32")], [(1, False)], 1, False, True)
        (f,) = run_raw_region(reg, [h])
        want = h.float()
        assert torch.equal(f.isnan(), want.isnan())
        m = ~want.isnan()
        assert torch.equal(f[m].view(torch.int32), want[m].view(torch.int32)), dt
        # float -> 16 bit: halfway points, subnormals, overflow, random
        g = torch.Generator().manual_seed(1)
        xs = torch.cat([
            want[m], (want[m].double() * (1 + 2.0 ** -11)).float(), torch.randn(20000, generator=g) * 1e4,
            torch.randn(20000, generator=g) * 1e-6, torch.tensor([65504.0, 65519.0, 65520.0, 1e38, -1e38,
                                                                float("inf"), float("-inf"), float("nan")]),
        ])
        reg = ([("tensor", "float32")], [("convert_element_type", (0,), dt)], [(1, False)], 1, False, True)
        (h2,) = run_raw_region(reg, [xs])
        want2 = xs.to(getattr(torch, dt))
        assert torch.equal(h2.isnan(), want2.isnan())
        mm = ~want2.isnan()
        assert torch.equal(h2[mm].view(torch.int16), want2[mm].view(torch.int16)), dt


def test_cpu_emulation_scalars_and_guards():
    # y = x * s (s: float64 scalar arg); z = (x > 0) as a guarded output broadcast along dim 0
    x = torch.randn(3, 4)
    reg = ([("tensor", "float32"), ("scalar", "float64"), ("scalar", "int64"), ("scalar", "bool")],
           [("mul", (0, 1), "float32"), ("add", (4, 2), "float32"), ("where", (3, 5, 0), "float32")],
           [(4, False), (5, False), (6, False)], 2, False, False)
    outs = run_raw_region(reg, [x], scalars=[("float64", 2.5), ("int64", -3), ("int64", 0)])
    torch.testing.assert_close(outs[0], x * 2.5)
    torch.testing.assert_close(outs[1], x * 2.5 - 3)
    torch.testing.assert_close(outs[2], x)


# ---------------------------------------------------------------------------------------------
# Thunder traces -> regions -> CPU emulation


def _thunder_region(fn, *args):
    import thunder
    from thunder.core.proxies import TensorProxy

    jf = thunder.jit(fn)
    expected = jf(*args)
    tr = thunder.last_traces(jf)[-1]
    bsyms = [b for b in tr.bound_symbols if K.fusible_bsym(b)]
    produced = {o.name for b in bsyms for o in b.flat_outs if isinstance(o, TensorProxy)}
    inputs = []
    for b in bsyms:
        for a in b.flat_args:
            if isinstance(a, TensorProxy) and a.name not in produced and all(a.name != i.name for i in inputs):
                inputs.append(a)
    ret = tr.bound_symbols[-1].args[0]
    ret = ret if isinstance(ret, (tuple, list)) else [ret]
    outs = [o for o in ret if isinstance(o, TensorProxy) and o.name in produced]
    return tr, bsyms, inputs, outs, expected


def _env(tr, args, proxies=None):
    """name -> runtime value of the given proxies (default: the trace's inputs), by running the
    trace up to them."""
    from thunder.core import prims
    from thunder.core.trace import from_trace

    if proxies is None:
        return dict(zip([p.name for p in tr.args], args))
    t2 = from_trace(tr)
    body = [b for b in tr.bound_symbols[:-1] if b.sym.id not in (prims.PrimIDs.DEL, prims.PrimIDs.RETURN)]
    t2.bound_symbols = body + [prims.python_return.bind(tuple(proxies), output=None)]
    vals = t2.python_callable()(*args)
    return {p.name: v for p, v in zip(proxies, vals)}


CASES = {
    "relu_add_broadcast": (lambda x, y: torch.nn.functional.relu(x) + y, lambda: (torch.randn(6, 5), torch.randn(5))),
    "gelu_tanh_silu": (
        lambda x: (torch.nn.functional.gelu(x, approximate="tanh"), torch.nn.functional.silu(x), torch.nn.functional.gelu(x)),
        lambda: (torch.randn(4, 8),),
    ),
    "floor_divide_remainder": (lambda x, y: (x // y, torch.remainder(x, y)), lambda: (torch.randn(5, 3) * 5, torch.randn(3) + 3)),
    "half_mlp_tail": (
        lambda x, b: torch.nn.functional.gelu((x + b).float()).to(torch.float16) * 0.5,
        lambda: (torch.randn(4, 16).half(), torch.randn(16).half()),
    ),
    "bf16_sigmoid_where": (
        lambda x: torch.where(torch.sigmoid(x) > 0.5, x, -x),
        lambda: (torch.randn(3, 7).bfloat16(),),
    ),
    "transposed_input": (lambda x, y: torch.tanh(x.t()) * y, lambda: (torch.randn(5, 4), torch.randn(4, 5))),
    "expanded_input": (lambda x: torch.exp(x.expand(3, 4, 5)) - 1, lambda: (torch.randn(4, 1),)),
    "int_and_bool": (
        lambda a, b: (torch.remainder(a * 3 + b, 7), (a > b) & (b > 0), torch.abs(a - b)),
        lambda: (torch.randint(-50, 50, (4, 6)), torch.randint(-50, 50, (4, 6))),
    ),
    "rsqrt_pow_clamp": (
        lambda x: (torch.rsqrt(x.abs() + 1e-6) ** 2, torch.clamp(x, -0.5, 0.5), torch.maximum(x, torch.zeros(())) ),
        lambda: (torch.randn(2, 3, 4),),
    ),
    "scalar_output_broadcast": (lambda x, y: (torch.exp(y), torch.exp(y) + x), lambda: (torch.randn(3, 4), torch.randn(4))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_thunder_region_cpu_emulation(case):
    fn, make = CASES[case]
    torch.manual_seed(0)
    args = make()
    tr, bsyms, inputs, outs, expected = _thunder_region(fn, *args)
    assert bsyms, "nothing fusible"
    region = K.build_cuda_region(bsyms, inputs, outs)
    env = _env(tr, args, inputs)
    call_args = [env[p.name] for p in inputs]
    got = run_region_on_cpu(region, *call_args)
    # reference: eager PyTorch on the region's own outputs (the function's returned tensors)
    exp = expected if isinstance(expected, (tuple, list)) else (expected,)
    ret = tr.bound_symbols[-1].args[0]
    ret = ret if isinstance(ret, (tuple, list)) else [ret]
    by_name = {o.name: g for o, g in zip(outs, got)}
    for proxy, want in zip(ret, exp):
        if proxy.name in by_name:
            g = by_name[proxy.name]
            assert g.shape == want.shape and g.dtype == want.dtype
            if g.dtype.is_floating_point:
                torch.testing.assert_close(g, want, **TOL[str(g.dtype).replace("torch.", "")])
            else:
                assert torch.equal(g, want)
    # the region is deterministic
    again = K.build_cuda_region(bsyms, inputs, outs)
    assert again.source(2) == region.source(2)


def test_region_dims_collapse_and_variants():
    fn, make = CASES["relu_add_broadcast"]
    args = make()
    tr, bsyms, inputs, outs, _ = _thunder_region(fn, *args)
    region = K.build_cuda_region(bsyms, inputs, outs)
    env = _env(tr, args, inputs)
    call_args = [env[p.name] for p in inputs]
    dev = region.check_args(call_args, cuda=False)
    o, _ = region.allocate_outputs(dev)
    (ndim, index64, contiguous), numel, params = region.launch_params(call_args, o)
    assert (ndim, index64, contiguous) == (2, False, False)  # y broadcasts along dim 0
    assert numel == 30 and len(params) == 8 * (1 + 2 + 3 + 3 * 2)
    # all-dense operands collapse to the contiguous variant
    fn2 = lambda x, y: torch.nn.functional.relu(x) * y  # noqa: E731
    args2 = (torch.randn(3, 4, 5), torch.randn(3, 4, 5))
    tr2, bsyms2, inputs2, outs2, _ = _thunder_region(fn2, *args2)
    r2 = K.build_cuda_region(bsyms2, inputs2, outs2)
    env2 = _env(tr2, args2, inputs2)
    ca = [env2[p.name] for p in inputs2]
    o2, _ = r2.allocate_outputs(torch.device("cpu"))
    assert r2.launch_params(ca, o2)[0] == (1, False, True)
    # a sliced input keeps the strided path, with collapse of what can be merged
    big = torch.randn(3, 4, 10)
    ca_sliced = [big[:, :, :5], ca[1]]
    assert r2.launch_params(ca_sliced, o2)[0] == (2, False, False)
    # layouts are cached per stride pattern: going back gives the first variant again, and the
    # packed bytes equal a fresh region's, new data pointers included
    fresh = K.build_cuda_region(bsyms2, inputs2, outs2)
    ca_new = [t.clone() for t in ca]
    assert r2.launch_params(ca_new, o2) == fresh.launch_params(ca_new, o2)
    assert r2.launch_params(ca_sliced, o2) == fresh.launch_params(ca_sliced, o2)
    assert r2.launch_params(ca_new, o2)[2] != r2.launch_params(ca, o2)[2]


def test_failed_variant_is_not_compiled_again(monkeypatch):
    fn, make = CASES["relu_add_broadcast"]
    tr, bsyms, inputs, outs, _ = _thunder_region(fn, *make())
    region = K.build_cuda_region(bsyms, inputs, outs)
    compiles = []

    def failing_compile(src, arch, **kw):
        compiles.append(arch)
        raise RuntimeError("nvrtc: out of registers")

    monkeypatch.setattr(K_kernel, "_device_info", lambda device: (90, 132))
    monkeypatch.setattr(K_kernel, "nvrtc_compile", failing_compile)
    with pytest.raises(RuntimeError, match="out of registers"):
        region._function(0, 2, False, False)
    with pytest.raises(NotImplementedError, match="out of registers"):
        region._function(0, 2, False, False)
    assert compiles == [90]  # tried once
    with pytest.raises(RuntimeError):  # another variant is its own try
        region._function(0, 1, False, True)
    assert compiles == [90, 90]


def test_regions_share_loaded_kernels(monkeypatch):
    """NOTE [loaded kernels]: one module load per (device, source), whichever region asks."""
    fn, make = CASES["relu_add_broadcast"]
    tr, bsyms, inputs, outs, _ = _thunder_region(fn, *make())
    r1 = K.build_cuda_region(bsyms, inputs, outs)
    r2 = K.build_cuda_region(bsyms, inputs, outs)  # the same region again (a recompilation, say)
    fn_b, make_b = CASES["gelu_tanh_silu"]
    tr_b, bsyms_b, inputs_b, outs_b, _ = _thunder_region(fn_b, *make_b())
    other = K.build_cuda_region(bsyms_b, inputs_b, outs_b)
    loads = []

    def fake_load(image, name, device):
        loads.append((image, device))
        return 0x1000 + len(loads)

    monkeypatch.setattr(K_kernel, "_loaded_kernels", {})
    monkeypatch.setattr(K_kernel, "_device_info", lambda device: (90, 132))
    monkeypatch.setattr(K_kernel, "nvrtc_compile", lambda src, arch, **kw: {"image": src.encode() + b"\0"})
    monkeypatch.setattr(_C, "cuda_load_function", fake_load)
    f1 = r1._function(0, 2, False, False)
    assert r2._function(0, 2, False, False) == f1
    assert len(loads) == 1
    assert r2._function(1, 2, False, False) != f1  # another device loads its own
    assert r1._function(0, 1, False, True) != f1  # another variant is another kernel
    assert other._function(0, 2, False, False) != f1
    assert len(loads) == 4
    assert len({img for img, _ in loads}) == 3


def test_build_region_rejects_unsupported():
    import thunder

    def f(x):
        return torch.relu(x).sum()

    jf = thunder.jit(f)
    jf(torch.randn(3))
    tr = thunder.last_traces(jf)[-1]
    summ = [b for b in tr.bound_symbols if b.sym.name == "sum"]
    assert summ and not K.fusible_bsym(summ[0])
    with pytest.raises(NotImplementedError):
        K.build_cuda_region(summ, list(summ[0].flat_args[:1]), [summ[0].output])


def test_fusible_bsym_on_thunder_trace():
    import thunder

    def f(x, w, y):
        a = torch.nn.functional.relu(x)
        b = a @ w
        c = torch.nn.functional.gelu(b) + y
        d = c.to(torch.float16)
        e = d.float().softmax(-1)
        g = c.permute(1, 0)
        h = torch.nn.functional.dropout(c, 0.5)
        return b, d, e, g, h, torch.sigmoid(c), c.sum(), c.reshape(-1)

    jf = thunder.jit(f)
    jf(torch.randn(4, 4), torch.randn(4, 4), torch.randn(4))
    tr = thunder.last_traces(jf)[-1]
    flags = {}
    for b in tr.bound_symbols:
        flags.setdefault(b.sym.name, []).append(K.fusible_bsym(b))
    assert all(flags["relu"]) and all(flags["gelu"]) and all(flags["to"]) and all(flags["add"])
    assert all(flags["neg"]) and all(flags["exp"]) and all(flags["reciprocal"])  # sigmoid, decomposed
    assert not any(flags["matmul"])
    assert not any(flags["sum"])
    assert not any(flags["permute"]) and not any(flags.get("reshape", [False]))
    assert not any(flags.get("softmax", flags.get("_softmax", [False])))
    for name in ("unpack_trivial", "python_return", "python_del"):
        assert not any(flags.get(name, [False]))
    assert any(K.view_only_bsym(b) for b in tr.bound_symbols if b.sym.name == "permute")
    # dropout (random) is never fusible
    for name, fl in flags.items():
        if "dropout" in name or "uniform" in name:
            assert not any(fl)


def test_fusible_bsym_warns_on_an_unforeseen_error(monkeypatch):
    # an exception the lowering does not expect keeps the op out of kernels, with a warning naming it
    import thunder
    from thunder_memfuse import MemFuseWarning
    from thunder_memfuse.regions.nvrtc import lowering

    jf = thunder.jit(lambda x: torch.nn.functional.relu(x))
    jf(torch.randn(4))
    relu = [b for b in thunder.last_traces(jf)[-1].bound_symbols if b.sym.name == "relu"]
    assert relu and K.fusible_bsym(relu[0])

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(lowering, "_lower", boom)
    monkeypatch.setattr(lowering, "_per_op", {})  # forget the answer given above
    from thunder_memfuse.regions import base

    monkeypatch.setattr(base, "_reasons", set())  # what has been said once already
    with pytest.warns(MemFuseWarning, match="relu stays out of generated kernels: .*RuntimeError: boom"):
        assert not lowering.fusible_bsym(relu[0])
    # said once: not for the same bound symbol again, nor for another relu with the same error
    jf2 = thunder.jit(lambda x: torch.nn.functional.relu(x) * 2)
    jf2(torch.randn(3))
    relu2 = [b for b in thunder.last_traces(jf2)[-1].bound_symbols if b.sym.name == "relu"]
    with warnings.catch_warnings(record=True) as rec:  # the filter pytest.warns had: said once
        warnings.simplefilter("always")
        assert not lowering.fusible_bsym(relu[0])
        assert not lowering.fusible_bsym(relu2[0])
    assert not [w for w in rec if issubclass(w.category, MemFuseWarning)]


def test_each_op_is_lowered_once_for_the_predicate_and_the_build(monkeypatch):
    """regions/nvrtc/lowering.py NOTE [per-op lowering]: fusible_bsym lowers each bound symbol
    once, answers again from its entry, and building a region of those bound symbols reuses
    their lowering; the entry goes with its bound symbol."""
    import gc

    import thunder
    from thunder_memfuse.regions.nvrtc import lowering

    monkeypatch.setattr(lowering, "_per_op", {})
    calls, asked = [], []  # lowerings made; per-op lowerings asked for (made or reused)
    real_check, real_op_leaves = lowering._check_leaves, lowering._op_leaves

    def counting(bsym):
        calls.append(bsym)
        return real_check(bsym)

    def asking(bsym):
        asked.append(id(bsym))  # not the object: entries must be free to go with their bound symbols
        return real_op_leaves(bsym)

    monkeypatch.setattr(lowering, "_check_leaves", counting)
    monkeypatch.setattr(lowering, "_op_leaves", asking)

    def real_leaves_of(b):
        return lowering._leaves(b, [])
    x = torch.randn(4, 5)
    tr, bsyms, inputs, outs, _ = _thunder_region(lambda t: (t.sin() * 2 + 1).relu(), x)
    assert len(bsyms) >= 3
    lowered = len(calls)
    assert lowered and all(any(c is b for b in tr.bound_symbols) for c in calls)
    assert len({id(b) for b in calls}) == len(calls)  # once per bound symbol asked
    assert all(K.fusible_bsym(b) for b in bsyms)  # answered from the entries
    assert len(calls) == lowered
    asked.clear()
    K.build_cuda_region(bsyms, inputs, outs)
    assert len(calls) == lowered  # the build lowered nothing again
    assert len(asked) >= len(bsyms)  # it reused each op's lowering
    # an unsupported op's reason is kept too
    tr2 = thunder.jit(lambda t: t.sum())
    tr2(x)
    summ = [b for b in thunder.last_traces(tr2)[-1].bound_symbols if b.sym.name == "sum"]
    for _ in range(2):
        with pytest.raises(NotImplementedError):
            K.build_cuda_region(summ, list(summ[0].flat_args[:1]), [summ[0].output])
    assert sum(1 for b in calls if b is summ[0]) == 1
    # an entry is weak: it goes with its bound symbol, and a copy of one is lowered for itself
    copy = bsyms[0].from_bsym()
    entries = len(lowering._per_op)
    assert K.fusible_bsym(copy) and len(lowering._per_op) == entries + 1 and calls[-1] is copy
    calls.clear()
    del copy
    gc.collect()
    assert len(lowering._per_op) == entries
    # ... also for a prim, its own only leaf (the entry must not hold it)
    prim = real_leaves_of(bsyms[0])[0].from_bsym()
    assert lowering._op_leaves(prim) == [prim] and lowering._op_leaves(prim)[0] is prim
    calls.clear()
    del prim
    gc.collect()
    assert len(lowering._per_op) == entries
