/*
 * test_util.h -- what every C test file shares: the check macro and a counting
 * allocator that can fail the Nth request.  Each file keeps its own counters
 * (its summary line reports them) and defines its CHECK name on MF_TEST_CHECK.
 */
#ifndef MF_TEST_UTIL_H
#define MF_TEST_UTIL_H

#include <stddef.h>
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

#endif
