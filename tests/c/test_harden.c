/*
 * test_harden.c -- the core's guards (issue 10): byte totals that would wrap
 * (NOTE [byte sums]), the cancel flag (NOTE [cancel]), the DP's memory budget
 * (NOTE [DP memory budget]), simulate's order validation and the baseline
 * order (NOTE [baseline order]).  Called from test_core.c's main.
 */
#include "mf_core.h"
#include "fixed_graph.h"

#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int test_harden(int *checks);

static int h_fail, h_checks;

#define HCHECK(cond, ...) MF_TEST_CHECK(h_checks, h_fail, cond, __VA_ARGS__)

/* ---- an allocator that counts bytes: current, peak, and live blocks ---- */
typedef struct balloc {
    long long cur, peak;
    long live;
} balloc;

static void *b_alloc(void *ud, size_t n)
{
    balloc *b = (balloc *)ud;
    size_t *p = (size_t *)malloc(n + sizeof(size_t) * 2);
    if (!p)
        return NULL;
    p[0] = n;
    b->cur += (long long)n;
    if (b->cur > b->peak)
        b->peak = b->cur;
    b->live++;
    return p + 2;
}

static void b_free(void *ud, void *q)
{
    balloc *b = (balloc *)ud;
    size_t *p;
    if (!q)
        return;
    p = (size_t *)q - 2;
    b->cur -= (long long)p[0];
    b->live--;
    free(p);
}

/* value 0 an input; a fork op, `paths` chains of 3 ops with mixed sizes, a join: hard for the DP */
static void fork_join(fg *g, int paths)
{
    static const int64_t sz[] = {1, 2, 3, 5, 8, 13};
    int32_t ends[FG_MAX], p, s, prev, zero = 0, fork, join;
    fg_init(g);
    fg_value(g, 0, 1);
    fork = fg_op(g, &zero, 1, 8, 0);
    for (p = 0; p < paths; p++) {
        prev = fork;
        for (s = 0; s < 3; s++) {
            prev = fg_op(g, &prev, 1, 64 * sz[(p * 7 + s * 3 + p / 5) % 6], 0);
        }
        ends[p] = prev;
    }
    join = fg_op(g, ends, paths, 4, 0); /* before indexing: the op may move is_output */
    g->b.is_output[join] = 1;
}

static int valid_order(const mf_graph_desc *d, const int32_t *order)
{
    mf_ctx ctx;
    int valid = 0;
    mf_ctx_init(&ctx, NULL);
    return mf_check_order(&ctx, d, order, &valid) == MF_OK && valid;
}

static void test_byte_sums(void)
{
    fg g;
    mf_graph_desc d;
    mf_ctx ctx;
    mf_plan_result res;
    int32_t z = 0, ins[2], order[3] = {0, 1, 2};
    int64_t pk = -1, steps[3];
    int st;
    /* issue 10: [0, 2**62, 2**62, 4]; the true peak 2**63 does not fit */
    fg_init(&g);
    fg_value(&g, INT64_MAX, 1); /* a graph input: never counted */
    fg_op(&g, &z, 1, (int64_t)1 << 62, 0);
    fg_op(&g, &z, 1, (int64_t)1 << 62, 0);
    ins[0] = 1;
    ins[1] = 2;
    fg_op(&g, ins, 2, 4, 0);
    g.b.is_output[3] = 1;
    d = fg_desc(&g, 0);
    mf_ctx_init(&ctx, NULL);
    st = mf_plan(&ctx, &d, NULL, &res);
    HCHECK(st == MF_EINVAL && strstr(ctx.err, "value_bytes") && strstr(ctx.err, "at value 1"), "plan: %d %s", st,
           ctx.err);
    HCHECK(res.order == NULL, "no result on error");
    st = mf_simulate(&ctx, &d, order, NULL, 0, &pk, steps, NULL);
    HCHECK(st == MF_EINVAL && strstr(ctx.err, "value_bytes"), "simulate: %d %s", st, ctx.err);
    /* exactly at the limit: accepted, and every figure exact */
    g.b.value_bytes[1] = MF_MAX_TOTAL_BYTES / 2;
    g.b.value_bytes[2] = MF_MAX_TOTAL_BYTES - MF_MAX_TOTAL_BYTES / 2 - 4;
    st = mf_plan(&ctx, &d, NULL, &res);
    HCHECK(st == MF_OK && res.peak_bytes == MF_MAX_TOTAL_BYTES && res.unfused_peak_bytes == MF_MAX_TOTAL_BYTES,
           "at the limit: %d %s peak %lld", st, ctx.err, (long long)res.peak_bytes);
    mf_plan_result_free(&ctx, &res);
    st = mf_simulate(&ctx, &d, order, NULL, 0, &pk, steps, NULL);
    HCHECK(st == MF_OK && pk == MF_MAX_TOTAL_BYTES && steps[0] >= 0 && steps[1] >= 0 && steps[2] >= 0,
           "simulate at the limit: %d %lld", st, (long long)pk);
    g.b.value_bytes[3] = 5; /* one byte more */
    HCHECK(mf_graph_check(&ctx, &d) == MF_EINVAL && strstr(ctx.err, "at value 3"), "one past: %s", ctx.err);
    fg_free(&g);
}

typedef struct cancel_after {
    long polls, stop_at;
} cancel_after;

static int cancel_cb(void *ud)
{
    cancel_after *c = (cancel_after *)ud;
    return ++c->polls >= c->stop_at;
}

static void test_cancel(void)
{
    fg g;
    mf_graph_desc d;
    mf_ctx ctx;
    mf_plan_options opt;
    mf_plan_result res;
    mf_allocator al;
    balloc b = {0, 0, 0};
    cancel_after c;
    long stops[] = {1, 2, 50};
    int i, st;
    fork_join(&g, 40);
    d = fg_desc(&g, 0);
    al.alloc = b_alloc;
    al.free = b_free;
    al.ud = &b;
    memset(&opt, 0, sizeof opt);
    opt.max_states = (int64_t)1 << 62;
    opt.fuse = 1;
    for (i = 0; i < 3; i++) {
        mf_ctx_init(&ctx, &al);
        c.polls = 0;
        c.stop_at = stops[i];
        ctx.cancel = cancel_cb;
        ctx.cancel_ud = &c;
        st = mf_plan(&ctx, &d, &opt, &res);
        HCHECK(st == MF_ECANCEL && !strcmp(ctx.err, "cancelled") && res.order == NULL && c.polls == stops[i],
               "cancel at poll %ld: %d %s (%ld polls)", stops[i], st, ctx.err, c.polls);
        HCHECK(b.live == 0 && b.cur == 0, "cancel at poll %ld leaked %ld blocks", stops[i], b.live);
    }
    /* a callback that never stops changes nothing */
    mf_ctx_init(&ctx, NULL);
    c.polls = 0;
    c.stop_at = 1L << 62;
    ctx.cancel = cancel_cb;
    ctx.cancel_ud = &c;
    opt.max_states = 0;
    st = mf_plan(&ctx, &d, &opt, &res);
    HCHECK(st == MF_OK && c.polls > 0 && valid_order(&d, res.order), "uncancelled: %d %s", st, ctx.err);
    mf_plan_result_free(&ctx, &res);
    fg_free(&g);
}

static void test_dp_budget(void)
{
    fg g;
    mf_graph_desc d;
    mf_ctx ctx;
    mf_plan_options opt;
    mf_plan_result res;
    mf_allocator al;
    balloc b = {0, 0, 0};
    long long base_peak;
    int st;
    fork_join(&g, 66); /* 200 ops */
    d = fg_desc(&g, 0);
    al.alloc = b_alloc;
    al.free = b_free;
    al.ud = &b;
    memset(&opt, 0, sizeof opt);
    opt.fuse = 1;
    /* what a plan needs besides the DP's tables: one with a tiny cap */
    opt.max_states = 1;
    mf_ctx_init(&ctx, &al);
    st = mf_plan(&ctx, &d, &opt, &res);
    HCHECK(st == MF_OK, "cap 1: %s", ctx.err);
    mf_plan_result_free(&ctx, &res);
    base_peak = b.peak;
    /* max_states of 2**62 with a 1 MiB budget: stops, not proven, valid */
    b.peak = 0;
    opt.max_states = (int64_t)1 << 62;
    opt.max_dp_bytes = 1 << 20;
    st = mf_plan(&ctx, &d, &opt, &res);
    HCHECK(st == MF_OK && !res.optimal && res.states > 0 && valid_order(&d, res.order) &&
               res.unfused_peak_bytes <= res.baseline_peak_bytes,
           "budget: %d %s optimal %d states %lld", st, ctx.err, res.optimal, (long long)res.states);
    printf("DP budget 1 MiB: peak allocation %lld bytes, a plan capped at 1 state %lld\n", b.peak, base_peak);
    /* the tables stay within the budget; the doubling array's old copy and the
     * per-piece scratch come on top (mf_dp.c NOTE [DP memory budget]) */
    HCHECK(b.peak <= base_peak + 2 * (1 << 20), "budget: peak allocation %lld (plan alone %lld)", b.peak,
           base_peak);
    mf_plan_result_free(&ctx, &res);
    HCHECK(b.live == 0, "budget: leaked %ld blocks", b.live);
    fg_free(&g);
}

static void test_orders(void)
{
    /* ops listed against the dataflow: op 0 reads what op 2 makes */
    int32_t in_ptr[] = {0, 1, 2, 3, 4}, in_idx[] = {3, 1, 0, 0}, out_ptr[] = {0, 1, 2, 3, 4},
            out_idx[] = {1, 2, 3, 4};
    int64_t bytes[] = {4, 100, 8, 50, 1000};
    uint8_t is_in[] = {1, 0, 0, 0, 0}, is_out[] = {0, 0, 1, 0, 1};
    int32_t listed[] = {0, 1, 2, 3}, base[] = {2, 0, 1, 3}, gp_empty[] = {0, 2, 2, 4};
    mf_graph_desc d;
    mf_ctx ctx;
    mf_plan_result res;
    int64_t pk = 0, base_pk = 0;
    int st;
    memset(&d, 0, sizeof d);
    d.n_ops = 4;
    d.n_values = 5;
    d.in_ptr = in_ptr;
    d.in_idx = in_idx;
    d.out_ptr = out_ptr;
    d.out_idx = out_idx;
    d.value_bytes = bytes;
    d.is_input = is_in;
    d.is_output = is_out;
    mf_ctx_init(&ctx, NULL);
    st = mf_simulate(&ctx, &d, listed, NULL, 0, &pk, NULL, NULL);
    HCHECK(st == MF_EINVAL && strstr(ctx.err, "order breaks a dependency: op 0 (position 0) runs before op 2"),
           "invalid order: %s", ctx.err);
    st = mf_simulate(&ctx, &d, base, gp_empty, 3, &pk, NULL, NULL);
    HCHECK(st == MF_EINVAL && strstr(ctx.err, "group 1 is empty"), "empty group: %s", ctx.err);
    HCHECK(mf_simulate(&ctx, &d, base, NULL, 0, &base_pk, NULL, NULL) == MF_OK, "baseline order: %s", ctx.err);
    st = mf_plan(&ctx, &d, NULL, &res);
    HCHECK(st == MF_OK && res.baseline_peak_bytes == base_pk && res.lower_bound_bytes <= res.unfused_peak_bytes &&
               res.unfused_peak_bytes <= res.baseline_peak_bytes,
           "baseline %lld, expected %lld", (long long)res.baseline_peak_bytes, (long long)base_pk);
    mf_plan_result_free(&ctx, &res);
}

int test_harden(int *checks)
{
    test_byte_sums();
    test_cancel();
    test_dp_budget();
    test_orders();
    printf("hardening: byte sums, cancel, DP memory budget, order validation (%d checks, %d failures)\n", h_checks,
           h_fail);
    *checks += h_checks;
    return h_fail;
}
