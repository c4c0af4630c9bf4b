"""memfuse under Thunder's DDP on CPU: 2 processes over gloo on 127.0.0.1.

    python benchmarks/ddp_cpu.py [--width 1024] [--blocks 6] [--batch 1024] [--steps 5] [--checkpoint]

An MLP of BLOCKS x (Linear + GELU), thunder.distributed.ddp(thunder.jit(model, transforms=...)) for
Thunder alone, memfuse (default: reorder only on CPU, collectives placed for overlap) and memfuse with
comm_overlap=False (collectives where the memory plan puts them).  Per rank: the measured peak of real
CPU allocations over one training step (forward + backward, torch.profiler, above what is live before
it), and the median wall time of --steps steps (after one compiling step; the variants' steps
interleaved, a barrier before each).
Also: gradients equal to Thunder's (bit for bit), and from report() how many all_reduces memfuse issues
earlier than Thunder's trace and by how many ops in total.  Asserts nothing; prints a table.
"""
from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MIB = float(1 << 20)
VARIANTS = ("thunder", "memfuse", "memfuse, no overlap")


def _model(args):
    blocks = [torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.GELU()) for _ in range(args.blocks)]

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(blocks)

        def forward(self, x):
            for b in self.blocks:
                x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False) if args.checkpoint else b(x)
            return x

    return MLP()


def _worker(rank, port, args, q):
    warnings.simplefilter("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if os.path.exists("/sys/class/net/lo"):  # gloo on loopback, whatever the hostname resolves to
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=300))
    import thunder
    import thunder_memfuse as tm
    from thunder_memfuse.measure import cpu_peak_bytes

    gen = torch.Generator().manual_seed(100 + rank)
    xs = [torch.randn(args.batch, args.width, generator=gen) for _ in range(args.steps + 2)]
    models = {}
    for variant in VARIANTS:
        torch.manual_seed(0)
        transforms = [] if variant == "thunder" else [tm.MemFuse(comm_overlap=variant == "memfuse")]
        models[variant] = thunder.distributed.ddp(thunder.jit(_model(args), transforms=transforms))

    def step(jm, x):
        for p in jm.parameters():
            p.grad = None
        jm(x).square().mean().backward()

    rows, times = {}, {v: [] for v in VARIANTS}
    for variant, jm in models.items():
        step(jm, xs[0])  # compiles
        dist.barrier()
        peak, _ = cpu_peak_bytes(step, jm, xs[1])
        rows[variant] = {"peak_mib": peak / MIB}
    # timed steps, the variants interleaved so that a load change on the machine hits all alike
    for x in xs[2:]:
        for variant, jm in models.items():
            dist.barrier()
            t0 = time.perf_counter()
            step(jm, x)
            times[variant].append((time.perf_counter() - t0) * 1e3)
    ref_grads = [p.grad for p in models["thunder"].parameters()]
    for variant, jm in models.items():
        row = rows[variant]
        row["step_ms"] = statistics.median(times[variant])
        if variant != "thunder":
            row["grads_equal"] = all(torch.equal(p.grad, r) for p, r in zip(jm.parameters(), ref_grads))
            colls = tm.report(jm)["backward"]["collectives"]
            row["earlier"] = sum(c["after"] < c["before"] for c in colls)
            row["later"] = sum(c["after"] > c["before"] for c in colls)
            row["ops_earlier"] = sum(c["before"] - c["after"] for c in colls)
            row["n_collectives"] = len(colls)
    dist.barrier()
    dist.destroy_process_group()
    q.put((rank, rows))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--checkpoint", action="store_true", help="activation checkpointing per block")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    smp = mp.get_context("spawn")
    q = smp.SimpleQueue()
    ctx = mp.start_processes(_worker, args=(port, args, q), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + args.timeout
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            print(f"ddp_cpu: timed out after {args.timeout} s", file=sys.stderr)
            return 2
    results = dict(q.get() for _ in range(2))
    print(f"DDP over gloo, 2 processes, MLP {args.blocks} x Linear({args.width}, {args.width}) + GELU, batch "
          f"{args.batch} per rank{', checkpointed blocks' if args.checkpoint else ''}, {args.threads} thread(s) per rank")
    print("%-20s %4s %10s %10s %8s %22s" % ("variant", "rank", "peak MiB", "step ms", "grads=", "all_reduce earlier"))
    for variant in VARIANTS:
        for rank in (0, 1):
            r = results[rank][variant]
            eq = "-" if "grads_equal" not in r else ("yes" if r["grads_equal"] else "NO")
            ear = "-" if "earlier" not in r else (f"{r['earlier']}/{r['n_collectives']} "
                                                  f"(later {r['later']}, -{r['ops_earlier']} ops)")
            print("%-20s %4d %10.2f %10.1f %8s %22s" % (variant, rank, r["peak_mib"], r["step_ms"], eq, ear))
    return 0


if __name__ == "__main__":
    sys.exit(main())
