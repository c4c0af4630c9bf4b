/*
 * test_util.h -- what every C test file shares: the check macro and a counting
 * allocator that can fail the Nth request.  Each file keeps its own counters
 * (its summary line reports them) and defines its CHECK name on MF_TEST_CHECK.
 */
#ifndef MF_TEST_UTIL_H
#define MF_TEST_UTIL_H

#include "mf_build.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define MF_TEST_CHECK(checks, failures, cond, ...)                                      \
    do {                                                                                \
        (checks)++;                                                                     \
        if (!(cond)) {                                                                  \
            (failures)++;                                                               \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                               \
            fprintf(stderr, "\n");                                                      \
        }                                                                               \
    } while (0)

/* An mf_allocator's state: count requests, fail the fail_at-th (1-based; <= 0:
 * never), and track live blocks so a test can check nothing leaked. */
typedef struct mf_talloc {
    long count, fail_at, live;
} mf_talloc;

void *mf_talloc_alloc(void *ud, size_t n); /* ud: an mf_talloc */
void mf_talloc_free(void *ud, void *p);

/* xorshift64 on *state (nonzero): a number in [0, n).  Each test file keeps its own state and seed. */
int mf_test_rand(uint64_t *state, int n);

/* The grouping of `order` (d's n_ops ops) that mask gives: a group starts at position i > 0 where bit
 * i - 1 is set.  Fills gp (n_ops + 1 entries) and returns the group count, or 0 where a group of two
 * or more ops holds one d calls unfusible. */
int32_t mf_test_grouping(const mf_graph_desc *d, const int32_t *order, uint32_t mask, int32_t *gp);

/* Inside b's open op: read base and make a view of it (a value of base's size aliasing it). */
int32_t mf_test_view_of(mf_gbuf *b, int32_t base);

#endif
