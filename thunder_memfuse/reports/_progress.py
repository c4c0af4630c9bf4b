"""Progress lines for long work (savings, the seed job): what is running now, on stderr.

A first call that compiles can take minutes; without a word the user cannot tell a slow compile
from a hang.  Progress(...)("compiling ...") writes one line to stderr, prefixed with the seconds
since the work began, when progress is on; otherwise it goes to logging.getLogger("thunder_memfuse")
at INFO, so an application that configures logging still sees it.

On by default only where stderr is a terminal (a person is watching; a log file or a test's capture
gets no lines); progress=True / False, or THUNDER_MEMFUSE_PROGRESS=1 / 0 in the environment, decide
otherwise (the argument wins over the environment).
"""
from __future__ import annotations

import os
import sys
import time

ENV = "THUNDER_MEMFUSE_PROGRESS"
_ON = ("1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")


def enabled(progress: bool | None = None) -> bool:
    """progress as given, else THUNDER_MEMFUSE_PROGRESS, else whether stderr is a terminal."""
    if progress is not None:
        if not isinstance(progress, bool):
            raise TypeError(f"progress must be True, False or None (None: on where stderr is a terminal), "
                            f"got {progress!r}")
        return progress
    value = os.environ.get(ENV, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    if value:
        raise ValueError(f"{ENV}={os.environ[ENV]!r}: use 1 (progress lines on stderr) or 0 (none); unset, "
                         f"they are on where stderr is a terminal")
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # no stderr, or a closed one
        return False


class Progress:
    """Say what long work is doing: Progress("savings")("compiling ...")."""

    def __init__(self, what: str, progress: bool | None = None):
        self.what = what
        self.on = enabled(progress)
        self.start = time.perf_counter()

    def __call__(self, message: str) -> None:
        elapsed = time.perf_counter() - self.start
        if self.on:
            print(f"[{self.what} {elapsed:6.1f} s] {message}", file=sys.stderr, flush=True)
        else:
            from .._options import LOG

            LOG.info("%s: %s", self.what, message)
