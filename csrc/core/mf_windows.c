/*
 * mf_windows.c -- pipeline step 6 of mf_sched.c: the DP (mf_dp.c) on
 * windows of the current order around its peak step, for the pieces the
 * piece DP could not finish.
 */
#include "mf_dp.h"

#include <string.h>

/* NOTE [windows]
 * Step 6 runs the DP on a window cur[a..b) around the plan's peak step pk:
 * only orders of the window with every step < pk are wanted (U = pk), steps
 * at or below the largest step outside the window are free (F).  Any order
 * of a contiguous range of a valid order that respects the edges inside it
 * is valid (what ran before a still does, what ran after b still does), the
 * live bytes before a are unchanged, and the steps after b see the same
 * sets; so an accepted window lowers the number of steps at pk by at least
 * one and raises none: the plan's peak never rises.  Windows prove nothing
 * (they never raise F), and stop at the first one that finds nothing.
 * Growing windows: in a piece of more than `small` ops (NOTE [DP piece
 * size]: its DP ran with a scaled share or not at all) a window that finds
 * nothing is doubled around the same peak, up to `small` ops (each run then
 * costs no more per state than a small piece's DP), each run capped at
 * win_cap and all of them within the windows' budget (NOTE [state
 * budget]); after a success the length is kept.  The windows in a piece of
 * at most `small` ops keep MF_WIN_LEN: its DP already searched the whole
 * piece and was capped, and larger windows there only repeat that search
 * (benchmarks/scheduler_scaling.py's 12-16-path blocks: no lower peak with
 * larger windows, more states; benchmarks/RESULTS.md, "Scheduler
 * scaling").  A grown window that reaches the piece's end keeps its length
 * by starting earlier.  In a large piece whose scaled DP is capped (the
 * checkpointed nanoGPT backward), the short windows stop early and longer
 * ones around the peak still find a little more; what each length found is
 * in benchmarks/RESULTS.md, "A real model". */

/* The peak step of cur (the first at the largest `during`), into *pos. */
static int64_t peak_step(const mf_plan_st *P, int32_t n, int32_t *pos)
{
    int32_t j;
    int64_t pk = -1;
    *pos = 0;
    for (j = 0; j < n; j++)
        if (P->dur[j] > pk) {
            pk = P->dur[j];
            *pos = j;
        }
    return pk;
}

int mf_windows_run(mf_plan_st *P, const mf_win_args *A, int64_t *states, int *improved)
{
    const int32_t *poff = A->poff;
    int64_t win_budget = A->win_budget;
    int32_t n = A->n, wlen = A->wlen0, i;
    int st;
    for (i = 0; i < MF_WIN_ITERS && win_budget > 0 && !P->sw->over_budget; i++) {
        int32_t pp, j, p, wa, wb, big;
        int64_t pk = peak_step(P, n, &pp), floor_ = A->F;
        mf_seg_job J;
        if (pk <= A->F)
            break;
        p = A->piece_of[P->cur[pp]];
        if (A->pdone[p])
            break; /* the peak is in a proven piece: cannot improve */
        big = poff[p + 1] - poff[p] > A->small;
        if (!big)
            wlen = A->wlen0;
        wa = pp - wlen / 2;
        if (wa < poff[p])
            wa = poff[p];
        wb = wa + wlen;
        if (wb > poff[p + 1]) {
            wb = poff[p + 1];
            if (big) /* a grown window keeps its length at the piece's end */
                wa = wb - wlen > poff[p] ? wb - wlen : poff[p];
        }
        if (wb - wa < 2)
            break;
        for (j = 0; j < n; j++)
            if ((j < wa || j >= wb) && P->dur[j] < pk && P->dur[j] > floor_)
                floor_ = P->dur[j];
        memset(&J, 0, sizeof J);
        J.a = wa;
        J.b = wb;
        J.live0 = P->lbef[wa];
        J.U = pk;
        J.F = floor_;
        J.cap = win_budget < A->win_cap ? win_budget : A->win_cap;
        if ((st = mf_seg_solve(P, &J)))
            return st;
        *states += J.states;
        win_budget -= J.states;
        if (J.outcome != MF_SEG_IMPROVED) {
            /* NOTE [windows]: in a piece the DP could not take whole,
             * try twice the window around the same peak */
            if (big && wlen < A->small && wb - wa == wlen) {
                wlen = 2 * wlen < A->small ? 2 * wlen : A->small;
                continue;
            }
            break;
        }
        *improved = 1;
    }
    return MF_OK;
}
