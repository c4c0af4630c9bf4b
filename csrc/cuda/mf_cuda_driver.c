/*
 * mf_cuda_driver.c -- the CUDA driver helpers: cuInit, each device's primary
 * context (entered and left around every device call, NOTE [current
 * context]), device attributes, module load and kernel launch.
 *
 * State (the primary contexts, cuInit's result) is process-wide and guarded
 * by the loader's lock (NOTE [cuda lock] in mf_cuda.h).
 */
#include "mf_cuda_internal.h"

#include <stdio.h>

/* ---- driver helpers ----------------------------------------------------- */

static int g_init_done;          /* cuInit succeeded */
static mf_CUresult g_init_result;
static int g_init_tried;
static mf_CUcontext g_ctx[MF_CUDA_MAX_DEVICES];

/* A failed driver call: status with "what failed: name (code): text". */
static int cu_error(mf_cuda_ctx *ctx, int status, mf_CUresult r, const char *what)
{
    const char *name = NULL, *text = NULL;
    if (mf_cuda_driver()->cuGetErrorName)
        mf_cuda_driver()->cuGetErrorName(r, &name);
    if (mf_cuda_driver()->cuGetErrorString)
        mf_cuda_driver()->cuGetErrorString(r, &text);
    return mf_cuda_set_error(ctx, status, "%s failed: %s (%d): %s", what, name ? name : "CUDA_ERROR", r,
            text ? text : "unknown error");
}

/* Called with the lock held and the driver loaded. */
static int init_locked(mf_cuda_ctx *ctx)
{
    if (!g_init_tried) {
        g_init_tried = 1;
        g_init_result = mf_cuda_driver()->cuInit(0);
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
    r = mf_cuda_driver()->cuDriverGetVersion(driver_version);
    if (r != 0) {
        cu_error(ctx, MF_CUDA_EDRIVER, r, "cuDriverGetVersion");
        mf_cuda_unlock();
        return MF_CUDA_EDRIVER;
    }
    rc = init_locked(ctx);
    if (rc == MF_OK) {
        r = mf_cuda_driver()->cuDeviceGetCount(device_count);
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
    if (device < 0 || device >= MF_CUDA_MAX_DEVICES) {
        return mf_cuda_set_error(ctx, MF_EINVAL, "device index %d out of range", device);
    }
    r = mf_cuda_driver()->cuDeviceGet(&dev, device);
    if (r != 0) {
        return cu_error(ctx, MF_CUDA_ENODEV, r, "cuDeviceGet");
    }
    if (!g_ctx[device]) {
        r = mf_cuda_driver()->cuDevicePrimaryCtxRetain(&g_ctx[device], dev);
        if (r != 0) {
            g_ctx[device] = NULL;
            return cu_error(ctx, MF_CUDA_EDRIVER, r, "cuDevicePrimaryCtxRetain");
        }
    }
    r = mf_cuda_driver()->cuCtxGetCurrent(&cur);
    if (r != 0) {
        return cu_error(ctx, MF_CUDA_EDRIVER, r, "cuCtxGetCurrent");
    }
    if (cur != g_ctx[device]) {
        r = mf_cuda_driver()->cuCtxSetCurrent(g_ctx[device]);
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
        (void)mf_cuda_driver()->cuCtxSetCurrent(prev);
}

/* The entry of every device call: load the driver (and lib, when it is not
 * the driver), take the lock and make device's primary context current.  On
 * success the lock is held: end with mf_cuda_leave_device.  On failure it is
 * not (mf_cuda_internal.h). */
int mf_cuda_enter_device(int lib, int device, mf_CUdevice *dev_out, mf_CUcontext *prev, mf_cuda_ctx *ctx)
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

void mf_cuda_leave_device(int device, mf_CUcontext prev)
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
    int rc = mf_cuda_enter_device(MF_CUDA_LIB_DRIVER, device, &dev, &prev, ctx);
    if (rc != MF_OK)
        return rc;
    r = mf_cuda_driver()->cuDeviceGetAttribute(&major, MF_CU_ATTR_CC_MAJOR, dev);
    if (r == 0)
        r = mf_cuda_driver()->cuDeviceGetAttribute(&minor, MF_CU_ATTR_CC_MINOR, dev);
    if (r == 0)
        r = mf_cuda_driver()->cuDeviceGetAttribute(&sms, MF_CU_ATTR_MULTIPROCESSOR_COUNT, dev);
    if (r != 0) {
        rc = cu_error(ctx, MF_CUDA_EDRIVER, r, "cuDeviceGetAttribute");
    }
    mf_cuda_leave_device(device, prev);
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
    int rc = mf_cuda_enter_device(MF_CUDA_LIB_DRIVER, device, NULL, &prev, ctx);
    if (rc != MF_OK)
        return rc;
    r = mf_cuda_driver()->cuModuleLoadData(&mod, image);
    if (r != 0) {
        rc = cu_error(ctx, MF_CUDA_EDRIVER, r, "cuModuleLoadData");
    } else {
        r = mf_cuda_driver()->cuModuleGetFunction(fn_out, mod, name);
        if (r != 0) {
            rc = cu_error(ctx, MF_CUDA_EDRIVER, r, "cuModuleGetFunction");
        }
    }
    mf_cuda_leave_device(device, prev);
    return rc;
}

int mf_cuda_launch(int device, mf_CUfunction fn, unsigned int grid, unsigned int block,
                   mf_CUstream stream, void *params, mf_cuda_ctx *ctx)
{
    void *kernel_params[1];
    mf_CUcontext prev = NULL;
    mf_CUresult r;
    int rc = mf_cuda_enter_device(MF_CUDA_LIB_DRIVER, device, NULL, &prev, ctx);
    if (rc != MF_OK)
        return rc;
    kernel_params[0] = params;
    r = mf_cuda_driver()->cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, kernel_params, NULL);
    if (r != 0) {
        rc = cu_error(ctx, MF_CUDA_EDRIVER, r, "cuLaunchKernel");
    }
    mf_cuda_leave_device(device, prev);
    return rc;
}
