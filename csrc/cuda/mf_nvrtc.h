/*
 * mf_nvrtc.h -- compile generated CUDA C with NVRTC, with a memory and a disk
 * cache of the resulting images (cubin or PTX).
 *
 * Invariants:
 *  - The cache key is the full text "version line + NVRTC version + options +
 *    kernel name + source"; its FNV-1a 64 hash only names the entry.  Both
 *    caches compare the whole key, so a hash collision can never hand back the
 *    wrong kernel.
 *  - Disk entries are written to a temporary file and renamed into place, so
 *    a reader sees a complete entry or none.  Disk problems never fail a
 *    compile (they are counted in the stats).
 *  - C99, no Python.h; int status + message in a caller buffer.
 */
#ifndef MF_NVRTC_H
#define MF_NVRTC_H

#include <stddef.h>
#include <stdint.h>

#include "mf_cuda.h" /* mf_cuda_ctx, the statuses (NOTE [cuda errors]) */

#ifdef __cplusplus
extern "C" {
#endif

enum { MF_NVRTC_AUTO = 0, MF_NVRTC_CUBIN = 1, MF_NVRTC_PTX = 2 };

typedef struct mf_nvrtc_result {
    char *image;          /* malloc'd; PTX is NUL-terminated (size counts the NUL) */
    size_t size;
    int is_cubin;
    char *log;            /* malloc'd compile log ("" when none); NULL for cache hits */
    char origin[16];      /* "memory", "disk" or "compiled" */
    char target[32];      /* "sm_90" (cubin) or "compute_90" (PTX) */
    uint64_t key_hash;
} mf_nvrtc_result;

typedef struct mf_nvrtc_cache_stats {
    long long memory_entries;
    long long memory_hits;
    long long disk_hits;
    long long disk_writes;
    long long disk_errors;
    long long compiles;
    long long compile_failures;
} mf_nvrtc_cache_stats;

void mf_nvrtc_result_free(mf_nvrtc_result *r);

/* NVRTC version (loads NVRTC on demand). */
int mf_nvrtc_version(int *major, int *minor, mf_cuda_ctx *ctx);
/* Supported SM numbers (e.g. 75, 80, ..., 120); *n = 0 when NVRTC cannot say. */
int mf_nvrtc_supported_archs(int *archs, int max, int *n, mf_cuda_ctx *ctx);

/*
 * Compile src (its __global__ function `name`) for a device of compute
 * capability `arch` (major*10+minor).
 *   mode MF_NVRTC_AUTO: cubin for sm_<arch> when this NVRTC supports it, else
 *     PTX for the newest supported compute_XX <= arch (the driver JITs it);
 *   MF_NVRTC_CUBIN / MF_NVRTC_PTX force one kind for exactly <arch>.
 * cache_dir: NULL -> $THUNDER_MEMFUSE_CACHE or ~/.cache/thunder_memfuse/kernels;
 *   "" -> no disk cache.  use_cache = 0 skips both caches (always compiles).
 * On MF_CUDA_ECOMPILE, log_out (if not NULL) receives the malloc'd NVRTC log.
 */
int mf_nvrtc_compile(const char *src, const char *name, int arch, int mode, const char *cache_dir,
                     int use_cache, mf_nvrtc_result *out, char **log_out, mf_cuda_ctx *ctx);

void mf_nvrtc_cache_stats_get(mf_nvrtc_cache_stats *out);
/* Drop the memory cache (the disk cache stays). */
void mf_nvrtc_cache_clear(void);
/* The disk cache directory that a NULL cache_dir means now ("" if none). */
void mf_nvrtc_default_cache_dir(char *buf, size_t buflen);

/* FNV-1a 64 (exposed for tests and for kernel names). */
uint64_t mf_nvrtc_hash(const void *data, size_t len, uint64_t seed);
#define MF_NVRTC_HASH_SEED 0xcbf29ce484222325ULL

#ifdef __cplusplus
}
#endif
#endif /* MF_NVRTC_H */
