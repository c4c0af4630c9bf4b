/*
 * test_pipeline.c -- tests of the planning pipeline (csrc/core/mf_pipeline.c NOTE [planning
 * pipeline], NOTE [work budget]) and of the max flow (csrc/core/mf_flow.c NOTE [min cut]), run
 * from test_core.c's main.  Random graphs with fusible and cheap ops go through mf_plan_pipeline:
 * the plan is a valid order of its graph whose simulated peak (with its groups) is the reported
 * one, never above the first plan; the kept steps chain and add up to the copies; a work budget of
 * one unit stops after the first plan; a peak target (NOTE [peak target]) gives the plan that
 * fits with no more copies than the lowest plan, never a higher plan for a lower target, and the
 * lowest plan where nothing fits.  The max flow's cut on a small graph is the known one, an
 * infinite path is an error.  Allocation failures leave nothing behind.
 */
#include "mf_build.h"
#include "mf_internal.h"
#include "test_util.h"

#include <stdio.h>
#include <string.h>

int mf_test_pipeline(int *checks);

static int p_failures, p_checks;

#define PCHECK(cond, ...) MF_TEST_CHECK(p_checks, p_failures, cond, __VA_ARGS__)

static uint64_t p_state = 0x2545F4914F6CDD1DULL;

static int p_int(int n) /* [0, n) */
{
    return mf_test_rand(&p_state, n);
}

/* A random DAG of n ops (n < 200): op k reads 1-3 recent values and makes one; ops fusible at
 * 80%, cheap at 70%; the values nothing reads are outputs. */
static void random_graph(mf_gbuf *b, uint8_t *cheap, int n)
{
    static const int64_t sizes[] = {1, 4, 8, 16, 32};
    uint8_t read[256];
    int k, v;
    mf_gbuf_init(b, NULL);
    memset(read, 0, sizeof read);
    mf_gbuf_add_value(b, 8, 1);
    for (k = 0; k < n; k++) {
        int nin = 1 + p_int(3), i;
        cheap[k] = (uint8_t)(p_int(10) < 7);
        mf_gbuf_begin_op(b, p_int(10) < 8);
        for (i = 0; i < nin; i++) {
            int32_t nv = b->n_values, u = nv - 1 - p_int(nv < 12 ? nv : 12);
            mf_gbuf_op_in(b, u);
            read[u] = 1;
        }
        mf_gbuf_op_out(b, mf_gbuf_add_value(b, sizes[p_int(5)], 0));
        mf_gbuf_end_op(b);
    }
    for (v = 1; v < b->n_values; v++)
        b->is_output[v] = !read[v];
}

static void check_result(const mf_graph_desc *g, const uint8_t *cheap, const mf_pipeline_result *r, int seed)
{
    mf_ctx ctx;
    mf_graph_desc d = *g;
    int64_t peak = -1;
    int valid = 0, i;
    int32_t splits = 0;
    mf_ctx_init(&ctx, NULL);
    if (r->has_copies)
        mf_remat_result_desc(&r->copies, &d);
    PCHECK(mf_check_order(&ctx, &d, r->plan.order, &valid) == MF_OK && valid, "seed %d: invalid order", seed);
    PCHECK(mf_simulate(&ctx, &d, r->plan.order, r->plan.group_ptr, r->plan.n_groups, &peak, NULL, NULL) == MF_OK &&
               peak == r->plan.peak_bytes,
           "seed %d: simulated %lld, planned %lld", seed, (long long)peak, (long long)r->plan.peak_bytes);
    PCHECK(r->plan.peak_bytes <= r->first_peak_bytes, "seed %d: above the first plan", seed);
    PCHECK(r->work > 0 && r->n_plans >= 1 && r->start != NULL, "seed %d: no account", seed);
    for (i = 0; i < r->n_steps; i++) {
        splits += r->steps[i].splits;
        PCHECK(r->steps[i].peak_after < r->steps[i].peak_before, "seed %d: step %d kept without a gain", seed, i);
        if (i)
            PCHECK(r->steps[i].peak_before == r->steps[i - 1].peak_after, "seed %d: steps do not chain", seed);
    }
    if (!r->has_copies)
        return;
    PCHECK(splits == r->copies.n_splits, "seed %d: steps made %d copies, the result %d", seed, (int)splits,
           (int)r->copies.n_splits);
    for (i = 0; i < r->copies.n_ops; i++) {
        int32_t o = r->copies.origin[i], j, twice = 0;
        PCHECK(o >= 0 && o < g->n_ops, "seed %d: origin out of range", seed);
        for (j = 0; j < r->copies.n_ops; j++)
            twice += j != i && r->copies.origin[j] == o;
        PCHECK(!twice || cheap[o], "seed %d: op %d copied but not cheap", seed, (int)o);
    }
}

static int call_pipeline(mf_ctx *ctx, const mf_graph_desc *d, const mf_pipeline_options *o, mf_pipeline_result *r)
{
    int st = mf_plan_pipeline(ctx, d, o, r);
    if (st != MF_OK)
        PCHECK(r->plan.order == NULL && !r->has_copies, "a failed pipeline left a result");
    return st;
}

#define INJECT_ALL 1000L
#define INJECT_RUNS 3000L

static void inject_pipeline(const mf_graph_desc *d, const mf_pipeline_options *o)
{
    mf_talloc ta;
    mf_allocator al = {mf_talloc_alloc, mf_talloc_free, NULL};
    mf_ctx ctx;
    mf_pipeline_result r;
    long total, N, step, runs = 0;
    al.ud = &ta;
    memset(&ta, 0, sizeof ta);
    mf_ctx_init(&ctx, &al);
    PCHECK(call_pipeline(&ctx, d, o, &r) == MF_OK && r.has_copies, "pipeline: the clean run made no copies");
    mf_pipeline_result_free(&ctx, &r);
    PCHECK(ta.live == 0, "pipeline: clean run leaked %ld blocks", ta.live);
    total = ta.count;
    /* a run per failed allocation: every one of the first INJECT_ALL, then a stride that keeps the
     * runs near INJECT_RUNS in all (the pipeline repeats its passes, so the later allocations come
     * from sites the first ones already reached), and the last */
    step = total > INJECT_RUNS ? (total - INJECT_ALL) / (INJECT_RUNS - INJECT_ALL) + 1 : 1;
    for (N = 1; N <= total; N = N < INJECT_ALL || N == total ? N + 1 : (N + step < total ? N + step : total)) {
        int st;
        runs++;
        memset(&ta, 0, sizeof ta);
        ta.fail_at = N;
        st = call_pipeline(&ctx, d, o, &r);
        mf_pipeline_result_free(&ctx, &r);
        PCHECK(st == MF_ENOMEM, "pipeline: failing allocation %ld/%ld gave %d (%s)", N, total, st, ctx.err);
        PCHECK(ta.live == 0, "pipeline: failing allocation %ld leaked %ld blocks", N, ta.live);
    }
    printf("allocation failure injection (planning pipeline): %ld of %ld allocations failed once each\n", runs,
           total);
}

/* Targets from above the first plan to below the lowest on one graph (o: its pipeline options). */
static void sweep_targets(const mf_graph_desc *d, mf_pipeline_options o, const mf_pipeline_result *lowest, int seed)
{
    int64_t hi = lowest->first_peak_bytes, lo = lowest->plan.peak_bytes, t, prev = -1;
    int i;
    for (i = 0; i <= 9; i++) {
        mf_ctx ctx;
        mf_pipeline_result r;
        int64_t copied;
        t = i == 0 ? hi + 1 : i == 9 ? lo - 1 : hi - (hi - lo) * (i - 1) / 7;
        mf_ctx_init(&ctx, NULL);
        o.peak_target = t;
        if (mf_plan_pipeline(&ctx, d, &o, &r) != MF_OK) {
            PCHECK(0, "seed %d target %lld: %s", seed, (long long)t, ctx.err);
            continue;
        }
        copied = r.has_copies ? r.copies.copied_bytes : 0;
        PCHECK(r.fits == (r.plan.peak_bytes <= t), "seed %d target %lld: fits %d, peak %lld", seed, (long long)t,
               r.fits, (long long)r.plan.peak_bytes);
        PCHECK(r.fits || r.plan.peak_bytes == lo, "seed %d target %lld: nothing fits but %lld is not the lowest %lld",
               seed, (long long)t, (long long)r.plan.peak_bytes, (long long)lo);
        PCHECK(t < hi || (!r.has_copies && r.n_plans == 1), "seed %d: the first plan fits but copies were made", seed);
        PCHECK(t < lo || copied <= (lowest->has_copies ? lowest->copies.copied_bytes : 0),
               "seed %d target %lld: more copies than the lowest plan's", seed, (long long)t);
        PCHECK(prev < 0 || r.budget_hit || r.plan.peak_bytes <= prev,
               "seed %d target %lld: peak %lld above the larger target's %lld", seed, (long long)t,
               (long long)r.plan.peak_bytes, (long long)prev);
        prev = r.plan.peak_bytes;
        mf_pipeline_result_free(&ctx, &r);
    }
}

static void test_random_pipelines(void)
{
    int seed, with_copies = 0, injected = 0;
    for (seed = 0; seed < 60; seed++) {
        mf_gbuf b;
        uint8_t cheap[256];
        mf_graph_desc d;
        mf_pipeline_options o;
        mf_pipeline_result r, cut;
        mf_ctx ctx;
        random_graph(&b, cheap, 20 + p_int(30));
        mf_gbuf_desc(&b, &d);
        mf_ctx_init(&ctx, NULL);
        memset(&o, 0, sizeof o);
        o.plan.fuse = 1;
        o.plan.max_states = 200;
        o.cheap = cheap;
        o.recompute_budget = 1 << 20;
        PCHECK(mf_plan_pipeline(&ctx, &d, &o, &r) == MF_OK, "seed %d: %s", seed, ctx.err);
        check_result(&d, cheap, &r, seed);
        with_copies += r.has_copies;
        sweep_targets(&d, o, &r, seed);
        o.max_work = 1;
        PCHECK(mf_plan_pipeline(&ctx, &d, &o, &cut) == MF_OK, "seed %d: %s", seed, ctx.err);
        PCHECK(cut.budget_hit && cut.n_plans == 1 && !cut.has_copies && cut.plan.peak_bytes == r.first_peak_bytes,
               "seed %d: one unit of work planned more than once", seed);
        mf_pipeline_result_free(&ctx, &cut);
        if (r.has_copies && !injected && d.n_ops <= 30) { /* every allocation failed once costs a run
                                                             * each: the smallest graphs keep it quick */
            o.max_work = 0;
            inject_pipeline(&d, &o);
            injected = 1;
        }
        mf_pipeline_result_free(&ctx, &r);
        mf_gbuf_free(&b);
    }
    PCHECK(with_copies >= 5, "only %d random graphs kept copies", with_copies);
    PCHECK(injected, "no small random graph kept copies to inject allocation failures into");
}

/* One op of fusible level f reading ins (n_in of them, -1 ends early) and making one value of bytes. */
static int32_t p_op(mf_gbuf *b, int f, const int32_t *ins, int n_in, int64_t bytes)
{
    int32_t v;
    int i;
    mf_gbuf_begin_op(b, f);
    for (i = 0; i < n_in; i++)
        mf_gbuf_op_in(b, ins[i]);
    v = mf_gbuf_add_value(b, bytes, 0);
    mf_gbuf_op_out(b, v);
    mf_gbuf_end_op(b);
    return v;
}

/* NOTE [searches on regions] (mf_pipeline.c) and NOTE [grouped bytes] (mf_sim.c).  A cheap c (10)
 * read by e1 and, after an unfusible m that makes 10, by e2; after e2 a fusible chain a1 -> a2 (30
 * each) -> a3.  Unfused, the peak is a1 and a2 together, where nothing eligible is live: the search
 * keeps nothing.  Fused, a1 and a2 are never stored and the peak is m's, with c live across it:
 * splitting c at e2 lowers it, which only the search on the plan's regions sees. */
static void test_search_on_regions(void)
{
    mf_gbuf b;
    mf_graph_desc d;
    mf_pipeline_options o;
    mf_pipeline_result r;
    mf_remat_result rr;
    mf_remat_options ro;
    mf_ctx ctx;
    uint8_t cheap[8] = {1, 0, 0, 0, 0, 0, 0};
    int64_t gb[16], unf = 0;
    int32_t x, c, e1, m, e2, a1, a2, a3, in[2], i, found = 0;
    mf_gbuf_init(&b, NULL);
    x = mf_gbuf_add_value(&b, 1, 1);
    c = p_op(&b, 1, &x, 1, 10);
    e1 = p_op(&b, 1, &c, 1, 1);
    m = p_op(&b, 0, &e1, 1, 10);
    in[0] = c;
    in[1] = m;
    e2 = p_op(&b, 1, in, 2, 1);
    a1 = p_op(&b, 1, &e2, 1, 30);
    a2 = p_op(&b, 1, &a1, 1, 30);
    a3 = p_op(&b, 1, &a2, 1, 1);
    b.is_output[a3] = 1;
    mf_gbuf_desc(&b, &d);
    mf_ctx_init(&ctx, NULL);
    memset(&o, 0, sizeof o);
    o.plan.fuse = 1;
    o.cheap = cheap;
    o.recompute_budget = 1 << 20;
    PCHECK(mf_plan_pipeline(&ctx, &d, &o, &r) == MF_OK, "regions: %s", ctx.err);
    check_result(&d, cheap, &r, -1);
    for (i = 0; i < r.n_steps; i++)
        found |= r.steps[i].kind == MF_STEP_REGIONS;
    PCHECK(found && r.plan.peak_bytes < r.first_peak_bytes,
           "regions: no search on the regions kept (%d steps, peak %lld, first %lld)", (int)r.n_steps,
           (long long)r.plan.peak_bytes, (long long)r.first_peak_bytes);
    mf_pipeline_result_free(&ctx, &r);
    /* the unfused search alone on the first plan's order keeps nothing */
    o.recompute_budget = 0;
    PCHECK(mf_plan_pipeline(&ctx, &d, &o, &r) == MF_OK, "regions: %s", ctx.err);
    memset(&ro, 0, sizeof ro);
    ro.budget_bytes = 1 << 20;
    PCHECK(mf_recompute(&ctx, &d, cheap, r.plan.order, &ro, &rr) == MF_OK && rr.n_splits == 0,
           "regions: the unfused search made %d copies", (int)rr.n_splits);
    mf_remat_result_free(&ctx, &rr);
    /* grouped bytes: a1 and a2 are the first plan's inner values, c is stored */
    PCHECK(mf_grouped_bytes(&ctx, &d, r.plan.order, r.plan.group_ptr, r.plan.n_groups, gb) == MF_OK, "regions: %s",
           ctx.err);
    PCHECK(gb[a1] == 0 && gb[a2] == 0 && gb[c] == 10 && gb[m] == 10 && gb[x] == 1,
           "regions: grouped bytes a1 %lld a2 %lld c %lld m %lld", (long long)gb[a1], (long long)gb[a2],
           (long long)gb[c], (long long)gb[m]);
    /* every op alone, nothing is zeroed, and the unfused peak is a1 and a2 together */
    PCHECK(mf_grouped_bytes(&ctx, &d, r.plan.order, NULL, 0, gb) == MF_OK && gb[a1] == 30 && gb[a2] == 30,
           "regions: ops alone zeroed a value");
    PCHECK(mf_simulate(&ctx, &d, r.plan.order, NULL, 0, &unf, NULL, NULL) == MF_OK && unf >= 60,
           "regions: unfused peak %lld", (long long)unf);
    mf_pipeline_result_free(&ctx, &r);
    mf_gbuf_free(&b);
}

/* mf_sim.c NOTE [grouped bytes] on random groupings of random graphs without pointwise ops (so no
 * reuse credit): the unfused peak of the grouped bytes in the grouping's order is never above the
 * fused peak, and equals it where every op is alone. */
static void test_grouped_bytes(void)
{
    int seed, grouped = 0;
    for (seed = 0; seed < 60; seed++) {
        mf_gbuf b;
        uint8_t cheap[256];
        mf_graph_desc d, dz;
        mf_ctx ctx;
        mf_plan_options po;
        mf_plan_result pr;
        int32_t gp[257];
        int64_t gb[512], fused = 0, unf = 0, alone = 0;
        int32_t ng;
        random_graph(&b, cheap, 8 + p_int(20));
        mf_gbuf_desc(&b, &d);
        mf_ctx_init(&ctx, NULL);
        memset(&po, 0, sizeof po);
        po.fuse = 0;
        PCHECK(mf_plan(&ctx, &d, &po, &pr) == MF_OK, "grouped bytes seed %d: %s", seed, ctx.err);
        /* a group boundary after about every third position */
        ng = mf_test_grouping(&d, pr.order, (uint32_t)p_int(1 << 15) * 0x12491u | 0x49249249u, gp);
        dz = d;
        dz.value_bytes = gb;
        if (ng > 0 && ng < d.n_ops) {
            grouped++;
            PCHECK(mf_grouped_bytes(&ctx, &d, pr.order, gp, ng, gb) == MF_OK &&
                       mf_simulate(&ctx, &d, pr.order, gp, ng, &fused, NULL, NULL) == MF_OK &&
                       mf_simulate(&ctx, &dz, pr.order, NULL, 0, &unf, NULL, NULL) == MF_OK && unf <= fused,
                   "grouped bytes seed %d: unfused %lld above fused %lld", seed, (long long)unf, (long long)fused);
        }
        PCHECK(mf_grouped_bytes(&ctx, &d, pr.order, NULL, 0, gb) == MF_OK &&
                   mf_simulate(&ctx, &d, pr.order, NULL, 0, &alone, NULL, NULL) == MF_OK &&
                   mf_simulate(&ctx, &dz, pr.order, NULL, 0, &unf, NULL, NULL) == MF_OK && unf == alone,
               "grouped bytes seed %d: ops alone, %lld against %lld", seed, (long long)unf, (long long)alone);
        mf_plan_result_free(&ctx, &pr);
        mf_gbuf_free(&b);
    }
    PCHECK(grouped >= 10, "only %d random groupings had a group of two ops or more", grouped);
}

/* NOTE [region fission] (mf_remat_fission.c), the move alone.  An MLP backward in the order h = fc1(x),
 * dy = g W2 (both unfusible), then the group [s, y, t, dh] (s = act'(h), the shared factor; y = h s
 * the activation's output; t = dy s; dh from t, h, dy), then wg = y^T g.  At the group with dy's
 * producer as m: B = {t, dh}, A = {s, y}; s is copied for t, and wg gets an edge to run before m.
 * With h as m (ranked first: as large as dy, made first) the whole group depends on it: nothing. */
static void test_region_fission(void)
{
    mf_gbuf b;
    mf_graph_desc d, dr;
    mf_remat_options ro;
    mf_remat_result rr;
    mf_ctx ctx;
    uint8_t cheap[8] = {0, 0, 1, 1, 1, 1, 0};
    int32_t order[7] = {0, 1, 2, 3, 4, 5, 6}, in[3], x, g, h, dy, s, y, t, dh, wg, k, pos_wg = -1, pos_m = -1;
    int32_t copies = 0, t_reads_copy = 0, *id;
    int valid = 0;
    mf_gbuf_init(&b, NULL);
    x = mf_gbuf_add_value(&b, 1, 1);
    g = mf_gbuf_add_value(&b, 1, 1);
    h = p_op(&b, MF_FUSIBLE_STORED, &x, 1, 4);
    dy = p_op(&b, MF_FUSIBLE_STORED, &g, 1, 4);
    s = p_op(&b, MF_FUSIBLE_POINTWISE, &h, 1, 4);
    in[0] = h;
    in[1] = s;
    y = p_op(&b, MF_FUSIBLE_POINTWISE, in, 2, 4);
    in[0] = dy;
    t = p_op(&b, MF_FUSIBLE_POINTWISE, in, 2, 4);
    in[0] = t;
    in[1] = h;
    in[2] = dy;
    dh = p_op(&b, MF_FUSIBLE_POINTWISE, in, 3, 4);
    in[0] = y;
    in[1] = g;
    wg = p_op(&b, MF_FUSIBLE_STORED, in, 2, 1);
    b.is_output[dh] = b.is_output[wg] = 1;
    mf_gbuf_desc(&b, &d);
    mf_ctx_init(&ctx, NULL);
    memset(&ro, 0, sizeof ro);
    ro.budget_bytes = 1 << 20;
    ro.focus_lo = 2;
    ro.focus_hi = 6;
    ro.fission = 1;
    PCHECK(mf_recompute(&ctx, &d, cheap, order, &ro, &rr) == MF_OK && rr.n_splits == 0 && rr.n_edges == 0,
           "fission around h: %d copies, %d edges (%s)", (int)rr.n_splits, (int)rr.n_edges, ctx.err);
    mf_remat_result_free(&ctx, &rr);
    ro.focus_pick = 1;
    PCHECK(mf_recompute(&ctx, &d, cheap, order, &ro, &rr) == MF_OK && rr.n_splits == 1 && rr.n_edges == 1,
           "fission around dy: %d copies, %d edges (%s)", (int)rr.n_splits, (int)rr.n_edges, ctx.err);
    if (rr.n_splits == 1) {
        mf_remat_result_desc(&rr, &dr);
        id = rr.origin; /* the result's order is 0..n-1 */
        for (k = 0; k < rr.n_ops; k++) {
            int32_t j;
            copies += id[k] == 2;
            if (id[k] == 6)
                pos_wg = k;
            if (id[k] == 1)
                pos_m = k;
            for (j = rr.in_ptr[k]; id[k] == 4 && j < rr.in_ptr[k + 1]; j++)
                t_reads_copy |= rr.value_origin[rr.in_idx[j]] == s && rr.in_idx[j] != s;
        }
        PCHECK(copies == 2 && t_reads_copy, "fission: s made %d times, t reads the copy: %d", (int)copies,
               t_reads_copy);
        PCHECK(pos_wg >= 0 && pos_m >= 0 && pos_wg < pos_m && rr.after[2 * (rr.n_after - 1)] == pos_wg &&
                   rr.after[2 * (rr.n_after - 1) + 1] == pos_m,
               "fission: wg at %d, dy's GEMM at %d", (int)pos_wg, (int)pos_m);
        {
            int32_t ident[16];
            for (k = 0; k < rr.n_ops && k < 16; k++)
                ident[k] = k;
            PCHECK(rr.n_ops <= 16 && mf_check_order(&ctx, &dr, ident, &valid) == MF_OK && valid,
                   "fission: the result's order breaks an edge");
        }
    }
    mf_remat_result_free(&ctx, &rr);
    mf_gbuf_free(&b);
    (void)y;
}

static void test_min_cut(void)
{
    /* s=0 -> 1 (3), s -> 2 (2), 1 -> 2 (1), 1 -> t=3 (2), 2 -> t (4): flow 5; the sink side in the
     * residual graph is t and 2 (2 -> t has capacity left), the cut s->2, 1->2, 1->t */
    int32_t src[] = {0, 0, 1, 1, 2}, dst[] = {1, 2, 2, 3, 3};
    int64_t cap[] = {3, 2, 1, 2, 4}, flow = 0, inf_cap[] = {MF_FLOW_INF, MF_FLOW_INF};
    int32_t isrc[] = {0, 1}, idst[] = {1, 2};
    uint8_t side[4];
    mf_ctx ctx;
    mf_talloc ta;
    mf_allocator al = {mf_talloc_alloc, mf_talloc_free, NULL};
    mf_ctx_init(&ctx, NULL);
    PCHECK(mf_min_cut(&ctx, 4, 5, src, dst, cap, 0, 3, &flow, side) == MF_OK && flow == 5, "flow %lld",
           (long long)flow);
    PCHECK(!side[0] && !side[1] && side[2] && side[3], "sink side %d%d%d%d", side[0], side[1], side[2], side[3]);
    PCHECK(mf_min_cut(&ctx, 3, 2, isrc, idst, inf_cap, 0, 2, &flow, side) == MF_EINVAL &&
               strstr(ctx.err, "infinite capacity"),
           "an infinite path: %s", ctx.err);
    al.ud = &ta;
    memset(&ta, 0, sizeof ta);
    ta.fail_at = 1;
    mf_ctx_init(&ctx, &al);
    PCHECK(mf_min_cut(&ctx, 4, 5, src, dst, cap, 0, 3, &flow, side) == MF_ENOMEM && ta.live == 0,
           "a failed allocation");
}

int mf_test_pipeline(int *checks)
{
    test_random_pipelines();
    test_search_on_regions();
    test_region_fission();
    test_grouped_bytes();
    test_min_cut();
    *checks += p_checks;
    return p_failures;
}
