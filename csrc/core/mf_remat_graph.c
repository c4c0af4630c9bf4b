/*
 * mf_remat_graph.c -- the graphs recomputation's search works on (NOTE
 * [recomputation], mf_remat.c): the caller's graph in its planned order, each
 * storage root's readers and eligibility, and the move itself, a new graph
 * with a set of splits' copies inserted.
 */
#include "mf_internal.h"

#include <string.h>

int32_t mf_first_reader_after(const mf_roots *R, int32_t r, int32_t s)
{
    int32_t q, m = R->rd_ptr[r + 1] - R->rd_ptr[r];
    for (q = 0; q < m; q++)
        if (R->rd[R->rd_ptr[r] + q] > s)
            return q;
    return -1;
}

void mf_wg_free(mf_ctx *ctx, mf_wgraph *w)
{
    mf_arena_release(ctx, &w->arena);
    memset(w, 0, sizeof *w);
}


static int is_view_op(const mf_wgraph *w, int32_t op)
{
    int32_t j;
    for (j = w->out_ptr[op]; j < w->out_ptr[op + 1]; j++)
        if (w->alias_of[w->out_idx[j]] >= 0)
            return 1;
    return 0;
}

int mf_roots_build(mf_ctx *ctx, mf_arena *a, const mf_wgraph *w, mf_roots *R)
{
    int32_t v, k, j, *cnt;
    R->prod = mf_arena_array(ctx, a, (size_t)w->nv + 1, sizeof(int32_t));
    R->root = mf_arena_array(ctx, a, (size_t)w->nv + 1, sizeof(int32_t));
    R->rd_ptr = mf_arena_array(ctx, a, (size_t)w->nv + 2, sizeof(int32_t));
    R->ok = mf_arena_array(ctx, a, (size_t)w->nv + 1, 1);
    R->cp = mf_arena_array(ctx, a, (size_t)w->nv + 1, 1);
    R->last = mf_arena_array(ctx, a, (size_t)w->nv + 1, sizeof(int32_t));
    R->last_other = mf_arena_array(ctx, a, (size_t)w->nv + 1, sizeof(int32_t));
    cnt = mf_arena_array(ctx, a, (size_t)w->nv + 1, sizeof(int32_t));
    if (!R->prod || !R->root || !R->rd_ptr || !R->ok || !R->cp || !R->last || !R->last_other || !cnt)
        return MF_ENOMEM;
    for (v = 0; v < w->nv; v++) {
        R->prod[v] = -1;
        R->last[v] = -1;
        R->last_other[v] = -1;
    }
    for (k = 0; k < w->n; k++)
        for (j = w->out_ptr[k]; j < w->out_ptr[k + 1]; j++)
            R->prod[w->out_idx[j]] = k;
    for (v = 0; v < w->nv; v++) {
        int32_t r = v, guard = 0;
        while (w->alias_of[r] >= 0 && guard++ <= w->nv)
            r = w->alias_of[r];
        R->root[v] = r;
    }
    /* eligibility of roots; views of r must be cheap single-output ops */
    for (v = 0; v < w->nv; v++) {
        int32_t p = R->prod[v];
        R->ok[v] = (uint8_t)(w->alias_of[v] < 0 && !w->is_input[v] && p >= 0 && w->cheap[p] &&
                             w->out_ptr[p + 1] - w->out_ptr[p] == 1);
    }
    for (v = 0; v < w->nv; v++) {
        int32_t r = R->root[v], p = R->prod[v];
        if (w->is_output[v] || w->is_input[r])
            R->ok[r] = 0;
        if (v != r && (p < 0 || !w->cheap[p] || w->out_ptr[p + 1] - w->out_ptr[p] != 1))
            R->ok[r] = 0;
    }
    /* readers: ops reading some alias of r that do not produce a view of r */
    for (k = 0; k < w->n; k++) {
        int view = is_view_op(w, k);
        for (j = w->in_ptr[k]; j < w->in_ptr[k + 1]; j++) {
            int32_t r = R->root[w->in_idx[j]], i2, dup = 0;
            R->last[r] = k;
            if (view) {
                R->last_other[r] = k;
                continue;
            }
            for (i2 = w->in_ptr[k]; i2 < j; i2++)
                if (R->root[w->in_idx[i2]] == r)
                    dup = 1;
            if (!dup)
                cnt[r]++;
        }
    }
    R->rd_ptr[0] = 0;
    for (v = 0; v < w->nv; v++)
        R->rd_ptr[v + 1] = R->rd_ptr[v] + cnt[v];
    R->rd = mf_arena_array(ctx, a, (size_t)R->rd_ptr[w->nv] + 1, sizeof(int32_t));
    if (!R->rd)
        return MF_ENOMEM;
    memset(cnt, 0, sizeof(int32_t) * (size_t)(w->nv + 1));
    for (k = 0; k < w->n; k++) {
        if (is_view_op(w, k))
            continue;
        for (j = w->in_ptr[k]; j < w->in_ptr[k + 1]; j++) {
            int32_t r = R->root[w->in_idx[j]], i2, dup = 0;
            for (i2 = w->in_ptr[k]; i2 < j; i2++)
                if (R->root[w->in_idx[i2]] == r)
                    dup = 1;
            if (!dup)
                R->rd[R->rd_ptr[r] + cnt[r]++] = k;
        }
    }
    memcpy(R->cp, R->ok, (size_t)w->nv);
    for (v = 0; v < w->nv; v++)
        if (R->rd_ptr[v + 1] - R->rd_ptr[v] < 2)
            R->ok[v] = 0;
    return MF_OK;
}

/* ---- applying splits: a new mf_wgraph with the copies inserted ---- */

typedef struct builder {
    int32_t n, nv, n_in, n_out, n_after;
    int32_t cap_ops, cap_v, cap_in, cap_out, cap_after;
    mf_wgraph *w;
} builder;

static int grow(mf_ctx *ctx, mf_arena *a, void **p, int32_t *cap, int32_t need, size_t size)
{
    int32_t nc;
    void *q;
    if (need <= *cap)
        return MF_OK;
    nc = *cap ? *cap : 64;
    while (nc < need) {
        if (nc > INT32_MAX / 2)
            return mf_set_error(ctx, MF_ENOMEM, "recomputation: graph too large");
        nc *= 2;
    }
    q = mf_arena_array(ctx, a, (size_t)nc, size);
    if (!q)
        return MF_ENOMEM;
    if (*p)
        memcpy(q, *p, (size_t)*cap * size);
    *p = q;
    *cap = nc;
    return MF_OK;
}

/* Per-op and per-value arrays grow together; ptr arrays have one more entry. */
static int b_reserve(mf_ctx *ctx, builder *b, int32_t ops, int32_t vals)
{
    mf_wgraph *w = b->w;
    mf_arena *a = &w->arena;
    int32_t co = b->cap_ops, cv = b->cap_v, st;
    if (ops + 1 > co) {
        int32_t c1 = co, c2 = co, c3 = co, c4 = co, c5 = co, c6 = co, c7 = co;
        if ((st = grow(ctx, a, (void **)&w->in_ptr, &c1, ops + 1, sizeof(int32_t))) ||
            (st = grow(ctx, a, (void **)&w->out_ptr, &c2, ops + 1, sizeof(int32_t))) ||
            (st = grow(ctx, a, (void **)&w->epi, &c3, ops + 1, sizeof(int32_t))) ||
            (st = grow(ctx, a, (void **)&w->origin, &c4, ops + 1, sizeof(int32_t))) ||
            (st = grow(ctx, a, (void **)&w->fusible, &c5, ops + 1, 1)) ||
            (st = grow(ctx, a, (void **)&w->comm, &c6, ops + 1, 1)) ||
            (st = grow(ctx, a, (void **)&w->cheap, &c7, ops + 1, 1)))
            return st;
        b->cap_ops = c1;
    }
    if (vals > cv) {
        int32_t c1 = cv, c2 = cv, c3 = cv, c4 = cv, c5 = cv, c6 = cv;
        if ((st = grow(ctx, a, (void **)&w->bytes, &c1, vals, sizeof(int64_t))) ||
            (st = grow(ctx, a, (void **)&w->alias_of, &c2, vals, sizeof(int32_t))) ||
            (st = grow(ctx, a, (void **)&w->vorigin, &c3, vals, sizeof(int32_t))) ||
            (st = grow(ctx, a, (void **)&w->is_input, &c4, vals, 1)) ||
            (st = grow(ctx, a, (void **)&w->is_output, &c5, vals, 1)) ||
            (st = grow(ctx, a, (void **)&w->don, &c6, vals, 1)))
            return st;
        b->cap_v = c1;
    }
    return MF_OK;
}

static int32_t b_value(mf_ctx *ctx, builder *b, const mf_wgraph *src, int32_t like, int32_t alias)
{
    mf_wgraph *w = b->w;
    int32_t v = b->nv;
    if (b_reserve(ctx, b, b->n, v + 1))
        return -1;
    w->bytes[v] = src->bytes[like];
    w->alias_of[v] = alias;
    w->vorigin[v] = src->vorigin[like];
    w->is_input[v] = 0;
    w->is_output[v] = 0;
    w->don[v] = src->don[like];
    b->nv++;
    return v;
}

/* Append op k of src with inputs remapped through map (value -> value, -1 = same) and,
 * for a copy, its outputs given in outs.  new_of[k] receives the new id of an original. */
static int b_op(mf_ctx *ctx, builder *b, const mf_wgraph *src, int32_t k, const int32_t *map, const int32_t *outs,
                int copy)
{
    mf_wgraph *w = b->w;
    int32_t j, nin = src->in_ptr[k + 1] - src->in_ptr[k], nout = src->out_ptr[k + 1] - src->out_ptr[k], op = b->n;
    int st;
    if ((st = b_reserve(ctx, b, op + 1, b->nv)) ||
        (st = grow(ctx, &w->arena, (void **)&w->in_idx, &b->cap_in, b->n_in + nin + 1, sizeof(int32_t))) ||
        (st = grow(ctx, &w->arena, (void **)&w->out_idx, &b->cap_out, b->n_out + nout + 1, sizeof(int32_t))))
        return st;
    w->in_ptr[op] = b->n_in;
    w->out_ptr[op] = b->n_out;
    for (j = src->in_ptr[k]; j < src->in_ptr[k + 1]; j++) {
        int32_t v = src->in_idx[j];
        w->in_idx[b->n_in++] = map && map[v] >= 0 ? map[v] : v;
    }
    for (j = 0; j < nout; j++)
        w->out_idx[b->n_out++] = copy ? outs[j] : src->out_idx[src->out_ptr[k] + j];
    w->in_ptr[op + 1] = b->n_in;
    w->out_ptr[op + 1] = b->n_out;
    w->fusible[op] = src->fusible[k];
    w->comm[op] = copy ? 0 : src->comm[k];
    w->cheap[op] = src->cheap[k];
    w->epi[op] = copy ? -1 : src->epi[k];
    w->origin[op] = src->origin[k];
    b->n++;
    return MF_OK;
}

/* What mf_apply_splits shares with copy_value. */
typedef struct applier {
    mf_ctx *ctx;
    mf_arena *tmp;
    builder *b;
    const mf_wgraph *src;
    const mf_roots *R;
    const mf_split *sp;
    int32_t *map;     /* src value -> the value a copied op reads instead (-1: itself) */
    int32_t *copy_of; /* copy_of[i * nv + v]: split i's copy of v, or -1 */
    int32_t *cp_src, *cp_new, n_copies, cap_cp;
} applier;

static int in_chain(const mf_split *s, int32_t root)
{
    int32_t c;
    if (root == s->r)
        return 1;
    for (c = 0; c < s->n_chain; c++)
        if (s->chain[c] == root)
            return 1;
    return 0;
}

/* Split i's copy of value x exists: the alias chain root .. x not copied yet is copied, and
 * before each copied op whatever of its inputs the split recomputes too (mf_remat.c NOTE
 * [chain splits]). */
static int copy_value(applier *A, int32_t i, int32_t x, int depth)
{
    const mf_wgraph *src = A->src;
    const mf_roots *R = A->R;
    size_t base = (size_t)i * (size_t)src->nv;
    int32_t chain[MF_REMAT_MAX_CHAIN], nc = 0, c, v;
    int st;
    if (depth > MF_REMAT_MAX_CHAIN)
        return mf_set_error(A->ctx, MF_EINVAL, "recomputation: chain too deep");
    for (v = x; v >= 0 && A->copy_of[base + (size_t)v] < 0 && nc < MF_REMAT_MAX_CHAIN; v = src->alias_of[v])
        chain[nc++] = v;
    if (nc == MF_REMAT_MAX_CHAIN)
        return mf_set_error(A->ctx, MF_EINVAL, "recomputation: view chain too deep");
    for (c = nc - 1; c >= 0; c--) {
        int32_t y = chain[c], p = R->prod[y], o, jj, nv0, outs[1];
        for (jj = src->in_ptr[p]; jj < src->in_ptr[p + 1]; jj++) {
            int32_t u = src->in_idx[jj];
            if (R->root[u] != R->root[y] && A->copy_of[base + (size_t)u] < 0 && in_chain(&A->sp[i], R->root[u]) &&
                (st = copy_value(A, i, u, depth + 1)))
                return st;
        }
        /* the copy's inputs: this split's copies where they exist */
        for (jj = src->in_ptr[p]; jj < src->in_ptr[p + 1]; jj++)
            A->map[src->in_idx[jj]] = A->copy_of[base + (size_t)src->in_idx[jj]];
        nv0 = src->alias_of[y] >= 0 ? A->copy_of[base + (size_t)src->alias_of[y]] : -1;
        if ((o = b_value(A->ctx, A->b, src, y, nv0)) < 0)
            return MF_ENOMEM;
        outs[0] = o;
        if (A->n_copies == A->cap_cp) {
            int32_t c1 = A->cap_cp;
            if ((st = grow(A->ctx, A->tmp, (void **)&A->cp_src, &c1, A->cap_cp + 1, sizeof(int32_t))) ||
                (st = grow(A->ctx, A->tmp, (void **)&A->cp_new, &A->cap_cp, A->cap_cp + 1, sizeof(int32_t))))
                return st;
        }
        A->cp_src[A->n_copies] = p;
        A->cp_new[A->n_copies++] = A->b->n;
        if ((st = b_op(A->ctx, A->b, src, p, A->map, outs, 1)))
            return st;
        for (jj = src->in_ptr[p]; jj < src->in_ptr[p + 1]; jj++)
            A->map[src->in_idx[jj]] = -1;
        A->copy_of[base + (size_t)y] = o;
    }
    return MF_OK;
}

/* The graph src with the splits applied (each split's copy runs right before the reader
 * that starts its segment).  out is a fresh mf_wgraph. */
int mf_apply_splits(mf_ctx *ctx, const mf_wgraph *src, const mf_roots *R, const mf_split *sp, int32_t n_sp,
                    mf_wgraph *out)
{
    mf_arena tmp = {NULL};
    builder b;
    applier A;
    int32_t *seg_of, *newid, *map, *copy_of;
    int32_t k, i, j, v, q;
    int st = MF_OK;

    memset(out, 0, sizeof *out);
    memset(&b, 0, sizeof b);
    memset(&A, 0, sizeof A);
    b.w = out;
    /* seg_of[op * n_sp + i] >= 0: op reads split i's copy (it is in that split's segment) */
    seg_of = mf_arena_array(ctx, &tmp, (size_t)src->n * (size_t)(n_sp ? n_sp : 1) + 1, sizeof(int32_t));
    newid = mf_arena_array(ctx, &tmp, (size_t)src->n + 1, sizeof(int32_t));
    map = mf_arena_array(ctx, &tmp, (size_t)src->nv + 1, sizeof(int32_t));
    /* copies of values per split: copy_of[s * nv + v] */
    copy_of = mf_arena_array(ctx, &tmp, (size_t)(n_sp ? n_sp : 1) * (size_t)src->nv + 1, sizeof(int32_t));
    if (!seg_of || !newid || !map || !copy_of) {
        st = MF_ENOMEM;
        goto done;
    }
    A.ctx = ctx;
    A.tmp = &tmp;
    A.b = &b;
    A.src = src;
    A.R = R;
    A.sp = sp;
    A.map = map;
    A.copy_of = copy_of;
    for (i = 0; i < src->n * (n_sp ? n_sp : 1); i++)
        seg_of[i] = -1;
    for (i = 0; i < n_sp * src->nv; i++)
        copy_of[i] = -1;
    for (v = 0; v < src->nv; v++)
        map[v] = -1;
    /* which readers read which split: split s covers readers k..(next split of r) */
    for (i = 0; i < n_sp; i++) {
        int32_t r = sp[i].r, lo = sp[i].k, hi = R->rd_ptr[r + 1] - R->rd_ptr[r];
        for (j = 0; j < n_sp; j++)
            if (sp[j].r == r && sp[j].k > lo && sp[j].k < hi)
                hi = sp[j].k;
        for (q = lo; q < hi; q++)
            seg_of[(size_t)R->rd[R->rd_ptr[r] + q] * (size_t)n_sp + (size_t)i] = 1;
    }
    if ((st = b_reserve(ctx, &b, src->n + 1, src->nv)))
        goto done;
    memcpy(out->bytes, src->bytes, sizeof(int64_t) * (size_t)src->nv);
    memcpy(out->alias_of, src->alias_of, sizeof(int32_t) * (size_t)src->nv);
    memcpy(out->vorigin, src->vorigin, sizeof(int32_t) * (size_t)src->nv);
    memcpy(out->is_input, src->is_input, (size_t)src->nv);
    memcpy(out->is_output, src->is_output, (size_t)src->nv);
    memcpy(out->don, src->don, (size_t)src->nv);
    b.nv = src->nv;
    for (k = 0; k < src->n; k++) {
        /* copies needed by op k (it reads a split root's alias in split i's segment) */
        for (i = 0; i < n_sp; i++) {
            if (seg_of[(size_t)k * (size_t)n_sp + (size_t)i] < 0)
                continue;
            for (j = src->in_ptr[k]; j < src->in_ptr[k + 1]; j++)
                if (R->root[src->in_idx[j]] == sp[i].r && (st = copy_value(&A, i, src->in_idx[j], 0)))
                    goto done;
        }
        /* op k itself, reading the copies of its segments */
        for (j = src->in_ptr[k]; j < src->in_ptr[k + 1]; j++) {
            int32_t x = src->in_idx[j];
            map[x] = -1;
            for (i = 0; i < n_sp; i++)
                if (seg_of[(size_t)k * (size_t)n_sp + (size_t)i] >= 0 && R->root[x] == sp[i].r)
                    map[x] = copy_of[(size_t)i * (size_t)src->nv + (size_t)x];
        }
        newid[k] = b.n;
        if ((st = b_op(ctx, &b, src, k, map, NULL, 0)))
            goto done;
        for (j = src->in_ptr[k]; j < src->in_ptr[k + 1]; j++)
            map[src->in_idx[j]] = -1;
    }
    /* ordering edges, renumbered; a copy keeps its original's incoming edges */
    for (i = 0; i < src->n_after; i++) {
        int32_t x = src->after[2 * i], y = src->after[2 * i + 1];
        if ((st = grow(ctx, &out->arena, (void **)&out->after, &b.cap_after, 2 * b.n_after + 2, sizeof(int32_t))))
            goto done;
        out->after[2 * b.n_after] = newid[x];
        out->after[2 * b.n_after + 1] = newid[y];
        b.n_after++;
    }
    /* a copy keeps its original's incoming ordering edges (the virtual op making a backward's
     * saved tensors comes first, say); the original's predecessors all run before it */
    for (q = 0; q < A.n_copies; q++)
        for (i = 0; i < src->n_after; i++)
            if (src->after[2 * i + 1] == A.cp_src[q]) {
                if ((st = grow(ctx, &out->arena, (void **)&out->after, &b.cap_after, 2 * b.n_after + 2,
                               sizeof(int32_t))))
                    goto done;
                out->after[2 * b.n_after] = newid[src->after[2 * i]];
                out->after[2 * b.n_after + 1] = A.cp_new[q];
                b.n_after++;
            }
    for (k = 0; k < src->n; k++)
        if (out->epi[newid[k]] >= 0)
            out->epi[newid[k]] = newid[src->epi[k]];
    out->n = b.n;
    out->nv = b.nv;
    out->n_after = b.n_after;
    if (!out->after) {
        out->after = mf_arena_array(ctx, &out->arena, 2, sizeof(int32_t));
        if (!out->after)
            st = MF_ENOMEM;
    }
done:
    mf_arena_release(ctx, &tmp);
    if (st)
        mf_wg_free(ctx, out);
    return st;
}

int mf_wg_from_desc(mf_ctx *ctx, const mf_graph_desc *g, const uint8_t *cheap, const int32_t *order,
                    mf_wgraph *w)
{
    mf_arena tmp = {NULL};
    builder b;
    int32_t *newid, i, k, v;
    int st;
    mf_wgraph src;
    memset(w, 0, sizeof *w);
    memset(&b, 0, sizeof b);
    memset(&src, 0, sizeof src);
    b.w = w;
    /* a view of g as a mf_wgraph in its own numbering, to copy ops from in order */
    src.n = g->n_ops;
    src.nv = g->n_values;
    src.in_ptr = (int32_t *)g->in_ptr;
    src.in_idx = (int32_t *)g->in_idx;
    src.out_ptr = (int32_t *)g->out_ptr;
    src.out_idx = (int32_t *)g->out_idx;
    src.bytes = (int64_t *)g->value_bytes;
    newid = mf_arena_array(ctx, &tmp, (size_t)g->n_ops + 1, sizeof(int32_t));
    src.alias_of = mf_arena_array(ctx, &tmp, (size_t)g->n_values + 1, sizeof(int32_t));
    src.vorigin = mf_arena_array(ctx, &tmp, (size_t)g->n_values + 1, sizeof(int32_t));
    src.is_input = mf_arena_array(ctx, &tmp, (size_t)g->n_values + 1, 1);
    src.is_output = mf_arena_array(ctx, &tmp, (size_t)g->n_values + 1, 1);
    src.don = mf_arena_array(ctx, &tmp, (size_t)g->n_values + 1, 1);
    src.epi = mf_arena_array(ctx, &tmp, (size_t)g->n_ops + 1, sizeof(int32_t));
    src.origin = mf_arena_array(ctx, &tmp, (size_t)g->n_ops + 1, sizeof(int32_t));
    src.fusible = mf_arena_array(ctx, &tmp, (size_t)g->n_ops + 1, 1);
    src.comm = mf_arena_array(ctx, &tmp, (size_t)g->n_ops + 1, 1);
    src.cheap = mf_arena_array(ctx, &tmp, (size_t)g->n_ops + 1, 1);
    if (!newid || !src.alias_of || !src.vorigin || !src.is_input || !src.is_output || !src.don || !src.epi ||
        !src.origin ||
        !src.fusible || !src.comm || !src.cheap) {
        st = MF_ENOMEM;
        goto done;
    }
    for (v = 0; v < g->n_values; v++) {
        src.alias_of[v] = g->alias_of ? g->alias_of[v] : -1;
        src.vorigin[v] = v;
        src.is_input[v] = g->is_input ? g->is_input[v] : 0;
        src.is_output[v] = g->is_output ? g->is_output[v] : 0;
        src.don[v] = g->donatable ? g->donatable[v] : 0;
    }
    for (k = 0; k < g->n_ops; k++) {
        src.epi[k] = g->epilogue_of ? g->epilogue_of[k] : -1;
        src.origin[k] = k;
        src.fusible[k] = g->fusible ? g->fusible[k] : 0;
        src.comm[k] = g->comm ? g->comm[k] : 0;
        src.cheap[k] = cheap ? cheap[k] : 0;
    }
    if ((st = b_reserve(ctx, &b, g->n_ops + 1, g->n_values + 1)))
        goto done;
    memcpy(w->bytes, g->value_bytes, sizeof(int64_t) * (size_t)g->n_values);
    memcpy(w->alias_of, src.alias_of, sizeof(int32_t) * (size_t)g->n_values);
    memcpy(w->vorigin, src.vorigin, sizeof(int32_t) * (size_t)g->n_values);
    memcpy(w->is_input, src.is_input, (size_t)g->n_values);
    memcpy(w->is_output, src.is_output, (size_t)g->n_values);
    memcpy(w->don, src.don, (size_t)g->n_values);
    b.nv = g->n_values;
    for (i = 0; i < g->n_ops; i++) {
        newid[order[i]] = i;
        if ((st = b_op(ctx, &b, &src, order[i], NULL, NULL, 0)))
            goto done;
    }
    for (k = 0; k < b.n; k++)
        if (w->epi[k] >= 0)
            w->epi[k] = newid[w->epi[k]];
    for (i = 0; i < g->n_after; i++) {
        if ((st = grow(ctx, &w->arena, (void **)&w->after, &b.cap_after, 2 * b.n_after + 2, sizeof(int32_t))))
            goto done;
        w->after[2 * b.n_after] = newid[g->after[2 * i]];
        w->after[2 * b.n_after + 1] = newid[g->after[2 * i + 1]];
        b.n_after++;
    }
    if (!w->after && !(w->after = mf_arena_array(ctx, &w->arena, 2, sizeof(int32_t)))) {
        st = MF_ENOMEM;
        goto done;
    }
    w->n = b.n;
    w->nv = b.nv;
    w->n_after = b.n_after;
done:
    mf_arena_release(ctx, &tmp);
    if (st)
        mf_wg_free(ctx, w);
    return st;
}

void mf_wg_result(const mf_wgraph *w, mf_remat_result *r)
{
    r->n_ops = w->n;
    r->n_values = w->nv;
    r->n_after = w->n_after;
    r->in_ptr = w->in_ptr;
    r->in_idx = w->in_idx;
    r->out_ptr = w->out_ptr;
    r->out_idx = w->out_idx;
    r->after = w->after;
    r->value_bytes = w->bytes;
    r->alias_of = w->alias_of;
    r->is_input = w->is_input;
    r->is_output = w->is_output;
    r->donatable = w->don;
    r->fusible = w->fusible;
    r->comm = w->comm;
    r->epilogue_of = w->epi;
    r->origin = w->origin;
    r->value_origin = w->vorigin;
}
