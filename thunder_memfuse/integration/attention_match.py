"""Attention written out by hand, as one scaled_dot_product_attention call.

NOTE [attention written out]  Many models compute attention op by op rather than through
`F.scaled_dot_product_attention`: BERT-style encoders (ELECTRA, BERT with eager attention) write

    scores = q @ k.transpose(-1, -2) / sqrt(d) + mask;  probs = softmax(scores, -1);  out = probs @ v

Each of `scores` and `probs` is a batch x heads x T x T tensor, and `probs` is saved for the backward:
at a thousand tokens these dwarf everything else a step keeps.  torch.compile's Inductor rewrites such
chains into its fused attention (its joint-graph attention patterns); here the computation trace is
rewritten before Thunder differentiates it, so the chain becomes the `scaled_dot_product_attention`
call it computes and takes the fused kernels of NOTE [attention kept whole] (attention.py) with their
backward.  The numbers are those of a fused attention (within float tolerance of the chain's).

A chain is matched only where it is exactly attention: `matmul(p, v)` whose `p` is `softmax(s, -1)`
(through a dropout of probability 0, the kind a model in eval or with dropout off leaves in the
trace), whose `s` is `matmul(q, k^T)` (k^T a transpose or permute of k's last two dimensions) scaled by
Python numbers (`/ c` or `* c`) and then, optionally, plus a mask or filled with -inf where a boolean
tensor is true (nanoGPT's causal `masked_fill`: the call's boolean mask is its negation); every tensor in between is read by
the next op alone and is no output (a model returning its attention probabilities keeps its chain);
and the fused kernel takes the call (attention.declined: 4-D inputs of one floating dtype, a mask of the
query's dtype and 2-D or 4-D).  A dropout of nonzero probability is never
matched: the chain's own random draws stay the user's.  Anything else stays as written.

Bloom writes the same chain over (batch * heads, T, T) views: `baddbmm(alibi, q, k^T, beta, alpha)`,
viewed 4-D, plus its causal mask, `softmax(..., dtype=float32)` and a cast to the same dtype, then a
dropout and `bmm(probs viewed 3-D, v)`.  Such a chain (bmm or matmul for either product, casts that
change nothing, the views between (batch * heads) and (batch, heads)) is matched as well: q, k and v are
viewed 4-D, alpha is the scale, and beta * bias, viewed (batch, heads, 1, T), is an additive bias beside
the mask (attention.py NOTE [an attention bias beside the mask]); the scores scaled after baddbmm (which
would scale its bias) keep the chain as written.  A mask or bias made from parameters (Swin's relative
position bias) gets its gradient as a mask handed to the call does (attention.py NOTE [a mask's gradient]).
"""
from __future__ import annotations

import math
from numbers import Number

import thunder.core.dtypes as dtypes
from thunder.core.proxies import TensorProxy, variableify

from .._options import LOG
from .._symbols import is_view

_MATMUL, _SOFTMAX, _DROPOUT = "torch.matmul", "torch.softmax", "torch.nn.functional.dropout"
_DIVIDES, _MULTIPLIES, _ADD = ("torch.true_divide", "torch.div"), ("torch.mul",), "torch.add"
_TRANSPOSES = ("torch.transpose", "torch.permute")
_MASKED_FILL = "torch.masked_fill"
_BMM, _BADDBMM = "torch.bmm", "torch.baddbmm"
_VIEWS = ("torch.Tensor.view", "torch.reshape", "torch.Tensor.reshape")


def _last_two_swapped(b, k) -> bool:
    """Is b (a transpose or permute) k with its last two dimensions swapped?"""
    nd = k.ndim
    if b.sym.id == "torch.transpose":
        dims = sorted(d % nd for d in b.args[1:3]) if len(b.args) >= 3 else None
        return dims == [nd - 2, nd - 1]
    perm = b.args[1:] if len(b.args) > 2 else (b.args[1] if len(b.args) > 1 else None)
    perm = tuple(perm[0]) if perm and isinstance(perm[0], (tuple, list)) else tuple(perm or ())
    return len(perm) == nd and tuple(d % nd for d in perm) == tuple(range(nd - 2)) + (nd - 1, nd - 2)


def _flat_view(b, x, lead) -> bool:
    """Is b a view or reshape of x between (batch, heads, ...) and (batch * heads, ...)? lead: the 4-D
    side's (batch, heads)."""
    y = b.output
    if b.sym.id not in _VIEWS or not isinstance(y, TensorProxy) or not isinstance(x, TensorProxy):
        return False
    four, three = (x, y) if x.ndim == 4 else (y, x)
    return (four.ndim == 4 and three.ndim == 3 and tuple(four.shape[:2]) == tuple(lead)
            and four.shape[0] * four.shape[1] == three.shape[0] and tuple(four.shape[2:]) == tuple(three.shape[1:]))


def _match(b, producer, consumers, outputs):
    """(q, k, v, mask, scale, the bound symbols the call replaces, filled, flat, bias) for the chain ending
    at matmul b, or None (NOTE [attention written out]).  flat: (batch, heads) where the chain runs on
    (batch * heads, T, T) views (Bloom's bmm); bias: (tensor, beta) a baddbmm adds to the scores."""
    def only_feeds(p, b2):
        return (isinstance(p, TensorProxy) and p.name not in outputs
                and [id(c) for c in consumers.get(p.name, ())] == [id(b2)])

    if len(b.args) != 2 or not all(isinstance(a, TensorProxy) for a in b.args):
        return None
    p, v = b.args
    chain = [b]
    prev = b
    pb = producer.get(p.name)
    flat = None
    if p.ndim == 3:  # bmm(probs.view(batch * heads, T, T), v): the chain below is 4-D
        if pb is None or not isinstance(pb.args[0], TensorProxy) or pb.args[0].ndim != 4 or v.ndim != 3:
            return None
        flat = tuple(pb.args[0].shape[:2])
        if not _flat_view(pb, pb.args[0], flat) or not only_feeds(p, prev):
            return None
        chain.append(pb)
        prev, p = pb, pb.args[0]
        pb = producer.get(p.name)
    # a dropout of probability 0, or a cast that changes nothing (Bloom's softmax(..., dtype=float32).to(float32))
    while pb is not None and (pb.sym.id == _DROPOUT or (pb.sym.name in ("to", "type_as") and is_view(pb))):
        if pb.sym.id == _DROPOUT:  # dropout(p, 0.0, training, inplace)
            prob = pb.args[1] if len(pb.args) > 1 else pb.kwargs.get("p", 0.5)
            if not (isinstance(prob, Number) and prob == 0):
                return None
        if not only_feeds(p, prev):
            return None
        chain.append(pb)
        prev, p = pb, pb.args[0]
        pb = producer.get(p.name)
    if pb is None or pb.sym.id != _SOFTMAX or not only_feeds(p, prev):
        return None
    s = pb.args[0]
    dim = pb.args[1] if len(pb.args) > 1 else pb.kwargs.get("dim")
    if not isinstance(s, TensorProxy) or not isinstance(dim, int) or dim % s.ndim != s.ndim - 1:
        return None
    want = pb.kwargs.get("dtype")
    if want is not None and dtypes.to_dtype(want) != s.dtype:  # a softmax in another dtype than the scores'
        return None
    chain.append(pb)
    prev, sb = pb, producer.get(s.name)
    mask, scale = None, 1.0
    fill = None  # masked_fill(scores, cond, -inf): the mask is not cond
    if sb is not None and sb.sym.id == _MASKED_FILL and only_feeds(s, prev):
        cond, value = (list(sb.args[1:3]) + [sb.kwargs.get("mask"), sb.kwargs.get("value")])[:2]
        if not (isinstance(cond, TensorProxy) and isinstance(value, Number) and value == -math.inf
                and isinstance(sb.args[0], TensorProxy)):
            return None
        fill, s = cond, sb.args[0]
        chain.append(sb)
        prev, sb = sb, producer.get(s.name)
    elif sb is not None and sb.sym.id == _ADD and only_feeds(s, prev) and sb.kwargs.get("alpha", 1) == 1:
        # scores + mask, either way round: the scores are the operand a matmul or a scaling made
        for x, m in (sb.args[:2], sb.args[1::-1]):
            xb = producer.get(x.name) if isinstance(x, TensorProxy) else None
            if (xb is not None and isinstance(m, TensorProxy) and tuple(x.shape) == tuple(s.shape)
                    and (xb.sym.id == _MATMUL or xb.sym.id in _DIVIDES + _MULTIPLIES
                         or (flat is not None and xb.sym.id in _VIEWS))):
                mask, s = m, x
                break
        else:
            return None
        chain.append(sb)
        prev, sb = sb, producer.get(s.name)
    while sb is not None and sb.sym.id in _DIVIDES + _MULTIPLIES and only_feeds(s, prev):
        a, c = sb.args[:2]
        if sb.sym.id in _DIVIDES and isinstance(a, TensorProxy) and isinstance(c, Number) and c != 0:
            scale, s = scale / c, a
        elif sb.sym.id in _MULTIPLIES and isinstance(a, TensorProxy) and isinstance(c, Number):
            scale, s = scale * c, a
        elif sb.sym.id in _MULTIPLIES and isinstance(c, TensorProxy) and isinstance(a, Number):
            scale, s = scale * a, c
        else:
            return None
        if sb.sym.id == "torch.div" and sb.kwargs.get("rounding_mode") is not None:
            return None
        chain.append(sb)
        prev, sb = sb, producer.get(s.name)
    bias = None
    if flat is not None:  # the 4-D scores are a view of bmm(q, k^T) or baddbmm(bias, q, k^T), all 3-D
        if sb is None or not only_feeds(s, prev) or not _flat_view(sb, sb.args[0], flat):
            return None
        chain.append(sb)
        prev, s = sb, sb.args[0]
        sb = producer.get(s.name)
        if sb is not None and sb.sym.id == _BADDBMM and only_feeds(s, prev) and len(sb.args) >= 3:
            extra = dict(zip(("beta", "alpha"), sb.args[3:5]), **sb.kwargs)
            beta, alpha = extra.get("beta", 1), extra.get("alpha", 1)
            x = sb.args[0]
            if (scale != 1.0 or extra.get("out") is not None or not isinstance(beta, Number)
                    or not isinstance(alpha, Number) or not isinstance(x, TensorProxy) or x.ndim != 3
                    or x.shape[0] not in (1, s.shape[0])):
                return None  # a scaling after baddbmm would scale its bias too
            bias, scale = (x, beta), float(alpha)
            chain.append(sb)
            q, kt = sb.args[1:3]
        elif sb is not None and sb.sym.id in (_BMM, _MATMUL) and only_feeds(s, prev) and len(sb.args) == 2:
            chain.append(sb)
            q, kt = sb.args
        else:
            return None
    elif sb is None or sb.sym.id != _MATMUL or not only_feeds(s, prev) or len(sb.args) != 2:
        return None
    else:
        q, kt = sb.args
        chain.append(sb)
    kb = producer.get(kt.name) if isinstance(kt, TensorProxy) else None
    if kb is None or kb.sym.id not in _TRANSPOSES or not isinstance(kb.args[0], TensorProxy):
        return None
    k = kb.args[0]
    if not isinstance(q, TensorProxy) or not _last_two_swapped(kb, k):
        return None
    if only_feeds(kt, chain[-1]):
        chain.append(kb)
    if fill is not None:  # declined() sees the boolean mask the call will take: its shape and dtype
        if fill.dtype != dtypes.bool8 or bias is not None:
            return None
        mask = fill
    if not _takes(q, k, v, mask, bias, scale, flat):
        return None
    if tuple(q.shape[:-1]) + (v.shape[-1],) != tuple(b.output.shape):
        return None
    return q, k, v, mask, scale, chain, fill is not None, flat, bias


def _takes(q, k, v, mask, bias, scale, flat) -> bool:
    """Does the fused kernel take the call the chain becomes (attention.declined, on the 4-D inputs and
    the one mask it is given)?"""
    from thunder.core.trace import detached_trace

    from .attention import declined

    if flat is None:
        return declined(q, k, v, mask, 0.0, False, scale=scale) in (None, "")
    if any(t.ndim != 3 or t.shape[0] != flat[0] * flat[1] for t in (q, k, v)):
        return False
    with detached_trace():
        q4, k4, v4 = (TensorProxy(like=t, shape=flat + tuple(t.shape[1:])) for t in (q, k, v))
        m4 = None
        if mask is not None or bias is not None:
            parts = [m for m in (mask, bias and bias[0]) if m is not None]
            if any(m.dtype != q.dtype for m in parts):
                return False
            if mask is not None and (mask.ndim != 4 or not _broadcasts_to(mask.shape, flat + (q.shape[1], k.shape[1]))):
                return False
            if bias is not None and not _broadcasts_to(bias[0].shape, (q.shape[0], q.shape[1], k.shape[1])):
                return False
            m4 = TensorProxy(like=parts[0], shape=flat + (q.shape[1], k.shape[1]), requires_grad=False)
        return declined(q4, k4, v4, m4, 0.0, False, scale=scale) in (None, "")


def _broadcasts_to(shape, target) -> bool:
    return len(shape) == len(target) and all(a in (1, t) for a, t in zip(shape, target))


_CALLS = ("torch.nn.functional.scaled_dot_product_attention", "memfuse_sdpa_cpu_biased")


def _writes(trace):
    """({tensor name: its storage's first tensor's name}, {storage name: the last position an op writes
    it in place}), through every op whose output may share an argument's storage (_aliases.aliases)."""
    from .. import _C, _symbols
    from ._aliases import aliases

    root, last = {}, {}
    for i, b in enumerate(trace.bound_symbols):
        args = b.flat_proxy_args
        if _symbols.effects(b) & _C.EFF_WRITES:
            for a in args:
                if isinstance(a, TensorProxy):
                    last[root.get(a.name, a.name)] = i
        for o, e in zip(b.flat_proxy_outs, aliases(b) or ()):
            if e is not None and isinstance(o, TensorProxy) and isinstance(args[e[0]], TensorProxy):
                root[o.name] = root.get(args[e[0]].name, args[e[0]].name)
    return root, last


def keep_apart_from_writes(trace):
    """NOTE [attention read again]  The fused call's backward reads its output, q, k, v, mask and bias as
    they were when it ran.  Eager's autograd refuses a program that writes one of them in place after the
    call, but only where eager picked a kernel that saves it (its math path saves the probabilities
    instead, and a chain written out by hand saves no output), and Thunder runs such a program: so where a
    later op writes the storage of one of them, the call gets a copy made before it (an input) or hands
    the program a copy of its result (the output), and its backward reads what it computed with.
    Returns (trace, how many copies)."""
    import thunder.torch as ltorch
    from thunder.core.trace import from_trace, reset_tracectx, set_tracectx

    from .. import _C, _symbols

    calls = [i for i, b in enumerate(trace.bound_symbols) if b.sym.id in _CALLS or b.sym.name in _CALLS]
    if not calls or not any(_symbols.effects(b) & _C.EFF_WRITES for b in trace.bound_symbols[calls[0]:]):
        return trace, 0
    root, last = _writes(trace)

    def later(t, i):
        return isinstance(t, TensorProxy) and last.get(root.get(t.name, t.name), -1) > i

    if not any(later(t, i) for i in calls for t in (*trace.bound_symbols[i].flat_proxy_args,
                                                    trace.bound_symbols[i].output)):
        return trace, 0
    new = from_trace(trace)
    tok = set_tracectx(new)
    swap, n, at = {}, 0, set(calls)
    try:
        for i, orig in enumerate(trace.bound_symbols):
            b = orig.from_bsym_swap_proxies(swap) if swap else orig
            if i not in at:
                new.bound_symbols.append(b)
                continue
            # the original names say which storages are written later; b reads them under their copies' names
            first = {t.name: t for t, o in zip(b.flat_proxy_args, orig.flat_proxy_args) if later(o, i)}
            new.push_scope(new.bound_symbols)  # the inputs' copies, then the call reading them
            try:
                before = {variableify(t): ltorch.clone(t) for t in first.values()}
            finally:
                new.pop_scope()
            new.bound_symbols.append(b.from_bsym_swap_proxies(before) if before else b)
            if later(b.output, i):  # the program's copy of the output, which later ops read instead
                new.push_scope(new.bound_symbols)
                try:
                    swap[variableify(b.output)] = ltorch.clone(b.output)
                finally:
                    new.pop_scope()
            n += len(before) + later(b.output, i)
    finally:
        reset_tracectx(tok)
    return new, n


def match_attention(trace):
    """(trace with each matched chain replaced by one scaled_dot_product_attention call, how many) (NOTE
    [attention written out]); the trace itself where none matched."""
    import thunder.torch as ltorch
    from thunder.core.trace import from_trace, reset_tracectx, set_tracectx

    from .attention import biased_attention

    if not any(b.sym.id == _SOFTMAX for b in trace.bound_symbols):
        return trace, 0
    producer, consumers, outputs = {}, {}, set()
    for b in trace.bound_symbols:
        if b.sym.name == "python_return":
            outputs.update(p.name for p in b.flat_proxy_args if isinstance(p, TensorProxy))
        for o in b.flat_proxy_outs:
            producer.setdefault(o.name, b)
        for a in {a.name for a in b.flat_proxy_args if isinstance(a, TensorProxy)}:
            consumers.setdefault(a, []).append(b)
    matches, replaced = {}, set()
    for b in trace.bound_symbols:
        if b.sym.id in (_MATMUL, _BMM) and isinstance(b.output, TensorProxy):
            m = _match(b, producer, consumers, outputs)
            if m is not None and not any(id(x) in replaced for x in m[5]):
                matches[id(b)] = m
                replaced.update(id(x) for x in m[5])
    if not matches:
        return trace, 0
    new = from_trace(trace)
    tok = set_tracectx(new)
    try:
        for b in trace.bound_symbols:
            m = matches.get(id(b))
            if m is None:
                if id(b) not in replaced:
                    new.bound_symbols.append(b)
                continue
            q, k, v, mask, scale, _, filled, flat, bias = m
            scope = []
            new.push_scope(scope)
            try:
                if filled:  # the positions masked_fill set to -inf take no part: a boolean mask of the others
                    mask = ltorch.logical_not(mask)
                if flat is not None:  # (batch * heads, T, d) -> (batch, heads, T, d), and back after
                    q, k, v = (ltorch.reshape(t, flat + tuple(t.shape[1:])) for t in (q, k, v))
                if bias is not None:  # baddbmm's beta * bias, added to the scaled scores before the mask
                    x, beta = bias
                    x = ltorch.reshape(x, (flat if x.shape[0] != 1 else (1, 1)) + tuple(x.shape[1:]))
                    x = x if beta == 1 else ltorch.mul(x, beta)
                    if x.device.type == "cpu":  # attention.py NOTE [an attention bias beside the mask]
                        out = biased_attention(q, k, v, mask, x, scale)
                    else:
                        out = ltorch.scaled_dot_product_attention(
                            q, k, v, x if mask is None else ltorch.add(x, mask), 0.0, False, scale=scale)
                else:
                    out = ltorch.scaled_dot_product_attention(q, k, v, mask, 0.0, False, scale=scale)
                if flat is not None:
                    out = ltorch.reshape(out, (flat[0] * flat[1],) + tuple(out.shape[2:]))
            finally:
                new.pop_scope()
            swap = {variableify(out): b.output}
            new.bound_symbols.extend(x.from_bsym_swap_proxies(swap) for x in scope)
    finally:
        reset_tracectx(tok)
    LOG.info("memfuse: %d attention chain(s) written out by hand run as scaled_dot_product_attention", len(matches))
    return new, len(matches)
