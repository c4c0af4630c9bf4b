/*
 * fake_cuda.c -- a stand-in libcuda.so.1 for CPU tests of csrc/cuda (built by
 * tests/test_cublaslt.py).  It exports every symbol of
 * MF_CUDA_DRIVER_SYMBOLS with the driver's signatures, reports one device and
 * keeps a current context per thread, so the tests can check that entry points
 * put back the context they found (NOTE [current context]).  Nothing here
 * touches a GPU.
 */
#include <stdint.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define FAKE_DEVICES 1

static __thread void *current_ctx;
static char primary[FAKE_DEVICES];

EXPORT int cuInit(unsigned int flags) { return flags == 0 ? 0 : 1; }
EXPORT int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
EXPORT int cuDeviceGetCount(int *n) { *n = FAKE_DEVICES; return 0; }
EXPORT int cuDeviceGet(int *dev, int ordinal)
{
    if (ordinal < 0 || ordinal >= FAKE_DEVICES)
        return 101; /* CUDA_ERROR_INVALID_DEVICE */
    *dev = ordinal;
    return 0;
}
EXPORT int cuDeviceGetAttribute(int *value, int attrib, int dev)
{
    (void)dev;
    *value = attrib == 75 ? 9 : attrib == 76 ? 0 : attrib == 16 ? 132 : 0;
    return 0;
}
EXPORT int cuDeviceGetName(char *name, int len, int dev)
{
    (void)dev;
    strncpy(name, "fake", (size_t)len);
    return 0;
}
EXPORT int cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
    *ctx = &primary[dev];
    return 0;
}
EXPORT int cuCtxGetCurrent(void **ctx) { *ctx = current_ctx; return 0; }
EXPORT int cuCtxSetCurrent(void *ctx) { current_ctx = ctx; return 0; }
EXPORT int cuModuleLoadData(void **mod, const void *image) { (void)mod; (void)image; return 200; }
EXPORT int cuModuleGetFunction(void **fn, void *mod, const char *name)
{
    (void)fn; (void)mod; (void)name;
    return 500;
}
EXPORT int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                          unsigned bz, unsigned shmem, void *stream, void **params, void **extra)
{
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem;
    (void)stream; (void)params; (void)extra;
    return 0;
}
EXPORT int cuGetErrorName(int e, const char **s) { (void)e; *s = "FAKE_ERROR"; return 0; }
EXPORT int cuGetErrorString(int e, const char **s) { (void)e; *s = "fake driver error"; return 0; }

/* Test hooks: the calling thread's current context, and setting it. */
EXPORT uintptr_t fake_cu_current(void) { return (uintptr_t)current_ctx; }
EXPORT void fake_cu_set_current(uintptr_t ctx) { current_ctx = (void *)ctx; }
