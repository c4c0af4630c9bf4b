"""What one call of a memfuse torch.compile region costs, through torch.compile (Dynamo: Thunder's
make_compiled) and through Inductor directly (regions/torchcompile.py NOTE [regions without Dynamo]).

    python benchmarks/region_call_overhead.py [--size 128] [--calls 2000]

The region is the whole of a small function's trace (relu, mul, add, softmax, permute, sum, matmul);
both callables run the same Inductor kernels.  Prints microseconds per call and whether the two agree.
"""
from __future__ import annotations

import argparse
import time


def _region(size):
    import torch
    import thunder

    def f(x, y, w):
        a = torch.relu(x) * y + 1.0
        b = torch.nn.functional.softmax(a, -1)
        return a.t(), torch.sum(b, 0), b @ w

    args = (torch.randn(size, size), torch.randn(size, size), torch.randn(size, size // 2))
    jf = thunder.jit(f)
    jf(*args)
    trace = thunder.last_traces(jf)[-1]
    skip = ("unpack_trivial", "python_return", "python_del", "unpack_sequence")
    bsyms = [b for b in trace.bound_symbols if b.sym.name not in skip]
    ret = next(b for b in trace.bound_symbols if b.sym.name == "python_return")
    return bsyms, list(trace.args), list(ret.args[0]), args


def _per_call_us(fn, calls):
    for _ in range(50):
        fn()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args(argv)
    import torch

    from thunder_memfuse.regions import torchcompile as tc

    bsyms, inputs, outputs, args = _region(a.size)
    dynamo = tc._dynamo_compiled(bsyms, inputs, outputs)
    direct = tc.InductorRegion(tc._torch_callable(bsyms, inputs, outputs), lambda: dynamo)
    same = all(torch.equal(p, q) for p, q in zip(dynamo(*args), direct(*args)))
    print(f"one region of {len(bsyms)} ops, {a.size}x{a.size} fp32, {torch.get_num_threads()} threads, "
          f"{a.calls} calls each; results identical: {same}")
    print(f"  through torch.compile (Dynamo):  {_per_call_us(lambda: dynamo(*args), a.calls):7.1f} us/call")
    print(f"  Inductor directly (memfuse):     {_per_call_us(lambda: direct(*args), a.calls):7.1f} us/call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
