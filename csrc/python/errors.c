/*
 * errors.c -- every status of csrc/core and csrc/cuda becomes a Python
 * exception here, and only here.
 *
 * NOTE [one error path]
 * The core (mf_core.h) and the CUDA layer (mf_cuda.h NOTE [cuda errors])
 * share one convention: a function returns an int status and leaves its
 * message in ctx->err; the statuses share one space (the CUDA layer's are
 * numbered apart from the core's).  The binding passes (status, message) to
 * mf_py_raise_status:
 *   MF_EINVAL, MF_ECYCLE       ValueError: bad input, the message names it
 *   MF_ENOMEM                  MemoryError
 *   MF_ECANCEL                 the pending exception (KeyboardInterrupt)
 *   MF_CUDA_ECOMPILE           KernelCompileError (cuda_py.c adds .log/.source)
 *   MF_CUDA_ENOALGO,
 *   MF_CUDA_EUNSUPPORTED       NotImplementedError: a case the CUDA layer does
 *                              not cover, the caller runs the torch ops
 *   other CUDA statuses        MemFuseError with the layer's message (a
 *                              library missing, a driver or cuBLAS failure)
 *   other core statuses        MemFuseError, "internal error (status N)"
 * MemFuseError and KernelCompileError live on the module (module.c,
 * cuda_py.c) and are looked up per raise: errors are rare and the binding
 * keeps no static PyObject globals.
 */
#include "mf_py.h"

#include "mf_cuda.h"

/* thunder_memfuse._C.<name>, or NULL (no exception set). */
static PyObject *module_type(const char *name)
{
    PyObject *type = NULL, *mod = PyImport_ImportModule("thunder_memfuse._C");
    if (mod) {
        type = PyObject_GetAttrString(mod, name);
        Py_DECREF(mod);
    }
    PyErr_Clear();
    return type;
}

PyObject *mf_py_raise_status(int status, const char *msg)
{
    PyObject *type;
    if (!msg)
        msg = "";
    switch (status) {
    case MF_ENOMEM:
        return PyErr_NoMemory();
    case MF_ECANCEL:
        /* the signal handler's exception (KeyboardInterrupt) is set */
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "thunder_memfuse: plan cancelled");
        return NULL;
    case MF_EINVAL:
    case MF_ECYCLE:
        PyErr_SetString(PyExc_ValueError, msg);
        return NULL;
    case MF_CUDA_ENOALGO:
    case MF_CUDA_EUNSUPPORTED:
        PyErr_SetString(PyExc_NotImplementedError, msg);
        return NULL;
    case MF_CUDA_ECOMPILE:
        type = module_type("KernelCompileError");
        PyErr_SetString(type ? type : PyExc_RuntimeError, msg);
        Py_XDECREF(type);
        return NULL;
    default:
        /* RuntimeError, MemFuseError's base, if the type cannot be found */
        type = module_type("MemFuseError");
        if (status >= MF_CUDA_ENOTFOUND)
            PyErr_SetString(type ? type : PyExc_RuntimeError, msg);
        else
            PyErr_Format(type ? type : PyExc_RuntimeError, "thunder_memfuse internal error (status %d): %s",
                         status, msg);
        Py_XDECREF(type);
        return NULL;
    }
}

PyObject *mf_py_raise(const mf_ctx *ctx, int status)
{
    return mf_py_raise_status(status, ctx->err);
}
