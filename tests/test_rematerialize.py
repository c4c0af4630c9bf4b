"""The fusion pass's rematerialization with its cuts solved in C (_rematerialize.py NOTE
[rematerialization in C]) and its regions' inputs and outputs found in linear time
(fusion_pass._Region): both must give exactly what Thunder's own code gives.  _C.min_cut against
networkx's minimum_cut on random graphs (the same flow and the same partition), its errors; then, on
the joint traces of real training steps, Thunder's rematerialize and memfuse's return the same trace,
and the regions the same inputs and outputs, where the pass did cut something; and where a consumer
an earlier pair rewrote reads a later producer (NOTE [consumers already rewritten]), memfuse's walk
recomputes what Thunder's keeps, and is Thunder's with that one lookup undone."""
import math
import random
import warnings

import networkx as nx
import pytest
import torch
import thunder
from thunder.core.rematerialization import rematerialize as thunder_rematerialize
from thunder.executors.utils import Region
from torch import nn

import models
from thunder_memfuse import _C, memfuse
from thunder_memfuse.integration import _rematerialize, fusion_pass
from thunder_memfuse.integration._rematerialize import rematerialize
from thunder_memfuse.regions import torchcompile as tc


def _random_graph(rng, n, m):
    edges = {}
    for _ in range(m):
        u, v = rng.randrange(n), rng.randrange(n)
        if u != v:
            edges[(u, v)] = rng.choice([-1, 0, 1, 2, 3, 5, 8])
    return edges


def test_min_cut_is_networkx_cut():
    rng = random.Random(0)
    compared = failed = 0
    for _ in range(1500):
        n = rng.randint(2, 24)
        edges = _random_graph(rng, n, rng.randint(0, 70))
        g = nx.DiGraph()
        g.add_nodes_from(range(n))
        for (u, v), c in edges.items():
            g.add_edge(u, v, capacity=float("inf") if c == -1 else float(c))
        src, dst = zip(*edges) if edges else ((), ())
        try:
            value, (_, sink_part) = nx.minimum_cut(g, 0, n - 1)
        except Exception:
            with pytest.raises(ValueError, match="infinite capacity"):
                _C.min_cut(n, list(src), list(dst), list(edges.values()), 0, n - 1)
            failed += 1
            continue
        flow, side = _C.min_cut(n, list(src), list(dst), list(edges.values()), 0, n - 1)
        assert flow == value
        assert {k for k in range(n) if side[k]} == sink_part
        compared += 1
    assert compared > 1000 and failed > 10  # both outcomes were exercised


def test_min_cut_errors():
    with pytest.raises(ValueError, match="edge 0 joins 0 and 5"):
        _C.min_cut(3, [0], [5], [1], 0, 2)
    with pytest.raises(ValueError, match="negative"):
        _C.min_cut(3, [0], [2], [-2], 0, 2)
    with pytest.raises(ValueError, match="capacity has 2 items"):
        _C.min_cut(3, [0], [2], [1, 1], 0, 2)
    with pytest.raises(TypeError, match=r"src\[0\] must be an int"):
        _C.min_cut(3, [True], [2], [1], 0, 2)
    with pytest.raises(ValueError, match="distinct source and sink"):
        _C.min_cut(3, [0], [2], [1], 1, 1)
    with pytest.raises(ValueError, match="overflow"):
        _C.min_cut(3, [0, 1], [1, 2], [2**62, 2**62], 0, 2)
    flow, side = _C.min_cut(2, [], [], [], 0, 1)  # nothing joins them: no flow, only the sink on its side
    assert flow == 0 and side == b"\x00\x01"


class _Step(nn.Module):
    def __init__(self, d=32, ckpt=False):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(approximate="tanh"),
                                                  nn.Linear(2 * d, d)) for _ in range(2))
        self.ckpt = ckpt

    def forward(self, x):
        for b in self.blocks:
            if self.ckpt:
                x = x + torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False)
            else:
                x = x + b(x)
        return (x.tanh() * x.sigmoid()).sum()


def _joint_traces(model, x, monkeypatch):
    seen = []
    real = fusion_pass._fuse_remat_dissolve

    def capture(ex, trace):  # inside the compilation, where memfuse_ex claims what it may
        fused, n_regions = fusion_pass.provisional_regions(ex, trace)
        seen.append((trace, fused, n_regions))
        return real(ex, trace)

    monkeypatch.setattr(fusion_pass, "_fuse_remat_dissolve", capture)
    jm = thunder.jit(model, executors=["torchcompile"], transforms=[memfuse])
    with warnings.catch_warnings():
        warnings.simplefilter("error", category=UserWarning)  # a skipped pass warns
        models.module_step(model, x)(jm)
    return seen


def _shape(bsyms):
    """A trace's bound symbols as names: symbol, arguments, outputs, and the same of each subsymbol
    (a provisional region's), in order."""
    def names(xs):
        return tuple(getattr(x, "name", repr(x)) for x in xs)

    return [(b.sym.name, names(b.flat_proxy_args), names(b.flat_proxy_outs), _shape(b.subsymbols) if b.sym.is_fusion else ())
            for b in bsyms]


@pytest.mark.skipif(not tc.available(False), reason="torch.compile cannot build here (no C++ compiler)")
@pytest.mark.parametrize("ckpt", [False, True], ids=["plain", "checkpointed"])
def test_rematerialize_is_thunders(ckpt, monkeypatch):
    torch.manual_seed(0)
    traces = _joint_traces(_Step(ckpt=ckpt), torch.randn(4, 16, 32, requires_grad=True), monkeypatch)
    assert traces, "memfuse's fusion pass did not run"
    cut = 0
    for trace, fused, n_regions in traces:
        assert n_regions >= 2
        producers, consumers = thunder.core.utils.producers_and_consumers(trace)
        for b in fused.bound_symbols:
            if b.sym.is_fusion:
                theirs = Region(producers, consumers, list(b.subsymbols))
                ours = fusion_pass._Region(producers, consumers, list(b.subsymbols))
                assert list(ours.inputs) == list(theirs.inputs) and list(ours.outputs) == list(theirs.outputs)
        want = _shape(thunder_rematerialize(fused).bound_symbols)
        got = _shape(rematerialize(fused).bound_symbols)
        assert got == want
        cut += got != _shape(fused.bound_symbols)
    assert cut, "no pair was cut: the comparison tested nothing"


class _Conv1DBlock(nn.Module):
    """HF GPT-2's MLP: linears as addmm, which the torchcompile executor does not claim in the
    forward, so the layer norm, the tanh GELU written out and the residual are separate provisional
    regions, all read by one backward region."""

    def __init__(self, d=32):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.w1, self.b1 = nn.Parameter(torch.randn(d, 4 * d) / d ** 0.5), nn.Parameter(torch.zeros(4 * d))
        self.w2, self.b2 = nn.Parameter(torch.randn(4 * d, d) / (4 * d) ** 0.5), nn.Parameter(torch.zeros(d))

    def forward(self, x):
        h = torch.addmm(self.b1, self.ln(x).reshape(-1, x.shape[-1]), self.w1)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return x + torch.addmm(self.b2, h, self.w2).reshape(x.shape)


class _Conv1DStep(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(_Conv1DBlock() for _ in range(2))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return (x * x).sum()


def _region_outputs(trace):
    return sum(len(b.flat_proxy_outs) for b in trace.bound_symbols if b.sym.is_fusion)


@pytest.mark.skipif(not tc.available(False), reason="torch.compile cannot build here (no C++ compiler)")
def test_rewritten_consumer_still_recomputes(monkeypatch):
    torch.manual_seed(0)
    model, x = _Conv1DStep(), torch.randn(4, 16, 32, requires_grad=True)
    traces = _joint_traces(model, x, monkeypatch)
    assert traces, "memfuse's fusion pass did not run"
    for _, fused, _ in traces:
        theirs = thunder_rematerialize(fused)
        ours = rematerialize(fused)
        # the GELU's intermediates are recomputed in the backward region, not kept as outputs
        assert _region_outputs(ours) < _region_outputs(theirs)
        with monkeypatch.context() as m:  # that lookup undone: Thunder's walk, value for value
            real = _rematerialize.external_producer_outputs
            m.setattr(_rematerialize, "external_producer_outputs",
                      lambda s, later, p, c, static=(): real(s, later, p, c))
            assert _shape(rematerialize(fused).bound_symbols) == _shape(theirs.bound_symbols)
    # and the step's gradients are eager's
    jm = thunder.jit(model, executors=["torchcompile"], transforms=[memfuse])
    want = torch.autograd.grad(model(x), [x, *model.parameters()])
    got = torch.autograd.grad(jm(x), [x, *model.parameters()])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not tc.available(False), reason="torch.compile cannot build here (no C++ compiler)")
def test_backward_producers_keep_thunders_lookup(monkeypatch):
    """NOTE [consumers already rewritten]: a producer in the backward part (a checkpointed block's
    forward computed again) keeps Thunder's lookup; the departure applied there too would cut
    differently in this trace."""
    from benchmarks.real_sizes import PreLM

    torch.manual_seed(0)
    model = PreLM(vocab=128, dim=32, heads=4, layers=2, seq=16, checkpoint=True)
    idx = torch.randint(0, 128, (2, 16))
    traces = _joint_traces(model, idx, monkeypatch)
    assert traces, "memfuse's fusion pass did not run"
    for _, fused, _ in traces:
        assert _rematerialize.backward_part(fused), "no backward part found in the joint trace"
        theirs = _shape(thunder_rematerialize(fused).bound_symbols)
        assert _shape(rematerialize(fused).bound_symbols) == theirs
        with monkeypatch.context() as m:  # the departure taken for every producer
            m.setattr(_rematerialize, "backward_part", lambda trace: set())
            assert _shape(rematerialize(fused).bound_symbols) != theirs
