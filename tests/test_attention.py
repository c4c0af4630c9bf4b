"""Attention kept whole on CPU tensors (thunder_memfuse/integration/attention.py NOTE [attention kept whole]): with
memfuse, F.scaled_dot_product_attention runs torch's fused CPU kernels, forward and backward, with eager's
numbers; the step saves the logsumexp, never a tokens x tokens tensor; what the kernel cannot take runs
decomposed with the reason logged and summarized."""
import copy
import logging
import math

import pytest
import torch
import torch.nn.functional as F
import thunder

from thunder_memfuse import MemFuse
from thunder_memfuse.integration import attention
from thunder_memfuse.regions import torchcompile as tc

B, H, T, E = 2, 4, 48, 16


class Attn(torch.nn.Module):
    def __init__(self, *, causal=False, mask=None, dropout=0.0, kv_heads=H, lk=None, dtype=torch.float32,
                 ckpt=False, broadcast=False):
        super().__init__()
        self.ckpt = ckpt
        self.q = torch.nn.Linear(E, H * E, dtype=dtype)
        self.k = torch.nn.Linear(E, kv_heads * E, dtype=dtype)
        self.v = torch.nn.Linear(E, kv_heads * E, dtype=dtype)
        self.causal, self.mask, self.dropout, self.kv_heads, self.lk = causal, mask, dropout, kv_heads, lk
        self.broadcast = broadcast  # multi-query attention as Falcon runs it: one k/v head, broadcast

    def forward(self, x, mem):
        q = self.q(x).view(B, T, H, E).transpose(1, 2)
        src = mem if self.lk else x
        L = src.shape[1]
        k = self.k(src).view(B, L, self.kv_heads, E).transpose(1, 2)
        v = self.v(src).view(B, L, self.kv_heads, E).transpose(1, 2)
        # grouped-query attention as HF and LitGPT models run it: k and v repeated (Falcon's: broadcast)
        if self.kv_heads < H and not self.broadcast:
            k, v = (t.repeat_interleave(H // self.kv_heads, dim=1) for t in (k, v))
        def attend(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, dropout_p=self.dropout,
                                                  is_causal=self.causal)

        y = torch.utils.checkpoint.checkpoint(attend, q, k, v, use_reentrant=False) if self.ckpt else attend(q, k, v)
        return (y.tanh() * 2).sum()


def _step(model, call, dtype=torch.float32, lk=None):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(B, T, E, generator=g, dtype=dtype)
    mem = torch.randn(B, lk or T, E, generator=g, dtype=dtype)
    for p in model.parameters():
        p.grad = None
    loss = call(x, mem)
    loss.backward()
    return [loss.detach()] + [p.grad.clone() for p in model.parameters()]


def _ops(trace):
    return [b.sym.name for b in trace.bound_symbols]


CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "float mask 4d": dict(mask=torch.randn(B, 1, T, T)),
    "float mask 2d": dict(mask=torch.randn(T, T)),
    "bool mask": dict(mask=torch.rand(T, T) > 0.3),
    "padding mask": dict(mask=torch.where(torch.arange(T) < T - 5, 0.0, -math.inf).view(1, 1, 1, T).expand(B, 1, T, T)),
    "cross attention": dict(lk=32),
    "grouped-query": dict(kv_heads=2, causal=True),
    "multi-query broadcast": dict(kv_heads=1, causal=True, broadcast=True),
    "multi-query broadcast, masked, checkpointed": dict(
        kv_heads=1, broadcast=True, mask=torch.rand(T, T, generator=torch.Generator().manual_seed(5)) > 0.3, ckpt=True),
    "checkpointed": dict(causal=True, ckpt=True),
    "float64": dict(dtype=torch.float64),
}


@pytest.mark.parametrize("executors", [None, pytest.param(["torchcompile"], marks=pytest.mark.skipif(
    not tc.available(False), reason="torch.compile cannot build here (no C++ compiler)"))], ids=["thunder", "torchcompile"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_attention_gives_eagers_numbers(case, executors):
    kw = dict(CASES[case])
    if kw.get("lk") and "mask" in kw:
        pytest.skip("no mask for cross attention here")
    dtype = kw.get("dtype", torch.float32)
    torch.manual_seed(0)
    model = Attn(**kw)
    eager = copy.deepcopy(model)
    want = _step(eager, eager, dtype, kw.get("lk"))
    jm = thunder.jit(model, transforms=[MemFuse(strict=True)], **({"executors": executors} if executors else {}))
    got = _step(model, jm, dtype, kw.get("lk"))
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-10)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tol)
    fw, bw = thunder.last_traces(jm)[-1], thunder.last_backward_traces(jm)[-1]
    assert "memfuse_sdpa_cpu_forward" in _ops(fw) and "memfuse_sdpa_cpu_backward" in _ops(bw)
    summary = attention.attention_summary(thunder.compile_data(jm))
    assert summary["decomposed"] == [] and summary["fused"] >= 1  # (a checkpointed call runs again)
    # what crosses to the backward: no batch x heads x T x T tensor, the logsumexp instead
    from thunder.core.vjp_utils import get_saved_for_backward_tensors

    saved = get_saved_for_backward_tensors(fw)
    assert not any(tuple(t.shape) == (B, H, T, kw.get("lk") or T) for t in saved)  # (a user's mask may be saved)
    assert any(tuple(t.shape) == (B, H, T) for t in saved) or kw.get("ckpt")  # checkpointed: recomputed


def test_plain_thunder_makes_the_attention_matrix_that_memfuse_does_not():
    """The difference is real: without memfuse, Thunder on a CPU saves a T x T tensor per head."""
    from thunder.core.vjp_utils import get_saved_for_backward_tensors

    torch.manual_seed(0)
    model = Attn(causal=True)
    jm = thunder.jit(model)
    _step(model, jm)
    saved = get_saved_for_backward_tensors(thunder.last_traces(jm)[-1])
    assert any(tuple(t.shape) == (B, H, T, T) for t in saved)


def test_what_the_kernel_cannot_take_runs_decomposed_and_says_why(caplog):
    """Dropout: the CPU kernel has none.  The step still runs, decomposed, with the reason logged once."""
    torch.manual_seed(0)
    model = Attn(dropout=0.1)
    reason = "dropout"
    attention._logged.clear()
    jm = thunder.jit(model, transforms=[MemFuse()])
    with caplog.at_level(logging.WARNING, logger="thunder_memfuse"):
        _step(model, jm)
    summary = attention.attention_summary(thunder.compile_data(jm))
    assert summary["fused"] == 0 and any(reason in r for r in summary["decomposed"]), summary
    assert any(reason in r.getMessage() and "runs decomposed" in r.getMessage() for r in caplog.records)


def test_the_checker_leaves_cuda_and_declines_what_it_cannot_run():
    from thunder.core.proxies import TensorProxy
    from thunder.core.trace import TraceCtx, tracectx

    with tracectx(TraceCtx()):
        q = TensorProxy(shape=(B, H, T, E), device=thunder.devices.cpu, dtype=thunder.dtypes.float32)
        q3 = TensorProxy(shape=(B, T, E), device=thunder.devices.cpu, dtype=thunder.dtypes.float32)
        qc = TensorProxy(shape=(B, H, T, E), device=thunder.devices.Device("cuda:0"), dtype=thunder.dtypes.float32)
        vi = TensorProxy(shape=(B, H, T, 8), device=thunder.devices.cpu, dtype=thunder.dtypes.float32)
        m16 = TensorProxy(shape=(T, T), device=thunder.devices.cpu, dtype=thunder.dtypes.float16)
        mg = TensorProxy(shape=(T, T), device=thunder.devices.cpu, dtype=thunder.dtypes.float32, requires_grad=True)
        m32 = TensorProxy(shape=(T, T), device=thunder.devices.cpu, dtype=thunder.dtypes.float32)
        m3 = TensorProxy(shape=(B, T, T), device=thunder.devices.cpu, dtype=thunder.dtypes.float32)
        assert attention.declined(q, q, q) is None
        assert attention.declined(qc, qc, qc) == ""  # Thunder's sdpa / cuDNN executors' to take
        assert "4-D" in attention.declined(q3, q3, q3)
        assert "value head size" in attention.declined(q, q, vi)
        assert "dtype" in attention.declined(q, q, q, m16)
        assert attention.declined(q, q, q, mg) is None  # its gradient: NOTE [a mask's gradient]
        assert "is_causal" in attention.declined(q, q, q, m32, 0.0, True)
        assert "3-D attention mask" in attention.declined(q, q, q, m3)
        assert attention.declined(q, q, q, m32) is None and attention.declined(q, q, q, None, 0.0, True) is None
        k1 = TensorProxy(shape=(B, 1, T, E), device=thunder.devices.cpu, dtype=thunder.dtypes.float32)
        k11 = TensorProxy(shape=(1, 1, T, E), device=thunder.devices.cpu, dtype=thunder.dtypes.float32)
        k2 = TensorProxy(shape=(B, 2, T, E), device=thunder.devices.cpu, dtype=thunder.dtypes.float32)
        assert attention.declined(q, k1, k1) is None and attention.declined(q, k11, k1) is None  # broadcast
        assert "broadcast" in attention.declined(q, k2, k2)  # 2 heads for 4: neither equal nor broadcast
        assert "broadcast" in attention.declined(k1, q, q)  # the query's heads are the output's


def test_inference_takes_the_fused_forward_once_per_call():
    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m).sin()

    q, k, v = (torch.randn(B, H, 33, E) for _ in range(3))
    m = torch.rand(33, 33) > 0.2
    jf = thunder.jit(f, transforms=[MemFuse(strict=True)])
    with torch.no_grad():
        torch.testing.assert_close(jf(q, k, v, m), f(q, k, v, m), rtol=0, atol=0)
    assert "memfuse_sdpa_cpu_forward" in _ops(thunder.last_traces(jf)[-1])
    assert attention.attention_summary(thunder.compile_data(jf)) == {"fused": 1, "decomposed": [], "written_out": 0}


def test_plain_thunder_without_memfuse_is_untouched():
    """The executor is added by memfuse's hook only: a jit without memfuse keeps Thunder's executors."""
    jm = thunder.jit(Attn())
    assert attention.NAME not in [e.name for e in thunder.compile_data(jm).executors_list]
    model = Attn()
    jm2 = thunder.jit(model, transforms=[MemFuse()])
    _step(model, jm2)
    assert thunder.compile_data(jm2).executors_list[0].name == attention.NAME


class LearnedBias(torch.nn.Module):
    """A mask made from parameters: a relative position bias gathered from a table (Swin's, T5's), handed
    to scaled_dot_product_attention; and a constant mask beside it, which needs no gradient."""

    def __init__(self, constant=False):
        super().__init__()
        self.qkv = torch.nn.Linear(E, 3 * H * E)
        table = torch.randn(2 * T - 1, H) * 0.5
        if constant:
            self.register_buffer("table", table)
        else:
            self.table = torch.nn.Parameter(table)
        pos = torch.arange(T)
        self.register_buffer("index", (pos[:, None] - pos[None, :] + T - 1).reshape(-1))

    def forward(self, x, mem):
        q, k, v = self.qkv(x).view(B, T, 3, H, E).permute(2, 0, 3, 1, 4)
        mask = self.table[self.index].view(T, T, H).permute(2, 0, 1).unsqueeze(0)
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=mask).tanh() * 2).sum()


@pytest.mark.parametrize("constant", [False, True], ids=["learned", "constant"])
def test_a_mask_made_from_parameters_gets_its_gradient(constant):
    """NOTE [a mask's gradient]: before differentiation an intermediate's proxy never says it needs a
    gradient, so the fused call gives every float mask one, from the probabilities recomputed in the
    backward; where nothing needs it (a mask from a buffer) no tokens x tokens tensor is made there."""
    from thunder.core.proxies import TensorProxy

    torch.manual_seed(0)
    model = LearnedBias(constant)
    eager = copy.deepcopy(model)
    want = _step(eager, eager)
    jm = thunder.jit(model, transforms=[MemFuse(strict=True)])
    got = _step(model, jm)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert attention.attention_summary(thunder.compile_data(jm))["fused"] == 1
    bw = thunder.last_backward_traces(jm)[-1]
    square = [b.sym.name for b in bw.bound_symbols for o in b.flat_proxy_outs  # made there, not saved
              if isinstance(o, TensorProxy) and o.ndim == 4 and tuple(o.shape[-2:]) == (T, T)
              and not b.sym.name.startswith("unpack")]
    assert bool(square) == (not constant), square
    if not constant:
        assert model.table.grad is not None and model.table.grad.abs().sum() > 0


def test_inputs_whose_rows_are_not_dense_take_the_kernel_with_eagers_numbers():
    """A transposed query (its last dimension strided) is read row by row by the fused kernels, which
    torch's own sdpa never hands them: they get dense copies (the fuzzer found garbage here)."""
    def f(a, b, c):
        q = a.transpose(-1, -2)  # (B, H, T, T): rows strided
        return F.scaled_dot_product_attention(q, b, c, attn_mask=c[..., :1].expand(B, H, T, T).mT).sin()

    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(B, H, T, T, generator=g, requires_grad=True) for _ in range(3))
    want = f(a, b, c)
    want.sum().backward()
    grads = [t.grad.clone() for t in (a, b, c)]
    for t in (a, b, c):
        t.grad = None
    jf = thunder.jit(f, transforms=[MemFuse(strict=True)])
    got = jf(a, b, c)
    got.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for t, w in zip((a, b, c), grads):
        torch.testing.assert_close(t.grad, w, rtol=1e-4, atol=1e-5)
    assert "memfuse_sdpa_cpu_backward" in _ops(thunder.last_backward_traces(jf)[-1])


@pytest.mark.parametrize("written", ["output", "mask"])
def test_what_the_backward_reads_again_is_kept_apart_from_later_writes(written):
    """NOTE [attention read again] (attention_match.py): the fused backward reads the call's output and
    mask; a program that writes one of them in place afterwards (which eager's math path allows) still
    gets eager's gradients, through a copy, and the call stays fused."""
    def f(x, m):
        q = x.view(B, H, T, E)
        mask = m * 1.0
        out = F.scaled_dot_product_attention(q, q.sin(), q.cos(), attn_mask=mask)
        (out if written == "output" else mask).mul_(0.5)
        return out.sum() + mask.sum()

    g = torch.Generator().manual_seed(1)
    x = torch.randn(B * H * T * E, generator=g, requires_grad=True)
    m = torch.randn(T, T, generator=g, requires_grad=True)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        f(x, m).backward()
    want = [x.grad.clone(), m.grad.clone()]
    x.grad = m.grad = None
    jf = thunder.jit(f, transforms=[MemFuse(strict=True)])
    jf(x, m).backward()
    torch.testing.assert_close(x.grad, want[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m.grad, want[1], rtol=1e-4, atol=1e-5)
    assert "memfuse_sdpa_cpu_backward" in _ops(thunder.last_backward_traces(jf)[-1])
    assert any("clone" in _ops(t) for t in thunder.last_traces(jf))
