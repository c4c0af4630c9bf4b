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
