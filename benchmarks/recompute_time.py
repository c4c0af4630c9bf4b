"""Plan time with recomputation (issue 18's target: a backward of about 1,600 ops with its recompute
candidates planned in under 200 ms).

    python benchmarks/recompute_time.py [--layers 16] [--repeat 5]
    python benchmarks/recompute_time.py --trace [--trace-layers 7] [--dim 256]

Synthetic: checkpointed_backward_graph() builds the backward of a GPT-style decoder with per-block
activation checkpointing as Thunder writes it in primitive ops: each block's forward is computed again
from its saved input (LayerNorm as var_mean and elementwise ops, attention as matmul / scale / where /
softmax / matmul, the tanh GELU as its elementwise chain), then its backward (two matmuls per linear
layer, the elementwise backward of GELU, softmax and LayerNorm reading the recomputed values).  The
elementwise ops and views are `cheap` (what thunder_memfuse/integration/_recompute.py NOTE [cheap ops] lets copy),
matmuls and reductions are not.  _C.plan is timed with recompute=0 and with the default budget (a
quarter of the bytes the ops write, _recompute.DEFAULT_SHARE).

--trace: the real thing.  One step of benchmarks/workloads.py's nanoGPT with checkpoint=True under
MemFuse() (plain thunder.jit, CPU); the backward's bound symbols are caught on their way into
integration._planning.plan_trace and planned again here, with recompute=0 and with the budget MemFuse gave them.
That time includes reading the trace (csrc/python/trace.c), not only the core.

Prints a markdown table; asserts nothing about time.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

MIB = float(1 << 20)


class _Builder:
    def __init__(self):
        self.vb, self.ops, self.cheap, self.fusible = [], [], [], []
        self.inputs, self.outputs, self.aliases = [], [], []

    def _val(self, nbytes):
        self.vb.append(int(nbytes))
        return len(self.vb) - 1

    def input(self, nbytes):
        v = self._val(nbytes)
        self.inputs.append(v)
        return v

    def op(self, ins, out_bytes, cheap=True):
        """An op reading ins and writing one value per entry of out_bytes (an int: one value)."""
        sizes = [out_bytes] if isinstance(out_bytes, int) else list(out_bytes)
        outs = [self._val(b) for b in sizes]
        self.ops.append((list(ins), outs))
        self.cheap.append(bool(cheap))
        self.fusible.append(bool(cheap))
        return outs[0] if len(outs) == 1 else outs

    def view(self, base):
        """A cheap op making a view of base (a transpose, a reshape, a split)."""
        v = self.op([base], self.vb[base])
        self.aliases.append((v, base))
        return v

    def spec(self):
        return dict(ops=self.ops, value_bytes=self.vb, graph_inputs=self.inputs, graph_outputs=self.outputs,
                    aliases=self.aliases, fusible=self.fusible)


def checkpointed_backward_graph(layers=16, batch=4, seq=128, dim=256, heads=4):
    """(plan() keyword arguments, cheap flags): the backward of a checkpointed GPT-style decoder."""
    b = _Builder()
    f = 4  # fp32
    act, hid, att, row = batch * seq * dim * f, 4 * batch * seq * dim * f, batch * heads * seq * seq * f, batch * seq * f
    mask = b.input(seq * seq)

    def layernorm(x):
        w, bias = b.input(dim * f), b.input(dim * f)
        var, mean = b.op([x], [row, row], cheap=False)  # var_mean
        rs = b.op([b.op([var], row)], row)  # rsqrt(var + eps)
        xh = b.op([b.op([x, mean], act), rs], act)  # (x - mean) * rs
        return b.op([b.op([xh, w], act), bias], act), (xh, rs, w)

    def layernorm_backward(dy, saved):
        xh, rs, w = saved
        b.outputs.append(b.op([dy], dim * f, cheap=False))  # bias gradient
        b.outputs.append(b.op([b.op([dy, xh], act)], dim * f, cheap=False))  # weight gradient
        dxh = b.op([dy, w], act)
        s1 = b.op([dxh], row, cheap=False)
        s2 = b.op([b.op([dxh, xh], act)], row, cheap=False)
        a1 = b.op([dxh, rs], act)
        u2 = b.op([b.op([xh, s2], act), rs], act)
        return b.op([b.op([a1, b.op([s1, rs], row)], act), u2], act)

    def linear_backward(x, dy, w, out_bytes, wbytes):
        b.outputs.append(b.op([x, dy], wbytes, cheap=False))  # weight gradient
        return b.op([dy, w], out_bytes, cheap=False)  # input gradient

    g = b.input(act)  # the loss gradient reaching the last block
    for _ in range(layers):
        # the block's forward, computed again from its saved input
        x = b.input(act)
        wqkv, wo, wfc, wproj = (b.input(dim * dim * f * k) for k in (3, 1, 4, 4))
        ln1, ln1_saved = layernorm(x)
        qkv = b.op([ln1, wqkv], 3 * act, cheap=False)
        q, k, v = (b.view(b.view(qkv)) for _ in range(3))  # split, then (b, h, t, d) transposes
        s = b.op([b.op([q, k], att, cheap=False)], att)  # q @ k^T, scaled
        msk = b.op([mask, s], att)  # where(causal, s, -inf)
        mx = b.op([msk], row * heads, cheap=False)  # amax
        e = b.op([b.op([msk, mx], att)], att)  # exp(s - max)
        p = b.op([e, b.op([e], row * heads, cheap=False)], att)  # e / sum(e)
        y = b.op([p, v], act, cheap=False)  # p @ v
        yc = b.op([b.view(y)], act)  # transpose, then a contiguous reshape
        x2 = b.op([x, b.op([yc, wo], act, cheap=False)], act)  # x + y @ wo
        ln2, ln2_saved = layernorm(x2)
        fc = b.op([ln2, wfc], hid, cheap=False)
        t3 = b.op([fc, b.op([b.op([fc], hid)], hid)], hid)  # fc + 0.044715 * fc ** 3
        t5 = b.op([b.op([t3], hid)], hid)  # tanh(c * t3)
        t6, t7 = b.op([t5], hid), b.op([fc], hid)  # 1 + t5, 0.5 * fc
        gelu = b.op([t7, t6], hid)
        # the block's backward
        dgelu = linear_backward(gelu, g, wproj, hid, 4 * dim * dim * f)
        d_a = b.op([b.op([dgelu, t6], hid)], hid)  # 0.5 * dgelu * t6
        d6 = b.op([dgelu, t7], hid)
        dt3 = b.op([b.op([d6, b.op([b.op([t5], hid)], hid)], hid)], hid)  # c * d6 * (1 - t5 * t5)
        d_c = b.op([b.op([dt3], hid), b.op([b.op([fc], hid)], hid)], hid)  # 0.044715 * dt3 * 3 fc ** 2
        dfc = b.op([b.op([d_a, dt3], hid), d_c], hid)
        dln2 = linear_backward(ln2, dfc, wfc, act, 4 * dim * dim * f)
        dx2 = b.op([g, layernorm_backward(dln2, ln2_saved)], act)
        dy = b.view(linear_backward(yc, dx2, wo, act, dim * dim * f))
        dp = b.op([dy, v], att, cheap=False)
        dv = b.op([p, dy], act, cheap=False)
        pm = b.op([dp, p], att)
        dmsk = b.op([b.op([dp, b.op([pm], row * heads, cheap=False)], att), p], att)  # (dp - sum(dp p)) p
        datt = b.op([b.op([mask, dmsk], att)], att)  # where backward, then the scale
        dq = b.op([datt, k], act, cheap=False)
        dk = b.op([datt, q], act, cheap=False)
        dqkv = b.op([dq, dk, dv], 3 * act, cheap=False)  # cat
        dln1 = linear_backward(ln1, dqkv, wqkv, act, 3 * dim * dim * f)
        g = b.op([dx2, layernorm_backward(dln1, ln1_saved)], act)
    b.outputs.append(g)
    return b.spec(), b.cheap


def default_budget(spec, share=None):
    """_recompute.budget_bytes's rule on a plain graph: a share of the bytes the ops write."""
    from thunder_memfuse.integration import _recompute

    share = _recompute.DEFAULT_SHARE if share is None else share
    views = {v for v, _ in spec["aliases"]}
    return int(share * sum(spec["value_bytes"][o] for _, outs in spec["ops"] for o in outs if o not in views))


def _timed(fn, repeat):
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), out


def bench_synthetic(layers, repeat):
    from thunder_memfuse import _C

    spec, cheap = checkpointed_backward_graph(layers)
    budget = default_budget(spec)
    t0, p0 = _timed(lambda: _C.plan(**spec), repeat)
    t1, p1 = _timed(lambda: _C.plan(**spec, recompute=budget, cheap=cheap), repeat)
    rc = p1.get("recompute") or {}
    print(f"| synthetic, {layers} layers | {len(spec['ops'])} | {sum(cheap)} | {t0:.1f} | {t1:.1f} | "
          f"{p0['peak_bytes'] / MIB:.2f} | {p1['peak_bytes'] / MIB:.2f} | {rc.get('splits', 0)} |")
    return p0, p1


def bench_trace(layers, repeat, dim, batch, seq):
    import workloads

    w = workloads.nanogpt(batch=batch, seq=seq, dim=dim, layers=layers, heads=4, checkpoint=True)
    bsyms, kw, orig = workloads.backward_plan_call(w)
    kw0 = dict(kw, recompute=0)
    t0, r0 = _timed(lambda: orig(bsyms, **kw0), repeat)
    t1, r1 = _timed(lambda: orig(bsyms, **kw), repeat)
    rc = r1["plan"].get("recompute") or {}
    print(f"| nanoGPT {layers}x{dim} checkpointed backward, plan_trace | {len(r0['graph']['ops'])} | - | "
          f"{t0:.1f} | {t1:.1f} | {r0['plan']['peak_bytes'] / MIB:.2f} | {r1['plan']['peak_bytes'] / MIB:.2f} | "
          f"{rc.get('splits', 0)} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, nargs="*", default=[4, 16])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--trace", action="store_true", help="also time a real checkpointed nanoGPT backward")
    ap.add_argument("--trace-layers", type=int, nargs="*", default=[7])
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args(argv)
    print("| graph | ops | cheap ops | plan ms, no recompute | plan ms, recompute | peak MiB, no recompute | "
          "peak MiB, recompute | splits |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.layers:
        bench_synthetic(n, args.repeat)
    if args.trace:
        for n in args.trace_layers:
            bench_trace(n, args.repeat, args.dim, args.batch, args.seq)


if __name__ == "__main__":
    main()
