"""The per-step accounting check: thunder_memfuse.measure.compare().

compare(jfn, *args) runs a jitted function once under torch.profiler with a
marker before every step of its final traces (the forward, and the backward
when the call builds an autograd graph), and lines up, step by step, the
memory the cost model says is live (csrc/core NOTE [cost model], read from the
same trace by the C reader; for a trace memfuse made, its plan, with each
Inductor region's own buffers: NOTE [regions in compare]) against the
allocations the profiler saw between two markers.  Nothing about the jitted function is changed: the markers run in
marked copies of its final traces, swapped into Thunder's cache entry for this
one call and swapped back after it.

Both curves are above the trace's start: for the forward, above its inputs;
for the backward, above what is live when it starts (the storages the forward
saved, which the model counts once per storage: trace.c NOTE [saved storages]).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

MIB = float(1 << 20)

# Ops whose implementation allocates workspace the model does not see (the
# model counts only the op's inputs and outputs).  compare() names them in its
# rows; docs/ARCHITECTURE.md "Known gaps" gives their measured sizes.
KNOWN_TEMPORARIES = {
    "cross_entropy": "log-softmax of the logits",
    "cross_entropy_backward": "softmax of the logits",
    "log_softmax_backward": "exp of the input",
    "softmax_backward": "product of output and gradient",
    "scaled_dot_product_attention": "attention weights (batch x heads x seq x seq)",
    "sdpa": "attention weights (batch x heads x seq x seq)",
    "sdpa_backward": "attention weights and their gradient",
    "matmul": "a contiguous copy of a transposed operand",
    "linear": "a contiguous copy of a transposed operand",
}


@dataclass
class TraceComparison:
    kind: str                       # "forward" or "backward"
    steps: list                     # per step: dict(step, op, simulated, measured, diff, flagged, note)
    start_simulated: int            # modelled bytes live at the start (backward: saved storages, incoming grads)
    largest_tensor: int             # bytes of the trace's largest tensor: the tolerance
    saved_simulated: int | None = None  # backward: the modelled distinct storages the forward saved
    saved_storages_measured: int | None = None  # backward: distinct storages the forward saved (runtime)
    saved_tensors_measured: int | None = None
    plan_peak: int | None = None    # memfuse's plan of this trace (report()'s peak), above the same start
    plan_allowance: int | None = None  # the plan's peak allowance (_step.py NOTE [the step's peak]), if any
    model: str = "trace"            # "plan": memfuse's own plan of the trace (NOTE [regions in compare])
    buffer_plans: int = 0           # regions counted by their Inductor program's buffers

    @property
    def simulated_peak(self) -> int:
        return max((r["simulated"] for r in self.steps), default=0)

    @property
    def measured_peak(self) -> int:
        return max((r["measured"] for r in self.steps), default=0)

    @property
    def flagged(self) -> list:
        return [r for r in self.steps if r["flagged"]]

    @property
    def within_one_tensor(self) -> bool:
        return abs(self.simulated_peak - self.measured_peak) <= self.largest_tensor


@dataclass
class Comparison:
    traces: dict = field(default_factory=dict)   # kind -> TraceComparison

    def __getitem__(self, kind):
        return self.traces[kind]

    def rows(self):
        """Every step of every trace as a flat list of dicts (a table)."""
        return [dict(trace=k, **r) for k, t in self.traces.items() for r in t.steps]

    @property
    def flagged(self):
        return [dict(trace=k, **r) for k, t in self.traces.items() for r in t.flagged]

    def summary(self) -> str:
        lines = []
        for k, t in self.traces.items():
            # docs/API.md "A trace's peak": the start counts; a figure without it says "above the start"
            s0 = t.start_simulated
            line = (f"{k}: {len(t.steps)} steps, peak simulated {(s0 + t.simulated_peak) / MIB:.2f} MiB, "
                    f"measured {(s0 + t.measured_peak) / MIB:.2f} MiB"
                    + (f" ({t.simulated_peak / MIB:.2f} / {t.measured_peak / MIB:.2f} MiB above the start of "
                       f"{s0 / MIB:.2f} MiB)" if s0 else "")
                    + f" (largest tensor {t.largest_tensor / MIB:.2f} MiB: "
                    f"{'within' if t.within_one_tensor else 'NOT within'} one tensor); "
                    f"{len(t.flagged)} steps differ by more than one tensor")
            if t.model == "plan":
                line += (f"; memfuse's regions counted as planned, {t.buffer_plans} of them by the buffers "
                         "their Inductor program allocates")
            if t.plan_peak is not None:
                if t.plan_peak == t.simulated_peak:
                    line += f"; report() gives the same peak ({(s0 + t.plan_peak) / MIB:.2f} MiB)"
                elif t.plan_allowance:
                    line += (f"; report() gives {t.plan_peak / MIB:.2f} MiB above the start: this trace was grouped "
                             f"within its backward's planned peak ({t.plan_allowance / MIB:.2f} MiB), a bound that "
                             "counts every GEMM's operands in a region to the region's end")
                elif t.model == "plan":
                    line += (f"; report() gives {t.plan_peak / MIB:.2f} MiB above the start: the planner's "
                             "count of its regions (every GEMM operand stored to its region's end), where this "
                             "model reads what Inductor compiled")
                else:
                    line += (f"; report() gives {t.plan_peak / MIB:.2f} MiB above the start: its plan models a "
                             "region's ops one by one (views of the region's inputs allocate nothing), while "
                             "this model reads each region of the final trace as one op whose outputs are all "
                             "new tensors")
            if k == "backward":
                line += f"; modelled start {t.start_simulated / MIB:.2f} MiB"
                if t.saved_simulated is not None:
                    line += f" (saved storages {t.saved_simulated / MIB:.2f} MiB, the rest incoming gradients)"
                if t.saved_storages_measured is not None:
                    n = t.saved_tensors_measured
                    line += (f", the forward saved {n} {'tensor' if n == 1 else 'tensors'} in distinct "
                             f"{'storage' if n == 1 else 'storages'} of {t.saved_storages_measured / MIB:.2f} MiB")
            lines.append(line)
        return "\n".join(lines)

    def table(self, all_steps=False, limit=40) -> str:
        """A markdown table: the flagged steps (or every step), at most `limit` rows."""
        rows = self.rows() if all_steps else self.flagged
        if not rows:  # a header alone reads as a table that failed to fill
            return ("no step differs between the simulated and the measured bytes by more than the trace's "
                    "largest tensor; table(all_steps=True) lists every step")
        out = ["| trace | step | op | simulated MiB | measured MiB | measured - simulated | note |",
               "|---|---|---|---|---|---|---|"]
        for r in rows[:limit]:
            out.append(f"| {r['trace']} | {r['step']} | {r['op']} | {r['simulated'] / MIB:.2f} | "
                       f"{r['measured'] / MIB:.2f} | {r['diff'] / MIB:+.2f} | {r['note']} |")
        if len(rows) > limit:
            out.append(f"| ... | {len(rows) - limit} more | | | | | |")
        return "\n".join(out)

    def plot(self, title=None):
        """The two curves per trace as a matplotlib Figure (the pyplot backend is not touched)."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=(9, 3.2 * max(1, len(self.traces))))
        axes = fig.subplots(max(1, len(self.traces)), 1, squeeze=False)[:, 0]
        for ax, (k, t) in zip(axes, self.traces.items()):
            # Drawn above zero, not above the start: a backward frees what the forward saved, so its
            # curves above its start go below zero.  The start is marked and named instead.
            s0 = t.start_simulated
            xs = [r["step"] for r in t.steps]
            ax.step(xs, [(r["simulated"] + s0) / MIB for r in t.steps], where="post", linewidth=2.5, alpha=0.6,
                    label=f"simulated (peak {(s0 + t.simulated_peak) / MIB:.2f} MiB)")
            # dashed and on top, so that where the two agree both stay visible
            ax.step(xs, [(r["measured"] + s0) / MIB for r in t.steps], where="post", linestyle="--", linewidth=1.2,
                    label=f"measured (peak {(s0 + t.measured_peak) / MIB:.2f} MiB)")
            if s0:
                what = ("what the forward saved and the incoming gradients" if k == "backward"
                        else "live when the trace starts")
                ax.axhline(s0 / MIB, color="grey", linestyle=":", linewidth=1,
                           label=f"start: {s0 / MIB:.2f} MiB ({what})")
            for r in t.flagged:
                ax.axvline(r["step"], color="red", alpha=0.15, lw=1)
            ax.set_title(f"{title + ': ' if title else ''}{k}, memory while each step runs")
            ax.set_xlabel("step of the final trace (a fusion region is one step)")
            ax.set_ylabel("MiB live above the inputs")
            ax.legend(loc="best", fontsize="small")
        fig.tight_layout()
        return fig


def default_loss(out):
    """The sum of every differentiable tensor of `out`, its gradient made dense: a sum alone hands the
    backward an expanded scalar (no bytes), where a real loss's gradient (a cross-entropy's, say) is
    a tensor of the output's size, which the model of the backward counts and frees after its last
    use.  The value is the plain sum; nothing more is allocated before the backward."""
    dense = _dense_grad()
    return sum(dense.apply(t.float()).sum() for t in _tensors(out) if t.requires_grad)


@functools.lru_cache(maxsize=None)
def _dense_grad():
    import torch

    class DenseGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.view_as(t)

        @staticmethod
        def backward(ctx, g):
            return g.contiguous()  # the expanded scalar written out at the output's size

    return DenseGrad


def compare(jfn, *args, backward=None, loss_fn=None, **kwargs) -> Comparison:
    """Run jfn(*args, **kwargs) once (plus its backward) and line up, step by step
    of its final traces, the simulated live bytes against the measured ones.

    backward: run the backward (default: when the call returns a tensor that
    requires grad).  loss_fn(output) -> scalar to backpropagate (default:
    default_loss, the sum of every differentiable output tensor).  The function is compiled first
    if it has not run yet.  CPU only (allocations from torch.profiler)."""
    import thunder

    try:
        cs = thunder.compile_stats(jfn)
    except Exception:
        cs = None
    if cs is None:
        raise ValueError("compare: expected a function returned by thunder.jit")
    devices = {t.device.type for t in _tensors((args, kwargs))}
    if devices - {"cpu"}:
        raise NotImplementedError(f"compare: CPU tensors only (got {', '.join(sorted(devices))}); "
                                  "the allocations are read from torch.profiler's CPU events")
    if not cs.interpreter_cache:
        _drop(jfn(*args, **kwargs))  # compile
    entry_idx, entry = _entry(cs)
    ftrace = entry.computation_traces[-1]
    btrace = entry.backward_traces[-1] if entry.backward_fn is not None and entry.backward_traces else None

    from thunder.common import transform_to_torch_types

    runtime = {}
    fmarked, fops = _marked(ftrace, "forward")
    comp = transform_to_torch_types(fmarked).python_callable()
    bwd = None
    bops = None
    if btrace is not None:
        bmarked, bops = _marked(btrace, "backward")
        bwd = bmarked.python_callable()

    def comp_wrapped(*inps):
        runtime["inputs"] = {t.untyped_storage().data_ptr() for t in _tensors(inps)}
        return comp(*inps)

    def bwd_wrapped(saved_for_backward, cotangents):
        inputs = runtime.get("inputs", set())
        seen = {}
        n = 0
        for t in _tensors(saved_for_backward[0] if saved_for_backward else ()):
            st = t.untyped_storage()
            if st.data_ptr() in inputs:
                continue
            n += 1
            seen[st.data_ptr()] = st.nbytes()
        runtime["saved"] = (n, sum(seen.values()))
        del t, st, seen
        return bwd(saved_for_backward, cotangents)

    swapped = entry._replace(computation_fn=comp_wrapped, backward_fn=bwd_wrapped if bwd else entry.backward_fn)
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    from .measure import _quiet_native_stderr

    cs.interpreter_cache[entry_idx] = swapped
    try:
        with _quiet_native_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = jfn(*args, **kwargs)
            do_bwd = backward if backward is not None else any(t.requires_grad for t in _tensors(out))
            if do_bwd and bwd is not None:
                loss = loss_fn(out) if loss_fn else default_loss(out)
                loss.backward()
                del loss
            del out
    finally:
        cs.interpreter_cache[entry_idx] = entry

    events = []  # (time, kind, payload): ("mark", (trace, i)) or ("alloc", bytes)

    def walk(node):
        if node.tag == _EventType.Allocation:
            if node.extra_fields.device.type == "cpu":
                events.append((node.start_time_ns, 1, node.extra_fields.alloc_size))
        elif node.name.startswith("memfuse_mark:"):
            _, kind, i = node.name.split(":")
            events.append((node.start_time_ns, 0, (kind, int(i))))
        for c in node.children:
            walk(c)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    events.sort(key=lambda e: (e[0], e[1]))

    result = Comparison()
    from ..integration import _planning

    try:  # memfuse's own plan of these traces, when it made them
        from ._traces import _memfuse_traces

        infos = {k: info for k, (_, info) in _memfuse_traces(jfn).items()}
    except Exception:
        infos = {}

    try:
        freeable = _planning.saved_storages(ftrace)
    except Exception:  # then the backward's saved tensors count as inputs
        freeable = None
    for kind, trace, ops in (("forward", ftrace, fops), ("backward", btrace if bwd else None, bops)):
        if trace is None:
            continue
        measured = _measured(events, kind, len(ops))
        if measured is None:
            continue  # this trace did not run (no backward)
        fr = _planning.backward_freeable(freeable, trace) if kind == "backward" else None
        tc = _planned(ops, kind, infos.get(kind), measured) or _simulated(trace, ops, kind, fr, measured)
        if kind == "backward" and freeable is not None:
            tc.saved_simulated = sum(dict(freeable.values()).values())  # bytes per distinct storage key
        if kind == "backward" and "saved" in runtime:
            tc.saved_tensors_measured, tc.saved_storages_measured = runtime["saved"]
        result.traces[kind] = tc
    try:  # report()'s figures of the same traces
        from ._traces import _schedules

        for kind, info in infos.items():
            if kind in result.traces:
                _, (peak, _, live_after) = _schedules(info)
                start = live_after[0] if info.get("saved_op") and live_after else 0
                result.traces[kind].plan_peak = info["plan"]["peak_bytes"] - start
                result.traces[kind].plan_allowance = info.get("peak_allowance")
    except Exception:
        pass
    if not result.traces:
        raise RuntimeError("compare: the call did not run the compiled traces (a cache miss: were the "
                           "arguments of another shape or kind than in the first call?)")
    return result


def _entry(cs):
    traces = getattr(cs, "last_traces", None)
    for i in range(len(cs.interpreter_cache) - 1, -1, -1):
        if cs.interpreter_cache[i].computation_traces is traces:
            return i, cs.interpreter_cache[i]
    return len(cs.interpreter_cache) - 1, cs.interpreter_cache[-1]


def _tensors(x):
    import torch

    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)


def _drop(out):
    del out


def _op_bsyms(trace):
    """The bound symbols the C reader makes ops of, in order, and the return (or None)."""
    from .. import _symbols

    ops, ret, seen_op = [], None, False
    for b in trace.bound_symbols:
        sid = b.sym.id
        if sid in _symbols.DROP_IDS:
            continue
        if sid in _symbols.RETURN_IDS:
            ret = b
            continue
        if not seen_op and sid in _symbols.PROLOGUE_IDS:
            continue
        seen_op = True
        ops.append(b)
    return ops, ret


def _marked(trace, kind):
    """A copy of trace with a profiler marker before each op and before the return."""
    import torch
    from thunder.core.symbol import BoundSymbol, Symbol
    from thunder.core.trace import from_trace

    ops, ret = _op_bsyms(trace)
    before = {id(b): i for i, b in enumerate(ops)}
    if ret is not None:
        before[id(ret)] = len(ops)

    def mark(i):
        with torch.profiler.record_function(f"memfuse_mark:{kind}:{i}"):
            pass

    sym = Symbol("_memfuse_mark", meta=lambda i: None, _module=None)
    new = from_trace(trace)
    bsyms = []
    for b in trace.bound_symbols:
        if id(b) in before:
            bsyms.append(BoundSymbol(sym, (before[id(b)],), {}, None, [], _call_ctx={"_memfuse_mark": mark}))
        bsyms.append(b)
    new.bound_symbols = bsyms
    return new, ops


def _measured(events, kind, n):
    """Per step i < n: (peak while it runs, bytes after it), above the start, or None."""
    cur, step = 0, None
    peak = [0] * n
    after = [0] * n
    for _, tag, payload in events:
        if tag == 0:
            k, i = payload
            if k != kind:
                if step is not None and step < n:
                    step = n  # the other trace's markers end this one
                continue
            if step is not None and step < n:
                after[step] = cur
            step = i
            if i < n:
                peak[i] = cur
        elif step is not None and step < n:
            cur += payload
            peak[step] = max(peak[step], cur)
    if step is None:
        return None
    return peak, after


def _simulated(trace, ops, kind, freeable, measured) -> TraceComparison:
    from .. import _plan
    from ..integration import _planning

    res = _planning.plan_trace(list(trace.bound_symbols), fuse=False, max_states=1, freeable=freeable)
    g = res["graph"]
    off = len(g["ops"]) - len(ops)  # 1 with the backward's virtual saved-tensor op
    _, step_bytes, live_after = _plan.simulate(g["ops"], g["value_bytes"], list(range(len(g["ops"]))),
                                               graph_inputs=g["graph_inputs"], graph_outputs=g["graph_outputs"],
                                               aliases=g["aliases"])
    start = live_after[0] if off else 0
    largest = max((b for b in g["value_bytes"]), default=0)
    mpeak, _ = measured
    rows = []
    for i, b in enumerate(ops):
        sim = step_bytes[i + off] - start
        diff = mpeak[i] - sim
        name = str(b.sym.name)
        outs = ", ".join(p.name for p in b.flat_proxy_outs[:2])
        base = name.rsplit(".", 1)[-1]
        rows.append(dict(step=i, op=f"{name} -> {outs}" if outs else name, simulated=sim, measured=mpeak[i],
                         diff=diff, flagged=abs(diff) > largest,
                         note=KNOWN_TEMPORARIES.get(base, "") if diff > 0 else ""))
    return TraceComparison(kind, rows, start, largest)


def _row(i, b, sim, measured, largest, note_ok=True):
    diff = measured - sim
    name = str(b.sym.name)
    outs = ", ".join(p.name for p in b.flat_proxy_outs[:2])
    base = name.rsplit(".", 1)[-1]
    return dict(step=i, op=f"{name} -> {outs}" if outs else name, simulated=sim, measured=measured, diff=diff,
                flagged=abs(diff) > largest, note=KNOWN_TEMPORARIES.get(base, "") if diff > 0 and note_ok else "")


def _inductor_peak(b):
    """The bytes the buffers of the Inductor program behind memfuse region b hold at most, or None
    (regions/inductor_buffers.py NOTE [Inductor's buffer plan])."""
    fn = (getattr(b, "_call_ctx", None) or {}).get(b.sym.name)
    state = getattr(fn, "memfuse_state", None)
    if not state or state.get("failed"):
        return None
    kernel = state.get("kernel")
    peak = getattr(kernel, "buffer_peak", None)
    return peak() if callable(peak) else None


def _planned_steps(ops, info):
    """(start, [each step's modelled bytes], regions read by their Inductor program) of trace steps
    `ops` under memfuse's plan `info` (NOTE [regions in compare]), or None where the steps do not
    line up with the plan's groups."""
    from ._traces import _schedules

    g, plan, names = info["graph"], info["plan"], info["names"]
    _, (_, steps, live) = _schedules(info)
    pos = {k: gi for gi, grp in enumerate(plan["groups"]) for k in grp}
    group_of = {}
    for k, (_, outs) in enumerate(g["ops"]):
        for v in outs:
            group_of.setdefault(str(names[v]), pos[k])
    first = 1 if info.get("saved_op") else 0  # the backward's op 0 makes the saved tensors
    start = live[0] if first and live else 0
    at, prev = [], first
    for b in ops:
        found = [group_of[p.name] for p in b.flat_proxy_outs if p.name in group_of]
        gi = min(found) if found else prev
        if gi < prev:
            return None
        at.append(gi)
        prev = gi
    if len(ops) and (at[-1] >= len(steps) or len(set(at)) < len(plan["groups"]) - first):
        return None
    sims, n_read = [], 0
    for b, gi in zip(ops, at):
        bp = _inductor_peak(b) if getattr(b.sym, "is_fusion", False) else None
        if bp is not None:
            n_read += 1
        sims.append((steps[gi] if bp is None else (live[gi - 1] if gi > 0 else 0) + bp,
                     len(plan["groups"][gi]) == 1))
    return start, sims, n_read


def _planned(ops, kind, info, measured):
    """NOTE [regions in compare]: a trace memfuse made is modelled as its plan models it, each step
    the planned group it runs: the trace read again from outside would see a region as one op whose
    outputs are all new tensors (a view of an input is none) and nothing of what runs inside.  A
    region Inductor compiled counts, while it runs, the live bytes before it plus the most its
    program's buffers hold at once (regions/inductor_buffers.py NOTE [Inductor's buffer plan]): what
    Inductor really allocates, operand copies included, where the plan's bound counts every GEMM
    operand to the region's end.  None where the trace's steps do not line up with the plan's
    groups (then the trace is read from outside, as for any other trace)."""
    if info is None:
        return None
    got = _planned_steps(ops, info)
    if got is None:
        return None
    start, sims, n_read = got
    mpeak, _ = measured
    largest = max(info["graph"]["value_bytes"], default=0)
    rows = [_row(i, b, sim - start, mpeak[i], largest, note_ok=single)
            for i, (b, (sim, single)) in enumerate(zip(ops, sims))]
    tc = TraceComparison(kind, rows, start, largest)
    tc.model, tc.buffer_plans = "plan", n_read
    return tc


def compiled_peak(trace, info):
    """The peak of a trace memfuse made with its Inductor regions counted by their compiled
    programs' buffers (NOTE [regions in compare]), in report()'s terms; None before any region was
    compiled or where the trace does not line up with its plan."""
    ops, _ = _op_bsyms(trace)
    got = _planned_steps(ops, info)
    if got is None or not got[2]:
        return None
    return max((sim for sim, _ in got[1]), default=0)
