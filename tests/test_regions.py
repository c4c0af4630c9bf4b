"""Region compilers (thunder_memfuse/regions): regions compiled by torch.compile on CPU, the
compile cache, the fall-backs, memfuse as the fusion pass (rematerialization kept), pickling.

Inductor compiles are slow on a small CPU: every graph here is tiny, and the tests share programs
where they can (the compile cache is process-wide)."""
import os
import pickle
import subprocess
import sys
import warnings

import pytest
import torch
import thunder

import thunder_memfuse as tm
from thunder_memfuse import MemFuse, regions
from thunder_memfuse.measure import cpu_peak_bytes
from thunder_memfuse.regions import torchcompile as tc
from benchmarks.seed import memory_peak_inefficient_func

from models import seed_inputs

needs_compiler = pytest.mark.skipif(not tc.available(False), reason="torch.compile cannot build here (no C++ compiler)")


def _ours(jf, which="forward"):
    traces = thunder.last_traces(jf) if which == "forward" else thunder.last_backward_traces(jf)
    return next(t for t in reversed(traces) if getattr(t, "_memfuse_info", None))


def _regions(trace):
    return [b for b in trace.bound_symbols if getattr(b.sym, "is_fusion", False)]


def _memfuse_warnings(rec):
    return [w for w in rec if issubclass(w.category, RuntimeWarning) and "memfuse" in str(w.message)]


def _norm_softmax(x, w):
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w  # RMSNorm: a reduction
    return torch.softmax(h, -1).sum(0), (h.tanh() + 1).amax(-1)


@needs_compiler
def test_torchcompile_regions_hold_reductions_and_match_thunder():
    torch.manual_seed(0)
    x, w = torch.randn(8, 16), torch.randn(16)
    plain = thunder.jit(_norm_softmax)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        ours = thunder.jit(_norm_softmax, transforms=[MemFuse(kernels="torchcompile")])
        got = ours(x, w)
    assert not _memfuse_warnings(rec)
    for a, b in zip(plain(x, w), got):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    trace = _ours(ours)
    assert trace._memfuse_info["kernels"] == "torchcompile"
    inside = {s.sym.name for r in _regions(trace) for s in r.subsymbols}
    assert inside & {"mean", "sum", "amax", "softmax", "_softmax"}, inside  # a reduction in a region
    # in torch.compile's place (replace_fusion=True) "auto" picks torch.compile on a CPU where
    # it works, and forms the same regions ...
    auto = thunder.jit(_norm_softmax, executors=["torchcompile"], transforms=[MemFuse(replace_fusion=True)])
    auto(x, w)
    assert _ours(auto)._memfuse_info["kernels"] == "torchcompile"
    assert len(_regions(_ours(auto))) == len(_regions(trace))
    # ... and so it does by default with the torchcompile executor in the list ...
    dflt = thunder.jit(_norm_softmax, executors=["torchcompile"], transforms=[MemFuse()])
    for a, b in zip(thunder.jit(_norm_softmax, executors=["torchcompile"])(x, w), dflt(x, w)):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    info = _ours(dflt)._memfuse_info
    assert info["kernels"] == "torchcompile" and info.get("replaced_executors") == ["torchcompile"]
    assert len(_regions(_ours(dflt))) == len(_regions(trace))
    # ... and memfuse keeps the executor where asked to (replace_fusion=False): no region of its own
    kept = thunder.jit(_norm_softmax, executors=["torchcompile"], transforms=[MemFuse(replace_fusion=False)])
    for a, b in zip(thunder.jit(_norm_softmax, executors=["torchcompile"])(x, w), kept(x, w)):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    assert not [r for r in _regions(_ours(kept)) if r.sym.name.startswith("MemFuse")]
    # ... and without any only reorders (regions NOTE [auto on CPU]): plain Thunder's numbers
    reorder = thunder.jit(_norm_softmax, transforms=[MemFuse()])
    for a, b in zip(plain(x, w), reorder(x, w)):
        assert torch.equal(a, b)
    assert _ours(reorder)._memfuse_info["kernels"] == "fallback"
    assert len(_regions(_ours(reorder))) == 0


@needs_compiler
def test_seed_measured_peak_is_the_planned_peak_and_compiles_once():
    """On the seed, regions hold a path's [matmul, relu] epilogue pairs and relus (regions/
    torchcompile.py NOTE [extern ops in regions]); repeated programs compile once (NOTE [region
    compile cache]), and the real peak is the planned one within a tensor: with memfuse alone
    asked for torch.compile, and by default in the torchcompile executor's place."""
    size = 64
    t0s, a = seed_inputs(n=4, size=size)
    tensor = size * size * 4
    before = dict(tc.stats)
    before_keys, keys = set(tc._cache), []
    # memfuse alone with torch.compile asked for, and by default in torch.compile's place
    for executors, mf in ((None, MemFuse(kernels="torchcompile")), (["torchcompile"], MemFuse())):
        jf = thunder.jit(memory_peak_inefficient_func, executors=executors, transforms=[mf])
        out = jf(list(t0s), a)
        torch.testing.assert_close(out, memory_peak_inefficient_func(list(t0s), a), rtol=1e-4, atol=1e-3)
        info = _ours(jf)._memfuse_info
        assert info["kernels"] == "torchcompile" and info["regions_after"] >= 4
        assert info["plan"]["peak_bytes"] == 3 * tensor
        assert "(torchcompile)" in tm.format_report(tm.report(jf))
        peak, _ = cpu_peak_bytes(jf, list(t0s), a)
        assert abs(peak - info["plan"]["peak_bytes"]) <= tensor, (peak, info["plan"]["peak_bytes"])
        keys += [tc.cache_key(r._call_ctx[r.sym.name].memfuse_group) for r in _regions(_ours(jf))]
    compiled = tc.stats["compiled"] - before["compiled"]
    reused = tc.stats["reused"] - before["reused"]
    # one compile per distinct program (the paths repeat), every other region reuses one
    assert compiled == len(set(keys)) - len(set(keys) & before_keys) < len(keys) / 2, (compiled, len(keys))
    assert reused == len(keys) - compiled


def test_program_key_ignores_names_but_not_programs():
    t0s, a = seed_inputs(n=2, size=8)
    jf = thunder.jit(memory_peak_inefficient_func, transforms=[MemFuse(fuse=False)])
    jf(list(t0s), a)
    bs = [b for b in thunder.last_traces(jf)[-1].bound_symbols if b.sym.name in ("relu", "matmul")]

    def key(b):
        args = [p for p in b.flat_proxy_args if hasattr(p, "shape")]
        return tc.program_key([b], args, list(b.flat_proxy_outs))

    relus = [b for b in bs if b.sym.name == "relu"]
    mms = [b for b in bs if b.sym.name == "matmul"]
    assert relus[0].output.name != relus[1].output.name and key(relus[0]) == key(relus[1])
    assert key(relus[0]) != key(mms[0])


@needs_compiler
def test_a_region_that_fails_to_compile_falls_back(monkeypatch):
    def broken(group):
        def call(*args):
            raise RuntimeError("inductor said no")

        return call

    monkeypatch.setattr(tc, "build", broken)
    torch.manual_seed(0)
    x, w = torch.randn(8, 16), torch.randn(16)
    ours = thunder.jit(_norm_softmax, transforms=[MemFuse(kernels="torchcompile")])
    with pytest.warns(RuntimeWarning, match="inductor said no"):
        got = ours(x, w)
    for a, b in zip(_norm_softmax(x, w), got):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for a, b in zip(_norm_softmax(x, w), ours(x, w)):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    assert not _memfuse_warnings(rec)  # gone to the fallback for good: said once


def test_no_compiler_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setattr(tc, "available", lambda cuda=False: False)
    regions.reset_warnings()
    t0s, a = seed_inputs(n=3, size=16)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for fn in (memory_peak_inefficient_func, _norm_softmax):
            args = (list(t0s), a) if fn is memory_peak_inefficient_func else (torch.randn(4, 8), torch.randn(8))
            jf = thunder.jit(fn, transforms=[MemFuse(kernels="torchcompile")])
            for got, want in zip(jf(*args) if fn is _norm_softmax else [jf(*args)],
                                 fn(*args) if fn is _norm_softmax else [fn(*args)]):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            info = _ours(jf)._memfuse_info
            assert info["kernels"] == "fallback" and info["regions_after"] == 0
    ours = _memfuse_warnings(rec)
    assert len(ours) == 1 and "C++ compiler" in str(ours[0].message), [str(w.message) for w in ours]


def test_no_c_compiler_in_a_fresh_process():
    """CXX pointing at a compiler that fails: the probe sees it before any region is built."""
    code = (
        "import warnings, torch, thunder\n"
        "from thunder_memfuse import MemFuse\n"
        "from thunder_memfuse.regions import torchcompile\n"
        "assert not torchcompile.available(False)\n"
        "with warnings.catch_warnings(record=True) as rec:\n"
        "    warnings.simplefilter('always')\n"
        "    x = torch.randn(4, 8)\n"
        "    for k in range(2):\n"
        "        jf = thunder.jit(lambda t: (t.sin() * 2).softmax(-1) + k, transforms=[MemFuse(kernels='torchcompile')])\n"
        "        torch.testing.assert_close(jf(x), (x.sin() * 2).softmax(-1) + k)\n"
        "msgs = [str(w.message) for w in rec if 'memfuse' in str(w.message)]\n"
        "assert len(msgs) == 1 and 'C++ compiler' in msgs[0], msgs\n"
        "print('OK')\n"
    )
    env = dict(os.environ, CXX="/bin/false")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


def test_nvfuser_where_not_installed_falls_back(monkeypatch):
    from thunder_memfuse.regions import nvfuser

    if nvfuser._executor() is not None:
        pytest.skip("nvFuser is installed here")
    regions.reset_warnings()
    x = torch.randn(4, 8)
    with pytest.warns(RuntimeWarning, match="kernels='nvfuser' cannot build regions"):
        jf = thunder.jit(lambda t: t.sin() * 2 + 1, transforms=[MemFuse(kernels="nvfuser")])
        torch.testing.assert_close(jf(x), x.sin() * 2 + 1)
    assert _ours(jf)._memfuse_info["kernels"] == "fallback"
    with pytest.raises(ValueError, match="kernels"):
        MemFuse(kernels="tensorrt")


@needs_compiler
def test_rematerialization_is_kept_on_a_training_step():
    """NOTE [memfuse fusion pass]: in torch.compile's place memfuse saves what its
    rematerialization saves, and the step's measured peak is no higher than without memfuse."""
    from thunder.core.vjp_utils import get_saved_for_backward_tensors

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32), torch.nn.Tanh())
    x = torch.randn(16, 32)

    def step(jm):
        for p in model.parameters():
            p.grad = None
        loss = jm(x).square().mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    base = thunder.jit(model, executors=["torchcompile"])
    # memfuse as the fusion pass in torch.compile's place (the default: NOTE [auto on CPU])
    ours = thunder.jit(model, executors=["torchcompile"], transforms=[MemFuse()])
    want, got = step(base), step(ours)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    for g, h in zip(got[1], want[1]):
        torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-5)
    assert "memfuse" in [ex.name for ex in thunder.compile_data(ours).executors_list]
    saved = [{p.name for p in get_saved_for_backward_tensors(thunder.last_traces(j)[-1])} for j in (base, ours)]
    assert len(saved[1]) <= len(saved[0])
    peaks = [cpu_peak_bytes(lambda: step(j))[0] for j in (base, ours)]
    assert peaks[1] <= peaks[0], peaks


def test_fusion_symbols_pickle():
    t0s, a = seed_inputs(n=2, size=8)
    jf = thunder.jit(memory_peak_inefficient_func, transforms=[MemFuse(fuse=True, kernels="fallback", _fallback_regions=True)])
    jf(list(t0s), a)
    fusions = _regions(_ours(jf))
    assert fusions
    for b in fusions:
        assert isinstance(b.sym.executor, thunder.extend.FusionExecutor)
        back = pickle.loads(pickle.dumps(b.sym))
        assert back.name == b.sym.name and back.is_fusion and back.executor is thunder.get_executor("memfuse")
    assert tm.report(jf)["forward"]["regions_after"] == len(fusions)


def _mlp_tail(x, w1, w2):
    h = torch.relu(x * 2 + 1)
    return torch.tanh(h @ w1) @ w2 + 1


@needs_compiler
def test_a_gemm_joins_a_region_as_a_stored_extern_call():
    """regions/torchcompile.py NOTE [extern ops in regions]: a matmul is fusible as STORED, may
    sit inside a region, and the real peak stays within one tensor of the planned one (the model
    counts the extern call's tensors as stored)."""
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(64, 64), torch.randn(64, 64), torch.randn(64, 64)
    plain = thunder.jit(_mlp_tail)
    ours = thunder.jit(_mlp_tail, transforms=[MemFuse(kernels="torchcompile")])
    torch.testing.assert_close(ours(x, w1, w2), plain(x, w1, w2), rtol=1e-4, atol=1e-4)
    trace = _ours(ours)
    mm = next(b for b in thunder.last_traces(plain)[-1].bound_symbols if b.sym.name == "matmul")
    assert tc.fusible(mm) == tc.STORED
    inside = [s.sym.name for r in _regions(trace) for s in r.subsymbols]
    assert "matmul" in inside, inside
    outside = [b.sym.name for b in trace.bound_symbols if not b.sym.is_fusion]
    assert "matmul" not in outside, outside
    peak, _ = cpu_peak_bytes(ours, x, w1, w2)
    planned = trace._memfuse_info["plan"]["peak_bytes"]
    assert peak <= planned + 64 * 64 * 4, (peak, planned)


@needs_compiler
def test_a_region_compiles_once_per_stride_pattern():
    """NOTE [regions without Dynamo]: Thunder's trace fixes shapes, not strides; a transposed
    input of the same shape gets a second compiled variant, and the right numbers."""
    torch.manual_seed(0)
    fn = lambda a, b: (a * b).tanh() + a  # noqa: E731
    a, b = torch.randn(32, 32), torch.randn(32, 32)
    ours = thunder.jit(fn, transforms=[MemFuse(kernels="torchcompile")])
    torch.testing.assert_close(ours(a, b), fn(a, b))
    at = torch.randn(32, 32).t()
    torch.testing.assert_close(ours(at, b), fn(at, b))
    torch.testing.assert_close(ours(a, b), fn(a, b))
    (region,) = _regions(_ours(ours))
    compiled = region._call_ctx[region.sym.name].memfuse_state["kernel"]
    assert isinstance(compiled, tc.InductorRegion) and len(compiled.variants) == 2


@needs_compiler
def test_a_region_is_found_in_inductors_graph_cache(tmp_path, monkeypatch):
    """NOTE [Inductor's graph cache]: a region compiled again (the next run of a script, here
    after memfuse's own cache is cleared) is loaded from Inductor's FX graph cache, not generated
    anew, and no region bypasses that cache."""
    from torch._dynamo.utils import counters
    from torch._inductor import config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    fn = lambda a, b: (a * b).sigmoid() * a + b  # noqa: E731
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    seen = []
    for _ in range(2):
        tc.clear_cache()
        before = dict(counters["inductor"])
        ours = thunder.jit(fn, transforms=[MemFuse(kernels="torchcompile")])
        with config.patch(fx_graph_cache=True):
            torch.testing.assert_close(ours(a, b), fn(a, b))
        assert _regions(_ours(ours))
        seen.append({k: counters["inductor"][k] - before.get(k, 0)
                     for k in ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass")})
    tc.clear_cache()
    assert seen[0]["fxgraph_cache_miss"] >= 1 and seen[0]["fxgraph_cache_bypass"] == 0, seen
    assert seen[1]["fxgraph_cache_hit"] >= 1 and seen[1]["fxgraph_cache_miss"] == 0, seen


def _gelu_grad(g, w, h):
    ga = g @ w
    t = torch.tanh(0.79788 * (h + 0.044715 * h * h * h))
    return (0.5 * h * ga) * (1 - t * t) * 0.79788 + 0.5 * (1 + t) * ga


@needs_compiler
def test_a_pointwise_result_takes_a_dying_gemm_buffer():
    """mf_fuse.c NOTE [stored heads]: a region [matmul, the GELU gradient over its result] stores
    one tensor, planned and measured, where counting the GEMM's result as stored gave two."""
    from thunder_memfuse import _C

    torch.manual_seed(0)
    g, w, h = torch.randn(256, 64), torch.randn(64, 256), torch.randn(256, 256)
    ours = thunder.jit(_gelu_grad, executors=["torchcompile"], transforms=[MemFuse(kernels="torchcompile")])
    torch.testing.assert_close(ours(g, w, h), _gelu_grad(g, w, h), rtol=1e-4, atol=1e-4)
    trace = _ours(ours)
    (region,) = _regions(trace)
    inside = [s.sym.name for s in region.subsymbols]
    assert "matmul" in inside, inside
    one = 256 * 256 * 4
    assert trace._memfuse_info["plan"]["peak_bytes"] == one
    peak, _ = cpu_peak_bytes(ours, g, w, h)
    assert peak <= one, peak
    plain = thunder.jit(_gelu_grad)
    plain(g, w, h)
    last = next(b for b in thunder.last_traces(plain)[-1].bound_symbols if b.sym.name == "add")
    assert tc.fusible(last) == _C.FUSIBLE_POINTWISE


class _Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 512)

    def forward(self, x, targets):
        logits = self.proj(torch.nn.functional.layer_norm(x, (64,)))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 512), targets.reshape(-1))


@needs_compiler
@pytest.mark.parametrize("rewritten", [True, False], ids=["inductor-rewrites-it", "stored"])
def test_a_loss_gradients_scatter_is_planned_as_its_program_holds_it(rewritten):
    """NOTE [scatters are stored]: a cross-entropy's backward writes its gradient by a scatter of one
    scalar per row into zeros.  Inductor's joint-graph passes (regions/inductor_graph.py NOTE [Inductor's inference passes])
    rewrite it into a pointwise select, so it is an inner value of its region; with the rewrite
    configured off, Inductor writes it to memory even inside a region and it is STORED.  Either way
    the backward's compiled buffers stay within its planned peak (tests/test_memory_budget.py checks
    what that changes: a budget met that was missed), and the rewrite plans one logits-sized tensor
    lower."""
    from torch._inductor import config

    from thunder_memfuse import report

    def run():
        torch.manual_seed(0)
        model = _Head()
        x, targets = torch.randn(4, 256, 64), torch.randint(0, 512, (4, 256))
        ours = thunder.jit(model, executors=["torchcompile"], transforms=[MemFuse()])
        ours(x, targets).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        for p in model.parameters():
            p.grad = None
        model(x, targets).backward()
        for g, p in zip(grads, model.parameters()):
            torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)
        bt = thunder.last_backward_traces(ours)[-1]
        ops = [s for b in bt.bound_symbols for s in (b.subsymbols if b.sym.is_fusion else [b])]
        scatter = [s for s in ops if "nll_loss_backward" in s.sym.name]
        assert scatter, [s.sym.name for s in ops]
        bw = report(ours)["backward"]
        assert bw["compiled_peak_bytes"] is not None
        # within the few bytes of the scalars (the loss's mean divisor) and of the row sums of the
        # log-softmax's gradient, which Inductor keeps between its two loops over a row
        assert bw["compiled_peak_bytes"] <= bw["peak_after_bytes"] + 4 * 4 * 256 + 64, bw
        return scatter[0], bw["peak_after_bytes"]

    tc.clear_cache()  # a region compiled under the other setting is not reused
    try:
        with config.patch({"optimize_scatter_upon_const_tensor": rewritten}):
            assert tc._scatter_upon_constants_rewritten() == rewritten
            scatter, planned = run()
            assert tc.is_realized(scatter) != rewritten
            assert (tc.fusible(scatter) == tc.STORED) != rewritten
        if rewritten:
            with config.patch({"optimize_scatter_upon_const_tensor": False}):
                tc.clear_cache()
                _, stored = run()
            # one logits-sized tensor less, less what then becomes the peak: the weight gradient's
            # matmul output (512 x 64), once the log-softmax gradient takes the saved log-softmax's
            # storage (NOTE [reuse credit])
            assert planned <= stored - 4 * 256 * 512 * 4 + 512 * 64 * 4 + 64, (planned, stored)
    finally:
        tc.clear_cache()


@needs_compiler
def test_claimed_prims_do_not_split_regions():
    """NOTE [claimed prims]: in torch.compile's place, prims Thunder's torch executor runs under
    its own names (a mean's division, a reshape) join memfuse's regions as torch.compile's did."""
    torch.manual_seed(0)
    x, w = torch.randn(8, 16), torch.randn(16)
    ours = thunder.jit(_norm_softmax, executors=["torchcompile"], transforms=[MemFuse(kernels="torchcompile")])
    for a, b in zip(thunder.jit(_norm_softmax, executors=["torchcompile"])(x, w), ours(x, w)):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    trace = _ours(ours)
    outside = [b.sym.name for b in trace.bound_symbols
               if not b.sym.is_fusion and b.sym.name not in ("unpack_trivial", "python_del", "python_return")]
    assert not [n for n in outside if n.endswith("_impl")], outside
    assert tc._torch_impl_of()["torch_div_prim_impl"] in tc._executor().implmap


@needs_compiler
def test_a_program_make_fx_cannot_trace_goes_through_dynamo(monkeypatch):
    """NOTE [regions without Dynamo]: where the ATen trace fails, the region is compiled as
    Thunder's torchcompile executor would (make_compiled), silently, with the same numbers."""
    def no_trace(*a, **k):
        raise RuntimeError("no fake kernel here")

    monkeypatch.setattr(tc, "_aten_graph", no_trace)
    tc.clear_cache()
    fn = lambda a, b: (a - b).sigmoid() * 3  # noqa: E731
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        ours = thunder.jit(fn, transforms=[MemFuse(kernels="torchcompile")])
        torch.testing.assert_close(ours(a, b), fn(a, b))
    assert not _memfuse_warnings(rec)
    (region,) = _regions(_ours(ours))
    compiled = region._call_ctx[region.sym.name].memfuse_state["kernel"]
    assert "no fake kernel here" in compiled.why_dynamo
    tc.clear_cache()


def test_every_compiler_is_one_region_compiler():
    """regions/base.py: each compiler module satisfies RegionCompiler; the fallback compiles
    nothing and plans as nvrtc does."""
    from thunder_memfuse.regions import base

    for name in regions.COMPILERS:
        comp = regions.compiler(name)
        assert isinstance(comp, base.RegionCompiler) and comp.name == name, name
    fallback, nvrtc = regions.compiler("fallback"), regions.compiler("nvrtc")
    assert not fallback.compiles_regions and fallback.available(False) and not nvrtc.available(False)
    assert fallback.fusible is nvrtc.fusible and fallback.epilogue_pair is nvrtc.epilogue_pair


def test_a_predicate_that_raises_answers_no_and_says_why_once(caplog):
    """regions/base.py predicate: the C reader asks fusible of every bound symbol, so a check
    that raises is logged once per check, op and error type, not per call."""
    import logging
    from types import SimpleNamespace

    class Odd:
        sym = SimpleNamespace(name="odd_op", is_fusion=False)

        @property
        def flat_outs(self):
            raise LookupError("no outputs here")

    regions.reset_warnings()
    with caplog.at_level(logging.WARNING, logger="thunder_memfuse"):
        assert [tc.fusible(Odd()) for _ in range(3)] == [0, 0, 0]
    said = [r.getMessage() for r in caplog.records if "odd_op" in r.getMessage()]
    assert len(said) == 1 and "LookupError: no outputs here" in said[0] and "fusible" in said[0], said


def _two_gemm_relu_pairs(x, w, b, a):
    h = torch.relu(torch.nn.functional.linear(x, w, b))
    g = torch.relu(h @ a)
    return torch.sigmoid(h @ a + 1) + g  # this h @ a is also read by add: no pair


def _built_kinds(monkeypatch):
    """The (op names, kind) of every region regroup_trace builds from here on."""
    from thunder_memfuse.integration import _regroup

    built = []
    real = _regroup.make_region_callable

    def recording(group, compiler):
        built.append((tuple(str(b.sym.name) for b in group.bsyms), group.kind))
        return real(group, compiler)

    monkeypatch.setattr(_regroup, "make_region_callable", recording)
    return built


def test_region_kinds_come_from_the_plan(monkeypatch):
    """csrc/core/mf_core.h NOTE [group kinds]: a region's kind is the one the plan gave its group;
    nothing works it out again from the bound symbols (a plan whose kinds say otherwise is
    followed), and a single op is a region only where the compiler's region_of_one says so."""
    from thunder_memfuse.integration import _planning

    args = (torch.randn(6, 4), torch.randn(5, 4), torch.randn(5), torch.randn(5, 5))
    expected = _two_gemm_relu_pairs(*args)
    opts = dict(fuse=True, kernels="fallback", _fallback_regions=True)
    built = _built_kinds(monkeypatch)
    jf = thunder.jit(_two_gemm_relu_pairs, transforms=[MemFuse(**opts)])
    torch.testing.assert_close(jf(*args), expected)
    kinds = _ours(jf)._memfuse_info["plan"]["kinds"]
    assert kinds.count("epilogue") == 2
    pairs = sorted(names for names, kind in built if kind == regions.base.EPILOGUE)
    assert pairs == [("linear", "relu"), ("matmul", "relu")]
    assert all(kind == regions.base.REGION for names, kind in built if kind != regions.base.EPILOGUE)

    # the same program under a plan that calls its pairs plain regions: built as regions
    real_plan_trace = _planning.plan_trace

    def pairs_as_regions(*a, **kw):
        res = real_plan_trace(*a, **kw)
        res["kinds"] = ["region" if k == "epilogue" else k for k in res["kinds"]]
        return res

    monkeypatch.setattr(_planning, "plan_trace", pairs_as_regions)
    built.clear()
    jf = thunder.jit(lambda *t: _two_gemm_relu_pairs(*t), transforms=[MemFuse(**opts)])
    torch.testing.assert_close(jf(*args), expected)
    assert built and all(kind == regions.base.REGION for _, kind in built)
    assert ("linear", "relu") in [names for names, _ in built]

    # a single op becomes a region of one exactly where the compiler runs it as one
    monkeypatch.setattr(_planning, "plan_trace", real_plan_trace)
    monkeypatch.setattr(regions.compiler("fallback"), "region_of_one", lambda b: b.sym.name == "matmul")
    built.clear()
    jf = thunder.jit(lambda *t: _two_gemm_relu_pairs(*t), transforms=[MemFuse(**opts)])
    torch.testing.assert_close(jf(*args), expected)
    assert (("matmul",), regions.base.ONE) in built  # the matmul that pairs with no relu
    assert all(len(names) > 1 for names, kind in built if kind != regions.base.ONE)


def test_region_kind_is_decided_in_one_place():
    class Compiler:
        @staticmethod
        def region_of_one(bsym):
            return bsym == "gemm"

    base = regions.base
    assert regions.region_kind(base.SINGLE, ["gemm"], Compiler) == base.ONE
    assert regions.region_kind(base.SINGLE, ["relu"], Compiler) is None
    assert regions.region_kind(base.REGION, ["a", "b", "c"], Compiler) == base.REGION
    assert regions.region_kind(base.EPILOGUE, ["gemm", "relu"], Compiler) == base.EPILOGUE
    with pytest.raises(ValueError, match="unknown group kind"):
        regions.region_kind("gemm", ["gemm"], Compiler)
    with pytest.raises(ValueError, match="epilogue group of 3"):
        regions.region_kind(base.EPILOGUE, ["a", "b", "c"], Compiler)
    with pytest.raises(ValueError, match="no region kind"):
        regions.make_group("MemFuseT", ["relu"], [], [], base.SINGLE)
