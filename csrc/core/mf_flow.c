/*
 * mf_flow.c -- a maximum flow and the minimum cut closest to the sink, for the
 * rematerialization of the fusion pass (thunder_memfuse/integration/_rematerialize.py).
 *
 * NOTE [min cut]
 * Thunder's rematerialization asks, for each producer/consumer pair of fusion
 * regions, for a minimum s-t cut of a small graph (a node pair per value,
 * value bytes on the edge between them, infinite edges along the dataflow) and
 * reads the partition networkx's minimum_cut returns: the sink side is the set
 * of nodes that can still reach t in the residual graph of a maximum flow.
 * That set is the same for every maximum flow (it is the minimal sink side of
 * the minimum cuts), so any exact max-flow algorithm gives the very cut
 * networkx gives; this one is Dinic's (BFS levels, blocking flows by DFS with
 * per-node edge cursors), in C because networkx's preflow-push in Python was
 * most of the pass's time.
 *
 * Capacities are non-negative integers, MF_FLOW_INF (-1) meaning infinite.
 * Infinite is represented as one more than the sum of the finite capacities:
 * if t is reachable from s along infinite edges alone the flow reaches that
 * value, and otherwise the cut around the infinitely reachable nodes bounds it
 * below it, so a flow of at least that value means no finite cut exists
 * (MF_EINVAL, as networkx fails on an infinite-capacity path).
 * Iterative throughout: no recursion depth grows with the graph.
 */
#include "mf_internal.h"

#include <string.h>

typedef struct flow_net {
    int32_t n, m2;           /* nodes; arcs (two per edge: forward, then its reverse) */
    int32_t *head, *next, *to;
    int64_t *res;            /* residual capacity per arc */
    int32_t *level, *cursor, *queue, *stack_node, *stack_arc;
} flow_net;

static int64_t augment(flow_net *f, int32_t s, int32_t t, int64_t limit)
{
    /* one blocking-flow DFS from s, iteratively: the path is stack_arc[0..d) */
    int32_t d = 0, v = s;
    int64_t pushed_total = 0;
    while (pushed_total < limit) {
        if (v == t) {
            int64_t push = limit - pushed_total;
            int32_t i;
            for (i = 0; i < d; i++)
                if (f->res[f->stack_arc[i]] < push)
                    push = f->res[f->stack_arc[i]];
            for (i = 0; i < d; i++) {
                f->res[f->stack_arc[i]] -= push;
                f->res[f->stack_arc[i] ^ 1] += push;
            }
            pushed_total += push;
            /* retreat to the first saturated arc's tail */
            for (i = 0; i < d; i++)
                if (f->res[f->stack_arc[i]] == 0)
                    break;
            d = i;
            v = d == 0 ? s : f->to[f->stack_arc[d - 1]];
            continue;
        }
        {
            int32_t a = f->cursor[v];
            while (a >= 0 && !(f->res[a] > 0 && f->level[f->to[a]] == f->level[v] + 1))
                a = f->next[a];
            f->cursor[v] = a;
            if (a >= 0) {
                f->stack_node[d] = v;
                f->stack_arc[d++] = a;
                v = f->to[a];
                continue;
            }
        }
        /* dead end: v leaves the level graph */
        f->level[v] = -1;
        if (d == 0)
            break;
        v = f->stack_node[--d];
        f->cursor[v] = f->next[f->cursor[v]];
    }
    return pushed_total;
}

static int bfs_levels(flow_net *f, int32_t s, int32_t t)
{
    int32_t qh = 0, qt = 0, v, a;
    for (v = 0; v < f->n; v++)
        f->level[v] = -1;
    f->level[s] = 0;
    f->queue[qt++] = s;
    while (qh < qt) {
        v = f->queue[qh++];
        for (a = f->head[v]; a >= 0; a = f->next[a])
            if (f->res[a] > 0 && f->level[f->to[a]] < 0) {
                f->level[f->to[a]] = f->level[v] + 1;
                f->queue[qt++] = f->to[a];
            }
    }
    return f->level[t] >= 0;
}

int mf_min_cut(mf_ctx *ctx, int32_t n, int32_t m, const int32_t *src, const int32_t *dst, const int64_t *cap,
               int32_t s, int32_t t, int64_t *flow_out, uint8_t *sink_side)
{
    flow_net f;
    int64_t inf = 1, flow = 0;
    int32_t i, v, a, qh, qt;
    int status = MF_OK;
    void *block = NULL;
    size_t bytes;

    if (n < 2 || m < 0 || s < 0 || s >= n || t < 0 || t >= n || s == t)
        return mf_set_error(ctx, MF_EINVAL, "min cut: need n >= 2 nodes and distinct source and sink in range "
                                            "(n %d, source %d, sink %d)", (int)n, (int)s, (int)t);
    if (m > (INT32_MAX / 2) - 1)
        return mf_set_error(ctx, MF_EINVAL, "min cut: too many edges (%d)", (int)m);
    for (i = 0; i < m; i++) {
        if (src[i] < 0 || src[i] >= n || dst[i] < 0 || dst[i] >= n)
            return mf_set_error(ctx, MF_EINVAL, "min cut: edge %d joins %d and %d, outside 0..%d", (int)i,
                                (int)src[i], (int)dst[i], (int)n - 1);
        if (cap[i] < MF_FLOW_INF)
            return mf_set_error(ctx, MF_EINVAL, "min cut: edge %d has capacity %lld (negative; -1 is infinite)",
                                (int)i, (long long)cap[i]);
        if (cap[i] > 0) {
            if (cap[i] > (INT64_MAX / 4) - inf)
                return mf_set_error(ctx, MF_EINVAL, "min cut: the finite capacities overflow (edge %d)", (int)i);
            inf += cap[i];
        }
    }
    f.n = n;
    f.m2 = 2 * m;
    bytes = (size_t)n * 6 * sizeof(int32_t) + (size_t)f.m2 * (2 * sizeof(int32_t) + sizeof(int64_t));
    block = mf_alloc(ctx, bytes ? bytes : 1);
    if (!block)
        return MF_ENOMEM;
    f.res = (int64_t *)block;
    f.next = (int32_t *)(f.res + f.m2);
    f.to = f.next + f.m2;
    f.head = f.to + f.m2;
    f.level = f.head + n;
    f.cursor = f.level + n;
    f.queue = f.cursor + n;
    f.stack_node = f.queue + n;
    f.stack_arc = f.stack_node + n;
    for (v = 0; v < n; v++)
        f.head[v] = -1;
    /* arcs in reverse so each node's list is in input order (a deterministic walk) */
    for (i = m - 1; i >= 0; i--) {
        int32_t fw = 2 * i, bw = 2 * i + 1;
        f.to[fw] = dst[i];
        f.res[fw] = cap[i] == MF_FLOW_INF ? inf : cap[i];
        f.to[bw] = src[i];
        f.res[bw] = 0;
        f.next[bw] = f.head[dst[i]];
        f.head[dst[i]] = bw;
        f.next[fw] = f.head[src[i]];
        f.head[src[i]] = fw;
    }
    while (flow < inf && bfs_levels(&f, s, t)) {
        memcpy(f.cursor, f.head, (size_t)n * sizeof(int32_t));
        flow += augment(&f, s, t, inf - flow);
        if (ctx->cancel && ctx->cancel(ctx->cancel_ud)) {
            status = MF_ECANCEL;
            goto done;
        }
    }
    if (flow >= inf) {
        status = mf_set_error(ctx, MF_EINVAL, "min cut: a path of infinite capacity joins the source and the sink");
        goto done;
    }
    /* sink side: the nodes that reach t by arcs with residual capacity (BFS backwards from t:
     * u reaches v's set by arc u->v when res[u->v] > 0, i.e. from v along the reverse arc a^1) */
    memset(sink_side, 0, (size_t)n);
    sink_side[t] = 1;
    qh = qt = 0;
    f.queue[qt++] = t;
    while (qh < qt) {
        v = f.queue[qh++];
        for (a = f.head[v]; a >= 0; a = f.next[a]) {
            int32_t u = f.to[a];
            if (!sink_side[u] && f.res[a ^ 1] > 0) {
                sink_side[u] = 1;
                f.queue[qt++] = u;
            }
        }
    }
    if (flow_out)
        *flow_out = flow;
done:
    mf_free(ctx, block);
    return status;
}
