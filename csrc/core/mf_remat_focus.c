/*
 * mf_remat_focus.c -- recomputation's focused splits (NOTE [focused splits]):
 * one split at the group at a plan's fused peak, for the binding to plan and
 * keep where the fused peak falls (csrc/python/remat.c).
 */
#include "mf_internal.h"

/*
 * NOTE [focused splits]  The search scores the unfused model, but where
 * regions run as kernels the plan's peak is its fused one, which may sit
 * where the unfused model has slack: a region that makes a cheap value (the
 * half of the GELU input that the weight gradient's recomputed GELU reads
 * again, say) and hands it to a reader far after the region counts it in the
 * region's cost, while the unfused peak is elsewhere and no split there
 * lowers it.  So the binding (csrc/python/remat.c) also asks for single
 * splits at the group at the fused peak [lo, hi): values made by a cheap op
 * before hi (in the group or before it), eligible as in NOTE
 * [recomputation], with a reader before hi and one after, largest first; the
 * pick-th is split at its first reader after the group, so it no longer
 * leaves the group (or stays live across it).  Nothing is scored here: the
 * caller plans the graph with the copy and keeps it only if the fused peak
 * falls.
 */
int mf_focused_split(mf_ctx *ctx, mf_wgraph *cur, const mf_remat_options *opt, int64_t budget, int64_t *used,
                     int32_t *n_used)
{
    mf_arena a = {NULL};
    mf_roots R;
    mf_split sp;
    mf_wgraph next;
    int32_t r, hi = opt->focus_hi, rank, pick = -1, k;
    int st;
    if ((st = mf_roots_build(ctx, &a, cur, &R)))
        goto done;
    /* the pick-th largest candidate (ties by id): count those above each */
    for (r = 0; r < cur->nv && pick < 0; r++) {
        int32_t x;
        if (!R.ok[r] || R.prod[r] >= hi || mf_first_reader_after(&R, r, hi - 1) < 1 || *used + cur->bytes[r] > budget)
            continue;
        for (x = 0, rank = 0; x < cur->nv; x++)
            if (x != r && R.ok[x] && R.prod[x] < hi && mf_first_reader_after(&R, x, hi - 1) >= 1 &&
                *used + cur->bytes[x] <= budget &&
                (cur->bytes[x] > cur->bytes[r] || (cur->bytes[x] == cur->bytes[r] && x < r)))
                rank++;
        if (rank == opt->focus_pick)
            pick = r;
    }
    if (pick < 0)
        goto done;
    k = mf_first_reader_after(&R, pick, hi - 1);
    sp.r = pick;
    sp.k = k;
    sp.bytes = cur->bytes[pick];
    sp.chain = NULL;
    sp.n_chain = 0;
    if ((st = mf_apply_splits(ctx, cur, &R, &sp, 1, &next)))
        goto done;
    mf_wg_free(ctx, cur);
    *cur = next;
    *used += sp.bytes;
    (*n_used)++;
done:
    mf_arena_release(ctx, &a);
    return st;
}
