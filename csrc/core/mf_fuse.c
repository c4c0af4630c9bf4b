/*
 * mf_fuse.c -- fusion grouping on a fixed valid order.
 *
 * Groups are intervals of consecutive ops: a single op, two or more fusible
 * ops, or an epilogue pair (NOTE [epilogue pairs]).  Frees happen only at group ends, so the live bytes at a group
 * boundary i depend on i alone:
 *   L(i) = bytes of storages allocated before i that are graph outputs or
 *          have a reader at position >= i,
 * and the cost of a group [i, j) is
 *   unfused (j = i + 1):  L(i) + bytes the op allocates,
 *   fused   (j > i + 1):  L(i) + bytes of storages allocated in [i, j) that
 *                         are graph outputs or read at a position >= j
 * (in a valid order every reader follows the allocator, so "read outside the
 * group" means "read at >= j").  Two DPs over positions:
 *   g(j) = min_i max(g(i), cost(i, j))          -> least peak P = g(n)
 *   h(j) = min_i h(i) + 1  over cost(i, j) <= P -> fewest groups at peak P.
 *
 * NOTE [epilogue pairs]
 * Besides runs of fusible ops, a group may be an epilogue pair [u, v]:
 * epilogue_of[v] == u, v at the position right after u, and every storage u
 * allocates read by nobody after v and not a graph output (the fused kernel,
 * a GEMM writing relu(A @ B) say, never writes u's own result).  Its cost is
 * the fused rule's, which then counts v's outputs only.  A pair is one more
 * candidate interval of length 2 in both DPs, so the grouping stays the
 * least-peak, fewest-groups one over the larger set of groupings.  The order
 * is planned without knowing about pairs (the unfused model), so a pair is
 * formed only where the planned order already puts v right after u.
 *
 * NOTE [group length cap]
 * A fused group holds at most MF_FUSE_MAX_GROUP (512) ops, which keeps both
 * DPs O(n * 512 + deaths * 512).  Longer runs of fusible ops are split; the
 * peak optimum can only be missed when a single kernel of more than 512 ops
 * would be needed to reach it, and the group count is minimal among
 * groupings that respect the cap.
 */
#include "mf_internal.h"

#include <string.h>

#define INF64 INT64_MAX

typedef struct fuse_ws {
    const mf_pg *pg;
    const int32_t *order;
    int32_t n, maxlen;
    int32_t *apos, *lastpos; /* per storage */
    int32_t *dptr, *didx;    /* storages (not outputs, read after alloc) by last read position */
    int64_t *L;              /* n + 1 */
} fuse_ws;

/* bytes allocated at position p by the fused rule for a group ending at j */
static int64_t fused_allocs(const fuse_ws *w, int32_t p, int32_t j)
{
    const mf_pg *pg = w->pg;
    int32_t v = w->order[p], q;
    int64_t sum = 0;
    for (q = pg->oalloc_ptr[v]; q < pg->oalloc_ptr[v + 1]; q++) {
        int32_t s = pg->oalloc[q];
        if (pg->sout[s] || w->lastpos[s] >= j)
            sum += pg->sbytes[s];
    }
    return sum;
}

/* Can [i, i + 2) be an epilogue pair (NOTE [epilogue pairs])? */
static int epilogue_pair(const fuse_ws *w, int32_t i)
{
    const mf_pg *pg = w->pg;
    int32_t u, q;
    if (i + 2 > w->n || pg->epi[w->order[i + 1]] != w->order[i])
        return 0;
    u = w->order[i];
    for (q = pg->oalloc_ptr[u]; q < pg->oalloc_ptr[u + 1]; q++) {
        int32_t s = pg->oalloc[q];
        if (pg->sout[s] || w->lastpos[s] > i + 1)
            return 0;
    }
    return 1;
}

/* One DP pass.  mode 0: minimize the peak (val = g); mode 1: minimize the
 * group count with every cost <= cap (val = h). */
static void dp_pass(const fuse_ws *w, int mode, int64_t cap, int64_t *val, int32_t *parent)
{
    const mf_pg *pg = w->pg;
    int32_t n = w->n, i, j, q;
    val[0] = 0;
    for (j = 1; j <= n; j++) {
        val[j] = INF64;
        parent[j] = -1;
    }
    for (i = 0; i < n; i++) {
        int64_t base = val[i], c, A, cand;
        if (base == INF64)
            continue;
        c = w->L[i] + pg->abytes[w->order[i]];
        cand = mode == 0 ? (c > base ? c : base) : (c <= cap ? base + 1 : INF64);
        if (cand < val[i + 1]) {
            val[i + 1] = cand;
            parent[i + 1] = i;
        }
        if (w->maxlen >= 2 && epilogue_pair(w, i)) {
            c = w->L[i] + fused_allocs(w, i + 1, i + 2); /* u's storages: none outlive the pair */
            cand = mode == 0 ? (c > base ? c : base) : (c <= cap ? base + 1 : INF64);
            if (cand < val[i + 2]) {
                val[i + 2] = cand;
                parent[i + 2] = i;
            }
        }
        if (!pg->fusible[w->order[i]] || w->maxlen < 2)
            continue;
        A = fused_allocs(w, i, i + 1);
        for (j = i + 2; j <= n && j - i <= w->maxlen; j++) {
            if (!pg->fusible[w->order[j - 1]])
                break;
            for (q = w->dptr[j - 1]; q < w->dptr[j]; q++) {
                int32_t s = w->didx[q];
                if (w->apos[s] >= i)
                    A -= pg->sbytes[s];
            }
            A += fused_allocs(w, j - 1, j);
            c = w->L[i] + A;
            cand = mode == 0 ? (c > base ? c : base) : (c <= cap ? base + 1 : INF64);
            if (cand < val[j]) {
                val[j] = cand;
                parent[j] = i;
            }
        }
    }
}

int mf_fuse_group(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, const int32_t *order, int fuse,
                  int32_t *group_ptr, int32_t *n_groups, int64_t *peak)
{
    fuse_ws w;
    int32_t n = pg->n, i, s, q, ng;
    int32_t *pos, *parent, *fill;
    int64_t *val, *diff, P;

    memset(&w, 0, sizeof w);
    w.pg = pg;
    w.order = order;
    w.n = n;
    w.maxlen = fuse ? MF_FUSE_MAX_GROUP : 1;
    pos = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    parent = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    fill = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 2, sizeof(int32_t));
    val = (int64_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int64_t));
    diff = (int64_t *)mf_arena_array(ctx, a, (size_t)n + 2, sizeof(int64_t));
    w.apos = (int32_t *)mf_arena_array(ctx, a, (size_t)pg->ns + 1, sizeof(int32_t));
    w.lastpos = (int32_t *)mf_arena_array(ctx, a, (size_t)pg->ns + 1, sizeof(int32_t));
    w.dptr = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 2, sizeof(int32_t));
    w.didx = (int32_t *)mf_arena_array(ctx, a, (size_t)pg->ns + 1, sizeof(int32_t));
    w.L = (int64_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int64_t));
    if (!pos || !parent || !fill || !val || !diff || !w.apos || !w.lastpos || !w.dptr || !w.didx || !w.L)
        return MF_ENOMEM;
    for (i = 0; i < n; i++)
        pos[order[i]] = i;
    for (s = 0; s < pg->ns; s++) {
        int32_t lp = -1, ap = pos[pg->salloc[s]];
        int64_t b = pg->sbytes[s];
        for (q = pg->sread_ptr[s]; q < pg->sread_ptr[s + 1]; q++)
            if (pos[pg->sread[q]] > lp)
                lp = pos[pg->sread[q]];
        w.apos[s] = ap;
        w.lastpos[s] = lp;
        if (pg->sout[s]) {
            diff[ap + 1] += b;
            diff[n + 1] -= b;
        } else if (lp > ap) {
            diff[ap + 1] += b;
            diff[lp + 1] -= b;
            w.dptr[lp + 1]++;
        }
    }
    {
        int64_t acc = 0;
        for (i = 0; i <= n; i++) {
            acc += diff[i];
            w.L[i] = acc;
        }
    }
    for (i = 0; i < n; i++)
        w.dptr[i + 1] += w.dptr[i];
    memcpy(fill, w.dptr, sizeof(int32_t) * ((size_t)n + 1));
    for (s = 0; s < pg->ns; s++)
        if (!pg->sout[s] && w.lastpos[s] > w.apos[s])
            w.didx[fill[w.lastpos[s]]++] = s;

    dp_pass(&w, 0, 0, val, parent);
    P = n ? val[n] : 0;
    dp_pass(&w, 1, P, val, parent);
    /* walk back: parent chain gives group starts */
    ng = 0;
    for (i = n; i > 0; i = parent[i])
        ng++;
    group_ptr[ng] = n;
    q = ng;
    for (i = n; i > 0; i = parent[i])
        group_ptr[--q] = parent[i];
    *n_groups = ng;
    *peak = P;
    return MF_OK;
}
