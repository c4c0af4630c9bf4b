/*
 * mf_liu.c -- Liu's hill/valley merging: one more heuristic order per piece.
 *
 * Input: the ops of one piece (NOTE [cut points] in mf_sched.c) in a valid
 * order.  Output: an order of the same ops by Liu's rule, or "not
 * applicable".  The scheduler scores it with the tracker like every other
 * candidate and keeps it only where it is strictly better, so it can never
 * make a plan worse (NOTE [never worse]).  O((k + E) log k) per piece.
 *
 * NOTE [liu merge]
 * Shape.  Parallel chains between a fork and a join are the classic case;
 * the rule generalizes to in-forests (Liu 1987, generalized tree pebbling),
 * and that is what we order.  Within the piece (its predecessors outside
 * have run): a "side sink" is an op with no successor in the piece and one
 * predecessor u in it (a weight gradient next to the matmul that continues
 * the chain); a fork is an op with two or more successors that are not side
 * sinks.  The head is the forks and their ancestors in the piece; it runs
 * first, in the input order.  Below it every op has at most one successor
 * besides side sinks (else it would be a fork), and its successors are not
 * in the head (else it would be an ancestor of a fork), so after gluing side
 * sinks right behind u (when u has other successors) the rest is an
 * in-forest: chains are its paths, joins its nodes with several children.
 * A fork with its chains and their join, a fork outside the piece (the
 * op that ends the previous piece, NOTE [cut points] in mf_sched.c) with
 * chains summed by a chain of adds: all such forests.  A piece that is all
 * head (or has fewer than 3 ops) is skipped.
 *
 * Profile.  Each op v below the head gets a rise dh(v) = bytes v allocates
 * (its step costs live + dh(v)) and a net change dv(v) = dh(v) - bytes freed
 * right after v.  A storage allocated below the head is freed by its last
 * reader in every order that follows the forest: the parent if it reads it,
 * else the last glued side sink that does (storages nobody reads: by their
 * allocator; read after the piece or an output: never).  A storage from
 * before the piece or from the head, read by one op below the head and by
 * nothing after the piece, is freed by that op.  One read by several (the
 * fork's output read by every chain head) is freed by whichever of them runs
 * last, which depends on the order: the first pass counts it as never freed,
 * a second pass as freed by the reader the first pass ran last, and the
 * scheduler scores both.  That is where the profile is approximate, and why
 * the orders are only candidates.
 *
 * Segments.  A sequence of steps is cut into hill/valley segments: the hill
 * H is the highest `during` of the segment, the valley V the live bytes at
 * its end, both relative to its start; the canonical decomposition has, in
 * absolute terms, hills strictly decreasing and valleys strictly increasing
 * (each valley is the lowest point after its hill).  Stored relatively
 * (dh = H - start, dv = V - start), a sequence is a list of segments with
 * keys dh - dv (hill minus valley, invariant under shifting the start);
 * appending one op's segment x to a list whose last segment is t merges them
 * while  dh(t) >= dv(t) + dh(x)  (x's hill is not lower)  or  dv(x) <= 0
 * (x's valley is not higher):  dh = max(dh(t), dv(t) + dh(x)),
 * dv = dv(t) + dv(x).  Afterwards the key of the new last segment is
 * strictly below every other key of the list, so "the last segment" is the
 * one with the least key.
 *
 * Merge.  Liu's rule: independent sequences are merged by taking segments
 * in order of decreasing hill minus valley; within one canonical sequence
 * the keys decrease, so each sequence keeps its own order.  For chains whose
 * memory effects add up (each frees only what it allocated, so no chain goes
 * below its start) Liu shows that some optimal interleaving runs each
 * segment without interruption, and this order is then optimal: with hills
 * and valleys measured from each chain's start, adjacent segments a, b of
 * chains A, B, the other chains holding C, A at its previous valley pA and B
 * at pB <= Vb: with Ha - Va >= Hb - Vb, a first costs
 * C + max(Ha + pB, Va + Hb) <= C + Ha + Vb <= C + max(Hb + pA, Vb + Ha),
 * the cost of b first.  At a tree node v the children's sequences are merged
 * this way, then v (and its glued side sinks) is appended.  Liu's exact tree
 * algorithm then re-decomposes the whole merged sequence; we only merge at
 * its end (appending v), which keeps every step O(log k) but means the
 * merged list may keep segments a full decomposition would join, so on
 * trees deeper than chains-and-one-join the order is a heuristic (tests/c:
 * independent chains with or without a join come out optimal).
 *
 * Data structure.  Every list is a leftist heap of segments, least key at
 * the root (ties: the later segment first), so the children's lists meld in
 * O(log k) each and the tail merges pop the root.  Each op creates one
 * segment and each merge destroys one, hence O(k log k) for the heaps and
 * O(k + E) for the rest.  Ops of a segment are a linked list; a merge
 * concatenates.  At the roots the forest's lists are melded and popped
 * (least key first, i.e. from the end of the order).
 */
#include "mf_internal.h"

#include <string.h>

int mf_liu_init(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, const int32_t *piece_of, int32_t max_k,
                mf_liu_ws *w)
{
    size_t n1 = (size_t)max_k + 1, ns1 = (size_t)pg->ns + 1;
    int32_t k, s;
    memset(w, 0, sizeof *w);
    w->pg = pg;
    w->piece_of = piece_of;
    w->max_k = max_k;
    w->lmap = (int32_t *)mf_arena_array(ctx, a, (size_t)pg->n + 1, sizeof(int32_t));
    w->parent = (int32_t *)mf_arena_array(ctx, a, n1, sizeof(int32_t));
    w->nsucc = (int32_t *)mf_arena_array(ctx, a, n1, sizeof(int32_t));
    w->npred = (int32_t *)mf_arena_array(ctx, a, n1, sizeof(int32_t));
    w->gfirst = (int32_t *)mf_arena_array(ctx, a, n1, sizeof(int32_t));
    w->glast = (int32_t *)mf_arena_array(ctx, a, n1, sizeof(int32_t));
    w->gnext = (int32_t *)mf_arena_array(ctx, a, n1, sizeof(int32_t));
    w->grank = (int32_t *)mf_arena_array(ctx, a, n1, sizeof(int32_t));
    w->hroot = (int32_t *)mf_arena_array(ctx, a, n1, sizeof(int32_t));
    w->onext = (int32_t *)mf_arena_array(ctx, a, n1, sizeof(int32_t));
    w->sl = (int32_t *)mf_arena_array(ctx, a, n1, sizeof(int32_t));
    w->sr = (int32_t *)mf_arena_array(ctx, a, n1, sizeof(int32_t));
    w->snpl = (int32_t *)mf_arena_array(ctx, a, n1, sizeof(int32_t));
    w->shead = (int32_t *)mf_arena_array(ctx, a, n1, sizeof(int32_t));
    w->stail = (int32_t *)mf_arena_array(ctx, a, n1, sizeof(int32_t));
    w->frees = (int64_t *)mf_arena_array(ctx, a, n1, sizeof(int64_t));
    w->sdh = (int64_t *)mf_arena_array(ctx, a, n1, sizeof(int64_t));
    w->sdv = (int64_t *)mf_arena_array(ctx, a, n1, sizeof(int64_t));
    w->role = (uint8_t *)mf_arena_array(ctx, a, n1, 1);
    w->lastp = (int32_t *)mf_arena_array(ctx, a, ns1, sizeof(int32_t));
    w->nlast = (int32_t *)mf_arena_array(ctx, a, ns1, sizeof(int32_t));
    w->onelast = (int32_t *)mf_arena_array(ctx, a, ns1, sizeof(int32_t));
    w->sstamp = (int32_t *)mf_arena_array(ctx, a, ns1, sizeof(int32_t));
    w->ppos = (int32_t *)mf_arena_array(ctx, a, n1, sizeof(int32_t));
    if (!w->sstamp || !w->ppos ||
        !w->lmap || !w->parent || !w->nsucc || !w->npred || !w->gfirst || !w->glast || !w->gnext || !w->grank ||
        !w->hroot || !w->onext || !w->sl || !w->sr || !w->snpl || !w->shead || !w->stail || !w->frees ||
        !w->sdh || !w->sdv || !w->role || !w->lastp || !w->nlast || !w->onelast)
        return MF_ENOMEM;
    for (k = 0; k < pg->n; k++)
        w->lmap[k] = -1;
    /* per storage: the last piece reading it, how many of its readers are
     * there, and one of them */
    for (s = 0; s < pg->ns; s++) {
        int32_t r, lp = -1, cnt = 0, one = -1;
        for (r = pg->sread_ptr[s]; r < pg->sread_ptr[s + 1]; r++) {
            int32_t p = piece_of[pg->sread[r]];
            if (p > lp) {
                lp = p;
                cnt = 1;
                one = pg->sread[r];
            } else if (p == lp) {
                cnt++;
            }
        }
        w->lastp[s] = lp;
        w->nlast[s] = cnt;
        w->onelast[s] = one;
    }
    return MF_OK;
}

/* role of a piece's op (NOTE [liu merge], Shape) */
enum { IN_FOREST = 0, GLUED = 1, IN_HEAD = 2 };

/* Heap order: least key (hill minus valley) first; ties: later segment first. */
static int seg_before(const mf_liu_ws *w, int32_t x, int32_t y)
{
    int64_t kx = w->sdh[x] - w->sdv[x], ky = w->sdh[y] - w->sdv[y];
    if (kx != ky)
        return kx < ky;
    return x > y;
}

static int32_t npl(const mf_liu_ws *w, int32_t x)
{
    return x < 0 ? 0 : w->snpl[x];
}

/* Leftist heap meld; recursion depth is bounded by the two right spines,
 * O(log k). */
static int32_t meld(mf_liu_ws *w, int32_t x, int32_t y)
{
    int32_t t;
    if (x < 0)
        return y;
    if (y < 0)
        return x;
    if (seg_before(w, y, x)) {
        t = x;
        x = y;
        y = t;
    }
    w->sr[x] = meld(w, w->sr[x], y);
    if (npl(w, w->sl[x]) < npl(w, w->sr[x])) {
        t = w->sl[x];
        w->sl[x] = w->sr[x];
        w->sr[x] = t;
    }
    w->snpl[x] = npl(w, w->sr[x]) + 1;
    return x;
}

/* Append local op j (rise dh, net change dv) to the sequence h; merge with
 * its last segments while the decomposition is not canonical. */
static int32_t append_op(mf_liu_ws *w, int32_t h, int32_t j, int64_t dh, int64_t dv)
{
    int32_t x = w->nseg++;
    w->sdh[x] = dh;
    w->sdv[x] = dv;
    w->shead[x] = w->stail[x] = j;
    w->onext[j] = -1;
    w->sl[x] = w->sr[x] = -1;
    w->snpl[x] = 1;
    while (h >= 0) {
        int32_t t = h; /* least key: the last segment of the sequence */
        int64_t rise = w->sdv[t] + w->sdh[x];
        if (!(w->sdh[t] <= rise || w->sdv[x] <= 0))
            break;
        w->sdh[x] = w->sdh[t] > rise ? w->sdh[t] : rise;
        w->sdv[x] = w->sdv[t] + w->sdv[x];
        w->onext[w->stail[t]] = w->shead[x];
        w->shead[x] = w->shead[t];
        h = meld(w, w->sl[t], w->sr[t]);
    }
    return meld(w, h, x);
}

int mf_liu_order(mf_ctx *ctx, mf_liu_ws *w, const int32_t *ops, int32_t k, int32_t piece,
                 const int32_t *prev, int32_t *out, int *applied)
{
    const mf_pg *pg = w->pg;
    int32_t j, q, roots = -1, pos, nrank = 0, nhead = 0;
    int ok = 1, st = MF_OK;
    *applied = 0;
    if (k < 3)
        return MF_OK;
    if (k > w->max_k)
        return mf_set_error(ctx, MF_EINTERNAL, "Liu merge: piece of %d ops, workspace for %d", (int)k,
                            (int)w->max_k);
    for (j = 0; j < k; j++) {
        w->lmap[ops[j]] = j;
        w->nsucc[j] = w->npred[j] = 0;
        w->parent[j] = w->gfirst[j] = w->glast[j] = w->gnext[j] = w->hroot[j] = -1;
        w->role[j] = IN_FOREST;
        w->frees[j] = 0;
    }
    w->stamp++;
    if (prev)
        for (j = 0; j < k; j++) {
            int32_t l = w->lmap[prev[j]];
            if (l < 0) { /* not the same set of ops: a caller's bug */
                st = mf_set_error(ctx, MF_EINTERNAL, "Liu merge: previous order of another piece");
                goto done;
            }
            w->ppos[l] = j;
        }
    for (j = 0; j < k; j++)
        for (q = pg->succ_ptr[ops[j]]; q < pg->succ_ptr[ops[j] + 1]; q++) {
            int32_t c = w->lmap[pg->succ[q]];
            if (c >= 0) {
                w->nsucc[j]++;
                w->npred[c]++;
            }
        }
    /* the head: forks (two or more successors that are not side sinks) and
     * their ancestors, in reverse topological order (NOTE [liu merge], Shape) */
    for (j = k - 1; j >= 0; j--) {
        int32_t nfork = 0;
        int head = 0;
        for (q = pg->succ_ptr[ops[j]]; q < pg->succ_ptr[ops[j] + 1]; q++) {
            int32_t c = w->lmap[pg->succ[q]];
            if (c < 0)
                continue;
            if (w->role[c] == IN_HEAD)
                head = 1;
            if (!(w->nsucc[c] == 0 && w->npred[c] == 1))
                nfork++;
        }
        if (head || nfork >= 2) {
            w->role[j] = IN_HEAD;
            nhead++;
        }
    }
    if (nhead == k)
        goto done;
    /* glue side sinks behind their predecessor when it has other successors */
    for (j = 0; j < k; j++) {
        int32_t u = -1;
        if (w->role[j] == IN_HEAD || w->nsucc[j] != 0 || w->npred[j] != 1)
            continue;
        for (q = pg->pred_ptr[ops[j]]; q < pg->pred_ptr[ops[j] + 1] && u < 0; q++)
            u = w->lmap[pg->pred[q]];
        if (u < 0 || w->role[u] == IN_HEAD || w->nsucc[u] < 2)
            continue;
        w->role[j] = GLUED;
        w->grank[j] = nrank++;
        if (w->glast[u] >= 0)
            w->gnext[w->glast[u]] = j;
        else
            w->gfirst[u] = j;
        w->glast[u] = j;
    }
    /* the forest below the head: one successor at most besides glued ones */
    for (j = 0; j < k && ok; j++) {
        if (w->role[j] != IN_FOREST)
            continue;
        for (q = pg->succ_ptr[ops[j]]; q < pg->succ_ptr[ops[j] + 1]; q++) {
            int32_t c = w->lmap[pg->succ[q]];
            if (c < 0 || w->role[c] == GLUED)
                continue;
            if (w->parent[j] >= 0 || w->role[c] == IN_HEAD) {
                ok = 0; /* cannot happen (see the head) */
                break;
            }
            w->parent[j] = c;
        }
    }
    if (!ok) { /* cannot happen: see the head; MF_STRICT_CHECKS makes it an error */
#ifdef MF_STRICT_CHECKS
        st = mf_set_error(ctx, MF_EINTERNAL, "Liu merge: the ops below the head are not a forest");
#endif
        goto done;
    }
    /* profiles: what each op below the head frees (NOTE [liu merge], Profile) */
    for (j = 0; j < k; j++) {
        int32_t v = ops[j];
        if (w->role[j] == IN_HEAD)
            continue;
        for (q = pg->oalloc_ptr[v]; q < pg->oalloc_ptr[v + 1]; q++) {
            int32_t s = pg->oalloc[q], f = -1, r;
            if (pg->sout[s])
                continue;
            if (pg->sread_ptr[s + 1] == pg->sread_ptr[s]) {
                f = j; /* nobody reads it: freed right after v */
            } else if (w->lastp[s] == piece) {
                /* its readers: the parent, glued side sinks of j */
                for (r = pg->sread_ptr[s]; r < pg->sread_ptr[s + 1]; r++) {
                    int32_t lr = w->lmap[pg->sread[r]];
                    if (lr < 0)
                        continue;
                    if (lr == w->parent[j]) {
                        f = lr;
                        break;
                    }
                    if (w->role[lr] == GLUED && (f < 0 || w->grank[lr] > w->grank[f]))
                        f = lr;
                }
            }
            if (f >= 0)
                w->frees[f] += pg->sbytes[s];
        }
        for (q = pg->oread_ptr[v]; q < pg->oread_ptr[v + 1]; q++) {
            int32_t s = pg->oread[q], r, f = -1, cnt = 0, al = w->lmap[pg->salloc[s]];
            if (pg->sout[s] || (al >= 0 && w->role[al] != IN_HEAD) || w->lastp[s] != piece ||
                w->sstamp[s] == w->stamp)
                continue;
            /* allocated before the piece or in the head: freed by its only
             * reader below the head, or (shared, with prev) by the one prev
             * runs last */
            w->sstamp[s] = w->stamp;
            for (r = pg->sread_ptr[s]; r < pg->sread_ptr[s + 1]; r++) {
                int32_t lr = w->lmap[pg->sread[r]];
                if (lr < 0 || w->role[lr] == IN_HEAD)
                    continue;
                cnt++;
                if (f < 0 || (prev && w->ppos[lr] > w->ppos[f]))
                    f = lr;
            }
            if (cnt == 1 || (cnt > 1 && prev))
                w->frees[f] += pg->sbytes[s];
        }
    }
    /* merge bottom-up: the input order is topological, children come first */
    w->nseg = 0;
    for (j = 0; j < k; j++) {
        int32_t h, g;
        if (w->role[j] != IN_FOREST)
            continue;
        h = append_op(w, w->hroot[j], j, pg->abytes[ops[j]], pg->abytes[ops[j]] - w->frees[j]);
        for (g = w->gfirst[j]; g >= 0; g = w->gnext[g])
            h = append_op(w, h, g, pg->abytes[ops[g]], pg->abytes[ops[g]] - w->frees[g]);
        if (w->parent[j] >= 0)
            w->hroot[w->parent[j]] = meld(w, w->hroot[w->parent[j]], h);
        else
            roots = meld(w, roots, h);
    }
    /* the head first, in the input order; then pop from the end */
    for (j = 0, q = 0; j < k; j++)
        if (w->role[j] == IN_HEAD)
            out[q++] = ops[j];
    pos = k;
    while (roots >= 0) {
        int32_t x = roots, len = 0, o;
        roots = meld(w, w->sl[x], w->sr[x]);
        for (o = w->shead[x]; o >= 0; o = w->onext[o])
            len++;
        pos -= len;
        if (pos < nhead)
            break;
        for (o = w->shead[x], q = pos; o >= 0; o = w->onext[o])
            out[q++] = ops[o];
    }
    if (pos != nhead) { /* cannot happen; as above */
#ifdef MF_STRICT_CHECKS
        st = mf_set_error(ctx, MF_EINTERNAL, "Liu merge lost ops of a piece (%d of %d placed)",
                          (int)(k - pos + nhead), (int)k);
#endif
        goto done;
    }
    /* the order must be valid: every predecessor inside the piece earlier */
    for (j = 0; j < k; j++)
        w->nsucc[j] = 0; /* reuse: placed */
    for (q = 0; q < k && ok; q++) {
        int32_t v = out[q], p;
        for (p = pg->pred_ptr[v]; p < pg->pred_ptr[v + 1]; p++) {
            int32_t lp = w->lmap[pg->pred[p]];
            if (lp >= 0 && !w->nsucc[lp])
                ok = 0;
        }
        w->nsucc[w->lmap[v]] = 1;
    }
    if (!ok) { /* cannot happen; as above */
#ifdef MF_STRICT_CHECKS
        st = mf_set_error(ctx, MF_EINTERNAL, "Liu merge produced an invalid order");
#endif
        goto done;
    }
    *applied = 1;
done:
    for (j = 0; j < k; j++)
        w->lmap[ops[j]] = -1;
    return st;
}
