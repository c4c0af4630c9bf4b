"""Python face of the C scheduler: plan() and simulate() on plain graphs."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence, Tuple

from . import _C

Op = Tuple[Sequence[int], Sequence[int]]  # (input value ids, output value ids)
Pair = Tuple[int, int]


@dataclass(frozen=True)
class Plan:
    """The result of :func:`plan`.

    order: op ids in the planned order.  groups: lists of op ids, each a run of
    consecutive ops of `order` (a fusion region, or a single op).  kinds: what
    the planner made of each group (csrc/core/mf_core.h NOTE [group kinds]):
    "single" (one op, unfused), "region" (fusible ops fused), "epilogue" (a pair
    [u, v] of `epilogues`, v run as u's epilogue).
    peak_bytes: simulated peak of `order` with `groups`; unfused_peak_bytes:
    `order` with every op alone; baseline_peak_bytes: the input order made
    valid by a stable topological sort (the ops as listed when that order is
    valid; otherwise the smallest-numbered ready op runs first), every op
    alone; lower_bound_bytes: no valid order can go below it.  optimal: the
    unfused order is proven minimal over all valid orders.  states: DP states
    explored; method: which part of the algorithm ladder produced the order.
    fusion_moves: single-op moves kept after grouping because they lower the
    fused peak (NOTE [fusion-aware moves] in csrc/core/mf_fuse.c); when > 0,
    unfused_peak_bytes and optimal describe the moved order, method the
    order before the moves.  hoists: storages' last readers moved, with what
    they wait for, before the peak step (NOTE [hoists] in csrc/core/mf_hoist.c).  comm_moves: collectives issued earlier and waits
    run later than the planned order had them (NOTE [collective overlap] in
    csrc/core/mf_comm.c), within the planned peaks.
    """

    order: list[int]
    groups: list[list[int]]
    kinds: list[str]
    peak_bytes: int
    unfused_peak_bytes: int
    baseline_peak_bytes: int
    lower_bound_bytes: int
    optimal: bool
    states: int
    method: str = field(default="")
    fusion_moves: int = 0
    hoists: int = 0
    comm_moves: int = 0
    # recompute: None, or what plan(recompute=...) copied (csrc/core/mf_remat.c NOTE
    # [recomputation]): origin (op of the graph each op of `order` is or copies), value_origin,
    # splits, copied_bytes, graph (the graph with the copies, which `order` and `groups` index)
    recompute: Optional[dict] = None
    peak_bytes_without_recompute: Optional[int] = None
    # pipeline: how the plan was found (csrc/core/mf_pipeline.c NOTE [planning pipeline]): start (the
    # labelled start that won), steps (each recomputation pass it kept: kind, splits, copied_bytes,
    # peak_before, peak_after), plans (planner calls), work and max_work (NOTE [work budget]),
    # budget_hit (a start or pass skipped for want of work)
    pipeline: Optional[dict] = None


def plan(ops: Sequence[Op], value_bytes: Sequence[int], *, graph_inputs: Sequence[int] = (),
         graph_outputs: Sequence[int] = (), aliases: Sequence[Pair] = (), fusible: Optional[Sequence[bool | int]] = None,
         after: Sequence[Pair] = (), max_states: Optional[int] = None, fuse: bool = True,
         epilogues: Sequence[Pair] = (), fusion_moves: bool = True, comm: Sequence[Pair] = (),
         comm_overlap: bool = True, recompute: int = 0, cheap: Optional[Sequence[bool]] = None,
         peak_allowance: int = 0, peak_target: int = 0, donatable: Sequence[int] = ()) -> Plan:
    """Plan the order and fusion grouping of a graph with the least peak bytes.

    ops: sequence of (input value ids, output value ids); op i is ops[i].
    value_bytes: byte size per value id.  Every value is produced by exactly
    one op or listed in graph_inputs.  aliases: pairs (view, base), the view
    shares the base's storage.  fusible: one entry per op (default: nothing
    fusible): true if it may join a fused group, whose inner values are never
    stored; the int 2 if it may join one as an extern call (a GEMM in an
    Inductor region), so what it reads and writes is stored while the group
    runs (csrc/core/mf_fuse.c NOTE [stored inner values]).  after: pairs (a, b): op a must run before op b.  epilogues:
    pairs (v, u): op v may run fused into op u as its epilogue, a group [u, v]
    (a GEMM writing relu of its result, say), when the order puts v right
    after u and u's outputs are read by v alone and are not graph outputs.
    fusion_moves: with fuse, move single ops near the peak where that lowers
    the fused peak (False: group the planned order as it is).
    comm: pairs (op, kind), kind 1 for an asynchronous collective, 2 for a
    wait on its result: collectives keep their relative order, and with
    comm_overlap each is issued as early and each wait run as late as the
    graph allows without raising the planned peaks.
    max_states: None (the default cap) or an int in [1, 2**63 - 1]; whatever
    it is, the exact DP also stops at a memory budget (256 MiB of tables) and
    the plan then reports optimal=False.  Ctrl-C raises KeyboardInterrupt.
    Bad input raises ValueError or TypeError naming the problem, including
    sizes whose total (values that are not graph inputs or views) passes
    2**61 - 1 bytes, and two different `epilogues` heads for one op.
    recompute: a budget in bytes; with `cheap` (one flag per op: may run again
    and give the same values), a cheap op's result kept alive across the peak
    may instead be computed again before its later readers (csrc/core/mf_remat.c
    NOTE [recomputation]), kept where it lowers the planned peak: then
    `recompute` says what was copied and `order`/`groups` index its `graph`.
    peak_allowance: bytes a fused peak may reach at no cost (csrc/core/mf_fuse.c
    NOTE [peak allowance]): the grouping then takes the fewest groups whose peak
    is at most the larger of the least peak and this, which may be above the
    order's unfused peak (0: none, the least peak).
    peak_target: 0, or bytes (csrc/core/mf_pipeline.c NOTE [peak target]): the
    recomputation passes stop at the first plan whose fused peak is at most this,
    so the plan copies as little as fits; `pipeline["fits"]` says whether one did
    (else the lowest plan found).
    donatable: value ids whose storage the fused group reading it last may write a result over, as a
    compiler given it as a donated buffer does (csrc/core/mf_credit.c NOTE [donated inputs]): a
    pointwise result of its size then takes its buffer in the plan's count.
    """
    d = _C.plan(ops, value_bytes, graph_inputs=graph_inputs, graph_outputs=graph_outputs, aliases=aliases,
                fusible=fusible, after=after, max_states=max_states, fuse=fuse, epilogues=epilogues,
                fusion_moves=fusion_moves, comm=comm, comm_overlap=comm_overlap, recompute=recompute,
                cheap=cheap, peak_allowance=peak_allowance, peak_target=peak_target, donatable=donatable)
    return Plan(**d)


def simulate(ops: Sequence[Op], value_bytes: Sequence[int], order: Sequence[int],
             groups: Optional[Sequence[Sequence[int]]] = None, *, graph_inputs: Sequence[int] = (),
             graph_outputs: Sequence[int] = (), aliases: Sequence[Pair] = (),
             fusible: Optional[Sequence[bool | int]] = None,
             epilogues: Sequence[Pair] = (), donatable: Sequence[int] = ()) -> Tuple[int, list[int], list[int]]:
    """Score a schedule with the core's cost model.

    order: every op once, keeping every dependency.  groups (optional): lists
    of op ids, each non-empty, whose concatenation is `order`.  Otherwise
    ValueError (or TypeError) names the problem.
    Returns (peak_bytes, step_bytes, live_after): the peak, the memory while
    each step (op or group) runs, and the live bytes after each step.
    fusible: as plan()'s; only the stored level (2) changes a group's cost.
    epilogues: as plan()'s: a two-op group (u, v) where v is u's epilogue runs as an epilogue pair, so
    a plan's order, groups, fusible and epilogues give back its peak_bytes; so do its donatable values.
    """
    return _C.simulate(ops, value_bytes, order, groups, graph_inputs=graph_inputs, graph_outputs=graph_outputs,
                       aliases=aliases, fusible=fusible, epilogues=epilogues, donatable=donatable)
