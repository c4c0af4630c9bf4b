/*
 * remat.c -- the binding's side of recomputation (csrc/core/mf_remat.c NOTE
 * [recomputation]): run the core's search on a built graph and its plan, and
 * rebuild the graph with the copies as an mf_gbuf to plan again.  Shared by
 * plan() (plan.c) and plan_trace() (trace.c).
 */
#include "mf_py.h"
#include <string.h>

static PyObject *ids_list(const int32_t *a, int32_t n)
{
    PyObject *l = PyList_New(n);
    int32_t i;
    if (!l)
        return NULL;
    for (i = 0; i < n; i++) {
        PyObject *x = PyLong_FromLong(a[i]);
        if (!x) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, i, x);
    }
    return l;
}

static int fill_gbuf(const mf_remat_result *r, mf_gbuf *out)
{
    int32_t v, k, j;
    mf_py_gbuf_init(out);
    for (v = 0; v < r->n_values; v++)
        if (mf_gbuf_add_value(out, r->value_bytes[v], r->is_input[v]) < 0)
            return -1;
    for (v = 0; v < r->n_values; v++) {
        out->alias_of[v] = r->alias_of[v];
        out->is_output[v] = r->is_output[v];
    }
    for (k = 0; k < r->n_ops; k++) {
        if (mf_gbuf_begin_op(out, r->fusible[k]) < 0)
            return -1;
        for (j = r->in_ptr[k]; j < r->in_ptr[k + 1]; j++)
            if (mf_gbuf_op_in(out, r->in_idx[j]) < 0)
                return -1;
        for (j = r->out_ptr[k]; j < r->out_ptr[k + 1]; j++)
            if (mf_gbuf_op_out(out, r->out_idx[j]) < 0)
                return -1;
        if (mf_gbuf_end_op(out) < 0)
            return -1;
    }
    for (j = 0; j < r->n_after; j++)
        if (mf_gbuf_after(out, r->after[2 * j], r->after[2 * j + 1]) < 0)
            return -1;
    for (k = 0; k < r->n_ops; k++) {
        if (r->epilogue_of[k] >= 0 && mf_gbuf_set_epilogue(out, k, r->epilogue_of[k]) < 0)
            return -1;
        if (r->comm[k] && mf_gbuf_set_comm(out, k, r->comm[k]) < 0)
            return -1;
    }
    return out->nomem ? -1 : 0;
}

int mf_py_recompute(mf_gbuf *b, const uint8_t *cheap, PyObject *plan, long long budget, mf_gbuf *out,
                    PyObject **info)
{
    mf_ctx ctx;
    mf_graph_desc desc;
    mf_remat_options opt;
    mf_remat_result res;
    PyObject *order_o = PyDict_GetItemString(plan, "order"), *seq = NULL;
    int32_t *order = NULL;
    Py_ssize_t i, n;
    int st, rc = -1;

    *info = NULL;
    mf_py_gbuf_init(out);
    memset(&res, 0, sizeof res);
    mf_py_ctx_init(&ctx);
    if (!order_o || !(seq = mf_py_tuple(order_o, "plan order")))
        goto done;
    n = PyTuple_GET_SIZE(seq);
    if (n != b->n_ops) {
        PyErr_SetString(PyExc_RuntimeError, "recompute: the plan's order does not match the graph");
        goto done;
    }
    if (!(order = PyMem_RawMalloc(sizeof(int32_t) * (size_t)(n + 1)))) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < n; i++) {
        long x = PyLong_AsLong(PyTuple_GET_ITEM(seq, i));
        if (x == -1 && PyErr_Occurred())
            goto done;
        order[i] = (int32_t)x;
    }
    mf_gbuf_desc(b, &desc);
    memset(&opt, 0, sizeof opt);
    opt.budget_bytes = (int64_t)budget;
    Py_BEGIN_ALLOW_THREADS
    st = mf_recompute(&ctx, &desc, cheap, order, &opt, &res);
    Py_END_ALLOW_THREADS
    if (st != MF_OK) {
        mf_py_raise(&ctx, st);
        goto done;
    }
    if (res.n_splits > 0) {
        PyObject *origin, *vorigin;
        if (fill_gbuf(&res, out) < 0) {
            PyErr_NoMemory();
            goto done;
        }
        if (!(origin = ids_list(res.origin, res.n_ops)))
            goto done;
        if (!(vorigin = ids_list(res.value_origin, res.n_values))) {
            Py_DECREF(origin);
            goto done;
        }
        *info = Py_BuildValue("{s:N,s:N,s:i,s:L,s:L,s:L,s:i}", "origin", origin, "value_origin", vorigin,
                              "splits", (int)res.n_splits, "copied_bytes", (long long)res.copied_bytes,
                              "searched_peak_bytes", (long long)res.peak_bytes, "start_peak_bytes",
                              (long long)res.start_peak_bytes, "n_values_before", (int)b->n_values);
        if (!*info)
            goto done;
    }
    rc = 0;
done:
    if (rc < 0)
        mf_gbuf_free(out);
    mf_remat_result_free(&ctx, &res);
    PyMem_RawFree(order);
    Py_XDECREF(seq);
    return rc;
}
