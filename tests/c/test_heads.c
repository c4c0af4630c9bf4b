/*
 * test_heads.c -- the buffers a fused group's results take (csrc/core/mf_credit.c NOTE [reuse
 * credit]: its stored head, mf_fuse.c NOTE [stored heads], and donated inputs), run from
 * test_core.c's main.  Random small graphs of mostly equal-sized values, many of them donatable,
 * made by stored ops (GEMMs, MF_FUSIBLE_STORED), pointwise ops (MF_FUSIBLE_POINTWISE), other
 * fusible ops, unfusible ops and views are planned; on the order each plan returns, every grouping (runs of fusible ops, singles)
 * is scored by a literal reference written from the NOTE, so:
 *  - mf_simulate equals the reference on every grouping (the simulator's copy of the rule);
 *  - the plan's peak is the least reference peak over all groupings of its order (the DP's copy);
 *  - the rule matters: on many orders the least peak with it is below the least peak without it,
 *    and never above.
 */
#define _POSIX_C_SOURCE 200809L
#include "mf_build.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mf_test_heads(int *checks);

static int h_failures, h_checks;

#define HCHECK(cond, ...) MF_TEST_CHECK(h_checks, h_failures, cond, __VA_ARGS__)

#define HMAX 11 /* ops: every grouping of an order is enumerated */
#define HVMAX 64

static uint64_t h_state = 0xABCDEF12345ULL;

static int h_int(int n) /* [0, n) */
{
    return mf_test_rand(&h_state, n);
}

static void random_graph(mf_gbuf *b, int n)
{
    int k, gemm = -1; /* the last stored op's result */
    mf_gbuf_init(b, NULL);
    mf_gbuf_add_value(b, 8, 1);
    mf_gbuf_add_value(b, 16, 1);
    for (k = 0; k < n; k++) {
        int32_t nv = b->n_values, v;
        int kind = h_int(12), nin = 1 + h_int(3), i;
        int fus = kind < 3 ? MF_FUSIBLE_STORED : kind < 7 ? MF_FUSIBLE_POINTWISE : kind < 9 ? MF_FUSIBLE : 0;
        mf_gbuf_begin_op(b, kind == 11 ? MF_FUSIBLE : fus);
        if (kind == 11 && nv > 2) { /* a view of a value made here */
            mf_test_view_of(b, 2 + h_int(nv - 2));
        } else {
            /* a pointwise op often reads the last GEMM's result (a GELU gradient over a matmul) */
            if (fus == MF_FUSIBLE_POINTWISE && gemm >= 0 && h_int(3))
                mf_gbuf_op_in(b, gemm);
            for (i = 0; i < nin; i++)
                mf_gbuf_op_in(b, h_int(nv));
            /* mostly one size, so a pointwise result can take a head's buffer */
            v = mf_gbuf_add_value(b, h_int(5) ? 16 : 8 * (1 + h_int(3)), 0);
            mf_gbuf_op_out(b, v);
            if (fus == MF_FUSIBLE_STORED)
                gemm = v;
        }
        mf_gbuf_end_op(b);
    }
    for (k = 2; k < b->n_values; k++) {
        if (h_int(6) == 0 || k == b->n_values - 1)
            b->is_output[k] = 1;
        if (h_int(3)) /* NOTE [donated inputs] */
            mf_gbuf_set_donatable(b, k);
    }
}

/* ---- the reference, literally from the NOTE ---- */

typedef struct href {
    int n, nv;
    int root[HVMAX];
    int alloc_op[HVMAX];        /* per root value: the op that makes it, -1 for inputs */
    int out[HVMAX], mat[HVMAX]; /* per root value */
    uint32_t readers[HVMAX];    /* per root value: op mask */
    int nalloc[HMAX], head[HMAX];
    int pointwise[HMAX];
    int don[HVMAX], viewed[HVMAX]; /* per root value: donatable; read through a view of other bytes or,
                                    * by a fused op, through one of another order (not donatable) */
    int prodop[HVMAX];             /* per value: the op that makes it (a view too), -1 for inputs */
} href;

/* How many of root s's values do the ops of group t read that the group does not make (its inputs)? */
static int group_inputs(const mf_graph_desc *d, const href *r, const int *grp, int s, int t)
{
    int k, j, x, n = 0, seen[HVMAX] = {0};
    for (k = 0; k < r->n; k++)
        if (grp[k] == t)
            for (j = d->in_ptr[k]; j < d->in_ptr[k + 1]; j++) {
                x = d->in_idx[j];
                if (r->root[x] != s || seen[x] || (x != s && r->prodop[x] >= 0 && grp[r->prodop[x]] == t))
                    continue;
                seen[x] = 1;
                n++;
            }
    return n;
}

static void href_build(const mf_graph_desc *d, href *r)
{
    int v, k, j;
    memset(r, 0, sizeof *r);
    r->n = d->n_ops;
    r->nv = d->n_values;
    for (v = 0; v < d->n_values; v++) {
        int x = v;
        while (d->alias_of[x] >= 0)
            x = d->alias_of[x];
        r->root[v] = x;
        r->alloc_op[v] = -1;
        r->prodop[v] = -1;
    }
    for (v = 0; v < d->n_values; v++) {
        if (d->is_output[v])
            r->out[r->root[v]] = 1;
        r->don[v] = d->donatable && d->donatable[v];
    }
    for (k = 0; k < d->n_ops; k++) {
        int stored = d->fusible[k] == MF_FUSIBLE_STORED;
        r->pointwise[k] = d->fusible[k] == MF_FUSIBLE_POINTWISE;
        r->head[k] = -1;
        for (j = d->in_ptr[k]; j < d->in_ptr[k + 1]; j++) {
            int s = r->root[d->in_idx[j]];
            if (d->is_input[s])
                continue;
            r->viewed[s] |= d->in_idx[j] != s && (d->value_bytes[d->in_idx[j]] != d->value_bytes[s] ||
                                                  (d->fusible && d->fusible[k] && !stored && !(d->donatable && d->donatable[d->in_idx[j]])));
            r->readers[s] |= 1u << k;
            r->mat[s] |= stored;
        }
        for (j = d->out_ptr[k]; j < d->out_ptr[k + 1]; j++) {
            int x = d->out_idx[j];
            r->prodop[x] = k;
            if (r->root[x] != x)
                continue; /* a view allocates nothing */
            r->alloc_op[x] = k;
            r->mat[x] |= stored;
            r->nalloc[k]++;
            r->head[k] = x;
        }
    }
}

/* Is every reader of root s in a group <= t, and the last position of one in group t (else -1)? */
static int last_in(const href *r, int s, const int *grp, const int *pos, int t, int *ok)
{
    int k, lp = -1;
    *ok = 1;
    for (k = 0; k < r->n; k++)
        if (r->readers[s] >> k & 1) {
            *ok &= grp[k] <= t;
            if (grp[k] == t && pos[k] > lp)
                lp = pos[k];
        }
    return lp;
}

/* csrc/core/mf_credit.c NOTE [reuse credit], literally: sources (the stored head, donated
 * storages) by size, the least last-read position r0 of each size, its results leaving the group
 * anywhere in it (takers), those at or after r0 (late ones) and those computed from a donated
 * source through unstored values, where some source of the size so far has every pointwise reader in
 * the group its op or its maker (direct ones: without the head, the one taker must be one). */
static int64_t href_credit(const mf_graph_desc *d, const href *r, const int32_t *order, const int *grp,
                           const int *pos, int lo, int hi, int t)
{
    int64_t r0[HVMAX], credit = 0; /* by size: index = bytes / 8 */
    int takers[HVMAX], plain[HVMAX], late[HVMAX], plate[HVMAX], direct[HVMAX], hok[HVMAX], headc = -1, h = -1, s, p, k,
        ok;
    int dsrc[HVMAX], dcls[HVMAX], carried[HVMAX]; /* per root: a donated source of the group, of the size;
                                                   * made from one through unstored values */
    uint32_t anc[HMAX] = {0}; /* per op: its makers in the group */
    for (s = 0; s < HVMAX; s++) {
        r0[s] = -1;
        takers[s] = plain[s] = late[s] = plate[s] = direct[s] = hok[s] = dsrc[s] = dcls[s] = carried[s] = 0;
    }
    if (r->nalloc[order[lo]] == 1) { /* the head: a source where no reader follows the group, never a taker */
        h = r->head[order[lo]];
        if (r->mat[h] && !r->out[h] && d->value_bytes[h] > 0) {
            int lp = last_in(r, h, grp, pos, t, &ok);
            if (ok) {
                headc = (int)(d->value_bytes[h] / 8);
                r0[headc] = lp > lo + 1 ? lp : lo + 1;
            }
        } else {
            h = -1;
        }
    }
    for (s = 0; s < r->nv; s++) {
        int lp;
        if (r->root[s] != s || r->alloc_op[s] < 0 || grp[r->alloc_op[s]] >= t || !r->don[s] || r->out[s] ||
            r->viewed[s] || d->value_bytes[s] == 0)
            continue;
        lp = last_in(r, s, grp, pos, t, &ok);
        ok &= group_inputs(d, r, grp, s, t) == 1; /* two inputs of the region: the caller donates neither */
        if (ok && lp >= 0 && (r0[d->value_bytes[s] / 8] < 0 || lp < r0[d->value_bytes[s] / 8]))
            r0[d->value_bytes[s] / 8] = lp;
        if (ok && lp >= 0) {
            dsrc[s] = lp + 1; /* its last read: 1 + the position */
            dcls[d->value_bytes[s] / 8] = 1;
        }
    }
    for (p = lo; p < hi; p++) {
        int u = order[p], carry = 0, ancok[HVMAX], hafter;
        for (s = 0; s < r->nv; s++) { /* a donated source (read last here) or a value made from one */
            if (r->root[s] == s && (r->readers[s] >> u & 1) && (dsrc[s] == p + 1 || (carried[s] && !r->mat[s])))
                carry = 1;
            if (r->root[s] == s && (r->readers[s] >> u & 1) && r->alloc_op[s] >= 0 && grp[r->alloc_op[s]] == t)
                anc[u] |= 1u << r->alloc_op[s] | anc[r->alloc_op[s]]; /* u's makers in the group */
        }
        for (s = 0; s < HVMAX; s++)
            ancok[s] = 0;
        for (s = 0; s < r->nv; s++) /* a source of the size so far whose pointwise readers are u or its makers */
            if (dsrc[s] && dsrc[s] <= p + 1) {
                int all = 1;
                for (k = 0; k < r->n; k++)
                    if ((r->readers[s] >> k & 1) && grp[k] == t && r->pointwise[k])
                        all &= k == u || (anc[u] >> k & 1);
                ancok[d->value_bytes[s] / 8] |= all;
            }
        for (s = 0; s < r->nv; s++)
            if (r->root[s] == s && r->alloc_op[s] == u && carry)
                carried[s] = 1;
        if (!r->pointwise[u])
            continue;
        hafter = h >= 0;
        for (k = 0; k < r->n && h >= 0; k++) /* the head's pointwise readers so far: u or its makers */
            if ((r->readers[h] >> k & 1) && grp[k] == t && pos[k] <= p && r->pointwise[k])
                hafter &= k == u || (anc[u] >> k & 1);
        for (s = 0; s < r->nv; s++) {
            int after = 0, c = (int)(d->value_bytes[s] / 8);
            if (r->root[s] != s || r->alloc_op[s] != u || s == h || c == 0)
                continue;
            for (k = 0; k < r->n; k++)
                after |= (r->readers[s] >> k & 1) && grp[k] > t;
            takers[c] += r->out[s] || after;
            plain[c] += (r->out[s] || after) && !r->mat[s];
            late[c] += (r->out[s] || after) && r0[c] >= 0 && p >= r0[c];
            plate[c] += (r->out[s] || after) && !r->mat[s] && r0[c] >= 0 && p >= r0[c];
            direct[c] += (r->out[s] || after) && carry && dcls[c] && ancok[c];
            hok[c] += (r->out[s] || after) && !r->mat[s] && r0[c] >= 0 && p >= r0[c] && hafter;
        }
    }
    for (s = 1; s < HVMAX; s++) /* two results of a size: each gets a buffer of its own */
        if (r0[s] >= 0 && (s == headc ? plain[s] == 1 && plate[s] == 1 && late[s] == takers[s] && hok[s] == 1
                                    : late[s] == 1 && direct[s] == 1))
            credit += 8 * (int64_t)s; /* with the head: unstored ones, and no early taker of any kind;
                                       * donated only: one late one, made from a source */
    return credit;
}

/* Peak of order grouped by gp (ng groups); credit: apply NOTE [reuse credit]. */
static int64_t href_peak(const mf_graph_desc *d, const href *r, const int32_t *order, const int32_t *gp, int ng,
                         int credit)
{
    int grp[HMAX], pos[HMAX], t, s, i, k;
    int64_t peak = 0;
    for (t = 0; t < ng; t++)
        for (i = gp[t]; i < gp[t + 1]; i++) {
            grp[order[i]] = t;
            pos[order[i]] = i;
        }
    for (t = 0; t < ng; t++) {
        int lo = gp[t], hi = gp[t + 1], size = hi - lo;
        int64_t during = 0;
        for (s = 0; s < r->nv; s++) {
            int a, last, outside = 0;
            if (r->root[s] != s || r->alloc_op[s] < 0)
                continue;
            a = grp[r->alloc_op[s]];
            last = a;
            for (k = 0; k < r->n; k++)
                if (r->readers[s] >> k & 1) {
                    last = grp[k] > last ? grp[k] : last;
                    outside |= grp[k] != a;
                }
            if (a == t && (size == 1 || r->out[s] || outside || r->mat[s]))
                during += d->value_bytes[s];
            else if (a < t && (r->out[s] || last >= t))
                during += d->value_bytes[s];
        }
        if (credit && size > 1) /* pairs are none of these random graphs' */
            during -= href_credit(d, r, order, grp, pos, lo, hi, t);
        if (during > peak)
            peak = during;
    }
    return peak;
}

/* Over every grouping of order: checks mf_simulate against the reference; the least peaks with
 * and without the rule. */
static void all_groupings(mf_ctx *ctx, const mf_graph_desc *d, const href *r, const int32_t *order, int t,
                          int64_t *least, int64_t *least_plain)
{
    int32_t n = d->n_ops, gp[HMAX + 1];
    uint32_t mask, M = n > 1 ? 1u << (n - 1) : 1;
    int mismatches = 0;
    *least = *least_plain = INT64_MAX;
    for (mask = 0; mask < M; mask++) {
        int32_t ng = mf_test_grouping(d, order, mask, gp);
        int64_t pk = -1, ref, plain;
        if (!ng)
            continue;
        ref = href_peak(d, r, order, gp, ng, 1);
        plain = href_peak(d, r, order, gp, ng, 0);
        if (mf_simulate(ctx, d, order, gp, ng, &pk, NULL, NULL) != MF_OK || pk != ref) {
            if (!mismatches++)
                fprintf(stderr, "heads %d: grouping %u: simulated %lld, reference %lld (%s)\n", t,
                        (unsigned)mask, (long long)pk, (long long)ref, ctx->err);
            continue;
        }
        *least = ref < *least ? ref : *least;
        *least_plain = plain < *least_plain ? plain : *least_plain;
    }
    HCHECK(mismatches == 0, "heads %d: %d groupings where the simulator and the reference differ", t, mismatches);
}

int mf_test_heads(int *checks)
{
    int t, planned = 0, lowered = 0;
    for (t = 0; t < 500; t++) {
        mf_gbuf b;
        mf_graph_desc d;
        mf_ctx ctx;
        mf_plan_options opt;
        mf_plan_result res;
        href r;
        int64_t least, least_plain;
        random_graph(&b, 2 + h_int(HMAX - 1));
        mf_gbuf_desc(&b, &d);
        mf_ctx_init(&ctx, NULL);
        if (mf_graph_check(&ctx, &d) != MF_OK) {
            mf_gbuf_free(&b);
            continue;
        }
        memset(&opt, 0, sizeof opt);
        opt.fuse = 1;
        if (mf_plan(&ctx, &d, &opt, &res) != MF_OK) {
            HCHECK(0, "heads %d: plan failed: %s", t, ctx.err);
            mf_gbuf_free(&b);
            continue;
        }
        planned++;
        href_build(&d, &r);
        all_groupings(&ctx, &d, &r, res.order, t, &least, &least_plain);
        HCHECK(res.peak_bytes == least, "heads %d: plan's peak %lld, least over its order's groupings %lld", t,
               (long long)res.peak_bytes, (long long)least);
        HCHECK(least <= least_plain, "heads %d: the rule raised the least peak (%lld > %lld)", t,
               (long long)least, (long long)least_plain);
        lowered += least < least_plain;
        mf_plan_result_free(&ctx, &res);
        mf_gbuf_free(&b);
    }
    /* without graphs where the rule lowers the peak, the checks above would prove nothing of it */
    HCHECK(lowered >= planned / 20, "the rule lowered the least peak on only %d of %d orders", lowered, planned);
    printf("reuse credit: %d random graphs planned, the rule lowered %d (%d checks, %d failures)\n", planned,
           lowered, h_checks, h_failures);
    *checks += h_checks;
    return h_failures;
}
