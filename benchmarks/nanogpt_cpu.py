"""memfuse on a real model: a nanoGPT training step (Thunder's own test model) on CPU.

    python benchmarks/nanogpt_cpu.py [--layers 4] [--embd 256] [--seq 128] [--batch 4] [--checkpoint]
                                     [--variants thunder "memfuse (auto)" ...]

For Thunder without memfuse, memfuse (fuse="auto": on CPU, reorder only) and
memfuse with fuse=True (regions on the CPU fallback), and on request the other
peers (eager, torch.compile, Thunder + torchcompile), prints the measured peak
of real CPU allocations over one forward+backward step (torch.profiler), the same
for the forward alone and for the backward alone (above what is live when it
starts: the saved tensors), and
for memfuse the planner's view of each trace: peak before/after, regions,
proven optimal or not, and the time the pass took.  With --checkpoint every
transformer block runs under torch.utils.checkpoint (activation checkpointing:
the backward recomputes each block).  Asserts nothing.

The functions (make_model, make_batch, PEERS, measure_variant) are what
notebooks/02_transformer_training.ipynb runs too.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time
import warnings

MIB = float(1 << 20)


def make_model(layers=4, embd=256, heads=4, seq=128, vocab=1024, checkpoint=False, seed=0):
    """nanoGPT (thunder.tests.nanogpt_model) without dropout; with checkpoint, every
    block runs under torch.utils.checkpoint (use_reentrant=False)."""
    import torch
    from thunder.tests import nanogpt_model

    torch.manual_seed(seed)
    cfg = nanogpt_model.GPTConfig(n_layer=layers, n_head=heads, n_embd=embd, block_size=seq, vocab_size=vocab,
                                  dropout=0.0)
    model = nanogpt_model.GPT(cfg)
    if checkpoint:
        from torch.utils.checkpoint import checkpoint as ckpt

        for block in model.transformer.h:
            block.forward = functools.partial(ckpt, block.forward, use_reentrant=False)
    return model


def make_batch(batch=4, seq=128, vocab=1024, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g)


def _thunder(model, **kw):
    import thunder

    return thunder.jit(model, **kw)


def _thunder_torchcompile(model):
    import thunder
    from thunder.executors.torch_compile import torch_compile_ex

    return thunder.jit(model, executors=[torch_compile_ex, *thunder.get_default_executors()])


def _memfuse(model, **opts):
    import thunder_memfuse as tm

    return _thunder(model, transforms=[tm.MemFuse(**opts)])


def _torchcompile_memfuse(model):
    """memfuse added to Thunder + torchcompile: memfuse's regions, compiled by torch.compile, in
    that executor's place (transform.py NOTE [replacing the fusion pass])."""
    import thunder
    import thunder_memfuse as tm
    from thunder.executors.torch_compile import torch_compile_ex

    return thunder.jit(model, executors=[torch_compile_ex, *thunder.get_default_executors()],
                       transforms=[tm.MemFuse()])


def _torch_compile(model):
    import torch

    return torch.compile(model)


# name -> model -> callable module.  "inductor": compiles C++ with torch.compile's default backend
# (tens of seconds per model on a small CPU).
PEERS = {
    "eager": dict(make=lambda m: m, inductor=False),
    "torch.compile": dict(make=_torch_compile, inductor=True),
    "thunder": dict(make=_thunder, inductor=False),
    "thunder + torchcompile": dict(make=_thunder_torchcompile, inductor=True),
    "memfuse (auto)": dict(make=_memfuse, inductor=False),
    "memfuse (fuse=True)": dict(make=functools.partial(_memfuse, fuse=True), inductor=False),
    "torchcompile + memfuse": dict(make=_torchcompile_memfuse, inductor=True),
}


def step_fn(jm, x):
    def run():
        logits, _ = jm(x)
        logits.float().sum().backward()
        return logits

    return run


def measure_variant(model, jm, x, *, iters=3, timeline=False):
    """Measure one variant on a fresh set of gradients: first step (compile) seconds,
    median step ms over `iters`, the measured step peak and the forward / backward
    split (bytes above what is live when each starts), and with timeline=True the
    measured live bytes over one step (times_ms, bytes)."""
    from thunder_memfuse.measure import cpu_memory_timeline, cpu_peak_bytes

    step = step_fn(jm, x)
    t = time.perf_counter()
    step()
    compile_s = time.perf_counter() - t
    times = []
    for _ in range(iters):
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        step()
        times.append((time.perf_counter() - t) * 1e3)
    model.zero_grad(set_to_none=True)
    peak, _ = cpu_peak_bytes(step)
    model.zero_grad(set_to_none=True)
    box = {}  # the forward is profiled too, so the profiler knows the saved tensors the backward frees
    fwd, _ = cpu_peak_bytes(lambda: box.setdefault("loss", jm(x)[0].float().sum()))
    bwd, _ = cpu_peak_bytes(box["loss"].backward)
    model.zero_grad(set_to_none=True)
    out = dict(compile_s=compile_s, time_ms=statistics.median(times) if times else None, peak_bytes=peak,
               peak_mib=peak / MIB, forward_bytes=fwd, backward_bytes=bwd)
    if timeline:
        ts, live, _ = cpu_memory_timeline(step)
        model.zero_grad(set_to_none=True)
        out["timeline"] = (ts, live)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--checkpoint", action="store_true", help="activation checkpointing per block")
    ap.add_argument("--variants", nargs="*", default=["thunder", "memfuse (auto)", "memfuse (fuse=True)"],
                    choices=list(PEERS), help="which variants to run (default: Thunder and memfuse)")
    ap.add_argument("--plot", metavar="PATH", help="also draw peak and step time per variant to PATH "
                                                    "(thunder_memfuse.plot_comparison; needs matplotlib)")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")

    import thunder_memfuse as tm

    model = make_model(args.layers, args.embd, args.heads, args.seq, args.vocab, args.checkpoint)
    x = make_batch(args.batch, args.seq, args.vocab)

    print(f"nanoGPT {args.layers} layers, n_embd {args.embd}, batch {args.batch} x {args.seq} tokens, "
          f"{'activation checkpointing per block, ' if args.checkpoint else ''}CPU")
    print("| variant | compile + first step s | step ms | measured step peak MiB | forward / backward MiB | "
          "trace | planned peak MiB (before -> after) | regions | proven | pass ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    measured = {}
    for name in args.variants:
        jm = PEERS[name]["make"](model)
        r = measure_variant(model, jm, x)
        measured[name] = r
        head = (f"| {name} | {r['compile_s']:.1f} | {r['time_ms']:.0f} | {r['peak_mib']:.1f} | "
                f"{r['forward_bytes'] / MIB:.2f} / {r['backward_bytes'] / MIB:.2f} |")
        if not name.startswith("memfuse"):
            print(f"{head} - | - | - | - | - |")
            continue
        for kind, rep in tm.report(jm).items():
            print(f"{head} {kind} ({rep['ops']} ops) | "
                  f"{rep['peak_before_bytes'] / MIB:.2f} -> {rep['peak_after_bytes'] / MIB:.2f} | "
                  f"{rep['regions_after']} | {'yes' if rep['optimal'] else 'no'} ({rep['method']}) | "
                  f"{rep['plan_ms']:.0f} |")
    if args.plot:
        tm.plot_comparison(measured, args.plot, measured_by="torch.profiler allocations",
                           title=f"nanoGPT {args.layers} layers, n_embd {args.embd}, "
                                 f"{'checkpointed ' if args.checkpoint else ''}training step, CPU")
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
