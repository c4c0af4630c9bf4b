/*
 * trace_walk.h -- the trace reader's state while it walks a trace (trace.c):
 * proxy names to value ids, sizes, ordering roots and reader lists, and the
 * per-op flags collected on the way.  Shared by trace.c (classification and
 * planning) and trace_walk.c (the bookkeeping).  Binding-private.
 */
#ifndef MF_TRACE_WALK_H
#define MF_TRACE_WALK_H

#include "mf_py.h"

#define MF_EFF_ORDERED 1
#define MF_EFF_WRITES 2
#define MF_EFF_COMM 4
#define MF_EFF_WAIT 8

typedef struct {
    PyObject *tensor_type, *aliases, *prologue_ids, *drop_ids, *return_ids, *effects, *fusible;
    PyObject *epilogue_pair; /* callable or NULL / None */
    PyObject *recomputable;  /* callable or NULL / None: NOTE [recompute candidates] */
    long long recompute;     /* budget in bytes; 0: none */
} cfg_t;

/* Per-walk state: name -> value id, per-storage readers (linked lists). */
typedef struct {
    mf_gbuf g;
    PyObject *ids;      /* dict: proxy name -> int value id */
    PyObject *names;    /* list: value id -> proxy name */
    int32_t *root;      /* value -> ordering root: the storage it (may) share (NOTE [views]) */
    int32_t *last_writer; /* value (root) -> op or -1 */
    int32_t *head;      /* root -> first reader entry or -1 */
    int32_t cap_v;
    int32_t *rd_op, *rd_next; /* reader entries */
    int32_t n_rd, cap_rd;
    int32_t prev_ordered;
    uint8_t *comm;      /* op -> MF_COMM_* (grows with ops) */
    int32_t cap_comm;
    uint8_t *cheap;     /* op -> may be recomputed (grows with ops) */
    int32_t cap_cheap;
    int any_comm;
} walk_t;

/* Grow the per-value arrays to hold `need` values; -1 on no memory. */
int mf_walk_grow_values(walk_t *w, int32_t need);
/* Op `op` reads ordering root `root`; -1 on no memory. */
int mf_walk_add_reader(walk_t *w, int32_t root, int32_t op);
void mf_walk_free(walk_t *w);
/* Make w->cheap hold at least n ops (new entries 0); -1 on no memory. */
int mf_walk_grow_cheap(walk_t *w, int32_t n);
/* Bytes of a proxy (trace.c NOTE [sizes]); -1 with an exception on failure. */
int mf_walk_proxy_bytes(const cfg_t *c, PyObject *p, PyObject *name, int64_t *out);
/* Value id of a proxy read by an op; unknown names become graph inputs when
 * create_as_input.  -1 (with an exception, or none for an unknown name). */
int32_t mf_walk_value_of(walk_t *w, const cfg_t *c, PyObject *p, int create_as_input);
/* A new value produced by an op; alias_base >= 0 makes it a view.  -1 on failure. */
int32_t mf_walk_new_value(walk_t *w, const cfg_t *c, PyObject *p, int32_t alias_base);

#endif /* MF_TRACE_WALK_H */
