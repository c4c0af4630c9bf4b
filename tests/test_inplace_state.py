"""Buffers and parameters updated in place in a training forward (fusion_pass.py NOTE [writes stay
put]).  With torchcompile + memfuse, memfuse's fusion pass runs Thunder's rematerialization on the joint
trace; it once copied a buffer's update into the backward, which ran it a second time.  These modules
must give eager's numbers over several steps (Thunder's torchcompile executor cannot run most of them,
so eager is the reference), memfuse must have planned both traces as the fusion pass, and the backward
must write none of its inputs."""
import copy
import warnings

import pytest
import torch
import thunder
from torch import nn

import fuzz_stateful
from thunder_memfuse import MemFuse, MemFuseWarning
from thunder_memfuse.integration import fusion_pass
from thunder_memfuse.regions import torchcompile as tc

pytestmark = pytest.mark.skipif(not tc.available(False), reason="torch.compile cannot build here (no C++ compiler)")


class BufNet(nn.Module):  # the module that found it
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(8, 8)
        self.register_buffer("ema", torch.zeros(8))

    def forward(self, x):
        h = self.l(x)
        self.ema.mul_(0.9).add_(h.detach().mean(0) * 0.1)
        return (h * self.ema).tanh().sum() + h.relu().sum()


class CounterLerp(nn.Module):
    """A step counter, a running target moved with lerp_, a statistic copied in, a clamped buffer."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 8)
        self.register_buffer("steps", torch.zeros(()))
        self.register_buffer("target", torch.zeros(16))
        self.register_buffer("last", torch.zeros(16))

    def forward(self, x):
        h = torch.tanh(self.a(x))
        old = h + self.target  # reads the target before its update
        self.steps.add_(1)
        with torch.no_grad():
            self.target.lerp_(h.mean(0), 0.5)
        self.last.copy_(h.detach().square().mean(0))
        self.last.clamp_(0.0, 0.25)
        y = self.b(old * (1 + self.steps / 10) + h * self.last)
        return y.square().mean()


def _batchnorm_mlp():
    return nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.GELU(), nn.Linear(32, 8))


MODULES = {"bufnet": BufNet, "counter_lerp": CounterLerp, "batchnorm": _batchnorm_mlp}


def _steps(model, call, n=3):
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        x = torch.randn(6, 8, generator=g)
        loss = call(x)
        if loss.dim():
            loss = loss.square().mean()
        loss.backward()
        out.append(loss.detach().clone())
    out += [p.grad.clone() for p in model.parameters()]
    out += [t.detach().clone() for t in model.state_dict().values()]
    return out


@pytest.mark.parametrize("recompute", ["auto", 1.0, False])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_state_updated_in_place_gives_eagers_numbers(name, recompute):
    torch.manual_seed(0)
    model = MODULES[name]()
    eager_model = copy.deepcopy(model)
    want = _steps(eager_model, eager_model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemFuseWarning)
        jm = thunder.jit(model, executors=["torchcompile"], transforms=[MemFuse(strict=True, recompute=recompute)])
        got = _steps(model, jm)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    # memfuse was the fusion pass, and planned both traces
    assert "memfuse" in [ex.name for ex in thunder.compile_data(jm).executors_list]
    fw = [t for t in thunder.last_traces(jm) if getattr(t, "_memfuse_info", None)]
    bw = [t for t in thunder.last_backward_traces(jm) if getattr(t, "_memfuse_info", None)]
    assert fw and bw
    assert fuzz_stateful.backward_writes_its_inputs(bw[-1]) == []
    # the forward still makes its updates, once each
    assert fusion_pass._writes(fuzz_stateful._flat(fw[-1]))


def test_the_pass_pins_the_update_and_every_reader_of_the_buffer():
    """On BufNet's joint trace: the buffer's reads and writes, and nothing that never touches its storage."""
    captured = {}
    real = fusion_pass._fuse_remat_dissolve

    def spy(ex, trace):
        captured["trace"] = trace
        return real(ex, trace)

    mp = pytest.MonkeyPatch()
    mp.setattr(fusion_pass, "_fuse_remat_dissolve", spy)
    try:
        torch.manual_seed(0)
        jm = thunder.jit(BufNet(), executors=["torchcompile"], transforms=[MemFuse()])
        jm(torch.randn(4, 8)).backward()
    finally:
        mp.undo()
    bsyms = captured["trace"].bound_symbols
    pinned = fusion_pass.pinned_ops(bsyms)
    names = [b.sym.name for b in bsyms if id(b) in pinned]
    assert names.count("copy_") == 2  # mul_ and add_ of the running average
    assert "update_aliases" in names and "mul" in names
    assert not any(b.sym.name in ("linear", "tanh") for b in bsyms if id(b) in pinned)
    # a trace without writes pins nothing, and costs no alias probe
    plain = [b for b in bsyms if not fusion_pass._writes_in_place(b)]
    assert fusion_pass.pinned_ops(plain) == set()


def test_a_pass_that_copies_a_write_leaves_the_trace_as_it_came(monkeypatch):
    """The pass checks its own result: where the writes are not the input's, each once, it warns and
    the joint trace goes on unrematerialized (never wrong)."""
    import thunder.core.rematerialization as remat

    real = remat.rematerialize

    def duplicate_a_write(trace):
        out = real(trace)
        for i, b in enumerate(out.bound_symbols):
            if b.sym.is_fusion:
                w = next((s for s in b.subsymbols if fusion_pass._writes_in_place(s)), None)
                if w is not None:
                    b.subsymbols = list(b.subsymbols) + [w]
                    break
        return out

    monkeypatch.setattr(remat, "rematerialize", duplicate_a_write)
    monkeypatch.setattr(fusion_pass, "pinned_ops", lambda bsyms: set())  # as before the fix
    torch.manual_seed(0)
    model = BufNet()
    eager = copy.deepcopy(model)
    with pytest.warns(MemFuseWarning, match="moved or copied an in-place write"):
        got = _steps(model, thunder.jit(model, executors=["torchcompile"], transforms=[MemFuse()]), n=2)
    want = _steps(eager, eager, n=2)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_autograd_vjp_ops_stay_out_of_torch_compile_regions():
    """Thunder's automatic backward of torch ops without a grad rule (detach_vjp here) runs
    torch.autograd.functional.vjp, which Dynamo cannot trace: regions/torchcompile.py NOTE [autograd vjps]."""
    assert "detach_vjp" in tc._autograd_vjps()
    torch.manual_seed(0)
    model = BufNet()
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemFuseWarning)  # no region falls back
        jm = thunder.jit(model, executors=["torchcompile"], transforms=[MemFuse()])
        jm(torch.randn(4, 8)).backward()
    bw = thunder.last_backward_traces(jm)[-1]
    for b in bw.bound_symbols:
        if b.sym.is_fusion:
            assert not any(s.sym.id in tc._autograd_vjps() for s in b.subsymbols)
