/*
 * test_comm.c -- tests of the collective-aware placement (csrc/core/mf_comm.c
 * NOTE [collective overlap]), run from test_core.c's main.
 *
 * Graphs shaped like a data-parallel backward (a chain of gradient ops, each
 * gradient reduced by an asynchronous collective and waited on at the end),
 * a case where issuing early would raise the peak, random graphs with random
 * collectives checked for the rules' invariants, bad input, and allocation
 * failures.
 */
#define _POSIX_C_SOURCE 200809L
#include "mf_core.h"
#include "fixed_graph.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mf_test_comm(int *checks);

static int c_failures, c_checks;

#define CCHECK(cond, ...) MF_TEST_CHECK(c_checks, c_failures, cond, __VA_ARGS__)

static int pos_of(const mf_plan_result *r, int32_t op)
{
    int i;
    for (i = 0; i < r->n_ops; i++)
        if (r->order[i] == op)
            return i;
    return -1;
}

static int plan_with(const mf_graph_desc *d, int overlap, int fuse, mf_plan_result *r)
{
    mf_ctx ctx;
    mf_plan_options opt;
    int st;
    memset(&opt, 0, sizeof opt);
    opt.fuse = fuse;
    opt.no_comm_overlap = !overlap;
    mf_ctx_init(&ctx, NULL);
    st = mf_plan(&ctx, d, &opt, r);
    if (st)
        fprintf(stderr, "mf_plan: %s\n", ctx.err);
    return st;
}

/* The invariants of NOTE [collective overlap] for d, planned with and
 * without overlap: a valid order, collectives in input order and never later
 * than without overlap, peaks within the bound. */
static void check_invariants(const mf_graph_desc *d, const char *what, int seed)
{
    mf_plan_result with, without;
    mf_ctx ctx;
    int valid = 0, k, last = -1;
    memset(&with, 0, sizeof with);
    memset(&without, 0, sizeof without);
    mf_ctx_init(&ctx, NULL);
    if (plan_with(d, 1, 1, &with) || plan_with(d, 0, 1, &without)) {
        CCHECK(0, "%s %d: plan failed", what, seed);
        goto done;
    }
    CCHECK(mf_check_order(&ctx, d, with.order, &valid) == MF_OK && valid, "%s %d: invalid order", what, seed);
    CCHECK(with.peak_bytes <= without.peak_bytes, "%s %d: peak %lld above the plan without overlap %lld", what,
           seed, (long long)with.peak_bytes, (long long)without.peak_bytes);
    CCHECK(with.unfused_peak_bytes <= without.unfused_peak_bytes, "%s %d: unfused peak rose", what, seed);
    CCHECK(with.peak_bytes <= with.unfused_peak_bytes, "%s %d: fused above unfused", what, seed);
    CCHECK(without.comm_moves == 0, "%s %d: moves without overlap", what, seed);
    {
        int64_t sim = 0;
        CCHECK(mf_simulate(&ctx, d, with.order, with.group_ptr, with.n_groups, &sim, NULL, NULL) == MF_OK &&
                   sim == with.peak_bytes,
               "%s %d: reported peak %lld, simulated %lld", what, seed, (long long)with.peak_bytes, (long long)sim);
    }
    for (k = 0; k < d->n_ops; k++) {
        int p;
        if (d->comm[k] != MF_COMM_ISSUE)
            continue;
        p = pos_of(&with, k);
        CCHECK(p > last, "%s %d: collective %d issued out of input order", what, seed, k);
        last = p;
        CCHECK(p <= pos_of(&without, k), "%s %d: collective %d issued later (%d) than without overlap (%d)", what,
               seed, k, p, pos_of(&without, k));
    }
done:
    mf_plan_result_free(&ctx, &with);
    mf_plan_result_free(&ctx, &without);
}

/* A data-parallel backward: L layers; layer i's activation gradient g_i
 * (from g_{i-1}) and weight gradient w_i (from g_i), all_reduce(w_i) -> a
 * future, wait -> the synced gradient (an alias of the future, a graph
 * output).  The input order computes every gradient first and issues all
 * collectives at the end (as Thunder's DDP trace does). */
static void build_ddp(fg *g, int L, int64_t act, int64_t wgt)
{
    int32_t x, gi[16], wi[16], fi[16], i;
    fg_init(g);
    x = fg_value(g, act, 1);
    for (i = 0; i < L; i++) {
        int32_t prev = i ? gi[i - 1] : x;
        gi[i] = fg_op(g, &prev, 1, act, MF_COMM_NONE);
        wi[i] = fg_op(g, &gi[i], 1, wgt, MF_COMM_NONE);
    }
    for (i = 0; i < L; i++)
        fi[i] = fg_op(g, &wi[i], 1, wgt, MF_COMM_ISSUE);
    for (i = 0; i < L; i++) {
        int32_t w = fg_op(g, &fi[i], 1, wgt, MF_COMM_WAIT);
        g->b.alias_of[w] = fi[i];
        g->b.is_output[w] = 1;
    }
    g->b.is_output[gi[L - 1]] = 1;
}

static void test_ddp_shape(void)
{
    fg g;
    mf_plan_result r;
    mf_graph_desc d;
    int L = 6, i;
    build_ddp(&g, L, 100, 10);
    d = fg_desc(&g, 1);
    memset(&r, 0, sizeof r);
    if (plan_with(&d, 1, 0, &r)) {
        CCHECK(0, "ddp plan failed");
        fg_free(&g);
        return;
    }
    /* each all_reduce right after its weight gradient; each wait at the end */
    for (i = 0; i < L; i++) {
        int issue = 2 * L + i, wait = 3 * L + i, wgrad = 2 * i + 1;
        CCHECK(pos_of(&r, issue) == pos_of(&r, wgrad) + 1, "collective %d at %d, its input at %d", issue,
               pos_of(&r, issue), pos_of(&r, wgrad));
        CCHECK(pos_of(&r, wait) == 3 * L + i, "wait %d at %d", wait, pos_of(&r, wait));
    }
    CCHECK(r.comm_moves > 0, "no comm moves");
    {
        mf_ctx ctx;
        mf_ctx_init(&ctx, NULL);
        mf_plan_result_free(&ctx, &r);
    }
    check_invariants(&d, "ddp", 0);
    fg_free(&g);
}

/* Issuing early would keep a big result buffer alive across the peak: the
 * collective must wait until the peak has passed. */
static void test_bound(void)
{
    fg g;
    mf_plan_result with, without;
    mf_graph_desc d;
    mf_ctx ctx;
    int32_t x, a, big, s, f, w;
    fg_init(&g);
    x = fg_value(&g, 1, 1);
    a = fg_op(&g, &x, 1, 1, MF_COMM_NONE);         /* op 0: the collective's input */
    big = fg_op(&g, &x, 1, 100, MF_COMM_NONE);     /* op 1: the peak */
    s = fg_op(&g, &big, 1, 1, MF_COMM_NONE);       /* op 2: frees big */
    f = fg_op(&g, &a, 1, 50, MF_COMM_ISSUE);       /* op 3: a 50-byte result */
    w = fg_op(&g, &f, 1, 50, MF_COMM_WAIT);        /* op 4 */
    g.b.alias_of[w] = f;
    g.b.is_output[w] = g.b.is_output[s] = 1;
    d = fg_desc(&g, 1);
    memset(&with, 0, sizeof with);
    memset(&without, 0, sizeof without);
    mf_ctx_init(&ctx, NULL);
    if (plan_with(&d, 1, 0, &with) || plan_with(&d, 0, 0, &without)) {
        CCHECK(0, "bound plan failed");
        fg_free(&g);
        return;
    }
    CCHECK(with.peak_bytes == without.peak_bytes, "peak %lld, without overlap %lld", (long long)with.peak_bytes,
           (long long)without.peak_bytes);
    CCHECK(pos_of(&with, 3) > pos_of(&with, 2), "collective issued before the peak passed (at %d, peak op at %d)",
           pos_of(&with, 3), pos_of(&with, 2));
    mf_plan_result_free(&ctx, &with);
    mf_plan_result_free(&ctx, &without);
    check_invariants(&d, "bound", 0);
    fg_free(&g);
}

/* Random graphs: random ops, some of whose results are reduced by a
 * collective (optionally waited on and read again). */
static uint64_t c_rng = 0x9E3779B97F4A7C15ULL;
static int c_rint(int n)
{
    c_rng ^= c_rng << 13;
    c_rng ^= c_rng >> 7;
    c_rng ^= c_rng << 17;
    return (int)(c_rng % (uint64_t)n);
}

static void test_random(void)
{
    int t;
    for (t = 0; t < 300; t++) {
        fg g;
        mf_graph_desc d;
        int32_t vals[FG_MAX], nv = 0, n = 6 + c_rint(24), i;
        fg_init(&g);
        vals[nv++] = fg_value(&g, 1 + c_rint(50), 1);
        for (i = 0; i < n && g.b.n_ops < FG_MAX - 4; i++) {
            int32_t ins[2];
            int nin = 1 + c_rint(2), j;
            for (j = 0; j < nin; j++)
                ins[j] = vals[c_rint(nv)];
            if (c_rint(4) == 0) {
                int32_t f = fg_op(&g, ins, 1, 1 + c_rint(60), MF_COMM_ISSUE), w;
                if (c_rint(3)) {
                    w = fg_op(&g, &f, 1, g.b.value_bytes[f], MF_COMM_WAIT);
                    g.b.alias_of[w] = f;
                    vals[nv++] = w;
                } else {
                    g.b.is_output[f] = 1;
                }
            } else {
                vals[nv++] = fg_op(&g, ins, nin, 1 + c_rint(100), MF_COMM_NONE);
            }
        }
        g.b.is_output[vals[nv - 1]] = 1;
        d = fg_desc(&g, 1);
        check_invariants(&d, "random", t);
        fg_free(&g);
    }
}

static void test_errors(void)
{
    fg g;
    mf_graph_desc d;
    mf_ctx ctx;
    int32_t x;
    build_ddp(&g, 2, 10, 10);
    g.comm[0] = 3;
    d = fg_desc(&g, 1);
    mf_ctx_init(&ctx, NULL);
    CCHECK(mf_graph_check(&ctx, &d) == MF_EINVAL && strstr(ctx.err, "comm kind"), "bad comm kind: %s", ctx.err);
    fg_free(&g);
    /* collectives keep their input order: one that reads (through a wait)
     * the result of a collective later in the input order is a cycle */
    fg_init(&g);
    x = fg_value(&g, 4, 1);
    {
        int32_t fb = 3, w, fa_;
        w = fg_op(&g, &fb, 1, 4, MF_COMM_WAIT);   /* op 0 (value 1) waits on op 2 */
        fa_ = fg_op(&g, &w, 1, 4, MF_COMM_ISSUE); /* op 1 (value 2) */
        fg_op(&g, &x, 1, 4, MF_COMM_ISSUE);       /* op 2 (value 3) */
        g.b.alias_of[w] = fb;
        g.b.is_output[fa_] = 1;
    }
    d = fg_desc(&g, 1);
    CCHECK(mf_graph_check(&ctx, &d) == MF_ECYCLE, "collectives out of data order: status %s", ctx.err);
    d = fg_desc(&g, 0);
    CCHECK(mf_graph_check(&ctx, &d) == MF_OK, "the same graph without collectives: %s", ctx.err);
    fg_free(&g);
}

/* Every allocation of a plan with collectives fails once: MF_ENOMEM, nothing leaked. */

static void test_alloc_failures(void)
{
    fg g;
    mf_graph_desc d;
    long total, k;
    build_ddp(&g, 4, 100, 10);
    d = fg_desc(&g, 1);
    {
        mf_talloc f = {0, 0, 0};
        mf_allocator al = {mf_talloc_alloc, mf_talloc_free, &f};
        mf_ctx ctx;
        mf_plan_result r;
        mf_ctx_init(&ctx, &al);
        CCHECK(mf_plan(&ctx, &d, NULL, &r) == MF_OK && r.comm_moves > 0, "plan: %s", ctx.err);
        mf_plan_result_free(&ctx, &r);
        total = f.count;
        CCHECK(f.live == 0, "leak: %ld blocks", f.live);
    }
    for (k = 1; k <= total; k++) {
        mf_talloc f = {0, k, 0};
        mf_allocator al = {mf_talloc_alloc, mf_talloc_free, &f};
        mf_ctx ctx;
        mf_plan_result r;
        int st;
        mf_ctx_init(&ctx, &al);
        st = mf_plan(&ctx, &d, NULL, &r);
        CCHECK(st == MF_ENOMEM, "failing allocation %ld: status %d", k, st);
        mf_plan_result_free(&ctx, &r);
        CCHECK(f.live == 0, "failing allocation %ld: %ld blocks leaked", k, f.live);
    }
    printf("allocation failure injection (plan with collectives): %ld allocations, each failed once\n", total);
    fg_free(&g);
}

int mf_test_comm(int *checks)
{
    test_ddp_shape();
    test_bound();
    test_random();
    test_errors();
    test_alloc_failures();
    *checks += c_checks;
    return c_failures;
}
