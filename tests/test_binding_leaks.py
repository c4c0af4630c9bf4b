"""The binding leaks nothing: repeated calls, including failing ones, keep RSS flat."""
import gc

import thunder_memfuse as tm
from benchmarks.seed import seed_graph_spec


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _growth(fn, n):
    for _ in range(n // 10):  # warm up allocator pools
        fn()
    gc.collect()
    before = _rss()
    for _ in range(n):
        fn()
    gc.collect()
    return _rss() - before


def test_plan_and_simulate_do_not_leak():
    spec, _ = seed_graph_spec(False)
    order = list(range(len(spec["ops"])))
    # a leak of one order array (160 bytes) per call would be 3 MiB here
    assert _growth(lambda: tm.plan(**spec), 20000) < 1 << 20
    assert _growth(lambda: tm.simulate(spec["ops"], spec["value_bytes"], order,
                                       graph_inputs=spec["graph_inputs"]), 20000) < 1 << 20


def test_errors_do_not_leak():
    def bad():
        for kwargs in (dict(ops=[([], [0]), ([], [0])], value_bytes=[4]), dict(ops=[(["a"], [0])], value_bytes=[4]),
                       dict(ops=[([], [0]), ([], [1])], value_bytes=[1, 1], after=[(0, 1), (1, 0)])):
            try:
                tm.plan(**kwargs)
            except (TypeError, ValueError):
                pass

    assert _growth(bad, 10000) < 1 << 20


def test_plan_trace_does_not_leak():
    import torch
    import thunder
    from thunder_memfuse.integration import _planning

    def f(x, y):
        return (torch.sin(x) * y + 1).relu() @ y

    jf = thunder.jit(f)
    jf(torch.randn(8, 8), torch.randn(8, 8))
    bsyms = list(thunder.last_traces(jf)[-1].bound_symbols)
    assert _growth(lambda: _planning.plan_trace(bsyms), 3000) < 1 << 20


def test_recomputation_passes_do_not_leak():
    """csrc/core/mf_pipeline.c: the searches, the focused tries (one kept here: the graph of
    tests/test_recompute.py's focused-split test) and the plans they drop."""
    from thunder_memfuse import _C

    vb = [1, 20, 1, 4, 4, 1, 1, 1, 1]
    ops = [([0], [1]), ([1], [2]), ([2], [3]), ([3], [4]), ([4], [5]), ([5], [6]), ([6], [7]), ([3, 4, 7], [8])]
    kw = dict(graph_inputs=[0], graph_outputs=[8], fusible=[True, True, True, True, True, False, False, True],
              cheap=[0, 0, 0, 1, 0, 0, 0, 0], fuse=True)
    assert _C.plan(ops, vb, recompute=100, **kw)["recompute"]["splits"] == 1
    # a leak of one graph with copies (a few hundred bytes) per call would be over 1 MiB here
    assert _growth(lambda: _C.plan(ops, vb, recompute=100, **kw), 5000) < 1 << 20
