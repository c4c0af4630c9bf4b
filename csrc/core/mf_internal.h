/*
 * mf_internal.h -- private declarations shared by the C files of csrc/core.
 *
 * Not installed, not included by the binding.  Holds the arena, the
 * "planning graph" (mf_pg: storages and dependency edges derived from an
 * mf_graph_desc), the incremental live-bytes tracker and the entry points of
 * the fusion grouping pass.
 *
 * Invariants of an mf_pg built by mf_pg_build (the desc passed
 * mf_graph_check first):
 *  - storages are the alias roots that are not graph inputs; sid[v] is the
 *    storage of value v (through its alias root) or -1 (input storage,
 *    never counted);
 *  - every storage has exactly one allocating op (salloc);
 *  - oread[k] lists the distinct storages op k reads, oalloc[k] the storages
 *    it allocates, otouch[k] their union (distinct); sread[s] the distinct
 *    ops reading s;
 *  - pred/succ are the distinct dependency edges: dataflow (producer of each
 *    value read), ordering edges, and view edges (see NOTE [view order] in
 *    mf_graph.c).  They form a DAG.
 */
#ifndef MF_INTERNAL_H
#define MF_INTERNAL_H

#include "mf_core.h"

/* ---- arena: every block is one mf_alloc, released together ---- */

typedef struct mf_arena {
    void *head; /* singly linked list of blocks */
} mf_arena;

/* Zeroed memory for count * size bytes (overflow checked); NULL + ctx->err
 * on failure. */
void *mf_arena_array(mf_ctx *ctx, mf_arena *a, size_t count, size_t size);
void mf_arena_release(mf_ctx *ctx, mf_arena *a);

/* Growable scratch outside the arena: make *p hold at least need elements
 * of size elem (capacity doubles from 64; contents kept when keep).  Free
 * with mf_free. */
int mf_grow(mf_ctx *ctx, void **p, size_t *cap, size_t need, size_t elem, int keep);
/* The capacity mf_grow would give *cap for need elements (no allocation);
 * (size_t)-1 when that would overflow. */
size_t mf_grow_cap(size_t cap, size_t need, size_t elem);

/* A growable buffer of T: data, len (elements in use, where the owner keeps
 * a count), cap (elements allocated).  Start zeroed; grown through mf_grow,
 * so through the ctx allocator, capacity doubling from 64 with overflow
 * checks.  MF_VEC_RESERVE(ctx, v, need, keep): at least need elements
 * (contents kept when keep), a status; MF_VEC_CAP_FOR(v, need): the
 * capacity that would give, without allocating ((size_t)-1 on overflow);
 * MF_VEC_FREE(ctx, v): release and zero. */
#define MF_VEC(T)                                                                                       \
    struct {                                                                                            \
        T *data;                                                                                        \
        size_t len, cap;                                                                                \
    }
#define MF_VEC_RESERVE(ctx, v, need, keep)                                                             \
    mf_grow((ctx), (void **)&(v).data, &(v).cap, (need), sizeof *(v).data, (keep))
#define MF_VEC_CAP_FOR(v, need) mf_grow_cap((v).cap, (need), sizeof *(v).data)
#define MF_VEC_FREE(ctx, v) (mf_free((ctx), (v).data), (v).data = NULL, (v).len = 0, (v).cap = 0)

/* NOTE [cancel] (mf_core.h): MF_ECANCEL with a message when ctx->cancel
 * asks to stop, else MF_OK. */
int mf_poll(mf_ctx *ctx);

/* ---- planning graph ---- */

typedef struct mf_pg {
    int32_t n;  /* ops */
    int32_t nv; /* values */
    int32_t ns; /* storages */
    int32_t *prod;   /* nv: producing op or -1 (graph input) */
    int32_t *sid;    /* nv: storage id or -1 */
    int64_t *sbytes; /* ns */
    int32_t *salloc; /* ns: allocating op */
    uint8_t *sout;   /* ns: some alias is a graph output */
    int32_t *oread_ptr, *oread; /* CSR n -> storages read */
    int32_t *oalloc_ptr, *oalloc;
    int32_t *otouch_ptr, *otouch;
    int32_t *sread_ptr, *sread; /* CSR ns -> reading ops */
    int32_t *pred_ptr, *pred;
    int32_t *succ_ptr, *succ;
    int64_t *abytes; /* n: bytes of storages allocated by the op */
    int64_t *oplb;   /* n: bytes of distinct storages read or allocated */
    uint8_t *fusible; /* n: 0, or 1 (fusible); MF_FUSIBLE_STORED is folded into smat */
    uint8_t *smat;    /* ns: stored even as an inner value of a group (NOTE [stored inner values]) */
    uint8_t *pointwise; /* n: given as MF_FUSIBLE_POINTWISE (NOTE [stored heads]) */
    uint8_t *sdon;    /* ns: may be donated to the group reading it last (mf_credit.c NOTE [donated inputs]) */
    int32_t *dread_ptr, *dread_s, *dread_v; /* CSR n -> (storage, value) reads of those: the value, or -1 for the root */
    int32_t *scls;    /* ns: size class, equal for equal sbytes (0 .. ncls - 1) */
    int64_t *cbytes;  /* ncls: the bytes of each class */
    int32_t ncls;
    int32_t *epi;     /* n: epilogue_of, or -1 (mf_core.h) */
    int64_t outbytes; /* bytes of all output storages */
} mf_pg;

/* Build the planning graph in arena a.  The desc must be valid
 * (mf_graph_check).  Returns a status. */
int mf_pg_build(mf_ctx *ctx, mf_arena *a, const mf_graph_desc *g, mf_pg *pg);

/* Dependency edges of a desc (dataflow + ordering + view edges), distinct,
 * as CSR of predecessors.  prod: producer per value (-1 for none).  Values
 * and op ids must be in range; self edges are dropped. */
int mf_build_preds(mf_ctx *ctx, mf_arena *a, const mf_graph_desc *g, const int32_t *prod,
                   int32_t **ptr_out, int32_t **idx_out);

/* Is order (n ops) a permutation respecting pg's edges?  scratch: n int32. */
int mf_pg_order_valid(const mf_pg *pg, const int32_t *order, int32_t *scratch);

/* ---- heuristic orders (mf_heur.c) and cut points (mf_cuts.c) ---- */

/* Indexed binary heap of ops keyed by (k1[op], k2[op], op id), least first. */
typedef struct mf_iheap {
    int32_t *h;  /* heap of op ids */
    int32_t *at; /* op -> index in h, or -1 */
    int32_t size;
    int64_t *k1, *k2;
} mf_iheap;

/* Scratch of the heuristic orders, sized for pg by mf_heur_ws_init. */
typedef struct mf_heur_ws {
    int32_t *indeg, *rc, *stack;
    uint8_t *sched;
    mf_iheap q;
} mf_heur_ws;

void mf_ih_push(mf_iheap *q, int32_t v);
int32_t mf_ih_pop(mf_iheap *q);
int mf_heur_ws_init(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, mf_heur_ws *w);
/* NOTE [greedy list scheduler] (variant 0: least net live change, 1: least
 * bytes allocated) and the depth-first order; each writes n op ids. */
void mf_greedy_order(const mf_pg *pg, mf_heur_ws *w, int variant, int32_t *order);
void mf_dfs_order(const mf_pg *pg, mf_heur_ws *w, int32_t *order);
/* NOTE [cut points]: pieces of the topological order T (piece_of[op]; kind[op]:
 * 0 regular, 1 floating, 2 trailing, 3 absorbed sink), their count in
 * *n_pieces. */
int mf_find_pieces(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, const int32_t *T, int32_t *piece_of,
                   uint8_t *kind, int32_t *n_pieces);

/* ---- orders (mf_order.c) ---- */
/* MF_OK when order is a permutation keeping every edge of pg, else MF_EINVAL
 * naming the first problem (what: the argument's name in the message). */
int mf_pg_order_check(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, const int32_t *order, const char *what);
/* The baseline order (NOTE [baseline order]): 0..n-1 made valid by a stable
 * topological sort, into order (n entries). */
int mf_baseline_order(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, int32_t *order);

/* General simulation (any permutation, optional groups): the cost model of
 * mf_core.h.  scratch arrays allocated in arena a. */
int mf_pg_simulate(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, const int32_t *order,
                   const int32_t *group_ptr, int32_t n_groups, int64_t *peak_out,
                   int64_t *step_bytes, int64_t *live_after);
/* mf_sim.c NOTE [grouped bytes]: value bytes with those a grouping never stores zeroed. */
int mf_grouped_bytes(mf_ctx *ctx, const mf_graph_desc *g, const int32_t *order, const int32_t *group_ptr,
                     int32_t n_groups, int64_t *bytes);

/* ---- incremental tracker for valid orders (unfused steps) ----
 * rc[s] = readers of s not yet run; live = bytes live now.  Applying op v:
 * during = live + abytes[v]; then every storage v touches whose allocator has
 * run, that is not an output and has no reader left is freed.  Undo restores
 * rc (the caller restores live). */
typedef struct mf_tracker {
    const mf_pg *pg;
    int32_t *rc;   /* ns */
    uint8_t *done; /* n */
    int64_t live;
} mf_tracker;

int mf_tracker_init(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, mf_tracker *t);
int64_t mf_tracker_apply(mf_tracker *t, int32_t v); /* returns during */
void mf_tracker_undo(mf_tracker *t, int32_t v);
/* Unfused peak of a valid order from a fresh state (t is reset). */
int64_t mf_tracker_peak(mf_tracker *t, const int32_t *order, int32_t n);
void mf_tracker_reset(mf_tracker *t);

/* ---- fusion grouping (mf_fuse.c) ----
 * Given a valid order, the grouping with the least peak, then the fewest
 * groups; with allow > 0 the fewest groups whose peak is at most the larger
 * of the least and allow (NOTE [peak allowance]).  group_ptr: n + 1 entries
 * (caller allocated); *n_groups, *peak (the grouping's own). */
/* ---- reuse credit (mf_credit.c NOTE [reuse credit]) ---- */
int mf_credit_setup(mf_ctx *ctx, mf_arena *a, const mf_graph_desc *g, const int32_t *root, mf_pg *pg);

/* One group's sources and takers by size class, met one position at a time;
 * credit: the bytes the group counts once less.  Stamps start every group
 * afresh without clearing. */
typedef struct mf_credit {
    const mf_pg *pg;
    int32_t *cstamp, *chead; /* ncls: the class has a source in this group; the head is among them */
    int32_t *tcstamp;        /* ncls: its taker counts below are this group's */
    int32_t *cn, *cnp;       /* ncls: its takers; those that are not stored */
    int32_t *cl, *clp;       /* ncls: those met after a source of the class (late); of them the unstored ones */
    int32_t *cd;             /* ncls: of them, those computed from a donated source (direct) */
    int32_t *ch;             /* ncls: late unstored ones made after every pointwise reader of the head */
    int32_t *dstamp;         /* ncls: a donated source of the class is in this group */
    int32_t *tstamp;         /* ns: counted as a taker in this group */
    int32_t *sreg, *scarry;  /* ns: a donated source in this group; made from one through unstored values */
    uint8_t *tlate;          /* ns: ... as a late one (bit 0), a direct one (bit 1) */
    uint64_t *smask;         /* ns: pointwise readers of donated inputs among its makers (one bit each) */
    uint64_t *xmask;         /* ns: a donated input's pointwise readers in the group */
    int32_t *mstamp, *xstamp; /* ns: smask, xmask are this group's */
    int32_t *cfirst, *snext; /* ncls, ns: the class's donated sources (valid where dstamp is), a list */
    int32_t *instamp, *inval, *inconf; /* ns: a donated input's value the group reads from outside; a second one */
    const int32_t *pos;      /* n: each op's position in the order the caller walks */
    int32_t gstart, hs;      /* the group's first position; its head storage, or -1 */
    int nbits;               /* reader bits given out in this group */
    int carry;               /* the op met now computes from a donated source (mf_credit_op) */
    int32_t stamp;
    int64_t credit;
} mf_credit;

int mf_credit_init(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, mf_credit *cr);
void mf_credit_begin(mf_credit *cr, int32_t gstart, int32_t hs);
/* Op u, met before its position's sources: the values of donated inputs it reads from outside the group. */
void mf_credit_inputs(mf_credit *cr, int32_t u);
void mf_credit_source(mf_credit *cr, int32_t s, int head);
void mf_credit_taker(mf_credit *cr, int32_t s);
void mf_credit_drop(mf_credit *cr, int32_t s);
/* Op u, met after its position's sources and before its takers: does it compute from a donated
 * source, directly or through values of the group no extern call stores? */
void mf_credit_op(mf_credit *cr, int32_t u);
/* The head storage of op u (NOTE [stored heads], mf_fuse.c), or -1. */
int32_t mf_credit_head(const mf_pg *pg, int32_t u);
/* May s, allocated at position p of order, take a source's buffer (hs: the group's head, or -1)? */
int mf_credit_is_taker(const mf_pg *pg, const int32_t *order, int32_t p, int32_t s, int32_t hs);
/* The credit of the fused group at positions [i, j) of order; apos / lastpos: each storage's
 * allocating and last reading position (-1: unread). */
int64_t mf_group_credit(mf_credit *cr, const int32_t *order, const int32_t *apos, const int32_t *lastpos, int32_t i,
                        int32_t j);

int mf_fuse_group(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, const int32_t *order, int fuse, int64_t allow,
                  int32_t *group_ptr, int32_t *n_groups, int64_t *peak);
/* The kind of each of the n_groups groups of a valid order (mf_core.h NOTE
 * [group kinds]) into kinds[0..n_groups). */
void mf_fuse_kinds(const mf_pg *pg, const int32_t *order, const int32_t *group_ptr, int32_t n_groups,
                   uint8_t *kinds);

#define MF_FUSE_MAX_GROUP 512

/* Fusion-aware moves (NOTE [fusion-aware moves] in mf_fuse.c): single-op
 * moves of the valid order `order` near the groups at the peak that lower
 * the fused peak.  order is rewritten only when the peak falls; *moves is
 * then the number of moves kept (else 0). */
int mf_fuse_refine(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, int64_t max_positions, int32_t *order,
                   int32_t *moves);

/* Coarse orders (NOTE [coarse orders] in mf_coarse.c): g's order planned with
 * its fusible chains contracted, into order_out (n_ops entries); *found is 0
 * when none is given (nothing to contract, a cycle, op ids not in
 * topological order).  The contracted plan creates at most max_states DP
 * states, added to *states. */
int mf_coarse_order(mf_ctx *ctx, mf_arena *a, const mf_graph_desc *g, int64_t max_states, int64_t *states,
                    int32_t *order_out, int *found);

/* Hoists (NOTE [hoists] in mf_hoist.c): on the valid order `order`, move a
 * storage's last reader, with its ancestors after the peak step, to just
 * before that step, while the unfused (peak, steps at the peak) falls.
 * order is rewritten in place; *moves is the number of hoists kept.  Nothing
 * runs when the order's peak is at most floor (a proven lower bound). */
int mf_hoist_refine(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, int64_t floor, int32_t *order, int32_t *moves);
/* Fused hoists (NOTE [fused hoists] in mf_hoist.c): moves of ops after the
 * first group at the fused peak to before it, each candidate regrouped;
 * order, group_ptr (n + 1 entries), *n_groups and *peak are rewritten where
 * the fused peak falls, with the unfused peak kept at most unfused_cap;
 * *moves counts the moves kept. */
int mf_hoist_fused(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, int fuse, int64_t unfused_cap, int32_t *order,
                   int32_t *group_ptr, int32_t *n_groups, int64_t *peak, int32_t *moves);

/* ---- Liu's hill/valley merging (mf_liu.c, NOTE [liu merge]) ----
 * Workspace built once per plan: per op and per storage of the graph, and
 * per local op of a piece of at most max_k ops, reused piece after piece. */
typedef struct mf_liu_ws {
    const mf_pg *pg;
    const int32_t *piece_of;
    int32_t *lmap;                    /* n: local index in the current piece, or -1 */
    int32_t *lastp, *nlast, *onelast; /* ns: last piece reading it, its readers there, one of them */
    int32_t *sstamp;                  /* ns: visited in this call (== stamp) */
    /* indexed by local op (max_k) */
    int32_t *parent, *nsucc, *npred;
    int32_t *gfirst, *glast, *gnext, *grank; /* glued side sinks, in order */
    int32_t *hroot, *onext, *ppos;    /* children's merged heap; next op of a segment; position in prev */
    int32_t *sl, *sr, *snpl, *shead, *stail; /* segments (leftist heap nodes) */
    int64_t *frees, *sdh, *sdv;
    uint8_t *role;                    /* in the forest, glued side sink, in the head */
    int32_t nseg, stamp, max_k;
} mf_liu_ws;

int mf_liu_init(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, const int32_t *piece_of, int32_t max_k,
                mf_liu_ws *w);
/* Order the k ops of piece `piece` (ops: the piece's ops in a valid order)
 * by Liu's rule into out (k entries).  prev (may be NULL): an order of the
 * same ops; a storage from before the piece that several of its ops read is
 * then counted as freed by the one prev runs last (else never).
 * *applied = 0 when the piece is all head (NOTE [liu merge]) or k < 3;
 * out is then not an order (it may be partly written): ignore it.
 * k <= max_k. */
int mf_liu_order(mf_ctx *ctx, mf_liu_ws *w, const int32_t *ops, int32_t k, int32_t piece,
                 const int32_t *prev, int32_t *out, int *applied);

/* ---- collective-aware placement (mf_comm.c, NOTE [collective overlap]) ----
 * On a valid planned schedule (order, group_ptr with n_groups groups, peaks
 * with and without groups), issue collectives earlier and waits later within
 * the bound that neither peak rises.  order/group_ptr (same group count) and
 * the peaks are rewritten when *moves > 0.  comm may be NULL (no-op). */
int mf_comm_place(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, const uint8_t *comm, int32_t *order,
                  int32_t *group_ptr, int32_t n_groups, int64_t *peak_fused, int64_t *peak_unfused,
                  int32_t *moves);

/* ---- recomputation (NOTE [recomputation], mf_remat.c) ----
 * mf_remat_graph.c holds the graphs the search works on and the move itself
 * (a split's copies inserted); mf_remat.c the scoring and the search. */

/* A graph with its ops in order: op k runs k-th.  origin / vorigin: the op
 * and value of the caller's graph each one is or copies. */
typedef struct mf_wgraph {
    int32_t n, nv, n_after;
    int32_t *in_ptr, *in_idx, *out_ptr, *out_idx, *after;
    int64_t *bytes;
    int32_t *alias_of, *epi, *origin, *vorigin;
    uint8_t *is_input, *is_output, *fusible, *comm, *cheap, *don;
    mf_arena arena;
} mf_wgraph;

/* One split of storage root r at its k-th reader; chain (n_chain roots, NULL when none) are
 * roots the copy recomputes along with r (mf_remat.c NOTE [chain splits]). */
typedef struct mf_split {
    int32_t r, k;
    int64_t bytes;
    const int32_t *chain;
    int32_t n_chain;
} mf_split;

/* Per storage root: its producer and its readers (not views of it), in order. */
typedef struct mf_roots {
    int32_t *prod;        /* nv: producing op or -1 */
    int32_t *root;        /* nv: alias root */
    int32_t *rd_ptr, *rd; /* nv + 1 CSR over roots: reading ops, ascending */
    uint8_t *ok;          /* nv: eligible root */
    uint8_t *cp;          /* nv: may be copied along a chain (eligible but for the two readers) */
    int32_t *last;        /* nv: last op reading the root's storage (any alias, views too), -1 */
    int32_t *last_other;  /* nv: last op reading it that is not in rd (an op making a view), -1 */
} mf_roots;

void mf_wg_free(mf_ctx *ctx, mf_wgraph *w);
/* The caller's graph g with its ops in `order`, renumbered 0..n-1. */
int mf_wg_from_desc(mf_ctx *ctx, const mf_graph_desc *g, const uint8_t *cheap, const int32_t *order,
                    mf_wgraph *w);
/* w's arrays (not copies) as the result's graph fields. */
void mf_wg_result(const mf_wgraph *w, mf_remat_result *r);
int mf_roots_build(mf_ctx *ctx, mf_arena *a, const mf_wgraph *w, mf_roots *R);
/* src with the splits' copies inserted, into out (a fresh graph). */
int mf_apply_splits(mf_ctx *ctx, const mf_wgraph *src, const mf_roots *R, const mf_split *sp, int32_t n_sp,
                    mf_wgraph *out);
/* The index among R's readers of root r of its first reader after position s, -1 when none. */
int32_t mf_first_reader_after(const mf_roots *R, int32_t r, int32_t s);
/* NOTE [focused splits] (mf_remat_focus.c): with opt->focus_hi > focus_lo, the focus_pick-th
 * largest eligible value made before focus_hi and read before and after it is split at its first
 * reader after it, within budget (*used, *n_used updated; nothing when there is none). */
int mf_focused_split(mf_ctx *ctx, mf_wgraph *cur, const mf_remat_options *opt, int64_t budget, int64_t *used,
                     int32_t *n_used);
/* NOTE [region fission] (mf_remat_fission.c): with opt->fission and focus_hi > focus_lo, the group
 * [focus_lo, focus_hi) cut in two around the focus_pick-th largest storage an unfusible op before it
 * makes for it alone: the values both halves read copied into the second, ordering edges for what
 * frees the first half's results before that op (*used, *n_used, *n_edges updated; nothing when it
 * does not apply or the budget is short). */
int mf_region_fission(mf_ctx *ctx, mf_wgraph *cur, const mf_remat_options *opt, int64_t budget, int64_t *used,
                      int32_t *n_used, int32_t *n_edges);
/* A view chain deeper than this (value, its base, ...) is an error of the move. */
#define MF_REMAT_MAX_CHAIN 64

#endif /* MF_INTERNAL_H */
