/*
 * test_kinds.c -- the kinds mf_plan gives its groups (csrc/core/mf_core.h
 * NOTE [group kinds]), run from test_core.c's main.
 *
 * mf_test_kinds_ok checks a plan's kinds against the rule written again here
 * from the desc alone (test_core.c calls it on every random graph it plans);
 * mf_test_kinds plans small graphs whose kinds are known: an epilogue pair, a
 * two-op run that looks like a pair but whose head's result is read later (a
 * region), a longer run, and no fusion at all.
 */
#define _POSIX_C_SOURCE 200809L
#include "mf_core.h"

#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mf_test_kinds(int *checks);
int mf_test_kinds_ok(const mf_graph_desc *d, const mf_plan_result *r);

static int k_failures, k_checks;

#define KCHECK(cond, ...) MF_TEST_CHECK(k_checks, k_failures, cond, __VA_ARGS__)

static int32_t root_of(const mf_graph_desc *d, int32_t v)
{
    while (d->alias_of && d->alias_of[v] >= 0)
        v = d->alias_of[v];
    return v;
}

/* Does op k read a value whose storage is x's? */
static int reads_storage(const mf_graph_desc *d, int32_t k, int32_t x)
{
    int32_t j;
    for (j = d->in_ptr[k]; j < d->in_ptr[k + 1]; j++)
        if (root_of(d, d->in_idx[j]) == x)
            return 1;
    return 0;
}

/* [u, v] is an epilogue pair: v names u, and every storage u allocates is
 * read by u and v alone and backs no graph output.  A collective is never
 * part of one, nor an extern call (MF_FUSIBLE_STORED) its epilogue. */
static int is_pair(const mf_graph_desc *d, int32_t u, int32_t v)
{
    int32_t j, k, y;
    if (!d->epilogue_of || d->epilogue_of[v] != u)
        return 0;
    if (d->fusible && d->fusible[v] == MF_FUSIBLE_STORED)
        return 0;
    if (d->comm && (d->comm[u] || d->comm[v]))
        return 0;
    for (j = d->out_ptr[u]; j < d->out_ptr[u + 1]; j++) {
        int32_t x = d->out_idx[j];
        if (root_of(d, x) != x)
            continue; /* a view: not u's allocation */
        for (y = 0; y < d->n_values; y++)
            if (root_of(d, y) == x && d->is_output && d->is_output[y])
                return 0;
        for (k = 0; k < d->n_ops; k++)
            if (k != u && k != v && reads_storage(d, k, x))
                return 0;
    }
    return 1;
}

int mf_test_kinds_ok(const mf_graph_desc *d, const mf_plan_result *r)
{
    int32_t i;
    if (r->n_groups > 0 && !r->group_kind)
        return 0;
    for (i = 0; i < r->n_groups; i++) {
        int32_t lo = r->group_ptr[i], len = r->group_ptr[i + 1] - lo;
        int want = len == 1                                         ? MF_GROUP_SINGLE
                   : len == 2 && is_pair(d, r->order[lo], r->order[lo + 1]) ? MF_GROUP_EPILOGUE
                                                                    : MF_GROUP_REGION;
        if (r->group_kind[i] != want) {
            fprintf(stderr, "group %d (%d ops from op %d): kind %d, expected %d\n", (int)i, (int)len,
                    (int)r->order[lo], (int)r->group_kind[i], want);
            return 0;
        }
    }
    return 1;
}

/* A chain x -> op0 -> a -> op1 -> b -> op2 -> c, where op2 also reads a when
 * a_late; c is the graph output. */
typedef struct chain {
    int32_t in_ptr[4], in_idx[5], out_ptr[4], out_idx[3];
    int64_t bytes[4];
    uint8_t is_input[4], is_output[4], fusible[3];
    int32_t epi[3];
} chain;

static mf_graph_desc chain_desc(chain *c, int a_late, const uint8_t fusible[3], int pair)
{
    mf_graph_desc d;
    int32_t in_ptr[4] = {0, 1, 2, 3}, in_late[4] = {0, 1, 2, 4};
    int32_t in_idx[5] = {0, 1, 2, 1, 0}, out_ptr[4] = {0, 1, 2, 3}, out_idx[3] = {1, 2, 3};
    int64_t bytes[4] = {100, 400, 100, 100};
    memset(c, 0, sizeof *c);
    memcpy(c->in_ptr, a_late ? in_late : in_ptr, sizeof c->in_ptr);
    memcpy(c->in_idx, in_idx, sizeof in_idx);
    memcpy(c->out_ptr, out_ptr, sizeof out_ptr);
    memcpy(c->out_idx, out_idx, sizeof out_idx);
    memcpy(c->bytes, bytes, sizeof bytes);
    memcpy(c->fusible, fusible, 3);
    c->is_input[0] = 1;
    c->is_output[3] = 1;
    c->epi[0] = c->epi[2] = -1;
    c->epi[1] = pair ? 0 : -1;
    memset(&d, 0, sizeof d);
    d.n_ops = 3;
    d.n_values = 4;
    d.in_ptr = c->in_ptr;
    d.in_idx = c->in_idx;
    d.out_ptr = c->out_ptr;
    d.out_idx = c->out_idx;
    d.value_bytes = c->bytes;
    d.is_input = c->is_input;
    d.is_output = c->is_output;
    d.fusible = c->fusible;
    d.epilogue_of = c->epi;
    return d;
}

/* Plans d and compares the kinds with want[0..n) (n groups). */
static void expect_kinds(const mf_graph_desc *d, const mf_plan_options *opt, const uint8_t *want, int32_t n,
                         const char *what)
{
    mf_ctx ctx;
    mf_plan_result r;
    int st;
    int32_t i;
    mf_ctx_init(&ctx, NULL);
    st = mf_plan(&ctx, d, opt, &r);
    KCHECK(st == MF_OK, "%s: %s", what, ctx.err);
    if (st == MF_OK) {
        KCHECK(r.n_groups == n, "%s: %d groups, expected %d", what, (int)r.n_groups, (int)n);
        for (i = 0; i < n && i < r.n_groups; i++)
            KCHECK(r.group_kind[i] == want[i], "%s: group %d has kind %d, expected %d", what, (int)i,
                   (int)r.group_kind[i], (int)want[i]);
        KCHECK(mf_test_kinds_ok(d, &r), "%s: kinds break the rule", what);
    }
    mf_plan_result_free(&ctx, &r);
}

int mf_test_kinds(int *checks)
{
    chain c;
    mf_graph_desc d;
    mf_plan_options unfused;
    const uint8_t none[3] = {0, 0, 0}, all[3] = {1, 1, 1}, head2[3] = {1, 1, 0};
    const uint8_t pair_single[2] = {MF_GROUP_EPILOGUE, MF_GROUP_SINGLE};
    const uint8_t region_single[2] = {MF_GROUP_REGION, MF_GROUP_SINGLE};
    const uint8_t singles[3] = {MF_GROUP_SINGLE, MF_GROUP_SINGLE, MF_GROUP_SINGLE};
    const uint8_t one_region[1] = {MF_GROUP_REGION};
    memset(&unfused, 0, sizeof unfused);

    /* a GEMM (not fusible) and its ReLU: the pair saves a, the GEMM's result */
    d = chain_desc(&c, 0, none, 1);
    expect_kinds(&d, NULL, pair_single, 2, "gemm + relu");
    expect_kinds(&d, &unfused, singles, 3, "gemm + relu, fuse off");
    /* the same with both fusible: still the pair's rule, so an epilogue pair */
    d = chain_desc(&c, 0, head2, 1);
    expect_kinds(&d, NULL, pair_single, 2, "fusible gemm + relu");
    /* op2 reads a too: [op0, op1] is no pair but, both fusible, a region
     * (the same peak with fewer groups) */
    d = chain_desc(&c, 1, head2, 1);
    expect_kinds(&d, NULL, region_single, 2, "a read later");
    /* ... and, op0 not fusible, no group at all */
    d = chain_desc(&c, 1, none, 1);
    expect_kinds(&d, NULL, singles, 3, "a read later, gemm not fusible");
    /* three fusible ops, no epilogue named: one region */
    d = chain_desc(&c, 0, all, 0);
    expect_kinds(&d, NULL, one_region, 1, "three fusible");
    /* a pair named, but the chain fuses whole: a region of three */
    d = chain_desc(&c, 0, all, 1);
    expect_kinds(&d, NULL, one_region, 1, "three fusible, a pair named");

    printf("group kinds: pairs, regions, singles (%d checks, %d failures)\n", k_checks, k_failures);
    *checks += k_checks;
    return k_failures;
}
