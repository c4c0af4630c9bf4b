/*
 * trace_walk.c -- the trace reader's bookkeeping (trace_walk.h): values by
 * proxy name, their sizes, ordering roots and per-storage reader lists.
 * trace.c decides what each bound symbol is; this file only records it.
 */
#include "trace_walk.h"
#include <math.h>
#include <string.h>

int mf_walk_grow_values(walk_t *w, int32_t need)
{
    int64_t nc;
    int32_t *r, *lw, *h;
    if (need <= w->cap_v)
        return 0;
    nc = w->cap_v ? (int64_t)w->cap_v * 2 : 64;
    while (nc < need)
        nc *= 2;
    if (nc > INT32_MAX)
        return -1;
    r = PyMem_RawRealloc(w->root, sizeof(int32_t) * (size_t)nc);
    if (!r)
        return -1;
    w->root = r;
    lw = PyMem_RawRealloc(w->last_writer, sizeof(int32_t) * (size_t)nc);
    if (!lw)
        return -1;
    w->last_writer = lw;
    h = PyMem_RawRealloc(w->head, sizeof(int32_t) * (size_t)nc);
    if (!h)
        return -1;
    w->head = h;
    w->cap_v = (int32_t)nc;
    return 0;
}

int mf_walk_add_reader(walk_t *w, int32_t root, int32_t op)
{
    if (w->n_rd + 1 > w->cap_rd) {
        int32_t nc = w->cap_rd ? w->cap_rd * 2 : 256;
        int32_t *a = PyMem_RawRealloc(w->rd_op, sizeof(int32_t) * (size_t)nc), *b;
        if (!a)
            return -1;
        w->rd_op = a;
        b = PyMem_RawRealloc(w->rd_next, sizeof(int32_t) * (size_t)nc);
        if (!b)
            return -1;
        w->rd_next = b;
        w->cap_rd = nc;
    }
    w->rd_op[w->n_rd] = op;
    w->rd_next[w->n_rd] = w->head[root];
    w->head[root] = w->n_rd++;
    return 0;
}

void mf_walk_free(walk_t *w)
{
    mf_gbuf_free(&w->g);
    Py_XDECREF(w->ids);
    Py_XDECREF(w->names);
    PyMem_RawFree(w->root);
    PyMem_RawFree(w->last_writer);
    PyMem_RawFree(w->head);
    PyMem_RawFree(w->rd_op);
    PyMem_RawFree(w->rd_next);
    PyMem_RawFree(w->comm);
    PyMem_RawFree(w->cheap);
}

/* Make w->cheap hold at least n ops (new entries 0). */
int mf_walk_grow_cheap(walk_t *w, int32_t n)
{
    int32_t nc;
    uint8_t *p;
    if (n <= w->cap_cheap)
        return 0;
    nc = w->cap_cheap ? w->cap_cheap * 2 : 256;
    while (nc < n)
        nc *= 2;
    if (!(p = PyMem_RawRealloc(w->cheap, (size_t)nc)))
        return -1;
    memset(p + w->cap_cheap, 0, (size_t)(nc - w->cap_cheap));
    w->cheap = p;
    w->cap_cheap = nc;
    return 0;
}

/* Bytes of a proxy (see NOTE [sizes]); -1 with an exception on failure. */
int mf_walk_proxy_bytes(const cfg_t *c, PyObject *p, PyObject *name, int64_t *out)
{
    PyObject *shape = NULL, *seq = NULL, *dtype = NULL, *db = NULL;
    int is_t;
    double numel = 1.0, per;
    Py_ssize_t i;
    int rc = -1;

    *out = 0;
    if ((is_t = PyObject_IsInstance(p, c->tensor_type)) < 0)
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
int32_t mf_walk_value_of(walk_t *w, const cfg_t *c, PyObject *p, int create_as_input)
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
    if (mf_walk_proxy_bytes(c, p, name, &bytes) < 0)
        goto done;
    if ((v = mf_gbuf_add_value(&w->g, bytes, 1)) < 0 || mf_walk_grow_values(w, v + 1) < 0) {
        PyErr_NoMemory();
        v = -1;
        goto done;
    }
    w->root[v] = v;
    w->last_writer[v] = -1;
    w->head[v] = -1;
    {
        PyObject *iv = PyLong_FromLong(v);
        if (!iv || PyDict_SetItem(w->ids, name, iv) < 0 || PyList_Append(w->names, name) < 0) {
            Py_XDECREF(iv);
            v = -1;
            goto done;
        }
        Py_DECREF(iv);
    }
done:
    Py_DECREF(name);
    return v;
}

/* A new value produced by op `op`; alias_base >= 0 makes it a view. */
int32_t mf_walk_new_value(walk_t *w, const cfg_t *c, PyObject *p, int32_t alias_base)
{
    PyObject *name = PyObject_GetAttrString(p, "name"), *iv = NULL;
    int32_t v = -1;
    int64_t bytes;
    if (!name)
        return -1;
    if (mf_walk_proxy_bytes(c, p, name, &bytes) < 0)
        goto done;
    if ((v = mf_gbuf_add_value(&w->g, bytes, 0)) < 0 || mf_walk_grow_values(w, v + 1) < 0) {
        PyErr_NoMemory();
        v = -1;
        goto done;
    }
    w->last_writer[v] = -1;
    w->head[v] = -1;
    w->root[v] = v;
    if (alias_base >= 0) {
        w->g.alias_of[v] = alias_base;
        w->root[v] = w->root[alias_base];
    }
    if (!(iv = PyLong_FromLong(v)) || PyDict_SetItem(w->ids, name, iv) < 0 || PyList_Append(w->names, name) < 0)
        v = -1;
done:
    Py_XDECREF(iv);
    Py_DECREF(name);
    return v;
}
