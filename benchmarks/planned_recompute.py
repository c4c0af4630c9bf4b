"""Planned backward peaks of the checkpointed workloads with and without recomputation (CPU).

    python benchmarks/planned_recompute.py [--only nanogpt,gpt2,llama] [--torchcompile] [--live N]
    python benchmarks/planned_recompute.py --shares 0,0.05,0.1,0.25 [--only ...] [--torchcompile]

One training step of each checkpointed workload (benchmarks/workloads.py, full size) under
thunder.jit(..., transforms=[MemFuse(recompute="auto")]), then report(jfn)["backward"]: the planned peak
with the copies, the planned peak without them, how many ops run twice, the pass's own time, the
forward's regions (its first grouping, and the grouping within the backward's planned peak where that
has fewer: thunder_memfuse/integration/_step.py NOTE [the step's peak]) and its planned peak, and (--live N) the N
largest storages live at the planned peak.  Planned peaks depend on the trace only,
not on the machine's load; the pass's time does.

--shares: the budget's effect instead.  The backward's bound symbols are caught on their way into
integration._planning.plan_trace during that step and planned again with each share of the bytes its ops write
(MemFuse(recompute=share) gives that budget; the default is _recompute.DEFAULT_SHARE): the planned
peak, the bytes the copies write, the splits and the groups (regions and single ops) of each plan.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="nanogpt,gpt2,llama")
    ap.add_argument("--torchcompile", action="store_true", help='executors=["torchcompile"]')
    ap.add_argument("--live", type=int, default=0)
    ap.add_argument("--shares", help="comma-separated budget shares to plan the backward with")
    args = ap.parse_args(argv)
    if args.shares:
        return shares(args)

    import thunder

    import workloads
    from thunder_memfuse import MemFuse, report
    from thunder_memfuse.reports import _report

    if args.live:  # report() lists the five largest; a longer list when asked
        top = _report._largest_live_at_peak
        _report._largest_live_at_peak = lambda info, steps, top_n=5: top(info, steps, top=args.live)
    ex = {"executors": ["torchcompile"]} if args.torchcompile else {}
    print("| workload | planned backward peak MiB | without recompute | ops run twice | pass ms | "
          "forward regions: first grouping -> within the backward's peak | planned forward peak MiB |")
    print("|---|---|---|---|---|---|---|")
    for name in args.only.split(","):
        w = getattr(workloads, name)(checkpoint=True)
        jf = thunder.jit(w.fn, transforms=[MemFuse(recompute="auto")], **ex)
        w.step(jf)()
        rep = report(jf)
        r, f = rep["backward"], rep["forward"]
        rc = r.get("recompute") or {}
        without = rc.get("peak_without_bytes") or r["peak_after_bytes"]
        regions = str(f["regions_after"])
        if f["regions_without_allowance"] is not None:
            regions = f"{f['regions_without_allowance']} -> {regions}"
        print(f"| {w.name} | {r['peak_after_bytes'] / 2**20:.2f} | {without / 2**20:.2f} | "
              f"{rc.get('copied_ops', 0)} | {r['plan_ms']:.0f} | {regions} | "
              f"{f['peak_after_bytes'] / 2**20:.2f} |", flush=True)
        for n, b, where in r["largest_live_at_peak"][: args.live]:
            print(f"    live at peak: {n} {b / 2**20:.2f} MiB ({where})")


def shares(args):
    import time

    import workloads
    from thunder_memfuse.integration import _recompute

    ex = {"executors": ["torchcompile"]} if args.torchcompile else {}
    print("| workload | budget share | planned backward peak MiB | copies write MiB | splits | groups | plan ms |")
    print("|---|---|---|---|---|---|---|")
    for name in args.only.split(","):
        w = getattr(workloads, name)(checkpoint=True)
        bsyms, kw, orig = workloads.backward_plan_call(w, **ex)
        for share in (float(x) for x in args.shares.split(",")):
            t = time.perf_counter()
            r = orig(bsyms, **dict(kw, recompute=_recompute.budget_bytes(bsyms, share)))
            ms = (time.perf_counter() - t) * 1e3
            rc = r["plan"].get("recompute") or {}
            print(f"| {w.name} | {share:g} | {r['plan']['peak_bytes'] / 2**20:.2f} | "
                  f"{rc.get('copied_bytes', 0) / 2**20:.2f} | {rc.get('splits', 0)} | {len(r['plan']['groups'])} | "
                  f"{ms:.0f} |", flush=True)


if __name__ == "__main__":
    main()
