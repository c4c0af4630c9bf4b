/*
 * mf_sim.c -- the simulator: NOTE [cost model] in mf_core.h, exactly.
 *
 * Two implementations that agree on valid orders (tests check it):
 *  - mf_pg_simulate: any permutation, any grouping, O(n + E).  A storage is
 *    allocated at the step (group) g_a of its allocating op and freed after
 *    step max(g_a, last reading step), or never when an alias is a graph
 *    output.  For an unread storage that is "right after the op producing
 *    it".  The public mf_simulate accepts valid orders only
 *    (mf_pg_order_check); internally any permutation is scored by the same
 *    deterministic rule.  A group of one op is
 *    an unfused step (counts every storage it allocates); a larger group
 *    counts the storages it allocates that are graph outputs or are read by
 *    some op outside the group, or are stored inner values (mf_fuse.c NOTE
 *    [stored inner values]) unless the group is an epilogue pair, less its
 *    reuse credit (mf_credit.c NOTE [reuse credit]).
 *  - mf_tracker: op-at-a-time live bytes for valid orders, with undo, used by
 *    the scheduler to score candidates without allocating.
 */
#include "mf_internal.h"

#include <string.h>

/* The groups of a grouping: grp[op] its group, gsize[group] its ops, pair[group] an epilogue pair;
 * group_ptr NULL: every op alone (n_groups ignored).  Checks the grouping and that order is a
 * permutation of pg's ops. */
typedef struct groups_of {
    int32_t *grp, *gsize, n_groups;
    uint8_t *pair;
} groups_of;

static int index_groups(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, const int32_t *order, const int32_t *group_ptr,
                        int32_t n_groups, groups_of *G)
{
    int32_t n = pg->n, i, j, k;
    if (!group_ptr)
        n_groups = n;
    if (n_groups < 0)
        return mf_set_error(ctx, MF_EINVAL, "n_groups is negative (%d)", (int)n_groups);
    if (group_ptr) {
        if (group_ptr[0] != 0)
            return mf_set_error(ctx, MF_EINVAL, "group_ptr[0] is %d, expected 0", (int)group_ptr[0]);
        for (i = 0; i < n_groups; i++)
            if (group_ptr[i + 1] <= group_ptr[i])
                return mf_set_error(ctx, MF_EINVAL, "group_ptr: group %d is %s", (int)i,
                                    group_ptr[i + 1] < group_ptr[i] ? "of negative length" : "empty");
        if (group_ptr[n_groups] != n)
            return mf_set_error(ctx, MF_EINVAL, "group_ptr[%d] is %d, expected n_ops = %d", (int)n_groups,
                                (int)group_ptr[n_groups], (int)n);
    }
    G->n_groups = n_groups;
    G->grp = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    G->gsize = (int32_t *)mf_arena_array(ctx, a, (size_t)n_groups + 1, sizeof(int32_t));
    G->pair = (uint8_t *)mf_arena_array(ctx, a, (size_t)n_groups + 1, 1);
    if (!G->grp || !G->gsize || !G->pair)
        return MF_ENOMEM;
    for (k = 0; k < n; k++)
        G->grp[k] = -1;
    for (i = 0; i < n_groups; i++) {
        int32_t lo = group_ptr ? group_ptr[i] : i, hi = group_ptr ? group_ptr[i + 1] : i + 1;
        G->gsize[i] = hi - lo;
        for (j = lo; j < hi; j++) {
            int32_t v = order[j];
            if (v < 0 || v >= n)
                return mf_set_error(ctx, MF_EINVAL, "order[%d] = %d is out of range [0, %d)", (int)j, (int)v,
                                    (int)n);
            if (G->grp[v] >= 0)
                return mf_set_error(ctx, MF_EINVAL, "order is not a permutation: op %d appears twice", (int)v);
            G->grp[v] = i;
        }
        G->pair[i] = (uint8_t)(hi - lo == 2 && pg->epi[order[lo + 1]] == order[lo]);
    }
    return MF_OK;
}

/* NOTE [cost model]: is storage s stored while the group allocating it runs (a group of one op, a
 * graph output, read by another group, or a stored inner value outside an epilogue pair)?  *last:
 * the last group that reads it, or its own where none later does. */
static int stored_in_group(const mf_pg *pg, const groups_of *G, int32_t s, int32_t *last)
{
    int32_t ag = G->grp[pg->salloc[s]], minr = G->n_groups, maxr = -1, j;
    for (j = pg->sread_ptr[s]; j < pg->sread_ptr[s + 1]; j++) {
        int32_t r = G->grp[pg->sread[j]];
        if (r < minr)
            minr = r;
        if (r > maxr)
            maxr = r;
    }
    *last = maxr > ag ? maxr : ag;
    return G->gsize[ag] == 1 || pg->sout[s] || minr < ag || maxr > ag || (pg->smat[s] && !G->pair[ag]);
}

int mf_pg_simulate(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, const int32_t *order,
                   const int32_t *group_ptr, int32_t n_groups, int64_t *peak_out,
                   int64_t *step_bytes, int64_t *live_after)
{
    int32_t n = pg->n, i, s, j;
    int32_t *pos, *apos, *lastpos;
    int64_t *diff, *cnt, peak = 0, live = 0;
    groups_of G;
    mf_credit cr;
    int st;

    if ((st = index_groups(ctx, a, pg, order, group_ptr, n_groups, &G)) != MF_OK)
        return st;
    n_groups = G.n_groups;
    diff = (int64_t *)mf_arena_array(ctx, a, (size_t)n_groups + 2, sizeof(int64_t));
    cnt = (int64_t *)mf_arena_array(ctx, a, (size_t)n_groups + 1, sizeof(int64_t));
    pos = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    apos = (int32_t *)mf_arena_array(ctx, a, (size_t)pg->ns + 1, sizeof(int32_t));
    lastpos = (int32_t *)mf_arena_array(ctx, a, (size_t)pg->ns + 1, sizeof(int32_t));
    if (!diff || !cnt || !pos || !apos || !lastpos || mf_credit_init(ctx, a, pg, &cr))
        return MF_ENOMEM;
    for (s = 0; s < pg->ns; s++) {
        int32_t ag = G.grp[pg->salloc[s]], last, fx;
        int64_t b = pg->sbytes[s];
        if (stored_in_group(pg, &G, s, &last))
            cnt[ag] += b;
        fx = pg->sout[s] ? n_groups : last; /* gone from live_after[fx] */
        diff[ag] += b;
        diff[fx] -= b;
    }
    /* mf_credit.c NOTE [reuse credit], by positions in order */
    for (j = 0; j < n; j++)
        pos[order[j]] = j;
    cr.pos = pos;
    for (s = 0; s < pg->ns; s++) {
        apos[s] = pos[pg->salloc[s]];
        lastpos[s] = -1;
        for (j = pg->sread_ptr[s]; j < pg->sread_ptr[s + 1]; j++)
            if (pos[pg->sread[j]] > lastpos[s])
                lastpos[s] = pos[pg->sread[j]];
    }
    for (i = 0; i < n_groups; i++)
        if (G.gsize[i] > 1 && !G.pair[i])
            cnt[i] -= mf_group_credit(&cr, order, apos, lastpos, group_ptr[i], group_ptr[i + 1]);
    for (i = 0; i < n_groups; i++) {
        int64_t during = live + cnt[i];
        live += diff[i];
        if (during > peak)
            peak = during;
        if (step_bytes)
            step_bytes[i] = during;
        if (live_after)
            live_after[i] = live;
    }
    *peak_out = peak;
    return MF_OK;
}

int mf_simulate(mf_ctx *ctx, const mf_graph_desc *g, const int32_t *order, const int32_t *group_ptr,
                int32_t n_groups, int64_t *peak_out, int64_t *step_bytes, int64_t *live_after)
{
    mf_arena a = {NULL};
    mf_pg pg;
    int st;
    *peak_out = 0;
    st = mf_graph_check(ctx, g);
    if (st)
        return st;
    if (!order && g->n_ops > 0)
        return mf_set_error(ctx, MF_EINVAL, "order is NULL");
    st = mf_pg_build(ctx, &a, g, &pg);
    if (!st)
        st = mf_pg_order_check(ctx, &a, &pg, order, "order");
    if (!st)
        st = mf_pg_simulate(ctx, &a, &pg, order, group_ptr, n_groups, peak_out, step_bytes, live_after);
    mf_arena_release(ctx, &a);
    return st;
}

/* NOTE [grouped bytes]  Each value's bytes as a grouping of g stores them:
 * 0 for every value of a storage made and read inside one group and not
 * stored there (NOTE [cost model]), else value_bytes[v].  Simulated unfused
 * in the grouping's order, such a graph's steps are its groups' ops, each
 * counting what the group keeps, so its peak step is near the fused peak:
 * what a search that scores by the unfused rule (mf_remat.c) needs to aim at
 * the fused one.  bytes: n_values entries. */
int mf_grouped_bytes(mf_ctx *ctx, const mf_graph_desc *g, const int32_t *order, const int32_t *group_ptr,
                     int32_t n_groups, int64_t *bytes)
{
    mf_arena a = {NULL};
    mf_pg pg;
    groups_of G;
    uint8_t *inner = NULL;
    int32_t s, v, last;
    int st = mf_pg_build(ctx, &a, g, &pg);
    if (!st)
        st = index_groups(ctx, &a, &pg, order, group_ptr, n_groups, &G);
    if (!st && !(inner = (uint8_t *)mf_arena_array(ctx, &a, (size_t)pg.ns + 1, 1)))
        st = MF_ENOMEM;
    for (s = 0; !st && s < pg.ns; s++)
        inner[s] = (uint8_t)!stored_in_group(&pg, &G, s, &last);
    for (v = 0; !st && v < g->n_values; v++)
        bytes[v] = pg.sid[v] >= 0 && inner[pg.sid[v]] ? 0 : g->value_bytes[v];
    mf_arena_release(ctx, &a);
    return st;
}

/* ---- tracker ---- */

int mf_tracker_init(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, mf_tracker *t)
{
    t->pg = pg;
    t->rc = (int32_t *)mf_arena_array(ctx, a, (size_t)pg->ns + 1, sizeof(int32_t));
    t->done = (uint8_t *)mf_arena_array(ctx, a, (size_t)pg->n + 1, 1);
    if (!t->rc || !t->done)
        return MF_ENOMEM;
    mf_tracker_reset(t);
    return MF_OK;
}

void mf_tracker_reset(mf_tracker *t)
{
    const mf_pg *pg = t->pg;
    int32_t s;
    for (s = 0; s < pg->ns; s++)
        t->rc[s] = pg->sread_ptr[s + 1] - pg->sread_ptr[s];
    memset(t->done, 0, (size_t)pg->n);
    t->live = 0;
}

int64_t mf_tracker_apply(mf_tracker *t, int32_t v)
{
    const mf_pg *pg = t->pg;
    int64_t during = t->live + pg->abytes[v];
    int32_t j;
    t->live = during;
    t->done[v] = 1;
    for (j = pg->oread_ptr[v]; j < pg->oread_ptr[v + 1]; j++)
        t->rc[pg->oread[j]]--;
    for (j = pg->otouch_ptr[v]; j < pg->otouch_ptr[v + 1]; j++) {
        int32_t s = pg->otouch[j];
        if (!pg->sout[s] && t->rc[s] == 0 && t->done[pg->salloc[s]])
            t->live -= pg->sbytes[s];
    }
    return during;
}

void mf_tracker_undo(mf_tracker *t, int32_t v)
{
    const mf_pg *pg = t->pg;
    int32_t j;
    t->done[v] = 0;
    for (j = pg->oread_ptr[v]; j < pg->oread_ptr[v + 1]; j++)
        t->rc[pg->oread[j]]++;
}

int64_t mf_tracker_peak(mf_tracker *t, const int32_t *order, int32_t n)
{
    int64_t peak = 0;
    int32_t i;
    mf_tracker_reset(t);
    for (i = 0; i < n; i++) {
        int64_t d = mf_tracker_apply(t, order[i]);
        if (d > peak)
            peak = d;
    }
    return peak;
}
