/*
 * trace_walk.c -- the trace reader's bookkeeping (trace_walk.h): values by
 * proxy name and their sizes.  trace.c reads what each bound symbol is; the
 * core's builder (csrc/core/mf_build.c) derives the graph's edges.
 */
#include "trace_walk.h"
#include <math.h>
#include <string.h>

int mf_walk_raise(walk_t *w)
{
    if (w->B.g.nomem) {
        PyErr_NoMemory();
        return -1;
    }
    mf_py_raise(&w->B.g.ctx, MF_EINVAL);
    return -1;
}

void mf_walk_free(walk_t *w)
{
    mf_builder_free(&w->B);
    Py_CLEAR(w->ids);
    Py_CLEAR(w->names);
}

/* Bytes of a proxy (see NOTE [sizes]); -1 with an exception on failure. */
int mf_walk_proxy_bytes(const walk_t *w, PyObject *p, PyObject *name, int64_t *out)
{
    PyObject *shape = NULL, *seq = NULL, *dtype = NULL, *db = NULL;
    int is_t;
    double numel = 1.0, per;
    Py_ssize_t i;
    int rc = -1;

    *out = 0;
    if ((is_t = PyObject_IsInstance(p, w->tensor_type)) < 0)
        return -1;
    if (!is_t)
        return 0;
    if (!(shape = PyObject_GetAttrString(p, "shape")))
        goto done;
    if (!(seq = mf_py_tuple(shape, "TensorProxy.shape")))
        goto done;
    for (i = 0; i < PyTuple_GET_SIZE(seq); i++) {
        PyObject *d = PyTuple_GET_ITEM(seq, i), *val = NULL;
        long long v;
        if (!PyLong_CheckExact(d)) {
            /* a symbolic dimension (IntegerProxy): plan for the value it had when
             * traced (NOTE [sizes]); without one the size is unknown */
            val = PyObject_GetAttrString(d, "value");
            if (!val || !PyLong_CheckExact(val)) {
                Py_XDECREF(val);
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "unknown shape: dimension %zd of %S is %.60s without an int value",
                             i, name, Py_TYPE(d)->tp_name);
                goto done;
            }
            d = val;
        }
        v = PyLong_AsLongLong(d);
        Py_XDECREF(val);
        if (v == -1 && PyErr_Occurred())
            goto done;
        if (v < 0) {
            PyErr_Format(PyExc_ValueError, "unknown shape: dimension %zd of %S is negative", i, name);
            goto done;
        }
        numel *= (double)v;
    }
    if (!(dtype = PyObject_GetAttrString(p, "dtype")))
        goto done;
    if (!(db = PyObject_GetAttrString(dtype, "bytes")))
        goto done;
    per = PyFloat_AsDouble(db);
    if (per == -1.0 && PyErr_Occurred())
        goto done;
    if (!(per >= 0.0) || numel * per > 9.0e18) {
        PyErr_Format(PyExc_ValueError, "size of %S out of range", name);
        goto done;
    }
    *out = (int64_t)ceil(numel * per);
    rc = 0;
done:
    Py_XDECREF(shape);
    Py_XDECREF(seq);
    Py_XDECREF(dtype);
    Py_XDECREF(db);
    return rc;
}

/* Value id of a proxy read by an op; unknown names become graph inputs. */
int32_t mf_walk_value_of(walk_t *w, PyObject *p, int create_as_input)
{
    PyObject *name = PyObject_GetAttrString(p, "name"), *idobj;
    int32_t v = -1;
    int64_t bytes;
    if (!name)
        return -1;
    idobj = PyDict_GetItemWithError(w->ids, name); /* borrowed */
    if (idobj) {
        v = (int32_t)PyLong_AsLong(idobj);
        goto done;
    }
    if (PyErr_Occurred() || !create_as_input)
        goto done;
    if (mf_walk_proxy_bytes(w, p, name, &bytes) < 0)
        goto done;
    if ((v = mf_build_input(&w->B, bytes)) < 0) {
        mf_walk_raise(w);
        goto done;
    }
    if (mf_walk_bind(w, p, v) < 0)
        v = -1;
done:
    Py_DECREF(name);
    return v;
}

static int append_name(walk_t *w, PyObject *label, int32_t v)
{
    if (PyList_GET_SIZE(w->names) != v) {
        PyErr_Format(PyExc_SystemError, "trace reader: value %d named out of order", (int)v);
        return -1;
    }
    return PyList_Append(w->names, label);
}

int mf_walk_bind(walk_t *w, PyObject *p, int32_t v)
{
    PyObject *name = PyObject_GetAttrString(p, "name"), *iv = NULL;
    int rc = -1;
    if (!name)
        return -1;
    if ((iv = PyLong_FromLong(v)) && PyDict_SetItem(w->ids, name, iv) == 0 && append_name(w, name, v) == 0)
        rc = 0;
    Py_XDECREF(iv);
    Py_DECREF(name);
    return rc;
}

int mf_walk_label(walk_t *w, PyObject *label)
{
    return append_name(w, label, (int32_t)PyList_GET_SIZE(w->names));
}
