"""memfuse inside Thunder, end to end on CPU."""
import warnings

import pytest
import torch
import thunder

import thunder_memfuse as tm
from thunder_memfuse import MemFuse, memfuse
from thunder_memfuse.measure import cpu_peak_bytes, trace_peak_bytes
from benchmarks.seed import memory_peak_efficient_func, memory_peak_inefficient_func

from models import checkpointed, grads_of, seed_inputs
from standin import ElementwiseFusion

MIB = 1 << 20
TENSOR = 256 * 256 * 4


_seed_inputs = seed_inputs


def _memfuse_trace(jf):
    tr = thunder.last_traces(jf)[-1]
    for t in reversed(thunder.last_traces(jf)):
        if getattr(t, "_memfuse_info", None):
            return tr, t
    raise AssertionError("memfuse did not transform the trace")


@pytest.mark.parametrize("fn", [memory_peak_efficient_func, memory_peak_inefficient_func])
def test_seed_peak_is_three_quarters_mib(fn):
    t0s, a = _seed_inputs()
    jf = thunder.jit(fn, transforms=[MemFuse(kernels="fallback")])  # reordered only
    out = jf(list(t0s), a)
    torch.testing.assert_close(out, fn(list(t0s), a), rtol=1e-4, atol=1e-3)
    final, ours = _memfuse_trace(jf)
    assert ours._memfuse_info["plan"]["unfused_peak_bytes"] == 3 * TENSOR
    assert ours._memfuse_info["plan"]["optimal"]
    # Thunder's own estimator on the final trace agrees
    assert trace_peak_bytes(final) == 3 * TENSOR
    # and so do real CPU allocations, within one tensor
    peak, _ = cpu_peak_bytes(jf, list(t0s), a)
    assert abs(peak - 3 * TENSOR) <= TENSOR


def test_dataflow_baseline_reproduces_the_problem():
    t0s, a = _seed_inputs()
    fn = memory_peak_efficient_func
    jd = thunder.jit(fn, transforms=[ElementwiseFusion()], fusion_type="dataflow")
    jd(list(t0s), a)
    base_peak, out = cpu_peak_bytes(jd, list(t0s), a)
    torch.testing.assert_close(out, fn(list(t0s), a), rtol=1e-4, atol=1e-3)
    jm = thunder.jit(fn, transforms=[MemFuse(kernels="fallback")])
    jm(list(t0s), a)
    ours, _ = cpu_peak_bytes(jm, list(t0s), a)
    assert base_peak >= 2 * MIB  # the horizontal fusion keeps every path's relu alive
    assert ours < base_peak


def test_checkpointed_backward_matches_and_is_planned():
    torch.manual_seed(0)
    x = torch.randn(32, 32, requires_grad=True)
    w = torch.randn(32, 32, requires_grad=True)
    jf = thunder.jit(checkpointed, transforms=[MemFuse(fuse=True, kernels="fallback", _fallback_regions=True)])
    for got, want in zip(grads_of(jf, x, w), grads_of(checkpointed, x, w)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    bw = thunder.last_backward_traces(jf)[-1]
    info = bw._memfuse_info
    assert info["trace"] == "backward"
    assert info["plan"]["peak_bytes"] <= info["plan"]["baseline_peak_bytes"]


def test_module_training_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8), torch.nn.Tanh())
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8), torch.nn.Tanh())
    ref.load_state_dict(model.state_dict())
    jm = thunder.jit(model, transforms=[MemFuse(fuse=True, kernels="fallback", _fallback_regions=True)])
    x = torch.randn(4, 16)
    out = jm(x)
    out.sum().backward()
    ref(x).sum().backward()
    torch.testing.assert_close(out, ref(x))
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def _elementwise_chain(x, y):
    a = torch.sin(x) * 2 + y
    b = torch.exp(-a.abs())
    return (b * b).sum(), torch.where(a > 0, a, b)


def test_fusion_regions_run_on_cpu_fallback_bitwise():
    torch.manual_seed(0)
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    plain = thunder.jit(_elementwise_chain)
    fused = thunder.jit(_elementwise_chain, transforms=[MemFuse(fuse=True, kernels="fallback", _fallback_regions=True)])
    for a, b in zip(plain(x, y), fused(x, y)):
        assert torch.equal(a, b)
    assert tm.report(fused)["forward"]["regions_after"] >= 1


def test_no_regions_on_the_fallback_by_default():
    """NOTE [fusion on CPU]: regions only where a compiler builds them; with the op-by-op
    fallback memfuse reorders."""
    torch.manual_seed(0)
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    jf = thunder.jit(_elementwise_chain, transforms=[MemFuse(kernels="fallback")])
    jf(x, y)
    rep = tm.report(jf)["forward"]
    assert rep["regions_after"] == 0
    assert rep["peak_after_bytes"] == rep["unfused_peak_bytes"] <= rep["peak_before_bytes"]
    with pytest.raises(ValueError, match="fuse"):
        MemFuse(fuse="sometimes")


def test_memfuse_instance_is_reusable_across_jits():
    t0s, a = _seed_inputs(n=3, size=32)
    j1 = thunder.jit(memory_peak_efficient_func, transforms=[memfuse])
    j2 = thunder.jit(memory_peak_inefficient_func, transforms=[memfuse])
    torch.testing.assert_close(j1(list(t0s), a), memory_peak_efficient_func(list(t0s), a))
    torch.testing.assert_close(j2(list(t0s), a), memory_peak_inefficient_func(list(t0s), a))


# ---- edge cases: never wrong, never fatal ------------------------------------------------------


def _run_both(fn, *args, **jit_kw):
    plain = thunder.jit(fn, **jit_kw)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        ours = thunder.jit(fn, transforms=[MemFuse(fuse=True, kernels="fallback", _fallback_regions=True)], **jit_kw)
        got = ours(*args)
    return plain(*args), got, [w for w in rec if issubclass(w.category, RuntimeWarning)], ours


def _same(a, b):
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b) if not a.is_floating_point() else torch.allclose(a, b, equal_nan=True)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


def test_zero_size_tensors():
    x = torch.randn(0, 4)
    ref, got, warns, _ = _run_both(lambda t: (t.relu() * 2).sum(0), x)
    _same(ref, got)
    assert not warns


def test_inplace_copy_keeps_write_order():
    def f(x, buf):
        y = buf * 2  # reads buf before the write
        buf.copy_(x + 1)
        return y + buf

    x = torch.randn(8)
    b1, b2 = torch.randn(8), None
    b2 = b1.clone()
    ref = thunder.jit(f)(x, b1)
    got = thunder.jit(f, transforms=[MemFuse(fuse=True, kernels="fallback", _fallback_regions=True)])(x, b2)
    torch.testing.assert_close(ref, got)
    torch.testing.assert_close(b1, b2)


def test_dropout_random_order_kept():
    def f(x):
        a = torch.nn.functional.dropout(x, 0.5)
        b = torch.nn.functional.dropout(x * 2, 0.5)
        return a + b

    x = torch.randn(128)
    torch.manual_seed(123)
    ref = thunder.jit(f)(x)
    torch.manual_seed(123)
    got = thunder.jit(f, transforms=[MemFuse(fuse=True, kernels="fallback", _fallback_regions=True)])(x)
    torch.testing.assert_close(ref, got)


def test_views_and_int_bool_and_non_tensor_outputs():
    def f(x, i):
        v = x.view(4, 4).t()
        m = i > 2
        return v.sum(), (i * 3).to(torch.int32), m, x.shape[0], torch.where(m, i, 0)

    x = torch.randn(16)
    i = torch.arange(16)
    ref, got, warns, _ = _run_both(f, x, i)
    _same(ref, got)
    assert not warns


def test_empty_function():
    def f():
        return None

    ref, got, warns, _ = _run_both(f)
    assert ref is None and got is None


def test_symbolic_values_are_planned_for_the_traced_size():
    def f(x, y):
        a = x.relu() * 2
        b = (y + 1).sin()
        return (a @ b).sum(), a.shape[0]

    jf = thunder.jit(f, transforms=[MemFuse(fuse=True, strict=True, kernels="fallback", _fallback_regions=True)], cache="symbolic values")
    plain = thunder.jit(f, cache="symbolic values")
    for n in (8, 5, 13):  # one trace serves every size; the plan stays valid
        x, y = torch.randn(n, 4), torch.randn(4, n)
        _same(plain(x, y), jf(x, y))
    info = tm.report(jf)["forward"]
    assert info["peak_after_bytes"] <= info["peak_before_bytes"]


class _Boom(Exception):
    pass


def test_internal_failure_warns_and_keeps_trace(monkeypatch):
    from thunder_memfuse.integration import _planning

    def broken(*a, **k):
        raise _Boom("injected")

    monkeypatch.setattr(_planning, "plan_trace", broken)
    x = torch.randn(4)
    with pytest.warns(RuntimeWarning, match="injected"):
        out = thunder.jit(lambda t: t.sin() + 1, transforms=[MemFuse()])(x)
    torch.testing.assert_close(out, x.sin() + 1)
    with pytest.raises(Exception, match="injected"):
        thunder.jit(lambda t: t.sin() + 2, transforms=[MemFuse(strict=True)])(x)


def test_options_are_validated():
    with pytest.raises(ValueError, match="backend"):
        MemFuse(backend="tpu")
    with pytest.raises(ValueError, match="max_states"):
        MemFuse(max_states=0)


def test_report_and_timeline(tmp_path):
    t0s, a = _seed_inputs(n=10, size=64)
    jf = thunder.jit(memory_peak_inefficient_func, transforms=[MemFuse(kernels="fallback")])
    jf(list(t0s), a)
    rep = tm.report(jf)
    fwd = rep["forward"]
    assert fwd["peak_after_bytes"] == 3 * 64 * 64 * 4
    assert fwd["peak_before_bytes"] > fwd["peak_after_bytes"]
    assert fwd["optimal"] is True
    assert fwd["largest_live_at_peak"] and all(b > 0 for _, b, _ in fwd["largest_live_at_peak"])
    text = tm.format_report(rep)
    assert "forward: peak" in text and "proven optimal" in text
    png = tmp_path / "timeline.png"
    tm.plot_timeline(jf, str(png))
    assert png.stat().st_size > 1000


def test_regions_of_another_fusion_pass_are_kept_whole():
    t0s, a = _seed_inputs(n=4, size=32)
    fn = memory_peak_inefficient_func
    jf = thunder.jit(fn, transforms=[ElementwiseFusion(), MemFuse(kernels="fallback")], fusion_type="dataflow")
    torch.testing.assert_close(jf(list(t0s), a), fn(list(t0s), a))
    final = thunder.last_traces(jf)[-1]
    theirs = [b for b in final.bound_symbols if b.sym.name.startswith("ElementwiseFusion")]
    assert theirs, "the other pass's regions survive as single ops"
    info = tm.report(jf)["forward"]
    assert info["regions_before"] == len(theirs) == info["regions_after"]
    assert info["peak_after_bytes"] <= info["peak_before_bytes"]


def test_general_fusion_executor_is_replaced():
    """NOTE [replacing the fusion pass]: with torch.compile's general fusion executor
    in the list (nvFuser's CPU stand-in), memfuse takes it out and plans alone."""
    t0s, a = _seed_inputs(n=4, size=32)

    def fn(t0s, a):
        return memory_peak_inefficient_func(t0s, a).sin().add(1).cos()  # a chain to fuse

    jf = thunder.jit(fn, executors=["torchcompile"], transforms=[MemFuse(fuse=True, replace_fusion=True, kernels="fallback",
                                                                     _fallback_regions=True)])
    torch.testing.assert_close(jf(list(t0s), a), fn(list(t0s), a), rtol=1e-4, atol=1e-4)
    names = [ex.name for ex in thunder.compile_data(jf).executors_list]
    assert "torchcompile" not in names and "torch" in names and "memfuse" in names
    final, ours = _memfuse_trace(jf)
    fusions = [b.sym.name for b in final.bound_symbols if getattr(b.sym, "is_fusion", False)]
    assert fusions and all(n.startswith("MemFuse") for n in fusions)
    assert ours._memfuse_info["replaced_executors"] == ["torchcompile"]
    assert ours._memfuse_info["plan"]["peak_bytes"] == 3 * 32 * 32 * 4
    assert "replaced fusion executors: torchcompile" in tm.format_report(tm.report(jf))


def test_replace_fusion_keeps_narrow_executors_and_can_be_turned_off(monkeypatch):
    from types import SimpleNamespace

    from thunder.core.compile_data import compile_data_and_stats
    from thunder.extend import get_executor

    def run_hook(transform, names, trace=None):
        if trace is None:
            trace = thunder.trace()(lambda t: t.cos(), torch.empty(2))
        cd = SimpleNamespace(executors_list=tuple(get_executor(n) for n in names))
        with compile_data_and_stats(cd, None):
            out = transform.transform_traces_pre_prologue("p", trace, "e")
        assert out == ("p", trace, "e")  # the traces pass through
        got = [ex.name for ex in cd.executors_list]
        assert got[0] == "memfuse_sdpa_cpu"  # first, wherever memfuse is in use (attention.py)
        return got[1:], getattr(cd, "_memfuse_replaced", ())

    from thunder_memfuse import regions

    names = ["torchcompile_xentropy", "torchcompile", "torch", "python"]
    replaced = (["torchcompile_xentropy", "memfuse", "torch", "python"], ("torchcompile",))
    assert run_hook(MemFuse(replace_fusion=True), names) == replaced
    assert run_hook(MemFuse(replace_fusion=False), names) == (names, ())
    assert run_hook(MemFuse(replace_fusion=True), ["torch", "python"]) == (["torch", "python"], ())
    # "auto": only where memfuse's regions are compiled: regions on, a compiler that works
    # for the trace here (regions.compiles)
    cuda_trace = thunder.trace()(lambda t: t.sin(), torch.empty(2, device="meta"))
    for b in cuda_trace.bound_symbols:
        for o in b.flat_proxy_outs:
            if hasattr(o, "device"):
                monkeypatch.setattr(o, "_device", thunder.core.devices.Device("cuda:0"), raising=False)
    cpu_trace = thunder.trace()(lambda t: t.sin(), torch.empty(2))
    seen = []
    monkeypatch.setattr(regions, "compiles", lambda name, cuda: seen.append((name, cuda)) and False)
    regions.reset_warnings()
    with warnings.catch_warnings():  # auto, and nothing compiles: this hook only asks (quiet); the
        warnings.simplefilter("error")  # trace's own transform says it, once (regions.resolve)
        assert run_hook(MemFuse(), names, cuda_trace) == (names, ())
    with pytest.warns(RuntimeWarning, match="fell back"):
        assert regions.resolve("auto", cuda=True) == "fallback"
    assert ("nvrtc", True) in seen
    assert run_hook(MemFuse(), names, cpu_trace) == (names, ())
    monkeypatch.setattr(regions, "compiles", lambda name, cuda: name == ("nvrtc" if cuda else "torchcompile"))
    assert run_hook(MemFuse(), names, cuda_trace) == replaced
    # a CPU trace: replaced where torch.compile builds memfuse's regions (regions NOTE [auto on CPU])
    assert run_hook(MemFuse(), names, cpu_trace) == replaced
    assert run_hook(MemFuse(kernels="torchcompile"), names, cpu_trace) == replaced
    assert run_hook(MemFuse(fuse=False), names, cuda_trace) == (names, ())
    assert run_hook(MemFuse(kernels="fallback"), names, cpu_trace) == (names, ())
    assert run_hook(MemFuse(backend="cpu"), names, cpu_trace) == (names, ())
    with pytest.warns(RuntimeWarning, match="left attention written out as it is"):  # not a trace: each
        with pytest.warns(RuntimeWarning, match="left elementwise ops on broadcasts"):  # step warns and
            with pytest.warns(RuntimeWarning, match="kept the fusion executors"):  # keeps going
                assert run_hook(MemFuse(), names, object()) == (names, ())
    with pytest.raises(ValueError, match="replace_fusion"):
        MemFuse(replace_fusion="yes")


def test_gemm_regions_map_arguments_and_fall_back(monkeypatch):
    """NOTE [gemm regions]: the cuBLAS path gets matmul/linear arguments in the bound
    symbol's order whatever the region's input order; CPU tensors use the fallback."""
    from thunder_memfuse import regions
    from thunder_memfuse.integration import executor
    from thunder_memfuse.regions import nvrtc

    def f(w, x, b):
        return torch.nn.functional.linear(x, w, b), torch.matmul(x, w.t())

    w, x, b = torch.randn(3, 4), torch.randn(2, 4), torch.randn(3)
    jf = thunder.jit(f)
    jf(w, x, b)
    trace = thunder.last_traces(jf)[-1]
    lin = next(bs for bs in trace.bound_symbols if bs.sym.name == "linear")
    assert not nvrtc.region_of_one(lin)  # CPU proxies: stays a torch call
    inputs = sorted(lin.flat_proxy_args, key=lambda p: p.name, reverse=True)
    calls = []
    monkeypatch.setattr(nvrtc, "cuda_linear", lambda *a: calls.append(a) or torch.nn.functional.linear(*a))
    run = nvrtc.gemm_builder(lin, inputs)()
    args = [{"w": w, "x": x, "b": b}[_arg_name(lin, p)] for p in inputs]
    (out,) = run(*args)
    torch.testing.assert_close(out, torch.nn.functional.linear(x, w, b))
    assert calls and calls[0][0] is x and calls[0][1] is w and calls[0][2] is b
    region = executor.make_region_callable(
        regions.make_group("MemFuseTest", [lin], inputs, lin.flat_proxy_outs, regions.base.ONE), nvrtc)
    torch.testing.assert_close(region(*args)[0], out)  # CPU tensors: the fallback


def test_region_kernel_failures_fall_back(monkeypatch):
    """executor.make_region_callable: a kernel that fails on its first call (NVRTC, module
    load, launch) sends the region to the fallback for good; a later failure only that call;
    NotImplementedError (nvrtc: a case its kernels do not cover) only that call, silently."""
    from thunder_memfuse import regions
    from thunder_memfuse.integration import executor
    from thunder_memfuse.regions import nvrtc

    x = torch.randn(5)
    jf = thunder.jit(lambda t: (t.sin() + 1).cos())
    expected = jf(x)
    trace = thunder.last_traces(jf)[-1]
    body = [b for b in trace.bound_symbols if b.sym.name in ("sin", "add", "cos")]
    assert len(body) == 3
    outputs = list(body[-1].flat_proxy_outs)
    monkeypatch.setattr(nvrtc, "accepts", lambda args: True)

    def region_with(script):
        calls = []

        def kernel(*args):
            calls.append(len(calls))
            what = script[min(len(calls) - 1, len(script) - 1)]
            if what == "ok":
                return [(args[0].sin() + 1).cos()]
            raise what

        monkeypatch.setattr(nvrtc, "build_cuda_region", lambda *a: kernel)
        return executor.make_region_callable(
            regions.make_group("MemFuseT", body, [trace.args[0]], outputs, regions.base.REGION), nvrtc), calls

    run, calls = region_with([RuntimeError("nvrtc said no")])
    with pytest.warns(RuntimeWarning, match="nvrtc said no"):
        torch.testing.assert_close(run(x)[0], expected)
    torch.testing.assert_close(run(x)[0], expected)
    assert calls == [0]  # never tried again

    run, calls = region_with(["ok", RuntimeError("launch failed"), "ok"])
    torch.testing.assert_close(run(x)[0], expected)
    with pytest.warns(RuntimeWarning, match="launch failed"):
        torch.testing.assert_close(run(x)[0], expected)
    torch.testing.assert_close(run(x)[0], expected)
    assert calls == [0, 1, 2]  # after a success, a failure costs only its own call

    run, calls = region_with([NotImplementedError("odd strides"), "ok"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(run(x)[0], expected)
        torch.testing.assert_close(run(x)[0], expected)
    assert calls == [0, 1]

    # what a failed kernel call allocated is gone before the fallback runs
    import weakref

    refs, alive_in_fallback = [], []
    real_fallback = executor._fallback_callable

    def watching_fallback(*a):
        fb = real_fallback(*a)

        def call(*args):
            alive_in_fallback.append(any(r() is not None for r in refs))
            return fb(*args)

        return call

    def leaky_kernel(*args):
        out = torch.empty(1000)
        refs.append(weakref.ref(out))
        raise NotImplementedError("layout needs a copy")

    monkeypatch.setattr(executor, "_fallback_callable", watching_fallback)
    monkeypatch.setattr(nvrtc, "build_cuda_region", lambda *a: leaky_kernel)
    run = executor.make_region_callable(regions.make_group("MemFuseT", body, [trace.args[0]], outputs,
                                                           regions.base.REGION), nvrtc)
    for _ in range(2):
        torch.testing.assert_close(run(x)[0], expected)
    assert alive_in_fallback == [False, False]


def test_epilogue_regions_gemm_relu(monkeypatch):
    """regions/nvrtc NOTE [epilogue regions]: with regions on, a matmul/linear whose result only
    a ReLU reads becomes one region [gemm, relu]; it runs on the fallback on CPU, and its
    kernel path hands the GEMM's arguments, in the bound symbol's order, to the cuBLASLt call."""
    from thunder_memfuse.integration import executor
    from thunder_memfuse.regions import nvrtc

    def f(x, w, b, a):
        h = torch.relu(torch.nn.functional.linear(x, w, b))
        g = torch.relu(h @ a)
        return torch.sigmoid(h @ a + 1) + g  # this h @ a is also read by add: no pair

    x, w, b, a = torch.randn(6, 4), torch.randn(5, 4), torch.randn(5), torch.randn(5, 5)
    jf = thunder.jit(f, transforms=[MemFuse(fuse=True, kernels="nvrtc")])  # CPU: run by the fallback
    from thunder_memfuse import regions

    regions.reset_warnings()
    with pytest.warns(tm.MemFuseWarning, match="kernels='nvrtc' cannot build regions for this CPU trace"):
        torch.testing.assert_close(jf(x, w, b, a), f(x, w, b, a))
    final = thunder.last_traces(jf)[-1]
    pairs = {b_.sym.name: [s.sym.name for s in b_.subsymbols] for b_ in final.bound_symbols
             if b_.sym.name.startswith("MemFuse") and len(b_.subsymbols) == 2}
    kinds = sorted(tuple(v) for v in pairs.values())
    assert ("linear", "relu") in kinds and ("matmul", "relu") in kinds

    # the kernel path, with the cuBLASLt calls stood in for
    calls = []
    monkeypatch.setattr(nvrtc, "accepts", lambda args: True)
    monkeypatch.setattr(nvrtc, "cuda_linear_act",
                        lambda *a, act: calls.append(("linear", a, act)) or torch.relu(
                            torch.nn.functional.linear(*a)), raising=False)
    region = next(b_ for b_ in final.bound_symbols if [s.sym.name for s in b_.subsymbols] == ["linear", "relu"])
    inputs = sorted(region.args, key=lambda p: p.name, reverse=True)
    # the pairs' kind comes from the plan (csrc/core/mf_core.h NOTE [group kinds])
    assert _memfuse_trace(jf)[1]._memfuse_info["plan"]["kinds"].count("epilogue") == 2
    group = regions.make_group("MemFuseT", region.subsymbols, inputs, region.output, regions.base.EPILOGUE)
    run = executor.make_region_callable(group, nvrtc)
    vals = {region.subsymbols[0].args[i].name: v for i, v in enumerate((x, w, b))}
    (out,) = run(*[vals[p.name] for p in inputs])
    torch.testing.assert_close(out, torch.relu(torch.nn.functional.linear(x, w, b)))
    assert len(calls) == 1 and calls[0][2] == "relu"
    assert calls[0][1][0] is x and calls[0][1][1] is w and calls[0][1][2] is b


def test_epilogue_pair_predicate(monkeypatch):
    from thunder_memfuse.regions.nvrtc import epilogue_pair

    def f(x, w):
        y = x @ w
        return torch.relu(y), torch.nn.functional.gelu(x @ w), torch.relu(x.double() @ w.double())

    x, w = torch.randn(3, 3), torch.randn(3, 3)
    jf = thunder.jit(f)
    jf(x, w)
    bs = [b for b in thunder.last_traces(jf)[-1].bound_symbols if b.sym.name in ("matmul", "relu", "gelu")]
    names = [b.sym.name for b in bs]
    assert names == ["matmul", "relu", "matmul", "gelu", "matmul", "relu"]
    assert epilogue_pair(bs[0], bs[1])
    assert not epilogue_pair(bs[2], bs[3])  # gelu: not an epilogue we run
    assert not epilogue_pair(bs[4], bs[5])  # float64: cuBLASLt path covers fp32/fp16/bf16
    assert not epilogue_pair(bs[2], bs[1])  # relu of another matmul's result

    # CUDA tensors: a pair only where cuBLASLt is there to run it
    from thunder.core.devices import Device
    from thunder_memfuse.regions import nvrtc

    for b in bs[:2]:
        for p in list(b.flat_proxy_args) + list(b.flat_proxy_outs):
            if hasattr(p, "_device"):
                monkeypatch.setattr(p, "_device", Device("cuda:0"))
    monkeypatch.setattr(nvrtc, "_cublaslt_found", lambda: False)
    assert not epilogue_pair(bs[0], bs[1])
    monkeypatch.setattr(nvrtc, "_cublaslt_found", lambda: True)
    assert epilogue_pair(bs[0], bs[1])


def _arg_name(bsym, proxy):
    # linear(x, w, b): map the proxy back to the Python argument it traced
    pos = [a.name for a in bsym.args].index(proxy.name)
    return ["x", "w", "b"][pos]


def test_backward_frees_saved_activations_not_parameters():
    """trace.c NOTE [freeable saved tensors]: the backward's saved activations are
    counted from its start and freed after their last use; parameters are inputs."""
    from thunder_memfuse import _symbols
    from thunder_memfuse.integration import _planning

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64), torch.nn.Tanh())
    jm = thunder.jit(model, transforms=[MemFuse(kernels="fallback")])
    x = torch.randn(32, 64)
    jm(x).sum().backward()
    fwd = next(t for t in thunder.last_traces(jm) if _is_augmented(t))
    saved = frozenset(_planning.saved_storages(fwd))
    params = {p.name for b in fwd.bound_symbols if b.sym.id in _symbols.PROLOGUE_IDS for p in b.flat_proxy_outs}
    assert saved and not (saved & params)
    info = thunder.last_backward_traces(jm)[-1]._memfuse_info
    names = info["names"]
    produced = {v for _, outs in info["graph"]["ops"] for v in outs}
    # every saved activation is a value the planner allocates (not a graph input) ...
    assert {n for i, n in enumerate(names) if i in produced} >= saved
    # ... by one op that has no bound symbol and runs first, with the incoming gradients
    # (freed after their last use too) and the roots of storages that no saved name is
    first = info["graph"]["ops"][0]
    made = {names[v] for v in first[1]}
    incoming = set(_planning.incoming_gradients(thunder.last_backward_traces(jm)[-1]))
    assert incoming and saved <= made and first[0] == []
    assert all(n in incoming or n.startswith("storage(") for n in made - saved)
    assert info["plan"]["order"][0] == 0
    act_bytes = sum(info["graph"]["value_bytes"][v] for v in first[1])
    assert info["plan"]["baseline_peak_bytes"] >= act_bytes > 0


def _is_augmented(trace):
    from thunder.core.trace import TraceTag

    return TraceTag.AUGMENTED_FORWARD in trace.tags


def test_shared_instance_keeps_each_compilation_s_saved_tensors():
    """The forward's saved storages reach the backward of the same compilation through its compile
    data, not through the transform instance: two thunder.jit functions sharing the module-level
    `memfuse`, with their forward and backward transforms interleaved, each plan their backward
    from their own forward's saved tensors, as when each runs alone."""
    from thunder.core.compile_data import compile_data_and_stats

    from thunder_memfuse import memfuse
    from thunder_memfuse.integration import _planning

    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)),
              torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 16), torch.nn.Tanh())]
    inputs = [torch.randn(32, 64), torch.randn(4, 16)]
    jits, traces = [], []
    for model, x in zip(models, inputs):
        jm = thunder.jit(model)  # Thunder's own traces, handed to memfuse's hook by hand below
        jm(x).sum().backward()
        fwd = thunder.last_traces(jm)[-1]
        assert _is_augmented(fwd)
        jits.append(jm)
        traces.append((fwd, thunder.last_backward_traces(jm)[-1]))

    def hook(i, which):
        with compile_data_and_stats(thunder.compile_data(jits[i]), None):
            return memfuse.transform_trace_post_optimization(traces[i][which])._memfuse_info

    alone = [(hook(i, 0), hook(i, 1))[1] for i in (0, 1)]
    hook(0, 0), hook(1, 0)  # both forwards first, then both backwards
    interleaved = [hook(0, 1), hook(1, 1)]
    for i, (a, b) in enumerate(zip(alone, interleaved)):
        saved = frozenset(_planning.saved_storages(traces[i][0]))
        made = {b["names"][v] for v in b["graph"]["ops"][0][1]}
        assert saved and b["saved_op"] and saved <= made  # its own saved tensors start the backward
        assert b["names"] == a["names"] and b["graph"] == a["graph"] and b["plan"] == a["plan"]
