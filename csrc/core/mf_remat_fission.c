/*
 * mf_remat_fission.c -- recomputation's region fission (NOTE [region
 * fission]): the group at a plan's fused peak cut in two around a producer it
 * waits for, the cheap values both halves read computed again in the second,
 * for the pipeline to plan and keep where the fused peak falls.
 */
#include "mf_internal.h"

#include <string.h>

/*
 * NOTE [region fission]  A region that reads the result of an unfusible op m
 * (a GEMM) made before it keeps that result, its own stored values and its
 * outputs alive at once.  In a transformer's MLP backward the region making
 * the activation's output for the second weight's gradient also makes the
 * activation's gradient from the GEMM result dL/d(activation output): both
 * outputs and the GEMM result are live together, though the weight gradient
 * could have run (and freed the activation's output) before the GEMM.  No
 * split of one value lowers that (the halves share the activation's cheap
 * factors), and no order of the ops does (the shared factors would be
 * stored): both moves at once do.  So, at the group at the fused peak
 * [lo, hi) and the pick-th largest storage it reads that an op m before lo
 * makes and nothing after the group reads, unfusible and not cheap:
 *  - B is the group's ops that depend on m, and those whose every reader is
 *    in B; A the rest.  The group is ordered A then B.
 *  - Each cheap value made in A and read in B is split at its first B reader
 *    with its chain (its cheap ancestors made in A), one at a time, until
 *    none is left; a value read across that cannot be copied ends the move.
 *  - The ops after the group that read storages A makes and do not depend on
 *    m get ordering edges to run before m: what they free goes before m's
 *    result is made.
 * Nothing is scored here: the caller plans the graph with the copies and the
 * edges and keeps it only if the fused peak falls.  The edges keep every
 * dependency (none of those readers depends on m), so any order the planner
 * finds is one of the program's.
 */

#define MF_FISSION_MAX_SPLITS 16
#define MF_FISSION_MAX_CHAIN 32

typedef struct fis {
    mf_ctx *ctx;
    mf_arena a;
    mf_roots R;
    int32_t *prod;   /* nv: producer */
    uint8_t *desc;   /* n: depends on m */
    uint8_t *inb;    /* n: in B (positions lo..hi) */
    int32_t *chain;  /* nv */
    int32_t *eptr, *edst; /* n + 1 CSR: the ordering edges leaving each op */
} fis;

/* cur in a new order (a permutation of its positions), origins kept in terms of cur's. */
static int reordered(mf_ctx *ctx, const mf_wgraph *cur, const int32_t *order, mf_wgraph *out)
{
    mf_remat_result r;
    mf_graph_desc d;
    int32_t k;
    int st;
    memset(&r, 0, sizeof r);
    mf_wg_result(cur, &r);
    mf_remat_result_desc(&r, &d);
    if ((st = mf_wg_from_desc(ctx, &d, cur->cheap, order, out)))
        return st;
    for (k = 0; k < out->n; k++)
        out->origin[k] = cur->origin[out->origin[k]];
    for (k = 0; k < out->nv; k++)
        out->vorigin[k] = cur->vorigin[out->vorigin[k]];
    return MF_OK;
}

/* F->desc: the ops of w that depend on op m (its data and ordering edges), in one pass over w's
 * order (every edge runs forward in it). */
static void depends_on(fis *F, const mf_wgraph *w, int32_t m)
{
    int32_t k, j;
    memset(F->desc, 0, (size_t)w->n);
    F->desc[m] = 1;
    for (k = m; k < w->n; k++) {
        for (j = w->in_ptr[k]; j < w->in_ptr[k + 1] && !F->desc[k]; j++)
            F->desc[k] = F->prod[w->in_idx[j]] >= 0 && F->desc[F->prod[w->in_idx[j]]];
        for (j = F->eptr[k]; F->desc[k] && j < F->eptr[k + 1]; j++)
            F->desc[F->edst[j]] = 1;
    }
}

/* F->inb over [lo, hi): the ops depending on m, then (backwards) those every reader of which is in B. */
static void split_group(fis *F, const mf_wgraph *w, int32_t lo, int32_t hi)
{
    int32_t k, j, x, q;
    for (k = lo; k < hi; k++)
        F->inb[k] = F->desc[k];
    for (k = hi - 1; k >= lo; k--) {
        int readers = 0, all_b = 1;
        if (F->inb[k])
            continue;
        if (F->eptr[k + 1] > F->eptr[k]) /* an op that must run before another stays */
            continue;
        for (j = w->out_ptr[k]; j < w->out_ptr[k + 1]; j++) {
            int32_t v = w->out_idx[j];
            if (w->is_output[v])
                all_b = 0;
            for (x = k + 1; x < w->n && all_b; x++)
                for (q = w->in_ptr[x]; q < w->in_ptr[x + 1]; q++)
                    if (w->in_idx[q] == v) {
                        readers++;
                        if (x >= hi || !F->inb[x])
                            all_b = 0;
                        break;
                    }
        }
        F->inb[k] = (uint8_t)(readers > 0 && all_b);
    }
}

static int fis_setup(fis *F, const mf_wgraph *w)
{
    int32_t k, j;
    mf_arena_release(F->ctx, &F->a);
    memset(&F->R, 0, sizeof F->R);
    F->prod = mf_arena_array(F->ctx, &F->a, (size_t)w->nv + 1, sizeof(int32_t));
    F->desc = mf_arena_array(F->ctx, &F->a, (size_t)w->n + 1, 1);
    F->inb = mf_arena_array(F->ctx, &F->a, (size_t)w->n + 1, 1);
    F->chain = mf_arena_array(F->ctx, &F->a, (size_t)w->nv + 1, sizeof(int32_t));
    F->eptr = mf_arena_array(F->ctx, &F->a, (size_t)w->n + 2, sizeof(int32_t));
    F->edst = mf_arena_array(F->ctx, &F->a, (size_t)w->n_after + 1, sizeof(int32_t));
    if (!F->prod || !F->desc || !F->inb || !F->chain || !F->eptr || !F->edst)
        return MF_ENOMEM;
    memset(F->eptr, 0, sizeof(int32_t) * ((size_t)w->n + 2));
    for (k = 0; k < w->n_after; k++)
        F->eptr[w->after[2 * k] + 2]++;
    for (k = 0; k < w->n; k++)
        F->eptr[k + 2] += F->eptr[k + 1];
    for (k = 0; k < w->n_after; k++)
        F->edst[F->eptr[w->after[2 * k] + 1]++] = w->after[2 * k + 1];
    for (k = 0; k < w->nv; k++)
        F->prod[k] = -1;
    for (k = 0; k < w->n; k++)
        for (j = w->out_ptr[k]; j < w->out_ptr[k + 1]; j++)
            F->prod[w->out_idx[j]] = k;
    return mf_roots_build(F->ctx, &F->a, w, &F->R);
}

/* Is root r a storage the group [lo, hi) reads that an unfusible, not cheap op before lo makes and no
 * op after the group reads? */
static int source_of_group(const fis *F, const mf_wgraph *w, int32_t r, int32_t lo, int32_t hi)
{
    int32_t p = F->R.prod[r], j;
    if (F->R.root[r] != r || p < 0 || p >= lo || w->cheap[p] || w->fusible[p] == 1 || F->R.last[r] >= hi)
        return 0;
    for (j = F->R.rd_ptr[r]; j < F->R.rd_ptr[r + 1]; j++)
        if (F->R.rd[j] >= lo)
            return 1;
    return 0;
}

/* The maker of the pick-th largest such storage (ties: the lower id first), or -1. */
static int32_t producer_at(const fis *F, const mf_wgraph *w, int32_t lo, int32_t hi, int32_t pick)
{
    int32_t r, x;
    for (r = 0; r < w->nv; r++) {
        int32_t rank = 0;
        if (!source_of_group(F, w, r, lo, hi))
            continue;
        for (x = 0; x < w->nv; x++)
            if (x != r && (w->bytes[x] > w->bytes[r] || (w->bytes[x] == w->bytes[r] && x < r)) &&
                source_of_group(F, w, x, lo, hi))
                rank++;
        if (rank == pick)
            return F->R.prod[r];
    }
    return -1;
}

/* A cheap root made in A and read in B, with the index of its first B reader: 1, or 0 where none is
 * left; -1 where a value read across cannot be copied. */
static int crossing(const fis *F, const mf_wgraph *w, int32_t lo, int32_t hi, int32_t *root, int32_t *k)
{
    int32_t r, j;
    for (r = 0; r < w->nv; r++) {
        int32_t p = F->R.prod[r], a = 0, first_b = -1;
        if (F->R.root[r] != r || p < lo || p >= hi || F->inb[p])
            continue;
        for (j = F->R.rd_ptr[r]; j < F->R.rd_ptr[r + 1]; j++) {
            int32_t x = F->R.rd[j];
            if (x >= lo && x < hi && F->inb[x]) {
                if (first_b < 0)
                    first_b = j - F->R.rd_ptr[r];
            } else {
                a = 1;
            }
        }
        if (first_b < 0)
            continue;
        if (!a || !F->R.ok[r] || first_b < 1)
            return -1;
        *root = r;
        *k = first_b;
        return 1;
    }
    return 0;
}

/* The cheap ancestors of root r made in A, into F->chain. */
static int32_t chain_of(fis *F, const mf_wgraph *w, int32_t lo, int32_t r)
{
    int32_t n = 0, i = 0, j;
    int32_t *stack = F->chain;
    /* a breadth-first walk; chain[0..n) the roots found */
    stack[n++] = r;
    for (i = 0; i < n; i++) {
        int32_t p = F->R.prod[stack[i]];
        for (j = w->in_ptr[p]; j < w->in_ptr[p + 1]; j++) {
            int32_t u = F->R.root[w->in_idx[j]], pu = F->R.prod[u], seen = 0, q;
            if (pu < lo || F->inb[pu] || !F->R.cp[u])
                continue;
            for (q = 0; q < n; q++)
                seen |= stack[q] == u;
            if (!seen && n <= MF_FISSION_MAX_CHAIN)
                stack[n++] = u;
        }
    }
    return n - 1; /* chain[1..n) */
}

static int add_edges(mf_ctx *ctx, mf_wgraph *w, const int32_t *pairs, int32_t n_pairs)
{
    int32_t *na;
    if (!n_pairs)
        return MF_OK;
    if (!(na = mf_arena_array(ctx, &w->arena, (size_t)(w->n_after + n_pairs) * 2 + 2, sizeof(int32_t))))
        return MF_ENOMEM;
    memcpy(na, w->after, sizeof(int32_t) * 2 * (size_t)w->n_after);
    memcpy(na + 2 * w->n_after, pairs, sizeof(int32_t) * 2 * (size_t)n_pairs);
    w->after = na;
    w->n_after += n_pairs;
    return MF_OK;
}

/* w in an order that keeps its edges, the new ones included: the stable topological sort of its
 * order (NOTE [baseline order]), so the readers that must run before m move up with what they need. */
static int edges_kept(mf_ctx *ctx, mf_wgraph *w)
{
    mf_arena a = {NULL};
    mf_remat_result r;
    mf_graph_desc d;
    mf_pg pg;
    mf_wgraph next;
    int32_t *order;
    int st;
    memset(&r, 0, sizeof r);
    mf_wg_result(w, &r);
    mf_remat_result_desc(&r, &d);
    if (!(order = mf_arena_array(ctx, &a, (size_t)w->n + 1, sizeof(int32_t))))
        st = MF_ENOMEM;
    else if (!(st = mf_pg_build(ctx, &a, &d, &pg)) && !(st = mf_baseline_order(ctx, &a, &pg, order)) &&
             !(st = reordered(ctx, w, order, &next))) {
        mf_wg_free(ctx, w);
        *w = next;
    }
    mf_arena_release(ctx, &a);
    return st;
}

int mf_region_fission(mf_ctx *ctx, mf_wgraph *cur, const mf_remat_options *opt, int64_t budget, int64_t *used,
                      int32_t *n_used, int32_t *n_edges)
{
    fis F;
    mf_wgraph w, next;
    int32_t lo = opt->focus_lo, hi = opt->focus_hi, m, k, i, n_sp = 0, n_e = 0, *order = NULL, *pairs = NULL;
    int64_t add = 0;
    int st, more;
    memset(&F, 0, sizeof F);
    memset(&w, 0, sizeof w);
    F.ctx = ctx;
    if ((st = fis_setup(&F, cur)))
        goto done;
    if ((m = producer_at(&F, cur, lo, hi, opt->focus_pick)) < 0)
        goto done;
    depends_on(&F, cur, m);
    split_group(&F, cur, lo, hi);
    for (k = lo, i = 0; k < hi; k++)
        i += F.inb[k];
    if (i == 0 || i == hi - lo) /* one half is empty */
        goto done;
    /* the group ordered A then B (m, before lo, keeps its position) */
    if (!(order = mf_alloc(ctx, sizeof(int32_t) * ((size_t)cur->n + 1)))) {
        st = MF_ENOMEM;
        goto done;
    }
    for (k = 0, i = 0; k < hi; k++)
        if (k < lo || !F.inb[k])
            order[i++] = k;
    for (k = lo; k < cur->n; k++)
        if (k >= hi || F.inb[k])
            order[i++] = k;
    if ((st = reordered(ctx, cur, order, &w)))
        goto done;
    /* the values read across, split one at a time */
    for (;;) {
        int32_t r, q, nc;
        mf_split sp;
        if ((st = fis_setup(&F, &w)))
            goto done;
        depends_on(&F, &w, m);
        split_group(&F, &w, lo, hi);
        more = crossing(&F, &w, lo, hi, &r, &q);
        if (more < 0 || (more > 0 && n_sp == MF_FISSION_MAX_SPLITS))
            goto done; /* nothing made: w is dropped */
        if (!more)
            break;
        nc = chain_of(&F, &w, lo, r);
        sp.r = r;
        sp.k = q;
        sp.bytes = w.bytes[r];
        sp.chain = nc ? F.chain + 1 : NULL;
        sp.n_chain = nc;
        for (i = 1; i <= nc; i++)
            sp.bytes += w.bytes[F.chain[i]];
        if (*used + add + sp.bytes > budget)
            goto done;
        if ((st = mf_apply_splits(ctx, &w, &F.R, &sp, 1, &next)))
            goto done;
        hi += next.n - w.n;
        mf_wg_free(ctx, &w);
        w = next;
        add += sp.bytes;
        n_sp++;
    }
    /* the readers of A's storages after the group that do not depend on m run before it */
    if (!(pairs = mf_alloc(ctx, sizeof(int32_t) * 2 * ((size_t)w.n + 1)))) {
        st = MF_ENOMEM;
        goto done;
    }
    for (k = hi; k < w.n; k++) {
        int32_t j, reads_a = 0;
        if (F.desc[k])
            continue;
        for (j = w.in_ptr[k]; j < w.in_ptr[k + 1] && !reads_a; j++) {
            int32_t p = F.R.prod[F.R.root[w.in_idx[j]]];
            reads_a = p >= lo && p < hi && !F.inb[p];
        }
        if (reads_a) {
            pairs[2 * n_e] = k;
            pairs[2 * n_e + 1] = m;
            n_e++;
        }
    }
    if (!n_sp && !n_e)
        goto done;
    if ((st = add_edges(ctx, &w, pairs, n_e)) || (n_e && (st = edges_kept(ctx, &w))))
        goto done;
    mf_wg_free(ctx, cur);
    *cur = w;
    memset(&w, 0, sizeof w);
    *used += add;
    *n_used += n_sp;
    *n_edges += n_e;
done:
    mf_free(ctx, order);
    mf_free(ctx, pairs);
    mf_wg_free(ctx, &w);
    mf_arena_release(ctx, &F.a);
    return st;
}
