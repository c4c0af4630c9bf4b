"""pytest plugin: run Thunder's own tests with memfuse appended to every thunder.jit call.

Load it with ``-p tests.peer.plugin`` from the repository root (the root must be
on sys.path: ``python -m pytest`` from the root puts it there; scripts/peer.sh
also sets PYTHONPATH).  pytest imports ``-p`` plugins before any conftest or
test module, and this module patches ``thunder.jit`` at import time, so test
modules that bind the function early (``from thunder import jit``,
``thunder_jit = partial(thunder.jit, ...)`` at module level, as
thunder/tests/test_jit_general.py does) get the wrapped one.

Environment:
  MEMFUSE_PEER=0         baseline: thunder.jit is still wrapped (to count calls)
                         but nothing is appended; thunder_memfuse is never imported.
  MEMFUSE_PEER=1         (default) append a fresh thunder_memfuse.MemFuse(fuse=True, kernels=K) to
                         ``transforms=`` of every call (a new list; the caller's
                         list/tuple is not mutated).
  MEMFUSE_PEER_KERNELS=K MemFuse(kernels=K) (default "fallback": no Inductor compile per test;
                         "auto" runs regions compiled by torch.compile on CPU, much slower)
  MEMFUSE_PEER_STRICT=1  use MemFuse(strict=True): a pass failure raises instead
                         of warning and keeping the trace (finds silent fallbacks).
  MEMFUSE_PEER_JSON=path write the counters below as JSON at the end of the session.

Counters printed in the terminal summary:
  - thunder.jit calls seen / wrapped (MemFuse appended),
  - MemFuse.transform_trace_post_optimization calls, how many returned a new
    trace (memfuse changed it) and how many returned the input trace,
  - thunder_memfuse RuntimeWarnings (memfuse fell back), grouped by message,
    with the first test that raised each.
"""
from __future__ import annotations

import functools
import json
import os
import re
import sys
import warnings
from collections import Counter, defaultdict

import _thunder_memfuse_boot  # noqa: F401  (torch 2.13 shim: must precede `import thunder`)

_thunder_memfuse_boot.apply()

import thunder  # noqa: E402

ENABLED = os.environ.get("MEMFUSE_PEER", "1") != "0"
STRICT = os.environ.get("MEMFUSE_PEER_STRICT", "0") == "1"
# which region compiler the appended MemFuse uses (MemFuse(kernels=...)); the default keeps the
# quick run fast on a small CPU (no Inductor compile per test), "auto" runs what users get
KERNELS = os.environ.get("MEMFUSE_PEER_KERNELS", "fallback")

_stats = {
    "mode": "memfuse" if ENABLED else "baseline",
    "jit_calls": 0,
    "jit_wrapped": 0,
    "hook_calls": 0,
    "hook_changed": 0,
    "hook_unchanged": 0,
    "hook_raised": 0,
    "traces_with_new_regions": 0,
    "new_regions": 0,
    "traces_with_fusion_moves": 0,
    "memfuse_warnings": 0,
}
_warn_counts: Counter = Counter()
_warn_first_test: dict = {}
_warn_tests: dict = defaultdict(set)
_tests_with_changes: set = set()
_current_test = {"nodeid": "<collection>"}
_reemitted = []  # Warning instances re-emitted by the hook wrapper (identity, not equality)

_ORIG_JIT = thunder.jit
if getattr(_ORIG_JIT, "__memfuse_peer__", False):  # plugin imported twice under two names
    _ORIG_JIT = _ORIG_JIT.__wrapped__
_MemFuse = None


def _memfuse_cls():
    global _MemFuse
    if _MemFuse is None:
        try:
            import thunder_memfuse

            cls = thunder_memfuse.MemFuse
        except Exception as e:  # the extension is not built, or the package is broken
            raise ImportError(
                f"tests.peer.plugin: MEMFUSE_PEER=1 but thunder_memfuse cannot be imported ({type(e).__name__}: {e}); "
                "build it (pip install -e .) or run the baseline with MEMFUSE_PEER=0"
            ) from e
        _instrument(cls)
        _MemFuse = cls
    return _MemFuse


def _normalize(msg: str) -> str:
    msg = re.sub(r"0x[0-9a-fA-F]+", "0x?", msg)
    msg = re.sub(r"\d+", "N", msg)
    return msg if len(msg) <= 240 else msg[:240] + "..."


def _is_memfuse_warning(w) -> bool:
    cat = getattr(w, "category", None)
    if cat is None or not issubclass(cat, RuntimeWarning):
        return False
    text = str(w.message)
    fname = str(getattr(w, "filename", "") or "")
    return text.startswith("memfuse") or "thunder_memfuse" in fname or "memfuse" in text.split(":", 1)[0]


def _tally_warning(text: str) -> None:
    key = _normalize(text)
    _stats["memfuse_warnings"] += 1
    _warn_counts[key] += 1
    _warn_first_test.setdefault(key, (_current_test["nodeid"], text))
    _warn_tests[key].add(_current_test["nodeid"])


def _fusion_names(trace) -> set:
    try:
        return {b.sym.name for b in trace.bound_symbols if getattr(b.sym, "is_fusion", False)}
    except Exception:
        return set()


def _instrument(cls) -> None:
    """Count the hook's calls and outcomes and its RuntimeWarnings (class level: pickling unaffected)."""
    if getattr(cls, "_peer_instrumented", False):
        return
    orig = cls.transform_trace_post_optimization

    @functools.wraps(orig)
    def transform_trace_post_optimization(self, computation_trace, **kwargs):
        _stats["hook_calls"] += 1
        with warnings.catch_warnings(record=True) as log:
            warnings.simplefilter("always")
            try:
                out = orig(self, computation_trace, **kwargs)
            except BaseException:
                _stats["hook_raised"] += 1
                raise
            finally:
                # re-emit everything so the outer filters (pytest's, a test's pytest.warns) still see them
                records = list(log)
        for w in records:
            if _is_memfuse_warning(w):
                _tally_warning(str(w.message))
            msg = w.message
            _reemitted.append(msg)
            warnings.warn_explicit(msg, w.category, w.filename, w.lineno, source=w.source)
        if out is computation_trace:
            _stats["hook_unchanged"] += 1
        else:
            _stats["hook_changed"] += 1
            new_regions = _fusion_names(out) - _fusion_names(computation_trace)
            if new_regions:
                _stats["traces_with_new_regions"] += 1
                _stats["new_regions"] += len(new_regions)
                _tests_with_changes.add(_current_test["nodeid"])
            if getattr(out, "_memfuse_info", {}).get("plan", {}).get("fusion_moves", 0):
                _stats["traces_with_fusion_moves"] += 1
        return out

    cls.transform_trace_post_optimization = transform_trace_post_optimization
    cls._peer_instrumented = True


@functools.wraps(_ORIG_JIT)
def _peer_jit(fn, /, *args, **kwargs):
    _stats["jit_calls"] += 1
    if ENABLED:
        cls = _memfuse_cls()
        transforms = kwargs.get("transforms")
        transforms = [] if transforms is None else list(transforms)
        # fuse=True: form regions on CPU too, so the peer suite exercises them
        # on the op-by-op fallback unless MEMFUSE_PEER_KERNELS says otherwise (_fallback_regions:
        # the test-only switch that lets the fallback run regions; users get a ValueError there)
        transforms.append(cls(strict=STRICT, fuse=True, kernels=KERNELS, _fallback_regions=KERNELS == "fallback"))
        kwargs["transforms"] = transforms
        _stats["jit_wrapped"] += 1
    return _ORIG_JIT(fn, *args, **kwargs)


_peer_jit.__memfuse_peer__ = True


def _install() -> None:
    if getattr(thunder.jit, "__memfuse_peer__", False):
        return
    if ENABLED:
        _memfuse_cls()  # fail fast, before collection, if the package cannot be imported
    thunder.jit = _peer_jit
    # Rebind early aliases of the original function in modules imported so far
    # (thunder's own modules import it lazily inside functions, but be thorough).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, mod in list(sys.modules.items()):
            d = getattr(mod, "__dict__", None)
            if not isinstance(d, dict) or mod is thunder or d is globals():
                continue
            for attr, value in list(d.items()):
                try:
                    if value is _ORIG_JIT:
                        setattr(mod, attr, _peer_jit)
                    elif type(value) is functools.partial and value.func is _ORIG_JIT:
                        setattr(mod, attr, functools.partial(_peer_jit, *value.args, **(value.keywords or {})))
                except Exception:
                    pass


_install()


# ----------------------------------------------------------------------------- pytest hooks
def pytest_configure(config):
    # Show memfuse fallback warnings every time (not once per location).
    config.addinivalue_line("filterwarnings", "always::RuntimeWarning")


def pytest_runtest_logstart(nodeid, location):
    _current_test["nodeid"] = nodeid
    # pytest reports a test's warnings (pytest_warning_recorded) after its logfinish:
    # forget the previous test's re-emitted warnings only now.
    _reemitted.clear()


def pytest_warning_recorded(warning_message, when, nodeid, location):
    # memfuse RuntimeWarnings raised outside the transform hook (e.g. a region's runtime fallback)
    if any(warning_message.message is m for m in _reemitted):
        return
    if _is_memfuse_warning(warning_message):
        saved = _current_test["nodeid"]
        _current_test["nodeid"] = nodeid or saved
        _tally_warning(str(warning_message.message))
        _current_test["nodeid"] = saved


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    tr = terminalreporter
    s = _stats
    tr.section(f"memfuse peer ({s['mode']})")
    if ENABLED:
        tr.write_line(f"thunder.jit calls: {s['jit_calls']}, wrapped with MemFuse(): {s['jit_wrapped']}"
                      + (" [strict]" if STRICT else ""))
        tr.write_line(
            f"MemFuse.transform_trace_post_optimization calls: {s['hook_calls']} "
            f"(returned a new trace: {s['hook_changed']}, returned its input: {s['hook_unchanged']}, "
            f"raised: {s['hook_raised']})"
        )
        tr.write_line(
            f"fusion regions made by memfuse: {s['new_regions']} in {s['traces_with_new_regions']} trace(s), "
            f"{len(_tests_with_changes)} test(s); traces with fusion-aware moves: "
            f"{s['traces_with_fusion_moves']}"
        )
    else:
        tr.write_line(f"baseline (MEMFUSE_PEER=0): thunder.jit calls: {s['jit_calls']}, wrapped: 0")
    tr.write_line(f"thunder_memfuse RuntimeWarnings (fallbacks): {s['memfuse_warnings']}")
    for key, n in _warn_counts.most_common(40):
        first, text = _warn_first_test[key]
        tr.write_line(f"  {n:5d} x in {len(_warn_tests[key])} test(s): {text[:300]}")
        tr.write_line(f"          first: {first}")
    path = os.environ.get("MEMFUSE_PEER_JSON")
    if path:
        data = dict(s)
        data["tests_with_new_regions"] = sorted(_tests_with_changes)
        data["warnings"] = [
            {"message": _warn_first_test[k][1], "count": n, "tests": sorted(_warn_tests[k])}
            for k, n in _warn_counts.most_common()
        ]
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
