"""Answers kept for the length of one pass over a trace (no Thunder import here: the region
compilers' predicates use it too)."""
from __future__ import annotations

import contextlib
import contextvars
import functools

# NOTE [one answer per bound symbol]: while _records.records() reads a trace, each predicate
# marked @memoized (_thunder's effects, is_random and comm_kind, a region compiler's fusible)
# answers a bound symbol once.  They ask each other: a compiler's fusible asks effects and
# is_random again, its epilogue_role asks fusible, the alias probe asks all three.  An answer is
# kept beside the bound symbol itself, so an id is never taken for another object's, and only for
# the scope of one records() call.
_MEMO: contextvars.ContextVar = contextvars.ContextVar("thunder_memfuse_memo", default=None)


@contextlib.contextmanager
def one_answer_each():
    """The scope in which memoized predicates answer each bound symbol once."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def memoized(fn):
    """fn(bsym), answered once per bound symbol inside one_answer_each()."""

    @functools.wraps(fn)
    def once(bsym):
        memo = _MEMO.get()
        if memo is None:
            return fn(bsym)
        key = (once, id(bsym))
        hit = memo.get(key)
        if hit is not None and hit[0] is bsym:
            return hit[1]
        res = fn(bsym)
        memo[key] = (bsym, res)
        return res

    return once
