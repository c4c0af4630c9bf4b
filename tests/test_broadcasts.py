"""Elementwise ops on broadcast tensors (thunder_memfuse/integration/broadcasts.py NOTE [broadcasts kept
small]): with memfuse, the attention mask an encoder builds from its padding mask is computed at the
padding mask's shape and read as an expand, so no batch x T x T mask is made or saved; the numbers are
plain Thunder's, bit for bit; a value whose reader needs it dense keeps its dense form."""
import pytest
import torch
import thunder
import torch.nn.functional as F

from thunder_memfuse import MemFuse
from thunder_memfuse.integration import broadcasts
from thunder_memfuse.measure import cpu_peak_bytes
from thunder_memfuse.regions import torchcompile as tc

B, H, T, E = 2, 4, 256, 8


def _mask(m, dtype):
    """transformers' _prepare_4d_attention_mask, as an encoder calls it for scaled_dot_product_attention."""
    b, t = m.shape
    expanded = m[:, None, None, :].expand(b, 1, t, t).to(dtype)
    inverted = 1.0 - expanded
    return inverted.masked_fill(inverted.to(torch.bool), torch.finfo(dtype).min)


def encoder(q, k, v, m):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=_mask(m, torch.float32)).tanh().sum()


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, E, generator=g, requires_grad=True) for _ in range(3))
    m = torch.ones(B, T)
    m[1, T - 40:] = 0
    return q, k, v, m


def _step(fn, *args):
    for a in args:
        a.grad = None
    loss = fn(*args)
    loss.backward()
    return loss.detach(), [a.grad.clone() for a in args if a.requires_grad]


def _rewritten(fn, *args):
    """(the rewritten trace, how many ops) for the computation trace Thunder hands to memfuse."""
    jf = thunder.jit(fn)
    jf(*args)
    return broadcasts.keep_broadcasts_small(thunder.last_traces(jf)[0])


def _executors():
    return [None] + ([["torchcompile"]] if tc.available() else [])


@pytest.mark.parametrize("executors", _executors(), ids=lambda e: "default" if e is None else e[0])
def test_an_encoders_mask_is_kept_at_the_padding_masks_shape(executors, monkeypatch):
    args = _inputs()
    kw = {} if executors is None else {"executors": executors}
    ours = thunder.jit(encoder, transforms=[MemFuse(strict=True)], **kw)
    got = _step(ours, *args)
    # the same pass without the rewrite (memfuse's fused attention, unlike Thunder's decomposition,
    # is eager's kernel: plain Thunder's numbers differ from both by float rounding)
    monkeypatch.setattr(broadcasts, "keep_broadcasts_small", lambda t: (t, 0))
    plain = thunder.jit(encoder, transforms=[MemFuse(strict=True)], **kw)
    want = _step(plain, *args)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got, _step(thunder.jit(encoder, **kw), *args), rtol=1e-4, atol=1e-4)
    # the planned trace: the mask the attention reads is an expand of a batch x 1 x 1 x T tensor
    fw = thunder.last_traces(ours)[-1]
    attn = next(b for b in fw.bound_symbols if "sdpa" in b.sym.name)
    mask = attn.args[3]
    producers = {o.name: b for b in fw.bound_symbols for b in ([b] + list(b.subsymbols)) for o in b.flat_proxy_outs}
    assert producers[mask.name].sym.name == "expand", producers[mask.name]
    assert tuple(producers[mask.name].args[0].shape) == (B, 1, 1, T)
    # what the step allocates: without the rewrite, the mask (B x T x T floats) is made and saved
    _step(ours, *args)
    _step(plain, *args)
    mine, _ = cpu_peak_bytes(_step, ours, *args)
    theirs, _ = cpu_peak_bytes(_step, plain, *args)
    # (the step's peak is then in the fused backward, whose own buffers are not the mask's size: at
    # least half the mask's bytes come off it)
    assert mine <= theirs - B * T * T * 4 // 2, (mine, theirs)


def test_what_is_rewritten_and_what_stays_dense():
    args = _inputs()
    trace, n = _rewritten(encoder, *args)
    assert n == 4  # the conversion, the subtraction, the bool conversion and the masked_fill
    shapes = {b.sym.name: tuple(b.output.shape) for b in trace.bound_symbols if b.sym.name in ("sub", "masked_fill")}
    assert shapes == {"sub": (B, 1, 1, T), "masked_fill": (B, 1, 1, T)}

    def returned(q, k, v, m):  # the mask is an output: the caller may write into it
        mask = _mask(m, torch.float32)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum(), mask

    trace, n = _rewritten(returned, *args)
    assert n == 3  # all but the masked_fill, whose result is returned
    assert [tuple(b.output.shape) for b in trace.bound_symbols if b.sym.name == "masked_fill"] == [(B, 1, T, T)]

    def matmul(q, k, v, m):  # a reader that is neither elementwise nor attention: the last op stays dense
        return torch.matmul(_mask(m, torch.float32), v).sum()

    assert _rewritten(matmul, *args)[1] == 3

    def needs_grad(q, k, v, m):  # an operand that needs a gradient: its backward sums over the broadcast
        return (q[:, :1, :1, :1] + m[:, None, None, :1].expand(B, 1, T, 1)).sum()

    assert _rewritten(needs_grad, *args)[1] == 0

    def dense_operand(q, k, v, m):  # a full-size operand: nothing to gain
        return (m[:, None, None, :].expand(B, H, T, T) + torch.ones(B, H, T, T)).sum()

    assert _rewritten(dense_operand, *args)[1] == 0


def test_readers_that_need_it_dense_get_the_same_numbers():
    def in_place(q, k, v, m):
        mask = 1.0 - m[:, None, None, :].expand(B, 1, T, T)
        mask.mul_(-1e4)  # written in place: it stays dense
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum(), mask

    args = _inputs(1)
    ours = thunder.jit(in_place, transforms=[MemFuse(strict=True)])
    plain = thunder.jit(in_place)
    assert _rewritten(in_place, *args)[1] == 0
    (a, ma), (b, mb) = ours(*args), plain(*args)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # (Thunder decomposes the attention)
    torch.testing.assert_close(ma, mb, rtol=0, atol=0)
    assert ma.stride() == mb.stride()  # a dense tensor, as the user's program made it
    torch.testing.assert_close(a, in_place(*args)[0], rtol=1e-5, atol=1e-5)


def test_random_ops_on_broadcasts_keep_their_draws():
    def dropped(q, k, v, m):
        mask = F.dropout(m[:, None, None, :].expand(B, 1, T, T), 0.5) * 2.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum()

    args = _inputs(2)
    _, n = _rewritten(dropped, *args)
    assert n == 0
    ours = thunder.jit(dropped, transforms=[MemFuse(strict=True)])
    plain = thunder.jit(dropped)
    torch.manual_seed(7)
    a = ours(*args)
    torch.manual_seed(7)
    b = plain(*args)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # other draws would differ by far more
