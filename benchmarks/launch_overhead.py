"""Host-side cost of one generated-kernel launch, measurable without a GPU.

    python benchmarks/launch_overhead.py [--size 256] [--calls 20000]

A fused region's call does, in Python, before the driver's cuLaunchKernel: check the
arguments, allocate the outputs from PyTorch's allocator, and pack the kernel parameters
(strides collapsed, 32/64-bit index and contiguous variant chosen).  This runs exactly that
path (CudaRegion.prepare) on CPU tensors for regions memfuse forms on real traces, and prints
microseconds per call: the part of a region's launch latency that is ours.  On a GPU the
driver launch (~3-5 us) and torch.cuda.current_stream come on top.  The last row times the Python
steps of a GEMM + ReLU region (kernels.cuda_matmul_act) before its cuBLASLt call.  Asserts nothing.
"""
from __future__ import annotations

import argparse
import time
import warnings


def regions(size):
    """(name, CudaRegion, args) for the regions memfuse forms on a few small functions."""
    import torch
    import thunder

    from thunder_memfuse import MemFuse
    from thunder_memfuse.regions.nvrtc import build_cuda_region

    def gelu_bias(x, b):
        return torch.nn.functional.gelu(x + b) * 0.5

    def residual(x, y, w):
        return (x * torch.sigmoid(x) + y * w).to(torch.float16)

    def strided(x):
        return torch.relu(x.t()) + 1

    cases = {
        "gelu(x + bias) * 0.5, bias broadcast": (gelu_bias, (torch.randn(size, size), torch.randn(size))),
        "silu(x) + y*w -> fp16, 3 inputs": (residual, (torch.randn(size, size),) * 3),
        "relu(x.t()) + 1, strided input": (strided, (torch.randn(size, size),)),
    }
    out = []
    for name, (fn, args) in cases.items():
        jf = thunder.jit(fn, transforms=[MemFuse(fuse=True)])
        jf(*args)
        fusions = [b for b in thunder.last_traces(jf)[-1].bound_symbols if b.sym.name.startswith("MemFuse")]
        b = max(fusions, key=lambda b: len(b.subsymbols))
        region = build_cuda_region(b.subsymbols, b.args, b.output)
        call_args = [_value(p) for p in b.args]
        out.append((name, region, call_args))
    return out


def _value(p):
    """A CPU value for a region input proxy: a random tensor of its shape and dtype, or its number."""
    import torch
    from thunder.core.dtypes import to_torch_dtype
    from thunder.core.proxies import TensorProxy

    if isinstance(p, TensorProxy):
        return torch.randn(tuple(p.shape)).to(to_torch_dtype(p.dtype))
    return getattr(p, "value", p)


def gemm_act_prep_us(size, calls):
    """The Python steps of regions/nvrtc/gemm.py's cuda_matmul_act before the driver call (argument checks,
    torch.matmul's shape rules, output allocation, the cuBLASLt problem), on CPU tensors."""
    import torch

    from thunder_memfuse.regions.nvrtc import gemm as K

    a, b = torch.randn(size, size), torch.randn(size, size)

    def prep():
        K._check_tensor_args(a=a, b=b)
        K._check_act("relu")
        a2, b2, m, k, n, batch, shape = K._matmul_shapes(a, b, ValueError)
        K._check_lt_inputs(a, b, cuda=False)
        K._lt_problem(a2, b2, torch.empty(*batch, m, n), None)

    for _ in range(200):
        prep()
    t0 = time.perf_counter()
    for _ in range(calls):
        prep()
    return (time.perf_counter() - t0) / calls * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--calls", type=int, default=20000)
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    import torch

    print(f"host-side prepare per call, CPU tensors {a.size}x{a.size}, {a.calls} calls, torch {torch.__version__}")
    print(f"{'region':40s} {'inputs':>6s} {'us/call':>8s}")
    for name, region, args in regions(a.size):
        for _ in range(200):
            region.prepare(args, cuda=False)
        t0 = time.perf_counter()
        for _ in range(a.calls):
            region.prepare(args, cuda=False)
        us = (time.perf_counter() - t0) / a.calls * 1e6
        print(f"{name:40s} {len(args):6d} {us:8.2f}")
    print(f"{'relu(a @ b) via cuBLASLt: host steps':40s} {2:6d} {gemm_act_prep_us(a.size, a.calls):8.2f}")


if __name__ == "__main__":
    main()
