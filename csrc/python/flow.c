/*
 * flow.c -- thunder_memfuse._C.min_cut: the core's maximum flow and the
 * minimum cut closest to the sink (mf_flow.c NOTE [min cut]), for the fusion
 * pass's rematerialization (thunder_memfuse/integration/_rematerialize.py).
 */
#include "mf_py.h"

/* The items of sequence `o` (named `what`) as int32 (is64 0) or int64 (is64 1) into out[len];
 * the length must be len.  0 or -1 (exception). */
static int read_ints(PyObject *o, const char *what, Py_ssize_t len, void *out, int is64)
{
    PyObject *fast = PySequence_Fast(o, what);
    Py_ssize_t i, k;
    if (!fast)
        return -1;
    k = PySequence_Fast_GET_SIZE(fast);
    if (k != len) {
        PyErr_Format(PyExc_ValueError, "min_cut: %s has %zd items, src has %zd", what, k, len);
        Py_DECREF(fast);
        return -1;
    }
    for (i = 0; i < len; i++) {
        PyObject *x = PySequence_Fast_GET_ITEM(fast, i);
        long long v;
        if (!PyLong_Check(x) || PyBool_Check(x)) {
            PyErr_Format(PyExc_TypeError, "min_cut: %s[%zd] must be an int, not %.100s", what, i,
                         Py_TYPE(x)->tp_name);
            Py_DECREF(fast);
            return -1;
        }
        v = PyLong_AsLongLong(x);
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
        if (is64) {
            ((int64_t *)out)[i] = (int64_t)v;
        } else {
            if (v < INT32_MIN || v > INT32_MAX) {
                PyErr_Format(PyExc_ValueError, "min_cut: %s[%zd] = %lld is out of range", what, i, v);
                Py_DECREF(fast);
                return -1;
            }
            ((int32_t *)out)[i] = (int32_t)v;
        }
    }
    Py_DECREF(fast);
    return 0;
}

static PyObject *py_min_cut(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"n", "src", "dst", "capacity", "source", "sink", NULL};
    PyObject *src_o, *dst_o, *cap_o, *result = NULL, *side_o = NULL;
    int n, s, t, status;
    Py_ssize_t m;
    int32_t *src = NULL, *dst = NULL;
    int64_t *cap = NULL, flow = 0;
    uint8_t *side = NULL;
    mf_ctx ctx;
    (void)self;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iOOOii:min_cut", kwlist, &n, &src_o, &dst_o, &cap_o, &s, &t))
        return NULL;
    m = PySequence_Size(src_o);
    if (m < 0)
        return NULL;
    if (n < 2 || m > INT32_MAX / 2 - 1) {
        PyErr_Format(PyExc_ValueError, "min_cut: need at least 2 nodes and fewer than 2**30 edges (n %d, %zd edges)",
                     n, m);
        return NULL;
    }
    src = PyMem_Malloc((size_t)(m ? m : 1) * sizeof(int32_t));
    dst = PyMem_Malloc((size_t)(m ? m : 1) * sizeof(int32_t));
    cap = PyMem_Malloc((size_t)(m ? m : 1) * sizeof(int64_t));
    side = PyMem_Malloc((size_t)n);
    if (!src || !dst || !cap || !side) {
        PyErr_NoMemory();
        goto out;
    }
    if (read_ints(src_o, "src", m, src, 0) < 0 || read_ints(dst_o, "dst", m, dst, 0) < 0 ||
        read_ints(cap_o, "capacity", m, cap, 1) < 0)
        goto out;
    mf_py_ctx_init(&ctx);
    Py_BEGIN_ALLOW_THREADS
    status = mf_min_cut(&ctx, n, (int32_t)m, src, dst, cap, s, t, &flow, side);
    Py_END_ALLOW_THREADS
    if (status != MF_OK) {
        mf_py_raise(&ctx, status);
        goto out;
    }
    side_o = PyBytes_FromStringAndSize((const char *)side, n);
    if (side_o)
        result = Py_BuildValue("(LN)", (long long)flow, side_o);
out:
    PyMem_Free(src);
    PyMem_Free(dst);
    PyMem_Free(cap);
    PyMem_Free(side);
    return result;
}

static PyMethodDef flow_methods[] = {
    {"min_cut", (PyCFunction)(void (*)(void))py_min_cut, METH_VARARGS | METH_KEYWORDS,
     "min_cut($module, /, n, src, dst, capacity, source, sink)\n--\n\n"
     "A maximum flow from source to sink over the directed edges src[i] -> dst[i] of a graph of n nodes, "
     "capacity[i] a non-negative int or -1 (infinite); returns (flow, sink_side), sink_side a bytes of n "
     "flags, 1 for the nodes that reach the sink in the residual graph (the minimum cut closest to the sink, "
     "the partition networkx's minimum_cut returns).  ValueError for bad edges or where a path of infinite "
     "capacity joins source and sink."},
    {NULL, NULL, 0, NULL},
};

int mf_py_flow_exec(PyObject *module)
{
    return PyModule_AddFunctions(module, flow_methods);
}
