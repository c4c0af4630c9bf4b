"""Plots for notebooks and benchmarks (matplotlib: the `[plot]` extra).

- plot_timeline(jfn, measured=compare(jfn, *args)): live bytes while each op of
  memfuse's traces runs, the input order against memfuse's plan, simulated by the
  C core's cost model, and memfuse's measured by the profiler where given.
- plot_comparison(rows): bars of peak memory and time per variant (eager,
  torch.compile, Thunder, memfuse...), as measured by the caller.
- plot_memory_over_time(curves): measured live bytes over a call's wall time
  per variant (thunder_memfuse.measure.cpu_memory_timeline on CPU).

Every function returns a matplotlib Figure, writes a file only when given a
path, and never selects a backend.  The figure is built with pyplot and then
closed to pyplot, so a notebook shows it exactly once, as the cell's value
(or through display(fig)); a script saves it (path=...) or calls fig.savefig.
Every curve and axis says whether it is simulated or measured.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

MIB = float(1 << 20)


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(
            "thunder_memfuse's plots need matplotlib, which is not installed: "
            "pip install 'thunder_memfuse[plot]' (or pip install matplotlib)"
        ) from e
    return plt


def _finish(plt, fig, path):
    fig.tight_layout()
    plt.close(fig)  # not pyplot's any more: shown once as a value, never by a later plt.show()
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def plot_timeline(jfn, path: str | None = None, *, figsize: tuple[float, float] | None = None, measured=None):
    """Live memory while each op runs, per trace memfuse transformed (forward,
    backward): Thunder's input order against memfuse's plan.

    jfn: a function from thunder.jit(..., transforms=[memfuse]) that has run once.
    path: also save the figure there (PNG, SVG, PDF... by its suffix).
    Both curves are simulated with the core's cost model (bytes above the
    inputs; a fused group counts as one step and is drawn at its first op).
    measured: a Comparison from thunder_memfuse.measure.compare(jfn, *args); its
    profiler curve of memfuse's final trace is drawn too, step by step at the same
    op positions, above the same start.
    Returns the matplotlib Figure.
    """
    from ._traces import _memfuse_traces, _schedules

    traces = _memfuse_traces(jfn, "plot_timeline")
    plt = _pyplot()
    fig, axes = plt.subplots(len(traces), 1, figsize=figsize or (9, 3.2 * len(traces)), squeeze=False)
    for ax, (kind, (_, info)) in zip(axes[:, 0], traces.items()):
        (pb, sb, _), (pa, sa, _) = _schedules(info)
        n = len(sb)  # each curve gets a closing point at n, so the last step has its width too
        ax.step(list(range(n)) + [n], [b / MIB for b in sb] + [sb[-1] / MIB if sb else 0.0], where="post",
                label=f"Thunder's order, simulated (peak {pb / MIB:.2f} MiB)")
        xs, k = [], 0  # a group is drawn at the op index where it starts: both curves share the axis
        for grp in info["plan"]["groups"]:
            xs.append(k)
            k += len(grp)
        ax.step(xs + [k], [b / MIB for b in sa] + [sa[-1] / MIB if sa else 0.0], where="post",
                label=f"memfuse, simulated (peak {pa / MIB:.2f} MiB"
                      + (f", {len(info['plan']['groups'])} steps with its regions" if k != len(xs) else "") + ")")
        # the recomputed copies (csrc/core/mf_remat.c NOTE [recomputation]): ops whose original op already
        # ran earlier in the schedule, marked on memfuse's curve at their step
        origin = (info["plan"].get("recompute") or {}).get("origin")
        if origin:
            seen, marks = set(), []
            for x, y, grp in zip(xs, sa, info["plan"]["groups"]):
                again = [k2 for k2 in grp if origin[k2] in seen]
                seen.update(origin[k2] for k2 in grp)
                if again:
                    marks.append((x, y / MIB))
            if marks:
                ax.plot([m[0] for m in marks], [m[1] for m in marks], linestyle="none", marker="v", markersize=4,
                        color="tab:red", label=f"memfuse, a recomputed copy runs ({len(marks)} steps)")
        mt = getattr(measured, "traces", {}).get(kind) if measured is not None else None
        if mt is not None and mt.steps:
            ys = [(r["measured"] + mt.start_simulated) / MIB for r in mt.steps]
            if len(ys) == len(xs):
                mx = list(xs)
            else:  # the final trace's steps do not line up with the plan's groups: spread them evenly
                mx = [k * i / len(ys) for i in range(len(ys))]
            ax.step(mx + [k], ys + [ys[-1]], where="post", linestyle="--",
                    label=f"memfuse, measured (torch.profiler; peak {max(ys):.2f} MiB)")
        lb = info["plan"].get("lower_bound_bytes")
        if lb:  # the bound of unfused orders (format_report gives it beside the unfused figures)
            below = " (memfuse's regions go below it: their inner values never reach memory)" if pa < lb else ""
            ax.axhline(lb / MIB, color="grey", linestyle=":", linewidth=1,
                       label=f"lower bound of unfused orders ({lb / MIB:.2f} MiB){below}")
        copies = k - len(sb)  # recomputed copies (report()["recompute"]): memfuse's axis runs past Thunder's ops
        ax.set_title(f"{kind} trace: {'simulated and measured' if mt is not None else 'simulated'} memory while "
                     f"each op runs ({len(sb)} ops"
                     + (f"; memfuse's schedule runs {k}, {copies} of them recomputed copies" if copies > 0 else "")
                     + ")")
        ax.set_xlabel("op position in the schedule (a region is drawn at its first op)")
        ax.set_ylabel("MiB above inputs")
        ax.legend(loc="best", fontsize="small")
    return _finish(plt, fig, path)


def _rows(results) -> list[tuple[str, float | None, float | None]]:
    """(label, peak MiB, time ms) from a mapping label -> dict or a sequence of dicts."""
    out = []
    items = results.items() if isinstance(results, Mapping) else ((r.get("variant"), r) for r in results)
    for label, r in items:
        if r is None:
            continue
        peak = r.get("peak_mib")
        if peak is None and r.get("peak_bytes") is not None:
            peak = r["peak_bytes"] / MIB
        out.append((str(label if label is not None else r.get("name", "?")), peak, r.get("time_ms")))
    if not out:
        raise ValueError("plot_comparison: no results to plot")
    return out


def plot_comparison(results: Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]], path: str | None = None,
                    *, title: str | None = None, measured_by: str = "measured",
                    highlight: str | None = "memfuse"):
    """Bars of peak memory and time per variant.

    results: {variant: {"peak_mib" (or "peak_bytes"): ..., "time_ms": ...}} or a
    list of such dicts with a "variant" key; a missing or None figure leaves its
    bar out (a variant that failed, or a time not measured).
    measured_by: how the peak was measured, shown on the axis
    ("torch.profiler allocations", "torch.cuda.max_memory_allocated", ...).
    highlight: variants whose name contains this string are drawn in another colour.
    Returns the matplotlib Figure.
    """
    rows = _rows(results)
    has_time = any(t is not None for _, _, t in rows)
    plt = _pyplot()
    ncols = 2 if has_time else 1
    fig, axes = plt.subplots(1, ncols, figsize=(5.5 * ncols, 0.45 * len(rows) + 1.6), squeeze=False)
    labels = [r[0] for r in rows]
    colors = ["tab:orange" if highlight and highlight in lab else "tab:blue" for lab in labels]
    panels = [(axes[0, 0], [r[1] for r in rows], f"peak MiB ({measured_by})", "{:.2f}")]
    if has_time:
        panels.append((axes[0, 1], [r[2] for r in rows], "time per call, ms (measured)", "{:.1f}"))
    for ax, vals, xlabel, fmt in panels:
        ys = list(range(len(rows)))
        bars = ax.barh(ys, [v if v is not None else 0.0 for v in vals], color=colors)
        for bar, v in zip(bars, vals):
            ax.annotate("n/a" if v is None else fmt.format(v), (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                        xytext=(3, 0), textcoords="offset points", va="center", fontsize="small")
        ax.set_yticks(ys)
        ax.set_yticklabels(labels)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        ax.margins(x=0.18)
    if title:
        fig.suptitle(title)
    return _finish(plt, fig, path)


def plot_memory_over_time(curves: Mapping[str, tuple[Sequence[float], Sequence[int]]], path: str | None = None,
                          *, title: str | None = None, measured_by: str = "torch.profiler allocations"):
    """Measured live bytes over one call's wall time, one curve per variant.

    curves: {variant: (times_ms, live_bytes)}, e.g. from
    thunder_memfuse.measure.cpu_memory_timeline.  Returns the matplotlib Figure.
    """
    if not curves:
        raise ValueError("plot_memory_over_time: no curves to plot")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(11, 3.4))
    for label, (ts, bs) in curves.items():
        peak = max(bs) if len(bs) else 0
        ax.step(list(ts), [b / MIB for b in bs], where="post", label=f"{label}, measured (peak {peak / MIB:.2f} MiB)")
    ax.set_xlabel("ms since the call started")
    ax.set_ylabel(f"MiB allocated ({measured_by})")
    ax.set_title(title or "measured memory during one call")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")  # beside: the curves overlap
    return _finish(plt, fig, path)


__all__ = ["plot_timeline", "plot_comparison", "plot_memory_over_time"]
