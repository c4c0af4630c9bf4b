/*
 * mf_build.c -- a graph for the core, built by hand (mf_gbuf) or from one
 * record per op (mf_builder); see mf_build.h.
 *
 * NOTE [ordering edges]  Dataflow alone does not make a reorder safe.
 *  - MF_EFF_ORDERED (random ops, side effects, item, ops without outputs)
 *    and MF_EFF_WRITES ops keep their relative order: one chain of edges.
 *  - MF_EFF_WRITES (copy_ and other in-place writes): the op runs after every
 *    earlier reader of the storage of each value it reads (write-after-read),
 *    and every later reader of that storage runs after it (read-after-write).
 *    "The storage" is the ordering root: every value that shares it or may
 *    share it at run time (NOTE [views]) reads and writes the same root, so a
 *    write through any alias orders against every reader of every alias.
 *
 * NOTE [collectives]  MF_EFF_COMM marks an asynchronous collective,
 * MF_EFF_WAIT the wait on its future.  Neither joins the chain above: the
 * core keeps the collectives in their order by itself and places them and
 * their waits for overlap (mf_comm.c NOTE [collective overlap]); a wait
 * depends on its future only.  A collective that may write its argument in
 * place also carries MF_EFF_WRITES, whose edges then apply (without the
 * chain).  Neither is ever fused.  The caller sizes futures like tensors and
 * makes a wait's result a view of its future (the collective allocated it).
 *
 * NOTE [views]  An output with out_alias[i] = x joins x's ordering root.  With
 * out_view[i] it is also a view of x in the memory model (alias_of = x: it
 * allocates nothing); without, it may alias x depending on strides the
 * caller does not know (`contiguous`), so it orders like an alias and
 * allocates like a new value.
 *
 * NOTE [saved op]  A backward's saved tensors are freed as soon as their last
 * reader has run, unlike real graph inputs.  They are the outputs of a
 * virtual op 0 (no work; ordering edges put it before every op), so the
 * planner is rewarded for finishing with a saved tensor early.  Saved tensors
 * sharing one storage in the forward are views of one value here too.
 *
 * NOTE [epilogue candidates]  With `epilogues`, an op v with role
 * MF_EPI_TAIL whose sized reads are all one value x, made directly (not as a
 * view) by an op u with role MF_EPI_HEAD, is a candidate epilogue of u: a
 * GEMM and a ReLU it can apply while writing.  The roles come from the
 * region compiler (its epilogue_role); the core forms the pair only where it
 * is valid and pays (mf_fuse.c NOTE [epilogue pairs]).
 *
 * NOTE [recompute candidates]  An op the record calls cheap may be copied by
 * mf_recompute (mf_remat.c NOTE [recomputation]) unless it has effects, or it
 * reads or makes a storage something writes in place (ordering roots): a
 * copy elsewhere would see other data.
 */
#include "mf_build.h"
#include "mf_internal.h"

#include <string.h>

/* ---- mf_gbuf ---- */

static int fail(mf_gbuf *b)
{
    b->nomem = 1;
    return -1;
}

/* Arrays growing together share the least capacity any of them reached. */
static size_t least(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* *p holds at least need elements of elem bytes (contents kept). */
static int grow(mf_gbuf *b, void *pp, size_t *cap, size_t need, size_t elem)
{
    size_t c = *cap;
    if (b->nomem)
        return -1;
    if (need <= c)
        return 0;
    if (mf_grow(&b->ctx, (void **)pp, &c, need, elem, 1) != MF_OK)
        return fail(b);
    *cap = c;
    return 0;
}

void mf_gbuf_init(mf_gbuf *b, const mf_ctx *parent)
{
    memset(b, 0, sizeof *b);
    mf_ctx_init(&b->ctx, parent ? &parent->alloc : NULL);
}

void mf_gbuf_free(mf_gbuf *b)
{
    mf_ctx c = b->ctx;
    mf_free(&c, b->in_ptr);
    mf_free(&c, b->out_ptr);
    mf_free(&c, b->fusible);
    mf_free(&c, b->in_idx);
    mf_free(&c, b->out_idx);
    mf_free(&c, b->value_bytes);
    mf_free(&c, b->alias_of);
    mf_free(&c, b->is_input);
    mf_free(&c, b->is_output);
    mf_free(&c, b->donatable);
    mf_free(&c, b->after);
    mf_free(&c, b->epilogue_of);
    mf_free(&c, b->comm);
    memset(b, 0, sizeof *b);
    b->ctx = c;
}

int32_t mf_gbuf_add_value(mf_gbuf *b, int64_t bytes, int is_input)
{
    int32_t v;
    size_t need;
    if (b->nomem || b->n_values == INT32_MAX)
        return fail(b);
    need = (size_t)b->n_values + 1;
    if (need > b->cap_values) {
        /* the five per-value arrays share one capacity: commit it only when
         * all of them grew */
        size_t c1 = b->cap_values, c2 = c1, c3 = c1, c4 = c1, c5 = c1;
        if (grow(b, &b->value_bytes, &c1, need, sizeof(int64_t)) < 0 ||
            grow(b, &b->alias_of, &c2, need, sizeof(int32_t)) < 0 || grow(b, &b->is_input, &c3, need, 1) < 0 ||
            grow(b, &b->is_output, &c4, need, 1) < 0 || grow(b, &b->donatable, &c5, need, 1) < 0)
            return -1;
        b->cap_values = least(least(least(c1, c2), least(c3, c4)), c5);
    }
    v = b->n_values++;
    b->value_bytes[v] = bytes;
    b->alias_of[v] = -1;
    b->is_input[v] = (uint8_t)(is_input != 0);
    b->is_output[v] = 0;
    b->donatable[v] = 0;
    return v;
}

int mf_gbuf_begin_op(mf_gbuf *b, int fusible)
{
    size_t need;
    if (b->nomem || b->n_ops == INT32_MAX - 1)
        return fail(b);
    need = (size_t)b->n_ops + 2; /* the offsets keep one more slot for the closing offset */
    if (need > b->cap_ops) {
        size_t c1 = b->cap_ops, c2 = c1, c3 = c1;
        if (grow(b, &b->in_ptr, &c1, need, sizeof(int32_t)) < 0 ||
            grow(b, &b->out_ptr, &c2, need, sizeof(int32_t)) < 0 || grow(b, &b->fusible, &c3, need, 1) < 0)
            return -1;
        b->cap_ops = least(least(c1, c2), c3);
    }
    b->in_ptr[b->n_ops] = b->n_in;
    b->out_ptr[b->n_ops] = b->n_out;
    b->fusible[b->n_ops] = (uint8_t)(fusible == MF_FUSIBLE_STORED || fusible == MF_FUSIBLE_POINTWISE ? fusible
                                                                                         : fusible != 0);
    return 0;
}

int mf_gbuf_op_in(mf_gbuf *b, int32_t v)
{
    if (b->n_in == INT32_MAX || grow(b, &b->in_idx, &b->cap_in, (size_t)b->n_in + 1, sizeof(int32_t)) < 0)
        return fail(b);
    b->in_idx[b->n_in++] = v;
    return 0;
}

int mf_gbuf_op_out(mf_gbuf *b, int32_t v)
{
    if (b->n_out == INT32_MAX || grow(b, &b->out_idx, &b->cap_out, (size_t)b->n_out + 1, sizeof(int32_t)) < 0)
        return fail(b);
    b->out_idx[b->n_out++] = v;
    return 0;
}

int mf_gbuf_end_op(mf_gbuf *b)
{
    if (b->nomem)
        return -1;
    b->n_ops++;
    b->in_ptr[b->n_ops] = b->n_in;
    b->out_ptr[b->n_ops] = b->n_out;
    return 0;
}

int mf_gbuf_set_epilogue(mf_gbuf *b, int32_t v, int32_t u)
{
    int32_t k;
    if (b->nomem)
        return -1;
    if (!b->epilogue_of) {
        if (!(b->epilogue_of = (int32_t *)mf_alloc(&b->ctx, sizeof(int32_t) * ((size_t)b->n_ops + 1))))
            return fail(b);
        b->n_epi = b->n_ops;
        for (k = 0; k < b->n_ops; k++)
            b->epilogue_of[k] = -1;
    }
    if (v >= 0 && v < b->n_epi)
        b->epilogue_of[v] = u;
    return 0;
}

int mf_gbuf_set_comm(mf_gbuf *b, int32_t op, uint8_t kind)
{
    if (b->nomem)
        return -1;
    if (!b->comm) {
        if (!(b->comm = (uint8_t *)mf_calloc(&b->ctx, (size_t)b->n_ops + 1, 1)))
            return fail(b);
        b->n_comm = b->n_ops;
    }
    if (op >= 0 && op < b->n_comm)
        b->comm[op] = kind;
    return 0;
}

int mf_gbuf_after(mf_gbuf *b, int32_t a, int32_t c)
{
    if (b->n_after >= INT32_MAX / 2 - 1 ||
        grow(b, &b->after, &b->cap_after, 2 * (size_t)b->n_after + 2, sizeof(int32_t)) < 0)
        return fail(b);
    b->after[2 * b->n_after] = a;
    b->after[2 * b->n_after + 1] = c;
    b->n_after++;
    return 0;
}

void mf_gbuf_set_donatable(mf_gbuf *b, int32_t v)
{
    if (v >= 0 && v < b->n_values) {
        b->donatable[v] = 1;
        b->any_donatable = 1;
    }
}

void mf_gbuf_desc(const mf_gbuf *b, mf_graph_desc *d)
{
    static const int32_t zero = 0;
    memset(d, 0, sizeof *d);
    d->n_ops = b->n_ops;
    d->n_values = b->n_values;
    d->in_ptr = b->in_ptr ? b->in_ptr : &zero;
    d->out_ptr = b->out_ptr ? b->out_ptr : &zero;
    d->in_idx = b->in_idx;
    d->out_idx = b->out_idx;
    d->value_bytes = b->value_bytes;
    d->alias_of = b->alias_of;
    d->is_input = b->is_input;
    d->is_output = b->is_output;
    d->donatable = b->any_donatable ? b->donatable : NULL;
    d->fusible = b->fusible;
    d->n_after = b->n_after;
    d->after = b->after;
    d->epilogue_of = b->n_epi == b->n_ops ? b->epilogue_of : NULL;
    d->comm = b->n_comm == b->n_ops ? b->comm : NULL;
}

/* ---- mf_builder ---- */

void mf_builder_init(mf_builder *B, const mf_ctx *parent)
{
    memset(B, 0, sizeof *B);
    mf_gbuf_init(&B->g, parent);
    B->prev_ordered = -1;
}

void mf_builder_free(mf_builder *B)
{
    mf_ctx *c = &B->g.ctx;
    mf_free(c, B->root);
    mf_free(c, B->last_writer);
    mf_free(c, B->head);
    mf_free(c, B->rd_op);
    mf_free(c, B->rd_next);
    mf_free(c, B->op_comm);
    mf_free(c, B->op_cheap);
    mf_free(c, B->op_epi);
    mf_gbuf_free(&B->g);
    {
        mf_gbuf g = B->g;
        memset(B, 0, sizeof *B);
        B->g = g;
    }
    B->prev_ordered = -1;
}

static int nomem(mf_builder *B)
{
    B->g.nomem = 1;
    return -1;
}

/* A new value of the graph with its walk state: root itself, no writer, no readers. */
static int32_t new_value(mf_builder *B, int64_t bytes, int is_input)
{
    int32_t v = mf_gbuf_add_value(&B->g, bytes, is_input);
    size_t need;
    if (v < 0)
        return -1;
    need = (size_t)v + 1;
    if (need > B->cap_v) {
        size_t c1 = B->cap_v, c2 = c1, c3 = c1;
        if (grow(&B->g, &B->root, &c1, need, sizeof(int32_t)) < 0 ||
            grow(&B->g, &B->last_writer, &c2, need, sizeof(int32_t)) < 0 ||
            grow(&B->g, &B->head, &c3, need, sizeof(int32_t)) < 0)
            return -1;
        B->cap_v = least(least(c1, c2), c3);
    }
    B->root[v] = v;
    B->last_writer[v] = -1;
    B->head[v] = -1;
    return v;
}

/* Per-op flag arrays hold op `op`. */
static int grow_ops(mf_builder *B, int32_t op)
{
    size_t need = (size_t)op + 1, c1 = B->cap_op, c2 = c1, c3 = c1;
    if (need <= B->cap_op)
        return 0;
    if (grow(&B->g, &B->op_comm, &c1, need, 1) < 0 || grow(&B->g, &B->op_cheap, &c2, need, 1) < 0 ||
        grow(&B->g, &B->op_epi, &c3, need, 1) < 0)
        return -1;
    memset(B->op_comm + B->cap_op, 0, c1 - B->cap_op);
    memset(B->op_cheap + B->cap_op, 0, c2 - B->cap_op);
    memset(B->op_epi + B->cap_op, 0, c3 - B->cap_op);
    B->cap_op = least(least(c1, c2), c3);
    return 0;
}

static int add_reader(mf_builder *B, int32_t root, int32_t op)
{
    int32_t e = B->head[root];
    if (e >= 0 && B->rd_op[e] == op) /* the op read this storage just before */
        return 0;
    if (B->n_rd == INT32_MAX)
        return nomem(B);
    {
        size_t need = (size_t)B->n_rd + 1, c1 = B->cap_rd, c2 = c1;
        if (need > B->cap_rd) {
            if (grow(&B->g, &B->rd_op, &c1, need, sizeof(int32_t)) < 0 ||
                grow(&B->g, &B->rd_next, &c2, need, sizeof(int32_t)) < 0)
                return -1;
            B->cap_rd = least(c1, c2);
        }
    }
    e = B->n_rd++;
    B->rd_op[e] = op;
    B->rd_next[e] = B->head[root];
    B->head[root] = e;
    return 0;
}

static int bad(mf_builder *B, const char *what)
{
    mf_set_error(&B->g.ctx, MF_EINVAL, "mf_build: %s", what);
    return -1;
}

int32_t mf_build_input(mf_builder *B, int64_t bytes)
{
    if (B->finished)
        return bad(B, "the graph is finished");
    if (bytes < 0)
        return bad(B, "negative bytes");
    return new_value(B, bytes, 1);
}

int32_t mf_build_saved(mf_builder *B, int64_t bytes, int32_t view_of)
{
    int32_t v;
    if (B->finished || B->saved_op == 2 || (B->saved_op == 0 && B->g.n_ops > 0))
        return bad(B, "saved tensors come before the first op");
    if (bytes < 0)
        return bad(B, "negative bytes");
    if (view_of >= B->g.n_values)
        return bad(B, "a saved tensor views a value that does not exist");
    if (B->saved_op == 0) {
        if (mf_gbuf_begin_op(&B->g, 0) < 0)
            return -1;
        B->saved_op = 1;
    }
    if ((v = new_value(B, bytes, 0)) < 0)
        return -1;
    if (view_of >= 0) {
        B->g.alias_of[v] = view_of;
        B->root[v] = B->root[view_of];
    }
    return mf_gbuf_op_out(&B->g, v) < 0 ? -1 : v;
}

static int close_saved_op(mf_builder *B)
{
    if (B->saved_op != 1)
        return 0;
    B->saved_op = 2;
    return mf_gbuf_end_op(&B->g);
}

int32_t mf_build_op(mf_builder *B, const mf_op_record *rec, int32_t *out_ids)
{
    int32_t op, i, e;
    uint32_t eff = rec->effects;
    if (B->finished)
        return bad(B, "the graph is finished");
    if (rec->n_in < 0 || rec->n_out < 0 || (rec->n_in && !rec->in) || (rec->n_out && (!rec->out_bytes || !out_ids)))
        return bad(B, "an op record with bad counts or arrays");
    for (i = 0; i < rec->n_in; i++)
        if (rec->in[i] < 0 || rec->in[i] >= B->g.n_values)
            return bad(B, "an op reads a value that does not exist");
    for (i = 0; i < rec->n_out; i++)
        if (rec->out_bytes[i] < 0 || (rec->out_alias && rec->out_alias[i] >= B->g.n_values))
            return bad(B, "an op makes a value of negative bytes or aliases one that does not exist");
    if (close_saved_op(B) < 0)
        return -1;
    op = B->g.n_ops;
    if (grow_ops(B, op) < 0 || mf_gbuf_begin_op(&B->g, eff ? 0 : rec->fusible) < 0)
        return -1;
    /* reads, with read-after-write edges from the storage's last writer */
    for (i = 0; i < rec->n_in; i++) {
        int32_t rt = B->root[rec->in[i]];
        if (mf_gbuf_op_in(&B->g, rec->in[i]) < 0)
            return -1;
        if (B->last_writer[rt] >= 0 && B->last_writer[rt] != op && mf_gbuf_after(&B->g, B->last_writer[rt], op) < 0)
            return -1;
        if (add_reader(B, rt, op) < 0)
            return -1;
    }
    /* write-after-read: after every earlier reader of each written storage */
    if (eff & MF_EFF_WRITES)
        for (i = 0; i < rec->n_in; i++) {
            int32_t rt = B->root[rec->in[i]];
            for (e = B->head[rt]; e >= 0; e = B->rd_next[e])
                if (B->rd_op[e] != op && mf_gbuf_after(&B->g, B->rd_op[e], op) < 0)
                    return -1;
            B->last_writer[rt] = op;
        }
    /* the new values, with their storage (NOTE [views]) */
    for (i = 0; i < rec->n_out; i++) {
        int32_t v = new_value(B, rec->out_bytes[i], 0), x = rec->out_alias ? rec->out_alias[i] : -1;
        if (v < 0)
            return -1;
        if (x >= 0) {
            B->root[v] = B->root[x];
            if (rec->out_view && rec->out_view[i])
                B->g.alias_of[v] = x;
        }
        if (mf_gbuf_op_out(&B->g, v) < 0)
            return -1;
        out_ids[i] = v;
    }
    if (mf_gbuf_end_op(&B->g) < 0)
        return -1;
    if (eff & (MF_EFF_COMM | MF_EFF_WAIT)) { /* NOTE [collectives] */
        B->op_comm[op] = (eff & MF_EFF_COMM) ? MF_COMM_ISSUE : MF_COMM_WAIT;
        B->any_comm = 1;
    } else if (eff & (MF_EFF_ORDERED | MF_EFF_WRITES)) {
        if (B->prev_ordered >= 0 && mf_gbuf_after(&B->g, B->prev_ordered, op) < 0)
            return -1;
        B->prev_ordered = op;
    }
    if (!eff && rec->cheap) {
        B->op_cheap[op] = 1;
        B->any_cheap = 1;
    }
    B->op_epi[op] = eff ? 0 : rec->epilogue;
    return op;
}

int mf_build_output(mf_builder *B, int32_t v)
{
    if (v < 0 || v >= B->g.n_values)
        return bad(B, "an output that does not exist");
    B->g.is_output[v] = 1;
    return 0;
}

/* NOTE [epilogue candidates] */
static int find_epilogues(mf_builder *B)
{
    mf_gbuf *g = &B->g;
    int32_t *prod, k, j, v;
    if (!(prod = (int32_t *)mf_alloc(&g->ctx, sizeof(int32_t) * ((size_t)g->n_values + 1))))
        return nomem(B);
    for (v = 0; v < g->n_values; v++)
        prod[v] = -1;
    for (k = 0; k < g->n_ops; k++)
        for (j = g->out_ptr[k]; j < g->out_ptr[k + 1]; j++)
            if (g->alias_of[g->out_idx[j]] < 0)
                prod[g->out_idx[j]] = k;
    for (v = 0; v < g->n_ops; v++) {
        int32_t x = -1, u;
        if (!(B->op_epi[v] & MF_EPI_TAIL))
            continue;
        for (j = g->in_ptr[v]; j < g->in_ptr[v + 1]; j++) {
            int32_t y = g->in_idx[j];
            if (g->value_bytes[y] == 0 || y == x)
                continue;
            if (x >= 0)
                break; /* two sized reads: not an epilogue */
            x = y;
        }
        if (x < 0 || j < g->in_ptr[v + 1] || (u = prod[x]) < 0 || u == v || !(B->op_epi[u] & MF_EPI_HEAD))
            continue;
        if (mf_gbuf_set_epilogue(g, v, u) < 0)
            break;
    }
    mf_free(&g->ctx, prod);
    return g->nomem ? -1 : 0;
}

/* NOTE [recompute candidates] */
static void clear_written_cheap(mf_builder *B)
{
    const mf_gbuf *g = &B->g;
    int32_t k, j;
    for (k = 0; k < g->n_ops; k++) {
        if (!B->op_cheap[k])
            continue;
        for (j = g->in_ptr[k]; j < g->in_ptr[k + 1]; j++)
            if (B->last_writer[B->root[g->in_idx[j]]] >= 0)
                B->op_cheap[k] = 0;
        for (j = g->out_ptr[k]; j < g->out_ptr[k + 1]; j++)
            if (B->last_writer[B->root[g->out_idx[j]]] >= 0)
                B->op_cheap[k] = 0;
    }
}

int mf_build_finish(mf_builder *B, int epilogues, mf_graph_desc *d, const uint8_t **cheap)
{
    mf_gbuf *g = &B->g;
    int32_t k;
    if (cheap)
        *cheap = NULL;
    memset(d, 0, sizeof *d);
    if (B->finished)
        return mf_set_error(&g->ctx, MF_EINVAL, "mf_build: the graph is finished");
    B->finished = 1;
    if (!g->nomem && close_saved_op(B) == 0 && B->saved_op == 2) /* NOTE [saved op] */
        for (k = 1; k < g->n_ops; k++)
            if (mf_gbuf_after(g, 0, k) < 0)
                break;
    if (!g->nomem && grow_ops(B, g->n_ops) == 0) {
        if (B->any_comm)
            for (k = 0; k < g->n_ops; k++)
                if (B->op_comm[k] && mf_gbuf_set_comm(g, k, B->op_comm[k]) < 0)
                    break;
        if (!g->nomem && epilogues)
            find_epilogues(B);
    }
    if (g->nomem)
        return g->ctx.err[0] ? MF_ENOMEM : mf_set_error(&g->ctx, MF_ENOMEM, "out of memory building the graph");
    if (B->any_cheap) {
        clear_written_cheap(B);
        if (cheap)
            *cheap = B->op_cheap;
    }
    mf_gbuf_desc(g, d);
    return MF_OK;
}
