/*
 * mf_sched.c -- the scheduler: mf_plan.
 *
 * Pipeline (every step outside the bounded DP is O((n + E) log n)), the
 * ladder of docs/ARCHITECTURE.md; plan_body runs it as one static function
 * per stage:
 *  0. planning graph (mf_graph.c) and the plan's buffers;
 *  1. baseline: ops 0..n-1 simulated unfused; a candidate when valid;
 *  2. lower bound LB = max(max_v oplb(v), bytes of output storages);
 *  3. heuristics (mf_heur.c) scored by the tracker: input order, two least-peak-first
 *     list schedulers, a depth-first "finish what you started" order; the
 *     best is U.  U == LB proves it optimal ("lower-bound");
 *  4. split into pieces at forced cut points (mf_cuts.c, NOTE [cut points]; sinks such
 *     as weight gradients join a piece, NOTE [sinks]) and take,
 *     per piece, the best normalized restriction of every heuristic order
 *     (NOTE [normalized candidates]), or, where strictly better, Liu's
 *     hill/valley merging of the piece's parallel chains (mf_liu.c, NOTE
 *     [liu merge]; pieces above the lower bound only);
 *  5. exact bottleneck DP over downward-closed sets (mf_dp.c), per piece, pieces with
 *     the highest peak first (NOTE [piece DP]: free moves, and recomputation
 *     glued to its consumer), within a state budget (NOTE [state budget];
 *     large pieces get a smaller share, NOTE [DP piece size]);
 *  6. windowed DP around the peak step of pieces the DP could not finish
 *     (mf_windows.c, NOTE [windows]); then, unless the order is proven
 *     optimal, hoists of a storage's last reader before the peak step
 *     (mf_hoist.c, NOTE [hoists]);
 *  7. fusion grouping (mf_fuse.c) on the final order;
 *  8. with fusion on, single-op moves near the peak group that lower the
 *     fused peak (mf_fuse.c NOTE [fusion-aware moves]), then grouping again;
 *  9. collectives issued early and waits run late within the plan's peaks
 *     (mf_comm.c, NOTE [collective overlap]).
 * The result is never worse than the input order (when valid) nor than any
 * heuristic: NOTE [never worse].
 *
 * Invariants: the current order `cur` is always a valid order; pos[] is its
 * inverse; dur[i] / lbef[i] are the unfused `during` and the live bytes
 * before position i, kept in sync whenever a range of cur is rewritten
 * (mf_plan_st, mf_dp.h).
 *
 * Notes kept elsewhere: NOTE [piece DP] and NOTE [DP memory budget] are in
 * mf_dp.c, NOTE [windows] in mf_windows.c, NOTE [cut points] and NOTE
 * [sinks] in mf_cuts.c.
 */
#include "mf_dp.h"

#include <string.h>


/* NOTE [DP piece size]
 * Expanding one DP state of a k-op piece costs O(k^2 / 64) (readiness of
 * every op against a bitset of k bits).  A piece of up to MF_DP_MAX_OPS ops
 * (`small`, mf_plan_options.dp_max_ops when tests lower it) gets the full
 * per-piece share of states (NOTE [state budget]).  A larger piece of up to
 * MF_DP_BIG_FACTOR * small ops still gets the exact DP, with its share
 * scaled by (small / k)^2 so that its time stays within that of a small
 * piece's run: real backward passes are one piece of hundreds of ops
 * (saved tensors come from one virtual op, and every op that reads only
 * saved tensors can run anywhere, so no cut is forced: mf_build.c NOTE
 * [saved op]), and the DP, helped by free moves and glue
 * (NOTE [piece DP]), often settles them in a few thousand states (nanoGPT's
 * backward is proven optimal this way: benchmarks/RESULTS.md, "A real
 * model").  It is the same search over the same piece, so what it proves
 * holds.  Larger pieces, and pieces whose
 * scaled share runs out, get the windows of step 6, which grow past
 * MF_WIN_LEN in pieces larger than small (NOTE [windows]). */

/* The state cap of the DP over a piece of k ops (NOTE [DP piece size], NOTE
 * [state budget]); 0: no DP. */
static int64_t piece_cap(int64_t run_cap, int32_t k, int32_t small)
{
    double r;
    int64_t c;
    if (k <= small)
        return run_cap;
    if (k > (int64_t)MF_DP_BIG_FACTOR * small)
        return 0;
    r = (double)small / (double)k;
    c = (int64_t)((double)run_cap * r * r);
    return c > 0 ? c : 1;
}

static const char *const HEUR_NAMES[] = {"input", "greedy", "greedy-peak", "dfs"};
#define N_HEUR 4

/* One mf_plan call: its inputs, what each stage leaves for the next. */
typedef struct plan {
    mf_ctx *ctx;
    mf_arena *a;
    const mf_graph_desc *g;
    const mf_plan_options *opt;
    mf_plan_result *out;
    int32_t n;
    mf_pg pg;
    mf_tracker tr;
    mf_heur_ws hw;
    mf_plan_st P;
    int32_t *scratch;
    /* heuristics (stage 3); hord[0] is the baseline order */
    int32_t *hord[N_HEUR];
    int32_t *prehoist; /* the order before hoists (stage 6b), when some were kept */
    int64_t hpeak[N_HEUR];
    int32_t best_h;
    int64_t LB, U, F; /* lower bound, best heuristic peak, proven lower bound */
    /* NOTE [state budget] */
    int64_t max_states, run_cap, win_cap, budget, states;
    int32_t small, wlen0;
    int fuse;
    /* pieces (stage 4) */
    int32_t np;
    int32_t *piece_of, *poff, *pfill, *cand, *order_of_piece, *liu_buf;
    uint8_t *kind, *emitted;
    int8_t *pdone;
    int64_t *ppeak, *plive0;
    mf_liu_ws lw;
    int improved, mixed, liu_kept;
    int64_t peak; /* unfused peak of the result (stage 7 on) */
} plan;

/* NOTE [state budget]
 * max_states bounds the DP states one mf_plan call creates, all DP runs
 * together.  One piece DP may create at most
 * run_cap = max(max_states / 4, min(max_states, 4096)) and one window
 * win_cap = max(max_states / 32, min(max_states, 1024)), so a graph of
 * many hard pieces stays within time (the cost of a state is a roughly
 * fixed amount of work; plan times: benchmarks/RESULTS.md) instead of
 * spending the whole budget on its first piece.  Pieces are solved from
 * the highest peak down; the first one left unproven (capped, too large,
 * out of budget) ends the piece loop, since no later piece can then
 * lower the plan's peak; windows continue with what is left, at most
 * max(max_states / 4, win_cap) states in all.  A piece of k > small ops
 * (NOTE [DP piece size]) gets run_cap * (small / k)^2, at least one
 * state, none above MF_DP_BIG_FACTOR * small ops. */
static void plan_budgets(plan *R)
{
    const mf_plan_options *opt = R->opt;
    int64_t ms = (opt && opt->max_states > 0) ? opt->max_states : MF_DEFAULT_MAX_STATES;
    int32_t small = (opt && opt->dp_max_ops > 0 && opt->dp_max_ops < MF_DP_MAX_OPS) ? opt->dp_max_ops
                                                                                      : MF_DP_MAX_OPS;
    R->max_states = ms;
    R->run_cap = ms / 4 > (ms < 4096 ? ms : 4096) ? ms / 4 : (ms < 4096 ? ms : 4096);
    R->win_cap = ms / 32 > (ms < 1024 ? ms : 1024) ? ms / 32 : (ms < 1024 ? ms : 1024);
    R->small = small;
    R->wlen0 = MF_WIN_LEN < small / 4 ? MF_WIN_LEN : (small / 4 > 2 ? small / 4 : 2);
    R->fuse = opt ? opt->fuse : 1;
}

/* An arena array of count elements of size bytes (count + 1 allocated, so
 * never empty). */
static void *arr(plan *R, size_t count, size_t size)
{
    return mf_arena_array(R->ctx, R->a, count + 1, size);
}

/* Stage 0: the planning graph, the tracker and the heuristics' scratch. */
static int stage_graph(plan *R)
{
    int32_t h;
    int st;
    if ((st = mf_pg_build(R->ctx, R->a, R->g, &R->pg)))
        return st;
    if ((st = mf_tracker_init(R->ctx, R->a, &R->pg, &R->tr)) || (st = mf_heur_ws_init(R->ctx, R->a, &R->pg, &R->hw)))
        return st;
    R->scratch = (int32_t *)arr(R, (size_t)R->n, sizeof(int32_t));
    for (h = 0; h < N_HEUR; h++)
        if (!(R->hord[h] = (int32_t *)arr(R, (size_t)R->n, sizeof(int32_t))))
            return MF_ENOMEM;
    return R->scratch ? MF_OK : MF_ENOMEM;
}

/* Stages 1-2: the baseline order (NOTE [baseline order], mf_order.c: valid,
 * the input order itself when that is valid) and its peak; the lower bound. */
static int stage_lower_bound(plan *R)
{
    int32_t k;
    int st;
    if ((st = mf_baseline_order(R->ctx, R->a, &R->pg, R->hord[0])) ||
        (st = mf_pg_simulate(R->ctx, R->a, &R->pg, R->hord[0], NULL, R->n, &R->out->baseline_peak_bytes, NULL,
                             NULL)))
        return st;
    R->LB = R->pg.outbytes;
    for (k = 0; k < R->n; k++)
        if (R->pg.oplb[k] > R->LB)
            R->LB = R->pg.oplb[k];
    R->out->lower_bound_bytes = R->LB;
    return MF_OK;
}

/* Stage 3: the heuristic orders (the baseline order is the first); the best
 * peak is U. */
static void stage_heuristics(plan *R)
{
    int32_t h;
    mf_greedy_order(&R->pg, &R->hw, 0, R->hord[1]);
    mf_greedy_order(&R->pg, &R->hw, 1, R->hord[2]);
    mf_dfs_order(&R->pg, &R->hw, R->hord[3]);
    R->best_h = -1;
    for (h = 0; h < N_HEUR; h++) {
        R->hpeak[h] = mf_tracker_peak(&R->tr, R->hord[h], R->n);
        if (R->best_h < 0 || R->hpeak[h] < R->hpeak[R->best_h])
            R->best_h = h;
    }
    R->U = R->hpeak[R->best_h];
}

/* The current order and what stays in sync with it (mf_plan_st). */
static int plan_cur_init(plan *R)
{
    mf_plan_st *P = &R->P;
    P->ctx = R->ctx;
    P->pg = &R->pg;
    P->cur = (int32_t *)arr(R, (size_t)R->n, sizeof(int32_t));
    P->pos = (int32_t *)arr(R, (size_t)R->n, sizeof(int32_t));
    P->dur = (int64_t *)arr(R, (size_t)R->n, sizeof(int64_t));
    P->lbef = (int64_t *)arr(R, (size_t)R->n, sizeof(int64_t));
    return P->cur && P->pos && P->dur && P->lbef ? MF_OK : MF_ENOMEM;
}

/* Stage 4a: cut points (mf_cuts.c) and the pieces' buffers. */
static int stage_cut_points(plan *R)
{
    int32_t n = R->n, np, i, k;
    mf_seg_ws *sw = R->P.sw;
    int st;
    R->piece_of = (int32_t *)arr(R, (size_t)n, sizeof(int32_t));
    R->kind = (uint8_t *)arr(R, (size_t)n, 1);
    R->emitted = (uint8_t *)arr(R, (size_t)n, 1);
    if (!R->piece_of || !R->kind || !R->emitted)
        return MF_ENOMEM;
    if ((st = mf_find_pieces(R->ctx, R->a, &R->pg, R->hord[R->best_h], R->piece_of, R->kind, &R->np)))
        return st;
    np = R->np;
    R->poff = (int32_t *)arr(R, (size_t)np, sizeof(int32_t));
    R->pfill = (int32_t *)arr(R, (size_t)np, sizeof(int32_t));
    R->cand = (int32_t *)arr(R, (size_t)n * N_HEUR, sizeof(int32_t));
    R->ppeak = (int64_t *)arr(R, (size_t)np, sizeof(int64_t));
    R->plive0 = (int64_t *)arr(R, (size_t)np, sizeof(int64_t));
    R->pdone = (int8_t *)arr(R, (size_t)np, 1);
    R->order_of_piece = (int32_t *)arr(R, (size_t)np, sizeof(int32_t));
    sw->lmap = (int32_t *)arr(R, (size_t)n, sizeof(int32_t));
    sw->smap = (int32_t *)arr(R, (size_t)R->pg.ns, sizeof(int32_t));
    if (!R->poff || !R->pfill || !R->cand || !R->ppeak || !R->plive0 || !R->pdone || !R->order_of_piece ||
        !sw->lmap || !sw->smap)
        return MF_ENOMEM;
    for (k = 0; k < n; k++) {
        sw->lmap[k] = -1;
        R->poff[R->piece_of[k] + 1]++;
    }
    for (k = 0; k < R->pg.ns; k++)
        sw->smap[k] = -1;
    for (i = 0; i < np; i++)
        R->poff[i + 1] += R->poff[i];
    return MF_OK;
}

/* Stage 4b: every heuristic order split by piece.
 * NOTE [normalized candidates]: each heuristic order is split by piece with
 * every floating op moved to just before its first successor (NOTE [cut
 * points]), trailing ops at the end and absorbed sinks in their piece (NOTE
 * [sinks]); the concatenation is then never worse than the heuristic order
 * itself, so the plan is never worse than the best heuristic, the input
 * order included. */
static void stage_candidates(plan *R)
{
    const mf_pg *pg = &R->pg;
    int32_t n = R->n, h, i;
    for (h = 0; h < N_HEUR; h++) {
        int32_t *c = R->cand + (size_t)h * n;
        memcpy(R->pfill, R->poff, sizeof(int32_t) * (size_t)R->np);
        memset(R->emitted, 0, (size_t)n);
        for (i = 0; i < n; i++) {
            int32_t v = R->hord[h][i], j;
            if (R->kind[v] == 1)
                continue;
            for (j = pg->pred_ptr[v]; j < pg->pred_ptr[v + 1]; j++) {
                int32_t p = pg->pred[j];
                if (R->kind[p] == 1 && !R->emitted[p]) {
                    R->emitted[p] = 1;
                    c[R->pfill[R->piece_of[p]]++] = p;
                }
            }
            c[R->pfill[R->piece_of[v]]++] = v;
        }
    }
}

/* The peak of ops[0..k) run from the tracker's state, which is put back
 * (live bytes live0). */
static int64_t trial_peak(mf_tracker *tr, const int32_t *ops, int32_t k, int64_t live0)
{
    int64_t pk = 0;
    int32_t j;
    for (j = 0; j < k; j++) {
        int64_t d = mf_tracker_apply(tr, ops[j]);
        if (d > pk)
            pk = d;
    }
    for (j = 0; j < k; j++)
        mf_tracker_undo(tr, ops[j]);
    tr->live = live0;
    return pk;
}

/* Liu's hill/valley merging (NOTE [liu merge] in mf_liu.c) for piece i
 * (cur[lo..hi), peak *bpk from live bytes live0): more candidates, kept when
 * strictly better.  The second pass counts a storage shared by several ops
 * of the piece as freed by the one the first pass ran last. */
static int piece_liu(plan *R, int32_t i, int32_t lo, int32_t hi, int64_t live0, int64_t *bpk)
{
    int applied = 1, pass, st;
    if (!R->liu_buf) { /* first use: workspace for the largest piece */
        int32_t mk = 0, q;
        for (q = 0; q < R->np; q++)
            if (R->poff[q + 1] - R->poff[q] > mk)
                mk = R->poff[q + 1] - R->poff[q];
        R->liu_buf = (int32_t *)arr(R, (size_t)mk * 2, sizeof(int32_t));
        if (!R->liu_buf)
            return MF_ENOMEM;
        if ((st = mf_liu_init(R->ctx, R->a, &R->pg, R->piece_of, mk, &R->lw)))
            return st;
    }
    for (pass = 0; pass < 2 && applied; pass++) {
        int32_t *lo_buf = R->liu_buf + (size_t)pass * (size_t)R->lw.max_k;
        int64_t pk;
        if ((st = mf_liu_order(R->ctx, &R->lw, R->P.cur + lo, hi - lo, i, pass ? R->liu_buf : NULL, lo_buf,
                               &applied)))
            return st;
        if (!applied)
            break;
        pk = trial_peak(&R->tr, lo_buf, hi - lo, live0);
        if (pk < *bpk) {
            *bpk = pk;
            R->liu_kept = 1;
            memcpy(R->P.cur + lo, lo_buf, sizeof(int32_t) * (size_t)(hi - lo));
        }
    }
    return MF_OK;
}

/* Stage 4c: per piece, the best candidate (the best heuristic's on ties),
 * then Liu's orders; pieces already at or below the lower bound LB are left
 * to their candidate, as the plan's peak cannot go below LB (the DP skips
 * them too).  Fills cur, pos, dur, lbef and the pieces' peaks. */
static int stage_piece_orders(plan *R)
{
    mf_plan_st *P = &R->P;
    int32_t i, h, j;
    int st;
    mf_tracker_reset(&R->tr);
    for (i = 0; i < R->np; i++) {
        int32_t lo = R->poff[i], hi = R->poff[i + 1], bh = -1;
        int64_t live0 = R->tr.live, bpk = INT64_MAX;
        R->plive0[i] = live0;
        for (h = 0; h < N_HEUR; h++) {
            int64_t pk = trial_peak(&R->tr, R->cand + (size_t)h * R->n + lo, hi - lo, live0);
            if (pk < bpk || (pk == bpk && h == R->best_h)) {
                bpk = pk;
                bh = h;
            }
        }
        if (bh != R->best_h)
            R->mixed = 1;
        memcpy(P->cur + lo, R->cand + (size_t)bh * R->n + lo, sizeof(int32_t) * (size_t)(hi - lo));
        if (bpk > R->LB && (st = piece_liu(R, i, lo, hi, live0, &bpk)))
            return st;
        R->ppeak[i] = bpk;
        for (j = lo; j < hi; j++) {
            P->lbef[j] = R->tr.live;
            P->dur[j] = mf_tracker_apply(&R->tr, P->cur[j]);
            P->pos[P->cur[j]] = j;
        }
    }
    return MF_OK;
}

/* Pieces by peak, descending (an indexed heap keyed by -peak), into
 * order_of_piece. */
static int pieces_by_peak(plan *R)
{
    mf_iheap q;
    int32_t i, np = R->np;
    int64_t *negpk = (int64_t *)arr(R, (size_t)np, sizeof(int64_t));
    int64_t *zero = (int64_t *)arr(R, (size_t)np, sizeof(int64_t));
    q.h = (int32_t *)arr(R, (size_t)np, sizeof(int32_t));
    q.at = (int32_t *)arr(R, (size_t)np, sizeof(int32_t));
    if (!negpk || !zero || !q.h || !q.at)
        return MF_ENOMEM;
    for (i = 0; i < np; i++)
        negpk[i] = -R->ppeak[i];
    q.k1 = negpk;
    q.k2 = zero;
    q.size = 0;
    for (i = 0; i < np; i++)
        mf_ih_push(&q, i);
    for (i = 0; i < np; i++)
        R->order_of_piece[i] = mf_ih_pop(&q);
    return MF_OK;
}

/* Stage 5: the exact DP per piece (mf_dp.c, NOTE [piece DP]), highest peak
 * first; the first piece left unproven ends the loop (NOTE [state budget]). */
static int stage_piece_dp(plan *R)
{
    mf_plan_st *P = &R->P;
    int32_t i;
    int st;
    if ((st = pieces_by_peak(R)))
        return st;
    R->budget = R->max_states;
    for (i = 0; i < R->np; i++) {
        int32_t p = R->order_of_piece[i];
        int64_t pcap;
        mf_seg_job J;
        if (R->ppeak[p] <= R->F) {
            R->pdone[p] = 1;
            continue;
        }
        /* the first piece left unproven has the highest peak among the
         * rest: no later piece can lower the plan's peak below it */
        pcap = piece_cap(R->run_cap, R->poff[p + 1] - R->poff[p], R->small);
        if (pcap <= 0 || R->budget <= 0 || P->sw->over_budget)
            break;
        memset(&J, 0, sizeof J);
        J.a = R->poff[p];
        J.b = R->poff[p + 1];
        J.live0 = R->plive0[p];
        J.U = R->ppeak[p];
        J.F = R->F;
        J.cap = R->budget < pcap ? R->budget : pcap;
        if ((st = mf_seg_solve(P, &J)))
            return st;
        R->states += J.states;
        R->budget -= J.states;
        if (J.outcome == MF_SEG_IMPROVED) {
            int64_t np_ = 0;
            int32_t j;
            for (j = R->poff[p]; j < R->poff[p + 1]; j++)
                if (P->dur[j] > np_)
                    np_ = P->dur[j];
            R->ppeak[p] = np_;
            R->improved = 1;
            R->pdone[p] = 1;
            if (J.bound > R->F)
                R->F = J.bound;
        } else if (J.outcome == MF_SEG_NO_BETTER) {
            R->pdone[p] = 1;
            if (R->ppeak[p] > R->F)
                R->F = R->ppeak[p];
        } else {
            if (J.bound > R->F)
                R->F = J.bound;
            break;
        }
    }
    return MF_OK;
}

/* Stage 6: windows around the peak step of unfinished pieces (mf_windows.c,
 * NOTE [windows]), with what the pieces left of the budget. */
static int stage_windows(plan *R)
{
    mf_win_args A;
    A.n = R->n;
    A.piece_of = R->piece_of;
    A.poff = R->poff;
    A.pdone = R->pdone;
    A.F = R->F;
    A.win_budget = R->budget < R->max_states / 4 ? R->budget : R->max_states / 4;
    if (A.win_budget < R->win_cap && R->budget >= R->win_cap)
        A.win_budget = R->win_cap;
    A.win_cap = R->win_cap;
    A.small = R->small;
    A.wlen0 = R->wlen0;
    return mf_windows_run(&R->P, &A, &R->states, &R->improved);
}

/* Stage 6b: hoists (mf_hoist.c, NOTE [hoists]) on the order of the pieces,
 * unless it is proven optimal. */
static int stage_hoists(plan *R)
{
    int32_t moves = 0;
    int st;
    if (R->opt && R->opt->no_hoists)
        return MF_OK;
    if (!(R->prehoist = (int32_t *)arr(R, (size_t)R->n, sizeof(int32_t))))
        return MF_ENOMEM;
    memcpy(R->prehoist, R->P.cur, sizeof(int32_t) * (size_t)R->n);
    if ((st = mf_hoist_refine(R->ctx, R->a, &R->pg, R->F, R->P.cur, &moves)))
        return st;
    if (moves == 0)
        R->prehoist = NULL;
    if (moves > 0 && !mf_pg_order_valid(&R->pg, R->P.cur, R->scratch))
        return mf_set_error(R->ctx, MF_EINTERNAL, "hoists produced an invalid order");
    R->out->hoists = moves;
    return MF_OK;
}

/* Stage 7a: the planned order into the result, checked against the
 * simulator and the tracker, never worse than the input or the best
 * heuristic order; its method and proof. */
static int stage_result(plan *R)
{
    mf_plan_result *out = R->out;
    int32_t n = R->n;
    int64_t peak;
    int st;
    out->order = (int32_t *)mf_alloc(R->ctx, sizeof(int32_t) * ((size_t)n + 1));
    out->group_ptr = (int32_t *)mf_alloc(R->ctx, sizeof(int32_t) * ((size_t)n + 1));
    out->group_kind = (uint8_t *)mf_alloc(R->ctx, (size_t)n + 1);
    if (!out->order || !out->group_ptr || !out->group_kind)
        return MF_ENOMEM;
    memcpy(out->order, R->P.cur, sizeof(int32_t) * (size_t)n);
    out->n_ops = n;
    if (!mf_pg_order_valid(&R->pg, out->order, R->scratch))
        return mf_set_error(R->ctx, MF_EINTERNAL, "scheduler produced an invalid order");
    if ((st = mf_pg_simulate(R->ctx, R->a, &R->pg, out->order, NULL, n, &peak, NULL, NULL)))
        return st;
    if (peak != mf_tracker_peak(&R->tr, out->order, n))
        return mf_set_error(R->ctx, MF_EINTERNAL, "tracker and simulator disagree on the peak");
    /* NOTE [never worse]: neither fallback below can trigger (NOTE
     * [normalized candidates]); they stay as the interface's guarantee.  The
     * tests build with MF_STRICT_CHECKS, which turns them into errors. */
#ifdef MF_STRICT_CHECKS
    if (out->baseline_peak_bytes < peak || R->U < peak)
        return mf_set_error(R->ctx, MF_EINTERNAL,
                            "plan peak %lld above the input (%lld) or heuristic (%lld) order", (long long)peak,
                            (long long)out->baseline_peak_bytes, (long long)R->U);
#endif
    if (out->baseline_peak_bytes < peak) {
        memcpy(out->order, R->hord[0], sizeof(int32_t) * (size_t)n);
        peak = out->baseline_peak_bytes;
        out->method = "input";
    }
    if (R->U < peak) {
        memcpy(out->order, R->hord[R->best_h], sizeof(int32_t) * (size_t)n);
        peak = R->U;
        out->method = HEUR_NAMES[R->best_h];
    }
    R->peak = peak;
    out->unfused_peak_bytes = peak;
    out->optimal = peak <= R->F;
    out->states = R->states;
    if (out->optimal)
        out->method = R->states == 0 ? "lower-bound" : "dp";
    else if (R->improved)
        out->method = "dp-partial";
    return MF_OK;
}

/* The plan's peak allowance (mf_fuse.c NOTE [peak allowance]), 0 when none. */
static int64_t allowance(const plan *R)
{
    return R->opt && R->opt->peak_allowance > 0 ? R->opt->peak_allowance : 0;
}

/* Does the allowance bind: the grouping's peak at most the allowance, so a
 * lower fused peak buys nothing (NOTE [peak allowance])? */
static int allowance_binds(const plan *R)
{
    return allowance(R) > 0 && R->out->peak_bytes <= allowance(R);
}

/* Stage 7b: fusion grouping (mf_fuse.c) of the final order. */
static int stage_fusion_grouping(plan *R)
{
    mf_plan_result *out = R->out;
    return mf_fuse_group(R->ctx, R->a, &R->pg, out->order, R->fuse, allowance(R), out->group_ptr, &out->n_groups,
                         &out->peak_bytes);
}

/* Stage 8: fusion-aware moves (NOTE [fusion-aware moves] in mf_fuse.c), from
 * the planned order, from the best heuristic order and from the order before
 * hoists: the moves are a local search, and the DPs' last unfused gains (or
 * the hoists') can put the planned order in a worse basin for regions
 * (nanoGPT's checkpointed backward reaches a lower fused peak from the
 * heuristic order: benchmarks/RESULTS.md, "A real model").  The order before
 * hoists is also grouped as it is.  The lower fused peak is kept. */
static int stage_fusion_moves(plan *R)
{
    mf_plan_result *out = R->out;
    int32_t n = R->n, ng2 = 0, c;
    int32_t *ord2, *gp2, *coarse;
    const int32_t *starts[4];
    int64_t pk2 = 0;
    int st, found = 0;
    if (!R->fuse || (R->opt && R->opt->no_fusion_moves) || allowance_binds(R))
        return MF_OK;
    ord2 = (int32_t *)arr(R, (size_t)n, sizeof(int32_t));
    gp2 = (int32_t *)arr(R, (size_t)n, sizeof(int32_t));
    coarse = (int32_t *)arr(R, (size_t)n, sizeof(int32_t));
    if (!ord2 || !gp2 || !coarse)
        return MF_ENOMEM;
    if (!(R->opt && R->opt->no_coarse)) {
        /* the coarse plan draws on what the DPs left of the plan's state budget, never less than one
         * window's (NOTE [state budget]); its states are the plan's */
        int64_t cs = 0, cap = R->max_states - R->states > R->win_cap ? R->max_states - R->states : R->win_cap;
        if ((st = mf_coarse_order(R->ctx, R->a, R->g, cap, &cs, coarse, &found)))
            return st;
        R->states += cs;
        out->states = R->states;
    }
    /* a view made without reading its base, or a view of it, can be ordered before the base
     * (NOTE [coarse orders]): then no coarse start */
    if (found && !mf_pg_order_valid(&R->pg, coarse, R->scratch))
        found = 0;
    starts[0] = out->order;
    /* the planned order may be the heuristic one: then no second start */
    starts[1] = memcmp(R->hord[R->best_h], out->order, sizeof(int32_t) * (size_t)n) ? R->hord[R->best_h] : NULL;
    starts[2] = R->prehoist;
    starts[3] = found ? coarse : NULL; /* NOTE [coarse orders] */
    for (c = 0; c < 4; c++) {
        int32_t moves = 0, pass;
        if (!starts[c])
            continue;
        for (pass = c >= 2 ? 0 : 1; pass < 2; pass++) { /* pass 0: the order as it is */
            memcpy(ord2, starts[c], sizeof(int32_t) * (size_t)n);
            if (pass == 1) {
                if ((st = mf_fuse_refine(R->ctx, R->a, &R->pg, R->opt ? R->opt->max_refine : 0, ord2, &moves)))
                    return st;
                if (moves == 0)
                    continue;
            }
            if (!mf_pg_order_valid(&R->pg, ord2, R->scratch))
                return mf_set_error(R->ctx, MF_EINTERNAL, "fusion-aware moves produced an invalid order");
            if ((st = mf_fuse_group(R->ctx, R->a, &R->pg, ord2, R->fuse, allowance(R), gp2, &ng2, &pk2)))
                return st;
            if (pk2 < out->peak_bytes) {
                memcpy(out->order, ord2, sizeof(int32_t) * (size_t)n);
                memcpy(out->group_ptr, gp2, sizeof(int32_t) * ((size_t)ng2 + 1));
                out->n_groups = ng2;
                out->peak_bytes = pk2;
                out->fusion_moves = moves + (c == 3); /* the coarse order counts as a move */
                if (c >= 2)
                    out->hoists = 0;
                R->peak = mf_tracker_peak(&R->tr, out->order, n);
                out->unfused_peak_bytes = R->peak;
                out->optimal = R->peak <= R->F;
            }
        }
    }
    return MF_OK;
}

/* Stage 8b: fused hoists (NOTE [fused hoists] in mf_hoist.c), against the
 * fused peak the moves left; fusion-aware moves of their own kind. */
static int stage_fused_hoists(plan *R)
{
    mf_plan_result *out = R->out;
    int32_t moves = 0;
    int64_t cap;
    int st;
    if (!R->fuse || (R->opt && (R->opt->no_fusion_moves || R->opt->no_hoists)) || allowance_binds(R))
        return MF_OK;
    /* the unfused peak may rise, as the moves' may, but never above the
     * input order's (NOTE [never worse]) */
    cap = out->unfused_peak_bytes > out->baseline_peak_bytes ? out->unfused_peak_bytes : out->baseline_peak_bytes;
    if ((st = mf_hoist_fused(R->ctx, R->a, &R->pg, R->fuse, cap, out->order, out->group_ptr, &out->n_groups,
                             &out->peak_bytes, &moves)))
        return st;
    if (moves > 0) {
        if (!mf_pg_order_valid(&R->pg, out->order, R->scratch))
            return mf_set_error(R->ctx, MF_EINTERNAL, "fused hoists produced an invalid order");
        out->fusion_moves += moves;
        R->peak = mf_tracker_peak(&R->tr, out->order, R->n);
        out->unfused_peak_bytes = R->peak;
        out->optimal = R->peak <= R->F;
    }
    return MF_OK;
}

/* Stage 9: collectives early, waits late, within the plan's peaks
 * (mf_comm.c); then the grouped schedule checked against the simulator. */
static int stage_collectives(plan *R)
{
    mf_plan_result *out = R->out;
    int64_t sim_peak;
    int st;
    if (!(R->opt && R->opt->no_comm_overlap) &&
        (st = mf_comm_place(R->ctx, R->a, &R->pg, R->g->comm, out->order, out->group_ptr, out->n_groups,
                            &out->peak_bytes, &out->unfused_peak_bytes, &out->comm_moves)))
        return st;
    R->peak = out->unfused_peak_bytes;
    if ((st = mf_pg_simulate(R->ctx, R->a, &R->pg, out->order, out->group_ptr, out->n_groups, &sim_peak, NULL,
                             NULL)))
        return st;
    /* regions never raise the unfused peak, but up to an allowance (NOTE [peak allowance]) */
    if (sim_peak != out->peak_bytes || (out->peak_bytes > R->peak && out->peak_bytes > allowance(R)))
        return mf_set_error(R->ctx, MF_EINTERNAL, "fusion grouping peak %lld disagrees with the simulator (%lld)",
                            (long long)out->peak_bytes, (long long)sim_peak);
    return MF_OK;
}

/* The method of an order planned through the pieces (stages 4-6). */
static const char *pieces_method(const plan *R)
{
    if (R->improved)
        return "dp";
    if (R->liu_kept)
        return "liu";
    if (R->mixed)
        return "pieces";
    return HEUR_NAMES[R->best_h];
}

/* The ladder of docs/ARCHITECTURE.md, one stage after the other. */
static int plan_body(mf_ctx *ctx, mf_arena *a, mf_seg_ws *sw, const mf_graph_desc *g,
                     const mf_plan_options *opt, mf_plan_result *out)
{
    plan R;
    int st;

    memset(&R, 0, sizeof R);
    R.ctx = ctx;
    R.a = a;
    R.g = g;
    R.opt = opt;
    R.out = out;
    R.n = g->n_ops;
    R.P.sw = sw;
    sw->mem_limit = (opt && opt->max_dp_bytes > 0) ? opt->max_dp_bytes : MF_DEFAULT_DP_BYTES;
    plan_budgets(&R);

    if ((st = stage_graph(&R)))             /* 0: planning graph */
        return st;
    if ((st = stage_lower_bound(&R)))       /* 1-2: baseline order, lower bound */
        return st;
    stage_heuristics(&R);                   /* 3: heuristic orders, upper bound U */
    if ((st = plan_cur_init(&R)))
        return st;
    R.F = R.LB;
    if (R.U <= R.LB) { /* a heuristic reaches the lower bound: optimal, no search */
        memcpy(R.P.cur, R.hord[R.best_h], sizeof(int32_t) * (size_t)R.n);
        out->method = "lower-bound";
    } else {
        if ((st = stage_cut_points(&R)))    /* 4: cut points, pieces */
            return st;
        stage_candidates(&R);               /* 4: normalized candidates per piece */
        if ((st = stage_piece_orders(&R)))  /* 4: best candidate or Liu per piece */
            return st;
        if ((st = stage_piece_dp(&R)))      /* 5: exact DP per piece */
            return st;
        if ((st = stage_windows(&R)))       /* 6: windows past the cap */
            return st;
        out->method = pieces_method(&R);
    }
    if ((st = stage_hoists(&R)))            /* 6b: hoists */
        return st;
    if ((st = stage_result(&R)))            /* 7: checks, never worse, proof */
        return st;
    if ((st = stage_fusion_grouping(&R)))   /* 7: fusion grouping */
        return st;
    if ((st = stage_fusion_moves(&R)))      /* 8: fusion-aware moves */
        return st;
    if ((st = stage_fused_hoists(&R)))      /* 8b: fused hoists */
        return st;
    if ((st = stage_collectives(&R)))       /* 9: collective placement */
        return st;
    /* the final groups' kinds (mf_core.h NOTE [group kinds]) */
    mf_fuse_kinds(&R.pg, out->order, out->group_ptr, out->n_groups, out->group_kind);
    return MF_OK;
}

int mf_plan(mf_ctx *ctx, const mf_graph_desc *g, const mf_plan_options *opt, mf_plan_result *out)
{
    mf_arena a = {NULL};
    mf_seg_ws sw;
    int st;
    memset(out, 0, sizeof *out);
    memset(&sw, 0, sizeof sw);
    out->method = "none";
    st = mf_graph_check(ctx, g);
    if (st)
        return st;
    st = plan_body(ctx, &a, &sw, g, opt, out);
    mf_seg_ws_free(ctx, &sw);
    mf_arena_release(ctx, &a);
    if (st) {
        mf_plan_result_free(ctx, out);
        out->method = "none";
    }
    return st;
}

void mf_plan_result_free(mf_ctx *ctx, mf_plan_result *r)
{
    if (!r)
        return;
    mf_free(ctx, r->order);
    mf_free(ctx, r->group_ptr);
    mf_free(ctx, r->group_kind);
    memset(r, 0, sizeof *r);
}
