/*
 * mf_build.h -- building a graph for the core (mf_build.c).  Plain C99, like
 * mf_core.h; every byte through the allocator of the ctx given at init.
 *
 * Two levels:
 *  - mf_gbuf: a growable graph in mf_graph_desc's form (values, ops with
 *    their reads and writes, ordering edges, epilogue and collective marks),
 *    for callers that already know every edge (plan()'s arguments, the
 *    recomputed graph, tests).
 *  - mf_builder: the graph from one neutral record per op (mf_op_record):
 *    what it reads and makes, which outputs share an argument's storage, its
 *    effects, its fusible level, its epilogue role and whether it may be
 *    recomputed.  The builder derives what a trace leaves implicit: storage
 *    roots, ordering edges (NOTE [ordering edges]), the virtual op 0 that
 *    makes a backward's saved tensors (NOTE [saved op]), the epilogue
 *    candidates (NOTE [epilogue candidates]) and which cheap ops may really
 *    be copied (NOTE [recompute candidates]).  A Thunder trace reaches it
 *    through csrc/python/trace.c, which only reads attributes.
 */
#ifndef MF_BUILD_H
#define MF_BUILD_H

#include "mf_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- mf_gbuf: a growable graph ----
 * Values and ops are numbered densely from 0 in creation order; an op is open
 * between mf_gbuf_begin_op and mf_gbuf_end_op, and its reads and writes are
 * appended meanwhile.  Every call returns 0 (or an id) on success and -1 when
 * memory ran out: b->nomem is then set, b->ctx.err says why, and every later
 * call fails too, so a caller may check once at the end. */
typedef struct mf_gbuf {
    int32_t n_ops, n_values;
    int32_t *in_ptr, *out_ptr; /* n_ops + 1 offsets (CSR) */
    uint8_t *fusible;          /* n_ops */
    int32_t *in_idx, *out_idx;
    int32_t n_in, n_out;
    int64_t *value_bytes;      /* n_values */
    int32_t *alias_of;
    uint8_t *is_input, *is_output;
    uint8_t *donatable;        /* n_values (mf_graph_desc.donatable); any_donatable: some is set */
    int any_donatable;
    int32_t *after;            /* n_after pairs */
    int32_t n_after;
    int32_t *epilogue_of;      /* n_epi entries, -1 or the head op; NULL: none set */
    int32_t n_epi;
    uint8_t *comm;             /* n_comm entries (MF_COMM_*); NULL: no collectives */
    int32_t n_comm;
    int nomem;                 /* sticky: an allocation failed */
    size_t cap_ops, cap_values, cap_in, cap_out, cap_after;
    mf_ctx ctx;                /* its allocator, and the message of a failure */
} mf_gbuf;

/* parent: whose allocator to use (NULL: malloc/free). */
void mf_gbuf_init(mf_gbuf *b, const mf_ctx *parent);
void mf_gbuf_free(mf_gbuf *b);
int32_t mf_gbuf_add_value(mf_gbuf *b, int64_t bytes, int is_input);
int mf_gbuf_begin_op(mf_gbuf *b, int fusible);
int mf_gbuf_op_in(mf_gbuf *b, int32_t v);
int mf_gbuf_op_out(mf_gbuf *b, int32_t v);
int mf_gbuf_end_op(mf_gbuf *b);
int mf_gbuf_after(mf_gbuf *b, int32_t a, int32_t c);
/* Op v may run as the epilogue of op u (mf_graph_desc.epilogue_of).  Call
 * after the last op is added; ops are range-checked by mf_graph_check. */
int mf_gbuf_set_epilogue(mf_gbuf *b, int32_t v, int32_t u);
/* Value v's storage may be donated (mf_graph_desc.donatable). */
void mf_gbuf_set_donatable(mf_gbuf *b, int32_t v);
/* Op `op` is a collective or a wait (mf_graph_desc.comm); as above. */
int mf_gbuf_set_comm(mf_gbuf *b, int32_t op, uint8_t kind);
/* The graph as a description (b's arrays, not copies). */
void mf_gbuf_desc(const mf_gbuf *b, mf_graph_desc *d);

/* ---- mf_builder: the graph from op records ---- */

/* Effects of an op (NOTE [ordering edges], NOTE [collectives]). */
#define MF_EFF_ORDERED 1u /* random draws, side effects, item, ops without outputs */
#define MF_EFF_WRITES 2u  /* writes its tensor arguments in place */
#define MF_EFF_COMM 4u    /* issues an asynchronous collective */
#define MF_EFF_WAIT 8u    /* waits on a collective's future */

/* Epilogue roles (NOTE [epilogue candidates]); a bit set. */
#define MF_EPI_HEAD 1u /* its kernel can apply an epilogue to its one output */
#define MF_EPI_TAIL 2u /* can be applied to the one tensor it reads, as an epilogue */

typedef struct mf_op_record {
    int32_t n_in;
    const int32_t *in;         /* values read, in argument order (repeats allowed) */
    int32_t n_out;
    const int64_t *out_bytes;  /* the new values it makes */
    /* per output: the value read that it shares storage with, or -1 (NULL:
     * none does).  out_view[i] != 0: it is a view of that value, allocating
     * nothing; 0: it only may share it (depending on strides the caller does
     * not know), so it orders like an alias and allocates like a new value
     * (NOTE [views]). */
    const int32_t *out_alias;
    const uint8_t *out_view;
    uint32_t effects;          /* MF_EFF_* */
    uint8_t fusible;           /* 0, MF_FUSIBLE or MF_FUSIBLE_STORED; an op with effects is never fused */
    uint8_t cheap;             /* may be recomputed (NOTE [recompute candidates]) */
    uint8_t epilogue;          /* MF_EPI_* */
} mf_op_record;

typedef struct mf_builder {
    mf_gbuf g;
    int32_t *root;        /* value -> ordering root: the storage it shares or may share */
    int32_t *last_writer; /* root -> op or -1 */
    int32_t *head;        /* root -> first reader entry or -1 */
    int32_t *rd_op, *rd_next;
    int32_t n_rd;
    uint8_t *op_comm, *op_cheap, *op_epi; /* per op */
    int32_t prev_ordered;
    int saved_op;         /* 0: none; 1: op 0 open; 2: op 0 closed */
    int any_comm, any_cheap, finished;
    size_t cap_v, cap_rd, cap_op;
} mf_builder;

void mf_builder_init(mf_builder *B, const mf_ctx *parent);
void mf_builder_free(mf_builder *B);
/* A graph input (made before the graph runs, never freed by it); its id or -1. */
int32_t mf_build_input(mf_builder *B, int64_t bytes);
/* NOTE [saved op]: a value made by the virtual op 0 (a backward's saved
 * tensor, freed after its last reader); view_of: an earlier such value whose
 * storage it shares, or -1.  Only before the first mf_build_op.  Its id or -1. */
int32_t mf_build_saved(mf_builder *B, int64_t bytes, int32_t view_of);
/* The next op, from its record; out_ids (rec->n_out) receives the ids of its
 * new values.  Its id or -1 (ctx error: bad record or no memory). */
int32_t mf_build_op(mf_builder *B, const mf_op_record *rec, int32_t *out_ids);
/* Value v is a graph output (read after the graph ends). */
int mf_build_output(mf_builder *B, int32_t v);
/* Close the graph: op 0's edges, collectives, and with `epilogues` the
 * epilogue candidates.  *d describes it (B's arrays); *cheap (may be NULL) is
 * NULL or n_ops flags of the ops a copy may recompute.  MF_OK or a status
 * with B->g.ctx.err.  Call once. */
int mf_build_finish(mf_builder *B, int epilogues, mf_graph_desc *d, const uint8_t **cheap);

#ifdef __cplusplus
}
#endif
#endif /* MF_BUILD_H */
