"""Scaled dot-product attention kept whole on CPU tensors.

NOTE [attention kept whole]  Thunder's sdpa executor declines CPU tensors, so on a CPU Thunder
decomposes `scaled_dot_product_attention` into matmul, softmax and matmul: every attention matrix
(batch x heads x T x T) is made, and the softmax's result is saved for the backward.  That cost grows
with T squared, and no order, grouping or recomputation touches it.  Eager PyTorch and torch.compile
run torch's fused CPU attention (a flash-attention kernel, blocked over the key length) instead.

memfuse_sdpa_cpu, an operator executor that memfuse puts first in a compilation's executor list
(transform.py, wherever memfuse is in use), claims the op on CPU tensors and runs the same kernels as
eager: `aten._scaled_dot_product_flash_attention_for_cpu` for the forward, which also returns the
logsumexp of each query row, and its `_backward`, which recomputes the probabilities block by block
from it.  So a training step saves q, k, v, the output and the logsumexp (batch x heads x T floats),
never a T x T tensor, and the numbers are eager's.  To the planner each is one op whose outputs are
what it allocates (the output and the logsumexp; the three gradients); the kernels' per-thread
blocks, which do not grow with T squared, are not counted.

What the kernel cannot take falls back to Thunder's decomposition, with the reason logged once per
process at WARNING on the `thunder_memfuse` logger and counted per compilation (report()'s
"attention"): dropout (the CPU kernel has none), inputs that are not 4-D, key/value heads or batch that neither equal the query's nor broadcast to them from
1 (grouped-query attention with k and v not repeated), a value head size unlike the query's,
dtypes other than floating ones, a mask of another floating dtype than the query.  Boolean masks are
turned into the additive mask eager uses (False: -inf); a float mask that needs a gradient gets it
from the probabilities recomputed in the backward (NOTE [a mask's gradient]).  A key and value of one head (or batch)
broadcast over the query's (multi-query attention: Falcon, GPTBigCode) are expanded, a view the
kernels read by its strides; their gradients are the expanded ones' summed back (one query-sized
tensor each, for a moment).  CUDA tensors are left to Thunder's own sdpa and cuDNN executors.
"""
from __future__ import annotations

import math
import threading

import torch
import thunder.core.dtypes as dtypes
import thunder.torch as ltorch
from thunder.core.proxies import TensorProxy
from thunder.core.transforms import get_grad, put_grads
from thunder.extend import OperatorExecutor, register_executor

from .._options import LOG

NAME = "memfuse_sdpa_cpu"
ex = OperatorExecutor(NAME, version="0.1")
register_executor(ex)

_logged: set = set()
_lock = threading.Lock()


def _float_mask(mask, dtype):
    """The additive mask eager's fused path uses: a boolean mask's False is -inf."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, -math.inf)


def _fwd_meta(query, key, value, attn_mask, is_causal, scale):
    b, h, lq, _ = query.shape
    lse_dtype = dtypes.float64 if query.dtype == dtypes.float64 else dtypes.float32
    return (TensorProxy(like=query, shape=tuple(query.shape[:3]) + (value.shape[-1],)),
            TensorProxy(like=query, shape=(b, h, lq), dtype=lse_dtype, requires_grad=False))


def _dense(*ts):
    """Each tensor with its last dimension dense: the kernels read rows by pointer (torch's sdpa checks
    this before it picks them and falls back otherwise; called directly, a transposed query reads
    garbage)."""
    return tuple(t if t is None or t.size(-1) <= 1 or t.stride(-1) == 1 else t.contiguous() for t in ts)


def _fwd_impl(query, key, value, attn_mask, is_causal, scale):
    query, key, value, mask = _dense(query, key, value, _float_mask(attn_mask, query.dtype))
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, is_causal, attn_mask=mask, scale=scale)


sdpa_fwd = ex.register_operator("memfuse_sdpa_cpu_forward", meta=_fwd_meta, fn=_fwd_impl)


def _bwd_meta(grad, query, key, value, out, logsumexp, attn_mask, is_causal, scale):
    return TensorProxy(like=query), TensorProxy(like=key), TensorProxy(like=value)


def _bwd_impl(grad, query, key, value, out, logsumexp, attn_mask, is_causal, scale):
    grad, query, key, value, out, mask = _dense(grad, query, key, value, out, _float_mask(attn_mask, query.dtype))
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, query, key, value, out, logsumexp, 0.0, is_causal, attn_mask=mask, scale=scale)


sdpa_bwd = ex.register_operator("memfuse_sdpa_cpu_backward", meta=_bwd_meta, fn=_bwd_impl)


def _broadcasts(kv, query) -> bool:
    """Are key's (or value's) batch and heads each the query's or 1 (multi-query attention, as Falcon and
    GPTBigCode run it: one key/value head broadcast over the query's)?"""
    return all(kv.shape[i] in (1, query.shape[i]) for i in (0, 1))


def _expanded(kv, query):
    """kv broadcast to the query's batch and heads: a view, which the fused kernels read by its strides."""
    if tuple(kv.shape[:2]) == tuple(query.shape[:2]):
        return kv
    return ltorch.expand(kv, (query.shape[0], query.shape[1], kv.shape[2], kv.shape[3]))


def _summed(grad, kv):
    """The gradient of a broadcast key or value: the expanded one's, summed over what was broadcast."""
    dims = [i for i in (0, 1) if kv.shape[i] != grad.shape[i]]
    return ltorch.sum(grad, dims, keepdim=True) if dims else grad


def declined(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None):
    """Why the fused CPU kernel cannot run this call (None: it can; "" for non-CPU tensors, which are
    not this executor's to take or to report)."""
    tensors = [t for t in (query, key, value, attn_mask) if t is not None]
    if not all(isinstance(t, TensorProxy) for t in tensors):
        return "an argument is not a tensor"
    if any(t.device.type != "cpu" for t in tensors):
        return ""
    if not (isinstance(dropout_p, (int, float)) and dropout_p == 0):
        return "dropout (the CPU kernel has none)"
    if not isinstance(is_causal, bool) or not (scale is None or isinstance(scale, (int, float))):
        return "is_causal or scale is not a constant"
    if any(t.ndim != 4 for t in (query, key, value)):
        return "query, key and value are not 4-D (batch, heads, tokens, head size)"
    if any(not dtypes.is_float_dtype(t.dtype) for t in (query, key, value)) or not (
            query.dtype == key.dtype == value.dtype):
        return "query, key and value are not of one floating dtype"
    if not (_broadcasts(key, query) and _broadcasts(value, query)) or key.shape[2] != value.shape[2]:
        return ("key and value heads or batch neither equal the query's nor broadcast to them from 1 "
                "(grouped-query attention: repeat k and v)")
    if query.shape[-1] != key.shape[-1] or value.shape[-1] != query.shape[-1]:
        return "the value head size differs from the query's"
    if attn_mask is not None:
        if is_causal:
            return "both is_causal and an attention mask"
        if attn_mask.dtype != dtypes.bool8 and attn_mask.dtype != query.dtype:
            return f"an attention mask of dtype {attn_mask.dtype} for {query.dtype} inputs"
        if attn_mask.ndim not in (2, 4):
            return f"a {attn_mask.ndim}-D attention mask (the kernel takes 2-D or 4-D)"
    return None


def _note(reason, call=None) -> None:
    """Count a fused call (`call`: its query, key and value names, so a call Thunder transforms twice counts
    once) or name why one runs decomposed, on the compilation's data (attention_summary); a reason is also
    logged, once per process."""
    from thunder.core.compile_data import get_compile_data

    cd = get_compile_data()
    if cd is not None:
        seen = getattr(cd, "_memfuse_attention", None)
        if seen is None:
            seen = cd._memfuse_attention = {"fused": set(), "decomposed": set()}
        if reason is None:
            seen["fused"].add(call)
        else:
            seen["decomposed"].add(reason)
    if reason is None:
        return
    with _lock:
        if reason in _logged:
            return
        _logged.add(reason)
    LOG.warning("memfuse: scaled_dot_product_attention on CPU tensors runs decomposed (matmul, softmax, "
                "matmul: a tokens x tokens tensor per head): %s", reason)


def note_written_out(cd, n: int) -> None:
    """Count n attention chains written out by hand that now run as one call (attention_match.py NOTE
    [attention written out]) on compile data `cd`."""
    if cd is not None and n:
        cd._memfuse_attention_written_out = getattr(cd, "_memfuse_attention_written_out", 0) + n


def attention_summary(cd) -> dict | None:
    """{"fused": attention calls that took the fused kernels, "decomposed": sorted reasons some did not,
    "written_out": of the calls, those memfuse found written out by hand} for compile data `cd`; None where
    no attention on CPU tensors was seen."""
    seen = getattr(cd, "_memfuse_attention", None)
    if seen is None:
        return None
    return {"fused": len(seen["fused"]), "decomposed": sorted(seen["decomposed"]),
            "written_out": getattr(cd, "_memfuse_attention_written_out", 0)}


def _checker(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None) -> bool:
    reason = declined(query, key, value, attn_mask, dropout_p, is_causal, scale=scale)
    if reason == "":
        return False
    if reason is not None:  # Thunder may ask more than once per call: fused calls are counted where they run
        _note(reason)
    return reason is None


def _execution(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None):
    _note(None, (query.name, key.name, value.name))
    out, _ = sdpa_fwd(query, _expanded(key, query), _expanded(value, query), attn_mask, is_causal, scale)
    return out


def _grad(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None):
    _note(None, (query.name, key.name, value.name))
    k, v = _expanded(key, query), _expanded(value, query)
    out, lse = sdpa_fwd(query, k, v, attn_mask, is_causal, scale)
    g = get_grad(out)
    gq, gk, gv = sdpa_bwd(g, query, k, v, out, lse, attn_mask, is_causal, scale)
    put_grads((query, key, value), (gq, _summed(gk, key), _summed(gv, value)))
    _put_mask_grads(g, query, k, v, scale, attn_mask)
    return out


def _put_mask_grads(g, query, key, value, scale, *masks):
    """NOTE [a mask's gradient]  The kernels give no gradient for an additive mask, and before Thunder
    differentiates a trace its proxies do not say which values need one (an intermediate's requires_grad
    is False whatever it is made from): a mask made from a parameter (Swin's relative position bias,
    a learned bias handed to scaled_dot_product_attention) would silently get none.  So each float mask
    (and an attention bias beside it) is given its gradient, the scores' gradient summed to its shape,
    made from the probabilities recomputed in the backward (a tokens x tokens tensor while it runs).
    Where nothing needs it, nothing reads it and Thunder drops it with its ops: no mask from a padding
    mask or a constant pays for it."""
    masks = [m for m in masks if m is not None and dtypes.is_float_dtype(m.dtype)]
    if not masks:
        return
    kt = ltorch.transpose(key, -2, -1)
    sc = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    s = ltorch.mul(ltorch.matmul(query, kt), sc)
    for m in masks:
        s = ltorch.add(s, m)
    p = ltorch.softmax(s, -1)
    dp = ltorch.matmul(g, ltorch.transpose(value, -2, -1))
    ds = ltorch.mul(p, ltorch.sub(dp, ltorch.sum(ltorch.mul(dp, p), -1, keepdim=True)))
    put_grads(masks, [_reduced(ds, m) for m in masks])


def _reduced(grad, x):
    """A gradient of grad's shape summed to x's, which broadcasts to it."""
    lead = grad.ndim - x.ndim
    if lead:
        grad = ltorch.sum(grad, list(range(lead)))
    dims = [i for i in range(x.ndim) if x.shape[i] == 1 and grad.shape[i] != 1]
    return ltorch.sum(grad, dims, keepdim=True) if dims else grad


ex.register_implementation(ltorch.scaled_dot_product_attention, checker=_checker, execution_transform=_execution,
                           grad_transform=_grad)


# NOTE [an attention bias beside the mask]  Bloom adds an ALiBi bias (batch x heads x 1 x T) to its
# scores and a causal mask (batch x 1 x T x T) after: the one mask the kernels take is their sum,
# batch x heads x T x T, which the backward would read, so the forward would save it, per layer.
# Matched chains with such a bias (attention_match.py) call memfuse_sdpa_cpu_biased instead: the bias
# and the mask are its operands, and its forward and backward kernels each make the sum for the call,
# so the backward saves the two small ones.  Each also returns that sum, a tensor nothing reads: the
# planner sees the bytes the call holds while it runs, and Thunder frees it right after.
def _sum_meta(query, attn_mask, attn_bias):
    shape = tuple(attn_bias.shape)
    if attn_mask is not None:  # both 4-D (attention_match.py): each dimension the larger
        shape = tuple(max(a, b) for a, b in zip(shape, attn_mask.shape))
    return TensorProxy(like=query, shape=shape, requires_grad=False)


def _kernel_mask(mask, bias, dtype):
    """The one additive mask the kernels take: bias plus the mask's (_float_mask)."""
    mask = _float_mask(mask, dtype)
    return bias + mask if mask is not None else bias


def _biased_meta(query, key, value, attn_mask, attn_bias, scale):
    return _fwd_meta(query, key, value, None, False, scale) + (_sum_meta(query, attn_mask, attn_bias),)


def _biased_impl(query, key, value, attn_mask, attn_bias, scale):
    m = _kernel_mask(attn_mask, attn_bias, query.dtype)
    return (*_fwd_impl(query, key, value, m, False, scale), m)


def _biased_bwd_meta(grad, query, key, value, out, logsumexp, attn_mask, attn_bias, scale):
    return _bwd_meta(grad, query, key, value, out, logsumexp, None, False, scale) + (
        _sum_meta(query, attn_mask, attn_bias),)


def _biased_bwd_impl(grad, query, key, value, out, logsumexp, attn_mask, attn_bias, scale):
    m = _kernel_mask(attn_mask, attn_bias, query.dtype)
    return (*_bwd_impl(grad, query, key, value, out, logsumexp, m, False, scale), m)


biased_fwd = ex.register_operator("memfuse_sdpa_cpu_biased_forward", meta=_biased_meta, fn=_biased_impl)
biased_bwd = ex.register_operator("memfuse_sdpa_cpu_biased_backward", meta=_biased_bwd_meta, fn=_biased_bwd_impl)


def _biased_out_meta(query, key, value, attn_mask, attn_bias, scale):
    return _fwd_meta(query, key, value, None, False, scale)[0]


def _biased_out_impl(query, key, value, attn_mask, attn_bias, scale):
    return _biased_impl(query, key, value, attn_mask, attn_bias, scale)[0]


biased_attention = ex.register_operator("memfuse_sdpa_cpu_biased", meta=_biased_out_meta, fn=_biased_out_impl)


def _biased_execution(query, key, value, attn_mask, attn_bias, scale):
    _note(None, (query.name, key.name, value.name))
    out, _, _ = biased_fwd(query, _expanded(key, query), _expanded(value, query), attn_mask, attn_bias, scale)
    return out


def _biased_grad(query, key, value, attn_mask, attn_bias, scale):
    _note(None, (query.name, key.name, value.name))
    k, v = _expanded(key, query), _expanded(value, query)
    out, lse, _ = biased_fwd(query, k, v, attn_mask, attn_bias, scale)
    g = get_grad(out)
    gq, gk, gv, _ = biased_bwd(g, query, k, v, out, lse, attn_mask, attn_bias, scale)
    put_grads((query, key, value), (gq, _summed(gk, key), _summed(gv, value)))
    _put_mask_grads(g, query, k, v, scale, attn_mask, attn_bias)
    return out


ex.register_implementation(biased_attention, execution_transform=_biased_execution, grad_transform=_biased_grad)


def add_to(cd) -> None:
    """Put memfuse_sdpa_cpu first in compile data `cd`'s executor list (None: outside a compilation)."""
    if cd is None:
        return
    executors = tuple(cd.executors_list)
    if any(e is ex for e in executors):
        return
    cd.executors_list = (ex,) + executors
