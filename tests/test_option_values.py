"""Each option takes exactly the values docs/API.md lists, by type, and what is validated is what acts
(issue 31): 0/1 and strings are not bools, recompute's share is finite and bounded, THUNDER_MEMFUSE is on
or off and nothing else; the binding's errors name their argument; simulate() reproduces plan()'s peak with
epilogue pairs."""
import math
import random

import pytest
import torch
import thunder

import thunder_memfuse as tm
from thunder_memfuse import MemFuse, _C, _options
from thunder_memfuse.integration import _recompute
from thunder_memfuse.integration.transform import GENERAL_FUSION_EXECUTORS

from test_plan import Graph, random_graph


@pytest.mark.parametrize("name, bad", [
    ("fuse", 0), ("fuse", 1), ("fuse", "true"), ("fuse", "Auto"), ("fuse", None),
    ("replace_fusion", 1), ("replace_fusion", 0), ("replace_fusion", "yes"),
    ("strict", "no"), ("strict", 1), ("strict", None),
    ("comm_overlap", 0), ("comm_overlap", "False"),
    ("kernels", ["auto"]), ("kernels", "Torchcompile"), ("backend", 0),
    ("recompute", float("inf")), ("recompute", 1e300), ("recompute", float("nan")), ("recompute", 10**400),
    ("recompute", 0), ("recompute", -0.5), ("recompute", _options.MAX_SHARE * 2), ("recompute", "on"),
])
def test_a_value_the_docs_do_not_list_is_refused_naming_the_option(name, bad):
    with pytest.raises((ValueError, TypeError), match=rf"MemFuse: {name} must be") as e:
        MemFuse(**{name: bad})
    assert "got" in str(e.value)  # and says what it got


def test_the_values_the_docs_list_are_kept_as_given():
    assert MemFuse(fuse=True).fuse is True and MemFuse(fuse=False).fuse is False
    assert MemFuse(fuse="auto").fuse == "auto" and MemFuse(replace_fusion=False).replace_fusion is False
    assert MemFuse(strict=True).strict is True
    assert MemFuse(recompute=_options.MAX_SHARE).recompute == _options.MAX_SHARE
    assert MemFuse(recompute=2).recompute == 2.0 and type(MemFuse(recompute=2).recompute) is float


def test_fuse_false_keeps_torchcompile_and_true_replaces_it():
    """The replacement reads the validated value: with fuse=False torchcompile's fusion stays (before,
    fuse=0 passed the check as False but acted as 'not False', taking torchcompile away for nothing)."""
    def executors(t):
        jf = thunder.jit(lambda x: (x.sin() * 2).cos(), executors=["torchcompile"], transforms=[t])
        jf(torch.randn(8))
        return [e.name for e in thunder.compile_data(jf).executors_list]

    assert "torchcompile" in executors(MemFuse(fuse=False)) and "memfuse" not in executors(MemFuse(fuse=False))
    replaced = executors(MemFuse(replace_fusion=True))
    assert "memfuse" in replaced and not set(GENERAL_FUSION_EXECUTORS) & set(replaced)


@pytest.mark.parametrize("value, off", [("", False), ("1", False), ("on", False), ("TRUE", False), ("yes", False),
                                        ("0", True), ("off", True), (" False ", True), ("no", True)])
def test_thunder_memfuse_on_and_off_values(monkeypatch, value, off):
    monkeypatch.setenv(_options.ENV, value)
    assert _options.disabled() is off


@pytest.mark.parametrize("value", ["maybe", "2", "disable", "n"])
def test_any_other_thunder_memfuse_value_is_an_error_at_compilation(monkeypatch, value):
    monkeypatch.setenv(_options.ENV, value)
    jf = thunder.jit(lambda x: x.sin() + 1, transforms=[tm.memfuse])
    with pytest.raises(ValueError, match=rf"THUNDER_MEMFUSE='{value}': use THUNDER_MEMFUSE=0 .* to turn memfuse off"):
        jf(torch.randn(4))


def test_the_recompute_budget_is_exact_and_clamped_to_the_planners_int64():
    from thunder.core.proxies import TensorProxy
    from thunder.core.trace import TraceCtx, tracectx
    import thunder.torch as ltorch

    trace = TraceCtx()
    with tracectx(trace):
        a = TensorProxy(shape=(2**31, 2**30), device=thunder.devices.cpu, dtype=thunder.dtypes.float32)
        ltorch.sin(a)  # writes 2**63 bytes
    bsyms = trace.bound_symbols
    assert _recompute.budget_bytes(bsyms, _options.MAX_SHARE) == _recompute.BUDGET_MAX
    assert _recompute.budget_bytes(bsyms, 0.25) == 2**61  # exact, no float rounding
    assert _recompute.budget_bytes(bsyms, False) == 0


@pytest.mark.parametrize("arg", ["recompute", "peak_allowance", "_dp_max_ops", "_recompute_passes", "_dp_max_bytes"])
def test_plan_argument_errors_name_the_argument(arg):
    ops, vb = [([0], [1]), ([1], [2])], [4, 4, 4]
    kw = dict(graph_inputs=[0], graph_outputs=[2])
    for bad, err in ((1.5, TypeError), (True, TypeError), ("3", TypeError), (-1, ValueError), (2**70, ValueError)):
        with pytest.raises(err, match=rf"^{arg} must be"):
            _C.plan(ops, vb, **kw, **{arg: bad})


def test_simulate_reproduces_plans_with_epilogue_pairs():
    """plan()'s peak from simulate() with the plan's groups, fusible and epilogues, on random graphs with
    extern (stored) heads; without the epilogues some of these peaks differ, which the test also checks."""
    rng = random.Random(31)
    pairs = differ = 0
    for _ in range(400):
        spec = random_graph(rng, max_ops=7)
        spec["fusible"] = [rng.choice([0, 1, 2]) for _ in spec["ops"]]
        g = Graph(**{k: v for k, v in spec.items()})
        cands = [(v, g.producer[x]) for v, (ins, _) in enumerate(spec["ops"]) for x in ins
                 if x in g.producer and g.producer[x] != v]
        epilogues = sorted(dict(rng.sample(cands, min(len(cands), 2))).items())
        p = tm.plan(**spec, epilogues=epilogues)
        common = dict(graph_inputs=spec["graph_inputs"], graph_outputs=spec["graph_outputs"],
                      aliases=spec["aliases"], fusible=spec["fusible"])
        sim = tm.simulate(spec["ops"], spec["value_bytes"], p.order, p.groups, epilogues=epilogues, **common)[0]
        assert sim == p.peak_bytes
        if "epilogue" in p.kinds:
            pairs += 1
            without = tm.simulate(spec["ops"], spec["value_bytes"], p.order, p.groups, **common)[0]
            differ += without != p.peak_bytes
    assert pairs > 20 and differ > 0, (pairs, differ)


def test_simulate_checks_its_epilogues_like_plan():
    ops, vb = [([0], [1]), ([1], [2])], [4, 4, 4]
    with pytest.raises(ValueError, match="epilogue_of 0 is not another op"):
        tm.simulate(ops, vb, [0, 1], graph_inputs=[0], graph_outputs=[2], epilogues=[(0, 0)])
    with pytest.raises(TypeError, match="epilogues"):
        tm.simulate(ops, vb, [0, 1], graph_inputs=[0], graph_outputs=[2], epilogues=5)
    assert math.isfinite(tm.simulate(ops, vb, [0, 1], graph_inputs=[0], graph_outputs=[2], epilogues=[(1, 0)])[0])


@pytest.mark.skipif(not __import__("thunder_memfuse.regions.torchcompile", fromlist=["x"]).available(False),
                    reason="torch.compile cannot build here (no C++ compiler)")
def test_the_timeline_simulates_the_planned_peak_with_its_epilogue_pairs():
    """The graph a trace keeps for reports carries its epilogue pairs, so report()'s timeline (and
    plot_timeline, which draws it) simulates the plan's own peak; on the seed with torchcompile the plan
    forms epilogue pairs, and without them the simulation would count each pair's pre-activation."""
    from thunder_memfuse.reports import _report
    from benchmarks.seed import memory_peak_inefficient_func

    torch.manual_seed(0)
    t0s, a = [torch.randn(64, 64) for _ in range(6)], torch.randn(64, 64)
    jf = thunder.jit(memory_peak_inefficient_func, executors=["torchcompile"], transforms=[tm.memfuse])
    jf(t0s, a)
    info = next(t for t in reversed(thunder.last_traces(jf)) if getattr(t, "_memfuse_info", None))._memfuse_info
    assert "epilogue" in info["plan"]["kinds"] and info["graph"]["epilogues"]
    _, after = _report._schedules(info)
    assert after[0] == info["plan"]["peak_bytes"] == tm.report(jf)["forward"]["peak_after_bytes"]
    g = dict(info["graph"], epilogues=())
    assert _report._schedules(dict(info, graph=g))[1][0] > info["plan"]["peak_bytes"]
