"""The step's peak (thunder_memfuse/integration/_step.py NOTE [the step's peak], csrc/core/mf_fuse.c NOTE
[peak allowance]): a training step's forward is regrouped with fewer regions within its backward's
planned peak; results stay plain Thunder's and the measured step peak does not rise.  The core's
grouping under an allowance is checked against brute force in tests/c/test_allowance.c.
"""
import pytest
import torch
import thunder

import thunder_memfuse as tm
from thunder_memfuse import MemFuse
from thunder_memfuse.integration import _step
from thunder_memfuse.errors import MemFuseError, MemFuseWarning
from thunder_memfuse.measure import cpu_peak_bytes
from thunder_memfuse.regions import torchcompile as tc

from models import checkpointed_mlp, module_step

needs_compiler = pytest.mark.skipif(not tc.available(False), reason="torch.compile cannot build here (no C++ compiler)")

FALLBACK = dict(fuse=True, kernels="fallback", _fallback_regions=True)


def _paths(x, w):
    # parallel paths whose least-peak forward grouping splits runs of fusible ops (the fallback
    # compiler leaves the matmuls alone)
    ys = [torch.sin(x * (i + 1)).exp() for i in range(4)]
    return sum(torch.tanh(y @ w) for y in ys)


def _checkpointed_paths(x, w):
    for _ in range(2):
        x = torch.utils.checkpoint.checkpoint(_paths, x, w, use_reentrant=False)
    return x


def _paths_step(fn=_checkpointed_paths, n=256):
    torch.manual_seed(0)
    x = torch.randn(n, n, requires_grad=True)
    w = (torch.randn(n, n) / 16).requires_grad_()

    def step(jf):
        out = jf(x, w)
        out.sum().backward()
        res = [out.detach(), x.grad.clone(), w.grad.clone()]
        x.grad = w.grad = None
        return res

    return step


def _forward(jm):
    """The forward trace memfuse returned (the last of Thunder's traces that carries its info)."""
    return [t for t in thunder.last_traces(jm) if hasattr(t, "_memfuse_info")][-1]


def _infos(jm):
    return _forward(jm)._memfuse_info, thunder.last_backward_traces(jm)[-1]._memfuse_info


def test_a_checkpointed_forward_is_regrouped_within_its_backwards_peak(monkeypatch):
    step = _paths_step()
    ref = step(thunder.jit(_checkpointed_paths))
    ours = thunder.jit(_checkpointed_paths, transforms=[MemFuse(strict=True, **FALLBACK)])
    for a, b in zip(ref, step(ours)):
        assert torch.equal(a, b)
    fw, bw = _infos(ours)
    assert fw["peak_allowance"] == bw["plan"]["peak_bytes"]
    assert fw["regions_after"] < fw["regions_without_allowance"], "the forward was not regrouped"
    assert fw["plan"]["peak_bytes"] <= bw["plan"]["peak_bytes"]
    # the program Thunder runs is the regrouped one
    assert sum(1 for b in _forward(ours).bound_symbols if b.sym.name.startswith("MemFuse")) == fw["regions_after"]
    rep = tm.report(ours)["forward"]
    assert rep["regions_after"] == fw["regions_after"] and rep["peak_allowance_bytes"] == fw["peak_allowance"]
    assert rep["regions_without_allowance"] == fw["regions_without_allowance"]
    assert "regrouped within the backward's planned peak" in tm.format_report(tm.report(ours))

    monkeypatch.setattr(_step, "regroup_forward", lambda *a, **k: False)
    first = thunder.jit(_checkpointed_paths, transforms=[MemFuse(strict=True, **FALLBACK)])
    for a, b in zip(ref, step(first)):
        assert torch.equal(a, b)
    fw1, bw1 = _infos(first)
    assert fw1["peak_allowance"] is None and fw1["regions_after"] == fw["regions_without_allowance"]
    assert "regrouped" not in tm.format_report(tm.report(first))
    assert bw1["plan"]["peak_bytes"] == bw["plan"]["peak_bytes"]
    peak_first, _ = cpu_peak_bytes(lambda: step(first))
    peak_ours, _ = cpu_peak_bytes(lambda: step(ours))
    assert peak_ours <= peak_first


def test_an_inference_forward_has_no_allowance():
    x, w = torch.randn(64, 64), torch.randn(64, 64) / 8
    jm = thunder.jit(_paths, transforms=[MemFuse(strict=True, **FALLBACK)])
    with torch.no_grad():
        torch.testing.assert_close(jm(x, w), _paths(x, w))
    info = _forward(jm)._memfuse_info
    assert info["peak_allowance"] is None and "regions_without_allowance" not in info


def test_a_failed_regrouping_keeps_the_first_forward_with_a_warning(monkeypatch):
    step = _paths_step(n=128)
    ref = step(thunder.jit(_checkpointed_paths))
    plan = MemFuse._plan

    def failing(self, trace, **kw):
        if kw.get("peak_allowance"):
            raise RuntimeError("replan broke")
        return plan(self, trace, **kw)

    monkeypatch.setattr(MemFuse, "_plan", failing)
    jm = thunder.jit(_checkpointed_paths, transforms=[MemFuse(**FALLBACK)])
    with pytest.warns(MemFuseWarning, match="kept the forward's first grouping.*replan broke"):
        got = step(jm)
    for a, b in zip(ref, got):
        assert torch.equal(a, b)
    fw, bw = _infos(jm)
    assert fw["peak_allowance"] is None and bw["plan"]  # the backward stays planned

    strict = thunder.jit(_checkpointed_paths, transforms=[MemFuse(strict=True, **FALLBACK)])
    with pytest.raises(MemFuseError, match="replan broke"):
        step(strict)


class _Trace:
    def __init__(self, regions, peak, ms=1.0):
        self._memfuse_info = {"regions_after": regions, "plan": {"peak_bytes": peak}, "time_ms": ms}
        self.bound_symbols = [f"bsyms of {regions}"]
        self.provenance = None

    def set_provenance(self, p):
        self.provenance = p

    def get_provenance(self):
        return self.provenance


@pytest.mark.parametrize("regions, peak, backward_peak, kept", [
    (2, 90, 100, True),     # fewer regions within the allowance
    (5, 90, 100, False),    # as many regions: the first grouping stays
    (2, 110, 100, False),   # above the allowance (never from the core): refused
    (2, 90, 50, False),     # the forward peaks above the backward: no allowance at all
])
def test_a_regrouping_is_kept_only_with_fewer_regions_within_the_allowance(regions, peak, backward_peak, kept):
    first = _Trace(5, 60)
    new = _Trace(regions, peak)
    calls = []

    def replan(trace, allowance):
        calls.append(allowance)
        return new

    fw = _step.Forward("source", first)
    assert _step.regroup_forward(fw, backward_peak, replan) is kept
    assert calls == ([] if backward_peak <= 60 else [backward_peak])
    assert (first.bound_symbols is new.bound_symbols) is kept
    if kept:
        assert first._memfuse_info["regions_without_allowance"] == 5 and first._memfuse_info["time_ms"] == 2.0


@needs_compiler
def test_with_torchcompile_regions_the_forward_compiles_fewer_regions():
    model = checkpointed_mlp(d=32, layers=2)
    x = torch.randn(64, 32)
    step = module_step(model, x)
    ref = step(model)
    jm = thunder.jit(model, executors=["torchcompile"], transforms=[MemFuse(strict=True)])
    for a, b in zip(ref, step(jm)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    fw, bw = _infos(jm)
    assert fw["kernels"] == "torchcompile"
    assert fw["regions_after"] < fw["regions_without_allowance"]
    assert fw["plan"]["peak_bytes"] <= bw["plan"]["peak_bytes"] == fw["peak_allowance"]


@pytest.mark.parametrize("own, others, kept", [(2, 0, True), (1, 3, False), (0, 4, False)])
def test_only_a_forward_with_regions_of_its_own_awaits_its_backward(own, others, kept):
    # another executor's regions (memfuse with fuse=False keeps them) are not memfuse's to merge
    import types

    cd = types.SimpleNamespace()
    t = _Trace(own + others, 60)
    t._memfuse_info["own_regions"] = own
    _step.keep_forward(cd, "source", t)
    assert (cd._memfuse_forward is not None) is kept
    fw = _step.take_forward(cd)
    assert (fw is not None and fw.returned is t) is kept
    assert _step.take_forward(cd) is None  # taken once
