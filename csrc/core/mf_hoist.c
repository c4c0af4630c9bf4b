/*
 * mf_hoist.c -- hoists: a local search on a planned order that ends a
 * storage's life before the peak step by running its last reader, and what
 * that reader still waits for, earlier (pipeline stage 6b of mf_sched.c).
 *
 * NOTE [hoists]  The pieces' DPs are exact inside a piece, but a storage
 * whose last reader joins a late piece (a weight gradient that waits for a
 * value recomputed late, say) stays alive across every piece in between,
 * and the windows around the peak step see only a few ops on each side.
 * A hoist moves a set of ops to just before the peak step s: for a storage x
 * live during s, not read by s, not a graph output, with its last reader L
 * after s, the set is L and every ancestor of L placed after s, in their
 * order.  It is possible only when s is not among them; then x is freed
 * before s.  Other storages may live longer (what the moved ops make, what
 * they read that was freed sooner), so every candidate is scored on the whole
 * order by the tracker (the unfused model); the best is kept while it lowers
 * (peak, steps at the peak), for at most MF_HOIST_ROUNDS rounds, each at the
 * new peak step.  The order stays valid: a moved op's ancestors all run
 * before it (those before s stay there, those after s move with it, in
 * order), and an op left after s that depends on a moved op still runs
 * after it.
 */
#include "mf_internal.h"

#include <string.h>

#define MF_HOIST_ROUNDS 64

typedef struct hscore {
    int64_t peak;
    int32_t at_peak, step; /* steps at the peak, the first of them */
} hscore;

static void score_order(mf_tracker *t, const int32_t *order, int32_t n, hscore *sc)
{
    int32_t k;
    mf_tracker_reset(t);
    sc->peak = -1;
    sc->at_peak = 0;
    sc->step = -1;
    for (k = 0; k < n; k++) {
        int64_t d = mf_tracker_apply(t, order[k]);
        if (d > sc->peak) {
            sc->peak = d;
            sc->at_peak = 1;
            sc->step = k;
        } else if (d == sc->peak) {
            sc->at_peak++;
        }
    }
}

static int lower(const hscore *a, const hscore *b)
{
    return a->peak != b->peak ? a->peak < b->peak : a->at_peak < b->at_peak;
}

/* Mark L and its ancestors placed after position ps (mark[op] = stamp).
 * Returns 0 when the op at ps is one of them (no hoist), else 1. */
static int mark_ancestors(const mf_pg *pg, const int32_t *pos, int32_t ps, int32_t L, int32_t *mark,
                          int32_t stamp, int32_t *stack)
{
    int32_t top = 0, j;
    mark[L] = stamp;
    stack[top++] = L;
    while (top > 0) {
        int32_t v = stack[--top];
        for (j = pg->pred_ptr[v]; j < pg->pred_ptr[v + 1]; j++) {
            int32_t p = pg->pred[j];
            if (pos[p] < ps || mark[p] == stamp)
                continue;
            if (pos[p] == ps)
                return 0;
            mark[p] = stamp;
            stack[top++] = p;
        }
    }
    return 1;
}

int mf_hoist_refine(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, int64_t floor, int32_t *order, int32_t *moves)
{
    int32_t n = pg->n, round, k, s;
    int32_t *pos, *mark, *stack, *cand, *best, *first, *last, stamp = 0;
    mf_tracker t;
    hscore cur;
    int st;
    *moves = 0;
    if (n < 3)
        return MF_OK;
    pos = mf_arena_array(ctx, a, (size_t)n, sizeof(int32_t));
    mark = mf_arena_array(ctx, a, (size_t)n, sizeof(int32_t));
    stack = mf_arena_array(ctx, a, (size_t)n, sizeof(int32_t));
    cand = mf_arena_array(ctx, a, (size_t)n, sizeof(int32_t));
    best = mf_arena_array(ctx, a, (size_t)n, sizeof(int32_t));
    first = mf_arena_array(ctx, a, (size_t)pg->ns + 1, sizeof(int32_t));
    last = mf_arena_array(ctx, a, (size_t)pg->ns + 1, sizeof(int32_t));
    if (!pos || !mark || !stack || !cand || !best || !first || !last)
        return MF_ENOMEM;
    if ((st = mf_tracker_init(ctx, a, pg, &t)))
        return st;
    for (k = 0; k < n; k++)
        mark[k] = -1;
    score_order(&t, order, n, &cur);
    if (cur.peak <= floor)
        return MF_OK; /* proven optimal: nothing to gain */
    for (round = 0; round < MF_HOIST_ROUNDS && cur.step >= 0; round++) {
        int32_t ps = cur.step, op_s = order[ps];
        hscore bsc = cur;
        int found = 0;
        if ((st = mf_poll(ctx)))
            return st;
        for (k = 0; k < n; k++)
            pos[order[k]] = k;
        for (s = 0; s < pg->ns; s++) {
            int32_t j;
            first[s] = pos[pg->salloc[s]];
            last[s] = first[s];
            for (j = pg->sread_ptr[s]; j < pg->sread_ptr[s + 1]; j++)
                if (pos[pg->sread[j]] > last[s])
                    last[s] = pos[pg->sread[j]];
        }
        for (s = 0; s < pg->ns; s++) {
            int32_t j, L, c = 0, q;
            hscore sc;
            if (pg->sout[s] || first[s] >= ps || last[s] <= ps)
                continue;
            for (j = pg->oread_ptr[op_s]; j < pg->oread_ptr[op_s + 1]; j++)
                if (pg->oread[j] == s)
                    break;
            if (j < pg->oread_ptr[op_s + 1])
                continue; /* the peak step reads it */
            L = order[last[s]];
            if (!mark_ancestors(pg, pos, ps, L, mark, ++stamp, stack))
                continue;
            memcpy(cand, order, sizeof(int32_t) * (size_t)ps);
            c = ps;
            for (q = ps + 1; q <= last[s]; q++)
                if (mark[order[q]] == stamp)
                    cand[c++] = order[q];
            for (q = ps; q < n; q++)
                if (mark[order[q]] != stamp)
                    cand[c++] = order[q];
            score_order(&t, cand, n, &sc);
            if (lower(&sc, &bsc)) {
                bsc = sc;
                memcpy(best, cand, sizeof(int32_t) * (size_t)n);
                found = 1;
            }
        }
        if (!found)
            break;
        memcpy(order, best, sizeof(int32_t) * (size_t)n);
        cur = bsc;
        (*moves)++;
    }
    return MF_OK;
}

/*
 * NOTE [fused hoists]  The hoists above score the unfused model, whose peak
 * may sit where regions change nothing (the first step of a backward, which
 * reads the incoming gradient, say), while the fused peak is elsewhere: a
 * region late in the order, with storages live across it only because the
 * ops that read them last (a weight gradient's matmul and the recomputed
 * chain feeding it) were left after it, which costs the unfused model
 * nothing.  So a move runs once more on the grouped order, against the fused
 * peak.  Let [i, j) be the first group at the fused peak.  A candidate is a
 * set M of ops after the group, moved in their order to just before it with
 * every ancestor placed after i (none may be in the group):
 *   - for a storage x live across the group, not read by it and not a graph
 *     output: every reader of x after the group;
 *   - for an op after the group whose results are all graph outputs (a
 *     gradient), or that makes nothing: that op.
 * Its gain at the group is what M frees before it (storages allocated before
 * i, not outputs, whose every reader at or after i is in M) less what M
 * leaves live there (its storages read outside M, or outputs).  The
 * MF_HOIST_FUSED_TRIES candidates of largest gain are regrouped in full
 * (mf_fuse_group) and scored by (fused peak, groups at the peak); the best
 * is kept while that falls, for at most MF_HOIST_FUSED_ROUNDS rounds, and
 * the order of the last strict fall of the fused peak is returned.  A set of
 * more than MF_HOIST_FUSED_MAX ops is not tried, nor one that would raise the
 * order's unfused peak above what the plan had (so what the plan proves of
 * its unfused peak still holds).  They are fusion-aware moves, counted with
 * them and switched off with them.
 */
#define MF_HOIST_FUSED_ROUNDS 16
#define MF_HOIST_FUSED_TRIES 6
#define MF_HOIST_FUSED_MAX 512

/* Fused peak, groups at it and the first of them, by the simulator. */
static int score_groups(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, const int32_t *order, const int32_t *gp,
                        int32_t ng, hscore *sc)
{
    int64_t *step = (int64_t *)mf_arena_array(ctx, a, (size_t)ng + 1, sizeof(int64_t));
    int32_t g;
    int st;
    if (!step)
        return MF_ENOMEM;
    if ((st = mf_pg_simulate(ctx, a, pg, order, gp, ng, &sc->peak, step, NULL)))
        return st;
    sc->at_peak = 0;
    sc->step = -1;
    for (g = 0; g < ng; g++)
        if (step[g] == sc->peak && sc->at_peak++ == 0)
            sc->step = g;
    return MF_OK;
}

typedef struct fh_ws {
    const mf_pg *pg;
    int32_t n, i, j;
    const int32_t *order;
    int32_t *pos, *mark, *stack, *sst; /* sst: per storage stamp */
    int32_t stamp;
} fh_ws;

/* Mark M: the seeds (ops at >= j) and their ancestors at > i, with a new
 * stamp.  The number of ops marked, or -1 when one is in [i, j) or there
 * are more than MF_HOIST_FUSED_MAX. */
static int32_t mark_set(fh_ws *W, const int32_t *seeds, int32_t n_seeds)
{
    const mf_pg *pg = W->pg;
    int32_t top = 0, cnt = 0, k, j;
    W->stamp++;
    for (k = 0; k < n_seeds; k++)
        if (W->mark[seeds[k]] != W->stamp) {
            W->mark[seeds[k]] = W->stamp;
            W->stack[top++] = seeds[k];
            cnt++;
        }
    while (top > 0) {
        int32_t v = W->stack[--top];
        for (j = pg->pred_ptr[v]; j < pg->pred_ptr[v + 1]; j++) {
            int32_t p = pg->pred[j], pp = W->pos[p];
            if (pp < W->i || W->mark[p] == W->stamp)
                continue;
            if (pp < W->j || ++cnt > MF_HOIST_FUSED_MAX)
                return -1;
            W->mark[p] = W->stamp;
            W->stack[top++] = p;
        }
    }
    return cnt;
}

/* Gain at the group of moving the marked set (NOTE [fused hoists]). */
static int64_t set_gain(fh_ws *W)
{
    const mf_pg *pg = W->pg;
    int32_t q, k, r;
    int64_t gain = 0;
    for (q = W->j; q < W->n; q++) {
        int32_t v = W->order[q];
        if (W->mark[v] != W->stamp)
            continue;
        for (k = pg->oalloc_ptr[v]; k < pg->oalloc_ptr[v + 1]; k++) {
            int32_t s = pg->oalloc[k], out = pg->sout[s];
            for (r = pg->sread_ptr[s]; r < pg->sread_ptr[s + 1] && !out; r++)
                out = W->mark[pg->sread[r]] != W->stamp;
            if (out)
                gain -= pg->sbytes[s];
        }
        for (k = pg->oread_ptr[v]; k < pg->oread_ptr[v + 1]; k++) {
            int32_t s = pg->oread[k], kept = 0;
            if (W->sst[s] == W->stamp || pg->sout[s] || W->pos[pg->salloc[s]] >= W->i)
                continue;
            W->sst[s] = W->stamp;
            for (r = pg->sread_ptr[s]; r < pg->sread_ptr[s + 1] && !kept; r++)
                kept = W->pos[pg->sread[r]] >= W->i && W->mark[pg->sread[r]] != W->stamp;
            if (!kept)
                gain += pg->sbytes[s];
        }
    }
    return gain;
}

int mf_hoist_fused(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, int fuse, int64_t unfused_cap, int32_t *order,
                   int32_t *group_ptr, int32_t *n_groups, int64_t *peak, int32_t *moves)
{
    int32_t n = pg->n, round, s, k, nseed, done = 0, kept = 0, kept_ng = *n_groups;
    int32_t *cand, *seeds, *gp2, *best, *best_gp, *top_kind, *top_id, *kept_ord, *kept_gp, best_ng = 0;
    int64_t *top_gain, kept_peak = *peak;
    mf_tracker tr;
    fh_ws W;
    hscore cur;
    int st = MF_OK;
    *moves = 0;
    if (n < 3 || !fuse)
        return MF_OK;
    if ((st = mf_tracker_init(ctx, a, pg, &tr)))
        return st;
    memset(&W, 0, sizeof W);
    W.pg = pg;
    W.n = n;
    W.order = order;
    W.pos = mf_arena_array(ctx, a, (size_t)n, sizeof(int32_t));
    W.mark = mf_arena_array(ctx, a, (size_t)n, sizeof(int32_t));
    W.stack = mf_arena_array(ctx, a, (size_t)n, sizeof(int32_t));
    W.sst = mf_arena_array(ctx, a, (size_t)pg->ns + 1, sizeof(int32_t));
    cand = mf_arena_array(ctx, a, (size_t)n, sizeof(int32_t));
    seeds = mf_arena_array(ctx, a, (size_t)n, sizeof(int32_t));
    best = mf_arena_array(ctx, a, (size_t)n, sizeof(int32_t));
    gp2 = mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    best_gp = mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    top_kind = mf_arena_array(ctx, a, MF_HOIST_FUSED_TRIES, sizeof(int32_t));
    top_id = mf_arena_array(ctx, a, MF_HOIST_FUSED_TRIES, sizeof(int32_t));
    top_gain = mf_arena_array(ctx, a, MF_HOIST_FUSED_TRIES, sizeof(int64_t));
    kept_ord = mf_arena_array(ctx, a, (size_t)n, sizeof(int32_t));
    kept_gp = mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    if (!W.pos || !W.mark || !W.stack || !W.sst || !cand || !seeds || !best || !gp2 || !best_gp || !top_kind ||
        !top_id || !top_gain || !kept_ord || !kept_gp)
        return MF_ENOMEM;
    memcpy(kept_ord, order, sizeof(int32_t) * (size_t)n);
    memcpy(kept_gp, group_ptr, sizeof(int32_t) * ((size_t)*n_groups + 1));
    for (k = 0; k < n; k++)
        W.mark[k] = -1;
    for (s = 0; s < pg->ns; s++)
        W.sst[s] = -1;
    for (round = 0; round < MF_HOIST_FUSED_ROUNDS && st == MF_OK; round++) {
        mf_arena tmp = {NULL};
        hscore bsc;
        int32_t nt = 0, t, found = 0, kind;
        if ((st = mf_poll(ctx)) || (st = score_groups(ctx, &tmp, pg, order, group_ptr, *n_groups, &cur))) {
            mf_arena_release(ctx, &tmp);
            break;
        }
        bsc = cur;
        W.i = group_ptr[cur.step];
        W.j = group_ptr[cur.step + 1];
        for (k = 0; k < n; k++)
            W.pos[order[k]] = k;
        /* kind 0: the readers after the group of storage id; kind 1: op id */
        for (kind = 0; kind < 2; kind++) {
            int32_t lim = kind ? n : pg->ns, id;
            for (id = 0; id < lim; id++) {
                int32_t q, x, ok = 1;
                int64_t g;
                nseed = 0;
                if (kind == 0) {
                    if (pg->sout[id] || W.pos[pg->salloc[id]] >= W.i)
                        continue;
                    for (q = pg->sread_ptr[id]; q < pg->sread_ptr[id + 1] && ok; q++) {
                        int32_t p = W.pos[pg->sread[q]];
                        ok = p < W.i || p >= W.j;
                        if (p >= W.j)
                            seeds[nseed++] = pg->sread[q];
                    }
                } else {
                    if (W.pos[id] < W.j)
                        continue;
                    for (q = pg->oalloc_ptr[id]; q < pg->oalloc_ptr[id + 1] && ok; q++)
                        ok = pg->sout[pg->oalloc[q]];
                    seeds[nseed++] = id;
                }
                if (!ok || nseed == 0 || mark_set(&W, seeds, nseed) < 0 || (g = set_gain(&W)) <= 0)
                    continue;
                for (x = nt; x > 0 && top_gain[x - 1] < g; x--)
                    if (x < MF_HOIST_FUSED_TRIES) {
                        top_gain[x] = top_gain[x - 1];
                        top_kind[x] = top_kind[x - 1];
                        top_id[x] = top_id[x - 1];
                    }
                if (x < MF_HOIST_FUSED_TRIES) {
                    top_gain[x] = g;
                    top_kind[x] = kind;
                    top_id[x] = id;
                }
                if (nt < MF_HOIST_FUSED_TRIES)
                    nt++;
            }
        }
        for (t = 0; t < nt && st == MF_OK; t++) {
            int32_t q, c, ng2 = 0, id = top_id[t];
            int64_t pk2;
            hscore sc;
            nseed = 0;
            if (top_kind[t] == 0) {
                for (q = pg->sread_ptr[id]; q < pg->sread_ptr[id + 1]; q++)
                    if (W.pos[pg->sread[q]] >= W.j)
                        seeds[nseed++] = pg->sread[q];
            } else {
                seeds[nseed++] = id;
            }
            if (mark_set(&W, seeds, nseed) < 0)
                continue;
            memcpy(cand, order, sizeof(int32_t) * (size_t)W.i);
            c = W.i;
            for (q = W.j; q < n; q++)
                if (W.mark[order[q]] == W.stamp)
                    cand[c++] = order[q];
            for (q = W.i; q < n; q++)
                if (W.mark[order[q]] != W.stamp)
                    cand[c++] = order[q];
            if (mf_tracker_peak(&tr, cand, n) > unfused_cap)
                continue; /* the unfused peak stays what the plan proved */
            if ((st = mf_fuse_group(ctx, &tmp, pg, cand, fuse, 0, gp2, &ng2, &pk2)))
                break;
            if (pk2 > bsc.peak)
                continue;
            if ((st = score_groups(ctx, &tmp, pg, cand, gp2, ng2, &sc)))
                break;
            if (lower(&sc, &bsc)) {
                bsc = sc;
                memcpy(best, cand, sizeof(int32_t) * (size_t)n);
                memcpy(best_gp, gp2, sizeof(int32_t) * ((size_t)ng2 + 1));
                best_ng = ng2;
                found = 1;
            }
        }
        mf_arena_release(ctx, &tmp);
        if (st || !found)
            break;
        memcpy(order, best, sizeof(int32_t) * (size_t)n);
        memcpy(group_ptr, best_gp, sizeof(int32_t) * ((size_t)best_ng + 1));
        *n_groups = best_ng;
        done++;
        if (bsc.peak < kept_peak) { /* a strict fall: the state kept */
            kept_peak = bsc.peak;
            kept = done;
            kept_ng = best_ng;
            memcpy(kept_ord, order, sizeof(int32_t) * (size_t)n);
            memcpy(kept_gp, group_ptr, sizeof(int32_t) * ((size_t)best_ng + 1));
        }
    }
    /* moves after the last strict fall (fewer groups at the same peak only)
     * are dropped, as fusion-aware moves drop theirs */
    memcpy(order, kept_ord, sizeof(int32_t) * (size_t)n);
    memcpy(group_ptr, kept_gp, sizeof(int32_t) * ((size_t)kept_ng + 1));
    *n_groups = kept_ng;
    *peak = kept_peak;
    *moves = kept;
    return st;
}
