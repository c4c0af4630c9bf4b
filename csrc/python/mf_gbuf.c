/*
 * mf_gbuf.c -- growable graph builder (see mf_gbuf.h), and its dict form
 * (mf_gbuf_to_dict, for reports).  The builder functions return
 * 0 on success and -1 when memory ran out (b->nomem is then set and every
 * later call fails too, so callers may check once at the end).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include "mf_gbuf.h"
#include "mf_py.h"

static int grow(void **p, int32_t *cap, int32_t need, size_t elem, int32_t extra)
{
    int64_t ncap;
    void *np;
    if (need <= *cap)
        return 0;
    ncap = *cap ? (int64_t)*cap * 2 : 16;
    while (ncap < need)
        ncap *= 2;
    if (ncap > INT32_MAX - extra)
        return -1;
    np = PyMem_RawRealloc(*p, (size_t)(ncap + extra) * elem);
    if (!np)
        return -1;
    *p = np;
    *cap = (int32_t)ncap;
    return 0;
}

void mf_gbuf_init(mf_gbuf *b)
{
    memset(b, 0, sizeof *b);
}

void mf_gbuf_free(mf_gbuf *b)
{
    PyMem_RawFree(b->in_ptr);
    PyMem_RawFree(b->out_ptr);
    PyMem_RawFree(b->fusible);
    PyMem_RawFree(b->in_idx);
    PyMem_RawFree(b->out_idx);
    PyMem_RawFree(b->value_bytes);
    PyMem_RawFree(b->alias_of);
    PyMem_RawFree(b->is_input);
    PyMem_RawFree(b->is_output);
    PyMem_RawFree(b->after);
    PyMem_RawFree(b->epilogue_of);
    PyMem_RawFree(b->comm);
    memset(b, 0, sizeof *b);
}

static int fail(mf_gbuf *b)
{
    b->nomem = 1;
    return -1;
}

static int grow_values(mf_gbuf *b, int32_t need)
{
    int32_t c;
    if (need <= b->cap_values)
        return 0;
    /* NOTE: the four per-value arrays share one capacity; grow each from
     * the old capacity and commit the new one only when all succeeded. */
    c = b->cap_values;
    if (grow((void **)&b->value_bytes, &c, need, sizeof(int64_t), 0) < 0)
        return -1;
    c = b->cap_values;
    if (grow((void **)&b->alias_of, &c, need, sizeof(int32_t), 0) < 0)
        return -1;
    c = b->cap_values;
    if (grow((void **)&b->is_input, &c, need, 1, 0) < 0)
        return -1;
    c = b->cap_values;
    if (grow((void **)&b->is_output, &c, need, 1, 0) < 0)
        return -1;
    b->cap_values = c;
    return 0;
}

int32_t mf_gbuf_add_value(mf_gbuf *b, int64_t bytes, int is_input)
{
    int32_t v;
    if (b->nomem || b->n_values == INT32_MAX || grow_values(b, b->n_values + 1) < 0)
        return fail(b);
    v = b->n_values++;
    b->value_bytes[v] = bytes;
    b->alias_of[v] = -1;
    b->is_input[v] = (uint8_t)(is_input != 0);
    b->is_output[v] = 0;
    return v;
}

int mf_gbuf_reserve_values(mf_gbuf *b, int32_t n)
{
    int32_t i;
    for (i = 0; i < n; i++)
        if (mf_gbuf_add_value(b, 0, 0) < 0)
            return -1;
    return 0;
}

int mf_gbuf_begin_op(mf_gbuf *b, int fusible)
{
    int32_t c;
    if (b->nomem)
        return -1;
    if (b->n_ops + 1 > b->cap_ops) {
        /* in_ptr/out_ptr keep one extra slot for the closing offset */
        c = b->cap_ops;
        if (grow((void **)&b->in_ptr, &c, b->n_ops + 1, sizeof(int32_t), 1) < 0)
            return fail(b);
        c = b->cap_ops;
        if (grow((void **)&b->out_ptr, &c, b->n_ops + 1, sizeof(int32_t), 1) < 0)
            return fail(b);
        c = b->cap_ops;
        if (grow((void **)&b->fusible, &c, b->n_ops + 1, 1, 0) < 0)
            return fail(b);
        b->cap_ops = c;
    }
    b->in_ptr[b->n_ops] = b->n_in;
    b->out_ptr[b->n_ops] = b->n_out;
    b->fusible[b->n_ops] = (uint8_t)(fusible == MF_FUSIBLE_STORED ? MF_FUSIBLE_STORED : fusible != 0);
    return 0;
}

int mf_fusible_level(PyObject *x)
{
    if (PyLong_CheckExact(x)) {
        long v = PyLong_AsLong(x);
        if (v == -1 && PyErr_Occurred())
            PyErr_Clear(); /* a huge int: by its truth */
        else if (v == MF_FUSIBLE_STORED)
            return MF_FUSIBLE_STORED;
    }
    return PyObject_IsTrue(x);
}

int mf_gbuf_op_in(mf_gbuf *b, int32_t v)
{
    if (b->nomem || grow((void **)&b->in_idx, &b->cap_in, b->n_in + 1, sizeof(int32_t), 0) < 0)
        return fail(b);
    b->in_idx[b->n_in++] = v;
    return 0;
}

int mf_gbuf_op_out(mf_gbuf *b, int32_t v)
{
    if (b->nomem || grow((void **)&b->out_idx, &b->cap_out, b->n_out + 1, sizeof(int32_t), 0) < 0)
        return fail(b);
    b->out_idx[b->n_out++] = v;
    return 0;
}

int mf_gbuf_end_op(mf_gbuf *b)
{
    if (b->nomem)
        return -1;
    b->n_ops++;
    b->in_ptr[b->n_ops] = b->n_in;
    b->out_ptr[b->n_ops] = b->n_out;
    return 0;
}

int mf_gbuf_set_epilogue(mf_gbuf *b, int32_t v, int32_t u)
{
    int32_t k;
    if (b->nomem)
        return -1;
    if (!b->epilogue_of) {
        b->epilogue_of = (int32_t *)PyMem_RawMalloc(sizeof(int32_t) * ((size_t)b->n_ops + 1));
        if (!b->epilogue_of)
            return fail(b);
        b->n_epi = b->n_ops;
        for (k = 0; k < b->n_ops; k++)
            b->epilogue_of[k] = -1;
    }
    if (v >= 0 && v < b->n_epi)
        b->epilogue_of[v] = u;
    return 0;
}

int mf_gbuf_set_comm(mf_gbuf *b, int32_t op, uint8_t kind)
{
    if (b->nomem)
        return -1;
    if (!b->comm) {
        b->comm = (uint8_t *)PyMem_RawCalloc((size_t)b->n_ops + 1, 1);
        if (!b->comm)
            return fail(b);
        b->n_comm = b->n_ops;
    }
    if (op >= 0 && op < b->n_comm)
        b->comm[op] = kind;
    return 0;
}

int mf_gbuf_after(mf_gbuf *b, int32_t a, int32_t c)
{
    if (b->nomem || grow((void **)&b->after, &b->cap_after, 2 * b->n_after + 2, sizeof(int32_t), 0) < 0)
        return fail(b);
    b->after[2 * b->n_after] = a;
    b->after[2 * b->n_after + 1] = c;
    b->n_after++;
    return 0;
}

void mf_gbuf_desc(const mf_gbuf *b, mf_graph_desc *d)
{
    static const int32_t zero = 0;
    memset(d, 0, sizeof *d);
    d->n_ops = b->n_ops;
    d->n_values = b->n_values;
    d->in_ptr = b->in_ptr ? b->in_ptr : &zero;
    d->out_ptr = b->out_ptr ? b->out_ptr : &zero;
    d->in_idx = b->in_idx;
    d->out_idx = b->out_idx;
    d->value_bytes = b->value_bytes;
    d->alias_of = b->alias_of;
    d->is_input = b->is_input;
    d->is_output = b->is_output;
    d->fusible = b->fusible;
    d->n_after = b->n_after;
    d->after = b->after;
    d->epilogue_of = b->n_epi == b->n_ops ? b->epilogue_of : NULL;
    d->comm = b->n_comm == b->n_ops ? b->comm : NULL;
}

/* The graph as plan() keyword arguments (for reports and timelines). */
PyObject *mf_gbuf_to_dict(const mf_gbuf *g)
{
    PyObject *ops = PyList_New(g->n_ops), *vb = PyList_New(g->n_values), *gi = PyList_New(0), *go = PyList_New(0),
             *al = PyList_New(0), *fu = PyList_New(g->n_ops), *af = PyList_New(g->n_after), *cm = PyList_New(0),
             *d = NULL;
    int32_t i, k;
    if (!ops || !vb || !gi || !go || !al || !fu || !af || !cm)
        goto done;
    for (i = 0; i < g->n_ops; i++) {
        PyObject *ins = PyList_New(g->in_ptr[i + 1] - g->in_ptr[i]), *outs, *t;
        if (!ins)
            goto done;
        for (k = g->in_ptr[i]; k < g->in_ptr[i + 1]; k++)
            PyList_SET_ITEM(ins, k - g->in_ptr[i], PyLong_FromLong(g->in_idx[k]));
        if (!(outs = PyList_New(g->out_ptr[i + 1] - g->out_ptr[i]))) {
            Py_DECREF(ins);
            goto done;
        }
        for (k = g->out_ptr[i]; k < g->out_ptr[i + 1]; k++)
            PyList_SET_ITEM(outs, k - g->out_ptr[i], PyLong_FromLong(g->out_idx[k]));
        t = PyTuple_Pack(2, ins, outs);
        Py_DECREF(ins);
        Py_DECREF(outs);
        if (!t)
            goto done;
        PyList_SET_ITEM(ops, i, t);
        PyList_SET_ITEM(fu, i, g->fusible[i] == MF_FUSIBLE_STORED ? PyLong_FromLong(MF_FUSIBLE_STORED)
                                                                  : PyBool_FromLong(g->fusible[i]));
        if (g->comm && g->n_comm == g->n_ops && g->comm[i]) { /* [op, MF_COMM_*] */
            PyObject *x = Py_BuildValue("(ii)", (int)i, (int)g->comm[i]);
            if (!x || PyList_Append(cm, x) < 0) {
                Py_XDECREF(x);
                goto done;
            }
            Py_DECREF(x);
        }
    }
    for (i = 0; i < g->n_values; i++) {
        PyObject *x;
        PyList_SET_ITEM(vb, i, PyLong_FromLongLong(g->value_bytes[i]));
        if (g->is_input[i] && ((x = PyLong_FromLong(i)) == NULL || PyList_Append(gi, x) < 0 || (Py_DECREF(x), 0)))
            goto done;
        if (g->is_output[i] && ((x = PyLong_FromLong(i)) == NULL || PyList_Append(go, x) < 0 || (Py_DECREF(x), 0)))
            goto done;
        if (g->alias_of[i] >= 0) {
            if (!(x = Py_BuildValue("(ii)", (int)i, (int)g->alias_of[i])) || PyList_Append(al, x) < 0) {
                Py_XDECREF(x);
                goto done;
            }
            Py_DECREF(x);
        }
    }
    for (i = 0; i < g->n_after; i++) {
        PyObject *x = Py_BuildValue("(ii)", (int)g->after[2 * i], (int)g->after[2 * i + 1]);
        if (!x)
            goto done;
        PyList_SET_ITEM(af, i, x);
    }
    if (PyErr_Occurred())
        goto done;
    d = Py_BuildValue("{s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O}", "ops", ops, "value_bytes", vb, "graph_inputs", gi,
                      "graph_outputs", go, "aliases", al, "fusible", fu, "after", af, "comm", cm);
done:
    Py_XDECREF(ops);
    Py_XDECREF(vb);
    Py_XDECREF(gi);
    Py_XDECREF(go);
    Py_XDECREF(al);
    Py_XDECREF(fu);
    Py_XDECREF(af);
    Py_XDECREF(cm);
    return d;
}
