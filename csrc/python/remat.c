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
 * from the plan without them, and the lower peak wins (the plan with hoists
 * on a tie).  Where regions are formed, two more start from the plan without
 * coarse orders (mf_coarse.c NOTE [coarse orders]): one runs every pass
 * without them, the focused ones too, and plans its result once more with
 * them; the other plans each pass's copies with them.  A coarse order changes
 * each pass's order and so the copies later searches find, and any of these
 * paths may end lowest (on the checkpointed workloads of benchmarks/ each of
 * the last two is the lowest somewhere).  The lowest of the starts wins (the
 * earlier one on a tie), and the focused passes (NOTE [focused splits] below)
 * then run on the winner alone: the other starts would try the same group at
 * the fused peak again.  *used receives the graph the
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

/* A plan with copies: the plan, what the copies are (info: origins, splits,
 * copied bytes) and the graph with them.  Two uses: one step's outcome (info
 * relative to the graph the step ran on), and where the passes stand (the
 * last kept plan, of b while info is NULL and g empty, info composed in
 * terms of b). */
typedef struct with_copies {
    PyObject *plan, *info;
    mf_gbuf g;
} with_copies;

static void copies_clear(with_copies *c)
{
    Py_CLEAR(c->plan);
    Py_CLEAR(c->info);
    mf_gbuf_free(&c->g);
    mf_py_gbuf_init(&c->g);
}

/* One step on cur (cheap flags ch) and its plan: the search (focus NULL) or
 * one focused split (NOTE [focused splits]), the copies' graph planned with
 * pa; 1 with *o set where that plan's peak is lower, else 0 (o empty), -1 on
 * error. */
static int pass_step(mf_gbuf *cur, const uint8_t *ch, PyObject *plan, long long budget, const mf_py_plan_args *pa,
                     const int32_t *focus, with_copies *o)
{
    o->plan = NULL;
    if (mf_py_recompute(cur, ch, plan, budget, focus, &o->g, &o->info) < 0)
        return -1;
    if (!o->info) {
        mf_gbuf_free(&o->g);
        mf_py_gbuf_init(&o->g);
        return 0;
    }
    if ((o->plan = mf_py_run_plan(&o->g, pa)) && dict_ll(o->plan, "peak_bytes") < dict_ll(plan, "peak_bytes") &&
        !PyErr_Occurred())
        return 1;
    copies_clear(o);
    return PyErr_Occurred() ? -1 : 0;
}

/* NOTE [focused splits] in the binding: where regions are formed, once the
 * searches keep nothing, the plan's first group at the fused peak offers the
 * MF_FOCUS_TRIES largest focused splits, one graph each.  A try only ranks a
 * candidate, so each is planned with 1/MF_FOCUS_STATE_SHARE of the plan's
 * search budgets: its DP states (NOTE [state budget]: the short windows and
 * pieces find the same orders on these graphs; what differs is the long
 * windows' last few bytes) and its fusion-aware moves' window positions
 * (mf_plan_options.max_refine); the lowest below the current plan is planned
 * again with the full budgets and the lower of its two plans kept.  At most
 * MF_FOCUS_PASSES such passes, each from the plan the last one kept. */
#define MF_FOCUS_TRIES 4
#define MF_FOCUS_PASSES 3
#define MF_FOCUS_STATE_SHARE 10

/* A try's share of a search budget (<= 0: the core's default dflt), at least 1. */
static long long focus_share(long long budget, long long dflt)
{
    long long q = (budget > 0 ? budget : dflt) / MF_FOCUS_STATE_SHARE;
    return q > 0 ? q : 1;
}

/* One focused pass on cur: 1 with *o set (the best try, planned in full), 0
 * when no try lowers the peak, -1 on error. */
static int focused_step(mf_gbuf *cur, const uint8_t *ch, PyObject *plan, long long budget,
                        const mf_py_plan_args *pa, with_copies *o)
{
    mf_py_plan_args quick = *pa;
    int32_t f[3];
    int got = 0;
    PyObject *full;
    quick.max_states = focus_share(pa->max_states, MF_DEFAULT_MAX_STATES);
    quick.max_refine = focus_share(pa->max_refine, MF_DEFAULT_REFINE_POSITIONS);
    mf_py_gbuf_init(&o->g);
    o->plan = o->info = NULL;
    if (fused_peak_group(cur, plan, &f[0], &f[1]) < 0)
        return -1;
    for (f[2] = 0; f[2] < MF_FOCUS_TRIES && f[1] > f[0]; f[2]++) {
        with_copies t;
        int r = pass_step(cur, ch, plan, budget, &quick, f, &t);
        if (r < 0) {
            copies_clear(o);
            return -1;
        }
        if (r == 0)
            continue;
        if (got && dict_ll(t.plan, "peak_bytes") >= dict_ll(o->plan, "peak_bytes")) {
            copies_clear(&t);
            continue;
        }
        copies_clear(o);
        *o = t;
        got = 1;
    }
    if (!got)
        return 0;
    if (!(full = mf_py_run_plan(&o->g, pa))) {
        copies_clear(o);
        return -1;
    }
    if (dict_ll(full, "peak_bytes") <= dict_ll(o->plan, "peak_bytes")) {
        Py_DECREF(o->plan);
        o->plan = full;
    } else {
        Py_DECREF(full);
    }
    return 1;
}

/* Keep step o on the state: its info composed onto the state's, its graph
 * and plan the state's.  o is emptied.  0 or -1. */
static int keep_step(with_copies *s, with_copies *o)
{
    if (s->info && compose_info(o->info, s->info) < 0)
        return -1;
    Py_XDECREF(s->info);
    s->info = o->info;
    o->info = NULL;
    Py_DECREF(s->plan);
    s->plan = o->plan;
    o->plan = NULL;
    mf_gbuf_free(&s->g);
    s->g = o->g;
    mf_py_gbuf_init(&o->g);
    return 0;
}

/* The passes on s (a plan of b, maybe with copies kept already): up to
 * `passes` searches, then (where regions are formed) up to `focus` focused
 * passes, while the planned peak falls.  0 or -1 (s is left as it stood
 * after the last kept step; the caller clears it). */
static int passes_on(mf_gbuf *b, const uint8_t *cheap, long long budget, const mf_py_plan_args *pa, int passes,
                     int focus, with_copies *s)
{
    uint8_t *ch_own = NULL;
    int pass, rc = -1;
    for (pass = 0; pass < passes + focus; pass++) {
        const uint8_t *ch = cheap;
        mf_gbuf *cur = s->info ? &s->g : b;
        long long left = budget - (s->info ? dict_ll(s->info, "copied_bytes") : 0);
        with_copies o;
        int got;
        if (left <= 0 || (pass >= passes && !pa->fuse))
            break;
        PyMem_RawFree(ch_own);
        ch_own = NULL;
        if (s->info && !(ch = ch_own = cheap_of_copies(s->info, cheap, b->n_ops)))
            goto done;
        if (pass < passes)
            got = pass_step(cur, ch, s->plan, left, pa, NULL, &o);
        else
            got = focused_step(cur, ch, s->plan, left, pa, &o);
        if (got < 0)
            goto done;
        if (got == 0) {
            if (pass < passes) { /* the search keeps nothing: on to the focused passes */
                pass = passes - 1;
                continue;
            }
            break;
        }
        if (keep_step(s, &o) < 0) {
            copies_clear(&o);
            goto done;
        }
    }
    rc = 0;
done:
    PyMem_RawFree(ch_own);
    return rc;
}

/* NOTE [recomputation passes]: the searches from each start, the focused
 * passes from the better one's last plan. */
PyObject *mf_py_plan_with_recompute(mf_gbuf *b, const uint8_t *cheap, long long budget,
                                    const mf_py_plan_args *pa, int passes, mf_gbuf *used)
{
    PyObject *first, *graph = NULL, *plan, *noc = NULL;
    mf_py_plan_args nh = *pa, nc;
    int k;
    with_copies s, s2;
    s.plan = s.info = s2.plan = s2.info = NULL;
    mf_py_gbuf_init(used);
    mf_py_gbuf_init(&s.g);
    mf_py_gbuf_init(&s2.g);
    first = mf_py_run_plan(b, pa);
    if (!first || budget <= 0 || !cheap)
        return first;
    if (passes <= 0)
        passes = MF_RECOMPUTE_PASSES;
    Py_INCREF(first);
    s.plan = first;
    if (passes_on(b, cheap, budget, pa, passes, 0, &s) < 0)
        goto fail;
    nh.hoists = 0;
    if (pa->hoists && dict_ll(first, "hoists") > 0) { /* the second start: the plan without hoists */
        if (!(s2.plan = mf_py_run_plan(b, &nh)) || passes_on(b, cheap, budget, pa, passes, 0, &s2) < 0)
            goto fail;
        if (dict_ll(s2.plan, "peak_bytes") < dict_ll(s.plan, "peak_bytes")) {
            with_copies t = s;
            s = s2;
            s2 = t;
        }
        copies_clear(&s2);
    }
    nc = *pa;
    nc.coarse = 0;
    if (pa->fuse && pa->coarse && !(noc = mf_py_run_plan(b, &nc)))
        goto fail;
    for (k = 0; noc && k < 2; k++) { /* the starts without coarse orders */
        PyObject *re;
        Py_INCREF(noc);
        s2.plan = noc;
        if (passes_on(b, cheap, budget, k ? pa : &nc, passes, 0, &s2) < 0 ||
            (!k && passes_on(b, cheap, budget, &nc, 0, MF_FOCUS_PASSES, &s2) < 0))
            goto fail;
        /* the result planned with coarse orders: no copies, the plan of b (first); copies planned
         * with them in every pass (k = 1), s2's own plan; else planned here */
        if (!s2.info) {
            re = first;
            Py_INCREF(re);
        } else if (k == 1) {
            re = NULL;
        } else if (!(re = mf_py_run_plan(&s2.g, pa))) {
            goto fail;
        }
        if (re && dict_ll(re, "peak_bytes") < dict_ll(s2.plan, "peak_bytes")) {
            Py_DECREF(s2.plan);
            s2.plan = re;
        } else {
            Py_XDECREF(re);
        }
        if (dict_ll(s2.plan, "peak_bytes") < dict_ll(s.plan, "peak_bytes")) {
            with_copies t = s;
            s = s2;
            s2 = t;
        }
        copies_clear(&s2);
    }
    Py_CLEAR(noc);
    if (passes_on(b, cheap, budget, pa, 0, MF_FOCUS_PASSES, &s) < 0)
        goto fail;
    if (!s.info) {
        Py_DECREF(first);
        plan = s.plan;
        s.plan = NULL;
        copies_clear(&s);
        return plan;
    }
    if (!(graph = mf_gbuf_to_dict(&s.g)) || PyDict_SetItemString(s.info, "graph", graph) < 0 ||
        PyDict_SetItemString(s.plan, "recompute", s.info) < 0 ||
        PyDict_SetItemString(s.plan, "peak_bytes_without_recompute", PyDict_GetItemString(first, "peak_bytes")) < 0 ||
        /* "baseline" stays the input order of the graph as given, without copies */
        PyDict_SetItemString(s.plan, "baseline_peak_bytes", PyDict_GetItemString(first, "baseline_peak_bytes")) < 0)
        goto fail;
    Py_DECREF(graph);
    Py_DECREF(first);
    plan = s.plan;
    *used = s.g;
    s.plan = NULL;
    mf_py_gbuf_init(&s.g);
    copies_clear(&s);
    return plan;
fail:
    Py_XDECREF(graph);
    Py_XDECREF(noc);
    copies_clear(&s);
    copies_clear(&s2);
    Py_DECREF(first);
    return NULL;
}
