/*
 * test_remat.c -- tests of recomputation's search (csrc/core/mf_remat.c NOTE [recomputation]),
 * run from test_core.c's main.  Random graphs with views (chains of them, views reading a
 * second value, views that are graph outputs), ops with two outputs, graph outputs and ordering
 * edges go through mf_recompute with several budgets, on the input order and on the planned
 * one, with few cheap ops (the exact search over at most ten candidate splits) and many (the
 * greedy).  These tests build with MF_STRICT_CHECKS, under which the search scores every
 * candidate both incrementally and on its built graph and fails on any difference (NOTE
 * [incremental scoring]); here the result must be a valid graph whose simulated peak is the
 * reported one, never above the start, within the budget, every copy a copy of a cheap op.
 * Allocation failures and cancellation leave nothing behind.
 */
#define _POSIX_C_SOURCE 200809L
#include "mf_build.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mf_test_remat(int *checks);

static int r_failures, r_checks;

#define RCHECK(cond, ...) MF_TEST_CHECK(r_checks, r_failures, cond, __VA_ARGS__)

static uint64_t r_state = 0x9E3779B97F4A7C15ULL;

static int r_int(int n) /* [0, n) */
{
    return mf_test_rand(&r_state, n);
}

typedef struct rgraph {
    mf_gbuf b;
    uint8_t cheap[512];
} rgraph;

/* A random graph of about n ops (at most 500); cheap_pct: the share of cheap ops. */
static void random_graph(rgraph *g, int n, int cheap_pct, int with_after)
{
    static const int64_t sizes[] = {0, 1, 4, 8, 16, 32, 64};
    int k;
    mf_gbuf_init(&g->b, NULL);
    mf_gbuf_add_value(&g->b, 8, 1);
    mf_gbuf_add_value(&g->b, 16, 1);
    for (k = 0; k < n && k < 500; k++) {
        int32_t nv = g->b.n_values, lo = nv - 1 - r_int(nv < 24 ? nv : 24), v;
        int kind = r_int(10), nin = 1 + r_int(3), i;
        g->cheap[k] = (uint8_t)(r_int(100) < cheap_pct);
        if (lo < 0)
            lo = 0;
        mf_gbuf_begin_op(&g->b, r_int(2));
        if (kind < 2) { /* a view of a recent value, sometimes reading a second one */
            int32_t base = lo + r_int(nv - lo);
            v = mf_gbuf_add_value(&g->b, g->b.value_bytes[base], 0);
            g->b.alias_of[v] = base;
            mf_gbuf_op_in(&g->b, base);
            if (r_int(4) == 0)
                mf_gbuf_op_in(&g->b, lo + r_int(nv - lo));
            mf_gbuf_op_out(&g->b, v);
            if (r_int(3))
                g->cheap[k] = 1;
        } else {
            for (i = 0; i < nin; i++)
                mf_gbuf_op_in(&g->b, lo + r_int(nv - lo));
            v = mf_gbuf_add_value(&g->b, sizes[r_int(7)], 0);
            mf_gbuf_op_out(&g->b, v);
            if (kind == 9)
                mf_gbuf_op_out(&g->b, mf_gbuf_add_value(&g->b, sizes[r_int(7)], 0));
        }
        mf_gbuf_end_op(&g->b);
        if (with_after && k > 2 && r_int(8) == 0)
            mf_gbuf_after(&g->b, r_int(k), k);
    }
    for (k = 2; k < g->b.n_values; k++)
        if (r_int(12) == 0)
            g->b.is_output[k] = 1;
}

static int64_t graph_bytes(const mf_gbuf *b)
{
    int64_t s = 0;
    int32_t v;
    for (v = 0; v < b->n_values; v++)
        s += b->value_bytes[v];
    return s;
}

/* mf_recompute on g in `order` (NULL: 0..n-1) with `budget`: the checks of the file's comment.
 * focus (NULL: the search): {lo, hi, pick} of NOTE [focused splits], which makes at most one
 * split and scores nothing, so its peak may rise. */
static void check_one(mf_ctx *ctx, const rgraph *g, const int32_t *order, int64_t budget, const int32_t *focus,
                      int *searched)
{
    mf_graph_desc d, rd;
    mf_remat_result res;
    int32_t *ord = malloc(sizeof(int32_t) * (size_t)(g->b.n_ops + 1)), k, *id;
    int64_t peak = 0;
    int st;
    mf_remat_options opt;
    memset(&opt, 0, sizeof opt);
    opt.budget_bytes = budget;
    if (focus) {
        opt.focus_lo = focus[0];
        opt.focus_hi = focus[1];
        opt.focus_pick = focus[2];
    }
    mf_gbuf_desc(&g->b, &d);
    for (k = 0; k < g->b.n_ops; k++)
        ord[k] = order ? order[k] : k;
    st = mf_recompute(ctx, &d, g->cheap, ord, &opt, &res);
    RCHECK(st == MF_OK, "mf_recompute: status %d (%s)", st, ctx->err);
    if (st == MF_OK) {
        mf_remat_result_desc(&res, &rd);
        RCHECK(mf_graph_check(ctx, &rd) == MF_OK, "the result is not a valid graph: %s", ctx->err);
        id = malloc(sizeof(int32_t) * (size_t)(res.n_ops + 1));
        for (k = 0; k < res.n_ops; k++)
            id[k] = k;
        st = mf_simulate(ctx, &rd, id, NULL, res.n_ops, &peak, NULL, NULL);
        RCHECK(st == MF_OK && peak == res.peak_bytes, "simulated %lld, reported %lld (%s)", (long long)peak,
               (long long)res.peak_bytes, ctx->err);
        RCHECK(focus || res.peak_bytes <= res.start_peak_bytes, "peak %lld above the start %lld",
               (long long)res.peak_bytes, (long long)res.start_peak_bytes);
        RCHECK(!focus || res.n_splits <= 1, "a focused split made %d", (int)res.n_splits);
        RCHECK(res.copied_bytes <= (budget > 0 ? budget : 0), "copied %lld over the budget %lld",
               (long long)res.copied_bytes, (long long)budget);
        RCHECK((res.n_splits == 0) == (res.n_ops == g->b.n_ops), "%d splits, %d ops of %d", (int)res.n_splits,
               (int)res.n_ops, (int)g->b.n_ops);
        { /* copies: their origins repeat, and each is cheap */
            int32_t *seen = calloc((size_t)g->b.n_ops + 1, sizeof(int32_t));
            for (k = 0; k < res.n_ops; k++)
                seen[res.origin[k]]++;
            for (k = 0; k < g->b.n_ops; k++)
                RCHECK(seen[k] >= 1 && (seen[k] == 1 || g->cheap[k]), "op %d appears %d times", (int)k,
                       (int)seen[k]);
            free(seen);
        }
        *searched += res.n_splits > 0;
        free(id);
        mf_remat_result_free(ctx, &res);
    }
    free(ord);
}

static void test_random(void)
{
    int seed, searched = 0, graphs = 0, focused = 0;
    mf_ctx ctx;
    mf_ctx_init(&ctx, NULL);
    for (seed = 0; seed < 250; seed++) {
        rgraph g;
        mf_graph_desc d;
        mf_plan_options po;
        mf_plan_result pr;
        int cheap_pct = seed % 4 == 0 ? 15 : 70, n = 6 + r_int(seed % 5 == 0 ? 200 : 60);
        int64_t total;
        random_graph(&g, n, cheap_pct, seed % 3 == 0);
        if (g.b.nomem) {
            RCHECK(0, "out of memory building a graph");
            mf_gbuf_free(&g.b);
            continue;
        }
        total = graph_bytes(&g.b);
        mf_gbuf_desc(&g.b, &d);
        check_one(&ctx, &g, NULL, total / 2, NULL, &searched);
        memset(&po, 0, sizeof po);
        memset(&pr, 0, sizeof pr);
        if (mf_plan(&ctx, &d, &po, &pr) == MF_OK) {
            int32_t f[3], i;
            check_one(&ctx, &g, pr.order, total / 8 + 1, NULL, &searched);
            check_one(&ctx, &g, pr.order, total, NULL, &searched);
            for (i = 0; i < 3; i++) { /* focused splits around a random group */
                f[0] = r_int(g.b.n_ops);
                f[1] = f[0] + 1 + r_int(4);
                f[1] = f[1] > g.b.n_ops ? g.b.n_ops : f[1];
                f[2] = r_int(3);
                check_one(&ctx, &g, pr.order, total, f, &focused);
            }
        } else {
            RCHECK(0, "mf_plan: %s", ctx.err);
        }
        mf_plan_result_free(&ctx, &pr);
        mf_gbuf_free(&g.b);
        graphs++;
    }
    RCHECK(searched > 60, "only %d searches kept copies", searched);
    RCHECK(focused > 30, "only %d focused splits made a copy", focused);
    printf("recomputation: %d random graphs, %d searches kept copies, %d focused splits made one\n", graphs, searched,
           focused);
}

/* ---- allocation failures and cancellation ---- */


static int cancel_now(void *ud)
{
    (void)ud;
    return 1;
}

static void test_failures(void)
{
    int which;
    for (which = 0; which < 2; which++) { /* 0: the greedy (many cheap ops), 1: the exact search */
        rgraph g;
        mf_graph_desc d;
        mf_remat_options opt;
        mf_remat_result res;
        int32_t k, *ord;
        long total = 0, fail;
        int st, copies = 0;
        do {
            random_graph(&g, which ? 12 : 40, which ? 30 : 80, 1);
            mf_gbuf_desc(&g.b, &d);
            ord = malloc(sizeof(int32_t) * (size_t)(g.b.n_ops + 1));
            for (k = 0; k < g.b.n_ops; k++)
                ord[k] = k;
            memset(&opt, 0, sizeof opt);
            opt.budget_bytes = graph_bytes(&g.b);
            {
                mf_ctx ctx;
                mf_ctx_init(&ctx, NULL);
                st = mf_recompute(&ctx, &d, g.cheap, ord, &opt, &res);
                copies = st == MF_OK && res.n_splits > 0;
                if (st == MF_OK)
                    mf_remat_result_free(&ctx, &res);
            }
            if (!copies) {
                free(ord);
                mf_gbuf_free(&g.b);
            }
        } while (!copies);
        for (fail = 1;; fail++) {
            mf_talloc f = {0, 0, 0};
            mf_allocator al = {mf_talloc_alloc, mf_talloc_free, NULL};
            mf_ctx ctx;
            al.ud = &f;
            f.fail_at = fail;
            mf_ctx_init(&ctx, &al);
            st = mf_recompute(&ctx, &d, g.cheap, ord, &opt, &res);
            if (st == MF_OK) {
                mf_remat_result_free(&ctx, &res);
                RCHECK(f.live == 0, "%ld blocks left after freeing the result", f.live);
                total = fail - 1;
                break;
            }
            RCHECK(st == MF_ENOMEM, "failing allocation %ld: status %d", fail, st);
            RCHECK(f.live == 0, "failing allocation %ld: %ld blocks leaked", fail, f.live);
        }
        {
            mf_ctx ctx;
            mf_ctx_init(&ctx, NULL);
            ctx.cancel = cancel_now;
            st = mf_recompute(&ctx, &d, g.cheap, ord, &opt, &res);
            RCHECK(st == MF_ECANCEL, "cancelled: status %d", st);
        }
        printf("allocation failure injection (recomputation, %s): %ld allocations, each failed once\n",
               which ? "exact" : "greedy", total);
        free(ord);
        mf_gbuf_free(&g.b);
    }
}

int mf_test_remat(int *checks)
{
    test_random();
    test_failures();
    *checks += r_checks;
    return r_failures;
}
