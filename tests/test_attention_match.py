"""Attention written out by hand (thunder_memfuse/integration/attention_match.py NOTE [attention written
out]): with memfuse, a matmul-softmax-matmul chain that is exactly attention runs as one
scaled_dot_product_attention call on the fused CPU kernels, with the chain's numbers within float
tolerance and no tokens x tokens tensor saved; every chain that is not exactly that stays as written."""
import copy
import math

import pytest
import torch
import thunder

from thunder_memfuse import MemFuse
from thunder_memfuse.integration import attention
from thunder_memfuse.regions import torchcompile as tc

B, H, T, E = 2, 4, 40, 16


class Written(torch.nn.Module):
    """BERT's self-attention as transformers writes it out, with variants."""

    def __init__(self, *, scaling="divide", mask=None, mask_first=False, dropout=0.0, permute_k=False,
                 return_probs=False, scale_after_mask=False, ckpt=False):
        super().__init__()
        self.qkv = torch.nn.Linear(E, 3 * H * E)
        self.register_buffer("causal", torch.tril(torch.ones(T + 8, T + 8)).view(1, 1, T + 8, T + 8))
        self.scaling, self.mask, self.mask_first, self.dropout = scaling, mask, mask_first, dropout
        self.permute_k, self.return_probs, self.scale_after_mask, self.ckpt = permute_k, return_probs, \
            scale_after_mask, ckpt

    def attend(self, q, k, v):
        kt = k.permute(0, 1, 3, 2) if self.permute_k else k.transpose(-1, -2)
        s = torch.matmul(q, kt)
        if self.scaling == "nanogpt":  # causal, as nanoGPT's attention without flash
            s = (s * (1.0 / math.sqrt(E))).masked_fill(self.causal[:, :, :T, :T] == 0, float("-inf"))
        elif self.scale_after_mask and self.mask is not None:
            s = (s + self.mask) / math.sqrt(E)
        else:
            s = s / math.sqrt(E) if self.scaling == "divide" else (s * (1 / math.sqrt(E)) if self.scaling == "multiply"
                                                                   else s)
            if self.mask is not None:
                s = self.mask + s if self.mask_first else s + self.mask
        p = torch.nn.functional.softmax(s, dim=-1)
        p = torch.nn.functional.dropout(p, self.dropout, training=True)
        return torch.matmul(p, v), p

    def forward(self, x):
        q, k, v = self.qkv(x).view(B, T, 3, H, E).permute(2, 0, 3, 1, 4)
        if self.ckpt:
            out = torch.utils.checkpoint.checkpoint(lambda *a: self.attend(*a)[0], q, k, v, use_reentrant=False)
            p = None
        else:
            out, p = self.attend(q, k, v)
        loss = (out.tanh() * 2).sum()
        return (loss, p) if self.return_probs else loss


def _padding_mask():
    keep = torch.arange(T) < T - 6
    return ((1.0 - keep.float()) * torch.finfo(torch.float32).min).view(1, 1, 1, T).expand(B, 1, 1, T)


CASES = {
    "divided, padding mask": dict(mask=_padding_mask()),
    "multiplied": dict(scaling="multiply"),
    "unscaled": dict(scaling="none"),
    "mask first, permuted key": dict(mask=_padding_mask(), mask_first=True, permute_k=True),
    "float mask 2d": dict(mask=torch.randn(T, T, generator=torch.Generator().manual_seed(4))),
    "checkpointed": dict(mask=_padding_mask(), ckpt=True),
    "causal masked_fill (nanoGPT)": dict(scaling="nanogpt"),
}


def _step(model, call):
    x = torch.randn(B, T, E, generator=torch.Generator().manual_seed(3))
    for p in model.parameters():
        p.grad = None
    out = call(x)
    loss = out[0] if isinstance(out, tuple) else out
    loss.backward()
    return [loss.detach()] + [p.grad.clone() for p in model.parameters()]


def _jit(model, executors):
    return thunder.jit(model, transforms=[MemFuse(strict=True)], **({"executors": executors} if executors else {}))


EXECUTORS = [None, pytest.param(["torchcompile"], marks=pytest.mark.skipif(
    not tc.available(False), reason="torch.compile cannot build here (no C++ compiler)"))]


def _against_eager(kw, executors):
    """(the jitted Written(**kw), its attention summary) after one step whose gradients equal eager's."""
    torch.manual_seed(0)
    return _model_against_eager(Written(**kw), executors)


def _model_against_eager(model, executors):
    """(the jitted model, its attention summary) after one step whose gradients equal eager's."""
    eager = copy.deepcopy(model)
    want = _step(eager, eager)
    jm = _jit(model, executors)
    got = _step(model, jm)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    return jm, attention.attention_summary(thunder.compile_data(jm))


@pytest.mark.parametrize("executors", EXECUTORS, ids=["thunder", "torchcompile"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_chain_that_is_attention_runs_fused(case, executors):
    jm, summary = _against_eager(CASES[case], executors)
    assert summary["written_out"] == 1 and summary["fused"] >= 1 and summary["decomposed"] == [], summary
    fw, bw = thunder.last_traces(jm)[-1], thunder.last_backward_traces(jm)[-1]
    assert "memfuse_sdpa_cpu_backward" in [b.sym.name for b in bw.bound_symbols]
    from thunder.core.vjp_utils import get_saved_for_backward_tensors

    assert not any(tuple(t.shape) == (B, H, T, T) for t in get_saved_for_backward_tensors(fw))


@pytest.mark.parametrize("kw, why", [
    (dict(return_probs=True), "the probabilities are returned"),
    (dict(mask=_padding_mask(), scale_after_mask=True), "scaled after the mask"),
])
def test_a_chain_that_is_not_exactly_attention_stays_as_written(kw, why):
    jm, summary = _against_eager(kw, None)
    assert not summary or summary["written_out"] == 0, (why, summary)
    assert any(b.sym.name in ("_softmax", "softmax") for b in thunder.last_traces(jm)[0].bound_symbols), why


def test_a_dropout_that_draws_stays_the_users():
    """A dropout of nonzero probability is never matched: under one seed the numbers are plain Thunder's."""
    torch.manual_seed(0)
    model = Written(mask=_padding_mask(), dropout=0.2)
    plain = copy.deepcopy(model)
    jm, jp = _jit(model, None), thunder.jit(plain)
    torch.manual_seed(7)
    got = _step(model, jm)
    torch.manual_seed(7)
    want = _step(plain, jp)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    summary = attention.attention_summary(thunder.compile_data(jm))
    assert not summary or summary["written_out"] == 0, summary


def test_matching_is_memfuses_alone():
    """Plain Thunder keeps the chain (and saves the T x T probabilities), so the difference is memfuse's."""
    from thunder.core.vjp_utils import get_saved_for_backward_tensors

    torch.manual_seed(0)
    model = Written(mask=_padding_mask())
    jp = thunder.jit(model)
    _step(model, jp)
    assert any(tuple(t.shape) == (B, H, T, T) for t in get_saved_for_backward_tensors(thunder.last_traces(jp)[-1]))


class Biased(torch.nn.Module):
    """Bloom's attention as transformers writes it out: an ALiBi bias added by baddbmm over
    (batch * heads, T, T) views, a causal mask added after, a softmax in float32 and a cast back."""

    def __init__(self, *, scale_after=False, bias_grad=False):
        super().__init__()
        self.qkv = torch.nn.Linear(E, 3 * H * E)
        self.scale_after = scale_after
        bias = torch.randn(B * H, 1, T, generator=torch.Generator().manual_seed(5))
        self.bias = torch.nn.Parameter(bias) if bias_grad else None
        self.register_buffer("alibi", bias)
        causal = torch.triu(torch.full((T, T), torch.finfo(torch.float32).min), 1)
        self.register_buffer("causal", causal.view(1, 1, T, T).expand(B, 1, T, T).clone())

    def forward(self, x):
        q, k, v = self.qkv(x).view(B, T, 3, H, E).permute(2, 0, 3, 1, 4)
        q, v = q.reshape(B * H, T, E), v.reshape(B * H, T, E)
        k = k.reshape(B * H, T, E).transpose(-1, -2)
        bias = self.bias if self.bias is not None else self.alibi
        s = bias.baddbmm(batch1=q, batch2=k, beta=1.0, alpha=1 / math.sqrt(E))
        if self.scale_after:
            s = s * 0.5
        w = s.view(B, H, T, -1) + self.causal
        p = torch.nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        p = torch.nn.functional.dropout(p, 0.0, training=True)
        out = torch.bmm(p.view(B * H, T, -1), v)
        return (out.tanh() * 2).sum()


@pytest.mark.parametrize("executors", EXECUTORS, ids=["thunder", "torchcompile"])
def test_an_alibi_bias_added_by_baddbmm_runs_fused_and_saves_no_sum(executors):
    """Bloom's chain runs as memfuse_sdpa_cpu_biased (attention.py NOTE [an attention bias beside the
    mask]): the backward saves the bias and the mask, never their batch x heads x T x T sum."""
    from thunder.core.vjp_utils import get_saved_for_backward_tensors

    torch.manual_seed(0)
    jm, summary = _model_against_eager(Biased(), executors)
    assert summary["written_out"] == 1 and summary["fused"] >= 1 and summary["decomposed"] == [], summary
    bw = thunder.last_backward_traces(jm)[-1]
    assert "memfuse_sdpa_cpu_biased_backward" in [b.sym.name for b in bw.bound_symbols]
    saved = get_saved_for_backward_tensors(thunder.last_traces(jm)[-1])
    assert not any(tuple(t.shape) in ((B, H, T, T), (B * H, T, T)) for t in saved), [t.shape for t in saved]


def test_a_bias_that_needs_a_gradient_gets_it():
    """A bias made from a parameter (attention.py NOTE [a mask's gradient]): matched, and its gradient is
    eager's."""
    torch.manual_seed(0)
    model = Biased(bias_grad=True)
    jm, summary = _model_against_eager(model, None)
    assert summary["written_out"] == 1, summary
    assert model.bias.grad is not None and model.bias.grad.abs().sum() > 0


class RelativeBias(torch.nn.Module):
    """Swin's window attention as transformers writes it out: the scores plus a relative position bias
    gathered from a parameter table (a mask that needs a gradient, though its proxy does not say so)."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(E, 3 * H * E)
        self.table = torch.nn.Parameter(torch.randn(2 * T - 1, H) * 0.5)
        pos = torch.arange(T)
        self.register_buffer("index", (pos[:, None] - pos[None, :] + T - 1).reshape(-1))

    def forward(self, x):
        q, k, v = self.qkv(x).view(B, T, 3, H, E).permute(2, 0, 3, 1, 4)
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(E)
        s = s + self.table[self.index].view(T, T, H).permute(2, 0, 1).unsqueeze(0)
        p = torch.nn.functional.softmax(s, dim=-1)
        return (torch.matmul(p, v).tanh() * 2).sum()


def test_a_relative_position_bias_gets_its_gradient():
    """Swin's chain runs fused and its bias table's gradient is eager's (it was silently lost once)."""
    torch.manual_seed(0)
    model = RelativeBias()
    jm, summary = _model_against_eager(model, None)
    assert summary["written_out"] == 1, summary
    assert model.table.grad is not None and model.table.grad.abs().sum() > 0


@pytest.mark.parametrize("kw, why", [
    (dict(scale_after=True), "the scores are scaled after baddbmm added the bias"),
])
def test_a_biased_chain_that_is_not_exactly_attention_stays_as_written(kw, why):
    torch.manual_seed(0)
    jm, summary = _model_against_eager(Biased(**kw), None)
    assert not summary or summary["written_out"] == 0, (why, summary)
    assert any(b.sym.name in ("_softmax", "softmax") for b in thunder.last_traces(jm)[0].bound_symbols), why
