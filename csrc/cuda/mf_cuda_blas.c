/*
 * mf_cuda_blas.c -- cuBLAS (cublasGemmEx, strided batched) and cuBLASLt (one
 * matmul with a fused epilogue) on the caller's stream, in the device's
 * primary context (mf_cuda_driver.c), with one handle per device and library
 * (NOTE [per-device handles]).
 */
#include "mf_cuda_internal.h"

#include <stdio.h>
#include <string.h>

/* NOTE [per-device handles]
 * One cuBLAS and one cuBLASLt handle per device, created at first use under
 * the lock with the device's primary context current (the caller has entered
 * the device), kept for the process.  A failed create is reported and tried
 * again on the next call. */
static mf_cublasHandle g_cublas_handle[MF_CUDA_MAX_DEVICES];
static mf_cublasLtHandle g_cublaslt_handle[MF_CUDA_MAX_DEVICES];

typedef int (*blas_error_fn)(mf_cuda_ctx *ctx, int status, mf_cublasStatus s, const char *what);

/* *out = the handle in *slot, created by create() first if there is none.
 * Lock held, device entered. */
static int device_handle(mf_cuda_ctx *ctx, void **slot, mf_cublasStatus (*create)(void **),
                         blas_error_fn error, const char *what, void **out)
{
    if (!*slot) {
        mf_cublasStatus s = create(slot);
        if (s != 0) {
            *slot = NULL;
            return error(ctx, MF_CUDA_ECUBLAS, s, what);
        }
    }
    *out = *slot;
    return MF_OK;
}

/* ---- cuBLAS ---------------------------------------------------------------- */

static int cublas_error(mf_cuda_ctx *ctx, int status, mf_cublasStatus s, const char *what)
{
    const char *text = mf_cuda_cublas()->cublasGetStatusString ? mf_cuda_cublas()->cublasGetStatusString(s) : NULL;
    return mf_cuda_set_error(ctx, status, "%s failed: status %d (%s)", what, s, text ? text : "cuBLAS error");
}

int mf_cuda_cublas_version(void)
{
    int major = -1, minor = 0, patch = 0;
    if (mf_cuda_load(MF_CUDA_LIB_CUBLAS, NULL) != MF_OK || !mf_cuda_cublas()->cublasGetProperty)
        return -1;
    /* libraryPropertyType: MAJOR_VERSION 0, MINOR_VERSION 1, PATCH_LEVEL 2 */
    if (mf_cuda_cublas()->cublasGetProperty(0, &major) != 0 || mf_cuda_cublas()->cublasGetProperty(1, &minor) != 0 ||
        mf_cuda_cublas()->cublasGetProperty(2, &patch) != 0)
        return -1;
    return major * 10000 + minor * 100 + patch;
}

int mf_cuda_gemm_run(const mf_cuda_gemm *g, mf_cuda_ctx *ctx)
{
    mf_cublasStatus s;
    int rc, compute;
    float alpha32 = (float)g->alpha, beta32 = (float)g->beta;
    const void *alpha, *beta;
    mf_cublasHandle h = NULL;
    mf_CUcontext prev = NULL;

    switch (g->dtype) {
    case MF_CUDA_R_32F:
        compute = g->allow_tf32 ? MF_CUBLAS_COMPUTE_32F_FAST_TF32 : MF_CUBLAS_COMPUTE_32F;
        alpha = &alpha32;
        beta = &beta32;
        break;
    case MF_CUDA_R_16F:
    case MF_CUDA_R_16BF:
        compute = MF_CUBLAS_COMPUTE_32F;
        alpha = &alpha32;
        beta = &beta32;
        break;
    case MF_CUDA_R_64F:
        compute = MF_CUBLAS_COMPUTE_64F;
        alpha = &g->alpha;
        beta = &g->beta;
        break;
    default:
        return mf_cuda_set_error(ctx, MF_EINVAL, "cuBLAS GEMM: unsupported data type %d", g->dtype);
    }
    if (g->m < 0 || g->n < 0 || g->k < 0 || g->batch < 1) {
        return mf_cuda_set_error(ctx, MF_EINVAL, "cuBLAS GEMM: bad sizes m=%d n=%d k=%d batch=%d", g->m, g->n, g->k,
                g->batch);
    }
    /* The handle is shared per device: set stream, workspace and run under
     * the lock so two threads never interleave on it. */
    rc = mf_cuda_enter_device(MF_CUDA_LIB_CUBLAS, g->device, NULL, &prev, ctx);
    if (rc != MF_OK)
        return rc;
    rc = device_handle(ctx, &g_cublas_handle[g->device], mf_cuda_cublas()->cublasCreate, cublas_error,
                       "cublasCreate", &h);
    if (rc != MF_OK)
        goto done;
    s = mf_cuda_cublas()->cublasSetStream(h, g->stream);
    if (s != 0) {
        rc = cublas_error(ctx, MF_CUDA_ECUBLAS, s, "cublasSetStream");
        goto done;
    }
    /* NOTE [cublas workspace]: cublasSetStream resets the workspace to
     * cuBLAS's own pool; hand it PyTorch's buffer afterwards so that every
     * byte is visible to torch.cuda.max_memory_allocated. */
    if (g->workspace && g->workspace_bytes && mf_cuda_cublas()->cublasSetWorkspace) {
        s = mf_cuda_cublas()->cublasSetWorkspace(h, g->workspace, g->workspace_bytes);
        if (s != 0) {
            rc = cublas_error(ctx, MF_CUDA_ECUBLAS, s, "cublasSetWorkspace");
            goto done;
        }
    }
    if (g->batch == 1)
        s = mf_cuda_cublas()->cublasGemmEx(h, g->transa, g->transb, g->m, g->n, g->k, alpha, g->A, g->dtype,
                                  g->lda, g->B, g->dtype, g->ldb, beta, g->C, g->dtype, g->ldc,
                                  compute, MF_CUBLAS_GEMM_DEFAULT);
    else
        s = mf_cuda_cublas()->cublasGemmStridedBatchedEx(
            h, g->transa, g->transb, g->m, g->n, g->k, alpha, g->A, g->dtype, g->lda, g->stride_a,
            g->B, g->dtype, g->ldb, g->stride_b, beta, g->C, g->dtype, g->ldc, g->stride_c,
            g->batch, compute, MF_CUBLAS_GEMM_DEFAULT);
    if (s != 0) {
        rc = cublas_error(ctx, MF_CUDA_ECUBLAS, s, g->batch == 1 ? "cublasGemmEx" : "cublasGemmStridedBatchedEx");
    }
done:
    mf_cuda_leave_device(g->device, prev);
    return rc;
}

/* ---- cuBLASLt ---------------------------------------------------------------- */

static int cublaslt_error(mf_cuda_ctx *ctx, int status, mf_cublasStatus s, const char *what)
{
    const char *text = mf_cuda_cublaslt()->cublasLtGetStatusString ? mf_cuda_cublaslt()->cublasLtGetStatusString(s) : NULL;
    return mf_cuda_set_error(ctx, status, "%s failed: status %d (%s)", what, s, text ? text : "cuBLAS error");
}

long long mf_cuda_cublaslt_version(void)
{
    if (mf_cuda_load(MF_CUDA_LIB_CUBLASLT, NULL) != MF_OK || !mf_cuda_cublaslt()->cublasLtGetVersion)
        return -1;
    return (long long)mf_cuda_cublaslt()->cublasLtGetVersion();
}

static const char *lt_dtype_name(int dtype)
{
    switch (dtype) {
    case MF_CUDA_R_32F: return "float32";
    case MF_CUDA_R_16F: return "float16";
    case MF_CUDA_R_16BF: return "bfloat16";
    default: return "?";
    }
}

/* The largest power of two dividing the address, at most 256 (the alignment
 * the heuristic assumes by default, NOTE [cublasLt header facts]). */
static uint32_t ptr_alignment(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 1;
    while (al < 256 && (a & al) == 0)
        al <<= 1;
    return al;
}

/* Argument checks of mf_cuda_lt_matmul_run, before any library is opened. */
static int check_lt_args(const mf_cuda_lt_matmul *g, mf_cuda_ctx *ctx)
{
    int rows_a, rows_b;
    if (g->dtype != MF_CUDA_R_32F && g->dtype != MF_CUDA_R_16F && g->dtype != MF_CUDA_R_16BF) {
        return mf_cuda_set_error(ctx, MF_EINVAL, "cuBLASLt matmul: unsupported data type %d", g->dtype);
    }
    if (g->act != MF_CUDA_ACT_NONE && g->act != MF_CUDA_ACT_RELU) {
        return mf_cuda_set_error(ctx, MF_EINVAL, "cuBLASLt matmul: unsupported activation %d", g->act);
    }
    if ((g->transa != MF_CUBLAS_OP_N && g->transa != MF_CUBLAS_OP_T) ||
        (g->transb != MF_CUBLAS_OP_N && g->transb != MF_CUBLAS_OP_T)) {
        return mf_cuda_set_error(ctx, MF_EINVAL, "cuBLASLt matmul: transa/transb must be 0 (N) or 1 (T), not %d/%d",
                g->transa, g->transb);
    }
    if (g->m < 1 || g->n < 1 || g->k < 1 || g->batch < 1) {
        return mf_cuda_set_error(ctx, MF_EINVAL, "cuBLASLt matmul: bad sizes m=%d n=%d k=%d batch=%d (all must be >= 1)",
                g->m, g->n, g->k, g->batch);
    }
    /* Column order: ld >= rows of the matrix as stored (before op). */
    rows_a = g->transa == MF_CUBLAS_OP_N ? g->m : g->k;
    rows_b = g->transb == MF_CUBLAS_OP_N ? g->k : g->n;
    if (g->lda < rows_a || g->ldb < rows_b || g->ldd < g->m) {
        return mf_cuda_set_error(ctx, MF_EINVAL,
                "cuBLASLt matmul: leading dimensions too small: lda=%d (>= %d), ldb=%d (>= %d), ldd=%d (>= %d)",
                g->lda, rows_a, g->ldb, rows_b, g->ldd, g->m);
    }
    if (g->stride_a < 0 || g->stride_b < 0 || g->stride_d < 0 || (g->batch > 1 && g->stride_d == 0)) {
        return mf_cuda_set_error(ctx, MF_EINVAL, "cuBLASLt matmul: bad batch strides %lld/%lld/%lld (D needs its own matrices)",
                g->stride_a, g->stride_b, g->stride_d);
    }
    if (!g->A || !g->B || !g->D) {
        return mf_cuda_set_error(ctx, MF_EINVAL, "cuBLASLt matmul: null matrix pointer");
    }
    if (!g->workspace && g->workspace_bytes) {
        return mf_cuda_set_error(ctx, MF_EINVAL, "cuBLASLt matmul: %zu workspace bytes at a null pointer", g->workspace_bytes);
    }
    return MF_OK;
}

/* Operation descriptor: compute/scale type, transposes, epilogue, bias.
 * *out is set as soon as it exists, so the caller destroys it on failure too.
 * Lock held, cuBLASLt loaded. */
static mf_cublasStatus make_lt_desc(const mf_cuda_lt_matmul *g, mf_cublasLtMatmulDesc *out, const char **what)
{
    const mf_cuda_cublaslt_api *lt = mf_cuda_cublaslt();
    int compute = g->dtype == MF_CUDA_R_32F && g->allow_tf32 ? MF_CUBLAS_COMPUTE_32F_FAST_TF32
                                                             : MF_CUBLAS_COMPUTE_32F;
    int32_t transa = g->transa, transb = g->transb;
    uint32_t epilogue;
    mf_cublasStatus s;

    if (g->bias)
        epilogue = g->act == MF_CUDA_ACT_RELU ? MF_CUBLASLT_EPILOGUE_RELU_BIAS : MF_CUBLASLT_EPILOGUE_BIAS;
    else
        epilogue = g->act == MF_CUDA_ACT_RELU ? MF_CUBLASLT_EPILOGUE_RELU : MF_CUBLASLT_EPILOGUE_DEFAULT;
    *what = "cublasLtMatmulDescCreate";
    s = lt->cublasLtMatmulDescCreate(out, compute, MF_CUDA_R_32F);
    if (s != 0) {
        *out = NULL;
        return s;
    }
    *what = "cublasLtMatmulDescSetAttribute(TRANSA)";
    s = lt->cublasLtMatmulDescSetAttribute(*out, MF_CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa);
    if (s != 0)
        return s;
    *what = "cublasLtMatmulDescSetAttribute(TRANSB)";
    s = lt->cublasLtMatmulDescSetAttribute(*out, MF_CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb);
    if (s != 0)
        return s;
    *what = "cublasLtMatmulDescSetAttribute(EPILOGUE)";
    s = lt->cublasLtMatmulDescSetAttribute(*out, MF_CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue);
    if (s != 0 || !g->bias)
        return s;
    *what = "cublasLtMatmulDescSetAttribute(BIAS_POINTER)";
    return lt->cublasLtMatmulDescSetAttribute(*out, MF_CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                              sizeof g->bias);
}

/* A column-order layout of rows x cols with leading dimension ld, batched
 * when batch > 1.  *out as in make_lt_desc. */
static mf_cublasStatus make_lt_layout(int dtype, int rows, int cols, int ld, int batch, long long stride,
                                      mf_cublasLtMatrixLayout *out, const char **what)
{
    const mf_cuda_cublaslt_api *lt = mf_cuda_cublaslt();
    int32_t count = batch;
    int64_t offset = stride;
    mf_cublasStatus s;
    *what = "cublasLtMatrixLayoutCreate";
    s = lt->cublasLtMatrixLayoutCreate(out, dtype, (uint64_t)rows, (uint64_t)cols, (int64_t)ld);
    if (s != 0)
        *out = NULL;
    if (s != 0 || batch == 1)
        return s;
    *what = "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)";
    s = lt->cublasLtMatrixLayoutSetAttribute(*out, MF_CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count);
    if (s != 0)
        return s;
    *what = "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)";
    return lt->cublasLtMatrixLayoutSetAttribute(*out, MF_CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &offset,
                                                sizeof offset);
}

/* Heuristic preferences: the workspace we have and the pointers' real
 * alignments.  *out as in make_lt_desc. */
static mf_cublasStatus make_lt_pref(const mf_cuda_lt_matmul *g, mf_cublasLtMatmulPreference *out,
                                    const char **what)
{
    const mf_cuda_cublaslt_api *lt = mf_cuda_cublaslt();
    uint64_t ws = g->workspace ? (uint64_t)g->workspace_bytes : 0;
    uint32_t al[4];
    int attrs[4] = {MF_CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, MF_CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    MF_CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, MF_CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    mf_cublasStatus s;
    int i;
    al[0] = ptr_alignment(g->A);
    al[1] = ptr_alignment(g->B);
    al[2] = al[3] = ptr_alignment(g->D); /* C is D */
    *what = "cublasLtMatmulPreferenceCreate";
    s = lt->cublasLtMatmulPreferenceCreate(out);
    if (s != 0) {
        *out = NULL;
        return s;
    }
    *what = "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)";
    s = lt->cublasLtMatmulPreferenceSetAttribute(*out, MF_CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    for (i = 0; i < 4 && s == 0; i++) {
        *what = "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)";
        s = lt->cublasLtMatmulPreferenceSetAttribute(*out, attrs[i], &al[i], sizeof al[i]);
    }
    return s;
}

/* NOTE [cublasLt matmul]
 * One mf_cuda_lt_matmul_run is one cublasLtMatmul on the caller's stream:
 *  - One cuBLASLt handle per device, created at first use under the lock
 *    with the device's primary context current.  A cuBLASLt handle holds no
 *    stream or workspace (both are cublasLtMatmul arguments), so unlike the
 *    cuBLAS handle nothing is set on it per call.
 *  - The operation descriptor, the three layouts (C uses D's: beta is 0 and C
 *    is D) and the preference are created for this call and destroyed before
 *    it returns, on every path: nothing is cached, so nothing can go stale or
 *    leak.  Their cost is host work of a few microseconds.
 *  - The heuristic is asked for one algorithm, with max workspace = the
 *    workspace given (PyTorch's buffer, NOTE [cublas workspace]) and the real
 *    alignment of A, B and D; none (or CUBLAS_STATUS_NOT_SUPPORTED) is
 *    MF_CUDA_ENOALGO with the problem spelled out, so the caller can fall back.
 *  - The lock is held from the context switch to the (asynchronous) launch,
 *    as in mf_cuda_gemm_run, and the thread's context is put back
 *    (NOTE [current context]).
 */
int mf_cuda_lt_matmul_run(const mf_cuda_lt_matmul *g, mf_cuda_ctx *ctx)
{
    mf_cublasLtMatmulDesc desc = NULL;
    mf_cublasLtMatrixLayout la = NULL, lb = NULL, ld = NULL;
    mf_cublasLtMatmulPreference pref = NULL;
    mf_cublasLtHeuristicResult heur;
    mf_cublasLtHandle h = NULL;
    mf_CUcontext prev = NULL;
    mf_cublasStatus s;
    const char *what = "cuBLASLt";
    float alpha = 1.0f, beta = 0.0f;
    int rc, returned = 0;

    rc = check_lt_args(g, ctx);
    if (rc != MF_OK)
        return rc;
    rc = mf_cuda_enter_device(MF_CUDA_LIB_CUBLASLT, g->device, NULL, &prev, ctx);
    if (rc != MF_OK)
        return rc;
    rc = device_handle(ctx, &g_cublaslt_handle[g->device], mf_cuda_cublaslt()->cublasLtCreate, cublaslt_error,
                       "cublasLtCreate", &h);
    if (rc != MF_OK)
        goto done;

    s = make_lt_desc(g, &desc, &what);
    if (s == 0)
        s = make_lt_layout(g->dtype, g->transa == MF_CUBLAS_OP_N ? g->m : g->k,
                           g->transa == MF_CUBLAS_OP_N ? g->k : g->m, g->lda, g->batch, g->stride_a, &la, &what);
    if (s == 0)
        s = make_lt_layout(g->dtype, g->transb == MF_CUBLAS_OP_N ? g->k : g->n,
                           g->transb == MF_CUBLAS_OP_N ? g->n : g->k, g->ldb, g->batch, g->stride_b, &lb, &what);
    if (s == 0)
        s = make_lt_layout(g->dtype, g->m, g->n, g->ldd, g->batch, g->stride_d, &ld, &what);
    if (s == 0)
        s = make_lt_pref(g, &pref, &what);
    if (s != 0) {
        rc = cublaslt_error(ctx, MF_CUDA_ECUBLAS, s, what);
        goto release;
    }

    memset(&heur, 0, sizeof heur);
    s = mf_cuda_cublaslt()->cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, 1, &heur, &returned);
    if (s != 0 && s != MF_CUBLAS_STATUS_NOT_SUPPORTED) {
        rc = cublaslt_error(ctx, MF_CUDA_ECUBLAS, s, "cublasLtMatmulAlgoGetHeuristic");
        goto release;
    }
    if (s != 0 || returned < 1 || heur.state != 0) {
        rc = mf_cuda_set_error(ctx, MF_CUDA_ENOALGO,
                "cublasLtMatmulAlgoGetHeuristic found no algorithm (status %d, %d returned, state %d) for "
                "%s m=%d n=%d k=%d batch=%d trans=%c%c lda=%d ldb=%d ldd=%d epilogue=%s%s, "
                "%zu workspace bytes, alignments A=%u B=%u D=%u",
                s, returned, returned > 0 ? heur.state : -1, lt_dtype_name(g->dtype), g->m, g->n, g->k,
                g->batch, g->transa ? 'T' : 'N', g->transb ? 'T' : 'N', g->lda, g->ldb, g->ldd,
                g->act == MF_CUDA_ACT_RELU ? "relu" : "none", g->bias ? "+bias" : "",
                g->workspace ? g->workspace_bytes : (size_t)0, (unsigned)ptr_alignment(g->A),
                (unsigned)ptr_alignment(g->B), (unsigned)ptr_alignment(g->D));
        goto release;
    }
    s = mf_cuda_cublaslt()->cublasLtMatmul(h, desc, &alpha, g->A, la, g->B, lb, &beta, g->D, ld, g->D, ld, &heur.algo,
                                  g->workspace_bytes ? g->workspace : NULL,
                                  g->workspace ? g->workspace_bytes : 0, g->stream);
    if (s != 0) {
        rc = cublaslt_error(ctx, MF_CUDA_ECUBLAS, s, "cublasLtMatmul");
    }
release:
    if (pref)
        (void)mf_cuda_cublaslt()->cublasLtMatmulPreferenceDestroy(pref);
    if (ld)
        (void)mf_cuda_cublaslt()->cublasLtMatrixLayoutDestroy(ld);
    if (lb)
        (void)mf_cuda_cublaslt()->cublasLtMatrixLayoutDestroy(lb);
    if (la)
        (void)mf_cuda_cublaslt()->cublasLtMatrixLayoutDestroy(la);
    if (desc)
        (void)mf_cuda_cublaslt()->cublasLtMatmulDescDestroy(desc);
done:
    mf_cuda_leave_device(g->device, prev);
    return rc;
}
