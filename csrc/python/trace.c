/*
 * trace.c -- read a Thunder trace into a core graph, plan it, regroup it.
 *
 * plan_trace(bsyms, *, tensor_type, aliases, prologue_ids, drop_ids,
 *            return_ids, effects, fusible, max_states=None, fuse=True,
 *            freeable=None, epilogue_pair=None, comm_overlap=True)
 *
 * Walks the bound symbols of a trace through the C API (bsym.sym.id,
 * bsym.sym.name, bsym.flat_proxy_args, bsym.flat_proxy_outs, proxy.name,
 * proxy.shape, proxy.dtype.bytes), builds the graph, plans it with the core
 * and returns the bound symbols regrouped in the planned order:
 *
 *   {"prologue": [bsym...], "groups": [[bsym...]...], "epilogue": [bsym...],
 *    "plan": {...core plan...}, "graph": {plan() arguments}, "names": [...],
 *    "saved_op": op 0 is the virtual op making the saved tensors (below)}
 *
 * Classification (the sets and callables come from thunder_memfuse/_thunder.py,
 * which knows Thunder's symbols; this file knows none by name):
 *  - drop_ids (del, clear_mutable_collection): dropped; the Python layer
 *    re-creates them with Thunder's del_last_used on the new order.
 *  - prologue_ids (unpack_*) before the first op: kept first, in order; their
 *    outputs are graph inputs.
 *  - return_ids: kept last; its proxy arguments are graph outputs.
 *  - everything else is an op of the graph.
 *
 * NOTE [ordering edges]  Dataflow alone does not make a reorder safe.
 *  - effects(bsym) & MF_EFF_ORDERED (random ops, side effects, item,
 *    collectives, ops without outputs): all such ops keep their relative
 *    order (one chain of edges).
 *  - effects(bsym) & MF_EFF_WRITES (copy_ and other in-place writes): the op
 *    runs after every earlier reader of the storage of each tensor argument,
 *    and before every later reader of it (write-after-read, read-after-write).
 *    "The storage" is the ordering root: every name that shares it or may
 *    share it at run time (NOTE [views]) reads and writes the same root, so a
 *    write through any alias orders against every reader of every alias.
 *
 * NOTE [collectives]  effects(bsym) & MF_EFF_COMM marks an asynchronous
 * collective, & MF_EFF_WAIT the wait on its future.  Neither joins the chain
 * above: the core keeps the collectives in their trace order by itself and
 * places them and their waits for overlap (mf_comm.c NOTE [collective
 * overlap]); a wait depends on its future only.  A collective that may write
 * its argument in place (an all_reduce with skip_clone) also carries
 * MF_EFF_WRITES, whose edges then apply (without the chain).  Futures are
 * sized like tensors (tensor_type includes the future proxy type): the
 * collective allocates its result when issued (Thunder's torch executor
 * clones or allocates the output then), and a wait's result is its future's
 * tensor, so it is an alias of the future, like a view.  Both ops are never
 * fused.
 *
 * NOTE [sizes]  bytes = ceil(numel * dtype.bytes) for tensor proxies (dtype
 * bytes may be fractional, e.g. fp4), 0 for other proxies.  A symbolic
 * dimension (cache="symbolic values": an IntegerProxy) counts with the value
 * it had when the trace was made: the order is valid for every size (validity
 * never depends on sizes) and planned for the traced one.  A dimension with no
 * int value raises ValueError("unknown shape"): the Python layer then returns
 * the trace unchanged with a warning.
 *
 * NOTE [freeable saved tensors]  In a backward trace, the saved activations
 * (unpacked from saved_for_backward) are freed by Thunder as soon as their
 * last use has run (torch_autograd.py clears ctx's references), unlike real
 * graph inputs.  Names passed in `freeable` become values allocated by a
 * virtual op 0 (no bound symbol; ordering edges put it before every op), so
 * the planner is rewarded for finishing with a saved tensor early.  Its group
 * is dropped from the result.
 *
 * With storage information (NOTE [saved storages]), saved tensors that share
 * a storage in the forward (a tensor and its views) are one storage here too.
 *
 * NOTE [views]  aliases(bsym) says which outputs share an argument's storage
 * (thunder_memfuse/_aliases.py NOTE [storage identity]): None, or one entry
 * per flat_proxy_outs item, None or (k, always) with k an index into
 * flat_proxy_args.  `always`: the output is a view of argument k in the
 * memory model (it shares that storage and allocates nothing).  Either way
 * the output joins argument k's storage for ordering (NOTE [ordering edges]):
 * an output that may alias its argument, depending on strides the trace does
 * not hold (`contiguous`), is an alias there and a new allocation in the
 * memory model.  (`reshape` may alias too, but Thunder's view table makes it
 * a view in the memory model: _thunder.VIEW_NAMES.)
 *
 * NOTE [epilogue candidates]  With fuse and an epilogue_pair callable, every
 * op v whose sized inputs are one value x produced by an op u (not a view of
 * it) is a candidate epilogue of u; epilogue_pair(bsym_u, bsym_v) decides
 * (a GEMM and a ReLU it can apply while writing, regions/nvrtc), and the core
 * forms the pair only where it is valid and pays (mf_fuse.c NOTE [epilogue
 * pairs]).
 */
#include "trace_walk.h"
#include <string.h>

static int contains(PyObject *set, PyObject *key)
{
    int r = PySequence_Contains(set, key);
    if (r < 0 && PyErr_ExceptionMatches(PyExc_TypeError)) { /* unhashable id: not a member */
        PyErr_Clear();
        return 0;
    }
    return r;
}

/* NOTE [views]: the argument output i shares storage with, from aliases()'s
 * answer `al`: *mem (a view in the memory model) and *ord (the ordering root
 * it joins), value ids or -1. */
static int alias_of_output(walk_t *w, const cfg_t *c, PyObject *al, PyObject *argseq, Py_ssize_t i, int is_t,
                           PyObject *symname, int32_t *mem, int32_t *ord)
{
    PyObject *e, *kobj, *alw;
    Py_ssize_t k;
    int32_t v;
    int always;
    *mem = *ord = -1;
    if (al == Py_None || !is_t || i >= PyTuple_GET_SIZE(al))
        return 0;
    e = PyTuple_GET_ITEM(al, i);
    if (e == Py_None)
        return 0;
    if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2) {
        PyErr_Format(PyExc_TypeError, "aliases(%S)[%zd] must be None or a (index, always) pair", symname, i);
        return -1;
    }
    kobj = PyTuple_GET_ITEM(e, 0);
    alw = PyTuple_GET_ITEM(e, 1);
    k = PyLong_AsSsize_t(kobj);
    if (k == -1 && PyErr_Occurred())
        return -1;
    if (k < 0 || k >= PyTuple_GET_SIZE(argseq)) {
        PyErr_Format(PyExc_ValueError, "aliases(%S)[%zd] names argument %zd of %zd", symname, i, k,
                     PyTuple_GET_SIZE(argseq));
        return -1;
    }
    if ((always = PyObject_IsTrue(alw)) < 0)
        return -1;
    {
        PyObject *p = PyTuple_GET_ITEM(argseq, k);
        int arg_t = PyObject_IsInstance(p, c->tensor_type);
        if (arg_t < 0)
            return -1;
        if (!arg_t)
            return 0;
        if ((v = mf_walk_value_of(w, c, p, 0)) < 0)
            return PyErr_Occurred() ? -1 : 0;
    }
    *ord = v;
    if (always)
        *mem = v;
    return 0;
}

/* Add one graph op for bsym (index op in ops_list). */
static int add_op(walk_t *w, const cfg_t *c, PyObject *bsym, PyObject *sym, int32_t op)
{
    PyObject *args = NULL, *outs = NULL, *r = NULL, *symname = NULL, *argseq = NULL, *outseq = NULL, *al = NULL;
    long flags;
    int fus, rc = -1;
    int32_t first_tensor = -1;
    Py_ssize_t i;

    if (!(r = PyObject_CallOneArg(c->effects, bsym)))
        goto done;
    flags = PyLong_AsLong(r);
    Py_CLEAR(r);
    if (flags == -1 && PyErr_Occurred())
        goto done;
    if (!(r = PyObject_CallOneArg(c->fusible, bsym)))
        goto done;
    if ((fus = mf_fusible_level(r)) < 0)
        goto done;
    Py_CLEAR(r);
    if (flags & (MF_EFF_COMM | MF_EFF_WAIT)) /* NOTE [collectives] */
        fus = 0;
    if (!(symname = PyObject_GetAttrString(sym, "name")))
        goto done;
    if (!(al = PyObject_CallOneArg(c->aliases, bsym))) /* NOTE [views] */
        goto done;
    if (al != Py_None && !PyTuple_Check(al)) {
        PyErr_Format(PyExc_TypeError, "aliases(%S) must return None or a tuple, not %.60s", symname,
                     Py_TYPE(al)->tp_name);
        goto done;
    }
    if (!(args = PyObject_GetAttrString(bsym, "flat_proxy_args")) ||
        !(argseq = mf_py_tuple(args, "flat_proxy_args")))
        goto done;
    if (!(outs = PyObject_GetAttrString(bsym, "flat_proxy_outs")) ||
        !(outseq = mf_py_tuple(outs, "flat_proxy_outs")))
        goto done;
    if (PyTuple_GET_SIZE(outseq) == 0)
        flags |= MF_EFF_ORDERED;
    if (mf_gbuf_begin_op(&w->g, fus) < 0)
        goto nomem;

    /* inputs, with read-after-write edges from the storage's last writer */
    for (i = 0; i < PyTuple_GET_SIZE(argseq); i++) {
        PyObject *p = PyTuple_GET_ITEM(argseq, i);
        int32_t v = mf_walk_value_of(w, c, p, 1), rt;
        int is_t;
        if (v < 0)
            goto done;
        if ((is_t = PyObject_IsInstance(p, c->tensor_type)) < 0)
            goto done;
        if (is_t && first_tensor < 0)
            first_tensor = v;
        if (mf_gbuf_op_in(&w->g, v) < 0)
            goto nomem;
        rt = w->root[v];
        if (w->last_writer[rt] >= 0 && w->last_writer[rt] != op && mf_gbuf_after(&w->g, w->last_writer[rt], op) < 0)
            goto nomem;
        if (mf_walk_add_reader(w, rt, op) < 0)
            goto nomem;
    }
    /* write-after-read: after every earlier reader of each written storage */
    if (flags & MF_EFF_WRITES) {
        for (i = 0; i < PyTuple_GET_SIZE(argseq); i++) {
            PyObject *p = PyTuple_GET_ITEM(argseq, i);
            int32_t v = mf_walk_value_of(w, c, p, 0), rt, e;
            if (v < 0) {
                if (PyErr_Occurred())
                    goto done;
                continue;
            }
            rt = w->root[v];
            for (e = w->head[rt]; e >= 0; e = w->rd_next[e])
                if (w->rd_op[e] != op && mf_gbuf_after(&w->g, w->rd_op[e], op) < 0)
                    goto nomem;
            w->last_writer[rt] = op;
        }
    }
    /* outputs */
    for (i = 0; i < PyTuple_GET_SIZE(outseq); i++) {
        PyObject *p = PyTuple_GET_ITEM(outseq, i), *name;
        int32_t v, mem_base = -1, ord_base = -1;
        int is_t, known;
        if (!(name = PyObject_GetAttrString(p, "name")))
            goto done;
        known = PyDict_Contains(w->ids, name);
        if (known < 0) {
            Py_DECREF(name);
            goto done;
        }
        if (known) {
            /* an op returning one of its arguments (an in-place op's result)
             * introduces no new value; any other repeat is an error */
            PyObject *idobj = PyDict_GetItemWithError(w->ids, name);
            int32_t prev = idobj ? (int32_t)PyLong_AsLong(idobj) : -1, k, is_arg = 0;
            for (k = w->g.in_ptr[op]; k < w->g.n_in; k++)
                if (w->g.in_idx[k] == prev)
                    is_arg = 1;
            if (!is_arg) {
                PyErr_Format(PyExc_ValueError, "proxy %S is produced twice (second time by %S)", name, symname);
                Py_DECREF(name);
                goto done;
            }
            Py_DECREF(name);
            continue;
        }
        Py_DECREF(name);
        if ((is_t = PyObject_IsInstance(p, c->tensor_type)) < 0)
            goto done;
        if (alias_of_output(w, c, al, argseq, i, is_t, symname, &mem_base, &ord_base) < 0)
            goto done;
        if ((flags & MF_EFF_WAIT) && is_t)
            mem_base = ord_base = first_tensor;
        v = mf_walk_new_value(w, c, p, mem_base);
        if (v < 0)
            goto done;
        if (ord_base >= 0)
            w->root[v] = w->root[ord_base];
        if (mf_gbuf_op_out(&w->g, v) < 0)
            goto nomem;
    }
    if (mf_gbuf_end_op(&w->g) < 0)
        goto nomem;
    if (flags & (MF_EFF_COMM | MF_EFF_WAIT)) {
        if (op >= w->cap_comm) {
            int32_t nc = w->cap_comm ? w->cap_comm * 2 : 64;
            uint8_t *cm;
            while (nc <= op)
                nc *= 2;
            if (!(cm = PyMem_RawRealloc(w->comm, (size_t)nc)))
                goto nomem;
            memset(cm + w->cap_comm, 0, (size_t)(nc - w->cap_comm));
            w->comm = cm;
            w->cap_comm = nc;
        }
        w->comm[op] = (flags & MF_EFF_COMM) ? MF_COMM_ISSUE : MF_COMM_WAIT;
        w->any_comm = 1;
    } else if (flags & (MF_EFF_ORDERED | MF_EFF_WRITES)) {
        if (w->prev_ordered >= 0 && mf_gbuf_after(&w->g, w->prev_ordered, op) < 0)
            goto nomem;
        w->prev_ordered = op;
    }
    if (c->recompute > 0 && c->recomputable && c->recomputable != Py_None && !flags) {
        int t;
        if (!(r = PyObject_CallOneArg(c->recomputable, bsym)))
            goto done;
        t = PyObject_IsTrue(r);
        Py_CLEAR(r);
        if (t < 0)
            goto done;
        if (mf_walk_grow_cheap(w, op + 1) < 0)
            goto nomem;
        w->cheap[op] = (uint8_t)t;
    }
    rc = 0;
    goto done;
nomem:
    PyErr_NoMemory();
done:
    Py_XDECREF(r);
    Py_XDECREF(al);
    Py_XDECREF(symname);
    Py_XDECREF(args);
    Py_XDECREF(outs);
    Py_XDECREF(argseq);
    Py_XDECREF(outseq);
    return rc;
}

/* NOTE [epilogue candidates]: ask c->epilogue_pair about each candidate
 * (u, v) of the built graph; ops[k] is op k's bound symbol (None: virtual). */
static int find_epilogues(walk_t *w, const cfg_t *c, PyObject *ops)
{
    mf_gbuf *g = &w->g;
    int32_t *prod, k, j, v;
    int rc = -1;
    if (!(prod = (int32_t *)PyMem_RawMalloc(sizeof(int32_t) * ((size_t)g->n_values + 1)))) {
        PyErr_NoMemory();
        return -1;
    }
    for (v = 0; v < g->n_values; v++)
        prod[v] = -1;
    for (k = 0; k < g->n_ops; k++)
        for (j = g->out_ptr[k]; j < g->out_ptr[k + 1]; j++)
            prod[g->out_idx[j]] = k;
    for (v = 0; v < g->n_ops; v++) {
        int32_t x = -1, u;
        PyObject *r;
        int yes;
        for (j = g->in_ptr[v]; j < g->in_ptr[v + 1]; j++) {
            int32_t y = g->in_idx[j];
            if (g->value_bytes[y] == 0 || y == x)
                continue;
            if (x >= 0)
                break; /* two sized inputs: not an epilogue */
            x = y;
        }
        if (x < 0 || j < g->in_ptr[v + 1] || (u = prod[x]) < 0 || u == v)
            continue;
        if (PyList_GET_ITEM(ops, u) == Py_None || PyList_GET_ITEM(ops, v) == Py_None)
            continue;
        if (!(r = PyObject_CallFunctionObjArgs(c->epilogue_pair, PyList_GET_ITEM(ops, u), PyList_GET_ITEM(ops, v),
                                               NULL)))
            goto done;
        yes = PyObject_IsTrue(r);
        Py_DECREF(r);
        if (yes < 0)
            goto done;
        if (yes && mf_gbuf_set_epilogue(g, v, u) < 0) {
            PyErr_NoMemory();
            goto done;
        }
    }
    rc = 0;
done:
    PyMem_RawFree(prod);
    return rc;
}

/* NOTE [saved storages]: the value of a freeable saved tensor p, made by the
 * virtual op 0.  With `freeable` a dict {name: (storage key, storage bytes)}
 * (thunder_memfuse/_thunder.py saved_storages), saved tensors with the same
 * key share one storage: the first of a group creates its root (p itself when
 * p is the root, named by the key; else a value of the key's bytes named
 * "storage(key)"), the others are views of it, so the storage counts once and
 * is freed after the last reader of any member.  `storages` maps key -> root
 * value id.  With a set (no storage information) each is its own storage. */
static int32_t saved_value(walk_t *w, const cfg_t *c, PyObject *p, PyObject *freeable, PyObject *storages)
{
    PyObject *name = NULL, *entry, *key, *rootobj, *iv = NULL, *label = NULL;
    long long nbytes;
    int32_t root, v = -1;
    if (!PyDict_Check(freeable))
        return mf_walk_new_value(w, c, p, -1);
    if (!(name = PyObject_GetAttrString(p, "name")))
        return -1;
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
        v = mf_walk_new_value(w, c, p, (int32_t)PyLong_AsLong(rootobj));
        goto done;
    }
    {
        int same = PyObject_RichCompareBool(name, key, Py_EQ);
        if (same < 0)
            goto done;
        if (same) {
            root = v = mf_walk_new_value(w, c, p, -1);
        } else {
            if ((root = mf_gbuf_add_value(&w->g, (int64_t)nbytes, 0)) < 0 || mf_walk_grow_values(w, root + 1) < 0) {
                PyErr_NoMemory();
                goto done;
            }
            w->root[root] = root;
            w->last_writer[root] = -1;
            w->head[root] = -1;
            if (!(label = PyUnicode_FromFormat("storage(%S)", key)) || PyList_Append(w->names, label) < 0 ||
                mf_gbuf_op_out(&w->g, root) < 0) {
                if (!PyErr_Occurred())
                    PyErr_NoMemory();
                goto done;
            }
            v = mf_walk_new_value(w, c, p, root);
        }
    }
    if (root < 0 || !(iv = PyLong_FromLong(root)) || PyDict_SetItem(storages, key, iv) < 0)
        v = -1;
done:
    Py_XDECREF(iv);
    Py_XDECREF(label);
    Py_DECREF(name);
    return v;
}

static PyObject *py_plan_trace(PyObject *self, PyObject *pargs, PyObject *kw)
{
    static char *kwlist[] = {"bsyms",      "tensor_type", "aliases", "prologue_ids", "drop_ids", "return_ids",
                             "effects",    "fusible",     "max_states", "fuse",         "freeable",
                             "epilogue_pair", "comm_overlap", "recompute", "recomputable", NULL};
    cfg_t c;
    PyObject *freeable = NULL, *storages = NULL;
    int virtual_open = 0;
    PyObject *bsyms, *ms = Py_None, *seq = NULL, *ops_list = NULL, *prologue = NULL, *epilogue = NULL;
    PyObject *plan = NULL, *groups = NULL, *graph = NULL, *out = NULL;
    int fuse = 1, seen_op = 0, comm_overlap = 1, have_used = 0;
    long long max_states = 0;
    walk_t w;
    mf_gbuf used;
    Py_ssize_t i, n;
    (void)self;

    memset(&w, 0, sizeof w);
    memset(&c, 0, sizeof c);
    mf_gbuf_init(&used);
    if (!PyArg_ParseTupleAndKeywords(pargs, kw, "O|$OOOOOOOOpOOpLO:plan_trace", kwlist, &bsyms, &c.tensor_type,
                                     &c.aliases, &c.prologue_ids, &c.drop_ids, &c.return_ids, &c.effects,
                                     &c.fusible, &ms, &fuse, &freeable, &c.epilogue_pair, &comm_overlap,
                                     &c.recompute, &c.recomputable))
        return NULL;
    if (c.recompute < 0) {
        PyErr_SetString(PyExc_ValueError, "plan_trace: recompute must be a budget in bytes >= 0");
        return NULL;
    }
    if (!c.tensor_type || !c.aliases || !PyCallable_Check(c.aliases) || !c.prologue_ids || !c.drop_ids || !c.return_ids || !c.effects ||
        !c.fusible) {
        PyErr_SetString(PyExc_TypeError, "plan_trace: every classification keyword is required");
        return NULL;
    }
    if (mf_py_max_states(ms, &max_states) < 0)
        return NULL;
    mf_gbuf_init(&w.g);
    w.prev_ordered = -1;
    if (!(w.ids = PyDict_New()) || !(w.names = PyList_New(0)) || !(ops_list = PyList_New(0)) ||
        !(storages = PyDict_New()) ||
        !(prologue = PyList_New(0)) || !(epilogue = PyList_New(0)))
        goto done;
    if (!(seq = mf_py_tuple(bsyms, "bsyms")))
        goto done;
    n = PyTuple_GET_SIZE(seq);
    for (i = 0; i < n; i++) {
        PyObject *b = PyTuple_GET_ITEM(seq, i), *sym, *sid;
        int is;
        if (!(sym = PyObject_GetAttrString(b, "sym")))
            goto done;
        if (!(sid = PyObject_GetAttrString(sym, "id"))) {
            Py_DECREF(sym);
            goto done;
        }
        if ((is = contains(c.drop_ids, sid)) != 0) {
            Py_DECREF(sym);
            Py_DECREF(sid);
            if (is < 0)
                goto done;
            continue;
        }
        if ((is = contains(c.return_ids, sid)) != 0) {
            Py_DECREF(sym);
            Py_DECREF(sid);
            if (is < 0 || PyList_Append(epilogue, b) < 0)
                goto done;
            continue;
        }
        if (PyList_GET_SIZE(epilogue) > 0) {
            PyErr_Format(PyExc_ValueError, "bound symbol %zd (%S) comes after the return", i, sid);
            Py_DECREF(sym);
            Py_DECREF(sid);
            goto done;
        }
        if (!seen_op && (is = contains(c.prologue_ids, sid)) != 0) {
            PyObject *outs = NULL, *os = NULL;
            Py_ssize_t k;
            Py_DECREF(sym);
            Py_DECREF(sid);
            if (is < 0 || PyList_Append(prologue, b) < 0)
                goto done;
            if (!(outs = PyObject_GetAttrString(b, "flat_proxy_outs")) ||
                !(os = mf_py_tuple(outs, "flat_proxy_outs"))) {
                Py_XDECREF(outs);
                goto done;
            }
            for (k = 0; k < PyTuple_GET_SIZE(os); k++) {
                PyObject *p = PyTuple_GET_ITEM(os, k);
                int fr = 0;
                if (freeable && freeable != Py_None) {
                    PyObject *nm = PyObject_GetAttrString(p, "name");
                    if (!nm) {
                        fr = -1;
                    } else {
                        fr = contains(freeable, nm);
                        if (fr > 0)
                            fr = PyObject_IsInstance(p, c.tensor_type);
                        if (fr > 0) { /* a name seen before is that value again */
                            int known = PyDict_Contains(w.ids, nm);
                            fr = known < 0 ? -1 : !known;
                        }
                        Py_DECREF(nm);
                    }
                }
                if (fr < 0) {
                    Py_DECREF(outs);
                    Py_DECREF(os);
                    goto done;
                }
                if (fr) {
                    /* NOTE [freeable saved tensors]: op 0, placed first by
                     * ordering edges, allocates them; they are freed after
                     * their last reader like any intermediate. */
                    int32_t v;
                    if (!virtual_open) {
                        if (mf_gbuf_begin_op(&w.g, 0) < 0 || PyList_Append(ops_list, Py_None) < 0) {
                            if (!PyErr_Occurred())
                                PyErr_NoMemory();
                            Py_DECREF(outs);
                            Py_DECREF(os);
                            goto done;
                        }
                        virtual_open = 1;
                    }
                    if ((v = saved_value(&w, &c, p, freeable, storages)) < 0 || mf_gbuf_op_out(&w.g, v) < 0) {
                        if (!PyErr_Occurred())
                            PyErr_NoMemory();
                        Py_DECREF(outs);
                        Py_DECREF(os);
                        goto done;
                    }
                } else if (mf_walk_value_of(&w, &c, p, 1) < 0) {
                    Py_DECREF(outs);
                    Py_DECREF(os);
                    goto done;
                }
            }
            Py_DECREF(outs);
            Py_DECREF(os);
            continue;
        }
        Py_DECREF(sid);
        if (virtual_open == 1) {
            if (mf_gbuf_end_op(&w.g) < 0) {
                Py_DECREF(sym);
                PyErr_NoMemory();
                goto done;
            }
            virtual_open = 2;
        }
        seen_op = 1;
        if (add_op(&w, &c, b, sym, (int32_t)PyList_GET_SIZE(ops_list)) < 0 || PyList_Append(ops_list, b) < 0) {
            Py_DECREF(sym);
            goto done;
        }
        Py_DECREF(sym);
    }
    if (virtual_open == 1) {
        if (mf_gbuf_end_op(&w.g) < 0) {
            PyErr_NoMemory();
            goto done;
        }
        virtual_open = 2;
    }
    if (virtual_open == 2) { /* the saved tensors exist before every op runs */
        int32_t k;
        for (k = 1; k < w.g.n_ops; k++)
            if (mf_gbuf_after(&w.g, 0, k) < 0) {
                PyErr_NoMemory();
                goto done;
            }
    }
    /* graph outputs: what the return reads */
    for (i = 0; i < PyList_GET_SIZE(epilogue); i++) {
        PyObject *args = PyObject_GetAttrString(PyList_GET_ITEM(epilogue, i), "flat_proxy_args"), *as;
        Py_ssize_t k;
        if (!args)
            goto done;
        if (!(as = mf_py_tuple(args, "flat_proxy_args"))) {
            Py_DECREF(args);
            goto done;
        }
        for (k = 0; k < PyTuple_GET_SIZE(as); k++) {
            int32_t v = mf_walk_value_of(&w, &c, PyTuple_GET_ITEM(as, k), 1);
            if (v < 0) {
                Py_DECREF(args);
                Py_DECREF(as);
                goto done;
            }
            w.g.is_output[v] = 1;
        }
        Py_DECREF(args);
        Py_DECREF(as);
    }
    if (w.g.nomem) {
        PyErr_NoMemory();
        goto done;
    }
    if (w.any_comm) {
        int32_t k;
        for (k = 0; k < w.g.n_ops && k < w.cap_comm; k++)
            if (w.comm[k] && mf_gbuf_set_comm(&w.g, k, w.comm[k]) < 0) {
                PyErr_NoMemory();
                goto done;
            }
    }
    if (fuse && c.epilogue_pair && c.epilogue_pair != Py_None && find_epilogues(&w, &c, ops_list) < 0)
        goto done;
    /* NOTE [recompute candidates]: an op the recomputable predicate accepts is
     * cheap unless it reads or makes a storage something writes in place
     * (ordering roots, NOTE [views]): a copy elsewhere would see other data. */
    if (c.recompute > 0 && w.cheap) {
        int32_t k, j;
        for (k = 0; k < w.g.n_ops && k < w.cap_cheap; k++) {
            if (!w.cheap[k])
                continue;
            for (j = w.g.in_ptr[k]; j < w.g.in_ptr[k + 1]; j++)
                if (w.last_writer[w.root[w.g.in_idx[j]]] >= 0)
                    w.cheap[k] = 0;
            for (j = w.g.out_ptr[k]; j < w.g.out_ptr[k + 1]; j++)
                if (w.last_writer[w.root[w.g.out_idx[j]]] >= 0)
                    w.cheap[k] = 0;
        }
        if (mf_walk_grow_cheap(&w, w.g.n_ops + 1) < 0) {
            PyErr_NoMemory();
            goto done;
        }
    }
    if (!(plan = mf_py_plan_with_recompute(&w.g, w.cheap, w.cheap ? c.recompute : 0, max_states, fuse, 1,
                                           comm_overlap, 0, 0, &used)))
        goto done;
    have_used = used.n_ops > 0;
    if (!(groups = mf_py_regroup(plan, ops_list, have_used ? &used : NULL, w.g.n_values)))
        goto done;
    if (virtual_open == 2) { /* the saved-tensor op has no bound symbol: drop its group */
        Py_ssize_t g0;
        for (g0 = 0; g0 < PyList_GET_SIZE(groups); g0++) {
            PyObject *bl = PyList_GET_ITEM(groups, g0);
            if (PyList_GET_SIZE(bl) == 1 && PyList_GET_ITEM(bl, 0) == Py_None) {
                if (PySequence_DelItem(groups, g0) < 0)
                    goto done;
                break;
            }
        }
    }
    if (!(graph = mf_gbuf_to_dict(have_used ? &used : &w.g)))
        goto done;
    if (have_used) { /* the trace's own graph, whose input order is Thunder's (reports' "before") */
        PyObject *g0 = mf_gbuf_to_dict(&w.g);
        int bad = !g0 || PyDict_SetItemString(graph, "before_recompute", g0) < 0;
        Py_XDECREF(g0);
        if (bad)
            goto done;
    }
    out = Py_BuildValue("{s:O,s:O,s:O,s:O,s:O,s:O,s:O}", "prologue", prologue, "groups", groups, "epilogue",
                        epilogue, "plan", plan, "graph", graph, "names", w.names, "saved_op",
                        virtual_open == 2 ? Py_True : Py_False);
done:
    Py_XDECREF(seq);
    Py_XDECREF(ops_list);
    Py_XDECREF(prologue);
    Py_XDECREF(epilogue);
    Py_XDECREF(plan);
    Py_XDECREF(groups);
    Py_XDECREF(graph);
    Py_XDECREF(storages);
    mf_walk_free(&w);
    mf_gbuf_free(&used);
    return out;
}

static PyMethodDef trace_methods[] = {
    {"plan_trace", (PyCFunction)(void (*)(void))py_plan_trace, METH_VARARGS | METH_KEYWORDS,
     "plan_trace($module, /, bsyms, *, tensor_type, aliases, prologue_ids, drop_ids, return_ids, effects, "
     "fusible, max_states=None, fuse=True, freeable=None, epilogue_pair=None, comm_overlap=True, recompute=0, "
     "recomputable=None)\n--\n\n"
     "Read a Thunder trace's bound symbols, plan them and regroup them; returns a dict.  max_states as in "
     "plan()."},
    {NULL, NULL, 0, NULL},
};

int mf_py_trace_exec(PyObject *module)
{
    if (PyModule_AddFunctions(module, trace_methods) < 0)
        return -1;
    if (PyModule_AddIntConstant(module, "EFF_ORDERED", MF_EFF_ORDERED) < 0 ||
        PyModule_AddIntConstant(module, "EFF_COMM", MF_EFF_COMM) < 0 ||
        PyModule_AddIntConstant(module, "EFF_WAIT", MF_EFF_WAIT) < 0)
        return -1;
    return PyModule_AddIntConstant(module, "EFF_WRITES", MF_EFF_WRITES);
}
