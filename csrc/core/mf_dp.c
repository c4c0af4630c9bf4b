/*
 * mf_dp.c -- the scheduler's exact DP (pipeline steps 5 and 6 of
 * mf_sched.c): a bottleneck best-first search over the downward-closed sets
 * of a range of the current order (NOTE [piece DP]), within a state cap and
 * a memory budget (NOTE [DP memory budget]).  The piece stage runs it on
 * whole pieces, the windows (mf_windows.c) on ranges around the peak.
 */
#include "mf_dp.h"

#include <string.h>

/* Sort a[0..k) by lb descending, idx ascending (bottom-up merge sort; tmp
 * holds k entries; no libc qsort, which may allocate behind the injectable
 * allocator). */
static void lb_sort(lb_key *a, lb_key *tmp, int32_t k)
{
    int32_t width, i;
    lb_key *src = a, *dst = tmp;
    for (width = 1; width < k; width *= 2) {
        for (i = 0; i < k; i += 2 * width) {
            int32_t l = i, m = i + width < k ? i + width : k, r = i + 2 * width < k ? i + 2 * width : k;
            int32_t x = l, y = m, o = l;
            while (x < m && y < r) {
                if (src[y].lb > src[x].lb || (src[y].lb == src[x].lb && src[y].idx < src[x].idx))
                    dst[o++] = src[y++];
                else
                    dst[o++] = src[x++];
            }
            while (x < m)
                dst[o++] = src[x++];
            while (y < r)
                dst[o++] = src[y++];
        }
        {
            lb_key *t = src;
            src = dst;
            dst = t;
        }
    }
    if (src != a)
        memcpy(a, src, sizeof(lb_key) * (size_t)k);
}

void mf_seg_ws_free(mf_ctx *ctx, mf_seg_ws *w)
{
    MF_VEC_FREE(ctx, w->ops), MF_VEC_FREE(ctx, w->lborder), MF_VEC_FREE(ctx, w->tptr);
    MF_VEC_FREE(ctx, w->tidx), MF_VEC_FREE(ctx, w->lsalloc), MF_VEC_FREE(ctx, w->path);
    MF_VEC_FREE(ctx, w->lsptr), MF_VEC_FREE(ctx, w->lsucc), MF_VEC_FREE(ctx, w->run);
    MF_VEC_FREE(ctx, w->pmask), MF_VEC_FREE(ctx, w->lsrd), MF_VEC_FREE(ctx, w->tbits);
    MF_VEC_FREE(ctx, w->rbits), MF_VEC_FREE(ctx, w->ab), MF_VEC_FREE(ctx, w->lbv);
    MF_VEC_FREE(ctx, w->lsb), MF_VEC_FREE(ctx, w->lsnever), MF_VEC_FREE(ctx, w->gptr);
    MF_VEC_FREE(ctx, w->gidx), MF_VEC_FREE(ctx, w->glued), MF_VEC_FREE(ctx, w->pool);
    MF_VEC_FREE(ctx, w->bits), MF_VEC_FREE(ctx, w->hash), MF_VEC_FREE(ctx, w->g);
    MF_VEC_FREE(ctx, w->live), MF_VEC_FREE(ctx, w->fval), MF_VEC_FREE(ctx, w->parent);
    MF_VEC_FREE(ctx, w->last), MF_VEC_FREE(ctx, w->depth), MF_VEC_FREE(ctx, w->closed);
    MF_VEC_FREE(ctx, w->tab), MF_VEC_FREE(ctx, w->heap), MF_VEC_FREE(ctx, w->sortk);
    memset(w, 0, sizeof *w);
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

static uint64_t hash_bits(const uint64_t *b, int32_t W)
{
    uint64_t h = 0x9e3779b97f4a7c15ULL;
    int32_t i;
    for (i = 0; i < W; i++)
        h = mix64(h ^ b[i]) + (uint64_t)i;
    return h;
}

static int hless(const hentry *x, const hentry *y)
{
    if (x->f != y->f)
        return x->f < y->f;
    if (x->depth != y->depth)
        return x->depth > y->depth; /* deeper first: reach a full set quickly */
    return x->idx < y->idx;
}

static int heap_push(mf_ctx *ctx, mf_seg_ws *w, size_t *hn, hentry e)
{
    size_t i;
    int st = MF_VEC_RESERVE(ctx, w->heap, *hn + 1, 1);
    if (st)
        return st;
    i = (*hn)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!hless(&e, &w->heap.data[p]))
            break;
        w->heap.data[i] = w->heap.data[p];
        i = p;
    }
    w->heap.data[i] = e;
    return MF_OK;
}

static hentry heap_pop(mf_seg_ws *w, size_t *hn)
{
    hentry top = w->heap.data[0], e;
    size_t i = 0, n;
    n = --(*hn);
    if (n == 0)
        return top;
    e = w->heap.data[n];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && hless(&w->heap.data[c + 1], &w->heap.data[c]))
            c++;
        if (!hless(&w->heap.data[c], &e))
            break;
        w->heap.data[i] = w->heap.data[c];
        i = c;
    }
    w->heap.data[i] = e;
    return top;
}

static int states_reserve(mf_ctx *ctx, mf_seg_ws *w, size_t need, int32_t W)
{
    int st;
    if ((st = MF_VEC_RESERVE(ctx, w->bits, need * (size_t)W, 1)) ||
        (st = MF_VEC_RESERVE(ctx, w->hash, need, 1)) ||
        (st = MF_VEC_RESERVE(ctx, w->g, need, 1)) ||
        (st = MF_VEC_RESERVE(ctx, w->live, need, 1)) ||
        (st = MF_VEC_RESERVE(ctx, w->fval, need, 1)) ||
        (st = MF_VEC_RESERVE(ctx, w->parent, need, 1)) ||
        (st = MF_VEC_RESERVE(ctx, w->last, need, 1)) ||
        (st = MF_VEC_RESERVE(ctx, w->depth, need, 1)) ||
        (st = MF_VEC_RESERVE(ctx, w->closed, need, 1)))
        return st;
    return MF_OK;
}

/* (Re)build the open-addressing table for nst states in a table of tcap
 * slots (power of two). */
static int table_rebuild(mf_ctx *ctx, mf_seg_ws *w, size_t tcap, int32_t nst)
{
    int32_t i;
    size_t mask = tcap - 1;
    /* freed first, allocated exactly: not MF_VEC_RESERVE, which keeps the
     * old block until the new one is there and never shrinks */
    MF_VEC_FREE(ctx, w->tab);
    w->tab.data = (int32_t *)mf_alloc(ctx, tcap * sizeof(int32_t));
    if (!w->tab.data)
        return MF_ENOMEM;
    w->tab.cap = tcap;
    memset(w->tab.data, 0xff, tcap * sizeof(int32_t));
    for (i = 0; i < nst; i++) {
        size_t h = (size_t)w->hash.data[i] & mask;
        while (w->tab.data[h] >= 0)
            h = (h + 1) & mask;
        w->tab.data[h] = i;
    }
    return MF_OK;
}

/* The ops of cur[a..b) in local order, their bytes and bounds, and their
 * predecessor masks; *ntouch: the storage touches of the ops. */
static int seg_ops(mf_plan_st *P, int32_t a, int32_t k, int32_t W, int32_t *ntouch)
{
    mf_ctx *ctx = P->ctx;
    const mf_pg *pg = P->pg;
    mf_seg_ws *w = P->sw;
    int32_t i, j, nt = 0;
    int st;
    if ((st = MF_VEC_RESERVE(ctx, w->ops, (size_t)k, 0)) ||
        (st = MF_VEC_RESERVE(ctx, w->lborder, (size_t)k, 0)) ||
        (st = MF_VEC_RESERVE(ctx, w->path, (size_t)k, 0)) ||
        (st = MF_VEC_RESERVE(ctx, w->tptr, (size_t)k + 1, 0)) ||
        (st = MF_VEC_RESERVE(ctx, w->pmask, (size_t)k * (size_t)W, 0)) ||
        (st = MF_VEC_RESERVE(ctx, w->tbits, (size_t)W, 0)) ||
        (st = MF_VEC_RESERVE(ctx, w->ab, (size_t)k, 0)) ||
        (st = MF_VEC_RESERVE(ctx, w->lbv, (size_t)k, 0)) ||
        (st = MF_VEC_RESERVE(ctx, w->lsptr, (size_t)k + 1, 0)) ||
        (st = MF_VEC_RESERVE(ctx, w->run, (size_t)k + 1, 0)) ||
        (st = MF_VEC_RESERVE(ctx, w->rbits, (size_t)W, 0)))
        return st;
    for (i = 0; i < k; i++) {
        int32_t v = P->cur[a + i];
        w->ops.data[i] = v;
        P->sw->lmap[v] = i;
        w->ab.data[i] = pg->abytes[v];
        w->lbv.data[i] = pg->oplb[v];
        nt += pg->otouch_ptr[v + 1] - pg->otouch_ptr[v];
    }
    memset(w->pmask.data, 0, sizeof(uint64_t) * (size_t)k * (size_t)W);
    for (i = 0; i < k; i++) {
        int32_t v = w->ops.data[i];
        for (j = pg->pred_ptr[v]; j < pg->pred_ptr[v + 1]; j++) {
            int32_t l = w->lmap[pg->pred[j]];
            if (l >= 0)
                w->pmask.data[(size_t)i * W + (size_t)(l >> 6)] |= (uint64_t)1 << (l & 63);
        }
    }
    *ntouch = nt;
    return MF_OK;
}

/* Local successors (CSR), in local order. */
static int seg_succ(mf_plan_st *P, int32_t k)
{
    mf_ctx *ctx = P->ctx;
    const mf_pg *pg = P->pg;
    mf_seg_ws *w = P->sw;
    int32_t i, j, ne = 0;
    int st;
    for (i = 0; i < k; i++) {
        int32_t v = w->ops.data[i];
        for (j = pg->succ_ptr[v]; j < pg->succ_ptr[v + 1]; j++)
            if (w->lmap[pg->succ[j]] >= 0)
                ne++;
    }
    if ((st = MF_VEC_RESERVE(ctx, w->lsucc, (size_t)ne + 1, 0)))
        return st;
    ne = 0;
    for (i = 0; i < k; i++) {
        int32_t v = w->ops.data[i];
        w->lsptr.data[i] = ne;
        for (j = pg->succ_ptr[v]; j < pg->succ_ptr[v + 1]; j++)
            if (w->lmap[pg->succ[j]] >= 0)
                w->lsucc.data[ne++] = w->lmap[pg->succ[j]];
    }
    w->lsptr.data[k] = ne;
    return MF_OK;
}

/* The storages the ops touch (nt touches): bytes, local allocator or -1 if
 * allocated before the range, reader masks, "never freed here" when an
 * output or read at a position >= b. */
static int seg_storages(mf_plan_st *P, int32_t b, int32_t k, int32_t W, int32_t nt)
{
    mf_ctx *ctx = P->ctx;
    const mf_pg *pg = P->pg;
    mf_seg_ws *w = P->sw;
    int32_t i, j, nls = 0;
    int st;
    if ((st = MF_VEC_RESERVE(ctx, w->tidx, (size_t)nt + 1, 0)) ||
        (st = MF_VEC_RESERVE(ctx, w->lsalloc, (size_t)nt + 1, 0)) ||
        (st = MF_VEC_RESERVE(ctx, w->lsb, (size_t)nt + 1, 0)) ||
        (st = MF_VEC_RESERVE(ctx, w->lsnever, (size_t)nt + 1, 0)) ||
        (st = MF_VEC_RESERVE(ctx, w->lsrd, ((size_t)nt + 1) * (size_t)W, 0)))
        return st;
    nt = 0;
    for (i = 0; i < k; i++) {
        int32_t v = w->ops.data[i];
        w->tptr.data[i] = nt;
        for (j = pg->otouch_ptr[v]; j < pg->otouch_ptr[v + 1]; j++) {
            int32_t s = pg->otouch[j], ls = w->smap[s];
            if (ls < 0) {
                int32_t r;
                int never = pg->sout[s];
                ls = nls++;
                w->smap[s] = ls;
                w->lsb.data[ls] = pg->sbytes[s];
                w->lsalloc.data[ls] = w->lmap[pg->salloc[s]];
                for (r = pg->sread_ptr[s]; r < pg->sread_ptr[s + 1] && !never; r++)
                    if (P->pos[pg->sread[r]] >= b)
                        never = 1;
                w->lsnever.data[ls] = (uint8_t)never;
                memset(w->lsrd.data + (size_t)ls * W, 0, sizeof(uint64_t) * (size_t)W);
            }
            w->tidx.data[nt++] = ls;
        }
        for (j = pg->oread_ptr[v]; j < pg->oread_ptr[v + 1]; j++) {
            int32_t ls = w->smap[pg->oread[j]];
            w->lsrd.data[(size_t)ls * W + (size_t)(i >> 6)] |= (uint64_t)1 << (i & 63);
        }
    }
    w->tptr.data[k] = nt;
    return MF_OK;
}

/* NOTE [piece DP], glue: deferrable ops and the op they are glued to. */
static int seg_glue(mf_plan_st *P, int32_t k, int32_t W)
{
    mf_ctx *ctx = P->ctx;
    mf_seg_ws *w = P->sw;
    int32_t i;
    int st;
    if ((st = MF_VEC_RESERVE(ctx, w->gptr, (size_t)k + 1, 0)) ||
        (st = MF_VEC_RESERVE(ctx, w->gidx, (size_t)k + 1, 0)) ||
        (st = MF_VEC_RESERVE(ctx, w->glued, (size_t)k + 1, 0)))
        return st;
    for (i = 0; i < k; i++) {
        int32_t q, z;
        int ok = w->lsptr.data[i + 1] - w->lsptr.data[i] == 1;
        for (z = 0; z < W && ok; z++)
            if (w->pmask.data[(size_t)i * W + (size_t)z])
                ok = 0;
        for (q = w->tptr.data[i]; q < w->tptr.data[i + 1] && ok; q++) {
            int32_t ls = w->tidx.data[q];
            const uint64_t *rd = w->lsrd.data + (size_t)ls * W;
            if (rd[i >> 6] >> (i & 63) & 1) {
                if (!w->lsnever.data[ls])
                    ok = 0; /* moving i would move a free */
            } else if (w->lsalloc.data[ls] == i && w->lsb.data[ls] > 0 && !w->lsnever.data[ls]) {
                int read = 0;
                for (z = 0; z < W; z++)
                    if (rd[z])
                        read = 1;
                if (!read)
                    ok = 0; /* a transient allocation */
            }
        }
        w->glued.data[i] = (uint8_t)ok;
    }
    memset(w->gptr.data, 0, sizeof(int32_t) * ((size_t)k + 1));
    for (i = 0; i < k; i++)
        if (w->glued.data[i])
            w->gptr.data[w->lsucc.data[w->lsptr.data[i]] + 1]++;
    for (i = 0; i < k; i++)
        w->gptr.data[i + 1] += w->gptr.data[i];
    for (i = 0; i < k; i++)
        w->path.data[i] = w->gptr.data[i];
    for (i = 0; i < k; i++)
        if (w->glued.data[i]) {
            int32_t u = w->lsucc.data[w->lsptr.data[i]];
            w->gidx.data[w->path.data[u]++] = i;
            w->pmask.data[(size_t)u * W + (size_t)(i >> 6)] &= ~((uint64_t)1 << (i & 63));
        }
    return MF_OK;
}

/* Ops by lower bound, descending, ties by local index (O(k log k): large
 * pieces reach the DP, NOTE [DP piece size]). */
static int seg_lb_order(mf_plan_st *P, int32_t k)
{
    mf_seg_ws *w = P->sw;
    int32_t i;
    int st;
    if ((st = MF_VEC_RESERVE(P->ctx, w->sortk, (size_t)k * 2, 0)))
        return st;
    for (i = 0; i < k; i++) {
        w->sortk.data[i].lb = w->lbv.data[i];
        w->sortk.data[i].idx = i;
    }
    lb_sort(w->sortk.data, w->sortk.data + k, k);
    for (i = 0; i < k; i++)
        w->lborder.data[i] = w->sortk.data[i].idx;
    return MF_OK;
}

/* Set up the local view of cur[a..b): ops, predecessor masks, the storages
 * the ops touch (bytes, local allocator or -1 if allocated before a, reader
 * masks, "never freed here" when an output or read at a position >= b).
 * *Wout: 64-bit words per bitset. */
static int seg_setup(mf_plan_st *P, int32_t a, int32_t b, int32_t *Wout)
{
    int32_t k = b - a, W = (k + 63) / 64, nt;
    int st;
    if ((st = seg_ops(P, a, k, W, &nt)) || (st = seg_succ(P, k)) || (st = seg_storages(P, b, k, W, nt)) ||
        (st = seg_glue(P, k, W)) || (st = seg_lb_order(P, k)))
        return st;
    *Wout = W;
    return MF_OK;
}

static void seg_unmap(mf_plan_st *P, int32_t a, int32_t b)
{
    const mf_pg *pg = P->pg;
    int32_t i, j;
    for (i = a; i < b; i++) {
        int32_t v = P->cur[i];
        P->sw->lmap[v] = -1;
        for (j = pg->otouch_ptr[v]; j < pg->otouch_ptr[v + 1]; j++)
            P->sw->smap[pg->otouch[j]] = -1;
    }
}

static int64_t h_of(const mf_seg_ws *w, const uint64_t *S, int32_t k)
{
    int32_t i;
    for (i = 0; i < k; i++) {
        int32_t x = w->lborder.data[i];
        if (!(S[x >> 6] >> (x & 63) & 1))
            return w->lbv.data[x];
    }
    return 0;
}

/* Is local op v not in S and all its predecessors in S? */
static int seg_ready(const mf_seg_ws *w, const uint64_t *S, int32_t v, int32_t W)
{
    int32_t q;
    if (S[v >> 6] >> (v & 63) & 1)
        return 0;
    for (q = 0; q < W; q++)
        if (w->pmask.data[(size_t)v * W + (size_t)q] & ~S[q])
            return 0;
    return 1;
}

/* Live bytes after local op v ran, T = S + v, cost = live(S) + alloc(v). */
static int64_t seg_live_after(const mf_seg_ws *w, const uint64_t *T, int32_t v, int32_t W, int64_t cost)
{
    int64_t live2 = cost;
    int32_t q;
    for (q = w->tptr.data[v]; q < w->tptr.data[v + 1]; q++) {
        int32_t ls = w->tidx.data[q], al = w->lsalloc.data[ls], z;
        const uint64_t *rd;
        int freed = 1;
        if (w->lsnever.data[ls])
            continue;
        if (al >= 0 && !(T[al >> 6] >> (al & 63) & 1))
            continue;
        rd = w->lsrd.data + (size_t)ls * W;
        for (z = 0; z < W; z++)
            if (rd[z] & ~T[z]) {
                freed = 0;
                break;
            }
        if (freed)
            live2 -= w->lsb.data[ls];
    }
    return live2;
}

/* NOTE [piece DP]
 * Bottleneck shortest path over downward-closed sets S of the segment's ops:
 * the edge S -> S + v costs live(S) + alloc(v) (v's unfused `during`), a
 * path's cost is its largest edge, and live(S) depends on S alone.  States
 * are expanded best-first on f = max(g, h, F): g the path's bottleneck, h the
 * largest oplb of an op not yet run (each such op will cost at least that,
 * and h never decreases along an edge by more than the edge pays, so f is
 * monotone and the first full set popped is optimal), F a floor below which
 * nothing matters (a proven lower bound of the whole plan).  Ties prefer
 * deeper states, so a solution at the floor is found almost depth-first.
 * Edges costing >= U and states with f >= U are dropped: only orders
 * strictly better than the current one are wanted, and when none is found
 * the current one is proven optimal.  States are memoized in an open
 * addressing table keyed by a 64-bit hash of the bitset (full compare on a
 * hit).  `states` counts the states created (the empty set included).
 * Free moves: when a ready op v costs live(S) + alloc(v) <= max(g(S), F)
 * and does not raise the live bytes (live(S + v) <= live(S)), S is expanded
 * by v alone.  Exchange argument: take any completion from S that runs v
 * later and move v to the front.  For every set S' >= S without v,
 * live(S' + v) - live(S') <= live(S + v) - live(S) <= 0 (the storages v
 * allocates are read only by its descendants, none in S', or are outputs,
 * so they count the same; a storage v reads is freed by v at S' whenever it
 * is at S), so every step up to v's old position gets no dearer, later
 * steps see the same sets, and v's own step costs at most max(g(S), F),
 * which the path pays anyway.  So some best completion from S starts with
 * v, and states are closed with their optimal g (A*, consistent f).  In the
 * sink-heavy blocks of a backward pass (NOTE [sinks]) this removes the
 * factor 2 per pending weight gradient, and the same for adds that free
 * their inputs.
 * Glue: an op x of the segment is "deferrable" when it has no predecessor in
 * the segment, exactly one successor u in it, every storage it reads is
 * never freed in the segment (lsnever: an output, or read after the
 * segment), and every storage it allocates has a reader, is never freed here
 * or has no bytes (recomputation from saved tensors, weight transposes: the
 * local form of the floating ops of NOTE [cut points]).  Claim: some optimal
 * order of the segment runs every deferrable x right before its u.  Take
 * any order and move x to just before u (valid: x's predecessors ran before
 * the segment; u is x's first successor, its others run after the segment).
 * x frees nothing wherever it runs (what it reads stays live through the
 * segment), and what it allocates stays live until u at least, so the steps
 * between x's old place and u lose exactly alloc(x), x's new step costs
 * live_before(u) - alloc(x) + alloc(x) <= u's step, which is unchanged, and
 * the steps after u see the same sets.  Moving the deferrable ops one by one
 * never raises the peak.  So the search only visits such "normalized"
 * orders: x is glued to u (u's readiness ignores x; expanding u runs the
 * unit "x..., u", whose steps all cost at most u's step since live only
 * grows until u), and nothing else changes: g, h and f stay exact for the
 * normalized orders, an order < U exists iff a normalized one does, and the
 * free-move argument above holds for a unit as for one op (in a normalized
 * completion the unit is contiguous, so moving it to the front is moving one
 * block, and for S' >= S without the unit, live(S' + unit) - live(S') <=
 * live(S + unit) - live(S) by the same storage-by-storage comparison).  In a
 * checkpointed backward block each path's recomputation would otherwise
 * double the states of every path not yet started (the 8-path blocks of
 * benchmarks/scheduler_scaling.py; the states with and without the units
 * are in benchmarks/RESULTS.md, "Scheduler scaling"). */
/* The unit of v: the ops glued to v (NOTE [piece DP], glue), then v.  Its
 * most expensive step is v's: a glued op frees nothing and keeps all it
 * allocates, so live only grows until v. */
static int64_t unit_cost(const mf_seg_ws *w, int32_t v, int64_t live)
{
    int32_t q;
    int64_t c = live + w->ab.data[v];
    for (q = w->gptr.data[v]; q < w->gptr.data[v + 1]; q++)
        c += w->ab.data[w->gidx.data[q]];
    return c;
}

/* Apply the unit of v to T (bitset) from live bytes `live`; append its ops to
 * run[*m..].  Returns the live bytes after it. */
static int64_t unit_apply(const mf_seg_ws *w, uint64_t *T, int32_t v, int32_t W, int64_t live, int32_t *run,
                          int32_t *m)
{
    int32_t q;
    for (q = w->gptr.data[v]; q <= w->gptr.data[v + 1]; q++) {
        int32_t x = q < w->gptr.data[v + 1] ? w->gidx.data[q] : v;
        int64_t cost = live + w->ab.data[x];
        T[x >> 6] |= (uint64_t)1 << (x & 63);
        live = seg_live_after(w, T, x, W, cost);
        run[(*m)++] = x;
    }
    return live;
}

/* A free move at S (NOTE [piece DP]): the first ready unit v (local order)
 * whose steps cost <= lim and after which live <= live(S).  Returns the
 * number of its ops (0: none), its ops in w->run.data, the set after it in
 * w->rbits.data, its live bytes and its largest step cost. */
static int32_t find_free(mf_seg_ws *w, const uint64_t *S, int64_t live, int64_t lim, int32_t k, int32_t W,
                         int64_t *live_out, int64_t *cost_out)
{
    int32_t v;
    for (v = 0; v < k; v++) {
        int64_t cost, lv;
        int32_t m = 0;
        if (w->glued.data[v] || (cost = unit_cost(w, v, live)) > lim || !seg_ready(w, S, v, W))
            continue;
        memcpy(w->rbits.data, S, sizeof(uint64_t) * (size_t)W);
        lv = unit_apply(w, w->rbits.data, v, W, live, w->run.data, &m);
        if (lv <= live) {
            *live_out = lv;
            *cost_out = cost;
            return m;
        }
    }
    return 0;
}

typedef struct seg_search {
    int32_t k, W, nst;
    size_t hn, tmask, pops;
    int capped;
} seg_search;

/* NOTE [DP memory budget]
 * The DP's tables (state bitsets and fields, hash table, heap, path pool)
 * grow with the states it creates, whatever max_states allows.  Before a
 * step that would grow them, the footprint they would have after it is
 * computed (mf_grow's doubling, the table's rehash); past mem_limit the run
 * stops as if capped (not proven) and no later DP or window runs in this
 * plan.  The per-piece scratch (O(k^2 / 64) words) is not counted; neither
 * is the old copy an array briefly keeps while it doubles. */
static int dp_over(mf_seg_ws *w, const seg_search *X, int new_state, int32_t m)
{
    size_t ns = (size_t)X->nst + (new_state ? 1 : 0), tab = w->tab.cap;
    double b;
    if (new_state && ns * 2 > tab)
        tab *= 2;
    b = (double)MF_VEC_CAP_FOR(w->bits, ns * (size_t)X->W) * 8.0 + (double)tab * 4.0 +
        (double)MF_VEC_CAP_FOR(w->g, ns) * (8.0 * 4 + 4.0 * 3 + 1.0) +
        (double)MF_VEC_CAP_FOR(w->heap, X->hn + 1) * (double)sizeof(hentry) +
        (double)MF_VEC_CAP_FOR(w->pool, m > 1 ? w->pool.len + (size_t)m + 1 : 0) * 4.0;
    if (b <= (double)w->mem_limit)
        return 0;
    w->over_budget = 1;
    return 1;
}

/* Reach state T (bitset) from state s by the ops run[0..m): insert it, or
 * lower its f; push it on the heap.  Sets X->capped when a new state would
 * exceed the job's cap. */
static int seg_relax(mf_plan_st *P, mf_seg_job *J, seg_search *X, int32_t s, const uint64_t *T, int64_t g2,
                     int64_t live2, const int32_t *run, int32_t m)
{
    mf_ctx *ctx = P->ctx;
    mf_seg_ws *w = P->sw;
    int32_t W = X->W, t;
    int64_t f2 = h_of(w, T, X->k);
    uint64_t hv;
    size_t h;
    hentry e;
    int st;
    if (f2 < g2)
        f2 = g2;
    if (f2 < J->F)
        f2 = J->F;
    if (f2 >= J->U)
        return MF_OK;
    hv = hash_bits(T, W);
    h = (size_t)hv & X->tmask;
    while ((t = w->tab.data[h]) >= 0) {
        if (w->hash.data[t] == hv && !memcmp(w->bits.data + (size_t)t * W, T, sizeof(uint64_t) * (size_t)W))
            break;
        h = (h + 1) & X->tmask;
    }
    if (t >= 0) {
        if (w->closed.data[t] || f2 >= w->fval.data[t])
            return MF_OK;
        if (dp_over(w, X, 0, m)) {
            X->capped = 1;
            return MF_OK;
        }
    } else {
        if (X->nst >= J->cap || dp_over(w, X, 1, m)) {
            X->capped = 1;
            return MF_OK;
        }
        if ((st = states_reserve(ctx, w, (size_t)X->nst + 1, W)))
            return st;
        t = X->nst++;
        memcpy(w->bits.data + (size_t)t * W, T, sizeof(uint64_t) * (size_t)W);
        w->hash.data[t] = hv;
        w->tab.data[h] = t;
        w->closed.data[t] = 0;
        w->depth.data[t] = w->depth.data[s] + m;
        if ((size_t)X->nst * 2 > w->tab.cap) {
            if ((st = table_rebuild(ctx, w, w->tab.cap * 2, X->nst)))
                return st;
            X->tmask = w->tab.cap - 1;
        }
    }
    if (m == 1) {
        w->last.data[t] = run[0];
    } else {
        if (w->pool.len + (size_t)m + 1 > (size_t)INT32_MAX)
            return mf_set_error(ctx, MF_ENOMEM, "out of memory (DP path pool)");
        if ((st = MF_VEC_RESERVE(ctx, w->pool, w->pool.len + (size_t)m + 1, 1)))
            return st;
        w->last.data[t] = -1 - (int32_t)w->pool.len;
        w->pool.data[w->pool.len++] = m;
        memcpy(w->pool.data + w->pool.len, run, sizeof(int32_t) * (size_t)m);
        w->pool.len += (size_t)m;
    }
    w->g.data[t] = g2;
    w->live.data[t] = live2;
    w->fval.data[t] = f2;
    w->parent.data[t] = s;
    e.f = f2;
    e.depth = w->depth.data[t];
    e.idx = t;
    return heap_push(ctx, w, &X->hn, e);
}

int mf_seg_solve(mf_plan_st *P, mf_seg_job *J)
{
    mf_ctx *ctx = P->ctx;
    mf_seg_ws *w = P->sw;
    int32_t k = J->b - J->a, W, i, goal = -1;
    seg_search X;
    int st;
    hentry e;

    memset(&X, 0, sizeof X);
    J->outcome = MF_SEG_NO_BETTER;
    J->states = 0;
    J->bound = J->F;
    if ((st = mf_poll(ctx)))
        return st;
    if (k <= 1)
        return MF_OK;
    st = seg_setup(P, J->a, J->b, &W);
    if (st)
        goto out;
    X.k = k;
    X.W = W;
    w->pool.len = 0;
    if ((st = states_reserve(ctx, w, 1024, W)))
        goto out;
    if ((st = table_rebuild(ctx, w, 2048, 0)))
        goto out;
    X.tmask = w->tab.cap - 1;
    memset(w->bits.data, 0, sizeof(uint64_t) * (size_t)W);
    w->hash.data[0] = hash_bits(w->bits.data, W);
    w->g.data[0] = 0;
    w->live.data[0] = J->live0;
    w->parent.data[0] = -1;
    w->last.data[0] = -1;
    w->depth.data[0] = 0;
    w->closed.data[0] = 0;
    {
        int64_t f0 = h_of(w, w->bits.data, k);
        if (f0 < J->F)
            f0 = J->F;
        w->fval.data[0] = f0;
        if (f0 >= J->U) {
            J->bound = f0;
            goto out;
        }
        w->tab.data[(size_t)w->hash.data[0] & X.tmask] = 0;
        X.nst = 1;
        e.f = f0;
        e.depth = 0;
        e.idx = 0;
        if ((st = heap_push(ctx, w, &X.hn, e)))
            goto out;
    }
    while (X.hn > 0) {
        int32_t s, v, m;
        int64_t lim, live2, maxc;
        if ((++X.pops & 63) == 0 && (st = mf_poll(ctx))) /* NOTE [cancel] */
            goto out;
        e = heap_pop(w, &X.hn);
        s = e.idx;
        if (w->closed.data[s] || e.f != w->fval.data[s])
            continue;
        w->closed.data[s] = 1;
        J->bound = e.f;
        if (w->depth.data[s] == k) {
            goal = s;
            break;
        }
        /* NOTE [piece DP] free moves: look for one first */
        lim = w->g.data[s] > J->F ? w->g.data[s] : J->F;
        m = find_free(w, w->bits.data + (size_t)s * W, w->live.data[s], lim, k, W, &live2, &maxc);
        if (m > 0) {
            if (maxc < w->g.data[s])
                maxc = w->g.data[s];
            /* w->rbits.data is the set after the unit; copy it, the state array may move */
            memcpy(w->tbits.data, w->rbits.data, sizeof(uint64_t) * (size_t)W);
            if ((st = seg_relax(P, J, &X, s, w->tbits.data, maxc, live2, w->run.data, m)))
                goto out;
        } else {
            for (v = 0; v < k; v++) {
                uint64_t *T = w->tbits.data;
                const uint64_t *S = w->bits.data + (size_t)s * W; /* re-read: the state array may move */
                int64_t cost, g2;
                int32_t m1 = 0;
                if (w->glued.data[v] || !seg_ready(w, S, v, W))
                    continue;
                cost = unit_cost(w, v, w->live.data[s]);
                if (cost >= J->U)
                    continue;
                g2 = w->g.data[s] > cost ? w->g.data[s] : cost;
                memcpy(T, S, sizeof(uint64_t) * (size_t)W);
                live2 = unit_apply(w, T, v, W, w->live.data[s], w->run.data, &m1);
                if ((st = seg_relax(P, J, &X, s, T, g2, live2, w->run.data, m1)))
                    goto out;
                if (X.capped)
                    break;
            }
        }
        if (X.capped) {
            J->outcome = MF_SEG_CAPPED;
            goto out;
        }
    }
    if (goal >= 0) {
        /* the ops along the path to the goal; then rewrite cur[a..b) and
         * refresh pos, dur, lbef by replaying them */
        int32_t s = goal, np = 0, o = 0;
        int64_t live = J->live0;
        while (w->parent.data[s] >= 0) {
            w->path.data[np++] = s;
            s = w->parent.data[s];
        }
        while (np > 0) {
            int32_t t = w->path.data[--np], c = w->last.data[t];
            if (c >= 0) {
                w->run.data[o++] = c;
            } else {
                const int32_t *r = w->pool.data + (-1 - c);
                memcpy(w->run.data + o, r + 1, sizeof(int32_t) * (size_t)r[0]);
                o += r[0];
            }
        }
        if (o != k) {
            st = mf_set_error(ctx, MF_EINTERNAL, "piece DP path has %d ops, expected %d", (int)o, (int)k);
            goto out;
        }
        memset(w->tbits.data, 0, sizeof(uint64_t) * (size_t)W);
        for (i = 0; i < k; i++) {
            int32_t lv = w->run.data[i], v = w->ops.data[lv];
            int64_t cost = live + w->ab.data[lv];
            P->cur[J->a + i] = v;
            P->pos[v] = J->a + i;
            P->lbef[J->a + i] = live;
            P->dur[J->a + i] = cost;
            w->tbits.data[lv >> 6] |= (uint64_t)1 << (lv & 63);
            live = seg_live_after(w, w->tbits.data, lv, W, cost);
        }
        J->outcome = MF_SEG_IMPROVED;
    }
out:
    J->states = X.nst;
    /* the maps must be clean for the next call; cur[a..b) holds the same ops */
    seg_unmap(P, J->a, J->b);
    return st;
}
