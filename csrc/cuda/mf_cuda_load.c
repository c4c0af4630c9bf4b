/*
 * mf_cuda_load.c -- dlopen() loader for the CUDA driver, NVRTC, cuBLAS and
 * cuBLASLt: the symbol tables, the library search, the lock and the error
 * context.  The driver helpers are in mf_cuda_driver.c, cuBLAS and cuBLASLt
 * in mf_cuda_blas.c.
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
