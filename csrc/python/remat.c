/*
 * remat.c -- the binding's side of recomputation (csrc/core/mf_remat.c NOTE
 * [recomputation]): run the core's search on a built graph and its plan, and
 * rebuild the graph with the copies as an mf_gbuf to plan again, and the
 * passes of search and plan (NOTE [recomputation passes]).  Shared by plan()
 * (plan.c) and plan_trace() (trace.c).
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

int mf_py_recompute(mf_gbuf *b, const uint8_t *cheap, PyObject *plan, long long budget, const int32_t *focus,
                    mf_gbuf *out, PyObject **info)
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
    if (focus) { /* NOTE [focused splits] */
        opt.focus_lo = focus[0];
        opt.focus_hi = focus[1];
        opt.focus_pick = focus[2];
    }
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

/* NOTE [recomputation passes] (mf_remat.c NOTE [recomputation]): the plan of
 * b; where budget > 0, the plan of b with copies of cheap ops too, kept if
 * its peak is lower.  The search splits values on one planned order; planning
 * the graph with the copies again finds another order, on which further
 * splits may pay.  So the search runs again on each kept plan, with what is
 * left of the budget, up to `passes` times (<= 0: MF_RECOMPUTE_PASSES), while the planned peak
 * keeps falling.  A later pass's origins are composed with the earlier ones',
 * so the result names ops and values of b.  Hoists (csrc/core/mf_hoist.c NOTE
 * [hoists]) change the first plan's order, and the search from another order
 * ends elsewhere; so where the first plan kept hoists, the passes also start
 * from the plan without them, and the lower final peak wins (the plan with
 * hoists on a tie).  *used receives the graph the
 * returned plan is for when that is one with copies (else it stays empty);
 * the caller frees it. */
#define MF_RECOMPUTE_PASSES 3

/* x[k] := prev[x[k]] for a list of ids. */
static int compose_ids(PyObject *x, PyObject *prev)
{
    Py_ssize_t i, n = PyList_GET_SIZE(x), m = PyList_GET_SIZE(prev);
    for (i = 0; i < n; i++) {
        Py_ssize_t j = PyLong_AsSsize_t(PyList_GET_ITEM(x, i));
        PyObject *y;
        if (j < 0 || j >= m) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "recompute: a copy's origin is out of range");
            return -1;
        }
        y = PyList_GET_ITEM(prev, j);
        Py_INCREF(y);
        PyList_SetItem(x, i, y);
    }
    return 0;
}

static long long dict_ll(PyObject *d, const char *key)
{
    PyObject *o = PyDict_GetItemString(d, key);
    return o ? PyLong_AsLongLong(o) : 0;
}

/* info (a later pass's, relative to the graph prev was made for) in terms of b. */
static int compose_info(PyObject *info, PyObject *prev)
{
    PyObject *o;
    if (compose_ids(PyDict_GetItemString(info, "origin"), PyDict_GetItemString(prev, "origin")) < 0 ||
        compose_ids(PyDict_GetItemString(info, "value_origin"), PyDict_GetItemString(prev, "value_origin")) < 0)
        return -1;
    if (!(o = PyLong_FromLongLong(dict_ll(info, "splits") + dict_ll(prev, "splits"))) ||
        PyDict_SetItemString(info, "splits", o) < 0)
        goto fail;
    Py_DECREF(o);
    if (!(o = PyLong_FromLongLong(dict_ll(info, "copied_bytes") + dict_ll(prev, "copied_bytes"))) ||
        PyDict_SetItemString(info, "copied_bytes", o) < 0)
        goto fail;
    Py_DECREF(o);
    if (PyDict_SetItemString(info, "start_peak_bytes", PyDict_GetItemString(prev, "start_peak_bytes")) < 0 ||
        PyDict_SetItemString(info, "n_values_before", PyDict_GetItemString(prev, "n_values_before")) < 0)
        return -1;
    return PyErr_Occurred() ? -1 : 0;
fail:
    Py_XDECREF(o);
    return -1;
}

/* cheap flags of g2's ops: those of the ops they are or copy (origin, relative to the graph
 * cheap is for). */
static uint8_t *cheap_of_copies(PyObject *info, const uint8_t *cheap, int32_t n_prev)
{
    PyObject *origin = PyDict_GetItemString(info, "origin");
    Py_ssize_t i, n = PyList_GET_SIZE(origin);
    uint8_t *c = PyMem_RawCalloc((size_t)n + 1, 1);
    if (!c) {
        PyErr_NoMemory();
        return NULL;
    }
    for (i = 0; i < n; i++) {
        long j = PyLong_AsLong(PyList_GET_ITEM(origin, i));
        if (j < 0 || j >= n_prev) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "recompute: a copy's origin is out of range");
            PyMem_RawFree(c);
            return NULL;
        }
        c[i] = cheap[j];
    }
    return c;
}

/* The group at the fused peak of `plan` (of b): its positions [*lo, *hi) in
 * the plan's order; *hi == *lo when it has no groups.  0 or -1. */
static int fused_peak_group(mf_gbuf *b, PyObject *plan, int32_t *lo, int32_t *hi)
{
    PyObject *order_o = PyDict_GetItemString(plan, "order"), *groups = PyDict_GetItemString(plan, "groups");
    Py_ssize_t n = b->n_ops, ng, g, i, k = 0;
    int32_t *order = NULL, *gp = NULL;
    int64_t *step = NULL, peak = 0;
    mf_graph_desc d;
    mf_ctx ctx;
    int rc = -1, st;
    *lo = *hi = 0;
    if (!order_o || !groups || !PyList_Check(order_o) || !PyList_Check(groups) || PyList_GET_SIZE(order_o) != n) {
        PyErr_SetString(PyExc_RuntimeError, "recompute: the plan has no order and groups of its graph");
        return -1;
    }
    ng = PyList_GET_SIZE(groups);
    order = PyMem_RawMalloc(sizeof(int32_t) * ((size_t)n + 1));
    gp = PyMem_RawMalloc(sizeof(int32_t) * ((size_t)ng + 1));
    step = PyMem_RawMalloc(sizeof(int64_t) * ((size_t)ng + 1));
    if (!order || !gp || !step) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < n; i++)
        order[i] = (int32_t)PyLong_AsLong(PyList_GET_ITEM(order_o, i));
    for (g = 0; g < ng; g++) {
        PyObject *x = PyList_GET_ITEM(groups, g);
        gp[g] = (int32_t)k;
        k += PySequence_Size(x);
    }
    gp[ng] = (int32_t)k;
    if (PyErr_Occurred())
        goto done;
    mf_py_ctx_init(&ctx);
    mf_gbuf_desc(b, &d);
    if ((st = mf_simulate(&ctx, &d, order, gp, (int32_t)ng, &peak, step, NULL)) != MF_OK) {
        mf_py_raise(&ctx, st);
        goto done;
    }
    for (g = 0; g < ng; g++)
        if (step[g] == peak) {
            *lo = gp[g];
            *hi = gp[g + 1];
            break;
        }
    rc = 0;
done:
    PyMem_RawFree(order);
    PyMem_RawFree(gp);
    PyMem_RawFree(step);
    return rc;
}

/* Drop a candidate of the passes: its plan, its info and its graph. */
static void drop_candidate(PyObject **plan, PyObject **info, mf_gbuf *g)
{
    Py_CLEAR(*plan);
    Py_CLEAR(*info);
    mf_gbuf_free(g);
}

/* One step of the passes on cur (cheap flags ch) and its plan: the search
 * (focus NULL) or one focused split (NOTE [focused splits]); 1 with *g2,
 * *info and *plan2 set where the copies' plan has a lower peak, else 0
 * (nothing set), -1 on error. */
static int pass_step(mf_gbuf *cur, const uint8_t *ch, PyObject *plan, long long budget, const mf_py_plan_args *pa,
                     const int32_t *focus, mf_gbuf *g2, PyObject **info, PyObject **plan2)
{
    *plan2 = NULL;
    if (mf_py_recompute(cur, ch, plan, budget, focus, g2, info) < 0)
        return -1;
    if (!*info) {
        mf_gbuf_free(g2);
        return 0;
    }
    if ((*plan2 = mf_py_run_plan(g2, pa)) && dict_ll(*plan2, "peak_bytes") < dict_ll(plan, "peak_bytes") &&
        !PyErr_Occurred())
        return 1;
    drop_candidate(plan2, info, g2);
    return PyErr_Occurred() ? -1 : 0;
}

/* NOTE [focused splits] in the binding: where regions are formed, a pass
 * whose search keeps nothing tries the focused splits of the plan's fused
 * peak group instead, the MF_FOCUS_TRIES largest one by one, and keeps the
 * lowest plan; at most MF_FOCUS_PASSES such passes. */
#define MF_FOCUS_TRIES 4
#define MF_FOCUS_PASSES 3

/* The passes from `plan` (a plan of b, stolen): the last kept plan, with *kept_out (a new
 * reference, NULL when no copies were kept) and *used (the graph of the last kept plan, empty
 * when none). */
static PyObject *passes_from(mf_gbuf *b, const uint8_t *cheap, long long budget, const mf_py_plan_args *pa,
                             int passes, PyObject *plan, mf_gbuf *used, PyObject **kept_out)
{
    PyObject *info = NULL, *kept_info = NULL;
    uint8_t *cheap_cur = NULL;
    const uint8_t *ch = cheap;
    mf_gbuf *cur = b;
    int pass, focused = 0;
    mf_py_gbuf_init(used);
    *kept_out = NULL;
    for (pass = 0; pass < passes + MF_FOCUS_PASSES && budget > 0; pass++) {
        PyObject *plan2 = NULL;
        mf_gbuf g2;
        int got = 0;
        if (pass < passes && !focused)
            got = pass_step(cur, ch, plan, budget, pa, NULL, &g2, &info, &plan2);
        if (got == 0 && pa->fuse && focused < MF_FOCUS_PASSES) {
            int32_t f[3];
            focused++;
            if (fused_peak_group(cur, plan, &f[0], &f[1]) < 0)
                goto fail;
            for (f[2] = 0; f[2] < MF_FOCUS_TRIES && f[1] > f[0]; f[2]++) {
                PyObject *p3, *i3;
                mf_gbuf g3;
                int r3 = pass_step(cur, ch, plan, budget, pa, f, &g3, &i3, &p3);
                if (r3 < 0) {
                    if (got)
                        drop_candidate(&plan2, &info, &g2);
                    got = -1;
                    break;
                }
                if (r3 == 0)
                    continue;
                if (got && dict_ll(p3, "peak_bytes") >= dict_ll(plan2, "peak_bytes")) {
                    drop_candidate(&p3, &i3, &g3);
                    continue;
                }
                if (got)
                    drop_candidate(&plan2, &info, &g2);
                plan2 = p3;
                info = i3;
                g2 = g3;
                got = 1;
            }
        }
        if (got < 0)
            goto fail;
        if (got == 0)
            break;
        budget -= dict_ll(info, "copied_bytes");
        {
            uint8_t *c2 = cheap_of_copies(info, ch, cur->n_ops);
            if (!c2 || (kept_info && compose_info(info, kept_info) < 0)) {
                PyMem_RawFree(c2);
                Py_DECREF(plan2);
                mf_gbuf_free(&g2);
                goto fail;
            }
            PyMem_RawFree(cheap_cur);
            ch = cheap_cur = c2;
        }
        Py_XDECREF(kept_info);
        kept_info = info;
        info = NULL;
        Py_DECREF(plan);
        plan = plan2;
        if (cur != b)
            mf_gbuf_free(cur);
        *used = g2;
        cur = used;
    }
    PyMem_RawFree(cheap_cur);
    *kept_out = kept_info;
    return plan;
fail:
    PyMem_RawFree(cheap_cur);
    Py_XDECREF(info);
    Py_XDECREF(kept_info);
    Py_DECREF(plan);
    mf_gbuf_free(used);
    mf_py_gbuf_init(used);
    return NULL;
}

PyObject *mf_py_plan_with_recompute(mf_gbuf *b, const uint8_t *cheap, long long budget,
                                    const mf_py_plan_args *pa, int passes, mf_gbuf *used)
{
    PyObject *first, *plan, *kept_info = NULL, *graph = NULL;
    mf_py_plan_args nh = *pa;
    mf_gbuf used2;
    mf_py_gbuf_init(used);
    first = mf_py_run_plan(b, pa);
    if (!first || budget <= 0 || !cheap)
        return first;
    if (passes <= 0)
        passes = MF_RECOMPUTE_PASSES;
    Py_INCREF(first);
    if (!(plan = passes_from(b, cheap, budget, pa, passes, first, used, &kept_info)))
        goto fail;
    nh.hoists = 0;
    if (pa->hoists && dict_ll(first, "hoists") > 0) { /* the second start: the plan without hoists */
        PyObject *start = mf_py_run_plan(b, &nh), *plan2, *info2 = NULL;
        if (!start)
            goto fail;
        if (!(plan2 = passes_from(b, cheap, budget, pa, passes, start, &used2, &info2)))
            goto fail;
        if (dict_ll(plan2, "peak_bytes") < dict_ll(plan, "peak_bytes")) {
            Py_DECREF(plan);
            Py_XDECREF(kept_info);
            mf_gbuf_free(used);
            plan = plan2;
            kept_info = info2;
            *used = used2;
        } else {
            Py_DECREF(plan2);
            Py_XDECREF(info2);
            mf_gbuf_free(&used2);
        }
    }
    if (!kept_info) {
        Py_DECREF(first);
        return plan;
    }
    if (!(graph = mf_gbuf_to_dict(used)) || PyDict_SetItemString(kept_info, "graph", graph) < 0 ||
        PyDict_SetItemString(plan, "recompute", kept_info) < 0 ||
        PyDict_SetItemString(plan, "peak_bytes_without_recompute", PyDict_GetItemString(first, "peak_bytes")) < 0 ||
        /* "baseline" stays the input order of the graph as given, without copies */
        PyDict_SetItemString(plan, "baseline_peak_bytes", PyDict_GetItemString(first, "baseline_peak_bytes")) < 0)
        goto fail;
    Py_DECREF(graph);
    Py_DECREF(kept_info);
    Py_DECREF(first);
    return plan;
fail:
    Py_XDECREF(graph);
    Py_XDECREF(kept_info);
    Py_XDECREF(plan);
    Py_DECREF(first);
    mf_gbuf_free(used);
    mf_py_gbuf_init(used);
    return NULL;
}
