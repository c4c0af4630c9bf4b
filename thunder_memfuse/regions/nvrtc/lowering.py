"""Thunder side of the NVRTC compiler: which bound symbols a generated elementwise kernel can hold
(fusible_bsym), and their lowering to the flat region program of csrc/cuda/mf_codegen.c
(NOTE [region format]).

NOTE [lowering]
  1. Every bound symbol is flattened to its leaf prims (bsym.sym.id is a PrimIDs member).
  2. The iteration space S is the shape of the largest region output.  Each value is computed
     "at a point of S" through a mapping: for each of the value's dims, the axis of S it
     follows, or None (broadcast: index 0).  Outputs are seeded with an identity / right-aligned
     mapping; a backward pass over the leaves pushes mappings to the arguments
     (broadcast_in_dim, transpose, squeeze and size-1 reshapes only change the mapping;
     elementwise prims keep it).  A value needed under two mappings is computed twice.
  3. A forward pass emits one instruction per (value, mapping); region inputs become kernel
     inputs per (tensor, mapping), i.e. per stride vector over S.
  4. At call time the strides are computed from the real tensors, dims of S are collapsed where
     every operand allows it, and the kernel variant (ndim, 32/64-bit index, contiguous) is
     generated, compiled (cached) and launched on PyTorch's current stream.  Outputs are
     allocated with torch.empty, so the caching allocator sees every byte.

NOTE [per-op lowering]
  The C reader asks fusible_bsym of every bound symbol of every trace, and kernel.py lowers each
  region of them again when it builds it.  What depends on one op alone is worked out once per
  bound symbol and kept for both: its leaf prims, each leaf checked (kernel code for it, one
  tensor out, supported dtypes, int shapes: step 1 and _lower's checks), and whether it lowers as
  a region of its own (fusible_bsym's answer).  What depends on the region (the iteration space,
  the mappings, the instructions) is still built per region.  The entries are keyed on the bound
  symbol's identity: Thunder never changes a bound symbol once made (a transform makes new ones),
  so the entry holds as long as the object lives.  Each holds a weak reference to its bound
  symbol: the entry goes when the bound symbol does, and an object that later reuses the address
  is never taken for it.  A bound symbol that cannot be weakly referenced is lowered every time.
"""
from __future__ import annotations

import functools
import math
import struct
import weakref
from numbers import Number

from ... import _C

SUPPORTED_DTYPES = (
    "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
)

# ---------------------------------------------------------------------------------------------
# Thunder side: leaves, dtypes, support


class _Unsupported(Exception):
    pass


@functools.lru_cache(maxsize=1)
def _thunder():
    import thunder.core.dtypes as dtypes
    from thunder.core.prims import PrimIDs
    from thunder.core.proxies import NumberProxy, TensorProxy

    return dtypes, PrimIDs, TensorProxy, NumberProxy


@functools.lru_cache(maxsize=1)
def _codegen_info() -> dict:
    return _C.cuda_codegen_info()


def _codegen_ops() -> dict:
    return _codegen_info()["ops"]


@functools.lru_cache(maxsize=None)
def _torch_dtype_name(tdtype) -> str | None:
    name = str(tdtype).replace("torch.", "")
    return name if name in SUPPORTED_DTYPES else None


def _dtype_name(dtype) -> str:
    """Thunder or torch dtype -> our dtype name; _Unsupported otherwise."""
    import torch

    if isinstance(dtype, torch.dtype):
        name = _torch_dtype_name(dtype)
    else:
        dtypes = _thunder()[0]
        try:
            name = _torch_dtype_name(dtypes.to_torch_dtype(dtype))
        except (ValueError, KeyError):  # not a Thunder dtype, or one torch has no dtype for
            name = None
    if name is None:
        raise _Unsupported(f"dtype {dtype} is not supported")
    return name


_SHAPE_PRIMS = ("BROADCAST_IN_DIM", "TRANSPOSE", "SQUEEZE", "RESHAPE")
# Prims whose value is their argument's value (no instruction): clone materializes only where it
# is a region output, which is exactly a copy.
_PASS_PRIMS = ("CLONE",)
_SKIP_PRIMS = ("DEL", "COMMENT")


def _prim_name(bsym) -> str | None:
    PrimIDs = _thunder()[1]
    sid = bsym.sym.id
    return sid.name if isinstance(sid, PrimIDs) else None


def _leaves(bsym, out: list) -> list:
    """Leaf prims of bsym, in order (NOTE [lowering] 1)."""
    name = _prim_name(bsym)
    if name is not None:
        if name not in _SKIP_PRIMS:
            out.append(bsym)
        return out
    if not bsym.subsymbols:
        raise _Unsupported(f"{bsym.sym.name} has no prim decomposition")
    for s in bsym.subsymbols:
        _leaves(s, out)
    return out


def _is_tensor(x) -> bool:
    return isinstance(x, _thunder()[2])


def _is_number_proxy(x) -> bool:
    return isinstance(x, _thunder()[3])


def _shape(p) -> tuple:
    shape = tuple(p.shape)
    for s in shape:
        if not isinstance(s, int):
            raise _Unsupported(f"symbolic shape {shape} of {p.name}")
    return shape


def _leaf_kind(leaf) -> str:
    """'shape', 'elementwise' (codegen op name = prim name lower-cased); _Unsupported otherwise."""
    name = _prim_name(leaf)
    if name in _SHAPE_PRIMS:
        return "shape"
    if name in _PASS_PRIMS:
        return "pass"
    op = name.lower() if name else None
    if op is None or op == "const" or op not in _codegen_ops():
        raise _Unsupported(f"prim {leaf.sym.name} has no kernel code")
    return "elementwise"


def _leaf_output(leaf):
    out = leaf.output
    if not _is_tensor(out):
        raise _Unsupported(f"{leaf.sym.name} does not produce one tensor")
    return out


def view_only_bsym(bsym) -> bool:
    """True when every leaf of bsym is a shape prim (a view in PyTorch: better left outside
    kernels, since a kernel output would materialize it)."""
    try:
        leaves = _leaves(bsym, [])
    except _Unsupported:
        return False
    return bool(leaves) and all(_prim_name(l) in _SHAPE_PRIMS for l in leaves)


# NOTE [per-op lowering]: id(bsym) -> its _OpRecord
_per_op: dict = {}
_SELF = object()  # a leaf that is the bound symbol itself (a prim): the entry must not hold it


class _OpRecord:
    __slots__ = ("ref", "leaves", "error", "fusible")

    def __init__(self, ref):
        self.ref = ref
        self.leaves = None    # the checked leaves (_SELF for bsym itself), once lowered
        self.error = None     # or why they cannot be lowered (an _Unsupported's message)
        self.fusible = None   # fusible_bsym's answer, once given


def _forget(key, ref) -> None:
    rec = _per_op.get(key)
    if rec is not None and rec.ref is ref:
        _per_op.pop(key, None)


def _record(bsym):
    """bsym's entry (NOTE [per-op lowering]), made on first use; None where bsym cannot be weakly
    referenced."""
    key = id(bsym)
    rec = _per_op.get(key)
    if rec is not None and rec.ref() is bsym:
        return rec
    try:
        ref = weakref.ref(bsym, functools.partial(_forget, key))
    except TypeError:
        return None
    rec = _per_op[key] = _OpRecord(ref)
    return rec


def _check_leaves(bsym) -> list:
    """bsym's leaf prims, each checked as _lower needs it; _Unsupported otherwise."""
    leaves = _leaves(bsym, [])
    for leaf in leaves:
        _leaf_kind(leaf)
        _dtype_name(_leaf_output(leaf).dtype)
        for a in leaf.args:
            if _is_tensor(a):
                _dtype_name(a.dtype)
                _shape(a)
    return leaves


def _op_leaves(bsym) -> list:
    """bsym's checked leaf prims, lowered once per bound symbol (NOTE [per-op lowering]);
    _Unsupported where it has none a kernel can hold."""
    rec = _record(bsym)
    if rec is None:
        return _check_leaves(bsym)
    if rec.leaves is None and rec.error is None:
        try:
            leaves = _check_leaves(bsym)
        except _Unsupported as e:
            rec.error = str(e)
        else:
            rec.leaves = tuple(_SELF if l is bsym else l for l in leaves)
    if rec.error is not None:
        raise _Unsupported(rec.error)
    return [bsym if l is _SELF else l for l in rec.leaves]


def fusible_bsym(bsym) -> bool:
    """Can bsym (at the level of a final execution trace, e.g. torch.nn.functional.relu) be part of
    one generated elementwise kernel?  All leaf prims supported, tensors of supported dtypes, at
    least one arithmetic leaf (pure views stay outside: see view_only_bsym), and the bound symbol
    on its own lowers to a valid region (shapes agree up to broadcasting).  Answered once per
    bound symbol (NOTE [per-op lowering])."""
    rec = _record(bsym)
    if rec is not None and rec.fusible is not None:
        return rec.fusible
    answer = _fusible(bsym)
    if rec is not None:
        rec.fusible = answer
    return answer


def _fusible(bsym) -> bool:
    from ..base import tensor_op

    try:
        if not tensor_op(bsym):
            return False
        outs = [o for o in bsym.flat_outs if o is not None]
        if all(_leaf_kind(l) == "shape" for l in _op_leaves(bsym)):
            return False
        inputs = []
        for a in bsym.flat_args:
            if (_is_tensor(a) or _is_number_proxy(a)) and all(a is not x for x in inputs):
                inputs.append(a)
        _lower([bsym], inputs, outs)
        return True
    except _Unsupported:
        return False
    except Exception as e:  # a case the lowering did not foresee: say so (once), keep the op out of kernels
        from ...errors import warn

        warn(f"memfuse nvrtc: {bsym.sym.name} stays out of generated kernels: lowering it raised "
             f"{type(e).__name__}: {e} (said once per op and exception type)",
             once=(__name__, str(bsym.sym.name), type(e).__name__))
        return False


# ---------------------------------------------------------------------------------------------
# Lowering (NOTE [lowering])


def _identity(n):
    return tuple(range(n))


def _seed_mapping(shape, S):
    """Right-aligned mapping of an output's dims onto S (numpy broadcasting)."""
    if len(shape) > len(S):
        raise _Unsupported(f"output of rank {len(shape)} in an iteration space of rank {len(S)}")
    off = len(S) - len(shape)
    m = []
    for i, s in enumerate(shape):
        ax = off + i
        if s == S[ax]:
            m.append(ax if s != 1 else ax)
        elif s == 1:
            m.append(None)
        else:
            raise _Unsupported(f"output shape {shape} does not broadcast to {S}")
    return tuple(m)


def _arg_mappings(leaf, m):
    """[(arg, mapping)] for the tensor arguments of leaf when its output is needed under m."""
    name = _prim_name(leaf)
    out = _leaf_output(leaf)
    out_shape = _shape(out)
    args = leaf.args
    if name == "BROADCAST_IN_DIM":
        a, bdims = args[0], tuple(args[2])
        a_shape = _shape(a)
        if len(bdims) != len(a_shape):
            raise _Unsupported("broadcast_in_dim: bad dims")
        am = []
        for i, d in enumerate(bdims):
            if a_shape[i] == 1 and out_shape[d] != 1:
                am.append(None)
            else:
                am.append(m[d])
        return [(a, tuple(am))]
    if name == "TRANSPOSE":
        a, perm = args[0], tuple(args[1])
        am = [None] * len(perm)
        for j, p in enumerate(perm):
            am[p] = m[j]
        return [(a, tuple(am))]
    if name == "SQUEEZE":
        a, dims = args[0], args[1]
        a_shape = _shape(a)
        dims = {d % len(a_shape) for d in (dims if isinstance(dims, (tuple, list)) else (dims,))}
        it = iter(m)
        return [(a, tuple(None if i in dims else next(it) for i in range(len(a_shape))))]
    if name in _PASS_PRIMS:
        if _shape(args[0]) != out_shape:
            raise _Unsupported(f"{leaf.sym.name} changes the shape")
        return [(args[0], m)]
    if name == "RESHAPE":
        a = args[0]
        a_shape = _shape(a)
        a_big = [i for i, s in enumerate(a_shape) if s != 1]
        o_big = [j for j, s in enumerate(out_shape) if s != 1]
        if [a_shape[i] for i in a_big] != [out_shape[j] for j in o_big]:
            raise _Unsupported("reshape other than adding/removing size-1 dims")
        am = [None] * len(a_shape)
        for i, j in zip(a_big, o_big):
            am[i] = m[j]
        return [(a, tuple(am))]
    # elementwise: tensor args have the output's shape
    res = []
    for a in args:
        if _is_tensor(a):
            if _shape(a) != out_shape:
                raise _Unsupported(f"{leaf.sym.name}: argument shape {a.shape} != output shape {out_shape}")
            res.append((a, m))
    return res


class _Program:
    """The lowered region: see csrc/cuda/mf_codegen.c NOTE [region format]."""

    def __init__(self):
        self.S = ()
        self.kinputs = []   # (kind, dtype name, arg position, mapping or None)
        self.instrs = []    # (op, args, dtype[, const])
        self.outputs = []   # (value id, guarded)
        self.out_info = []  # (shape, mapping, dtype name, position in the outputs list)
        self.n_out = 0      # len(outputs) given (duplicates map to the same kernel output)
        self.out_index = [] # per given output: index into self.outputs


def _lower(bsyms, inputs, outputs) -> _Program:
    leaves = []
    for b in bsyms:
        leaves.extend(_op_leaves(b))  # checked once per bound symbol (NOTE [per-op lowering])
    if not leaves:
        raise _Unsupported("empty region")
    producer = {leaf.output.name: leaf for leaf in leaves}
    in_pos = {}
    for i, p in enumerate(inputs):
        if _is_tensor(p) or _is_number_proxy(p):
            in_pos.setdefault(p.name, i)
    outs = list(outputs)
    if not outs:
        raise _Unsupported("region without outputs")
    for o in outs:
        if not _is_tensor(o):
            raise _Unsupported("non-tensor region output")
        if o.name not in producer:
            raise _Unsupported(f"output {o.name} is not computed in the region")
    shapes = [_shape(o) for o in outs]
    S = max(shapes, key=lambda s: (math.prod(s), len(s)))
    prog = _Program()
    prog.S = S

    # pass 1: backward, required mappings per value name
    required: dict[str, list] = {}

    def need(name, m):
        lst = required.setdefault(name, [])
        if m not in lst:
            lst.append(m)

    seen = {}
    for o, sh in zip(outs, shapes):
        if o.name in seen:
            continue
        m = _identity(len(S)) if sh == S else _seed_mapping(sh, S)
        seen[o.name] = m
        need(o.name, m)
    for leaf in reversed(leaves):
        out = leaf.output
        for m in list(required.get(out.name, ())):
            for a, am in _arg_mappings(leaf, m):
                if a.name not in producer and a.name not in in_pos:
                    raise _Unsupported(f"{a.name} is neither a region input nor computed in it")
                need(a.name, am)

    # pass 2: forward emission
    memo: dict = {}
    for name, pos in sorted(in_pos.items(), key=lambda kv: kv[1]):
        p = inputs[pos]
        if _is_tensor(p):
            for m in required.get(name, ()):
                memo[(name, m)] = len(prog.kinputs)
                prog.kinputs.append(("tensor", _dtype_name(p.dtype), pos, m))
    used_numbers = set()
    for leaf in leaves:
        for a in leaf.args:
            if _is_number_proxy(a):
                used_numbers.add(a.name)
    for name, pos in sorted(in_pos.items(), key=lambda kv: kv[1]):
        p = inputs[pos]
        if _is_number_proxy(p) and name in used_numbers:
            pt = getattr(p, "python_type", None)
            dt = "bool" if pt is bool else "int64" if pt is int else "float64" if pt is float else None
            if dt is None:
                raise _Unsupported(f"number input {name} of type {pt}")
            memo[(name, None)] = len(prog.kinputs)
            prog.kinputs.append(("scalar", dt, pos, None))
    n_in = len(prog.kinputs)
    consts: dict = {}

    def const_ref(x):
        if isinstance(x, bool):
            key, dt = ("b", bool(x)), "bool"
        elif isinstance(x, int):
            if not -(2**63) <= x < 2**63:
                raise _Unsupported("integer literal out of int64 range")
            key, dt = ("i", int(x)), "int64"
        elif isinstance(x, float):
            key, dt = ("f", struct.pack("<d", x)), "float64"
        else:
            raise _Unsupported(f"literal {x!r} of type {type(x).__name__}")
        if key not in consts:
            consts[key] = n_in + len(prog.instrs)
            prog.instrs.append(("const", (), dt, x if dt != "float64" else float(x)))
        return consts[key]

    def ref(a, m):
        if _is_tensor(a):
            return memo[(a.name, m)]
        if _is_number_proxy(a):
            if (a.name, None) in memo:
                return memo[(a.name, None)]
            v = getattr(a, "value", None)
            if isinstance(v, Number):
                return const_ref(v)
            raise _Unsupported(f"number {a.name} is not a region input")
        if isinstance(a, Number):
            return const_ref(a)
        raise _Unsupported(f"argument {a!r}")

    for leaf in leaves:
        out = leaf.output
        ms = required.get(out.name, ())
        if not ms:
            continue  # dead inside the region
        name = _prim_name(leaf)
        for m in ms:
            if name in _SHAPE_PRIMS or name in _PASS_PRIMS:
                (a, am), = _arg_mappings(leaf, m)
                memo[(out.name, m)] = memo[(a.name, am)]
                continue
            op = name.lower()
            if op == "convert_element_type":
                args = (ref(leaf.args[0], m),)
            else:
                if leaf.kwargs:
                    raise _Unsupported(f"{leaf.sym.name} with keyword arguments")
                if len(leaf.args) != _codegen_ops()[op]:
                    raise _Unsupported(f"{leaf.sym.name} with {len(leaf.args)} arguments")
                args = tuple(ref(a, m) for a in leaf.args)
            memo[(out.name, m)] = n_in + len(prog.instrs)
            prog.instrs.append((op, args, _dtype_name(out.dtype)))

    # outputs
    slot_of = {}
    for o, sh in zip(outs, shapes):
        if o.name in slot_of:
            prog.out_index.append(slot_of[o.name])
            continue
        m = seen[o.name]
        covered = {ax for ax in m if ax is not None}
        guarded = any(S[d] != 1 and d not in covered for d in range(len(S)))
        slot_of[o.name] = len(prog.outputs)
        prog.out_index.append(len(prog.outputs))
        prog.outputs.append((memo[(o.name, m)], guarded))
        prog.out_info.append((sh, m, _dtype_name(o.dtype)))
    prog.n_out = len(outs)
    # cheap structural check in C (also validates ops/dtypes combinations)
    try:
        _C.cuda_codegen(_region_tuple(prog, max(len(S), 1), False, False))
    except ValueError as e:
        raise _Unsupported(str(e)) from None
    return prog


def _region_tuple(prog: _Program, ndim: int, index64: bool, contiguous: bool):
    ins = [(k, dt) for k, dt, _, _ in prog.kinputs]
    return (ins, prog.instrs, prog.outputs, ndim, index64, contiguous)
