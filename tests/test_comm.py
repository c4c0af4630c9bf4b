"""Collective placement through the binding (csrc/core/mf_comm.c NOTE [collective overlap]):
plan(comm=...) on graphs shaped like a data-parallel backward, its errors, and the
classification of Thunder's distributed symbols (one process, no communication)."""
import pytest

import thunder_memfuse as tm

ISSUE, WAIT = 1, 2


def ddp_graph(layers=4, act=100, wgt=10):
    """Layer i: activation gradient g_i (from g_{i-1}), weight gradient w_i (from g_i); then, as in
    Thunder's DDP trace, every all_reduce after the whole backward, every wait after them."""
    ops, vb, comm, aliases, outs = [], [act], [], [], []
    prev = 0
    wgrads = []
    for _ in range(layers):
        vb.append(act)
        g = len(vb) - 1
        ops.append(([prev], [g]))
        vb.append(wgt)
        wgrads.append(len(vb) - 1)
        ops.append(([g], [len(vb) - 1]))
        prev = g
    futures = []
    for w in wgrads:
        vb.append(wgt)
        futures.append(len(vb) - 1)
        comm.append((len(ops), ISSUE))
        ops.append(([w], [len(vb) - 1]))
    for f in futures:
        vb.append(wgt)
        comm.append((len(ops), WAIT))
        aliases.append((len(vb) - 1, f))
        outs.append(len(vb) - 1)
        ops.append(([f], [len(vb) - 1]))
    outs.append(prev)
    return dict(ops=ops, value_bytes=vb, graph_inputs=[0], graph_outputs=outs, aliases=aliases, comm=comm)


def test_collectives_issued_after_their_input_waits_last():
    spec = ddp_graph()
    p = tm.plan(**spec, fuse=False)
    off = tm.plan(**spec, fuse=False, comm_overlap=False)
    pos = {op: i for i, op in enumerate(p.order)}
    issues = [op for op, k in spec["comm"] if k == ISSUE]
    waits = [op for op, k in spec["comm"] if k == WAIT]
    for i, c in enumerate(issues):
        assert pos[c] == pos[2 * i + 1] + 1, f"all_reduce {c} not right after its gradient: {p.order}"
    assert [pos[c] for c in issues] == sorted(pos[c] for c in issues)  # the input order kept
    assert sorted(pos[w] for w in waits) == list(range(len(p.order) - len(waits), len(p.order)))
    assert p.comm_moves > 0 and off.comm_moves == 0
    assert p.peak_bytes <= off.peak_bytes and p.unfused_peak_bytes <= off.unfused_peak_bytes
    # the reported peak is the simulator's for the returned schedule
    peak, _, _ = tm.simulate(spec["ops"], spec["value_bytes"], p.order, p.groups, graph_inputs=[0],
                             graph_outputs=spec["graph_outputs"], aliases=spec["aliases"])
    assert peak == p.peak_bytes


def test_early_issue_that_would_raise_the_peak_waits():
    # op 0: the collective's input; op 1: a 100-byte peak freed by op 2; op 3: the collective (a
    # 50-byte result); op 4: its wait.  Issued before op 2, its result would sit on the peak.
    spec = dict(ops=[([0], [1]), ([0], [2]), ([2], [3]), ([1], [4]), ([4], [5])], value_bytes=[1, 1, 100, 1, 50, 50],
                graph_inputs=[0], graph_outputs=[3, 5], aliases=[(5, 4)], comm=[(3, ISSUE), (4, WAIT)])
    p = tm.plan(**spec, fuse=False)
    off = tm.plan(**spec, fuse=False, comm_overlap=False)
    assert p.peak_bytes == off.peak_bytes
    assert p.order.index(3) > p.order.index(2)


def test_comm_errors_name_the_problem():
    spec = ddp_graph(2)
    with pytest.raises(ValueError, match="comm kind 3"):
        tm.plan(**{**spec, "comm": [(0, 3)]})
    with pytest.raises(ValueError, match=r"comm\[0\]: op 99 out of range"):
        tm.plan(**{**spec, "comm": [(99, 1)]})
    with pytest.raises(ValueError, match="pair"):
        tm.plan(**{**spec, "comm": [(0,)]})
    with pytest.raises(TypeError):
        tm.plan(**{**spec, "comm": [("a", 1)]})


def test_thunder_distributed_symbols_are_classified():
    """comm_kind/effects on the bound symbols Thunder's DDP uses (built on proxies, no process group)."""
    from thunder.core import devices, dtypes
    from thunder.core.proxies import FutureTensorProxy, TensorProxy
    from thunder.core.trace import TraceCtx, tracectx
    from thunder.distributed import prims as dprims
    from thunder_memfuse import _C, _symbols

    with tracectx(TraceCtx()):
        a = TensorProxy(shape=(4, 4), device=devices.cpu, dtype=dtypes.float32)
        fut = FutureTensorProxy(like=a)
        out = TensorProxy(like=a)
        issue = dprims.all_reduce.bind(a, dprims.DistributedReduceOps.SUM, None, True, False, output=fut)
        issue_in_place = dprims.all_reduce.bind(a, dprims.DistributedReduceOps.SUM, None, True, True, output=fut)
        wait = dprims.wait.bind(fut, output=out)
        sync = dprims.pack.bind([a], "bucket", output=out)
    assert _symbols.comm_kind(issue) == "issue" and _symbols.effects(issue) == _C.EFF_COMM
    assert _symbols.effects(issue_in_place) == _C.EFF_COMM | _C.EFF_WRITES
    assert _symbols.comm_kind(wait) == "wait" and _symbols.effects(wait) == _C.EFF_WAIT
    assert _symbols.comm_kind(sync) is None and _symbols.effects(sync) & _C.EFF_ORDERED  # pack: blocking, ordered
