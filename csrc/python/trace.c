/*
 * trace.c -- read a Thunder trace into the core's graph builder, plan it,
 * regroup it.
 *
 * plan_trace(bsyms, records, *, tensor_type, max_states=None, fuse=True,
 *            freeable=None, comm_overlap=True, recompute=0, peak_allowance=0,
 *            peak_target=0, donatable=None)
 *
 * records[i] describes bsyms[i] (thunder_memfuse/integration/_records.py collects them in
 * one pass; this file knows no Thunder symbol and calls nothing back):
 *   (kind, effects, fusible, aliases, cheap, epilogue)
 *  - kind: RECORD_OP, RECORD_PROLOGUE (unpack_*: kept first, in order; their
 *    outputs are graph inputs), RECORD_DROP (del, clear_mutable_collection:
 *    dropped, the Python layer re-creates them on the new order) or
 *    RECORD_RETURN (kept last; what it reads is a graph output);
 *  - effects: MF_EFF_* (csrc/core/mf_build.c NOTE [ordering edges], NOTE
 *    [collectives]); fusible: 0, 1 or 2 (MF_FUSIBLE_STORED); cheap: may be
 *    recomputed (NOTE [recompute candidates]); epilogue: MF_EPI_* (NOTE
 *    [epilogue candidates]);
 *  - aliases: None, or one entry per flat_proxy_outs item, None or
 *    (k, always) with k an index into flat_proxy_args: the output shares
 *    argument k's storage (always) or may share it (mf_build.c NOTE [views];
 *    thunder_memfuse/integration/_aliases.py NOTE [storage identity]).
 * Of the bound symbols it reads sym.id, flat_proxy_args, flat_proxy_outs and
 * of proxies name, shape and dtype.bytes.  Returns
 *
 *   {"prologue": [bsym...], "groups": [[bsym...]...], "kinds": [each group's
 *    kind in the plan], "epilogue": [bsym...],
 *    "plan": {...core plan...}, "graph": {plan() arguments}, "names": [...],
 *    "saved_op": op 0 is the virtual op making the saved tensors}
 *
 * NOTE [sizes]  bytes = ceil(numel * dtype.bytes) for proxies of tensor_type
 * (dtype bytes may be fractional, e.g. fp4; futures are sized like tensors:
 * mf_build.c NOTE [collectives]), 0 for other proxies.  A symbolic dimension
 * (cache="symbolic values": an IntegerProxy) counts with the value it had
 * when the trace was made: the order is valid for every size (validity never
 * depends on sizes) and planned for the traced one.  A dimension with no int
 * value raises ValueError("unknown shape"): the Python layer then returns the
 * trace unchanged with a warning.
 *
 * NOTE [freeable saved tensors]  In a backward trace, the saved activations
 * (unpacked from saved_for_backward) are freed by Thunder as soon as their
 * last use has run (torch_autograd.py clears ctx's references), unlike real
 * graph inputs.  Names passed in `freeable` become values of the builder's
 * virtual op 0 (mf_build.c NOTE [saved op]); its group is dropped from the
 * result.  With storage information (NOTE [saved storages]), saved tensors
 * that share a storage in the forward (a tensor and its views) are one
 * storage here too.
 *
 * donatable: None, or the names of the proxies whose storage a fused group
 * reading it last may write over (csrc/core/mf_credit.c NOTE [donated
 * inputs]; the Python layer decides which: _planning.donatable_names).
 *
 * An op returning one of its own arguments (an in-place op's result)
 * introduces no new value; any other name produced twice is an error.
 */
#include "trace_walk.h"
#include <limits.h>
#include <string.h>

enum { RECORD_OP = 0, RECORD_PROLOGUE = 1, RECORD_DROP = 2, RECORD_RETURN = 3 };

typedef struct {
    long kind, effects, fusible, cheap, epilogue;
    PyObject *aliases; /* borrowed */
} record_t;

static int read_record(PyObject *r, Py_ssize_t i, record_t *out)
{
    long *fields[5];
    int k;
    fields[0] = &out->kind;
    fields[1] = &out->effects;
    fields[2] = &out->fusible;
    fields[3] = &out->cheap;
    fields[4] = &out->epilogue;
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 6) {
        PyErr_Format(PyExc_TypeError,
                     "records[%zd] must be a (kind, effects, fusible, aliases, cheap, epilogue) tuple", i);
        return -1;
    }
    for (k = 0; k < 5; k++) {
        PyObject *x = PyTuple_GET_ITEM(r, k < 3 ? k : k + 1);
        if (k == 2) {
            int lv = mf_fusible_level(x);
            if (lv < 0)
                return -1;
            *fields[k] = lv;
            continue;
        }
        *fields[k] = PyLong_AsLong(x);
        if (*fields[k] == -1 && PyErr_Occurred())
            return -1;
        if (*fields[k] < 0) {
            PyErr_Format(PyExc_ValueError, "records[%zd][%d] must be >= 0", i, k < 3 ? k : k + 1);
            return -1;
        }
    }
    out->aliases = PyTuple_GET_ITEM(r, 3);
    if (out->kind > RECORD_RETURN) {
        PyErr_Format(PyExc_ValueError, "records[%zd]: unknown kind %ld", i, out->kind);
        return -1;
    }
    if (out->aliases != Py_None && !PyTuple_Check(out->aliases)) {
        PyErr_Format(PyExc_TypeError, "records[%zd]: aliases must be None or a tuple, not %.60s", i,
                     Py_TYPE(out->aliases)->tp_name);
        return -1;
    }
    return 0;
}

/* mf_build.c NOTE [views]: the value output i shares storage with, from the
 * record's aliases, into *x (-1: none) and *view. */
static int alias_of_output(walk_t *w, PyObject *al, PyObject *argseq, const int32_t *in, Py_ssize_t i,
                           PyObject *symid, int32_t *x, uint8_t *view)
{
    PyObject *e;
    Py_ssize_t k;
    int always, arg_t;
    *x = -1;
    *view = 0;
    if (al == Py_None || i >= PyTuple_GET_SIZE(al) || (e = PyTuple_GET_ITEM(al, i)) == Py_None)
        return 0;
    if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2) {
        PyErr_Format(PyExc_TypeError, "aliases of %S, entry %zd, must be None or an (index, always) pair", symid, i);
        return -1;
    }
    k = PyLong_AsSsize_t(PyTuple_GET_ITEM(e, 0));
    if (k == -1 && PyErr_Occurred())
        return -1;
    if (k < 0 || k >= PyTuple_GET_SIZE(argseq)) {
        PyErr_Format(PyExc_ValueError, "aliases of %S, entry %zd, names argument %zd of %zd", symid, i, k,
                     PyTuple_GET_SIZE(argseq));
        return -1;
    }
    if ((always = PyObject_IsTrue(PyTuple_GET_ITEM(e, 1))) < 0)
        return -1;
    if ((arg_t = PyObject_IsInstance(PyTuple_GET_ITEM(argseq, k), w->tensor_type)) <= 0)
        return arg_t;
    *x = in[k];
    *view = (uint8_t)always;
    return 0;
}

/* One graph op for bsym, from its record. */
static int add_op(walk_t *w, PyObject *bsym, PyObject *symid, const record_t *r)
{
    PyObject *args = NULL, *outs = NULL, *argseq = NULL, *outseq = NULL, *pending = NULL;
    int32_t *in = NULL, *alias = NULL, *ids = NULL;
    int64_t *bytes = NULL;
    uint8_t *view = NULL;
    mf_op_record rec;
    Py_ssize_t i, n_in, n_out, n_new = 0;
    int rc = -1;

    if (!(args = PyObject_GetAttrString(bsym, "flat_proxy_args")) ||
        !(argseq = mf_py_tuple(args, "flat_proxy_args")))
        goto done;
    if (!(outs = PyObject_GetAttrString(bsym, "flat_proxy_outs")) ||
        !(outseq = mf_py_tuple(outs, "flat_proxy_outs")))
        goto done;
    n_in = PyTuple_GET_SIZE(argseq);
    n_out = PyTuple_GET_SIZE(outseq);
    in = (int32_t *)PyMem_RawMalloc(sizeof(int32_t) * ((size_t)n_in + 1));
    alias = (int32_t *)PyMem_RawMalloc(sizeof(int32_t) * ((size_t)n_out + 1));
    ids = (int32_t *)PyMem_RawMalloc(sizeof(int32_t) * ((size_t)n_out + 1));
    bytes = (int64_t *)PyMem_RawMalloc(sizeof(int64_t) * ((size_t)n_out + 1));
    view = (uint8_t *)PyMem_RawMalloc((size_t)n_out + 1);
    if (!in || !alias || !ids || !bytes || !view || !(pending = PyList_New(0))) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < n_in; i++)
        if ((in[i] = mf_walk_value_of(w, PyTuple_GET_ITEM(argseq, i), 1)) < 0)
            goto done;
    for (i = 0; i < n_out; i++) {
        PyObject *p = PyTuple_GET_ITEM(outseq, i), *name, *idobj;
        if (!(name = PyObject_GetAttrString(p, "name")))
            goto done;
        idobj = PyDict_GetItemWithError(w->ids, name); /* borrowed */
        if (idobj) {
            int32_t prev = (int32_t)PyLong_AsLong(idobj);
            Py_ssize_t k;
            int is_arg = 0;
            for (k = 0; k < n_in; k++)
                is_arg |= in[k] == prev;
            if (!is_arg)
                PyErr_Format(PyExc_ValueError, "proxy %S is produced twice (second time by %S)", name, symid);
            Py_DECREF(name);
            if (!is_arg)
                goto done;
            continue;
        }
        if (PyErr_Occurred() || mf_walk_proxy_bytes(w, p, name, &bytes[n_new]) < 0) {
            Py_DECREF(name);
            goto done;
        }
        Py_DECREF(name);
        if (alias_of_output(w, r->aliases, argseq, in, i, symid, &alias[n_new], &view[n_new]) < 0 ||
            PyList_Append(pending, p) < 0)
            goto done;
        n_new++;
    }
    memset(&rec, 0, sizeof rec);
    rec.n_in = (int32_t)n_in;
    rec.in = in;
    rec.n_out = (int32_t)n_new;
    rec.out_bytes = bytes;
    rec.out_alias = alias;
    rec.out_view = view;
    rec.effects = (uint32_t)r->effects;
    rec.fusible = (uint8_t)r->fusible;
    rec.cheap = (uint8_t)(r->cheap != 0);
    rec.epilogue = (uint8_t)r->epilogue;
    if (mf_build_op(&w->B, &rec, ids) < 0) {
        mf_walk_raise(w);
        goto done;
    }
    for (i = 0; i < n_new; i++)
        if (mf_walk_bind(w, PyList_GET_ITEM(pending, i), ids[i]) < 0)
            goto done;
    rc = 0;
done:
    PyMem_RawFree(in);
    PyMem_RawFree(alias);
    PyMem_RawFree(ids);
    PyMem_RawFree(bytes);
    PyMem_RawFree(view);
    Py_XDECREF(pending);
    Py_XDECREF(args);
    Py_XDECREF(outs);
    Py_XDECREF(argseq);
    Py_XDECREF(outseq);
    return rc;
}

/* NOTE [saved storages]: the value of a freeable saved tensor p, made by the
 * builder's op 0.  With `freeable` a dict {name: (storage key, storage
 * bytes)} (thunder_memfuse/integration/_planning.py saved_storages), saved tensors with the
 * same key share one storage: the first of a group creates its root (p itself
 * when p is the root, named by the key; else a value of the key's bytes named
 * "storage(key)"), the others are views of it, so the storage counts once and
 * is freed after the last reader of any member.  `storages` maps key -> root
 * value id.  With a set (no storage information) each is its own storage. */
static int32_t saved_value(walk_t *w, PyObject *p, PyObject *freeable, PyObject *storages)
{
    PyObject *name = NULL, *entry, *key, *rootobj, *iv = NULL, *label = NULL;
    long long nbytes;
    int64_t own;
    int32_t root = -1, v = -1;
    if (!(name = PyObject_GetAttrString(p, "name")))
        return -1;
    if (mf_walk_proxy_bytes(w, p, name, &own) < 0)
        goto done;
    if (!PyDict_Check(freeable)) {
        if ((v = mf_build_saved(&w->B, own, -1)) < 0 || mf_walk_bind(w, p, v) < 0)
            v = v < 0 ? mf_walk_raise(w) : -1;
        goto done;
    }
    entry = PyDict_GetItemWithError(freeable, name); /* borrowed */
    if (!entry) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_KeyError, "%S", name);
        goto done;
    }
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2) {
        PyErr_Format(PyExc_TypeError, "freeable[%R] must be a (storage key, bytes) tuple", name);
        goto done;
    }
    key = PyTuple_GET_ITEM(entry, 0);
    if ((nbytes = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 1))) < 0) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "freeable[%R]: storage bytes must be >= 0", name);
        goto done;
    }
    rootobj = PyDict_GetItemWithError(storages, key); /* borrowed */
    if (!rootobj && PyErr_Occurred())
        goto done;
    if (rootobj) {
        root = (int32_t)PyLong_AsLong(rootobj);
    } else {
        int same = PyObject_RichCompareBool(name, key, Py_EQ);
        if (same < 0)
            goto done;
        if (!same) { /* the storage itself, named by its key */
            if ((root = mf_build_saved(&w->B, (int64_t)nbytes, -1)) < 0) {
                mf_walk_raise(w);
                goto done;
            }
            if (!(label = PyUnicode_FromFormat("storage(%S)", key)) || mf_walk_label(w, label) < 0)
                goto done;
        }
    }
    if ((v = mf_build_saved(&w->B, own, root)) < 0) {
        mf_walk_raise(w);
        goto done;
    }
    if (mf_walk_bind(w, p, v) < 0) {
        v = -1;
        goto done;
    }
    if (!rootobj && (!(iv = PyLong_FromLong(root >= 0 ? root : v)) || PyDict_SetItem(storages, key, iv) < 0))
        v = -1;
done:
    Py_XDECREF(iv);
    Py_XDECREF(label);
    Py_DECREF(name);
    return v;
}

/* A prologue bound symbol: its outputs are graph inputs, or saved tensors
 * made by op 0 (NOTE [freeable saved tensors]). */
static int add_prologue(walk_t *w, PyObject *b, PyObject *freeable, PyObject *storages)
{
    PyObject *outs, *os;
    Py_ssize_t k;
    int rc = -1;
    if (!(outs = PyObject_GetAttrString(b, "flat_proxy_outs")))
        return -1;
    if (!(os = mf_py_tuple(outs, "flat_proxy_outs"))) {
        Py_DECREF(outs);
        return -1;
    }
    for (k = 0; k < PyTuple_GET_SIZE(os); k++) {
        PyObject *p = PyTuple_GET_ITEM(os, k), *nm;
        int fr = 0;
        if (freeable != Py_None) {
            if (!(nm = PyObject_GetAttrString(p, "name")))
                goto done;
            fr = PySequence_Contains(freeable, nm);
            if (fr > 0)
                fr = PyObject_IsInstance(p, w->tensor_type);
            if (fr > 0) { /* a name seen before is that value again */
                int known = PyDict_Contains(w->ids, nm);
                fr = known < 0 ? -1 : !known;
            }
            Py_DECREF(nm);
            if (fr < 0)
                goto done;
        }
        if (fr ? saved_value(w, p, freeable, storages) < 0 : mf_walk_value_of(w, p, 1) < 0)
            goto done;
    }
    rc = 0;
done:
    Py_DECREF(outs);
    Py_DECREF(os);
    return rc;
}

/* The return's proxy arguments are graph outputs. */
static int add_outputs(walk_t *w, PyObject *epilogue)
{
    Py_ssize_t i, k;
    for (i = 0; i < PyList_GET_SIZE(epilogue); i++) {
        PyObject *args = PyObject_GetAttrString(PyList_GET_ITEM(epilogue, i), "flat_proxy_args"), *as;
        int bad = 0;
        if (!args)
            return -1;
        if (!(as = mf_py_tuple(args, "flat_proxy_args"))) {
            Py_DECREF(args);
            return -1;
        }
        for (k = 0; k < PyTuple_GET_SIZE(as) && !bad; k++) {
            int32_t v = mf_walk_value_of(w, PyTuple_GET_ITEM(as, k), 1);
            bad = v < 0 || (mf_build_output(&w->B, v) < 0 && mf_walk_raise(w) < 0);
        }
        Py_DECREF(args);
        Py_DECREF(as);
        if (bad)
            return -1;
    }
    return 0;
}

/* The values named in `donatable` (None: none) may be donated. */
static int mark_donatable(walk_t *w, PyObject *donatable)
{
    PyObject *it, *name;
    if (donatable == Py_None)
        return 0;
    if (!(it = PyObject_GetIter(donatable)))
        return -1;
    while ((name = PyIter_Next(it))) {
        PyObject *idobj = PyDict_GetItemWithError(w->ids, name); /* borrowed */
        Py_DECREF(name);
        if (idobj)
            mf_gbuf_set_donatable(&w->B.g, (int32_t)PyLong_AsLong(idobj));
        else if (PyErr_Occurred())
            break;
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : 0;
}

/* The plan's kinds, one per group of `groups` (mf_core.h NOTE [group kinds]); the
 * saved-tensor op's group has no bound symbol, so it and its kind are dropped. */
static PyObject *kinds_of_groups(PyObject *plan, PyObject *groups)
{
    PyObject *pk = PyDict_GetItemString(plan, "kinds"), *kinds;
    Py_ssize_t g0;
    if (!pk || !PyList_Check(pk) || PyList_GET_SIZE(pk) != PyList_GET_SIZE(groups)) {
        PyErr_SetString(PyExc_RuntimeError, "plan_trace: the plan's kinds do not match its groups");
        return NULL;
    }
    if (!(kinds = PyList_GetSlice(pk, 0, PyList_GET_SIZE(pk))))
        return NULL;
    for (g0 = 0; g0 < PyList_GET_SIZE(groups); g0++) {
        PyObject *bl = PyList_GET_ITEM(groups, g0);
        if (PyList_GET_SIZE(bl) == 1 && PyList_GET_ITEM(bl, 0) == Py_None) {
            if (PySequence_DelItem(groups, g0) < 0 || PySequence_DelItem(kinds, g0) < 0)
                Py_CLEAR(kinds);
            break;
        }
    }
    return kinds;
}

static PyObject *py_plan_trace(PyObject *self, PyObject *pargs, PyObject *kw)
{
    static char *kwlist[] = {"bsyms",    "records", "tensor_type",  "max_states", "fuse",
                             "freeable", "comm_overlap", "recompute", "peak_allowance", "peak_target",
                             "donatable", NULL};
    PyObject *bsyms, *records, *tensor_type = NULL, *ms = Py_None, *freeable = Py_None, *donatable = Py_None;
    PyObject *seq = NULL, *rseq = NULL, *ops_list = NULL, *prologue = NULL, *epilogue = NULL, *storages = NULL;
    PyObject *plan = NULL, *groups = NULL, *kinds = NULL, *graph = NULL, *out = NULL;
    int fuse = 1, comm_overlap = 1, have_used = 0, st;
    long long max_states = 0, recompute = 0, allowance = 0, target = 0;
    double t_read = 0, t_plan = 0, t_regroup = 0, t_end = 0;
    PyObject *recompute_o = NULL, *allowance_o = NULL, *target_o = NULL;
    const uint8_t *cheap = NULL;
    mf_graph_desc d;
    mf_ctx pc;
    walk_t w;
    mf_gbuf used;
    mf_py_plan_args pa = MF_PY_PLAN_ARGS_DEFAULT;
    Py_ssize_t i, n;
    (void)self;

    memset(&w, 0, sizeof w);
    mf_py_ctx_init(&pc);
    mf_builder_init(&w.B, &pc);
    mf_gbuf_init(&used, &pc);
    if (!PyArg_ParseTupleAndKeywords(pargs, kw, "OO|$OOpOpOOOO:plan_trace", kwlist, &bsyms, &records, &tensor_type,
                                     &ms, &fuse, &freeable, &comm_overlap, &recompute_o, &allowance_o, &target_o,
                                     &donatable))
        goto done;
    if (mf_py_count_arg(allowance_o, "plan_trace: peak_allowance", "a number of bytes", LLONG_MAX, &allowance) < 0 ||
        mf_py_count_arg(recompute_o, "plan_trace: recompute", "a budget in bytes", LLONG_MAX, &recompute) < 0 ||
        mf_py_count_arg(target_o, "plan_trace: peak_target", "a number of bytes", LLONG_MAX, &target) < 0)
        goto done;
    if (!tensor_type) {
        PyErr_SetString(PyExc_TypeError, "plan_trace: tensor_type is required");
        goto done;
    }
    if (mf_py_max_states(ms, &max_states) < 0)
        goto done;
    w.tensor_type = tensor_type;
    if (!(w.ids = PyDict_New()) || !(w.names = PyList_New(0)) || !(ops_list = PyList_New(0)) ||
        !(storages = PyDict_New()) || !(prologue = PyList_New(0)) || !(epilogue = PyList_New(0)))
        goto done;
    if (!(seq = mf_py_tuple(bsyms, "bsyms")) || !(rseq = mf_py_tuple(records, "records")))
        goto done;
    t_read = mf_py_mono_s();
    n = PyTuple_GET_SIZE(seq);
    if (PyTuple_GET_SIZE(rseq) != n) {
        PyErr_Format(PyExc_ValueError, "plan_trace: %zd records for %zd bound symbols", PyTuple_GET_SIZE(rseq), n);
        goto done;
    }
    for (i = 0; i < n; i++) {
        PyObject *b = PyTuple_GET_ITEM(seq, i), *sym, *sid;
        record_t r;
        int bad;
        if (read_record(PyTuple_GET_ITEM(rseq, i), i, &r) < 0)
            goto done;
        if (r.kind == RECORD_DROP)
            continue;
        if (r.kind == RECORD_RETURN) {
            if (PyList_Append(epilogue, b) < 0)
                goto done;
            continue;
        }
        if (!(sym = PyObject_GetAttrString(b, "sym")))
            goto done;
        sid = PyObject_GetAttrString(sym, "id");
        Py_DECREF(sym);
        if (!sid)
            goto done;
        if (PyList_GET_SIZE(epilogue) > 0) {
            PyErr_Format(PyExc_ValueError, "bound symbol %zd (%S) comes after the return", i, sid);
            Py_DECREF(sid);
            goto done;
        }
        if (r.kind == RECORD_PROLOGUE && w.B.g.n_ops - (w.B.saved_op != 0) > 0) {
            PyErr_Format(PyExc_ValueError, "bound symbol %zd (%S): a prologue record after the first op", i, sid);
            Py_DECREF(sid);
            goto done;
        }
        if (r.kind == RECORD_PROLOGUE) {
            bad = add_prologue(&w, b, freeable, storages) < 0 || PyList_Append(prologue, b) < 0;
        } else {
            if (w.B.saved_op && PyList_GET_SIZE(ops_list) == 0 && PyList_Append(ops_list, Py_None) < 0) {
                Py_DECREF(sid);
                goto done;
            }
            bad = add_op(&w, b, sid, &r) < 0 || PyList_Append(ops_list, b) < 0;
        }
        Py_DECREF(sid);
        if (bad)
            goto done;
    }
    if (w.B.saved_op && PyList_GET_SIZE(ops_list) == 0 && PyList_Append(ops_list, Py_None) < 0)
        goto done;
    if (add_outputs(&w, epilogue) < 0 || mark_donatable(&w, donatable) < 0)
        goto done;
    if ((st = mf_build_finish(&w.B, fuse, &d, &cheap)) != MF_OK) {
        mf_py_raise(&w.B.g.ctx, st);
        goto done;
    }
    pa.max_states = max_states;
    pa.fuse = fuse;
    pa.comm_overlap = comm_overlap;
    pa.peak_allowance = allowance;
    pa.peak_target = target;
    t_plan = mf_py_mono_s();
    if (!(plan = mf_py_plan_with_recompute(&w.B.g, cheap, cheap ? recompute : 0, &pa, 0, &used)))
        goto done;
    t_regroup = mf_py_mono_s();
    have_used = used.n_ops > 0;
    if (!(groups = mf_py_regroup(plan, ops_list, have_used ? &used : NULL, w.B.g.n_values)))
        goto done;
    if (!(kinds = kinds_of_groups(plan, groups)))
        goto done;
    if (have_used) { /* the copies' graph, made once by remat.c: a new dict over the same lists */
        PyObject *rc = PyDict_GetItemString(plan, "recompute"), *g1 = rc ? PyDict_GetItemString(rc, "graph") : NULL;
        if (!g1 || !PyDict_Check(g1)) {
            PyErr_SetString(PyExc_RuntimeError, "plan_trace: the plan's copies come without their graph");
            goto done;
        }
        graph = PyDict_Copy(g1);
    } else {
        graph = mf_gbuf_to_dict(&w.B.g);
    }
    if (!graph)
        goto done;
    if (have_used) { /* the trace's own graph, whose input order is Thunder's (reports' "before") */
        PyObject *g0 = mf_gbuf_to_dict(&w.B.g);
        int bad = !g0 || PyDict_SetItemString(graph, "before_recompute", g0) < 0;
        Py_XDECREF(g0);
        if (bad)
            goto done;
    }
    t_end = mf_py_mono_s();
    /* stage_ms: reading the bound symbols into the graph, planning (with recomputation's passes), and
     * the groups of bound symbols made from the plan */
    out = Py_BuildValue("{s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:{s:d,s:d,s:d}}", "prologue", prologue, "groups", groups,
                        "kinds", kinds, "epilogue", epilogue, "plan", plan, "graph", graph, "names", w.names,
                        "saved_op", w.B.saved_op ? Py_True : Py_False, "stage_ms", "reading",
                        1e3 * (t_plan - t_read), "planning", 1e3 * (t_regroup - t_plan), "regrouping",
                        1e3 * (t_end - t_regroup));
done:
    Py_XDECREF(seq);
    Py_XDECREF(rseq);
    Py_XDECREF(ops_list);
    Py_XDECREF(prologue);
    Py_XDECREF(epilogue);
    Py_XDECREF(plan);
    Py_XDECREF(groups);
    Py_XDECREF(kinds);
    Py_XDECREF(graph);
    Py_XDECREF(storages);
    mf_walk_free(&w);
    mf_gbuf_free(&used);
    return out;
}

static PyMethodDef trace_methods[] = {
    {"plan_trace", (PyCFunction)(void (*)(void))py_plan_trace, METH_VARARGS | METH_KEYWORDS,
     "plan_trace($module, /, bsyms, records, *, tensor_type, max_states=None, fuse=True, freeable=None, "
     "comm_overlap=True, recompute=0, peak_allowance=0, peak_target=0, donatable=None)\n--\n\n"
     "Read a Thunder trace's bound symbols with one record each, plan them and regroup them; returns a "
     "dict.  max_states, peak_allowance and peak_target as in plan()."},
    {NULL, NULL, 0, NULL},
};

int mf_py_trace_exec(PyObject *module)
{
    if (PyModule_AddFunctions(module, trace_methods) < 0)
        return -1;
    if (PyModule_AddIntConstant(module, "EFF_ORDERED", MF_EFF_ORDERED) < 0 ||
        PyModule_AddIntConstant(module, "EFF_COMM", MF_EFF_COMM) < 0 ||
        PyModule_AddIntConstant(module, "EFF_WAIT", MF_EFF_WAIT) < 0 ||
        PyModule_AddIntConstant(module, "EFF_WRITES", MF_EFF_WRITES) < 0 ||
        PyModule_AddIntConstant(module, "EPI_HEAD", MF_EPI_HEAD) < 0 ||
        PyModule_AddIntConstant(module, "EPI_TAIL", MF_EPI_TAIL) < 0 ||
        PyModule_AddIntConstant(module, "FUSIBLE_POINTWISE", MF_FUSIBLE_POINTWISE) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_OP", RECORD_OP) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_PROLOGUE", RECORD_PROLOGUE) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_DROP", RECORD_DROP) < 0)
        return -1;
    return PyModule_AddIntConstant(module, "RECORD_RETURN", RECORD_RETURN);
}
