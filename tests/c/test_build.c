/*
 * test_build.c -- tests of the graph builder from op records (csrc/core/mf_build.c), run from
 * test_core.c's main: ordering edges (in-place write-after-read and read-after-write, through
 * views and through outputs that only may alias, the chain of ordered ops, collectives), views
 * in the memory model, the saved-tensor op 0, epilogue candidates, recompute candidates, bad
 * records and allocation failures.  No Thunder: each graph is written as the records a trace
 * would give.
 */
#define _POSIX_C_SOURCE 200809L
#include "mf_build.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mf_test_build(int *checks);

static int b_failures, b_checks;

#define BCHECK(cond, ...) MF_TEST_CHECK(b_checks, b_failures, cond, __VA_ARGS__)

/* One op: reads in[0..nin), makes nout values (bytes each) with the given aliases. */
typedef struct {
    int32_t in[4], alias[4];
    int64_t bytes[4];
    uint8_t view[4];
    int nin, nout;
    uint32_t eff;
    uint8_t fusible, cheap, epi;
} op_t;

static int32_t add(mf_builder *B, op_t o, int32_t *outs)
{
    mf_op_record r;
    int32_t tmp[4];
    memset(&r, 0, sizeof r);
    r.n_in = o.nin;
    r.in = o.in;
    r.n_out = o.nout;
    r.out_bytes = o.bytes;
    r.out_alias = o.alias;
    r.out_view = o.view;
    r.effects = o.eff;
    r.fusible = o.fusible;
    r.cheap = o.cheap;
    r.epilogue = o.epi;
    return mf_build_op(B, &r, outs ? outs : tmp);
}

/* An op reading a (and b when >= 0), making one value of `bytes` (aliasing `alias` when >= 0). */
static op_t op1(int32_t a, int32_t b, int64_t bytes, int32_t alias, int view, uint32_t eff)
{
    op_t o;
    memset(&o, 0, sizeof o);
    o.in[o.nin++] = a;
    if (b >= 0)
        o.in[o.nin++] = b;
    o.nout = bytes >= 0 ? 1 : 0;
    o.bytes[0] = bytes;
    o.alias[0] = alias;
    o.view[0] = (uint8_t)view;
    o.eff = eff;
    o.fusible = 1;
    return o;
}

static int has_edge(const mf_graph_desc *d, int32_t a, int32_t b)
{
    int32_t i;
    for (i = 0; i < d->n_after; i++)
        if (d->after[2 * i] == a && d->after[2 * i + 1] == b)
            return 1;
    return 0;
}

/* The planned order is valid and puts a before b. */
static int planned_before(const mf_graph_desc *d, int32_t a, int32_t b)
{
    mf_ctx ctx;
    mf_plan_result r;
    int32_t i, pa = -1, pb = -1;
    int valid = 0;
    mf_ctx_init(&ctx, NULL);
    if (mf_plan(&ctx, d, NULL, &r) != MF_OK)
        return 0;
    for (i = 0; i < r.n_ops; i++) {
        if (r.order[i] == a)
            pa = i;
        if (r.order[i] == b)
            pb = i;
    }
    if (mf_check_order(&ctx, d, r.order, &valid) != MF_OK)
        valid = 0;
    mf_plan_result_free(&ctx, &r);
    return valid && pa >= 0 && pb >= 0 && pa < pb;
}

static void test_in_place_edges(void)
{
    mf_builder B;
    mf_graph_desc d;
    int32_t x, y, a, w, bb, c, out[1];
    mf_builder_init(&B, NULL);
    x = mf_build_input(&B, 64);
    a = add(&B, op1(x, -1, 1000, -1, 0, 0), out);                    /* reads x: a big result */
    y = out[0];
    w = add(&B, op1(x, -1, -1, -1, 0, MF_EFF_WRITES), NULL);         /* x.add_(1): no new value */
    bb = add(&B, op1(x, -1, 8, -1, 0, 0), out);                      /* reads x after the write */
    c = add(&B, op1(y, out[0], 8, -1, 0, 0), out);
    mf_build_output(&B, out[0]);
    BCHECK(mf_build_finish(&B, 0, &d, NULL) == MF_OK, "finish: %s", B.g.ctx.err);
    BCHECK(has_edge(&d, a, w), "write-after-read: the write runs after the earlier reader");
    BCHECK(has_edge(&d, w, bb), "read-after-write: the later reader runs after the write");
    BCHECK(!has_edge(&d, a, bb) && !has_edge(&d, a, c), "no edge between plain readers");
    BCHECK(d.fusible[w] == 0, "an op with an effect is never fused");
    /* the planner would rather run bb first (its result is small, a's is big): the edges forbid it */
    BCHECK(planned_before(&d, a, w) && planned_before(&d, w, bb), "the plan keeps read, write, read");
    mf_builder_free(&B);
}

static void test_alias_edges(void)
{
    mf_builder B;
    mf_graph_desc d;
    int32_t x, v, c, rd, w, later, out[1];
    mf_builder_init(&B, NULL);
    x = mf_build_input(&B, 64);
    add(&B, op1(x, -1, 64, x, 1, 0), out); /* v = x.view(...) */
    v = out[0];
    add(&B, op1(x, -1, 64, x, 0, 0), out); /* c = x.contiguous(): may alias x */
    c = out[0];
    rd = add(&B, op1(x, -1, 8, -1, 0, 0), NULL);
    w = add(&B, op1(v, -1, -1, -1, 0, MF_EFF_WRITES), NULL); /* v.mul_(2) writes x's storage */
    later = add(&B, op1(c, -1, 8, -1, 0, 0), out);           /* reads the may-alias after the write */
    mf_build_output(&B, out[0]);
    BCHECK(mf_build_finish(&B, 0, &d, NULL) == MF_OK, "finish: %s", B.g.ctx.err);
    BCHECK(d.alias_of[v] == x, "a view is an alias in the memory model");
    BCHECK(d.alias_of[c] == -1, "a may-alias allocates like a new value");
    BCHECK(has_edge(&d, rd, w), "a write through a view orders after readers of the base");
    BCHECK(has_edge(&d, 1, w), "and after the op that read x to make the may-alias");
    BCHECK(has_edge(&d, w, later), "a reader of the may-alias orders after the write");
    mf_builder_free(&B);
}

static void test_chains(void)
{
    mf_builder B;
    mf_graph_desc d;
    int32_t x, x2, r1, r2, pure, wr, c1, wt, out[1], fut;
    op_t o;
    mf_builder_init(&B, NULL);
    x = mf_build_input(&B, 64);
    x2 = mf_build_input(&B, 64);
    r1 = add(&B, op1(x, -1, 64, -1, 0, MF_EFF_ORDERED), NULL); /* dropout */
    pure = add(&B, op1(x, -1, 64, -1, 0, 0), NULL);
    r2 = add(&B, op1(x, -1, 64, -1, 0, MF_EFF_ORDERED), NULL); /* another draw */
    wr = add(&B, op1(x, -1, -1, -1, 0, MF_EFF_WRITES), NULL);
    c1 = add(&B, op1(x2, -1, 64, -1, 0, MF_EFF_COMM), out);    /* all_reduce: a future */
    fut = out[0];
    o = op1(fut, -1, 64, fut, 1, MF_EFF_WAIT);
    wt = add(&B, o, out);
    mf_build_output(&B, out[0]);
    BCHECK(mf_build_finish(&B, 0, &d, NULL) == MF_OK, "finish: %s", B.g.ctx.err);
    BCHECK(has_edge(&d, r1, r2) && has_edge(&d, r2, wr), "ordered ops and writes form one chain");
    BCHECK(!has_edge(&d, r1, pure) && !has_edge(&d, pure, r2), "a pure op stays free between them");
    BCHECK(!has_edge(&d, wr, c1) && !has_edge(&d, r2, c1), "a collective is not in the chain");
    BCHECK(d.comm && d.comm[c1] == MF_COMM_ISSUE && d.comm[wt] == MF_COMM_WAIT && d.comm[pure] == MF_COMM_NONE,
           "collectives and waits are marked");
    BCHECK(d.fusible[c1] == 0 && d.fusible[wt] == 0 && d.fusible[pure] == 1, "neither is fused");
    BCHECK(has_edge(&d, pure, wr), "the write still runs after the pure reader of x");
    mf_builder_free(&B);
}

static void test_saved_op(void)
{
    mf_builder B;
    mf_graph_desc d;
    int32_t s, sv, g, a, b2, out[1];
    mf_builder_init(&B, NULL);
    g = mf_build_input(&B, 32); /* the incoming gradient: a real input */
    s = mf_build_saved(&B, 128, -1);
    sv = mf_build_saved(&B, 128, s); /* a view of the same saved storage */
    BCHECK(s >= 0 && sv >= 0, "saved values: %s", B.g.ctx.err);
    a = add(&B, op1(s, g, 32, -1, 0, 0), out);
    b2 = add(&B, op1(sv, out[0], 32, -1, 0, 0), out);
    mf_build_output(&B, out[0]);
    BCHECK(mf_build_saved(&B, 8, -1) < 0 && strstr(B.g.ctx.err, "before the first op"),
           "a saved value after an op is refused: %s", B.g.ctx.err);
    BCHECK(mf_build_finish(&B, 0, &d, NULL) == MF_OK, "finish: %s", B.g.ctx.err);
    BCHECK(a == 1 && b2 == 2 && d.n_ops == 3, "op 0 makes the saved values");
    BCHECK(d.out_ptr[1] - d.out_ptr[0] == 2 && d.in_ptr[1] == d.in_ptr[0], "op 0 reads nothing, makes both");
    BCHECK(has_edge(&d, 0, a) && has_edge(&d, 0, b2), "op 0 runs before every op");
    BCHECK(d.alias_of[sv] == s && !d.is_input[s] && d.is_input[g], "saved views share one storage");
    mf_builder_free(&B);
}

static void test_epilogues(void)
{
    mf_builder B;
    mf_graph_desc d;
    int32_t x, w, gm, act, y, two, viewed, v2, bad_head, lone, out[1];
    op_t o;
    mf_builder_init(&B, NULL);
    x = mf_build_input(&B, 64);
    w = mf_build_input(&B, 64);
    o = op1(x, w, 64, -1, 0, 0);
    o.epi = MF_EPI_HEAD;
    gm = add(&B, o, out); /* y = x @ w */
    y = out[0];
    o = op1(y, -1, 64, -1, 0, 0);
    o.epi = MF_EPI_TAIL;
    act = add(&B, o, out); /* relu(y) */
    o = op1(y, x, 64, -1, 0, 0);
    o.epi = MF_EPI_TAIL;
    two = add(&B, o, NULL); /* reads y and x: not an epilogue */
    add(&B, op1(y, -1, 64, y, 1, 0), out); /* a view of y */
    o = op1(out[0], -1, 64, -1, 0, 0);
    o.epi = MF_EPI_TAIL;
    viewed = add(&B, o, NULL); /* reads the view, not y itself */
    o = op1(x, -1, 64, -1, 0, 0);
    bad_head = add(&B, o, out); /* made without a head role */
    o = op1(out[0], -1, 64, -1, 0, 0);
    o.epi = MF_EPI_TAIL;
    lone = add(&B, o, out);
    o = op1(x, w, 64, -1, 0, MF_EFF_ORDERED);
    o.epi = MF_EPI_HEAD;
    add(&B, o, out); /* a head with an effect loses its role */
    o = op1(out[0], -1, 64, -1, 0, 0);
    o.epi = MF_EPI_TAIL;
    v2 = add(&B, o, out);
    mf_build_output(&B, out[0]);
    BCHECK(mf_build_finish(&B, 1, &d, NULL) == MF_OK, "finish: %s", B.g.ctx.err);
    BCHECK(d.epilogue_of && d.epilogue_of[act] == gm, "relu(x @ w) is a candidate");
    BCHECK(d.epilogue_of && d.epilogue_of[two] == -1 && d.epilogue_of[viewed] == -1, "two reads, a view: none");
    BCHECK(d.epilogue_of && d.epilogue_of[lone] == -1 && d.epilogue_of[v2] == -1, "no head: none");
    (void)bad_head;
    mf_builder_free(&B);

    mf_builder_init(&B, NULL); /* epilogues off: no candidates at all */
    x = mf_build_input(&B, 64);
    o = op1(x, -1, 64, -1, 0, 0);
    o.epi = MF_EPI_HEAD;
    add(&B, o, out);
    o = op1(out[0], -1, 64, -1, 0, 0);
    o.epi = MF_EPI_TAIL;
    add(&B, o, out);
    mf_build_output(&B, out[0]);
    BCHECK(mf_build_finish(&B, 0, &d, NULL) == MF_OK && d.epilogue_of == NULL, "epilogues off");
    mf_builder_free(&B);
}

static void test_recompute_candidates(void)
{
    mf_builder B;
    mf_graph_desc d;
    const uint8_t *cheap = NULL;
    int32_t x, y, ok, touched, eff, out[1];
    op_t o;
    mf_builder_init(&B, NULL);
    x = mf_build_input(&B, 64);
    y = mf_build_input(&B, 64);
    o = op1(x, -1, 64, -1, 0, 0);
    o.cheap = 1;
    ok = add(&B, o, out);
    o = op1(y, -1, 64, -1, 0, 0);
    o.cheap = 1;
    touched = add(&B, o, NULL); /* reads y, which is written in place later */
    o = op1(x, -1, 64, -1, 0, MF_EFF_ORDERED);
    o.cheap = 1;
    eff = add(&B, o, NULL);
    add(&B, op1(y, -1, -1, -1, 0, MF_EFF_WRITES), NULL);
    mf_build_output(&B, out[0]);
    BCHECK(mf_build_finish(&B, 0, &d, &cheap) == MF_OK, "finish: %s", B.g.ctx.err);
    BCHECK(cheap && cheap[ok] == 1, "a cheap op stays a candidate");
    BCHECK(cheap && cheap[touched] == 0, "not one reading storage written in place");
    BCHECK(cheap && cheap[eff] == 0, "not one with an effect");
    mf_builder_free(&B);

    mf_builder_init(&B, NULL); /* nothing cheap: no flags */
    x = mf_build_input(&B, 64);
    add(&B, op1(x, -1, 64, -1, 0, 0), out);
    mf_build_output(&B, out[0]);
    BCHECK(mf_build_finish(&B, 0, &d, &cheap) == MF_OK && cheap == NULL, "no cheap op: NULL");
    mf_builder_free(&B);
}

static void test_bad_records(void)
{
    mf_builder B;
    mf_graph_desc d;
    int32_t x;
    mf_builder_init(&B, NULL);
    x = mf_build_input(&B, 64);
    BCHECK(add(&B, op1(x + 5, -1, 8, -1, 0, 0), NULL) < 0 && strstr(B.g.ctx.err, "does not exist"),
           "a read of a value that does not exist: %s", B.g.ctx.err);
    BCHECK(add(&B, op1(x, -1, -8, -1, 0, 0), NULL) >= 0, "-8 bytes here means no output");
    {
        op_t o = op1(x, -1, 8, -1, 0, 0);
        o.bytes[0] = -3;
        o.nout = 1;
        BCHECK(add(&B, o, NULL) < 0 && strstr(B.g.ctx.err, "negative"), "negative bytes: %s", B.g.ctx.err);
    }
    BCHECK(mf_build_input(&B, -1) < 0, "a negative input");
    BCHECK(mf_build_output(&B, 99) < 0, "an output that does not exist");
    BCHECK(!B.g.nomem, "bad records are not out of memory");
    BCHECK(mf_build_finish(&B, 0, &d, NULL) == MF_OK, "the graph so far is fine");
    BCHECK(mf_build_finish(&B, 0, &d, NULL) == MF_EINVAL, "finish twice");
    BCHECK(mf_build_input(&B, 1) < 0, "nothing after finish");
    mf_builder_free(&B);
}

/* ---- allocation failures: every failing allocation gives ENOMEM and leaks nothing ---- */


/* A backward-shaped graph of L layers: saved tensors, cheap chains, views, in-place writes. */
static int build_some(const mf_ctx *parent, int L)
{
    mf_builder B;
    mf_graph_desc d;
    const uint8_t *cheap;
    int32_t g, s[64], out[1], i, st = MF_OK;
    op_t o;
    mf_builder_init(&B, parent);
    g = mf_build_input(&B, 256);
    for (i = 0; i < L && i < 64; i++)
        s[i] = mf_build_saved(&B, 512, i % 3 == 2 ? s[i - 1] : -1);
    for (i = 0; i < L && i < 64; i++) {
        o = op1(g, s[i], 256, -1, 0, 0);
        o.epi = MF_EPI_HEAD;
        add(&B, o, out);
        o = op1(out[0], -1, 256, -1, 0, 0);
        o.cheap = 1;
        o.epi = MF_EPI_TAIL;
        add(&B, o, out);
        add(&B, op1(out[0], -1, 256, out[0], 1, 0), out);
        if (i % 4 == 3)
            add(&B, op1(out[0], -1, -1, -1, 0, MF_EFF_WRITES), NULL);
        g = out[0];
    }
    mf_build_output(&B, g);
    st = mf_build_finish(&B, 1, &d, &cheap);
    if (st == MF_OK && B.g.nomem)
        st = MF_EINTERNAL;
    mf_builder_free(&B);
    return st;
}

static void test_alloc_failures(void)
{
    long total, k;
    {
        mf_talloc f = {0, -1, 0};
        mf_allocator al = {mf_talloc_alloc, mf_talloc_free, &f};
        mf_ctx ctx;
        mf_ctx_init(&ctx, &al);
        BCHECK(build_some(&ctx, 40) == MF_OK, "the graph builds");
        total = f.count;
        BCHECK(f.live == 0, "leak: %ld blocks", f.live);
    }
    for (k = 1; k <= total; k++) {
        mf_talloc f = {0, k, 0};
        mf_allocator al = {mf_talloc_alloc, mf_talloc_free, &f};
        mf_ctx ctx;
        int st;
        mf_ctx_init(&ctx, &al);
        st = build_some(&ctx, 40);
        BCHECK(st == MF_ENOMEM, "failing allocation %ld: status %d", k, st);
        BCHECK(f.live == 0, "failing allocation %ld: %ld blocks leaked", k, f.live);
    }
    printf("allocation failure injection (graph builder): %ld allocations, each failed once\n", total);
}

int mf_test_build(int *checks)
{
    test_in_place_edges();
    test_alias_edges();
    test_chains();
    test_saved_op();
    test_epilogues();
    test_recompute_candidates();
    test_bad_records();
    test_alloc_failures();
    printf("graph builder: ordering edges, views, saved op, epilogue and recompute candidates (%d checks, %d "
           "failures)\n", b_checks, b_failures);
    *checks += b_checks;
    return b_failures;
}
