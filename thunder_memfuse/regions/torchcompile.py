"""The "torchcompile" region compiler: each memfuse region is compiled by Inductor, from the
program Thunder's torch.compile executor would hand it (thunder.executors.torch_compile.make_compiled):
C++/OpenMP on CPU, Triton on GPU, called without Dynamo (NOTE [regions without Dynamo]).

What a region may hold is what that executor can claim (reductions, norms, softmax, not only
elementwise ops), less what would change a program's numbers or effects: random ops (Inductor draws
its own random numbers, so a fixed seed would not give plain Thunder's), in-place writes and other
ordered ops.

NOTE [extern ops in regions]: the cost model counts a region's inner values as never stored, which
holds for what Inductor fuses into its loops.  A matmul, a convolution or an attention kernel is an
extern call in Inductor's program: its inputs and its result are stored in buffers.  Such an op may
join a region all the same, as STORED (fusible() returns 2, the core's MF_FUSIBLE_STORED): the
planner then counts every storage it reads or writes as stored while the region runs (mf_fuse.c
NOTE [stored inner values]), so a GEMM sits inside a region only where that does not raise the
peak, and the seed keeps its paths apart (benchmarks/RESULTS.md).  Fewer regions are fewer calls.  An epilogue pair
[gemm, elementwise op of its result alone] (mf_fuse.c NOTE [epilogue pairs]) keeps its exact rule:
Inductor writes the elementwise result over the GEMM's buffer, so the pair stores one tensor.

NOTE [scatters are stored]: Inductor lowers an op that writes scattered positions of a fresh tensor
(embedding_backward decomposes into zeros followed by an index_put; scatter, index_put, index_add,
index_copy themselves) to a buffer it must write in memory before anything reads it: no consumer's
loop can compute an element of it in place.  Such an op is STORED (_REALIZED_NAMES): its result and
what it reads count as stored while its region runs.  nll_loss_backward is the exception where
Inductor's joint-graph passes run (inductor_graph.py NOTE [Inductor's inference passes]): its decomposition scatters one
scalar per row into zeros, which the scatter-upon-constant pattern rewrites into a pointwise select, so
a cross-entropy's backward region [nll_loss_backward, log_softmax_backward] holds one logits-sized
buffer, not two (_REWRITTEN_SCATTERS).  Without those passes (Inductor configured not to run them) it
is stored, as the others: counted as an inner value, that region was planned at one tensor and its
program held two, and MemFuse(memory_budget=...) called a plan fitting that measured above the budget.

NOTE [functional region programs]: a region holds no in-place op of the trace, but the torch
implementations of some functional Thunder ops write in place inside (copy_with_setitem clones its
input, then assigns into the clone).  compile_fx_inner expects the functional graph AOTAutograd would
hand it; given the clone and the assignment as they are, it wrote into the region's input instead of
the clone (a backward's incoming gradient, which a view taken by an earlier region still read: found by
the differential fuzzer with executors=["torchcompile"]).  So the program is traced through
torch.func.functionalize (remove="mutations": views stay views, so a region's output that is a view of
its input is still one, as the cost model counts it).

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

from .._memo import memoized
from . import inductor_fixes, inductor_graph
from .base import (Group, InputsWritten, always, never, pair_by_roles, predicate, pure, region_trace, same_as_one_read,
                   tensor_op)
from .inductor_buffers import buffer_peak

name = "torchcompile"
compiles_regions = True
expects_unsupported = False
region_of_one = never
accepts = always

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
    except Exception as e:  # any failure to tell is a no (regions.resolve says what that means)
        from .._options import LOG

        LOG.info("memfuse: torch.compile cannot build regions here: %s: %s", type(e).__name__, e)
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


_REALIZED_NAMES = frozenset({  # NOTE [scatters are stored]
    "nll_loss_backward", "nll_loss2d_backward", "embedding_backward", "embedding_dense_backward",
    "scatter", "scatter_add", "scatter_reduce", "index_put", "index_add", "index_copy", "masked_scatter",
})
_REWRITTEN_SCATTERS = frozenset({"nll_loss_backward", "nll_loss2d_backward"})  # ... unless the passes rewrite them


def _scatter_upon_constants_rewritten() -> bool:
    """Will Inductor's joint-graph passes turn a scatter of a scalar into zeros into a pointwise
    select, in the programs memfuse compiles (inductor_graph.py NOTE [Inductor's inference passes])?"""
    try:
        from torch._inductor import config
    except Exception:  # noqa: BLE001 - no Inductor: nothing is rewritten
        return False
    return bool(inductor_graph.joint_graph_passes() is not None and config.use_joint_graph_passes and config.pattern_matcher
                and getattr(config, "optimize_scatter_upon_const_tensor", False))


def is_realized(bsym) -> bool:
    """Does Inductor always write bsym's result to a buffer of its own (NOTE [scatters are stored])?
    Read from the names: Thunder's (nll_loss_backward), its torch executor's
    (torch_nll_loss_backward_impl) and aten's (torch.ops.aten.embedding_backward)."""
    from .._symbols import _base_name

    for n in {_base_name(bsym.sym.name), _base_name(bsym.sym.id)}:
        if n.startswith("torch_") and n.endswith("_impl"):
            n = n[len("torch_"):-len("_impl")]
        if _realized_name(n):
            return True
    return False


def _realized_name(n: str) -> bool:
    n = n.lstrip("_").removesuffix("_")
    return n in _REALIZED_NAMES and (n not in _REWRITTEN_SCATTERS or not _scatter_upon_constants_rewritten())


_ROWWISE_NAMES = frozenset({
    "softmax", "_softmax", "log_softmax", "_log_softmax", "layer_norm", "rms_norm", "group_norm",
    "batch_norm", "instance_norm", "cumsum", "cumprod", "logsumexp", "sort", "topk",
})


@memoized
@predicate(False)
def is_extern(bsym) -> bool:
    """An op Inductor runs as an extern kernel (NOTE [extern ops in regions])."""
    from thunder.core.prims import OpTags
    from thunder.core.symbol import gather_tags

    return bsym.sym.name in _EXTERN_NAMES or OpTags.MATMUL_OP in gather_tags(bsym)


@predicate(0)
def epilogue_role(bsym) -> int:
    """EPI_HEAD: an extern op with one tensor result (NOTE [extern ops in regions]); EPI_TAIL: a
    pointwise op of one tensor, with that tensor's shape and dtype (csrc/core/mf_build.c NOTE
    [epilogue candidates] pairs them).  Pointwise: no reduction in it (a final trace's bound
    symbols do not always keep their prim decomposition, so this is read from tags and names, not
    from the prims)."""
    from thunder.core.prims import OpTags
    from thunder.core.proxies import TensorProxy
    from thunder.core.symbol import gather_tags

    from .. import _C

    if is_extern(bsym):
        return _C.EPI_HEAD if sum(isinstance(o, TensorProxy) for o in bsym.flat_proxy_outs) == 1 else 0
    if not fusible(bsym) or bsym.sym.name in _ROWWISE_NAMES or OpTags.REDUCTION_OP in gather_tags(bsym):
        return 0
    if is_realized(bsym):  # NOTE [scatters are stored]: its result is written whole first
        return 0
    return _C.EPI_TAIL if same_as_one_read(bsym) else 0


def epilogue_pair(gemm, act) -> bool:
    """May `act` run as the epilogue of extern op `gemm` in one region (NOTE [extern ops in
    regions])?"""
    return pair_by_roles(epilogue_role, gemm, act)


STORED = 2  # the core's MF_FUSIBLE_STORED (NOTE [extern ops in regions])
POINTWISE = 3  # the core's MF_FUSIBLE_POINTWISE (NOTE [pointwise over an extern result])


@memoized
@predicate(False)
def is_pointwise(bsym) -> bool:
    """NOTE [pointwise over an extern result]: Inductor frees a buffer at its last use and gives
    its memory to the next buffer of the same size, and a pointwise kernel that reads a dying
    buffer at the index it writes writes its result over it.  So in a region that begins with an
    extern call (a GEMM), a pointwise op whose result has the GEMM result's size, made where that
    result is read for the last time or later, takes its buffer: the GELU gradient of a
    transformer's MLP over the matmul that makes its incoming gradient.  An op is pointwise here
    when it makes one tensor and reads only tensors of that tensor's shape, with no reduction,
    no row-wise op, no view and no extern call (csrc/core/mf_fuse.c NOTE [stored heads] counts the
    buffer once)."""
    from thunder.core.prims import OpTags
    from thunder.core.proxies import TensorProxy
    from thunder.core.symbol import gather_tags

    from .._symbols import _base_name

    if is_extern(bsym) or bsym.sym.name in _ROWWISE_NAMES:
        return False
    tags = gather_tags(bsym)
    if _base_name(bsym.sym.name) not in _ROWWISE_BACKWARD_NAMES and (OpTags.REDUCTION_OP in tags
                                                                      or OpTags.SHAPE_OP in tags):
        return False  # (their decompositions broadcast a row's sum: not a view of their result)
    outs = [o for o in bsym.flat_proxy_outs if isinstance(o, TensorProxy)]
    reads = [p for p in bsym.flat_proxy_args if isinstance(p, TensorProxy)]
    return len(outs) == 1 and bool(reads) and all(tuple(p.shape) == tuple(outs[0].shape) for p in reads)


# The gradients of a softmax and a log-softmax: a reduction over each row of their reads, then a
# last pass that writes each element from the same element of its reads (all of its shape), which is
# Inductor's loop that may write over a dying read (is_pointwise: the cross-entropy's gradient over
# the saved log-softmax, csrc/core/mf_credit.c NOTE [donated inputs]).
_ROWWISE_BACKWARD_NAMES = frozenset({"_softmax_backward_data", "_log_softmax_backward_data", "softmax_backward",
                                     "log_softmax_backward"})


@functools.lru_cache(maxsize=1)
def _torch_impl_of() -> dict:
    """{id of a torch-executor implementation symbol: id of the symbol it implements}.

    NOTE [claimed prims]: where memfuse replaces the torchcompile executor, an op neither executor
    claims whole is flattened into prims, which memfuse_ex's fusion pass claims and dissolves again
    (NOTE [memfuse fusion pass]); Thunder's torch executor then takes them, as
    `torch_div_prim_impl`, `torch_prims_reshape_impl`, `shallow_copy`, ...  torch.compile would
    have claimed those prims; its can_fuse does not know the torch executor's names for them, so
    they are looked up here, or each would split a region in two."""
    from thunder.executors.torchex import ex as pytorch_ex

    out = {}
    for k, v in pytorch_ex.implmap.items():
        sym = getattr(v, "symbol", None)
        if sym is not None and sym.id != k:
            out[sym.id] = k
    return out


@functools.lru_cache(maxsize=1)
def _autograd_vjps() -> frozenset:
    """NOTE [autograd vjps]: the backward of a torch op Thunder registered automatically (no grad rule
    of its own: `detach`, ...) is a torch-executor op named `<op>_vjp` that runs
    torch.autograd.functional.vjp on the saved arguments.  Dynamo cannot trace that (the argument
    pytrees), so a region holding one fails to compile and runs op by op; Thunder's torchcompile
    executor claims them and fails the same way.  They stay outside memfuse's regions."""
    from thunder.core.symbol import Symbol
    from thunder.core.transforms import backward_impls
    from thunder.executors.torchex import ex as pytorch_ex

    return frozenset(v.id for v in backward_impls.values()
                     if isinstance(v, Symbol) and v.executor is pytorch_ex and str(v.id).endswith("_vjp"))


@memoized
@predicate(0)
def fusible(bsym) -> int:
    """Can bsym be part of a torch.compile region: the torchcompile executor can claim it, its
    outputs are tensors, and it neither draws random numbers nor has an ordered effect.  0: no;
    1: yes; STORED: yes, as an extern call whose tensors are stored (NOTE [extern ops in
    regions]), or a scatter whose result is (NOTE [scatters are stored]); POINTWISE: yes, and pointwise (NOTE [pointwise over an extern result])."""
    from .._symbols import _base_name

    if not tensor_op(bsym) or not pure(bsym) or bsym.sym.id in _autograd_vjps():
        return 0
    if _executor().can_fuse(bsym):
        return STORED if is_extern(bsym) or is_realized(bsym) else (POINTWISE if is_pointwise(bsym) else 1)
    orig = _torch_impl_of().get(bsym.sym.id)
    if orig is not None and orig in _executor().implmap:
        if _base_name(orig) in _EXTERN_NAMES or is_realized(bsym) or _realized_name(_base_name(orig)):
            return STORED
        return POINTWISE if is_pointwise(bsym) else 1
    return 0


# ------------------------------------------------------------------------------------------
# Building a region


def program_key(bsyms, inputs, outputs):
    """NOTE [region compile cache]: (canonical source, input metadata) of a region."""
    from thunder.core.proxies import Proxy, TensorProxy

    trace = region_trace("region", bsyms, inputs, outputs)
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


def cache_key(group: Group):
    """The region's key in the compile cache: its program (program_key) and the inputs it may write
    over (inductor_graph.py NOTE [donated inputs in Inductor]), which make another program."""
    return program_key(group.bsyms, group.inputs, group.outputs), group.donated, group.donated_saved


def build(group: Group):
    """The compiled callable of a region (shared by every region with the same program).
    Inductor compiles on the first call (per stride pattern), so compile errors surface there."""
    bsyms, inputs, outputs = group.bsyms, group.inputs, group.outputs
    key = cache_key(group)
    fn = _cache.get(key)
    if fn is not None:
        stats["reused"] += 1
        return fn
    with _cache_lock:
        fn = _cache.get(key)
        if fn is None:
            fn = _cache[key] = _make(list(bsyms), list(inputs), list(outputs), group.donated, group.donated_saved)
            stats["compiled"] += 1
        else:
            stats["reused"] += 1
    return fn


def _make(bsyms, inputs, outputs, donated=(), donated_saved=()):
    """NOTE [regions without Dynamo]: a region whose inputs are all tensors is compiled by Inductor
    from its ATen graph, and called directly; any other goes through torch.compile as Thunder's
    make_compiled would compile it (_dynamo_compiled), writing over none of its inputs."""
    from thunder.core.proxies import TensorProxy

    if all(isinstance(a, TensorProxy) for a in inputs):
        return InductorRegion(_torch_callable(bsyms, inputs, outputs),
                              functools.partial(_dynamo_compiled, bsyms, inputs, outputs), donated, donated_saved)
    return _dynamo_compiled(bsyms, inputs, outputs)


def _dynamo_compiled(bsyms, inputs, outputs):
    """The region through torch.compile as Thunder's executor compiles it (make_compiled: its
    fullgraph option, autocast off and no autograd around the compiled callable), with Inductor called
    through inductor_fixes.inductor_backend: the fixes are in place when Dynamo compiles, on a call."""
    import torch
    from thunder.core.compile_data import get_compile_option
    from thunder.executors.torchex import no_autocast

    fullgraph = get_compile_option("torch_compile_fullgraph",
                                   "Whether to enable `fullgraph` from `torch.compile`. Defaults to `True`.")
    fn = torch.compile(_torch_callable(bsyms, inputs, outputs), fullgraph=True if fullgraph is None else fullgraph,
                       backend=inductor_fixes.inductor_backend)
    return torch.no_grad()(no_autocast(fn))


def _torch_callable(bsyms, inputs, outputs):
    """The region as a Python function of torch calls: the program make_compiled hands to
    torch.compile (the region's trace, lowered by Thunder's torch executor)."""
    from thunder.core import prims
    from thunder.executors.passes import transform_for_execution
    from thunder.executors.torchex import ex as pytorch_ex

    trace = region_trace("memfuse_region", bsyms, inputs, outputs, unpack=True)
    for b in trace.bound_symbols:
        if b.sym == prims.unpack_trivial:
            continue
        for o in list(b.flat_outs) + [o for s in b.subsymbols for o in s.flat_outs]:
            if o is not None and getattr(o, "name", None) and o.name not in trace.names:
                trace.add_name(o.name)
    return transform_for_execution(trace, executors_list=(pytorch_ex,)).python_callable(include_decorators=False)


MAX_VARIANTS = 8  # stride patterns compiled per region before Dynamo takes the rest


class InductorRegion:
    """NOTE [regions without Dynamo]
    torch.compile puts Dynamo in front of every call of a compiled function: a frame hook, a guard
    check over every input and global state, and AOTAutograd's runtime wrapper.  For a trace of a
    few whole-program regions that is noise; for memfuse's many regions it was most of the step
    (RESULTS.md, "Region compilers on CPU").  A region needs none of it: Thunder's trace already
    fixes its shapes, dtypes and devices (its prologue checks them), its ops are pure (no random
    op, no in-place write, no effect), and it runs without autograd.  So the region's torch program
    is traced to an ATen graph with Inductor's decompositions (make_fx, on fake tensors) and
    compiled by Inductor's graph compiler (compile_fx_inner): the same code torch.compile would
    generate.  A call is then Inductor's own `call`: size and stride assertions, its kernels.

    What the trace does not fix are strides, and under cache="symbolic values" sizes: Inductor's
    program asserts both, so each pattern of input sizes and strides (a transposed weight, a new
    batch size) compiles a variant of its own.  Past MAX_VARIANTS patterns, every new one goes
    through one shared Dynamo callable (below), which handles them its own way (with dynamic
    shapes); nothing more is stored per pattern, so the table stays bounded.  Grad mode
    is off for the call, as in Thunder's own regions.  A program that cannot be traced this way
    (an op without a fake-tensor kernel, say) is compiled as Thunder's torchcompile executor
    would, through Dynamo (_dynamo_compiled): slower calls, same kernels; `why_dynamo` says why."""

    __slots__ = ("fn", "variants", "peaks", "lock", "dynamo", "why_dynamo", "dynamo_fn", "untraceable", "donated",
                 "donated_all")

    def __init__(self, fn, dynamo, donated=(), donated_saved=()):
        self.fn = fn
        # inductor_graph.py NOTE [donated inputs in Inductor]: the inputs its program may write over (_regroup.py NOTE
        # [donated inputs]); the saved activations among them only where the backward does not keep its graph
        self.donated = tuple(donated)
        self.donated_all = tuple(sorted(set(donated) | set(donated_saved)))
        self.variants = {}
        self.peaks = {}  # per pattern: the bytes its program's buffers hold at most (NOTE [Inductor's buffer plan])
        self.lock = threading.Lock()
        self.dynamo = dynamo  # () -> the region through torch.compile, for what make_fx cannot trace
        self.why_dynamo = None
        self.dynamo_fn = None  # built once, on the first pattern that needs it
        self.untraceable = False  # make_fx failed once: every pattern goes through Dynamo

    def __call__(self, *args):
        import torch

        donate = self.donated_all if self.donated_all == self.donated or not _keeps_graph() else self.donated
        key = (donate, *[(a.size(), a.stride()) for a in args])
        compiled = self.variants.get(key)
        if compiled is None:
            compiled = self._compile(key, args, donate)
        try:
            if torch.is_grad_enabled():
                with torch.no_grad():
                    return compiled(list(args))
            return compiled(list(args))
        except Exception as e:
            if not donate or compiled is self.dynamo_fn:
                raise
            raise InputsWritten(f"memfuse: a region failed after its program may have written over inputs that die "
                                f"with it, so it cannot run again on the fallback ({type(e).__name__}: {e})") from e

    def buffer_peak(self):
        """The most bytes the buffers of any compiled pattern's program hold at once
        (inductor_buffers.py NOTE [Inductor's buffer plan]); None when unknown or when a pattern
        runs through Dynamo."""
        if self.dynamo_fn is not None or not self.peaks or None in self.peaks.values():
            return None
        return max(self.peaks.values())

    def _shared(self):
        """The one Dynamo callable, taking every pattern past the cap (and all of them where
        make_fx cannot trace the program)."""
        if self.dynamo_fn is None:
            fn = self.dynamo()
            self.dynamo_fn = lambda args, fn=fn: fn(*args)
        return self.dynamo_fn

    def _compile(self, key, args, donate=()):
        import torch

        with self.lock:
            compiled = self.variants.get(key)
            if compiled is not None:
                return compiled
            if self.untraceable or len(self.variants) >= MAX_VARIANTS:
                if not self.untraceable:
                    self.why_dynamo = f"more than {MAX_VARIANTS} size and stride patterns"
                return self._shared()
            try:
                with torch.no_grad(), inductor_fixes.applied():  # NOTE [Inductor bugs worked around]
                    compiled = inductor_graph.compile_region(_aten_graph(self.fn, args), args, donate)
                self.peaks[key] = buffer_peak(getattr(compiled, "source_code", None))
            except Exception as e:  # Dynamo's way; its own errors go to the region's fallback
                self.why_dynamo = f"{type(e).__name__}: {e}"
                self.untraceable = True
                return self._shared()
            self.variants[key] = compiled
        return compiled


def _keeps_graph() -> bool:
    """Does the running backward keep its graph (backward(retain_graph=True))?  Its saved activations
    then outlive it, and no region may write over them.  Yes where it cannot be told."""
    import torch

    try:
        return bool(torch._C._autograd._get_current_graph_task_keep_graph())
    except Exception:  # noqa: BLE001 - no graph task running, or no such API: keep them
        return True


def _aten_graph(fn, args):
    """The region's torch program as the functional ATen graph Inductor compiles, traced on fake
    tensors with Inductor's decompositions (NOTE [functional region programs])."""
    import torch
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(torch.func.functionalize(fn, remove="mutations"),
                   decomposition_table=select_decomp_table(), tracing_mode="fake")(*args)


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()
