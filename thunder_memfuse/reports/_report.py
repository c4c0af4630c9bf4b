"""What memfuse did to a jitted function: report() and format_report().

Both (and thunder_memfuse.plot.plot_timeline) read the `_memfuse_info` memfuse
leaves on each trace it returns (the plan and the graph it planned), and score
schedules with the C core's simulator (thunder_memfuse.simulate), so the
figures are the planner's own.
"""
from __future__ import annotations

from ._traces import _memfuse_traces, _schedules


def _origins(trace):
    """{proxy name: "op at file:line"} for what the trace's symbols produce, from
    the source position Thunder records on each bound symbol (the user's line in a
    forward; backward symbols carry none, so they get the op's name only)."""
    import os

    out = {}

    def visit(b, outer=None):
        line = None
        if b.source_filename and b.source_positions is not None:
            line = f"{os.path.basename(b.source_filename)}:{b.source_positions.lineno}"
        subs = getattr(b, "subsymbols", ()) or ()
        if getattr(b.sym, "is_fusion", False) and subs:
            for sb in subs:  # a region: name each value by the op inside that made it
                visit(sb, b.sym.name)
            return
        where = ", ".join(x for x in (b.sym.name, line, f"in {outer}" if outer else None) if x)
        for o in b.flat_proxy_outs:
            name = getattr(o, "name", None)
            if name is not None:
                out.setdefault(name, where)

    for b in trace.bound_symbols:
        visit(b)
    return out


def _largest_live_at_peak(info, step_bytes, top=5):
    """The largest storages live while the peak step runs [(proxy name, bytes)]."""
    g, plan, names = info["graph"], info["plan"], info["names"]
    if not step_bytes:
        return []
    peak_step = max(range(len(step_bytes)), key=step_bytes.__getitem__)
    alias = dict(g["aliases"])

    def root(v):
        while v in alias:
            v = alias[v]
        return v

    pos = {}
    for gi, grp in enumerate(plan["groups"]):
        for k in grp:
            pos[k] = gi
    first, last, readers_out = {}, {}, {}
    for k, (ins, outs) in enumerate(g["ops"]):
        for v in outs:
            first.setdefault(root(v), pos[k])
    for k, (ins, outs) in enumerate(g["ops"]):
        for v in ins:
            r = root(v)
            last[r] = max(last.get(r, -1), pos[k])
            if r in first and pos[k] != first[r]:
                readers_out[r] = True
    inputs, outputs = set(g["graph_inputs"]), {root(v) for v in g["graph_outputs"]}
    sizes = [len(grp) for grp in plan["groups"]]
    live = []
    for r, start in first.items():
        if r in inputs or g["value_bytes"][r] == 0:
            continue
        # a value made and used only inside one fused group is never materialized
        if sizes[start] > 1 and r not in outputs and not readers_out.get(r):
            continue
        end = len(step_bytes) if r in outputs else last.get(r, start)
        if start <= peak_step <= end:
            live.append((str(names[r]), g["value_bytes"][r]))
    live.sort(key=lambda t: -t[1])
    return live[:top]


def _collectives(info):
    """Per asynchronous collective, in issue order: its result's name, its
    position among the trace's ops in Thunder's order ("before") and in
    memfuse's ("after"), and the same for the wait on it (None when the trace
    has none).  Positions count ops (a region's ops one by one; the
    prologue, dels, comments and the return not at all), so the two orders
    compare directly (csrc/core/mf_comm.c NOTE [collective overlap])."""
    g, plan, names = info["graph"], info["plan"], info["names"]
    comm = dict(g.get("comm", ()))
    if not comm:
        return []
    virtual = len(g["ops"]) - info["ops"]  # trace.c NOTE [freeable saved tensors]: op 0, run first
    after = {op: i for i, op in enumerate(plan["order"])}
    wait_of = {}
    for k, kind in comm.items():
        if kind == 2:
            for v in g["ops"][k][0]:
                wait_of.setdefault(v, k)
    out = []
    for k in sorted(op for op, kind in comm.items() if kind == 1):
        outs = g["ops"][k][1]
        w = next((wait_of[v] for v in outs if v in wait_of), None)
        out.append({
            "name": str(names[outs[0]]) if outs else f"op{k}",
            "before": k - virtual,
            "after": after[k] - virtual,
            "wait_before": None if w is None else w - virtual,
            "wait_after": None if w is None else after[w] - virtual,
        })
    return out


def report(jfn) -> dict:
    """What memfuse did to each trace of a jitted function that has run once.

    Returns {"forward": {...}, "backward": {...}} (the backward only when one was
    traced).  Each holds peaks in bytes above the inputs (see format_report for
    what each term means): peak_before_bytes, peak_after_bytes,
    unfused_peak_bytes, lower_bound_bytes; regions_before / regions_after (fusion
    regions); ops; optimal, method, states, fusion_moves, hoists (how the order was
    found); pipeline (the planning pipeline's start that won, the recomputation passes it kept, its
    planner calls and work); memory_budget (with MemFuse(memory_budget=...): bytes, fits,
    planned_peak_bytes, held_bytes, copied_bytes; None otherwise); saved_set (a forward's saved tensors
    rebuilt in the backward within memory_budget: rebuilt, rebuilt_bytes, extra_work,
    first_peak_bytes, planned_step_peak_bytes, fits, candidates; None otherwise); comm_moves and collectives (per asynchronous collective, its op
    position before and after memfuse, and its wait's); plan_ms (the pass's own time); time_ms (that time by stage); replaced_executors;
    compiled_peak_bytes (the peak with each region Inductor compiled counted by the buffers its
    program allocates, _compare.py NOTE [regions in compare]; None before any was compiled);
    peak_allowance_bytes and regions_without_allowance (a training step's forward regrouped with fewer
    regions within its backward's planned peak, _step.py NOTE [the step's peak]; None otherwise); and
    largest_live_at_peak: [(proxy name, bytes, where)], where names the op that
    made the tensor and, when Thunder recorded it, the user's source line
    ("mul, model.py:42"; for a backward's saved tensor, the forward's line);
    start_bytes: what is live when the trace starts (a backward: the distinct
    storages the forward saved and the incoming gradients, each freed after
    its last use), so the step sees peak_after_bytes - start_bytes on top of
    what the forward left (peak_above_start_bytes).

    "before" is the trace as memfuse received it, not Thunder without memfuse:
    measure.savings() measures that.  A function not from thunder.jit is a
    TypeError; one that has not run, was jitted without memfuse, ran with
    THUNDER_MEMFUSE=0 or was left unchanged is a ValueError saying which.
    """
    out = {}
    traces = _memfuse_traces(jfn, "report")
    fwd_origins = _origins(traces["forward"][0]) if "forward" in traces else {}
    for kind, (trace, info) in traces.items():
        plan = info["plan"]
        origins = _origins(trace)
        if kind == "backward":  # saved tensors keep their forward names: the forward knows their line
            for k, v in fwd_origins.items():
                if "," not in origins.get(k, ""):
                    origins[k] = f"saved: {v}"
        (_, _, _), (peak_after, steps_after, live_after) = _schedules(info)
        # in measured terms: a backward starts with the storages the forward saved
        # (each counted once: trace.c NOTE [saved storages]), made by its op 0
        start = live_after[0] if info.get("saved_op") and live_after else 0
        out[kind] = {
            "start_bytes": start,
            "peak_above_start_bytes": plan["peak_bytes"] - start,
            "peak_before_bytes": plan["baseline_peak_bytes"],
            "peak_after_bytes": plan["peak_bytes"],
            "unfused_peak_bytes": plan["unfused_peak_bytes"],
            "lower_bound_bytes": plan["lower_bound_bytes"],
            "regions_before": info["regions_before"],
            "regions_after": info["regions_after"],
            # _step.py NOTE [the step's peak]: a forward regrouped within its backward's planned peak
            "peak_allowance_bytes": info.get("peak_allowance"),
            "regions_without_allowance": info.get("regions_without_allowance"),
            "ops": info["ops"],
            "optimal": plan["optimal"],
            "method": plan["method"],
            "states": plan["states"],
            "fusion_moves": plan.get("fusion_moves", 0),
            "hoists": plan.get("hoists", 0),
            "plan_ms": info["time_ms"],
            # memfuse's own time on this trace by stage: reading (the op records and the graph), planning
            # (the order, regions and recomputation's passes), regrouping (bound symbols into regions), and,
            # on a forward, the joint trace's fusion pass where memfuse ran it (fusion_pass.py) and, within a
            # memory_budget, its choice of the saved set (_saved_set.py)
            "time_ms": {k: round(v, 3) for k, v in info.get("stage_ms", {}).items()},
            "replaced_executors": info.get("replaced_executors", []),
            # regions.reorder_only: no regions by design is not a compiler that failed
            "kernels": "reorder-only" if info.get("reorder_only") else info.get("kernels"),
            # _compare.py NOTE [regions in compare]: the peak with each compiled Inductor region's own buffers
            "compiled_peak_bytes": _compiled_peak(trace, info),
            "largest_live_at_peak": [(name, b, origins.get(name, "input"))
                                     for name, b in _largest_live_at_peak(info, steps_after)],
            "comm_moves": plan.get("comm_moves", 0),
            "collectives": _collectives(info),
            # csrc/core/mf_remat.c NOTE [recomputation]: what runs twice, the bytes it writes again,
            # and the planned peak without the copies (None: nothing was recomputed)
            "recompute": _recompute_summary(info.get("recompute"), start),
            # csrc/core/mf_pipeline.c NOTE [planning pipeline]: the start that won, the recomputation
            # passes it kept (kind, splits, copied_bytes, peak_before, peak_after), planner calls, and
            # the work spent against the trace's budget (NOTE [work budget])
            "pipeline": plan.get("pipeline"),
            # MemFuse(memory_budget=...) (csrc/core/mf_pipeline.c NOTE [peak target]): the budget in bytes,
            # whether the plan fits it, the planned peak, the bytes of the forward's outputs the caller
            # holds beside a backward (integration/_planning.py NOTE [held outputs]) and the bytes
            # copies write again; None for "auto"
            "memory_budget": info.get("memory_budget"),
            # integration/_saved_set.py NOTE [the saved set]: on a forward with a memory_budget, the saved
            # tensors rebuilt in the backward, the bytes that frees, the work they cost, the planned step
            # peak before and after; None otherwise
            "saved_set": info.get("saved_set"),
        }
    return out


def _compiled_peak(trace, info):
    from ._compare import compiled_peak

    try:
        return compiled_peak(trace, info)
    except Exception:  # a report never fails on a figure it cannot give
        return None


def _recompute_summary(rc, start):
    if not rc:
        return None
    return {
        "copied_ops": rc["copied_ops"],
        "copies": list(rc["copies"]),
        "copied_bytes": rc["copied_bytes"],
        "peak_without_bytes": rc["peak_bytes_without"],
        "peak_bytes": rc["peak_bytes"],
        # what the backward starts with (the forward's saved storages): recomputation inside a trace
        # does not change it, so before and after are the same figure
        "saved_bytes_before": start,
        "saved_bytes_after": start,
    }


TERMS = {
    "peak": "the most bytes live at once above the trace's inputs, in the core's cost model (simulated)",
    "before -> after": "the trace as memfuse received it (Thunder's order, after the fusion executors memfuse "
                       "did not replace) -> memfuse's order and regions; Thunder without memfuse is measured by "
                       "thunder_memfuse.measure.savings()",
    "lower bound": "no valid order of the unfused ops can have a smaller peak (a bound on the unfused figures: "
                   "regions keep their inner values out of memory, so a fused peak can be below it)",
    "regions": "fusion regions: ops that run as one kernel (values made and used inside one never reach memory)",
    "proven optimal": "no valid order of the unfused ops has a smaller peak",
    "states": "states the exact dynamic program explored (0: no search was needed)",
    "reorder-only": "memfuse reorders the ops and forms no regions of its own, by design: plain thunder.jit on "
                    "a CPU (add executors=['torchcompile'] to have memfuse's regions compiled), fuse=False or "
                    "kernels='fallback' (\"fallback\" instead means a compiler was wanted and could not work; "
                    "a MemFuseWarning said why)",
}
METHODS = {  # csrc/core/mf_core.h, what mf_plan_result.method says
    "lower-bound": "a heuristic order reached the lower bound, so it is optimal without search",
    "dp": "the exact dynamic program over the graph's parallel paths found the order",
    "dp-partial": "the dynamic program improved the order but hit its state cap (not proven)",
    "input": "Thunder's own order was kept (no candidate beat it)",
    "greedy": "a greedy list scheduler (least net change of live bytes) gave the order",
    "greedy-peak": "a greedy list scheduler (least bytes allocated) gave the order",
    "dfs": "a depth-first 'finish what you started' order",
    "pieces": "per independent piece of the graph, the best of the heuristics",
    "liu": "Liu's hill/valley merging of parallel chains gave the order of at least one piece",
    "none": "nothing to plan (an empty graph)",
}
EXTRA_TERMS = {
    "fusion-aware moves": "single ops moved next to a region afterwards because that lowers the fused peak",
    "hoists": "a tensor's last reader moved, with what it waits for, before the peak step, so the tensor is "
              "freed sooner",
    "live at peak": "the largest tensors allocated while the peak step runs, with the op that made them "
                    "and, where Thunder recorded it, the user's source line",
}


def _peak_line(kind, r) -> str:
    """A trace's peaks, each figure beside the bound of its own model: the unfused figures (the order
    memfuse received, memfuse's order) with the lower bound of unfused orders, and, when memfuse
    formed regions, the fused peak on its own (a region's inner values never reach memory, so it
    can be below that bound)."""
    m = 2 ** 20
    before, unfused, fused, lb = (r["peak_before_bytes"], r.get("unfused_peak_bytes", r["peak_after_bytes"]),
                                  r["peak_after_bytes"], r["lower_bound_bytes"])
    if fused == unfused:
        line = f"{kind}: peak {before / m:.2f} -> {fused / m:.2f} MiB (lower bound {lb / m:.2f})"
    else:
        comp = f", {r['kernels']}" if r.get("kernels") else ""
        line = (f"{kind}: peak unfused {before / m:.2f} -> {unfused / m:.2f} MiB (lower bound {lb / m:.2f}), "
                f"fused {fused / m:.2f} MiB ({r['regions_after']} regions{comp})")
    if r.get("compiled_peak_bytes") is not None:
        line += f"; {r['compiled_peak_bytes'] / m:.2f} MiB with the buffers its compiled regions allocate"
    if r.get("start_bytes"):
        line += (f" (from a start of {r['start_bytes'] / m:.2f} MiB: the storages the forward saved and the "
                 f"incoming gradients)")
    return line


def format_report(rep, *, explain: bool = True, savings=None) -> str:
    """Readable text of report(jfn): one line per trace, the fusion executors
    memfuse replaced, and the largest tensors live at the peak, each named by its
    proxy, the op that made it and (where Thunder recorded it) the user's
    source line.  explain=True (default) adds a short legend of the terms used:
    peak, lower bound, regions, proven optimal, states, and the method that
    produced each order (lower-bound, dp, input, greedy, liu, ...).

    rep: report(jfn)'s dict, or the jitted function itself (report() is called), or a
    measure.savings() result (its one-line summary).  savings: a measure.savings() result whose
    one-line summary goes first.

    Example::

        print(thunder_memfuse.format_report(thunder_memfuse.report(jfn)))
        print(thunder_memfuse.format_report(jfn, savings=measure.savings(fn, *args)))
    """
    from .savings import Savings

    if isinstance(rep, Savings):
        return rep.summary()
    if not isinstance(rep, dict):
        if callable(rep):
            rep = report(rep)
        else:
            raise TypeError(f"format_report: expected report(jfn)'s dict, a jitted function or a "
                            f"measure.savings() result, got {type(rep).__name__}")
    if savings is not None and not isinstance(savings, Savings):
        raise TypeError(f"format_report: savings must be a measure.savings() result, got {type(savings).__name__}")
    lines = [savings.summary()] if savings is not None else []
    for kind, r in rep.items():
        if not isinstance(r, dict) or "peak_after_bytes" not in r:
            raise TypeError(f"format_report: {kind!r} is not a trace of report(jfn); pass report(jfn) itself")
        lines.append(
            _peak_line(kind, r) + ", "
            f"regions {r['regions_before']} -> {r['regions_after']}"
            + (f" ({r['kernels']})" if r.get("kernels") and (r["regions_after"] or r["kernels"] == "reorder-only")
               else "") + ", "
            f"{'proven optimal' if r['optimal'] else 'not proven optimal'} ({r['method']}, {r['states']} states)"
            + (f", {r['fusion_moves']} fusion-aware moves" if r.get("fusion_moves") else "")
            + (f", {r['hoists']} hoists" if r.get("hoists") else "")
        )
        if r.get("regions_without_allowance") is not None:
            lines.append(f"    regrouped within the backward's planned peak of {r['peak_allowance_bytes'] / 2**20:.2f} "
                         f"MiB: {r['regions_without_allowance']} -> {r['regions_after']} regions")
        if r.get("replaced_executors"):
            lines.append(f"    replaced fusion executors: {', '.join(r['replaced_executors'])}")
        if r.get("time_ms"):
            lines.append("    memfuse's time: " + ", ".join(f"{k} {v:.0f} ms" for k, v in r["time_ms"].items()))
        rc = r.get("recompute")
        if rc:
            n = rc["copied_ops"]
            names = sorted(set(rc["copies"]))
            lines.append(f"    recomputed {n} {'op' if n == 1 else 'ops'} ({', '.join(names[:6])}"
                         f"{', ...' if len(names) > 6 else ''}), {rc['copied_bytes'] / 2**20:.2f} MiB written "
                         f"again: planned peak {rc['peak_without_bytes'] / 2**20:.2f} -> "
                         f"{rc['peak_bytes'] / 2**20:.2f} MiB")
        mb = r.get("memory_budget")
        if mb:
            held = mb["held_bytes"]
            over = mb["planned_peak_bytes"] + held - mb["bytes"]
            lines.append(f"    memory budget {mb['bytes'] / 2**20:.2f} MiB: "
                         + ("fits" if mb["fits"] else f"no plan fits, {over / 2**20:.2f} MiB above")
                         + f" (planned peak {mb['planned_peak_bytes'] / 2**20:.2f} MiB, "
                         + (f"{held / 2**20:.2f} MiB of outputs held beside it, " if held else "")
                         + f"{mb['copied_bytes'] / 2**20:.2f} MiB written again by recomputation)")
        ss = r.get("saved_set")
        if ss and ss["rebuilt"]:
            names = ss["rebuilt"]
            lines.append(f"    saved set: {len(names)} saved {'tensor' if len(names) == 1 else 'tensors'} "
                         f"({', '.join(names[:6])}{', ...' if len(names) > 6 else ''}) rebuilt in the backward, "
                         f"{ss['rebuilt_bytes'] / 2**20:.2f} MiB saved less for {ss['extra_work']:.3g} more "
                         f"element operations: planned step peak {ss['first_peak_bytes'] / 2**20:.2f} -> "
                         f"{ss['planned_step_peak_bytes'] / 2**20:.2f} MiB")
        pl = r.get("pipeline")
        if pl and (pl["steps"] or pl["start"] != "plan" or pl["budget_hit"]):
            kept = "; ".join(f"{st['kind']}: {st['splits']} {'copy' if st['splits'] == 1 else 'copies'}, "
                             f"{st['peak_before'] / 2**20:.2f} -> {st['peak_after'] / 2**20:.2f} MiB"
                             for st in pl["steps"])
            lines.append(f"    planned from start {pl['start']!r} ({pl['plans']} planner calls)"
                         + (f", passes kept: {kept}" if kept else "")
                         + (", work budget reached: later starts and passes skipped" if pl["budget_hit"] else ""))
        for item in r["largest_live_at_peak"]:
            name, b = item[0], item[1]
            where = f" ({item[2]})" if len(item) > 2 and item[2] else ""
            lines.append(f"    live at peak: {name} {b / 2**20:.2f} MiB{where}")
        for c in r.get("collectives", ()):
            wait = "" if c["wait_before"] is None else f", its wait {c['wait_before']} -> {c['wait_after']}"
            lines.append(f"    collective {c['name']}: op {c['before']} -> {c['after']}{wait}")
    if explain and rep:
        lines.append("terms:")
        rs = list(rep.values())
        used = {"peak", "before -> after", "lower bound",  # the legend names only the terms the lines use
                *(("regions",) if any(r["regions_after"] or r["regions_before"] for r in rs) else ()),
                *(("proven optimal",) if any(r["optimal"] for r in rs) else ()),
                *(("states",) if any(r["states"] for r in rs) else ()),
                *(("reorder-only",) if any(r.get("kernels") == "reorder-only" for r in rs) else ())}
        lines += [f"    {t}: {text}" for t, text in TERMS.items() if t in used]
        for m in sorted({r["method"] for r in rep.values()}):
            lines.append(f"    {m}: {METHODS.get(m, 'the planner rung that produced the order')}")
        if any(r.get("fusion_moves") for r in rep.values()):
            lines.append(f"    fusion-aware moves: {EXTRA_TERMS['fusion-aware moves']}")
        if any(r.get("hoists") for r in rep.values()):
            lines.append(f"    hoists: {EXTRA_TERMS['hoists']}")
        if any(r["largest_live_at_peak"] for r in rep.values()):
            lines.append(f"    live at peak: {EXTRA_TERMS['live at peak']}")
    return "\n".join(lines)
