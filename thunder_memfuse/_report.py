"""What memfuse did to a jitted function: report() and plot_timeline().

Both read the `_memfuse_info` memfuse leaves on each trace it returns (the
plan and the graph it planned), and score schedules with the C core's
simulator (thunder_memfuse.simulate), so the figures are the planner's own.
"""
from __future__ import annotations

from . import _plan


def _memfuse_traces(jfn):
    import thunder

    out = {}
    for kind, getter in (("forward", thunder.last_traces), ("backward", thunder.last_backward_traces)):
        try:
            traces = getter(jfn) or []
        except Exception:
            traces = []
        for t in reversed(traces):
            info = getattr(t, "_memfuse_info", None)
            if info is not None:
                out[kind] = info
                break
    return out


def _schedules(info):
    g = info["graph"]
    plan = info["plan"]
    n = len(g["ops"])
    kw = dict(graph_inputs=g["graph_inputs"], graph_outputs=g["graph_outputs"], aliases=g["aliases"])
    before = _plan.simulate(g["ops"], g["value_bytes"], list(range(n)), **kw)
    after = _plan.simulate(g["ops"], g["value_bytes"], plan["order"], plan["groups"], **kw)
    return before, after


def _largest_live_at_peak(info, step_bytes, top=5):
    """The largest storages live while the peak step runs (name, bytes)."""
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


def report(jfn) -> dict:
    """Per trace ("forward", "backward"): peak before/after, regions before/after,
    proven optimal or not, and the largest tensors live at the peak.  Peaks are
    above the trace's inputs; start_bytes is what is live when the trace starts
    (a backward: the distinct storages the forward saved and the incoming
    gradients, each freed after its last use), so the step sees
    peak_after_bytes - start_bytes on top of what the forward left."""
    out = {}
    for kind, info in _memfuse_traces(jfn).items():
        plan = info["plan"]
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
            "ops": info["ops"],
            "optimal": plan["optimal"],
            "method": plan["method"],
            "states": plan["states"],
            "fusion_moves": plan.get("fusion_moves", 0),
            "plan_ms": info["time_ms"],
            "replaced_executors": info.get("replaced_executors", []),
            "largest_live_at_peak": _largest_live_at_peak(info, steps_after),
        }
    if not out:
        raise ValueError("report: this function has no trace transformed by memfuse (was it called once?)")
    return out


def format_report(rep: dict) -> str:
    lines = []
    for kind, r in rep.items():
        lines.append(
            f"{kind}: peak {r['peak_before_bytes'] / 2**20:.2f} -> {r['peak_after_bytes'] / 2**20:.2f} MiB"
            + (f" (from a start of {r['start_bytes'] / 2**20:.2f} MiB: the storages the forward saved and the "
               f"incoming gradients)"
               if r.get("start_bytes") else "") + ", "
            f"regions {r['regions_before']} -> {r['regions_after']}, "
            f"{'proven optimal' if r['optimal'] else 'not proven optimal'} ({r['method']}, {r['states']} states)"
            + (f", {r['fusion_moves']} fusion-aware moves" if r.get("fusion_moves") else "")
        )
        if r.get("replaced_executors"):
            lines.append(f"    replaced fusion executors: {', '.join(r['replaced_executors'])}")
        for name, b in r["largest_live_at_peak"]:
            lines.append(f"    live at peak: {name} {b / 2**20:.2f} MiB")
    return "\n".join(lines)


def plot_timeline(jfn, path: str) -> str:
    """Draw live bytes over the schedule, input order against memfuse's, to a PNG."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    traces = _memfuse_traces(jfn)
    if not traces:
        raise ValueError("plot_timeline: this function has no trace transformed by memfuse")
    fig, axes = plt.subplots(len(traces), 1, figsize=(9, 3.2 * len(traces)), squeeze=False)
    for ax, (kind, info) in zip(axes[:, 0], traces.items()):
        (pb, sb, _), (pa, sa, _) = _schedules(info)
        mib = float(1 << 20)
        ax.step(range(len(sb)), [b / mib for b in sb], where="post", label=f"input order (peak {pb / mib:.2f} MiB)")
        # x for groups: the op index where each group starts, so both curves share an axis
        xs, k = [], 0
        for grp in info["plan"]["groups"]:
            xs.append(k)
            k += len(grp)
        ax.step(xs, [b / mib for b in sa], where="post", label=f"memfuse (peak {pa / mib:.2f} MiB)")
        ax.set_title(f"{kind}: memory while each op runs")
        ax.set_xlabel("op in schedule")
        ax.set_ylabel("MiB above inputs")
        ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
