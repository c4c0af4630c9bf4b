/*
 * mf_order.c -- orders of a planning graph: the baseline order and the
 * validation of a given order with a message naming the first problem.
 *
 * NOTE [baseline order]
 * baseline_peak_bytes must score a valid order, or it could sit below the
 * lower bound and a plan could look worse than "doing nothing".  The
 * baseline is the input order 0..n-1 made valid by a stable topological
 * sort: Kahn's algorithm that always runs the ready op with the smallest id.
 * When 0..n-1 is valid it is that order itself (at step i ops 0..i-1 have
 * run, op i is ready and no smaller id is left); otherwise each op runs as
 * early in the input order as its dependencies allow.  The scheduler uses it
 * as its "input" candidate, so a plan is never worse than the baseline.
 */
#include "mf_internal.h"

#include <string.h>

/* min-heap of op ids */
static void heap_push(int32_t *h, int32_t *n, int32_t v)
{
    int32_t i = (*n)++;
    while (i > 0) {
        int32_t p = (i - 1) / 2;
        if (h[p] <= v)
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static int32_t heap_pop(int32_t *h, int32_t *n)
{
    int32_t top = h[0], e, i = 0, m = --(*n);
    if (m == 0)
        return top;
    e = h[m];
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= m)
            break;
        if (c + 1 < m && h[c + 1] < h[c])
            c++;
        if (h[c] >= e)
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = e;
    return top;
}

int mf_baseline_order(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, int32_t *order)
{
    int32_t n = pg->n, k, j, hn = 0, o = 0;
    int32_t *indeg = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    int32_t *h = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    if (!indeg || !h)
        return MF_ENOMEM;
    for (k = 0; k < n; k++) {
        indeg[k] = pg->pred_ptr[k + 1] - pg->pred_ptr[k];
        if (!indeg[k])
            heap_push(h, &hn, k);
    }
    while (hn > 0) {
        int32_t v = heap_pop(h, &hn);
        order[o++] = v;
        for (j = pg->succ_ptr[v]; j < pg->succ_ptr[v + 1]; j++)
            if (--indeg[pg->succ[j]] == 0)
                heap_push(h, &hn, pg->succ[j]);
    }
    if (o != n) /* mf_graph_check rejected cycles */
        return mf_set_error(ctx, MF_EINTERNAL, "baseline order: %d of %d ops sorted", (int)o, (int)n);
    return MF_OK;
}

int mf_pg_order_check(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, const int32_t *order, const char *what)
{
    int32_t n = pg->n, i, j;
    int32_t *pos = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    if (!pos)
        return MF_ENOMEM;
    for (i = 0; i < n; i++)
        pos[i] = -1;
    for (i = 0; i < n; i++) {
        int32_t v = order[i];
        if (v < 0 || v >= n)
            return mf_set_error(ctx, MF_EINVAL, "%s[%d] = %d is out of range [0, %d)", what, (int)i, (int)v,
                                (int)n);
        if (pos[v] >= 0)
            return mf_set_error(ctx, MF_EINVAL, "%s is not a permutation: op %d appears twice (positions %d and %d)",
                                what, (int)v, (int)pos[v], (int)i);
        pos[v] = i;
    }
    for (i = 0; i < n; i++) {
        int32_t v = order[i];
        for (j = pg->pred_ptr[v]; j < pg->pred_ptr[v + 1]; j++)
            if (pos[pg->pred[j]] > i)
                return mf_set_error(ctx, MF_EINVAL,
                                    "%s breaks a dependency: op %d (position %d) runs before op %d (position "
                                    "%d), which it depends on (dataflow, view or ordering edge)",
                                    what, (int)v, (int)i, (int)pg->pred[j], (int)pos[pg->pred[j]]);
    }
    return MF_OK;
}
