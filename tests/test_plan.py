"""thunder_memfuse.plan(): the C core against an independent reference."""
import json
import os
import random

import pytest

import thunder_memfuse as tm
from reference import MIB, SEED_BYTES, Graph, random_backward_graph, random_chains_graph, random_graph
from thunder_memfuse import _C
from thunder_memfuse._plan import Plan
from benchmarks.seed import seed_graph_spec


def seed_graph(efficient):
    return seed_graph_spec(efficient)[0]


def _check_plan_properties(g: Graph, spec, p):
    n = len(spec["ops"])
    assert sorted(p.order) == list(range(n))
    assert g.valid(p.order), "order must be topological and respect `after`"
    # groups: consecutive runs of the order, only fusible ops in multi-op groups
    flat = [k for grp in p.groups for k in grp]
    assert flat == p.order
    for grp in p.groups:
        assert len(grp) >= 1
        if len(grp) > 1:
            assert all(spec["fusible"][k] for k in grp)
    # mf_core.h NOTE [group kinds]: no epilogues here, so a group is one op or a region
    assert p.kinds == ["single" if len(grp) == 1 else "region" for grp in p.groups]
    assert p.peak_bytes <= p.unfused_peak_bytes and p.peak_bytes <= p.baseline_peak_bytes
    if p.fusion_moves == 0:  # moves may trade the unfused peak for a lower fused one
        assert p.unfused_peak_bytes <= p.baseline_peak_bytes
    # every figure agrees with the reference simulator
    assert p.unfused_peak_bytes == g.simulate(p.order)
    assert p.peak_bytes == g.simulate(p.order, p.groups)
    assert p.baseline_peak_bytes == g.simulate(list(range(n)))
    assert p.lower_bound_bytes <= p.unfused_peak_bytes


def _check_against_optimum(g, spec, p, i, must_prove) -> bool:
    """The plan's properties, never below the brute-force optimum, `optimal` only when it is
    (required when must_prove).  Returns p.optimal."""
    _check_plan_properties(g, spec, p)
    best = g.min_peak()
    assert p.unfused_peak_bytes >= best
    if p.optimal:
        assert p.unfused_peak_bytes == best, f"graph {i}: claims optimal: {spec}"
    if must_prove:
        assert p.optimal, f"graph {i}: not proven at the default cap: {spec}"
    return p.optimal


def test_random_dags_are_optimal_against_brute_force():
    rng = random.Random(1234)
    n_graphs = 1000
    for i in range(n_graphs):
        spec = random_graph(rng, max_ops=12)
        g = Graph(**spec)
        p = tm.plan(**spec, fusion_moves=False)
        _check_plan_properties(g, spec, p)
        assert p.optimal, f"graph {i}: not proven optimal at the default cap: {spec}"
        assert p.unfused_peak_bytes == g.min_peak(), f"graph {i}: {spec}"


@pytest.mark.parametrize("max_states", [None, 1, 40])
def test_parallel_chains_against_brute_force(max_states):
    """Parallel-chain graphs (forks, joins, recomputation, weight-gradient
    sinks, horizontal listing): whenever the plan says optimal its peak is the
    brute-force optimum, and it is never worse than the input order.  With
    max_states=1 the order comes from the heuristics and Liu's merging alone."""
    rng = random.Random(2024)
    n_optimal = n_liu = 0
    for i in range(250):
        spec = random_chains_graph(rng)
        if len(spec["ops"]) > 14:
            continue
        g = Graph(**spec)
        p = tm.plan(**spec, max_states=max_states, fusion_moves=False)
        n_optimal += _check_against_optimum(g, spec, p, i, must_prove=max_states is None)
        n_liu += p.method == "liu"
    assert n_optimal > 0
    if max_states == 1:
        assert n_liu > 0, "Liu's order never kept with the DP off"


def _plan_dp_max_ops(spec, dp_max_ops, max_states=None):
    """tm.plan with the test-only _dp_max_ops: pieces above that many ops are
    'large' (mf_sched.c NOTE [DP piece size]): scaled DP share, growing windows."""
    return Plan(**_C.plan(**spec, max_states=max_states, _dp_max_ops=dp_max_ops, fusion_moves=False))


@pytest.mark.parametrize("max_states", [None, 5, 30])
def test_large_pieces_against_brute_force(max_states):
    """Small graphs whose pieces count as large (dp_max_ops 2..3): the DP runs
    with the scaled share of states and, when it is capped, the windows grow.
    Whatever the cap: valid, never worse than the input order, never below
    the optimum, optimal only when it is; at the default cap proven."""
    rng = random.Random(4242)
    n_proven = n = 0
    for i in range(300):
        gen = (random_graph, random_chains_graph, random_backward_graph)[i % 3]
        spec = gen(rng, max_ops=11) if gen is not random_chains_graph else random_chains_graph(rng)
        if len(spec["ops"]) > 12:
            continue
        g = Graph(**spec)
        p = _plan_dp_max_ops(spec, 2 + i % 2, max_states)
        n_proven += _check_against_optimum(g, spec, p, i, must_prove=max_states is None)
        n += 1
    assert n > 200 and n_proven > 0


def test_nanogpt_backward_is_one_large_piece_solved_by_the_dp():
    """A real Thunder backward (nanoGPT, 4 layers, CPU trace; tests/data): op 0
    makes the saved tensors, so no cut splits the 617 ops.  Before the DP took
    large pieces, only 24-op windows touched it: 89.52 MiB, unproven.  The
    scaled-share DP proves 89.02 MiB optimal in a few thousand states."""
    with open(os.path.join(os.path.dirname(__file__), "data", "nanogpt_plain_backward.json")) as f:
        d = json.load(f)
    spec = dict(ops=[(i, o) for i, o in d["ops"]], value_bytes=d["value_bytes"], graph_inputs=d["graph_inputs"],
                graph_outputs=d["graph_outputs"], aliases=[tuple(a) for a in d["aliases"]], fusible=d["fusible"],
                after=[tuple(a) for a in d["after"]])
    p = tm.plan(**spec, fuse=False)
    assert len(spec["ops"]) == 617
    assert p.baseline_peak_bytes == 93886464  # 89.54 MiB
    assert p.unfused_peak_bytes == 93342720  # 89.02 MiB (89.52 before)
    assert p.optimal and p.method == "dp"
    assert 0 < p.states < 10000
    peak, _, _ = tm.simulate(spec["ops"], spec["value_bytes"], p.order, graph_inputs=spec["graph_inputs"],
                             graph_outputs=spec["graph_outputs"], aliases=spec["aliases"])
    assert peak == p.unfused_peak_bytes


def test_liu_is_optimal_on_independent_chains():
    """No fork (each chain frees only what it allocated), one join or none:
    Liu's rule is exact (NOTE [liu merge]), so even with the DP off
    (max_states=1) the plan reaches the brute-force optimum."""
    rng = random.Random(77)
    for i in range(200):
        spec = random_chains_graph(rng, max_len=4, fork=False, join=rng.choice(["none", "one"]), sinks=False,
                                   recompute=False)
        if len(spec["ops"]) > 13:
            continue
        g = Graph(**spec)
        p = tm.plan(**spec, max_states=1, fusion_moves=False)
        _check_plan_properties(g, spec, p)
        assert p.unfused_peak_bytes == g.min_peak(), f"graph {i}: {spec}"


def test_small_dags_against_every_order():
    """The subset search in the reference is itself checked by enumerating orders."""
    rng = random.Random(99)
    for _ in range(150):
        spec = random_graph(rng, max_ops=6)
        g = Graph(**spec)
        best = min(g.simulate(o) for o in g.all_orders())
        assert g.min_peak() == best
        assert tm.plan(**spec, fusion_moves=False).unfused_peak_bytes == best


def best_grouping(g, order, allowed):
    """(least peak, fewest groups) over every split of `order` into runs, each run of two or
    more ops passing allowed(run); by exhaustion (small graphs)."""
    best, n = None, len(order)
    for cuts in range(1 << max(n - 1, 0)):
        groups, cur = [], [order[0]]
        for j in range(1, n):
            if (cuts >> (j - 1)) & 1:
                groups.append(cur)
                cur = [order[j]]
            else:
                cur.append(order[j])
        groups.append(cur)
        if all(len(gr) == 1 or allowed(gr) for gr in groups):
            key = (g.simulate(order, groups), len(groups))
            best = key if best is None or key < best else best
    return best


def test_fusion_grouping_is_least_peak_then_fewest_groups():
    rng = random.Random(7)
    for _ in range(300):
        spec = random_graph(rng, max_ops=7)
        g = Graph(**spec)
        p = tm.plan(**spec)
        # all groupings of this order into runs of fusible ops
        best = best_grouping(g, p.order, lambda gr: all(spec["fusible"][k] for k in gr))
        assert (p.peak_bytes, len(p.groups)) == best


def test_fusion_moves_against_every_order():
    """NOTE [fusion-aware moves]: the moves only lower the fused peak, never below the least
    fused peak over every order and grouping, and `optimal` stays true to the unfused order."""
    rng = random.Random(321)
    lowered = 0
    for i in range(300):
        spec = random_graph(rng, max_ops=7)
        g = Graph(**spec)
        fixed = tm.plan(**spec, fusion_moves=False)
        p = tm.plan(**spec)
        _check_plan_properties(g, spec, p)
        fusible_run = lambda gr: all(spec["fusible"][k] for k in gr)  # noqa: E731
        assert (p.peak_bytes, len(p.groups)) == best_grouping(g, p.order, fusible_run)
        if p.fusion_moves:
            lowered += 1
            assert p.peak_bytes < fixed.peak_bytes, f"graph {i}: moves kept without a gain: {spec}"
        else:
            assert (p.order, p.groups) == (fixed.order, fixed.groups)
        assert p.peak_bytes >= min(best_grouping(g, o, fusible_run)[0] for o in g.all_orders()), f"graph {i}"
        assert p.optimal == (p.unfused_peak_bytes == g.min_peak())
    assert lowered > 0  # the moves do lower peaks on some of these graphs


def test_fusion_moves_join_a_region_across_a_gemm():
    """The checkpointed-backward pattern in four ops: a (elementwise) frees the big z early,
    so the unfused optimum runs it before the GEMM, which splits a from c (elementwise): its
    big result is materialized across the GEMM.  With the GEMM moved first, a and c form one
    region and a's result is never materialized; the unfused peak of that order is higher."""
    X, Z, E, Y, S = 10, 100, 1000, 100, 10
    ops = [([0], [1]),     # 0: z = k(x)       not fusible
           ([1], [2]),     # 1: a = f(z)       fusible, frees z
           ([0], [3]),     # 2: y = gemm(x)    not fusible
           ([2, 3], [4])]  # 3: c = h(a, y)    fusible, the output
    vb = [X, Z, E, Y, S]
    kw = dict(graph_inputs=[0], graph_outputs=[4], fusible=[False, True, False, True])
    g = Graph(ops=ops, value_bytes=vb, aliases=[], after=[], **kw)
    fixed = tm.plan(ops, vb, **kw, fusion_moves=False)
    assert fixed.order == [0, 1, 2, 3] and fixed.peak_bytes == fixed.unfused_peak_bytes == E + Y + S
    p = tm.plan(ops, vb, **kw)
    best = min(best_grouping(g, o, lambda gr: all(kw["fusible"][k] for k in gr))[0] for o in g.all_orders())
    assert p.fusion_moves > 0 and p.peak_bytes == best == Z + Y + S
    assert p.groups[-1] == [1, 3] and p.peak_bytes == g.simulate(p.order, p.groups)
    assert p.unfused_peak_bytes == Z + Y + E > fixed.unfused_peak_bytes and not p.optimal


def test_epilogue_pairs_against_every_grouping():
    """mf_fuse.c NOTE [epilogue pairs]: with pairs (v, u) allowed, the grouping is still the
    least peak, then fewest groups, over runs of fusible ops and valid pairs."""
    rng = random.Random(11)
    formed = pairs = 0
    for _ in range(300):
        spec = random_graph(rng, max_ops=7)
        g = Graph(**spec)
        cands = [(v, g.producer[x]) for v, (ins, _) in enumerate(spec["ops"]) for x in ins
                 if x in g.producer and g.producer[x] != v]
        epilogues = dict(rng.sample(cands, min(len(cands), 2)))  # v -> u, one head per v
        p = tm.plan(**spec, epilogues=sorted(epilogues.items()))
        st = g.storages()

        def pair_ok(grp):
            u, v = grp
            return epilogues.get(v) == u and all(
                not s["output"] and s["readers"] <= {v} for s in st.values() if s["counted"] and s["producer"] == u)

        fusible_or_pair = lambda gr: all(spec["fusible"][k] for k in gr) or (len(gr) == 2 and pair_ok(gr))  # noqa: E731
        best = best_grouping(g, p.order, fusible_or_pair)
        assert (p.peak_bytes, len(p.groups)) == best
        assert p.peak_bytes <= p.unfused_peak_bytes
        sim = tm.simulate(spec["ops"], spec["value_bytes"], p.order, p.groups, graph_inputs=spec["graph_inputs"],
                          graph_outputs=spec["graph_outputs"], aliases=spec["aliases"])[0]
        assert sim == p.peak_bytes == g.simulate(p.order, p.groups)
        formed += sum(1 for gr in p.groups if len(gr) == 2 and not all(spec["fusible"][k] for k in gr))
        # mf_core.h NOTE [group kinds]: a two-op group meeting the pair's rule is an epilogue pair
        # (fusible or not), any other group of two or more a region
        assert p.kinds == ["single" if len(gr) == 1 else "epilogue" if len(gr) == 2 and pair_ok(gr) else "region"
                           for gr in p.groups]
        pairs += p.kinds.count("epilogue")
    assert formed > 0  # some pairs of a non-fusible head were formed
    assert pairs >= formed


def test_epilogue_pair_skips_the_pre_activation():
    # x -> u (gemm, 400 B result) -> v (relu) -> w: as a pair, u's result is never materialized
    ops, vb = [([0], [1]), ([1], [2]), ([2], [3])], [100, 400, 100, 100]
    kw = dict(graph_inputs=[0], graph_outputs=[3], fusible=[False, True, False])
    p = tm.plan(ops, vb, **kw, epilogues=[(1, 0)])
    assert p.groups == [[0, 1], [2]] and p.peak_bytes == 200 and p.unfused_peak_bytes == 500
    assert p.kinds == ["epilogue", "single"]  # the plan says what the pair is (NOTE [group kinds])
    assert tm.plan(ops, vb, **kw).peak_bytes == 500
    off = tm.plan(ops, vb, **kw, epilogues=[(1, 0)], fuse=False)
    assert off.groups == [[0], [1], [2]] and off.kinds == ["single"] * 3
    # both fusible: the pair is formed by either rule, and the kind is still the pair's
    both = tm.plan(ops, vb, **dict(kw, fusible=[True, True, False]), epilogues=[(1, 0)])
    assert both.groups == [[0, 1], [2]] and both.kinds == ["epilogue", "single"]
    kw["graph_outputs"] = [1, 3]  # the kernel would have to write u's result too
    assert tm.plan(ops, vb, **kw, epilogues=[(1, 0)]).groups == [[0], [1], [2]]
    # ... but with both fusible, [u, v] is a region that writes it (not an epilogue pair)
    reg = tm.plan(ops, vb, **dict(kw, fusible=[True, True, False]), epilogues=[(1, 0)])
    assert reg.groups == [[0, 1], [2]] and reg.kinds == ["region", "single"]


def test_simulate_matches_reference():
    rng = random.Random(5)
    for _ in range(200):
        spec = random_graph(rng, max_ops=8)
        g = Graph(**spec)
        order = list(range(len(spec["ops"])))
        peak, steps, live = tm.simulate(spec["ops"], spec["value_bytes"], order,
                                        graph_inputs=spec["graph_inputs"], graph_outputs=spec["graph_outputs"],
                                        aliases=spec["aliases"])
        assert peak == g.simulate(order) == max(steps, default=0)
        assert len(steps) == len(live) == len(order)
        assert all(lv <= st for lv, st in zip(live, steps))


@pytest.mark.parametrize("efficient", [True, False])
def test_seed_graph(efficient):
    spec = seed_graph(efficient)
    p = tm.plan(**spec)
    assert p.unfused_peak_bytes == 786432 == 3 * SEED_BYTES
    assert p.peak_bytes == 786432
    assert p.optimal
    g = Graph(**spec)
    assert g.valid(p.order)
    if efficient:
        assert p.baseline_peak_bytes == 786432
    else:
        assert p.baseline_peak_bytes > 786432
        assert p.baseline_peak_bytes == g.simulate(list(range(len(spec["ops"]))))


def test_seed_plans_agree_between_the_two_functions():
    pe, pi = tm.plan(**seed_graph(True)), tm.plan(**seed_graph(False))
    assert pe.unfused_peak_bytes == pi.unfused_peak_bytes == 0.75 * MIB


def test_views_share_storage_and_inputs_are_free():
    # x (input) -> v = view(x) -> y = f(v) (output)
    p = tm.plan([([0], [1]), ([1], [2])], [100, 100, 10], graph_inputs=[0], graph_outputs=[2], aliases=[(1, 0)])
    assert p.unfused_peak_bytes == 10
    # view of a produced value keeps its base alive until the view's last use
    ops = [([0], [1]), ([1], [2]), ([2], [3])]
    p = tm.plan(ops, [0, 50, 50, 7], graph_inputs=[0], graph_outputs=[3], aliases=[(2, 1)])
    assert p.unfused_peak_bytes == 57


def test_after_edges_are_respected():
    ops = [([], [0]), ([], [1])]
    p = tm.plan(ops, [10, 10], graph_outputs=[0, 1], after=[(1, 0)])
    assert p.order == [1, 0]


def test_max_states_cap_still_returns_a_valid_plan():
    spec = random_graph(random.Random(3), max_ops=12)
    p = tm.plan(**spec, max_states=1)
    g = Graph(**spec)
    assert g.valid(p.order)
    assert p.unfused_peak_bytes <= p.baseline_peak_bytes


@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        (dict(ops=[([], [0]), ([], [0])], value_bytes=[4]), ValueError, "produced by op 0 and op 1"),
        (dict(ops=[([1], [0])], value_bytes=[4, 4]), ValueError, "value 1"),
        (dict(ops=[([5], [0])], value_bytes=[4]), ValueError, "out of range"),
        (dict(ops=[([], [0])], value_bytes=[-4]), ValueError, "value_bytes[0]"),
        (dict(ops=[([], [0]), ([], [1])], value_bytes=[1, 1], after=[(0, 1), (1, 0)]), ValueError, "cycle"),
        (dict(ops=[([], [0])], value_bytes=[1], after=[(0, 0)]), ValueError, "cycle"),
        (dict(ops=[([], [0])], value_bytes=[1], epilogues=[(0, 0)]), ValueError, "epilogue_of 0 is not another op"),
        (dict(ops=[([], [0])], value_bytes=[1], epilogues=[(0, 3)]), ValueError, "epilogues[0][1]"),
        (dict(ops=[([], [0])], value_bytes=["4"]), TypeError, "value_bytes[0]"),
        (dict(ops=[(["a"], [0])], value_bytes=[4]), TypeError, "ops[0][0] (inputs)[0]"),
        (dict(ops=[3], value_bytes=[4]), TypeError, "ops[0]"),
        (dict(ops=[([], [0], [])], value_bytes=[4]), ValueError, "ops[0]"),
        (dict(ops=[([], [0])], value_bytes=[4], fusible=[True, False]), ValueError, "fusible"),
        (dict(ops=[([], [0])], value_bytes=[4], graph_inputs=[0]), ValueError, "input"),
        (dict(ops=[([], [0])], value_bytes=[4], aliases=[(0, 0)]), ValueError, "view of itself"),
        (dict(ops=[([], [0])], value_bytes=[4], graph_outputs=[9]), ValueError, "graph_outputs[0]"),
        (dict(ops=None, value_bytes=[4]), TypeError, "ops"),
        (dict(ops=[([], [0])], value_bytes=[4], max_states=0), ValueError, "max_states"),
    ],
)
def test_bad_input_is_named(kwargs, exc, words):
    with pytest.raises(exc) as ei:
        tm.plan(**kwargs)
    assert words in str(ei.value)


def test_empty_graph():
    p = tm.plan([], [])
    assert p.order == [] and p.groups == [] and p.peak_bytes == 0 and p.optimal


def test_stored_fusible_ops_keep_their_tensors():
    """csrc/core/mf_fuse.c NOTE [stored inner values]: an op given as fusible=2 (a GEMM in an
    Inductor region) may join a group, but what it reads and writes is counted as stored."""
    ops = [([0], [1]), ([1], [2]), ([2], [3])]  # relu, gemm, relu
    kw = dict(graph_inputs=[0], graph_outputs=[3])
    vb = [MIB] * 4
    plain = tm.plan(ops, vb, fusible=[True, True, True], **kw)
    stored = tm.plan(ops, vb, fusible=[True, 2, True], **kw)
    assert plain.peak_bytes == MIB and plain.groups == [[0, 1, 2]]
    assert stored.peak_bytes == 2 * MIB and len(stored.groups) == 2
    # the simulator counts one group of all three as the stored rule says: inner 1 and 2 stored
    assert tm.simulate(ops, vb, [0, 1, 2], [[0, 1, 2]], fusible=[True, 2, True], **kw)[0] == 3 * MIB
    assert tm.simulate(ops, vb, [0, 1, 2], [[0, 1, 2]], fusible=[1, 1, 1], **kw)[0] == MIB
    assert tm.simulate(ops, vb, [0, 1, 2], [[0, 1, 2]], **kw)[0] == MIB
    # a stored value counts to the group's end (the margin NOTE [stored inner values] keeps):
    # relu, gemm, relu, gemm, relu in one group stores its four inner values and its output
    ops5 = [([k], [k + 1]) for k in range(5)]
    five = tm.simulate(ops5, [MIB] * 6, list(range(5)), [list(range(5))], graph_inputs=[0], graph_outputs=[5],
                       fusible=[1, 2, 1, 2, 1])
    assert five[0] == 5 * MIB


def _wide_graph(rng, n):
    """A random DAG whose ops read 1-3 of all earlier values: long-lived values whose last readers the
    pieces cannot settle."""
    ops, vb = [], [8]
    for _ in range(n):
        m = len(vb)
        ins = sorted(set(rng.sample(range(m), k=min(m, rng.choice([1, 1, 2, 2, 3])))))
        ops.append((ins, [m]))
        vb.append(rng.choice([1, 2, 4, 8, 16, 32]))
    readers = {v for ins, _ in ops for v in ins}
    return ops, vb, [v for v in range(1, len(vb)) if v not in readers]


def test_hoists_never_raise_a_peak_and_lower_some():
    """csrc/core/mf_hoist.c NOTE [hoists]: on orders the planner cannot prove optimal (a small state
    budget stands in for a large real graph), hoisting a storage's last reader before the peak step
    lowers the unfused peak on some graphs and never raises it; with fusion, the order before the
    hoists stays a candidate, so the fused peak never rises either.  Every figure is checked against
    the reference simulator."""
    lowered = 0
    for seed in range(60):
        rng = random.Random(seed)
        ops, vb, outs = _wide_graph(rng, rng.randrange(20, 60))
        fus = [rng.random() < 0.7 for _ in ops]
        for fuse in (False, True):
            kw = dict(graph_inputs=[0], graph_outputs=outs, fuse=fuse, fusible=fus, max_states=50)
            off = Plan(**_C.plan(ops, vb, _hoists=False, **kw))
            on = Plan(**_C.plan(ops, vb, **kw))
            assert on.peak_bytes <= off.peak_bytes, (seed, fuse)
            g = Graph(ops, vb, graph_inputs=[0], graph_outputs=outs, fusible=fus)
            _check_plan_properties(g, dict(ops=ops, fusible=fus), on)
            if not fuse and on.peak_bytes < off.peak_bytes:
                lowered += 1
                assert on.hoists > 0 and not off.hoists
    assert lowered >= 3


def test_fused_hoists_lower_fused_peaks_the_unfused_hoists_leave():
    """csrc/core/mf_hoist.c NOTE [fused hoists]: on graphs where the unfused hoists find nothing
    (the plan without fusion has none), moving ops after the fused peak's group to before it still
    lowers some fused peaks; it never raises one, nor the unfused peak, and every figure is the
    reference simulator's."""
    lowered = 0
    for seed in range(120):
        rng = random.Random(seed)
        ops, vb, outs = _wide_graph(rng, rng.randrange(20, 60))
        fus = [rng.random() < 0.7 for _ in ops]
        kw = dict(graph_inputs=[0], graph_outputs=outs, fusible=fus, max_states=50)
        if Plan(**_C.plan(ops, vb, fuse=False, **kw)).hoists:
            continue
        off = Plan(**_C.plan(ops, vb, fuse=True, _hoists=False, **kw))
        on = Plan(**_C.plan(ops, vb, fuse=True, **kw))
        assert on.peak_bytes <= off.peak_bytes, seed
        assert on.unfused_peak_bytes <= off.unfused_peak_bytes, seed
        _check_plan_properties(Graph(ops, vb, graph_inputs=[0], graph_outputs=outs, fusible=fus),
                               dict(ops=ops, fusible=fus), on)
        if on.peak_bytes < off.peak_bytes:
            lowered += 1
            assert on.fusion_moves > 0, seed
    assert lowered >= 2



def test_a_peak_allowance_trades_peak_for_fewer_groups_up_to_it():
    # csrc/core/mf_fuse.c NOTE [peak allowance]: op 2 is a GEMM in a region (stored: its result counts
    # while the region runs), so the least-peak grouping keeps op 1 apart; an allowance lets one group
    # hold ops 1-3, above the unfused peak, but never above the allowance
    ops = [([0], [1]), ([1], [2]), ([0], [3]), ([2, 3], [4])]
    kw = dict(graph_inputs=[0], graph_outputs=[4], fusible=[0, 1, 2, 1])
    vb = [8, 100, 10, 100, 10]
    least = tm.plan(ops, vb, **kw)
    assert least.groups == [[0], [1], [2, 3]] and least.peak_bytes == least.unfused_peak_bytes == 120
    assert tm.plan(ops, vb, peak_allowance=209, **kw).groups == least.groups  # one byte short
    merged = tm.plan(ops, vb, peak_allowance=210, **kw)
    assert merged.groups == [[0], [1, 2, 3]] and merged.peak_bytes == 210 and merged.unfused_peak_bytes == 120
    assert tm.plan(ops, vb, peak_allowance=10**9, **kw).groups == merged.groups
    with pytest.raises(ValueError, match="peak_allowance"):
        tm.plan(ops, vb, peak_allowance=-1, **kw)
