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

    from thunder_memfuse import seed

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

    from thunder_memfuse.seed import memory_peak_inefficient_func

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
