"""Planned backward peaks of the checkpointed workloads with and without recomputation (CPU).

    python benchmarks/planned_recompute.py [--only nanogpt,gpt2,llama] [--torchcompile] [--live N]

One training step of each checkpointed workload (benchmarks/workloads.py, full size) under
thunder.jit(..., transforms=[MemFuse(recompute="auto")]), then report(jfn)["backward"]: the planned peak
with the copies, the planned peak without them, how many ops run twice, the pass's own time, and
(--live N) the N largest storages live at the planned peak.  Planned peaks depend on the trace only,
not on the machine's load; the pass's time does.
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
    args = ap.parse_args(argv)

    import thunder

    import workloads
    from thunder_memfuse import MemFuse, report
    from thunder_memfuse import _report

    if args.live:  # report() lists the five largest; a longer list when asked
        top = _report._largest_live_at_peak
        _report._largest_live_at_peak = lambda info, steps, top_n=5: top(info, steps, top=args.live)
    ex = {"executors": ["torchcompile"]} if args.torchcompile else {}
    print("| workload | planned backward peak MiB | without recompute | ops run twice | pass ms |")
    print("|---|---|---|---|---|")
    for name in args.only.split(","):
        w = getattr(workloads, name)(checkpoint=True)
        jf = thunder.jit(w.fn, transforms=[MemFuse(recompute="auto")], **ex)
        w.step(jf)()
        r = report(jf)["backward"]
        rc = r.get("recompute") or {}
        without = rc.get("peak_without_bytes") or r["peak_after_bytes"]
        print(f"| {w.name} | {r['peak_after_bytes'] / 2**20:.2f} | {without / 2**20:.2f} | "
              f"{rc.get('copied_ops', 0)} | {r['plan_ms']:.0f} |", flush=True)
        for n, b, where in r["largest_live_at_peak"][: args.live]:
            print(f"    live at peak: {n} {b / 2**20:.2f} MiB ({where})")


if __name__ == "__main__":
    main()
