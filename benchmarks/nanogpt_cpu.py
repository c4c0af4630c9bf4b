"""memfuse on a real model: a nanoGPT training step (Thunder's own test model) on CPU.

    python benchmarks/nanogpt_cpu.py [--layers 4] [--embd 256] [--seq 128] [--batch 4] [--checkpoint]

For Thunder without memfuse, memfuse (fuse="auto": on CPU, reorder only) and
memfuse with fuse=True (regions on the CPU fallback), prints the measured peak
of real CPU allocations over one forward+backward step (torch.profiler), the same
for the forward alone and for the backward alone (above what is live when it
starts: the saved tensors), and
for memfuse the planner's view of each trace: peak before/after, regions,
proven optimal or not, and the time the pass took.  With --checkpoint every
transformer block runs under torch.utils.checkpoint (activation checkpointing:
the backward recomputes each block).  Asserts nothing.
"""
from __future__ import annotations

import argparse
import functools
import time
import warnings

MIB = float(1 << 20)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--checkpoint", action="store_true", help="activation checkpointing per block")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")

    import torch
    import thunder
    from thunder.tests import nanogpt_model

    import thunder_memfuse as tm
    from thunder_memfuse.measure import cpu_peak_bytes

    torch.manual_seed(0)
    cfg = nanogpt_model.GPTConfig(n_layer=args.layers, n_head=args.heads, n_embd=args.embd,
                                  block_size=args.seq, vocab_size=args.vocab, dropout=0.0)
    model = nanogpt_model.GPT(cfg)
    if args.checkpoint:
        from torch.utils.checkpoint import checkpoint

        for block in model.transformer.h:
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    x = torch.randint(0, args.vocab, (args.batch, args.seq))

    def split_peaks(jm):
        """(forward peak, backward peak above what is live when it starts).  The forward
        is profiled too, so the profiler knows the saved tensors the backward frees."""
        box = {}
        fwd, _ = cpu_peak_bytes(lambda: box.setdefault("loss", jm(x)[0].float().sum()))
        bwd, _ = cpu_peak_bytes(box["loss"].backward)
        return fwd, bwd

    def step(jm):
        def run():
            logits, _ = jm(x)
            logits.float().sum().backward()
            return logits

        return run

    print(f"nanoGPT {args.layers} layers, n_embd {args.embd}, batch {args.batch} x {args.seq} tokens, "
          f"{'activation checkpointing per block, ' if args.checkpoint else ''}CPU")
    print("| variant | compile + first step s | measured step peak MiB | forward / backward MiB | trace | "
          "planned peak MiB (before -> after) | regions | proven | pass ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, transforms in (("thunder", []), ("memfuse (auto)", [tm.MemFuse()]),
                             ("memfuse (fuse=True)", [tm.MemFuse(fuse=True)])):
        jm = thunder.jit(model, transforms=transforms)
        t = time.perf_counter()
        step(jm)()
        compile_s = time.perf_counter() - t
        model.zero_grad(set_to_none=True)
        peak, _ = cpu_peak_bytes(step(jm))
        model.zero_grad(set_to_none=True)
        fwd, bwd = split_peaks(jm)
        model.zero_grad(set_to_none=True)
        split = f"{fwd / MIB:.2f} / {bwd / MIB:.2f}"
        if not transforms:
            print(f"| {name} | {compile_s:.1f} | {peak / MIB:.1f} | {split} | - | - | - | - | - |")
            continue
        for kind, r in tm.report(jm).items():
            print(f"| {name} | {compile_s:.1f} | {peak / MIB:.1f} | {split} | {kind} ({r['ops']} ops) | "
                  f"{r['peak_before_bytes'] / MIB:.2f} -> {r['peak_after_bytes'] / MIB:.2f} | "
                  f"{r['regions_after']} | {'yes' if r['optimal'] else 'no'} ({r['method']}) | {r['plan_ms']:.0f} |")


if __name__ == "__main__":
    main()
