/*
 * mf_comm.c -- collective-aware placement of a planned schedule.
 *
 * NOTE [collective overlap]
 * An asynchronous collective (comm[k] == MF_COMM_ISSUE: all_reduce,
 * all_gather, reduce_scatter ...) starts communication that proceeds while
 * later steps compute, until the op that waits on its future
 * (MF_COMM_WAIT).  The more compute between the two, the more of the
 * communication is hidden.  The planner (mf_sched.c) minimizes the peak and
 * is indifferent to where a collective sits, so on its own it can issue a
 * gradient's all_reduce later than the input (Thunder's) order did.  This
 * pass runs on the final plan, order and fusion groups, and moves only the
 * steps holding a collective or a wait (each is a step of its own: such ops
 * are never fused, mf_graph.c); every other step keeps its grouping and
 * relative order, except for the pull in rule 2.
 *
 * Rules, in this order:
 *  1. Collectives, in their input order (mf_build_preds chains them, so
 *     every rank issues the same sequence, whatever the plan), each issued
 *     as early as its inputs allow: the collective moves to an insertion
 *     point q, and the steps holding its ancestors that lie between q and
 *     its old position move with it, before it and in their order ("cone
 *     pull"); the steps passed over keep their order.  Valid because a
 *     pulled step's predecessors are ancestors too.  The candidates are the
 *     positions of the steps that are not ancestors (at the earliest, the
 *     collective runs right after its last ancestor); the earliest one that
 *     keeps the bound wins.  It is found by bisection, which assumes that
 *     pulling less never costs more; every candidate is scored anyway, so
 *     where that fails the collective is only issued later than it could be,
 *     never above the bound.  A collective whose inputs are ready just moves
 *     up to its last predecessor (the insertion points after it pull nothing).
 *  2. Waits, in input order: each moves to just before the first step that
 *     reads its result (to the end if none does), or as late before that as
 *     keeps the bound; waits that end up side by side keep their input order.
 *
 * The bound (what may be traded): a candidate is kept only if its peak with
 * groups is at or below the plan's, its peak without groups at or below the
 * plan's unfused peak, and the first not above the second (the invariants
 * mf_plan reports).  So overlap never costs memory beyond the plan that
 * ignores it, and that plan is never above the input order's peak: an early
 * issue whose result buffer (an all_reduce's clone, an all_gather's output)
 * would raise the peak is issued later, where it fits.  Every candidate is
 * scored by the one simulator (mf_pg_simulate for the groups, the tracker
 * without); a budget of op and edge visits bounds the pass, and what is left
 * when it runs out stays as planned.
 */
#include "mf_internal.h"

#include <string.h>

/* op and edge visits spent on scoring candidates (bounds the pass's time) */
#define COMM_BUDGET 40000000LL

typedef struct comm_ws {
    mf_ctx *ctx;
    const mf_pg *pg;
    mf_tracker tr;
    int32_t n, m;
    int32_t *base, *gptr0; /* the planned order and its group offsets */
    int32_t *st, *cand;    /* m: group ids in schedule order; a candidate */
    int32_t *pos;          /* m: group -> position in st */
    int32_t *opg;          /* n: op -> group */
    int32_t *ord, *gp;     /* n, m + 1: a schedule written out */
    int32_t *scratch;      /* n */
    uint8_t *anc;          /* m */
    int32_t *queue;        /* m */
    int64_t bound_f, bound_u, peak_f, peak_u, budget;
} comm_ws;

static int32_t glen(const comm_ws *w, int32_t g)
{
    return w->gptr0[g + 1] - w->gptr0[g];
}

static void write_out(comm_ws *w, const int32_t *st, int32_t *ord, int32_t *gp)
{
    int32_t i, k = 0;
    for (i = 0; i < w->m; i++) {
        int32_t g = st[i], l = glen(w, g);
        gp[i] = k;
        memcpy(ord + k, w->base + w->gptr0[g], sizeof(int32_t) * (size_t)l);
        k += l;
    }
    gp[w->m] = k;
}

/* Score w->cand: *ok when it keeps the bound, with its peaks. */
static int score_cand(comm_ws *w, int *ok, int64_t *pf_out, int64_t *pu_out)
{
    mf_arena loc = {NULL};
    int64_t pf = 0, pu;
    int st;
    *ok = 0;
    write_out(w, w->cand, w->ord, w->gp);
    if (!mf_pg_order_valid(w->pg, w->ord, w->scratch))
        return mf_set_error(w->ctx, MF_EINTERNAL, "collective placement produced an invalid order");
    st = mf_pg_simulate(w->ctx, &loc, w->pg, w->ord, w->gp, w->m, &pf, NULL, NULL);
    mf_arena_release(w->ctx, &loc);
    if (st)
        return st;
    pu = mf_tracker_peak(&w->tr, w->ord, w->n);
    w->budget -= 3 * ((int64_t)w->n + w->pg->pred_ptr[w->n]);
    *ok = pf <= w->bound_f && pu <= w->bound_u && pf <= pu;
    *pf_out = pf;
    *pu_out = pu;
    return MF_OK;
}

/* Make w->cand (scored: peaks pf, pu) the schedule. */
static void commit(comm_ws *w, int64_t pf, int64_t pu)
{
    int32_t i;
    memcpy(w->st, w->cand, sizeof(int32_t) * (size_t)w->m);
    for (i = 0; i < w->m; i++)
        w->pos[w->st[i]] = i;
    w->peak_f = pf;
    w->peak_u = pu;
}

/* Candidate of rule 2: the step at position `from` moved to position `to`. */
static void cand_move(comm_ws *w, int32_t from, int32_t to)
{
    int32_t g = w->st[from];
    memcpy(w->cand, w->st, sizeof(int32_t) * (size_t)w->m);
    if (to < from)
        memmove(w->cand + to + 1, w->st + to, sizeof(int32_t) * (size_t)(from - to));
    else
        memmove(w->cand + from, w->st + from + 1, sizeof(int32_t) * (size_t)(to - from));
    w->cand[to] = g;
}

/* Mark in w->anc the groups holding an ancestor of group g. */
static void mark_ancestors(comm_ws *w, int32_t g)
{
    const mf_pg *pg = w->pg;
    int32_t head = 0, tail = 0, j, k;
    memset(w->anc, 0, (size_t)w->m);
    w->queue[tail++] = g;
    while (head < tail) {
        int32_t h = w->queue[head++];
        for (k = w->gptr0[h]; k < w->gptr0[h + 1]; k++) {
            int32_t op = w->base[k];
            for (j = pg->pred_ptr[op]; j < pg->pred_ptr[op + 1]; j++) {
                int32_t u = w->opg[pg->pred[j]];
                if (u != g && !w->anc[u]) {
                    w->anc[u] = 1;
                    w->queue[tail++] = u;
                }
            }
        }
    }
}

/* Candidate of rule 1: group g (at position P) inserted at q, the
 * ancestors among st[q..P) before it. */
static void cand_pull(comm_ws *w, int32_t g, int32_t q)
{
    int32_t P = w->pos[g], i, k = q;
    memcpy(w->cand, w->st, sizeof(int32_t) * (size_t)q);
    for (i = q; i < P; i++)
        if (w->anc[w->st[i]])
            w->cand[k++] = w->st[i];
    w->cand[k++] = g;
    for (i = q; i < P; i++)
        if (!w->anc[w->st[i]])
            w->cand[k++] = w->st[i];
    memcpy(w->cand + k, w->st + P + 1, sizeof(int32_t) * (size_t)(w->m - P - 1));
}

/* Rule 1 for the collective in group g; *moved when it was issued earlier. */
static int issue_early(comm_ws *w, int32_t g, int *moved)
{
    int32_t P = w->pos[g], nL = 0, i, lo, hi, best = -1;
    int64_t bf = 0, bu = 0, pf, pu;
    int st, ok;
    *moved = 0;
    mark_ancestors(w, g);
    for (i = 0; i < P; i++) /* insertion points: the steps that are not ancestors */
        if (!w->anc[w->st[i]])
            w->queue[nL++] = i;
    lo = 0;
    hi = nL; /* nL: stay (always within the bound) */
    while (lo < hi && w->budget > 0) {
        int32_t mid = lo + (hi - lo) / 2;
        cand_pull(w, g, w->queue[mid]);
        if ((st = score_cand(w, &ok, &pf, &pu)))
            return st;
        if (ok) {
            best = hi = mid;
            bf = pf;
            bu = pu;
        } else {
            lo = mid + 1;
        }
    }
    if (best < 0)
        return MF_OK;
    cand_pull(w, g, w->queue[best]);
    commit(w, bf, bu);
    *moved = 1;
    return MF_OK;
}

int mf_comm_place(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, const uint8_t *comm, int32_t *order,
                  int32_t *group_ptr, int32_t n_groups, int64_t *peak_fused, int64_t *peak_unfused,
                  int32_t *moves)
{
    comm_ws w;
    int32_t n = pg->n, m = n_groups, k, i, j, any = 0;
    int st, ok, moved;
    int64_t pf, pu;
    *moves = 0;
    if (!comm)
        return MF_OK;
    for (k = 0; k < n && !any; k++)
        any = comm[k] != MF_COMM_NONE;
    if (!any)
        return MF_OK;
    memset(&w, 0, sizeof w);
    w.ctx = ctx;
    w.pg = pg;
    w.n = n;
    w.m = m;
    w.base = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    w.gptr0 = (int32_t *)mf_arena_array(ctx, a, (size_t)m + 1, sizeof(int32_t));
    w.st = (int32_t *)mf_arena_array(ctx, a, (size_t)m + 1, sizeof(int32_t));
    w.cand = (int32_t *)mf_arena_array(ctx, a, (size_t)m + 1, sizeof(int32_t));
    w.pos = (int32_t *)mf_arena_array(ctx, a, (size_t)m + 1, sizeof(int32_t));
    w.opg = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    w.ord = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    w.gp = (int32_t *)mf_arena_array(ctx, a, (size_t)m + 1, sizeof(int32_t));
    w.scratch = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    w.anc = (uint8_t *)mf_arena_array(ctx, a, (size_t)m + 1, 1);
    w.queue = (int32_t *)mf_arena_array(ctx, a, (size_t)m + 1, sizeof(int32_t));
    if (!w.base || !w.gptr0 || !w.st || !w.cand || !w.pos || !w.opg || !w.ord || !w.gp || !w.scratch || !w.anc ||
        !w.queue)
        return MF_ENOMEM;
    if ((st = mf_tracker_init(ctx, a, pg, &w.tr)))
        return st;
    memcpy(w.base, order, sizeof(int32_t) * (size_t)n);
    memcpy(w.gptr0, group_ptr, sizeof(int32_t) * ((size_t)m + 1));
    for (i = 0; i < m; i++) {
        w.st[i] = w.pos[i] = i;
        for (k = group_ptr[i]; k < group_ptr[i + 1]; k++)
            w.opg[order[k]] = i;
    }
    w.bound_f = w.peak_f = *peak_fused;
    w.bound_u = w.peak_u = *peak_unfused;
    w.budget = COMM_BUDGET;

    /* rule 1: collectives, in their (input) order */
    for (k = 0; k < n && w.budget > 0; k++) {
        if (comm[k] != MF_COMM_ISSUE || glen(&w, w.opg[k]) != 1)
            continue;
        if ((st = issue_early(&w, w.opg[k], &moved)))
            return st;
        *moves += moved;
    }
    /* rule 2: waits, in input order */
    for (k = 0; k < n && w.budget > 0; k++) {
        int32_t g = w.opg[k], p, hi = m - 1, t;
        if (comm[k] != MF_COMM_WAIT || glen(&w, g) != 1)
            continue;
        p = w.pos[g];
        for (j = pg->succ_ptr[k]; j < pg->succ_ptr[k + 1]; j++)
            if (w.pos[w.opg[pg->succ[j]]] - 1 < hi)
                hi = w.pos[w.opg[pg->succ[j]]] - 1;
        for (t = hi; t > p && w.budget > 0; t--) {
            cand_move(&w, p, t);
            if ((st = score_cand(&w, &ok, &pf, &pu)))
                return st;
            if (ok) {
                commit(&w, pf, pu);
                ++*moves;
                break;
            }
        }
    }
    if (*moves) {
        write_out(&w, w.st, order, group_ptr);
        *peak_fused = w.peak_f;
        *peak_unfused = w.peak_u;
    }
    return MF_OK;
}
