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
"""
from __future__ import annotations

import os
import sys
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


def user_stacklevel(skip=1):
    """The stacklevel, seen from the caller `skip` frames up, of the first user frame."""
    dirs = _internal_dirs()
    f = sys._getframe(skip)
    level = 1
    while f is not None and _is_internal(f.f_code.co_filename, dirs):
        f = f.f_back
        level += 1
    return level if f is not None else 1


def warn(message: str) -> None:
    """warnings.warn(message, MemFuseWarning) at the user's line; also logged (WARNING) through
    logging.getLogger("thunder_memfuse")."""
    from ._options import LOG

    LOG.warning("%s", message)
    warnings.warn(message, MemFuseWarning, stacklevel=user_stacklevel(2) + 1)
