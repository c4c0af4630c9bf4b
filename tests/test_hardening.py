"""Hostile and extreme input to plan() / simulate() (issue 10): no crash, no silent overflow, a bounded
DP, plans that Ctrl-C stops, validated schedules, a baseline defined for every graph, typed signatures."""
import ast
import inspect
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

import thunder_memfuse as tm
from reference import Graph
from thunder_memfuse import _C

TESTS = pathlib.Path(__file__).parent
PKG = TESTS.parent / "thunder_memfuse"


def test_callbacks_and_malformed_graphs_never_crash():
    """tests/crash_checks.py in a child process: the 7 mutation variants of issue 10 and more, and the
    hypothesis properties on malformed graphs and mutation callbacks.  A crash fails this test."""
    r = subprocess.run([sys.executable, str(TESTS / "crash_checks.py")], cwd=TESTS, capture_output=True, text=True,
                       timeout=600)
    started = [ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("start ")]
    assert r.returncode == 0, f"child exited {r.returncode} during {started[-1:]}:\n{r.stdout[-2000:]}{r.stderr[-4000:]}"
    assert r.stdout.count("\nok ") + r.stdout.startswith("ok ") == len(started) >= 11


# ---- sizes whose sums do not fit ----

def test_overflowing_sizes_raise_naming_value_bytes():
    ops = [([0], [1]), ([0], [2]), ([1, 2], [3])]
    kw = dict(graph_inputs=[0], graph_outputs=[3])
    with pytest.raises(ValueError, match=r"value_bytes: .* total more than"):
        tm.plan(ops, [0, 2**62, 2**62, 4], **kw)  # issue 10: the true peak is 2**63
    with pytest.raises(ValueError, match="value_bytes"):
        tm.simulate(ops, [0, 2**62, 2**62, 4], [0, 1, 2], **kw)
    with pytest.raises(ValueError, match=r"value_bytes\[1\]: size .* non-negative 64-bit"):
        tm.plan(ops, [0, 2**63, 1, 4], **kw)
    # graph inputs and views store nothing of their own, so they do not count
    vb = [2**63 - 1, 2**59, 2**59, 4, 2**62]  # value 4: a view of value 1, declared huge
    p = tm.plan(ops + [([1], [4])], vb, aliases=[(4, 1)], **kw)
    assert p.peak_bytes == 2**60 + 4 == Graph(ops + [([1], [4])], vb, aliases=[(4, 1)], **kw).min_peak()
    peak, steps, _ = tm.simulate(ops, [0, 2**60, 2**60 - 8, 4], [0, 1, 2], **kw)
    assert peak == 2**61 - 8 + 4 and min(steps) >= 0


# ---- max_states ----

BAD_MAX_STATES = [True, False, 0, -1, 2**63, 2**64, 1.5, "3", [1]]


def _err(fn, *a, **kw):
    try:
        fn(*a, **kw)
    except (TypeError, ValueError) as e:
        return type(e), str(e)
    return None


@pytest.mark.parametrize("bad", BAD_MAX_STATES, ids=repr)
def test_max_states_is_checked_the_same_in_plan_and_memfuse(bad):
    from thunder_memfuse import MemFuse

    graph = ([([0], [1])], [4, 4])
    expected = _err(_C._validate_max_states, bad)
    assert expected is not None and "max_states" in expected[1] and "2**63 - 1" in expected[1]
    assert expected[0] is (ValueError if isinstance(bad, int) and not isinstance(bad, bool) else TypeError)
    assert _err(tm.plan, *graph, graph_inputs=[0], max_states=bad) == expected
    assert _err(MemFuse, max_states=bad) == expected


def test_max_states_accepts_its_whole_range():
    from thunder_memfuse import MemFuse

    for good in (None, 1, 2**62, 2**63 - 1):
        assert tm.plan([([0], [1])], [4, 4], graph_inputs=[0], max_states=good).peak_bytes == 4
        assert MemFuse(max_states=good).max_states == good


# ---- the DP's memory budget ----

def fork_join(paths=66, seed=0):
    """1 fork op, `paths` chains of 3 ops with mixed sizes, 1 join: 200 ops, hard for the DP."""
    import random

    rng = random.Random(seed)
    ops, vb, ends = [([0], [1])], [0, 8], []
    for _ in range(paths):
        prev = 1
        for _ in range(3):
            vb.append(rng.choice([1, 2, 3, 5, 8, 13]) * 64)
            ops.append(([prev], [len(vb) - 1]))
            prev = len(vb) - 1
        ends.append(prev)
    vb.append(4)
    ops.append((ends, [len(vb) - 1]))
    return dict(ops=ops, value_bytes=vb, graph_inputs=[0], graph_outputs=[len(vb) - 1])


BUDGET_CHILD = """
import json, resource, sys, time
sys.path.insert(0, {tests!r})
from test_hardening import fork_join
import thunder_memfuse as tm
spec = fork_join()
tm.plan(**spec, max_states=10)  # warm up: code and allocator pages are not the DP's
r0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
p = tm.plan(**spec, max_states=2**62)
print(json.dumps(dict(n=len(spec["ops"]), optimal=p.optimal, peak=p.peak_bytes, lb=p.lower_bound_bytes,
                      states=p.states, s=time.perf_counter() - t,
                      rss_mib=(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - r0) / 1024)))
"""


def test_huge_max_states_stays_within_the_dp_memory_budget():
    """max_states=2**62 on a 200-op fork/join: the DP stops at its 256 MiB budget (mf_dp.c NOTE [DP
    memory budget]) and the plan says not proven.  Before, this ran to 17 GB and beyond."""
    import json

    r = subprocess.run([sys.executable, "-c", BUDGET_CHILD.format(tests=str(TESTS))], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(r.stdout.strip().splitlines()[-1])
    print(d)
    assert d["n"] == 200 and d["optimal"] is False and d["peak"] >= d["lb"]
    assert d["rss_mib"] < 256 + 64, d  # the tables, plus the interpreter's own noise


def test_small_dp_budget_stops_the_search_and_the_plan_is_still_valid():
    spec = fork_join()
    g = Graph(**spec)
    full = tm.plan(**spec, max_states=10**5)
    d = _C.plan(**spec, max_states=2**62, _dp_max_bytes=1 << 20)
    assert d["optimal"] is False and 0 < d["states"] < 10**5
    assert g.valid(d["order"]) and d["unfused_peak_bytes"] == g.simulate(d["order"])
    assert d["peak_bytes"] <= d["baseline_peak_bytes"] and full.peak_bytes >= d["lower_bound_bytes"]


# ---- Ctrl-C ----

def test_ctrl_c_interrupts_a_long_plan_quickly():
    """SIGINT from a timer thread 0.3 s into a plan that would run for seconds: KeyboardInterrupt
    (plan.c NOTE [interrupting a plan]); the binding polls signals every 20 ms.  Python's own SIGINT
    handler is put in place for the test: Inductor's compile-worker setup can leave SIGINT ignored in a
    process that ran torch.compile before (torch/_inductor/compile_worker/utils.py), and a Ctrl-C that
    the process ignores reaches no plan."""
    spec = fork_join()
    sent, ended = [], []
    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)

    def interrupt():
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(0.3, interrupt)
    t0 = time.perf_counter()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            try:
                tm.plan(**spec, max_states=2**62)
            finally:
                ended.append(time.perf_counter())
    except BaseException as e:  # say what happened: the plan's length, whether the signal went out
        raise AssertionError(f"{e}: plan ran {ended[0] - t0:.3f} s, SIGINT sent "
                             f"{'at %.3f s' % (sent[0] - t0) if sent else 'never'}, handler "
                             f"{signal.getsignal(signal.SIGINT)}") from e
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, old_handler)
    latency = time.perf_counter() - sent[0]
    print(f"KeyboardInterrupt {latency * 1e3:.1f} ms after SIGINT ({time.perf_counter() - t0:.2f} s in plan)")
    assert latency < 0.5  # about 20 ms when the machine is idle; slack for a loaded CI
    assert tm.plan(**fork_join(paths=3), max_states=10).peak_bytes > 0  # the binding is still usable


# ---- simulate validates what it scores ----

CHAIN = dict(ops=[([0], [1]), ([1], [2]), ([0], [3])], value_bytes=[4, 8, 16, 32], graph_inputs=[0],
             graph_outputs=[2, 3])


def _sim(order, groups=None):
    return tm.simulate(CHAIN["ops"], CHAIN["value_bytes"], order, groups, graph_inputs=[0], graph_outputs=[2, 3])


def test_simulate_rejects_invalid_schedules():
    with pytest.raises(ValueError, match=r"order breaks a dependency: op 1 \(position 0\) runs before op 0"):
        _sim([1, 0, 2])
    with pytest.raises(ValueError, match="op 0 appears twice"):
        _sim([0, 0, 2])
    with pytest.raises(ValueError, match="order has 2 ops"):
        _sim([0, 1])
    with pytest.raises(TypeError, match="order must be a sequence"):
        _sim("garbage", [[0, 1], [2]])  # with groups, order is no longer ignored
    with pytest.raises(ValueError, match=r"groups\[1\] is empty"):
        _sim([0, 1, 2], [[0, 1], [], [2]])
    with pytest.raises(ValueError, match="consecutive runs of order"):
        _sim([0, 1, 2], [[0, 2], [1]])
    with pytest.raises(ValueError, match="groups hold 2 ops"):
        _sim([0, 1, 2], [[0, 1]])
    with pytest.raises(ValueError, match="breaks a dependency"):
        _sim([1, 0, 2], [[1, 0], [2]])
    g = Graph(**CHAIN)
    for order, groups in (([0, 1, 2], None), ([2, 0, 1], None), ([0, 1, 2], [[0, 1], [2]]),
                          ([0, 2, 1], [[0], [2, 1]])):
        peak, steps, live = _sim(order, groups)
        assert peak == g.simulate(order, groups) == max(steps) and min(live) >= 0


# ---- the baseline, defined for every input ----

def stable_topological_order(g: Graph):
    done, order = set(), []
    while len(order) < len(g.ops):
        k = min(k for k in range(len(g.ops)) if k not in done and g.preds[k] <= done)
        order.append(k)
        done.add(k)
    return order


def test_baseline_is_the_input_order_made_valid_by_a_stable_sort():
    # ops listed against the dataflow: op 0 reads what op 2 makes, op 1 what op 0 makes
    spec = dict(ops=[([3], [1]), ([1], [2]), ([0], [3]), ([0], [4])], value_bytes=[4, 100, 8, 50, 1000],
                graph_inputs=[0], graph_outputs=[2, 4])
    g = Graph(**spec)
    base = stable_topological_order(g)
    assert base == [2, 0, 1, 3] and not g.valid([0, 1, 2, 3])
    p = tm.plan(**spec)
    assert p.baseline_peak_bytes == g.simulate(base)
    assert p.lower_bound_bytes <= p.unfused_peak_bytes <= p.baseline_peak_bytes
    valid_listing = dict(spec, ops=[spec["ops"][k] for k in base])
    assert tm.plan(**valid_listing).baseline_peak_bytes == Graph(**valid_listing).simulate([0, 1, 2, 3])


def test_conflicting_epilogues_raise_and_repeats_are_fine():
    ops = [([0], [1]), ([1], [2]), ([1], [3])]
    kw = dict(graph_inputs=[0], graph_outputs=[2, 3])
    with pytest.raises(ValueError, match=r"epilogues\[1\]: op 1 is already the epilogue of op 0"):
        tm.plan(ops, [4, 4, 4, 4], **kw, epilogues=[(1, 0), (1, 2)])
    assert tm.plan(ops, [4, 4, 4, 4], **kw, epilogues=[(1, 0), (1, 0)]).peak_bytes > 0


# ---- signatures and the type stub ----

def _public_functions():
    return {n: f for n, f in vars(_C).items() if inspect.isbuiltin(f) and not n.startswith("_")}


def test_every_public_c_function_has_a_signature_and_a_stub():
    funcs = _public_functions()
    assert {"plan", "simulate", "plan_trace"} <= set(funcs)
    stub = ast.parse((PKG / "_C.pyi").read_text())
    stubbed = {n.name: n for n in stub.body if isinstance(n, ast.FunctionDef)}
    for name, f in funcs.items():
        sig = inspect.signature(f)  # raises without a text signature
        assert name in stubbed, f"_C.pyi lacks {name}"
        st = stubbed[name].args
        stub_names = [a.arg for a in st.posonlyargs + st.args + st.kwonlyargs]
        assert stub_names == [p for p in sig.parameters if not p.startswith("_")], name
    assert (PKG / "py.typed").exists()
    # the Python wrapper exposes the C parameters of plan() (less the test-only ones)
    c_params = [p for p in inspect.signature(_C.plan).parameters if not p.startswith("_")]
    assert list(inspect.signature(tm.plan).parameters) == c_params
    assert list(inspect.signature(tm.simulate).parameters) == list(inspect.signature(_C.simulate).parameters)
