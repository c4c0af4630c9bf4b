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
 * NOTE [stored inner values]
 * An op given as MF_FUSIBLE_STORED (mf_core.h) may join a group, but as an
 * extern call inside the group's program: Inductor runs a GEMM as a library
 * call on stored buffers, so its inputs and its result exist in memory even
 * when no op outside the group reads them.  Every storage such an op reads
 * or allocates is marked (pg->smat); the fused rule then counts a marked
 * storage allocated in the group as if it were read after the group: stored
 * from its allocation to the group's end.  That is an upper bound of what
 * the compiler keeps (it may free the buffer at its last use inside the
 * program), so the planned peak of such a group is never below the real
 * one for what the model sees.  Counting a buffer only up to its last read
 * inside the group was tried (a segment tree in the DP): it let larger
 * regions form, in which Inductor also keeps buffers the model does not see
 * (intermediates it realizes, operand copies for a GEMM), and a checkpointed
 * nanoGPT step measured a higher peak than with this rule and than without
 * memfuse (benchmarks/RESULTS.md); the whole-group count is kept as the
 * margin.  An unmarked inner value stays free.  Epilogue pairs keep their own,
 * exact rule: their GEMM result is written over by the epilogue.  A group of
 * one op counts everything it allocates, marked or not.
 *
 * NOTE [stored heads]
 * One exception to that count, which Inductor makes: it frees a buffer at
 * its last use and gives it to the next buffer of its size, and a pointwise
 * kernel reading a dying buffer at the index it writes writes over it.  So
 * where a fused group begins with a stored op writing exactly one storage h
 * (a GEMM; not a graph output, read by nobody after the group), and an op the
 * record calls MF_FUSIBLE_POINTWISE, at or after h's last read in the group,
 * allocates a storage of h's size that leaves the group, that storage takes
 * h's buffer: the group counts h's bytes once, not twice.  (A checkpointed
 * MLP's backward: the matmul making the GELU's incoming gradient, then the
 * GELU gradient over it.)  mf_credit.c applies the rule, with donated inputs
 * (NOTE [reuse credit]), for the DP and the simulator alike; the fusion-aware moves then bring the GEMM next to its
 * pointwise consumer where that lowers the peak.
 * Where two such storages leave the group (a SwiGLU backward: both branches'
 * gradients from the GEMM's result; a checkpointed GELU MLP's backward region
 * that recomputes the activation and makes its gradient) each gets a buffer of
 * its own: Inductor's kernel writing both reads the head while it writes, so
 * neither may write over it.  Then nothing is credited.  (An earlier form
 * credited one of the two: the plan was one tensor below the program.)
 *
 * NOTE [group length cap]
 * A fused group holds at most MF_FUSE_MAX_GROUP (512) ops, which keeps both
 * DPs O(n * 512 + deaths * 512).  Longer runs of fusible ops are split; the
 * peak optimum can only be missed when a single kernel of more than 512 ops
 * would be needed to reach it, and the group count is minimal among
 * groupings that respect the cap.
 *
 * NOTE [peak allowance]
 * A plan's peak is not always the peak that matters: the forward of a
 * training step peaks far below its backward, whose peak is the step's.
 * There a forward grouping up to the backward's peak costs no memory, and
 * each region it saves is one compile and one launch less.  With an
 * allowance A (mf_plan_options.peak_allowance) the second DP takes the fewest
 * groups with every cost <= max(P, A) instead of P; the grouping's peak is
 * then its own largest group cost (at most that bound), which may exceed the
 * order's unfused peak: that is what the allowance gives away.  Where it
 * binds (the peak found is at most A) the fusion-aware moves and fused hoists
 * are skipped, since a lower fused peak buys nothing.  Where the allowance
 * comes from is the caller's business (docs/ARCHITECTURE.md, "The step's
 * peak").
 */
#include "mf_internal.h"

#include <string.h>

#define INF64 INT64_MAX

typedef struct fuse_ws {
    const mf_pg *pg;
    const int32_t *order;
    int32_t n, maxlen;
    int32_t a, b;            /* the DPs run over positions [a, b) (the whole order: 0, n) */
    int32_t *apos, *lastpos; /* per storage */
    int32_t *dptr, *didx;    /* storages (not outputs, read after alloc) by last read position,
                                dptr[p - a] .. dptr[p - a + 1] for position p in [a, b) */
    int64_t *L;              /* n + 1, by absolute position */
    int64_t *fa;             /* n + 1, by absolute position: fused_allocs(p, p + 1), filled by dp_pass */
    mf_credit *cr;           /* mf_credit.c NOTE [reuse credit] */
} fuse_ws;

/* bytes allocated at position p by the fused rule for a group ending at j */
static int64_t fused_allocs(const fuse_ws *w, int32_t p, int32_t j)
{
    const mf_pg *pg = w->pg;
    int32_t v = w->order[p], q;
    int64_t sum = 0;
    for (q = pg->oalloc_ptr[v]; q < pg->oalloc_ptr[v + 1]; q++) {
        int32_t s = pg->oalloc[q];
        if (pg->sout[s] || w->lastpos[s] >= j || pg->smat[s])
            sum += pg->sbytes[s];
    }
    return sum;
}

/* Can [i, i + 2) be an epilogue pair (NOTE [epilogue pairs])? */
static int epilogue_pair(const fuse_ws *w, int32_t i)
{
    const mf_pg *pg = w->pg;
    int32_t u, q;
    if (i + 2 > w->b || pg->epi[w->order[i + 1]] != w->order[i])
        return 0;
    u = w->order[i];
    for (q = pg->oalloc_ptr[u]; q < pg->oalloc_ptr[u + 1]; q++) {
        int32_t s = pg->oalloc[q];
        if (pg->sout[s] || w->lastpos[s] > i + 1)
            return 0;
    }
    return 1;
}

/* mf_credit.c NOTE [reuse credit]: the results of position p that leave a group ending at j */
static void credit_takers(const fuse_ws *w, int32_t p, int32_t j, int32_t hs)
{
    const mf_pg *pg = w->pg;
    int32_t u = w->order[p], q;
    for (q = pg->oalloc_ptr[u]; q < pg->oalloc_ptr[u + 1]; q++) {
        int32_t s = pg->oalloc[q];
        if ((pg->sout[s] || w->lastpos[s] >= j) && mf_credit_is_taker(pg, w->order, p, s, hs))
            mf_credit_taker(w->cr, s);
    }
}

/* The value of extending a grouping of value base by a group of cost c. */
static int64_t step(int mode, int64_t cap, int64_t base, int64_t c)
{
    if (mode == 0)
        return c > base ? c : base;
    if (c > cap)
        return INF64;
    return base + (mode == 1 || c == cap);
}

/* One DP pass over [w->a, w->b); val and parent are indexed by position - a.
 * mode 0: minimize the peak (val = g); mode 1: minimize the group count with
 * every cost <= cap (val = h); mode 2: minimize the number of groups costing
 * exactly cap, every cost <= cap (NOTE [fusion-aware moves]).  parent[j - a]
 * is the start of the group ending at j (absolute). */
static void dp_pass(const fuse_ws *w, int mode, int64_t cap, int64_t *val, int32_t *parent)
{
    const mf_pg *pg = w->pg;
    mf_credit *cr = w->cr;
    int32_t a = w->a, b = w->b, i, j, q, hs;
    val[0] = 0;
    for (j = a + 1; j <= b; j++) {
        val[j - a] = INF64;
        parent[j - a] = -1;
    }
    /* what position p adds to a group that goes on past it does not depend
     * on where the group starts: once per pass, not once per start */
    for (j = a; j < b; j++)
        w->fa[j] = fused_allocs(w, j, j + 1);
    for (i = a; i < b; i++) {
        int64_t base = val[i - a], c, A, cand;
        if (base == INF64)
            continue;
        c = w->L[i] + pg->abytes[w->order[i]];
        cand = step(mode, cap, base, c);
        if (cand < val[i + 1 - a]) {
            val[i + 1 - a] = cand;
            parent[i + 1 - a] = i;
        }
        if (w->maxlen >= 2 && epilogue_pair(w, i)) {
            c = w->L[i] + fused_allocs(w, i + 1, i + 2); /* u's storages: none outlive the pair */
            cand = step(mode, cap, base, c);
            if (cand < val[i + 2 - a]) {
                val[i + 2 - a] = cand;
                parent[i + 2 - a] = i;
            }
        }
        if (!pg->fusible[w->order[i]] || w->maxlen < 2)
            continue;
        /* the groups [i, j) for growing j, with the reuse credit met position
         * by position (mf_credit.c NOTE [reuse credit]; mf_group_credit: the same, whole) */
        A = w->fa[i];
        hs = mf_credit_head(pg, w->order[i]);
        mf_credit_begin(cr, i, hs);
        mf_credit_inputs(cr, w->order[i]);
        if (hs >= 0 && w->lastpos[hs] <= i)
            mf_credit_source(cr, hs, 1); /* unread: dead from the start */
        for (q = w->dptr[i - a]; q < w->dptr[i + 1 - a]; q++) /* donated inputs read last at i */
            if (w->apos[w->didx[q]] < i && pg->sdon[w->didx[q]])
                mf_credit_source(cr, w->didx[q], 0);
        mf_credit_op(cr, w->order[i]);
        credit_takers(w, i, i + 1, hs); /* i's results, while read after it */
        for (j = i + 2; j <= b && j - i <= w->maxlen; j++) {
            int32_t p = j - 1, u = w->order[p];
            if (!pg->fusible[u])
                break;
            mf_credit_inputs(cr, u);
            for (q = w->dptr[p - a]; q < w->dptr[j - a]; q++) {
                int32_t s = w->didx[q];
                if (w->apos[s] >= i) { /* made in the group, read by it alone from here on */
                    if (!pg->smat[s])
                        A -= pg->sbytes[s];
                    mf_credit_drop(cr, s);
                    if (s == hs)
                        mf_credit_source(cr, s, 1);
                } else if (pg->sdon[s]) {
                    mf_credit_source(cr, s, 0);
                }
            }
            A += w->fa[p];
            mf_credit_op(cr, u);
            credit_takers(w, p, j, hs);
            c = w->L[i] + A - cr->credit;
            cand = step(mode, cap, base, c);
            if (cand < val[j - a]) {
                val[j - a] = cand;
                parent[j - a] = i;
            }
        }
    }
}

/* Cost of the group [i, j) under the current positions (the rules above). */
static int64_t group_cost(const fuse_ws *w, int32_t i, int32_t j)
{
    int64_t sum = 0;
    int32_t p;
    if (j == i + 1)
        return w->L[i] + w->pg->abytes[w->order[i]];
    if (j == i + 2 && epilogue_pair(w, i)) /* the pair's rule is never above the fused one */
        return w->L[i] + fused_allocs(w, i + 1, i + 2);
    for (p = i; p < j; p++)
        sum += fused_allocs(w, p, j);
    return w->L[i] + sum - mf_group_credit(w->cr, w->order, w->apos, w->lastpos, i, j);
}

/* Positions, storage positions, the live bytes L at every boundary and the
 * storages by last read position, for the whole of `order` (pos: n entries,
 * filled).  The DP range is [0, n). */
static int ws_setup(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, const int32_t *order, int fuse, int32_t *pos,
                    fuse_ws *w)
{
    int32_t n = pg->n, i, s, q;
    int32_t *fill;
    int64_t *diff;

    memset(w, 0, sizeof *w);
    w->pg = pg;
    w->order = order;
    w->n = n;
    w->a = 0;
    w->b = n;
    w->maxlen = fuse ? MF_FUSE_MAX_GROUP : 1;
    fill = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 2, sizeof(int32_t));
    diff = (int64_t *)mf_arena_array(ctx, a, (size_t)n + 2, sizeof(int64_t));
    w->apos = (int32_t *)mf_arena_array(ctx, a, (size_t)pg->ns + 1, sizeof(int32_t));
    w->lastpos = (int32_t *)mf_arena_array(ctx, a, (size_t)pg->ns + 1, sizeof(int32_t));
    w->dptr = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 2, sizeof(int32_t));
    w->didx = (int32_t *)mf_arena_array(ctx, a, (size_t)pg->ns + 1, sizeof(int32_t));
    w->L = (int64_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int64_t));
    w->fa = (int64_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int64_t));
    w->cr = (mf_credit *)mf_arena_array(ctx, a, 1, sizeof(mf_credit));
    if (!fill || !diff || !w->apos || !w->lastpos || !w->dptr || !w->didx || !w->L || !w->fa || !w->cr ||
        mf_credit_init(ctx, a, pg, w->cr))
        return MF_ENOMEM;
    w->cr->pos = pos;
    for (i = 0; i < n; i++)
        pos[order[i]] = i;
    for (s = 0; s < pg->ns; s++) {
        int32_t lp = -1, ap = pos[pg->salloc[s]];
        int64_t b = pg->sbytes[s];
        for (q = pg->sread_ptr[s]; q < pg->sread_ptr[s + 1]; q++)
            if (pos[pg->sread[q]] > lp)
                lp = pos[pg->sread[q]];
        w->apos[s] = ap;
        w->lastpos[s] = lp;
        if (pg->sout[s]) {
            diff[ap + 1] += b;
            diff[n + 1] -= b;
        } else if (lp > ap) {
            diff[ap + 1] += b;
            diff[lp + 1] -= b;
            w->dptr[lp + 1]++;
        }
    }
    {
        int64_t acc = 0;
        for (i = 0; i <= n; i++) {
            acc += diff[i];
            w->L[i] = acc;
        }
    }
    for (i = 0; i < n; i++)
        w->dptr[i + 1] += w->dptr[i];
    memcpy(fill, w->dptr, sizeof(int32_t) * ((size_t)n + 1));
    for (s = 0; s < pg->ns; s++)
        if (!pg->sout[s] && w->lastpos[s] > w->apos[s])
            w->didx[fill[w->lastpos[s]]++] = s;
    return MF_OK;
}

/* Group starts (absolute positions) of the last dp_pass, walked back from b,
 * into starts[0..k); returns k. */
static int32_t walk_groups(const fuse_ws *w, const int32_t *parent, int32_t *starts)
{
    int32_t a = w->a, i, c = 0, k;
    for (i = w->b; i > a; i = parent[i - a])
        c++;
    k = c;
    for (i = w->b; i > a; i = parent[i - a])
        starts[--c] = parent[i - a];
    return k;
}

/* Both DPs over [w->a, w->b): the least peak P, then the fewest groups with
 * every cost at most max(P, allow) (NOTE [peak allowance]).  Group starts
 * (absolute positions) go to starts[0..k), *k their count; returns the
 * grouping's peak (P when allow does not bind). */
static int64_t group_range(const fuse_ws *w, int64_t allow, int64_t *val, int32_t *parent, int32_t *starts,
                           int32_t *k)
{
    int64_t P, peak = 0;
    int32_t g;
    dp_pass(w, 0, 0, val, parent);
    P = w->b > w->a ? val[w->b - w->a] : 0;
    if (allow <= P) {
        dp_pass(w, 1, P, val, parent);
        *k = walk_groups(w, parent, starts);
        return P;
    }
    dp_pass(w, 1, allow, val, parent);
    *k = walk_groups(w, parent, starts);
    for (g = 0; g < *k; g++) {
        int64_t c = group_cost(w, starts[g], g + 1 < *k ? starts[g + 1] : w->b);
        if (c > peak)
            peak = c;
    }
    return peak;
}

int mf_fuse_group(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, const int32_t *order, int fuse, int64_t allow,
                  int32_t *group_ptr, int32_t *n_groups, int64_t *peak)
{
    fuse_ws w;
    int32_t n = pg->n, st;
    int32_t *pos = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    int32_t *parent = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    int64_t *val = (int64_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int64_t));
    if (!pos || !parent || !val)
        return MF_ENOMEM;
    if ((st = ws_setup(ctx, a, pg, order, fuse, pos, &w)))
        return st;
    *peak = group_range(&w, allow, val, parent, group_ptr, n_groups);
    group_ptr[*n_groups] = n;
    return MF_OK;
}

/* NOTE [group kinds] (mf_core.h): the kind of each group of a grouped
 * order.  A pair [u, v] meets the rule of epilogue_pair above at its place:
 * there "no storage of u outlives the pair" reads positions; here, in a
 * valid order, every reader of a storage u allocates runs after u, so the
 * same rule is "u and v are its only readers". */
static int pair_at(const mf_pg *pg, int32_t u, int32_t v)
{
    int32_t q, j;
    if (pg->epi[v] != u)
        return 0;
    for (q = pg->oalloc_ptr[u]; q < pg->oalloc_ptr[u + 1]; q++) {
        int32_t s = pg->oalloc[q];
        if (pg->sout[s])
            return 0;
        for (j = pg->sread_ptr[s]; j < pg->sread_ptr[s + 1]; j++)
            if (pg->sread[j] != u && pg->sread[j] != v)
                return 0;
    }
    return 1;
}

void mf_fuse_kinds(const mf_pg *pg, const int32_t *order, const int32_t *group_ptr, int32_t n_groups,
                   uint8_t *kinds)
{
    int32_t i;
    for (i = 0; i < n_groups; i++) {
        int32_t lo = group_ptr[i], len = group_ptr[i + 1] - lo;
        if (len == 1)
            kinds[i] = MF_GROUP_SINGLE;
        else if (len == 2 && pair_at(pg, order[lo], order[lo + 1]))
            kinds[i] = MF_GROUP_EPILOGUE;
        else
            kinds[i] = MF_GROUP_REGION;
    }
}

/* NOTE [fusion-aware moves]
 * mf_sched plans the order with the unfused model and the grouping above
 * runs on that order.  Regions change what is live, though: an op reading a
 * region's results consumes them inside the region only when it runs next to
 * it, and the unfused model, in which those results exist anyway, gives no
 * reason to put it there.  (In a checkpointed transformer backward the
 * elementwise tail of the GELU gradient is planned after the next matmul and
 * keeps two of its inputs alive across it.)  mf_fuse_refine therefore moves
 * single ops (or short blocks, below) near a group at the peak: op v from
 * position q to position t, both within MF_REFINE_H positions of the group's ends, where the move
 * touches the group (min(q, t) <= its end, max(q, t) >= its start - 1) and
 * keeps the order valid (t after v's last predecessor, before its first
 * successor).  A move rewrites positions [lo, hi] only, so the live bytes at
 * every boundary outside them and the cost of every group that does not
 * overlap them stay as they are: only the window W (the groups overlapping
 * [lo, hi], and the peak group) is regrouped, by the same DPs on W alone, and
 * the new peak is max(the groups outside W, W's DP peak).  A move is kept
 * when it lowers the peak, or keeps it with fewer groups at the peak (a
 * third DP over W: the least number of groups costing exactly the peak);
 * each round takes the best move by (peak, groups at the peak) among the
 * moves around the first MF_REFINE_SCAN groups at the peak (the first that
 * lowers the peak ends the scan), so that pair falls lexicographically round
 * after round and the loop ends.  A budget of evaluated window positions
 * bounds the time, and a plateau of more than MF_REFINE_MAX_PEAKS groups at
 * the peak, which the budget could not clear, ends it at once.  Besides
 * single ops, blocks of up to MF_REFINE_BLOCK consecutive ops move as one:
 * a GEMM and the op feeding it, say, that sit between two runs of
 * elementwise ops which only merge once both are out of the way.  The order of the last strict peak decrease is returned (plateau
 * moves that led nowhere are dropped); the caller regroups it with
 * mf_fuse_group, whose least peak over groupings is at most the windows'.
 * The price: the order's unfused peak may rise above the planned one, so what
 * the plan proves about the unfused order (`optimal`) may no longer hold for
 * it.  The fused peak, the figure when regions run as kernels, only falls.
 */
#define MF_REFINE_H 8
#define MF_REFINE_BLOCK 3 /* longest block of consecutive ops moved as one */
#define MF_REFINE_MAX_WIN 128
/* window positions evaluated, all moves together, bound the search's time:
 * mf_plan_options.max_refine (MF_DEFAULT_REFINE_POSITIONS), and at most
 * MF_REFINE_PER_OP per op of the graph (small graphs) */
#define MF_REFINE_PER_OP 256
#define MF_REFINE_SCAN 16        /* peak groups whose moves one round compares */
#define MF_REFINE_MAX_PEAKS 64   /* more groups at the peak than this: stop */

typedef struct refine_st {
    fuse_ws w;            /* w.order is ord */
    const mf_pg *pg;
    int32_t n, ng;
    int32_t *ord, *pos;
    int32_t *gs, *gs2;    /* group starts, gs[ng] == n; splice scratch */
    int64_t *gc, *gc2;    /* group costs */
    int64_t *pmax, *smax; /* pmax[g] = max gc[0..g), smax[g] = max gc[g..ng) (0 when empty) */
    int32_t *save_ord;    /* window scratch, MF_REFINE_MAX_WIN + 2 each */
    int64_t *save_L, *val;
    int32_t *parent, *wstart, *wdptr;
    int32_t *touched, *save_apos, *save_last, *stamp, nt, cur; /* ns each */
} refine_st;

static void refine_bounds(refine_st *R)
{
    int32_t g;
    R->pmax[0] = 0;
    for (g = 0; g < R->ng; g++)
        R->pmax[g + 1] = R->gc[g] > R->pmax[g] ? R->gc[g] : R->pmax[g];
    R->smax[R->ng] = 0;
    for (g = R->ng - 1; g >= 0; g--)
        R->smax[g] = R->gc[g] > R->smax[g + 1] ? R->gc[g] : R->smax[g + 1];
}

/* The group holding position p (binary search on the starts). */
static int32_t group_of(const refine_st *R, int32_t p)
{
    int32_t lo = 0, hi = R->ng - 1;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo + 1) / 2;
        if (R->gs[mid] <= p)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Move the block of len ops at [q, q + len) so that it starts at t, inside
 * the window [a, b), and bring pos, apos, lastpos and L up to date there
 * (saving what it overwrites).  Returns 0, or -1 when the live bytes at b
 * disagree with the unchanged prefix (a bug). */
static int apply_move(refine_st *R, int32_t q, int32_t len, int32_t t, int32_t a, int32_t b)
{
    const mf_pg *pg = R->pg;
    fuse_ws *w = &R->w;
    int32_t *ord = R->ord, *old = R->save_ord - a, p, k;
    size_t sz = sizeof(int32_t);
    memcpy(R->save_ord, ord + a, sz * (size_t)(b - a));
    memcpy(R->save_L, w->L + a, sizeof(int64_t) * (size_t)(b - a + 1));
    if (t < q) { /* [t, q) shifts right past the block */
        memcpy(ord + t, old + q, sz * (size_t)len);
        memcpy(ord + t + len, old + t, sz * (size_t)(q - t));
    } else { /* (q + len, t + len) shifts left */
        memcpy(ord + q, old + q + len, sz * (size_t)(t - q));
        memcpy(ord + t, old + q, sz * (size_t)len);
    }
    for (p = a; p < b; p++)
        R->pos[ord[p]] = p;
    R->cur++;
    R->nt = 0;
    for (p = a; p < b; p++)
        for (k = pg->otouch_ptr[ord[p]]; k < pg->otouch_ptr[ord[p] + 1]; k++) {
            int32_t s = pg->otouch[k], lp = -1, r;
            if (R->stamp[s] == R->cur)
                continue;
            R->stamp[s] = R->cur;
            R->touched[R->nt] = s;
            R->save_apos[R->nt] = w->apos[s];
            R->save_last[R->nt] = w->lastpos[s];
            R->nt++;
            for (r = pg->sread_ptr[s]; r < pg->sread_ptr[s + 1]; r++)
                if (R->pos[pg->sread[r]] > lp)
                    lp = R->pos[pg->sread[r]];
            w->apos[s] = R->pos[pg->salloc[s]];
            w->lastpos[s] = lp;
        }
    for (p = a; p < b; p++) {
        int32_t op = ord[p];
        int64_t l = w->L[p];
        for (k = pg->oalloc_ptr[op]; k < pg->oalloc_ptr[op + 1]; k++) {
            int32_t s = pg->oalloc[k];
            if (pg->sout[s] || w->lastpos[s] > p)
                l += pg->sbytes[s];
        }
        for (k = pg->oread_ptr[op]; k < pg->oread_ptr[op + 1]; k++) {
            int32_t s = pg->oread[k];
            if (!pg->sout[s] && w->lastpos[s] == p && w->apos[s] < p)
                l -= pg->sbytes[s];
        }
        w->L[p + 1] = l;
    }
    if (w->L[b] != R->save_L[b - a])
        return -1;
    /* storages by last read position inside the window: all are touched */
    memset(R->wdptr, 0, sizeof(int32_t) * (size_t)(b - a + 2));
    for (k = 0; k < R->nt; k++) {
        int32_t s = R->touched[k], lp = w->lastpos[s];
        if (!pg->sout[s] && lp > w->apos[s] && lp >= a && lp < b)
            R->wdptr[lp - a + 1]++;
    }
    for (p = 0; p <= b - a; p++)
        R->wdptr[p + 1] += R->wdptr[p];
    for (k = 0; k < R->nt; k++) {
        int32_t s = R->touched[k], lp = w->lastpos[s];
        if (!pg->sout[s] && lp > w->apos[s] && lp >= a && lp < b)
            w->didx[R->wdptr[lp - a]++] = s;
    }
    for (p = b - a; p > 0; p--) /* the fill pass moved each start to the next one's */
        R->wdptr[p] = R->wdptr[p - 1];
    R->wdptr[0] = 0;
    w->dptr = R->wdptr;
    w->a = a;
    w->b = b;
    return 0;
}

static void undo_move(refine_st *R, int32_t a, int32_t b)
{
    int32_t p, k;
    memcpy(R->ord + a, R->save_ord, sizeof(int32_t) * (size_t)(b - a));
    memcpy(R->w.L + a, R->save_L, sizeof(int64_t) * (size_t)(b - a + 1));
    for (p = a; p < b; p++)
        R->pos[R->ord[p]] = p;
    for (k = 0; k < R->nt; k++) {
        R->w.apos[R->touched[k]] = R->save_apos[k];
        R->w.lastpos[R->touched[k]] = R->save_last[k];
    }
}

/* Replace groups ga..gb (positions [a, b)) by the window's k groups. */
static void splice_groups(refine_st *R, int32_t ga, int32_t gb, int32_t k)
{
    int32_t g, m = 0, b = R->gs[gb + 1];
    int32_t *ts;
    int64_t *tc;
    for (g = 0; g < ga; g++, m++) {
        R->gs2[m] = R->gs[g];
        R->gc2[m] = R->gc[g];
    }
    for (g = 0; g < k; g++, m++) {
        int32_t j = g + 1 < k ? R->wstart[g + 1] : b;
        R->gs2[m] = R->wstart[g];
        R->gc2[m] = group_cost(&R->w, R->wstart[g], j);
    }
    for (g = gb + 1; g < R->ng; g++, m++) {
        R->gs2[m] = R->gs[g];
        R->gc2[m] = R->gc[g];
    }
    R->gs2[m] = R->n;
    R->ng = m;
    ts = R->gs;
    R->gs = R->gs2;
    R->gs2 = ts;
    tc = R->gc;
    R->gc = R->gc2;
    R->gc2 = tc;
    refine_bounds(R);
}

int mf_fuse_refine(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, int64_t max_positions, int32_t *order,
                   int32_t *moves_out)
{
    refine_st R;
    int32_t n = pg->n, g, k, moves = 0, best_moves = 0, ns1 = pg->ns + 1, W = MF_REFINE_MAX_WIN + 2;
    int64_t P, P0, best_P, budget = (int64_t)MF_REFINE_PER_OP * n;
    int32_t *best, *full_parent;
    int64_t *full_val;
    int st;

    *moves_out = 0;
    if (max_positions <= 0)
        max_positions = MF_DEFAULT_REFINE_POSITIONS;
    if (budget > max_positions)
        budget = max_positions;
    for (g = 0; g < n && !pg->fusible[g] && pg->epi[g] < 0; g++)
        ;
    if (g == n) /* no op can join a group: moves could only redo the unfused DPs' work */
        return MF_OK;
    memset(&R, 0, sizeof R);
    R.pg = pg;
    R.n = n;
    R.ord = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    R.pos = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    R.gs = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    R.gs2 = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    R.gc = (int64_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int64_t));
    R.gc2 = (int64_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int64_t));
    R.pmax = (int64_t *)mf_arena_array(ctx, a, (size_t)n + 2, sizeof(int64_t));
    R.smax = (int64_t *)mf_arena_array(ctx, a, (size_t)n + 2, sizeof(int64_t));
    R.save_ord = (int32_t *)mf_arena_array(ctx, a, (size_t)W, sizeof(int32_t));
    R.save_L = (int64_t *)mf_arena_array(ctx, a, (size_t)W, sizeof(int64_t));
    R.val = (int64_t *)mf_arena_array(ctx, a, (size_t)W, sizeof(int64_t));
    R.parent = (int32_t *)mf_arena_array(ctx, a, (size_t)W, sizeof(int32_t));
    R.wstart = (int32_t *)mf_arena_array(ctx, a, (size_t)W, sizeof(int32_t));
    R.wdptr = (int32_t *)mf_arena_array(ctx, a, (size_t)W + 1, sizeof(int32_t));
    R.touched = (int32_t *)mf_arena_array(ctx, a, (size_t)ns1, sizeof(int32_t));
    R.save_apos = (int32_t *)mf_arena_array(ctx, a, (size_t)ns1, sizeof(int32_t));
    R.save_last = (int32_t *)mf_arena_array(ctx, a, (size_t)ns1, sizeof(int32_t));
    R.stamp = (int32_t *)mf_arena_array(ctx, a, (size_t)ns1, sizeof(int32_t));
    best = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    full_val = (int64_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int64_t));
    full_parent = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 1, sizeof(int32_t));
    if (!R.ord || !R.pos || !R.gs || !R.gs2 || !R.gc || !R.gc2 || !R.pmax || !R.smax || !R.save_ord ||
        !R.save_L || !R.val || !R.parent || !R.wstart || !R.wdptr || !R.touched || !R.save_apos ||
        !R.save_last || !R.stamp || !best || !full_val || !full_parent)
        return MF_ENOMEM;
    memcpy(R.ord, order, sizeof(int32_t) * (size_t)n);
    if ((st = ws_setup(ctx, a, pg, R.ord, 1, R.pos, &R.w)))
        return st;
    P = group_range(&R.w, 0, full_val, full_parent, R.gs, &R.ng);
    R.gs[R.ng] = n;
    for (g = 0; g < R.ng; g++)
        R.gc[g] = group_cost(&R.w, R.gs[g], R.gs[g + 1]);
    refine_bounds(&R);
    P0 = best_P = P;
    memcpy(best, R.ord, sizeof(int32_t) * (size_t)n);

    while (budget > 0) {
        /* best move of this round, by (new peak, groups at the peak) */
        int32_t cnt = 0, bq = -1, bt = -1, blen = 1, bga = 0, bgb = 0, h, scanned;
        int64_t bkp = P, bkc;
        for (g = 0; g < R.ng; g++)
            cnt += R.gc[g] == P;
        if (cnt > MF_REFINE_MAX_PEAKS)
            break; /* a plateau this wide will not be cleared within the budget */
        bkc = cnt;
        for (g = 0, scanned = 0; g < R.ng && budget > 0 && scanned < MF_REFINE_SCAN && bkp == P; g++) {
            int32_t i = R.gs[g], j = R.gs[g + 1], q;
            int32_t qlo = i - MF_REFINE_H < 0 ? 0 : i - MF_REFINE_H;
            int32_t qhi = j + MF_REFINE_H > n ? n : j + MF_REFINE_H; /* exclusive */
            if (R.gc[g] != P)
                continue;
            scanned++;
            for (q = qlo; q < qhi && budget > 0; q++) {
                int32_t len;
                if (q >= i + MF_REFINE_H && q < j - MF_REFINE_H)
                    continue; /* deep inside a long group */
                for (len = 1; len <= MF_REFINE_BLOCK && q + len <= n && budget > 0; len++) {
                    /* the block [q, q + len) may start anywhere in (its last
                     * predecessor outside it, its first successor outside it - len] */
                    int32_t tlo = qlo, thi = qhi - len, t, x;
                    for (x = q; x < q + len; x++) {
                        int32_t v = R.ord[x];
                        for (k = pg->pred_ptr[v]; k < pg->pred_ptr[v + 1]; k++) {
                            int32_t pp = R.pos[pg->pred[k]];
                            if ((pp < q || pp >= q + len) && pp + 1 > tlo)
                                tlo = pp + 1;
                        }
                        for (k = pg->succ_ptr[v]; k < pg->succ_ptr[v + 1]; k++) {
                            int32_t sp = R.pos[pg->succ[k]];
                            if ((sp < q || sp >= q + len) && sp - len < thi)
                                thi = sp - len;
                        }
                    }
                    for (t = tlo; t <= thi && budget > 0; t++) {
                        int32_t lo = q < t ? q : t, hi = (q < t ? t : q) + len - 1, ga, gb, wa, wb;
                        int64_t Pw, Pn, kc = 0;
                        if (t == q || lo > j || hi < i - 1)
                            continue;
                        ga = group_of(&R, lo < i ? lo : i);
                        gb = group_of(&R, hi > j - 1 ? hi : j - 1);
                        wa = R.gs[ga];
                        wb = R.gs[gb + 1];
                        if (wb - wa > MF_REFINE_MAX_WIN)
                            continue;
                        budget -= wb - wa;
                        if (apply_move(&R, q, len, t, wa, wb))
                            return mf_set_error(ctx, MF_EINTERNAL, "fusion-aware move: live bytes disagree");
                        /* the window's least peak only: its grouping is walked for the
                         * move kept, below */
                        dp_pass(&R.w, 0, 0, R.val, R.parent);
                        Pw = R.val[wb - wa];
                        Pn = R.pmax[ga] > R.smax[gb + 1] ? R.pmax[ga] : R.smax[gb + 1];
                        if (Pw > Pn)
                            Pn = Pw;
                        if (Pn == P) { /* groups at P: outside W, plus the fewest W can have */
                            kc = cnt;
                            for (h = ga; h <= gb; h++)
                                kc -= R.gc[h] == P;
                            if (Pw == P) {
                                dp_pass(&R.w, 2, P, R.val, R.parent);
                                kc += R.val[wb - wa];
                            }
                        }
                        if (Pn < bkp || (Pn == bkp && kc < bkc)) {
                            bkp = Pn;
                            bkc = kc;
                            bq = q;
                            blen = len;
                            bt = t;
                            bga = ga;
                            bgb = gb;
                        }
                        undo_move(&R, wa, wb);
                    }
                }
            }
        }
        if (bq < 0)
            break;
        {   /* redo the best move and keep W's grouping: the fewest groups at
             * a lower peak, or the fewest groups at P */
            int32_t wa = R.gs[bga], wb = R.gs[bgb + 1], nk;
            int64_t Pw;
            if (apply_move(&R, bq, blen, bt, wa, wb))
                return mf_set_error(ctx, MF_EINTERNAL, "fusion-aware move: live bytes disagree");
            Pw = group_range(&R.w, 0, R.val, R.parent, R.wstart, &nk);
            if (Pw == P) {
                dp_pass(&R.w, 2, P, R.val, R.parent);
                nk = walk_groups(&R.w, R.parent, R.wstart);
            }
            splice_groups(&R, bga, bgb, nk);
            P = R.pmax[R.ng];
            if (P != bkp)
                return mf_set_error(ctx, MF_EINTERNAL, "fusion-aware move: peak %lld, expected %lld",
                                    (long long)P, (long long)bkp);
        }
        moves++;
        if (P < best_P) {
            best_P = P;
            best_moves = moves;
            memcpy(best, R.ord, sizeof(int32_t) * (size_t)n);
        }
    }
    if (best_P < P0) {
        memcpy(order, best, sizeof(int32_t) * (size_t)n);
        *moves_out = best_moves;
    }
    return MF_OK;
}
