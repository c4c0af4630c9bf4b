/*
 * mf_py.h -- shared declarations of the CPython binding (thunder_memfuse._C).
 * The only C in the project that includes Python.h lives in csrc/python/.
 */
#ifndef MF_PY_H
#define MF_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Exec-slot hooks: each adds its functions/constants to the module.
 * Return 0 on success, -1 with an exception set. */
int mf_py_plan_exec(PyObject *module);    /* plan.c: plan(), simulate() */
int mf_py_trace_exec(PyObject *module);   /* trace.c: Thunder trace reading */
int mf_py_cuda_exec(PyObject *module);    /* cuda_py.c: CUDA loader, codegen, NVRTC, cuBLAS */
int mf_py_flow_exec(PyObject *module);    /* flow.c: min_cut() */

#include "mf_core.h"
#include "mf_build.h"

/* plan.c helpers shared with trace.c */
void mf_py_ctx_init(mf_ctx *ctx);                      /* core ctx on PyMem_Raw */
/* An empty growable graph on the binding's allocator (PyMem_Raw). */
void mf_py_gbuf_init(mf_gbuf *b);
/* errors.c NOTE [one error path]: any status of the core or the CUDA layer
 * with its message -> the exception; returns NULL.  mf_py_raise: the same
 * for a core ctx. */
PyObject *mf_py_raise_status(int status, const char *msg);
PyObject *mf_py_raise(const mf_ctx *ctx, int status);
/* The planner's options as plan() and plan_trace() take them (mf_plan_options). */
typedef struct mf_py_plan_args {
    long long max_states, dp_max_bytes, max_refine, peak_allowance, max_work, peak_target;
    int fuse, fusion_moves, comm_overlap, dp_max_ops, hoists, coarse;
} mf_py_plan_args;
/* The planner's defaults, stated once: the core's own limits (0), no peak
 * allowance or peak target, fusion, fusion-aware moves, collective overlap, hoists and coarse
 * orders on. */
#define MF_PY_PLAN_ARGS_DEFAULT {0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 1, 1}
/* plan.c: the core's plan options from pa; a plan result as plan()'s dict. */
void mf_py_plan_options(const mf_py_plan_args *pa, mf_plan_options *opt);
PyObject *mf_py_plan_dict(const mf_plan_result *r);
/* plan.c: mf_plan_pipeline without the GIL, Ctrl-C polled
 * (NOTE [interrupting a plan]); the core's status. */
int mf_py_plan_pipeline(mf_ctx *ctx, const mf_graph_desc *d, const mf_pipeline_options *opt,
                        mf_pipeline_result *res);
/* remat.c: the core's planning pipeline (mf_pipeline.c NOTE [planning
 * pipeline]) on b, converted once: the plan dict, with "pipeline" (the
 * winning start, its kept steps, the planner calls and the work spent) and,
 * where copies lower the planned peak, "recompute" (origin, value_origin,
 * splits, copied_bytes, searched_peak_bytes, start_peak_bytes,
 * n_values_before, and "graph", the graph with the copies as a dict).  cheap
 * NULL or budget <= 0: no recomputation; passes <= 0: the default.  *used
 * receives the graph with copies where the plan is for one (else it stays
 * empty); the caller frees it.  New reference or NULL. */
PyObject *mf_py_plan_with_recompute(mf_gbuf *b, const uint8_t *cheap, long long budget,
                                    const mf_py_plan_args *pa, int passes, mf_gbuf *used);
/* trace_regroup.c: the plan's groups as lists of bound symbols (ops_list:
 * op id -> bsym); used: the graph with recomputed copies the plan is for, or
 * NULL; nv0: values of the trace's own graph.  New reference or NULL. */
PyObject *mf_py_regroup(PyObject *plan, PyObject *ops_list, const mf_gbuf *used, int32_t nv0);
/* A tuple snapshot of a sequence (plan.c NOTE [snapshots]): o itself when a
 * tuple, else a new tuple of its items; TypeError naming `what` otherwise. */
PyObject *mf_py_tuple(PyObject *o, const char *what);
/* max_states: None (-> 0, the default) or an int in [1, 2**63 - 1], not a
 * bool; TypeError / ValueError naming the range.  0 or -1. */
int mf_py_max_states(PyObject *ms, long long *out);
/* An optional int argument in [0, hi] named `name` (NULL: not given, *out kept); what it counts goes
 * into the TypeError / ValueError. */
/* Seconds on the monotonic clock (the binding's stage times). */
double mf_py_mono_s(void);
int mf_py_count_arg(PyObject *o, const char *name, const char *what, long long hi, long long *out);

/* graph_dict.c: a built graph as plan()'s keyword arguments (ops, value_bytes,
 * graph_inputs, graph_outputs, aliases, fusible, after, comm), for reports
 * and timelines; NULL with an exception set on failure. */
PyObject *mf_gbuf_to_dict(const mf_gbuf *g);
/* The fusible level of a Python answer (mf_core.h): the int MF_FUSIBLE_STORED
 * (2) as itself, anything else by its truth; -1 with an exception set. */
int mf_fusible_level(PyObject *x);

#endif /* MF_PY_H */
