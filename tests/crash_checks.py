"""Inputs that could crash the interpreter, run in a child process by test_hardening.py.

A segfault here kills only the child: the parent test sees its exit status and the last
check it started.  Each check prints "start NAME" before and "ok NAME" after it runs.

- the mutation callbacks of issue 10: a user __index__ / __bool__ that changes the very
  list the binding is reading (plan.c NOTE [snapshots]);
- hypothesis properties: malformed graphs and random mutation callbacks give a result or
  a TypeError / ValueError, nothing else.
"""
from __future__ import annotations

import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import thunder_memfuse as tm
from thunder_memfuse import _C

OK_ERRORS = (TypeError, ValueError)


def call(fn, *args, **kw):
    """fn(*args, **kw): a result, or a TypeError / ValueError (returned); anything else raises."""
    try:
        return fn(*args, **kw)
    except OK_ERRORS as e:
        return e


class Evil:
    """An id whose __index__ / __bool__ first runs `action` (which mutates some list)."""

    def __init__(self, action, value=0):
        self.action, self.value = action, value

    def __index__(self):
        self.action()
        return self.value

    def __bool__(self):
        self.action()
        return bool(self.value)


# ---- the seven variants of issue 10, and the other sequences the binding reads ----

def v_op_inputs():
    ins = []
    ins += [Evil(ins.clear), 0]
    call(tm.plan, [(ins, [1])], [4, 4], graph_inputs=[0], graph_outputs=[1])


def v_op_pair():
    pair = []
    pair += [[Evil(pair.clear)], [1]]
    call(tm.plan, [pair], [4, 4], graph_inputs=[0], graph_outputs=[1])


def v_alias_pair():
    al = []
    al += [Evil(al.clear, 2), 1]
    call(tm.plan, [([0], [1]), ([1], [2])], [4, 4, 4], graph_inputs=[0], graph_outputs=[2], aliases=[al])


def v_fusible():
    fu = []
    fu += [Evil(fu.clear, 1), True]
    call(tm.plan, [([0], [1]), ([1], [2])], [4, 4, 4], graph_inputs=[0], graph_outputs=[2], fusible=fu)


def v_ops_from_fusible():
    ops = [([0], [1]), ([1], [2])]
    call(tm.plan, ops, [4, 4, 4], graph_inputs=[0], graph_outputs=[2], fusible=[Evil(ops.clear, 1), True])


def v_simulate_order():
    order = []
    order += [Evil(order.clear, 0), 1]
    call(tm.simulate, [([0], [1]), ([1], [2])], [4, 4, 4], order, graph_inputs=[0])


def v_simulate_groups():
    groups, inner = [], []
    inner += [Evil(lambda: (groups.clear(), inner.clear()), 0), 1]
    groups.append(inner)
    call(tm.simulate, [([0], [1]), ([1], [2])], [4, 4, 4], [0, 1], groups, graph_inputs=[0])


def v_graph_io_after_epilogues():
    lists = {k: [] for k in ("graph_inputs", "graph_outputs", "after", "epilogues")}
    lists["graph_inputs"] += [Evil(lists["graph_inputs"].clear, 0)] + [0] * 8
    lists["graph_outputs"] += [Evil(lists["graph_outputs"].clear, 2)] + [2] * 8
    pa = []
    pa += [Evil(pa.clear, 0), 1]
    lists["after"].append(pa)
    pe = []
    pe += [Evil(pe.clear, 1), 0]
    lists["epilogues"].append(pe)
    call(tm.plan, [([0], [1]), ([1], [2])], [4, 4, 4], **lists)


def v_value_bytes_subclass():
    vb = []

    class Big(int):
        def __index__(self):
            vb.clear()
            return 4

    vb += [Big(4), 4, 4]
    call(tm.plan, [([0], [1]), ([1], [2])], vb, graph_inputs=[0], graph_outputs=[2])


VARIANTS = [v_op_inputs, v_op_pair, v_alias_pair, v_fusible, v_ops_from_fusible, v_simulate_order,
            v_simulate_groups, v_graph_io_after_epilogues, v_value_bytes_subclass]


# ---- properties ----

PROP = settings(max_examples=300, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))

junk = st.one_of(st.integers(-3, 12), st.integers(-2**70, 2**70), st.booleans(), st.none(),
                 st.floats(allow_nan=True), st.text(max_size=2), st.just(2**63), st.just(-1))
id_list = st.one_of(st.lists(st.integers(-1, 9), max_size=4), st.lists(junk, max_size=4), junk,
                    st.tuples(st.integers(0, 9)))
pair = st.one_of(st.tuples(st.integers(-1, 9), st.integers(-1, 9)), st.lists(junk, max_size=3), junk)
op = st.one_of(st.tuples(id_list, id_list), st.lists(id_list, max_size=3), junk)
sizes = st.one_of(st.lists(st.one_of(st.integers(0, 64), st.integers(-5, 2**64), junk), max_size=10), junk)


@PROP
@given(ops=st.one_of(st.lists(op, max_size=8), junk), vb=sizes, gi=id_list, go=id_list,
       al=st.one_of(st.lists(pair, max_size=3), junk), fu=st.one_of(st.none(), st.lists(junk, max_size=8)),
       af=st.one_of(st.lists(pair, max_size=3), junk), ep=st.one_of(st.lists(pair, max_size=2), junk),
       ms=st.one_of(st.none(), junk), order=st.one_of(st.lists(junk, max_size=8), junk),
       groups=st.one_of(st.none(), st.lists(st.lists(junk, max_size=3), max_size=4), junk))
def prop_malformed(ops, vb, gi, go, al, fu, af, ep, ms, order, groups):
    r = call(_C.plan, ops, vb, graph_inputs=gi, graph_outputs=go, aliases=al, fusible=fu, after=af,
             epilogues=ep, max_states=ms)
    assert isinstance(r, (dict, *OK_ERRORS)), r
    r = call(_C.simulate, ops, vb, order, groups, graph_inputs=gi, graph_outputs=go, aliases=al)
    assert isinstance(r, (tuple, *OK_ERRORS)), r


# A valid chain graph 0 -> 1 -> ... -> n; one of its lists gets an Evil item whose callback
# mutates a list the binding is reading (clear it, shrink it, grow it, replace items).
MUTATE = ["clear", "pop", "append", "replace", "del_outer"]


@PROP
@given(n=st.integers(2, 6), target=st.sampled_from(["ins", "outs", "ops", "fusible", "order", "groups", "gi",
                                                      "after"]),
       how=st.sampled_from(MUTATE), pos=st.integers(0, 5), call_sim=st.booleans())
def prop_mutation(n, target, how, pos, call_sim):
    ops = [[[k], [k + 1]] for k in range(n)]
    vb = [8] * (n + 1)
    fusible = [True] * n
    order = list(range(n))
    groups = [[k] for k in range(n)]
    gi, after = [0], [[0, n - 1]]
    lists = {"ins": ops[pos % n][0], "outs": ops[pos % n][1], "ops": ops, "fusible": fusible, "order": order,
             "groups": groups, "gi": gi, "after": after[0]}
    victim = lists[target]

    def action():
        if how == "clear":
            victim.clear()
        elif how == "pop" and victim:
            victim.pop()
        elif how == "append":
            victim.extend([object()] * 3)
        elif how == "replace" and victim:
            victim[0] = "x"
        elif how == "del_outer":
            ops.clear()
            groups.clear()

    i = pos % max(len(victim), 1)
    if target in ("ops", "groups"):  # an Evil id inside the item at i
        victim[i] = [[Evil(action, i)], [i + 1]] if target == "ops" else [Evil(action, i)]
    else:
        victim.insert(i, Evil(action, victim[i] if i < len(victim) else 0))
    if call_sim or target in ("order", "groups"):
        r = call(tm.simulate, ops, vb, order, groups, graph_inputs=gi)
    else:
        r = call(tm.plan, ops, vb, graph_inputs=gi, graph_outputs=[n], fusible=fusible, after=after)
    assert isinstance(r, (tm.Plan, tuple, *OK_ERRORS)), r


def main(names):
    checks = {f.__name__: f for f in VARIANTS + [prop_malformed, prop_mutation]}
    for name in names or list(checks):
        print("start", name, flush=True)
        checks[name]()
        print("ok", name, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
