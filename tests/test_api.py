"""The package's API conventions: error and warning categories, where warnings
point, the report's names and legend, the plot functions, and the import-shim
.pth (import thunder first; silent when its module is gone)."""
import inspect
import os
import subprocess
import sys
import warnings

import pytest
import torch
import thunder

import thunder_memfuse as tm
from thunder_memfuse import MemFuse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_error_and_warning_categories():
    assert issubclass(tm.MemFuseError, RuntimeError)
    assert issubclass(tm.KernelCompileError, tm.MemFuseError)  # the C binding's error shares the base
    assert tm.MemFuseError is tm._C.MemFuseError
    from thunder_memfuse.integration import transform

    assert transform.MemFuseError is tm.MemFuseError  # one error type, whichever module raises it
    assert issubclass(tm.MemFuseWarning, RuntimeWarning)
    assert {"MemFuseError", "MemFuseWarning", "KernelCompileError"} <= set(tm.__all__)


def _broken_planner(monkeypatch):
    from thunder_memfuse.integration import _planning

    def broken(*a, **k):
        raise ValueError("injected")

    monkeypatch.setattr(_planning, "plan_trace", broken)


def test_fallback_warning_points_at_the_callers_line(monkeypatch):
    _broken_planner(monkeypatch)
    x = torch.randn(4)
    jf = thunder.jit(lambda t: t.cos() * 3, transforms=[MemFuse()])
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        out = jf(x)
    torch.testing.assert_close(out, x.cos() * 3)
    ours = [w for w in rec if issubclass(w.category, tm.MemFuseWarning)]
    assert ours and "injected" in str(ours[0].message)
    assert ours[0].filename == __file__ and ours[0].lineno == line


def test_strict_raises_memfuse_error(monkeypatch):
    _broken_planner(monkeypatch)
    with pytest.raises(tm.MemFuseError, match="injected"):
        thunder.jit(lambda t: t.cos() * 4, transforms=[MemFuse(strict=True)])(torch.randn(4))


def test_warning_filter_by_category(monkeypatch):
    _broken_planner(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tm.MemFuseWarning)
        with pytest.raises(tm.MemFuseWarning):
            thunder.jit(lambda t: t.cos() * 5, transforms=[MemFuse()])(torch.randn(4))


def _step(x, w):
    h = torch.relu(x @ w)
    k = torch.sin(h) * 2
    return (k @ w).sum()


def _jitted_step():
    torch.manual_seed(0)
    x = torch.randn(32, 32, requires_grad=True)
    w = torch.randn(32, 32, requires_grad=True)
    jf = thunder.jit(_step, transforms=[MemFuse()])
    jf(x, w).backward()
    return jf


def test_report_names_tensors_by_source_line_and_explains_terms():
    rep = tm.report(_jitted_step())
    fwd = rep["forward"]["largest_live_at_peak"]
    assert fwd and all(len(item) == 3 for item in fwd)
    assert any("test_api.py:" in where for _, _, where in fwd), fwd
    # a backward's saved tensors carry the forward's line
    bwd = rep["backward"]["largest_live_at_peak"]
    assert any(where.startswith("saved: ") and "test_api.py:" in where for _, _, where in bwd), bwd
    text = tm.format_report(rep)
    assert "test_api.py:" in text and "terms:" in text and "lower bound:" in text
    for method in {r["method"] for r in rep.values()}:
        assert f"    {method}: " in text
    assert "terms:" not in tm.format_report(rep, explain=False)
    assert tm.format_report.__doc__ and "report(" in tm.format_report.__doc__


def test_plots_return_figures_save_only_on_request_and_keep_the_backend(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib
    from matplotlib.figure import Figure

    backend = matplotlib.get_backend()
    jf = _jitted_step()
    before = set(os.listdir(tmp_path))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        fig = tm.plot_timeline(jf)
    finally:
        os.chdir(cwd)
    assert isinstance(fig, Figure) and set(os.listdir(tmp_path)) == before
    assert len(fig.axes) == 2  # forward and backward
    labels = [t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()]
    assert all("simulated" in lab or "lower bound" in lab for lab in labels), labels
    png = tmp_path / "t.png"
    assert isinstance(tm.plot_timeline(jf, str(png)), Figure) and png.stat().st_size > 1000
    cmp_png = tmp_path / "c.png"
    fig = tm.plot_comparison({"eager": {"peak_mib": 2.0, "time_ms": 1.0}, "memfuse": {"peak_bytes": 1 << 20}},
                             str(cmp_png), measured_by="torch.profiler allocations")
    assert cmp_png.stat().st_size > 1000
    assert "torch.profiler allocations" in fig.axes[0].get_xlabel()
    assert "measured" in fig.axes[1].get_xlabel()
    from thunder_memfuse.plot import plot_memory_over_time

    fig = plot_memory_over_time({"eager": ([0.0, 1.0, 2.0], [0, 1 << 20, 0])})
    assert "measured" in fig.axes[0].get_legend().get_texts()[0].get_text()
    assert matplotlib.get_backend() == backend
    with pytest.raises(ValueError, match="no results"):
        tm.plot_comparison({})


def test_plots_without_matplotlib_say_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)  # import matplotlib.pyplot fails
    with pytest.raises(ImportError, match=r"thunder_memfuse\[plot\]"):
        tm.plot_comparison({"eager": {"peak_mib": 1.0}})


def _python(code, **kw):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=kw.get("cwd", "/"),
                          env=env, timeout=120)


def test_import_thunder_first_works_in_this_install():
    r = _python("import thunder, torch; assert hasattr(torch.Tensor, 'align_as'); print('ok')")
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


def test_compat_pth_is_silent_without_its_module():
    with open(os.path.join(ROOT, "thunder_memfuse_compat.pth")) as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(lines) == 1 and lines[0].startswith("import ")  # site.py execs "import" lines only
    # what site.py does with the line, with the module gone (uninstalled)
    code = ("import sys; sys.modules['_thunder_memfuse_boot'] = None\n"
            f"exec({lines[0]!r})\nprint('started')")
    r = _python(code)
    assert r.returncode == 0 and r.stdout.strip() == "started" and r.stderr == "", r.stderr


def test_seed_job_draws_its_comparison(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from benchmarks import seed

    assert seed.main(["--paths", "2", "--size", "16", "--plot", str(tmp_path / "seed.png")]) == 0
    for fname in ("efficient", "inefficient"):
        assert (tmp_path / f"seed-{fname}.png").stat().st_size > 1000
    assert "plot: " in capsys.readouterr().out
