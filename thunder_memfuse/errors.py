"""The exception and warning categories of thunder_memfuse.

- MemFuseError (a RuntimeError): the base of every error the package raises
  itself.  It is defined by the C binding (thunder_memfuse._C), so the binding's
  internal errors and KernelCompileError share it with the Python side
  (MemFuse(strict=True)).  Bad input raises ValueError or TypeError instead.
- MemFuseWarning (a RuntimeWarning): everything memfuse warns about, chiefly
  "the pass could not run on this trace, it was left unchanged" and "a region
  ran on the fallback path".  Filter it as usual::

      warnings.filterwarnings("error", category=thunder_memfuse.MemFuseWarning)

warn() points the warning at the user's line: the first frame outside
thunder_memfuse, Thunder, PyTorch and the code Thunder generates for traces.
warn(..., once=key) says a thing once per process, unless the user's warning
filters change what they do with it (NOTE [once, within the user's filters]).
"""
from __future__ import annotations

import os
import sys
import threading
import warnings

from ._C import KernelCompileError, MemFuseError

__all__ = ["MemFuseError", "MemFuseWarning", "KernelCompileError", "warn"]


class MemFuseWarning(RuntimeWarning):
    """A memfuse warning: the pass left a trace unchanged, or a region fell back."""


MemFuseWarning.__module__ = "thunder_memfuse"


def _internal_dirs():
    dirs = [os.path.dirname(os.path.abspath(__file__))]
    for name in ("thunder", "torch", "lightning_utilities"):
        mod = sys.modules.get(name)
        f = getattr(mod, "__file__", None)
        if f:
            dirs.append(os.path.dirname(os.path.abspath(f)))
    for mod in (warnings, os):  # the standard library (contextlib, functools...)
        dirs.append(os.path.dirname(os.path.abspath(mod.__file__)))
    return tuple(d + os.sep for d in dirs)


def _is_internal(filename, dirs):
    if filename.startswith("thunder."):  # code Thunder generates for a trace (thunder.computation_3)
        return True
    if filename.startswith("<frozen "):
        return True
    if filename.startswith("<"):  # <string>, <stdin>: user code
        return False
    return os.path.abspath(filename).startswith(dirs)


def _user_frame(skip):
    """(stacklevel, frame) of the first user frame, seen from the caller `skip` frames up."""
    dirs = _internal_dirs()
    f = sys._getframe(skip + 1)
    level = 1
    while f is not None and _is_internal(f.f_code.co_filename, dirs):
        f = f.f_back
        level += 1
    return (level, f) if f is not None else (1, None)


def user_stacklevel(skip=1):
    """The stacklevel, seen from the caller `skip` frames up, of the first user frame."""
    return _user_frame(skip)[0]


# NOTE [once, within the user's filters]: some warnings are said once per process (a compiler that
# cannot work here would otherwise warn at every compilation).  A plain "already said" flag would also
# swallow the warning after the user changed their filters, so that
# warnings.filterwarnings("error", category=MemFuseWarning), set after the first occurrence, would
# never fire.  Python's own once-ness has the same problem solved: its registries are forgotten
# whenever the filters change.  We keep, per key, the action the user's filters gave the warning
# when it was said, and say it again when they now give another action, or "error" (an error is
# raised at every occurrence, as Python raises it).  "always" is not repeated: one compilation
# resolves its compiler more than once, and the same sentence twice per compilation is noise.  The
# filters are matched as warnings.warn_explicit matches them (message, category, module, line),
# against the user's frame the warning points at.
_said: dict = {}
_said_lock = threading.Lock()


def _action(text, category, frame) -> str:
    """The action the current warning filters give this warning at this frame."""
    module = frame.f_globals.get("__name__", "<string>") if frame is not None else "sys"
    lineno = frame.f_lineno if frame is not None else 1
    for action, msg, cat, mod, ln in warnings.filters:
        if ((msg is None or msg.match(text)) and issubclass(category, cat)
                and (mod is None or mod.match(module)) and (ln == 0 or ln == lineno)):
            return action
    return warnings.defaultaction


def warn(message: str, *, once=None) -> None:
    """warnings.warn(message, MemFuseWarning) at the user's line; also logged (WARNING) through
    logging.getLogger("thunder_memfuse").  once: a key; a warning with a key already said is
    said again only where the user's filters now treat it differently, or make it an error
    (NOTE [once, within the user's filters])."""
    from ._options import LOG

    level, frame = _user_frame(1)
    if once is not None:
        action = _action(message, MemFuseWarning, frame)
        with _said_lock:
            before = _said.get(once)
            _said[once] = action
        if before is not None and before == action and action != "error":
            return
    del frame
    LOG.warning("%s", message)
    warnings.warn(message, MemFuseWarning, stacklevel=level + 1)


def forget_said() -> None:
    """Forget which once-per-process warnings were said (tests)."""
    with _said_lock:
        _said.clear()
