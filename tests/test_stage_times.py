"""report(jfn)[trace]["time_ms"]: memfuse's own time on each trace by stage (issue 32): reading, planning,
regrouping, and on a forward the joint trace's fusion pass where memfuse ran it.  The stages other than the
fusion pass add up to plan_ms, the pass's whole time on the trace."""
import pytest
import torch
import thunder

import thunder_memfuse as tm
from thunder_memfuse.regions import torchcompile as tc

from models import checkpointed_mlp


def _step(jm, model):
    x = torch.randn(8, 64)
    jm(x).square().mean().backward()


@pytest.mark.parametrize("executors", [None, pytest.param(["torchcompile"], marks=pytest.mark.skipif(
    not tc.available(False), reason="torch.compile cannot build here (no C++ compiler)"))], ids=["thunder", "torchcompile"])
def test_time_by_stage_adds_up(executors):
    model = checkpointed_mlp(d=64, layers=2)
    jm = thunder.jit(model, transforms=[tm.memfuse], **({"executors": executors} if executors else {}))
    _step(jm, model)
    r = tm.report(jm)
    for kind in ("forward", "backward"):
        stages = r[kind]["time_ms"]
        assert {"reading", "planning", "regrouping"} <= set(stages)
        assert all(v >= 0 for v in stages.values())
        own = sum(v for k, v in stages.items() if k not in ("fusion pass", "saved set"))
        assert own == pytest.approx(r[kind]["plan_ms"], abs=0.01)
        assert r[kind]["plan_ms"] > 0
    # the joint trace's fusion pass is memfuse's only where it replaced torchcompile's
    assert ("fusion pass" in r["forward"]["time_ms"]) == bool(executors)
    assert "fusion pass" not in r["backward"]["time_ms"]
    assert "saved set" not in r["forward"]["time_ms"]  # chosen only within a memory_budget
    if executors:  # the pass ran once, and counts once, though the forward was planned twice
        assert r["forward"].get("regions_without_allowance") is not None  # regrouped: a second plan
        once = thunder.compile_data(jm)._memfuse_fusion_pass_ms
        assert r["forward"]["time_ms"]["fusion pass"] == pytest.approx(once, abs=0.01)
    text = tm.format_report(jm)
    assert text.count("memfuse's time: reading") == 2
