/*
 * fixed_graph.h -- the graphs of test_comm.c and test_harden.c: the core's
 * mf_gbuf (mf_build.h) with a simpler face.  Every op makes one new value; a
 * value may be a graph input, a graph output or a view (b.alias_of, -1:
 * none), and an op may be a collective (comm, MF_COMM_*; at most FG_MAX ops).
 * Free with fg_free.
 */
#ifndef FIXED_GRAPH_H
#define FIXED_GRAPH_H

#include "mf_build.h"

#define FG_MAX 512

typedef struct fg {
    mf_gbuf b;
    uint8_t comm[FG_MAX]; /* per op */
} fg;

void fg_init(fg *g);                                  /* empty: no values, no ops */
void fg_free(fg *g);
int32_t fg_value(fg *g, int64_t bytes, int is_input); /* a value no op makes yet; its id */
/* An op reading ins[0..nin), making one new value of `bytes`; returns that value. */
int32_t fg_op(fg *g, const int32_t *ins, int nin, int64_t bytes, uint8_t comm);
mf_graph_desc fg_desc(const fg *g, int with_comm); /* with_comm 0: no collectives; nothing fusible */

#endif
