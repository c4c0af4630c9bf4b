"""Property-based tests (hypothesis, seeded and bounded): plan() and simulate() on valid DAGs against the
independent reference (tests/reference.py) and brute force, and sizes near the 64-bit limit.

Malformed graphs and mutation callbacks, which could crash the interpreter, run in a child process:
tests/crash_checks.py, started by tests/test_hardening.py.
"""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import thunder_memfuse as tm
from reference import Graph
from test_hardening import stable_topological_order

PROP = settings(max_examples=150, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
MAX_TOTAL = 2**61 - 1  # mf_core.h MF_MAX_TOTAL_BYTES
SMALL = [0, 1, 8, 16, 32, 48, 64, 128, 256]
HUGE = [0, 1, 2**40, 2**59, 2**60, 2**61 - 1, 2**62, 2**63 - 1]


@st.composite
def dags(draw, max_ops=8, sizes=SMALL):
    """A valid graph: ops read earlier values (some views of what they read), ordering edges forward,
    then the ops listed in a random order (the input order need not be valid)."""
    n_in = draw(st.integers(0, 2))
    vb = [draw(st.sampled_from(sizes)) for _ in range(n_in)]
    ops, aliases = [], []
    for _ in range(draw(st.integers(1, max_ops))):
        avail = list(range(len(vb)))
        ins = draw(st.lists(st.sampled_from(avail), max_size=3, unique=True)) if avail else []
        outs = []
        for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2]))):
            vb.append(draw(st.sampled_from(sizes)))
            outs.append(len(vb) - 1)
            if ins and draw(st.integers(0, 6)) == 0:
                aliases.append((outs[-1], draw(st.sampled_from(ins))))
        ops.append((ins, outs))
    n = len(ops)
    produced = [v for _, outs in ops for v in outs]
    outputs = draw(st.lists(st.sampled_from(produced), unique=True, max_size=3)) if produced else []
    after = []
    if n >= 2:
        for a, b in draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=2)):
            if a != b:
                after.append((min(a, b), max(a, b)))
    perm = draw(st.permutations(range(n)))  # op k of the topological listing becomes op perm[k]
    listed = [None] * n
    for k, op in enumerate(ops):
        listed[perm[k]] = op
    return dict(ops=listed, value_bytes=vb, graph_inputs=list(range(n_in)), graph_outputs=outputs,
                aliases=aliases, fusible=[draw(st.booleans()) for _ in range(n)],
                after=[(perm[a], perm[b]) for a, b in after])


def stored_total(spec):
    views = {v for v, _ in spec["aliases"]}
    return sum(b for v, b in enumerate(spec["value_bytes"]) if v not in views and v not in spec["graph_inputs"])


@PROP
@given(spec=dags())
def test_plan_matches_the_reference_and_brute_force(spec):
    g = Graph(**spec)
    p = tm.plan(**spec, fusion_moves=False)
    n = len(spec["ops"])
    assert sorted(p.order) == list(range(n)) and g.valid(p.order)
    assert [k for grp in p.groups for k in grp] == p.order
    assert all(len(grp) == 1 or all(spec["fusible"][k] for k in grp) for grp in p.groups)
    assert p.unfused_peak_bytes == g.simulate(p.order)
    assert p.peak_bytes == g.simulate(p.order, p.groups) <= p.unfused_peak_bytes
    # the baseline: the listed order made valid by a stable topological sort (mf_order.c)
    assert p.baseline_peak_bytes == g.simulate(stable_topological_order(g))
    assert p.unfused_peak_bytes <= p.baseline_peak_bytes
    best = g.min_peak()
    assert p.lower_bound_bytes <= best <= p.unfused_peak_bytes
    assert p.optimal and p.unfused_peak_bytes == best  # 8 ops: always proven at the default cap
    if n <= 6:
        assert best == min(g.simulate(o) for o in g.all_orders())


@PROP
@given(spec=dags(), data=st.data())
def test_simulate_matches_the_reference_on_any_valid_schedule(spec, data):
    g = Graph(**spec)
    done, order = set(), []
    while len(order) < len(spec["ops"]):  # a random valid order
        ready = [k for k in range(len(spec["ops"])) if k not in done and g.preds[k] <= done]
        order.append(data.draw(st.sampled_from(ready)))
        done.add(order[-1])
    cuts = sorted(data.draw(st.sets(st.integers(1, len(order) - 1))) if len(order) > 1 else [])
    groups = [order[a:b] for a, b in zip([0] + cuts, cuts + [len(order)])]
    kw = dict(graph_inputs=spec["graph_inputs"], graph_outputs=spec["graph_outputs"], aliases=spec["aliases"])
    peak, steps, live = tm.simulate(spec["ops"], spec["value_bytes"], order, **kw)
    assert peak == g.simulate(order) == max(steps, default=0) and min(live, default=0) >= 0
    peak, steps, _ = tm.simulate(spec["ops"], spec["value_bytes"], order, groups, **kw)
    assert peak == g.simulate(order, groups) and len(steps) == len(groups) and min(steps) >= 0


@PROP
@given(spec=dags(max_ops=5, sizes=HUGE))
def test_sizes_near_the_64_bit_limit_are_exact_or_rejected(spec):
    """Either every figure is exact (Python's ints are the reference) or ValueError names value_bytes."""
    g = Graph(**spec)
    if stored_total(spec) > MAX_TOTAL:
        with pytest.raises(ValueError, match="value_bytes"):
            tm.plan(**spec)
        with pytest.raises(ValueError, match="value_bytes"):
            tm.simulate(spec["ops"], spec["value_bytes"], stable_topological_order(g),
                        graph_inputs=spec["graph_inputs"], aliases=spec["aliases"])
        return
    p = tm.plan(**spec)
    assert p.peak_bytes == g.simulate(p.order, p.groups) >= 0
    assert p.unfused_peak_bytes == g.simulate(p.order)
    assert not p.optimal or p.unfused_peak_bytes == g.min_peak()
    _, steps, live = tm.simulate(spec["ops"], spec["value_bytes"], p.order, p.groups,
                                 graph_inputs=spec["graph_inputs"], graph_outputs=spec["graph_outputs"],
                                 aliases=spec["aliases"])
    assert min(steps) >= 0 and min(live) >= 0
