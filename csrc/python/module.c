/*
 * module.c -- thunder_memfuse._C: PEP 489 multi-phase init.
 *
 * The exec slot asks each part of the binding to add its functions:
 * plan.c (the C core: plan, simulate), trace.c (reading Thunder traces),
 * cuda_py.c (CUDA loader, code generator, NVRTC, cuBLAS) and flow.c (min_cut).  No static
 * PyObject globals and no module state (m_size 0): the exception types are
 * attributes of the module, looked up per raise (errors.c).
 *
 * MemFuseError (a RuntimeError) is the base of every exception the package
 * defines: the binding's own (internal errors, KernelCompileError) and the
 * Python side's (thunder_memfuse.MemFuseError is this type).  Bad input stays
 * ValueError / TypeError.
 */
#include "mf_py.h"

static int add_base_error(PyObject *m)
{
    int rc;
    PyObject *exc = PyErr_NewExceptionWithDoc(
        "thunder_memfuse.MemFuseError",
        "Base class of thunder_memfuse's errors: internal failures of the C core, kernels that\n"
        "do not compile (KernelCompileError), and MemFuse(strict=True) refusing a trace.",
        PyExc_RuntimeError, NULL);
    if (!exc)
        return -1;
    rc = PyModule_AddObjectRef(m, "MemFuseError", exc);
    Py_DECREF(exc);
    return rc;
}

static int mf_exec(PyObject *m)
{
    if (add_base_error(m) < 0)
        return -1;
    if (mf_py_plan_exec(m) < 0)
        return -1;
    if (mf_py_trace_exec(m) < 0)
        return -1;
    if (mf_py_cuda_exec(m) < 0)
        return -1;
    if (mf_py_flow_exec(m) < 0)
        return -1;
    return 0;
}

static PyModuleDef_Slot mf_slots[] = {
    {Py_mod_exec, (void *)mf_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef mf_module = {
    PyModuleDef_HEAD_INIT,
    "thunder_memfuse._C",
    "C core of thunder_memfuse: memory-aware scheduler, Thunder trace reader, CUDA kernels.",
    0,
    NULL,
    mf_slots,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__C(void);

PyMODINIT_FUNC PyInit__C(void)
{
    return PyModuleDef_Init(&mf_module);
}
