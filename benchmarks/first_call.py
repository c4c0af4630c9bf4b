"""First calls measured one variant per process (CPU).

    python benchmarks/first_call.py [--only "llama 4x256/4x128/checkpointed"] [--repeat 2]
                                    [--variants thunder+torchcompile,torchcompile+memfuse]

benchmarks/models.py runs every variant of a workload in one process, so a later variant's Inductor
compiles may reuse kernels an earlier one compiled (Inductor's in-process code caches).  Here each
(workload, variant) runs alone, one step as models.py runs it, in a fresh process with a fresh
Inductor cache directory, --repeat times, in turns
(variant A, variant B, A, B, ...) so that a change in the machine's speed touches both.  Prints
each first call, the median per variant, and each variant's median against the first variant's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def first_call(workload, variant):
    """One first call of `variant` on the workload named `workload` (exactly), in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="memfuse_first_call_") as d:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", workload, variant],
                             check=True, capture_output=True, text=True,
                             env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(d, "inductor")))
    return json.loads(out.stdout.strip().splitlines()[-1])


def child(workload, variant):
    import warnings

    warnings.simplefilter("ignore")
    sys.path.insert(0, HERE)
    import models
    import workloads

    ws = [w for w in workloads.all_workloads(only=[workload]) if w.name == workload]
    if len(ws) != 1:
        raise SystemExit(f"first_call: no workload named {workload!r}")
    rows = models.run(ws, models.variants([variant]), rounds=1, do_compare=False, log=lambda *a: None)
    if "error" in rows[0]:
        raise SystemExit(f"first_call: {variant} failed on {workload}: {rows[0]['error']}")
    print(json.dumps(rows[0]["first_call_s"]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="nanogpt 4x256/4x128/checkpointed;llama 4x256/4x128/checkpointed",
                    help="';'-separated workload names, '/' standing for ', ' (the names of benchmarks/workloads.py)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--variants", default="thunder+torchcompile,torchcompile+memfuse")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)
    if args.child:
        return child(*args.child)
    names = [n.replace("/", ", ") for n in args.only.split(";")]
    variants = args.variants.split(",")
    times = {}  # (workload, variant) -> [s]
    for _ in range(args.repeat):
        for w in names:
            for v in variants:
                s = first_call(w, v)
                times.setdefault((w, v), []).append(s)
                print(f"{w} | {v}: {s:.1f} s", flush=True)
    print()
    print("| workload | variant | first call s, each run | median | against " + variants[0] + " |")
    print("|---|---|---|---|---|")
    for w in sorted({w for w, _ in times}):
        base = statistics.median(times[(w, variants[0])]) if (w, variants[0]) in times else None
        for v in variants:
            ts = times.get((w, v))
            if not ts:
                continue
            med = statistics.median(ts)
            ratio = f"{med / base:.2f}x" if base else "-"
            print(f"| {w} | {v} | {' / '.join(f'{t:.1f}' for t in ts)} | {med:.1f} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
