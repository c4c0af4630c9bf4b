/*
 * mf_cuts.c -- forced cut points (pipeline step 4 of mf_sched.c): splitting
 * a heuristic order into pieces that run one after another in every valid
 * order, with floating ops and absorbed sinks (NOTE [cut points], NOTE
 * [sinks]).
 */
#include "mf_internal.h"

#include <string.h>
/* ------------------------------------------------------------------ */
/* cut points                                                          */

/* NOTE [cut points]
 * Let R be the ops other than "floating", "trailing" and "absorbed sink"
 * ones (below), in a topological order T.  The prefix P = T[0..i) runs
 * before the rest of R in every valid order iff every op of P is an ancestor
 * of every op of the rest.  We accept a cut when (a) P has a unique maximal
 * op v = T[i-1] (then all of P is below v) and (b) every op of the rest whose
 * predecessors (in R) all lie in P has v as a direct predecessor (dataflow,
 * ordering or view edge).  Both are maintained incrementally along T in
 * O(n + E): (a) by counting ops of P without a successor in P; (b) an op u
 * with last predecessor at position m blocks the cuts m+2 .. pos(u).  The
 * cuts split R into pieces R_0, R_1, ...; no path from R_{>j} to R_{<=j}
 * exists, and no path through a non-R op either (floating ops have no
 * predecessors, sinks no successors, trailing ops no edges).
 *
 * Floating ops: no predecessor, at least one successor, and every storage
 * they allocate is read or is an output (or has no bytes).  Moving such an op
 * s to just before its first successor f never raises the peak: every
 * storage s allocates stays live until f anyway, so s's new step costs
 * live_before(f) <= during(f) in the old order, and the steps in between
 * lose s's bytes.  Hence some optimal order has every floating op right
 * before its first successor, which lies in the earliest piece containing a
 * successor; that is the piece the floating op joins (Float_j: those of R_j).
 * Trailing ops: no edges at all and every storage they allocate is an output
 * (or has no bytes); moving one to the very end costs the final live bytes,
 * which never exceed the last step.  They form a last piece.
 *
 * NOTE [sinks]  Absorbed sinks.  Weight gradients are ops nothing reads and
 * whose result is returned: maximal in every prefix, they would block every
 * cut after their inputs.  A sink s (no successor, at least one predecessor,
 * all predecessors in R) with j = the latest piece of its predecessors is
 * taken out of R and joins piece j when, with the pieces of R computed
 * without the absorbed sinks:
 *  (ii)  out(s) <= fr(s), where out(s) is the bytes of the output storages s
 *        allocates (its other storages are unread, freed right after s) and
 *        fr(s) is the bytes of the non-output storages s reads, not allocated
 *        by s, whose other readers are all in R_{<=j} (so no other sink);
 *  (iii) j is the last piece of R, or alloc(s) <= alloc(y) for every y in
 *        Y_{j+1} = the ops of R_{j+1} whose predecessors in R all lie in
 *        R_{<=j}, plus Float_{j+1}.
 * Claim: some optimal order runs R_0 + Float_0 + Sinks_0, then R_1 +
 * Float_1 + Sinks_1, ..., then the trailing ops; pieces then really are
 * independent (below) and per-piece optima concatenate to an optimum.
 * Proof: take any valid order O; normalize floating and trailing ops as
 * above (no step rises).  While some absorbed sink s of piece j runs after
 * y, the first op of R_{>j} + Float_{>j} in O, move s to just before y.
 * Let S be the set of ops before y: S contains all of R_{<=j} (ancestors of
 * every op of R_{>j}; a floating y sits right before an op of R_{j+1}) and
 * Float_{<=j}, so s is ready at S, and y is in Y_{j+1} (its predecessors
 * in R ran before it and are not in R_{>j}; a floating y joins the piece of
 * the op right after it, which is the first of R_{>j}, in R_{j+1}).  The
 * live bytes after a set depend on the set alone; for every S' >= S without
 * s, live(S' + s) - live(S') = out(s) - (bytes s frees) <= out(s) - fr(s)
 * <= 0 by (ii), since the storages counted in fr(s) are allocated by
 * ancestors of s (in S) and their other readers are in S.  So:
 *  - steps before y are unchanged; steps after s's old position too (same
 *    sets); s's old step is gone;
 *  - s's new step costs live(S) + alloc(s) <= live(S) + alloc(y), which is
 *    y's old step, by (iii);
 *  - every step from y to s's old position now has s done before it, so its
 *    live_before changes by live(S'+s) - live(S') <= 0.
 * The peak never rises, each move puts one more sink inside its piece and
 * none leaves, so the loop ends with the piece-structured order.  (If j is
 * the last piece, s already runs among R_j and the trailing ops, i.e. in
 * piece j once trailing ops are at the end.)
 * The normalized restriction of an order (NOTE [normalized candidates]) is
 * exactly the result of these moves (moved sinks end up at the end of
 * their piece in their old relative order), so it is never worse either.
 * Why the conditions: without (ii) a sink that frees little should run as
 * late as possible (its output would sit through later pieces' peaks);
 * without (iii) the next piece's first step may free a big crossing storage
 * (live(S) is then the peak), and s should run after it.  Candidates that
 * fail go back to R and the cuts are recomputed (a few rounds, then every
 * candidate goes back: the rule without sinks).
 * Pieces are independent: the live bytes after a set of ops depend on the
 * set alone, so each piece is scheduled against the constant memory left by
 * the pieces before it, and the peak is the maximum over pieces.
 */
#define MF_SINK_ROUNDS 4

/* Cuts of the ops with kind 0 along T (NOTE [cut points]): piece_of for
 * them, *n_reg pieces.  rpos, insc, bad, cutid: n + 2 int32 each. */
static void regular_cuts(const mf_pg *pg, const int32_t *T, const uint8_t *kind, int32_t *piece_of,
                         int32_t *rpos, int32_t *insc, int32_t *bad, int32_t *cutid, int32_t *n_reg)
{
    int32_t n = pg->n, i, j, k, nr = 0, maxcount = 0;
    memset(insc, 0, sizeof(int32_t) * ((size_t)n + 2));
    memset(bad, 0, sizeof(int32_t) * ((size_t)n + 2));
    memset(cutid, 0, sizeof(int32_t) * ((size_t)n + 2));
    for (i = 0; i < n; i++) {
        int32_t v = T[i];
        rpos[v] = -1;
        if (kind[v] == 0)
            rpos[v] = nr++;
    }
    /* walk R: after adding the op at rpos r the prefix has r + 1 ops */
    for (i = 0; i < n; i++) {
        int32_t v = T[i], m = -1, r = rpos[v];
        if (kind[v])
            continue;
        maxcount++;
        for (j = pg->pred_ptr[v]; j < pg->pred_ptr[v + 1]; j++) {
            int32_t p = pg->pred[j];
            if (kind[p])
                continue;
            if (rpos[p] > m)
                m = rpos[p];
            if (insc[p]++ == 0)
                maxcount--;
        }
        if (m + 2 <= r) { /* blocks cuts m+2 .. r */
            bad[m + 2]++;
            bad[r + 1]--;
        }
        cutid[r + 1] = (maxcount == 1); /* (a) for the cut after r + 1 ops */
    }
    {
        int32_t acc = 0, cur = 0;
        /* piece of the op at rpos r = number of cuts c <= r (cuts at 1..nr-1) */
        int32_t *pc = insc; /* reuse: pieces by rpos */
        for (i = 0; i <= nr; i++) {
            acc += bad[i];
            if (i >= 1 && i <= nr - 1 && cutid[i] && acc == 0)
                cur++;
            if (i < nr)
                pc[i] = cur;
        }
        *n_reg = nr > 0 ? cur + 1 : 0;
        for (k = 0; k < n; k++)
            if (kind[k] == 0)
                piece_of[k] = pc[rpos[k]];
    }
}

/* Earliest piece among the successors of floating op k (all in R). */
static int32_t floating_piece(const mf_pg *pg, const uint8_t *kind, const int32_t *piece_of, int32_t k,
                              int32_t none)
{
    int32_t best = none, j;
    for (j = pg->succ_ptr[k]; j < pg->succ_ptr[k + 1]; j++) {
        int32_t u = pg->succ[j];
        if (kind[u] == 0 && piece_of[u] < best)
            best = piece_of[u];
    }
    return best;
}

/* Check conditions (ii) and (iii) of NOTE [sinks] for every candidate (kind
 * 3) against the current cuts; failing ones get kind 0.  Sets piece_of of
 * the survivors; *n_failed. */
static void check_sinks(const mf_pg *pg, uint8_t *kind, int32_t *piece_of, int32_t n_reg, int64_t *miny,
                        int32_t *smaxp, int32_t *snsink, int32_t *n_failed)
{
    int32_t n = pg->n, k, j, s, failed = 0;
    for (k = 0; k <= n_reg; k++)
        miny[k] = INT64_MAX;
    for (k = 0; k < n; k++) {
        if (kind[k] == 0 && piece_of[k] > 0) {
            int first = 1;
            for (j = pg->pred_ptr[k]; j < pg->pred_ptr[k + 1] && first; j++) {
                int32_t p = pg->pred[j];
                if (kind[p] == 0 && piece_of[p] >= piece_of[k])
                    first = 0;
            }
            if (first && pg->abytes[k] < miny[piece_of[k]])
                miny[piece_of[k]] = pg->abytes[k];
        } else if (kind[k] == 1) {
            int32_t p = floating_piece(pg, kind, piece_of, k, n_reg);
            if (p < n_reg && pg->abytes[k] < miny[p])
                miny[p] = pg->abytes[k];
        }
    }
    /* per storage: latest piece of a reader in R, readers that are sinks
     * (readers of a storage are in R or sinks: floating and trailing ops
     * read graph inputs only) */
    for (s = 0; s < pg->ns; s++) {
        int32_t r, mp = -1, ns_ = 0;
        for (r = pg->sread_ptr[s]; r < pg->sread_ptr[s + 1]; r++) {
            int32_t u = pg->sread[r];
            if (kind[u] == 0) {
                if (piece_of[u] > mp)
                    mp = piece_of[u];
            } else {
                ns_++;
            }
        }
        smaxp[s] = mp;
        snsink[s] = ns_;
    }
    for (k = 0; k < n; k++) {
        int32_t pj = -1;
        int64_t out = 0, fr = 0;
        if (kind[k] != 3)
            continue;
        for (j = pg->pred_ptr[k]; j < pg->pred_ptr[k + 1]; j++)
            if (piece_of[pg->pred[j]] > pj)
                pj = piece_of[pg->pred[j]];
        for (j = pg->oalloc_ptr[k]; j < pg->oalloc_ptr[k + 1]; j++)
            if (pg->sout[pg->oalloc[j]])
                out += pg->sbytes[pg->oalloc[j]];
        for (j = pg->oread_ptr[k]; j < pg->oread_ptr[k + 1]; j++) {
            s = pg->oread[j];
            if (!pg->sout[s] && pg->salloc[s] != k && snsink[s] == 1 && smaxp[s] <= pj)
                fr += pg->sbytes[s];
        }
        if (out <= fr && (pj == n_reg - 1 || pg->abytes[k] <= miny[pj + 1])) {
            piece_of[k] = pj;
        } else {
            kind[k] = 0;
            failed++;
        }
    }
    *n_failed = failed;
}

int mf_find_pieces(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, const int32_t *T, int32_t *piece_of,
                   uint8_t *kind /* out: 0 regular, 1 floating, 2 trailing, 3 absorbed sink */,
                   int32_t *n_pieces)
{
    int32_t n = pg->n, j, k, np = 0, round, n_sinks = 0, failed = 0;
    int32_t *rpos, *insc, *bad, *cutid, *smaxp, *snsink;
    int64_t *miny;
    int any_trailing = 0;
    rpos = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 2, sizeof(int32_t));
    insc = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 2, sizeof(int32_t));
    bad = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 2, sizeof(int32_t));
    cutid = (int32_t *)mf_arena_array(ctx, a, (size_t)n + 2, sizeof(int32_t));
    if (!rpos || !insc || !bad || !cutid)
        return MF_ENOMEM;
    for (k = 0; k < n; k++) {
        kind[k] = 0;
        int32_t np_ = pg->pred_ptr[k + 1] - pg->pred_ptr[k], ns_ = pg->succ_ptr[k + 1] - pg->succ_ptr[k];
        int unread = 0, nonout = 0;
        if (np_ > 0)
            continue;
        for (j = pg->oalloc_ptr[k]; j < pg->oalloc_ptr[k + 1]; j++) {
            int32_t s = pg->oalloc[j];
            if (pg->sbytes[s] > 0 && !pg->sout[s]) {
                nonout = 1;
                if (pg->sread_ptr[s + 1] == pg->sread_ptr[s])
                    unread = 1;
            }
        }
        if (ns_ > 0 && !unread)
            kind[k] = 1;
        else if (ns_ == 0 && !nonout)
            kind[k] = 2;
    }
    /* sink candidates: no successor, predecessors all in R */
    for (k = 0; k < n; k++) {
        int ok = kind[k] == 0 && pg->succ_ptr[k + 1] == pg->succ_ptr[k] && pg->pred_ptr[k + 1] > pg->pred_ptr[k];
        for (j = pg->pred_ptr[k]; j < pg->pred_ptr[k + 1] && ok; j++)
            if (kind[pg->pred[j]] != 0)
                ok = 0;
        if (ok) {
            kind[k] = 3;
            n_sinks++;
        }
    }
    if (n_sinks > 0) {
        smaxp = (int32_t *)mf_arena_array(ctx, a, (size_t)pg->ns + 1, sizeof(int32_t));
        snsink = (int32_t *)mf_arena_array(ctx, a, (size_t)pg->ns + 1, sizeof(int32_t));
        miny = (int64_t *)mf_arena_array(ctx, a, (size_t)n + 2, sizeof(int64_t));
        if (!smaxp || !snsink || !miny)
            return MF_ENOMEM;
        for (round = 0; round < MF_SINK_ROUNDS; round++) {
            regular_cuts(pg, T, kind, piece_of, rpos, insc, bad, cutid, &np);
            check_sinks(pg, kind, piece_of, np, miny, smaxp, snsink, &failed);
            if (failed == 0)
                break;
        }
        if (failed) /* give up: every sink back in R */
            for (k = 0; k < n; k++)
                if (kind[k] == 3)
                    kind[k] = 0;
    }
    if (n_sinks == 0 || failed)
        regular_cuts(pg, T, kind, piece_of, rpos, insc, bad, cutid, &np);
    for (k = 0; k < n; k++) {
        if (kind[k] == 1) {
            int32_t best = floating_piece(pg, kind, piece_of, k, np);
            if (best == np) /* cannot happen: successors are regular */
                return mf_set_error(ctx, MF_EINTERNAL, "floating op %d has no regular successor", (int)k);
            piece_of[k] = best;
        } else if (kind[k] == 2) {
            any_trailing = 1;
        }
    }
    if (any_trailing) {
        for (k = 0; k < n; k++)
            if (kind[k] == 2)
                piece_of[k] = np;
        np++;
    }
    *n_pieces = np;
    return MF_OK;
}
