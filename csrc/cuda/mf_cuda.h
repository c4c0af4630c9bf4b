/*
 * mf_cuda.h -- run-time loading of the CUDA driver, NVRTC and cuBLAS, and the
 * thin driver/cuBLAS helpers the binding needs (context, module load, kernel
 * launch, GEMM).
 *
 * Invariants:
 *  - Nothing here is linked against CUDA: every library is dlopen()ed at first
 *    use (never at import), so the extension builds and imports with no CUDA.
 *  - Every symbol we call is listed once in an X-macro below; the macro makes
 *    the function-pointer typedefs, the pointer tables and the dlsym loop.
 *  - C99, no Python.h.  Functions return an int status (MF_CUDA_OK == 0) and
 *    write a message into a caller buffer (err, errlen) on failure.
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

#ifdef __cplusplus
extern "C" {
#endif

enum {
    MF_CUDA_OK = 0,
    MF_CUDA_ENOTFOUND = 1, /* a library could not be opened */
    MF_CUDA_ESYMBOL = 2,   /* a required symbol is missing */
    MF_CUDA_EDRIVER = 3,   /* a driver call failed (message has its name) */
    MF_CUDA_ENVRTC = 4,    /* NVRTC failed outside compilation */
    MF_CUDA_ECOMPILE = 5,  /* the program did not compile (log available) */
    MF_CUDA_ECUBLAS = 6,   /* a cuBLAS call failed */
    MF_CUDA_EINVAL = 7,    /* bad argument */
    MF_CUDA_ENOMEM = 8,
    MF_CUDA_ENODEV = 9     /* no device / device index out of range */
};

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

/* The typedefs and tables generated from the lists. */
#define MF_CUDA_TYPEDEF(field, sym, ret, params, req) typedef ret(*mf_##field##_fn) params;
MF_CUDA_DRIVER_SYMBOLS(MF_CUDA_TYPEDEF)
MF_CUDA_NVRTC_SYMBOLS(MF_CUDA_TYPEDEF)
MF_CUDA_CUBLAS_SYMBOLS(MF_CUDA_TYPEDEF)
#undef MF_CUDA_TYPEDEF

#define MF_CUDA_FIELD(field, sym, ret, params, req) mf_##field##_fn field;
typedef struct mf_cuda_driver_api { MF_CUDA_DRIVER_SYMBOLS(MF_CUDA_FIELD) } mf_cuda_driver_api;
typedef struct mf_cuda_nvrtc_api { MF_CUDA_NVRTC_SYMBOLS(MF_CUDA_FIELD) } mf_cuda_nvrtc_api;
typedef struct mf_cuda_cublas_api { MF_CUDA_CUBLAS_SYMBOLS(MF_CUDA_FIELD) } mf_cuda_cublas_api;
#undef MF_CUDA_FIELD

/* Which library. */
enum { MF_CUDA_LIB_DRIVER = 0, MF_CUDA_LIB_NVRTC = 1, MF_CUDA_LIB_CUBLAS = 2, MF_CUDA_LIB_COUNT = 3 };

#define MF_CUDA_PATH_LEN 1024
#define MF_CUDA_MSG_LEN 2048

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
int mf_cuda_set_search_dirs(const char *const *dirs, int n, char *err, size_t errlen);
/* The current list, joined by ':' into buf. */
void mf_cuda_get_search_dirs(char *buf, size_t buflen);

/* Open a library and resolve its table at first use; later calls return the
 * cached result (a failure is remembered until mf_cuda_reset_failed()). */
int mf_cuda_load(int lib, char *err, size_t errlen);
void mf_cuda_lib_info_get(int lib, mf_cuda_lib_info *out);
/* Forget failed attempts so a later call searches again (e.g. after the
 * search dirs changed). */
void mf_cuda_reset_failed(void);

/* The tables; valid only after mf_cuda_load(lib) returned MF_CUDA_OK. */
const mf_cuda_driver_api *mf_cuda_driver(void);
const mf_cuda_nvrtc_api *mf_cuda_nvrtc(void);
const mf_cuda_cublas_api *mf_cuda_cublas(void);

/* NOTE [cuda lock]: one process-wide mutex guards the library tables, the
 * per-device state below and the kernel cache (mf_nvrtc.c).  The binding may
 * run in several interpreters with their own GILs, so the GIL is not enough. */
void mf_cuda_lock(void);
void mf_cuda_unlock(void);

/* ---- driver helpers (load the driver on demand) ------------------------- */
/* cuInit + versions; device_count is 0 when the driver loads but has no GPU. */
int mf_cuda_driver_info(int *driver_version, int *device_count, char *err, size_t errlen);
/* Each function below runs in device's primary context, the one PyTorch uses
 * (so kernels and cuBLAS see PyTorch's memory), and leaves the thread's
 * current context as it found it (mf_cuda.c NOTE [current context]). */
/* Compute capability as major*10+minor, and the SM count. */
int mf_cuda_device_arch(int device, int *arch, int *sm_count, char *err, size_t errlen);
/* Load a module image (cubin or NUL-terminated PTX) into device's primary
 * context and return the named function.  The module is never unloaded. */
int mf_cuda_load_function(int device, const void *image, const char *name,
                          mf_CUfunction *fn_out, char *err, size_t errlen);
/* Launch fn with ONE by-value parameter of params_size bytes (the packed
 * kernel parameter struct, see mf_codegen.h) on stream. */
int mf_cuda_launch(int device, mf_CUfunction fn, unsigned int grid, unsigned int block,
                   mf_CUstream stream, void *params, char *err, size_t errlen);

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

int mf_cuda_gemm_run(const mf_cuda_gemm *g, char *err, size_t errlen);
/* cuBLAS version as major*10000+minor*100+patch, or -1. */
int mf_cuda_cublas_version(void);

/* printf-style message into a caller's error buffer (err may be NULL). */
void mf_cuda_set_err(char *err, size_t errlen, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif /* MF_CUDA_H */
