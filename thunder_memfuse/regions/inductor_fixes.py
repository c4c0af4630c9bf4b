"""NOTE [Inductor bugs worked around]: defects of the installed Inductor that memfuse's regions reach
and Thunder's own torchcompile regions happen not to, fixed while memfuse compiles a region.

memfuse groups ops Thunder's executor would group differently, so its regions hand Inductor programs
nobody else's pass makes; where Inductor generates wrong code for one, adding memfuse would make a
user's program wrong.  Each fix here is applied only where the installed torch has the defect (told
from its code, not its version number, so a torch that fixed it is left alone) and only while
memfuse's region compiler runs (`applied()`, and `inductor_backend` for the regions Dynamo compiles,
on their first call): what a user compiles with torch.compile outside
memfuse's compilations is Inductor's as installed.

- tile2d atomic add (pytorch/pytorch#191837): on CPU, a 2-d tiled kernel (a loop nest that reads
  some input transposed) that accumulates into scattered positions (index_add, index_put with
  accumulate, embedding and nll_loss backward) with more than one thread applied the tile's inner
  offset to the store's index twice: silently wrong values, or writes past the buffer.  Found on a
  Falcon step (HF transformers), whose multi-query key gradient is an index_add of a transposed
  rotary gradient into the fused qkv gradient.  The fix passes the store's index untransformed to the
  vector kernel's atomic path, which transforms it once (through the tile's index_expr).

While a fix is applied, Inductor's FX graph cache keys carry a marker (a no-op post-grad pre-pass
with a uuid of its own), so a program compiled with the defect by an earlier process is not served
from the on-disk cache.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading

from .._options import LOG

_lock = threading.Lock()
_depth = 0
_saved: dict = {}  # while applied: the store and whether the cache marker was set
_logged = False


def _source(fn) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


@functools.lru_cache(maxsize=None)
def _tile2d_fix():
    """(CppTile2DKernel, the fixed store), or None where the installed Inductor does not have the defect
    (or its code is not the shape the fix is written for: then it is left alone)."""
    try:
        from torch._inductor.codegen import cpp
    except Exception:  # noqa: BLE001 - no Inductor: nothing to fix
        return None
    tile, vec, over = (getattr(cpp, n, None) for n in ("CppTile2DKernel", "CppVecKernel", "CppTile2DOverrides"))
    if tile is None or vec is None or over is None:
        return None
    store, vec_store = tile.__dict__.get("store"), vec.__dict__.get("store")
    if store is None or vec_store is None:
        return None
    s, vs, ix = _source(store), _source(vec_store), _source(getattr(over, "index_expr", None))
    defect = ("transform_indexing" in s and "atomic" not in s  # transformed before delegating, atomic or not
              and "ops.index_expr(index" in vs  # the vector kernel's atomic path re-derives the index
              and "transform_indexing" in ix)  # ... through the tile's overrides, which transform it again
    if not defect:
        return None
    config = cpp.config

    def fixed_store(self, name, index, value, mode=None):
        if (mode == "atomic_add" and (config.cpp.dynamic_threads or self.num_threads != 1)
                and not self.need_vec_transpose(self.rename_indexing(index))):
            return vec_store(self, name, index, value, mode)  # transformed once, by index_expr
        return store(self, name, index, value, mode)

    return tile, fixed_store


def _cache_marker():
    """A no-op post-grad pass whose uuid keys Inductor's FX graph cache apart from unfixed entries."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class MemfuseInductorFixes(CustomGraphPass):
        def __call__(self, graph):
            return None

        def uuid(self):
            return "thunder_memfuse.regions.inductor_fixes:tile2d-atomic-add:1"

    return MemfuseInductorFixes()


def needed() -> bool:
    """Does the installed Inductor have a defect fixed here?"""
    return _tile2d_fix() is not None


@contextlib.contextmanager
def applied():
    """The fixes in place while the body runs (re-entrant; a thread that compiles meanwhile sees the
    fixed code too, which only differs where the defect is)."""
    global _depth, _logged
    fix = _tile2d_fix()
    if fix is None:
        yield
        return
    tile, fixed_store = fix
    with _lock:
        if _depth == 0:
            from torch._inductor import config

            _saved["store"] = tile.__dict__["store"]
            tile.store = fixed_store
            _saved["marker"] = config.post_grad_custom_pre_pass is None
            if _saved["marker"]:  # a user's own pass stays; the entries it keys are theirs
                config.post_grad_custom_pre_pass = _cache_marker()
            if not _logged:
                _logged = True
                LOG.info("memfuse: Inductor's tile2d atomic-add store fixed while memfuse compiles regions "
                         "(pytorch/pytorch#191837)")
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                from torch._inductor import config

                tile.store = _saved.pop("store")
                if _saved.pop("marker"):
                    config.post_grad_custom_pre_pass = None


def inductor_backend(gm, example_inputs):
    """torch.compile's backend for the regions memfuse hands to Dynamo: Inductor's compile_fx, what
    torch.compile's default backend calls, with the fixes applied while it compiles.  Dynamo compiles on
    a call, so a hook here keeps the fixes off the calls that run compiled code."""
    from torch._inductor.compile_fx import compile_fx

    with applied():
        return compile_fx(gm, example_inputs)
