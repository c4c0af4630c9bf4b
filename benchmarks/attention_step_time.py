"""Step time of torchcompile + memfuse with and without its CPU attention executor, beside Thunder +
torchcompile (CPU): does keeping attention whole cost time at the size the project was tuned on?

    python benchmarks/attention_step_time.py [--model llama|nanogpt|gpt2] [--ckpt] [--rounds 8]

One process, the three variants compiled first, then timed in alternating order over the rounds (4 layers
x 256 wide, batch 4 x 128 tokens); prints the median and min step in ms.  "without attention" keeps
thunder_memfuse.attention's executor out of the compilation (attention.add_to made a no-op).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama", choices=("llama", "nanogpt", "gpt2"))
    ap.add_argument("--ckpt", action="store_true")
    ap.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    import thunder

    import thunder_memfuse as tm
    import thunder_memfuse.integration.attention as att
    import workloads

    add_to = att.add_to
    variants = {}
    for v in ("thunder + torchcompile", "torchcompile + memfuse", "torchcompile + memfuse without attention"):
        w = getattr(workloads, a.model)(batch=4, seq=128, dim=256, layers=4, heads=4, checkpoint=a.ckpt)
        att.add_to = (lambda cd: None) if v.endswith("without attention") else add_to
        kw = {"executors": ["torchcompile"]}
        if "memfuse" in v:
            kw["transforms"] = [tm.MemFuse()]
        step = w.step(thunder.jit(w.fn, **kw))
        for _ in range(2):  # compile, then one warm step
            step()
            w.reset()
        variants[v] = (w, step)
    att.add_to = add_to
    times = {v: [] for v in variants}
    for r in range(a.rounds):
        order = list(variants.items())
        for v, (w, step) in (order if r % 2 == 0 else reversed(order)):
            t0 = time.perf_counter()
            step()
            times[v].append(1e3 * (time.perf_counter() - t0))
            w.reset()
    print(f"{a.model}{' checkpointed' if a.ckpt else ''}, 4 x 256, batch 4 x 128, {a.rounds} rounds")
    for v, ts in times.items():
        print(f"  {v:42s} median {statistics.median(ts):7.1f} ms  min {min(ts):7.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
