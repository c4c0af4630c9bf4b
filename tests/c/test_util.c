/* test_util.c -- the counting, failing allocator of test_util.h. */
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
