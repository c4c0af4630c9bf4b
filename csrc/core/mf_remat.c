/*
 * mf_remat.c -- recomputation as a planning move (NOTE [recomputation]): the
 * scoring and the search.  The graphs it works on and the move itself are in
 * mf_remat_graph.c.
 *
 * NOTE [recomputation]  Reordering cannot go below what a graph keeps alive:
 * a value computed early and read again much later holds its storage across
 * every step in between.  When the op producing it is cheap (elementwise, a
 * view, a conversion: the caller's `cheap` flags) it can instead be computed
 * again right before a later reader, from the same inputs, so the first copy
 * dies after its early readers.  The move is a *split*: (storage r, k) runs a
 * copy of r's producer right before r's k-th reader (k >= 1, readers in the
 * planned order), and readers k.. read the copy; readers through views of r
 * get copies of those view ops too (they allocate nothing).  A copy reads the
 * original's inputs, so it may keep them alive longer: every candidate is
 * scored by the simulator's rule on the whole graph, which counts that.
 *
 * Eligible r: the storage root of the only output of a cheap op, not a graph
 * input or output (nor any alias of it), every view of it made by cheap
 * single-output ops, at least two readers that are not such views.  The
 * caller marks nothing cheap that writes memory, reads memory something
 * writes, draws random numbers or has other effects, so a copy computes the
 * same values as the original wherever it runs.
 *
 * Search, on the planned order, every op alone (the unfused model):
 *  - at most MF_REMAT_EXACT candidate splits in the whole graph: every subset
 *    within the budget is scored, the least (peak, steps at the peak, bytes
 *    copied) wins, so on small graphs the choice is exact for this move set;
 *  - otherwise greedy rounds: the peak step s is found; each eligible storage
 *    live across s and not read by s offers one split, at its first reader
 *    after s (the only split that frees it across s); the best is kept while
 *    it lowers (peak, steps at the peak).  A copy is an op like any other,
 *    so later rounds may split the values it reads; each candidate is also
 *    offered with its chain (NOTE [chain splits]).  Each round's candidates
 *    are scored without building their graphs (NOTE [incremental scoring]);
 *    only the kept one is built.
 * The budget bounds the bytes the copies write (views count nothing), the
 * stand-in for their work.  The result is the graph with the copies, its ops
 * renumbered so that the searched order is 0..n-1; the caller plans it again
 * (that order is the planner's baseline candidate, so the plan is never worse
 * than the search) and keeps it only if its peak is lower.
 */
#include "mf_internal.h"

#include <string.h>

#define MF_REMAT_EXACT 10

/* ---- scoring ---- */

typedef struct score {
    int64_t peak;
    int32_t at_peak; /* steps at the peak */
    int32_t step;    /* the first of them */
} score;

/* The unfused simulation of w in its order 0..n-1 (NOTE [cost model]);
 * during and live (n entries each, may be NULL) receive each step's memory
 * and the live bytes after it.  w is a graph this file or mf_remat_graph.c
 * made from a checked one, in a valid order by construction, so it is
 * simulated without mf_simulate's checks of the graph and the order (each
 * chain candidate is scored this way); MF_STRICT_CHECKS builds check both. */
static int score_of(mf_ctx *ctx, const mf_wgraph *w, score *sc, int64_t *during, int64_t *live)
{
    mf_graph_desc d;
    mf_remat_result as_result;
    mf_arena a = {NULL};
    int32_t *order, k;
    int64_t *step;
    int st;
    order = mf_arena_array(ctx, &a, (size_t)w->n + 1, sizeof(int32_t));
    step = during ? during : mf_arena_array(ctx, &a, (size_t)w->n + 1, sizeof(int64_t));
    if (!order || !step) {
        mf_arena_release(ctx, &a);
        return MF_ENOMEM;
    }
    for (k = 0; k < w->n; k++)
        order[k] = k;
    memset(&as_result, 0, sizeof as_result);
    mf_wg_result(w, &as_result);
    mf_remat_result_desc(&as_result, &d);
#ifdef MF_STRICT_CHECKS
    st = mf_simulate(ctx, &d, order, NULL, w->n, &sc->peak, step, live);
#else
    {
        mf_pg pg;
        st = mf_pg_build(ctx, &a, &d, &pg);
        if (st == MF_OK)
            st = mf_pg_simulate(ctx, &a, &pg, order, NULL, w->n, &sc->peak, step, live);
    }
#endif
    if (st == MF_OK) {
        sc->at_peak = 0;
        sc->step = -1;
        for (k = 0; k < w->n; k++)
            if (step[k] == sc->peak) {
                if (sc->step < 0)
                    sc->step = k;
                sc->at_peak++;
            }
    }
    mf_arena_release(ctx, &a);
    return st;
}

static int better(const score *a, int64_t abytes, const score *b, int64_t bbytes)
{
    if (a->peak != b->peak)
        return a->peak < b->peak;
    if (a->at_peak != b->at_peak)
        return a->at_peak < b->at_peak;
    return abytes < bbytes;
}

/* Splits scored the long way: their graph built and simulated. */
static int score_built(mf_ctx *ctx, const mf_wgraph *w, const mf_roots *R, const mf_split *sp, int32_t n_sp,
                       score *sc)
{
    mf_wgraph t;
    int st = mf_apply_splits(ctx, w, R, sp, n_sp, &t);
    if (st == MF_OK) {
        st = score_of(ctx, &t, sc, NULL, NULL);
        mf_wg_free(ctx, &t);
    }
    return st;
}

/*
 * NOTE [incremental scoring]  Splits change the intervals of a few storages
 * only: a split root's first copy is now freed after the last op still
 * reading it (its readers before the first split, the ops making views of
 * it); each copy's storage lives from its copy op to the last reader of its
 * segment; a storage a copy op reads that was freed before it now lives
 * until the last such op.  Every other storage keeps its interval of steps,
 * and the simulator's `during` of a step is the sum of the storages whose
 * interval holds it.  So the score of a set of splits is the current order's
 * step memory plus those intervals' differences: between consecutive ends of
 * the changed intervals the difference is constant, and a segment tree over
 * the steps gives each such run's maximum and how many steps reach it; each
 * inserted copy op counts the live bytes after the step before it plus the
 * differences there.  Positions in the new order are keys: old step t is
 * (t << 32 | INT32_MAX), the j-th op inserted (in mf_apply_splits's order:
 * by the old step they precede, then by split, then by the reader's inputs)
 * is (t << 32 | j), which sorts it after step t - 1 and before step t.  The
 * result equals the simulation of the built graph: MF_STRICT_CHECKS builds
 * compare the two for every candidate, and the kept splits' graph is
 * simulated anyway; should the two ever disagree there, the search scores
 * the rest the long way (an error under MF_STRICT_CHECKS).
 */
#define KEY_OLD(t) (((int64_t)(t) << 32) | INT32_MAX)
#ifdef MF_STRICT_CHECKS
#define MF_REMAT_FALLBACK 0
#else
#define MF_REMAT_FALLBACK 1
#endif

/* A storage whose interval the splits change: old [os, oe], new [ns, ne] (keys). */
typedef struct ichange {
    int64_t os, oe, ns, ne, bytes;
    int32_t root; /* -1: a copy's storage */
} ichange;

typedef struct iscore {
    mf_arena a;             /* everything below */
    const mf_wgraph *w;
    mf_roots R;
    score sc;               /* w's own score */
    int64_t *during, *live; /* n: each step's memory and the live bytes after it */
    int64_t *tmax;          /* 2 * tn: segment tree of during's maximum ... */
    int32_t *tcnt;          /* ... and how many steps reach it */
    int32_t tn;             /* leaves: a power of two >= n */
    int32_t *end;           /* nv, per root: the last step its storage is counted in */
    uint8_t *fixed;         /* nv, per root: a graph input's or output's storage (no split moves it) */
    uint16_t *copied;       /* nv scratch: bit i: split i copies the value */
    int32_t *chg_of;        /* nv scratch: a root's entry in chg, or -1 */
    int32_t *vals;          /* nv: the values copied, to clear */
    int64_t *ins, *bp;      /* the inserted ops' keys; the runs' first steps */
    int32_t *walk;          /* (old step, split) pairs of the segments' readers */
    ichange *chg;
    int32_t n_ins, n_chg, n_vals, cap;
} iscore;

static void top(int64_t *peak, int32_t *count, int64_t v, int32_t c)
{
    if (v > *peak) {
        *peak = v;
        *count = c;
    } else if (v == *peak) {
        *count += c;
    }
}

static void iscore_free(mf_ctx *ctx, iscore *I)
{
    mf_arena_release(ctx, &I->a);
    memset(I, 0, sizeof *I);
}

/* w's roots, its unfused steps and their tree.  The steps come from the
 * storages' intervals, by mf_pg_simulate's rule (a storage counts from the
 * step allocating it through its last reader, to the end when it is an
 * output), which spares each round the checks and the dependency edges of
 * mf_simulate; MF_STRICT_CHECKS builds compare the two. */
static int iscore_init(mf_ctx *ctx, const mf_wgraph *w, iscore *I)
{
    int32_t n = w->n, nv = w->nv, t, v;
    int64_t live = 0, *cnt, *diff;
    mf_arena *a = &I->a;
    int st;
    memset(I, 0, sizeof *I);
    I->w = w;
    if ((st = mf_roots_build(ctx, a, w, &I->R)))
        goto fail;
    for (I->tn = 1; I->tn < n; I->tn *= 2)
        ;
    I->cap = 4 * (nv + 2) + 4 * MF_REMAT_EXACT; /* changes: roots, copies and the storages copies read */
    I->during = mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int64_t));
    I->live = mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int64_t));
    I->tmax = mf_arena_array(ctx, a, 2 * (size_t)I->tn, sizeof(int64_t));
    I->tcnt = mf_arena_array(ctx, a, 2 * (size_t)I->tn, sizeof(int32_t));
    I->end = mf_arena_array(ctx, a, (size_t)nv + 1, sizeof(int32_t));
    I->fixed = mf_arena_array(ctx, a, (size_t)nv + 1, 1);
    I->copied = mf_arena_array(ctx, a, (size_t)nv + 1, sizeof(uint16_t));
    I->chg_of = mf_arena_array(ctx, a, (size_t)nv + 1, sizeof(int32_t));
    I->vals = mf_arena_array(ctx, a, (size_t)nv + 1, sizeof(int32_t));
    I->ins = mf_arena_array(ctx, a, (size_t)nv * MF_REMAT_EXACT + 1, sizeof(int64_t)); /* a split copies each value once */
    I->bp = mf_arena_array(ctx, a, (size_t)I->cap, sizeof(int64_t));
    I->walk = mf_arena_array(ctx, a, 2 * ((size_t)w->in_ptr[n] + 1), sizeof(int32_t));
    I->chg = mf_arena_array(ctx, a, (size_t)nv + MF_REMAT_EXACT + 2, sizeof(ichange));
    cnt = mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int64_t));
    diff = mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int64_t));
    if (!I->during || !I->live || !I->tmax || !I->tcnt || !I->end || !I->fixed || !I->copied || !I->chg_of ||
        !I->vals || !I->ins || !I->bp || !I->walk || !I->chg || !cnt || !diff) {
        st = MF_ENOMEM;
        goto fail;
    }
    for (v = 0; v < nv; v++) {
        I->chg_of[v] = -1;
        if (w->is_input[v] || w->is_output[v])
            I->fixed[I->R.root[v]] = 1;
    }
    for (v = 0; v < nv; v++) {
        int32_t p = I->R.prod[v];
        if (I->R.root[v] != v || p < 0)
            continue;
        I->end[v] = I->fixed[v] ? n - 1 : (I->R.last[v] > p ? I->R.last[v] : p);
        cnt[p] += w->bytes[v];
        diff[p] += w->bytes[v];
        if (!I->fixed[v])
            diff[I->end[v]] -= w->bytes[v];
    }
    for (t = 0; t < I->tn; t++) {
        if (t < n) {
            I->during[t] = live + cnt[t];
            live += diff[t];
            I->live[t] = live;
        }
        I->tmax[I->tn + t] = t < n ? I->during[t] : -1;
        I->tcnt[I->tn + t] = t < n;
    }
    for (t = I->tn - 1; t >= 1; t--) {
        I->tmax[t] = I->tmax[2 * t];
        I->tcnt[t] = I->tcnt[2 * t];
        top(&I->tmax[t], &I->tcnt[t], I->tmax[2 * t + 1], I->tcnt[2 * t + 1]);
    }
    I->sc.peak = n > 0 ? I->tmax[1] : 0;
    I->sc.at_peak = n > 0 ? I->tcnt[1] : 0;
    I->sc.step = -1;
    for (t = 0; t < n && I->sc.step < 0; t++)
        if (I->during[t] == I->sc.peak)
            I->sc.step = t;
#ifdef MF_STRICT_CHECKS
    {
        score full;
        int64_t *step = mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int64_t));
        if (!step) {
            st = MF_ENOMEM;
            goto fail;
        }
        if ((st = score_of(ctx, w, &full, step, NULL)))
            goto fail;
        for (t = 0; t < n; t++)
            if (step[t] != I->during[t]) {
                st = mf_set_error(ctx, MF_EINTERNAL, "recomputation: step %d is %lld, the simulator's %lld",
                                  (int)t, (long long)I->during[t], (long long)step[t]);
                goto fail;
            }
        if (full.peak != I->sc.peak || full.at_peak != I->sc.at_peak || full.step != I->sc.step) {
            st = mf_set_error(ctx, MF_EINTERNAL, "recomputation: the score is not the simulator's");
            goto fail;
        }
    }
#endif
    return MF_OK;
fail:
    iscore_free(ctx, I);
    return st;
}

/* Maximum of during over steps [lo, hi] and how many steps reach it. */
static void range_top(const iscore *I, int32_t lo, int32_t hi, int64_t *peak, int32_t *count)
{
    int32_t l = lo + I->tn, h = hi + I->tn + 1;
    for (; l < h; l /= 2, h /= 2) {
        if (l & 1) {
            top(peak, count, I->tmax[l], I->tcnt[l]);
            l++;
        }
        if (h & 1) {
            h--;
            top(peak, count, I->tmax[h], I->tcnt[h]);
        }
    }
}

/* Root s's storage lives at least until key (its entry made on first use). */
static void extend(iscore *I, int32_t s, int64_t key)
{
    ichange *e;
    if (I->chg_of[s] < 0) {
        e = &I->chg[I->n_chg];
        I->chg_of[s] = I->n_chg++;
        e->os = e->ns = KEY_OLD(I->R.prod[s]);
        e->oe = e->ne = KEY_OLD(I->end[s]);
        e->bytes = I->w->bytes[s];
        e->root = s;
    }
    e = &I->chg[I->chg_of[s]];
    if (key > e->ne)
        e->ne = key;
}

static int64_t delta_at(const iscore *I, int64_t key)
{
    int64_t d = 0;
    int32_t i;
    for (i = 0; i < I->n_chg; i++) {
        const ichange *e = &I->chg[i];
        d += e->bytes * ((e->ns <= key && key <= e->ne) - (e->os <= key && key <= e->oe));
    }
    return d;
}

/* The first old step at or after key, and the last at or before it. */
static int32_t old_from(int64_t key)
{
    return (int32_t)(key >> 32) + ((key & 0xffffffff) > INT32_MAX);
}

static int32_t old_upto(int64_t key)
{
    return (int32_t)(key >> 32) - ((key & 0xffffffff) < INT32_MAX);
}

static int cmp_walk(const int32_t *x, const int32_t *y)
{
    return x[0] != y[0] ? x[0] > y[0] : x[1] > y[1];
}

/* Readers k.. of split i's root up to the next split of that root: [*lo, *hi). */
static void segment(const mf_roots *R, const mf_split *sp, int32_t n_sp, int32_t i, int32_t *lo, int32_t *hi)
{
    int32_t j, r = sp[i].r;
    *lo = sp[i].k;
    *hi = R->rd_ptr[r + 1] - R->rd_ptr[r];
    for (j = 0; j < n_sp; j++)
        if (sp[j].r == r && sp[j].k > *lo && sp[j].k < *hi)
            *hi = sp[j].k;
}

/* The score of the graph with the splits applied (NOTE [incremental scoring]); at most
 * MF_REMAT_EXACT splits, distinct. */
static int score_splits(mf_ctx *ctx, iscore *I, const mf_split *sp, int32_t n_sp, score *sc)
{
    const mf_wgraph *w = I->w;
    const mf_roots *R = &I->R;
    int32_t i, j, q, nw = 0, nb = 0, count = 0, copy0;
    int64_t peak = -1;
    int st = MF_OK;
    I->n_ins = I->n_chg = I->n_vals = 0;
    /* each split root's first copy: read by its readers before its first split and by view ops */
    for (i = 0; i < n_sp; i++) {
        int32_t r = sp[i].r, kmin = sp[i].k, last;
        for (j = 0; j < n_sp; j++)
            if (sp[j].r == r && sp[j].k < kmin)
                kmin = sp[j].k;
        last = R->rd[R->rd_ptr[r] + kmin - 1];
        extend(I, r, -1);
        I->chg[I->chg_of[r]].ne = KEY_OLD(last > R->last_other[r] ? last : R->last_other[r]);
    }
    /* each copy's storage, to the last reader of its segment (its start set below) */
    copy0 = I->n_chg;
    for (i = 0; i < n_sp; i++) {
        int32_t lo, hi;
        ichange *e = &I->chg[I->n_chg++];
        segment(R, sp, n_sp, i, &lo, &hi);
        e->os = INT64_MAX;
        e->oe = -1;
        e->ns = KEY_OLD(R->rd[R->rd_ptr[sp[i].r] + lo]);
        e->ne = KEY_OLD(R->rd[R->rd_ptr[sp[i].r] + hi - 1]);
        e->bytes = w->bytes[sp[i].r];
        e->root = -1;
        for (q = lo; q < hi; q++) {
            I->walk[2 * nw] = R->rd[R->rd_ptr[sp[i].r] + q];
            I->walk[2 * nw++ + 1] = i;
        }
    }
    /* the copy ops, in mf_apply_splits's order: by reader, then by split */
    for (i = 1; i < nw; i++)
        for (j = i; j > 0 && cmp_walk(&I->walk[2 * j - 2], &I->walk[2 * j]); j--) {
            int32_t t0 = I->walk[2 * j - 2], t1 = I->walk[2 * j - 1];
            I->walk[2 * j - 2] = I->walk[2 * j];
            I->walk[2 * j - 1] = I->walk[2 * j + 1];
            I->walk[2 * j] = t0;
            I->walk[2 * j + 1] = t1;
        }
    for (q = 0; q < nw; q++) {
        int32_t op = I->walk[2 * q], sid = I->walk[2 * q + 1], r = sp[sid].r;
        uint16_t bit = (uint16_t)(1u << sid);
        for (j = w->in_ptr[op]; j < w->in_ptr[op + 1]; j++) {
            int32_t x = w->in_idx[j], chain[MF_REMAT_MAX_CHAIN], nc = 0, v;
            if (R->root[x] != r)
                continue;
            for (v = x; v >= 0 && !(I->copied[v] & bit) && nc < MF_REMAT_MAX_CHAIN; v = w->alias_of[v])
                chain[nc++] = v;
            if (nc == MF_REMAT_MAX_CHAIN) {
                st = mf_set_error(ctx, MF_EINVAL, "recomputation: view chain too deep");
                goto done;
            }
            while (nc-- > 0) {
                int32_t y = chain[nc], p = R->prod[y], jj;
                int64_t key = ((int64_t)op << 32) | I->n_ins;
                I->ins[I->n_ins++] = key;
                if (y == r)
                    I->chg[copy0 + sid].ns = key;
                for (jj = w->in_ptr[p]; jj < w->in_ptr[p + 1]; jj++) {
                    int32_t u = w->in_idx[jj];
                    if (!(I->copied[u] & bit) && !I->fixed[R->root[u]]) /* else the copy's own storage */
                        extend(I, R->root[u], key);
                }
                if (!I->copied[y])
                    I->vals[I->n_vals++] = y;
                I->copied[y] |= bit;
            }
        }
    }
    /* runs of old steps with one difference: from the ends of the changed intervals */
    I->bp[nb++] = 0;
    for (i = 0; i < I->n_chg; i++) {
        const ichange *e = &I->chg[i];
        if (e->root >= 0) {
            I->bp[nb++] = old_upto(e->oe) + 1;
        }
        I->bp[nb++] = old_from(e->ns);
        I->bp[nb++] = old_upto(e->ne) + 1;
    }
    for (i = 1; i < nb; i++)
        for (j = i; j > 0 && I->bp[j - 1] > I->bp[j]; j--) {
            int64_t x = I->bp[j - 1];
            I->bp[j - 1] = I->bp[j];
            I->bp[j] = x;
        }
    for (i = 0; i < nb; i++) {
        int32_t lo = (int32_t)I->bp[i], hi = i + 1 < nb ? (int32_t)I->bp[i + 1] - 1 : w->n - 1;
        if (lo < 0)
            lo = 0;
        if (hi >= w->n)
            hi = w->n - 1;
        if (lo <= hi) {
            int64_t m = -1;
            int32_t c = 0;
            range_top(I, lo, hi, &m, &c);
            top(&peak, &count, m + delta_at(I, KEY_OLD(lo)), c);
        }
    }
    for (i = 0; i < I->n_ins; i++)
        top(&peak, &count, I->live[(I->ins[i] >> 32) - 1] + delta_at(I, I->ins[i]), 1);
    sc->peak = peak < 0 ? 0 : peak;
    sc->at_peak = count;
    sc->step = -1;
done:
    for (i = 0; i < I->n_vals; i++)
        I->copied[I->vals[i]] = 0;
    for (i = 0; i < I->n_chg; i++)
        if (I->chg[i].root >= 0)
            I->chg_of[I->chg[i].root] = -1;
    return st;
}

/* Scored both ways under MF_STRICT_CHECKS (NOTE [incremental scoring]). */
static int score_checked(mf_ctx *ctx, iscore *I, const mf_split *sp, int32_t n_sp, int built, score *sc)
{
    int32_t i;
    int st;
    for (i = 0; i < n_sp; i++) /* NOTE [chain splits] are scored the long way */
        built |= sp[i].n_chain > 0;
    st = built ? score_built(ctx, I->w, &I->R, sp, n_sp, sc) : score_splits(ctx, I, sp, n_sp, sc);
#ifdef MF_STRICT_CHECKS
    score full;
    if (st == MF_OK && !built && (st = score_built(ctx, I->w, &I->R, sp, n_sp, &full)) == MF_OK &&
        (full.peak != sc->peak || full.at_peak != sc->at_peak))
        st = mf_set_error(ctx, MF_EINTERNAL, "recomputation: %d splits (%d, %d) .. score (%lld, %d), built (%lld, %d)",
                          (int)n_sp, (int)sp[0].r, (int)sp[0].k, (long long)sc->peak, (int)sc->at_peak,
                          (long long)full.peak, (int)full.at_peak);
#endif
    return st;
}

/* The graph with the kept splits, and its iscore; MF_EINTERNAL when its score is not the
 * predicted one (NOTE [incremental scoring]), *next left empty. */
static int build_kept(mf_ctx *ctx, const iscore *I, const mf_split *sp, int32_t n_sp, const score *want,
                      mf_wgraph *next, iscore *J)
{
    int st = mf_apply_splits(ctx, I->w, &I->R, sp, n_sp, next);
    if (st)
        return st;
    if ((st = iscore_init(ctx, next, J)) == MF_OK && (J->sc.peak != want->peak || J->sc.at_peak != want->at_peak)) {
        iscore_free(ctx, J);
        st = mf_set_error(ctx, MF_EINTERNAL, "recomputation: the kept splits' score is not their graph's");
    }
    if (st)
        mf_wg_free(ctx, next);
    else
        J->w = next;
    return st;
}

/* ---- search ---- */

static int reads_root(const mf_wgraph *w, const mf_roots *R, int32_t op, int32_t r)
{
    int32_t j;
    for (j = w->in_ptr[op]; j < w->in_ptr[op + 1]; j++)
        if (R->root[w->in_idx[j]] == r)
            return 1;
    return 0;
}

/* Every subset of at most MF_REMAT_EXACT candidate splits (NOTE [recomputation]). */
static int search_exact(mf_ctx *ctx, mf_wgraph *cur, iscore *I, const mf_split *cand, int32_t nc, int64_t budget,
                        score *best_sc, int64_t *best_bytes, int32_t *n_used)
{
    mf_split sel[MF_REMAT_EXACT];
    int32_t n, i;
    int st, built = 0;
    score start = *best_sc;
    for (;;) {
        uint32_t mask, best_mask = 0;
        mf_wgraph next;
        iscore J;
        for (mask = 1; mask < (1u << nc); mask++) {
            int64_t bytes = 0;
            score sc;
            for (n = 0, i = 0; i < nc; i++)
                if (mask & (1u << i)) {
                    sel[n++] = cand[i];
                    bytes += cand[i].bytes;
                }
            if (bytes > budget)
                continue;
            if (ctx->cancel && ctx->cancel(ctx->cancel_ud))
                return mf_set_error(ctx, MF_ECANCEL, "cancelled");
            if ((st = score_checked(ctx, I, sel, n, built, &sc)))
                return st;
            if (better(&sc, bytes, best_sc, *best_bytes)) {
                *best_sc = sc;
                *best_bytes = bytes;
                best_mask = mask;
            }
        }
        if (!best_mask)
            return MF_OK;
        for (n = 0, i = 0; i < nc; i++)
            if (best_mask & (1u << i))
                sel[n++] = cand[i];
        st = build_kept(ctx, I, sel, n, best_sc, &next, &J);
        if (st == MF_EINTERNAL && MF_REMAT_FALLBACK && !built) {
            built = 1; /* NOTE [incremental scoring]: once more, the long way */
            *best_sc = start;
            *best_bytes = 0;
            continue;
        }
        if (st)
            return st;
        *best_sc = J.sc;
        iscore_free(ctx, &J);
        mf_wg_free(ctx, cur);
        *cur = next;
        *n_used = n;
        return MF_OK;
    }
}

/* NOTE [chain splits]  A copy of r keeps the inputs of r's producer alive up
 * to the copy.  Where such an input is itself made by a cheap op and would
 * otherwise die before the copy, extending it only moves the cost, so one
 * link alone often gains nothing where the whole chain does.  Each greedy
 * candidate is offered alone and, where that gains nothing, with its chain
 * (chain_of: those inputs, transitively, up to MF_REMAT_CHAIN roots,
 * recomputed before r from what stays alive anyway).  A chain candidate is
 * scored the long way (its graph built and simulated), the others
 * incrementally. */
#define MF_REMAT_CHAIN 32

static int32_t chain_of(const mf_wgraph *w, const mf_roots *R, int32_t r, int32_t at, int32_t *chain)
{
    int32_t n = 0, q = 0, y = r;
    for (;;) {
        int32_t p = R->prod[y], j, c;
        for (j = p >= 0 ? w->in_ptr[p] : 0; p >= 0 && j < w->in_ptr[p + 1] && n < MF_REMAT_CHAIN; j++) {
            int32_t u = R->root[w->in_idx[j]], dup = u == r;
            if (!R->cp[u] || R->last[u] >= at)
                continue;
            for (c = 0; c < n; c++)
                dup |= chain[c] == u;
            if (!dup)
                chain[n++] = u;
        }
        if (q == n)
            return n;
        y = chain[q++];
    }
}

static int search_greedy(mf_ctx *ctx, mf_wgraph *cur, iscore *I, int64_t budget, int32_t max_rounds, score *sc,
                         int64_t *used, int32_t *n_used)
{
    int32_t round, chain[MF_REMAT_CHAIN], best_chain[MF_REMAT_CHAIN];
    int st = MF_OK, built = 0; /* built: score the candidates the long way */
    for (round = 0; round < max_rounds; round++) {
        const mf_roots *R = &I->R;
        mf_wgraph next;
        mf_split best;
        iscore J;
        score best_sc = *sc, c = *sc;
        int32_t r, s = sc->step;
        best.r = -1;
        best.k = 0;
        best.bytes = 0;
        best.chain = NULL;
        best.n_chain = 0;
        if (s < 0)
            break;
        for (r = 0; r < cur->nv && st == MF_OK; r++) {
            int32_t k, p = R->prod[r], n_ch, variant, q;
            int alone_gains;
            if (!R->ok[r] || p >= s || R->last[r] <= s || reads_root(cur, R, s, r))
                continue;
            if ((k = mf_first_reader_after(R, r, s)) < 1)
                continue;
            n_ch = chain_of(cur, R, r, R->rd[R->rd_ptr[r] + k], chain);
            /* the split alone, and with its chain (NOTE [chain splits]) */
            for (variant = 0, alone_gains = 0; variant < (n_ch ? 2 : 1) && st == MF_OK && !alone_gains; variant++) {
                mf_split one;
                one.r = r;
                one.k = k;
                one.bytes = cur->bytes[r];
                one.chain = variant ? chain : NULL;
                one.n_chain = variant ? n_ch : 0;
                for (q = 0; q < one.n_chain; q++)
                    one.bytes += cur->bytes[chain[q]];
                if (*used + one.bytes > budget)
                    continue;
                if (ctx->cancel && ctx->cancel(ctx->cancel_ud)) {
                    st = mf_set_error(ctx, MF_ECANCEL, "cancelled");
                    break;
                }
                if ((st = score_checked(ctx, I, &one, 1, built, &c)))
                    break;
                alone_gains = better(&c, 0, sc, 0); /* then its chain is not tried: it costs more to score */
                if (better(&c, one.bytes, &best_sc, best.r >= 0 ? best.bytes : INT64_MAX) && better(&c, 0, sc, 0)) {
                    best = one;
                    best_sc = c;
                    if (one.n_chain) { /* chain is scratch: keep the best's own copy */
                        memcpy(best_chain, chain, sizeof(int32_t) * (size_t)one.n_chain);
                        best.chain = best_chain;
                    }
                }
            }
        }
        if (st || best.r < 0)
            break;
        st = build_kept(ctx, I, &best, 1, &best_sc, &next, &J);
        if (st == MF_EINTERNAL && MF_REMAT_FALLBACK && !built) {
            built = 1; /* NOTE [incremental scoring]: this round again, the long way */
            round--;
            st = MF_OK;
            continue;
        }
        if (st)
            break;
        iscore_free(ctx, I);
        mf_wg_free(ctx, cur);
        *cur = next;
        *I = J;
        I->w = cur;
        *sc = I->sc;
        *used += best.bytes;
        (*n_used)++;
    }
    return st;
}

int mf_recompute(mf_ctx *ctx, const mf_graph_desc *g, const uint8_t *cheap, const int32_t *order,
                 const mf_remat_options *opt, mf_remat_result *out)
{
    mf_wgraph cur;
    score sc;
    int64_t used = 0, budget = opt ? opt->budget_bytes : 0;
    int32_t n_used = 0, max_rounds = opt && opt->max_rounds > 0 ? opt->max_rounds : 256;
    int st;

    memset(out, 0, sizeof *out);
    if ((st = mf_graph_check(ctx, g)))
        return st;
    if (!order || !cheap)
        return mf_set_error(ctx, MF_EINVAL, "recompute: order and cheap are required");
    {
        int valid = 0;
        if ((st = mf_check_order(ctx, g, order, &valid)) != MF_OK)
            return st;
        if (!valid)
            return mf_set_error(ctx, MF_EINVAL, "recompute: the order breaks a dependency");
    }
    if ((st = mf_wg_from_desc(ctx, g, cheap, order, &cur)))
        return st;
    if ((st = score_of(ctx, &cur, &sc, NULL, NULL)))
        goto fail;
    out->start_peak_bytes = sc.peak;
    if (budget > 0 && opt->focus_hi > opt->focus_lo) {
        if ((st = opt->fission ? mf_region_fission(ctx, &cur, opt, budget, &used, &n_used, &out->n_edges)
                               : mf_focused_split(ctx, &cur, opt, budget, &used, &n_used)) ||
            ((n_used > 0 || out->n_edges > 0) && (st = score_of(ctx, &cur, &sc, NULL, NULL))))
            goto fail;
    } else if (budget > 0) {
        iscore I;
        mf_split cand[MF_REMAT_EXACT];
        int32_t nc = 0, r, q;
        int too_many = 0;
        if ((st = iscore_init(ctx, &cur, &I)))
            goto fail;
        for (r = 0; r < cur.nv && !too_many; r++) {
            if (!I.R.ok[r])
                continue;
            for (q = 1; q < I.R.rd_ptr[r + 1] - I.R.rd_ptr[r]; q++) {
                if (nc == MF_REMAT_EXACT) {
                    too_many = 1;
                    break;
                }
                cand[nc].r = r;
                cand[nc].k = q;
                cand[nc].bytes = cur.bytes[r];
                cand[nc].chain = NULL;
                cand[nc].n_chain = 0;
                nc++;
            }
        }
        if (too_many)
            st = search_greedy(ctx, &cur, &I, budget, max_rounds, &sc, &used, &n_used);
        else if (nc > 0)
            st = search_exact(ctx, &cur, &I, cand, nc, budget, &sc, &used, &n_used);
        iscore_free(ctx, &I);
        if (st)
            goto fail;
    }
    mf_wg_result(&cur, out);
    out->n_splits = n_used;
    out->copied_bytes = used;
    out->peak_bytes = sc.peak;
    out->arena_ = cur.arena.head;
    return MF_OK;
fail:
    mf_wg_free(ctx, &cur);
    return st;
}

void mf_remat_result_free(mf_ctx *ctx, mf_remat_result *r)
{
    mf_arena a;
    a.head = r->arena_;
    mf_arena_release(ctx, &a);
    memset(r, 0, sizeof *r);
}

void mf_remat_result_desc(const mf_remat_result *r, mf_graph_desc *d)
{
    memset(d, 0, sizeof *d);
    d->n_ops = r->n_ops;
    d->n_values = r->n_values;
    d->in_ptr = r->in_ptr;
    d->in_idx = r->in_idx;
    d->out_ptr = r->out_ptr;
    d->out_idx = r->out_idx;
    d->value_bytes = r->value_bytes;
    d->alias_of = r->alias_of;
    d->is_input = r->is_input;
    d->is_output = r->is_output;
    d->donatable = r->donatable;
    d->fusible = r->fusible;
    d->n_after = r->n_after;
    d->after = r->after;
    d->epilogue_of = r->epilogue_of;
    d->comm = r->comm;
}
