/*
 * mf_cuda.c -- dlopen() loader for the CUDA driver, NVRTC, cuBLAS and
 * cuBLASLt, plus the driver and cuBLAS helpers (primary context, module load,
 * launch, GEMM, cuBLASLt GEMM with a fused epilogue).
 *
 * Invariants:
 *  - No library is opened before the first mf_cuda_load() (never at import).
 *  - Each symbol is named once, in the X-macros of mf_cuda.h.
 *  - Every dlerror() text met while searching is kept in the library's info
 *    record, so "why was NVRTC not found" has a precise answer.
 *  - All mutable state is process-wide and guarded by one mutex
 *    (NOTE [cuda lock] in mf_cuda.h).
 */
#define _GNU_SOURCE /* dladdr, RTLD_NOLOAD */
#include "mf_cuda.h"

#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_DIRS 64
#define MAX_DEVICES 64

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

void mf_cuda_lock(void) { pthread_mutex_lock(&g_lock); }
void mf_cuda_unlock(void) { pthread_mutex_unlock(&g_lock); }

/* ---- tables ---------------------------------------------------------------- */

static mf_cuda_driver_api g_driver;
static mf_cuda_nvrtc_api g_nvrtc;
static mf_cuda_cublas_api g_cublas;
static mf_cuda_cublaslt_api g_cublaslt;

typedef struct sym_entry {
    const char *name;   /* exported symbol */
    size_t offset;      /* of the pointer in its table */
    int required;
} sym_entry;

#define DRV_ENTRY(field, sym, ret, params, req) {sym, offsetof(mf_cuda_driver_api, field), req},
#define NVRTC_ENTRY(field, sym, ret, params, req) {sym, offsetof(mf_cuda_nvrtc_api, field), req},
#define CUBLAS_ENTRY(field, sym, ret, params, req) {sym, offsetof(mf_cuda_cublas_api, field), req},
#define CUBLASLT_ENTRY(field, sym, ret, params, req) {sym, offsetof(mf_cuda_cublaslt_api, field), req},
static const sym_entry driver_syms[] = {MF_CUDA_DRIVER_SYMBOLS(DRV_ENTRY){NULL, 0, 0}};
static const sym_entry nvrtc_syms[] = {MF_CUDA_NVRTC_SYMBOLS(NVRTC_ENTRY){NULL, 0, 0}};
static const sym_entry cublas_syms[] = {MF_CUDA_CUBLAS_SYMBOLS(CUBLAS_ENTRY){NULL, 0, 0}};
static const sym_entry cublaslt_syms[] = {MF_CUDA_CUBLASLT_SYMBOLS(CUBLASLT_ENTRY){NULL, 0, 0}};
#undef DRV_ENTRY
#undef NVRTC_ENTRY
#undef CUBLAS_ENTRY
#undef CUBLASLT_ENTRY

/* The mirrored cuBLASLt structs must have the header's sizes (NOTE [cublasLt
 * header facts]); a wrong size makes this array's length negative. */
typedef char check_lt_algo_size[sizeof(mf_cublasLtMatmulAlgo) == 64 ? 1 : -1];
typedef char check_lt_heuristic_size[sizeof(mf_cublasLtHeuristicResult) == 96 ? 1 : -1];

/*
 * NOTE [library names]
 * Versioned sonames first, newest major first, then the unversioned name
 * (present only with a toolkit's -dev files).  The driver's soname has been
 * libcuda.so.1 for every CUDA release.
 */
static const char *const driver_names[] = {"libcuda.so.1", "libcuda.so", NULL};
static const char *const nvrtc_names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2",
                                          "libnvrtc.so", NULL};
static const char *const cublas_names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so.11",
                                           "libcublas.so", NULL};
/* libcublasLt ships next to libcublas (same wheel folder, same toolkit lib64)
 * and is searched the same way. */
static const char *const cublaslt_names[] = {"libcublasLt.so.13", "libcublasLt.so.12",
                                             "libcublasLt.so.11", "libcublasLt.so", NULL};

typedef struct lib_desc {
    const char *label;
    const char *const *names;
    const sym_entry *syms;
    void *table;
    size_t table_size;
} lib_desc;

static const lib_desc g_libs[MF_CUDA_LIB_COUNT] = {
    {"CUDA driver", driver_names, driver_syms, &g_driver, sizeof g_driver},
    {"NVRTC", nvrtc_names, nvrtc_syms, &g_nvrtc, sizeof g_nvrtc},
    {"cuBLAS", cublas_names, cublas_syms, &g_cublas, sizeof g_cublas},
    {"cuBLASLt", cublaslt_names, cublaslt_syms, &g_cublaslt, sizeof g_cublaslt},
};

typedef struct lib_state {
    mf_cuda_lib_info info;
    void *handle;
    void *preload;   /* libnvrtc-builtins, opened RTLD_GLOBAL next to libnvrtc */
} lib_state;

static lib_state g_state[MF_CUDA_LIB_COUNT];

static char *g_dirs[MAX_DIRS];
static int g_ndirs;

/* ---- small helpers --------------------------------------------------------- */

int mf_cuda_set_error(mf_cuda_ctx *ctx, int status, const char *fmt, ...)
{
    va_list ap;
    if (!ctx)
        return status;
    va_start(ap, fmt);
    vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
    va_end(ap);
    return status;
}

/* Append "; text" to a bounded buffer (truncating quietly). */
static void append_msg(char *buf, size_t buflen, const char *text)
{
    size_t used = strlen(buf);
    if (used + 3 >= buflen)
        return;
    if (used > 0) {
        memcpy(buf + used, "; ", 2);
        used += 2;
        buf[used] = '\0';
    }
    snprintf(buf + used, buflen - used, "%s", text);
}

static int file_exists(const char *path) { return access(path, F_OK) == 0; }

int mf_cuda_set_search_dirs(const char *const *dirs, int n, mf_cuda_ctx *ctx)
{
    int i;
    if (n < 0 || (n > 0 && !dirs)) {
        return mf_cuda_set_error(ctx, MF_EINVAL, "bad search directory list");
    }
    if (n > MAX_DIRS)
        n = MAX_DIRS;
    mf_cuda_lock();
    for (i = 0; i < g_ndirs; i++) {
        free(g_dirs[i]);
        g_dirs[i] = NULL;
    }
    g_ndirs = 0;
    for (i = 0; i < n; i++) {
        size_t len = strlen(dirs[i]);
        char *copy = (char *)malloc(len + 1);
        if (!copy) {
            mf_cuda_unlock();
            return mf_cuda_set_error(ctx, MF_ENOMEM, "out of memory");
        }
        memcpy(copy, dirs[i], len + 1);
        g_dirs[g_ndirs++] = copy;
    }
    mf_cuda_unlock();
    mf_cuda_reset_failed();
    return MF_OK;
}

void mf_cuda_get_search_dirs(char *buf, size_t buflen)
{
    int i;
    size_t used = 0;
    if (!buf || buflen == 0)
        return;
    buf[0] = '\0';
    mf_cuda_lock();
    for (i = 0; i < g_ndirs && used + 1 < buflen; i++) {
        int w = snprintf(buf + used, buflen - used, "%s%s", i ? ":" : "", g_dirs[i]);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    mf_cuda_unlock();
}

void mf_cuda_reset_failed(void)
{
    int i;
    mf_cuda_lock();
    for (i = 0; i < MF_CUDA_LIB_COUNT; i++) {
        if (g_state[i].info.attempted && !g_state[i].info.loaded)
            memset(&g_state[i].info, 0, sizeof g_state[i].info);
    }
    mf_cuda_unlock();
}

/* Resolve every symbol of lib from handle.  0 when all required ones exist;
 * otherwise the missing names go into st->info.error. */
static int resolve(const lib_desc *lib, lib_state *st, void *handle)
{
    const sym_entry *e;
    int ok = 1;
    memset(lib->table, 0, lib->table_size);
    for (e = lib->syms; e->name; e++) {
        void *p;
        dlerror();
        p = dlsym(handle, e->name);
        if (!p && e->required) {
            const char *why = dlerror();
            char msg[512];
            snprintf(msg, sizeof msg, "missing symbol %s (%s)", e->name, why ? why : "?");
            append_msg(st->info.error, sizeof st->info.error, msg);
            ok = 0;
        }
        memcpy((char *)lib->table + e->offset, &p, sizeof p);
    }
    return ok ? 0 : -1;
}

/*
 * NOTE [nvrtc builtins]
 * libnvrtc opens libnvrtc-builtins.so.<major>.<minor> by soname at compile
 * time.  The pip wheels ship it next to libnvrtc but that folder is not on the
 * loader path, so before opening <dir>/libnvrtc.so.N we open the builtins from
 * the same folder with RTLD_GLOBAL; NVRTC's own dlopen then finds the
 * already-loaded library by its soname.
 */
static void preload_nvrtc_builtins(lib_state *st, const char *dir, const char *soname)
{
    DIR *d;
    struct dirent *ent;
    const char *ver = strstr(soname, ".so.");
    char prefix[64];
    char best[512] = "";
    if (!ver || st->preload)
        return;
    /* libnvrtc.so.13 -> libnvrtc-builtins.so.13. */
    snprintf(prefix, sizeof prefix, "libnvrtc-builtins.so.%s", ver + 4);
    d = opendir(dir);
    if (!d)
        return;
    while ((ent = readdir(d)) != NULL) {
        if (strncmp(ent->d_name, prefix, strlen(prefix)) == 0 &&
            (best[0] == '\0' || strcmp(ent->d_name, best) > 0))
            snprintf(best, sizeof best, "%s", ent->d_name);
    }
    closedir(d);
    if (best[0]) {
        char path[MF_CUDA_PATH_LEN];
        snprintf(path, sizeof path, "%s/%s", dir, best);
        st->preload = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
        if (!st->preload) {
            const char *why = dlerror();
            append_msg(st->info.error, sizeof st->info.error, why ? why : path);
        }
    }
}

/* Try one dlopen; on success resolve the table.  1 loaded, 0 not. */
static int try_open(int which, const char *path, int flags, const char *how)
{
    const lib_desc *lib = &g_libs[which];
    lib_state *st = &g_state[which];
    void *h;
    dlerror();
    h = dlopen(path, flags);
    if (!h) {
        if (!(flags & RTLD_NOLOAD)) {
            const char *why = dlerror();
            append_msg(st->info.error, sizeof st->info.error, why ? why : path);
        }
        return 0;
    }
    if (resolve(lib, st, h) != 0) {
        dlclose(h);
        return 0;
    }
    st->handle = h;
    st->info.loaded = 1;
    snprintf(st->info.how, sizeof st->info.how, "%s", how);
    {
        /* The real file: ask the loader where the first symbol lives. */
        Dl_info dli;
        void *first = NULL;
        memcpy(&first, (char *)lib->table + lib->syms[0].offset, sizeof first);
        if (first && dladdr(first, &dli) && dli.dli_fname)
            snprintf(st->info.path, sizeof st->info.path, "%s", dli.dli_fname);
        else
            snprintf(st->info.path, sizeof st->info.path, "%s", path);
    }
    return 1;
}

static int search_dir(int which, const char *dir, const char *how)
{
    const lib_desc *lib = &g_libs[which];
    const char *const *name;
    for (name = lib->names; *name; name++) {
        char path[MF_CUDA_PATH_LEN];
        snprintf(path, sizeof path, "%s/%s", dir, *name);
        if (!file_exists(path))
            continue;
        if (which == MF_CUDA_LIB_NVRTC)
            preload_nvrtc_builtins(&g_state[which], dir, *name);
        if (try_open(which, path, RTLD_NOW | RTLD_LOCAL, how))
            return 1;
    }
    return 0;
}

/* The search order of NOTE [library search] (docs/CUDA.md). */
static int load_locked(int which)
{
    const lib_desc *lib = &g_libs[which];
    lib_state *st = &g_state[which];
    const char *const *name;
    const char *envs[2] = {"CUDA_HOME", "CUDA_PATH"};
    int i;

    st->info.attempted = 1;
    st->info.error[0] = '\0';
    /* 1. Already in the process (e.g. PyTorch opened it): share that copy. */
    for (name = lib->names; *name; name++)
        if (try_open(which, *name, RTLD_NOW | RTLD_NOLOAD, "already loaded"))
            return 1;
    /* 2. The nvidia pip wheels' lib folders handed over by Python. */
    for (i = 0; i < g_ndirs; i++)
        if (search_dir(which, g_dirs[i], "search dir"))
            return 1;
    /* 3. A toolkit: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda. */
    for (i = 0; i < 3; i++) {
        const char *root = i < 2 ? getenv(envs[i]) : "/usr/local/cuda";
        char dir[MF_CUDA_PATH_LEN];
        if (!root || !root[0])
            continue;
        snprintf(dir, sizeof dir, "%s/lib64", root);
        if (search_dir(which, dir, i < 2 ? envs[i] : "/usr/local/cuda"))
            return 1;
    }
    /* 4. The default loader path (LD_LIBRARY_PATH, ld.so.cache). */
    for (name = lib->names; *name; name++)
        if (try_open(which, *name, RTLD_NOW | RTLD_LOCAL, "loader path"))
            return 1;
    return 0;
}

int mf_cuda_load(int which, mf_cuda_ctx *ctx)
{
    lib_state *st;
    int ok;
    if (which < 0 || which >= MF_CUDA_LIB_COUNT) {
        return mf_cuda_set_error(ctx, MF_EINVAL, "bad library id %d", which);
    }
    st = &g_state[which];
    mf_cuda_lock();
    if (st->info.loaded)
        ok = 1;
    else if (st->info.attempted)
        ok = 0;
    else
        ok = load_locked(which);
    if (!ok)
        mf_cuda_set_error(ctx, MF_CUDA_ENOTFOUND, "%s not found: %s", g_libs[which].label,
                st->info.error[0] ? st->info.error : "no candidate file");
    mf_cuda_unlock();
    return ok ? MF_OK : MF_CUDA_ENOTFOUND;
}

void mf_cuda_lib_info_get(int which, mf_cuda_lib_info *out)
{
    if (which < 0 || which >= MF_CUDA_LIB_COUNT) {
        memset(out, 0, sizeof *out);
        return;
    }
    mf_cuda_lock();
    *out = g_state[which].info;
    mf_cuda_unlock();
}

const mf_cuda_driver_api *mf_cuda_driver(void) { return &g_driver; }
const mf_cuda_nvrtc_api *mf_cuda_nvrtc(void) { return &g_nvrtc; }
const mf_cuda_cublas_api *mf_cuda_cublas(void) { return &g_cublas; }
const mf_cuda_cublaslt_api *mf_cuda_cublaslt(void) { return &g_cublaslt; }

/* ---- driver helpers ----------------------------------------------------- */

static int g_init_done;          /* cuInit succeeded */
static mf_CUresult g_init_result;
static int g_init_tried;
static mf_CUcontext g_ctx[MAX_DEVICES];
static mf_cublasHandle g_cublas_handle[MAX_DEVICES];
static mf_cublasLtHandle g_cublaslt_handle[MAX_DEVICES];

/* A failed driver call: status with "what failed: name (code): text". */
static int cu_error(mf_cuda_ctx *ctx, int status, mf_CUresult r, const char *what)
{
    const char *name = NULL, *text = NULL;
    if (g_driver.cuGetErrorName)
        g_driver.cuGetErrorName(r, &name);
    if (g_driver.cuGetErrorString)
        g_driver.cuGetErrorString(r, &text);
    return mf_cuda_set_error(ctx, status, "%s failed: %s (%d): %s", what, name ? name : "CUDA_ERROR", r,
            text ? text : "unknown error");
}

/* Called with the lock held and the driver loaded. */
static int init_locked(mf_cuda_ctx *ctx)
{
    if (!g_init_tried) {
        g_init_tried = 1;
        g_init_result = g_driver.cuInit(0);
        g_init_done = g_init_result == 0;
    }
    if (!g_init_done) {
        return cu_error(ctx, MF_CUDA_EDRIVER, g_init_result, "cuInit");
    }
    return MF_OK;
}

int mf_cuda_driver_info(int *driver_version, int *device_count, mf_cuda_ctx *ctx)
{
    int rc;
    mf_CUresult r;
    *driver_version = -1;
    *device_count = 0;
    rc = mf_cuda_load(MF_CUDA_LIB_DRIVER, ctx);
    if (rc != MF_OK)
        return rc;
    mf_cuda_lock();
    r = g_driver.cuDriverGetVersion(driver_version);
    if (r != 0) {
        cu_error(ctx, MF_CUDA_EDRIVER, r, "cuDriverGetVersion");
        mf_cuda_unlock();
        return MF_CUDA_EDRIVER;
    }
    rc = init_locked(ctx);
    if (rc == MF_OK) {
        r = g_driver.cuDeviceGetCount(device_count);
        if (r != 0) {
            rc = cu_error(ctx, MF_CUDA_EDRIVER, r, "cuDeviceGetCount");
        }
    }
    mf_cuda_unlock();
    return rc;
}

/* NOTE [current context]: the driver calls below need device's primary
 * context (PyTorch's) current on this thread.  The thread's current context
 * is what the runtime reports as the current device, so PyTorch would follow
 * a switch we leave behind: every entry point saves the context that was
 * current (*prev) and puts it back (restore_locked) before it returns.  With
 * one GPU, or when PyTorch already made that device current, nothing changes.
 *
 * Lock held, driver loaded. */
static int use_device_locked(int device, mf_CUdevice *dev_out, mf_CUcontext *prev, mf_cuda_ctx *ctx)
{
    mf_CUresult r;
    mf_CUdevice dev;
    mf_CUcontext cur = NULL;
    int rc = init_locked(ctx);
    if (rc != MF_OK)
        return rc;
    if (device < 0 || device >= MAX_DEVICES) {
        return mf_cuda_set_error(ctx, MF_EINVAL, "device index %d out of range", device);
    }
    r = g_driver.cuDeviceGet(&dev, device);
    if (r != 0) {
        return cu_error(ctx, MF_CUDA_ENODEV, r, "cuDeviceGet");
    }
    if (!g_ctx[device]) {
        r = g_driver.cuDevicePrimaryCtxRetain(&g_ctx[device], dev);
        if (r != 0) {
            g_ctx[device] = NULL;
            return cu_error(ctx, MF_CUDA_EDRIVER, r, "cuDevicePrimaryCtxRetain");
        }
    }
    r = g_driver.cuCtxGetCurrent(&cur);
    if (r != 0) {
        return cu_error(ctx, MF_CUDA_EDRIVER, r, "cuCtxGetCurrent");
    }
    if (cur != g_ctx[device]) {
        r = g_driver.cuCtxSetCurrent(g_ctx[device]);
        if (r != 0) {
            return cu_error(ctx, MF_CUDA_EDRIVER, r, "cuCtxSetCurrent");
        }
    }
    *prev = cur;
    if (dev_out)
        *dev_out = dev;
    return MF_OK;
}

/* Put back the context use_device_locked found (NOTE [current context]). */
static void restore_locked(int device, mf_CUcontext prev)
{
    if (prev != g_ctx[device])
        (void)g_driver.cuCtxSetCurrent(prev);
}

/* The entry of every device call: load the driver (and lib, when it is not
 * the driver), take the lock and make device's primary context current.  On
 * success the lock is held: end with leave_device.  On failure it is not. */
static int enter_device(int lib, int device, mf_CUdevice *dev_out, mf_CUcontext *prev, mf_cuda_ctx *ctx)
{
    int rc = mf_cuda_load(MF_CUDA_LIB_DRIVER, ctx);
    if (rc == MF_OK && lib != MF_CUDA_LIB_DRIVER)
        rc = mf_cuda_load(lib, ctx);
    if (rc != MF_OK)
        return rc;
    mf_cuda_lock();
    rc = use_device_locked(device, dev_out, prev, ctx);
    if (rc != MF_OK)
        mf_cuda_unlock();
    return rc;
}

static void leave_device(int device, mf_CUcontext prev)
{
    restore_locked(device, prev);
    mf_cuda_unlock();
}

int mf_cuda_device_arch(int device, int *arch, int *sm_count, mf_cuda_ctx *ctx)
{
    mf_CUdevice dev;
    mf_CUcontext prev = NULL;
    int major = 0, minor = 0, sms = 0;
    mf_CUresult r;
    int rc = enter_device(MF_CUDA_LIB_DRIVER, device, &dev, &prev, ctx);
    if (rc != MF_OK)
        return rc;
    r = g_driver.cuDeviceGetAttribute(&major, MF_CU_ATTR_CC_MAJOR, dev);
    if (r == 0)
        r = g_driver.cuDeviceGetAttribute(&minor, MF_CU_ATTR_CC_MINOR, dev);
    if (r == 0)
        r = g_driver.cuDeviceGetAttribute(&sms, MF_CU_ATTR_MULTIPROCESSOR_COUNT, dev);
    if (r != 0) {
        rc = cu_error(ctx, MF_CUDA_EDRIVER, r, "cuDeviceGetAttribute");
    }
    leave_device(device, prev);
    if (rc == MF_OK) {
        *arch = major * 10 + minor;
        if (sm_count)
            *sm_count = sms;
    }
    return rc;
}

int mf_cuda_load_function(int device, const void *image, const char *name,
                          mf_CUfunction *fn_out, mf_cuda_ctx *ctx)
{
    mf_CUmodule mod = NULL;
    mf_CUcontext prev = NULL;
    mf_CUresult r;
    int rc = enter_device(MF_CUDA_LIB_DRIVER, device, NULL, &prev, ctx);
    if (rc != MF_OK)
        return rc;
    r = g_driver.cuModuleLoadData(&mod, image);
    if (r != 0) {
        rc = cu_error(ctx, MF_CUDA_EDRIVER, r, "cuModuleLoadData");
    } else {
        r = g_driver.cuModuleGetFunction(fn_out, mod, name);
        if (r != 0) {
            rc = cu_error(ctx, MF_CUDA_EDRIVER, r, "cuModuleGetFunction");
        }
    }
    leave_device(device, prev);
    return rc;
}

int mf_cuda_launch(int device, mf_CUfunction fn, unsigned int grid, unsigned int block,
                   mf_CUstream stream, void *params, mf_cuda_ctx *ctx)
{
    void *kernel_params[1];
    mf_CUcontext prev = NULL;
    mf_CUresult r;
    int rc = enter_device(MF_CUDA_LIB_DRIVER, device, NULL, &prev, ctx);
    if (rc != MF_OK)
        return rc;
    kernel_params[0] = params;
    r = g_driver.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, kernel_params, NULL);
    if (r != 0) {
        rc = cu_error(ctx, MF_CUDA_EDRIVER, r, "cuLaunchKernel");
    }
    leave_device(device, prev);
    return rc;
}

/* ---- cuBLAS ---------------------------------------------------------------- */

static int cublas_error(mf_cuda_ctx *ctx, int status, mf_cublasStatus s, const char *what)
{
    const char *text = g_cublas.cublasGetStatusString ? g_cublas.cublasGetStatusString(s) : NULL;
    return mf_cuda_set_error(ctx, status, "%s failed: status %d (%s)", what, s, text ? text : "cuBLAS error");
}

int mf_cuda_cublas_version(void)
{
    int major = -1, minor = 0, patch = 0;
    if (mf_cuda_load(MF_CUDA_LIB_CUBLAS, NULL) != MF_OK || !g_cublas.cublasGetProperty)
        return -1;
    /* libraryPropertyType: MAJOR_VERSION 0, MINOR_VERSION 1, PATCH_LEVEL 2 */
    if (g_cublas.cublasGetProperty(0, &major) != 0 || g_cublas.cublasGetProperty(1, &minor) != 0 ||
        g_cublas.cublasGetProperty(2, &patch) != 0)
        return -1;
    return major * 10000 + minor * 100 + patch;
}

int mf_cuda_gemm_run(const mf_cuda_gemm *g, mf_cuda_ctx *ctx)
{
    mf_cublasStatus s;
    int rc, compute;
    float alpha32 = (float)g->alpha, beta32 = (float)g->beta;
    const void *alpha, *beta;
    mf_cublasHandle h;
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
    rc = enter_device(MF_CUDA_LIB_CUBLAS, g->device, NULL, &prev, ctx);
    if (rc != MF_OK)
        return rc;
    if (!g_cublas_handle[g->device]) {
        s = g_cublas.cublasCreate(&g_cublas_handle[g->device]);
        if (s != 0) {
            g_cublas_handle[g->device] = NULL;
            rc = cublas_error(ctx, MF_CUDA_ECUBLAS, s, "cublasCreate");
            goto done;
        }
    }
    h = g_cublas_handle[g->device];
    s = g_cublas.cublasSetStream(h, g->stream);
    if (s != 0) {
        rc = cublas_error(ctx, MF_CUDA_ECUBLAS, s, "cublasSetStream");
        goto done;
    }
    /* NOTE [cublas workspace]: cublasSetStream resets the workspace to
     * cuBLAS's own pool; hand it PyTorch's buffer afterwards so that every
     * byte is visible to torch.cuda.max_memory_allocated. */
    if (g->workspace && g->workspace_bytes && g_cublas.cublasSetWorkspace) {
        s = g_cublas.cublasSetWorkspace(h, g->workspace, g->workspace_bytes);
        if (s != 0) {
            rc = cublas_error(ctx, MF_CUDA_ECUBLAS, s, "cublasSetWorkspace");
            goto done;
        }
    }
    if (g->batch == 1)
        s = g_cublas.cublasGemmEx(h, g->transa, g->transb, g->m, g->n, g->k, alpha, g->A, g->dtype,
                                  g->lda, g->B, g->dtype, g->ldb, beta, g->C, g->dtype, g->ldc,
                                  compute, MF_CUBLAS_GEMM_DEFAULT);
    else
        s = g_cublas.cublasGemmStridedBatchedEx(
            h, g->transa, g->transb, g->m, g->n, g->k, alpha, g->A, g->dtype, g->lda, g->stride_a,
            g->B, g->dtype, g->ldb, g->stride_b, beta, g->C, g->dtype, g->ldc, g->stride_c,
            g->batch, compute, MF_CUBLAS_GEMM_DEFAULT);
    if (s != 0) {
        rc = cublas_error(ctx, MF_CUDA_ECUBLAS, s, g->batch == 1 ? "cublasGemmEx" : "cublasGemmStridedBatchedEx");
    }
done:
    leave_device(g->device, prev);
    return rc;
}

/* ---- cuBLASLt ---------------------------------------------------------------- */

static int cublaslt_error(mf_cuda_ctx *ctx, int status, mf_cublasStatus s, const char *what)
{
    const char *text = g_cublaslt.cublasLtGetStatusString ? g_cublaslt.cublasLtGetStatusString(s) : NULL;
    return mf_cuda_set_error(ctx, status, "%s failed: status %d (%s)", what, s, text ? text : "cuBLAS error");
}

long long mf_cuda_cublaslt_version(void)
{
    if (mf_cuda_load(MF_CUDA_LIB_CUBLASLT, NULL) != MF_OK || !g_cublaslt.cublasLtGetVersion)
        return -1;
    return (long long)g_cublaslt.cublasLtGetVersion();
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
    const mf_cuda_cublaslt_api *lt = &g_cublaslt;
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
    const mf_cuda_cublaslt_api *lt = &g_cublaslt;
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
    const mf_cuda_cublaslt_api *lt = &g_cublaslt;
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
    mf_cublasLtHandle h;
    mf_CUcontext prev = NULL;
    mf_cublasStatus s;
    const char *what = "cuBLASLt";
    float alpha = 1.0f, beta = 0.0f;
    int rc, returned = 0;

    rc = check_lt_args(g, ctx);
    if (rc != MF_OK)
        return rc;
    rc = enter_device(MF_CUDA_LIB_CUBLASLT, g->device, NULL, &prev, ctx);
    if (rc != MF_OK)
        return rc;
    if (!g_cublaslt_handle[g->device]) {
        s = g_cublaslt.cublasLtCreate(&g_cublaslt_handle[g->device]);
        if (s != 0) {
            g_cublaslt_handle[g->device] = NULL;
            rc = cublaslt_error(ctx, MF_CUDA_ECUBLAS, s, "cublasLtCreate");
            goto done;
        }
    }
    h = g_cublaslt_handle[g->device];

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
    s = g_cublaslt.cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, 1, &heur, &returned);
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
    s = g_cublaslt.cublasLtMatmul(h, desc, &alpha, g->A, la, g->B, lb, &beta, g->D, ld, g->D, ld, &heur.algo,
                                  g->workspace_bytes ? g->workspace : NULL,
                                  g->workspace ? g->workspace_bytes : 0, g->stream);
    if (s != 0) {
        rc = cublaslt_error(ctx, MF_CUDA_ECUBLAS, s, "cublasLtMatmul");
    }
release:
    if (pref)
        (void)g_cublaslt.cublasLtMatmulPreferenceDestroy(pref);
    if (ld)
        (void)g_cublaslt.cublasLtMatrixLayoutDestroy(ld);
    if (lb)
        (void)g_cublaslt.cublasLtMatrixLayoutDestroy(lb);
    if (la)
        (void)g_cublaslt.cublasLtMatrixLayoutDestroy(la);
    if (desc)
        (void)g_cublaslt.cublasLtMatmulDescDestroy(desc);
done:
    leave_device(g->device, prev);
    return rc;
}
