/*
 * plan.c -- the Python entry to the C core: plan() and simulate().
 *
 * Converts Python sequences into an mf_gbuf (checking types and id ranges
 * here, so every message names the offending argument and index), lets the
 * core check the graph (it names semantic problems: a value produced twice,
 * a cycle ...), runs the core without the GIL, and converts the result.
 * Core statuses become exceptions in one place, mf_py_raise (errors.c).
 *
 * NOTE [snapshots]: every sequence argument is copied into a tuple
 * (mf_py_tuple) before any of its items is converted.  Converting an item
 * can run user code (__index__, __bool__) that mutates the list being read;
 * a tuple cannot change and holds its own references, so no callback can
 * make the binding read past the end or use a freed item.
 */
#include "mf_py.h"
#include <limits.h>
#include <string.h>
#include <time.h>

/* ---- allocator: the core allocates through PyMem_Raw (no GIL needed) ---- */

static void *raw_alloc(void *ud, size_t n)
{
    (void)ud;
    return PyMem_RawMalloc(n ? n : 1);
}

static void raw_free(void *ud, void *p)
{
    (void)ud;
    PyMem_RawFree(p);
}

void mf_py_ctx_init(mf_ctx *ctx)
{
    mf_allocator a;
    a.alloc = raw_alloc;
    a.free = raw_free;
    a.ud = NULL;
    mf_ctx_init(ctx, &a);
}

void mf_py_gbuf_init(mf_gbuf *b)
{
    mf_ctx c;
    mf_py_ctx_init(&c);
    mf_gbuf_init(b, &c);
}

/* ---- argument conversion ---- */

/* An integer id in [0, limit); what/index name it in messages. */
static int get_id(PyObject *o, int32_t limit, const char *what, int32_t *out)
{
    long long v;
    int overflow = 0;
    if (PyBool_Check(o) || !PyLong_Check(o)) {
        if (PyBool_Check(o) || !PyIndex_Check(o)) {
            PyErr_Format(PyExc_TypeError, "%s must be an int, not %.80s", what, Py_TYPE(o)->tp_name);
            return -1;
        }
    }
    {
        PyObject *idx = PyNumber_Index(o);
        if (!idx)
            return -1;
        v = PyLong_AsLongLongAndOverflow(idx, &overflow);
        Py_DECREF(idx);
    }
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow || v < 0 || v >= limit) {
        PyErr_Format(PyExc_ValueError, "%s: id %R out of range [0, %d)", what, o, (int)limit);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

PyObject *mf_py_tuple(PyObject *o, const char *what)
{
    PyObject *t;
    if (PyTuple_Check(o)) {
        Py_INCREF(o);
        return o;
    }
    if (!(t = PySequence_Tuple(o)) && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a sequence, not %.80s", what, Py_TYPE(o)->tp_name);
    }
    return t;
}

/* A sequence as a tuple snapshot (NOTE [snapshots]); names the argument on
 * failure.  Strings are not sequences of ids. */
static PyObject *as_seq(PyObject *o, const char *what)
{
    if (PyUnicode_Check(o) || PyBytes_Check(o) || !PySequence_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a sequence, not %.80s", what, Py_TYPE(o)->tp_name);
        return NULL;
    }
    return mf_py_tuple(o, what);
}

int mf_py_max_states(PyObject *ms, long long *out)
{
    int overflow = 0;
    long long v;
    *out = 0;
    if (ms == Py_None)
        return 0;
    if (PyBool_Check(ms) || !PyLong_Check(ms)) {
        PyErr_Format(PyExc_TypeError, "max_states must be an int in [1, 2**63 - 1] or None, not %.80s",
                     Py_TYPE(ms)->tp_name);
        return -1;
    }
    v = PyLong_AsLongLongAndOverflow(ms, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow || v < 1) {
        PyErr_Format(PyExc_ValueError, "max_states must be an int in [1, 2**63 - 1] or None, got %R", ms);
        return -1;
    }
    *out = v;
    return 0;
}

/* An optional count argument of plan() or plan_trace() (NULL: not given, *out unchanged): an int in
 * [0, hi]; what says what it counts.  Errors name the argument. */
int mf_py_count_arg(PyObject *o, const char *name, const char *what, long long hi, long long *out)
{
    long long v;
    int overflow = 0;
    if (!o)
        return 0;
    if (PyBool_Check(o) || !PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int (%s >= 0), not %.80s", name, what, Py_TYPE(o)->tp_name);
        return -1;
    }
    v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow || v < 0 || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s must be %s in [0, %lld], got %R", name, what, hi, o);
        return -1;
    }
    *out = v;
    return 0;
}

/* An iterable of ids (graph_inputs, graph_outputs, an op's inputs). */
typedef int (*id_sink)(mf_gbuf *b, int32_t v, void *arg);

static int each_id(PyObject *o, int32_t limit, const char *what, mf_gbuf *b, id_sink sink, void *arg)
{
    PyObject *seq = as_seq(o, what);
    Py_ssize_t i, n;
    char name[160];
    if (!seq)
        return -1;
    n = PyTuple_GET_SIZE(seq);
    for (i = 0; i < n; i++) {
        int32_t v;
        snprintf(name, sizeof name, "%s[%zd]", what, i);
        if (get_id(PyTuple_GET_ITEM(seq, i), limit, name, &v) < 0 || sink(b, v, arg) < 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

static int sink_in(mf_gbuf *b, int32_t v, void *arg)
{
    (void)arg;
    return mf_gbuf_op_in(b, v) < 0 ? (PyErr_NoMemory(), -1) : 0;
}

static int sink_out(mf_gbuf *b, int32_t v, void *arg)
{
    (void)arg;
    return mf_gbuf_op_out(b, v) < 0 ? (PyErr_NoMemory(), -1) : 0;
}

static int sink_flag(mf_gbuf *b, int32_t v, void *arg)
{
    uint8_t *flags = (uint8_t *)arg;
    (void)b;
    flags[v] = 1;
    return 0;
}

static int sink_donatable(mf_gbuf *b, int32_t v, void *arg)
{
    (void)arg;
    mf_gbuf_set_donatable(b, v);
    return 0;
}

/* A sequence of int pairs; each pair goes to sink2. */
typedef int (*pair_sink)(mf_gbuf *b, int32_t x, int32_t y, const char *what);

static int each_pair(PyObject *o, int32_t limit, const char *what, mf_gbuf *b, pair_sink sink)
{
    PyObject *seq = as_seq(o, what);
    Py_ssize_t i, n;
    char name[160];
    if (!seq)
        return -1;
    n = PyTuple_GET_SIZE(seq);
    for (i = 0; i < n; i++) {
        PyObject *pair;
        int32_t x, y;
        snprintf(name, sizeof name, "%s[%zd]", what, i);
        pair = as_seq(PyTuple_GET_ITEM(seq, i), name);
        if (!pair)
            goto fail;
        if (PyTuple_GET_SIZE(pair) != 2) {
            PyErr_Format(PyExc_ValueError, "%s must be a pair, got %zd items", name, PyTuple_GET_SIZE(pair));
            Py_DECREF(pair);
            goto fail;
        }
        {
            char n0[180], n1[180];
            snprintf(n0, sizeof n0, "%s[0]", name);
            snprintf(n1, sizeof n1, "%s[1]", name);
            if (get_id(PyTuple_GET_ITEM(pair, 0), limit, n0, &x) < 0 ||
                get_id(PyTuple_GET_ITEM(pair, 1), limit, n1, &y) < 0) {
                Py_DECREF(pair);
                goto fail;
            }
        }
        Py_DECREF(pair);
        if (sink(b, x, y, name) < 0)
            goto fail;
    }
    Py_DECREF(seq);
    return 0;
fail:
    Py_DECREF(seq);
    return -1;
}

static int sink_alias(mf_gbuf *b, int32_t view, int32_t base, const char *what)
{
    if (b->alias_of[view] != -1 && b->alias_of[view] != base) {
        PyErr_Format(PyExc_ValueError, "%s: value %d is already a view of value %d", what, (int)view,
                     (int)b->alias_of[view]);
        return -1;
    }
    if (view == base) {
        PyErr_Format(PyExc_ValueError, "%s: value %d cannot be a view of itself", what, (int)view);
        return -1;
    }
    b->alias_of[view] = base;
    return 0;
}

/* (the core's graph check rejects an op that is its own epilogue) */
static int sink_epilogue(mf_gbuf *b, int32_t v, int32_t u, const char *what)
{
    if (b->epilogue_of && v < b->n_epi && b->epilogue_of[v] != -1 && b->epilogue_of[v] != u) {
        PyErr_Format(PyExc_ValueError, "%s: op %d is already the epilogue of op %d", what, (int)v,
                     (int)b->epilogue_of[v]);
        return -1;
    }
    if (mf_gbuf_set_epilogue(b, v, u) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* (op, kind): the core's graph check rejects a kind other than 0, 1, 2 */
static int sink_comm(mf_gbuf *b, int32_t op, int32_t kind, const char *what)
{
    if (op >= b->n_ops) {
        PyErr_Format(PyExc_ValueError, "%s: op %d out of range [0, %d)", what, (int)op, (int)b->n_ops);
        return -1;
    }
    if (kind > 255) {
        PyErr_Format(PyExc_ValueError, "%s: comm kind %d is not 0 (none), 1 (issue) or 2 (wait)", what, (int)kind);
        return -1;
    }
    if (mf_gbuf_set_comm(b, op, (uint8_t)kind) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static int sink_after(mf_gbuf *b, int32_t x, int32_t y, const char *what)
{
    (void)what;
    if (mf_gbuf_after(b, x, y) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Build the graph from plan()/simulate() arguments.  0 or -1 (exception). */
static int build_graph(mf_gbuf *b, PyObject *ops, PyObject *value_bytes, PyObject *graph_inputs,
                       PyObject *graph_outputs, PyObject *aliases, PyObject *fusible, PyObject *after,
                       PyObject *epilogues, PyObject *donatable)
{
    PyObject *ops_seq = NULL, *vb_seq = NULL, *fu_seq = NULL;
    Py_ssize_t n_ops, n_values, i;
    char name[96];
    int rc = -1;

    if (!(vb_seq = as_seq(value_bytes, "value_bytes")))
        goto done;
    n_values = PyTuple_GET_SIZE(vb_seq);
    if (n_values >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "value_bytes: too many values");
        goto done;
    }
    for (i = 0; i < n_values; i++) {
        PyObject *o = PyTuple_GET_ITEM(vb_seq, i);
        long long v;
        int overflow = 0;
        if (PyBool_Check(o) || !PyLong_Check(o)) {
            PyErr_Format(PyExc_TypeError, "value_bytes[%zd] must be an int, not %.80s", i, Py_TYPE(o)->tp_name);
            goto done;
        }
        v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (v == -1 && PyErr_Occurred())
            goto done;
        if (overflow || v < 0) {
            PyErr_Format(PyExc_ValueError, "value_bytes[%zd]: size %R must be a non-negative 64-bit int", i, o);
            goto done;
        }
        if (mf_gbuf_add_value(b, (int64_t)v, 0) < 0) {
            PyErr_NoMemory();
            goto done;
        }
    }
    if (each_id(graph_inputs, (int32_t)n_values, "graph_inputs", b, sink_flag, b->is_input) < 0)
        goto done;
    if (each_id(graph_outputs, (int32_t)n_values, "graph_outputs", b, sink_flag, b->is_output) < 0)
        goto done;
    if (each_pair(aliases, (int32_t)n_values, "aliases", b, sink_alias) < 0)
        goto done;
    if (donatable && each_id(donatable, (int32_t)n_values, "donatable", b, sink_donatable, NULL) < 0)
        goto done;

    if (!(ops_seq = as_seq(ops, "ops")))
        goto done;
    n_ops = PyTuple_GET_SIZE(ops_seq);
    if (n_ops >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "ops: too many ops");
        goto done;
    }
    if (fusible != Py_None) {
        if (!(fu_seq = as_seq(fusible, "fusible")))
            goto done;
        if (PyTuple_GET_SIZE(fu_seq) != n_ops) {
            PyErr_Format(PyExc_ValueError, "fusible has %zd entries but there are %zd ops",
                         PyTuple_GET_SIZE(fu_seq), n_ops);
            goto done;
        }
    }
    for (i = 0; i < n_ops; i++) {
        PyObject *op;
        int fu = 0;
        snprintf(name, sizeof name, "ops[%zd]", i);
        if (fu_seq && (fu = mf_fusible_level(PyTuple_GET_ITEM(fu_seq, i))) < 0)
            goto done;
        if (!(op = as_seq(PyTuple_GET_ITEM(ops_seq, i), name)))
            goto done;
        if (PyTuple_GET_SIZE(op) != 2) {
            PyErr_Format(PyExc_ValueError, "%s must be a pair (inputs, outputs), got %zd items", name,
                         PyTuple_GET_SIZE(op));
            Py_DECREF(op);
            goto done;
        }
        if (mf_gbuf_begin_op(b, fu) < 0) {
            Py_DECREF(op);
            PyErr_NoMemory();
            goto done;
        }
        {
            char nin[120], nout[120];
            snprintf(nin, sizeof nin, "%s[0] (inputs)", name);
            snprintf(nout, sizeof nout, "%s[1] (outputs)", name);
            if (each_id(PyTuple_GET_ITEM(op, 0), (int32_t)n_values, nin, b, sink_in, NULL) < 0 ||
                each_id(PyTuple_GET_ITEM(op, 1), (int32_t)n_values, nout, b, sink_out, NULL) < 0) {
                Py_DECREF(op);
                goto done;
            }
        }
        Py_DECREF(op);
        if (mf_gbuf_end_op(b) < 0) {
            PyErr_NoMemory();
            goto done;
        }
    }
    if (each_pair(after, (int32_t)n_ops, "after", b, sink_after) < 0)
        goto done;
    if (epilogues && each_pair(epilogues, (int32_t)n_ops, "epilogues", b, sink_epilogue) < 0)
        goto done;
    rc = 0;
done:
    Py_XDECREF(ops_seq);
    Py_XDECREF(vb_seq);
    Py_XDECREF(fu_seq);
    return rc;
}

/* A list of the n ints a32[0..n) or, when a32 is NULL, a64[0..n); NULL with
 * an exception set on failure. */
static PyObject *int_list(const int32_t *a32, const int64_t *a64, Py_ssize_t n)
{
    PyObject *l = PyList_New(n);
    Py_ssize_t i;
    if (!l)
        return NULL;
    for (i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLongLong(a32 ? (long long)a32[i] : (long long)a64[i]);
        if (!v) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, i, v);
    }
    return l;
}

#define MF_PY_KIND_NAME_(id, name) name,
static const char *const KIND_NAMES[MF_GROUP_N_KINDS] = {MF_GROUP_KINDS(MF_PY_KIND_NAME_)};
#undef MF_PY_KIND_NAME_

/* The core's group kinds (mf_core.h NOTE [group kinds]) as their names. */
static PyObject *kind_list(const uint8_t *kinds, int32_t n)
{
    PyObject *l = PyList_New(n);
    int32_t i;
    if (!l)
        return NULL;
    for (i = 0; i < n; i++) {
        PyObject *v;
        if (kinds[i] >= MF_GROUP_N_KINDS) {
            Py_DECREF(l);
            return mf_py_raise_status(MF_EINTERNAL, "a group of the plan has no known kind");
        }
        if (!(v = PyUnicode_InternFromString(KIND_NAMES[kinds[i]]))) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, i, v);
    }
    return l;
}

/* The plan result as a dict (the Python layer wraps it in a Plan): groups[k]
 * the op ids of group k, kinds[k] its kind. */
PyObject *mf_py_plan_dict(const mf_plan_result *r)
{
    PyObject *d = NULL, *order = NULL, *groups = NULL, *kinds = NULL;
    int32_t g;
    if (!(order = int_list(r->order, NULL, r->n_ops)))
        goto fail;
    if (!(groups = PyList_New(r->n_groups)))
        goto fail;
    for (g = 0; g < r->n_groups; g++) {
        PyObject *grp = int_list(r->order + r->group_ptr[g], NULL, r->group_ptr[g + 1] - r->group_ptr[g]);
        if (!grp)
            goto fail;
        PyList_SET_ITEM(groups, g, grp);
    }
    if (!(kinds = kind_list(r->group_kind, r->n_groups)))
        goto fail;
    d = Py_BuildValue("{s:O,s:O,s:O,s:L,s:L,s:L,s:L,s:O,s:L,s:s,s:i,s:i,s:i}", "order", order, "groups", groups,
                      "kinds", kinds,
                      "peak_bytes", (long long)r->peak_bytes, "unfused_peak_bytes",
                      (long long)r->unfused_peak_bytes, "baseline_peak_bytes", (long long)r->baseline_peak_bytes,
                      "lower_bound_bytes", (long long)r->lower_bound_bytes, "optimal",
                      r->optimal ? Py_True : Py_False, "states", (long long)r->states, "method",
                      r->method ? r->method : "", "fusion_moves", (int)r->fusion_moves, "hoists",
                      (int)r->hoists, "comm_moves", (int)r->comm_moves);
fail:
    Py_XDECREF(order);
    Py_XDECREF(groups);
    Py_XDECREF(kinds);
    return d;
}

/* NOTE [interrupting a plan]: the core runs without the GIL and polls
 * ctx->cancel (mf_core.h NOTE [cancel]).  poll_signals reads a monotonic
 * clock and, at most every MF_PY_POLL_S seconds, takes the GIL back to run
 * PyErr_CheckSignals: a Ctrl-C then runs Python's handler, whose
 * KeyboardInterrupt stays set while the core unwinds with MF_ECANCEL, and
 * mf_py_raise passes it on.  (Off the main thread CheckSignals does nothing;
 * the plan then runs to its end.) */
#define MF_PY_POLL_S 0.02

typedef struct sigpoll {
    PyThreadState *ts;
    double next;
} sigpoll;

double mf_py_mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int poll_signals(void *ud)
{
    sigpoll *p = (sigpoll *)ud;
    double now = mf_py_mono_s();
    int rc;
    if (now < p->next)
        return 0;
    p->next = now + MF_PY_POLL_S;
    PyEval_RestoreThread(p->ts);
    rc = PyErr_CheckSignals();
    p->ts = PyEval_SaveThread();
    return rc < 0;
}

/* The core's plan options from the binding's arguments: fusion_moves 0 sets
 * no_fusion_moves, comm_overlap 0 no_comm_overlap, hoists 0 no_hoists,
 * coarse 0 no_coarse; dp_max_ops, dp_max_bytes (0: the defaults; tests lower
 * them). */
void mf_py_plan_options(const mf_py_plan_args *pa, mf_plan_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->max_states = pa->max_states;
    opt->max_dp_bytes = pa->dp_max_bytes;
    opt->fuse = pa->fuse;
    opt->no_fusion_moves = !pa->fusion_moves;
    opt->no_comm_overlap = !pa->comm_overlap;
    opt->dp_max_ops = pa->dp_max_ops;
    opt->no_hoists = !pa->hoists;
    opt->no_coarse = !pa->coarse;
    opt->max_refine = pa->max_refine;
    opt->peak_allowance = pa->peak_allowance;
}

int mf_py_plan_pipeline(mf_ctx *ctx, const mf_graph_desc *d, const mf_pipeline_options *opt,
                        mf_pipeline_result *res)
{
    sigpoll sp;
    int st;
    ctx->cancel = poll_signals;
    ctx->cancel_ud = &sp;
    sp.next = mf_py_mono_s() + MF_PY_POLL_S;
    sp.ts = PyEval_SaveThread();
    st = mf_plan_pipeline(ctx, d, opt, res);
    PyEval_RestoreThread(sp.ts);
    ctx->cancel = NULL;
    return st;
}

static PyObject *py_plan(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ops",  "value_bytes", "graph_inputs", "graph_outputs", "aliases",
                             "fusible", "after",    "max_states",   "fuse",          "epilogues",
                             "fusion_moves", "_dp_max_ops", "_dp_max_bytes", "comm", "comm_overlap", "recompute",
                             "cheap", "_recompute_passes", "_hoists", "peak_allowance", "_max_work", "peak_target",
                             "donatable", NULL};
    PyObject *ops, *vb, *gi = NULL, *go = NULL, *al = NULL, *fu = Py_None, *af = NULL, *ms = Py_None;
    PyObject *ch = Py_None;
    PyObject *dp_ops_o = NULL, *dp_bytes_o = NULL, *budget_o = NULL, *passes_o = NULL, *allowance_o = NULL;
    PyObject *work_o = NULL, *target_o = NULL, *don = NULL;
    long long budget = 0, n = 0, max_work = 0, target = 0;
    uint8_t *cheap = NULL;
    PyObject *ep = NULL, *cm = NULL;
    int comm_overlap = 1;
    PyObject *empty = NULL, *out = NULL;
    int fuse = 1, fusion_moves = 1, dp_max_ops = 0, passes = 0, hoists = 1;
    long long max_states = 0, dp_max_bytes = 0, allowance = 0;
    mf_gbuf b;
    (void)self;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$OOOOOOpOpOOOpOOOpOOOO:plan", kwlist, &ops, &vb, &gi, &go, &al,
                                     &fu, &af, &ms, &fuse, &ep, &fusion_moves, &dp_ops_o, &dp_bytes_o, &cm,
                                     &comm_overlap, &budget_o, &ch, &passes_o, &hoists, &allowance_o, &work_o,
                                     &target_o, &don))
        return NULL;
    if (mf_py_count_arg(allowance_o, "peak_allowance", "a number of bytes", LLONG_MAX, &allowance) < 0 ||
        mf_py_count_arg(budget_o, "recompute", "a budget in bytes", LLONG_MAX, &budget) < 0 ||
        mf_py_count_arg(dp_bytes_o, "_dp_max_bytes", "a number of bytes", LLONG_MAX, &dp_max_bytes) < 0 ||
        mf_py_count_arg(work_o, "_max_work", "a number of work units", LLONG_MAX, &max_work) < 0 ||
        mf_py_count_arg(target_o, "peak_target", "a number of bytes", LLONG_MAX, &target) < 0)
        return NULL;
    if (mf_py_count_arg(dp_ops_o, "_dp_max_ops", "a number of ops", INT_MAX, &n) < 0)
        return NULL;
    dp_max_ops = (int)n;
    n = 0;
    if (mf_py_count_arg(passes_o, "_recompute_passes", "a number of passes", INT_MAX, &n) < 0)
        return NULL;
    passes = (int)n;
    if (mf_py_max_states(ms, &max_states) < 0)
        return NULL;
    if (!(empty = PyTuple_New(0)))
        return NULL;
    mf_py_gbuf_init(&b);
    if (build_graph(&b, ops, vb, gi ? gi : empty, go ? go : empty, al ? al : empty, fu, af ? af : empty,
                    ep, don) == 0 &&
        (!cm || each_pair(cm, INT32_MAX, "comm", &b, sink_comm) == 0)) {
        if (budget > 0 && ch != Py_None) {
            PyObject *cs = mf_py_tuple(ch, "cheap");
            Py_ssize_t i;
            if (!cs)
                goto done;
            if (PyTuple_GET_SIZE(cs) != b.n_ops) {
                PyErr_Format(PyExc_ValueError, "cheap has %zd entries but the graph has %d ops",
                             PyTuple_GET_SIZE(cs), (int)b.n_ops);
                Py_DECREF(cs);
                goto done;
            }
            if (!(cheap = PyMem_RawCalloc((size_t)b.n_ops + 1, 1))) {
                Py_DECREF(cs);
                PyErr_NoMemory();
                goto done;
            }
            for (i = 0; i < b.n_ops; i++) {
                int t = PyObject_IsTrue(PyTuple_GET_ITEM(cs, i));
                if (t < 0) {
                    Py_DECREF(cs);
                    goto done;
                }
                cheap[i] = (uint8_t)t;
            }
            Py_DECREF(cs);
        }
        {
            mf_gbuf used;
            mf_py_plan_args pa = MF_PY_PLAN_ARGS_DEFAULT;
            pa.max_states = max_states;
            pa.dp_max_bytes = dp_max_bytes;
            pa.fuse = fuse;
            pa.fusion_moves = fusion_moves;
            pa.comm_overlap = comm_overlap;
            pa.dp_max_ops = dp_max_ops;
            pa.hoists = hoists;
            pa.peak_allowance = allowance;
            pa.max_work = max_work;
            pa.peak_target = target;
            out = mf_py_plan_with_recompute(&b, cheap, cheap ? budget : 0, &pa, passes, &used);
            mf_gbuf_free(&used);
        }
    }
done:
    PyMem_RawFree(cheap);
    mf_gbuf_free(&b);
    Py_DECREF(empty);
    return out;
}

/* simulate's order (and groups): ids into order[0..n_ops), group offsets
 * into gptr; every group non-empty, and with groups given their
 * concatenation must be the order.  0 or -1 (exception). */
static int read_schedule(PyObject *order_o, PyObject *groups_o, int32_t n_ops, int32_t *order, int32_t *gptr,
                         int32_t *n_groups)
{
    PyObject *seq = NULL, *grp = NULL;
    Py_ssize_t i, n, g, k = 0;
    char name[96];
    int rc = -1;
    if (!(seq = as_seq(order_o, "order")))
        return -1;
    n = PyTuple_GET_SIZE(seq);
    if (n != n_ops) {
        PyErr_Format(PyExc_ValueError, "order has %zd ops but the graph has %d", n, (int)n_ops);
        goto done;
    }
    for (i = 0; i < n; i++) {
        snprintf(name, sizeof name, "order[%zd]", i);
        if (get_id(PyTuple_GET_ITEM(seq, i), n_ops, name, &order[i]) < 0)
            goto done;
        gptr[i] = (int32_t)i;
    }
    gptr[n] = (int32_t)n;
    *n_groups = (int32_t)n;
    Py_CLEAR(seq);
    if (groups_o == Py_None)
        return 0;
    if (!(seq = as_seq(groups_o, "groups")))
        return -1;
    n = PyTuple_GET_SIZE(seq);
    for (g = 0; g < n; g++) {
        Py_ssize_t j, m;
        snprintf(name, sizeof name, "groups[%zd]", g);
        if (!(grp = as_seq(PyTuple_GET_ITEM(seq, g), name)))
            goto done;
        m = PyTuple_GET_SIZE(grp);
        if (m == 0) {
            PyErr_Format(PyExc_ValueError, "%s is empty: every group holds at least one op", name);
            goto done;
        }
        if (m > (Py_ssize_t)n_ops - k) {
            PyErr_Format(PyExc_ValueError, "groups hold more than the graph's %d ops", (int)n_ops);
            goto done;
        }
        gptr[g] = (int32_t)k;
        for (j = 0; j < m; j++, k++) {
            int32_t v;
            snprintf(name, sizeof name, "groups[%zd][%zd]", g, j);
            if (get_id(PyTuple_GET_ITEM(grp, j), n_ops, name, &v) < 0)
                goto done;
            if (v != order[k]) {
                PyErr_Format(PyExc_ValueError,
                             "%s is op %d but order[%zd] is op %d: the groups must be consecutive runs of order",
                             name, (int)v, k, (int)order[k]);
                goto done;
            }
        }
        Py_CLEAR(grp);
    }
    if (k != n_ops) {
        PyErr_Format(PyExc_ValueError, "groups hold %zd ops but the graph has %d", k, (int)n_ops);
        goto done;
    }
    gptr[n] = (int32_t)k;
    *n_groups = (int32_t)n;
    rc = 0;
done:
    Py_XDECREF(seq);
    Py_XDECREF(grp);
    return rc;
}

static PyObject *py_simulate(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ops",     "value_bytes", "order", "groups", "graph_inputs",
                             "graph_outputs", "aliases", "fusible", "epilogues", "donatable", NULL};
    PyObject *ops, *vb, *order_o, *groups_o = Py_None, *gi = NULL, *go = NULL, *al = NULL, *fu = Py_None;
    PyObject *ep = NULL, *don = NULL;
    PyObject *empty = NULL, *out = NULL;
    int32_t *order = NULL, *gptr = NULL;
    int64_t *steps = NULL, *live = NULL, peak = 0;
    int32_t n_groups = 0;
    mf_gbuf b;
    mf_ctx ctx;
    mf_graph_desc desc;
    int st;
    (void)self;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|O$OOOOOO:simulate", kwlist, &ops, &vb, &order_o, &groups_o, &gi,
                                     &go, &al, &fu, &ep, &don))
        return NULL;
    if (!(empty = PyTuple_New(0)))
        return NULL;
    mf_py_gbuf_init(&b);
    mf_py_ctx_init(&ctx);
    if (build_graph(&b, ops, vb, gi ? gi : empty, go ? go : empty, al ? al : empty, fu, empty, ep, don) < 0)
        goto done;
    mf_gbuf_desc(&b, &desc);
    if ((st = mf_graph_check(&ctx, &desc)) != MF_OK) {
        mf_py_raise(&ctx, st);
        goto done;
    }
    order = PyMem_RawMalloc(sizeof(int32_t) * (size_t)(desc.n_ops + 1));
    gptr = PyMem_RawMalloc(sizeof(int32_t) * (size_t)(desc.n_ops + 2));
    steps = PyMem_RawMalloc(sizeof(int64_t) * (size_t)(desc.n_ops + 1));
    live = PyMem_RawMalloc(sizeof(int64_t) * (size_t)(desc.n_ops + 1));
    if (!order || !gptr || !steps || !live) {
        PyErr_NoMemory();
        goto done;
    }
    if (read_schedule(order_o, groups_o, desc.n_ops, order, gptr, &n_groups) < 0)
        goto done;
    if ((st = mf_simulate(&ctx, &desc, order, gptr, n_groups, &peak, steps, live)) != MF_OK) {
        mf_py_raise(&ctx, st);
        goto done;
    }
    {
        PyObject *sl = int_list(NULL, steps, n_groups), *ll = int_list(NULL, live, n_groups);
        if (sl && ll)
            out = Py_BuildValue("(LOO)", (long long)peak, sl, ll);
        Py_XDECREF(sl);
        Py_XDECREF(ll);
    }
done:
    PyMem_RawFree(order);
    PyMem_RawFree(gptr);
    PyMem_RawFree(steps);
    PyMem_RawFree(live);
    mf_gbuf_free(&b);
    Py_DECREF(empty);
    return out;
}

/* MemFuse(max_states=) checks its argument here, so plan(), plan_trace()
 * and the transform accept and reject exactly the same values. */
static PyObject *py_validate_max_states(PyObject *self, PyObject *arg)
{
    long long v;
    (void)self;
    if (mf_py_max_states(arg, &v) < 0)
        return NULL;
    if (arg == Py_None)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(v);
}

static PyMethodDef plan_methods[] = {
    {"plan", (PyCFunction)(void (*)(void))py_plan, METH_VARARGS | METH_KEYWORDS,
     "plan($module, /, ops, value_bytes, *, graph_inputs=(), graph_outputs=(), aliases=(), fusible=None, "
     "after=(), max_states=None, fuse=True, epilogues=(), fusion_moves=True, _dp_max_ops=0, _dp_max_bytes=0, comm=(), "
     "comm_overlap=True, recompute=0, cheap=None, _recompute_passes=0, _hoists=True, peak_allowance=0, _max_work=0, "
     "peak_target=0, donatable=())\n--\n\n"
     "Plan the order and fusion groups with the least peak bytes; returns a dict (thunder_memfuse.plan wraps "
     "it in a Plan): kinds[k] is group k's kind, \"single\", \"region\" or \"epilogue\".\n"
     "peak_allowance: a fused peak up to this many bytes costs nothing, so the fewest groups within it are "
     "formed (NOTE [peak allowance]); 0: none.\n"
     "max_states: None or an int in [1, 2**63 - 1].  The DP also stops at a memory budget (256 MiB, "
     "_dp_max_bytes when > 0), reporting optimal=False.  Ctrl-C raises KeyboardInterrupt.\n"
     "_dp_max_ops, _dp_max_bytes (tests only): pieces above this many ops count as large for the DP "
     "(default 256); the DP's memory budget in bytes; how many times recomputation's search runs (default 3); _hoists=False: no NOTE [hoists]; "
     "_max_work: the planning pipeline's work budget (NOTE [work budget]; 0: the default).  The result's \"pipeline\" says which "
     "start won, the recomputation passes kept, the planner calls and the work spent.\n"
     "peak_target: 0, or bytes: the plan with the fewest copied bytes whose fused peak is at most this, else the "
     "lowest (NOTE [peak target]); the pipeline's \"fits\" says which.\n"
     "donatable: value ids whose storage a fused group reading it last may write a result over (NOTE [donated "
     "inputs], csrc/core/mf_credit.c)."},
    {"simulate", (PyCFunction)(void (*)(void))py_simulate, METH_VARARGS | METH_KEYWORDS,
     "simulate($module, /, ops, value_bytes, order, groups=None, *, graph_inputs=(), graph_outputs=(), "
     "aliases=(), fusible=None, epilogues=(), donatable=())\n--\n\n"
     "Score a schedule with the core's cost model; returns (peak, step_bytes, live_after).\n"
     "fusible: as plan()'s; only its stored level (2) matters here (NOTE [stored inner values]).\n"
     "epilogues: as plan()'s; a two-op group (u, v) with v the epilogue of u is an epilogue pair, so a "
     "plan's groups and epilogues give plan()'s peak; so do its donatable values (as plan()'s).\n"
     "order must be a permutation of the ops that keeps every dependency; groups (optional) must be non-empty "
     "consecutive runs of order.  Otherwise ValueError names the problem."},
    {"_validate_max_states", (PyCFunction)py_validate_max_states, METH_O,
     "_validate_max_states($module, max_states, /)\n--\n\n"
     "max_states as plan() accepts it (None or an int in [1, 2**63 - 1]), else TypeError / ValueError."},
    {NULL, NULL, 0, NULL},
};

int mf_py_plan_exec(PyObject *module)
{
    if (PyModule_AddFunctions(module, plan_methods) < 0)
        return -1;
    return PyModule_AddIntConstant(module, "DEFAULT_MAX_STATES", MF_DEFAULT_MAX_STATES);
}
