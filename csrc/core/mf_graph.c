/*
 * mf_graph.c -- graph validation (mf_graph_check), the planning graph
 * (mf_pg_build: storages, CSR adjacency) and order validity (mf_check_order).
 *
 * Invariants: mf_graph_check never reads out of the caller's arrays before it
 * has checked the offsets that lead there; each failure names the first
 * problem found, checks running in a fixed order (structure, ids, sizes,
 * aliases, producers, ordering edges, cycles), so messages are deterministic.
 * All temporary memory lives in one arena per call.
 *
 * NOTE [view order]
 * A view's storage is allocated by the op that produces its alias root, so a
 * view cannot exist before its base.  Besides dataflow (an op depends on the
 * producer of every value it reads) and the ordering edges, the dependency
 * graph therefore has a "view edge": the producer of a view value x runs
 * after the producer of alias_of[x] (when that base is produced by another
 * op).  In real traces the view op reads its base, so the edge is implied
 * anyway; making it explicit keeps the cost model set-based (live bytes after
 * a set of ops depend on the set alone), which the lower bound and the DP
 * rely on.  mf_graph_check reports cycles through view edges like any other
 * cycle, and mf_check_order requires them.  For the same reason a graph input
 * may only be a view of a graph input.
 */
#include "mf_internal.h"

#include <stdio.h>
#include <string.h>

/* ---- CSR helpers ---- */

static int csr_transpose(mf_ctx *ctx, mf_arena *a, int32_t n_src, const int32_t *ptr,
                         const int32_t *idx, int32_t n_dst, int32_t **tptr_out,
                         int32_t **tidx_out)
{
    int32_t *tptr, *tidx, *fill;
    int32_t i, j, m = ptr[n_src];
    tptr = (int32_t *)mf_arena_array(ctx, a, (size_t)n_dst + 1, sizeof(int32_t));
    tidx = (int32_t *)mf_arena_array(ctx, a, (size_t)m, sizeof(int32_t));
    fill = (int32_t *)mf_arena_array(ctx, a, (size_t)n_dst + 1, sizeof(int32_t));
    if (!tptr || !tidx || !fill)
        return MF_ENOMEM;
    for (j = 0; j < m; j++)
        tptr[idx[j] + 1]++;
    for (i = 0; i < n_dst; i++)
        tptr[i + 1] += tptr[i];
    memcpy(fill, tptr, sizeof(int32_t) * ((size_t)n_dst + 1));
    for (i = 0; i < n_src; i++)
        for (j = ptr[i]; j < ptr[i + 1]; j++)
            tidx[fill[idx[j]]++] = i;
    *tptr_out = tptr;
    *tidx_out = tidx;
    return MF_OK;
}

int mf_build_preds(mf_ctx *ctx, mf_arena *a, const mf_graph_desc *g, const int32_t *prod,
                   int32_t **ptr_out, int32_t **idx_out)
{
    int32_t n = g->n_ops, k, j, pass, e;
    int32_t *aptr, *aidx = NULL, *stamp, *ptr, *idx = NULL;
    /* ordering edges grouped by their later op */
    aptr = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    stamp = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    ptr = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    if (!aptr || !stamp || !ptr)
        return MF_ENOMEM;
    if (g->n_after > 0) {
        int32_t *fill;
        aidx = (int32_t *)mf_arena_array(ctx, a, (size_t)g->n_after, sizeof(int32_t));
        fill = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
        if (!aidx || !fill)
            return MF_ENOMEM;
        for (e = 0; e < g->n_after; e++)
            aptr[g->after[2 * e + 1] + 1]++;
        for (k = 0; k < n; k++)
            aptr[k + 1] += aptr[k];
        memcpy(fill, aptr, sizeof(int32_t) * ((size_t)n + 1));
        for (e = 0; e < g->n_after; e++)
            aidx[fill[g->after[2 * e + 1]]++] = g->after[2 * e];
    }
    for (pass = 0; pass < 2; pass++) {
        int32_t cnt = 0, prev_issue = -1;
        for (k = 0; k < n; k++)
            stamp[k] = -1;
        for (k = 0; k < n; k++) {
            if (pass == 0)
                ptr[k] = cnt;
#define MF_ADD_PRED(p_)                                                                  \
    do {                                                                                 \
        int32_t p__ = (p_);                                                              \
        if (p__ >= 0 && p__ != k && stamp[p__] != k) {                                   \
            stamp[p__] = k;                                                              \
            if (pass == 1)                                                               \
                idx[cnt] = p__;                                                          \
            cnt++;                                                                       \
        }                                                                                \
    } while (0)
            for (j = g->in_ptr[k]; j < g->in_ptr[k + 1]; j++)
                MF_ADD_PRED(prod[g->in_idx[j]]);
            if (g->alias_of) {
                for (j = g->out_ptr[k]; j < g->out_ptr[k + 1]; j++) {
                    int32_t b = g->alias_of[g->out_idx[j]];
                    if (b >= 0)
                        MF_ADD_PRED(prod[b]);
                }
            }
            for (j = aptr[k]; j < aptr[k + 1]; j++)
                MF_ADD_PRED(aidx[j]);
            /* collectives keep their input order (mf_comm.c NOTE [collective overlap]) */
            if (g->comm && g->comm[k] == MF_COMM_ISSUE) {
                MF_ADD_PRED(prev_issue);
                prev_issue = k;
            }
#undef MF_ADD_PRED
        }
        if (pass == 0) {
            ptr[n] = cnt;
            idx = (int32_t *)mf_arena_array(ctx, a, (size_t)cnt, sizeof(int32_t));
            if (!idx)
                return MF_ENOMEM;
        }
    }
    *ptr_out = ptr;
    *idx_out = idx;
    return MF_OK;
}

/* ---- validation ---- */

/* Is there a dataflow or view edge p -> k (else it is an ordering edge)? */
static int data_edge(const mf_graph_desc *g, const int32_t *prod, int32_t p, int32_t k)
{
    int32_t j;
    for (j = g->in_ptr[k]; j < g->in_ptr[k + 1]; j++)
        if (prod[g->in_idx[j]] == p)
            return 1;
    if (g->alias_of)
        for (j = g->out_ptr[k]; j < g->out_ptr[k + 1]; j++) {
            int32_t b = g->alias_of[g->out_idx[j]];
            if (b >= 0 && prod[b] == p)
                return 1;
        }
    return 0;
}

/* Kahn's algorithm; on a cycle, name it. */
static int check_acyclic(mf_ctx *ctx, mf_arena *a, const mf_graph_desc *g, const int32_t *prod)
{
    int32_t n = g->n_ops, k, j, head = 0, tail = 0;
    int32_t *pptr, *pidx, *sptr, *sidx, *indeg, *queue, *seen, *cyc;
    int st = mf_build_preds(ctx, a, g, prod, &pptr, &pidx);
    if (st)
        return st;
    st = csr_transpose(ctx, a, n, pptr, pidx, n, &sptr, &sidx);
    if (st)
        return st;
    indeg = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    queue = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    if (!indeg || !queue)
        return MF_ENOMEM;
    for (k = 0; k < n; k++) {
        indeg[k] = pptr[k + 1] - pptr[k];
        if (!indeg[k])
            queue[tail++] = k;
    }
    while (head < tail) {
        int32_t v = queue[head++];
        for (j = sptr[v]; j < sptr[v + 1]; j++)
            if (--indeg[sidx[j]] == 0)
                queue[tail++] = sidx[j];
    }
    if (tail == n)
        return MF_OK;
    {
        /* Walk predecessors inside the unfinished part until an op repeats. */
        int32_t u = -1, m = 0, start, best, i, after_a = -1, after_b = -1;
        char buf[MF_ERR_LEN];
        size_t len = 0;
        seen = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
        cyc = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
        if (!seen || !cyc)
            return MF_ENOMEM;
        for (k = 0; k < n && u < 0; k++)
            if (indeg[k] > 0)
                u = k;
        for (k = 0; k < n; k++)
            seen[k] = -1;
        while (seen[u] < 0) {
            seen[u] = m;
            cyc[m++] = u;
            for (j = pptr[u]; j < pptr[u + 1]; j++)
                if (indeg[pidx[j]] > 0)
                    break;
            u = pidx[j]; /* exists: u is unfinished, so some pred is */
        }
        /* cyc[seen[u]..m) walks backwards: cyc[i+1] -> cyc[i]. */
        start = seen[u];
        m -= start;
        cyc += start;
        for (i = 0; i < m / 2; i++) { /* forward direction */
            int32_t t = cyc[i];
            cyc[i] = cyc[m - 1 - i];
            cyc[m - 1 - i] = t;
        }
        best = 0;
        for (i = 1; i < m; i++)
            if (cyc[i] < cyc[best])
                best = i;
        for (i = 0; i < m; i++) {
            int32_t p = cyc[(best + i) % m], q = cyc[(best + i + 1) % m];
            if (after_a < 0 && !data_edge(g, prod, p, q)) {
                after_a = p;
                after_b = q;
            }
            if (len < sizeof buf - 24)
                len += (size_t)snprintf(buf + len, sizeof buf - len, "%d -> ", (int)p);
            else if (len < sizeof buf - 8) {
                len += (size_t)snprintf(buf + len, sizeof buf - len, "... -> ");
                break;
            }
        }
        snprintf(buf + len, sizeof buf - len, "%d", (int)cyc[best]);
        if (after_a >= 0)
            return mf_set_error(ctx, MF_ECYCLE, "ordering edge (%d, %d) creates a cycle through ops %s",
                                (int)after_a, (int)after_b, buf);
        return mf_set_error(ctx, MF_ECYCLE, "cycle through ops %s", buf);
    }
}

static int check_csr(mf_ctx *ctx, const char *name, const int32_t *ptr, int32_t n)
{
    int32_t k;
    if (ptr[0] != 0)
        return mf_set_error(ctx, MF_EINVAL, "%s[0] is %d, expected 0", name, (int)ptr[0]);
    for (k = 0; k < n; k++)
        if (ptr[k + 1] < ptr[k])
            return mf_set_error(ctx, MF_EINVAL, "%s decreases at op %d (%d > %d)", name, (int)k,
                                (int)ptr[k], (int)ptr[k + 1]);
    return MF_OK;
}

static int check_body(mf_ctx *ctx, mf_arena *a, const mf_graph_desc *g)
{
    int32_t n = g->n_ops, nv = g->n_values, k, j, v, e;
    int32_t *prod;
    uint8_t *state;
    int st;

    if (n < 0)
        return mf_set_error(ctx, MF_EINVAL, "n_ops is negative (%d)", (int)n);
    if (nv < 0)
        return mf_set_error(ctx, MF_EINVAL, "n_values is negative (%d)", (int)nv);
    if (g->n_after < 0)
        return mf_set_error(ctx, MF_EINVAL, "n_after is negative (%d)", (int)g->n_after);
    if (!g->in_ptr || !g->out_ptr)
        return mf_set_error(ctx, MF_EINVAL, "%s is NULL", g->in_ptr ? "out_ptr" : "in_ptr");
    if ((st = check_csr(ctx, "in_ptr", g->in_ptr, n)) || (st = check_csr(ctx, "out_ptr", g->out_ptr, n)))
        return st;
    if (g->in_ptr[n] > 0 && !g->in_idx)
        return mf_set_error(ctx, MF_EINVAL, "in_idx is NULL");
    if (g->out_ptr[n] > 0 && !g->out_idx)
        return mf_set_error(ctx, MF_EINVAL, "out_idx is NULL");
    if (nv > 0 && !g->value_bytes)
        return mf_set_error(ctx, MF_EINVAL, "value_bytes is NULL");
    if (g->n_after > 0 && !g->after)
        return mf_set_error(ctx, MF_EINVAL, "after is NULL");
    if (g->comm)
        for (k = 0; k < n; k++)
            if (g->comm[k] > MF_COMM_WAIT)
                return mf_set_error(ctx, MF_EINVAL, "op %d: comm kind %d is not none (0), issue (1) or wait (2)",
                                    (int)k, (int)g->comm[k]);
    if (g->epilogue_of)
        for (k = 0; k < n; k++)
            if (g->epilogue_of[k] < -1 || g->epilogue_of[k] >= n || g->epilogue_of[k] == k)
                return mf_set_error(ctx, MF_EINVAL, "op %d: epilogue_of %d is not another op in [0, %d)",
                                    (int)k, (int)g->epilogue_of[k], (int)n);

    for (k = 0; k < n; k++) {
        for (j = g->in_ptr[k]; j < g->in_ptr[k + 1]; j++)
            if (g->in_idx[j] < 0 || g->in_idx[j] >= nv)
                return mf_set_error(ctx, MF_EINVAL, "op %d reads value %d out of range [0, %d)", (int)k,
                                    (int)g->in_idx[j], (int)nv);
        for (j = g->out_ptr[k]; j < g->out_ptr[k + 1]; j++)
            if (g->out_idx[j] < 0 || g->out_idx[j] >= nv)
                return mf_set_error(ctx, MF_EINVAL, "op %d writes value %d out of range [0, %d)", (int)k,
                                    (int)g->out_idx[j], (int)nv);
    }
    for (v = 0; v < nv; v++)
        if (g->value_bytes[v] < 0)
            return mf_set_error(ctx, MF_EINVAL, "value %d has negative size %lld", (int)v,
                                (long long)g->value_bytes[v]);

    /* alias chains: in range, acyclic (0 new, 1 on the current walk, 2 done) */
    state = (uint8_t *)mf_arena_array(ctx, a, (size_t)nv + 1, 1);
    prod = (int32_t *)mf_arena_array(ctx, a, (size_t)nv + 1, sizeof(int32_t));
    if (!state || !prod)
        return MF_ENOMEM;
    if (g->alias_of) {
        for (v = 0; v < nv; v++)
            if (g->alias_of[v] < -1 || g->alias_of[v] >= nv)
                return mf_set_error(ctx, MF_EINVAL, "value %d is a view of value %d out of range [0, %d)",
                                    (int)v, (int)g->alias_of[v], (int)nv);
        for (v = 0; v < nv; v++) {
            int32_t u = v;
            while (u >= 0 && state[u] == 0) {
                state[u] = 1;
                u = g->alias_of[u];
            }
            if (u >= 0 && state[u] == 1)
                return mf_set_error(ctx, MF_EINVAL, "alias chain through value %d is cyclic", (int)u);
            for (u = v; u >= 0 && state[u] == 1; u = g->alias_of[u])
                state[u] = 2;
        }
    }

    { /* NOTE [byte sums] (mf_core.h): the stored values' total */
        int64_t total = 0;
        for (v = 0; v < nv; v++) {
            if ((g->alias_of && g->alias_of[v] >= 0) || (g->is_input && g->is_input[v]))
                continue;
            if (g->value_bytes[v] > MF_MAX_TOTAL_BYTES - total)
                return mf_set_error(ctx, MF_EINVAL,
                                    "value_bytes: the values that are not graph inputs or views total more than "
                                    "%lld bytes (2**61 - 1) at value %d (size %lld); the planner's sums are 64-bit",
                                    (long long)MF_MAX_TOTAL_BYTES, (int)v, (long long)g->value_bytes[v]);
            total += g->value_bytes[v];
        }
    }
    for (v = 0; v < nv; v++)
        prod[v] = -1;
    for (k = 0; k < n; k++)
        for (j = g->out_ptr[k]; j < g->out_ptr[k + 1]; j++) {
            int32_t x = g->out_idx[j];
            if (prod[x] == k)
                return mf_set_error(ctx, MF_EINVAL, "op %d writes value %d twice", (int)k, (int)x);
            if (prod[x] >= 0)
                return mf_set_error(ctx, MF_EINVAL, "value %d is produced by op %d and op %d", (int)x,
                                    (int)prod[x], (int)k);
            prod[x] = k;
        }
    for (v = 0; v < nv; v++) {
        int in = g->is_input && g->is_input[v];
        if (in && prod[v] >= 0)
            return mf_set_error(ctx, MF_EINVAL, "graph input %d is also produced by op %d", (int)v,
                                (int)prod[v]);
        if (!in && prod[v] < 0)
            return mf_set_error(ctx, MF_EINVAL, "value %d is neither produced by an op nor a graph input",
                                (int)v);
        if (in && g->alias_of && g->alias_of[v] >= 0 && !g->is_input[g->alias_of[v]])
            return mf_set_error(ctx, MF_EINVAL,
                                "graph input %d is a view of value %d, which is not a graph input "
                                "(NOTE [view order])",
                                (int)v, (int)g->alias_of[v]);
    }

    for (e = 0; e < g->n_after; e++) {
        int32_t p = g->after[2 * e], q = g->after[2 * e + 1];
        if (p < 0 || p >= n || q < 0 || q >= n)
            return mf_set_error(ctx, MF_EINVAL, "ordering edge %d (%d, %d) names op %d out of range [0, %d)",
                                (int)e, (int)p, (int)q, (int)((p < 0 || p >= n) ? p : q), (int)n);
        if (p == q)
            return mf_set_error(ctx, MF_ECYCLE, "ordering edge (%d, %d) creates a cycle", (int)p, (int)q);
    }
    for (k = 0; k < n; k++)
        for (j = g->in_ptr[k]; j < g->in_ptr[k + 1]; j++)
            if (prod[g->in_idx[j]] == k)
                return mf_set_error(ctx, MF_ECYCLE,
                                    "op %d reads value %d, which it produces itself (cycle through ops %d -> %d)",
                                    (int)k, (int)g->in_idx[j], (int)k, (int)k);
    return check_acyclic(ctx, a, g, prod);
}

int mf_graph_check(mf_ctx *ctx, const mf_graph_desc *g)
{
    mf_arena a = {NULL};
    int st;
    if (!g)
        return mf_set_error(ctx, MF_EINVAL, "graph is NULL");
    st = check_body(ctx, &a, g);
    mf_arena_release(ctx, &a);
    return st;
}

/* ---- planning graph ---- */

int mf_pg_build(mf_ctx *ctx, mf_arena *a, const mf_graph_desc *g, mf_pg *pg)
{
    int32_t n = g->n_ops, nv = g->n_values, k, j, v, ns = 0;
    int32_t *root, *stack, *stamp;
    int pass, st;

    memset(pg, 0, sizeof *pg);
    pg->n = n;
    pg->nv = nv;
    root = (int32_t *)mf_arena_array(ctx, a, (size_t)nv + 1, sizeof(int32_t));
    stack = (int32_t *)mf_arena_array(ctx, a, (size_t)nv + 1, sizeof(int32_t));
    stamp = (int32_t *)mf_arena_array(ctx, a, (size_t)nv + (size_t)n + 1, sizeof(int32_t));
    pg->prod = (int32_t *)mf_arena_array(ctx, a, (size_t)nv + 1, sizeof(int32_t));
    pg->sid = (int32_t *)mf_arena_array(ctx, a, (size_t)nv + 1, sizeof(int32_t));
    pg->abytes = (int64_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int64_t));
    pg->oplb = (int64_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int64_t));
    pg->fusible = (uint8_t *)mf_arena_array(ctx, a, (size_t)n + 1, 1);
    pg->epi = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    pg->pointwise = (uint8_t *)mf_arena_array(ctx, a, (size_t)n + 1, 1);
    if (!root || !stack || !stamp || !pg->prod || !pg->sid || !pg->abytes || !pg->oplb || !pg->fusible ||
        !pg->epi || !pg->pointwise)
        return MF_ENOMEM;

    /* alias roots, memoized (chains are acyclic: checked) */
    for (v = 0; v < nv; v++)
        root[v] = -1;
    for (v = 0; v < nv; v++) {
        int32_t u = v, sp = 0, r;
        while (root[u] < 0 && g->alias_of && g->alias_of[u] >= 0) {
            stack[sp++] = u;
            u = g->alias_of[u];
        }
        r = root[u] >= 0 ? root[u] : u;
        root[u] = r;
        while (sp > 0)
            root[stack[--sp]] = r;
    }
    for (v = 0; v < nv; v++)
        pg->prod[v] = -1;
    for (k = 0; k < n; k++)
        for (j = g->out_ptr[k]; j < g->out_ptr[k + 1]; j++)
            pg->prod[g->out_idx[j]] = k;
    for (v = 0; v < nv; v++)
        if (root[v] == v && !(g->is_input && g->is_input[v]))
            ns++;
    pg->ns = ns;
    pg->sbytes = (int64_t *)mf_arena_array(ctx, a, (size_t)ns + 1, sizeof(int64_t));
    pg->salloc = (int32_t *)mf_arena_array(ctx, a, (size_t)ns + 1, sizeof(int32_t));
    pg->sout = (uint8_t *)mf_arena_array(ctx, a, (size_t)ns + 1, 1);
    pg->smat = (uint8_t *)mf_arena_array(ctx, a, (size_t)ns + 1, 1);
    if (!pg->sbytes || !pg->salloc || !pg->sout || !pg->smat)
        return MF_ENOMEM;
    ns = 0;
    for (v = 0; v < nv; v++) {
        if (root[v] == v && !(g->is_input && g->is_input[v])) {
            pg->sbytes[ns] = g->value_bytes[v];
            pg->salloc[ns] = pg->prod[v];
            stack[v] = ns++;
        } else {
            stack[v] = -1;
        }
    }
    for (v = 0; v < nv; v++) {
        pg->sid[v] = stack[root[v]];
        if (pg->sid[v] >= 0 && g->is_output && g->is_output[v])
            pg->sout[pg->sid[v]] = 1;
    }
    for (v = 0; v < pg->ns; v++)
        if (pg->sout[v])
            pg->outbytes += pg->sbytes[v];

    /* per-op CSRs: reads (distinct storages), allocs, touch = reads U allocs */
    pg->oread_ptr = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    pg->oalloc_ptr = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    pg->otouch_ptr = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    if (!pg->oread_ptr || !pg->oalloc_ptr || !pg->otouch_ptr)
        return MF_ENOMEM;
    for (pass = 0; pass < 2; pass++) {
        int32_t cr = 0, ca = 0, ct = 0;
        for (v = 0; v < pg->ns; v++)
            stamp[v] = -1;
        for (k = 0; k < n; k++) {
            if (pass == 0) {
                pg->oread_ptr[k] = cr;
                pg->oalloc_ptr[k] = ca;
                pg->otouch_ptr[k] = ct;
            }
            for (j = g->in_ptr[k]; j < g->in_ptr[k + 1]; j++) {
                int32_t s = pg->sid[g->in_idx[j]];
                if (s >= 0 && stamp[s] != k) {
                    stamp[s] = k;
                    if (pass) {
                        pg->oread[cr] = s;
                        pg->otouch[ct] = s;
                    }
                    cr++;
                    ct++;
                }
            }
            for (j = g->out_ptr[k]; j < g->out_ptr[k + 1]; j++) {
                int32_t x = g->out_idx[j], s = pg->sid[x];
                if (s >= 0 && root[x] == x) {
                    if (pass)
                        pg->oalloc[ca] = s;
                    ca++;
                    if (stamp[s] != k) {
                        stamp[s] = k;
                        if (pass)
                            pg->otouch[ct] = s;
                        ct++;
                    }
                }
            }
        }
        if (pass == 0) {
            pg->oread_ptr[n] = cr;
            pg->oalloc_ptr[n] = ca;
            pg->otouch_ptr[n] = ct;
            pg->oread = (int32_t *)mf_arena_array(ctx, a, (size_t)cr, sizeof(int32_t));
            pg->oalloc = (int32_t *)mf_arena_array(ctx, a, (size_t)ca, sizeof(int32_t));
            pg->otouch = (int32_t *)mf_arena_array(ctx, a, (size_t)ct, sizeof(int32_t));
            if (!pg->oread || !pg->oalloc || !pg->otouch)
                return MF_ENOMEM;
        }
    }
    for (k = 0; k < n; k++) {
        int64_t ab = 0, lb = 0;
        for (j = pg->oalloc_ptr[k]; j < pg->oalloc_ptr[k + 1]; j++)
            ab += pg->sbytes[pg->oalloc[j]];
        for (j = pg->otouch_ptr[k]; j < pg->otouch_ptr[k + 1]; j++)
            lb += pg->sbytes[pg->otouch[j]];
        pg->abytes[k] = ab;
        pg->oplb[k] = lb;
        /* a collective or a wait is a step of its own (NOTE [collective overlap]) */
        pg->fusible[k] = (uint8_t)(g->fusible && g->fusible[k] && !(g->comm && g->comm[k]));
        if (pg->fusible[k] && g->fusible[k] == MF_FUSIBLE_STORED) /* NOTE [stored inner values] */
            for (j = pg->otouch_ptr[k]; j < pg->otouch_ptr[k + 1]; j++)
                pg->smat[pg->otouch[j]] = 1;
        pg->pointwise[k] = (uint8_t)(pg->fusible[k] && g->fusible[k] == MF_FUSIBLE_POINTWISE);
        pg->epi[k] = g->epilogue_of ? g->epilogue_of[k] : -1;
        if (g->fusible && g->fusible[k] == MF_FUSIBLE_STORED) /* an extern call is no epilogue */
            pg->epi[k] = -1;
        if (g->comm && pg->epi[k] >= 0 && (g->comm[k] || g->comm[pg->epi[k]]))
            pg->epi[k] = -1;
    }
    st = csr_transpose(ctx, a, n, pg->oread_ptr, pg->oread, pg->ns, &pg->sread_ptr, &pg->sread);
    if (st || (st = mf_credit_setup(ctx, a, g, root, pg)))
        return st;
    st = mf_build_preds(ctx, a, g, pg->prod, &pg->pred_ptr, &pg->pred);
    if (st)
        return st;
    return csr_transpose(ctx, a, n, pg->pred_ptr, pg->pred, n, &pg->succ_ptr, &pg->succ);
}

int mf_pg_order_valid(const mf_pg *pg, const int32_t *order, int32_t *pos)
{
    int32_t i, k, j;
    for (k = 0; k < pg->n; k++)
        pos[k] = -1;
    for (i = 0; i < pg->n; i++) {
        int32_t v = order[i];
        if (v < 0 || v >= pg->n || pos[v] >= 0)
            return 0;
        pos[v] = i;
    }
    for (k = 0; k < pg->n; k++)
        for (j = pg->pred_ptr[k]; j < pg->pred_ptr[k + 1]; j++)
            if (pos[pg->pred[j]] > pos[k])
                return 0;
    return 1;
}

int mf_check_order(mf_ctx *ctx, const mf_graph_desc *g, const int32_t *order, int *valid_out)
{
    mf_arena a = {NULL};
    mf_pg pg;
    int32_t *pos;
    int st = mf_graph_check(ctx, g);
    *valid_out = 0;
    if (st)
        return st;
    if (!order && g->n_ops > 0)
        return mf_set_error(ctx, MF_EINVAL, "order is NULL");
    st = mf_pg_build(ctx, &a, g, &pg);
    if (!st) {
        pos = (int32_t *)mf_arena_array(ctx, &a, (size_t)g->n_ops + 1, sizeof(int32_t));
        if (!pos)
            st = MF_ENOMEM;
        else
            *valid_out = mf_pg_order_valid(&pg, order, pos);
    }
    mf_arena_release(ctx, &a);
    return st;
}
