"""Regions that write over inputs dying with them (integration/_regroup.py NOTE [donated inputs],
regions/inductor_graph.py NOTE [donated inputs in Inductor]): the memory it gives back, and the tensors
it must never touch (the trace's inputs, what the caller holds, a storage read later through a view,
the saved activations of a backward that keeps its graph).  Every test checks that memfuse planned the
traces it compares, and the ones that need a donation check that one was made."""
import pytest
import torch
import thunder

from thunder_memfuse import MemFuse
from thunder_memfuse.integration import _regroup
from thunder_memfuse.measure import cpu_peak_bytes
from thunder_memfuse.regions import torchcompile as tc

pytestmark = pytest.mark.skipif(not tc.available(False), reason="torch.compile cannot build here (no C++ compiler)")


def _planned(jf, backward=False):
    getter = thunder.last_backward_traces if backward else thunder.last_traces
    traces = [t for t in getter(jf) if getattr(t, "_memfuse_info", None)]
    assert traces, "memfuse did not plan this trace"
    return traces[-1]


def _kernels(trace):
    """(region bound symbol, its built kernel) for the regions that ran compiled."""
    out = []
    for b in trace.bound_symbols:
        if getattr(b.sym, "is_fusion", False) and b.sym.name.startswith("MemFuse"):
            k = b._call_ctx[b.sym.name].memfuse_state["kernel"]
            if isinstance(k, tc.InductorRegion):
                out.append((b, k))
    return out


def _dropped(x, w):
    d = torch.nn.functional.dropout(x @ w, 0.5, training=True)  # random: it stays out of regions
    return torch.log_softmax(d, -1) * 2  # ... so the region after it is the last to read d


def _jit(fn, **kw):
    return thunder.jit(fn, executors=["torchcompile"], transforms=[MemFuse(**kw)])


def _without_donations(make):
    """make() with no region given an input to write over (and regions compiled afresh)."""
    tc.clear_cache()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_regroup, "_donations", lambda *a: {})
            return make()
    finally:
        tc.clear_cache()


def test_a_dying_intermediate_is_written_over():
    """The log-softmax's region writes its result over the dropout's, which it alone reads: its
    program allocates no result buffer of its own (the row statistics only), where the same region
    without the donation allocates one; the numbers are plain Thunder's under the same seed."""
    torch.manual_seed(0)
    x, w = torch.randn(512, 64), torch.randn(64, 1024)
    jf = _jit(_dropped)
    torch.manual_seed(1)
    got = jf(x, w)
    torch.manual_seed(1)
    # plain thunder.jit's: torch's dropout, as memfuse keeps random ops out of regions (Thunder's
    # torchcompile executor would draw Inductor's own numbers)
    torch.testing.assert_close(got, thunder.jit(_dropped)(x, w), rtol=1e-5, atol=1e-5)
    ((b, k),) = _kernels(_planned(jf))
    assert k.donated == (0,), "the region was not given the dropout's result to write over"
    (peak,) = k.peaks.values()
    assert peak < 64 * 1024, peak  # the row statistics

    def plain():
        jp = _jit(_dropped)
        jp(x, w)
        ((_, kp),) = _kernels(_planned(jp))
        assert not kp.donated
        return next(iter(kp.peaks.values()))

    assert _without_donations(plain) >= 512 * 1024 * 4


def _keeps(x, w):
    h = x @ w
    v = h[:, :8]  # a view of h, read after the region that reads h
    y = torch.tanh(h) * 2
    return y, h, v * 3


def test_what_outlives_the_region_is_never_written_over():
    """The trace's inputs, a returned tensor, and a storage a later op reads through a view keep
    their values."""
    torch.manual_seed(0)
    x, w = torch.randn(256, 64), torch.randn(64, 128)
    x0, w0 = x.clone(), w.clone()
    jf = _jit(_keeps)
    y, h, v3 = jf(x, w)
    torch.testing.assert_close(x, x0, rtol=0, atol=0)
    torch.testing.assert_close(w, w0, rtol=0, atol=0)
    want = _keeps(x0, w0)
    for a, b in zip((y, h, v3), want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    trace = _planned(jf)
    for b, k in _kernels(trace):
        names = [a.name for a in b.args]
        for i in k.donated_all:
            assert names[i] not in {p.name for p in trace.args}, "a trace input was donated"


class _Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 512)

    def forward(self, x, targets):
        h = torch.nn.functional.layer_norm(x, (64,))
        return torch.nn.functional.cross_entropy(self.proj(h).reshape(-1, 512), targets.reshape(-1))


def test_saved_activations_are_written_over_only_when_the_graph_is_not_kept():
    """The backward writes the cross-entropy's gradient over the saved log-softmax, except in a
    backward that keeps its graph (retain_graph=True): there a second backward reads the same saved
    tensors and must get the same gradients."""
    torch.manual_seed(0)
    model = _Classifier()
    x, targets = torch.randn(4, 256, 64), torch.randint(0, 512, (4, 256))
    jf = _jit(model)

    def grads(**kw):
        for p in model.parameters():
            p.grad = None
        loss = jf(x, targets)
        loss.backward(**kw)
        return loss, [p.grad.clone() for p in model.parameters()]

    loss, once = grads()
    kernels = _kernels(_planned(jf, backward=True))
    assert any(set(k.donated_all) - set(k.donated) for _, k in kernels), "no saved activation was donated"
    peak, _ = cpu_peak_bytes(grads)

    def plain():
        jp = _jit(model)
        for p in model.parameters():
            p.grad = None
        jp(x, targets).backward()
        for p in model.parameters():
            p.grad = None
        return cpu_peak_bytes(lambda: jp(x, targets).backward())[0]

    # the gradient of the logits written over the saved log-softmax: one logits-sized tensor less
    assert peak <= _without_donations(plain) - 4 * 256 * 512 * 4 + 256 * 1024, peak
    for p in model.parameters():
        p.grad = None
    model(x, targets).backward()
    for g, p in zip(once, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)

    for p in model.parameters():
        p.grad = None
    kept = jf(x, targets)
    kept.backward(retain_graph=True)
    first = [p.grad.clone() for p in model.parameters()]
    kept.backward()  # the same saved tensors again
    for a, b, g in zip(first, [p.grad for p in model.parameters()], once):
        torch.testing.assert_close(a, g, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b, 2 * g, rtol=1e-5, atol=1e-6)


def _converts(x, w):
    h = x @ w
    c = h.contiguous()  # h itself at run time: contiguous already
    t = h.to(torch.float32)  # ... and so is this
    return torch.tanh(c) + h.sin() + t


def test_a_conversion_that_may_return_its_argument_shares_its_storage():
    """The memory model counts `contiguous` and `to` as new tensors (conservative there); a region
    writing over one of them would write over the tensor they return as they are, which another name
    still reads: for donations they share their argument's storage."""
    from thunder_memfuse.integration import _planning

    torch.manual_seed(0)
    x, w = torch.randn(64, 32), torch.randn(32, 64)
    jf = _jit(_converts)
    torch.testing.assert_close(jf(x, w), _converts(x, w), rtol=1e-5, atol=1e-5)
    trace = thunder.last_traces(jf)[0]
    root = _planning.donation_root(trace)
    mm = next(b for b in trace.bound_symbols if b.sym.name == "matmul").output
    for name in ("contiguous", "to"):
        out = next(b for b in trace.bound_symbols if b.sym.name == name).output
        assert root(out) == (mm, False), (name, root(out))


def test_the_planner_counts_a_donated_input_as_given_back():
    """csrc/core/mf_credit.c NOTE [donated inputs], on a graph: a pointwise result of a fused group
    takes the buffer of a donatable input the group reads last, so the group counts it once; the
    simulator agrees with the plan, and an input that is not donatable, read after the group, read
    through a view of other bytes or of another order, or read through two of its values from
    outside the group gives nothing back.  A bad id is an error that names the argument."""
    from thunder_memfuse import _plan

    # x (input) -> a (op 0, runs alone) -> b (op 1, reads a) -> c (op 2, pointwise, reads b): a and c
    # of one size
    ops, vb = [([0], [1]), ([1], [2]), ([2], [3])], [100, 100, 100, 100]
    kw = dict(graph_inputs=[0], graph_outputs=[3], fusible=[False, True, 3])
    plain = _plan.plan(ops, vb, **kw)
    given = _plan.plan(ops, vb, donatable=[1], **kw)
    assert (plain.peak_bytes, given.peak_bytes, given.groups) == (200, 100, [[0], [1, 2]]), (plain, given)
    grouped = dict(order=[0, 1, 2], groups=[[0], [1, 2]])
    assert _plan.simulate(ops, vb, grouped["order"], grouped["groups"], donatable=[1], **kw)[1] == [100, 100]
    assert _plan.simulate(ops, vb, grouped["order"], grouped["groups"], **kw)[1] == [100, 200]
    # read after the group (op 3 reads a again): a lives on, nothing to take
    ops2, vb2 = ops + [([1, 3], [4])], vb + [100]
    kw2 = dict(graph_inputs=[0], graph_outputs=[4], fusible=[False, True, 3, False])
    assert _plan.simulate(ops2, vb2, [0, 1, 2, 3], [[0], [1, 2], [3]], donatable=[1], **kw2)[1][1] == 200
    # read through a view of all its bytes that keeps their order (value 4 aliases a, and is marked
    # donatable: a reshape): the group's one input, given back
    ops3 = [([0], [1]), ([1], [4]), ([4], [2]), ([2], [3])]
    kw3 = dict(graph_inputs=[0], graph_outputs=[3], fusible=[False, True, True, 3], aliases=[(4, 1)])
    with_view = _plan.simulate(ops3, vb + [100], [0, 1, 2, 3], [[0], [1], [2, 3]], donatable=[1, 4], **kw3)
    assert with_view[1][2] == 100, with_view
    # ... but not through a view of another order (not marked: a transpose) or of fewer bytes (a slice)
    reordered = _plan.simulate(ops3, vb + [100], [0, 1, 2, 3], [[0], [1], [2, 3]], donatable=[1], **kw3)
    sliced = _plan.simulate(ops3, vb + [50], [0, 1, 2, 3], [[0], [1], [2, 3]], donatable=[1, 4], **kw3)
    assert (reordered[1][2], sliced[1][2]) == (200, 200), (reordered, sliced)
    # the root and a view both read from outside the group are two inputs of its region, of which the
    # caller donates neither; with the view made in the group, the root is its one input again
    ops4 = [([0], [1]), ([1], [4]), ([4, 1], [2]), ([2], [3])]
    two = _plan.simulate(ops4, vb + [100], [0, 1, 2, 3], [[0], [1], [2, 3]], donatable=[1, 4], **kw3)
    one = _plan.simulate(ops4, vb + [100], [0, 1, 2, 3], [[0], [1, 2, 3]], donatable=[1, 4], **kw3)
    assert (two[1][2], one[1][1]) == (200, 100), (two, one)
    with pytest.raises(ValueError, match="donatable"):
        _plan.plan(ops, vb, donatable=[7], **kw)


def test_the_backward_plan_counts_the_saved_activation_its_gradient_takes():
    """The planner knows what the regions' donated inputs give back (transform passes the donatable
    storages to the core): the classifier's backward is planned one logits tensor lower than with no
    donations counted, and compare() still finds the plan within one tensor of the measurement."""
    from thunder_memfuse.integration import _planning
    from thunder_memfuse.measure import compare
    from thunder_memfuse.reports._traces import _schedules

    torch.manual_seed(0)
    model = _Classifier()
    x, targets = torch.randn(4, 256, 64), torch.randint(0, 512, (4, 256))

    def planned_backward():
        jf = _jit(model)
        jf(x, targets).backward()
        return jf, _planned(jf, backward=True)._memfuse_info

    jf, info = planned_backward()
    assert info["graph"]["donatable"], "no storage was passed to the planner as donatable"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_planning, "donatable_names", lambda *a: frozenset())
        _, blind = planned_backward()
    assert not blind["graph"]["donatable"]

    def gradient_step(inf):
        """The planned bytes of the step that makes the logits' gradient (the log-softmax backward)."""
        g, plan = inf["graph"], inf["plan"]
        _, (_, steps, _) = _schedules(inf)
        (k,) = [k for k, grp in enumerate(plan["groups"])
                if any(inf["names"][v] == logits_grad for op in grp for v in g["ops"][op][1])]
        return steps[k]

    bw = _planned(jf, backward=True)
    logits_grad = next(b for b in bw.bound_symbols for s in b.subsymbols
                       if "_log_softmax_backward_data" in s.sym.name).output
    logits_grad = logits_grad[0].name if isinstance(logits_grad, tuple) else logits_grad.name
    logits = 4 * 256 * 512 * 4
    assert gradient_step(info) == gradient_step(blind) - logits, (gradient_step(info), gradient_step(blind))
    assert info["plan"]["peak_bytes"] < blind["plan"]["peak_bytes"]
    c = compare(jf, x, targets)
    assert c["backward"].within_one_tensor, c.summary()


def test_storages_a_conversion_joins_are_not_donatable_to_the_planner():
    """donatable_names leaves out the storages the donation keys join (a `contiguous` or `to` that may
    return the matmul's result): the model counts them apart, and a region may write over none of
    them while another is read; the values the trace makes alone are donatable."""
    from thunder_memfuse.integration import _planning

    torch.manual_seed(0)
    x, w = torch.randn(64, 32), torch.randn(32, 64)
    jf = _jit(_converts)
    jf(x, w)
    trace = thunder.last_traces(jf)[0]
    names = _planning.donatable_names(trace.bound_symbols, None, None)
    joined = {b.output.name for b in trace.bound_symbols if b.sym.name in ("matmul", "contiguous", "to")}
    assert len(joined) == 3 and not joined & names, (joined, names)
    tanh = next(b for b in trace.bound_symbols if b.sym.name == "tanh").output.name
    assert tanh in names
    assert not {p.name for p in trace.args} & names, "a trace input was donatable"


def _viewed(x):
    y = torch.tanh(x)
    return y.reshape(-1).sin(), y.t().cos()


def test_views_of_a_donatable_storage_are_marked_only_where_they_keep_its_order():
    """donatable_names marks the reshapes of a donatable storage (a result computed from one may be
    written over it) and leaves its transposes unmarked, which keeps the core from giving the storage
    to a fused op reading it through one (csrc/core/mf_credit.c NOTE [donated inputs])."""
    from thunder_memfuse.integration import _planning

    jf = _jit(_viewed)
    jf(torch.randn(16, 8))
    trace = thunder.last_traces(jf)[0]
    names = _planning.donatable_names(trace.bound_symbols, None, None)
    out = {b.sym.name: b.output.name for b in trace.bound_symbols if b.sym.name in ("tanh", "reshape", "t")}
    assert set(out) == {"tanh", "reshape", "t"}, out
    assert out["tanh"] in names and out["reshape"] in names, (out, names)
    assert out["t"] not in names, (out, names)
