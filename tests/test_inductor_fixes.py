"""Inductor defects memfuse's regions reach, fixed while memfuse compiles them
(thunder_memfuse/regions/inductor_fixes.py NOTE [Inductor bugs worked around]).

The programs here put a scatter that accumulates (index_add, and index_select's backward) after a
value read transposed, in a region of its own, as memfuse planned a Falcon step's multi-query key
gradient.  Inductor's C++ code generation takes its atomic path only with more than one thread, so
the tests compile with two whatever the machine has (cpp.threads)."""
import pytest
import torch
import thunder

from thunder_memfuse import MemFuse
from thunder_memfuse.regions import inductor_fixes
from thunder_memfuse.regions import torchcompile as tc

pytestmark = pytest.mark.skipif(not tc.available(False), reason="torch.compile cannot build here (no C++ compiler)")


def _regions_holding(jf, name, backward=False):
    traces = thunder.last_backward_traces(jf) if backward else thunder.last_traces(jf)
    trace = next(t for t in reversed(traces) if getattr(t, "_memfuse_info", None))
    return [b for b in trace.bound_symbols if getattr(b.sym, "is_fusion", False)
            and any(s.sym.name == name for s in b.subsymbols)]


def _scatter_of_transposed(a, idx):
    s = torch.sin(a).transpose(1, 2).unsqueeze(2)  # (2, 64, 1, 32), strides of a transpose
    return torch.index_add(a.new_zeros(2, a.shape[2], 6, a.shape[1]), 2, idx, s) * 2


def _key_of_fused_qkv(qkv, w, idx):
    k = qkv.index_select(2, idx)  # (2, 64, 1, 32): its gradient is an index_add into qkv's
    return (torch.tanh(k.transpose(1, 3) @ w)).sum()  # ... of a gradient that arrives transposed


def test_an_accumulating_scatter_of_a_transposed_value_matches_thunder():
    from torch._inductor import config

    torch.manual_seed(0)
    a, idx = torch.randn(2, 32, 64), torch.tensor([4])
    with config.patch({"cpp.threads": 2}):
        jf = thunder.jit(_scatter_of_transposed, transforms=[MemFuse(kernels="torchcompile")])
        got = jf(a, idx)
    torch.testing.assert_close(got, thunder.jit(_scatter_of_transposed)(a, idx))
    assert _regions_holding(jf, "index_add"), "memfuse did not plan a region holding the scatter"


def test_a_gathers_gradient_into_a_fused_projection_matches_thunder():
    from torch._inductor import config

    torch.manual_seed(0)
    qkv, w, idx = torch.randn(2, 64, 6, 32), torch.randn(64, 8), torch.tensor([4])
    grads = []  # plain Thunder's, memfuse's (Thunder + torchcompile's own regions hit the defect here)
    for kw in ({}, dict(executors=["torchcompile"], transforms=[MemFuse(kernels="torchcompile")])):
        x = qkv.clone().requires_grad_()
        with config.patch({"cpp.threads": 2}):
            jf = thunder.jit(_key_of_fused_qkv, **kw)
            jf(x, w, idx).backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0])
    assert _regions_holding(jf, "index_add", backward=True), "memfuse did not plan the scatter's region"


def test_the_fix_is_in_place_only_while_memfuse_compiles():
    if not inductor_fixes.needed():
        pytest.skip("the installed Inductor does not have the tile2d atomic-add defect")
    from torch._inductor import config
    from torch._inductor.codegen import cpp

    store, pre = cpp.CppTile2DKernel.__dict__["store"], config.post_grad_custom_pre_pass
    with inductor_fixes.applied():
        with inductor_fixes.applied():  # re-entrant
            assert cpp.CppTile2DKernel.__dict__["store"] is not store
        assert cpp.CppTile2DKernel.__dict__["store"] is not store
        assert config.post_grad_custom_pre_pass.uuid().startswith("thunder_memfuse")  # keys the graph cache apart
    assert cpp.CppTile2DKernel.__dict__["store"] is store
    assert config.post_grad_custom_pre_pass is pre


def test_regions_through_dynamo_are_compiled_with_the_fix(monkeypatch):
    """Every pattern past MAX_VARIANTS (here: every one) goes through the region's Dynamo callable,
    which compiles on its first call: the fix comes with its backend, not with the call.  (Other
    sizes than the first test's: memfuse reuses a region compiled for the same program.)"""
    from torch._inductor import config

    monkeypatch.setattr(tc, "MAX_VARIANTS", 0)
    torch.manual_seed(0)
    a, idx = torch.randn(2, 32, 48), torch.tensor([4])
    calls = []
    backend = inductor_fixes.inductor_backend
    monkeypatch.setattr(inductor_fixes, "inductor_backend", lambda gm, ex: calls.append(1) or backend(gm, ex))
    with config.patch({"cpp.threads": 2}):
        jf = thunder.jit(_scatter_of_transposed, transforms=[MemFuse(kernels="torchcompile")])
        got = jf(a, idx)
        again = jf(a, idx)
    want = thunder.jit(_scatter_of_transposed)(a, idx)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(again, want)
    assert calls, "no region went through the Dynamo callable's backend"
    region = _regions_holding(jf, "index_add")
    assert region, "memfuse did not plan a region holding the scatter"
