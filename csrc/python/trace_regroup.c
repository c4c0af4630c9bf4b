/*
 * trace_regroup.c -- the planned groups as bound symbols (trace.c's last step).
 *
 * groups[k] = the bound symbols of the k-th planned group.  With
 * recomputation (csrc/core/mf_remat.c NOTE [recomputation]) the plan is for
 * the graph with the copies: its op k is or copies op origin[k] of the trace,
 * and an op reading or making a value the copies introduced is given as
 * (bsym, ((value of the trace, new value), ...)) for the Python layer to
 * rebind with fresh proxies (thunder_memfuse/_recompute.py NOTE [emitting
 * copies]).  groups[k] is the plan's group k, so plan["kinds"][k] is its kind
 * (csrc/core/mf_core.h NOTE [group kinds]): the Python layer builds each
 * region from that, never from the bound symbols again.
 */
#include "mf_py.h"

PyObject *mf_py_regroup(PyObject *plan, PyObject *ops_list, const mf_gbuf *used, int32_t nv0)
{
    PyObject *gl = PyDict_GetItemString(plan, "groups"), *kinds = PyDict_GetItemString(plan, "kinds");
    PyObject *groups = NULL;
    Py_ssize_t i;
    if (!gl || !kinds || !PyList_Check(gl) || !PyList_Check(kinds) || PyList_GET_SIZE(kinds) != PyList_GET_SIZE(gl))
        return mf_py_raise_status(MF_EINTERNAL, "plan result lacks its groups or a kind per group");
    {
        PyObject *rinfo = (used != NULL) ? PyDict_GetItemString(plan, "recompute") : NULL;
        PyObject *origin = rinfo ? PyDict_GetItemString(rinfo, "origin") : NULL;
        PyObject *vorigin = rinfo ? PyDict_GetItemString(rinfo, "value_origin") : NULL;
        if (used != NULL && (!origin || !vorigin)) {
            PyErr_SetString(PyExc_RuntimeError, "recompute result lacks origin");
            goto fail;
        }
        if (!(groups = PyList_New(PyList_GET_SIZE(gl))))
            goto fail;
        for (i = 0; i < PyList_GET_SIZE(gl); i++) {
            PyObject *ids = PyList_GET_ITEM(gl, i), *bl = PyList_New(PyList_GET_SIZE(ids));
            Py_ssize_t k;
            if (!bl)
                goto fail;
            PyList_SET_ITEM(groups, i, bl);
            for (k = 0; k < PyList_GET_SIZE(ids); k++) {
                long opid = PyLong_AsLong(PyList_GET_ITEM(ids, k)), orig = opid;
                PyObject *b, *item;
                if ((used != NULL))
                    orig = PyLong_AsLong(PyList_GET_ITEM(origin, opid));
                b = PyList_GET_ITEM(ops_list, orig);
                item = b;
                Py_INCREF(b);
                if ((used != NULL)) {
                    PyObject *pairs = PyList_New(0);
                    int32_t j, lo[2] = {used->in_ptr[opid], used->out_ptr[opid]}, hi[2] = {used->in_ptr[opid + 1],
                                                                                        used->out_ptr[opid + 1]};
                    int side;
                    if (!pairs) {
                        Py_DECREF(b);
                        goto fail;
                    }
                    for (side = 0; side < 2; side++)
                        for (j = lo[side]; j < hi[side]; j++) {
                            int32_t v = side ? used->out_idx[j] : used->in_idx[j];
                            PyObject *pr;
                            if (v < nv0)
                                continue;
                            pr = Py_BuildValue("(Oi)", PyList_GET_ITEM(vorigin, v), (int)v);
                            if (!pr || PyList_Append(pairs, pr) < 0) {
                                Py_XDECREF(pr);
                                Py_DECREF(pairs);
                                Py_DECREF(b);
                                goto fail;
                            }
                            Py_DECREF(pr);
                        }
                    if (PyList_GET_SIZE(pairs) > 0) {
                        PyObject *tp = PyList_AsTuple(pairs);
                        item = tp ? Py_BuildValue("(NN)", b, tp) : NULL;
                        if (!item) {
                            Py_DECREF(pairs);
                            goto fail;
                        }
                    }
                    Py_DECREF(pairs);
                }
                PyList_SET_ITEM(bl, k, item);
            }
        }
    }
    return groups;
fail:
    Py_XDECREF(groups);
    return NULL;
}
