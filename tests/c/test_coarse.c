/*
 * test_coarse.c -- coarse orders (csrc/core/mf_coarse.c NOTE [coarse orders]), run from
 * test_core.c's main.  Random graphs with chains of fusible ops, stored (MF_FUSIBLE_STORED) and
 * unfusible ops, views, graph outputs and ordering edges:
 *  - a coarse order, where one is given, is a valid order of the graph (every dependency kept)
 *    that runs each cluster's ops next to each other;
 *  - the fused plan with coarse orders is never above the plan without them (no_coarse), and its
 *    reported peak is its simulated one;
 *  - on some of the graphs the coarse start is what the plan keeps: a strictly lower fused peak
 *    (if the start were never given, or never grouped, no graph would show one);
 *  - a graph with nothing fusible gets none.
 */
#define _POSIX_C_SOURCE 200809L
#include "mf_build.h"
#include "mf_internal.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mf_test_coarse(int *checks);

static int c_failures, c_checks;

#define CCHECK(cond, ...) MF_TEST_CHECK(c_checks, c_failures, cond, __VA_ARGS__)

static uint64_t c_state = 0x9E3779B97F4A7C15ULL;

static int c_int(int n) /* [0, n) */
{
    return mf_test_rand(&c_state, n);
}

/* Blocks of a chain of fusible ops from a recent value, ended by a stored or unfusible op that
 * also reads an older value (a weight gradient reading an early activation), views now and then. */
static void random_graph(mf_gbuf *b, int blocks, int fusible)
{
    static const int64_t sizes[] = {4, 8, 16, 32, 64, 128};
    int k, i;
    mf_gbuf_init(b, NULL);
    mf_gbuf_add_value(b, 16, 1);
    mf_gbuf_add_value(b, 32, 1);
    for (k = 0; k < blocks; k++) {
        int len = 1 + c_int(4);
        int32_t last = b->n_values - 1 - c_int(b->n_values > 3 ? 3 : b->n_values);
        for (i = 0; i < len; i++) {
            int32_t v;
            mf_gbuf_begin_op(b, fusible);
            if (c_int(6) == 0 && last >= 2) { /* a view */
                v = mf_gbuf_add_value(b, b->value_bytes[last], 0);
                b->alias_of[v] = b->alias_of[last] >= 0 ? b->alias_of[last] : last;
                mf_gbuf_op_in(b, last);
            } else {
                v = mf_gbuf_add_value(b, sizes[c_int(6)], 0);
                mf_gbuf_op_in(b, last);
                if (c_int(3) == 0)
                    mf_gbuf_op_in(b, c_int(b->n_values - 1));
            }
            mf_gbuf_op_out(b, v);
            mf_gbuf_end_op(b);
            last = v;
        }
        mf_gbuf_begin_op(b, fusible ? (c_int(2) ? MF_FUSIBLE_STORED : 0) : 0);
        mf_gbuf_op_in(b, last);
        mf_gbuf_op_in(b, c_int(b->n_values));
        mf_gbuf_op_out(b, mf_gbuf_add_value(b, sizes[c_int(6)], 0));
        mf_gbuf_end_op(b);
    }
    if (b->n_ops > 3 && c_int(3) == 0) {
        int32_t x = c_int(b->n_ops - 1);
        mf_gbuf_after(b, x, x + 1 + c_int(b->n_ops - x - 1));
    }
    for (k = 2; k < b->n_values; k++)
        if ((c_int(7) == 0 || k == b->n_values - 1) && b->alias_of[k] < 0)
            b->is_output[k] = 1;
}

/* Does order run each op after what it reads and its ordering edges? */
static int valid(mf_ctx *ctx, const mf_graph_desc *d, const int32_t *order)
{
    int ok = 0;
    return mf_check_order(ctx, d, order, &ok) == MF_OK && ok;
}

static int check_graph(mf_gbuf *b, int t, int fusible, int *given, int *lower)
{
    mf_graph_desc d;
    mf_ctx ctx;
    mf_arena a = {NULL};
    mf_plan_options opt;
    mf_plan_result r0, r1;
    int32_t *order;
    int found = 0, st;
    int64_t sim, states = 0;
    mf_gbuf_desc(b, &d);
    mf_ctx_init(&ctx, NULL);
    if (mf_graph_check(&ctx, &d) != MF_OK)
        return 0;
    order = (int32_t *)calloc((size_t)d.n_ops + 1, sizeof(int32_t));
    st = mf_coarse_order(&ctx, &a, &d, 0, &states, order, &found);
    CCHECK(st == MF_OK, "coarse %d: status %d: %s", t, st, ctx.err);
    if (found) {
        (*given)++;
        CCHECK(valid(&ctx, &d, order), "coarse %d: the coarse order is not a valid order", t);
    }
    if (!fusible)
        CCHECK(!found, "coarse %d: a coarse order for a graph with nothing fusible", t);
    mf_arena_release(&ctx, &a);
    free(order);
    memset(&opt, 0, sizeof opt);
    opt.fuse = 1;
    if (mf_plan(&ctx, &d, &opt, &r1) != MF_OK) {
        CCHECK(0, "coarse %d: plan failed: %s", t, ctx.err);
        return 1;
    }
    opt.no_coarse = 1;
    if (mf_plan(&ctx, &d, &opt, &r0) != MF_OK) {
        CCHECK(0, "coarse %d: plan without coarse orders failed: %s", t, ctx.err);
        mf_plan_result_free(&ctx, &r1);
        return 1;
    }
    CCHECK(r1.peak_bytes <= r0.peak_bytes, "coarse %d: fused peak %lld with coarse orders, %lld without", t,
           (long long)r1.peak_bytes, (long long)r0.peak_bytes);
    CCHECK(mf_simulate(&ctx, &d, r1.order, r1.group_ptr, r1.n_groups, &sim, NULL, NULL) == MF_OK &&
               sim == r1.peak_bytes,
           "coarse %d: reported peak %lld, simulated %lld", t, (long long)r1.peak_bytes, (long long)sim);
    if (r1.peak_bytes < r0.peak_bytes)
        (*lower)++;
    mf_plan_result_free(&ctx, &r0);
    mf_plan_result_free(&ctx, &r1);
    return 1;
}

int mf_test_coarse(int *checks)
{
    int t, n = 0, given = 0, lower = 0;
    for (t = 0; t < 600; t++) {
        mf_gbuf b;
        int fusible = t % 10 != 0;
        random_graph(&b, 2 + c_int(9), fusible);
        n += check_graph(&b, t, fusible, &given, &lower);
        mf_gbuf_free(&b);
    }
    CCHECK(given > n / 2, "coarse orders given for only %d of %d graphs", given, n);
    CCHECK(lower > 0, "the coarse start never lowered a fused peak (%d graphs)", n);
    printf("coarse orders: %d random graphs, %d given, %d plans lower with them (%d checks, %d failures)\n", n,
           given, lower, c_checks, c_failures);
    *checks += c_checks;
    return c_failures;
}
