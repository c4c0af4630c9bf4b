"""One benchmark of the real peers, in one process, on CPU.

    python benchmarks/models.py [--quick] [--batch 4] [--seq 128] [--dim 256] [--layers 4]
                                [--rounds 5] [--only llama] [--variants eager,memfuse] [--no-compare]
                                [--json out.json]

Variants: eager, torch.compile, Thunder (default executors), Thunder with
executors=["torchcompile"], memfuse, torchcompile + memfuse (and the same with
MemFuse(recompute=False): "torchcompile+memfuse(recompute=False)"), and memfuse with
each `kernels=` value MemFuse accepts (when it has that option).
Workloads (benchmarks/workloads.py): the seed's two functions; nanoGPT
(thunder.tests.nanogpt_model) and a Llama-style model (RMSNorm, rotary
embedding, SwiGLU), each a training step, plain and with per-block activation
checkpointing; a GPT-2-style model (nanoGPT's blocks with Hugging Face GPT-2's
explicit tanh GELU), a plain training step.

Figures per workload and variant: first call (compile + one step) in s, with a
fresh Inductor cache unless --warm-cache; the
measured peak of one step (torch.profiler allocations, above what is live at
the call: thunder_memfuse.measure.cpu_peak_bytes); the median step time over
--rounds rounds in which the variants alternate; whether loss and gradients
(or the result) match eager.  For the Thunder variants, compare() lines up the
cost model and the measurement step by step (peak above each trace's start,
simulated / measured).  Asserts nothing.

Everything is importable for a notebook:
    sys.path.insert(0, "benchmarks"); import models, workloads
    rows = models.run(workloads.all_workloads(quick=True), models.variants())
"""
from __future__ import annotations

import argparse
import gc
import inspect
import json
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

MIB = float(1 << 20)

# Values tried for MemFuse(kernels=...) when the transform does not list them itself.
_KERNEL_CANDIDATES = ("auto", "torchcompile", "nvrtc", "nvfuser", "fallback")


def memfuse_kernel_values():
    """The kernels= values MemFuse accepts here ([] when it has no such option)."""
    from thunder_memfuse import MemFuse

    try:
        if "kernels" not in inspect.signature(MemFuse.__init__).parameters:
            return []
    except (TypeError, ValueError):
        return []
    import thunder_memfuse.integration.transform as T

    listed = getattr(T, "KERNELS", None) or getattr(T, "_KERNELS", None)
    out = []
    for k in listed or _KERNEL_CANDIDATES:
        try:
            MemFuse(kernels=k)
        except (TypeError, ValueError):
            continue
        out.append(k)
    return out


def variants(names=None):
    """[(name, make(fn) -> compiled)] for the peers; names: a subset to keep."""
    import thunder
    import torch
    from thunder_memfuse import MemFuse

    vs = [
        ("eager", lambda fn: fn),
        ("torch.compile", lambda fn: torch.compile(fn)),
        ("thunder", lambda fn: thunder.jit(fn)),
        ("thunder+torchcompile", lambda fn: thunder.jit(fn, executors=["torchcompile"])),
        ("memfuse", lambda fn: thunder.jit(fn, transforms=[MemFuse()])),
        # memfuse as the fusion pass in torch.compile's place (the default with that executor)
        ("torchcompile+memfuse", lambda fn: thunder.jit(fn, executors=["torchcompile"], transforms=[MemFuse()])),
        # the same without recomputation: what the copies cost in step time and give in memory
        ("torchcompile+memfuse(recompute=False)",
         lambda fn: thunder.jit(fn, executors=["torchcompile"], transforms=[MemFuse(recompute=False)])),
    ]
    for k in memfuse_kernel_values():
        vs.append((f"memfuse kernels={k}", lambda fn, k=k: thunder.jit(fn, transforms=[MemFuse(kernels=k)])))
    if names:
        vs = [v for v in vs if v[0] in names]
    return vs


def _close(got, want):
    import torch

    if len(got) != len(want):
        return False
    return all(torch.allclose(g.float(), w.float(), rtol=1e-3, atol=1e-4) for g, w in zip(got, want))


def _compare_figures(compiled, w):
    """compare()'s per-trace peaks above the start, simulated / measured (MiB)."""
    from thunder_memfuse.measure import compare

    w.reset()
    if w.training:
        import torch.nn.functional as F

        targets = _targets(w)

        def loss_fn(out):
            logits = out[0] if isinstance(out, tuple) else out
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

        c = compare(compiled, *w.inputs, loss_fn=loss_fn)
    else:
        c = compare(compiled, *w.inputs)
    w.reset()
    out = {}
    for kind, t in c.traces.items():
        out[kind] = dict(simulated_mib=t.simulated_peak / MIB, measured_mib=t.measured_peak / MIB,
                         largest_tensor_mib=t.largest_tensor / MIB, within_one_tensor=t.within_one_tensor,
                         flagged_steps=len(t.flagged), start_simulated_mib=t.start_simulated / MIB,
                         saved_simulated_mib=None if t.saved_simulated is None else t.saved_simulated / MIB,
                         saved_storages_measured_mib=(None if t.saved_storages_measured is None
                                                      else t.saved_storages_measured / MIB))
    return out


def _targets(w):
    import torch

    return torch.roll(w.inputs[0], -1, dims=1)


def run(workloads, vs, rounds=5, do_compare=True, log=print):
    """Run every variant on every workload; returns a list of row dicts."""
    from thunder_memfuse.measure import cpu_peak_bytes

    rows = []
    for w in workloads:
        log(f"# {w.name}")
        compiled, res = {}, {}
        expected = None
        for name, make in vs:
            r = dict(workload=w.name, variant=name)
            rows.append(r)
            res[name] = r
            try:
                t = time.perf_counter()
                c = make(w.fn)
                w.reset()
                w.step(c)()
                r["first_call_s"] = time.perf_counter() - t
                got = w.result(c)
                if name == "eager":
                    expected = got
                r["matches_eager"] = None if expected is None else _close(got, expected)
                w.reset()
                gc.collect()
                peak, _ = cpu_peak_bytes(w.step(c))
                w.reset()
                r["peak_mib"] = peak / MIB
                compiled[name] = c
            except Exception as e:  # one failing peer does not stop the benchmark
                r["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:160]
                log(f"  {name}: failed: {r['error']}")
                if "--debug" in sys.argv:
                    traceback.print_exc()
        times = {n: [] for n in compiled}
        for _ in range(rounds):  # variants alternate, so drifts hit them alike
            for n, c in compiled.items():
                w.reset()
                step = w.step(c)
                t = time.perf_counter()
                step()
                times[n].append(time.perf_counter() - t)
        w.reset()
        for n, ts in times.items():
            if ts:
                res[n]["step_ms"] = statistics.median(ts) * 1e3
        if do_compare:
            for n, c in compiled.items():
                if n in ("eager", "torch.compile"):
                    continue
                try:
                    res[n]["compare"] = _compare_figures(c, w)
                except Exception as e:
                    res[n]["compare_error"] = f"{type(e).__name__}: {e}".splitlines()[0][:160]
        for n in res:
            log("  " + _line(res[n]))
        del compiled
        gc.collect()
    return rows


def _line(r):
    if "error" in r:
        return f"{r['variant']}: failed ({r['error']})"
    s = (f"{r['variant']}: peak {r['peak_mib']:.2f} MiB, step {r.get('step_ms', float('nan')):.1f} ms, "
         f"first call {r['first_call_s']:.1f} s, {'matches eager' if r['matches_eager'] is not False else 'DIFFERS'}")
    for kind, c in (r.get("compare") or {}).items():
        s += f"; {kind} sim/meas {c['simulated_mib']:.2f}/{c['measured_mib']:.2f}"
    return s


def table(rows) -> str:
    out = ["| workload | variant | peak MiB | step ms (median) | first call s | matches eager | "
           "model / measured peak above start, MiB: forward; backward | saved storages: modelled / measured MiB |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['workload']} | {r['variant']} | failed: {r['error'][:60]} | | | | | |")
            continue
        cmp = r.get("compare") or {}
        parts = []
        for kind in ("forward", "backward"):
            if kind in cmp:
                c = cmp[kind]
                parts.append(f"{c['simulated_mib']:.2f} / {c['measured_mib']:.2f}"
                             + ("" if c["within_one_tensor"] else " (!)"))
        bw = cmp.get("backward")
        start = "-" if not bw or bw["saved_storages_measured_mib"] is None or bw["saved_simulated_mib"] is None else (
            f"{bw['saved_simulated_mib']:.2f} / {bw['saved_storages_measured_mib']:.2f}")
        me = r["matches_eager"]
        out.append(f"| {r['workload']} | {r['variant']} | {r['peak_mib']:.2f} | {r.get('step_ms', float('nan')):.1f} | "
                   f"{r['first_call_s']:.1f} | {'-' if me is None else ('yes' if me else 'NO')} | "
                   f"{'; '.join(parts) or '-'} | {start} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (batch 2 x 64, dim 128, 2 layers, seed 128)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--paths", type=int, default=10, help="seed: parallel paths")
    ap.add_argument("--size", type=int, default=256, help="seed: matrix size")
    ap.add_argument("--rounds", type=int, default=5, help="timed steps per variant (alternating)")
    ap.add_argument("--only", help="comma-separated substrings of workload names to run")
    ap.add_argument("--variants", help="comma-separated variant names to run")
    ap.add_argument("--no-compare", action="store_true", help="skip the per-step model check")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's own choice)")
    ap.add_argument("--debug", action="store_true", help="print tracebacks of failing variants")
    ap.add_argument("--warm-cache", action="store_true",
                    help="keep Inductor's on-disk cache (default: a fresh one, so every first call compiles cold)")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    if not args.warm_cache:
        # First calls are compared cold: Inductor's on-disk caches (FX graphs, kernels) from earlier
        # runs would otherwise favour whichever variant's programs were compiled before.
        import os
        import tempfile

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="memfuse_bench_inductor_")
    import torch

    import workloads

    if args.threads:
        torch.set_num_threads(args.threads)

    ws = workloads.all_workloads(quick=args.quick, batch=args.batch, seq=args.seq, dim=args.dim,
                                 layers=args.layers, paths=args.paths, size=args.size,
                                 only=args.only.split(",") if args.only else None)
    vs = variants(args.variants.split(",") if args.variants else None)
    print(f"CPU, torch {torch.__version__}, {torch.get_num_threads()} threads; variants: "
          f"{', '.join(n for n, _ in vs)}")
    rows = run(ws, vs, rounds=args.rounds, do_compare=not args.no_compare)
    print()
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
