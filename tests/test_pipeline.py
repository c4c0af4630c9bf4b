"""The planning pipeline in the core (csrc/core/mf_pipeline.c NOTE [planning pipeline], NOTE [work
budget]): one call plans a graph from its labelled starts with recomputation's passes; the plan says
which start won and which passes it kept; the work budget only cuts the search short (a smaller budget
never gives a lower plan, never a higher one than the first plan), and the same graph gets the same
plan every time."""
import random

from thunder_memfuse import _C, plan


def _random_graph(rng, n_ops):
    ops, vb = [], [rng.choice([4, 8, 16])]
    for k in range(n_ops):
        ins = sorted(set(rng.sample(range(len(vb)), k=min(len(vb), rng.choice([1, 2, 3])))))
        ops.append((ins, [len(vb)]))
        vb.append(rng.choice([1, 4, 8, 16, 32]))
    readers = {v for ins, _ in ops for v in ins}
    outs = [v for v in range(1, len(vb)) if v not in readers]
    return ops, vb, outs


def _graphs(count, lo=20, hi=45):
    for seed in range(count):
        rng = random.Random(seed)
        ops, vb, outs = _random_graph(rng, rng.randrange(lo, hi))
        kw = dict(graph_inputs=[0], graph_outputs=outs, fusible=[rng.random() < 0.8 for _ in ops],
                  cheap=[rng.random() < 0.7 for _ in ops], max_states=200)
        yield seed, ops, vb, kw


def test_the_plan_says_which_start_won_and_which_passes_it_kept():
    starts, steps_seen = set(), 0
    for seed, ops, vb, kw in _graphs(60):
        first = _C.plan(ops, vb, **{k: v for k, v in kw.items() if k != "cheap"})
        pl = first["pipeline"]
        assert pl["start"] == "plan" and pl["steps"] == [] and pl["plans"] == 1 and not pl["budget_hit"]
        assert 0 < pl["work"] <= pl["max_work"]
        got = _C.plan(ops, vb, recompute=sum(vb), **kw)
        pl = got["pipeline"]
        starts.add(pl["start"])
        assert pl["plans"] > 1 and not pl["budget_hit"]
        steps = pl["steps"]
        if "recompute" not in got:
            assert steps == [] or pl["start"] != "plan", seed
            continue
        assert steps, seed  # copies come from kept passes
        steps_seen += len(steps)
        for a, b in zip(steps, steps[1:]):
            assert a["peak_after"] == b["peak_before"], seed
        for st in steps:
            assert st["kind"] in ("search", "search on regions", "focused split", "region fission")
            assert st["splits"] > 0 or st["kind"] == "region fission"  # a fission may only add order
            assert st["peak_after"] < st["peak_before"], seed
        assert sum(st["splits"] for st in steps) == got["recompute"]["splits"], seed
        assert sum(st["copied_bytes"] for st in steps) == got["recompute"]["copied_bytes"], seed
        assert got["peak_bytes"] <= steps[-1]["peak_after"], seed
        assert steps[0]["peak_before"] <= got["peak_bytes_without_recompute"] or pl["start"] != "plan", seed
    assert steps_seen >= 10 and len(starts) >= 2, (steps_seen, starts)


def test_a_smaller_work_budget_never_plans_lower_and_never_above_the_first_plan():
    cut_short = 0
    for seed, ops, vb, kw in _graphs(40):
        full = _C.plan(ops, vb, recompute=sum(vb), **kw)
        first = _C.plan(ops, vb, **{k: v for k, v in kw.items() if k != "cheap"})
        peaks = []
        for work in (1, full["pipeline"]["work"] // 8, full["pipeline"]["work"] // 2, full["pipeline"]["work"]):
            r = _C.plan(ops, vb, recompute=sum(vb), _max_work=max(work, 1), **kw)
            assert r["peak_bytes"] <= first["peak_bytes"], seed
            assert r["pipeline"]["max_work"] == max(work, 1)
            cut_short += r["pipeline"]["budget_hit"]
            peaks.append(r["peak_bytes"])
        assert peaks == sorted(peaks, reverse=True), (seed, peaks)
        assert peaks[0] == first["peak_bytes"] and peaks[-1] == full["peak_bytes"], seed
    assert cut_short >= 40  # at least every run with one unit


def test_a_peak_target_gives_the_fewest_copies_that_fit_and_never_a_higher_plan_for_a_lower_target():
    """NOTE [peak target]: with a target, the plan fits it with no more copies than the lowest plan; a
    lower target never gives a higher plan; where nothing fits, the lowest plan and fits False."""
    fitted_with_fewer_copies = 0
    for seed, ops, vb, kw in _graphs(60):
        lowest = _C.plan(ops, vb, recompute=sum(vb), **kw)
        lo = lowest["peak_bytes"]
        hi = lowest.get("peak_bytes_without_recompute", lo)  # the first plan (no copies)
        lo_copies = lowest.get("recompute", {}).get("copied_bytes", 0)
        prev = None
        for t in sorted({hi + 1, hi, lo, lo - 1} | {lo + (hi - lo) * i // 6 for i in range(7)}, reverse=True):
            r = _C.plan(ops, vb, recompute=sum(vb), peak_target=t, **kw)
            pk, copies = r["peak_bytes"], r.get("recompute", {}).get("copied_bytes", 0)
            assert r["pipeline"]["fits"] == (pk <= t), (seed, t)
            if not r["pipeline"]["fits"]:
                assert pk == lo, (seed, t)
            if t >= hi:
                assert copies == 0 and pk == hi, (seed, t)
            if t >= lo:
                assert copies <= lo_copies, (seed, t)
                fitted_with_fewer_copies += copies < lo_copies
            assert prev is None or r["pipeline"]["budget_hit"] or pk <= prev, (seed, t, pk, prev)
            prev = pk
    assert fitted_with_fewer_copies >= 20, fitted_with_fewer_copies


def test_the_same_graph_gets_the_same_plan():
    for seed, ops, vb, kw in _graphs(10):
        a = plan(ops, vb, recompute=sum(vb), **kw)
        b = plan(ops, vb, recompute=sum(vb), **kw)
        assert a == b, seed
        assert a.pipeline is not None and a.pipeline["plans"] >= 1


def test_max_work_is_checked():
    import pytest

    with pytest.raises(ValueError, match="_max_work"):
        _C.plan([([0], [1])], [4, 4], graph_inputs=[0], _max_work=-1)
    with pytest.raises(ValueError, match="peak_target"):
        _C.plan([([0], [1])], [4, 4], graph_inputs=[0], peak_target=-1)
