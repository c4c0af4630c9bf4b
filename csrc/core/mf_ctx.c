/*
 * mf_ctx.c -- context, allocator and error message; the per-call arena.
 *
 * Invariants: every byte the core allocates goes through ctx->alloc (a zeroed
 * allocator means malloc/free), so a test allocator can fail the Nth request.
 * mf_alloc never returns NULL without a message in ctx->err.  No global
 * mutable state: the core is thread-safe as long as each thread has its ctx.
 */
#include "mf_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *default_alloc(void *ud, size_t n)
{
    (void)ud;
    return malloc(n);
}

static void default_free(void *ud, void *p)
{
    (void)ud;
    free(p);
}

void mf_ctx_init(mf_ctx *ctx, const mf_allocator *alloc)
{
    memset(ctx, 0, sizeof *ctx);
    if (alloc && alloc->alloc && alloc->free) {
        ctx->alloc = *alloc;
    } else {
        ctx->alloc.alloc = default_alloc;
        ctx->alloc.free = default_free;
        ctx->alloc.ud = NULL;
    }
}

int mf_set_error(mf_ctx *ctx, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
    va_end(ap);
    return status;
}

void *mf_alloc(mf_ctx *ctx, size_t nbytes)
{
    void *p;
    if (!ctx->alloc.alloc) /* a zeroed ctx that skipped mf_ctx_init */
        mf_ctx_init(ctx, NULL);
    /* NOTE [zero-size allocations]: malloc(0) may legally return NULL, which
     * would read as a failure; ask for one byte instead. */
    p = ctx->alloc.alloc(ctx->alloc.ud, nbytes ? nbytes : 1);
    if (!p)
        mf_set_error(ctx, MF_ENOMEM, "out of memory (allocating %zu bytes)", nbytes);
    return p;
}

void *mf_calloc(mf_ctx *ctx, size_t n, size_t size)
{
    void *p;
    if (size && n > (size_t)-1 / size) {
        mf_set_error(ctx, MF_ENOMEM, "out of memory (%zu x %zu bytes overflows)", n, size);
        return NULL;
    }
    p = mf_alloc(ctx, n * size);
    if (p)
        memset(p, 0, (n * size) != 0 ? n * size : 1);
    return p;
}

void mf_free(mf_ctx *ctx, void *p)
{
    if (!p)
        return;
    if (!ctx->alloc.free) {
        free(p);
        return;
    }
    ctx->alloc.free(ctx->alloc.ud, p);
}

int mf_poll(mf_ctx *ctx)
{
    if (ctx->cancel && ctx->cancel(ctx->cancel_ud))
        return mf_set_error(ctx, MF_ECANCEL, "cancelled");
    return MF_OK;
}

/* ---- growable scratch ---- */

size_t mf_grow_cap(size_t cap, size_t need, size_t elem)
{
    size_t nc;
    if (need <= cap)
        return cap;
    nc = cap ? cap : 64;
    while (nc < need) {
        if (nc > ((size_t)-1 / 2) / elem)
            return (size_t)-1;
        nc *= 2;
    }
    return nc > (size_t)-1 / elem ? (size_t)-1 : nc;
}

int mf_grow(mf_ctx *ctx, void **p, size_t *cap, size_t need, size_t elem, int keep)
{
    size_t nc;
    void *q;
    if (need <= *cap && *p)
        return MF_OK;
    nc = mf_grow_cap(*cap, need, elem);
    if (nc == (size_t)-1)
        return mf_set_error(ctx, MF_ENOMEM, "out of memory (scratch of %zu elements)", need);
    q = mf_alloc(ctx, nc * elem);
    if (!q)
        return MF_ENOMEM;
    if (keep && *p && *cap)
        memcpy(q, *p, *cap * elem);
    mf_free(ctx, *p);
    *p = q;
    *cap = nc;
    return MF_OK;
}

/* ---- arena ---- */

/* NOTE [arena header]: each block starts with a header padded to the
 * strictest alignment we store (int64 / pointers), so the payload that
 * follows is suitably aligned for any array the core keeps. */
typedef union blk_hdr {
    void *next;
    int64_t align_i;
    double align_d;
    void *align_p;
    char pad[16];
} blk_hdr;

void *mf_arena_array(mf_ctx *ctx, mf_arena *a, size_t count, size_t size)
{
    size_t bytes;
    blk_hdr *h;
    if (size && count > ((size_t)-1 - sizeof(blk_hdr)) / size) {
        mf_set_error(ctx, MF_ENOMEM, "out of memory (%zu x %zu bytes overflows)", count, size);
        return NULL;
    }
    bytes = count * size;
    h = (blk_hdr *)mf_alloc(ctx, sizeof(blk_hdr) + bytes);
    if (!h)
        return NULL;
    memset(h + 1, 0, bytes);
    h->next = a->head;
    a->head = h;
    return h + 1;
}

void mf_arena_release(mf_ctx *ctx, mf_arena *a)
{
    blk_hdr *h = (blk_hdr *)a->head;
    while (h) {
        blk_hdr *nx = (blk_hdr *)h->next;
        mf_free(ctx, h);
        h = nx;
    }
    a->head = NULL;
}
