/*
 * test_core.c -- tests of the thunder_memfuse C core (csrc/core).
 *
 * The reference model here is written from NOTE [cost model] in mf_core.h
 * independently of the core: a literal per-step simulation, a brute-force
 * enumerator of valid orders (with branch and bound), an exhaustive DP over
 * all subsets for medium graphs, and an enumerator of all groupings.  The
 * core must agree with it on hundreds of random graphs.  An injectable
 * allocator fails the Nth allocation to check cleanup (no leaks: counted
 * here, and LeakSanitizer in `make sanitize`).
 */
#define _POSIX_C_SOURCE 200809L
#include "mf_build.h"
#include "mf_core.h"
#include "mf_internal.h" /* white-box: mf_liu_order (NOTE [liu merge] in mf_liu.c) */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_util.h"

int mf_test_kinds_ok(const mf_graph_desc *d, const mf_plan_result *r); /* test_kinds.c */

static int g_failures = 0;
static int g_checks = 0;

#define CHECK(cond, ...) MF_TEST_CHECK(g_checks, g_failures, cond, __VA_ARGS__)

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- PRNG ---- */
static uint64_t rng_state = 88172645463325252ULL;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static int rint_(int n) /* [0, n) */
{
    return (int)(rnd() % (uint64_t)n);
}

/* ---- test graph builder: a thin face on the core's mf_gbuf (mf_build.h) ---- */
typedef mf_gbuf tg;

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "out of memory in test\n");
        exit(2);
    }
    return q;
}

static void tg_check(const tg *g)
{
    if (g->nomem) {
        fprintf(stderr, "out of memory in test: %s\n", g->ctx.err);
        exit(2);
    }
}

static void tg_init(tg *g)
{
    mf_gbuf_init(g, NULL);
}

static void tg_free(tg *g)
{
    mf_gbuf_free(g);
}

static int tg_value(tg *g, int64_t bytes, int input, int alias_of, int output)
{
    int v = mf_gbuf_add_value(g, bytes, input);
    tg_check(g);
    g->alias_of[v] = alias_of;
    g->is_output[v] = (uint8_t)output;
    return v;
}

/* fusible: 0, 1 (MF_FUSIBLE) or MF_FUSIBLE_STORED, kept as given */
static int tg_op(tg *g, const int *ins, int nin, const int *outs, int nout, int fusible)
{
    int k = g->n_ops, i;
    mf_gbuf_begin_op(g, fusible);
    for (i = 0; i < nin; i++)
        mf_gbuf_op_in(g, ins[i]);
    for (i = 0; i < nout; i++)
        mf_gbuf_op_out(g, outs[i]);
    mf_gbuf_end_op(g);
    tg_check(g);
    return k;
}

static void tg_after(tg *g, int a, int b)
{
    mf_gbuf_after(g, a, b);
    tg_check(g);
}

static mf_graph_desc tg_desc(const tg *g)
{
    mf_graph_desc d;
    mf_gbuf_desc(g, &d);
    return d;
}

/* ---- reference model (from the header's NOTE, literally) ---- */
#define RMAX 64 /* ops in reference computations that use masks */

typedef struct ref {
    int n, ns;
    int sroot[1024];          /* storage -> root value */
    int64_t sb[1024];
    int salloc[1024];
    int sout[1024];
    int smat[1024];           /* touched by an MF_FUSIBLE_STORED op (NOTE [stored inner values]) */
    int epi[RMAX];            /* epilogue_of, or -1 */
    uint64_t sreaders[1024];  /* op mask (n <= 64) */
    uint64_t pred[RMAX];      /* op masks */
    int64_t allocb[RMAX];
} ref;

static int ref_root(const mf_graph_desc *d, int v)
{
    while (d->alias_of && d->alias_of[v] >= 0)
        v = d->alias_of[v];
    return v;
}

static void ref_build(const mf_graph_desc *d, ref *r)
{
    int v, k, j, s;
    int *prod = (int *)calloc((size_t)d->n_values + 1, sizeof(int));
    int *sid = (int *)calloc((size_t)d->n_values + 1, sizeof(int));
    memset(r, 0, sizeof *r);
    r->n = d->n_ops;
    for (v = 0; v < d->n_values; v++)
        prod[v] = -1;
    for (k = 0; k < d->n_ops; k++)
        for (j = d->out_ptr[k]; j < d->out_ptr[k + 1]; j++)
            prod[d->out_idx[j]] = k;
    for (v = 0; v < d->n_values; v++) {
        sid[v] = -1;
        if (ref_root(d, v) == v && !(d->is_input && d->is_input[v])) {
            s = r->ns++;
            r->sroot[s] = v;
            r->sb[s] = d->value_bytes[v];
            r->salloc[s] = prod[v];
            sid[v] = s;
        }
    }
    for (v = 0; v < d->n_values; v++) {
        s = sid[ref_root(d, v)];
        if (s >= 0 && d->is_output && d->is_output[v])
            r->sout[s] = 1;
    }
    for (k = 0; k < d->n_ops; k++) {
        for (j = d->in_ptr[k]; j < d->in_ptr[k + 1]; j++) {
            int x = d->in_idx[j];
            s = sid[ref_root(d, x)];
            if (s >= 0 && k < 64)
                r->sreaders[s] |= 1ULL << k;
            if (prod[x] >= 0 && k < 64)
                r->pred[k] |= 1ULL << prod[x];
        }
        for (j = d->out_ptr[k]; j < d->out_ptr[k + 1]; j++) {
            int x = d->out_idx[j];
            if (d->alias_of && d->alias_of[x] >= 0 && prod[d->alias_of[x]] >= 0 && prod[d->alias_of[x]] != k &&
                k < 64)
                r->pred[k] |= 1ULL << prod[d->alias_of[x]];
        }
    }
    for (k = 0; k < d->n_ops && k < RMAX; k++) {
        r->epi[k] = d->epilogue_of ? d->epilogue_of[k] : -1;
        if (!d->fusible || d->fusible[k] != MF_FUSIBLE_STORED)
            continue;
        for (j = d->in_ptr[k]; j < d->in_ptr[k + 1]; j++)
            if ((s = sid[ref_root(d, d->in_idx[j])]) >= 0)
                r->smat[s] = 1;
        for (j = d->out_ptr[k]; j < d->out_ptr[k + 1]; j++) /* what it allocates: not its views */
            if ((s = sid[d->out_idx[j]]) >= 0)
                r->smat[s] = 1;
    }
    for (j = 0; j < d->n_after; j++)
        if (d->after[2 * j + 1] < 64)
            r->pred[d->after[2 * j + 1]] |= 1ULL << d->after[2 * j];
    for (s = 0; s < r->ns; s++)
        if (r->salloc[s] < 64)
            r->allocb[r->salloc[s]] += r->sb[s];
    free(prod);
    free(sid);
}

/* Live bytes after the set S of ops has run (valid prefixes). */
static int64_t ref_live(const ref *r, uint64_t S)
{
    int64_t live = 0;
    int s;
    for (s = 0; s < r->ns; s++) {
        if (!(S >> r->salloc[s] & 1))
            continue;
        if (r->sout[s] || (r->sreaders[s] & ~S))
            live += r->sb[s];
    }
    return live;
}

/* Literal simulation of an order with groups (any permutation). */
static int64_t ref_sim(const ref *r, const int32_t *order, const int32_t *gp, int ng, int64_t *steps)
{
    int gidx[RMAX], t, s, i;
    int64_t peak = 0;
    if (!gp)
        ng = r->n;
    for (t = 0; t < ng; t++) {
        int lo = gp ? gp[t] : t, hi = gp ? gp[t + 1] : t + 1;
        for (i = lo; i < hi; i++)
            gidx[order[i]] = t;
    }
    for (t = 0; t < ng; t++) {
        int64_t during = 0;
        int size = gp ? gp[t + 1] - gp[t] : 1;
        int pair = size == 2 && r->epi[order[gp[t] + 1]] == order[gp[t]];
        for (s = 0; s < r->ns; s++) {
            int a = gidx[r->salloc[s]], last = -1, outside = 0, k;
            for (k = 0; k < r->n; k++)
                if (r->sreaders[s] >> k & 1) {
                    if (gidx[k] > last)
                        last = gidx[k];
                    if (gidx[k] != a)
                        outside = 1;
                }
            if (a == t) {
                if (size == 1 || r->sout[s] || outside || (r->smat[s] && !pair))
                    during += r->sb[s];
            } else if (a < t) {
                int freed_after = last > a ? last : a;
                if (r->sout[s] || freed_after >= t)
                    during += r->sb[s];
            }
        }
        if (steps)
            steps[t] = during;
        if (during > peak)
            peak = during;
    }
    return peak;
}

/* Brute force over all valid orders with branch and bound. */
typedef struct bf {
    const ref *r;
    int64_t best;
    long nodes;
} bf;

static void bf_rec(bf *b, uint64_t S, int depth, int64_t cur)
{
    const ref *r = b->r;
    int v;
    if (cur >= b->best)
        return;
    if (depth == r->n) {
        b->best = cur;
        return;
    }
    b->nodes++;
    for (v = 0; v < r->n; v++) {
        int64_t d;
        if (S >> v & 1 || (r->pred[v] & ~S))
            continue;
        d = ref_live(r, S) + r->allocb[v];
        bf_rec(b, S | 1ULL << v, depth + 1, d > cur ? d : cur);
    }
}

static int64_t brute_min(const ref *r)
{
    bf b;
    b.r = r;
    b.best = INT64_MAX;
    b.nodes = 0;
    bf_rec(&b, 0, 0, 0);
    return b.best;
}

/* Exhaustive DP over all subsets (n <= 22). */
static int64_t subset_min(const ref *r)
{
    size_t N = (size_t)1 << r->n, S;
    int64_t *best = (int64_t *)malloc(sizeof(int64_t) * N), res;
    int v;
    best[0] = 0;
    for (S = 1; S < N; S++) {
        int64_t b = INT64_MAX;
        for (v = 0; v < r->n; v++) {
            size_t T;
            int64_t c;
            if (!(S >> v & 1))
                continue;
            T = S & ~((size_t)1 << v);
            if (best[T] == INT64_MAX || (r->pred[v] & ~(uint64_t)T))
                continue;
            c = ref_live(r, T) + r->allocb[v];
            if (c < best[T])
                c = best[T];
            if (c < b)
                b = c;
        }
        best[S] = b;
    }
    res = best[N - 1];
    free(best);
    return res;
}

static int ref_valid(const ref *r, const int32_t *order)
{
    uint64_t S = 0;
    int i;
    for (i = 0; i < r->n; i++) {
        int v = order[i];
        if (S >> v & 1 || (r->pred[v] & ~S))
            return 0;
        S |= 1ULL << v;
    }
    return 1;
}

/* The baseline order (mf_order.c NOTE [baseline order]): the smallest
 * ready op id first. */
static void ref_stable_order(const ref *r, int32_t *order)
{
    uint64_t S = 0;
    int i, k;
    for (i = 0; i < r->n; i++) {
        for (k = 0; k < r->n && (S >> k & 1 || (r->pred[k] & ~S)); k++)
            ;
        order[i] = k;
        S |= 1ULL << k;
    }
}

/* A random valid order. */
static void ref_random_order(const ref *r, int32_t *order)
{
    uint64_t S = 0;
    int i, k, ready[RMAX], nr;
    for (i = 0; i < r->n; i++) {
        nr = 0;
        for (k = 0; k < r->n; k++)
            if (!(S >> k & 1) && !(r->pred[k] & ~S))
                ready[nr++] = k;
        order[i] = ready[rint_(nr)];
        S |= 1ULL << order[i];
    }
}

/* All groupings of an order: least peak, then fewest groups. */
static void brute_groups(const ref *r, const mf_graph_desc *d, const int32_t *order, int64_t *min_peak,
                         int *min_groups)
{
    int n = r->n;
    uint32_t mask, M = n > 1 ? (1u << (n - 1)) : 1;
    int32_t gp[RMAX + 1];
    *min_peak = INT64_MAX;
    *min_groups = 1 << 30;
    for (mask = 0; mask < M; mask++) {
        int ng = 0, i, ok = 1, lo = 0;
        int64_t pk;
        gp[0] = 0;
        for (i = 1; i <= n; i++)
            if (i == n || (mask >> (i - 1) & 1))
                gp[++ng] = i;
        for (i = 0; i < ng && ok; i++) {
            int j;
            lo = gp[i];
            if (gp[i + 1] - lo >= 2)
                for (j = lo; j < gp[i + 1]; j++)
                    if (!d->fusible || !d->fusible[order[j]])
                        ok = 0;
        }
        if (!ok)
            continue;
        pk = ref_sim(r, order, n ? gp : NULL, ng, NULL);
        if (pk < *min_peak || (pk == *min_peak && ng < *min_groups)) {
            *min_peak = pk;
            *min_groups = ng;
        }
    }
}

/* The least fused peak over all valid orders and their groupings (n <= 8). */
static void bfo_rec(const ref *r, const mf_graph_desc *d, int32_t *order, uint64_t S, int depth, int64_t *best)
{
    int v;
    if (depth == r->n) {
        int64_t pk;
        int ng;
        brute_groups(r, d, order, &pk, &ng);
        if (pk < *best)
            *best = pk;
        return;
    }
    for (v = 0; v < r->n; v++) {
        if (S >> v & 1 || (r->pred[v] & ~S))
            continue;
        order[depth] = v;
        bfo_rec(r, d, order, S | 1ULL << v, depth + 1, best);
    }
}

static int64_t brute_fused_min(const ref *r, const mf_graph_desc *d)
{
    int32_t order[RMAX];
    int64_t best = INT64_MAX;
    bfo_rec(r, d, order, 0, 0, &best);
    return best;
}

/* ---- random graphs ---- */

static void random_graph(tg *out, int n, int permute)
{
    /* build in generation order, then emit with a permutation of op ids */
    int nv0 = 0, k, i, j;
    int ins[64][4], nins[64], outs[64][3], nouts[64], fus[64], perm[64], inv[64];
    tg g;
    int nvalues_avail = 0, avail[256];
    tg_init(&g);
    tg_init(out);
    nv0 = rint_(4);
    for (i = 0; i < nv0; i++) {
        int al = (i > 0 && rint_(4) == 0) ? rint_(i) : -1;
        int v = tg_value(&g, 8 * (1 + rint_(50)), 1, al, 0);
        avail[nvalues_avail++] = v;
    }
    for (k = 0; k < n; k++) {
        nins[k] = nvalues_avail ? rint_(4) : 0;
        for (i = 0; i < nins[k]; i++)
            ins[k][i] = avail[rint_(nvalues_avail)];
        nouts[k] = rint_(10) == 0 ? 0 : 1 + (rint_(3) == 0);
        for (i = 0; i < nouts[k]; i++) {
            int al = -1, v;
            int64_t b = rint_(8) == 0 ? 0 : 8 * (1 + rint_(100));
            if (rint_(4) == 0 && nvalues_avail > 0) {
                if (nins[k] > 0 && rint_(5) != 0)
                    al = ins[k][rint_(nins[k])];
                else
                    al = avail[rint_(nvalues_avail)];
            }
            v = tg_value(&g, b, 0, al, rint_(7) == 0);
            outs[k][i] = v;
            if (nvalues_avail < 256)
                avail[nvalues_avail++] = v;
        }
        fus[k] = rint_(2);
        if (fus[k] && rint_(4) == 0)
            fus[k] = MF_FUSIBLE_STORED; /* an extern call in a region (NOTE [stored inner values]) */
    }
    /* ops in generation order 0..n-1; pick a permutation */
    for (k = 0; k < n; k++)
        perm[k] = k;
    if (permute)
        for (k = n - 1; k > 0; k--) {
            int t = rint_(k + 1), x = perm[k];
            perm[k] = perm[t];
            perm[t] = x;
        }
    for (k = 0; k < n; k++)
        inv[perm[k]] = k; /* generation op perm[k] gets id k */
    for (i = 0; i < g.n_values; i++)
        tg_value(out, g.value_bytes[i], g.is_input[i], g.alias_of[i], g.is_output[i]);
    for (k = 0; k < n; k++) {
        int gk = perm[k];
        tg_op(out, ins[gk], nins[gk], outs[gk], nouts[gk], fus[gk]);
    }
    j = rint_(3);
    for (i = 0; i < j && n >= 2; i++) {
        int a = rint_(n - 1), b = a + 1 + rint_(n - 1 - a);
        tg_after(out, inv[a], inv[b]);
    }
    tg_free(&g);
}

/* The desc and reference of a generated test graph of min_ops..max_ops ops
 * that passes mf_graph_check (a CHECK failure when must_check).  Returns 0
 * (and frees g) when the graph is to be skipped. */
static int test_graph(tg *g, mf_graph_desc *d, ref *r, int min_ops, int max_ops, int must_check, const char *what,
                      int t)
{
    mf_ctx ctx;
    int st;
    if (g->n_ops < min_ops || g->n_ops > max_ops) {
        tg_free(g);
        return 0;
    }
    *d = tg_desc(g);
    mf_ctx_init(&ctx, NULL);
    st = mf_graph_check(&ctx, d);
    if (must_check)
        CHECK(st == MF_OK, "%s %d: %s", what, t, ctx.err);
    if (st != MF_OK) {
        tg_free(g);
        return 0;
    }
    ref_build(d, r);
    return 1;
}

/* ---- checks shared by the random tests ---- */

/* Checks of a plan with fusion-aware moves (NOTE [fusion-aware moves]) on
 * d, against the plan of the same graph without them (peak `unmoved`, order
 * `unmoved_order`).  Returns 1 when moves were kept. */
static int check_fusion_moves(const mf_graph_desc *d, const ref *r, int64_t best, int64_t unmoved,
                              const int32_t *unmoved_order, const char *what, int seed)
{
    mf_ctx ctx;
    mf_plan_result res;
    mf_plan_options opt = {0};
    int st, moved, i;
    mf_ctx_init(&ctx, NULL);
    memset(&opt, 0, sizeof opt);
    opt.fuse = 1;
    st = mf_plan(&ctx, d, &opt, &res);
    CHECK(st == MF_OK, "%s %d: plan with moves failed %d %s", what, seed, st, ctx.err);
    if (st)
        return 0;
    moved = res.fusion_moves > 0;
    CHECK(ref_valid(r, res.order), "%s %d: moves: invalid order", what, seed);
    CHECK(ref_sim(r, res.order, res.group_ptr, res.n_groups, NULL) == res.peak_bytes, "%s %d: moves: ref peak",
          what, seed);
    CHECK(mf_test_kinds_ok(d, &res), "%s %d: moves: group kinds", what, seed);
    CHECK(moved ? res.peak_bytes < unmoved : res.peak_bytes == unmoved, "%s %d: moves: peak %lld vs %lld (%d)",
          what, seed, (long long)res.peak_bytes, (long long)unmoved, (int)res.fusion_moves);
    CHECK(res.peak_bytes <= res.unfused_peak_bytes && res.unfused_peak_bytes >= best, "%s %d: moves: unfused",
          what, seed);
    CHECK(res.optimal == (res.unfused_peak_bytes == best), "%s %d: moves: optimal flag", what, seed);
    if (!moved)
        for (i = 0; i < d->n_ops; i++)
            CHECK(res.order[i] == unmoved_order[i], "%s %d: moves: order changed without a move", what, seed);
    if (d->n_ops <= 12) {
        int64_t mp;
        int mg;
        brute_groups(r, d, res.order, &mp, &mg);
        CHECK(mp == res.peak_bytes && mg == res.n_groups, "%s %d: moves: grouping not the least", what, seed);
    }
    if (d->n_ops <= 7)
        CHECK(res.peak_bytes >= brute_fused_min(r, d), "%s %d: moves: below the fused optimum", what, seed);
    mf_plan_result_free(&ctx, &res);
    return moved;
}

static int check_plan_against_ref(const mf_graph_desc *d, const ref *r, int64_t best, const char *what,
                                  int seed)
{
    mf_ctx ctx;
    mf_plan_result res;
    mf_plan_options opt = {0};
    int st, valid = 0, i, j, moved;
    int64_t sim = -1, ident_peak;
    int32_t ident[RMAX];
    mf_ctx_init(&ctx, NULL);
    ref_stable_order(r, ident);
    ident_peak = ref_sim(r, ident, NULL, 0, NULL);

    /* the planned order as it is: proven against brute force */
    memset(&opt, 0, sizeof opt);
    opt.fuse = 1;
    opt.no_fusion_moves = 1;
    st = mf_plan(&ctx, d, &opt, &res);
    CHECK(st == MF_OK, "%s %d: plan failed %d %s", what, seed, st, ctx.err);
    if (st)
        return 0;
    CHECK(res.optimal == 1, "%s %d: not optimal (method %s)", what, seed, res.method);
    CHECK(res.unfused_peak_bytes == best, "%s %d: unfused %lld != brute %lld (method %s)", what, seed,
          (long long)res.unfused_peak_bytes, (long long)best, res.method);
    CHECK(res.lower_bound_bytes <= best, "%s %d: LB %lld > opt %lld", what, seed,
          (long long)res.lower_bound_bytes, (long long)best);
    CHECK(res.baseline_peak_bytes == ident_peak, "%s %d: baseline %lld != ref %lld", what, seed,
          (long long)res.baseline_peak_bytes, (long long)ident_peak);
    CHECK(mf_check_order(&ctx, d, res.order, &valid) == MF_OK && valid, "%s %d: invalid order", what, seed);
    CHECK(ref_valid(r, res.order), "%s %d: invalid order (ref)", what, seed);
    CHECK(res.peak_bytes <= res.unfused_peak_bytes, "%s %d: fused peak above unfused", what, seed);
    CHECK(res.unfused_peak_bytes <= res.baseline_peak_bytes, "%s %d: worse than the baseline", what, seed);
    CHECK(res.group_ptr[0] == 0 && res.group_ptr[res.n_groups] == d->n_ops, "%s %d: group_ptr", what, seed);
    for (i = 0; i < res.n_groups; i++) {
        CHECK(res.group_ptr[i + 1] > res.group_ptr[i], "%s %d: empty group", what, seed);
        if (res.group_ptr[i + 1] - res.group_ptr[i] >= 2)
            for (j = res.group_ptr[i]; j < res.group_ptr[i + 1]; j++)
                CHECK(d->fusible[res.order[j]], "%s %d: non-fusible op in group", what, seed);
    }
    CHECK(mf_simulate(&ctx, d, res.order, res.group_ptr, res.n_groups, &sim, NULL, NULL) == MF_OK &&
              sim == res.peak_bytes,
          "%s %d: simulate %lld != peak %lld", what, seed, (long long)sim, (long long)res.peak_bytes);
    CHECK(ref_sim(r, res.order, res.group_ptr, res.n_groups, NULL) == res.peak_bytes, "%s %d: ref fused peak",
          what, seed);
    if (d->n_ops <= 12) {
        int64_t mp;
        int mg;
        brute_groups(r, d, res.order, &mp, &mg);
        CHECK(mp == res.peak_bytes, "%s %d: grouping peak %lld != brute %lld", what, seed,
              (long long)res.peak_bytes, (long long)mp);
        CHECK(mg == res.n_groups, "%s %d: groups %d != brute %d", what, seed, (int)res.n_groups, mg);
    }
    CHECK(mf_test_kinds_ok(d, &res), "%s %d: group kinds", what, seed);
    CHECK(res.fusion_moves == 0, "%s %d: moves made while off", what, seed);
    moved = check_fusion_moves(d, r, best, res.peak_bytes, res.order, what, seed);
    mf_plan_result_free(&ctx, &res);

    /* unfused planning */
    opt.fuse = 0;
    st = mf_plan(&ctx, d, &opt, &res);
    CHECK(st == MF_OK && res.n_groups == d->n_ops && res.peak_bytes == res.unfused_peak_bytes &&
              res.unfused_peak_bytes == best,
          "%s %d: fuse=0 plan", what, seed);
    mf_plan_result_free(&ctx, &res);

    /* a tiny cap: valid, never worse than the input order */
    opt.fuse = 1;
    opt.max_states = 1;
    st = mf_plan(&ctx, d, &opt, &res);
    CHECK(st == MF_OK, "%s %d: capped plan failed", what, seed);
    if (st == MF_OK) {
        CHECK(ref_valid(r, res.order), "%s %d: capped invalid", what, seed);
        CHECK(res.unfused_peak_bytes >= best, "%s %d: capped below optimum", what, seed);
        if (res.optimal)
            CHECK(res.unfused_peak_bytes == best, "%s %d: capped claims optimal wrongly", what, seed);
        CHECK(res.unfused_peak_bytes <= res.baseline_peak_bytes, "%s %d: capped worse than the baseline", what,
              seed);
    }
    mf_plan_result_free(&ctx, &res);
    return moved;
}

static void test_random_small(void)
{
    int t, n_dp = 0, n_moved = 0;
    long total_states = 0;
    for (t = 0; t < 600; t++) {
        tg g;
        mf_graph_desc d;
        ref r;
        mf_ctx ctx;
        int st, n = 1 + rint_(10);
        int64_t best, sim;
        int32_t order[RMAX], gp[RMAX + 1];
        int ng, i;
        random_graph(&g, n, t % 2);
        d = tg_desc(&g);
        mf_ctx_init(&ctx, NULL);
        st = mf_graph_check(&ctx, &d);
        if (st != MF_OK) {
            /* a view edge may close a cycle in a random graph: must be a cycle */
            CHECK(st == MF_ECYCLE, "random %d: check failed %d %s", t, st, ctx.err);
            tg_free(&g);
            continue;
        }
        ref_build(&d, &r);
        best = brute_min(&r);
        /* simulator vs reference on a random permutation and grouping */
        for (i = 0; i < n; i++)
            order[i] = i;
        for (i = n - 1; i > 0; i--) {
            int j = rint_(i + 1), x = order[i];
            order[i] = order[j];
            order[j] = x;
        }
        ng = 0;
        gp[0] = 0;
        for (i = 1; i <= n; i++)
            if (i == n || rint_(2))
                gp[++ng] = i;
        if (!ref_valid(&r, order)) { /* the public simulator takes valid orders only */
            st = mf_simulate(&ctx, &d, order, gp, ng, &sim, NULL, NULL);
            CHECK(st == MF_EINVAL && strstr(ctx.err, "breaks a dependency"), "random %d: invalid order: %d %s", t,
                  st, ctx.err);
            ref_random_order(&r, order);
        }
        {
            int64_t steps[RMAX], ref_steps[RMAX], live_after[RMAX];
            int64_t rp = ref_sim(&r, order, gp, ng, ref_steps);
            st = mf_simulate(&ctx, &d, order, gp, ng, &sim, steps, live_after);
            CHECK(st == MF_OK && sim == rp, "random %d: simulate %lld != ref %lld", t, (long long)sim,
                  (long long)rp);
            for (i = 0; i < ng && st == MF_OK; i++)
                CHECK(steps[i] == ref_steps[i], "random %d: step %d", t, i);
            rp = ref_sim(&r, order, NULL, 0, ref_steps);
            st = mf_simulate(&ctx, &d, order, NULL, 0, &sim, steps, NULL);
            CHECK(st == MF_OK && sim == rp, "random %d: unfused simulate %lld != ref %lld", t, (long long)sim,
                  (long long)rp);
        }
        n_moved += check_plan_against_ref(&d, &r, best, "random", t);
        {
            mf_plan_result res;
            if (mf_plan(&ctx, &d, NULL, &res) == MF_OK) {
                if (res.states > 0)
                    n_dp++;
                total_states += (long)res.states;
            }
            mf_plan_result_free(&ctx, &res);
        }
        tg_free(&g);
    }
    printf("random small graphs: %d used the DP, %ld states in all; fusion-aware moves lowered %d\n", n_dp,
           total_states, n_moved);
    CHECK(n_moved > 0, "random small graphs: fusion-aware moves never lowered a peak");
}

/* Blocks of parallel paths joined by a residual chain, with floating
 * "weight prep" ops (no inputs but graph inputs), n <= 22: checked against
 * the exhaustive subset DP, which knows nothing of cut points. */
static void block_graph(tg *g, int nblocks, int maxpaths, int fus_mode)
{
    int x, b, W;
    tg_init(g);
    W = tg_value(g, 64, 1, -1, 0);
    x = tg_value(g, 8 * (1 + rint_(20)), 1, -1, 0);
    for (b = 0; b < nblocks; b++) {
        int np = 1 + rint_(maxpaths), p, acc = -1;
        int w = -1;
        if (rint_(2)) { /* a floating op: reads only a graph input */
            int outv = tg_value(g, 8 * (1 + rint_(10)), 0, -1, 0);
            tg_op(g, &W, 1, &outv, 1, fus_mode ? rint_(2) : 0);
            w = outv;
        }
        for (p = 0; p < np; p++) {
            int len = 1 + rint_(3), l, h = x;
            for (l = 0; l < len; l++) {
                int ins[2], nv = 1, o;
                o = tg_value(g, 8 * (1 + rint_(40)), 0, (l > 0 && rint_(6) == 0) ? h : -1, 0);
                ins[0] = h;
                if (w >= 0 && l == 0 && p == 0)
                    ins[nv++] = w;
                if (g->alias_of[o] >= 0)
                    g->value_bytes[o] = g->value_bytes[h];
                tg_op(g, ins, nv, &o, 1, fus_mode ? rint_(2) : 0);
                h = o;
            }
            {
                int ins[2], o = tg_value(g, 8 * (1 + rint_(20)), 0, -1, 0);
                ins[0] = acc >= 0 ? acc : x;
                ins[1] = h;
                tg_op(g, ins, 2, &o, 1, fus_mode ? rint_(2) : 0);
                acc = o;
            }
        }
        x = acc;
    }
    g->is_output[x] = 1;
}

static void test_blocks(void)
{
    int t, tested = 0, n_moved = 0;
    for (t = 0; t < 60; t++) {
        tg g;
        mf_graph_desc d;
        ref r;
        int64_t best;
        block_graph(&g, 2 + rint_(3), 3, t % 2);
        if (!test_graph(&g, &d, &r, 2, 20, 1, "blocks", t))
            continue;
        best = subset_min(&r);
        n_moved += check_plan_against_ref(&d, &r, best, "blocks", t);
        tested++;
        tg_free(&g);
    }
    printf("block graphs checked against the subset DP: %d; fusion-aware moves lowered %d\n", tested, n_moved);
}

/* ---- weight-gradient sinks (NOTE [sinks] in mf_sched.c) ---- */

/* Hand-made graphs where absorbing the sink s into the piece of its last
 * predecessor would lose the optimum: the rule must refuse (the plan is then
 * checked against brute force).  which == 0: s frees less than it keeps
 * (condition (ii)); which == 1: the next piece starts by freeing a big
 * storage, so s must run after that first op (condition (iii)). */
static void sink_trap_graph(tg *g, int which)
{
    int in, u, t, m1, o, q, r, f, B, w, c, d, ins[2];
    tg_init(g);
    in = tg_value(g, 64, 1, -1, 0);
    u = tg_value(g, 1, 0, -1, 0);
    tg_op(g, &in, 1, &u, 1, 0); /* so that A is not a floating op */
    if (which == 0) {
        t = tg_value(g, 1, 0, -1, 0);
        m1 = tg_value(g, 1, 0, -1, 0);
        o = tg_value(g, 100, 0, -1, 1);
        q = tg_value(g, 1000, 0, -1, 0);
        r = tg_value(g, 1, 0, -1, 0);
        f = tg_value(g, 1, 0, -1, 1);
        tg_op(g, &u, 1, &t, 1, 0); /* A */
        tg_op(g, &t, 1, &m1, 1, 0); /* M */
        ins[0] = t;
        ins[1] = m1;
        tg_op(g, ins, 2, &o, 1, 0); /* s: keeps 100, frees 1 */
        tg_op(g, &m1, 1, &q, 1, 0); /* Q: the big step */
        tg_op(g, &q, 1, &r, 1, 0);
        tg_op(g, &r, 1, &f, 1, 0);
    } else {
        t = tg_value(g, 10, 0, -1, 0);
        B = tg_value(g, 1000, 0, -1, 0);
        w = tg_value(g, 1, 0, -1, 0);
        o = tg_value(g, 10, 0, -1, 1);
        c = tg_value(g, 1, 0, -1, 0);
        d = tg_value(g, 1, 0, -1, 1);
        tg_op(g, &u, 1, &t, 1, 0); /* A */
        tg_op(g, &t, 1, &B, 1, 0);  /* M */
        ins[0] = B;
        ins[1] = t;
        tg_op(g, ins, 2, &w, 1, 0); /* v */
        ins[0] = t;
        ins[1] = w;
        tg_op(g, ins, 2, &o, 1, 0); /* s: frees t (10), keeps o (10) */
        ins[0] = B;
        ins[1] = w;
        tg_op(g, ins, 2, &c, 1, 0); /* y: frees B, allocates 1 */
        tg_op(g, &c, 1, &d, 1, 0);
    }
}

/* Blocks shaped like a checkpointed transformer backward (n <= 18): the
 * running gradient x fans out to paths (a floating recompute op per path
 * sometimes); each path ends with a weight-gradient sink reading its head
 * (and sometimes a graph input, another head, or the block input) and
 * writing a graph output; the paths are summed into the next x.  Sizes are
 * random, so the conditions of NOTE [sinks] hold for some sinks and fail
 * for others. */
static void sink_block_graph(tg *g, int nblocks, int maxpaths)
{
    int x, b, S;
    tg_init(g);
    S = tg_value(g, 64, 1, -1, 0);
    x = tg_value(g, 8 * (1 + rint_(20)), 1, -1, 0);
    for (b = 0; b < nblocks; b++) {
        int np = 1 + rint_(maxpaths), p, acc = -1, heads[8];
        for (p = 0; p < np; p++) {
            int len = 1 + rint_(2), l, h = x, r = -1;
            if (rint_(3) == 0) { /* recompute from a saved input: floating */
                r = tg_value(g, 8 * (1 + rint_(20)), 0, -1, 0);
                tg_op(g, &S, 1, &r, 1, 0);
            }
            for (l = 0; l < len; l++) {
                int ins[2], nin = 1, o = tg_value(g, 8 * (1 + rint_(30)), 0, -1, 0);
                ins[0] = h;
                if (l == 0 && r >= 0)
                    ins[nin++] = r;
                tg_op(g, ins, nin, &o, 1, rint_(2));
                h = o;
            }
            heads[p] = h;
            {
                int ins[3], nin = 0, gw = tg_value(g, 8 * (1 + rint_(12)), 0, -1, 1);
                int kind = rint_(6);
                ins[nin++] = h;
                if (kind <= 2)
                    ins[nin++] = S;
                else if (kind == 3 && p > 0)
                    ins[nin++] = heads[p - 1]; /* shared with another sink */
                else if (kind == 4)
                    ins[nin++] = x; /* the block input: read in this block */
                tg_op(g, ins, nin, &gw, 1, 0);
            }
            {
                int ins[2], o = tg_value(g, 8 * (1 + rint_(20)), 0, -1, 0);
                ins[0] = acc >= 0 ? acc : x;
                ins[1] = h;
                tg_op(g, ins, 2, &o, 1, rint_(2));
                acc = o;
            }
        }
        x = acc;
    }
    g->is_output[x] = 1;
}

/* The benchmark's shape at scale: blocks of 2..4 paths, each path with a
 * recompute op, elementwise ops, a matmul and a weight-gradient sink. */
static void sink_stack_graph(tg *g, int target_ops, int minp, int maxp)
{
    const int64_t act = 1 << 20;
    int x;
    tg_init(g);
    x = tg_value(g, act, 1, -1, 0);
    while (g->n_ops < target_ops) {
        int np = minp + rint_(maxp - minp + 1), p, acc = -1;
        for (p = 0; p < np; p++) {
            int len = 3 + rint_(4), l, h = x;
            int saved = tg_value(g, act / 2, 1, -1, 0), wt = tg_value(g, act / 4, 1, -1, 0);
            for (l = 0; l < len; l++) {
                int ins[2], o;
                if (l == 0) {
                    int r = tg_value(g, act, 0, -1, 0);
                    tg_op(g, &saved, 1, &r, 1, 1);
                    o = tg_value(g, act, 0, -1, 0);
                    ins[0] = h;
                    ins[1] = r;
                    tg_op(g, ins, 2, &o, 1, 1);
                } else if (l == len - 1) {
                    int gw = tg_value(g, act / 4, 0, -1, 1);
                    o = tg_value(g, act, 0, -1, 0);
                    ins[0] = h;
                    ins[1] = wt;
                    tg_op(g, ins, 2, &o, 1, 0);
                    ins[1] = saved;
                    tg_op(g, ins, 2, &gw, 1, 0);
                } else {
                    o = tg_value(g, act * (1 + (rint_(3) == 0)), 0, -1, 0);
                    tg_op(g, &h, 1, &o, 1, 1);
                }
                h = o;
            }
            if (acc < 0) {
                acc = h;
            } else {
                int ins[2], o = tg_value(g, act, 0, -1, 0);
                ins[0] = acc;
                ins[1] = h;
                tg_op(g, ins, 2, &o, 1, 1);
                acc = o;
            }
        }
        x = acc;
    }
    g->is_output[x] = 1;
}

static void test_sinks(void)
{
    int t, tested = 0, which, opt_runs = 0;
    for (which = 0; which < 2; which++) {
        tg g;
        mf_graph_desc d;
        ref r;
        mf_ctx ctx;
        sink_trap_graph(&g, which);
        d = tg_desc(&g);
        mf_ctx_init(&ctx, NULL);
        CHECK(mf_graph_check(&ctx, &d) == MF_OK, "sink trap %d: %s", which, ctx.err);
        ref_build(&d, &r);
        check_plan_against_ref(&d, &r, brute_min(&r), "sink trap", which);
        tg_free(&g);
    }
    for (t = 0; t < 300; t++) {
        tg g;
        mf_graph_desc d;
        ref r;
        sink_block_graph(&g, 2 + rint_(2), 3);
        if (!test_graph(&g, &d, &r, 2, 18, 1, "sink blocks", t))
            continue;
        check_plan_against_ref(&d, &r, g.n_ops <= 12 ? brute_min(&r) : subset_min(&r), "sink blocks", t);
        tested++;
        tg_free(&g);
    }
    printf("sink block graphs checked against brute force / the subset DP: %d\n", tested);
    /* at scale: blocks of 2..4 paths split into pieces, each solved exactly */
    for (t = 0; t < 6; t++) {
        tg g;
        mf_graph_desc d;
        mf_ctx ctx;
        mf_plan_result res;
        int valid = 0, st, minp = 2 + t % 3;
        double t0;
        sink_stack_graph(&g, 1000, minp, minp + (t < 3 ? 0 : 1) > 4 ? 4 : minp + (t < 3 ? 0 : 1));
        d = tg_desc(&g);
        mf_ctx_init(&ctx, NULL);
        t0 = now_ms();
        st = mf_plan(&ctx, &d, NULL, &res);
        t0 = now_ms() - t0;
        CHECK(st == MF_OK, "sink stack: %s", ctx.err);
        if (st == MF_OK) {
            CHECK(mf_check_order(&ctx, &d, res.order, &valid) == MF_OK && valid, "sink stack: invalid order");
            CHECK(res.unfused_peak_bytes <= res.baseline_peak_bytes, "sink stack: worse than input");
            CHECK(res.optimal == 1, "sink stack %d (%d ops, paths >= %d): not proven optimal (%s, %lld states)",
                  t, (int)d.n_ops, minp, res.method, (long long)res.states);
            CHECK(res.states < 20000, "sink stack %d: %lld states", t, (long long)res.states);
            opt_runs += res.optimal;
            if (t == 0 || t == 5)
                printf("sink stack %d ops: %.1f ms, peak %lld unfused %lld baseline %lld LB %lld optimal %d "
                       "method %s states %lld\n",
                       (int)d.n_ops, t0, (long long)res.peak_bytes, (long long)res.unfused_peak_bytes,
                       (long long)res.baseline_peak_bytes, (long long)res.lower_bound_bytes, res.optimal,
                       res.method, (long long)res.states);
        }
        mf_plan_result_free(&ctx, &res);
        tg_free(&g);
    }
    printf("sink stacks of 1k ops proven optimal: %d of 6\n", opt_runs);
}

/* Random graphs of 11..16 ops against the subset DP. */
static void test_random_medium(void)
{
    int t, tested = 0, n_moved = 0;
    for (t = 0; t < 80; t++) {
        tg g;
        mf_graph_desc d;
        ref r;
        random_graph(&g, 11 + rint_(6), t % 2);
        if (!test_graph(&g, &d, &r, 0, RMAX, 0, "medium", t))
            continue;
        n_moved += check_plan_against_ref(&d, &r, subset_min(&r), "medium", t);
        tested++;
        tg_free(&g);
    }
    printf("medium random graphs checked against the subset DP: %d; fusion-aware moves lowered %d\n", tested,
           n_moved);
}

/* ---- seed graph ---- */

static void seed_graph(tg *g, int efficient)
{
    int t0[10], t1[10], t2[10], t3[10], a[11], i, phase;
    const int64_t B = 262144;
    tg_init(g);
    for (i = 0; i < 10; i++)
        t0[i] = tg_value(g, B, 1, -1, 0);
    a[0] = tg_value(g, B, 1, -1, 0);
    for (i = 0; i < 10; i++) {
        t1[i] = tg_value(g, B, 0, -1, 0);
        t2[i] = tg_value(g, B, 0, -1, 0);
        t3[i] = tg_value(g, B, 0, -1, 0);
        a[i + 1] = tg_value(g, B, 0, -1, i == 9);
    }
    if (efficient) {
        for (i = 0; i < 10; i++) {
            int in2[2];
            tg_op(g, &t0[i], 1, &t1[i], 1, 1);
            in2[0] = in2[1] = t1[i];
            tg_op(g, in2, 2, &t2[i], 1, 0);
            tg_op(g, &t2[i], 1, &t3[i], 1, 1);
            in2[0] = t3[i];
            in2[1] = a[i];
            tg_op(g, in2, 2, &a[i + 1], 1, 0);
        }
    } else {
        for (phase = 0; phase < 4; phase++)
            for (i = 0; i < 10; i++) {
                int in2[2];
                if (phase == 0)
                    tg_op(g, &t0[i], 1, &t1[i], 1, 1);
                if (phase == 1) {
                    in2[0] = in2[1] = t1[i];
                    tg_op(g, in2, 2, &t2[i], 1, 0);
                }
                if (phase == 2)
                    tg_op(g, &t2[i], 1, &t3[i], 1, 1);
                if (phase == 3) {
                    in2[0] = t3[i];
                    in2[1] = a[i];
                    tg_op(g, in2, 2, &a[i + 1], 1, 0);
                }
            }
    }
}

static void test_seed(void)
{
    int eff;
    for (eff = 1; eff >= 0; eff--) {
        tg g;
        mf_graph_desc d;
        mf_ctx ctx;
        mf_plan_result res;
        int st, valid = 0, rep;
        double t0, best_ms = 1e9;
        int64_t sim;
        seed_graph(&g, eff);
        d = tg_desc(&g);
        mf_ctx_init(&ctx, NULL);
        for (rep = 0; rep < 5; rep++) {
            t0 = now_ms();
            st = mf_plan(&ctx, &d, NULL, &res);
            t0 = now_ms() - t0;
            if (t0 < best_ms)
                best_ms = t0;
            if (rep < 4)
                mf_plan_result_free(&ctx, &res);
        }
        CHECK(st == MF_OK, "seed: %s", ctx.err);
        CHECK(res.unfused_peak_bytes == 786432, "seed %d: unfused %lld", eff, (long long)res.unfused_peak_bytes);
        CHECK(res.optimal == 1, "seed %d: not optimal", eff);
        CHECK(res.peak_bytes <= 786432, "seed %d: fused peak %lld", eff, (long long)res.peak_bytes);
        CHECK(res.baseline_peak_bytes == (eff ? 786432 : 2883584), "seed %d: baseline %lld", eff,
              (long long)res.baseline_peak_bytes);
        CHECK(res.lower_bound_bytes == 786432, "seed %d: LB %lld", eff, (long long)res.lower_bound_bytes);
        CHECK(mf_check_order(&ctx, &d, res.order, &valid) == MF_OK && valid, "seed %d: invalid", eff);
        CHECK(mf_simulate(&ctx, &d, res.order, res.group_ptr, res.n_groups, &sim, NULL, NULL) == MF_OK &&
                  sim == res.peak_bytes,
              "seed %d: simulate", eff);
        CHECK(best_ms < 50.0, "seed %d: %.3f ms", eff, best_ms);
        printf("seed graph (%s order): peak %lld unfused %lld baseline %lld LB %lld groups %d method %s "
               "states %lld, %.3f ms\n",
               eff ? "efficient" : "inefficient", (long long)res.peak_bytes, (long long)res.unfused_peak_bytes,
               (long long)res.baseline_peak_bytes, (long long)res.lower_bound_bytes, (int)res.n_groups,
               res.method, (long long)res.states, best_ms);
        mf_plan_result_free(&ctx, &res);
        tg_free(&g);
    }
}

/* ---- simulator unit tests (hand-computed) ---- */

static int64_t sim_of(const tg *g, const int32_t *order, const int32_t *gp, int ng, int64_t *steps,
                      int64_t *live)
{
    mf_ctx ctx;
    mf_graph_desc d = tg_desc(g);
    int64_t peak = -1;
    int st;
    mf_ctx_init(&ctx, NULL);
    st = mf_simulate(&ctx, &d, order, gp, ng, &peak, steps, live);
    CHECK(st == MF_OK, "simulate failed: %s", ctx.err);
    return peak;
}

static void test_simulator(void)
{
    tg g;
    int32_t o01[] = {0, 1}, o012[] = {0, 1, 2}, o0123[] = {0, 1, 2, 3};
    int32_t gp_all2[] = {0, 2}, gp3[] = {0, 2, 3};
    int64_t steps[8], live[8];

    /* a(in) -> op0 -> b(200) -> op1 -> c(50, out) */
    {
        int a, b, c;
        tg_init(&g);
        a = tg_value(&g, 100, 1, -1, 0);
        b = tg_value(&g, 200, 0, -1, 0);
        c = tg_value(&g, 50, 0, -1, 1);
        tg_op(&g, &a, 1, &b, 1, 1);
        tg_op(&g, &b, 1, &c, 1, 1);
        CHECK(sim_of(&g, o01, NULL, 0, steps, live) == 250, "unfused chain");
        CHECK(steps[0] == 200 && steps[1] == 250 && live[0] == 200 && live[1] == 50, "unfused steps");
        /* fused: b is inner, never materialized; c is an output */
        CHECK(sim_of(&g, o01, gp_all2, 1, steps, live) == 50 && live[0] == 50, "fused chain");
        tg_free(&g);
    }
    /* views: x(100) by op0; op1: v = view(x), reads x; op2 reads v -> y(10, out);
     * op3: w = view(v) reads v; op4 reads w -> z(1, out) */
    {
        int x, v, y, w, z, in2[1];
        tg_init(&g);
        x = tg_value(&g, 100, 0, -1, 0);
        v = tg_value(&g, 100, 0, x, 0);
        y = tg_value(&g, 10, 0, -1, 1);
        tg_op(&g, NULL, 0, &x, 1, 0);
        tg_op(&g, &x, 1, &v, 1, 0);
        tg_op(&g, &v, 1, &y, 1, 0);
        /* 0: 100, 1: 100 (a view allocates nothing), 2: 110, then x freed */
        CHECK(sim_of(&g, o012, NULL, 0, steps, live) == 110, "view");
        CHECK(steps[1] == 100 && live[1] == 100 && live[2] == 10, "view steps");
        w = tg_value(&g, 100, 0, v, 0);
        z = tg_value(&g, 1, 0, -1, 1);
        tg_op(&g, &v, 1, &w, 1, 0);
        in2[0] = w;
        tg_op(&g, in2, 1, &z, 1, 0);
        {
            int32_t o[] = {0, 1, 2, 3, 4};
            /* view chain keeps x alive until op4: 100, 100, 110, 110, 111 */
            CHECK(sim_of(&g, o, NULL, 0, steps, live) == 111, "view chain");
            CHECK(live[2] == 110 && live[3] == 110 && live[4] == 11, "view chain live");
        }
        /* the view is a graph output: storage x lives to the end */
        g.is_output[w] = 1;
        {
            int32_t o[] = {0, 1, 2, 3, 4};
            CHECK(sim_of(&g, o, NULL, 0, steps, live) == 111 && live[4] == 111, "view output");
        }
        tg_free(&g);
    }
    /* inputs never counted, a view of an input is free; an unread value is
     * freed right after its op */
    {
        int a, av, u, o, ins[2], outs[2];
        tg_init(&g);
        a = tg_value(&g, 1000, 1, -1, 0);
        av = tg_value(&g, 1000, 0, a, 0);
        u = tg_value(&g, 300, 0, -1, 0);
        o = tg_value(&g, 5, 0, -1, 1);
        tg_op(&g, &a, 1, &av, 1, 1);
        ins[0] = av;
        outs[0] = u;
        outs[1] = o;
        tg_op(&g, ins, 1, outs, 2, 1);
        CHECK(sim_of(&g, o01, NULL, 0, steps, live) == 305, "inputs free, unread counted");
        CHECK(steps[0] == 0 && steps[1] == 305 && live[1] == 5, "unread freed");
        /* in a fused group an unread storage is not materialized */
        CHECK(sim_of(&g, o01, gp_all2, 1, steps, live) == 5, "fused unread");
        tg_free(&g);
    }
    /* fusing can raise the peak: inputs stay alive until the kernel ends */
    {
        int x, y, z, q, ins[2];
        tg_init(&g);
        x = tg_value(&g, 100, 0, -1, 0);
        y = tg_value(&g, 10, 0, -1, 0);
        z = tg_value(&g, 100, 0, -1, 0);
        q = tg_value(&g, 1, 0, -1, 1);
        tg_op(&g, NULL, 0, &x, 1, 0); /* 0: x */
        tg_op(&g, &x, 1, &y, 1, 1);   /* 1: y = f(x), frees x */
        tg_op(&g, NULL, 0, &z, 1, 1); /* 2: z */
        ins[0] = y;
        ins[1] = z;
        tg_op(&g, ins, 2, &q, 1, 0); /* 3 */
        /* unfused: 100, 110, 110, 111 */
        CHECK(sim_of(&g, o0123, NULL, 0, steps, live) == 111, "raise unfused");
        {
            int32_t gp[] = {0, 1, 3, 4};
            /* [1,2] fused: x alive (100) + y, z read outside (110) = 210 */
            CHECK(sim_of(&g, o0123, gp, 3, steps, live) == 210, "fusing raises");
        }
        (void)gp3;
        tg_free(&g);
    }
}

/* fusion lowers the peak: a chain of fusible elementwise ops with big inner values */
static void test_fusion_plan(void)
{
    tg g;
    mf_graph_desc d;
    mf_ctx ctx;
    mf_plan_result res;
    int a, b, c, e, f;
    tg_init(&g);
    a = tg_value(&g, 100, 1, -1, 0);
    b = tg_value(&g, 100, 0, -1, 0);
    c = tg_value(&g, 100, 0, -1, 0);
    e = tg_value(&g, 100, 0, -1, 0);
    f = tg_value(&g, 100, 0, -1, 1);
    tg_op(&g, &a, 1, &b, 1, 1);
    tg_op(&g, &b, 1, &c, 1, 1);
    tg_op(&g, &c, 1, &e, 1, 1);
    tg_op(&g, &e, 1, &f, 1, 0);
    d = tg_desc(&g);
    mf_ctx_init(&ctx, NULL);
    CHECK(mf_plan(&ctx, &d, NULL, &res) == MF_OK, "%s", ctx.err);
    /* unfused 200; fused [0..2] then [3]: 100 and 200 -> still 200; fewest groups 2 */
    CHECK(res.unfused_peak_bytes == 200 && res.peak_bytes == 200 && res.n_groups == 2, "fusion plan %lld %d",
          (long long)res.peak_bytes, (int)res.n_groups);
    mf_plan_result_free(&ctx, &res);
    g.fusible[3] = 1;
    CHECK(mf_plan(&ctx, &d, NULL, &res) == MF_OK, "%s", ctx.err);
    CHECK(res.peak_bytes == 100 && res.n_groups == 1, "fusion all %lld %d", (long long)res.peak_bytes,
          (int)res.n_groups);
    mf_plan_result_free(&ctx, &res);
    tg_free(&g);
}

/* NOTE [epilogue pairs]: u (a GEMM, not fusible) with a big result read only
 * by v (a ReLU) pairs with v, so u's result is never materialized. */
static void test_epilogue_pairs(void)
{
    tg g;
    mf_graph_desc d;
    mf_ctx ctx;
    mf_plan_result res;
    mf_plan_options unfused = {0};
    int32_t epi[3] = {-1, 0, -1};
    int x, a, b, c;
    int64_t sim;
    tg_init(&g);
    x = tg_value(&g, 100, 1, -1, 0);
    a = tg_value(&g, 400, 0, -1, 0);
    b = tg_value(&g, 100, 0, -1, 0);
    c = tg_value(&g, 100, 0, -1, 1);
    tg_op(&g, &x, 1, &a, 1, 0); /* u = gemm */
    tg_op(&g, &a, 1, &b, 1, 1); /* v = relu */
    tg_op(&g, &b, 1, &c, 1, 0); /* w */
    d = tg_desc(&g);
    d.epilogue_of = epi;
    mf_ctx_init(&ctx, NULL);
    CHECK(mf_plan(&ctx, &d, NULL, &res) == MF_OK, "%s", ctx.err);
    /* unfused: u 400, v 400 + 100, w 100 + 100 -> 500; [u, v] 100, w 200 -> 200 */
    CHECK(res.unfused_peak_bytes == 500 && res.peak_bytes == 200 && res.n_groups == 2 &&
              res.group_ptr[1] == 2,
          "epilogue pair %lld %d", (long long)res.peak_bytes, (int)res.n_groups);
    CHECK(mf_simulate(&ctx, &d, res.order, res.group_ptr, res.n_groups, &sim, NULL, NULL) == MF_OK &&
              sim == res.peak_bytes,
          "epilogue pair simulated %lld", (long long)sim);
    mf_plan_result_free(&ctx, &res);
    CHECK(mf_plan(&ctx, &d, &unfused, &res) == MF_OK && res.n_groups == 3 && res.peak_bytes == 500,
          "fuse=0 forms no pair: %d", (int)res.n_groups);
    mf_plan_result_free(&ctx, &res);
    /* u's result is a graph output: the kernel would have to write it, no pair */
    g.is_output[a] = 1;
    CHECK(mf_plan(&ctx, &d, NULL, &res) == MF_OK && res.n_groups == 3, "output blocks the pair: %d",
          (int)res.n_groups);
    mf_plan_result_free(&ctx, &res);
    g.is_output[a] = 0;
    /* not v's producer's epilogue: only the named u pairs */
    epi[1] = 2;
    CHECK(mf_plan(&ctx, &d, NULL, &res) == MF_OK && res.n_groups == 3, "wrong head: %d", (int)res.n_groups);
    mf_plan_result_free(&ctx, &res);
    epi[1] = 1;
    CHECK(mf_graph_check(&ctx, &d) == MF_EINVAL && strstr(ctx.err, "epilogue_of"), "self epilogue: %s", ctx.err);
    epi[1] = 3;
    CHECK(mf_graph_check(&ctx, &d) == MF_EINVAL && strstr(ctx.err, "epilogue_of"), "range: %s", ctx.err);
    tg_free(&g);
}

/* NOTE [stored inner values]: a GEMM (MF_FUSIBLE_STORED) may join a group, but
 * what it reads and writes is stored while the group runs. */
static void test_stored_inner_values(void)
{
    tg g;
    mf_graph_desc d;
    mf_ctx ctx;
    mf_plan_result res;
    int32_t gp_all[2] = {0, 3}, o012[3] = {0, 1, 2}, epi[3] = {-1, -1, 1};
    int x, a, b, c;
    int64_t sim;
    tg_init(&g);
    x = tg_value(&g, 100, 1, -1, 0);
    a = tg_value(&g, 100, 0, -1, 0);
    b = tg_value(&g, 100, 0, -1, 0);
    c = tg_value(&g, 100, 0, -1, 1);
    tg_op(&g, &x, 1, &a, 1, MF_FUSIBLE);        /* relu */
    tg_op(&g, &a, 1, &b, 1, MF_FUSIBLE_STORED); /* gemm, an extern call in a region */
    tg_op(&g, &b, 1, &c, 1, MF_FUSIBLE);        /* relu */
    d = tg_desc(&g);
    mf_ctx_init(&ctx, NULL);
    /* one group of all three: a and b stored next to c -> 300; plain fusible it would be 100 */
    CHECK(mf_simulate(&ctx, &d, o012, gp_all, 1, &sim, NULL, NULL) == MF_OK && sim == 300, "stored group %lld",
          (long long)sim);
    CHECK(mf_plan(&ctx, &d, NULL, &res) == MF_OK, "%s", ctx.err);
    /* unfused 200 (a + b, then b + c); no grouping beats it, and the fewest groups at 200 is two:
     * [relu, gemm] stores a and b (200), then [relu] alone (200) */
    CHECK(res.peak_bytes == 200 && res.n_groups == 2, "stored plan %lld %d", (long long)res.peak_bytes,
          (int)res.n_groups);
    CHECK(mf_simulate(&ctx, &d, res.order, res.group_ptr, res.n_groups, &sim, NULL, NULL) == MF_OK &&
              sim == res.peak_bytes,
          "stored plan simulated %lld", (long long)sim);
    mf_plan_result_free(&ctx, &res);
    /* an epilogue pair keeps its own rule: [gemm, relu] writes c over b -> b not counted */
    d.epilogue_of = epi;
    CHECK(mf_plan(&ctx, &d, NULL, &res) == MF_OK && res.peak_bytes == 200, "stored pair %lld",
          (long long)res.peak_bytes);
    CHECK(mf_simulate(&ctx, &d, res.order, res.group_ptr, res.n_groups, &sim, NULL, NULL) == MF_OK &&
              sim == res.peak_bytes,
          "stored pair simulated %lld", (long long)sim);
    mf_plan_result_free(&ctx, &res);
    /* the same values as plain fusible ops: one group, 100 */
    g.fusible[1] = MF_FUSIBLE;
    d.epilogue_of = NULL;
    CHECK(mf_plan(&ctx, &d, NULL, &res) == MF_OK && res.peak_bytes == 100 && res.n_groups == 1,
          "fusible plan %lld %d", (long long)res.peak_bytes, (int)res.n_groups);
    mf_plan_result_free(&ctx, &res);
    tg_free(&g);
}

/* ---- error messages ---- */

static void expect_err(const tg *g, int status, const char *needle)
{
    mf_ctx ctx;
    mf_graph_desc d = tg_desc(g);
    mf_plan_result res;
    int st;
    mf_ctx_init(&ctx, NULL);
    st = mf_graph_check(&ctx, &d);
    CHECK(st == status && strstr(ctx.err, needle), "expected %d '%s', got %d '%s'", status, needle, st, ctx.err);
    st = mf_plan(&ctx, &d, NULL, &res);
    CHECK(st == status && strstr(ctx.err, needle) && res.order == NULL, "plan: expected %d '%s', got %d '%s'",
          status, needle, st, ctx.err);
    mf_plan_result_free(&ctx, &res);
}

static void test_errors(void)
{
    tg g;
    int v[16], k;
    /* produced twice */
    tg_init(&g);
    for (k = 0; k < 8; k++)
        v[k] = tg_value(&g, 8, k == 0, -1, 0);
    tg_op(&g, &v[0], 1, &v[1], 1, 0);
    tg_op(&g, &v[1], 1, &v[2], 1, 0);
    tg_op(&g, &v[1], 1, &v[7], 1, 0);
    tg_op(&g, &v[2], 1, &v[3], 1, 0);
    tg_op(&g, &v[2], 1, &v[4], 1, 0);
    tg_op(&g, &v[2], 1, &v[7], 1, 0);
    tg_op(&g, &v[2], 1, &v[5], 1, 0);
    tg_op(&g, &v[2], 1, &v[6], 1, 0);
    expect_err(&g, MF_EINVAL, "value 7 is produced by op 2 and op 5");
    tg_free(&g);

    /* neither produced nor input */
    tg_init(&g);
    v[0] = tg_value(&g, 8, 1, -1, 0);
    v[1] = tg_value(&g, 8, 0, -1, 0);
    v[2] = tg_value(&g, 8, 0, -1, 0);
    v[3] = tg_value(&g, 8, 0, -1, 0);
    tg_op(&g, &v[0], 1, &v[1], 1, 0);
    tg_op(&g, &v[3], 1, &v[2], 1, 0);
    expect_err(&g, MF_EINVAL, "value 3 is neither produced by an op nor a graph input");
    /* out of range read */
    g.in_idx[1] = 12;
    expect_err(&g, MF_EINVAL, "op 1 reads value 12 out of range [0, 4)");
    g.in_idx[1] = -1;
    expect_err(&g, MF_EINVAL, "op 1 reads value -1 out of range [0, 4)");
    g.in_idx[1] = 1;
    g.out_idx[1] = 9;
    expect_err(&g, MF_EINVAL, "op 1 writes value 9 out of range [0, 4)");
    g.out_idx[1] = 2;
    g.is_input[3] = 1;
    /* negative size */
    g.value_bytes[2] = -8;
    expect_err(&g, MF_EINVAL, "value 2 has negative size -8");
    g.value_bytes[2] = 8;
    /* alias cycle */
    g.alias_of[1] = 2;
    g.alias_of[2] = 1;
    expect_err(&g, MF_EINVAL, "alias chain through value");
    g.alias_of[2] = 2;
    expect_err(&g, MF_EINVAL, "alias chain through value 2 is cyclic");
    g.alias_of[1] = -1;
    g.alias_of[2] = 7;
    expect_err(&g, MF_EINVAL, "value 2 is a view of value 7 out of range [0, 4)");
    g.alias_of[2] = -1;
    /* input also produced */
    g.is_input[1] = 1;
    expect_err(&g, MF_EINVAL, "graph input 1 is also produced by op 0");
    g.is_input[1] = 0;
    /* input that is a view of a produced value */
    g.alias_of[3] = 2;
    expect_err(&g, MF_EINVAL, "graph input 3 is a view of value 2, which is not a graph input");
    g.alias_of[3] = -1;
    /* ordering edges */
    tg_after(&g, 1, 1);
    expect_err(&g, MF_ECYCLE, "ordering edge (1, 1) creates a cycle");
    g.after[0] = 5;
    expect_err(&g, MF_EINVAL, "ordering edge 0 (5, 1) names op 5 out of range [0, 2)");
    g.after[0] = 1;
    g.after[1] = 0;
    g.in_idx[1] = 3; /* op 1 reads the graph input 3: ops 0 and 1 independent */
    {
        mf_ctx ctx;
        mf_graph_desc d = tg_desc(&g);
        mf_ctx_init(&ctx, NULL);
        CHECK(mf_graph_check(&ctx, &d) == MF_OK, "independent ops with an edge: %s", ctx.err);
    }
    tg_free(&g);

    /* cycles: dataflow 0 -> 1 plus ordering edge (1, 0) */
    tg_init(&g);
    v[0] = tg_value(&g, 8, 1, -1, 0);
    v[1] = tg_value(&g, 8, 0, -1, 0);
    v[2] = tg_value(&g, 8, 0, -1, 0);
    v[3] = tg_value(&g, 8, 0, -1, 0);
    tg_op(&g, &v[0], 1, &v[1], 1, 0);
    tg_op(&g, &v[1], 1, &v[2], 1, 0);
    tg_op(&g, &v[2], 1, &v[3], 1, 0);
    tg_after(&g, 2, 1);
    expect_err(&g, MF_ECYCLE, "ordering edge (2, 1) creates a cycle through ops 1 -> 2 -> 1");
    g.n_after = 0;
    /* a pure dataflow cycle: op 0 reads value 3 produced by op 2 */
    g.in_idx[0] = 3;
    expect_err(&g, MF_ECYCLE, "cycle through ops 0 -> 1 -> 2 -> 0");
    g.in_idx[0] = 0;
    /* an op reading its own output */
    g.in_idx[1] = 2;
    expect_err(&g, MF_ECYCLE, "op 1 reads value 2, which it produces itself");
    g.in_idx[1] = 1;
    /* a view edge closing a cycle: value 1 (op 0) a view of value 3 (op 2) */
    g.alias_of[1] = 3;
    expect_err(&g, MF_ECYCLE, "cycle through ops 0 -> 1 -> 2 -> 0");
    g.alias_of[1] = -1;
    /* structural */
    g.in_ptr[1] = 2;
    g.in_ptr[2] = 1;
    expect_err(&g, MF_EINVAL, "in_ptr decreases at op 1");
    g.in_ptr[1] = 1;
    g.in_ptr[2] = 2;
    {
        mf_ctx ctx;
        mf_graph_desc d = tg_desc(&g);
        int valid = 1;
        int32_t bad[] = {0, 0, 2}, rev[] = {2, 1, 0}, ok[] = {0, 1, 2};
        int64_t pk;
        mf_ctx_init(&ctx, NULL);
        CHECK(mf_check_order(&ctx, &d, ok, &valid) == MF_OK && valid == 1, "valid order");
        CHECK(mf_check_order(&ctx, &d, rev, &valid) == MF_OK && valid == 0, "reversed order");
        CHECK(mf_check_order(&ctx, &d, bad, &valid) == MF_OK && valid == 0, "not a permutation");
        CHECK(mf_simulate(&ctx, &d, bad, NULL, 0, &pk, NULL, NULL) == MF_EINVAL &&
                  strstr(ctx.err, "op 0 appears twice"),
              "simulate non-permutation: %s", ctx.err);
        CHECK(mf_simulate(&ctx, &d, rev, NULL, 0, &pk, NULL, NULL) == MF_EINVAL &&
                  strstr(ctx.err, "order breaks a dependency"),
              "simulate invalid order: %s", ctx.err);
        {
            int32_t gp[] = {0, 2, 2};
            CHECK(mf_simulate(&ctx, &d, ok, gp, 2, &pk, NULL, NULL) == MF_EINVAL && strstr(ctx.err, "group_ptr"),
                  "bad group_ptr: %s", ctx.err);
        }
    }
    tg_free(&g);

    /* empty graph */
    {
        mf_ctx ctx;
        mf_graph_desc d;
        mf_plan_result res;
        int32_t zero = 0;
        memset(&d, 0, sizeof d);
        d.in_ptr = &zero;
        d.out_ptr = &zero;
        mf_ctx_init(&ctx, NULL);
        CHECK(mf_plan(&ctx, &d, NULL, &res) == MF_OK && res.n_groups == 0 && res.peak_bytes == 0 &&
                  res.optimal == 1,
              "empty graph: %s", ctx.err);
        mf_plan_result_free(&ctx, &res);
        mf_plan_result_free(&ctx, &res); /* safe twice / on zeroed */
        CHECK(mf_graph_check(&ctx, NULL) == MF_EINVAL, "NULL graph");
    }
}

static void stack_graph(tg *g, int target_ops);

/* ---- Liu's hill/valley merging (NOTE [liu merge] in mf_liu.c) ---- */

typedef struct cop {
    int ins[40], nin, outs[2], nout, key;
} cop;

/* Parallel chains: an optional fork op (reads a graph input; its output is
 * read by every chain head), nch chains of 1..maxlen ops (random sizes, 0
 * included; some ops with a second, unread output), optionally a floating
 * "recompute" op per chain read by its head, a weight-gradient side sink per
 * chain (reads the value before the last op; a graph output), and a join:
 * 0 none (chain ends are outputs), 1 one op reading every end, 2 a chain of
 * adds.  horizontal: ops listed step by step across chains (the order a
 * dataflow fusion produces), else chain by chain (a valid order either way). */
static void chains_graph(tg *g, int nch, int maxlen, int fork, int join, int sinks, int recompute,
                         int horizontal)
{
    cop *ops = (cop *)xrealloc(NULL, sizeof(cop) * (size_t)(nch * (maxlen + 3) + 4));
    int nops = 0, c, l, x, src, ends[32], i, j;
    tg_init(g);
    x = tg_value(g, 8 * (1 + rint_(8)), 1, -1, 0);
    src = x;
    if (fork) {
        cop *o = &ops[nops++];
        src = tg_value(g, 8 * (1 + rint_(8)), 0, -1, 0);
        o->nin = 1;
        o->ins[0] = x;
        o->nout = 1;
        o->outs[0] = src;
        o->key = -1;
    }
    for (c = 0; c < nch; c++) {
        int len = 1 + rint_(maxlen), h = src, prevh = -1;
        for (l = 0; l < len; l++) {
            cop *o;
            if (l == 0 && recompute) {
                int saved = tg_value(g, 16, 1, -1, 0), r = tg_value(g, 8 * (1 + rint_(6)), 0, -1, 0);
                o = &ops[nops++];
                o->nin = 1;
                o->ins[0] = saved;
                o->nout = 1;
                o->outs[0] = r;
                o->key = 0;
                o = &ops[nops++];
                o->nin = 2;
                o->ins[0] = h;
                o->ins[1] = r;
            } else {
                o = &ops[nops++];
                o->nin = 1;
                o->ins[0] = h;
            }
            o->nout = 1;
            o->outs[0] = tg_value(g, rint_(6) == 0 ? 0 : 8 * (1 + rint_(16)), 0, -1, 0);
            if (rint_(5) == 0)
                o->outs[o->nout++] = tg_value(g, 8 * (1 + rint_(4)), 0, -1, 0); /* never read */
            o->key = 2 * l + 1;
            prevh = h;
            h = o->outs[0];
        }
        if (sinks && prevh != src && prevh >= 0) {
            cop *o = &ops[nops++];
            o->nin = 1;
            o->ins[0] = prevh;
            o->nout = 1;
            o->outs[0] = tg_value(g, 8 * (1 + rint_(2)), 0, -1, 1);
            o->key = 2 * len;
        }
        ends[c] = h;
    }
    if (join == 1) {
        cop *o = &ops[nops++];
        o->nin = nch;
        for (c = 0; c < nch; c++)
            o->ins[c] = ends[c];
        o->nout = 1;
        o->outs[0] = tg_value(g, 8 * (1 + rint_(4)), 0, -1, 1);
        o->key = 1000;
    } else if (join == 2) {
        int acc = ends[0];
        for (c = 1; c < nch; c++) {
            cop *o = &ops[nops++];
            o->nin = 2;
            o->ins[0] = acc;
            o->ins[1] = ends[c];
            o->nout = 1;
            o->outs[0] = acc = tg_value(g, 8 * (1 + rint_(4)), 0, -1, 0);
            o->key = 1000 + c;
        }
        g->is_output[acc] = 1;
    } else {
        for (c = 0; c < nch; c++)
            g->is_output[ends[c]] = 1;
    }
    /* horizontal: stable sort by key (chain order kept within a step) */
    for (i = 1; i < nops && horizontal; i++) {
        cop t = ops[i];
        for (j = i; j > 0 && ops[j - 1].key > t.key; j--)
            ops[j] = ops[j - 1];
        ops[j] = t;
    }
    for (i = 0; i < nops; i++)
        tg_op(g, ops[i].ins, ops[i].nin, ops[i].outs, ops[i].nout, rint_(2));
    free(ops);
}

/* Liu's order itself, as one piece: valid, and for independent chains (no
 * fork, so each chain frees only what it allocated) with or without one
 * join op, optimal (the exact case of NOTE [liu merge]). */
static int liu_whitebox(const mf_graph_desc *d, const ref *r, int64_t *peak_out, int32_t *order)
{
    mf_ctx ctx;
    mf_arena a = {NULL};
    mf_pg pg;
    mf_liu_ws lw;
    int32_t ident[RMAX], piece_of[RMAX], order2[RMAX];
    int applied = 0, i, st;
    mf_ctx_init(&ctx, NULL);
    for (i = 0; i < d->n_ops; i++) {
        ident[i] = i;
        piece_of[i] = 0;
    }
    st = mf_pg_build(&ctx, &a, d, &pg);
    if (!st)
        st = mf_liu_init(&ctx, &a, &pg, piece_of, d->n_ops, &lw);
    if (!st)
        st = mf_liu_order(&ctx, &lw, ident, d->n_ops, 0, NULL, order, &applied);
    if (!st && applied) {
        /* the second pass (shared storages freed by their last reader) */
        int applied2 = 0;
        st = mf_liu_order(&ctx, &lw, ident, d->n_ops, 0, order, order2, &applied2);
        CHECK(st == MF_OK && applied2 && ref_valid(r, order2), "liu second pass: %d %s", st, ctx.err);
    }
    mf_arena_release(&ctx, &a);
    CHECK(st == MF_OK, "liu white-box: %d %s", st, ctx.err);
    if (st || !applied)
        return 0;
    *peak_out = ref_sim(r, order, NULL, 0, NULL);
    return 1;
}

static void test_liu(void)
{
    int t, exact = 0, plans = 0, liu_capped = 0, liu_wide = 0, wide = 0;
    /* exact case: independent chains, with or without one join */
    for (t = 0; t < 400; t++) {
        tg g;
        mf_graph_desc d;
        ref r;
        int64_t best, pk = -1;
        int32_t order[RMAX];
        chains_graph(&g, 2 + rint_(3), 4, 0, rint_(2), 0, 0, 0);
        if (!test_graph(&g, &d, &r, 0, 16, 1, "liu exact", t))
            continue;
        best = brute_min(&r);
        if (g.n_ops >= 3) {
            CHECK(liu_whitebox(&d, &r, &pk, order), "liu exact %d: not applied", t);
            CHECK(ref_valid(&r, order), "liu exact %d: invalid order", t);
            CHECK(pk == best, "liu exact %d: Liu's order peaks at %lld, optimum %lld", t, (long long)pk,
                  (long long)best);
        }
        exact++;
        tg_free(&g);
    }
    /* every shape: the plan against the subset DP, at the default cap and
     * capped (check_plan_against_ref); Liu's own order valid */
    for (t = 0; t < 300; t++) {
        tg g;
        mf_graph_desc d;
        ref r;
        mf_ctx ctx;
        mf_plan_result res;
        mf_plan_options opt = {0};
        int64_t pk;
        int32_t order[RMAX];
        chains_graph(&g, 2 + rint_(3), 3, rint_(2), rint_(3), rint_(2), rint_(2), rint_(2));
        if (!test_graph(&g, &d, &r, 3, 20, 1, "liu shapes", t))
            continue;
        mf_ctx_init(&ctx, NULL);
        if (liu_whitebox(&d, &r, &pk, order))
            CHECK(ref_valid(&r, order) && pk >= subset_min(&r), "liu shapes %d: order", t);
        check_plan_against_ref(&d, &r, subset_min(&r), "liu shapes", t);
        opt.max_states = 1;
        opt.fuse = 1;
        if (mf_plan(&ctx, &d, &opt, &res) == MF_OK && !strcmp(res.method, "liu"))
            liu_capped++;
        mf_plan_result_free(&ctx, &res);
        plans++;
        tg_free(&g);
    }
    /* wide blocks, listed horizontally: the DP is over its cap; valid,
     * never worse than the input order */
    for (t = 0; t < 12; t++) {
        tg g;
        mf_graph_desc d;
        mf_ctx ctx;
        mf_plan_result res;
        int valid = 0;
        chains_graph(&g, 12 + rint_(12), 8, 1, 1 + rint_(2), rint_(2), rint_(2), 1);
        d = tg_desc(&g);
        mf_ctx_init(&ctx, NULL);
        CHECK(mf_plan(&ctx, &d, NULL, &res) == MF_OK, "liu wide %d: %s", t, ctx.err);
        CHECK(mf_check_order(&ctx, &d, res.order, &valid) == MF_OK && valid, "liu wide %d: invalid", t);
        CHECK(res.unfused_peak_bytes <= res.baseline_peak_bytes, "liu wide %d: worse than input", t);
        if (!strcmp(res.method, "liu"))
            liu_wide++;
        wide++;
        mf_plan_result_free(&ctx, &res);
        tg_free(&g);
    }
    CHECK(liu_capped > 0, "Liu's order never kept on capped small chain graphs");
    printf("Liu merging: %d independent-chain graphs optimal, %d shapes checked (Liu kept at cap 1: %d), "
           "wide blocks: Liu kept in %d of %d\n",
           exact, plans, liu_capped, liu_wide, wide);
}

/* ---- pieces larger than the DP's full share (NOTE [DP piece size]) ---- */

/* Plan d with the given options and check what holds at any cap: a valid
 * order, peaks that agree with the reference, never below the optimum best,
 * never worse than a valid input order, optimal only when it is.  Returns
 * the plan's `optimal` (-1: the plan failed). */
static int check_plan_opts(const mf_graph_desc *d, const ref *r, int64_t best, const mf_plan_options *opt,
                           const char *what, int seed, int64_t *states)
{
    mf_ctx ctx;
    mf_plan_result res;
    int32_t ident[RMAX];
    int st, i, optimal;
    mf_ctx_init(&ctx, NULL);
    for (i = 0; i < d->n_ops; i++)
        ident[i] = i;
    st = mf_plan(&ctx, d, opt, &res);
    CHECK(st == MF_OK, "%s %d: plan failed %d %s", what, seed, st, ctx.err);
    if (st)
        return -1;
    CHECK(ref_valid(r, res.order), "%s %d: invalid order", what, seed);
    CHECK(ref_sim(r, res.order, NULL, 0, NULL) == res.unfused_peak_bytes, "%s %d: unfused peak", what, seed);
    CHECK(ref_sim(r, res.order, res.group_ptr, res.n_groups, NULL) == res.peak_bytes, "%s %d: peak", what,
          seed);
    CHECK(res.unfused_peak_bytes >= best, "%s %d: %lld below the optimum %lld", what, seed,
          (long long)res.unfused_peak_bytes, (long long)best);
    if (res.optimal)
        CHECK(res.unfused_peak_bytes == best, "%s %d: claims optimal at %lld, optimum %lld (method %s)", what,
              seed, (long long)res.unfused_peak_bytes, (long long)best, res.method);
    if (ref_valid(r, ident))
        CHECK(res.unfused_peak_bytes <= ref_sim(r, ident, NULL, 0, NULL), "%s %d: worse than input", what, seed);
    optimal = res.optimal;
    if (states)
        *states += res.states;
    mf_plan_result_free(&ctx, &res);
    return optimal;
}

/* Small graphs planned with dp_max_ops lowered to 2..4, so that their pieces
 * are "large": the DP runs with the scaled share (and proves the optimum
 * when it finishes), and when it is capped the windows grow (2, 4, ...) in
 * those pieces.  Checked against brute force / the subset DP. */
static void test_large_pieces(void)
{
    int t, tested = 0, proven = 0, proven_capped = 0, runs_capped = 0;
    int64_t st_full = 0, st_capped = 0;
    for (t = 0; t < 900; t++) {
        tg g;
        mf_graph_desc d;
        ref r;
        mf_plan_options opt = {0};
        int64_t best;
        int o;
        if (t % 3 == 0)
            random_graph(&g, 6 + rint_(7), t % 2);
        else if (t % 3 == 1)
            block_graph(&g, 2 + rint_(3), 3, t % 2);
        else
            chains_graph(&g, 2 + rint_(3), 3, rint_(2), rint_(3), rint_(2), rint_(2), rint_(2));
        if (!test_graph(&g, &d, &r, 5, 20, 0, "large pieces", t))
            continue;
        best = g.n_ops <= 12 ? brute_min(&r) : subset_min(&r);
        opt.fuse = t % 2;
        opt.no_fusion_moves = 1; /* the unfused DP is under test (moves: check_fusion_moves) */
        opt.dp_max_ops = 2 + t % 3;
        o = check_plan_opts(&d, &r, best, &opt, "large pieces", t, &st_full);
        proven += o == 1;
        /* capped: the scaled share runs out, the windows take over */
        opt.max_states = 4 + rint_(60);
        o = check_plan_opts(&d, &r, best, &opt, "large pieces capped", t, &st_capped);
        proven_capped += o == 1;
        runs_capped++;
        tested++;
        tg_free(&g);
    }
    CHECK(proven * 10 >= tested * 9, "large pieces: only %d of %d proven at the default cap", proven, tested);
    /* pieces above MF_DP_BIG_FACTOR * dp_max_ops skip the DP: windows only */
    {
        tg g;
        mf_graph_desc d;
        mf_ctx ctx;
        mf_plan_result res;
        mf_plan_options opt = {0};
        int valid = 0;
        int64_t sim = -1;
        stack_graph(&g, 400);
        d = tg_desc(&g);
        mf_ctx_init(&ctx, NULL);
        opt.fuse = 1;
        opt.dp_max_ops = 2;
        CHECK(mf_plan(&ctx, &d, &opt, &res) == MF_OK, "large pieces stack: %s", ctx.err);
        CHECK(mf_check_order(&ctx, &d, res.order, &valid) == MF_OK && valid, "large pieces stack: invalid");
        CHECK(mf_simulate(&ctx, &d, res.order, NULL, 0, &sim, NULL, NULL) == MF_OK &&
                  sim == res.unfused_peak_bytes && (sim <= res.baseline_peak_bytes || res.fusion_moves > 0),
              "large pieces stack: peak %lld baseline %lld moves %d", (long long)sim,
              (long long)res.baseline_peak_bytes, (int)res.fusion_moves); /* moves may raise the unfused peak */
        mf_plan_result_free(&ctx, &res);
        tg_free(&g);
    }
    printf("large-piece DP (dp_max_ops 2..4) on %d small graphs: %d proven (%lld states); capped: %d of %d "
           "proven (%lld states)\n",
           tested, proven, (long long)st_full, proven_capped, runs_capped, (long long)st_capped);
}

/* ---- allocation failure injection ---- */

typedef int (*call_fn)(mf_ctx *ctx, const mf_graph_desc *d, void *arg);

static int call_plan(mf_ctx *ctx, const mf_graph_desc *d, void *arg)
{
    mf_plan_result res;
    int st = mf_plan(ctx, d, (const mf_plan_options *)arg, &res);
    if (st == MF_OK)
        CHECK(res.order != NULL, "plan ok without order");
    else
        CHECK(res.order == NULL && res.group_ptr == NULL, "plan failed but left arrays");
    mf_plan_result_free(ctx, &res);
    return st;
}

static int call_check(mf_ctx *ctx, const mf_graph_desc *d, void *arg)
{
    (void)arg;
    return mf_graph_check(ctx, d);
}

static int call_sim(mf_ctx *ctx, const mf_graph_desc *d, void *arg)
{
    int64_t pk;
    int valid, st;
    (void)arg;
    st = mf_simulate(ctx, d, (const int32_t *)arg, NULL, 0, &pk, NULL, NULL);
    if (st)
        return st;
    return mf_check_order(ctx, d, (const int32_t *)arg, &valid);
}

static void inject(const mf_graph_desc *d, call_fn fn, void *arg, const char *what)
{
    mf_talloc ta;
    mf_allocator al;
    mf_ctx ctx;
    long total, N;
    al.alloc = mf_talloc_alloc;
    al.free = mf_talloc_free;
    al.ud = &ta;
    memset(&ta, 0, sizeof ta);
    mf_ctx_init(&ctx, &al);
    CHECK(fn(&ctx, d, arg) == MF_OK, "%s: clean run failed: %s", what, ctx.err);
    CHECK(ta.live == 0, "%s: clean run leaked %ld blocks", what, ta.live);
    total = ta.count;
    for (N = 1; N <= total; N++) {
        int st;
        memset(&ta, 0, sizeof ta);
        ta.fail_at = N;
        ctx.err[0] = 0;
        st = fn(&ctx, d, arg);
        CHECK(st == MF_ENOMEM, "%s: failing allocation %ld/%ld gave %d (%s)", what, N, total, st, ctx.err);
        CHECK(ta.live == 0, "%s: failing allocation %ld leaked %ld blocks", what, N, ta.live);
        CHECK(st != MF_ENOMEM || strstr(ctx.err, "out of memory"), "%s: message '%s'", what, ctx.err);
    }
    printf("allocation failure injection (%s): %ld allocations, each failed once\n", what, total);
}

static void test_alloc_failures(void)
{
    tg g;
    mf_graph_desc d;
    mf_plan_options opt = {0};
    int t, found = 0;
    int32_t ident[64];
    for (t = 0; t < 64; t++)
        ident[t] = t;
    seed_graph(&g, 0);
    d = tg_desc(&g);
    inject(&d, call_plan, NULL, "plan seed");
    inject(&d, call_check, NULL, "check seed");
    inject(&d, call_sim, ident, "simulate seed");
    tg_free(&g);
    /* graphs where the DP and the windows run */
    for (t = 0; t < 400 && found < 3; t++) {
        mf_ctx ctx;
        mf_plan_result res;
        int st;
        block_graph(&g, 3, 3, 1);
        d = tg_desc(&g);
        mf_ctx_init(&ctx, NULL);
        st = mf_plan(&ctx, &d, NULL, &res);
        if (st == MF_OK && res.states > 3) {
            found++;
            inject(&d, call_plan, NULL, "plan with DP");
            opt.max_states = 3;
            opt.fuse = 1;
            inject(&d, call_plan, &opt, "plan with capped DP");
        }
        mf_plan_result_free(&ctx, &res);
        tg_free(&g);
    }
    CHECK(found > 0, "no block graph needed the DP");
    /* parallel chains with a fork and side sinks, DP capped, where Liu's
     * order is kept (so its workspace was allocated) */
    opt.max_states = 3;
    opt.fuse = 1;
    for (t = 0, found = 0; t < 200 && !found; t++) {
        mf_ctx ctx;
        mf_plan_result res;
        chains_graph(&g, 6, 5, 1, 2, 1, 1, 1);
        d = tg_desc(&g);
        mf_ctx_init(&ctx, NULL);
        if (mf_plan(&ctx, &d, &opt, &res) == MF_OK && !strcmp(res.method, "liu")) {
            found = 1;
            inject(&d, call_plan, &opt, "plan with Liu merging");
        }
        mf_plan_result_free(&ctx, &res);
        tg_free(&g);
    }
    CHECK(found, "no chain graph kept Liu's order");
    /* a large piece (dp_max_ops lowered): the scaled DP, capped, then
     * growing windows */
    stack_graph(&g, 150);
    d = tg_desc(&g);
    opt.max_states = 3000;
    opt.fuse = 1;
    opt.dp_max_ops = 8;
    inject(&d, call_plan, &opt, "plan with a large piece");
    opt.dp_max_ops = 0;
    tg_free(&g);
    /* a DP that grows its state arrays and hash table, capped, then windows */
    stack_graph(&g, 150);
    d = tg_desc(&g);
    opt.max_states = 6000;
    opt.fuse = 1;
    inject(&d, call_plan, &opt, "plan with a large DP");
    tg_free(&g);
}

/* ---- larger graphs: timing and sanity ---- */

/* Transformer-like stack: per block a fan-out of the residual into paths of
 * a few ops (some reading a weight prepared by a floating op), summed into
 * the residual by a chain of adds. */
static void stack_graph(tg *g, int target_ops)
{
    int x, W;
    tg_init(g);
    W = tg_value(g, 4096, 1, -1, 0);
    x = tg_value(g, 4096, 1, -1, 0);
    while (g->n_ops < target_ops) {
        int np = 4 + rint_(7), p, acc = x;
        for (p = 0; p < np; p++) {
            int len = 3 + rint_(4), l, h = x, w = -1;
            if (rint_(3) == 0) {
                w = tg_value(g, 1024, 0, -1, 0);
                tg_op(g, &W, 1, &w, 1, 0);
            }
            for (l = 0; l < len; l++) {
                int ins[2], nin = 1, o = tg_value(g, 1024 * (1 + rint_(8)), 0, -1, 0);
                ins[0] = h;
                if (l == 0 && w >= 0)
                    ins[nin++] = w;
                tg_op(g, ins, nin, &o, 1, rint_(2));
                h = o;
            }
            {
                int ins[2], o = tg_value(g, 4096, 0, -1, 0);
                ins[0] = acc;
                ins[1] = h;
                tg_op(g, ins, 2, &o, 1, 1);
                acc = o;
            }
        }
        x = acc;
    }
    g->is_output[x] = 1;
}

static void test_large(int full)
{
    int sizes[] = {10000, 100000}, si;
    for (si = 0; si < (full ? 2 : 1); si++) {
        tg g;
        mf_graph_desc d;
        mf_ctx ctx;
        mf_plan_result res;
        int valid = 0, st;
        double t0;
        stack_graph(&g, sizes[si]);
        d = tg_desc(&g);
        mf_ctx_init(&ctx, NULL);
        t0 = now_ms();
        st = mf_plan(&ctx, &d, NULL, &res);
        t0 = now_ms() - t0;
        CHECK(st == MF_OK, "large: %s", ctx.err);
        if (st == MF_OK) {
            CHECK(mf_check_order(&ctx, &d, res.order, &valid) == MF_OK && valid, "large: invalid order");
            CHECK(res.unfused_peak_bytes <= res.baseline_peak_bytes, "large: worse than input");
            printf("stack graph %d ops: %.1f ms, peak %lld unfused %lld baseline %lld LB %lld optimal %d "
                   "method %s states %lld groups %d\n",
                   (int)d.n_ops, t0, (long long)res.peak_bytes, (long long)res.unfused_peak_bytes,
                   (long long)res.baseline_peak_bytes, (long long)res.lower_bound_bytes, res.optimal, res.method,
                   (long long)res.states, (int)res.n_groups);
        }
        mf_plan_result_free(&ctx, &res);
        tg_free(&g);
    }
}

int mf_test_comm(int *checks); /* test_comm.c */
int mf_test_build(int *checks); /* test_build.c */
int mf_test_kinds(int *checks); /* test_kinds.c */
int mf_test_remat(int *checks); /* test_remat.c */
int mf_test_allowance(int *checks); /* test_allowance.c */
int mf_test_coarse(int *checks); /* test_coarse.c */
int mf_test_heads(int *checks); /* test_heads.c */
int mf_test_pipeline(int *checks); /* test_pipeline.c */
int test_harden(int *checks); /* test_harden.c */

int main(int argc, char **argv)
{
    int full = argc > 1 && !strcmp(argv[1], "--full");
    test_simulator();
    test_fusion_plan();
    test_epilogue_pairs();
    test_stored_inner_values();
    test_errors();
    test_seed();
    test_random_small();
    test_blocks();
    test_sinks();
    test_random_medium();
    test_liu();
    test_large_pieces();
    test_alloc_failures();
    test_large(full);
    g_failures += mf_test_comm(&g_checks);
    g_failures += mf_test_build(&g_checks);
    g_failures += mf_test_remat(&g_checks);
    g_failures += mf_test_allowance(&g_checks);
    g_failures += mf_test_coarse(&g_checks);
    g_failures += mf_test_heads(&g_checks);
    g_failures += mf_test_pipeline(&g_checks);
    g_failures += test_harden(&g_checks);
    g_failures += mf_test_kinds(&g_checks);
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
