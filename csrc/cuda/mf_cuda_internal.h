/*
 * mf_cuda_internal.h -- what the CUDA layer's own files share (the loader
 * mf_cuda_load.c, the driver helpers mf_cuda_driver.c, cuBLAS/cuBLASLt
 * mf_cuda_blas.c); not for the binding.
 */
#ifndef MF_CUDA_INTERNAL_H
#define MF_CUDA_INTERNAL_H

#include "mf_cuda.h"

/* Devices with a primary context or a BLAS handle slot; a larger index is
 * bad input (MF_EINVAL). */
#define MF_CUDA_MAX_DEVICES 64

/* The entry of every device call (mf_cuda_driver.c): load the driver (and
 * lib, when it is not the driver), take the lock and make device's primary
 * context current.  On success the lock is held: end with
 * mf_cuda_leave_device, which puts back the thread's context (*prev, NOTE
 * [current context]).  On failure it is not held. */
int mf_cuda_enter_device(int lib, int device, mf_CUdevice *dev_out, mf_CUcontext *prev, mf_cuda_ctx *ctx);
void mf_cuda_leave_device(int device, mf_CUcontext prev);

#endif /* MF_CUDA_INTERNAL_H */
