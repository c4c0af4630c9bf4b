"""The C reader's input: one record per bound symbol (thunder_memfuse/integration/_records.py NOTE [op records]),
each question asked once, and a reader that checks what it is given."""
import pytest
import torch
import thunder

from thunder_memfuse import _C
from thunder_memfuse.integration import _planning
from thunder_memfuse.integration._records import records


def _trace(fn, *args):
    jf = thunder.jit(fn)
    jf(*args)
    return thunder.last_traces(jf)[-1]


def _f(x, w):
    y = torch.relu(x @ w)
    z = (y * 2).sin()
    x.add_(1)
    return z + x, torch.nn.functional.dropout(y, 0.5)


def test_each_question_is_asked_once_per_op_and_never_about_effects():
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    trace = _trace(_f, x, w)
    asked = {"fusible": [], "role": []}

    def fusible(b):
        asked["fusible"].append(b)
        return 1

    def role(b):
        asked["role"].append(b)
        return 0

    bsyms = list(trace.bound_symbols)
    recs = records(bsyms, fusible=fusible, epilogue_role=role, recompute=False)
    assert len(recs) == len(bsyms)
    ops = [b for b, r in zip(bsyms, recs) if r[0] == _C.RECORD_OP]
    pure = [b for b, r in zip(bsyms, recs) if r[0] == _C.RECORD_OP and r[1] == 0]
    effects = [b for b, r in zip(bsyms, recs) if r[0] == _C.RECORD_OP and r[1] != 0]
    assert effects and pure  # the in-place add and the dropout have effects
    assert [id(b) for b in asked["fusible"]] == [id(b) for b in pure]
    assert [id(b) for b in asked["role"]] == [id(b) for b in pure]
    assert all(r[2] == 0 and r[4] == 0 and r[5] == 0 for r in recs if r[0] == _C.RECORD_OP and r[1])
    kinds = {b.sym.id: r[0] for b, r in zip(bsyms, recs)}
    assert kinds[thunder.core.prims.PrimIDs.RETURN] == _C.RECORD_RETURN
    assert any(r[0] == _C.RECORD_PROLOGUE for r in recs) and len(ops) < len(bsyms)


def test_the_in_place_write_orders_after_its_readers_through_the_records():
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    trace = _trace(_f, x, w)
    bsyms = list(trace.bound_symbols)
    recs = records(bsyms, fusible=lambda b: 0, epilogue_role=lambda b: 0, recompute=False)
    ops = [b for b, r in zip(bsyms, recs) if r[0] == _C.RECORD_OP]  # graph op k is ops[k] (no saved op)
    res = _planning.plan_trace(bsyms, fuse=False)
    g = res["graph"]
    w_op = next(k for k, b in enumerate(ops) if b.sym.name == "copy_")
    x_root = g["ops"][w_op][0][1]  # copy_(src, dst): writes dst, x's storage
    readers = [k for k, (ins, _) in enumerate(g["ops"]) if x_root in ins and k < w_op]
    assert readers, "x is read before it is written"
    edges = {tuple(e) for e in g["after"]}
    assert all((k, w_op) in edges for k in readers)  # write-after-read, built by the core


def test_bad_records_are_named():
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    bsyms = list(_trace(_f, x, w).bound_symbols)
    recs = records(bsyms, fusible=lambda b: 1, epilogue_role=lambda b: 0, recompute=False)
    tt = (thunder.core.proxies.TensorProxy,)
    with pytest.raises(ValueError, match="records for"):
        _C.plan_trace(bsyms, recs[:-1], tensor_type=tt)
    bad = list(recs)
    bad[0] = (0, 0, 0)
    with pytest.raises(TypeError, match=r"records\[0\]"):
        _C.plan_trace(bsyms, bad, tensor_type=tt)
    bad[0] = (9, 0, 0, None, 0, 0)
    with pytest.raises(ValueError, match="unknown kind"):
        _C.plan_trace(bsyms, bad, tensor_type=tt)
    k = next(i for i, r in enumerate(recs) if r[0] == _C.RECORD_OP)
    bad = list(recs)
    bad[k] = (0, 0, 1, "no", 0, 0)
    with pytest.raises(TypeError, match="aliases must be None or a tuple"):
        _C.plan_trace(bsyms, bad, tensor_type=tt)
    bad[k] = (0, 0, 1, ((99, True),), 0, 0)
    with pytest.raises(ValueError, match="names argument 99"):
        _C.plan_trace(bsyms, bad, tensor_type=tt)
    # the reader calls nothing back: the old per-symbol callables are not parameters any more
    with pytest.raises(TypeError):
        _C.plan_trace(bsyms, recs, tensor_type=tt, effects=lambda b: 0)


def test_the_collector_waits_while_a_trace_is_planned_and_comes_back_after():
    """integration/_planning.py NOTE [collector paused]: no cyclic collection runs inside plan_trace or the
    transform (each would walk every Thunder object alive), the collector is on again after them,
    also when planning fails, and it stays off after them when the caller had it off."""
    import gc

    from thunder_memfuse import MemFuse

    def f(x):
        return (x.sin() * 2).cos() @ x

    seen = []
    import thunder_memfuse.integration._records as rec_mod  # plan_trace imports records from it at each call

    orig = rec_mod.records

    def spy(*a, **k):
        seen.append(gc.isenabled())
        return orig(*a, **k)

    rec_mod.records = spy
    try:
        jf = thunder.jit(f, transforms=[MemFuse(strict=True)])
        jf(torch.randn(16, 16))
        assert seen and not any(seen) and gc.isenabled()
        with pytest.raises(ValueError):
            _planning.plan_trace(thunder.last_traces(jf)[-1].bound_symbols, max_states=-1)
        assert gc.isenabled()
        gc.disable()
        try:
            _planning.plan_trace(thunder.last_traces(jf)[-1].bound_symbols)
            assert not gc.isenabled()
        finally:
            gc.enable()
    finally:
        rec_mod.records = orig
