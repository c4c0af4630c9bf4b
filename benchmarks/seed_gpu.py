"""The seed case (benchmarks/seed.py, Thunder issue #1337) on a GPU: peak memory and time per call.

    python benchmarks/seed_gpu.py [--out report.json] [--paths 10] [--size 256] [--iters 20]

For memory_peak_efficient_func and memory_peak_inefficient_func, under eager PyTorch, Thunder's
default fusion, Thunder with fusion_type="dataflow", torch.compile and memfuse
(thunder.jit(fn, transforms=[thunder_memfuse.MemFuse(kernels="nvrtc")])):
  peak  = torch.cuda.max_memory_allocated() around one call, measured exactly as the issue does
          (warm-up call, gc.collect(0), empty_cache, reset_peak_memory_stats, before, call, after);
  time  = median milliseconds per call over --iters calls, from CUDA events;
  ok    = the result matches eager's for the same function.
Each configuration's failure is recorded (error + traceback tail) and the run goes on.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import traceback

MIB = 1024 * 1024


# the seed functions themselves live in one place: benchmarks/seed.py (the seed job), beside this file
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from seed import memory_peak_efficient_func, memory_peak_inefficient_func  # noqa: E402

FUNCS = {"efficient": memory_peak_efficient_func, "inefficient": memory_peak_inefficient_func}


def make_configs():
    """name -> function(fn) -> callable; built lazily so that one import failure is one error."""

    def eager(fn):
        return fn

    def thunder_default(fn):
        import thunder

        return thunder.jit(fn)

    def thunder_dataflow(fn):
        import thunder

        return thunder.jit(fn, fusion_type="dataflow")

    def torch_compile(fn):
        import torch

        return torch.compile(fn)

    def memfuse(fn):
        import thunder

        import thunder_memfuse

        try:
            MemFuse = thunder_memfuse.MemFuse
        except AttributeError as e:
            raise RuntimeError("thunder_memfuse.MemFuse is not available in this build") from e
        return thunder.jit(fn, transforms=[MemFuse(kernels="nvrtc")])

    # memfuse right after eager: if a stage limit cuts the run (torch.compile's first compile
    # on a fresh machine is the slow one), the configuration under test has been measured
    return {
        "eager": eager,
        "memfuse": memfuse,
        "thunder": thunder_default,
        "thunder_dataflow": thunder_dataflow,
        "torch_compile": torch_compile,
    }


def measure_peak(f, t0s, a):
    """Exactly the issue's measurement (the warm-up call is made by the caller)."""
    import torch

    gc.collect(0)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.max_memory_allocated()
    out = f(t0s, a)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    return peak, out


def measure_time(f, t0s, a, iters):
    import torch

    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        f(t0s, a)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), min(times)


def run(args) -> dict:
    import torch

    report = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "paths": args.paths,
        "size": args.size,
        "iters": args.iters,
        "results": [],
    }
    for mod in ("thunder", "thunder_memfuse"):
        try:
            m = __import__(mod)
            report[mod] = getattr(m, "__version__", "?")
        except Exception as e:  # recorded, the run goes on
            report[mod] = f"import failed: {e!r}"
    if not torch.cuda.is_available():
        report["error"] = "CUDA not available"
        return report
    try:
        import thunder_memfuse

        report["cuda_status"] = thunder_memfuse.cuda_status()
    except Exception as e:
        report["cuda_status"] = {"error": repr(e)}

    torch.manual_seed(0)
    t0s = [torch.randn(args.size, args.size, device="cuda") for _ in range(args.paths)]
    a = torch.randn(args.size, args.size, device="cuda")
    reference = {name: fn(t0s, a) for name, fn in FUNCS.items()}
    torch.cuda.synchronize()

    configs = make_configs()
    only = set(args.only.split(",")) if args.only else None
    for cname, build in configs.items():
        if only and cname not in only:
            continue
        for fname, fn in FUNCS.items():
            row = {"config": cname, "function": fname}
            t_start = time.perf_counter()
            try:
                f = build(fn)
                t_build = time.perf_counter()
                out = f(t0s, a)  # warm-up (compiles)
                torch.cuda.synchronize()
                row["first_call_s"] = round(time.perf_counter() - t_build, 3)
                peak, out = measure_peak(f, t0s, a)
                row["peak_bytes"] = int(peak)
                row["peak_mib"] = round(peak / MIB, 4)
                ref = reference[fname]
                row["ok"] = bool(torch.allclose(out, ref, rtol=1e-3, atol=1e-3 * float(ref.abs().max())))
                if not row["ok"]:
                    row["max_abs_diff"] = float((out - ref).abs().max())
                med, best = measure_time(f, t0s, a, args.iters)
                row["ms_median"] = round(med, 4)
                row["ms_min"] = round(best, 4)
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"[:2000]
                row["traceback"] = traceback.format_exc()[-4000:]
            row["wall_s"] = round(time.perf_counter() - t_start, 3)
            report["results"].append(row)
            save(args.out, report)  # after every row: a cut-off run keeps what it measured
            print(json.dumps({k: v for k, v in row.items() if k != "traceback"}), flush=True)
            gc.collect()
            torch.cuda.empty_cache()
    return report


def save(path, report):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1, default=str)
    os.replace(tmp, path)


def table(report) -> str:
    lines = [f"seed case on {report.get('device')}: {report.get('paths')} paths of "
             f"{report.get('size')}x{report.get('size')} fp32 (torch {report.get('torch')})",
             f"{'config':18s} {'function':12s} {'peak MiB':>9s} {'ms/call':>9s} {'ok':>4s}  note"]
    for r in report.get("results", []):
        peak = f"{r['peak_mib']:.2f}" if "peak_mib" in r else "-"
        ms = f"{r['ms_median']:.3f}" if "ms_median" in r else "-"
        ok = {True: "yes", False: "NO"}.get(r.get("ok"), "-")
        note = r.get("error", "")[:60]
        lines.append(f"{r['config']:18s} {r['function']:12s} {peak:>9s} {ms:>9s} {ok:>4s}  {note}")
    if report.get("error"):
        lines.append("error: " + report["error"])
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "seed_gpu.json"))
    ap.add_argument("--paths", type=int, default=10)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--only", default="", help="comma-separated configs (default: all)")
    args = ap.parse_args(argv)
    try:
        report = run(args)
    except Exception as e:
        report = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
    save(args.out, report)
    print(table(report))
    print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
