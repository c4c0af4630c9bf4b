"""The torch and Thunder versions thunder_memfuse supports, checked when the package is imported.

NOTE [supported versions]: memfuse runs inside lightning-thunder 0.2.6 (pinned: it reads Thunder's
traces, compile data and executors), so the torch range is the one Thunder 0.2.6 imports and runs
with, given our import shim (_thunder_memfuse_boot.py):
- the floor is Thunder 0.2.6's own requirement (its metadata says torch>=2.7.1);
- the ceiling (TORCH_BELOW) is the first minor release on which Thunder 0.2.6 cannot be imported: there
  `torch.autograd.function.Function.apply` has no `__func__`, which thunder/core/jit_ext.py reads at
  import time, and the shim does not patch Thunder's code.
The range is repeated in pyproject.toml's runtime requirement (so pip refuses a torch outside it)
and in README.md / docs/API.md; TESTED is what CI runs (scripts/setup.sh pins it).

A torch outside the range used to surface as an unrelated error deep in Thunder's import, or as
"cannot import name 'memfuse'".  check() turns it into one ImportError that names the installed
version, the range and the fix, before anything else of the package loads.  IGNORE_ENV lets
someone try another version anyway (trying a torch release that has not been checked yet).
"""
from __future__ import annotations

import os
import re

TORCH_MIN = "2.7.1"  # Thunder 0.2.6's own floor
__version__ = "0.1.0"  # the package's (pyproject.toml's version); thunder_memfuse.__version__

TORCH_BELOW = "2.14"  # the first release that breaks Thunder 0.2.6's import
TORCH_TESTED = "2.13.0"
THUNDER = "0.2.6"
TORCH_SPEC = f"torch>={TORCH_MIN},<{TORCH_BELOW}"
IGNORE_ENV = "THUNDER_MEMFUSE_IGNORE_VERSIONS"


def parse(version: str) -> tuple[int, ...]:
    """The release numbers at the start of a version string: "2.13.0+cpu" -> (2, 13, 0),
    "2.14.0.dev20250101" -> (2, 14, 0), "2.13.0a0+git1234" -> (2, 13, 0)."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(version))
    if not m:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(p) for p in m.group(1).split("."))


def torch_supported(version: str) -> bool:
    v = parse(version)
    return parse(TORCH_MIN) <= v < parse(TORCH_BELOW)


def _ignored() -> bool:
    return os.environ.get(IGNORE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _installed_thunder() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("lightning-thunder")
    except metadata.PackageNotFoundError:  # not installed (plan() works without it), or not from pip
        return None


def problems(torch_version: str | None, thunder_version: str | None) -> list[str]:
    """What is wrong with these versions (empty: nothing).  None: not installed."""
    out = []
    if torch_version is None:
        out.append(f"torch is not installed; thunder_memfuse needs {TORCH_SPEC}: "
                   f"pip install 'torch=={TORCH_TESTED}'")
    elif not torch_supported(torch_version):
        newer = parse(torch_version) >= parse(TORCH_BELOW)
        why = (f"lightning-thunder {THUNDER}, which memfuse runs in, cannot be imported on torch "
               f"{TORCH_BELOW} or newer" if newer else
               f"lightning-thunder {THUNDER}, which memfuse runs in, needs torch {TORCH_MIN} or newer")
        out.append(f"torch {torch_version} is installed, but thunder_memfuse supports {TORCH_SPEC} "
                   f"(tested: {TORCH_TESTED}): {why}. Fix: pip install 'torch=={TORCH_TESTED}' "
                   f"(or any torch in {TORCH_SPEC})")
    if thunder_version is not None and parse(thunder_version)[:3] != parse(THUNDER):
        out.append(f"lightning-thunder {thunder_version} is installed, but thunder_memfuse supports "
                   f"lightning-thunder=={THUNDER} only (it reads Thunder's traces and compile data). "
                   f"Fix: pip install 'lightning-thunder=={THUNDER}'")
    return out


def check() -> None:
    """Raise ImportError naming the installed versions, the supported ones and the fix, when the
    installed torch or Thunder is one thunder_memfuse does not support (NOTE [supported versions]).
    Set THUNDER_MEMFUSE_IGNORE_VERSIONS=1 to import anyway."""
    if _ignored():
        return
    try:
        import torch
    except ImportError:
        torch_version = None
    else:
        torch_version = str(getattr(torch, "__version__", "0"))
    found = problems(torch_version, _installed_thunder())
    if found:
        raise ImportError("thunder_memfuse cannot run with the installed packages:\n  - "
                          + "\n  - ".join(found)
                          + f"\n(to try anyway, set {IGNORE_ENV}=1)", name="thunder_memfuse")
