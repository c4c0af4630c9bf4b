/*
 * mf_cuda.h -- run-time loading of the CUDA driver, NVRTC, cuBLAS and cuBLASLt,
 * and the thin driver/cuBLAS helpers the binding needs (context, module load,
 * kernel launch, GEMM, GEMM with a fused epilogue).
 *
 * Invariants:
 *  - Nothing here is linked against CUDA: every library is dlopen()ed at first
 *    use (never at import), so the extension builds and imports with no CUDA.
 *  - Every symbol we call is listed once in an X-macro below; the macro makes
 *    the function-pointer typedefs, the pointer tables and the dlsym loop.
 *  - C99, no Python.h.  Functions return an int status (MF_OK == 0) and
 *    leave a message in ctx->err on failure (NOTE [cuda errors]).
 *  - Process-wide state (library handles, per-device contexts and cuBLAS
 *    handles, the kernel cache) is guarded by one mutex, see NOTE [cuda lock].
 *
 * No CUDA header is included: the few types and enum values we need are
 * spelled out here with their documented numeric values.
 */
#ifndef MF_CUDA_H
#define MF_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "mf_core.h" /* MF_OK, MF_EINVAL, MF_ENOMEM: one status space (NOTE [cuda errors]) */

#ifdef __cplusplus
extern "C" {
#endif

/*
 * NOTE [cuda errors]
 * The core's convention (mf_core.h): every function returns an int status and
 * leaves the message of a failure in ctx->err.  The status space is the
 * core's: MF_OK, MF_EINVAL (bad argument), MF_ENOMEM, and the CUDA layer's
 * own codes below, numbered apart from the core's, so the binding turns any
 * of them into an exception in one place (csrc/python mf_py_raise_status).
 * A NULL ctx is allowed where the message is not wanted.
 */
enum {
    MF_CUDA_ENOTFOUND = 16, /* a library could not be opened */
    MF_CUDA_ESYMBOL = 17,   /* a required symbol is missing */
    MF_CUDA_EDRIVER = 18,   /* a driver call failed (message has its name) */
    MF_CUDA_ENVRTC = 19,    /* NVRTC failed outside compilation */
    MF_CUDA_ECOMPILE = 20,  /* the program did not compile (log available) */
    MF_CUDA_ECUBLAS = 21,   /* a cuBLAS call failed */
    MF_CUDA_ENODEV = 22,    /* the driver has no such device */
    MF_CUDA_ENOALGO = 23,   /* cuBLASLt's heuristic offered no algorithm */
    MF_CUDA_EUNSUPPORTED = 24 /* a case this layer does not cover: the caller falls back */
};

#define MF_CUDA_MSG_LEN 2048

typedef struct mf_cuda_ctx {
    char err[MF_CUDA_MSG_LEN]; /* message of the last failure */
} mf_cuda_ctx;

/* Format the message into ctx->err (truncated; ctx may be NULL); returns
 * status, as the core's mf_set_error. */
int mf_cuda_set_error(mf_cuda_ctx *ctx, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ---- minimal CUDA types (ABI-compatible spellings) ---------------------- */
typedef int mf_CUresult;        /* CUresult: 0 == CUDA_SUCCESS */
typedef int mf_CUdevice;
typedef void *mf_CUcontext;
typedef void *mf_CUmodule;
typedef void *mf_CUfunction;
typedef void *mf_CUstream;
typedef void *mf_nvrtcProgram;
typedef int mf_nvrtcResult;     /* 0 == NVRTC_SUCCESS */
typedef void *mf_cublasHandle;
typedef int mf_cublasStatus;    /* 0 == CUBLAS_STATUS_SUCCESS */
typedef void *mf_cublasLtHandle;           /* cublasLtHandle_t */
typedef void *mf_cublasLtMatmulDesc;       /* cublasLtMatmulDesc_t */
typedef void *mf_cublasLtMatrixLayout;     /* cublasLtMatrixLayout_t */
typedef void *mf_cublasLtMatmulPreference; /* cublasLtMatmulPreference_t */
/* cublasLtMatmulAlgo_t and cublasLtMatmulHeuristicResult_t, field for field
 * (NOTE [cublasLt header facts]). */
typedef struct mf_cublasLtMatmulAlgo {
    uint64_t data[8];
} mf_cublasLtMatmulAlgo;
typedef struct mf_cublasLtHeuristicResult {
    mf_cublasLtMatmulAlgo algo;
    size_t workspace_size;
    mf_cublasStatus state;
    float waves_count;
    int reserved[4];
} mf_cublasLtHeuristicResult;

/* Device attributes (CUdevice_attribute). */
#define MF_CU_ATTR_MULTIPROCESSOR_COUNT 16
#define MF_CU_ATTR_CC_MAJOR 75
#define MF_CU_ATTR_CC_MINOR 76

/* cudaDataType_t (library_types.h) */
#define MF_CUDA_R_32F 0
#define MF_CUDA_R_64F 1
#define MF_CUDA_R_16F 2
#define MF_CUDA_R_16BF 14
/* cublasComputeType_t */
#define MF_CUBLAS_COMPUTE_32F 68
#define MF_CUBLAS_COMPUTE_32F_FAST_TF32 77
#define MF_CUBLAS_COMPUTE_64F 70
/* cublasOperation_t, cublasGemmAlgo_t */
#define MF_CUBLAS_OP_N 0
#define MF_CUBLAS_OP_T 1
#define MF_CUBLAS_GEMM_DEFAULT (-1)
/* cublasStatus_t */
#define MF_CUBLAS_STATUS_NOT_SUPPORTED 15

/*
 * NOTE [cublasLt header facts]
 * Read from cublasLt.h of the nvidia-cublas 13.1.1.3 wheel
 * (nvidia/cu13/include/cublasLt.h).  The entry points, the layout, matmul
 * descriptor and preference attributes and the heuristic result struct were
 * checked against the CUDA 12.6 toolkit's cublasLt.h, and the epilogue values
 * against a CUDA 11 one: none of them changed.
 *  - Entry points (all cublasStatus_t, an int, except GetVersion/GetStatusString):
 *      cublasLtCreate(cublasLtHandle_t *)
 *      cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *, cublasComputeType_t, cudaDataType_t scale)
 *      cublasLtMatmulDescDestroy(desc)
 *      cublasLtMatmulDescSetAttribute(desc, attr, const void *buf, size_t size)
 *      cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *, cudaDataType, uint64_t rows,
 *                                 uint64_t cols, int64_t ld)
 *      cublasLtMatrixLayoutDestroy(layout)
 *      cublasLtMatrixLayoutSetAttribute(layout, attr, const void *buf, size_t size)
 *      cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *), ...Destroy(pref),
 *      cublasLtMatmulPreferenceSetAttribute(pref, attr, const void *buf, size_t size)
 *      cublasLtMatmulAlgoGetHeuristic(handle, desc, Adesc, Bdesc, Cdesc, Ddesc, pref,
 *          int requested, cublasLtMatmulHeuristicResult_t results[], int *returned)
 *      cublasLtMatmul(handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc,
 *          const cublasLtMatmulAlgo_t *, void *workspace, size_t workspace_bytes, stream)
 *      size_t cublasLtGetVersion(void)          major*10000 + minor*100 + patch
 *      const char *cublasLtGetStatusString(cublasStatus_t)
 *    The descriptor handles are pointers to opaque structs; the enum arguments
 *    are C enums (int).  SetAttribute checks `size` against the attribute's
 *    own type, so each value below is passed in exactly that type.
 *  - cublasLtMatmulDescAttributes_t: TRANSA 3 (int32), TRANSB 4 (int32),
 *    EPILOGUE 7 (uint32), BIAS_POINTER 8 (const void *), BIAS_DATA_TYPE 26
 *    (int32; default -1 = the type of D).  We leave BIAS_DATA_TYPE at its
 *    default: our bias always has D's type, and the attribute is missing from
 *    older cuBLASLt releases.
 *  - cublasLtEpilogue_t: DEFAULT 1, RELU 2, BIAS 4, RELU_BIAS 6 (RELU | BIAS).
 *    The bias is a packed (stride 1) vector of length rows(D), added to every
 *    column of the column-major D before the activation.
 *  - cublasLtMatrixLayoutAttribute_t: BATCH_COUNT 5 (int32, default 1),
 *    STRIDED_BATCH_OFFSET 6 (int64 elements, default 0).  Every matrix of one
 *    call must have the same batch count; a stride of 0 on A or B reuses one
 *    matrix for every batch entry.  ld must be >= rows (column order, the
 *    default ORDER_COL 0).
 *  - cublasLtMatmulPreferenceAttributes_t: MAX_WORKSPACE_BYTES 1 (uint64,
 *    default 0 = no workspace), MIN_ALIGNMENT_A/B/C/D_BYTES 5/6/7/8 (uint32,
 *    default 256: the heuristic assumes 256-byte aligned pointers unless told
 *    otherwise, so we pass each pointer's real alignment).
 *  - sizeof(cublasLtMatmulAlgo_t) == 64 (uint64_t data[8]);
 *    sizeof(cublasLtMatmulHeuristicResult_t) == 96 (algo 64, size_t
 *    workspaceSize 8, cublasStatus_t state 4, float wavesCount 4,
 *    int reserved[4] 16); a result's fields are valid only when state == 0.
 *  - The scale type (alpha, beta) is CUDA_R_32F for compute 32F and
 *    32F_FAST_TF32; alpha and beta are host pointers (POINTER_MODE_HOST, the
 *    default).
 *  - cublasLtMatmulAlgoGetHeuristic returns CUBLAS_STATUS_NOT_SUPPORTED (15,
 *    cublas_api.h) when no heuristic covers the configuration: like zero
 *    results, that means "no algorithm".
 */
#define MF_CUBLASLT_MATMUL_DESC_TRANSA 3
#define MF_CUBLASLT_MATMUL_DESC_TRANSB 4
#define MF_CUBLASLT_MATMUL_DESC_EPILOGUE 7
#define MF_CUBLASLT_MATMUL_DESC_BIAS_POINTER 8
#define MF_CUBLASLT_EPILOGUE_DEFAULT 1u
#define MF_CUBLASLT_EPILOGUE_RELU 2u
#define MF_CUBLASLT_EPILOGUE_BIAS 4u
#define MF_CUBLASLT_EPILOGUE_RELU_BIAS 6u
#define MF_CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT 5
#define MF_CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET 6
#define MF_CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES 1
#define MF_CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES 5
#define MF_CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES 6
#define MF_CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES 7
#define MF_CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES 8

/*
 * NOTE [symbol tables]
 * X(field, "exported symbol", return type, (parameter list), required)
 * The exported name can differ from the field (versioned entry points such as
 * cublasCreate_v2).  Optional symbols (required == 0) may be NULL after
 * loading; callers check before use.
 */
#define MF_CUDA_DRIVER_SYMBOLS(X)                                                        \
    X(cuInit, "cuInit", mf_CUresult, (unsigned int flags), 1)                            \
    X(cuDriverGetVersion, "cuDriverGetVersion", mf_CUresult, (int *version), 1)          \
    X(cuDeviceGetCount, "cuDeviceGetCount", mf_CUresult, (int *count), 1)                \
    X(cuDeviceGet, "cuDeviceGet", mf_CUresult, (mf_CUdevice * dev, int ordinal), 1)      \
    X(cuDeviceGetAttribute, "cuDeviceGetAttribute", mf_CUresult,                         \
      (int *value, int attrib, mf_CUdevice dev), 1)                                      \
    X(cuDeviceGetName, "cuDeviceGetName", mf_CUresult,                                   \
      (char *name, int len, mf_CUdevice dev), 1)                                         \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", mf_CUresult,                 \
      (mf_CUcontext * ctx, mf_CUdevice dev), 1)                                          \
    X(cuCtxGetCurrent, "cuCtxGetCurrent", mf_CUresult, (mf_CUcontext * ctx), 1)          \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", mf_CUresult, (mf_CUcontext ctx), 1)            \
    X(cuModuleLoadData, "cuModuleLoadData", mf_CUresult,                                 \
      (mf_CUmodule * mod, const void *image), 1)                                         \
    X(cuModuleGetFunction, "cuModuleGetFunction", mf_CUresult,                           \
      (mf_CUfunction * fn, mf_CUmodule mod, const char *name), 1)                        \
    X(cuLaunchKernel, "cuLaunchKernel", mf_CUresult,                                     \
      (mf_CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,               \
       unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,            \
       mf_CUstream stream, void **params, void **extra), 1)                              \
    X(cuGetErrorName, "cuGetErrorName", mf_CUresult, (mf_CUresult e, const char **s), 1) \
    X(cuGetErrorString, "cuGetErrorString", mf_CUresult, (mf_CUresult e, const char **s), 1)

#define MF_CUDA_NVRTC_SYMBOLS(X)                                                         \
    X(nvrtcVersion, "nvrtcVersion", mf_nvrtcResult, (int *major, int *minor), 1)         \
    X(nvrtcGetErrorString, "nvrtcGetErrorString", const char *, (mf_nvrtcResult r), 1)   \
    X(nvrtcCreateProgram, "nvrtcCreateProgram", mf_nvrtcResult,                          \
      (mf_nvrtcProgram * prog, const char *src, const char *name, int nheaders,          \
       const char *const *headers, const char *const *include_names), 1)                 \
    X(nvrtcDestroyProgram, "nvrtcDestroyProgram", mf_nvrtcResult,                        \
      (mf_nvrtcProgram * prog), 1)                                                       \
    X(nvrtcCompileProgram, "nvrtcCompileProgram", mf_nvrtcResult,                        \
      (mf_nvrtcProgram prog, int nopts, const char *const *opts), 1)                     \
    X(nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize", mf_nvrtcResult,                  \
      (mf_nvrtcProgram prog, size_t *size), 1)                                           \
    X(nvrtcGetProgramLog, "nvrtcGetProgramLog", mf_nvrtcResult,                          \
      (mf_nvrtcProgram prog, char *log), 1)                                              \
    X(nvrtcGetPTXSize, "nvrtcGetPTXSize", mf_nvrtcResult,                                \
      (mf_nvrtcProgram prog, size_t *size), 1)                                           \
    X(nvrtcGetPTX, "nvrtcGetPTX", mf_nvrtcResult, (mf_nvrtcProgram prog, char *ptx), 1)  \
    X(nvrtcGetCUBINSize, "nvrtcGetCUBINSize", mf_nvrtcResult,                            \
      (mf_nvrtcProgram prog, size_t *size), 0)                                           \
    X(nvrtcGetCUBIN, "nvrtcGetCUBIN", mf_nvrtcResult,                                    \
      (mf_nvrtcProgram prog, char *cubin), 0)                                            \
    X(nvrtcGetNumSupportedArchs, "nvrtcGetNumSupportedArchs", mf_nvrtcResult,            \
      (int *n), 0)                                                                       \
    X(nvrtcGetSupportedArchs, "nvrtcGetSupportedArchs", mf_nvrtcResult, (int *archs), 0)

#define MF_CUDA_CUBLAS_SYMBOLS(X)                                                        \
    X(cublasCreate, "cublasCreate_v2", mf_cublasStatus, (mf_cublasHandle * h), 1)        \
    X(cublasSetStream, "cublasSetStream_v2", mf_cublasStatus,                            \
      (mf_cublasHandle h, mf_CUstream s), 1)                                             \
    X(cublasSetWorkspace, "cublasSetWorkspace_v2", mf_cublasStatus,                      \
      (mf_cublasHandle h, void *ws, size_t nbytes), 0)                                   \
    X(cublasGetProperty, "cublasGetProperty", mf_cublasStatus, (int type, int *value), 0) \
    X(cublasGetStatusString, "cublasGetStatusString", const char *, (mf_cublasStatus s), 0) \
    X(cublasGemmEx, "cublasGemmEx", mf_cublasStatus,                                     \
      (mf_cublasHandle h, int transa, int transb, int m, int n, int k,                   \
       const void *alpha, const void *A, int atype, int lda, const void *B, int btype,   \
       int ldb, const void *beta, void *C, int ctype, int ldc, int compute, int algo), 1) \
    X(cublasGemmStridedBatchedEx, "cublasGemmStridedBatchedEx", mf_cublasStatus,         \
      (mf_cublasHandle h, int transa, int transb, int m, int n, int k,                   \
       const void *alpha, const void *A, int atype, int lda, long long strideA,          \
       const void *B, int btype, int ldb, long long strideB, const void *beta, void *C,  \
       int ctype, int ldc, long long strideC, int batch, int compute, int algo), 1)

/* cuBLASLt (libcublasLt, a separate library of the same wheel/toolkit; the
 * types and values are in NOTE [cublasLt header facts]). */
#define MF_CUDA_CUBLASLT_SYMBOLS(X)                                                      \
    X(cublasLtCreate, "cublasLtCreate", mf_cublasStatus, (mf_cublasLtHandle * h), 1)     \
    X(cublasLtMatmulDescCreate, "cublasLtMatmulDescCreate", mf_cublasStatus,             \
      (mf_cublasLtMatmulDesc * d, int compute, int scale_type), 1)                       \
    X(cublasLtMatmulDescDestroy, "cublasLtMatmulDescDestroy", mf_cublasStatus,           \
      (mf_cublasLtMatmulDesc d), 1)                                                      \
    X(cublasLtMatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute", mf_cublasStatus, \
      (mf_cublasLtMatmulDesc d, int attr, const void *buf, size_t size), 1)              \
    X(cublasLtMatrixLayoutCreate, "cublasLtMatrixLayoutCreate", mf_cublasStatus,         \
      (mf_cublasLtMatrixLayout * l, int type, uint64_t rows, uint64_t cols, int64_t ld), 1) \
    X(cublasLtMatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy", mf_cublasStatus,       \
      (mf_cublasLtMatrixLayout l), 1)                                                    \
    X(cublasLtMatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute",              \
      mf_cublasStatus, (mf_cublasLtMatrixLayout l, int attr, const void *buf, size_t size), 1) \
    X(cublasLtMatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate", mf_cublasStatus, \
      (mf_cublasLtMatmulPreference * p), 1)                                              \
    X(cublasLtMatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy",                \
      mf_cublasStatus, (mf_cublasLtMatmulPreference p), 1)                               \
    X(cublasLtMatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute",      \
      mf_cublasStatus, (mf_cublasLtMatmulPreference p, int attr, const void *buf, size_t size), 1) \
    X(cublasLtMatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic", mf_cublasStatus, \
      (mf_cublasLtHandle h, mf_cublasLtMatmulDesc d, mf_cublasLtMatrixLayout a,          \
       mf_cublasLtMatrixLayout b, mf_cublasLtMatrixLayout c, mf_cublasLtMatrixLayout dl, \
       mf_cublasLtMatmulPreference p, int requested, mf_cublasLtHeuristicResult *results, \
       int *returned), 1)                                                                \
    X(cublasLtMatmul, "cublasLtMatmul", mf_cublasStatus,                                 \
      (mf_cublasLtHandle h, mf_cublasLtMatmulDesc d, const void *alpha, const void *A,   \
       mf_cublasLtMatrixLayout a, const void *B, mf_cublasLtMatrixLayout b,              \
       const void *beta, const void *C, mf_cublasLtMatrixLayout c, void *D,              \
       mf_cublasLtMatrixLayout dl, const mf_cublasLtMatmulAlgo *algo, void *ws,          \
       size_t ws_bytes, mf_CUstream s), 1)                                               \
    X(cublasLtGetVersion, "cublasLtGetVersion", size_t, (void), 0)                       \
    X(cublasLtGetStatusString, "cublasLtGetStatusString", const char *, (mf_cublasStatus s), 0)

/* The typedefs and tables generated from the lists. */
#define MF_CUDA_TYPEDEF(field, sym, ret, params, req) typedef ret(*mf_##field##_fn) params;
MF_CUDA_DRIVER_SYMBOLS(MF_CUDA_TYPEDEF)
MF_CUDA_NVRTC_SYMBOLS(MF_CUDA_TYPEDEF)
MF_CUDA_CUBLAS_SYMBOLS(MF_CUDA_TYPEDEF)
MF_CUDA_CUBLASLT_SYMBOLS(MF_CUDA_TYPEDEF)
#undef MF_CUDA_TYPEDEF

#define MF_CUDA_FIELD(field, sym, ret, params, req) mf_##field##_fn field;
typedef struct mf_cuda_driver_api { MF_CUDA_DRIVER_SYMBOLS(MF_CUDA_FIELD) } mf_cuda_driver_api;
typedef struct mf_cuda_nvrtc_api { MF_CUDA_NVRTC_SYMBOLS(MF_CUDA_FIELD) } mf_cuda_nvrtc_api;
typedef struct mf_cuda_cublas_api { MF_CUDA_CUBLAS_SYMBOLS(MF_CUDA_FIELD) } mf_cuda_cublas_api;
typedef struct mf_cuda_cublaslt_api { MF_CUDA_CUBLASLT_SYMBOLS(MF_CUDA_FIELD) } mf_cuda_cublaslt_api;
#undef MF_CUDA_FIELD

/* Which library. */
enum {
    MF_CUDA_LIB_DRIVER = 0,
    MF_CUDA_LIB_NVRTC = 1,
    MF_CUDA_LIB_CUBLAS = 2,
    MF_CUDA_LIB_CUBLASLT = 3,
    MF_CUDA_LIB_COUNT = 4
};

#define MF_CUDA_PATH_LEN 1024
/* What a load attempt found (copied out by mf_cuda_lib_info). */
typedef struct mf_cuda_lib_info {
    int attempted;                  /* a load was tried */
    int loaded;                     /* all required symbols resolved */
    char path[MF_CUDA_PATH_LEN];    /* the file that was opened (dlinfo), or "" */
    char how[64];                   /* "already loaded", "search dir", "CUDA_HOME", "loader path" */
    char error[MF_CUDA_MSG_LEN];    /* why not: every dlerror() text, joined */
} mf_cuda_lib_info;

/* Candidate directories (nvidia pip wheels' lib folders, found by the Python
 * side) tried before CUDA_HOME/lib64 and the default loader path.  Copied. */
int mf_cuda_set_search_dirs(const char *const *dirs, int n, mf_cuda_ctx *ctx);
/* The current list, joined by ':' into buf. */
void mf_cuda_get_search_dirs(char *buf, size_t buflen);

/* Open a library and resolve its table at first use; later calls return the
 * cached result (a failure is remembered until mf_cuda_reset_failed()). */
int mf_cuda_load(int lib, mf_cuda_ctx *ctx);
void mf_cuda_lib_info_get(int lib, mf_cuda_lib_info *out);
/* Forget failed attempts so a later call searches again (e.g. after the
 * search dirs changed). */
void mf_cuda_reset_failed(void);

/* The tables; valid only after mf_cuda_load(lib) returned MF_OK. */
const mf_cuda_driver_api *mf_cuda_driver(void);
const mf_cuda_nvrtc_api *mf_cuda_nvrtc(void);
const mf_cuda_cublas_api *mf_cuda_cublas(void);
const mf_cuda_cublaslt_api *mf_cuda_cublaslt(void);

/* NOTE [cuda lock]: one process-wide mutex guards the library tables, the
 * per-device state below and the kernel cache (mf_nvrtc.c).  The binding may
 * run in several interpreters with their own GILs, so the GIL is not enough. */
void mf_cuda_lock(void);
void mf_cuda_unlock(void);

/* ---- driver helpers (load the driver on demand) ------------------------- */
/* cuInit + versions; device_count is 0 when the driver loads but has no GPU. */
int mf_cuda_driver_info(int *driver_version, int *device_count, mf_cuda_ctx *ctx);
/* Each function below runs in device's primary context, the one PyTorch uses
 * (so kernels and cuBLAS see PyTorch's memory), and leaves the thread's
 * current context as it found it (mf_cuda_driver.c NOTE [current context]). */
/* Compute capability as major*10+minor, and the SM count. */
int mf_cuda_device_arch(int device, int *arch, int *sm_count, mf_cuda_ctx *ctx);
/* Load a module image (cubin or NUL-terminated PTX) into device's primary
 * context and return the named function.  The module is never unloaded;
 * regions/nvrtc/kernel.py loads each (device, source) once (NOTE [loaded kernels]). */
int mf_cuda_load_function(int device, const void *image, const char *name,
                          mf_CUfunction *fn_out, mf_cuda_ctx *ctx);
/* Launch fn with ONE by-value parameter of params_size bytes (the packed
 * kernel parameter struct, see mf_codegen.h) on stream. */
int mf_cuda_launch(int device, mf_CUfunction fn, unsigned int grid, unsigned int block,
                   mf_CUstream stream, void *params, mf_cuda_ctx *ctx);

/* ---- cuBLAS -------------------------------------------------------------- */
typedef struct mf_cuda_gemm {
    int device;
    mf_CUstream stream;
    void *workspace;          /* PyTorch-allocated, may be NULL */
    size_t workspace_bytes;
    int transa, transb;       /* MF_CUBLAS_OP_N / _T */
    int m, n, k;              /* column-major problem, as cuBLAS sees it */
    const void *A; int lda; long long stride_a;
    const void *B; int ldb; long long stride_b;
    void *C; int ldc; long long stride_c;
    int batch;                /* 1: cublasGemmEx, > 1: strided batched */
    int dtype;                /* MF_CUDA_R_* of A, B and C */
    double alpha, beta;
    int allow_tf32;           /* float32 only */
} mf_cuda_gemm;

int mf_cuda_gemm_run(const mf_cuda_gemm *g, mf_cuda_ctx *ctx);
/* cuBLAS version as major*10000+minor*100+patch, or -1. */
int mf_cuda_cublas_version(void);

/* ---- cuBLASLt: one GEMM with a fused epilogue ------------------------------ */
/* Activation applied by the epilogue. */
enum { MF_CUDA_ACT_NONE = 0, MF_CUDA_ACT_RELU = 1 };

/* D = act(op(A) op(B) [+ bias]), column-major as cuBLAS sees it (the row-major
 * caller passes C^T = B^T A^T, see docs/CUDA.md).  alpha = 1, beta = 0 (no C
 * input; C's layout is D's).  bias, when not NULL, has D's data type and m
 * elements (one per row of the column-major D) and is shared by every batch
 * entry. */
typedef struct mf_cuda_lt_matmul {
    int device;
    mf_CUstream stream;
    void *workspace;          /* PyTorch-allocated, may be NULL (then 0 bytes) */
    size_t workspace_bytes;
    int transa, transb;       /* MF_CUBLAS_OP_N / _T */
    int m, n, k;              /* all >= 1 */
    const void *A; int lda; long long stride_a;   /* strides in elements; 0 = reuse */
    const void *B; int ldb; long long stride_b;
    void *D; int ldd; long long stride_d;
    int batch;                /* >= 1; > 1 sets BATCH_COUNT/STRIDED_BATCH_OFFSET */
    int dtype;                /* MF_CUDA_R_32F, _16F or _16BF for A, B, D and bias */
    int allow_tf32;           /* float32 only: compute 32F_FAST_TF32 */
    const void *bias;         /* NULL: no bias */
    int act;                  /* MF_CUDA_ACT_* */
} mf_cuda_lt_matmul;

/* Runs one cublasLtMatmul on g->stream.  MF_EINVAL for bad arguments
 * (checked before any library is opened), MF_CUDA_ENOTFOUND when libcublasLt
 * (or a required symbol of it) is missing, MF_CUDA_ENOALGO when the heuristic has no algorithm
 * for the problem within the workspace, MF_CUDA_ECUBLAS for a failed call. */
int mf_cuda_lt_matmul_run(const mf_cuda_lt_matmul *g, mf_cuda_ctx *ctx);
/* cublasLtGetVersion() (major*10000+minor*100+patch), or -1. */
long long mf_cuda_cublaslt_version(void);


#ifdef __cplusplus
}
#endif
#endif /* MF_CUDA_H */
