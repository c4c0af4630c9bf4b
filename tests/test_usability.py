"""What a new user meets (issue 20): option checks and misuse messages, THUNDER_MEMFUSE=0, logging,
measure.savings(), reports that agree with themselves, the public names."""
import logging
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch
import thunder

import thunder_memfuse as tm
from thunder_memfuse import MemFuse, memfuse, regions
from benchmarks.seed import memory_peak_inefficient_func

from models import checkpointed, seed_inputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20


# options ---------------------------------------------------------------------------------------

def test_contradictory_options_are_value_errors_that_name_the_fix():
    with pytest.raises(ValueError, match=r"fuse=True, kernels='fallback'.*use fuse='auto'.*kernels='torchcompile'"):
        MemFuse(fuse=True, kernels="fallback")
    with pytest.raises(ValueError, match=r"replace_fusion=True, fuse=False.*use replace_fusion=False.*fuse='auto'"):
        MemFuse(replace_fusion=True, fuse=False)
    with pytest.raises(ValueError, match=r"replace_fusion=True, kernels='fallback'.*kernels='torchcompile'"):
        MemFuse(replace_fusion=True, kernels="fallback")
    with pytest.raises(ValueError, match=r"backend='cpu' means kernels='fallback'.*drop backend="):
        MemFuse(backend="cpu", kernels="torchcompile")
    with pytest.raises(ValueError, match=r"backend='cuda' means kernels='nvrtc'"):
        MemFuse(backend="cuda", kernels="fallback")
    with pytest.raises(ValueError, match="use kernels="):
        MemFuse(backend="tpu")


def test_backend_is_folded_into_kernels():
    with pytest.warns(DeprecationWarning, match=r"MemFuse\(backend='cpu'\) is MemFuse\(kernels='fallback'\)"):
        m = MemFuse(backend="cpu")
    assert m.kernels == "fallback" and "backend" not in repr(m)
    with pytest.warns(DeprecationWarning):
        assert MemFuse(backend="cuda").kernels == "nvrtc"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert MemFuse(backend="auto", kernels="torchcompile").kernels == "torchcompile"


def test_forced_compiler_that_cannot_work_warns_once_and_raises_under_strict():
    regions.reset_warnings()
    x = torch.randn(8)
    jf = thunder.jit(lambda t: (t.sin() + 1).cos(), transforms=[MemFuse(kernels="nvrtc")])
    with pytest.warns(tm.MemFuseWarning, match=r"kernels='nvrtc' cannot build regions for this CPU trace.*"
                                               r"kernels='torchcompile'") as rec:
        jf(x)
    assert len([w for w in rec if issubclass(w.category, tm.MemFuseWarning)]) == 1
    assert tm.report(jf)["forward"]["kernels"] == "fallback"  # what ran, not what was asked for
    regions.reset_warnings()
    with warnings.catch_warnings(record=True) as rec:  # a second compilation, the same filters: no second warning
        warnings.simplefilter("default", tm.MemFuseWarning)
        thunder.jit(lambda t: t.exp() * 2, transforms=[MemFuse(kernels="nvrtc")])(x)
        thunder.jit(lambda t: t.exp() * 3, transforms=[MemFuse(kernels="nvrtc")])(x)
    assert len([w for w in rec if issubclass(w.category, tm.MemFuseWarning)]) == 1
    with pytest.raises(tm.MemFuseError, match=r"kernels='nvrtc' cannot build regions.*strict=True"):
        thunder.jit(lambda t: t.tanh() - 1, transforms=[MemFuse(kernels="nvrtc", strict=True)])(x)


def test_the_class_in_transforms_is_a_clear_type_error():
    fix = r"passes the class MemFuse, not a transform: use transforms=\[memfuse\].*transforms=\[MemFuse\(\.\.\.\)\]"
    with pytest.raises(TypeError, match=fix):
        thunder.jit(lambda t: t.sin(), transforms=[MemFuse])(torch.randn(3))
    with pytest.raises(TypeError, match=fix):  # a module: refused at thunder.jit already
        thunder.jit(torch.nn.Linear(3, 3), transforms=[MemFuse])
    assert isinstance(MemFuse(), MemFuse) and not isinstance(object(), MemFuse)


def test_two_memfuse_transforms_in_one_list_are_a_type_error():
    with pytest.raises(TypeError, match=r"holds 2 memfuse transforms.*pass one: transforms=\[memfuse\]"):
        thunder.jit(lambda t: t.sin(), transforms=[memfuse, MemFuse(fuse=False)])(torch.randn(3))
    with pytest.raises(TypeError, match="holds 2 memfuse transforms"):
        thunder.jit(lambda t: t.cos(), transforms=[memfuse, memfuse])(torch.randn(3))


# report misuse -----------------------------------------------------------------------------------

def test_report_says_why_there_is_nothing_to_report():
    def f(t):
        return t.sin() * 2

    for fn in (tm.report, tm.plot_timeline):
        who = fn.__name__
        with pytest.raises(TypeError, match=rf"{who}: expected a function returned by thunder.jit.*jit it first"):
            fn(f)
        with pytest.raises(ValueError, match=rf"{who}: this function has not run yet; call it once"):
            fn(thunder.jit(f, transforms=[memfuse]))
        plain = thunder.jit(f)
        plain(torch.randn(3))
        with pytest.raises(ValueError, match=rf"{who}: this function was compiled without memfuse.*"
                                             r"transforms=\[memfuse\]"):
            fn(plain)


def test_format_report_takes_the_jitted_function_too():
    jf = thunder.jit(lambda t: t.sin() * 2, transforms=[memfuse])
    jf(torch.randn(3))
    assert tm.format_report(jf) == tm.format_report(tm.report(jf))
    with pytest.raises(TypeError, match=r"format_report: expected report\(jfn\)'s dict"):
        tm.format_report(42)
    with pytest.raises(TypeError, match=r"not a trace of report\(jfn\)"):
        tm.format_report({"forward": 1})


def _rep(before, unfused, fused, lb, regions_after):
    return {"forward": dict(peak_before_bytes=before, peak_after_bytes=fused, unfused_peak_bytes=unfused,
                            lower_bound_bytes=lb, regions_before=0, regions_after=regions_after,
                            kernels="torchcompile", optimal=True, method="dp", states=3,
                            largest_live_at_peak=[], start_bytes=0)}


def test_format_report_puts_each_figure_beside_the_bound_of_its_model():
    text = tm.format_report(_rep(int(1.5 * MIB), int(1.5 * MIB), MIB, int(1.5 * MIB), 3), explain=False)
    assert "peak unfused 1.50 -> 1.50 MiB (lower bound 1.50), fused 1.00 MiB (3 regions, torchcompile)" in text
    # never a result right before a "lower bound" above it
    for after, bound in re.findall(r"-> ([\d.]+) MiB \(lower bound ([\d.]+)\)", text):
        assert float(after) >= float(bound)
    text = tm.format_report(_rep(int(2.75 * MIB), int(0.75 * MIB), int(0.75 * MIB), int(0.75 * MIB), 0),
                            explain=False)
    assert text.startswith("forward: peak 2.75 -> 0.75 MiB (lower bound 0.75)")


def _legend(fig):
    return [t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()]


@pytest.mark.parametrize("case", ["seed", "checkpointed"])
def test_report_compare_and_plot_give_the_same_peak(case):
    pytest.importorskip("matplotlib")
    from thunder_memfuse.measure import compare

    if case == "seed":
        t0s, a = seed_inputs(n=6, size=64)
        jf, args = thunder.jit(memory_peak_inefficient_func, transforms=[memfuse]), (list(t0s), a)
    else:
        x, w = torch.randn(32, 64, requires_grad=True), torch.randn(64, 64, requires_grad=True)
        jf, args = thunder.jit(checkpointed, transforms=[memfuse]), (x, w)
    out = jf(*args)
    if case != "seed":
        out.backward()
    rep = tm.report(jf)
    cmp = compare(jf, *args)
    legend = " ".join(_legend(tm.plot_timeline(jf)))
    assert set(rep) == set(cmp.traces) == ({"forward"} if case == "seed" else {"forward", "backward"})
    for kind, r in rep.items():
        assert cmp[kind].simulated_peak == r["peak_above_start_bytes"], (kind, cmp.summary())
        assert cmp[kind].plan_peak == r["peak_above_start_bytes"]
        assert f"memfuse, simulated (peak {r['peak_after_bytes'] / MIB:.2f} MiB" in legend
    assert "report() gives the same peak" in cmp.summary()
    # docs/API.md "A trace's peak": the headline figures of format_report and compare's summary are one
    # figure, the start counted (a backward's saved storages and incoming gradients)
    text, summary = tm.format_report(jf), cmp.summary()
    for kind, r in rep.items():
        figure = f"{r['peak_after_bytes'] / MIB:.2f} MiB"
        head = next(line for line in text.splitlines() if line.startswith(kind + ":"))
        assert figure in head, (head, figure)
        line = next(x for x in summary.splitlines() if x.startswith(kind + ":"))
        assert f"peak simulated {figure}" in line and f"report() gives the same peak ({figure})" in line, line
        if r["start_bytes"]:
            assert f"above the start of {r['start_bytes'] / MIB:.2f} MiB" in line
    # with the measurement: a third curve per trace, the profiler's, whose peak is compare()'s
    fig = tm.plot_timeline(jf, measured=cmp)
    for ax, (kind, t) in zip(fig.axes, cmp.traces.items()):
        labels = [x.get_text() for x in ax.get_legend().get_texts()]
        meas = [x for x in labels if x.startswith("memfuse, measured")]
        assert meas and f"peak {(t.measured_peak + t.start_simulated) / MIB:.2f} MiB" in meas[0], labels
        assert "measured" in ax.get_title()
    if case == "seed":
        assert rep["forward"]["peak_after_bytes"] == 3 * 64 * 64 * 4


def test_compare_says_one_tensor_not_one_tensors():
    from thunder_memfuse.reports._compare import Comparison, TraceComparison

    t = TraceComparison("backward", [], 0, 4, saved_simulated=4, saved_storages_measured=4, saved_tensors_measured=1)
    text = Comparison({"backward": t}).summary()
    assert "saved 1 tensor in distinct storage of" in text and "1 tensors" not in text
    t.saved_tensors_measured = 3
    assert "saved 3 tensors in distinct storages" in Comparison({"backward": t}).summary()


# THUNDER_MEMFUSE=0 -----------------------------------------------------------------------------

def _no_provenance(trace):
    return "\n".join(line for line in str(trace).splitlines() if not line.startswith("# Constructed by"))


def test_thunder_memfuse_0_leaves_traces_untouched(monkeypatch):
    t0s, a = seed_inputs(n=4, size=32)
    plain = thunder.jit(memory_peak_inefficient_func)
    plain(list(t0s), a)
    monkeypatch.setenv("THUNDER_MEMFUSE", "0")
    off = thunder.jit(memory_peak_inefficient_func, executors=["torchcompile"],
                      transforms=[MemFuse(replace_fusion=True)])
    plain_tc = thunder.jit(memory_peak_inefficient_func, executors=["torchcompile"])
    off_default = thunder.jit(memory_peak_inefficient_func, transforms=[memfuse])
    torch.testing.assert_close(off_default(list(t0s), a), plain(list(t0s), a))
    assert _no_provenance(thunder.last_traces(off_default)[-1]) == _no_provenance(thunder.last_traces(plain)[-1])
    assert all(getattr(t, "_memfuse_info", None) is None for t in thunder.last_traces(off_default))
    with pytest.raises(ValueError, match=r"memfuse is turned off in this process \(THUNDER_MEMFUSE='0'\)"):
        tm.report(off_default)
    # the executors stay too (torchcompile not replaced), without compiling anything here
    from thunder.core.compile_data import compile_data_and_stats

    cd = thunder.compile_data(off)
    with compile_data_and_stats(cd, None):
        assert MemFuse(replace_fusion=True).transform_traces_pre_prologue("p", "c", "e") == ("p", "c", "e")
    names = [e.name for e in cd.executors_list]
    assert "torchcompile" in names and "memfuse" not in names
    assert names[1:] == [e.name for e in thunder.compile_data(plain_tc).executors_list][1:]
    monkeypatch.setenv("THUNDER_MEMFUSE", "1")
    on = thunder.jit(memory_peak_inefficient_func, transforms=[memfuse])
    on(list(t0s), a)
    assert tm.report(on)["forward"]["peak_after_bytes"] < tm.report(on)["forward"]["peak_before_bytes"]


# logging -----------------------------------------------------------------------------------------

def test_logging_through_the_thunder_memfuse_logger(caplog, monkeypatch):
    t0s, a = seed_inputs(n=4, size=32)
    with caplog.at_level(logging.DEBUG, logger="thunder_memfuse"):
        thunder.jit(memory_peak_inefficient_func, transforms=[memfuse])(list(t0s), a)
    plans = [r for r in caplog.records if r.name == "thunder_memfuse" and r.levelno == logging.INFO]
    assert plans and re.search(r"planned forward trace .*peak [\d.]+ -> [\d.]+ MiB unfused.* took [\d.]+ ms",
                               plans[0].getMessage()), [r.getMessage() for r in plans]
    caplog.clear()
    from thunder_memfuse.integration import _planning

    monkeypatch.setattr(_planning, "plan_trace", lambda *a, **k: (_ for _ in ()).throw(ValueError("injected")))
    with caplog.at_level(logging.INFO, logger="thunder_memfuse"), pytest.warns(tm.MemFuseWarning, match="injected"):
        thunder.jit(lambda t: t.cos() * 5, transforms=[MemFuse()])(torch.randn(4))
    fallbacks = [r for r in caplog.records if r.levelno == logging.WARNING and "injected" in r.getMessage()]
    assert fallbacks and "left trace" in fallbacks[0].getMessage()
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("thunder_memfuse").handlers)


def test_logging_names_the_regions(caplog):
    from thunder_memfuse.integration.transform import _log_plan

    class B:  # the bound symbols' names are all _log_plan reads of a group
        def __init__(self, n):
            self.sym = type("S", (), {"name": n})()

    plan = dict(baseline_peak_bytes=2 * MIB, unfused_peak_bytes=MIB, lower_bound_bytes=MIB, peak_bytes=MIB // 2,
                optimal=True, method="dp")
    with caplog.at_level(logging.DEBUG, logger="thunder_memfuse"):
        _log_plan(None, False, plan, "torchcompile", 1, [[B("relu"), B("matmul")], [B("add")]], 1.5)
    msgs = [r.getMessage() for r in caplog.records]
    assert any("1 regions (torchcompile)" in m and "took 1.5 ms" in m for m in msgs)
    assert any("region 0 (torchcompile): relu matmul" in m for m in msgs)


# savings -------------------------------------------------------------------------------------------

def test_savings_on_the_seed_with_torchcompile(capsys):
    from thunder_memfuse.measure import savings

    t0s, a = seed_inputs()  # 10 paths of 256x256
    s = savings(memory_peak_inefficient_func, list(t0s), a, executors=["torchcompile"], iters=2)
    assert s.with_memfuse.peak_bytes == int(0.75 * MIB), s
    assert s.without.peak_bytes == int(2.75 * MIB), s
    assert s.results_match is True and s.saved_bytes == 2 * MIB
    line = s.summary()
    assert line.startswith("memfuse: peak 0.75 MiB vs 2.75 MiB without (-2.00 MiB, -73%)")
    assert "outputs match (executors: torchcompile)" in line and "\n" not in line
    assert s.with_memfuse.step_ms > 0 and s.without.first_call_ms > 0
    printed = capsys.readouterr().out
    assert line in printed and "| thunder (torchcompile) | 2.75 MiB |" in printed
    assert tm.format_report(s) == line


def test_savings_misuse_and_format_report_line():
    from thunder_memfuse.measure import savings

    f = lambda t: t.sin()  # noqa: E731
    with pytest.raises(TypeError, match="not thunder.jit's result: savings jits it twice"):
        savings(thunder.jit(f), torch.randn(3))
    with pytest.raises(TypeError, match="memfuse must be a MemFuse instance"):
        savings(f, torch.randn(3), memfuse=MemFuse)
    with pytest.raises(ValueError, match="iters must be an int >= 1"):
        savings(f, torch.randn(3), iters=0)
    s = savings(f, torch.randn(3), iters=1, print_result=False)
    jf = thunder.jit(f, transforms=[memfuse])
    jf(torch.randn(3))
    assert tm.format_report(jf, savings=s, explain=False).splitlines()[0] == s.summary()


def test_savings_command_line(tmp_path):
    (tmp_path / "mystep.py").write_text(
        "import torch\n"
        "def make_step():\n"
        "    return (lambda x: (x.relu() @ x).sum(dim=0), (torch.randn(16, 16),))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, str(tmp_path)]))
    p = subprocess.run([sys.executable, "-m", "thunder_memfuse.savings", "mystep:make_step", "--iters", "1"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert re.search(r"^memfuse: peak [\d.]+ MiB vs [\d.]+ MiB without .*outputs match", p.stdout, re.M), p.stdout
    p = subprocess.run([sys.executable, "-m", "thunder_memfuse.savings", "nocolon"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=600)
    assert p.returncode != 0 and "expected MODULE:FUNCTION" in p.stderr


# public names and docs -----------------------------------------------------------------------------

def test_dir_lists_the_lazy_names():
    names = dir(tm)
    for n in ("memfuse", "MemFuse", "report", "format_report", "plot_timeline", "plan"):
        assert n in names, n


def test_measure_docstrings_say_what_they_return():
    from thunder_memfuse import measure

    assert "(peak, result)" in measure.cpu_peak_bytes.__doc__
    assert "(peak, result)" in measure.cuda_peak_bytes.__doc__


def test_every_thunder_memfuse_name_cited_in_notebooks_and_docs_exists():
    import importlib
    import json

    cited = set()
    files = [os.path.join(ROOT, "notebooks", f) for f in os.listdir(os.path.join(ROOT, "notebooks"))
             if f.endswith(".ipynb")]
    files += [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "docs", "API.md")]
    for path in files:
        text = open(path).read()
        if path.endswith(".ipynb"):
            text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"])
        cited |= {(os.path.basename(path), m) for m in re.findall(r"thunder_memfuse(?:\.[A-Za-z_]\w*)+", text)}
    assert cited
    for where, name in sorted(cited):
        parts = name.split(".")
        obj, i = None, len(parts)
        while i > 0:  # the longest importable module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
                break
            except ImportError:
                i -= 1
        for attr in parts[i:]:
            assert hasattr(obj, attr), f"{where} cites {name}, which does not exist"
            obj = getattr(obj, attr)


def test_api_page_documents_every_public_name_and_option():
    import inspect

    text = open(os.path.join(ROOT, "docs", "API.md")).read()
    for name in tm.__all__:
        assert f"`{name}" in text, name
    for opt, p in inspect.signature(MemFuse).parameters.items():
        if not opt.startswith("_"):
            assert f"`{opt}`" in text and f"{p.default!r}" in text, opt
    from thunder_memfuse import measure

    for name in ("savings", "compare", "cpu_peak_bytes", "cuda_peak_bytes", "cpu_memory_timeline",
                 "trace_peak_bytes"):
        assert hasattr(measure, name) and f"measure.{name}" in text, name
    assert "THUNDER_MEMFUSE" in text and 'getLogger("thunder_memfuse")' in text
