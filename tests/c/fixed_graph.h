/*
 * fixed_graph.h -- a fixed-capacity graph builder shared by the C tests
 * (test_comm.c, test_harden.c; test_core.c's random graphs use its own growing
 * builder).  Every op makes one new value; a value may be a graph input, a
 * graph output or a view (alias_of, -1: none), and an op may be a collective
 * (comm, MF_COMM_*).
 */
#ifndef FIXED_GRAPH_H
#define FIXED_GRAPH_H

#include "mf_core.h"

#define FG_MAX 512

typedef struct fg {
    int32_t n_ops, n_values, n_in, n_out;
    int32_t in_ptr[FG_MAX + 1], out_ptr[FG_MAX + 1], in_idx[4 * FG_MAX], out_idx[FG_MAX];
    int64_t bytes[FG_MAX + 2];
    int32_t alias_of[FG_MAX + 2];
    uint8_t is_input[FG_MAX + 2], is_output[FG_MAX + 2], comm[FG_MAX];
} fg;

void fg_init(fg *g);                                  /* empty: no values, no ops */
int32_t fg_value(fg *g, int64_t bytes, int is_input); /* a value no op makes yet; its id */
/* An op reading ins[0..nin), making one new value of `bytes`; returns that value. */
int32_t fg_op(fg *g, const int32_t *ins, int nin, int64_t bytes, uint8_t comm);
mf_graph_desc fg_desc(const fg *g, int with_comm); /* with_comm 0: no collectives */

#endif
