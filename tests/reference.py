"""An independent Python reference of the cost model and of the optimum.

Written from the cost model in docs/ARCHITECTURE.md, separately from the C core, so the
tests compare two implementations.  Small graphs only.
"""
from __future__ import annotations

import itertools
import random


class Graph:
    def __init__(self, ops, value_bytes, graph_inputs=(), graph_outputs=(), aliases=(), fusible=None, after=()):
        self.ops = [(list(i), list(o)) for i, o in ops]
        self.value_bytes = list(value_bytes)
        self.inputs = set(graph_inputs)
        self.outputs = set(graph_outputs)
        self.alias = dict(aliases)
        self.fusible = list(fusible) if fusible is not None else [False] * len(ops)
        self.after = list(after)
        n = len(self.ops)
        self.producer = {}
        for k, (_, outs) in enumerate(self.ops):
            for v in outs:
                self.producer[v] = k
        self.preds = [set() for _ in range(n)]
        for k, (ins, _) in enumerate(self.ops):
            for v in ins:
                if v in self.producer and self.producer[v] != k:
                    self.preds[k].add(self.producer[v])
        for a, b in self.after:
            self.preds[b].add(a)

    def root(self, v):
        while v in self.alias:
            v = self.alias[v]
        return v

    def storages(self):
        """root -> (bytes or 0 for inputs, producer op, set of reader ops, is_output)"""
        st = {}
        for v in range(len(self.value_bytes)):
            r = self.root(v)
            st.setdefault(r, {"readers": set(), "output": False})
        for k, (ins, _) in enumerate(self.ops):
            for v in ins:
                st[self.root(v)]["readers"].add(k)
        for v in self.outputs:
            st[self.root(v)]["output"] = True
        for r, s in st.items():
            s["counted"] = r not in self.inputs
            s["bytes"] = self.value_bytes[r] if s["counted"] else 0
            s["producer"] = self.producer.get(r)
        return st

    def simulate(self, order, groups=None):
        """Peak of `order` where groups (list of lists, concatenating to order) fuse."""
        if groups is None:
            groups = [[k] for k in order]
        st = self.storages()
        pos = {}
        for gi, g in enumerate(groups):
            for k in g:
                pos[k] = gi
        live = 0
        peak = 0
        for gi, g in enumerate(groups):
            gset = set(g)
            freed = 0
            for s in st.values():
                if not s["counted"] or s["producer"] not in gset:
                    continue
                if len(g) == 1 or s["output"] or any(rd not in gset for rd in s["readers"]):
                    live += s["bytes"]  # materialized: allocated while the step runs
            peak = max(peak, live)
            for s in st.values():
                if not s["counted"] or s["producer"] is None or s["output"] or pos[s["producer"]] > gi:
                    continue
                materialized = (s["producer"] not in gset or len(g) == 1
                                or any(rd not in gset for rd in s["readers"]))
                last = max((pos[rd] for rd in s["readers"]), default=pos[s["producer"]])
                if materialized and last == gi:
                    freed += s["bytes"]
            live -= freed
        return peak

    def valid(self, order):
        seen = set()
        for k in order:
            if not self.preds[k] <= seen:
                return False
            seen.add(k)
        return len(seen) == len(self.ops) == len(order)

    def min_peak(self):
        """Exact optimum by exhaustive search over downward-closed sets."""
        n = len(self.ops)
        best = {0: 0}
        pred_mask = [sum(1 << p for p in self.preds[k]) for k in range(n)]
        st = self.storages()
        # live bytes after a set S ran
        def live(mask):
            tot = 0
            for r, s in st.items():
                if not s["counted"] or s["producer"] is None or not (mask >> s["producer"]) & 1:
                    continue
                if s["output"] or any(not (mask >> rd) & 1 for rd in s["readers"]):
                    tot += s["bytes"]
            return tot
        def alloc(k):
            return sum(s["bytes"] for s in st.values() if s["counted"] and s["producer"] == k)
        frontier = {0}
        for _ in range(n):
            nxt = set()
            for mask in frontier:
                lv = live(mask)
                for k in range(n):
                    if (mask >> k) & 1 or (pred_mask[k] & mask) != pred_mask[k]:
                        continue
                    m2 = mask | (1 << k)
                    val = max(best[mask], lv + alloc(k))
                    if val < best.get(m2, float("inf")):
                        best[m2] = val
                    nxt.add(m2)
            frontier = nxt
        return best.get((1 << n) - 1)

    def all_orders(self):
        for perm in itertools.permutations(range(len(self.ops))):
            if self.valid(perm):
                yield list(perm)


def random_graph(rng: random.Random, max_ops=12, allow_after=True):
    n_ops = rng.randint(1, max_ops)
    n_inputs = rng.randint(0, 3)
    value_bytes = []
    graph_inputs = list(range(n_inputs))
    for _ in range(n_inputs):
        value_bytes.append(rng.choice([0, 4, 8, 16, 64, 100]))
    ops = []
    aliases = []
    for k in range(n_ops):
        avail = list(range(len(value_bytes)))
        ins = rng.sample(avail, k=min(len(avail), rng.choice([0, 1, 1, 2, 2, 3])))
        outs = []
        for _ in range(rng.choice([1, 1, 1, 2]) if rng.random() > 0.05 else 0):
            v = len(value_bytes)
            value_bytes.append(rng.choice([0, 1, 8, 16, 32, 48, 64, 128, 256]))
            outs.append(v)
            if ins and rng.random() < 0.15:
                aliases.append((v, rng.choice(ins)))
        ops.append((ins, outs))
    produced = [v for _, outs in ops for v in outs]
    graph_outputs = [v for v in produced if rng.random() < 0.15]
    fusible = [rng.random() < 0.6 for _ in range(n_ops)]
    after = []
    if allow_after:
        for _ in range(rng.choice([0, 0, 1, 2])):
            a, b = sorted(rng.sample(range(n_ops), 2)) if n_ops >= 2 else (0, 0)
            if a != b:
                after.append((a, b))
    return dict(ops=ops, value_bytes=value_bytes, graph_inputs=graph_inputs, graph_outputs=graph_outputs,
                aliases=aliases, fusible=fusible, after=after)


def random_chains_graph(rng: random.Random, n_chains=(2, 4), max_len=3, fork=None, join=None, sinks=None,
                        recompute=None, horizontal=None):
    """Parallel chains (the shape of NOTE [liu merge] in csrc/core/mf_liu.c):
    an optional fork op whose output every chain head reads, chains of
    1..max_len ops with random sizes (0 included, sometimes a second output
    nobody reads), optionally a floating recompute op per chain and a
    weight-gradient side sink per chain (a graph output), joined by nothing
    (chain ends are outputs), one op, or a chain of adds.  Listed chain by
    chain, or step by step across chains ("horizontal"); valid either way.
    None picks at random."""
    pick = lambda x: rng.random() < 0.5 if x is None else x  # noqa: E731
    fork, sinks, recompute, horizontal = pick(fork), pick(sinks), pick(recompute), pick(horizontal)
    join = rng.choice(["none", "one", "adds"]) if join is None else join
    value_bytes, graph_inputs, graph_outputs, keyed = [], [], [], []

    def val(nbytes, is_input=False):
        value_bytes.append(nbytes)
        if is_input:
            graph_inputs.append(len(value_bytes) - 1)
        return len(value_bytes) - 1

    def op(key, ins, outs):
        keyed.append((key, len(keyed), (list(ins), list(outs))))

    src = val(rng.choice([8, 16, 64]), True)
    if fork:
        g = val(rng.choice([8, 16, 32]))
        op(-1, [src], [g])
        src = g
    ends = []
    for _ in range(rng.randint(*n_chains)):
        length, h, prev = rng.randint(1, max_len), src, None
        for step in range(length):
            ins = [h]
            if step == 0 and recompute:
                r = val(rng.choice([8, 16, 32]))
                op(0, [val(16, True)], [r])
                ins.append(r)
            outs = [val(rng.choice([0, 8, 16, 32, 48, 64, 128]))]
            if rng.random() < 0.2:
                outs.append(val(rng.choice([8, 16])))  # never read: freed right after the op
            op(2 * step + 1, ins, outs)
            prev, h = h, outs[0]
        if sinks and prev is not None and prev != src:
            gw = val(rng.choice([8, 16]))
            graph_outputs.append(gw)
            op(2 * length, [prev], [gw])
        ends.append(h)
    if join == "one":
        o = val(rng.choice([8, 16]))
        op(1000, ends, [o])
        graph_outputs.append(o)
    elif join == "adds":
        acc = ends[0]
        for i, e in enumerate(ends[1:]):
            o = val(rng.choice([8, 16, 32]))
            op(1000 + i, [acc, e], [o])
            acc = o
        graph_outputs.append(acc)
    else:
        graph_outputs.extend(ends)
    if horizontal:
        keyed.sort(key=lambda t: (t[0], t[1]))
    ops = [o for _, _, o in keyed]
    return dict(ops=ops, value_bytes=value_bytes, graph_inputs=graph_inputs, graph_outputs=graph_outputs,
                aliases=[], fusible=[rng.random() < 0.6 for _ in ops], after=[])


MIB = 1 << 20
SEED_BYTES = 256 * 256 * 4


def random_backward_graph(rng: random.Random, max_ops=12):
    """A backward pass as csrc/python/trace.c builds it (NOTE [freeable saved
    tensors]): op 0 produces the saved tensors and runs before every other op
    (after edges), so no cut point splits the graph; the other ops read saved
    tensors, the cotangent (a graph input) and earlier results."""
    n_ops = rng.randint(2, max_ops)
    value_bytes = [rng.choice([8, 16, 64])]  # the cotangent
    saved = []
    for _ in range(rng.randint(1, 4)):
        saved.append(len(value_bytes))
        value_bytes.append(rng.choice([8, 16, 32, 64, 128]))
    ops = [([], list(saved))]
    made = [0]
    for k in range(1, n_ops):
        ins = rng.sample(saved, k=min(len(saved), rng.choice([0, 1, 1, 2])))
        if rng.random() < 0.6:
            ins.append(rng.choice(made))
        outs = [len(value_bytes)]
        value_bytes.append(rng.choice([0, 8, 16, 32, 64, 128]))
        made.append(outs[0])
        ops.append((sorted(set(ins)), outs))
    produced = [v for _, outs in ops[1:] for v in outs]
    graph_outputs = [v for v in produced if rng.random() < 0.25]
    return dict(ops=ops, value_bytes=value_bytes, graph_inputs=[0], graph_outputs=graph_outputs, aliases=[],
                fusible=[rng.random() < 0.6 for _ in ops], after=[(0, k) for k in range(1, n_ops)])
