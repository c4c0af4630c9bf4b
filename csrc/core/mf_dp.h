/*
 * mf_dp.h -- the scheduler's exact DP over a range of the current order
 * (mf_dp.c, NOTE [piece DP]), shared by the piece stage (mf_sched.c) and the
 * windows (mf_windows.c, NOTE [windows]).  Private to csrc/core.
 */
#ifndef MF_DP_H
#define MF_DP_H

#include "mf_internal.h"

/* Pieces of up to MF_DP_MAX_OPS ops get the DP's full share (NOTE [DP piece
 * size], mf_sched.c), up to MF_DP_BIG_FACTOR times that a scaled share;
 * windows start at MF_WIN_LEN ops, at most MF_WIN_ITERS runs (NOTE
 * [windows]). */
#define MF_DP_MAX_OPS 256
#define MF_DP_BIG_FACTOR 16
#define MF_WIN_LEN 24
#define MF_WIN_ITERS 64

typedef struct lb_key {
    int64_t lb;
    int32_t idx;
} lb_key;

typedef struct hentry {
    int64_t f;
    int32_t depth;
    int32_t idx;
} hentry;

/* The DP's scratch, kept across the runs of one mf_plan call. */
typedef struct mf_seg_ws {
    /* persistent maps (size n / ns, in the plan's arena), -1 outside a call */
    int32_t *lmap, *smap;
    /* per segment (sized for k ops) */
    MF_VEC(int32_t) ops, lborder, tptr, tidx, lsalloc, path, lsptr, lsucc, run;
    MF_VEC(uint64_t) pmask, lsrd, tbits, rbits;
    MF_VEC(int64_t) ab, lbv, lsb;
    MF_VEC(uint8_t) lsnever;
    MF_VEC(int32_t) gptr, gidx; /* deferrable ops glued to each op (NOTE [piece DP], glue) */
    MF_VEC(uint8_t) glued;
    /* units of more than one op (NOTE [piece DP], glue) on a state's path:
     * pool of [len, ops...]; len: entries in use */
    MF_VEC(int32_t) pool;
    /* states (every field sized alike: NOTE [DP memory budget] counts g's cap) */
    MF_VEC(uint64_t) bits, hash;
    MF_VEC(int64_t) g, live, fval;
    MF_VEC(int32_t) parent, last, depth;
    MF_VEC(uint8_t) closed;
    MF_VEC(int32_t) tab; /* open addressing table of state ids (cap: a power of two) */
    MF_VEC(hentry) heap;
    MF_VEC(lb_key) sortk;
    int64_t mem_limit; /* NOTE [DP memory budget] */
    int over_budget;   /* sticky: a run stopped at mem_limit */
} mf_seg_ws;

void mf_seg_ws_free(mf_ctx *ctx, mf_seg_ws *w);

/* The plan's current order and what is kept in sync with it.  Invariants:
 * cur is a valid order; pos is its inverse; dur[i] / lbef[i] are the
 * unfused `during` and the live bytes before position i. */
typedef struct mf_plan_st {
    mf_ctx *ctx;
    const mf_pg *pg;
    int32_t *cur, *pos;
    int64_t *dur, *lbef;
    mf_seg_ws *sw;
} mf_plan_st;

enum { MF_SEG_IMPROVED = 1, MF_SEG_NO_BETTER = 2, MF_SEG_CAPPED = 3 };

typedef struct mf_seg_job {
    int32_t a, b;   /* range of cur */
    int64_t live0;  /* live bytes before a */
    int64_t U;      /* only orders with every step < U are wanted */
    int64_t F;      /* steps <= F are free (a proven lower bound elsewhere) */
    int64_t cap;    /* max states to create */
    /* out */
    int outcome;
    int64_t states;
    int64_t bound;  /* last popped priority: lower bound of max(F, segment peak) */
} mf_seg_job;

/* NOTE [piece DP]: the best order of cur[a..b) with every step < U, written
 * into cur (and pos, dur, lbef) when one is found (MF_SEG_IMPROVED); else
 * the range is unchanged.  Returns a status. */
int mf_seg_solve(mf_plan_st *P, mf_seg_job *J);

/* NOTE [windows] (mf_windows.c): what the windows read. */
typedef struct mf_win_args {
    int32_t n;                 /* ops */
    const int32_t *piece_of;   /* n: piece of each op */
    const int32_t *poff;       /* pieces + 1: first position of each piece in cur */
    const int8_t *pdone;       /* pieces: proven by the piece DP */
    int64_t F;                 /* proven lower bound: steps at or below it are free */
    int64_t win_budget;        /* states for all windows (NOTE [state budget]) */
    int64_t win_cap;           /* states for one window */
    int32_t small, wlen0;      /* NOTE [DP piece size]'s small; the first window length */
} mf_win_args;

/* Windows around the peak step of cur while they lower it; *states += the
 * states they created, *improved = 1 when one was accepted.  A status. */
int mf_windows_run(mf_plan_st *P, const mf_win_args *A, int64_t *states, int *improved);

#endif /* MF_DP_H */
