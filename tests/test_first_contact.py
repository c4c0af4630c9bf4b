"""What a person at the keyboard meets first (issue 34): supported versions stated and enforced,
import failures that name their cause, warning filters that work whenever they are set, misuse
that names the fix, the reorder-only mode called that."""
import os
import subprocess
import sys
import textwrap
import tomllib

import pytest

from thunder_memfuse import _versions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code, env=None, cwd=ROOT):
    full_env = dict(os.environ)
    full_env.pop(_versions.IGNORE_ENV, None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, cwd=cwd, timeout=300)


# supported versions ------------------------------------------------------------------------------

def test_the_runtime_requirement_states_the_range_the_import_enforces():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    assert _versions.TORCH_SPEC in deps, deps
    assert f"lightning-thunder=={_versions.THUNDER}" in deps
    import torch

    assert _versions.torch_supported(torch.__version__)  # the torch these tests run on


@pytest.mark.parametrize("version,ok", [("2.13.0+cpu", True), ("2.13.1", True), ("2.7.1", True),
                                        ("2.13.0a0+git1234", True), ("2.14.0", False), ("2.14.1", False),
                                        ("2.14.0.dev20260101+cpu", False), ("3.0.0", False), ("2.7.0", False),
                                        ("2.5.1+cu121", False)])
def test_torch_range(version, ok):
    assert _versions.torch_supported(version) is ok


def test_unsupported_torch_message_names_version_range_and_fix():
    (msg,) = _versions.problems("2.14.1", _versions.THUNDER)
    assert "torch 2.14.1 is installed" in msg and _versions.TORCH_SPEC in msg
    assert "cannot be imported on torch 2.14 or newer" in msg
    assert f"pip install 'torch=={_versions.TORCH_TESTED}'" in msg
    (old,) = _versions.problems("2.5.1", _versions.THUNDER)
    assert "torch 2.5.1 is installed" in old and f"needs torch {_versions.TORCH_MIN} or newer" in old
    (thunder,) = _versions.problems("2.13.0", "0.3.0")
    assert "lightning-thunder 0.3.0 is installed" in thunder and "pip install 'lightning-thunder==0.2.6'" in thunder
    assert _versions.problems("2.13.0+cpu", "0.2.6") == []
    assert "torch is not installed" in _versions.problems(None, None)[0]


@pytest.mark.parametrize("statement", ["import thunder_memfuse", "from thunder_memfuse import memfuse",
                                       "from thunder_memfuse import plan"])
def test_importing_on_an_unsupported_torch_is_an_import_error_naming_the_fix(statement):
    r = _run(f"""
        import torch
        torch.__version__ = "2.14.1"   # what pip would install as the newest torch
        try:
            {statement}
        except ImportError as e:
            print("RAISED", type(e).__name__, e)
        else:
            print("IMPORTED")
    """)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "RAISED ImportError" in out, out + r.stderr
    assert "torch 2.14.1 is installed" in out and "torch>=2.7.1,<2.14" in out
    assert "pip install 'torch==2.13.0'" in out and _versions.IGNORE_ENV in out
    assert "cannot import name" not in out


def test_the_version_check_can_be_skipped_on_request():
    r = _run("""
        import torch
        torch.__version__ = "2.14.1"
        import thunder_memfuse
        print("IMPORTED", thunder_memfuse.plan is not None)
    """, env={_versions.IGNORE_ENV: "1"})
    assert r.returncode == 0 and "IMPORTED True" in r.stdout, r.stderr


def test_a_failing_lazy_import_names_its_real_cause(tmp_path):
    # a Thunder whose import fails as Thunder 0.2.6's does on a torch it does not support
    fake = tmp_path / "thunder"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise AttributeError(\"'builtin_function_or_method' object has no "
                                      "attribute '__func__'\")\n")
    r = _run(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        try:
            from thunder_memfuse import memfuse
        except ImportError as e:
            print("RAISED", type(e).__name__, e)
            print("CAUSE", type(e.__cause__).__name__)
        else:
            print("IMPORTED")
    """)
    assert r.returncode == 0, r.stderr
    assert "RAISED ImportError thunder_memfuse.memfuse could not be loaded" in r.stdout, r.stdout + r.stderr
    assert "AttributeError: 'builtin_function_or_method' object has no attribute '__func__'" in r.stdout
    assert "CAUSE AttributeError" in r.stdout
    assert "cannot import name" not in r.stdout


# warnings ----------------------------------------------------------------------------------------

def _memfuse_warnings(rec):
    import thunder_memfuse as tm

    return [w for w in rec if issubclass(w.category, tm.MemFuseWarning)]


def test_an_error_filter_set_after_the_first_warning_still_fires():
    import warnings

    import thunder
    import torch

    import thunder_memfuse as tm
    from thunder_memfuse import MemFuse, regions

    regions.reset_warnings()
    x = torch.randn(8)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("default", tm.MemFuseWarning)
        thunder.jit(lambda t: t.sin() * 2, transforms=[MemFuse(kernels="nvrtc")])(x)
        thunder.jit(lambda t: t.cos() * 2, transforms=[MemFuse(kernels="nvrtc")])(x)  # said once
    assert len(_memfuse_warnings(rec)) == 1
    with warnings.catch_warnings():  # as the README offers it, after the first occurrence
        warnings.filterwarnings("error", category=tm.MemFuseWarning)
        with pytest.raises(tm.MemFuseWarning, match=r"kernels='nvrtc' cannot build regions"):
            thunder.jit(lambda t: t.tan() * 2, transforms=[MemFuse(kernels="nvrtc")])(x)
        with pytest.raises(tm.MemFuseWarning):  # "error" asks for every occurrence
            thunder.jit(lambda t: t.exp() * 2, transforms=[MemFuse(kernels="nvrtc")])(x)
    with warnings.catch_warnings(record=True) as rec:  # an "ignore" in between does not use up the warning
        warnings.simplefilter("ignore", tm.MemFuseWarning)
        thunder.jit(lambda t: t.sinh() * 2, transforms=[MemFuse(kernels="nvrtc")])(x)
        warnings.simplefilter("default", tm.MemFuseWarning)
        thunder.jit(lambda t: t.cosh() * 2, transforms=[MemFuse(kernels="nvrtc")])(x)
    assert len(_memfuse_warnings(rec)) == 1


def test_a_warning_filter_matches_the_users_line_and_module():
    import warnings

    from thunder_memfuse import errors

    errors.forget_said()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("default")
        # a filter for another module leaves the warning said once; one for this module makes it an error
        warnings.filterwarnings("error", category=errors.MemFuseWarning, module="some_other_module")
        errors.warn("memfuse: test once", once="test-key")
        errors.warn("memfuse: test once", once="test-key")
        assert len(_memfuse_warnings(rec)) == 1 and rec[-1].filename == __file__
        warnings.filterwarnings("error", category=errors.MemFuseWarning, module=__name__)
        with pytest.raises(errors.MemFuseWarning, match="test once"):
            errors.warn("memfuse: test once", once="test-key")
    errors.forget_said()


# --device cuda without CUDA ----------------------------------------------------------------------

@pytest.mark.parametrize("build,said", [(None, "is a build without CUDA"),
                                        ("12.8", "no CUDA device is visible")])
def test_seed_on_cuda_without_cuda_says_so(monkeypatch, capsys, build, said):
    import torch

    from benchmarks import seed

    monkeypatch.setattr(torch.version, "cuda", build)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exc:
        seed.main(["--device", "cuda"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--device cuda: " in err and said in err and "Run without --device" in err
    assert "AssertionError" not in err


# reorder-only is not a fallback ------------------------------------------------------------------

def _seed_jit(**kw):
    import thunder
    import torch

    from benchmarks.seed import memory_peak_inefficient_func

    torch.manual_seed(0)
    t0s, a = [torch.randn(32, 32) for _ in range(4)], torch.randn(32, 32)
    jf = thunder.jit(memory_peak_inefficient_func, **kw)
    jf(t0s, a)
    return jf


def test_plain_jit_on_cpu_is_called_reorder_only(caplog):
    import logging

    import thunder_memfuse as tm
    from thunder_memfuse import MemFuse, memfuse

    with caplog.at_level(logging.INFO, logger="thunder_memfuse"):
        jf = _seed_jit(transforms=[memfuse])
    rep = tm.report(jf)["forward"]
    assert rep["kernels"] == "reorder-only" and rep["regions_after"] == 0
    text = tm.format_report(jf)
    assert "(reorder-only)" in text and "reorder-only: memfuse reorders the ops" in text
    assert "fallback" not in text.split("terms:")[0]
    planned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("planned forward")]
    assert planned and "(reorder-only)" in planned[-1] and "fallback" not in planned[-1]
    assert tm.report(_seed_jit(transforms=[MemFuse(fuse=False)]))["forward"]["kernels"] == "reorder-only"
    assert tm.report(_seed_jit(transforms=[MemFuse(kernels="fallback")]))["forward"]["kernels"] == "reorder-only"


def test_a_compiler_that_runs_or_fails_keeps_its_name():
    import warnings

    import thunder_memfuse as tm
    from thunder_memfuse import MemFuse, memfuse, regions

    compiled = tm.report(_seed_jit(executors=["torchcompile"], transforms=[memfuse]))["forward"]
    assert compiled["kernels"] == "torchcompile" and compiled["regions_after"] > 0
    regions.reset_warnings()
    with warnings.catch_warnings(record=True):  # nvrtc wanted on a CPU trace: a real fallback, warned
        warnings.simplefilter("always")
        failed = _seed_jit(transforms=[MemFuse(kernels="nvrtc")])
    assert tm.report(failed)["forward"]["kernels"] == "fallback"


# misuse names the fix ----------------------------------------------------------------------------

def test_transforms_not_a_list_names_the_fix():
    import thunder
    import torch

    from thunder_memfuse import MemFuse, memfuse

    fix = r"transforms=memfuse\) passes one transform where thunder.jit takes a list: use transforms=\[memfuse\]"
    with pytest.raises(TypeError, match=fix):
        thunder.jit(lambda t: t.sin(), transforms=memfuse)(torch.randn(3))
    with pytest.raises(TypeError, match=fix):  # a module: Thunder iterates the transforms
        thunder.jit(torch.nn.Linear(3, 3), transforms=MemFuse(fuse=False))


def test_memfuse_as_a_torch_compile_backend_or_a_decorator_names_the_fix():
    import torch

    from thunder_memfuse import memfuse

    with pytest.raises(Exception, match=r"not a torch.compile backend; use thunder.jit\(fn, transforms=\[memfuse\]\)"):
        torch.compile(lambda t: t.sin() + 1, backend=memfuse)(torch.randn(3))
    with pytest.raises(TypeError, match=r"not a function or a decorator to call; use thunder.jit\(fn, transforms="):
        memfuse(lambda t: t)


@pytest.mark.parametrize("kw,fix", [
    (dict(kernels="torchcompile"), r"transforms=\[MemFuse\(kernels='torchcompile'\)\]"),
    (dict(memfuse=False), r"memfuse runs because it is in transforms="),
    (dict(memfuse=True, recompute=False), r"transforms=\[MemFuse\(recompute=False\)\]"),
])
def test_memfuse_options_given_to_thunder_jit_name_the_fix(kw, fix):
    import thunder
    import torch

    from thunder_memfuse import memfuse

    with pytest.raises(TypeError, match=r"thunder.jit does not know these options and would ignore them; .*" + fix):
        thunder.jit(lambda t: t.sin(), transforms=[memfuse], **kw)(torch.randn(3))
    thunder.jit(lambda t: t.sin(), transforms=[memfuse], fusion_type="dataflow")(torch.randn(3))  # Thunder's own


# savings: eager beside Thunder, the spread of step times, progress ---------------------------------

def _inplace_chain(x):  # eager updates y in place; Thunder's functional trace allocates a new tensor per step
    y = x * 2
    y.add_(1)
    y.mul_(3)
    return y.sub_(x)


def test_savings_measures_eager_and_the_spread_of_step_times(capsys):
    import torch

    from thunder_memfuse.measure import savings

    s = savings(_inplace_chain, torch.randn(256, 256), iters=3, progress=False)
    names = [r.name for r in s.runs()]
    assert names == ["eager", "thunder", "thunder + memfuse"] and s.eager is s.runs()[0] and s.rounds == 3
    for r in s.runs():
        assert r.error is None and r.peak_bytes > 0 and r.first_call_ms > 0
        assert 0 < r.step_ms_min <= r.step_ms <= r.step_ms_max
    printed = capsys.readouterr()
    assert printed.err == ""  # progress off
    assert f"| eager | {s.eager.peak_bytes / 2**20:.2f} MiB | {s.eager.step_ms_min:.2f} / " in printed.out
    assert "step min / median / max (3 rounds)" in printed.out
    line = s.summary()
    assert f"eager PyTorch {s.eager.peak_bytes / 2**20:.2f} MiB" in line and "medians of 3 alternating rounds" in line
    above = s.with_memfuse.peak_bytes - s.eager.peak_bytes
    assert s.above_eager_bytes == max(0, above)
    # said plainly where memfuse's peak is above eager's, and only there
    assert ("ABOVE eager's" in line) == (above > 0) and ("still peaks above eager PyTorch" in str(s)) == (above > 0)


def test_savings_says_plainly_when_memfuse_is_above_eager():
    from thunder_memfuse.savings import Run, Savings

    mib = 2 ** 20
    runs = dict(without=Run("thunder", 22 * mib, 10.0, 1000.0, step_ms_min=9.0, step_ms_max=30.0),
                with_memfuse=Run("thunder + memfuse", 16 * mib, 11.0, 1200.0, step_ms_min=10.0, step_ms_max=12.0))
    s = Savings(**runs, results_match=True, executors=None, measured_by="x", rounds=5,
                eager=Run("eager", 13 * mib, 5.0, 5.0, step_ms_min=4.0, step_ms_max=6.0))
    assert s.above_eager_bytes == 3 * mib
    assert "eager PyTorch 13.00 MiB (memfuse's peak is ABOVE eager's by 3.00 MiB)" in s.summary()
    assert "still peaks above eager PyTorch (16.00 vs 13.00 MiB)" in str(s)
    assert "min-max 10.00-12.00 vs 9.00-30.00" in s.summary()
    below = Savings(**runs, results_match=True, executors=None, measured_by="x", rounds=5,
                    eager=Run("eager", 20 * mib, 5.0, 5.0, step_ms_min=4.0, step_ms_max=6.0))
    assert below.above_eager_bytes == 0 and "ABOVE" not in below.summary() and "still peaks" not in str(below)


def test_savings_peers_and_progress(monkeypatch, capsys):
    import torch

    from thunder_memfuse.measure import savings

    compiled = []
    # torch.compile itself is Inductor's minutes-long compile on a small CPU; the plumbing is what is tested
    monkeypatch.setattr(torch, "compile", lambda fn: compiled.append(fn) or fn)
    s = savings(lambda t: (t.relu() @ t).sum(0), torch.randn(32, 32), iters=2, peers=True, progress=True,
                print_result=False)
    assert compiled and [r.name for r in s.peers] == ["torch.compile"] and s.peers[0].peak_bytes is not None
    err = capsys.readouterr().err
    for said in ("eager: first call ...", "torch.compile: first call (compiles) ...",
                 "thunder + memfuse: first call (compiles) ...", "measuring its peak", "timing: round 1/2",
                 "timing: round 2/2", "done"):
        assert said in err, (said, err)
    assert err.index("thunder: first call") < err.index("thunder + memfuse: first call") < err.index("round 1/2")


def test_progress_follows_the_argument_then_the_environment(monkeypatch):
    from thunder_memfuse.reports import _progress

    monkeypatch.setenv(_progress.ENV, "1")
    assert _progress.enabled(None) is True and _progress.enabled(False) is False
    monkeypatch.setenv(_progress.ENV, "0")
    assert _progress.enabled(None) is False and _progress.enabled(True) is True
    monkeypatch.setenv(_progress.ENV, "maybe")
    with pytest.raises(ValueError, match=r"THUNDER_MEMFUSE_PROGRESS='maybe': use 1 .* or 0"):
        _progress.enabled(None)
    monkeypatch.delenv(_progress.ENV)
    assert _progress.enabled(None) is False  # pytest captures stderr: not a terminal
    with pytest.raises(TypeError, match="progress must be True, False or None"):
        _progress.enabled("yes")


def test_savings_command_line_progress_and_peers_flags(tmp_path):
    (tmp_path / "mystep.py").write_text(
        "import torch\n"
        "def make_step():\n"
        "    return (lambda x: (x.relu() @ x).sum(dim=0), (torch.randn(16, 16),))\n")
    env = {"PYTHONPATH": os.pathsep.join([ROOT, str(tmp_path)])}
    quiet = subprocess.run([sys.executable, "-m", "thunder_memfuse.savings", "mystep:make_step", "--iters", "2"],
                           capture_output=True, text=True, env=dict(os.environ, **env), cwd=tmp_path, timeout=600)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert "[savings" not in quiet.stderr  # stderr is a pipe here
    assert "| eager |" in quiet.stdout and "eager PyTorch" in quiet.stdout
    loud = subprocess.run([sys.executable, "-m", "thunder_memfuse.savings", "mystep:make_step", "--iters", "1",
                           "--progress"], capture_output=True, text=True, env=dict(os.environ, **env),
                          cwd=tmp_path, timeout=600)
    assert loud.returncode == 0 and "thunder + memfuse: first call (compiles) ..." in loud.stderr, loud.stderr[-2000:]
    assert "--peers" in subprocess.run([sys.executable, "-m", "thunder_memfuse.savings", "--help"],
                                       capture_output=True, text=True, env=dict(os.environ, **env)).stdout


def test_the_seed_job_says_what_it_compiles(monkeypatch, capsys):
    import torch

    from benchmarks import seed

    monkeypatch.setattr(torch, "compile", lambda fn: fn)  # the eager stand-in keeps the test short
    assert seed.main(["--paths", "2", "--size", "16", "--progress"]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("[seed")]
    assert "importing Thunder ..." in lines[0]
    for fname in ("efficient", "inefficient"):
        for v in ("torch.compile", "thunder default", "thunder + torchcompile", "memfuse", "torchcompile + memfuse"):
            assert any(f"] {fname} function, {v}: compiling and measuring ..." in ln for ln in lines), (fname, v, err)
    assert seed.main(["--paths", "2", "--size", "16", "--plan-only"]) == 0 and "[seed" not in capsys.readouterr().err


# compare's table and plot, plot_timeline's axis ---------------------------------------------------

def _checkpointed_step():
    import thunder
    import torch

    from models import checkpointed, checkpointed_mlp, module_step  # noqa: F401
    from thunder_memfuse import memfuse

    torch.manual_seed(0)
    x = torch.randn(64, 128, requires_grad=True)
    w = torch.randn(128, 128, requires_grad=True)
    jf = thunder.jit(checkpointed, transforms=[memfuse])
    jf(x, w).backward()
    return jf, x, w


def test_compare_table_and_plot_read_at_a_glance():
    pytest.importorskip("matplotlib")
    from thunder_memfuse.measure import compare

    jf, x, w = _checkpointed_step()
    c = compare(jf, x, w)
    bw = c["backward"]
    assert bw.start_simulated > 0  # the backward starts with what the forward saved
    if not c.flagged:
        assert c.table().startswith("no step differs") and "table(all_steps=True)" in c.table()
    assert c.table(all_steps=True).startswith("| trace | step |")
    fig = c.plot()
    ax = fig.axes[list(c.traces).index("backward")]
    labels = [ln.get_label() for ln in ax.get_lines()]
    sim, meas = (ln for ln in ax.get_lines() if ln.get_label().startswith(("simulated", "measured")))
    mib = 2 ** 20
    # drawn above the inputs, the start included: no negative memory, the peaks where the labels say
    assert min(sim.get_ydata()) >= 0 and min(meas.get_ydata()) >= 0
    assert max(sim.get_ydata()) == pytest.approx((bw.simulated_peak + bw.start_simulated) / mib)
    assert any(lb.startswith(f"start: {bw.start_simulated / mib:.2f} MiB (what the forward saved") for lb in labels)
    assert sim.get_linestyle() != meas.get_linestyle()  # both visible where they agree
    assert "a fusion region is one step" in ax.get_xlabel()


def test_timeline_title_counts_the_recomputed_copies():
    pytest.importorskip("matplotlib")
    import thunder_memfuse as tm

    jf, _, _ = _checkpointed_step()
    rep = tm.report(jf)
    fig = tm.plot_timeline(jf)
    for ax, (kind, r) in zip(fig.axes, rep.items()):
        copies = (r["recompute"] or {}).get("copied_ops", 0)
        title = ax.get_title()
        assert (f"{copies} of them recomputed copies" in title) == (copies > 0), (kind, title, copies)
        right = int(max(max(ln.get_xdata()) for ln in ax.get_lines() if len(ln.get_xdata()) > 1))
        assert f"({right - copies} ops" in title, (kind, title, right)  # Thunder's ops; the axis runs on to the copies
        if copies:
            assert f"memfuse's schedule runs {right}, {copies} of them" in title
