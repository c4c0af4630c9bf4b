/* Coarse orders: the order planned on the graph with its fusible chains
 * contracted (NOTE [coarse orders]).  Plain C; reads the graph description
 * only, plans the contracted graph with mf_plan itself. */
#include "mf_internal.h"

#include <string.h>

/* NOTE [coarse orders]
 * The DP and heuristics plan the order against the unfused model, where every
 * value of an elementwise chain is stored.  In a checkpointed backward under
 * regions the unfused peak sits in such a chain (a tanh GELU's nine large
 * values), so the rest of the order is free to keep much alive at no cost in
 * that model, and the regions formed on it later fill that slack: the
 * fusion-aware moves (mf_fuse.c) only move single ops in windows near the
 * peak, and cannot undo a block's weight gradients left a block later.
 * Here each fusible op that is not stored (MF_FUSIBLE), not a collective, no
 * graph output, and whose every reader is in one cluster whose root may fuse,
 * joins that cluster (ops in reverse order, so a cluster is an in-tree of
 * chains feeding its root).  Each cluster becomes one op of a contracted graph
 * that reads what its members read from outside and writes what is read
 * outside it (alias bases kept with their views); a stored member (a GEMM in
 * an Inductor region) adds the cluster's inner values it reads as bytes live
 * while the cluster runs, as the fused model stores them.  mf_plan orders the
 * contracted graph unfused (its values are what regions would store), and
 * the order expands cluster by cluster, members in graph order.  The result
 * is only a start: stage 8 of mf_plan groups it and runs the fusion-aware
 * moves from it like its other starts, and keeps the lowest fused peak, so it
 * never makes a plan worse.  The graph's op ids must be a topological order
 * (the reader's graphs are: the trace order) and contraction must leave no
 * cycle through ordering edges; otherwise no coarse order is given.  Views
 * count through dataflow only (in traces a view's op reads its base or a view
 * of it), so mf_plan drops an expanded order that breaks a view edge. */

typedef struct coarse {
    mf_ctx *ctx;
    mf_arena *a;
    const mf_graph_desc *g;
    int32_t n, nv;
    int32_t *prod;  /* nv: producing op or -1 */
    int32_t *par;   /* n: union-find parent */
    int32_t *rd_ptr, *rd; /* readers of each value (CSR) */
} coarse;

static int32_t find(int32_t *par, int32_t x)
{
    while (par[x] != x) {
        par[x] = par[par[x]];
        x = par[x];
    }
    return x;
}

static int32_t vroot(const mf_graph_desc *g, int32_t v)
{
    while (g->alias_of && g->alias_of[v] >= 0)
        v = g->alias_of[v];
    return v;
}

static int is_out(const mf_graph_desc *g, int32_t v)
{
    return g->is_output && (g->is_output[v] || g->is_output[vroot(g, v)]);
}

/* The base of view x, or -1 (for the topological check: a view's op runs
 * after its base's producer, mf_graph.c NOTE [view order]). */
static int32_t view_base(const mf_graph_desc *g, int32_t x)
{
    return g->alias_of ? g->alias_of[x] : -1;
}

/* Producers and readers; *topo 0 when some op depends on a later one. */
static int index_graph(coarse *C, int *topo)
{
    const mf_graph_desc *g = C->g;
    int32_t k, i, v, *fill;
    C->prod = (int32_t *)mf_arena_array(C->ctx, C->a, (size_t)C->nv + 1, sizeof(int32_t));
    C->rd_ptr = (int32_t *)mf_arena_array(C->ctx, C->a, (size_t)C->nv + 1, sizeof(int32_t));
    C->rd = (int32_t *)mf_arena_array(C->ctx, C->a, (size_t)g->in_ptr[C->n] + 1, sizeof(int32_t));
    fill = (int32_t *)mf_arena_array(C->ctx, C->a, (size_t)C->nv + 1, sizeof(int32_t));
    C->par = (int32_t *)mf_arena_array(C->ctx, C->a, (size_t)C->n + 1, sizeof(int32_t));
    if (!C->prod || !C->rd_ptr || !C->rd || !fill || !C->par)
        return MF_ENOMEM;
    for (v = 0; v < C->nv; v++)
        C->prod[v] = -1;
    memset(C->rd_ptr, 0, sizeof(int32_t) * ((size_t)C->nv + 1));
    for (k = 0; k < C->n; k++) {
        C->par[k] = k;
        for (i = g->out_ptr[k]; i < g->out_ptr[k + 1]; i++)
            C->prod[g->out_idx[i]] = k;
    }
    *topo = 1;
    for (k = 0; k < C->n; k++) {
        for (i = g->in_ptr[k]; i < g->in_ptr[k + 1]; i++) {
            v = g->in_idx[i];
            if (C->prod[v] >= k)
                *topo = 0;
            C->rd_ptr[v + 1]++;
        }
        for (i = g->out_ptr[k]; i < g->out_ptr[k + 1]; i++)
            if ((v = view_base(g, g->out_idx[i])) >= 0 && C->prod[v] > k)
                *topo = 0;
    }
    for (v = 0; v < C->nv; v++)
        C->rd_ptr[v + 1] += C->rd_ptr[v];
    memcpy(fill, C->rd_ptr, sizeof(int32_t) * (size_t)C->nv);
    for (k = 0; k < C->n; k++)
        for (i = g->in_ptr[k]; i < g->in_ptr[k + 1]; i++)
            C->rd[fill[g->in_idx[i]]++] = k;
    return MF_OK;
}

static int fusible_at(const mf_graph_desc *g, int32_t k)
{
    return g->fusible ? g->fusible[k] : 0;
}

/* Join op k into its readers' cluster where NOTE [coarse orders] allows it. */
static void join(coarse *C, int32_t k)
{
    const mf_graph_desc *g = C->g;
    int32_t i, j, c = -1;
    if (fusible_at(g, k) == 0 || fusible_at(g, k) == MF_FUSIBLE_STORED)
        return;
    if (g->comm && g->comm[k] != MF_COMM_NONE)
        return;
    for (i = g->out_ptr[k]; i < g->out_ptr[k + 1]; i++) {
        int32_t v = g->out_idx[i];
        if (is_out(g, v))
            return;
        for (j = C->rd_ptr[v]; j < C->rd_ptr[v + 1]; j++) {
            int32_t r = find(C->par, C->rd[j]);
            if (c >= 0 && r != c)
                return;
            c = r;
        }
    }
    if (c < 0 || c == k || fusible_at(g, c) == 0)
        return;
    C->par[k] = c;
}

/* The contracted graph of the clusters, planned unfused; its order expanded
 * into order_out.  *found stays 0 when the contraction has a cycle. */
static int plan_contracted(coarse *C, int32_t nc, const int32_t *cid, int64_t max_states, int64_t *states,
                           int32_t *order_out, int *found)
{
    const mf_graph_desc *g = C->g;
    int32_t n = C->n, nv = C->nv, k, i, v, c, nk = 0;
    int32_t *vid = (int32_t *)mf_arena_array(C->ctx, C->a, (size_t)nv + 1, sizeof(int32_t));
    int32_t *optr = (int32_t *)mf_arena_array(C->ctx, C->a, (size_t)nc + 1, sizeof(int32_t));
    int32_t *iptr = (int32_t *)mf_arena_array(C->ctx, C->a, (size_t)nc + 1, sizeof(int32_t));
    int32_t *oidx = (int32_t *)mf_arena_array(C->ctx, C->a, (size_t)g->out_ptr[n] + (size_t)nc + 1, sizeof(int32_t));
    int32_t *iidx = (int32_t *)mf_arena_array(C->ctx, C->a, (size_t)g->in_ptr[n] + 1, sizeof(int32_t));
    int32_t *seen = (int32_t *)mf_arena_array(C->ctx, C->a, (size_t)nv + 1, sizeof(int32_t));
    int32_t *aft = (int32_t *)mf_arena_array(C->ctx, C->a, 2 * (size_t)g->n_after + 1, sizeof(int32_t));
    int32_t *members = (int32_t *)mf_arena_array(C->ctx, C->a, (size_t)n + 1, sizeof(int32_t));
    int32_t *mptr = (int32_t *)mf_arena_array(C->ctx, C->a, (size_t)nc + 2, sizeof(int32_t));
    int64_t *vb = (int64_t *)mf_arena_array(C->ctx, C->a, (size_t)nv + (size_t)nc + 1, sizeof(int64_t));
    int32_t *al = (int32_t *)mf_arena_array(C->ctx, C->a, (size_t)nv + (size_t)nc + 1, sizeof(int32_t));
    uint8_t *isin = (uint8_t *)mf_arena_array(C->ctx, C->a, (size_t)nv + (size_t)nc + 1, 1);
    uint8_t *isout = (uint8_t *)mf_arena_array(C->ctx, C->a, (size_t)nv + (size_t)nc + 1, 1);
    uint8_t *keep = (uint8_t *)mf_arena_array(C->ctx, C->a, (size_t)nv + 1, 1);
    uint8_t *ccomm = g->comm ? (uint8_t *)mf_arena_array(C->ctx, C->a, (size_t)nc + 1, 1) : NULL;
    int32_t nn = 0, na = 0;
    mf_graph_desc d;
    mf_plan_options o;
    mf_plan_result r;
    int st;
    if (!vid || !optr || !iptr || !oidx || !iidx || !seen || !aft || !members || !mptr || !vb || !al || !isin ||
        !isout || !keep || (g->comm && !ccomm))
        return MF_ENOMEM;
    /* kept values: graph inputs and outputs, values read in another cluster, alias bases of kept ones */
    for (v = 0; v < nv; v++) {
        keep[v] = (uint8_t)(C->prod[v] < 0 || is_out(g, v));
        for (i = C->rd_ptr[v]; i < C->rd_ptr[v + 1] && !keep[v]; i++)
            keep[v] = (uint8_t)(cid[C->rd[i]] != cid[C->prod[v]]);
    }
    for (v = 0; v < nv; v++)
        for (i = v; keep[v] && view_base(g, i) >= 0 && !keep[view_base(g, i)]; i = view_base(g, i))
            keep[view_base(g, i)] = 1;
    for (v = 0; v < nv; v++) {
        vid[v] = keep[v] ? nn++ : -1;
        seen[v] = -1;
    }
    for (v = 0; v < nv; v++)
        if (keep[v]) {
            vb[vid[v]] = g->value_bytes[v];
            isin[vid[v]] = (uint8_t)(C->prod[v] < 0);
            isout[vid[v]] = (uint8_t)(g->is_output && g->is_output[v]);
            al[vid[v]] = (g->alias_of && g->alias_of[v] >= 0) ? vid[g->alias_of[v]] : -1;
        }
    /* members of each cluster, in graph order */
    memset(mptr, 0, sizeof(int32_t) * ((size_t)nc + 2));
    for (k = 0; k < n; k++)
        mptr[cid[k] + 2]++;
    for (c = 0; c < nc; c++)
        mptr[c + 2] += mptr[c + 1];
    for (k = 0; k < n; k++)
        members[mptr[cid[k] + 1]++] = k;
    optr[0] = iptr[0] = 0;
    for (c = 0; c < nc; c++) {
        int64_t stored = 0;
        int32_t no = optr[c], ni = iptr[c];
        for (i = mptr[c]; i < mptr[c + 1]; i++) {
            int32_t j;
            k = members[i];
            if (ccomm && g->comm[k] != MF_COMM_NONE)
                ccomm[c] = g->comm[k];
            for (j = g->in_ptr[k]; j < g->in_ptr[k + 1]; j++) {
                v = g->in_idx[j];
                if (C->prod[v] >= 0 && cid[C->prod[v]] == c) {
                    if (fusible_at(g, k) == MF_FUSIBLE_STORED && !keep[v] && seen[v] != c)
                        stored += g->value_bytes[v];
                } else if (seen[v] != c) {
                    iidx[ni++] = vid[v];
                }
                seen[v] = c;
            }
            for (j = g->out_ptr[k]; j < g->out_ptr[k + 1]; j++)
                if (keep[g->out_idx[j]])
                    oidx[no++] = vid[g->out_idx[j]];
        }
        if (stored > 0) { /* a value nothing reads: live while the cluster runs */
            vb[nn] = stored;
            isin[nn] = isout[nn] = 0;
            al[nn] = -1;
            oidx[no++] = nn++;
        }
        optr[c + 1] = no;
        iptr[c + 1] = ni;
    }
    for (i = 0; i < g->n_after; i++)
        if (cid[g->after[2 * i]] != cid[g->after[2 * i + 1]]) {
            aft[2 * na] = cid[g->after[2 * i]];
            aft[2 * na + 1] = cid[g->after[2 * i + 1]];
            na++;
        }
    memset(&d, 0, sizeof d);
    d.n_ops = nc;
    d.n_values = nn;
    d.in_ptr = iptr;
    d.in_idx = iidx;
    d.out_ptr = optr;
    d.out_idx = oidx;
    d.value_bytes = vb;
    d.alias_of = al;
    d.is_input = isin;
    d.is_output = isout;
    d.n_after = na;
    d.after = aft;
    d.comm = ccomm;
    if ((st = mf_graph_check(C->ctx, &d)) != MF_OK) {
        if (st == MF_ENOMEM || st == MF_ECANCEL)
            return st;
#ifdef MF_STRICT_CHECKS
        if (st != MF_ECYCLE)
            return mf_set_error(C->ctx, MF_EINTERNAL, "coarse order: contracted graph rejected (status %d)", st);
#endif
        C->ctx->err[0] = '\0'; /* a cycle through ordering edges: no coarse order */
        return MF_OK;
    }
    memset(&o, 0, sizeof o);
    o.max_states = max_states;
    o.fuse = 0;
    o.no_comm_overlap = 1;
    if ((st = mf_plan(C->ctx, &d, &o, &r)) != MF_OK)
        return st;
    *states += r.states;
    for (c = 0; c < nc; c++) {
        int32_t q = r.order[c];
        for (i = mptr[q]; i < mptr[q + 1]; i++)
            order_out[nk++] = members[i];
    }
    mf_plan_result_free(C->ctx, &r);
    *found = 1;
    return MF_OK;
}

int mf_coarse_order(mf_ctx *ctx, mf_arena *a, const mf_graph_desc *g, int64_t max_states, int64_t *states,
                    int32_t *order_out, int *found)
{
    coarse C;
    int32_t k, nc = 0, *cid, *num;
    int topo, st;
    *found = 0;
    if (!g->fusible || g->n_ops < 2)
        return MF_OK;
    memset(&C, 0, sizeof C);
    C.ctx = ctx;
    C.a = a;
    C.g = g;
    C.n = g->n_ops;
    C.nv = g->n_values;
    if ((st = index_graph(&C, &topo)) || !topo)
        return st;
    for (k = C.n - 1; k >= 0; k--)
        join(&C, k);
    cid = (int32_t *)mf_arena_array(ctx, a, (size_t)C.n + 1, sizeof(int32_t));
    num = (int32_t *)mf_arena_array(ctx, a, (size_t)C.n + 1, sizeof(int32_t));
    if (!cid || !num)
        return MF_ENOMEM;
    for (k = 0; k < C.n; k++)
        num[k] = -1;
    for (k = 0; k < C.n; k++) { /* clusters numbered by their first member */
        int32_t r = find(C.par, k);
        if (num[r] < 0)
            num[r] = nc++;
        cid[k] = num[r];
    }
    if (nc == C.n) /* nothing contracted: the plan's own orders already are this one */
        return MF_OK;
    return plan_contracted(&C, nc, cid, max_states, states, order_out, found);
}
