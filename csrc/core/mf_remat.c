/*
 * mf_remat.c -- recomputation as a planning move (NOTE [recomputation]).
 *
 * NOTE [recomputation]  Reordering cannot go below what a graph keeps alive:
 * a value computed early and read again much later holds its storage across
 * every step in between.  When the op producing it is cheap (elementwise, a
 * view, a conversion: the caller's `cheap` flags) it can instead be computed
 * again right before a later reader, from the same inputs, so the first copy
 * dies after its early readers.  The move is a *split*: (storage r, k) runs a
 * copy of r's producer right before r's k-th reader (k >= 1, readers in the
 * planned order), and readers k.. read the copy; readers through views of r
 * get copies of those view ops too (they allocate nothing).  A copy reads the
 * original's inputs, so it may keep them alive longer: every candidate is
 * scored by the simulator on the whole graph, which counts that.
 *
 * Eligible r: the storage root of the only output of a cheap op, not a graph
 * input or output (nor any alias of it), every view of it made by cheap
 * single-output ops, at least two readers that are not such views.  The
 * caller marks nothing cheap that writes memory, reads memory something
 * writes, draws random numbers or has other effects, so a copy computes the
 * same values as the original wherever it runs.
 *
 * Search, on the planned order, every op alone (the unfused model):
 *  - at most MF_REMAT_EXACT candidate splits in the whole graph: every subset
 *    within the budget is scored, the least (peak, steps at the peak, bytes
 *    copied) wins, so on small graphs the choice is exact for this move set;
 *  - otherwise greedy rounds: the peak step s is found; each eligible storage
 *    live across s and not read by s offers one split, at its first reader
 *    after s (the only split that frees it across s); the best is kept while
 *    it lowers (peak, steps at the peak).  A copy is an op like any other,
 *    so later rounds may split the values it reads: chains are recomputed a
 *    link at a time.
 * The budget bounds the bytes the copies write (views count nothing), the
 * stand-in for their work.  The result is the graph with the copies, its ops
 * renumbered so that the searched order is 0..n-1; the caller plans it again
 * (that order is the planner's baseline candidate, so the plan is never worse
 * than the search) and keeps it only if its peak is lower.
 */
#include "mf_internal.h"

#include <string.h>

#define MF_REMAT_EXACT 10

/* A graph with its ops in order: op k runs k-th. */
typedef struct wgraph {
    int32_t n, nv, n_after;
    int32_t *in_ptr, *in_idx, *out_ptr, *out_idx, *after;
    int64_t *bytes;
    int32_t *alias_of, *epi, *origin, *vorigin;
    uint8_t *is_input, *is_output, *fusible, *comm, *cheap;
    mf_arena arena;
} wgraph;

static void wg_free(mf_ctx *ctx, wgraph *w)
{
    mf_arena_release(ctx, &w->arena);
    memset(w, 0, sizeof *w);
}

static void wg_desc(const wgraph *w, mf_graph_desc *d)
{
    memset(d, 0, sizeof *d);
    d->n_ops = w->n;
    d->n_values = w->nv;
    d->in_ptr = w->in_ptr;
    d->in_idx = w->in_idx;
    d->out_ptr = w->out_ptr;
    d->out_idx = w->out_idx;
    d->value_bytes = w->bytes;
    d->alias_of = w->alias_of;
    d->is_input = w->is_input;
    d->is_output = w->is_output;
    d->fusible = w->fusible;
    d->n_after = w->n_after;
    d->after = w->after;
    d->epilogue_of = w->epi;
    d->comm = w->comm;
}

/* One split of storage root r at its k-th reader. */
typedef struct split {
    int32_t r, k;
    int64_t bytes;
} split;

/* Per storage root: its producer and its readers (not views of it), in order. */
typedef struct roots {
    int32_t *prod;            /* nv: producing op or -1 */
    int32_t *root;            /* nv: alias root */
    int32_t *rd_ptr, *rd;     /* nv + 1 CSR over roots: reading ops, ascending */
    uint8_t *ok;              /* nv: eligible root */
    int32_t *last;            /* nv: last op reading the root's storage (any alias, views too), -1 */
} roots;

static int is_view_op(const wgraph *w, int32_t op)
{
    int32_t j;
    for (j = w->out_ptr[op]; j < w->out_ptr[op + 1]; j++)
        if (w->alias_of[w->out_idx[j]] >= 0)
            return 1;
    return 0;
}

static int roots_build(mf_ctx *ctx, mf_arena *a, const wgraph *w, roots *R)
{
    int32_t v, k, j, *cnt;
    R->prod = mf_arena_array(ctx, a, (size_t)w->nv + 1, sizeof(int32_t));
    R->root = mf_arena_array(ctx, a, (size_t)w->nv + 1, sizeof(int32_t));
    R->rd_ptr = mf_arena_array(ctx, a, (size_t)w->nv + 2, sizeof(int32_t));
    R->ok = mf_arena_array(ctx, a, (size_t)w->nv + 1, 1);
    R->last = mf_arena_array(ctx, a, (size_t)w->nv + 1, sizeof(int32_t));
    cnt = mf_arena_array(ctx, a, (size_t)w->nv + 1, sizeof(int32_t));
    if (!R->prod || !R->root || !R->rd_ptr || !R->ok || !R->last || !cnt)
        return MF_ENOMEM;
    for (v = 0; v < w->nv; v++) {
        R->prod[v] = -1;
        R->last[v] = -1;
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
            if (view)
                continue;
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
    for (v = 0; v < w->nv; v++)
        if (R->rd_ptr[v + 1] - R->rd_ptr[v] < 2)
            R->ok[v] = 0;
    return MF_OK;
}

/* ---- applying splits: a new wgraph with the copies inserted ---- */

typedef struct builder {
    int32_t n, nv, n_in, n_out, n_after;
    int32_t cap_ops, cap_v, cap_in, cap_out, cap_after;
    wgraph *w;
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
    wgraph *w = b->w;
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
        int32_t c1 = cv, c2 = cv, c3 = cv, c4 = cv, c5 = cv;
        if ((st = grow(ctx, a, (void **)&w->bytes, &c1, vals, sizeof(int64_t))) ||
            (st = grow(ctx, a, (void **)&w->alias_of, &c2, vals, sizeof(int32_t))) ||
            (st = grow(ctx, a, (void **)&w->vorigin, &c3, vals, sizeof(int32_t))) ||
            (st = grow(ctx, a, (void **)&w->is_input, &c4, vals, 1)) ||
            (st = grow(ctx, a, (void **)&w->is_output, &c5, vals, 1)))
            return st;
        b->cap_v = c1;
    }
    return MF_OK;
}

static int32_t b_value(mf_ctx *ctx, builder *b, const wgraph *src, int32_t like, int32_t alias)
{
    wgraph *w = b->w;
    int32_t v = b->nv;
    if (b_reserve(ctx, b, b->n, v + 1))
        return -1;
    w->bytes[v] = src->bytes[like];
    w->alias_of[v] = alias;
    w->vorigin[v] = src->vorigin[like];
    w->is_input[v] = 0;
    w->is_output[v] = 0;
    b->nv++;
    return v;
}

/* Append op k of src with inputs remapped through map (value -> value, -1 = same) and,
 * for a copy, its outputs given in outs.  new_of[k] receives the new id of an original. */
static int b_op(mf_ctx *ctx, builder *b, const wgraph *src, int32_t k, const int32_t *map, const int32_t *outs,
                int copy)
{
    wgraph *w = b->w;
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

/* The graph src with the splits applied (each split's copy runs right before the reader
 * that starts its segment).  out is a fresh wgraph. */
static int apply_splits(mf_ctx *ctx, const wgraph *src, const roots *R, const split *sp, int32_t n_sp,
                        wgraph *out)
{
    mf_arena tmp = {NULL};
    builder b;
    int32_t *seg_of, *newid, *map, *copy_of, *cp_src = NULL, *cp_new = NULL, n_copies = 0, cap_cp = 0;
    int32_t k, i, j, v, q;
    int st = MF_OK;

    memset(out, 0, sizeof *out);
    memset(&b, 0, sizeof b);
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
    b.nv = src->nv;
    for (k = 0; k < src->n; k++) {
        /* copies needed by op k (it reads a split root's alias in split i's segment) */
        for (i = 0; i < n_sp; i++) {
            if (seg_of[(size_t)k * (size_t)n_sp + (size_t)i] < 0)
                continue;
            for (j = src->in_ptr[k]; j < src->in_ptr[k + 1]; j++) {
                int32_t x = src->in_idx[j], chain[64], nc = 0, c;
                if (R->root[x] != sp[i].r)
                    continue;
                /* copy the alias chain root .. x that split i has not copied yet */
                for (v = x; v >= 0 && copy_of[(size_t)i * (size_t)src->nv + (size_t)v] < 0 && nc < 64;
                     v = src->alias_of[v])
                    chain[nc++] = v;
                if (nc == 64) {
                    st = mf_set_error(ctx, MF_EINVAL, "recomputation: view chain too deep");
                    goto done;
                }
                for (c = nc - 1; c >= 0; c--) {
                    int32_t y = chain[c], p = R->prod[y], o, jj, nv0;
                    int32_t outs[1];
                    /* the copy's inputs: earlier copies of this split where they exist */
                    for (jj = src->in_ptr[p]; jj < src->in_ptr[p + 1]; jj++) {
                        int32_t u = src->in_idx[jj];
                        map[u] = copy_of[(size_t)i * (size_t)src->nv + (size_t)u];
                    }
                    nv0 = src->alias_of[y] >= 0 ? copy_of[(size_t)i * (size_t)src->nv + (size_t)src->alias_of[y]]
                                                : -1;
                    if ((o = b_value(ctx, &b, src, y, nv0)) < 0) {
                        st = MF_ENOMEM;
                        goto done;
                    }
                    outs[0] = o;
                    if (n_copies == cap_cp) {
                        int32_t c1 = cap_cp;
                        if ((st = grow(ctx, &tmp, (void **)&cp_src, &c1, cap_cp + 1, sizeof(int32_t))) ||
                            (st = grow(ctx, &tmp, (void **)&cp_new, &cap_cp, cap_cp + 1, sizeof(int32_t))))
                            goto done;
                    }
                    cp_src[n_copies] = p;
                    cp_new[n_copies++] = b.n;
                    if ((st = b_op(ctx, &b, src, p, map, outs, 1)))
                        goto done;
                    for (jj = src->in_ptr[p]; jj < src->in_ptr[p + 1]; jj++)
                        map[src->in_idx[jj]] = -1;
                    copy_of[(size_t)i * (size_t)src->nv + (size_t)y] = o;
                }
            }
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
    for (q = 0; q < n_copies; q++)
        for (i = 0; i < src->n_after; i++)
            if (src->after[2 * i + 1] == cp_src[q]) {
                if ((st = grow(ctx, &out->arena, (void **)&out->after, &b.cap_after, 2 * b.n_after + 2,
                               sizeof(int32_t))))
                    goto done;
                out->after[2 * b.n_after] = newid[src->after[2 * i]];
                out->after[2 * b.n_after + 1] = cp_new[q];
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
        wg_free(ctx, out);
    return st;
}

/* ---- scoring and search ---- */

typedef struct score {
    int64_t peak;
    int32_t at_peak; /* steps at the peak */
    int32_t step;    /* the first of them */
} score;

static int score_of(mf_ctx *ctx, const wgraph *w, score *sc)
{
    mf_graph_desc d;
    mf_arena a = {NULL};
    int32_t *order, k;
    int64_t *step;
    int st;
    order = mf_arena_array(ctx, &a, (size_t)w->n + 1, sizeof(int32_t));
    step = mf_arena_array(ctx, &a, (size_t)w->n + 1, sizeof(int64_t));
    if (!order || !step) {
        mf_arena_release(ctx, &a);
        return MF_ENOMEM;
    }
    for (k = 0; k < w->n; k++)
        order[k] = k;
    wg_desc(w, &d);
    st = mf_simulate(ctx, &d, order, NULL, w->n, &sc->peak, step, NULL);
    if (st == MF_OK) {
        sc->at_peak = 0;
        sc->step = -1;
        for (k = 0; k < w->n; k++)
            if (step[k] == sc->peak) {
                if (sc->step < 0)
                    sc->step = k;
                sc->at_peak++;
            }
    }
    mf_arena_release(ctx, &a);
    return st;
}

static int better(const score *a, int64_t abytes, const score *b, int64_t bbytes)
{
    if (a->peak != b->peak)
        return a->peak < b->peak;
    if (a->at_peak != b->at_peak)
        return a->at_peak < b->at_peak;
    return abytes < bbytes;
}

static int wg_from_desc(mf_ctx *ctx, const mf_graph_desc *g, const uint8_t *cheap, const int32_t *order,
                        wgraph *w)
{
    mf_arena tmp = {NULL};
    builder b;
    int32_t *newid, i, k, v;
    int st;
    wgraph src;
    memset(w, 0, sizeof *w);
    memset(&b, 0, sizeof b);
    memset(&src, 0, sizeof src);
    b.w = w;
    /* a view of g as a wgraph in its own numbering, to copy ops from in order */
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
    src.epi = mf_arena_array(ctx, &tmp, (size_t)g->n_ops + 1, sizeof(int32_t));
    src.origin = mf_arena_array(ctx, &tmp, (size_t)g->n_ops + 1, sizeof(int32_t));
    src.fusible = mf_arena_array(ctx, &tmp, (size_t)g->n_ops + 1, 1);
    src.comm = mf_arena_array(ctx, &tmp, (size_t)g->n_ops + 1, 1);
    src.cheap = mf_arena_array(ctx, &tmp, (size_t)g->n_ops + 1, 1);
    if (!newid || !src.alias_of || !src.vorigin || !src.is_input || !src.is_output || !src.epi || !src.origin ||
        !src.fusible || !src.comm || !src.cheap) {
        st = MF_ENOMEM;
        goto done;
    }
    for (v = 0; v < g->n_values; v++) {
        src.alias_of[v] = g->alias_of ? g->alias_of[v] : -1;
        src.vorigin[v] = v;
        src.is_input[v] = g->is_input ? g->is_input[v] : 0;
        src.is_output[v] = g->is_output ? g->is_output[v] : 0;
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
        wg_free(ctx, w);
    return st;
}

static int32_t first_reader_after(const roots *R, int32_t r, int32_t s)
{
    int32_t q, m = R->rd_ptr[r + 1] - R->rd_ptr[r];
    for (q = 0; q < m; q++)
        if (R->rd[R->rd_ptr[r] + q] > s)
            return q;
    return -1;
}

static int reads_root(const wgraph *w, const roots *R, int32_t op, int32_t r)
{
    int32_t j;
    for (j = w->in_ptr[op]; j < w->in_ptr[op + 1]; j++)
        if (R->root[w->in_idx[j]] == r)
            return 1;
    return 0;
}

/* Every subset of at most MF_REMAT_EXACT candidate splits (NOTE [recomputation]). */
static int search_exact(mf_ctx *ctx, wgraph *cur, const roots *R, const split *cand, int32_t nc, int64_t budget,
                        score *best_sc, int64_t *best_bytes, int32_t *n_used)
{
    uint32_t mask, best_mask = 0;
    split sel[MF_REMAT_EXACT];
    wgraph best, t;
    int st = MF_OK, have = 0;
    memset(&best, 0, sizeof best);
    for (mask = 1; mask < (1u << nc); mask++) {
        int32_t n = 0, i;
        int64_t bytes = 0;
        score sc;
        for (i = 0; i < nc; i++)
            if (mask & (1u << i)) {
                sel[n++] = cand[i];
                bytes += cand[i].bytes;
            }
        if (bytes > budget)
            continue;
        if (ctx->cancel && ctx->cancel(ctx->cancel_ud)) {
            st = mf_set_error(ctx, MF_ECANCEL, "cancelled");
            break;
        }
        if ((st = apply_splits(ctx, cur, R, sel, n, &t)))
            break;
        if ((st = score_of(ctx, &t, &sc))) {
            wg_free(ctx, &t);
            break;
        }
        if (better(&sc, bytes, best_sc, *best_bytes)) {
            if (have)
                wg_free(ctx, &best);
            best = t;
            have = 1;
            *best_sc = sc;
            *best_bytes = bytes;
            best_mask = mask;
        } else {
            wg_free(ctx, &t);
        }
    }
    if (st == MF_OK && have) {
        wg_free(ctx, cur);
        *cur = best;
        *n_used = 0;
        for (; best_mask; best_mask &= best_mask - 1)
            (*n_used)++;
    } else if (have) {
        wg_free(ctx, &best);
    }
    return st;
}

static int search_greedy(mf_ctx *ctx, wgraph *cur, int64_t budget, int32_t max_rounds, score *sc, int64_t *used,
                         int32_t *n_used)
{
    int32_t round;
    int st = MF_OK;
    for (round = 0; round < max_rounds; round++) {
        mf_arena ra = {NULL};
        roots R;
        wgraph best, t;
        score best_sc = *sc;
        int64_t best_bytes = 0;
        int have = 0;
        int32_t r, s = sc->step;
        memset(&best, 0, sizeof best);
        if (s < 0 || (st = roots_build(ctx, &ra, cur, &R))) {
            mf_arena_release(ctx, &ra);
            break;
        }
        for (r = 0; r < cur->nv && st == MF_OK; r++) {
            int32_t k, p = R.prod[r];
            split one;
            score c;
            if (!R.ok[r] || p >= s || R.last[r] <= s || reads_root(cur, &R, s, r))
                continue;
            if ((k = first_reader_after(&R, r, s)) < 1 || *used + cur->bytes[r] > budget)
                continue;
            if (ctx->cancel && ctx->cancel(ctx->cancel_ud)) {
                st = mf_set_error(ctx, MF_ECANCEL, "cancelled");
                break;
            }
            one.r = r;
            one.k = k;
            one.bytes = cur->bytes[r];
            if ((st = apply_splits(ctx, cur, &R, &one, 1, &t)))
                break;
            if ((st = score_of(ctx, &t, &c))) {
                wg_free(ctx, &t);
                break;
            }
            if (better(&c, one.bytes, &best_sc, have ? best_bytes : INT64_MAX) && better(&c, 0, sc, 0)) {
                if (have)
                    wg_free(ctx, &best);
                best = t;
                have = 1;
                best_sc = c;
                best_bytes = one.bytes;
            } else {
                wg_free(ctx, &t);
            }
        }
        mf_arena_release(ctx, &ra);
        if (st || !have) {
            if (have)
                wg_free(ctx, &best);
            break;
        }
        wg_free(ctx, cur);
        *cur = best;
        *sc = best_sc;
        *used += best_bytes;
        (*n_used)++;
    }
    return st;
}

int mf_recompute(mf_ctx *ctx, const mf_graph_desc *g, const uint8_t *cheap, const int32_t *order,
                 const mf_remat_options *opt, mf_remat_result *out)
{
    wgraph cur;
    score sc;
    int64_t used = 0, budget = opt ? opt->budget_bytes : 0;
    int32_t n_used = 0, max_rounds = opt && opt->max_rounds > 0 ? opt->max_rounds : 256;
    int st;

    memset(out, 0, sizeof *out);
    if ((st = mf_graph_check(ctx, g)))
        return st;
    if (!order || !cheap)
        return mf_set_error(ctx, MF_EINVAL, "recompute: order and cheap are required");
    {
        int valid = 0;
        if ((st = mf_check_order(ctx, g, order, &valid)) != MF_OK)
            return st;
        if (!valid)
            return mf_set_error(ctx, MF_EINVAL, "recompute: the order breaks a dependency");
    }
    if ((st = wg_from_desc(ctx, g, cheap, order, &cur)))
        return st;
    if ((st = score_of(ctx, &cur, &sc)))
        goto fail;
    out->start_peak_bytes = sc.peak;
    if (budget > 0) {
        mf_arena ra = {NULL};
        roots R;
        split cand[MF_REMAT_EXACT];
        int32_t nc = 0, r, q;
        int too_many = 0;
        if ((st = roots_build(ctx, &ra, &cur, &R))) {
            mf_arena_release(ctx, &ra);
            goto fail;
        }
        for (r = 0; r < cur.nv && !too_many; r++) {
            if (!R.ok[r])
                continue;
            for (q = 1; q < R.rd_ptr[r + 1] - R.rd_ptr[r]; q++) {
                if (nc == MF_REMAT_EXACT) {
                    too_many = 1;
                    break;
                }
                cand[nc].r = r;
                cand[nc].k = q;
                cand[nc].bytes = cur.bytes[r];
                nc++;
            }
        }
        if (!too_many && nc > 0) {
            int64_t bb = 0;
            st = search_exact(ctx, &cur, &R, cand, nc, budget, &sc, &bb, &n_used);
            used = bb;
            mf_arena_release(ctx, &ra);
        } else {
            mf_arena_release(ctx, &ra);
            if (too_many)
                st = search_greedy(ctx, &cur, budget, max_rounds, &sc, &used, &n_used);
        }
        if (st)
            goto fail;
    }
    out->n_ops = cur.n;
    out->n_values = cur.nv;
    out->n_after = cur.n_after;
    out->in_ptr = cur.in_ptr;
    out->in_idx = cur.in_idx;
    out->out_ptr = cur.out_ptr;
    out->out_idx = cur.out_idx;
    out->after = cur.after;
    out->value_bytes = cur.bytes;
    out->alias_of = cur.alias_of;
    out->is_input = cur.is_input;
    out->is_output = cur.is_output;
    out->fusible = cur.fusible;
    out->comm = cur.comm;
    out->epilogue_of = cur.epi;
    out->origin = cur.origin;
    out->value_origin = cur.vorigin;
    out->n_splits = n_used;
    out->copied_bytes = used;
    out->peak_bytes = sc.peak;
    out->arena_ = cur.arena.head;
    return MF_OK;
fail:
    wg_free(ctx, &cur);
    return st;
}

void mf_remat_result_free(mf_ctx *ctx, mf_remat_result *r)
{
    mf_arena a;
    a.head = r->arena_;
    mf_arena_release(ctx, &a);
    memset(r, 0, sizeof *r);
}

void mf_remat_result_desc(const mf_remat_result *r, mf_graph_desc *d)
{
    memset(d, 0, sizeof *d);
    d->n_ops = r->n_ops;
    d->n_values = r->n_values;
    d->in_ptr = r->in_ptr;
    d->in_idx = r->in_idx;
    d->out_ptr = r->out_ptr;
    d->out_idx = r->out_idx;
    d->value_bytes = r->value_bytes;
    d->alias_of = r->alias_of;
    d->is_input = r->is_input;
    d->is_output = r->is_output;
    d->fusible = r->fusible;
    d->n_after = r->n_after;
    d->after = r->after;
    d->epilogue_of = r->epilogue_of;
    d->comm = r->comm;
}
