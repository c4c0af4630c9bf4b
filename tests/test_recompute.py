"""Recomputation (csrc/core/mf_remat.c NOTE [recomputation], thunder_memfuse/integration/_recompute.py).

- On small graphs the chosen copies give the least simulated peak over every copy set within the
  budget, found here by brute force over the same move set (at most 10 candidate splits).
- Random ops, in-place writes and other effects are never copied; results equal plain Thunder's.
- A checkpointed MLP with GELU and LayerNorm: gradients equal, the measured peak is below the same
  jit without recomputation, and the planner's peak equals the measured one within one tensor.
"""
import itertools
import random

import pytest
import torch
import thunder

from thunder_memfuse import MemFuse, _C
from thunder_memfuse.integration import _recompute
from thunder_memfuse.measure import cpu_peak_bytes

from models import checkpointed_mlp, module_step


# ---------------------------------------------------------------- small graphs, brute force

def _random_graph(rng, n_ops):
    """A random DAG: op k reads 1-2 earlier values (or the input) and makes one value."""
    ops, vb = [], [rng.choice([4, 8, 16])]
    for k in range(n_ops):
        ins = sorted(set(rng.sample(range(len(vb)), k=min(len(vb), rng.choice([1, 2])))))
        ops.append((ins, [len(vb)]))
        vb.append(rng.choice([1, 4, 8, 16, 32]))
    readers = {v for ins, _ in ops for v in ins}
    outs = [v for v in range(1, len(vb)) if v not in readers]
    cheap = [rng.random() < 0.6 for _ in ops]
    return ops, vb, outs, cheap


def _candidates(ops, vb, outs, cheap, order):
    """The move set of NOTE [recomputation] on a graph without views: (value, k) for every value made
    by a cheap op alone, not an output, with at least two readers; k >= 1 indexes its readers in
    `order`."""
    pos = {op: i for i, op in enumerate(order)}
    out = []
    for p, (ins, os_) in enumerate(ops):
        if not cheap[p] or len(os_) != 1 or os_[0] in outs:
            continue
        r = os_[0]
        rd = sorted((k for k, (i2, _) in enumerate(ops) if r in i2), key=pos.get)
        out.extend((r, k, rd) for k in range(1, len(rd)))
    return out


def _apply(ops, vb, order, splits):
    """The graph with the splits' copies inserted before the reader starting each segment, in the
    order of `order`; returns (ops, value_bytes) with the new order 0..n-1."""
    prod = {o: p for p, (_, os_) in enumerate(ops) for o in os_}
    seg = {}  # (reader op, value) -> split index
    for i, (r, k, rd) in enumerate(splits):
        ks = sorted(kk for rr, kk, _ in splits if rr == r)
        hi = next((kk for kk in ks if kk > k), len(rd))
        for q in range(k, hi):
            seg[(rd[q], r)] = i
    new_ops, new_vb, made = [], list(vb), {}
    for op in order:
        ins, os_ = ops[op]
        new_ins = []
        for v in ins:
            i = seg.get((op, v))
            if i is None:
                new_ins.append(v)
                continue
            if i not in made:
                made[i] = len(new_vb)
                new_vb.append(vb[v])
                new_ops.append((list(ops[prod[v]][0]), [made[i]]))
            new_ins.append(made[i])
        new_ops.append((new_ins, list(os_)))
    return new_ops, new_vb


@pytest.mark.parametrize("seed", range(40))
def test_copies_are_the_best_copy_set_on_small_graphs(seed):
    """Where the core searched exactly (at most 10 candidates), nothing beats its copies."""
    rng = random.Random(seed)
    while True:  # a graph with 1 to 10 candidate splits, where the core's search is exact
        ops, vb, outs, cheap = _random_graph(rng, rng.randrange(4, 9))
        base = _C.plan(ops, vb, graph_inputs=[0], graph_outputs=outs, fuse=False)
        order = base["order"]
        cands = _candidates(ops, vb, outs, cheap, order)
        if 1 <= len(cands) <= 10:
            break
    budget = sum(vb) // 2
    best = _C.simulate(ops, vb, order, graph_inputs=[0], graph_outputs=outs)[0]
    for n in range(1, len(cands) + 1):
        for sub in itertools.combinations(cands, n):
            if sum(vb[r] for r, _, _ in sub) > budget:
                continue
            o2, v2 = _apply(ops, vb, order, list(sub))
            best = min(best, _C.simulate(o2, v2, list(range(len(o2))), graph_inputs=[0],
                                         graph_outputs=outs)[0])
    got = _C.plan(ops, vb, graph_inputs=[0], graph_outputs=outs, fuse=False, recompute=budget, cheap=cheap)
    assert got["peak_bytes"] <= base["peak_bytes"]
    assert got["peak_bytes"] <= best, "brute force found a copy set with a lower peak"
    if got["peak_bytes"] < base["peak_bytes"]:
        rc = got["recompute"]
        assert rc["splits"] >= 1 and 0 < rc["copied_bytes"] <= budget
        g = rc["graph"]  # the graph with the copies, planned: the plan scores as reported
        sim = _C.simulate(g["ops"], g["value_bytes"], got["order"], graph_inputs=g["graph_inputs"],
                          graph_outputs=g["graph_outputs"])
        assert sim[0] == got["unfused_peak_bytes"]
        # every copy copies a cheap op
        assert all(cheap[o] for o in rc["origin"] if rc["origin"].count(o) > 1)
        assert len(rc["origin"]) > len(ops)


def test_a_chain_is_recomputed_whole_where_one_link_cannot_help():
    """csrc/core/mf_remat.c NOTE [chain splits]: c = g(b), b = f(m) are cheap; c is read before the
    peak and after it, b only by c.  Copying c alone keeps b alive across the peak instead, which
    gains nothing; copying b and c together (m stays alive anyway) frees both.  Twelve small
    candidates make the search greedy, where chains are offered."""
    ops = [([0], [1]),          # op 0: m (not cheap), read again at the end
           ([1], [2]),          # op 1: b = f(m)
           ([2], [3]),          # op 2: c = g(b)
           ([3], [4])]          # op 3: e, an early reader of c
    vb = [1, 10, 10, 10, 1]
    cheap = [False, True, True, False]
    small = []
    for _ in range(12):         # small cheap values with two readers each: candidates, no gain
        p = len(vb)
        ops.append(([0], [p]))
        vb.append(1)
        cheap.append(True)
        ops.append(([p], [p + 1]))
        vb.append(1)
        cheap.append(False)
        small += [p, p + 1]
    big = len(vb)
    ops.append(([4], [big]))            # the peak: a big value made from e
    vb.append(50)
    ops.append(([big], [big + 1]))
    vb.append(1)
    ops.append(([3, big + 1, 1], [big + 2]))  # the late reader of c (and of m)
    vb.append(1)
    ops.append((small, [big + 3]))
    vb.append(1)
    cheap += [False] * 4
    kw = dict(graph_inputs=[0], graph_outputs=[big + 2, big + 3], fuse=False)
    base = _C.plan(ops, vb, **kw)
    got = _C.plan(ops, vb, recompute=1000, cheap=cheap, **kw)
    assert got["peak_bytes"] <= base["peak_bytes"] - 10, (base["peak_bytes"], got["peak_bytes"])
    origin = got["recompute"]["origin"]
    assert origin.count(1) == 2 and origin.count(2) == 2  # b and c both run twice
    assert origin.count(0) == 1  # the matmul-like op never


def test_the_search_runs_again_on_the_order_planned_with_its_copies():
    """csrc/core/mf_pipeline.c NOTE [recomputation passes]: the first search copies v2 for op 4; planned
    again, that graph's order lets a second search copy v1 too (for op 3 and for v2's copy), which no
    copy set on the first order reaches.  The result names the caller's ops and values."""
    ops = [([0], [1]), ([0, 1], [2]), ([0, 2], [3]), ([1, 3], [4]), ([2, 4], [5]), ([4], [6])]
    vb = [8, 32, 16, 32, 1, 32, 4]
    cheap = [1, 1, 1, 1, 1, 0]
    kw = dict(graph_inputs=[0], graph_outputs=[5, 6], fuse=False, cheap=cheap)
    plain = _C.plan(ops, vb, graph_inputs=[0], graph_outputs=[5, 6], fuse=False)
    one = _C.plan(ops, vb, recompute=1000, _recompute_passes=1, **kw)
    got = _C.plan(ops, vb, recompute=1000, **kw)
    assert got["peak_bytes"] < one["peak_bytes"] < plain["peak_bytes"]
    rc = got["recompute"]
    assert rc["splits"] > one["recompute"]["splits"]
    assert sorted(set(rc["origin"])) == list(range(len(ops)))  # ops of the caller's graph
    assert rc["value_origin"][: len(vb)] == list(range(len(vb)))
    copied = rc["value_origin"][len(vb):]
    assert copied and rc["copied_bytes"] == sum(vb[v] for v in copied)
    assert all(cheap[o] for o in rc["origin"] if rc["origin"].count(o) > 1)
    assert got["peak_bytes_without_recompute"] == plain["peak_bytes"]
    g = rc["graph"]
    sim = _C.simulate(g["ops"], g["value_bytes"], got["order"], graph_inputs=g["graph_inputs"],
                      graph_outputs=g["graph_outputs"])
    assert sim[0] == got["unfused_peak_bytes"]
    for budget in range(1, 64):  # later passes spend only what is left
        r = _C.plan(ops, vb, recompute=budget, **kw)
        assert r["peak_bytes"] <= plain["peak_bytes"]
        if "recompute" in r:
            assert 0 < r["recompute"]["copied_bytes"] <= budget


def test_a_split_the_unfused_search_cannot_score_is_found_at_the_fused_peak():
    """csrc/core/mf_remat_focus.c NOTE [focused splits]: the unfused peak is op 1's step (v1, 20 bytes),
    which no copy lowers, so the search keeps nothing.  With regions the peak is op 5's step, where
    v4 (made by cheap op 3, read by op 4 in the region before and by op 7 at the end) is still
    live; copying op 3 next to op 7, where the copy and op 7 form one region, lowers the fused peak.
    Without regions the same budget copies nothing."""
    vb = [1, 20, 1, 4, 4, 1, 1, 1, 1]
    ops = [([0], [1]), ([1], [2]), ([2], [3]), ([3], [4]), ([4], [5]), ([5], [6]), ([6], [7]), ([3, 4, 7], [8])]
    fus = [True, True, True, True, True, False, False, True]
    cheap = [0, 0, 0, 1, 0, 0, 0, 0]
    kw = dict(graph_inputs=[0], graph_outputs=[8], fusible=fus)
    plain = _C.plan(ops, vb, fuse=True, **kw)
    got = _C.plan(ops, vb, fuse=True, recompute=100, cheap=cheap, **kw)
    assert got["peak_bytes"] < plain["peak_bytes"]
    rc = got["recompute"]
    assert rc["splits"] == 1 and rc["origin"].count(3) == 2 and rc["copied_bytes"] == vb[4]
    g = rc["graph"]
    sim = _C.simulate(g["ops"], g["value_bytes"], got["order"], groups=got["groups"],
                      graph_inputs=g["graph_inputs"], graph_outputs=g["graph_outputs"], fusible=g["fusible"])
    assert sim[0] == got["peak_bytes"]
    assert "recompute" not in _C.plan(ops, vb, fuse=False, recompute=100, cheap=cheap, **kw)
    assert "recompute" not in _C.plan(ops, vb, fuse=True, recompute=vb[4] - 1, cheap=cheap, **kw)


def test_a_kept_plan_is_never_above_the_full_plan_of_its_graph():
    """csrc/core/mf_pipeline.c NOTE [recomputation passes]: whatever the passes keep (searches from two
    starts, focused tries planned with a tenth of the DP states and the best planned again in full),
    the returned plan is one of the graph with the copies, as the reference simulator scores it, and
    its peak is at most what planning that graph again with the caller's budget gives.  A small state
    budget stands in for a large graph; some graphs must keep copies, or nothing was checked."""
    kept = 0
    for seed in range(80):
        rng = random.Random(seed)
        ops, vb, outs, cheap = _random_graph(rng, rng.randrange(20, 50))
        fus = [rng.random() < 0.8 for _ in ops]
        kw = dict(graph_inputs=[0], graph_outputs=outs, fusible=fus, max_states=60)
        plain = _C.plan(ops, vb, **kw)
        got = _C.plan(ops, vb, recompute=sum(vb), cheap=cheap, **kw)
        assert got["peak_bytes"] <= plain["peak_bytes"], seed
        if "recompute" not in got:
            continue
        kept += 1
        g = got["recompute"]["graph"]
        again = _C.plan(g["ops"], g["value_bytes"], graph_inputs=g["graph_inputs"],
                        graph_outputs=g["graph_outputs"], aliases=g["aliases"], fusible=g["fusible"],
                        max_states=60)
        assert got["peak_bytes"] <= again["peak_bytes"], seed
        sim = _C.simulate(g["ops"], g["value_bytes"], got["order"], groups=got["groups"],
                          graph_inputs=g["graph_inputs"], graph_outputs=g["graph_outputs"], fusible=g["fusible"])
        assert sim[0] == got["peak_bytes"], seed
    assert kept >= 10


def test_recompute_is_off_without_a_budget_or_cheap_ops():
    ops = [([0], [1]), ([1], [2]), ([2], [3]), ([3], [4]), ([1, 4], [5])]
    vb = [4, 8, 4, 16, 1, 4]
    kw = dict(graph_inputs=[0], graph_outputs=[5], fuse=False)
    plain = _C.plan(ops, vb, **kw)
    assert "recompute" not in _C.plan(ops, vb, recompute=100, cheap=[0] * 5, **kw)
    assert "recompute" not in _C.plan(ops, vb, recompute=0, cheap=[1] * 5, **kw)
    assert "recompute" not in _C.plan(ops, vb, recompute=4, cheap=[1, 0, 0, 0, 0], **kw)  # over budget
    got = _C.plan(ops, vb, recompute=8, cheap=[1, 0, 0, 0, 0], **kw)
    assert got["peak_bytes"] < plain["peak_bytes"] and got["recompute"]["copied_bytes"] == 8
    import thunder_memfuse as tm

    p = tm.plan(ops, vb, recompute=8, cheap=[1, 0, 0, 0, 0], **kw)  # the Python face carries the record
    assert p.peak_bytes == got["peak_bytes"] and p.recompute["splits"] == 1
    assert p.peak_bytes_without_recompute == plain["peak_bytes"]
    assert tm.plan(ops, vb, **kw).recompute is None
    with pytest.raises(ValueError, match="cheap has 2 entries"):
        _C.plan(ops, vb, recompute=8, cheap=[1, 0], **kw)
    with pytest.raises(ValueError, match="recompute"):
        _C.plan(ops, vb, recompute=-1, cheap=[1] * 5, **kw)


def test_a_share_of_one_is_a_share_not_the_default():
    """MemFuse(recompute=1) and recompute=1.0 ask for copies writing as much as the trace's ops: they
    equal True, and once fell through to the default share."""
    def f(x):
        return (x * 2).sin() + x

    jf = thunder.jit(f)
    jf(torch.randn(64, 64))
    bsyms = thunder.last_traces(jf)[-1].bound_symbols
    auto = _recompute.budget_bytes(bsyms, "auto")
    assert auto > 0 and _recompute.budget_bytes(bsyms, True) == auto
    for one in (1, 1.0):
        assert MemFuse(recompute=one).recompute == 1.0 and type(MemFuse(recompute=one).recompute) is float
        assert _recompute.budget_bytes(bsyms, MemFuse(recompute=one).recompute) >= 3 * auto  # the default is 0.25
    assert _recompute.budget_bytes(bsyms, MemFuse(recompute=False).recompute) == 0
    with pytest.raises(ValueError, match="recompute must be"):
        MemFuse(recompute=0)


# ---------------------------------------------------------------- Thunder traces

def test_random_ops_in_place_writes_and_effects_are_never_copied():
    def f(x, w):
        h = x @ w
        g = torch.nn.functional.gelu(h, approximate="tanh")
        d = torch.nn.functional.dropout(g, 0.3)
        y = (d @ w.t()).relu()
        h2 = g * 2
        h2.add_(1)  # an in-place write of a cheap op's result
        return (y @ w).sum() + (h2 * g).sum()

    x, w = torch.randn(64, 32, requires_grad=True), torch.randn(32, 32, requires_grad=True)

    def step(jf):
        torch.manual_seed(3)
        out = jf(x, w)
        out.backward()
        res = [out.detach(), x.grad.clone(), w.grad.clone()]
        x.grad = w.grad = None
        return res

    plain = step(thunder.jit(f))
    jm = thunder.jit(f, transforms=[MemFuse(strict=True, recompute=1.0)])
    ours = step(jm)
    for a, b in zip(plain, ours):
        assert torch.equal(a, b)
    from thunder_memfuse import _symbols

    for t in (thunder.last_traces(jm)[-1], thunder.last_backward_traces(jm)[-1]):
        assert getattr(t, "_memfuse_info", None), "memfuse did not plan this trace"
        for b in t.bound_symbols:
            if _symbols.is_random(b) or _symbols.effects(b):
                assert not _recompute.recomputable(b), b.sym.name


def test_a_checkpointed_mlp_peaks_lower_with_the_same_gradients():
    model = checkpointed_mlp()
    x = torch.randn(256, 64)
    step = module_step(model, x)
    plain = thunder.jit(model)
    without = thunder.jit(model, transforms=[MemFuse(strict=True, recompute=False)])
    ours = thunder.jit(model, transforms=[MemFuse(strict=True)])
    ref = step(plain)
    for jm in (without, ours):
        for a, b in zip(ref, step(jm)):
            assert torch.equal(a, b)
    info = thunder.last_backward_traces(ours)[-1]._memfuse_info
    rc = info["recompute"]
    assert rc and rc["copied_ops"] >= 1 and rc["peak_bytes"] < rc["peak_bytes_without"]
    import thunder_memfuse as tm

    rep = tm.report(ours)["backward"]["recompute"]
    assert rep["copied_ops"] == rc["copied_ops"] and rep["peak_bytes"] < rep["peak_without_bytes"]
    assert rep["saved_bytes_before"] == rep["saved_bytes_after"] > 0
    assert "recomputed" in tm.format_report(tm.report(ours))
    assert tm.report(without)["backward"]["recompute"] is None
    peak_without, _ = cpu_peak_bytes(lambda: step(without))
    peak_ours, _ = cpu_peak_bytes(lambda: step(ours))
    assert peak_ours < peak_without
    # the planner's figure is the measured one, within one tensor of the backward
    from thunder_memfuse.measure import compare

    cmp = compare(ours, x)
    bw = cmp["backward"]
    assert bw.within_one_tensor, cmp.summary()
    assert bw.plan_peak is None or abs(bw.plan_peak - bw.measured_peak) <= bw.largest_tensor, cmp.summary()


def test_the_plan_with_copies_carries_its_group_kinds():
    # csrc/core/mf_core.h NOTE [group kinds]: the plan of the graph with the copies (planned again
    # by mf_plan) gives each of its groups a kind, the epilogue pair [gemm, relu] included
    ops = [([0], [1]), ([1], [2]), ([2], [3]), ([3], [4]), ([4], [5]), ([5], [6]), ([1, 6], [7])]
    vb = [4, 8, 4, 16, 4, 16, 2, 4]
    kw = dict(graph_inputs=[0], graph_outputs=[7], fuse=True, epilogues=[(3, 2)])
    got = _C.plan(ops, vb, recompute=8, cheap=[1] + [0] * 6, **kw)
    assert got["peak_bytes"] < got["peak_bytes_without_recompute"]
    origin = got["recompute"]["origin"]
    assert len(origin) == len(ops) + 1  # op 0 is copied before op 6
    assert len(got["kinds"]) == len(got["groups"])
    pair = [gr for gr, k in zip(got["groups"], got["kinds"]) if k == "epilogue"]
    assert [[origin[o] for o in gr] for gr in pair] == [[2, 3]]
    assert all(k == "single" for gr, k in zip(got["groups"], got["kinds"]) if len(gr) == 1)


def test_plot_timeline_marks_the_recomputed_copies():
    """Each step of memfuse's schedule where a copy runs (an op whose original ran earlier) is marked."""
    pytest.importorskip("matplotlib")
    import thunder_memfuse as tm

    model = checkpointed_mlp()
    jm = thunder.jit(model, transforms=[MemFuse(strict=True, recompute=1.0)])
    module_step(model, torch.randn(256, 64))(jm)
    copied = thunder.last_backward_traces(jm)[-1]._memfuse_info["recompute"]["copied_ops"]
    fig = tm.plot_timeline(jm)
    labels = [t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()]
    marked = [lb for lb in labels if lb.startswith("memfuse, a recomputed copy runs")]
    assert len(marked) == 1  # the backward only: a training forward keeps what the backward reads
    n = int(marked[0].split("(")[1].split()[0])
    assert 0 < n <= copied
