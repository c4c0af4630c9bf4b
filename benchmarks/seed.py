"""The main job: the seed comparison, on CPU by default (bash scripts/seed.sh runs it).

The seed case: N independent paths relu -> matmul -> relu -> matmul, chained
through one accumulator (10 paths of 256x256 fp32 by default), written twice:
path by path (the "efficient" order: one path's intermediates live at a time)
and step by step across all paths (the "inefficient" order, the shape
Thunder's dataflow fusion gives it: every path's intermediate live at once).

    python benchmarks/seed.py [--device cpu|cuda] [--paths 10] [--size 256]

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
    labels = {}  # ORDER_KEY says what each label means
    for i in range(n_paths):
        labels[id(relu1[i])], labels[id(mm1[i])], labels[id(relu2[i])] = f"p{i}.relu", f"p{i}.mm", f"p{i}.relu2"
    for p in paths:
        labels[id(chain[p])] = f"p{p}.into_a"
    spec = dict(ops=ops, value_bytes=vb, graph_inputs=t0 + [a[0]], graph_outputs=[a[-1]],
                fusible=[len(i) == 1 for i, _ in ops])
    return spec, [labels[id(o)] for o in ops]


ORDER_KEY = ("path i's ops, in the order planned: pi.relu (its first relu), pi.mm (relu @ relu), pi.relu2 "
             "(relu of that), pi.into_a (a = relu2 @ a, the accumulator)")


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
        print(f"seed graph, {name} function: {len(spec['ops'])} ops; peak in the function's own order "
              f"{p.baseline_peak_bytes / MIB:.2f} MiB, in memfuse's order {p.unfused_peak_bytes / MIB:.2f} MiB "
              f"(with its fusion regions {p.peak_bytes / MIB:.2f} MiB, {len(p.groups)} kernel launches); "
              f"{'proven optimal' if p.optimal else 'not proven optimal'}, planned in {ms:.2f} ms")
        print("  order:", " ".join(labels[k] for k in p.order))
    print(f"  ({ORDER_KEY})")
    return rows


def thunder_section(device, n_paths, size, iters=1, time_iters=0, progress=None):
    """{(function, variant): {"measured_mib", "trace_mib", "matches_eager", "time_ms"}}:
    each variant's measured peak above the inputs, Thunder's own estimate on its
    final trace, whether its result matches eager's, and (time_iters > 0) the
    median milliseconds per call over time_iters calls (None otherwise).
    progress: say each variant on stderr as it compiles (thunder_memfuse/reports/_progress.py)."""
    from thunder_memfuse.reports._progress import Progress

    say = Progress("seed", progress)
    say("importing Thunder ...")
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
        # memfuse as the fusion pass in torch.compile's place, its regions compiled by torch.compile
        yield "torchcompile + memfuse", thunder.jit(fn, executors=["torchcompile"], transforms=[MemFuse()]), "jit"

    results = {}
    for fname, fn in FUNCTIONS.items():
        expected = fn(list(t0s), a)
        for vname, f, kind in variants(fn):
            say(f"{fname} function, {vname}: {'compiling and ' if vname != 'eager' else ''}measuring ...")
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
            results[(fname, vname)] = dict(measured_mib=peak / MIB, trace_mib=est, matches_eager=ok,
                                           time_ms=_median_ms(f, t0s, a, time_iters, device))
    return results


def _median_ms(f, t0s, a, n, device):
    if n <= 0:
        return None
    import statistics

    import torch

    times = []
    for _ in range(n):
        args = list(t0s)
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        f(args, a)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


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
    print()
    print("The measured column is what this process allocated; trust it. Thunder's estimate reads the final "
          "trace statically and does not see what runs inside a fusion region (Thunder + torchcompile's one "
          "region holds every path), so it can be far below the measurement.")


def plot_results(results, device, n_paths, size, path):
    """One comparison figure per function (thunder_memfuse.plot.plot_comparison), saved
    to path with -<function> before the suffix; returns the paths written."""
    import os

    from thunder_memfuse.plot import plot_comparison

    root, ext = os.path.splitext(path)
    written = []
    for fname in FUNCTIONS:
        rows = {v: {"peak_mib": r["measured_mib"], "time_ms": r.get("time_ms")}
                for (f, v), r in results.items() if f == fname}
        out = f"{root}-{fname}{ext or '.png'}"
        plot_comparison(rows, out, title=f"seed, {fname} order: {n_paths} paths of {size}x{size} on {device}",
                        measured_by="max_memory_allocated" if device == "cuda" else "torch.profiler allocations")
        written.append(out)
        print(f"plot: {out}")
    return written


def cuda_unavailable():
    """Why this process cannot run on CUDA (None: it can): a CPU-only build of torch, or no device."""
    import torch

    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return f"this torch ({torch.__version__}) is a build without CUDA"
    if not torch.cuda.is_available():
        return (f"torch {torch.__version__} is built with CUDA {torch.version.cuda}, but no CUDA device "
                f"is visible (torch.cuda.is_available() is False: no GPU, no driver, or CUDA_VISIBLE_DEVICES)")
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--paths", type=int, default=10)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--plan-only", action="store_true", help="only plan the seed graph (no Thunder)")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--plot", metavar="PATH",
                    help="also draw each function's peak and time per variant to PATH (needs matplotlib: "
                         "the [plot] extra); PATH gets -efficient / -inefficient before its suffix")
    ap.add_argument("--time-iters", type=int, default=0, help="also time each variant: median of N calls")
    ap.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="say on stderr which variant is compiling (default: where stderr is a terminal, or "
                         "as THUNDER_MEMFUSE_PROGRESS=1 / 0 says)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not args.plan_only:
        problem = cuda_unavailable()
        if problem:
            ap.error(f"--device cuda: {problem}. Run without --device (the CPU comparison), with --plan-only, "
                     f"or on a machine with an NVIDIA GPU and a CUDA build of torch")
    nbytes = args.size * args.size * 4
    report = {"plan": plan_section(args.paths, nbytes)}
    if not args.plan_only:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # Thunder's optional-executor warnings
            results = thunder_section(args.device, args.paths, args.size,
                                      time_iters=args.time_iters or (3 if args.plot else 0), progress=args.progress)
        print_table(results, args.device)
        report["run"] = {f"{k[0]}/{k[1]}": v for k, v in results.items()}
        if args.plot:
            plot_results(results, args.device, args.paths, args.size, args.plot)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
