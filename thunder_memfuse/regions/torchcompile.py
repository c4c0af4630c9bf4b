"""The "torchcompile" region compiler: each memfuse region is built by Thunder's torch.compile
executor (thunder.executors.torch_compile.make_compiled), so Inductor compiles it: C++/OpenMP on
CPU, Triton on GPU.

What a region may hold is what that executor can claim (reductions, norms, softmax, not only
elementwise ops), less what would change a program's numbers or effects: random ops (Inductor draws
its own random numbers, so a fixed seed would not give plain Thunder's), in-place writes and other
ordered ops.

NOTE [extern ops in regions]: the cost model counts a region's inner values as never stored, which
holds for what Inductor fuses into its loops.  A matmul, a convolution or an attention kernel is an
extern call in Inductor's program: its inputs are stored in buffers, so a matmul inside a region
would let the planner believe values are free that exist (the seed: one region of all 40 ops, planned
0.25 MiB, measured 2.75).  Such ops therefore stay outside regions, with one exception the model
states exactly: an epilogue pair [gemm, elementwise op of its result alone] (mf_fuse.c NOTE
[epilogue pairs]), where Inductor writes the elementwise result over the GEMM's buffer, so the
pair stores one tensor, as planned.

NOTE [region compile cache]: a region is compiled once per program.  The key is the region's
Thunder program as Python source with every proxy renamed by order of first appearance, plus each
input's metadata (shape, dtype, device, requires_grad, kind): two regions with the same key compute
the same function of their positional inputs, so they share one compiled callable.  A model's
repeated blocks (each layer's regions, the checkpointed recomputation of a block) then compile
once, and so does a second thunder.jit of the same model; only the first call of a new key pays
for Dynamo and Inductor.  The cache is process-wide and bounded by the distinct programs seen.
"""
from __future__ import annotations

import functools
import io
import os
import subprocess
import tempfile
import threading
import tokenize

NAME = "torchcompile"

_cache: dict = {}
_cache_lock = threading.Lock()
stats = {"compiled": 0, "reused": 0}


# ------------------------------------------------------------------------------------------
# Is it usable here?


@functools.lru_cache(maxsize=None)
def available(cuda: bool = False) -> bool:
    """Can torch.compile build regions here?  On GPU Inductor needs Triton; on CPU a working C++
    compiler (the one Inductor would call), which is tried once on a one-line file."""
    try:
        if cuda:
            from torch.utils._triton import has_triton

            return bool(has_triton())
        return _cxx_works()
    except Exception:
        return False


def _cxx_works() -> bool:
    from torch._inductor import cpp_builder

    cxx = cpp_builder.get_cpp_compiler()
    with tempfile.TemporaryDirectory(prefix="memfuse_cxx_") as d:
        src = os.path.join(d, "probe.cpp")
        with open(src, "w") as f:
            f.write("extern \"C\" int memfuse_probe(int x) { return x + 1; }\n")
        r = subprocess.run([cxx, "-shared", "-fPIC", "-O0", "-o", os.path.join(d, "probe.so"), src],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        return r.returncode == 0 and os.path.exists(os.path.join(d, "probe.so"))


# ------------------------------------------------------------------------------------------
# What a region may hold


@functools.lru_cache(maxsize=1)
def _executor():
    from thunder.executors.torch_compile import torch_compile_ex

    return torch_compile_ex


_EXTERN_NAMES = frozenset({
    "matmul", "linear", "mm", "bmm", "addmm", "baddbmm", "addbmm", "einsum", "_scaled_mm",
    "conv1d", "conv2d", "conv3d", "convolution", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "scaled_dot_product_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
})


_ROWWISE_NAMES = frozenset({
    "softmax", "_softmax", "log_softmax", "_log_softmax", "layer_norm", "rms_norm", "group_norm",
    "batch_norm", "instance_norm", "cumsum", "cumprod", "logsumexp", "sort", "topk",
})


def is_extern(bsym) -> bool:
    """An op Inductor runs as an extern kernel (NOTE [extern ops in regions])."""
    from thunder.core.prims import OpTags
    from thunder.core.symbol import gather_tags

    if bsym.sym.name in _EXTERN_NAMES:
        return True
    try:
        return OpTags.MATMUL_OP in gather_tags(bsym)
    except Exception:
        return False


def epilogue_pair(gemm, act) -> bool:
    """May `act` run as the epilogue of extern op `gemm` in one region (NOTE [extern ops in
    regions])?  act is a pointwise op whose one tensor result has the shape and dtype of gemm's
    one tensor result, which is all it reads.  Pointwise: no reduction in it (a final trace's
    bound symbols do not always keep their prim decomposition, so this is read from tags and
    names, not from the prims)."""
    from thunder.core.prims import OpTags
    from thunder.core.proxies import TensorProxy
    from thunder.core.symbol import gather_tags

    try:
        if not is_extern(gemm) or not fusible(act) or act.sym.name in _ROWWISE_NAMES:
            return False
        if OpTags.REDUCTION_OP in gather_tags(act):
            return False
        g = [o for o in gemm.flat_proxy_outs if isinstance(o, TensorProxy)]
        a = [o for o in act.flat_proxy_outs if isinstance(o, TensorProxy)]
        if len(g) != 1 or len(a) != 1:
            return False
        reads = [p for p in act.flat_proxy_args if isinstance(p, TensorProxy)]
        return (all(p.name == g[0].name for p in reads) and tuple(g[0].shape) == tuple(a[0].shape)
                and g[0].dtype == a[0].dtype)
    except Exception:
        return False


def fusible(bsym) -> bool:
    """Can bsym be part of a torch.compile region: the torchcompile executor can claim it, its
    outputs are tensors, it is no extern op (NOTE [extern ops in regions]), and it neither draws
    random numbers nor has an ordered effect."""
    from thunder.core.proxies import TensorProxy

    from .. import _thunder

    try:
        if getattr(bsym.sym, "is_fusion", False):
            return False
        outs = [o for o in bsym.flat_outs if o is not None]
        if not outs or not all(isinstance(o, TensorProxy) for o in outs):
            return False
        if _thunder.is_random(bsym) or _thunder.effects(bsym) or is_extern(bsym):
            return False
        return bool(_executor().can_fuse(bsym))
    except Exception:
        return False


# ------------------------------------------------------------------------------------------
# Building a region


def program_key(bsyms, inputs, outputs):
    """NOTE [region compile cache]: (canonical source, input metadata) of a region."""
    from thunder.core import prims
    from thunder.core.codeutils import SigInfo
    from thunder.core.proxies import Proxy, TensorProxy
    from thunder.core.trace import TraceCtx

    trace = TraceCtx(None)
    trace.args = list(inputs)
    trace.kwargs = {}
    trace.bound_symbols = list(bsyms) + [prims.python_return.bind(list(outputs), output=None)]
    trace._siginfo = SigInfo("region")
    trace._siginfo.args = [(a.name, None) for a in inputs]
    names = {}

    def note(p):
        if isinstance(p, Proxy) and p.name not in names:
            names[p.name] = f"_v{len(names)}"

    for a in inputs:
        note(a)
    for b in bsyms:  # the printed program names top-level values only (comments are dropped)
        for p in list(b.flat_proxy_args) + list(b.flat_proxy_outs):
            note(p)
    src = trace.python(print_depth=1, include_decorators=False)
    toks = []
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            continue
        if tok.type == tokenize.NAME:
            toks.append(names.get(tok.string, tok.string))
        elif tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
            toks.append("\n")
        else:
            toks.append(tok.string)
    meta = tuple(
        ("tensor", tuple(d if isinstance(d, int) else repr(d) for d in a.shape), str(a.dtype), str(a.device),
         bool(a.requires_grad))
        if isinstance(a, TensorProxy) else (type(a).__name__, getattr(a, "python_type", None).__name__
                                            if getattr(a, "python_type", None) else None)
        for a in inputs
    )
    return " ".join(toks), meta, len(outputs)


def build(bsyms, inputs, outputs):
    """The compiled callable of a region (shared by every region with the same program).
    torch.compile compiles on the first call, so compile errors surface there."""
    from thunder.executors.torch_compile import make_compiled

    key = program_key(bsyms, inputs, outputs)
    fn = _cache.get(key)
    if fn is not None:
        stats["reused"] += 1
        return fn
    with _cache_lock:
        fn = _cache.get(key)
        if fn is None:
            fn = _cache[key] = make_compiled(list(bsyms), list(inputs), list(outputs))
            stats["compiled"] += 1
        else:
            stats["reused"] += 1
    return fn


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()
