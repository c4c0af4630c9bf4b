"""Thunder's rematerialization with the min-cut in C: the fusion pass's (fusion_pass.py) step that
decides, for each producer/consumer pair of provisional regions, which values the consumer computes
again instead of reading.

NOTE [rematerialization in C]  thunder.core.rematerialization.rematerialize walks the pairs in order
and, for each, builds a graph (a node pair per value, the value's bytes between them, infinite edges
along the dataflow; required producer values tied to the source, required consumer values to the
sink) and solves it with networkx's minimum_cut, in Python: most of the fusion pass's time, and it
grows with every pair of every layer.  This module keeps Thunder's walk and Thunder's own helpers
(find_external_producer_outputs, apply_rematerialization_for_producer/consumer, ...), builds the same
graph with the same capacities over integer node ids, and solves it with the core's maximum flow
(csrc/core/mf_flow.c NOTE [min cut]).  The cut read back is the one networkx returns: the nodes that
reach the sink in the residual graph of a maximum flow, a set every maximum flow shares.  So the
pass's result is Thunder's, value for value (tests/test_rematerialize.py compares the two on real
joint traces, which also catches a Thunder release whose graph differs from this one).

NOTE [consumers already rewritten]  The one place where this walk departs from Thunder's.  Thunder
asks which of a producer's outputs some other op still reads (find_external_producer_outputs) by
looking them up in the trace's consumers as they were before the walk, and leaves out the pair's
consumer and the producer's later consumers as they are now.  Once an earlier pair has rewritten a
consumer (a layer's backward region reading the attention's, then the MLP's forward regions), the
two are different bound symbols, so the consumer's own reads count as another op's: every output of
every later producer it reads is kept, and nothing more is recomputed there.  On a GPT-2 step every
intermediate of the tanh GELU was saved for that reason.  Here an op is "another" only where it is
neither the pair's consumer nor a later consumer, as they were before the walk or as they are now;
everything else is Thunder's.  tests/test_rematerialize.py compares the walk with Thunder's, that one
lookup aside, and checks a trace where the two differ.

The departure is taken only where the pair's producer lies in the joint trace's forward part: there
a cut decides what the forward saves for the backward, which nothing after this pass changes (with
memory_budget="auto").  A producer in the backward part (a checkpointed block's forward computed again
there) keeps Thunder's lookup: what the backward computes twice is already the planner's own choice,
made against the modelled peak (csrc/core/mf_remat.c), and a wider memory-blind cut there moved the
recomputed forward chains into the backward's regions, which then measured higher (pre-LN
checkpointed steps at 1024 and 2048 tokens, benchmarks/RESULTS.md).

Capacities are Thunder's (a tensor's dtype bytes, a number 0, any other proxy 1, halved for the
producer's own arguments), doubled so that they are integers.  Where networkx's DiGraph would keep
the last of two equal edges, so does this graph; the edges are the same in every case but the
halving, which Thunder applies the same way each time.
"""
from __future__ import annotations

from itertools import chain, takewhile

INF = -1  # an infinite capacity, as _C.min_cut takes it


def rematerialize(trace):
    """thunder.core.rematerialization.rematerialize, its cuts solved in C."""
    from collections import defaultdict

    from thunder.core import utils
    from thunder.core.rematerialization import (apply_rematerialization_for_consumer,
                                                apply_rematerialization_for_producer,
                                                find_fusion_producer_consumer_pairs)
    from thunder.core.trace import from_trace

    static_consumers = utils.consumers(trace)
    pairs = find_fusion_producer_consumer_pairs(trace, proxy_to_consumers=static_consumers)
    backward = backward_part(trace)
    current = {b: b for b in chain.from_iterable(pairs)}
    cuts_so_far = defaultdict(tuple)
    for i, (producer, consumer) in enumerate(pairs):
        cur_producer, cur_consumer = current[producer], current[consumer]
        # the producer's later consumers: what they read must stay an output
        later_static = tuple(c for _, c in takewhile(lambda pc: pc[0] is producer, pairs[i + 1:]))
        later = tuple(current[c] for c in later_static)
        external = external_producer_outputs(static_consumers, later, cur_producer, cur_consumer,
                                             () if id(producer) in backward else (consumer, *later_static))
        cut = find_cut(external, cur_producer, cur_consumer)
        if not cut:
            continue
        external += cuts_so_far[producer]
        new_producer = apply_rematerialization_for_producer(external, cur_producer, cut)
        new_consumer = apply_rematerialization_for_consumer(cur_producer, cur_consumer, cut)
        current[producer] = current[cur_producer] = new_producer
        current[consumer] = current[cur_consumer] = new_consumer
        cuts_so_far[producer] += cut
    out = from_trace(trace)
    out.bound_symbols = tuple(current.get(b, b) for b in trace.bound_symbols)
    return out


def backward_part(trace) -> set:
    """ids of the bound symbols of a joint trace's backward part, as Thunder's split assigns them
    (NOTE [consumers already rewritten]); empty for any other trace."""
    from ._saved_set import backward_indices, is_joint

    if not is_joint(trace):
        return set()
    return {id(trace.bound_symbols[i]) for i in backward_indices(trace)}


def external_producer_outputs(static_consumers, later, producer, consumer, static_pair_consumers=()):
    """thunder.core.rematerialization.find_external_producer_outputs: the producer's outputs that
    must stay outputs, since an op other than the pair's consumer (or the producer's later consumers,
    `later`) reads them.  The ops that do not count are those as they are now and, as
    `static_pair_consumers`, as they were before the walk (NOTE [consumers already rewritten]);
    without them this is Thunder's function."""
    from thunder.core import prims, utils

    local = utils.consumers(list(chain((producer, consumer), later)))
    ours = {id(b) for b in chain((consumer,), later, static_pair_consumers)}
    arg_names = {x.name for x in consumer.args}

    def rematerializable(out):
        here = local.get(out, ())
        if len(here) > 1:
            return False
        if any(x.sym is not prims.python_del and id(x) not in ours and x not in (consumer, *later)
               for x in static_consumers.get(out, ())):
            return False
        return not here or out.name in arg_names

    keep = {x.name for x in producer.output if rematerializable(x)}
    return tuple(x for x in producer.output if x.name not in keep)


def find_cut(external_producer_outputs, producer, consumer) -> tuple:
    """thunder.core.rematerialization.find_cut: the names of the values at the minimum cut between
    producer and consumer (sorted), or () where none may be cut."""
    from thunder.core import prims, utils
    from thunder.core.proxies import NumberProxy, TensorProxy
    from thunder.core.symbol import has_tags
    from thunder.core.trace import TraceCtx
    from thunder.core.rematerialization import find_external_consumer_inputs

    from .. import _C

    tags = {prims.OpTags.REDUCTION_OP, prims.OpTags.RANDOM_OP, prims.OpTags.MATMUL_OP}
    required_producer = list(producer.args) + list(external_producer_outputs)
    required_producer += [y for x in producer.subsymbols if has_tags(x, tags) for y in x.flat_outs]
    if producer.sym.executor != consumer.sym.executor:
        required_producer += [y for x in producer.subsymbols
                              if not has_tags(x, tags) and not consumer.sym.executor.can_fuse(x)
                              for y in x.flat_outs]
    required_producer = [x for x in required_producer if x is not None]

    external_inputs = find_external_consumer_inputs(producer, consumer)
    required_consumer = [x.name for x in consumer.output] + [x.name for x in external_inputs]
    consumer_trace = TraceCtx(None)
    consumer_trace.bound_symbols = consumer.subsymbols
    required_consumer += [y.name for x in utils.find_producer_symbols(consumer_trace, consumer.output, external_inputs)
                          for y in x.flat_outs if y is not None]
    required_consumer_set = set(required_consumer)
    if any(x.name in required_consumer_set for x in required_producer):
        return ()
    utils.check(len(required_consumer) > 0,
                lambda: "The consumer has no outputs. This is not supported by the cut finding algorithm.")

    ids = {"source": 0, "sink": 1}
    edges = {}  # (u, v) -> doubled capacity; a repeated edge keeps its last capacity, as a DiGraph does

    def node(name):
        k = ids.get(name)
        if k is None:
            k = ids[name] = len(ids)
        return k

    def add_edge(u, v, cap):
        edges[(u, v)] = cap

    skip = (prims.PrimIDs.UNPACK_SEQUENCE, prims.PrimIDs.UNPACK_TRIVIAL, prims.PrimIDs.UNPACK_KEY,
            prims.PrimIDs.RETURN)
    combined = TraceCtx(None)
    combined.bound_symbols = (*producer.subsymbols, *consumer.subsymbols)
    users = utils.consumers(combined)._dict
    producer_arg_names = {x.name for x in producer.args}

    for name in required_consumer:
        add_edge(node(name + "_in"), 1, INF)

    def add_value(var):
        name = var.name
        if isinstance(var, TensorProxy):
            cap = 2 * var.dtype.bytes
        elif isinstance(var, NumberProxy):
            cap = 0
        else:
            cap = 2
        if name in producer_arg_names:
            cap //= 2
        out = node(name + "_out")
        add_edge(node(name + "_in"), out, cap)
        for user in users.get(name, ()):
            if user.sym.id in skip:
                continue
            for o in user.flat_proxy_outs:
                add_edge(out, node(o.name + "_in"), INF)

    for var in required_producer:
        add_edge(0, node(var.name + "_in"), INF)
        add_value(var)
    for b in chain(producer.subsymbols, consumer.subsymbols):
        for var in b.flat_proxy_outs:
            add_value(var)

    src, dst = [], []
    for u, v in edges:
        src.append(u)
        dst.append(v)
    try:
        _, sink_side = _C.min_cut(len(ids), src, dst, list(edges.values()), 0, 1)
    except ValueError as e:
        raise RuntimeError(f"memfuse: rematerialization's min-cut failed: {e}") from e
    names = list(ids)
    cut = set()
    for (u, v), cap in edges.items():
        if v == 1 or sink_side[u] or not sink_side[v]:
            continue
        nu, nv = names[u], names[v]
        if not (nu.endswith("_in") and nv.endswith("_out") and nu[:-3] == nv[:-4]):
            raise RuntimeError(f"memfuse: rematerialization cut an edge between values: {nu} -> {nv}")
        cut.add(nu[:-3])
    return tuple(sorted(cut))
