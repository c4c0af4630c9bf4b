"""memfuse under Thunder's DDP: 2 processes over gloo on 127.0.0.1 (CPU).

One spawn runs every case (importing Thunder twice costs most of the time):
a small MLP, plain and with per-block activation checkpointing, jitted with
and without memfuse, wrapped by thunder.distributed.ddp; and gradient
accumulation with no_sync.  Each worker asserts, and a failure in either
process fails the test:
  - gradients equal plain Thunder DDP's (bit for bit: memfuse only reorders);
  - the collectives of the memfuse backward come in the same order on every
    rank, and in Thunder's order;
  - no all_reduce is issued later (counted in ops) than in Thunder's trace,
    and report() shows each one's position before and after.
The whole run is bounded in time; the processes are killed past it.
"""
from __future__ import annotations

import datetime
import os
import socket
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

WORLD = 2
TIMEOUT_S = 300
WIDTH, BATCH, BLOCKS = 64, 256, 4

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MLP(torch.nn.Module):
    """BLOCKS x (Linear + GELU); with checkpoint=True each block is recomputed
    in the backward (torch.utils.checkpoint, which Thunder traces)."""

    def __init__(self, checkpoint: bool):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU())
                                          for _ in range(BLOCKS))
        self.checkpoint = checkpoint

    def forward(self, x):
        for b in self.blocks:
            x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False) if self.checkpoint else b(x)
        return x


def _ops(trace):
    """The trace's ops, as memfuse counts them (no prologue, dels, comments, return)."""
    from thunder.core.prims import PrimIDs
    from thunder_memfuse import _symbols

    out = []
    for b in trace.bound_symbols:
        if b.sym.id in _symbols.DROP_IDS or b.sym.id in _symbols.RETURN_IDS:
            continue
        if not out and b.sym.id in _symbols.PROLOGUE_IDS:
            continue
        if getattr(b.sym, "is_fusion", False):
            out.extend(b.subsymbols)
        else:
            out.append(b)
    assert PrimIDs.RETURN not in {b.sym.id for b in out}
    return out


def _collectives(trace):
    """[(position among ops, symbol name, result name)] of the async collectives, in trace order."""
    from thunder_memfuse._symbols import comm_kind

    return [(i, b.sym.name, b.flat_proxy_outs[0].name) for i, b in enumerate(_ops(trace)) if comm_kind(b) == "issue"]


def _model(checkpoint: bool, use_memfuse: bool):
    import thunder
    from thunder_memfuse import MemFuse

    torch.manual_seed(0)
    model = MLP(checkpoint)
    return thunder.distributed.ddp(thunder.jit(model, transforms=[MemFuse(strict=True)] if use_memfuse else []))


def _step(jm, gen, no_sync=False):
    x = torch.randn(BATCH, WIDTH, generator=gen)
    if no_sync:
        with jm.no_sync():
            jm(x).square().mean().backward()
    else:
        jm(x).square().mean().backward()


def _grads(jm):
    return [p.grad.clone() for p in jm.parameters()]


def _check_case(rank: int, checkpoint: bool, accumulate: bool):
    import thunder
    import thunder_memfuse as tm

    what = f"rank {rank}, {'checkpointed' if checkpoint else 'plain'} MLP"
    ref, jm = _model(checkpoint, False), _model(checkpoint, True)
    for m in (ref, jm):
        _step(m, torch.Generator().manual_seed(100 + rank))
    ref_bw, bw = thunder.last_backward_traces(ref)[-1], thunder.last_backward_traces(jm)[-1]
    assert getattr(bw, "_memfuse_info", None) is not None, f"{what}: memfuse did not plan the backward"
    _assert_equal(_grads(jm), _grads(ref), what)

    ref_coll, coll = _collectives(ref_bw), _collectives(bw)
    assert len(coll) == 2 * BLOCKS, f"{what}: expected one all_reduce per parameter, got {coll}"
    assert [c[1:] for c in coll] == [c[1:] for c in ref_coll], f"{what}: collectives reordered: {coll} vs {ref_coll}"
    # the same sequence on every rank
    seqs = [None] * WORLD
    dist.all_gather_object(seqs, [c[1:] for c in coll])
    assert all(s == seqs[0] for s in seqs), f"{what}: ranks issue different sequences: {seqs}"
    # never issued later than in Thunder's own trace
    for (p, name, res), (p0, _, _) in zip(coll, ref_coll):
        if "all_reduce" in name:
            assert p <= p0, f"{what}: {res} issued at op {p}, Thunder's trace issues it at op {p0}"
    assert any(p < p0 for (p, *_), (p0, *_) in zip(coll, ref_coll)), f"{what}: nothing issued earlier"
    # report(): per collective, position before and after
    rep = tm.report(jm)["backward"]["collectives"]
    assert [c["name"] for c in rep] == [c[2] for c in coll]
    for c, (p, _, _), (p0, _, _) in zip(rep, coll, ref_coll):
        assert (c["before"], c["after"]) == (p0, p), f"{what}: report {c} vs trace positions {p0} -> {p}"
        assert c["wait_after"] > c["after"]

    if accumulate:  # gradient accumulation: two no_sync steps, then a synced one
        for m in (ref, jm):
            gen = torch.Generator().manual_seed(200 + rank)
            for p in m.parameters():
                p.grad = None
            _step(m, gen, no_sync=True)
            assert not _collectives(thunder.last_backward_traces(m)[-1]), f"{what}: no_sync backward communicates"
            _step(m, gen, no_sync=True)
            _step(m, gen)
        assert getattr(thunder.last_backward_traces(jm)[-1], "_memfuse_info", None) is not None
        _assert_equal(_grads(jm), _grads(ref), what + ", no_sync accumulation")


def _assert_equal(grads, ref_grads, what):
    assert len(grads) == len(ref_grads)
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        torch.testing.assert_close(g, r, rtol=0, atol=0, msg=lambda m: f"{what}: gradient {i}: {m}")


def _worker(rank: int, port: int, errfile: str):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if os.path.exists("/sys/class/net/lo"):  # gloo on loopback, whatever the hostname resolves to
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=120))
    try:
        _check_case(rank, checkpoint=False, accumulate=True)
        _check_case(rank, checkpoint=True, accumulate=False)
    except BaseException:
        with open(f"{errfile}.{rank}", "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def test_ddp_gloo_two_processes(tmp_path):
    errfile = str(tmp_path / "err")
    ctx = mp.start_processes(_worker, args=(_free_port(), errfile), nprocs=WORLD, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                pytest.fail(f"DDP workers did not finish within {TIMEOUT_S} s")
    except ProcessException:
        errs = [open(f"{errfile}.{r}").read() for r in range(WORLD) if os.path.exists(f"{errfile}.{r}")]
        pytest.fail("a DDP worker failed:\n" + "\n".join(errs))
    finally:
        for p in ctx.processes:  # only the workers this test started
            if p.is_alive():
                p.kill()
