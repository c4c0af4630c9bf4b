"""The memory model against the measurement (issue 13): saved tensors that share
storage across the forward/backward boundary, and compare()'s per-step check."""
import warnings

import pytest
import torch
import thunder

import thunder_memfuse as tm
from thunder_memfuse import MemFuse
from thunder_memfuse.integration import _planning
from thunder_memfuse._plan import simulate
from thunder_memfuse.measure import compare
from benchmarks.seed import FUNCTIONS

from models import seed_inputs


def three_aliases(x, w):
    """The forward saves h, h.t() and a reshape of h (h * w, a @ w and b.sin() each save their operand)."""
    h = x @ w
    a = h.t()
    b = h.reshape(-1, 2 * h.shape[1])
    return (h * w).sum() + (a @ w).sum() + b.sin().sum()


def _root(aliases, v):
    alias = dict(aliases)
    while v in alias:
        v = alias[v]
    return v


def test_saved_views_are_one_storage_freed_after_the_last_use():
    torch.manual_seed(0)
    x = torch.randn(64, 64, requires_grad=True)
    w = torch.randn(64, 64, requires_grad=True)
    jf = thunder.jit(three_aliases, transforms=[MemFuse()])
    jf(x, w).backward()
    got = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    three_aliases(x, w).backward()
    torch.testing.assert_close(got, (x.grad, w.grad), rtol=1e-4, atol=1e-4)

    storages = _planning.saved_storages(thunder.last_traces(jf)[-1])
    keys = {k for k, _ in storages.values()}
    assert len(storages) == 3 and len(keys) == 1, storages  # h and two views, one storage
    h_bytes = 64 * 64 * 4
    assert {b for _, b in storages.values()} == {h_bytes}

    info = thunder.last_backward_traces(jf)[-1]._memfuse_info
    g, names, order = info["graph"], info["names"], info["plan"]["order"]
    ids = [names.index(n) for n in storages]
    roots = {_root(g["aliases"], v) for v in ids}
    assert len(roots) == 1
    (root,) = roots
    kw = dict(graph_inputs=g["graph_inputs"], graph_outputs=g["graph_outputs"], aliases=g["aliases"])
    _, _, live = simulate(g["ops"], g["value_bytes"], order, **kw)
    # the backward starts with one storage, not three tensors (and the incoming gradient, a scalar)
    assert live[0] == h_bytes + 4
    # the storage is live exactly until the step of the last reader of any of the
    # three (or of a view the backward takes of them)
    members = {v for v in range(len(g["value_bytes"])) if _root(g["aliases"], v) == root}
    assert set(ids) <= members
    pos = {op: i for i, op in enumerate(order)}
    last = max(pos[k] for k, (ins, _) in enumerate(g["ops"]) if set(ins) & members)
    vb = list(g["value_bytes"])
    vb[root] = 0
    _, _, live0 = simulate(g["ops"], vb, order, **kw)
    held = [a - b for a, b in zip(live, live0)]
    assert all(h == h_bytes for h in held[:last]) and all(h == 0 for h in held[last:])

    c = compare(jf, x, w)
    bw = c["backward"]
    assert bw.saved_simulated == h_bytes == bw.saved_storages_measured
    assert bw.start_simulated == h_bytes + 4
    assert bw.saved_tensors_measured == 3
    assert abs(bw.simulated_peak - bw.measured_peak) <= bw.largest_tensor
    assert not c.flagged, c.table()


def test_saved_view_of_an_input_stays_an_input():
    def fn(x, w):
        return (x.t() @ w).sin().sum()  # the forward saves x.t(), a view of an input

    x = torch.randn(32, 32, requires_grad=True)
    w = torch.randn(32, 32, requires_grad=True)
    jf = thunder.jit(fn, transforms=[MemFuse()])
    jf(x, w).backward()
    ft = thunder.last_traces(jf)[-1]
    storages = _planning.saved_storages(ft)
    from thunder.core.vjp_utils import get_saved_for_backward_tensors

    saved = {s.name for s in get_saved_for_backward_tensors(ft)}
    views_of_inputs = saved - set(storages) - {"x", "w"}
    assert views_of_inputs, "the forward saves a view of x"
    c = compare(jf, x, w)
    assert c["backward"].saved_simulated == c["backward"].saved_storages_measured


@pytest.mark.parametrize("name", list(FUNCTIONS))
@pytest.mark.parametrize("transforms", [[], [MemFuse()]], ids=["thunder", "memfuse"])
def test_compare_on_the_seed(name, transforms):
    t0s, a = seed_inputs()
    jf = thunder.jit(FUNCTIONS[name], transforms=transforms)
    c = compare(jf, list(t0s), a)
    fw = c["forward"]
    assert len(fw.steps) == 40 and "backward" not in c.traces
    assert abs(fw.simulated_peak - fw.measured_peak) <= fw.largest_tensor
    assert not c.flagged, c.table()
    assert fw.measured_peak == (3 if transforms or name == "efficient" else 11) * 256 * 256 * 4
    fig = c.plot(title=name)
    assert len(fig.axes) == 1 and len(fig.axes[0].lines) >= 2


def test_compare_on_a_checkpointed_mlp():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([mlp, torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(),
                                                                          torch.nn.Linear(256, 64))])

        def forward(self, x):
            for b in self.blocks:
                x = x + torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False)
            return x

    net = Net()
    x = torch.randn(128, 64)
    jm = thunder.jit(net, transforms=[MemFuse()])
    c = compare(jm, x)
    assert set(c.traces) == {"forward", "backward"}
    for t in c.traces.values():
        assert abs(t.simulated_peak - t.measured_peak) <= t.largest_tensor, c.summary()
    bw = c["backward"]
    assert bw.saved_simulated <= bw.saved_storages_measured
    # the incoming gradient of the output is freed after its last use too
    assert bw.start_simulated == bw.saved_simulated + 128 * 64 * 4
    assert tm.report(jm)["backward"]["start_bytes"] == bw.start_simulated
    for p in net.parameters():
        p.grad = None


def test_plan_trace_rejects_bad_storage_information():
    def fn(x):
        return x.sin().cos()

    jf = thunder.jit(fn)
    x = torch.randn(8, requires_grad=True)
    jf(x)
    bt = thunder.last_backward_traces(jf)[-1]
    saved = [n for n in _planning.saved_storages(thunder.last_traces(jf)[-1])]
    assert saved
    with pytest.raises(TypeError, match="storage key, bytes"):
        _planning.plan_trace(list(bt.bound_symbols), freeable={n: "bad" for n in saved})
    with pytest.raises(ValueError, match="bytes must be >= 0"):
        _planning.plan_trace(list(bt.bound_symbols), freeable={n: ("k", -1) for n in saved})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = _planning.plan_trace(list(bt.bound_symbols), freeable={n: ("k", 32) for n in saved})
    assert res["plan"]["peak_bytes"] > 0


def test_storage_information_does_not_leak():
    from test_binding_leaks import _growth

    jf = thunder.jit(three_aliases)
    x = torch.randn(16, 16, requires_grad=True)
    jf(x, x.detach().clone().requires_grad_())
    bsyms = list(thunder.last_backward_traces(jf)[-1].bound_symbols)
    saved = _planning.saved_storages(thunder.last_traces(jf)[-1])
    shared = {n: ("root", 1024) for n in saved}  # every saved tensor a view of one unsaved root

    def bad():
        try:
            _planning.plan_trace(bsyms, freeable={n: ("root", -1) for n in saved})
        except ValueError:
            pass

    assert _growth(lambda: _planning.plan_trace(bsyms, freeable=saved), 1000) < 1 << 20
    assert _growth(lambda: _planning.plan_trace(bsyms, freeable=shared), 1000) < 1 << 20
    assert _growth(bad, 1000) < 1 << 20


def test_compare_rejects_what_it_cannot_measure():
    with pytest.raises(ValueError, match="thunder.jit"):
        compare(lambda x: x, torch.randn(2))


def _large_output(x, w1, w2):
    return torch.relu(torch.tanh(x @ w1) @ w2)  # the backward reads the output's gradient first


def test_compare_backpropagates_a_dense_gradient_by_default():
    """compare()'s default loss is the outputs' sum with its gradient written out at the output's
    size, as a real loss's is: the backward's model counts that tensor and frees it after its last
    use.  A bare sum hands the backward an expanded scalar, and the two curves part by the
    gradient's size (the second comparison shows the default is what keeps them together)."""
    torch.manual_seed(0)
    x = torch.randn(512, 256)
    w1, w2 = torch.randn(256, 256, requires_grad=True), torch.randn(256, 1024, requires_grad=True)
    jf = thunder.jit(_large_output, transforms=[MemFuse()])
    jf(x, w1, w2)
    assert tm.report(jf)["backward"] is not None, "memfuse did not plan the backward"
    bw = compare(jf, x, w1, w2)["backward"]
    assert not bw.flagged and abs(bw.simulated_peak - bw.measured_peak) <= 64, bw.steps  # a scalar or so
    bare = compare(jf, x, w1, w2, loss_fn=lambda o: o.sum())["backward"]
    assert bare.measured_peak - bare.simulated_peak >= 512 * 1024 * 4 // 2, bare.steps
