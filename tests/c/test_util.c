/* test_util.c -- what test_util.h declares: the counting, failing allocator, the random numbers and
 * the groupings of an order. */
#include "test_util.h"

#include <stdlib.h>

void *mf_talloc_alloc(void *ud, size_t n)
{
    mf_talloc *t = (mf_talloc *)ud;
    void *p;
    if (++t->count == t->fail_at && t->fail_at > 0)
        return NULL;
    p = malloc(n ? n : 1);
    if (p)
        t->live++;
    return p;
}

void mf_talloc_free(void *ud, void *p)
{
    mf_talloc *t = (mf_talloc *)ud;
    if (p) {
        t->live--;
        free(p);
    }
}

int mf_test_rand(uint64_t *state, int n)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (int)(*state % (uint64_t)n);
}

int32_t mf_test_grouping(const mf_graph_desc *d, const int32_t *order, uint32_t mask, int32_t *gp)
{
    int32_t n = d->n_ops, ng = 0, i, j;
    gp[0] = 0;
    for (i = 1; i <= n; i++)
        if (i == n || (mask >> (i - 1) & 1))
            gp[++ng] = i;
    for (i = 0; i < ng; i++)
        if (gp[i + 1] - gp[i] >= 2)
            for (j = gp[i]; j < gp[i + 1]; j++)
                if (!d->fusible[order[j]])
                    return 0;
    return ng;
}

int32_t mf_test_view_of(mf_gbuf *b, int32_t base)
{
    int32_t v = mf_gbuf_add_value(b, b->value_bytes[base], 0);
    b->alias_of[v] = base;
    mf_gbuf_op_in(b, base);
    mf_gbuf_op_out(b, v);
    return v;
}
