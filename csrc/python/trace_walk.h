/*
 * trace_walk.h -- the trace reader's state while it walks a trace (trace.c):
 * the core's graph builder (csrc/core/mf_build.h), which derives every edge,
 * and the map from proxy names to its value ids.  Shared by trace.c
 * (reading bound symbols and their records) and trace_walk.c (names, sizes).
 * Binding-private.
 */
#ifndef MF_TRACE_WALK_H
#define MF_TRACE_WALK_H

#include "mf_py.h"
#include "mf_build.h"

typedef struct {
    mf_builder B;
    PyObject *tensor_type; /* proxies of these types have sizes (NOTE [sizes]) */
    PyObject *ids;         /* dict: proxy name -> int value id */
    PyObject *names;       /* list: value id -> proxy name */
} walk_t;

/* A builder call failed (-1): the exception for B's state (MemoryError or
 * the core's message through errors.c).  Returns -1. */
int mf_walk_raise(walk_t *w);
void mf_walk_free(walk_t *w);
/* Bytes of a proxy (trace.c NOTE [sizes]); -1 with an exception on failure. */
int mf_walk_proxy_bytes(const walk_t *w, PyObject *p, PyObject *name, int64_t *out);
/* Value id of a proxy an op reads; an unknown name becomes a graph input
 * when create_as_input.  -1 (with an exception, or none for an unknown name). */
int32_t mf_walk_value_of(walk_t *w, PyObject *p, int create_as_input);
/* Remember that proxy p is value v; 0 or -1 with an exception. */
int mf_walk_bind(walk_t *w, PyObject *p, int32_t v);
/* Name a value that has no proxy (a saved storage's root); 0 or -1. */
int mf_walk_label(walk_t *w, PyObject *label);

#endif /* MF_TRACE_WALK_H */
