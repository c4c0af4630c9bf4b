"""Scheduler scaling: plan synthetic graphs shaped like a checkpointed transformer
backward and print time, DP states, proven-optimal or not, and peak vs baseline.

    python benchmarks/scheduler_scaling.py [--sizes 1000 10000 100000] [--repeat 3]

Asserts nothing about time (targets on a 2-core machine: seed < 10 ms and proven
optimal; 10k ops < 50 ms; 100k ops < 1 s; peak never above baseline).
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import thunder_memfuse as tm
if __package__:  # imported as benchmarks.scheduler_scaling (notebooks/03_scheduler.ipynb)
    from .seed import seed_graph_spec
else:  # python benchmarks/scheduler_scaling.py: benchmarks/ is on sys.path
    from seed import seed_graph_spec

MIB = float(1 << 20)


def transformer_backward_graph(n_ops_target: int, seed: int = 0, paths=(4, 8), path_len=(3, 6)):
    """Stacks of blocks.  Each block reads the running gradient g_k (fan-out to
    every path), runs P parallel paths of L ops (elementwise ops and matmuls
    against a weight that is a graph input; one recomputed activation per path
    as in checkpointing), writes one weight gradient per path (a graph output,
    live to the end), and sums the paths into g_{k+1}.  Ops are listed in the
    'horizontal' order a dataflow fusion produces: step j of every path, then
    step j+1, so the input order is the memory-hungry one."""
    rng = random.Random(seed)
    vb, ops, fusible = [], [], []
    graph_inputs, graph_outputs = [], []

    def val(nbytes, is_input=False):
        vb.append(nbytes)
        if is_input:
            graph_inputs.append(len(vb) - 1)
        return len(vb) - 1

    def op(ins, outs, fu):
        ops.append((ins, outs))
        fusible.append(fu)

    act = 1 << 20
    g = val(act, True)
    while len(ops) < n_ops_target:
        p = rng.randint(*paths)
        lens = [rng.randint(*path_len) for _ in range(p)]
        heads = [g] * p
        saved = [val(act // 2, True) for _ in range(p)]  # saved-for-backward input per path
        weights = [val(act // 4, True) for _ in range(p)]
        for step in range(max(lens)):
            for i in range(p):
                if step >= lens[i]:
                    continue
                if step == 0:  # recompute the checkpointed activation
                    r = val(act)
                    op([saved[i]], [r], True)
                    out = val(act)
                    op([heads[i], r], [out], True)
                elif step == lens[i] - 1:  # matmul against the weight, plus its gradient
                    out = val(act)
                    gw = val(act // 4)
                    op([heads[i], weights[i]], [out], False)
                    op([heads[i], saved[i]], [gw], False)
                    graph_outputs.append(gw)
                else:
                    out = val(act * rng.choice([1, 1, 2]))
                    op([heads[i]], [out], True)
                heads[i] = out
        acc = heads[0]
        for i in range(1, p):
            nxt = val(act)
            op([acc, heads[i]], [nxt], True)
            acc = nxt
        g = acc
    graph_outputs.append(g)
    return dict(ops=ops, value_bytes=vb, graph_inputs=graph_inputs, graph_outputs=graph_outputs, fusible=fusible)


def bench(name, spec, repeat, max_states=None):
    times = []
    p = None
    for _ in range(repeat):
        t = time.perf_counter()
        p = tm.plan(**spec, max_states=max_states)
        times.append((time.perf_counter() - t) * 1e3)
    assert p.peak_bytes <= p.unfused_peak_bytes and p.peak_bytes <= p.baseline_peak_bytes
    print(f"| {name} | {len(spec['ops'])} | {statistics.median(times):.2f} | {p.states} | "
          f"{'yes' if p.optimal else 'no'} | {p.method} | {p.baseline_peak_bytes / MIB:.2f} | "
          f"{p.unfused_peak_bytes / MIB:.2f} | {p.peak_bytes / MIB:.2f} | {p.lower_bound_bytes / MIB:.2f} | "
          f"{len(p.groups)} |")
    return p


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", type=int, nargs="*", default=[1000, 10000, 100000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-states", type=int, default=None, help="DP state cap (default: the core's)")
    args = ap.parse_args(argv)
    print("| graph | ops | plan ms (median) | DP states | proven optimal | method | baseline MiB | "
          "planned MiB | with fusion MiB | lower bound MiB | kernels |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for eff in (True, False):
        spec, _ = seed_graph_spec(eff)
        bench(f"seed ({'efficient' if eff else 'inefficient'} order)", spec, max(args.repeat, 5))
    for paths in ((2, 4), (4, 8), (12, 16)):
        for n in args.sizes:
            bench(f"transformer-backward-like {n // 1000}k, {paths[0]}-{paths[1]} paths/block",
                  transformer_backward_graph(n, paths=paths), args.repeat, args.max_states)


if __name__ == "__main__":
    main()
