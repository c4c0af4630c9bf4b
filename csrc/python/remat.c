/*
 * remat.c -- the binding's one call of the core's planning pipeline
 * (csrc/core/mf_pipeline.c NOTE [planning pipeline]) and its one conversion
 * to Python: the plan dict, what the winning start and its steps were, and
 * the graph with the copies where recomputation lowered the peak.  Shared by
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
    for (v = 0; v < r->n_values; v++)
        if (mf_gbuf_add_value(out, r->value_bytes[v], r->is_input[v]) < 0)
            return -1;
    for (v = 0; v < r->n_values; v++) {
        out->alias_of[v] = r->alias_of[v];
        out->is_output[v] = r->is_output[v];
        if (r->donatable && r->donatable[v])
            mf_gbuf_set_donatable(out, v);
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

/* The pipeline's account: {"start", "steps": [{kind, splits, copied_bytes, peak_before,
 * peak_after}], "plans", "work", "max_work", "budget_hit", "fits"}; fits: a peak target was
 * given and the plan's peak is at most it (NOTE [peak target]). */
static PyObject *pipeline_dict(const mf_pipeline_result *r)
{
    PyObject *steps = PyList_New(r->n_steps), *d;
    int32_t i;
    if (!steps)
        return NULL;
    for (i = 0; i < r->n_steps; i++) {
        const mf_pipeline_step *s = &r->steps[i];
        const char *kind = s->kind == MF_STEP_SEARCH    ? "search"
                           : s->kind == MF_STEP_REGIONS ? "search on regions"
                           : s->kind == MF_STEP_FISSION ? "region fission"
                                                        : "focused split";
        PyObject *x = Py_BuildValue("{s:s,s:i,s:L,s:L,s:L}", "kind", kind,
                                    "splits", (int)s->splits, "copied_bytes", (long long)s->copied_bytes,
                                    "peak_before", (long long)s->peak_before, "peak_after", (long long)s->peak_after);
        if (!x) {
            Py_DECREF(steps);
            return NULL;
        }
        PyList_SET_ITEM(steps, i, x);
    }
    d = Py_BuildValue("{s:s,s:N,s:i,s:L,s:L,s:O,s:O}", "start", r->start ? r->start : "", "steps", steps, "plans",
                      (int)r->n_plans, "work", (long long)r->work, "max_work", (long long)r->max_work, "budget_hit",
                      r->budget_hit ? Py_True : Py_False, "fits", r->fits ? Py_True : Py_False);
    return d;
}

/* plan["recompute"] and the keys that go with it; *used filled.  0 or -1. */
static int add_copies(PyObject *plan, const mf_pipeline_result *r, int32_t n_values_before, mf_gbuf *used)
{
    const mf_remat_result *c = &r->copies;
    PyObject *origin = NULL, *vorigin = NULL, *info = NULL, *graph = NULL;
    int rc = -1;
    if (fill_gbuf(c, used) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    if (!(origin = ids_list(c->origin, c->n_ops)) || !(vorigin = ids_list(c->value_origin, c->n_values)) ||
        !(graph = mf_gbuf_to_dict(used)))
        goto done;
    info = Py_BuildValue("{s:O,s:O,s:i,s:L,s:L,s:L,s:i,s:O}", "origin", origin, "value_origin", vorigin, "splits",
                         (int)c->n_splits, "copied_bytes", (long long)c->copied_bytes, "searched_peak_bytes",
                         (long long)c->peak_bytes, "start_peak_bytes", (long long)c->start_peak_bytes,
                         "n_values_before", (int)n_values_before, "graph", graph);
    if (!info || PyDict_SetItemString(plan, "recompute", info) < 0)
        goto done;
    Py_DECREF(info);
    /* "baseline" stays the input order of the graph as given, without copies */
    info = Py_BuildValue("{s:L,s:L}", "peak_bytes_without_recompute", (long long)r->first_peak_bytes,
                         "baseline_peak_bytes", (long long)r->first_baseline_peak_bytes);
    if (!info || PyDict_Update(plan, info) < 0)
        goto done;
    rc = 0;
done:
    Py_XDECREF(origin);
    Py_XDECREF(vorigin);
    Py_XDECREF(graph);
    Py_XDECREF(info);
    return rc;
}

PyObject *mf_py_plan_with_recompute(mf_gbuf *b, const uint8_t *cheap, long long budget,
                                    const mf_py_plan_args *pa, int passes, mf_gbuf *used)
{
    mf_ctx ctx;
    mf_graph_desc desc;
    mf_pipeline_options opt;
    mf_pipeline_result res;
    PyObject *plan = NULL, *account = NULL;
    int st;

    mf_py_gbuf_init(used);
    mf_py_ctx_init(&ctx);
    memset(&opt, 0, sizeof opt);
    memset(&res, 0, sizeof res);
    mf_py_plan_options(pa, &opt.plan);
    opt.cheap = budget > 0 ? cheap : NULL;
    opt.recompute_budget = budget > 0 ? (int64_t)budget : 0;
    opt.passes = passes;
    opt.max_work = pa->max_work;
    opt.peak_target = pa->peak_target;
    mf_gbuf_desc(b, &desc);
    if ((st = mf_py_plan_pipeline(&ctx, &desc, &opt, &res)) != MF_OK)
        return mf_py_raise(&ctx, st);
    if (!(plan = mf_py_plan_dict(&res.plan)) || !(account = pipeline_dict(&res)) ||
        PyDict_SetItemString(plan, "pipeline", account) < 0 ||
        (res.has_copies && add_copies(plan, &res, b->n_values, used) < 0)) {
        Py_CLEAR(plan);
        mf_gbuf_free(used);
        mf_py_gbuf_init(used);
    }
    Py_XDECREF(account);
    mf_pipeline_result_free(&ctx, &res);
    return plan;
}
