"""The buffers an Inductor program allocates, read from its generated wrapper code.

NOTE [Inductor's buffer plan]: the cost model counts a region by its ops (mf_fuse.c NOTE [stored inner
values]): an upper bound where a GEMM's operands are counted to the region's end, and blind to what
Inductor adds (a contiguous copy of a GEMM operand whose strides a library call cannot take, say).
Once a region is compiled, what it allocates is written down: the `call` function of the program
Inductor generated (CompiledFxGraph.source_code) allocates each buffer with an `empty_strided_*` line,
renames one it reuses in place (`bufM = reinterpret_tensor(bufN, ...); del bufN  # reuse`), takes a donated
input's memory the same way (`bufM = t12_1`, an input the `... = args` line names: no new bytes; regions/torchcompile.py NOTE [donated inputs in
Inductor]) and drops one with `del bufN`.  Walking those lines gives the most bytes its buffers hold at once while it runs,
outputs included (a returned view of an input allocates nothing).  A line that makes a buffer any
other way (a fallback kernel returning a new tensor, sizes that are symbols) makes the answer None:
unknown, never a guess.  compare() uses it (thunder_memfuse/reports/_compare.py NOTE [regions in compare]).
"""
from __future__ import annotations

import re

_ALLOC = re.compile(r"^(buf\d+) = empty_strided(?:_[a-z0-9]+)?\(\(([^()]*)\), \(([^()]*)\), (?:dtype=)?torch\.(\w+)")
_ALLOC_KW = re.compile(r"^(buf\d+) = empty_strided(?:_[a-z0-9]+)?\(\(([^()]*)\), \(([^()]*)\),.*dtype=torch\.(\w+)")
_RENAME = re.compile(r"^(buf\d+) = (?:reinterpret_tensor\()?(buf\d+)\b")
_FROM_NAME = re.compile(r"^(buf\d+) = (?:reinterpret_tensor\()?(\w+)\b")
_UNPACK = re.compile(r"^([\w, ]+) = args$")
_DEL = re.compile(r"^del (buf\d+(?:, buf\d+)*)$")
_ASSIGN = re.compile(r"^(buf\d+) = ")


def _ints(text):
    return [int(x) for x in text.replace(" ", "").split(",") if x]


def _storage_bytes(sizes, strides, dtype) -> int:
    import torch

    if any(s == 0 for s in sizes):
        return 0
    span = 1 + sum((s - 1) * st for s, st in zip(sizes, strides))
    return span * torch.empty((), dtype=getattr(torch, dtype)).element_size()


def buffer_peak(source: str | None) -> int | None:
    """The most bytes the buffers of an Inductor program's `call` hold at once, or None when the
    program allocates in a way this reader does not size (NOTE [Inductor's buffer plan])."""
    if not source:
        return None
    lines = source.splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("def call(self, args)"))
    except StopIteration:
        return None
    indent = len(lines[start]) - len(lines[start].lstrip())
    storage_of, bytes_of, names_of = {}, {}, {}
    live = peak = 0
    inputs = set()
    for ln in lines[start + 1:]:
        if ln.strip() and len(ln) - len(ln.lstrip()) <= indent:
            break  # the end of call's body
        for stmt in (s.strip() for s in ln.split("#", 1)[0].split(";")):
            if not stmt:
                continue
            m = _ALLOC.match(stmt) or _ALLOC_KW.match(stmt)
            if m:
                try:
                    b = _storage_bytes(_ints(m.group(2)), _ints(m.group(3)), m.group(4))
                except (ValueError, AttributeError, TypeError):
                    return None  # symbolic sizes, or a dtype torch does not name
                sid = len(bytes_of)
                bytes_of[sid] = b
                storage_of[m.group(1)] = sid
                names_of[sid] = {m.group(1)}
                live += b
                peak = max(peak, live)
                continue
            m = _RENAME.match(stmt)
            if m and m.group(2) in storage_of:
                sid = storage_of[m.group(2)]
                storage_of[m.group(1)] = sid
                names_of[sid].add(m.group(1))
                continue
            m = _UNPACK.match(stmt)
            if m:
                inputs.update(n.strip() for n in m.group(1).split(",") if n.strip())
                continue
            m = _FROM_NAME.match(stmt)
            if m and m.group(2) in inputs:  # a donated input's memory: the caller's bytes, counted outside
                sid = len(bytes_of)
                bytes_of[sid] = 0
                storage_of[m.group(1)] = sid
                names_of[sid] = {m.group(1)}
                continue
            m = _DEL.match(stmt)
            if m:
                for name in m.group(1).split(", "):
                    sid = storage_of.pop(name, None)
                    if sid is None:
                        continue
                    names_of[sid].discard(name)
                    if not names_of[sid]:
                        live -= bytes_of[sid]
                continue
            if _ASSIGN.match(stmt):
                return None  # a buffer made some other way: its size is not written here
    return peak
