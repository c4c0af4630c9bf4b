/*
 * fake_cublaslt.c -- a stand-in libcublasLt.so.13 for CPU tests of
 * mf_cuda_lt_matmul_run (built by tests/test_cublaslt.py).
 *
 * It exports the entry points of MF_CUDA_CUBLASLT_SYMBOLS with the signatures
 * of cublasLt.h and behaves as the header documents them (csrc/cuda/mf_cuda.h
 * NOTE [cublasLt header facts]):
 *  - SetAttribute checks the size of each attribute's own type and rejects
 *    attributes we do not expect (status 7, CUBLAS_STATUS_INVALID_VALUE);
 *  - cublasLtMatmul checks that the layouts agree with op(A) (m x k), op(B)
 *    (k x n) and D (m x n), ld >= rows, equal batch counts, alpha 1 and beta 0,
 *    and then computes D = epilogue(op(A) op(B) [+ bias]) in float on HOST
 *    memory (the tests pass CPU tensors' pointers), column-major, with the
 *    bias added per row of D;
 *  - every object created is counted until destroyed (leak checks), and a test
 *    can make the n-th call fail or the heuristic find nothing.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define INVALID 7
#define NOT_SUPPORTED 15

typedef struct desc { int compute, scale, transa, transb; uint32_t epilogue; const void *bias; } desc;
typedef struct layout { int type; uint64_t rows, cols; int64_t ld; int32_t batch; int64_t stride; } layout;
typedef struct pref { uint64_t ws; uint32_t align[4]; } pref;
typedef struct algo { uint64_t data[8]; } algo;
typedef struct heur { algo a; size_t ws; int state; float waves; int reserved[4]; } heur;

static int live, creates, calls, fail_at, no_algo, not_supported;
static char last[1024];

/* Counts a call; 1 when it must fail (fake_lt_fail_at). */
static int failing(void)
{
    calls++;
    return fail_at > 0 && calls == fail_at;
}

EXPORT int cublasLtCreate(void **h)
{
    static int handle;
    if (failing())
        return 3; /* CUBLAS_STATUS_ALLOC_FAILED */
    creates++;
    *h = &handle;
    return 0;
}
EXPORT size_t cublasLtGetVersion(void) { return 990102; }
EXPORT const char *cublasLtGetStatusString(int s) { return s == INVALID ? "FAKE_INVALID_VALUE" : "FAKE_STATUS"; }

EXPORT int cublasLtMatmulDescCreate(desc **d, int compute, int scale)
{
    if (failing())
        return 3;
    *d = calloc(1, sizeof **d);
    (*d)->compute = compute;
    (*d)->scale = scale;
    (*d)->epilogue = 1;
    live++;
    return 0;
}
EXPORT int cublasLtMatmulDescDestroy(desc *d) { free(d); live--; return 0; }
EXPORT int cublasLtMatmulDescSetAttribute(desc *d, int attr, const void *buf, size_t size)
{
    if (failing())
        return INVALID;
    switch (attr) {
    case 3: if (size != 4) return INVALID; memcpy(&d->transa, buf, 4); return 0;
    case 4: if (size != 4) return INVALID; memcpy(&d->transb, buf, 4); return 0;
    case 7: if (size != 4) return INVALID; memcpy(&d->epilogue, buf, 4); return 0;
    case 8: if (size != sizeof(void *)) return INVALID; memcpy(&d->bias, buf, sizeof(void *)); return 0;
    default: return INVALID;
    }
}

EXPORT int cublasLtMatrixLayoutCreate(layout **l, int type, uint64_t rows, uint64_t cols, int64_t ld)
{
    if (failing())
        return 3;
    *l = calloc(1, sizeof **l);
    (*l)->type = type;
    (*l)->rows = rows;
    (*l)->cols = cols;
    (*l)->ld = ld;
    (*l)->batch = 1;
    live++;
    return 0;
}
EXPORT int cublasLtMatrixLayoutDestroy(layout *l) { free(l); live--; return 0; }
EXPORT int cublasLtMatrixLayoutSetAttribute(layout *l, int attr, const void *buf, size_t size)
{
    if (failing())
        return INVALID;
    switch (attr) {
    case 5: if (size != 4) return INVALID; memcpy(&l->batch, buf, 4); return 0;
    case 6: if (size != 8) return INVALID; memcpy(&l->stride, buf, 8); return 0;
    default: return INVALID;
    }
}

EXPORT int cublasLtMatmulPreferenceCreate(pref **p)
{
    if (failing())
        return 3;
    *p = calloc(1, sizeof **p);
    live++;
    return 0;
}
EXPORT int cublasLtMatmulPreferenceDestroy(pref *p) { free(p); live--; return 0; }
EXPORT int cublasLtMatmulPreferenceSetAttribute(pref *p, int attr, const void *buf, size_t size)
{
    if (failing())
        return INVALID;
    if (attr == 1) {
        if (size != 8) return INVALID;
        memcpy(&p->ws, buf, 8);
        return 0;
    }
    if (attr >= 5 && attr <= 8) {
        if (size != 4) return INVALID;
        memcpy(&p->align[attr - 5], buf, 4);
        return 0;
    }
    return INVALID;
}

EXPORT int cublasLtMatmulAlgoGetHeuristic(void *h, desc *d, layout *a, layout *b, layout *c, layout *dl, pref *p,
                                          int requested, heur *results, int *returned)
{
    if (failing())
        return INVALID;
    if (!h || !d || !a || !b || !c || !dl || !p || requested < 1 || !results || !returned)
        return INVALID;
    if (not_supported)
        return NOT_SUPPORTED;
    *returned = 0;
    if (no_algo)
        return 0;
    memset(results, 0, sizeof *results);
    results->a.data[0] = 0xA160;
    results->waves = 1.0f;
    *returned = 1;
    snprintf(last, sizeof last, "ws=%llu align=%u,%u,%u,%u", (unsigned long long)p->ws, p->align[0], p->align[1],
             p->align[2], p->align[3]);
    return 0;
}

static float half_to_float(uint16_t h)
{
    int e = (h >> 10) & 31, f = h & 1023;
    float v = e == 0 ? ldexpf((float)f, -24) : e == 31 ? (f ? NAN : INFINITY) : ldexpf((float)(f | 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}
static uint16_t float_to_half(float x)
{
    /* round to nearest even through double arithmetic on the scaled value */
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    float a = fabsf(x);
    int e;
    double m;
    if (isnan(x)) return 0x7e00;
    if (a >= 65520.0f) return sign | 0x7c00;
    if (a < ldexpf(1.0f, -14)) return sign | (uint16_t)nearbyint(ldexp(a, 24));
    frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    m = nearbyint(ldexp(a, 11 - e)); /* 11 significant bits */
    if (m >= 2048.0) { m /= 2.0; e++; }
    if (e - 1 + 15 >= 31) return sign | 0x7c00;
    return sign | (uint16_t)(((e - 1 + 15) << 10) | ((int)m - 1024));
}
static float load(int type, const void *p, int64_t i)
{
    uint16_t h;
    uint32_t u;
    float f;
    if (type == 0) { memcpy(&f, (const char *)p + 4 * i, 4); return f; }
    memcpy(&h, (const char *)p + 2 * i, 2);
    if (type == 2) return half_to_float(h);
    u = (uint32_t)h << 16;
    memcpy(&f, &u, 4);
    return f;
}
static void store(int type, void *p, int64_t i, float v)
{
    uint16_t h;
    uint32_t u;
    if (type == 0) { memcpy((char *)p + 4 * i, &v, 4); return; }
    if (type == 2) h = float_to_half(v);
    else {
        memcpy(&u, &v, 4);
        u += 0x7fff + ((u >> 16) & 1); /* round to nearest even */
        h = (uint16_t)(u >> 16);
    }
    memcpy((char *)p + 2 * i, &h, 2);
}

EXPORT int cublasLtMatmul(void *h, desc *d, const void *alpha, const void *A, layout *la, const void *B, layout *lb,
                          const void *beta, const void *C, layout *lc, void *D, layout *ld, const algo *al,
                          void *ws, size_t ws_bytes, void *stream)
{
    uint64_t m, n, k, ka, kb, i, j, l;
    int32_t p;
    float one, zero;
    if (failing())
        return INVALID;
    if (!h || !d || !la || !lb || !lc || !ld || !al || al->data[0] != 0xA160 || !A || !B || !D)
        return INVALID;
    memcpy(&one, alpha, 4);
    memcpy(&zero, beta, 4);
    if (one != 1.0f || zero != 0.0f || C != D || lc->rows != ld->rows || lc->cols != ld->cols)
        return INVALID;
    if (d->scale != 0 || !(d->compute == 68 || (d->compute == 77 && ld->type == 0)))
        return INVALID;
    if (la->type != ld->type || lb->type != ld->type || (ld->type != 0 && ld->type != 2 && ld->type != 14))
        return INVALID;
    m = d->transa == 0 ? la->rows : la->cols;
    ka = d->transa == 0 ? la->cols : la->rows;
    kb = d->transb == 0 ? lb->rows : lb->cols;
    n = d->transb == 0 ? lb->cols : lb->rows;
    k = ka;
    if (ka != kb || m != ld->rows || n != ld->cols)
        return INVALID;
    if (la->ld < (int64_t)la->rows || lb->ld < (int64_t)lb->rows || ld->ld < (int64_t)ld->rows)
        return INVALID;
    if (la->batch != ld->batch || lb->batch != ld->batch || (ld->batch > 1 && ld->stride == 0))
        return INVALID;
    if ((d->epilogue & 4) && !d->bias)
        return INVALID;
    if (d->epilogue != 1 && d->epilogue != 2 && d->epilogue != 4 && d->epilogue != 6)
        return INVALID;
    for (p = 0; p < ld->batch; p++)
        for (j = 0; j < n; j++)
            for (i = 0; i < m; i++) {
                float acc = 0.0f;
                for (l = 0; l < k; l++) {
                    int64_t ia = d->transa == 0 ? (int64_t)(i + l * la->ld) : (int64_t)(l + i * la->ld);
                    int64_t ib = d->transb == 0 ? (int64_t)(l + j * lb->ld) : (int64_t)(j + l * lb->ld);
                    acc += load(la->type, A, p * la->stride + ia) * load(lb->type, B, p * lb->stride + ib);
                }
                if (d->epilogue & 4)
                    acc += load(ld->type, d->bias, (int64_t)i);
                if ((d->epilogue & 2) && !(acc > 0.0f))
                    acc = acc != acc ? acc : 0.0f;
                store(ld->type, D, p * ld->stride + (int64_t)(i + j * ld->ld), acc);
            }
    snprintf(last + strlen(last), sizeof last - strlen(last),
             " compute=%d transa=%d transb=%d m=%llu n=%llu k=%llu lda=%lld ldb=%lld ldd=%lld batch=%d"
             " strides=%lld,%lld,%lld epilogue=%u bias=%d ws_ptr=%d ws_bytes=%zu stream=%p",
             d->compute, d->transa, d->transb, (unsigned long long)m, (unsigned long long)n, (unsigned long long)k,
             (long long)la->ld, (long long)lb->ld, (long long)ld->ld, ld->batch, (long long)la->stride,
             (long long)lb->stride, (long long)ld->stride, d->epilogue, d->bias != NULL, ws != NULL, ws_bytes,
             stream);
    return 0;
}

/* Test hooks. */
EXPORT int fake_lt_live(void) { return live; }
EXPORT int fake_lt_creates(void) { return creates; }
EXPORT int fake_lt_calls(void) { return calls; }
EXPORT void fake_lt_fail_at(int n) { calls = 0; fail_at = n; }
EXPORT void fake_lt_no_algo(int v) { no_algo = v; }
EXPORT void fake_lt_not_supported(int v) { not_supported = v; }
EXPORT const char *fake_lt_last(void) { return last; }
