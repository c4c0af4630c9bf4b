/*
 * mf_sched.c -- the scheduler: mf_plan.
 *
 * Pipeline (every step outside the bounded DP is O((n + E) log n)):
 *  1. baseline: ops 0..n-1 simulated unfused; a candidate when valid;
 *  2. lower bound LB = max(max_v oplb(v), bytes of output storages);
 *  3. heuristics (mf_heur.c) scored by the tracker: input order, two least-peak-first
 *     list schedulers, a depth-first "finish what you started" order; the
 *     best is U.  U == LB proves it optimal ("lower-bound");
 *  4. split into pieces at forced cut points (mf_cuts.c, NOTE [cut points]; sinks such
 *     as weight gradients join a piece, NOTE [sinks]) and take,
 *     per piece, the best normalized restriction of every heuristic order
 *     (NOTE [normalized candidates]), or, where strictly better, Liu's
 *     hill/valley merging of the piece's parallel chains (mf_liu.c, NOTE
 *     [liu merge]; pieces above the lower bound only);
 *  5. exact bottleneck DP over downward-closed sets, per piece, pieces with
 *     the highest peak first (NOTE [piece DP]: free moves, and recomputation
 *     glued to its consumer), within a state budget (NOTE [state budget];
 *     large pieces get a smaller share, NOTE [DP piece size]);
 *  6. windowed DP around the peak step of pieces the DP could not finish
 *     (NOTE [windows]);
 *  7. fusion grouping (mf_fuse.c) on the final order;
 *  8. with fusion on, single-op moves near the peak group that lower the
 *     fused peak (mf_fuse.c NOTE [fusion-aware moves]), then grouping again.
 * The result is never worse than the input order (when valid) nor than any
 * heuristic: NOTE [never worse].
 *
 * Invariants: the current order `cur` is always a valid order; pos[] is its
 * inverse; dur[i] / lbef[i] are the unfused `during` and the live bytes
 * before position i, kept in sync whenever a range of cur is rewritten.
 */
#include "mf_internal.h"

#include <string.h>

/* NOTE [DP piece size]
 * Expanding one DP state of a k-op piece costs O(k^2 / 64) (readiness of
 * every op against a bitset of k bits).  A piece of up to MF_DP_MAX_OPS ops
 * (`small`, mf_plan_options.dp_max_ops when tests lower it) gets the full
 * per-piece share of states (NOTE [state budget]).  A larger piece of up to
 * MF_DP_BIG_FACTOR * small ops still gets the exact DP, with its share
 * scaled by (small / k)^2 so that its time stays within that of a small
 * piece's run: real backward passes are one piece of hundreds of ops
 * (saved tensors come from one virtual op, and every op that reads only
 * saved tensors can run anywhere, so no cut is forced: csrc/python/trace.c
 * NOTE [freeable saved tensors]), and the DP, helped by free moves and glue
 * (NOTE [piece DP]), often settles them in a few thousand states (nanoGPT's
 * backward is proven optimal this way: benchmarks/RESULTS.md, "A real
 * model").  It is the same search over the same piece, so what it proves
 * holds.  Larger pieces, and pieces whose
 * scaled share runs out, get the windows of step 6, which grow past
 * MF_WIN_LEN in pieces larger than small (NOTE [windows]). */
#define MF_DP_MAX_OPS 256
#define MF_DP_BIG_FACTOR 16
#define MF_WIN_LEN 24
#define MF_WIN_ITERS 64

/* ------------------------------------------------------------------ */
/* growable scratch (mf_ctx.c)                                          */

static int grow(mf_ctx *ctx, void **p, size_t *cap, size_t need, size_t elem, int keep)
{
    return mf_grow(ctx, p, cap, need, elem, keep);
}

/* ------------------------------------------------------------------ */
/* segment DP                                                          */

typedef struct lb_key {
    int64_t lb;
    int32_t idx;
} lb_key;

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

typedef struct hentry {
    int64_t f;
    int32_t depth;
    int32_t idx;
} hentry;

typedef struct seg_ws {
    /* persistent maps (size n / ns), -1 outside a call */
    int32_t *lmap, *smap;
    /* per segment (sized for k ops) */
    int32_t *ops, *lborder, *tptr, *tidx, *lsalloc, *path, *lsptr, *lsucc, *run;
    uint64_t *pmask, *lsrd, *tbits, *rbits;
    int64_t *ab, *lbv, *lsb;
    uint8_t *lsnever;
    size_t c_ops, c_lborder, c_tptr, c_tidx, c_lsalloc, c_path, c_lsptr, c_lsucc, c_run, c_pmask, c_lsrd,
        c_tbits, c_rbits, c_ab, c_lbv, c_lsb, c_lsnever;
    int32_t *gptr, *gidx; /* deferrable ops glued to each op (NOTE [piece DP], glue) */
    uint8_t *glued;
    size_t c_gptr, c_gidx, c_glued;
    /* units of more than one op (NOTE [piece DP], glue) on a state's path:
     * pool of [len, ops...] */
    int32_t *pool;
    size_t c_pool, n_pool;
    /* states */
    uint64_t *bits, *hash;
    int64_t *g, *live, *fval;
    int32_t *parent, *last, *depth;
    uint8_t *closed;
    size_t c_bits, c_hash, c_g, c_live, c_fval, c_parent, c_last, c_depth, c_closed;
    int32_t *tab;
    size_t c_tab;
    hentry *heap;
    size_t c_heap;
    lb_key *sortk;
    size_t c_sortk;
    int64_t mem_limit; /* NOTE [DP memory budget] */
    int over_budget;   /* sticky: a run stopped at mem_limit */
} seg_ws;

static void seg_ws_free(mf_ctx *ctx, seg_ws *w)
{
    void *ps[] = {w->ops, w->lborder, w->tptr, w->tidx, w->lsalloc, w->path, w->lsptr, w->lsucc, w->run,
                  w->rbits, w->pool, w->gptr, w->gidx, w->glued, w->pmask, w->lsrd, w->tbits,
                  w->ab, w->lbv, w->lsb, w->lsnever, w->bits, w->hash, w->g, w->live, w->fval, w->parent,
                  w->last, w->depth, w->closed, w->tab, w->heap, w->sortk};
    size_t i;
    for (i = 0; i < sizeof ps / sizeof ps[0]; i++)
        mf_free(ctx, ps[i]);
    memset(w, 0, sizeof *w);
}

enum { SEG_IMPROVED = 1, SEG_NO_BETTER = 2, SEG_CAPPED = 3 };

typedef struct seg_job {
    int32_t a, b;   /* range of cur */
    int64_t live0;  /* live bytes before a */
    int64_t U;      /* only orders with every step < U are wanted */
    int64_t F;      /* steps <= F are free (a proven lower bound elsewhere) */
    int64_t cap;    /* max states to create */
    /* out */
    int outcome;
    int64_t states;
    int64_t bound;  /* last popped priority: lower bound of max(F, segment peak) */
} seg_job;

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

static int heap_push(mf_ctx *ctx, seg_ws *w, size_t *hn, hentry e)
{
    size_t i;
    int st = grow(ctx, (void **)&w->heap, &w->c_heap, *hn + 1, sizeof(hentry), 1);
    if (st)
        return st;
    i = (*hn)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!hless(&e, &w->heap[p]))
            break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = e;
    return MF_OK;
}

static hentry heap_pop(seg_ws *w, size_t *hn)
{
    hentry top = w->heap[0], e;
    size_t i = 0, n;
    n = --(*hn);
    if (n == 0)
        return top;
    e = w->heap[n];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && hless(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!hless(&w->heap[c], &e))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    w->heap[i] = e;
    return top;
}

static int states_reserve(mf_ctx *ctx, seg_ws *w, size_t need, int32_t W)
{
    int st;
    if ((st = grow(ctx, (void **)&w->bits, &w->c_bits, need * (size_t)W, sizeof(uint64_t), 1)) ||
        (st = grow(ctx, (void **)&w->hash, &w->c_hash, need, sizeof(uint64_t), 1)) ||
        (st = grow(ctx, (void **)&w->g, &w->c_g, need, sizeof(int64_t), 1)) ||
        (st = grow(ctx, (void **)&w->live, &w->c_live, need, sizeof(int64_t), 1)) ||
        (st = grow(ctx, (void **)&w->fval, &w->c_fval, need, sizeof(int64_t), 1)) ||
        (st = grow(ctx, (void **)&w->parent, &w->c_parent, need, sizeof(int32_t), 1)) ||
        (st = grow(ctx, (void **)&w->last, &w->c_last, need, sizeof(int32_t), 1)) ||
        (st = grow(ctx, (void **)&w->depth, &w->c_depth, need, sizeof(int32_t), 1)) ||
        (st = grow(ctx, (void **)&w->closed, &w->c_closed, need, 1, 1)))
        return st;
    return MF_OK;
}

/* (Re)build the open-addressing table for nst states in a table of tcap
 * slots (power of two). */
static int table_rebuild(mf_ctx *ctx, seg_ws *w, size_t tcap, int32_t nst)
{
    int32_t i;
    size_t mask = tcap - 1;
    mf_free(ctx, w->tab);
    w->tab = NULL;
    w->c_tab = 0;
    w->tab = (int32_t *)mf_alloc(ctx, tcap * sizeof(int32_t));
    if (!w->tab)
        return MF_ENOMEM;
    w->c_tab = tcap;
    memset(w->tab, 0xff, tcap * sizeof(int32_t));
    for (i = 0; i < nst; i++) {
        size_t h = (size_t)w->hash[i] & mask;
        while (w->tab[h] >= 0)
            h = (h + 1) & mask;
        w->tab[h] = i;
    }
    return MF_OK;
}

typedef struct plan_st {
    mf_ctx *ctx;
    const mf_pg *pg;
    int32_t *cur, *pos;
    int64_t *dur, *lbef;
    seg_ws *sw;
} plan_st;

/* Set up the local view of cur[a..b): ops, predecessor masks, the storages
 * the ops touch (bytes, local allocator or -1 if allocated before a, reader
 * masks, "never freed here" when an output or read at a position >= b).
 * *Wout: 64-bit words per bitset. */
static int seg_setup(plan_st *P, int32_t a, int32_t b, int32_t *Wout)
{
    mf_ctx *ctx = P->ctx;
    const mf_pg *pg = P->pg;
    seg_ws *w = P->sw;
    int32_t k = b - a, W = (k + 63) / 64, i, j, nls = 0, nt = 0, ne;
    int st;
    if ((st = grow(ctx, (void **)&w->ops, &w->c_ops, (size_t)k, sizeof(int32_t), 0)) ||
        (st = grow(ctx, (void **)&w->lborder, &w->c_lborder, (size_t)k, sizeof(int32_t), 0)) ||
        (st = grow(ctx, (void **)&w->path, &w->c_path, (size_t)k, sizeof(int32_t), 0)) ||
        (st = grow(ctx, (void **)&w->tptr, &w->c_tptr, (size_t)k + 1, sizeof(int32_t), 0)) ||
        (st = grow(ctx, (void **)&w->pmask, &w->c_pmask, (size_t)k * (size_t)W, sizeof(uint64_t), 0)) ||
        (st = grow(ctx, (void **)&w->tbits, &w->c_tbits, (size_t)W, sizeof(uint64_t), 0)) ||
        (st = grow(ctx, (void **)&w->ab, &w->c_ab, (size_t)k, sizeof(int64_t), 0)) ||
        (st = grow(ctx, (void **)&w->lbv, &w->c_lbv, (size_t)k, sizeof(int64_t), 0)) ||
        (st = grow(ctx, (void **)&w->lsptr, &w->c_lsptr, (size_t)k + 1, sizeof(int32_t), 0)) ||
        (st = grow(ctx, (void **)&w->run, &w->c_run, (size_t)k + 1, sizeof(int32_t), 0)) ||
        (st = grow(ctx, (void **)&w->rbits, &w->c_rbits, (size_t)W, sizeof(uint64_t), 0)))
        return st;
    for (i = 0; i < k; i++) {
        int32_t v = P->cur[a + i];
        w->ops[i] = v;
        P->sw->lmap[v] = i;
        w->ab[i] = pg->abytes[v];
        w->lbv[i] = pg->oplb[v];
        nt += pg->otouch_ptr[v + 1] - pg->otouch_ptr[v];
    }
    memset(w->pmask, 0, sizeof(uint64_t) * (size_t)k * (size_t)W);
    for (i = 0; i < k; i++) {
        int32_t v = w->ops[i];
        for (j = pg->pred_ptr[v]; j < pg->pred_ptr[v + 1]; j++) {
            int32_t l = w->lmap[pg->pred[j]];
            if (l >= 0)
                w->pmask[(size_t)i * W + (size_t)(l >> 6)] |= (uint64_t)1 << (l & 63);
        }
    }
    /* local successors (CSR), in local order */
    ne = 0;
    for (i = 0; i < k; i++) {
        int32_t v = w->ops[i];
        for (j = pg->succ_ptr[v]; j < pg->succ_ptr[v + 1]; j++)
            if (w->lmap[pg->succ[j]] >= 0)
                ne++;
    }
    if ((st = grow(ctx, (void **)&w->lsucc, &w->c_lsucc, (size_t)ne + 1, sizeof(int32_t), 0)))
        return st;
    ne = 0;
    for (i = 0; i < k; i++) {
        int32_t v = w->ops[i];
        w->lsptr[i] = ne;
        for (j = pg->succ_ptr[v]; j < pg->succ_ptr[v + 1]; j++)
            if (w->lmap[pg->succ[j]] >= 0)
                w->lsucc[ne++] = w->lmap[pg->succ[j]];
    }
    w->lsptr[k] = ne;
    if ((st = grow(ctx, (void **)&w->tidx, &w->c_tidx, (size_t)nt + 1, sizeof(int32_t), 0)) ||
        (st = grow(ctx, (void **)&w->lsalloc, &w->c_lsalloc, (size_t)nt + 1, sizeof(int32_t), 0)) ||
        (st = grow(ctx, (void **)&w->lsb, &w->c_lsb, (size_t)nt + 1, sizeof(int64_t), 0)) ||
        (st = grow(ctx, (void **)&w->lsnever, &w->c_lsnever, (size_t)nt + 1, 1, 0)) ||
        (st = grow(ctx, (void **)&w->lsrd, &w->c_lsrd, ((size_t)nt + 1) * (size_t)W, sizeof(uint64_t), 0)))
        return st;
    nt = 0;
    for (i = 0; i < k; i++) {
        int32_t v = w->ops[i];
        w->tptr[i] = nt;
        for (j = pg->otouch_ptr[v]; j < pg->otouch_ptr[v + 1]; j++) {
            int32_t s = pg->otouch[j], ls = w->smap[s];
            if (ls < 0) {
                int32_t r;
                int never = pg->sout[s];
                ls = nls++;
                w->smap[s] = ls;
                w->lsb[ls] = pg->sbytes[s];
                w->lsalloc[ls] = w->lmap[pg->salloc[s]];
                for (r = pg->sread_ptr[s]; r < pg->sread_ptr[s + 1] && !never; r++)
                    if (P->pos[pg->sread[r]] >= b)
                        never = 1;
                w->lsnever[ls] = (uint8_t)never;
                memset(w->lsrd + (size_t)ls * W, 0, sizeof(uint64_t) * (size_t)W);
            }
            w->tidx[nt++] = ls;
        }
        for (j = pg->oread_ptr[v]; j < pg->oread_ptr[v + 1]; j++) {
            int32_t ls = w->smap[pg->oread[j]];
            w->lsrd[(size_t)ls * W + (size_t)(i >> 6)] |= (uint64_t)1 << (i & 63);
        }
    }
    w->tptr[k] = nt;
    /* NOTE [piece DP], glue: deferrable ops and the op they are glued to */
    if ((st = grow(ctx, (void **)&w->gptr, &w->c_gptr, (size_t)k + 1, sizeof(int32_t), 0)) ||
        (st = grow(ctx, (void **)&w->gidx, &w->c_gidx, (size_t)k + 1, sizeof(int32_t), 0)) ||
        (st = grow(ctx, (void **)&w->glued, &w->c_glued, (size_t)k + 1, 1, 0)))
        return st;
    for (i = 0; i < k; i++) {
        int32_t q, z;
        int ok = w->lsptr[i + 1] - w->lsptr[i] == 1;
        for (z = 0; z < W && ok; z++)
            if (w->pmask[(size_t)i * W + (size_t)z])
                ok = 0;
        for (q = w->tptr[i]; q < w->tptr[i + 1] && ok; q++) {
            int32_t ls = w->tidx[q];
            const uint64_t *rd = w->lsrd + (size_t)ls * W;
            if (rd[i >> 6] >> (i & 63) & 1) {
                if (!w->lsnever[ls])
                    ok = 0; /* moving i would move a free */
            } else if (w->lsalloc[ls] == i && w->lsb[ls] > 0 && !w->lsnever[ls]) {
                int read = 0;
                for (z = 0; z < W; z++)
                    if (rd[z])
                        read = 1;
                if (!read)
                    ok = 0; /* a transient allocation */
            }
        }
        w->glued[i] = (uint8_t)ok;
    }
    memset(w->gptr, 0, sizeof(int32_t) * ((size_t)k + 1));
    for (i = 0; i < k; i++)
        if (w->glued[i])
            w->gptr[w->lsucc[w->lsptr[i]] + 1]++;
    for (i = 0; i < k; i++)
        w->gptr[i + 1] += w->gptr[i];
    for (i = 0; i < k; i++)
        w->path[i] = w->gptr[i];
    for (i = 0; i < k; i++)
        if (w->glued[i]) {
            int32_t u = w->lsucc[w->lsptr[i]];
            w->gidx[w->path[u]++] = i;
            w->pmask[(size_t)u * W + (size_t)(i >> 6)] &= ~((uint64_t)1 << (i & 63));
        }
    /* ops by lower bound, descending, ties by local index (O(k log k):
     * large pieces reach the DP, NOTE [DP piece size]) */
    if ((st = grow(ctx, (void **)&w->sortk, &w->c_sortk, (size_t)k * 2, sizeof(lb_key), 0)))
        return st;
    for (i = 0; i < k; i++) {
        w->sortk[i].lb = w->lbv[i];
        w->sortk[i].idx = i;
    }
    lb_sort(w->sortk, w->sortk + k, k);
    for (i = 0; i < k; i++)
        w->lborder[i] = w->sortk[i].idx;
    *Wout = W;
    return MF_OK;
}

static void seg_unmap(plan_st *P, int32_t a, int32_t b)
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

static int64_t h_of(const seg_ws *w, const uint64_t *S, int32_t k)
{
    int32_t i;
    for (i = 0; i < k; i++) {
        int32_t x = w->lborder[i];
        if (!(S[x >> 6] >> (x & 63) & 1))
            return w->lbv[x];
    }
    return 0;
}

/* Is local op v not in S and all its predecessors in S? */
static int seg_ready(const seg_ws *w, const uint64_t *S, int32_t v, int32_t W)
{
    int32_t q;
    if (S[v >> 6] >> (v & 63) & 1)
        return 0;
    for (q = 0; q < W; q++)
        if (w->pmask[(size_t)v * W + (size_t)q] & ~S[q])
            return 0;
    return 1;
}

/* Live bytes after local op v ran, T = S + v, cost = live(S) + alloc(v). */
static int64_t seg_live_after(const seg_ws *w, const uint64_t *T, int32_t v, int32_t W, int64_t cost)
{
    int64_t live2 = cost;
    int32_t q;
    for (q = w->tptr[v]; q < w->tptr[v + 1]; q++) {
        int32_t ls = w->tidx[q], al = w->lsalloc[ls], z;
        const uint64_t *rd;
        int freed = 1;
        if (w->lsnever[ls])
            continue;
        if (al >= 0 && !(T[al >> 6] >> (al & 63) & 1))
            continue;
        rd = w->lsrd + (size_t)ls * W;
        for (z = 0; z < W; z++)
            if (rd[z] & ~T[z]) {
                freed = 0;
                break;
            }
        if (freed)
            live2 -= w->lsb[ls];
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
static int64_t unit_cost(const seg_ws *w, int32_t v, int64_t live)
{
    int32_t q;
    int64_t c = live + w->ab[v];
    for (q = w->gptr[v]; q < w->gptr[v + 1]; q++)
        c += w->ab[w->gidx[q]];
    return c;
}

/* Apply the unit of v to T (bitset) from live bytes `live`; append its ops to
 * run[*m..].  Returns the live bytes after it. */
static int64_t unit_apply(const seg_ws *w, uint64_t *T, int32_t v, int32_t W, int64_t live, int32_t *run,
                          int32_t *m)
{
    int32_t q;
    for (q = w->gptr[v]; q <= w->gptr[v + 1]; q++) {
        int32_t x = q < w->gptr[v + 1] ? w->gidx[q] : v;
        int64_t cost = live + w->ab[x];
        T[x >> 6] |= (uint64_t)1 << (x & 63);
        live = seg_live_after(w, T, x, W, cost);
        run[(*m)++] = x;
    }
    return live;
}

/* A free move at S (NOTE [piece DP]): the first ready unit v (local order)
 * whose steps cost <= lim and after which live <= live(S).  Returns the
 * number of its ops (0: none), its ops in w->run, the set after it in
 * w->rbits, its live bytes and its largest step cost. */
static int32_t find_free(seg_ws *w, const uint64_t *S, int64_t live, int64_t lim, int32_t k, int32_t W,
                         int64_t *live_out, int64_t *cost_out)
{
    int32_t v;
    for (v = 0; v < k; v++) {
        int64_t cost, lv;
        int32_t m = 0;
        if (w->glued[v] || (cost = unit_cost(w, v, live)) > lim || !seg_ready(w, S, v, W))
            continue;
        memcpy(w->rbits, S, sizeof(uint64_t) * (size_t)W);
        lv = unit_apply(w, w->rbits, v, W, live, w->run, &m);
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
static int dp_over(seg_ws *w, const seg_search *X, int new_state, int32_t m)
{
    size_t ns = (size_t)X->nst + (new_state ? 1 : 0), tab = w->c_tab;
    double b;
    if (new_state && ns * 2 > tab)
        tab *= 2;
    b = (double)mf_grow_cap(w->c_bits, ns * (size_t)X->W, 8) * 8.0 + (double)tab * 4.0 +
        (double)mf_grow_cap(w->c_g, ns, 8) * (8.0 * 4 + 4.0 * 3 + 1.0) +
        (double)mf_grow_cap(w->c_heap, X->hn + 1, sizeof(hentry)) * (double)sizeof(hentry) +
        (double)mf_grow_cap(w->c_pool, m > 1 ? w->n_pool + (size_t)m + 1 : 0, 4) * 4.0;
    if (b <= (double)w->mem_limit)
        return 0;
    w->over_budget = 1;
    return 1;
}

/* Reach state T (bitset) from state s by the ops run[0..m): insert it, or
 * lower its f; push it on the heap.  Sets X->capped when a new state would
 * exceed the job's cap. */
static int seg_relax(plan_st *P, seg_job *J, seg_search *X, int32_t s, const uint64_t *T, int64_t g2,
                     int64_t live2, const int32_t *run, int32_t m)
{
    mf_ctx *ctx = P->ctx;
    seg_ws *w = P->sw;
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
    while ((t = w->tab[h]) >= 0) {
        if (w->hash[t] == hv && !memcmp(w->bits + (size_t)t * W, T, sizeof(uint64_t) * (size_t)W))
            break;
        h = (h + 1) & X->tmask;
    }
    if (t >= 0) {
        if (w->closed[t] || f2 >= w->fval[t])
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
        memcpy(w->bits + (size_t)t * W, T, sizeof(uint64_t) * (size_t)W);
        w->hash[t] = hv;
        w->tab[h] = t;
        w->closed[t] = 0;
        w->depth[t] = w->depth[s] + m;
        if ((size_t)X->nst * 2 > w->c_tab) {
            if ((st = table_rebuild(ctx, w, w->c_tab * 2, X->nst)))
                return st;
            X->tmask = w->c_tab - 1;
        }
    }
    if (m == 1) {
        w->last[t] = run[0];
    } else {
        if (w->n_pool + (size_t)m + 1 > (size_t)INT32_MAX)
            return mf_set_error(ctx, MF_ENOMEM, "out of memory (DP path pool)");
        if ((st = grow(ctx, (void **)&w->pool, &w->c_pool, w->n_pool + (size_t)m + 1, sizeof(int32_t), 1)))
            return st;
        w->last[t] = -1 - (int32_t)w->n_pool;
        w->pool[w->n_pool++] = m;
        memcpy(w->pool + w->n_pool, run, sizeof(int32_t) * (size_t)m);
        w->n_pool += (size_t)m;
    }
    w->g[t] = g2;
    w->live[t] = live2;
    w->fval[t] = f2;
    w->parent[t] = s;
    e.f = f2;
    e.depth = w->depth[t];
    e.idx = t;
    return heap_push(ctx, w, &X->hn, e);
}

static int seg_solve(plan_st *P, seg_job *J)
{
    mf_ctx *ctx = P->ctx;
    seg_ws *w = P->sw;
    int32_t k = J->b - J->a, W, i, goal = -1;
    seg_search X;
    int st;
    hentry e;

    memset(&X, 0, sizeof X);
    J->outcome = SEG_NO_BETTER;
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
    w->n_pool = 0;
    if ((st = states_reserve(ctx, w, 1024, W)))
        goto out;
    if ((st = table_rebuild(ctx, w, 2048, 0)))
        goto out;
    X.tmask = w->c_tab - 1;
    memset(w->bits, 0, sizeof(uint64_t) * (size_t)W);
    w->hash[0] = hash_bits(w->bits, W);
    w->g[0] = 0;
    w->live[0] = J->live0;
    w->parent[0] = -1;
    w->last[0] = -1;
    w->depth[0] = 0;
    w->closed[0] = 0;
    {
        int64_t f0 = h_of(w, w->bits, k);
        if (f0 < J->F)
            f0 = J->F;
        w->fval[0] = f0;
        if (f0 >= J->U) {
            J->bound = f0;
            goto out;
        }
        w->tab[(size_t)w->hash[0] & X.tmask] = 0;
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
        if (w->closed[s] || e.f != w->fval[s])
            continue;
        w->closed[s] = 1;
        J->bound = e.f;
        if (w->depth[s] == k) {
            goal = s;
            break;
        }
        /* NOTE [piece DP] free moves: look for one first */
        lim = w->g[s] > J->F ? w->g[s] : J->F;
        m = find_free(w, w->bits + (size_t)s * W, w->live[s], lim, k, W, &live2, &maxc);
        if (m > 0) {
            if (maxc < w->g[s])
                maxc = w->g[s];
            /* w->rbits is the set after the unit; copy it, the state array may move */
            memcpy(w->tbits, w->rbits, sizeof(uint64_t) * (size_t)W);
            if ((st = seg_relax(P, J, &X, s, w->tbits, maxc, live2, w->run, m)))
                goto out;
        } else {
            for (v = 0; v < k; v++) {
                uint64_t *T = w->tbits;
                const uint64_t *S = w->bits + (size_t)s * W; /* re-read: the state array may move */
                int64_t cost, g2;
                int32_t m1 = 0;
                if (w->glued[v] || !seg_ready(w, S, v, W))
                    continue;
                cost = unit_cost(w, v, w->live[s]);
                if (cost >= J->U)
                    continue;
                g2 = w->g[s] > cost ? w->g[s] : cost;
                memcpy(T, S, sizeof(uint64_t) * (size_t)W);
                live2 = unit_apply(w, T, v, W, w->live[s], w->run, &m1);
                if ((st = seg_relax(P, J, &X, s, T, g2, live2, w->run, m1)))
                    goto out;
                if (X.capped)
                    break;
            }
        }
        if (X.capped) {
            J->outcome = SEG_CAPPED;
            goto out;
        }
    }
    if (goal >= 0) {
        /* the ops along the path to the goal; then rewrite cur[a..b) and
         * refresh pos, dur, lbef by replaying them */
        int32_t s = goal, np = 0, o = 0;
        int64_t live = J->live0;
        while (w->parent[s] >= 0) {
            w->path[np++] = s;
            s = w->parent[s];
        }
        while (np > 0) {
            int32_t t = w->path[--np], c = w->last[t];
            if (c >= 0) {
                w->run[o++] = c;
            } else {
                const int32_t *r = w->pool + (-1 - c);
                memcpy(w->run + o, r + 1, sizeof(int32_t) * (size_t)r[0]);
                o += r[0];
            }
        }
        if (o != k) {
            st = mf_set_error(ctx, MF_EINTERNAL, "piece DP path has %d ops, expected %d", (int)o, (int)k);
            goto out;
        }
        memset(w->tbits, 0, sizeof(uint64_t) * (size_t)W);
        for (i = 0; i < k; i++) {
            int32_t lv = w->run[i], v = w->ops[lv];
            int64_t cost = live + w->ab[lv];
            P->cur[J->a + i] = v;
            P->pos[v] = J->a + i;
            P->lbef[J->a + i] = live;
            P->dur[J->a + i] = cost;
            w->tbits[lv >> 6] |= (uint64_t)1 << (lv & 63);
            live = seg_live_after(w, w->tbits, lv, W, cost);
        }
        J->outcome = SEG_IMPROVED;
    }
out:
    J->states = X.nst;
    /* the maps must be clean for the next call; cur[a..b) holds the same ops */
    seg_unmap(P, J->a, J->b);
    return st;
}

/* ------------------------------------------------------------------ */
/* mf_plan                                                             */

/* NOTE [windows]
 * Step 6 runs the DP on a window cur[a..b) around the plan's peak step pk:
 * only orders of the window with every step < pk are wanted (U = pk), steps
 * at or below the largest step outside the window are free (F).  Any order
 * of a contiguous range of a valid order that respects the edges inside it
 * is valid (what ran before a still does, what ran after b still does), the
 * live bytes before a are unchanged, and the steps after b see the same
 * sets; so an accepted window lowers the number of steps at pk by at least
 * one and raises none: the plan's peak never rises.  Windows prove nothing
 * (they never raise F), and stop at the first one that finds nothing.
 * Growing windows: in a piece of more than `small` ops (NOTE [DP piece
 * size]: its DP ran with a scaled share or not at all) a window that finds
 * nothing is doubled around the same peak, up to `small` ops (each run then
 * costs no more per state than a small piece's DP), each run capped at
 * win_cap and all of them within the windows' budget (NOTE [state
 * budget]); after a success the length is kept.  The windows in a piece of
 * at most `small` ops keep MF_WIN_LEN: its DP already searched the whole
 * piece and was capped, and larger windows there only repeat that search
 * (benchmarks/scheduler_scaling.py's 12-16-path blocks: no lower peak with
 * larger windows, more states; benchmarks/RESULTS.md, "Scheduler
 * scaling").  A grown window that reaches the piece's end keeps its length
 * by starting earlier.  In a large piece whose scaled DP is capped (the
 * checkpointed nanoGPT backward), the short windows stop early and longer
 * ones around the peak still find a little more; what each length found is
 * in benchmarks/RESULTS.md, "A real model". */

/* The state cap of the DP over a piece of k ops (NOTE [DP piece size], NOTE
 * [state budget]); 0: no DP. */
static int64_t piece_cap(int64_t run_cap, int32_t k, int32_t small)
{
    double r;
    int64_t c;
    if (k <= small)
        return run_cap;
    if (k > (int64_t)MF_DP_BIG_FACTOR * small)
        return 0;
    r = (double)small / (double)k;
    c = (int64_t)((double)run_cap * r * r);
    return c > 0 ? c : 1;
}

static const char *const HEUR_NAMES[] = {"input", "greedy", "greedy-peak", "dfs"};
#define N_HEUR 4

static int plan_body(mf_ctx *ctx, mf_arena *a, seg_ws *sw, const mf_graph_desc *g,
                     const mf_plan_options *opt, mf_plan_result *out)
{
    mf_pg pg;
    mf_tracker tr;
    mf_heur_ws hw;
    plan_st P;
    int32_t n = g->n_ops, i, k, h, best_h = -1, np = 0;
    int32_t *scratch, *hord[N_HEUR], *piece_of, *poff, *pfill, *cand;
    int64_t hpeak[N_HEUR], LB = 0, U, F, budget, win_budget, states = 0, peak, sim_peak;
    int64_t max_states = (opt && opt->max_states > 0) ? opt->max_states : MF_DEFAULT_MAX_STATES;
    /* NOTE [state budget]
     * max_states bounds the DP states one mf_plan call creates, all DP runs
     * together.  One piece DP may create at most
     * run_cap = max(max_states / 4, min(max_states, 4096)) and one window
     * win_cap = max(max_states / 32, min(max_states, 1024)), so a graph of
     * many hard pieces stays within time (the cost of a state is a roughly
     * fixed amount of work; plan times: benchmarks/RESULTS.md) instead of
     * spending the whole budget on its first piece.  Pieces are solved from
     * the highest peak down; the first one left unproven (capped, too large,
     * out of budget) ends the piece loop, since no later piece can then
     * lower the plan's peak; windows continue with what is left, at most
     * max(max_states / 4, win_cap) states in all.  A piece of k > small ops
     * (NOTE [DP piece size]) gets run_cap * (small / k)^2, at least one
     * state, none above MF_DP_BIG_FACTOR * small ops. */
    int64_t run_cap = max_states / 4 > (max_states < 4096 ? max_states : 4096)
                          ? max_states / 4
                          : (max_states < 4096 ? max_states : 4096);
    int64_t win_cap = max_states / 32 > (max_states < 1024 ? max_states : 1024)
                          ? max_states / 32
                          : (max_states < 1024 ? max_states : 1024);
    int32_t small = (opt && opt->dp_max_ops > 0 && opt->dp_max_ops < MF_DP_MAX_OPS) ? opt->dp_max_ops
                                                                                      : MF_DP_MAX_OPS;
    int32_t wlen0 = MF_WIN_LEN < small / 4 ? MF_WIN_LEN : (small / 4 > 2 ? small / 4 : 2), wlen;
    int fuse = opt ? opt->fuse : 1, improved = 0, mixed = 0, liu_kept = 0;
    int st;

    memset(&P, 0, sizeof P);
    P.sw = sw;
    sw->mem_limit = (opt && opt->max_dp_bytes > 0) ? opt->max_dp_bytes : MF_DEFAULT_DP_BYTES;
    st = mf_pg_build(ctx, a, g, &pg);
    if (st)
        return st;
    if ((st = mf_tracker_init(ctx, a, &pg, &tr)) || (st = mf_heur_ws_init(ctx, a, &pg, &hw)))
        return st;
    scratch = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    for (h = 0; h < N_HEUR; h++)
        if (!(hord[h] = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t))))
            return MF_ENOMEM;
    if (!scratch)
        return MF_ENOMEM;

    /* 1-2: baseline (NOTE [baseline order], mf_order.c: valid, the input
     * order itself when that is valid), lower bound */
    if ((st = mf_baseline_order(ctx, a, &pg, hord[0])) ||
        (st = mf_pg_simulate(ctx, a, &pg, hord[0], NULL, n, &out->baseline_peak_bytes, NULL, NULL)))
        return st;
    LB = pg.outbytes;
    for (k = 0; k < n; k++)
        if (pg.oplb[k] > LB)
            LB = pg.oplb[k];
    out->lower_bound_bytes = LB;

    /* 3: heuristics (the baseline order is the first) */
    mf_greedy_order(&pg, &hw, 0, hord[1]);
    mf_greedy_order(&pg, &hw, 1, hord[2]);
    mf_dfs_order(&pg, &hw, hord[3]);
    for (h = 0; h < N_HEUR; h++) {
        hpeak[h] = mf_tracker_peak(&tr, hord[h], n);
        if (best_h < 0 || hpeak[h] < hpeak[best_h])
            best_h = h;
    }
    U = hpeak[best_h];

    P.ctx = ctx;
    P.pg = &pg;
    P.cur = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    P.pos = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    P.dur = (int64_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int64_t));
    P.lbef = (int64_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int64_t));
    if (!P.cur || !P.pos || !P.dur || !P.lbef)
        return MF_ENOMEM;
    F = LB;
    if (U <= LB) {
        memcpy(P.cur, hord[best_h], sizeof(int32_t) * (size_t)n);
        out->method = "lower-bound";
    } else {
        /* 4: pieces, best restriction of each heuristic per piece */
        int32_t *order_of_piece, *liu_buf = NULL;
        int64_t *ppeak, *plive0;
        mf_liu_ws lw;
        int8_t *pdone;
        uint8_t *kind, *emitted;
        piece_of = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
        kind = (uint8_t *)mf_arena_array(ctx, a, (size_t)n + 1, 1);
        emitted = (uint8_t *)mf_arena_array(ctx, a, (size_t)n + 1, 1);
        if (!piece_of || !kind || !emitted)
            return MF_ENOMEM;
        if ((st = mf_find_pieces(ctx, a, &pg, hord[best_h], piece_of, kind, &np)))
            return st;
        poff = (int32_t *)mf_arena_array(ctx, a, (size_t)np + 1, sizeof(int32_t));
        pfill = (int32_t *)mf_arena_array(ctx, a, (size_t)np + 1, sizeof(int32_t));
        cand = (int32_t *)mf_arena_array(ctx, a, (size_t)n * N_HEUR + 1, sizeof(int32_t));
        ppeak = (int64_t *)mf_arena_array(ctx, a, (size_t)np + 1, sizeof(int64_t));
        plive0 = (int64_t *)mf_arena_array(ctx, a, (size_t)np + 1, sizeof(int64_t));
        pdone = (int8_t *)mf_arena_array(ctx, a, (size_t)np + 1, 1);
        order_of_piece = (int32_t *)mf_arena_array(ctx, a, (size_t)np + 1, sizeof(int32_t));
        P.sw->lmap = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
        P.sw->smap = (int32_t *)mf_arena_array(ctx, a, (size_t)pg.ns + 1, sizeof(int32_t));
        if (!poff || !pfill || !cand || !ppeak || !plive0 || !pdone || !order_of_piece || !P.sw->lmap ||
            !P.sw->smap)
            return MF_ENOMEM;
        for (k = 0; k < n; k++) {
            P.sw->lmap[k] = -1;
            poff[piece_of[k] + 1]++;
        }
        for (k = 0; k < pg.ns; k++)
            P.sw->smap[k] = -1;
        for (i = 0; i < np; i++)
            poff[i + 1] += poff[i];
        for (h = 0; h < N_HEUR; h++) {
            int32_t *c = cand + (size_t)h * n;
            /* NOTE [normalized candidates]: each heuristic order is split by
             * piece with every floating op moved to just before its first
             * successor (NOTE [cut points]), trailing ops at the end and
             * absorbed sinks in their piece (NOTE [sinks]); the
             * concatenation is then never worse than the heuristic order
             * itself, so the plan is never worse than the best heuristic,
             * the input order included. */
            memcpy(pfill, poff, sizeof(int32_t) * (size_t)np);
            memset(emitted, 0, (size_t)n);
            for (i = 0; i < n; i++) {
                int32_t v = hord[h][i], j;
                if (kind[v] == 1)
                    continue;
                for (j = pg.pred_ptr[v]; j < pg.pred_ptr[v + 1]; j++) {
                    int32_t p = pg.pred[j];
                    if (kind[p] == 1 && !emitted[p]) {
                        emitted[p] = 1;
                        c[pfill[piece_of[p]]++] = p;
                    }
                }
                c[pfill[piece_of[v]]++] = v;
            }
        }
        mf_tracker_reset(&tr);
        for (i = 0; i < np; i++) {
            int32_t lo = poff[i], hi = poff[i + 1], j, bh = -1;
            int64_t live0 = tr.live, bpk = INT64_MAX;
            plive0[i] = live0;
            for (h = 0; h < N_HEUR; h++) {
                const int32_t *c = cand + (size_t)h * n;
                int64_t pk = 0;
                for (j = lo; j < hi; j++) {
                    int64_t d = mf_tracker_apply(&tr, c[j]);
                    if (d > pk)
                        pk = d;
                }
                for (j = lo; j < hi; j++)
                    mf_tracker_undo(&tr, c[j]);
                tr.live = live0;
                if (pk < bpk || (pk == bpk && h == best_h)) {
                    bpk = pk;
                    bh = h;
                }
            }
            if (bh != best_h)
                mixed = 1;
            memcpy(P.cur + lo, cand + (size_t)bh * n + lo, sizeof(int32_t) * (size_t)(hi - lo));
            /* Liu's hill/valley merging (NOTE [liu merge] in mf_liu.c): more
             * candidates for the piece, kept when strictly better.  The
             * second pass counts a storage shared by several ops of the
             * piece as freed by the one the first pass ran last.  Pieces
             * already at or below the lower bound LB are left alone: the
             * plan's peak cannot go below LB (the DP skips them too). */
            if (bpk > LB) {
                int applied = 1, pass;
                if (!liu_buf) { /* first use: workspace for the largest piece */
                    int32_t mk = 0, q;
                    for (q = 0; q < np; q++)
                        if (poff[q + 1] - poff[q] > mk)
                            mk = poff[q + 1] - poff[q];
                    liu_buf = (int32_t *)mf_arena_array(ctx, a, (size_t)mk * 2 + 1, sizeof(int32_t));
                    if (!liu_buf)
                        return MF_ENOMEM;
                    if ((st = mf_liu_init(ctx, a, &pg, piece_of, mk, &lw)))
                        return st;
                }
                for (pass = 0; pass < 2 && applied; pass++) {
                    int32_t *lo_buf = liu_buf + (size_t)pass * (size_t)lw.max_k;
                    int64_t pk = 0;
                    if ((st = mf_liu_order(ctx, &lw, P.cur + lo, hi - lo, i, pass ? liu_buf : NULL, lo_buf,
                                           &applied)))
                        return st;
                    if (!applied)
                        break;
                    for (j = 0; j < hi - lo; j++) {
                        int64_t d = mf_tracker_apply(&tr, lo_buf[j]);
                        if (d > pk)
                            pk = d;
                    }
                    for (j = 0; j < hi - lo; j++)
                        mf_tracker_undo(&tr, lo_buf[j]);
                    tr.live = live0;
                    if (pk < bpk) {
                        bpk = pk;
                        liu_kept = 1;
                        memcpy(P.cur + lo, lo_buf, sizeof(int32_t) * (size_t)(hi - lo));
                    }
                }
            }
            ppeak[i] = bpk;
            for (j = lo; j < hi; j++) {
                P.lbef[j] = tr.live;
                P.dur[j] = mf_tracker_apply(&tr, P.cur[j]);
                P.pos[P.cur[j]] = j;
            }
        }
        /* 5: DP per piece, highest peak first (selection by a sort on ppeak) */
        {
            mf_iheap q; /* pieces by peak, descending */
            int64_t *negpk = (int64_t *)mf_arena_array(ctx, a, (size_t)np + 1, sizeof(int64_t));
            int64_t *zero = (int64_t *)mf_arena_array(ctx, a, (size_t)np + 1, sizeof(int64_t));
            q.h = (int32_t *)mf_arena_array(ctx, a, (size_t)np + 1, sizeof(int32_t));
            q.at = (int32_t *)mf_arena_array(ctx, a, (size_t)np + 1, sizeof(int32_t));
            if (!negpk || !zero || !q.h || !q.at)
                return MF_ENOMEM;
            for (i = 0; i < np; i++)
                negpk[i] = -ppeak[i];
            q.k1 = negpk;
            q.k2 = zero;
            q.size = 0;
            for (i = 0; i < np; i++)
                mf_ih_push(&q, i);
            for (i = 0; i < np; i++)
                order_of_piece[i] = mf_ih_pop(&q);
        }
        budget = max_states;
        for (i = 0; i < np; i++) {
            int32_t p = order_of_piece[i];
            int64_t pcap;
            seg_job J;
            if (ppeak[p] <= F) {
                pdone[p] = 1;
                continue;
            }
            /* the first piece left unproven has the highest peak among the
             * rest: no later piece can lower the plan's peak below it */
            pcap = piece_cap(run_cap, poff[p + 1] - poff[p], small);
            if (pcap <= 0 || budget <= 0 || sw->over_budget)
                break;
            memset(&J, 0, sizeof J);
            J.a = poff[p];
            J.b = poff[p + 1];
            J.live0 = plive0[p];
            J.U = ppeak[p];
            J.F = F;
            J.cap = budget < pcap ? budget : pcap;
            if ((st = seg_solve(&P, &J)))
                return st;
            states += J.states;
            budget -= J.states;
            if (J.outcome == SEG_IMPROVED) {
                int64_t np_ = 0;
                int32_t j;
                for (j = poff[p]; j < poff[p + 1]; j++)
                    if (P.dur[j] > np_)
                        np_ = P.dur[j];
                ppeak[p] = np_;
                improved = 1;
                pdone[p] = 1;
                if (J.bound > F)
                    F = J.bound;
            } else if (J.outcome == SEG_NO_BETTER) {
                pdone[p] = 1;
                if (ppeak[p] > F)
                    F = ppeak[p];
            } else {
                if (J.bound > F)
                    F = J.bound;
                break;
            }
        }
        /* 6: windows around the peak step of unfinished pieces (NOTE
         * [windows]) */
        win_budget = budget < max_states / 4 ? budget : max_states / 4;
        if (win_budget < win_cap && budget >= win_cap)
            win_budget = win_cap;
        wlen = wlen0;
        for (i = 0; i < MF_WIN_ITERS && win_budget > 0 && !sw->over_budget; i++) {
            int32_t pp = 0, j, p, wa, wb, big;
            int64_t pk = -1, floor_ = F;
            seg_job J;
            for (j = 0; j < n; j++)
                if (P.dur[j] > pk) {
                    pk = P.dur[j];
                    pp = j;
                }
            if (pk <= F)
                break;
            p = piece_of[P.cur[pp]];
            if (pdone[p])
                break; /* the peak is in a proven piece: cannot improve */
            big = poff[p + 1] - poff[p] > small;
            if (!big)
                wlen = wlen0;
            wa = pp - wlen / 2;
            if (wa < poff[p])
                wa = poff[p];
            wb = wa + wlen;
            if (wb > poff[p + 1]) {
                wb = poff[p + 1];
                if (big) /* a grown window keeps its length at the piece's end */
                    wa = wb - wlen > poff[p] ? wb - wlen : poff[p];
            }
            if (wb - wa < 2)
                break;
            for (j = 0; j < n; j++)
                if ((j < wa || j >= wb) && P.dur[j] < pk && P.dur[j] > floor_)
                    floor_ = P.dur[j];
            memset(&J, 0, sizeof J);
            J.a = wa;
            J.b = wb;
            J.live0 = P.lbef[wa];
            J.U = pk;
            J.F = floor_;
            J.cap = win_budget < win_cap ? win_budget : win_cap;
            if ((st = seg_solve(&P, &J)))
                return st;
            states += J.states;
            win_budget -= J.states;
            if (J.outcome != SEG_IMPROVED) {
                /* NOTE [windows]: in a piece the DP could not take whole,
                 * try twice the window around the same peak */
                if (big && wlen < small && wb - wa == wlen) {
                    wlen = 2 * wlen < small ? 2 * wlen : small;
                    continue;
                }
                break;
            }
            improved = 1;
        }
        if (improved)
            out->method = "dp";
        else if (liu_kept)
            out->method = "liu";
        else if (mixed)
            out->method = "pieces";
        else
            out->method = HEUR_NAMES[best_h];
    }

    /* 7: final checks, fusion grouping */
    out->order = (int32_t *)mf_alloc(ctx, sizeof(int32_t) * ((size_t)n + 1));
    out->group_ptr = (int32_t *)mf_alloc(ctx, sizeof(int32_t) * ((size_t)n + 1));
    if (!out->order || !out->group_ptr)
        return MF_ENOMEM;
    memcpy(out->order, P.cur, sizeof(int32_t) * (size_t)n);
    out->n_ops = n;
    if (!mf_pg_order_valid(&pg, out->order, scratch))
        return mf_set_error(ctx, MF_EINTERNAL, "scheduler produced an invalid order");
    if ((st = mf_pg_simulate(ctx, a, &pg, out->order, NULL, n, &peak, NULL, NULL)))
        return st;
    if (peak != mf_tracker_peak(&tr, out->order, n))
        return mf_set_error(ctx, MF_EINTERNAL, "tracker and simulator disagree on the peak");
    /* NOTE [never worse]: neither fallback below can trigger (NOTE
     * [normalized candidates]); they stay as the interface's guarantee.  The
     * tests build with MF_STRICT_CHECKS, which turns them into errors. */
#ifdef MF_STRICT_CHECKS
    if (out->baseline_peak_bytes < peak || U < peak)
        return mf_set_error(ctx, MF_EINTERNAL, "plan peak %lld above the input (%lld) or heuristic (%lld) order",
                            (long long)peak, (long long)out->baseline_peak_bytes, (long long)U);
#endif
    if (out->baseline_peak_bytes < peak) {
        memcpy(out->order, hord[0], sizeof(int32_t) * (size_t)n);
        peak = out->baseline_peak_bytes;
        out->method = "input";
    }
    if (U < peak) {
        memcpy(out->order, hord[best_h], sizeof(int32_t) * (size_t)n);
        peak = U;
        out->method = HEUR_NAMES[best_h];
    }
    out->unfused_peak_bytes = peak;
    out->optimal = peak <= F;
    out->states = states;
    if (out->optimal)
        out->method = states == 0 ? "lower-bound" : "dp";
    else if (improved)
        out->method = "dp-partial";
    if ((st = mf_fuse_group(ctx, a, &pg, out->order, fuse, out->group_ptr, &out->n_groups, &out->peak_bytes)))
        return st;
    /* 8: fusion-aware moves (NOTE [fusion-aware moves] in mf_fuse.c), from the
     * planned order and from the best heuristic order: the moves are a local
     * search, and the DPs' last unfused gains can put the planned order in
     * a worse basin for regions (nanoGPT's checkpointed backward reaches a
     * lower fused peak from the heuristic order: benchmarks/RESULTS.md, "A
     * real model").  The lower fused peak reached by moves is kept. */
    if (fuse && !(opt && opt->no_fusion_moves)) {
        int32_t ng2 = 0, c, n_starts;
        int32_t *ord2 = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
        int32_t *gp2 = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
        int64_t pk2 = 0;
        if (!ord2 || !gp2)
            return MF_ENOMEM;
        /* the planned order may be the heuristic one: then one start */
        n_starts = memcmp(hord[best_h], out->order, sizeof(int32_t) * (size_t)n) ? 2 : 1;
        for (c = 0; c < n_starts; c++) {
            int32_t moves = 0;
            memcpy(ord2, c == 0 ? out->order : hord[best_h], sizeof(int32_t) * (size_t)n);
            if ((st = mf_fuse_refine(ctx, a, &pg, ord2, &moves)))
                return st;
            if (moves == 0)
                continue;
            if (!mf_pg_order_valid(&pg, ord2, scratch))
                return mf_set_error(ctx, MF_EINTERNAL, "fusion-aware moves produced an invalid order");
            if ((st = mf_fuse_group(ctx, a, &pg, ord2, fuse, gp2, &ng2, &pk2)))
                return st;
            if (pk2 < out->peak_bytes) {
                memcpy(out->order, ord2, sizeof(int32_t) * (size_t)n);
                memcpy(out->group_ptr, gp2, sizeof(int32_t) * ((size_t)ng2 + 1));
                out->n_groups = ng2;
                out->peak_bytes = pk2;
                out->fusion_moves = moves;
                peak = mf_tracker_peak(&tr, out->order, n);
                out->unfused_peak_bytes = peak;
                out->optimal = peak <= F;
            }
        }
    }
    /* 9: collectives early, waits late, within the plan's peaks (mf_comm.c) */
    if (!(opt && opt->no_comm_overlap) &&
        (st = mf_comm_place(ctx, a, &pg, g->comm, out->order, out->group_ptr, out->n_groups, &out->peak_bytes,
                            &out->unfused_peak_bytes, &out->comm_moves)))
        return st;
    peak = out->unfused_peak_bytes;
    if ((st = mf_pg_simulate(ctx, a, &pg, out->order, out->group_ptr, out->n_groups, &sim_peak, NULL, NULL)))
        return st;
    if (sim_peak != out->peak_bytes || out->peak_bytes > peak)
        return mf_set_error(ctx, MF_EINTERNAL, "fusion grouping peak %lld disagrees with the simulator (%lld)",
                            (long long)out->peak_bytes, (long long)sim_peak);
    return MF_OK;
}

int mf_plan(mf_ctx *ctx, const mf_graph_desc *g, const mf_plan_options *opt, mf_plan_result *out)
{
    mf_arena a = {NULL};
    seg_ws sw;
    int st;
    memset(out, 0, sizeof *out);
    memset(&sw, 0, sizeof sw);
    out->method = "none";
    st = mf_graph_check(ctx, g);
    if (st)
        return st;
    st = plan_body(ctx, &a, &sw, g, opt, out);
    seg_ws_free(ctx, &sw);
    mf_arena_release(ctx, &a);
    if (st) {
        mf_plan_result_free(ctx, out);
        out->method = "none";
    }
    return st;
}

void mf_plan_result_free(mf_ctx *ctx, mf_plan_result *r)
{
    if (!r)
        return;
    mf_free(ctx, r->order);
    mf_free(ctx, r->group_ptr);
    memset(r, 0, sizeof *r);
}
