/*
 * graph_dict.c -- a built graph (csrc/core/mf_build.h mf_gbuf) as plan()'s
 * keyword arguments, for reports and timelines; and the fusible level of a
 * Python answer.
 */
#include "mf_py.h"

#include <string.h>

int mf_fusible_level(PyObject *x)
{
    if (PyLong_CheckExact(x)) {
        long v = PyLong_AsLong(x);
        if (v == -1 && PyErr_Occurred())
            PyErr_Clear(); /* a huge int: by its truth */
        else if (v == MF_FUSIBLE_STORED || v == MF_FUSIBLE_POINTWISE)
            return (int)v;
    }
    return PyObject_IsTrue(x);
}

static PyObject *to_dict(const mf_gbuf *g);

/* The graph as plan() keyword arguments (for reports and timelines).  The
 * collector is held off while the lists are made: each op's entry makes new
 * containers, which would otherwise set off collections that walk every
 * object of the caller's traces. */
PyObject *mf_gbuf_to_dict(const mf_gbuf *g)
{
    int was = PyGC_Disable();
    PyObject *d = to_dict(g);
    if (was)
        PyGC_Enable();
    return d;
}

static PyObject *to_dict(const mf_gbuf *g)
{
    PyObject *ops = PyList_New(g->n_ops), *vb = PyList_New(g->n_values), *gi = PyList_New(0), *go = PyList_New(0),
             *al = PyList_New(0), *fu = PyList_New(g->n_ops), *af = PyList_New(g->n_after), *cm = PyList_New(0),
             *ep = PyList_New(0), *dn = PyList_New(0), *d = NULL;
    int32_t i, k;
    if (!ops || !vb || !gi || !go || !al || !fu || !af || !cm || !ep || !dn)
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
        PyList_SET_ITEM(fu, i, g->fusible[i] == MF_FUSIBLE_STORED || g->fusible[i] == MF_FUSIBLE_POINTWISE
                                   ? PyLong_FromLong(g->fusible[i])
                                   : PyBool_FromLong(g->fusible[i]));
        if (g->epilogue_of && i < g->n_epi && g->epilogue_of[i] >= 0) { /* (v, u): v may be u's epilogue */
            PyObject *x = Py_BuildValue("(ii)", (int)i, (int)g->epilogue_of[i]);
            if (!x || PyList_Append(ep, x) < 0) {
                Py_XDECREF(x);
                goto done;
            }
            Py_DECREF(x);
        }
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
        if (g->donatable[i] && ((x = PyLong_FromLong(i)) == NULL || PyList_Append(dn, x) < 0 || (Py_DECREF(x), 0)))
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
    d = Py_BuildValue("{s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O}", "ops", ops, "value_bytes", vb, "graph_inputs",
                      gi, "graph_outputs", go, "aliases", al, "fusible", fu, "after", af, "comm", cm, "epilogues", ep,
                      "donatable", dn);
done:
    Py_XDECREF(ops);
    Py_XDECREF(vb);
    Py_XDECREF(gi);
    Py_XDECREF(go);
    Py_XDECREF(al);
    Py_XDECREF(fu);
    Py_XDECREF(af);
    Py_XDECREF(cm);
    Py_XDECREF(ep);
    Py_XDECREF(dn);
    return d;
}
