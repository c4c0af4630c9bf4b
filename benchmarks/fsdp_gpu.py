"""memfuse under Thunder's FSDP on the lent GPU (benchmarks/gpu_check.sh stage `fsdp`).

Thunder 0.2.6's FSDP needs CUDA (NCCL), so it can only be checked where a GPU is lent.  World size 1
(one process, NCCL on 127.0.0.1): the all_gathers and reduce_scatters are real collectives on a
group of one, so the traces carry them and memfuse places them (csrc/core/mf_comm.c NOTE
[collective overlap]).  Per sharding strategy, a small MLP (BLOCKS x Linear + GELU) trained one
step with thunder.distributed.fsdp(thunder.jit(model)) with and without memfuse:
  - gradients compared (max abs difference; memfuse's regions run generated kernels, so equality
    is up to float rounding),
  - torch.cuda.max_memory_allocated over the step (second step, after compilation), above what
    was allocated before it,
  - report()'s collectives: per collective its position in Thunder's order and in memfuse's.

    python benchmarks/fsdp_gpu.py --out out/gpu/fsdp_gpu.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import time

import torch


def _mlp(width, blocks):
    layers = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers)


def _run(strategy, use_memfuse, args):
    import thunder
    import thunder.distributed as td
    from thunder_memfuse import memfuse

    torch.manual_seed(0)
    model = _mlp(args.width, args.blocks).cuda()
    jm = td.fsdp(thunder.jit(model, transforms=[memfuse] if use_memfuse else []),
                 device=torch.device("cuda", 0), sharding_strategy=strategy)
    gen = torch.Generator(device="cuda").manual_seed(1)
    xs = [torch.randn(args.batch, args.width, device="cuda", generator=gen) for _ in range(2)]
    jm(xs[0]).square().mean().backward()  # compiles
    for p in jm.parameters():
        p.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    jm(xs[1]).square().mean().backward()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    peak = torch.cuda.max_memory_allocated() - before
    grads = [p.grad.detach().clone() if p.grad is not None else None for p in jm.parameters()]
    out = {"peak_mib": peak / 2**20, "step_ms": ms}
    if use_memfuse:
        import thunder_memfuse as tm

        rep = tm.report(jm)
        out["report"] = {k: {"peak_before_mib": r["peak_before_bytes"] / 2**20,
                             "peak_after_mib": r["peak_after_bytes"] / 2**20,
                             "regions_after": r["regions_after"], "comm_moves": r["comm_moves"],
                             "collectives": r["collectives"]} for k, r in rep.items()}
    return out, grads


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--strategies", default="ZERO2,ZERO3")
    args = ap.parse_args()
    if not torch.cuda.is_available() or not torch.distributed.is_nccl_available():
        print("fsdp_gpu: needs CUDA and NCCL (Thunder 0.2.6's FSDP is CUDA-only); nothing to do here", file=sys.stderr)
        return 5
    import torch.distributed as dist
    import thunder.distributed as td

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK="0", RANK="0", WORLD_SIZE="1")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, timeout=datetime.timedelta(seconds=120))
    results, ok = [], True
    try:
        for name in args.strategies.split(","):
            strategy = getattr(td.FSDPType, name)
            row = {"strategy": name}
            try:
                plain, g_plain = _run(strategy, False, args)
                mf, g_mf = _run(strategy, True, args)
                diffs = [float((a - b).abs().max()) for a, b in zip(g_mf, g_plain) if a is not None and b is not None]
                same_shape = len(g_mf) == len(g_plain) and all(
                    (a is None) == (b is None) for a, b in zip(g_mf, g_plain))
                row.update(thunder=plain, memfuse=mf, max_abs_grad_diff=max(diffs) if diffs else None,
                           grads_close=same_shape and all(
                               torch.allclose(a, b, rtol=1e-3, atol=1e-4) for a, b in zip(g_mf, g_plain)
                               if a is not None))
                ok &= bool(row["grads_close"])
            except Exception as e:  # recorded, the next strategy still runs
                row["error"] = f"{type(e).__name__}: {e}"
                ok = False
            results.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "memfuse"}, default=str))
            if "memfuse" in row:
                for kind, r in row["memfuse"]["report"].items():
                    print(f"  {kind}: planned peak {r['peak_before_mib']:.2f} -> {r['peak_after_mib']:.2f} MiB, "
                          f"{r['comm_moves']} comm moves")
                    for c in r["collectives"]:
                        print(f"    {c['name']}: op {c['before']} -> {c['after']}, wait {c['wait_before']} -> "
                              f"{c['wait_after']}")
    finally:
        dist.destroy_process_group()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "args": vars(args),
              "results": results}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1, default=str)
    print("\n%-6s %14s %14s %12s %12s %12s" % ("fsdp", "thunder MiB", "memfuse MiB", "thunder ms", "memfuse ms",
                                             "grad diff"))
    for r in results:
        if "error" in r:
            print("%-6s error: %s" % (r["strategy"], r["error"][:100]))
            continue
        print("%-6s %14.2f %14.2f %12.2f %12.2f %12.2e" % (
            r["strategy"], r["thunder"]["peak_mib"], r["memfuse"]["peak_mib"], r["thunder"]["step_ms"],
            r["memfuse"]["step_ms"], r["max_abs_grad_diff"] or 0.0))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
