"""Elementwise ops on broadcast tensors computed at the broadcast's own shape.

NOTE [broadcasts kept small]  Encoders build their attention mask from a batch x tokens padding mask by
expanding it to batch x 1 x T x T and then converting, inverting and filling it (transformers'
`_prepare_4d_attention_mask`: `1.0 - mask[:, None, None, :].expand(b, 1, T, T).to(dtype)`, then a
`masked_fill` of its nonzeros with the dtype's minimum).  Each elementwise op on the expanded view
writes a dense batch x T x T tensor, and the last one is saved for the backward of every attention
that reads it: at a thousand tokens that tensor outweighs a layer's activations, at four thousand it
outweighs the model.  Eager never builds it where the mask is all ones (the model checks and passes
no mask), which a traced program cannot do.

An elementwise op gives every element from the same elements of its operands, so computed on the
operands before their expand and expanded after, it gives the same numbers, bit for bit, as a view
of a tensor of the small shape.  Before Thunder differentiates the computation trace, each such op
whose tensor operands need no gradient and are expands (or results of ops rewritten so) whose small
shape is smaller than its own is rewritten that way; the chain's last value becomes an expand of a
small tensor, which the fused attention kernels take as they are (attention.py NOTE [attention kept
whole]) and the backward saves at its small size.

A value is rewritten only where every reader of it takes a view as it takes a dense tensor: other
elementwise ops (out of place), expands and attention; a value returned, written in place, reshaped or read by
anything else keeps its dense form, and so do the ops it depends on only through it.  Random ops are
not elementwise here (their draws depend on the shape), so no draw of the user's program changes.
"""
from __future__ import annotations

from thunder.core.proxies import TensorProxy, variableify

from .._options import LOG

_EXPANDS = frozenset({"torch.Tensor.expand", "torch.expand", "torch.broadcast_to", "torch.Tensor.expand_as",
                      "torch.expand_as"})
# out-of-place elementwise ops (their Tensor-method spellings trace to these ids), and dtype conversions
_ELEMENTWISE = frozenset({
    "torch.add", "torch.sub", "torch.mul", "torch.true_divide", "torch.div", "torch.neg", "torch.abs",
    "torch.eq", "torch.ne", "torch.lt", "torch.le", "torch.gt", "torch.ge",
    "torch.logical_and", "torch.logical_or", "torch.logical_not", "torch.logical_xor",
    "torch.bitwise_and", "torch.bitwise_or", "torch.bitwise_not", "torch.bitwise_xor",
    "torch.where", "torch.masked_fill", "torch.minimum", "torch.maximum", "torch.clamp",
    "torch.Tensor.type_as",
})
_CONVERSIONS = frozenset({"torch.Tensor.to", "torch.to"})
_ATTENTION = frozenset({"torch.nn.functional.scaled_dot_product_attention"})


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _is_conversion_only(b) -> bool:
    """A .to() that changes at most the dtype (no device, no memory format)."""
    from thunder.core import devices

    if b.kwargs.get("device") is not None or b.kwargs.get("memory_format") is not None:
        return False
    return not any(isinstance(a, (str, devices.Device)) or type(a).__name__ == "device" for a in b.args[1:])


def _elementwise(b) -> bool:
    return b.sym.id in _ELEMENTWISE or (b.sym.id in _CONVERSIONS and _is_conversion_only(b))


def _tensors(b):
    return [a for a in b.flat_proxy_args if isinstance(a, TensorProxy)]


def _broadcast_shape(shapes):
    nd = max(len(s) for s in shapes)
    out = [1] * nd
    for s in shapes:
        for i, d in enumerate(s, nd - len(s)):
            if d != 1:
                out[i] = d
    return tuple(out)


def _plan(trace, excluded):
    """{id of an op to rewrite}, {name: the small shape of the value it or an expand gives}, given the ops
    `excluded` must stay dense."""
    small, rewrite = {}, set()
    for b in trace.bound_symbols:
        outs = [o for o in b.flat_proxy_outs if isinstance(o, TensorProxy)]
        if len(outs) != 1:
            continue
        out = outs[0]
        ins = _tensors(b)
        if b.sym.id in _EXPANDS and ins and not ins[0].requires_grad:
            src = ins[0]
            small[out.name] = small.get(src.name, tuple(src.shape))
            continue
        if not _elementwise(b) or id(b) in excluded or not ins or any(p.requires_grad for p in ins):
            continue
        if not any(p.name in small for p in ins):
            continue
        shape = _broadcast_shape([small.get(p.name, tuple(p.shape)) for p in ins])
        if _numel(shape) < _numel(out.shape):
            small[out.name] = shape
            rewrite.add(id(b))
    return rewrite, small


def keep_broadcasts_small(trace):
    """(trace with NOTE [broadcasts kept small]'s ops rewritten, how many); the trace itself where none is."""
    import thunder.torch as ltorch
    from thunder.core.trace import from_trace, reset_tracectx, set_tracectx
    from thunder.core.transform_common import dce

    if not any(b.sym.id in _EXPANDS for b in trace.bound_symbols):
        return trace, 0
    readers, outputs = {}, set()
    for b in trace.bound_symbols:
        if b.sym.name == "python_return":
            outputs.update(p.name for p in b.flat_proxy_args if isinstance(p, TensorProxy))
            continue
        for a in {a.name for a in _tensors(b)}:
            readers.setdefault(a, []).append(b)
    excluded = set()
    while True:  # each round keeps dense the ops a reader needs dense; the set only grows
        rewrite, _ = _plan(trace, excluded)
        dense = {id(b) for b in trace.bound_symbols if id(b) in rewrite and (
            b.output.name in outputs
            or any(id(r) not in rewrite and not _elementwise(r) and r.sym.id not in _ATTENTION | _EXPANDS
                   for r in readers.get(b.output.name, ())))}
        if not dense:
            break
        excluded |= dense
    if not rewrite:
        return trace, 0
    new = from_trace(trace)
    tok = set_tracectx(new)
    small = {}  # name: the proxy of the small tensor
    try:
        for b in trace.bound_symbols:
            ins = _tensors(b)
            if b.sym.id in _EXPANDS and ins and not ins[0].requires_grad:
                small[b.output.name] = small.get(ins[0].name, ins[0])
            if id(b) not in rewrite:
                new.bound_symbols.append(b)
                continue
            swap = {p.name: small[p.name] for p in ins if p.name in small}
            args = [swap.get(a.name, a) if isinstance(a, TensorProxy) else a for a in b.args]
            kwargs = {k: swap.get(a.name, a) if isinstance(a, TensorProxy) else a for k, a in b.kwargs.items()}
            scope = []
            new.push_scope(scope)
            try:
                r = b.sym(*args, **kwargs)
                out = ltorch.expand(r, tuple(b.output.shape))
            finally:
                new.pop_scope()
            small[b.output.name] = r
            new.bound_symbols.extend(x.from_bsym_swap_proxies({variableify(out): b.output}) for x in scope)
    finally:
        reset_tracectx(tok)
    LOG.info("memfuse: %d elementwise op(s) on broadcast tensors computed at their small shape", len(rewrite))
    return dce(new), len(rewrite)
