"""The main job: the seed comparison (shared/SEED.md), on CPU by default.

    python -m thunder_memfuse.seed [--device cpu|cuda] [--paths 10] [--size 256]

1. Plans the seed graph with the C core for both functions and prints the plan.
2. Runs both functions under the real peers: eagerly, under torch.compile,
   Thunder's default, Thunder with its CPU fusion executor
   (executors=["torchcompile"]: the seed's problem, since that executor fuses
   the independent paths into one region), memfuse, and memfuse added to the
   torchcompile executor; prints each one's peak above the inputs: Thunder's
   own estimate on the final trace
   (get_alloc_memory) and the measured peak (torch.profiler allocations on CPU,
   torch.cuda.max_memory_allocated on CUDA).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

MIB = float(1 << 20)


def memory_peak_efficient_func(t0s, a):
    import torch

    for t0 in t0s:
        t1 = torch.nn.functional.relu(t0)
        del t0
        t2 = torch.matmul(t1, t1)
        del t1
        t3 = torch.nn.functional.relu(t2)
        del t2
        a = torch.matmul(t3, a)
        del t3
    return a


def memory_peak_inefficient_func(t0s, a):
    import torch

    t1s = []
    for t0 in t0s:
        t1 = torch.nn.functional.relu(t0)
        del t0
        t1s.append(t1)
    del t0s
    t2s = []
    while t1s:
        t1 = t1s.pop()
        t2 = torch.matmul(t1, t1)
        del t1
        t2s.append(t2)
    del t1s
    t3s = []
    while t2s:
        t2 = t2s.pop()
        t3 = torch.nn.functional.relu(t2)
        del t2
        t3s.append(t3)
    del t2s
    while t3s:
        t3 = t3s.pop()
        a = torch.matmul(t3, a)
        del t3
    del t3s
    return a


FUNCTIONS = {"efficient": memory_peak_efficient_func, "inefficient": memory_peak_inefficient_func}


def seed_graph_spec(efficient: bool, n_paths: int = 10, nbytes: int = 256 * 256 * 4):
    """The seed as a plain graph for thunder_memfuse.plan, ops in the function's order."""
    vb = []

    def new():
        vb.append(nbytes)
        return len(vb) - 1

    t0 = [new() for _ in range(n_paths)]
    a = [new()]
    t1 = [new() for _ in range(n_paths)]
    t2 = [new() for _ in range(n_paths)]
    t3 = [new() for _ in range(n_paths)]
    a += [new() for _ in range(n_paths)]
    paths = list(range(n_paths)) if efficient else list(reversed(range(n_paths)))
    relu1 = {i: ([t0[i]], [t1[i]]) for i in range(n_paths)}
    mm1 = {i: ([t1[i], t1[i]], [t2[i]]) for i in range(n_paths)}
    relu2 = {i: ([t2[i]], [t3[i]]) for i in range(n_paths)}
    chain = {p: ([t3[p], a[j]], [a[j + 1]]) for j, p in enumerate(paths)}
    if efficient:
        ops = [o for i in paths for o in (relu1[i], mm1[i], relu2[i], chain[i])]
    else:
        ops = [relu1[i] for i in range(n_paths)] + [mm1[i] for i in paths] + [relu2[i] for i in paths]
        ops += [chain[p] for p in paths]
    labels = {}
    for i in range(n_paths):
        labels[id(relu1[i])], labels[id(mm1[i])], labels[id(relu2[i])] = f"relu{i}", f"mm{i}", f"relu'{i}"
    for j, p in enumerate(paths):
        labels[id(chain[p])] = f"a{j + 1}=mm(t3_{p})"
    spec = dict(ops=ops, value_bytes=vb, graph_inputs=t0 + [a[0]], graph_outputs=[a[-1]],
                fusible=[len(i) == 1 for i, _ in ops])
    return spec, [labels[id(o)] for o in ops]


def plan_section(n_paths, nbytes):
    import thunder_memfuse as tm

    rows = {}
    for name in FUNCTIONS:
        spec, labels = seed_graph_spec(name == "efficient", n_paths, nbytes)
        t = time.perf_counter()
        p = tm.plan(**spec)
        ms = (time.perf_counter() - t) * 1e3
        rows[name] = dict(peak_mib=p.peak_bytes / MIB, unfused_peak_mib=p.unfused_peak_bytes / MIB,
                          baseline_peak_mib=p.baseline_peak_bytes / MIB, optimal=p.optimal, states=p.states,
                          method=p.method, plan_ms=ms, groups=len(p.groups))
        print(f"seed graph, {name} order: {len(spec['ops'])} ops, input-order peak "
              f"{p.baseline_peak_bytes / MIB:.2f} MiB -> planned {p.unfused_peak_bytes / MIB:.2f} MiB "
              f"(with fusion {p.peak_bytes / MIB:.2f} MiB, {len(p.groups)} kernels), "
              f"{'proven optimal' if p.optimal else 'not proven optimal'} ({p.method}, {p.states} states, "
              f"{ms:.2f} ms)")
        print("  order:", " ".join(labels[k] for k in p.order))
    return rows


def thunder_section(device, n_paths, size, iters=1):
    import torch

    import thunder
    from thunder_memfuse import MemFuse
    from thunder_memfuse.measure import cpu_peak_bytes, cuda_peak_bytes, trace_peak_bytes

    torch.manual_seed(0)
    t0s = [torch.randn(size, size, device=device) for _ in range(n_paths)]
    a = torch.randn(size, size, device=device)
    measure = cuda_peak_bytes if device == "cuda" else cpu_peak_bytes

    def variants(fn):
        yield "eager", fn, None
        if device == "cpu" or torch.cuda.is_available():
            yield "torch.compile", torch.compile(fn), None
        yield "thunder default", thunder.jit(fn), "jit"
        yield "thunder + torchcompile", thunder.jit(fn, executors=["torchcompile"]), "jit"
        yield "memfuse", thunder.jit(fn, transforms=[MemFuse()]), "jit"
        yield "torchcompile + memfuse", thunder.jit(fn, executors=["torchcompile"], transforms=[MemFuse()]), "jit"

    results = {}
    for fname, fn in FUNCTIONS.items():
        expected = fn(list(t0s), a)
        for vname, f, kind in variants(fn):
            try:
                f(list(t0s), a)  # warm up / compile
                peak, out = measure(f, list(t0s), a)
            except Exception as e:  # a peer that cannot run here (no C compiler for torch.compile, say)
                results[(fname, vname)] = dict(measured_mib=None, trace_mib=None, matches_eager=None,
                                               error=f"{type(e).__name__}: {e}".splitlines()[0][:120])
                continue
            est = None
            if kind == "jit":
                est = trace_peak_bytes(thunder.last_traces(f)[-1]) / MIB
            ok = bool(torch.allclose(out, expected, rtol=1e-4, atol=1e-3))
            results[(fname, vname)] = dict(measured_mib=peak / MIB, trace_mib=est, matches_eager=ok)
    return results


def print_table(results, device):
    meas = "max_memory_allocated" if device == "cuda" else "profiler allocations"
    print()
    print(f"| function | variant | peak above inputs ({meas}) | Thunder estimate (get_alloc_memory) | result |")
    print("|---|---|---|---|---|")
    for (fname, vname), r in results.items():
        if r.get("error"):
            print(f"| {fname} | {vname} | could not run: {r['error']} | - | - |")
            continue
        est = "-" if r["trace_mib"] is None else f"{r['trace_mib']:.2f} MiB"
        print(f"| {fname} | {vname} | {r['measured_mib']:.2f} MiB | {est} | "
              f"{'matches eager' if r['matches_eager'] else 'DIFFERS'} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--paths", type=int, default=10)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--plan-only", action="store_true", help="only plan the seed graph (no Thunder)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    nbytes = args.size * args.size * 4
    report = {"plan": plan_section(args.paths, nbytes)}
    if not args.plan_only:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # Thunder's optional-executor warnings
            results = thunder_section(args.device, args.paths, args.size)
        print_table(results, args.device)
        report["run"] = {f"{k[0]}/{k[1]}": v for k, v in results.items()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
