"""How memfuse's own time grows with depth (issue 32): a Llama-style training step at 2..64 layers (CPU).

    python benchmarks/depth_scaling.py [--layers 2,4,8,16,32,64] [--configs plain,ckpt]
                                       [--variants tc,tc+memfuse] [--cache cold,warm] [--timeout 1800]

The step: benchmarks/workloads.py's Llama-style decoder, width 64, 4 heads, seq 64, batch 2; "ckpt" wraps
each block in torch.utils.checkpoint.  Variants: tc = thunder.jit(m, executors=["torchcompile"]);
tc+memfuse = the same with transforms=[memfuse].  One process per (depth, config, variant), so each first
call starts from a cold process.  The first call depends on Inductor's on-disk cache, so each row names
its state: "cold" runs with an empty cache directory of its own (a new model, a new machine); "warm" runs
the same process twice on one directory and reports the second (the next run of the same script).  The
"fx cache" column is Inductor's FX graph cache's hits/misses/bypasses in the reported process.

Per row: the bound symbols of the forward and backward traces memfuse planned (for tc: Thunder's final
traces), memfuse's time by stage from report()'s time_ms (reading, planning, regrouping, the fusion pass;
"own" is their sum over both traces), the first call, and the measured peak of the second step.  At the
end, for each config and quantity, the log-log slope against the depth, to which the traces' bound symbols
are proportional (1.0: linear; Thunder + torchcompile's final traces hold a few large regions, so their
bound symbols say nothing of the work).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import own_process  # noqa: E402
MIB = float(1 << 20)


def one(layers, ckpt, variant):
    import thunder

    import thunder_memfuse as tm
    import workloads
    from thunder_memfuse.measure import cpu_peak_bytes

    warnings.simplefilter("ignore")
    w = workloads.llama(batch=2, seq=64, dim=64, layers=layers, heads=4, checkpoint=ckpt)
    kw = {"executors": ["torchcompile"]}
    if variant == "tc+memfuse":
        kw["transforms"] = [tm.memfuse]
    jm = thunder.jit(w.fn, **kw)
    t0 = time.perf_counter()
    w.step(jm)()
    first = time.perf_counter() - t0
    w.reset()
    peak, _ = cpu_peak_bytes(w.step(jm))
    out = {"first_s": first, "peak_mib": peak / MIB,
           "fw_bsyms": len(thunder.last_traces(jm)[-1].bound_symbols),
           "bw_bsyms": len(thunder.last_backward_traces(jm)[-1].bound_symbols)}
    if variant == "tc+memfuse":
        r = tm.report(jm)
        stages = {}
        for kind in ("forward", "backward"):
            for k, v in r[kind]["time_ms"].items():
                stages[k] = stages.get(k, 0.0) + v
        out["stages_ms"] = stages
        out["own_ms"] = sum(stages.values())
    from torch._dynamo.utils import counters

    c = counters["inductor"]
    out["fx_cache"] = f"{c['fxgraph_cache_hit']}/{c['fxgraph_cache_miss']}/{c['fxgraph_cache_bypass']}"
    return out


def _row(layers, cfg, variant, cache, timeout, label):
    """One row's result in a process of its own, on an Inductor cache directory of its own: empty
    (cold), or filled by one run of the same process before (warm).  None, said, on failure."""
    args = ["--one", layers, cfg, variant]
    with tempfile.TemporaryDirectory(prefix="memfuse_depth_") as d:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=d)
        if cache == "warm":
            own_process.run(__file__, args, env=env, timeout=timeout)
        r, why = own_process.run(__file__, args, env=env, timeout=timeout)
    if r is None:
        print(f"{label}: failed: {why}", flush=True)
    return r


def _slope(xs, ys):
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="2,4,8,16,32,64")
    ap.add_argument("--configs", default="plain,ckpt")
    ap.add_argument("--variants", default="tc,tc+memfuse")
    ap.add_argument("--cache", default="cold,warm", help="Inductor's on-disk cache: cold, warm or both")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per process")
    ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        own_process.emit(one(int(a.one[0]), a.one[1] == "ckpt", a.one[2]))
        return 0
    results = {}
    print("layers config variant cache: fw/bw bound symbols | memfuse's time by stage (ms) | fx cache "
          "hit/miss/bypass | first call s | peak MiB")
    for cfg in a.configs.split(","):
        for layers in map(int, a.layers.split(",")):
            for variant in a.variants.split(","):
                for cache in a.cache.split(","):
                    label = f"{layers:3d} {cfg:5s} {variant:10s} {cache:4s}"
                    r = _row(layers, cfg, variant, cache, a.timeout, label)
                    if r is None:
                        continue
                    results[(cfg, layers, variant, cache)] = r
                    st = r.get("stages_ms")
                    stages = " ".join(f"{k} {v:.0f}" for k, v in st.items()) + f" own {r['own_ms']:.0f}" if st else "-"
                    print(f"{label}: {r['fw_bsyms']}/{r['bw_bsyms']} | {stages} | {r['fx_cache']} | "
                          f"{r['first_s']:.1f} | {r['peak_mib']:.2f}", flush=True)
    print("\nlog-log slopes against the depth:")
    for cfg in a.configs.split(","):
        for variant in a.variants.split(","):
            for cache in a.cache.split(","):
                pts = sorted((k[1], v) for k, v in results.items() if k[0] == cfg and k[2] == variant and k[3] == cache)
                if len(pts) < 2:
                    continue
                xs = [layers for layers, _ in pts]
                series = {"first call": [v["first_s"] for _, v in pts]}
                if variant == "tc+memfuse":
                    series["own"] = [v["own_ms"] for _, v in pts]
                    for k in pts[-1][1]["stages_ms"]:
                        series[k] = [v["stages_ms"].get(k) for _, v in pts]
                parts = []
                for k, ys in series.items():
                    sl = _slope(xs, ys)
                    if sl is not None:
                        parts.append(f"{k} {sl:.2f}")
                print(f"  {cfg:5s} {variant:10s} {cache:4s}: " + ", ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
