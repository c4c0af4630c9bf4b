"""Measured figures live only in benchmarks/RESULTS.md (issue 19).

A figure copied into a code comment drifts: the run is redone, RESULTS is updated, the comment is not
(mf_sched.c once said "617-op ... 89.52" where RESULTS said 616 ops and 89.54).  Comments give the
reason and cite RESULTS.  This test scans every comment and docstring under csrc/ and thunder_memfuse/
for what reads as a measurement: a number with a memory or time unit, a DP state count, a speedup
("1.6x"), a percentage, or a decimal with two or more places.

Constants that carry a unit (a budget, a limit, a workspace size) are settings, not measurements; they
are listed in ALLOWED with the reason, keyed by file and the matched text.
"""

from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize

ROOT = pathlib.Path(__file__).resolve().parent.parent

# A number followed by a unit, a state count, a speedup or a percentage; or a bare decimal with two or
# more places (89.52).  "x" only right after the number, so that shapes ("256x256", "16 x 256") and hex
# literals do not match.
FIGURE = re.compile(
    r"(?<![\w.])\d+(?:\.\d+)?k?\s?(?:[KMGT]i?B|ms|us|µs|ns|seconds|states)\b"
    r"|(?<![\w.])\d+(?:\.\d+)?x\b"
    r"|(?<![\w.])\d+(?:\.\d+)?\s?%"
    r"|(?<![\w.])\d+\.\d+\s?s\b"
    r"|(?<![\w.])\d+\.\d{2,}(?![\w.])"
)

# (path, matched text) -> why it is not a measurement.
ALLOWED = {
    ("csrc/cuda/mf_codegen.h", "4 KiB"): "CUDA's documented limit on a kernel's by-value parameters",
    ("thunder_memfuse/_plan.py", "256 MiB"): "the DP's memory budget, a setting (mf_plan_options.max_dp_bytes)",
    ("thunder_memfuse/regions/nvrtc/gemm.py", "32 MiB"): "the cuBLAS workspace size chosen for sm_90+, a setting",
}


def c_comments(text: str) -> list[tuple[int, str]]:
    """(first line, text) of every /* */ and // comment of C source, string and char literals skipped."""
    out, i, n, line = [], 0, len(text), 1
    while i < n:
        c = text[i]
        if c in "\"'":
            i += 1
            while i < n and text[i] != c and text[i] != "\n":
                i += 2 if text[i] == "\\" else 1
            i += 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j
            out.append((line, text[i + 2 : j]))
            line += text.count("\n", i, j)
            i = j + 2
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append((line, text[i + 2 : j]))
            i = j
        else:
            line += c == "\n"
            i += 1
    return out


def py_comments(text: str) -> list[tuple[int, str]]:
    """(first line, text) of every comment and every docstring or bare string statement."""
    out = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out.append((node.lineno, node.value.value))
    return out


def figures(text: str, kind: str) -> list[tuple[int, str, str]]:
    """(line, matched text, the line) of every figure in the comments of `text` ("c" or "py")."""
    found = []
    for first, body in c_comments(text) if kind == "c" else py_comments(text):
        for k, ln in enumerate(body.split("\n")):
            for m in FIGURE.finditer(ln):
                found.append((first + k, m.group(0), ln.strip()))
    return found


def _sources():
    for p in sorted(ROOT.glob("csrc/**/*")):
        if p.suffix in (".c", ".h"):
            yield p, "c"
    for p in sorted(ROOT.glob("thunder_memfuse/**/*.py")):
        yield p, "py"


def test_no_measured_figures_in_comments():
    bad = []
    n_files = 0
    for p, kind in _sources():
        n_files += 1
        rel = p.relative_to(ROOT).as_posix()
        for line, text, src in figures(p.read_text(encoding="utf-8"), kind):
            if (rel, text) not in ALLOWED:
                bad.append(f"{rel}:{line}: {text!r} in: {src}")
    assert n_files > 20, "the scan found too few sources"
    assert not bad, (
        "measured figures belong in benchmarks/RESULTS.md; cite it from the comment instead:\n" + "\n".join(bad)
    )


def test_the_scan_finds_planted_figures():
    c_src = (
        '/* nanoGPT\'s 617-op backward: 89.52 -> 89.02 MiB in 1.5k states */\n'
        "int f(void) { return 1; } // about 50 ms\n"
        "/* a region call is 1.65x faster\n * and 12% smaller, 0.4 us a state, 3.2 s to compile */\n"
    )
    got = [t for _, t, _ in figures(c_src, "c")]
    assert got == ["89.52", "89.02 MiB", "1.5k states", "50 ms", "1.65x", "12%", "0.4 us", "3.2 s"], got
    assert [ln for ln, _, _ in figures(c_src, "c")] == [1, 1, 1, 2, 3, 4, 4, 4]

    py_src = 'def f():\n    """Peak 2.75 MiB."""\n    return 1  # ~15 us a call\n'
    assert sorted(t for _, t, _ in figures(py_src, "py")) == ["15 us", "2.75 MiB"]


def test_the_scan_ignores_code_strings_and_shapes():
    c_src = (
        'static const char *s = "32 MiB /* not a comment */ 89.52";\n'
        "double x = 89.52; char q = '\"'; /* a 256x256 matrix, 16 x 256 ops, 0x1F, sm_90 */\n"
    )
    assert figures(c_src, "c") == []
    py_src = 'X = "2.75 MiB"  # shapes 128 x 128, version 13.1.1.3\nY = 89.52\n'
    assert figures(py_src, "py") == []


def test_allowed_entries_are_settings():
    # every allowed figure names a reason; none may be a bare decimal (those are always measurements)
    for (path, text), why in ALLOWED.items():
        assert why and (ROOT / path).exists(), path
        assert not re.fullmatch(r"\d+\.\d{2,}", text), text
