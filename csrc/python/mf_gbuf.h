/*
 * mf_gbuf.h -- a growable graph under construction, turned into an
 * mf_graph_desc for the core.  Used by plan.c (graphs given as Python
 * sequences) and trace.c (graphs read from Thunder traces).  Memory comes
 * from PyMem_Raw* so it can be used without the GIL.
 *
 * Invariant: values and ops are numbered densely from 0 in creation order;
 * per-value arrays grow together; an op is open between gbuf_begin_op and
 * gbuf_end_op, and its inputs/outputs are appended to in_idx/out_idx.
 */
#ifndef MF_GBUF_H
#define MF_GBUF_H

#include <stdint.h>
#include "mf_core.h"

typedef struct mf_gbuf {
    int32_t n_ops, n_values;
    int32_t cap_ops, cap_values;
    int32_t *in_ptr, *out_ptr;       /* cap_ops + 1 */
    uint8_t *fusible;                /* cap_ops */
    int32_t *in_idx, *out_idx;
    int32_t n_in, cap_in, n_out, cap_out;
    int64_t *value_bytes;            /* cap_values */
    int32_t *alias_of;
    uint8_t *is_input, *is_output;
    int32_t *after;                  /* pairs */
    int32_t n_after, cap_after;
    int32_t *epilogue_of;            /* n_epi entries, -1 or the head op; NULL: none set */
    int32_t n_epi;
    uint8_t *comm;                   /* n_comm entries (MF_COMM_*); NULL: no collectives */
    int32_t n_comm;
    int nomem;                       /* sticky: an allocation failed */
} mf_gbuf;

void mf_gbuf_init(mf_gbuf *b);
void mf_gbuf_free(mf_gbuf *b);
int32_t mf_gbuf_add_value(mf_gbuf *b, int64_t bytes, int is_input); /* -1 on no memory */
int mf_gbuf_reserve_values(mf_gbuf *b, int32_t n);                  /* n values, zero bytes */
int mf_gbuf_begin_op(mf_gbuf *b, int fusible);
int mf_gbuf_op_in(mf_gbuf *b, int32_t v);
int mf_gbuf_op_out(mf_gbuf *b, int32_t v);
int mf_gbuf_end_op(mf_gbuf *b);
int mf_gbuf_after(mf_gbuf *b, int32_t a, int32_t c);
/* Op v may run as the epilogue of op u (mf_core.h epilogue_of).  Call after
 * the last op is added; ops are not range-checked here (mf_graph_check does). */
int mf_gbuf_set_epilogue(mf_gbuf *b, int32_t v, int32_t u);
/* Op `op` is a collective or a wait (mf_core.h comm).  Like
 * mf_gbuf_set_epilogue: call after the last op is added. */
int mf_gbuf_set_comm(mf_gbuf *b, int32_t op, uint8_t kind);
void mf_gbuf_desc(const mf_gbuf *b, mf_graph_desc *d);

#endif /* MF_GBUF_H */
