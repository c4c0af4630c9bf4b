/*
 * mf_heur.c -- heuristic orders (pipeline step 3 of mf_sched.c): an indexed
 * binary heap of ops, two greedy list schedulers and a depth-first "finish
 * what you started" order, each O((n + E) log n) on the planning graph.
 */
#include "mf_internal.h"

#include <string.h>
/* ------------------------------------------------------------------ */
/* indexed binary heap of ops keyed by (k1, k2, op id)                   */


static int ih_less(const mf_iheap *q, int32_t a, int32_t b)
{
    if (q->k1[a] != q->k1[b])
        return q->k1[a] < q->k1[b];
    if (q->k2[a] != q->k2[b])
        return q->k2[a] < q->k2[b];
    return a < b;
}

static void ih_set(mf_iheap *q, int32_t i, int32_t v)
{
    q->h[i] = v;
    q->at[v] = i;
}

static void ih_up(mf_iheap *q, int32_t i)
{
    int32_t v = q->h[i];
    while (i > 0) {
        int32_t p = (i - 1) / 2;
        if (!ih_less(q, v, q->h[p]))
            break;
        ih_set(q, i, q->h[p]);
        i = p;
    }
    ih_set(q, i, v);
}

static void ih_down(mf_iheap *q, int32_t i)
{
    int32_t v = q->h[i];
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= q->size)
            break;
        if (c + 1 < q->size && ih_less(q, q->h[c + 1], q->h[c]))
            c++;
        if (!ih_less(q, q->h[c], v))
            break;
        ih_set(q, i, q->h[c]);
        i = c;
    }
    ih_set(q, i, v);
}

void mf_ih_push(mf_iheap *q, int32_t v)
{
    q->h[q->size] = v;
    q->at[v] = q->size;
    q->size++;
    ih_up(q, q->size - 1);
}

int32_t mf_ih_pop(mf_iheap *q)
{
    int32_t v = q->h[0];
    q->at[v] = -1;
    q->size--;
    if (q->size > 0) {
        ih_set(q, 0, q->h[q->size]);
        ih_down(q, 0);
    }
    return v;
}

/* ------------------------------------------------------------------ */
/* heuristics                                                          */


int mf_heur_ws_init(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, mf_heur_ws *w)
{
    size_t n = (size_t)pg->n + 1;
    w->indeg = (int32_t *)mf_arena_array(ctx, a, n, sizeof(int32_t));
    w->rc = (int32_t *)mf_arena_array(ctx, a, (size_t)pg->ns + 1, sizeof(int32_t));
    w->stack = (int32_t *)mf_arena_array(ctx, a, n, sizeof(int32_t));
    w->sched = (uint8_t *)mf_arena_array(ctx, a, n, 1);
    w->q.h = (int32_t *)mf_arena_array(ctx, a, n, sizeof(int32_t));
    w->q.at = (int32_t *)mf_arena_array(ctx, a, n, sizeof(int32_t));
    w->q.k1 = (int64_t *)mf_arena_array(ctx, a, n, sizeof(int64_t));
    w->q.k2 = (int64_t *)mf_arena_array(ctx, a, n, sizeof(int64_t));
    if (!w->indeg || !w->rc || !w->stack || !w->sched || !w->q.h || !w->q.at || !w->q.k1 || !w->q.k2)
        return MF_ENOMEM;
    return MF_OK;
}

static void heur_reset(const mf_pg *pg, mf_heur_ws *w)
{
    int32_t k, s;
    for (k = 0; k < pg->n; k++) {
        w->indeg[k] = pg->pred_ptr[k + 1] - pg->pred_ptr[k];
        w->sched[k] = 0;
        w->q.at[k] = -1;
    }
    for (s = 0; s < pg->ns; s++)
        w->rc[s] = pg->sread_ptr[s + 1] - pg->sread_ptr[s];
    w->q.size = 0;
}

/* Net change of live bytes if v ran now. */
static int64_t net_delta(const mf_pg *pg, const int32_t *rc, int32_t v)
{
    int64_t d = pg->abytes[v];
    int32_t j;
    for (j = pg->oread_ptr[v]; j < pg->oread_ptr[v + 1]; j++) {
        int32_t s = pg->oread[j];
        if (!pg->sout[s] && rc[s] == 1)
            d -= pg->sbytes[s];
    }
    for (j = pg->oalloc_ptr[v]; j < pg->oalloc_ptr[v + 1]; j++) {
        int32_t s = pg->oalloc[j];
        if (!pg->sout[s] && pg->sread_ptr[s + 1] == pg->sread_ptr[s])
            d -= pg->sbytes[s];
    }
    return d;
}

static void set_keys(const mf_pg *pg, mf_heur_ws *w, int variant, int32_t v)
{
    int64_t d = net_delta(pg, w->rc, v);
    if (variant == 0) { /* frees the most / grows live the least */
        w->q.k1[v] = d;
        w->q.k2[v] = pg->abytes[v];
    } else { /* least `during` first */
        w->q.k1[v] = pg->abytes[v];
        w->q.k2[v] = d;
    }
}

/* NOTE [greedy list scheduler]: among ready ops take the least key; keys
 * change when a storage gets down to its last reader, which is found by a
 * scan of the storage's readers once per storage (O(E) total), so the whole
 * run is O((n + E) log n). */
void mf_greedy_order(const mf_pg *pg, mf_heur_ws *w, int variant, int32_t *order)
{
    int32_t k, j, i = 0;
    heur_reset(pg, w);
    for (k = 0; k < pg->n; k++)
        if (w->indeg[k] == 0) {
            set_keys(pg, w, variant, k);
            mf_ih_push(&w->q, k);
        }
    while (w->q.size > 0) {
        int32_t v = mf_ih_pop(&w->q);
        order[i++] = v;
        w->sched[v] = 1;
        for (j = pg->oread_ptr[v]; j < pg->oread_ptr[v + 1]; j++) {
            int32_t s = pg->oread[j], r;
            if (--w->rc[s] == 1 && !pg->sout[s]) {
                for (r = pg->sread_ptr[s]; r < pg->sread_ptr[s + 1]; r++) {
                    int32_t u = pg->sread[r];
                    if (!w->sched[u] && w->q.at[u] >= 0) {
                        set_keys(pg, w, variant, u);
                        ih_up(&w->q, w->q.at[u]);
                        ih_down(&w->q, w->q.at[u]);
                    }
                }
            }
        }
        for (j = pg->succ_ptr[v]; j < pg->succ_ptr[v + 1]; j++) {
            int32_t u = pg->succ[j];
            if (--w->indeg[u] == 0) {
                set_keys(pg, w, variant, u);
                mf_ih_push(&w->q, u);
            }
        }
    }
}

/* Depth first along consumers: the op made ready last runs next. */
void mf_dfs_order(const mf_pg *pg, mf_heur_ws *w, int32_t *order)
{
    int32_t k, j, sp = 0, i = 0;
    heur_reset(pg, w);
    for (k = pg->n - 1; k >= 0; k--)
        if (w->indeg[k] == 0)
            w->stack[sp++] = k;
    while (sp > 0) {
        int32_t v = w->stack[--sp];
        order[i++] = v;
        for (j = pg->succ_ptr[v + 1] - 1; j >= pg->succ_ptr[v]; j--) {
            int32_t u = pg->succ[j];
            if (--w->indeg[u] == 0)
                w->stack[sp++] = u;
        }
    }
}
