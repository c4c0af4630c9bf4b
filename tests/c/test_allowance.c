/*
 * test_allowance.c -- the plan's peak allowance (csrc/core/mf_fuse.c NOTE [peak allowance]), run
 * from test_core.c's main.  Random small graphs with fusible, stored (MF_FUSIBLE_STORED) and
 * unfusible ops, graph outputs and views are planned without an allowance and with several: below
 * the least fused peak, at it, between it and the unfused peak, far above.  On the order each plan
 * returns, every grouping (runs of fusible ops, singles) is scored by mf_simulate, so:
 *  - an allowance that does not bind (at most the least grouping peak of the plan without one)
 *    gives that very plan;
 *  - otherwise the plan's grouping has the fewest groups of all groupings of its order whose peak
 *    is at most max(least, allowance), its reported peak is its simulated one and at most that
 *    bound, and it never has more groups than the plan without the allowance on the same order;
 *  - a huge allowance leaves one group per maximal run of fusible ops.
 */
#define _POSIX_C_SOURCE 200809L
#include "mf_build.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mf_test_allowance(int *checks);

static int a_failures, a_checks;

#define ACHECK(cond, ...) MF_TEST_CHECK(a_checks, a_failures, cond, __VA_ARGS__)

#define AMAX 11

static uint64_t a_state = 0xD1B54A32D192ED03ULL;

static int a_int(int n) /* [0, n) */
{
    return mf_test_rand(&a_state, n);
}

static void random_graph(mf_gbuf *b, int n)
{
    static const int64_t sizes[] = {1, 4, 8, 16, 32, 64};
    int k;
    mf_gbuf_init(b, NULL);
    mf_gbuf_add_value(b, 8, 1);
    mf_gbuf_add_value(b, 16, 1);
    for (k = 0; k < n; k++) {
        int32_t nv = b->n_values;
        int kind = a_int(10), nin = 1 + a_int(3), i;
        mf_gbuf_begin_op(b, kind < 6 ? 1 : kind < 8 ? MF_FUSIBLE_STORED : 0);
        if (kind == 9 && nv > 2) { /* a view of a value made here */
            mf_test_view_of(b, 2 + a_int(nv - 2));
        } else {
            for (i = 0; i < nin; i++)
                mf_gbuf_op_in(b, a_int(nv));
            mf_gbuf_op_out(b, mf_gbuf_add_value(b, sizes[a_int(6)], 0));
        }
        mf_gbuf_end_op(b);
    }
    for (k = 2; k < b->n_values; k++)
        if (a_int(5) == 0 || k == b->n_values - 1)
            b->is_output[k] = 1;
}

/* Over every grouping of `order` (runs of fusible ops, singles): the least peak, and the fewest
 * groups among those with peak <= bound (bound < 0: at the least peak). */
static void all_groupings(mf_ctx *ctx, const mf_graph_desc *d, const int32_t *order, int64_t bound,
                          int64_t *least, int *fewest)
{
    int32_t n = d->n_ops, gp[AMAX + 1];
    uint32_t mask, M = n > 1 ? 1u << (n - 1) : 1;
    int pass;
    *least = INT64_MAX;
    *fewest = 1 << 30;
    for (pass = 0; pass < 2; pass++)
        for (mask = 0; mask < M; mask++) {
            int32_t ng = mf_test_grouping(d, order, mask, gp);
            int64_t pk = 0;
            if (!ng || mf_simulate(ctx, d, order, gp, ng, &pk, NULL, NULL) != MF_OK)
                continue;
            if (pass == 0 && pk < *least)
                *least = pk;
            if (pass == 1 && pk <= (bound < 0 || bound < *least ? *least : bound) && ng < *fewest)
                *fewest = ng;
        }
}

/* Maximal runs of fusible ops in order, each counted once, plus every unfusible op. */
static int runs_of(const mf_graph_desc *d, const int32_t *order)
{
    int32_t i, c = 0;
    for (i = 0; i < d->n_ops; i++)
        c += !d->fusible[order[i]] || i == 0 || !d->fusible[order[i - 1]];
    return c;
}

static int same_plan(const mf_plan_result *a, const mf_plan_result *b)
{
    return a->peak_bytes == b->peak_bytes && a->n_groups == b->n_groups &&
           !memcmp(a->order, b->order, sizeof(int32_t) * (size_t)a->n_ops) &&
           !memcmp(a->group_ptr, b->group_ptr, sizeof(int32_t) * ((size_t)a->n_groups + 1));
}

static void check_graph(mf_gbuf *b, int t, int *bound_cases)
{
    mf_graph_desc d;
    mf_ctx ctx;
    mf_plan_options opt;
    mf_plan_result r0, ra;
    int64_t allows[5], sim;
    int c;
    mf_gbuf_desc(b, &d);
    mf_ctx_init(&ctx, NULL);
    if (mf_graph_check(&ctx, &d) != MF_OK)
        return;
    memset(&opt, 0, sizeof opt);
    opt.fuse = 1;
    if (mf_plan(&ctx, &d, &opt, &r0) != MF_OK) {
        ACHECK(0, "allowance %d: plan failed: %s", t, ctx.err);
        return;
    }
    allows[0] = r0.peak_bytes / 2;
    allows[1] = r0.peak_bytes;
    allows[2] = (r0.peak_bytes + r0.unfused_peak_bytes) / 2 + 1;
    allows[3] = r0.unfused_peak_bytes + 1 + a_int(64);
    allows[4] = INT64_MAX / 64;
    for (c = 0; c < 5; c++) {
        int64_t least, bound;
        int fewest;
        opt.peak_allowance = allows[c];
        if (mf_plan(&ctx, &d, &opt, &ra) != MF_OK) {
            ACHECK(0, "allowance %d/%d: plan failed: %s", t, c, ctx.err);
            continue;
        }
        ACHECK(mf_simulate(&ctx, &d, ra.order, ra.group_ptr, ra.n_groups, &sim, NULL, NULL) == MF_OK &&
                   sim == ra.peak_bytes,
               "allowance %d/%d: reported peak %lld, simulated %lld", t, c, (long long)ra.peak_bytes,
               (long long)sim);
        if (allows[c] <= r0.peak_bytes) { /* does not bind: the plan without it */
            ACHECK(same_plan(&r0, &ra), "allowance %d/%d: %lld <= peak %lld changed the plan", t, c,
                   (long long)allows[c], (long long)r0.peak_bytes);
            mf_plan_result_free(&ctx, &ra);
            continue;
        }
        (*bound_cases)++;
        all_groupings(&ctx, &d, ra.order, allows[c], &least, &fewest);
        bound = least > allows[c] ? least : allows[c];
        ACHECK(ra.peak_bytes <= bound, "allowance %d/%d: peak %lld above the bound %lld", t, c,
               (long long)ra.peak_bytes, (long long)bound);
        ACHECK(ra.n_groups == fewest, "allowance %d/%d: %d groups, fewest within %lld: %d", t, c,
               (int)ra.n_groups, (long long)bound, fewest);
        if (!memcmp(ra.order, r0.order, sizeof(int32_t) * (size_t)d.n_ops))
            ACHECK(ra.n_groups <= r0.n_groups, "allowance %d/%d: more groups (%d) than without it (%d)", t, c,
                   (int)ra.n_groups, (int)r0.n_groups);
        if (c == 4)
            ACHECK(ra.n_groups == runs_of(&d, ra.order), "allowance %d: huge allowance left %d groups, %d runs",
                   t, (int)ra.n_groups, runs_of(&d, ra.order));
        mf_plan_result_free(&ctx, &ra);
    }
    mf_plan_result_free(&ctx, &r0);
}

int mf_test_allowance(int *checks)
{
    int t, bound_cases = 0;
    for (t = 0; t < 400; t++) {
        mf_gbuf b;
        random_graph(&b, 2 + a_int(AMAX - 1));
        check_graph(&b, t, &bound_cases);
        mf_gbuf_free(&b);
    }
    ACHECK(bound_cases > 200, "only %d plans where the allowance binds", bound_cases);
    printf("peak allowance: %d random graphs, %d plans where it binds (%d checks, %d failures)\n", t, bound_cases,
           a_checks, a_failures);
    *checks += a_checks;
    return a_failures;
}
