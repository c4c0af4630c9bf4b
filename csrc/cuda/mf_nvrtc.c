/*
 * mf_nvrtc.c -- NVRTC compilation of generated kernels and the kernel cache
 * (memory + disk).  See mf_nvrtc.h for the invariants.
 *
 * NOTE [kernel cache]
 *  key text  = "thunder_memfuse-kernel-v1\nnvrtc=<maj>.<min>\ntarget=<sm_90|compute_90>\n"
 *              "options=<opts>\nname=<kernel>\n" + source
 *  file name = <dir>/<fnv1a64(key) as 16 hex>-<target>.<cubin|ptx>
 *  file body = "MFK1" | u64 key length | key | u64 image length | image
 *  (native-endian: the cache lives in the user's home, not shared across
 *  machines).  A reader accepts an entry only if the stored key equals the
 *  wanted one byte for byte.  The memory cache holds the same key/image pairs
 *  and is consulted first.
 */
#define _GNU_SOURCE
#include "mf_nvrtc.h"
#include "mf_cuda.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define KEY_VERSION "thunder_memfuse-kernel-v1"
/* Options besides the target.  Part of the key. */
#define NVRTC_OPTIONS "--std=c++17"
#define MAX_ARCHS 64

typedef struct cache_entry {
    uint64_t hash;
    char *key;
    size_t key_len;
    char *image;
    size_t size;
    int is_cubin;
    char target[32];
} cache_entry;

static cache_entry *g_entries;
static size_t g_nentries, g_capentries;
static mf_nvrtc_cache_stats g_stats;

uint64_t mf_nvrtc_hash(const void *data, size_t len, uint64_t seed)
{
    const unsigned char *p = (const unsigned char *)data;
    uint64_t h = seed;
    size_t i;
    for (i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

void mf_nvrtc_result_free(mf_nvrtc_result *r)
{
    if (!r)
        return;
    free(r->image);
    free(r->log);
    r->image = NULL;
    r->log = NULL;
    r->size = 0;
}

static int nvrtc_error(mf_cuda_ctx *ctx, int status, mf_nvrtcResult res, const char *what)
{
    const char *text = mf_cuda_nvrtc()->nvrtcGetErrorString
                           ? mf_cuda_nvrtc()->nvrtcGetErrorString(res)
                           : NULL;
    return mf_cuda_set_error(ctx, status, "%s failed: %s (%d)", what, text ? text : "NVRTC error", res);
}

int mf_nvrtc_version(int *major, int *minor, mf_cuda_ctx *ctx)
{
    mf_nvrtcResult r;
    int rc = mf_cuda_load(MF_CUDA_LIB_NVRTC, ctx);
    if (rc != MF_OK)
        return rc;
    r = mf_cuda_nvrtc()->nvrtcVersion(major, minor);
    if (r != 0) {
        return nvrtc_error(ctx, MF_CUDA_ENVRTC, r, "nvrtcVersion");
    }
    return MF_OK;
}

int mf_nvrtc_supported_archs(int *archs, int max, int *n, mf_cuda_ctx *ctx)
{
    const mf_cuda_nvrtc_api *api;
    int count = 0, all[MAX_ARCHS], i;
    mf_nvrtcResult r;
    int rc = mf_cuda_load(MF_CUDA_LIB_NVRTC, ctx);
    *n = 0;
    if (rc != MF_OK)
        return rc;
    api = mf_cuda_nvrtc();
    if (!api->nvrtcGetNumSupportedArchs || !api->nvrtcGetSupportedArchs)
        return MF_OK;
    r = api->nvrtcGetNumSupportedArchs(&count);
    if (r != 0) {
        return nvrtc_error(ctx, MF_CUDA_ENVRTC, r, "nvrtcGetNumSupportedArchs");
    }
    if (count > MAX_ARCHS)
        count = MAX_ARCHS;
    r = api->nvrtcGetSupportedArchs(all);
    if (r != 0) {
        return nvrtc_error(ctx, MF_CUDA_ENVRTC, r, "nvrtcGetSupportedArchs");
    }
    for (i = 0; i < count && i < max; i++)
        archs[i] = all[i];
    *n = i;
    return MF_OK;
}

/* ---- key and target -------------------------------------------------------- */

/* Pick the target per the mode; fills target ("sm_90"/"compute_90") and *cubin. */
static int choose_target(int arch, int mode, char *target, size_t tlen, int *cubin, mf_cuda_ctx *ctx)
{
    int archs[MAX_ARCHS], n = 0, i, best = -1, exact = 0;
    int rc = mf_nvrtc_supported_archs(archs, MAX_ARCHS, &n, ctx);
    const mf_cuda_nvrtc_api *api = mf_cuda_nvrtc();
    if (rc != MF_OK)
        return rc;
    if (arch <= 0)
        return mf_cuda_set_error(ctx, MF_EINVAL, "bad compute capability %d", arch);
    for (i = 0; i < n; i++) {
        if (archs[i] == arch)
            exact = 1;
        if (archs[i] <= arch && archs[i] > best)
            best = archs[i];
    }
    if (mode == MF_NVRTC_CUBIN || (mode == MF_NVRTC_AUTO && exact)) {
        if (!api->nvrtcGetCUBIN || !api->nvrtcGetCUBINSize) {
            if (mode == MF_NVRTC_CUBIN) {
                return mf_cuda_set_error(ctx, MF_CUDA_ENVRTC, "this NVRTC cannot produce cubin (no nvrtcGetCUBIN)");
            }
        } else {
            snprintf(target, tlen, "sm_%d", arch);
            *cubin = 1;
            return MF_OK;
        }
    }
    if (mode == MF_NVRTC_AUTO && n > 0) {
        if (best < 0) {
            return mf_cuda_set_error(ctx, MF_CUDA_ENVRTC, "device sm_%d is older than every architecture this NVRTC supports "
                                 "(oldest sm_%d)", arch, archs[0]);
        }
        arch = best;
    }
    snprintf(target, tlen, "compute_%d", arch);
    *cubin = 0;
    return MF_OK;
}

static char *make_key(const char *src, const char *name, const char *target, int major,
                      int minor, size_t *len_out)
{
    char head[512];
    size_t hlen, slen = strlen(src);
    char *key;
    snprintf(head, sizeof head, "%s\nnvrtc=%d.%d\ntarget=%s\noptions=%s\nname=%s\n", KEY_VERSION,
             major, minor, target, NVRTC_OPTIONS, name);
    hlen = strlen(head);
    key = (char *)malloc(hlen + slen + 1);
    if (!key)
        return NULL;
    memcpy(key, head, hlen);
    memcpy(key + hlen, src, slen + 1);
    *len_out = hlen + slen;
    return key;
}

/* ---- memory cache (lock held) -------------------------------------------- */

static cache_entry *mem_find(uint64_t hash, const char *key, size_t key_len)
{
    size_t i;
    for (i = 0; i < g_nentries; i++) {
        cache_entry *e = &g_entries[i];
        if (e->hash == hash && e->key_len == key_len && memcmp(e->key, key, key_len) == 0)
            return e;
    }
    return NULL;
}

static void mem_insert(uint64_t hash, const char *key, size_t key_len, const char *image,
                       size_t size, int is_cubin, const char *target)
{
    cache_entry *e;
    if (mem_find(hash, key, key_len))
        return;
    if (g_nentries == g_capentries) {
        size_t cap = g_capentries ? g_capentries * 2 : 16;
        cache_entry *grown = (cache_entry *)realloc(g_entries, cap * sizeof *grown);
        if (!grown)
            return; /* caching is best effort */
        g_entries = grown;
        g_capentries = cap;
    }
    e = &g_entries[g_nentries];
    e->key = (char *)malloc(key_len);
    e->image = (char *)malloc(size ? size : 1);
    if (!e->key || !e->image) {
        free(e->key);
        free(e->image);
        return;
    }
    memcpy(e->key, key, key_len);
    memcpy(e->image, image, size);
    e->hash = hash;
    e->key_len = key_len;
    e->size = size;
    e->is_cubin = is_cubin;
    snprintf(e->target, sizeof e->target, "%s", target);
    g_nentries++;
    g_stats.memory_entries = (long long)g_nentries;
}

void mf_nvrtc_cache_clear(void)
{
    size_t i;
    mf_cuda_lock();
    for (i = 0; i < g_nentries; i++) {
        free(g_entries[i].key);
        free(g_entries[i].image);
    }
    free(g_entries);
    g_entries = NULL;
    g_nentries = g_capentries = 0;
    g_stats.memory_entries = 0;
    mf_cuda_unlock();
}

void mf_nvrtc_cache_stats_get(mf_nvrtc_cache_stats *out)
{
    mf_cuda_lock();
    *out = g_stats;
    mf_cuda_unlock();
}

/* ---- disk cache ------------------------------------------------------------ */

void mf_nvrtc_default_cache_dir(char *buf, size_t buflen)
{
    const char *env = getenv("THUNDER_MEMFUSE_CACHE");
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (env && env[0])
        snprintf(buf, buflen, "%s", env);
    else if (xdg && xdg[0])
        snprintf(buf, buflen, "%s/thunder_memfuse/kernels", xdg);
    else if (home && home[0])
        snprintf(buf, buflen, "%s/.cache/thunder_memfuse/kernels", home);
    else
        buf[0] = '\0';
}

/* mkdir -p; 0 on success. */
static int make_dirs(const char *dir)
{
    char path[1024];
    size_t i, len = strlen(dir);
    if (len == 0 || len >= sizeof path)
        return -1;
    memcpy(path, dir, len + 1);
    for (i = 1; i <= len; i++) {
        if (path[i] == '/' || path[i] == '\0') {
            char c = path[i];
            path[i] = '\0';
            if (mkdir(path, 0755) != 0 && errno != EEXIST)
                return -1;
            path[i] = c;
        }
    }
    return 0;
}

static void entry_path(char *buf, size_t buflen, const char *dir, uint64_t hash, const char *target,
                       int is_cubin)
{
    snprintf(buf, buflen, "%s/%016llx-%s.%s", dir, (unsigned long long)hash, target,
             is_cubin ? "cubin" : "ptx");
}

/* 1 and a malloc'd image on a hit; 0 otherwise. */
static int disk_read(const char *path, const char *key, size_t key_len, char **image,
                     size_t *size)
{
    FILE *f = fopen(path, "rb");
    char magic[4];
    uint64_t klen = 0, ilen = 0;
    char *kbuf = NULL, *ibuf = NULL;
    int hit = 0;
    if (!f)
        return 0;
    if (fread(magic, 1, 4, f) != 4 || memcmp(magic, "MFK1", 4) != 0)
        goto out;
    if (fread(&klen, sizeof klen, 1, f) != 1 || klen != (uint64_t)key_len)
        goto out;
    kbuf = (char *)malloc(key_len ? key_len : 1);
    if (!kbuf || fread(kbuf, 1, key_len, f) != key_len || memcmp(kbuf, key, key_len) != 0)
        goto out;
    if (fread(&ilen, sizeof ilen, 1, f) != 1 || ilen == 0 || ilen > ((uint64_t)1 << 31))
        goto out;
    ibuf = (char *)malloc((size_t)ilen);
    if (!ibuf || fread(ibuf, 1, (size_t)ilen, f) != (size_t)ilen)
        goto out;
    *image = ibuf;
    *size = (size_t)ilen;
    ibuf = NULL;
    hit = 1;
out:
    free(kbuf);
    free(ibuf);
    fclose(f);
    return hit;
}

static int disk_write(const char *dir, const char *path, const char *key, size_t key_len,
                      const char *image, size_t size)
{
    char tmp[1300];
    FILE *f;
    uint64_t klen = key_len, ilen = size;
    int ok, w;
    if (make_dirs(dir) != 0)
        return -1;
    w = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (w < 0 || (size_t)w >= sizeof tmp)
        return -1;
    f = fopen(tmp, "wb");
    if (!f)
        return -1;
    ok = fwrite("MFK1", 1, 4, f) == 4 && fwrite(&klen, sizeof klen, 1, f) == 1 &&
         fwrite(key, 1, key_len, f) == key_len && fwrite(&ilen, sizeof ilen, 1, f) == 1 &&
         fwrite(image, 1, size, f) == size;
    if (fclose(f) != 0)
        ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return -1;
    }
    return 0;
}

/* ---- compile ------------------------------------------------------------- */

/* Run NVRTC.  On success the image (and its size) is malloc'd; *log always set (may be ""). */
static int run_nvrtc(const char *src, const char *name, const char *target, int cubin,
                     char **image, size_t *size, char **log, mf_cuda_ctx *ctx)
{
    const mf_cuda_nvrtc_api *api = mf_cuda_nvrtc();
    mf_nvrtcProgram prog = NULL;
    mf_nvrtcResult r, cr;
    char arch_opt[64];
    const char *opts[2];
    size_t log_size = 0, n = 0;
    char *buf = NULL;
    int rc = MF_OK;

    *image = NULL;
    *log = NULL;
    snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", target);
    opts[0] = arch_opt;
    opts[1] = NVRTC_OPTIONS;
    r = api->nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL);
    if (r != 0) {
        return nvrtc_error(ctx, MF_CUDA_ENVRTC, r, "nvrtcCreateProgram");
    }
    cr = api->nvrtcCompileProgram(prog, 2, opts);
    if (api->nvrtcGetProgramLogSize(prog, &log_size) == 0 && log_size > 0) {
        *log = (char *)malloc(log_size + 1);
        if (*log) {
            if (api->nvrtcGetProgramLog(prog, *log) != 0)
                (*log)[0] = '\0';
            (*log)[log_size] = '\0';
        }
    }
    if (!*log) {
        *log = (char *)malloc(1);
        if (*log)
            (*log)[0] = '\0';
    }
    if (cr != 0) {
        rc = cr == 6 /* NVRTC_ERROR_COMPILATION */ ? MF_CUDA_ECOMPILE : MF_CUDA_ENVRTC;
        nvrtc_error(ctx, rc, cr, "nvrtcCompileProgram");
        if (rc == MF_CUDA_ENVRTC && *log && strstr(*log, "error"))
            rc = MF_CUDA_ECOMPILE;
        goto out;
    }
    r = cubin ? api->nvrtcGetCUBINSize(prog, &n) : api->nvrtcGetPTXSize(prog, &n);
    if (r != 0 || n == 0) {
        rc = nvrtc_error(ctx, MF_CUDA_ENVRTC, r, cubin ? "nvrtcGetCUBINSize" : "nvrtcGetPTXSize");
        goto out;
    }
    buf = (char *)malloc(n + 1);
    if (!buf) {
        rc = mf_cuda_set_error(ctx, MF_ENOMEM, "out of memory");
        goto out;
    }
    r = cubin ? api->nvrtcGetCUBIN(prog, buf) : api->nvrtcGetPTX(prog, buf);
    if (r != 0) {
        rc = nvrtc_error(ctx, MF_CUDA_ENVRTC, r, cubin ? "nvrtcGetCUBIN" : "nvrtcGetPTX");
        free(buf);
        goto out;
    }
    buf[n] = '\0';
    *image = buf;
    *size = n; /* the PTX size reported by NVRTC already counts its NUL */
out:
    api->nvrtcDestroyProgram(&prog);
    return rc;
}

int mf_nvrtc_compile(const char *src, const char *name, int arch, int mode, const char *cache_dir,
                     int use_cache, mf_nvrtc_result *out, char **log_out, mf_cuda_ctx *ctx)
{
    char target[32], dir[1024], path[1200];
    int cubin = 0, major = 0, minor = 0, rc;
    char *key = NULL, *image = NULL, *log = NULL;
    size_t key_len = 0, size = 0;
    uint64_t hash;
    cache_entry *hit;

    memset(out, 0, sizeof *out);
    if (log_out)
        *log_out = NULL;
    if (!src || !name) {
        return mf_cuda_set_error(ctx, MF_EINVAL, "no source or kernel name");
    }
    rc = mf_nvrtc_version(&major, &minor, ctx);
    if (rc != MF_OK)
        return rc;
    rc = choose_target(arch, mode, target, sizeof target, &cubin, ctx);
    if (rc != MF_OK)
        return rc;
    key = make_key(src, name, target, major, minor, &key_len);
    if (!key) {
        return mf_cuda_set_error(ctx, MF_ENOMEM, "out of memory");
    }
    hash = mf_nvrtc_hash(key, key_len, MF_NVRTC_HASH_SEED);
    out->key_hash = hash;
    out->is_cubin = cubin;
    snprintf(out->target, sizeof out->target, "%s", target);

    if (cache_dir)
        snprintf(dir, sizeof dir, "%s", cache_dir);
    else
        mf_nvrtc_default_cache_dir(dir, sizeof dir);
    entry_path(path, sizeof path, dir, hash, target, cubin);

    if (use_cache) {
        mf_cuda_lock();
        hit = mem_find(hash, key, key_len);
        if (hit) {
            image = (char *)malloc(hit->size);
            if (image) {
                memcpy(image, hit->image, hit->size);
                size = hit->size;
                g_stats.memory_hits++;
            }
        }
        mf_cuda_unlock();
        if (image) {
            snprintf(out->origin, sizeof out->origin, "memory");
            goto done;
        }
        if (dir[0] && disk_read(path, key, key_len, &image, &size)) {
            mf_cuda_lock();
            g_stats.disk_hits++;
            mem_insert(hash, key, key_len, image, size, cubin, target);
            mf_cuda_unlock();
            snprintf(out->origin, sizeof out->origin, "disk");
            goto done;
        }
    }

    rc = run_nvrtc(src, name, target, cubin, &image, &size, &log, ctx);
    mf_cuda_lock();
    if (rc == MF_OK)
        g_stats.compiles++;
    else
        g_stats.compile_failures++;
    mf_cuda_unlock();
    if (rc != MF_OK) {
        if (log_out)
            *log_out = log;
        else
            free(log);
        free(key);
        return rc;
    }
    snprintf(out->origin, sizeof out->origin, "compiled");
    out->log = log;
    if (use_cache) {
        int werr = dir[0] ? disk_write(dir, path, key, key_len, image, size) : 0;
        mf_cuda_lock();
        mem_insert(hash, key, key_len, image, size, cubin, target);
        if (dir[0]) {
            if (werr == 0)
                g_stats.disk_writes++;
            else
                g_stats.disk_errors++;
        }
        mf_cuda_unlock();
    }
done:
    free(key);
    out->image = image;
    out->size = size;
    return MF_OK;
}
