/*
 * mf_core.h -- public interface of the thunder_memfuse C core.
 *
 * The core plans the order and fusion grouping of a dataflow graph so that the
 * peak of live bytes is minimal (docs/ARCHITECTURE.md).
 * Pure C99: no CPython API, no CUDA.  Every function returns an int status
 * (MF_OK == 0) and writes results through out-parameters; on failure the
 * message is in ctx->err.  All memory goes through ctx->alloc, so tests can
 * fail the Nth allocation and check that every path cleans up.
 *
 * NOTE [cost model]  (the one simulator that scores every decision)
 *  - A value's storage is that of its alias root (follow alias_of to -1).
 *  - Storage of a graph input (root is_input) is never counted nor freed.
 *  - Storage is allocated by the op producing its root value and freed right
 *    after the last op (in schedule order) that reads any alias of it, unless
 *    some alias is a graph output (then it lives to the end).  Storage that
 *    nobody reads is freed right after the op producing it.
 *  - Unfused op k: during = live_before + bytes of storages k allocates.
 *  - Fused group G: during = live_before + bytes of storages allocated in G
 *    that are read (through any alias) by an op outside G or are graph
 *    outputs.  Storages produced and consumed only inside G are never
 *    materialized.  Frees happen after the whole group.  Less the group's
 *    reuse credit: a size whose dying buffer (its stored head's, a
 *    donatable input's) one pointwise result takes counts once
 *    (mf_credit.c NOTE [reuse credit]).
 *  - peak = max over steps of during (memory before the first step is 0).
 */
#ifndef MF_CORE_H
#define MF_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    MF_OK = 0,
    MF_ENOMEM = 1,   /* an allocation failed */
    MF_EINVAL = 2,   /* bad graph (message names the problem) */
    MF_ECYCLE = 3,   /* the dataflow plus ordering edges have a cycle */
    MF_EINTERNAL = 4,
    MF_ECANCEL = 5   /* ctx->cancel asked to stop (NOTE [cancel]) */
};

typedef struct mf_allocator {
    void *(*alloc)(void *ud, size_t nbytes);   /* NULL on failure */
    void (*free)(void *ud, void *ptr);          /* ptr may be NULL */
    void *ud;
} mf_allocator;

#define MF_ERR_LEN 512

/* NOTE [cancel]: a long call (mf_plan) polls ctx->cancel (when set) from
 * its loops: at least every few milliseconds of work, so the caller decides
 * how often anything costly (a clock read, taking a lock) happens.  A
 * nonzero return stops the call with MF_ECANCEL; nothing is leaked and the
 * result is empty.  The callback must not call back into the core with the
 * same ctx.  mf_ctx_init leaves it NULL (never cancelled). */
typedef struct mf_ctx {
    mf_allocator alloc;       /* zeroed -> malloc/free */
    char err[MF_ERR_LEN];     /* message of the last failure */
    int (*cancel)(void *ud);  /* may be NULL; nonzero: stop */
    void *cancel_ud;
} mf_ctx;

void mf_ctx_init(mf_ctx *ctx, const mf_allocator *alloc /* may be NULL */);
void *mf_alloc(mf_ctx *ctx, size_t nbytes);   /* sets err on failure */
void *mf_calloc(mf_ctx *ctx, size_t n, size_t size);
void mf_free(mf_ctx *ctx, void *p);
/* Format the message into ctx->err (truncated to MF_ERR_LEN); returns status. */
#if defined(__GNUC__) || defined(__clang__)
#define MF_PRINTF_FMT(f, a) __attribute__((format(printf, f, a)))
#else
#define MF_PRINTF_FMT(f, a)
#endif
int mf_set_error(mf_ctx *ctx, int status, const char *fmt, ...) MF_PRINTF_FMT(3, 4);

/* A graph, described by flat arrays owned by the caller (not copied by
 * mf_graph_check; mf_plan copies what it needs). */
#define MF_FUSIBLE 1
#define MF_FUSIBLE_STORED 2
#define MF_FUSIBLE_POINTWISE 3

typedef struct mf_graph_desc {
    int32_t n_ops;
    int32_t n_values;
    const int32_t *in_ptr;      /* n_ops + 1 offsets into in_idx (CSR) */
    const int32_t *in_idx;      /* value ids read by each op (repeats allowed) */
    const int32_t *out_ptr;     /* n_ops + 1 offsets into out_idx */
    const int32_t *out_idx;     /* value ids written by each op */
    const int64_t *value_bytes; /* n_values, >= 0 (0 for non-tensors) */
    const int32_t *alias_of;    /* n_values: base value id or -1; may be NULL */
    const uint8_t *is_input;    /* n_values: graph input; may be NULL */
    const uint8_t *is_output;   /* n_values: graph output; may be NULL */
    /* n_ops; may be NULL (nothing fusible).  0: runs alone; MF_FUSIBLE: may
     * join a fused group, whose inner values are never stored; MF_FUSIBLE_STORED:
     * may join one, but as an extern call of the group's program (a GEMM in an
     * Inductor region) or a buffer the program writes whole (a scatter), so
     * every storage it reads or allocates is stored while
     * its group runs (NOTE [stored inner values], mf_fuse.c); it is never an
     * epilogue.  MF_FUSIBLE_POINTWISE: MF_FUSIBLE, and elementwise (each
     * output element from the same element of reads of its own shape), so its
     * output may take a dead extern result's buffer (NOTE [stored heads],
     * mf_fuse.c).  Other nonzero values mean MF_FUSIBLE. */
    const uint8_t *fusible;
    int32_t n_after;            /* ordering edges: op after[2i] runs before after[2i+1] */
    const int32_t *after;
    /* n_ops; may be NULL.  epilogue_of[v] = u (else -1): v may run fused
     * into u as its epilogue, a group of exactly [u, v] (u's kernel applies
     * v on its output as it writes it: a GEMM with a ReLU epilogue, say).
     * Such a group needs v right after u in the order and u's outputs read
     * by v alone, never graph outputs (NOTE [epilogue pairs], mf_fuse.c). */
    const int32_t *epilogue_of;
    /* n_ops; may be NULL (no communication).  comm[k] is MF_COMM_ISSUE for
     * an asynchronous collective (all_reduce, all_gather, ...: it starts the
     * communication and returns a future), MF_COMM_WAIT for the op that
     * waits on a future, else MF_COMM_NONE.  Such ops are never fused.  The
     * caller keeps the collectives in one sequence with `after` edges (every
     * rank must issue the same one); mf_plan then issues each as early and
     * waits as late as the graph and a memory bound allow (mf_comm.c NOTE
     * [collective overlap]). */
    const uint8_t *comm;
    /* n_values; may be NULL (none).  donatable[v] on a root: the storage
     * whose root is v may be written over by the fused group that reads it
     * last (the caller's compiler does so, and no one outside the graph holds
     * it: Inductor's donated buffers).  On a view: its elements keep the
     * storage's order (a reshape); a fused op reading a view not so marked,
     * or any op reading a view of other bytes, leaves the storage undonated
     * (mf_credit.c NOTE [donated inputs]). */
    const uint8_t *donatable;
} mf_graph_desc;

enum { MF_COMM_NONE = 0, MF_COMM_ISSUE = 1, MF_COMM_WAIT = 2 };
/* NOTE [byte sums]: every sum of bytes the core forms (live bytes, a step,
 * a peak, a hill minus a valley) is bounded by the total of the stored
 * values (alias roots that are not graph inputs), up to a small factor.
 * mf_graph_check rejects a graph whose total exceeds MF_MAX_TOTAL_BYTES, so
 * no sum can wrap in 64 bits: a size too large is an error naming
 * value_bytes, never a wrong peak. */
#define MF_MAX_TOTAL_BYTES (INT64_MAX / 4)

/* Validate: ids in range, each value produced by exactly one op or a graph
 * input (not both), sizes >= 0 and their total within MF_MAX_TOTAL_BYTES,
 * alias chains acyclic, no cycle through dataflow + after edges.
 * MF_EINVAL / MF_ECYCLE with a message. */
int mf_graph_check(mf_ctx *ctx, const mf_graph_desc *g);

/* Simulate a schedule.  order: n_ops op ids, a permutation that keeps every
 * dependency (dataflow, view and ordering edges; MF_EINVAL naming the first
 * violation otherwise); groups given by group_ptr (n_groups + 1 strictly
 * increasing offsets into order: no empty group; NULL means every op
 * alone).  step_bytes (n_groups entries, may be NULL) receives each
 * step's `during` memory, live_after (may be NULL) the live bytes after it. */
int mf_simulate(mf_ctx *ctx, const mf_graph_desc *g, const int32_t *order,
                const int32_t *group_ptr, int32_t n_groups,
                int64_t *peak_out, int64_t *step_bytes, int64_t *live_after);

/* Is order a permutation that respects dataflow and after edges?  *valid_out. */
int mf_check_order(mf_ctx *ctx, const mf_graph_desc *g, const int32_t *order,
                   int *valid_out);

typedef struct mf_plan_options {
    int64_t max_states;  /* cap on DP states; <= 0 means the default */
    int64_t max_dp_bytes; /* memory budget of the DP's tables (NOTE [DP memory
                           * budget], mf_sched.c); <= 0: MF_DEFAULT_DP_BYTES */
    int fuse;            /* 1: form fusion groups; 0: singletons only */
    int no_fusion_moves; /* 1: group the planned order as it is (no NOTE [fusion-aware moves]) */
    int32_t dp_max_ops;  /* pieces of up to this many ops get the DP's full
                          * share of states (mf_sched.c NOTE [DP piece size]);
                          * <= 0 or above the built-in 256: 256.  Tests lower
                          * it to reach the large-piece paths on small graphs. */
    int no_comm_overlap; /* 1: leave collectives and waits where the plan put them */
    int no_hoists;       /* 1: no NOTE [hoists] (mf_hoist.c) */
    int no_coarse;       /* 1: no NOTE [coarse orders] (mf_coarse.c) start for the fusion-aware moves */
    int64_t max_refine;  /* window positions the fusion-aware moves evaluate, each of the
                          * (up to three) times they run (mf_fuse.c NOTE [fusion-aware
                          * moves]); <= 0: MF_DEFAULT_REFINE_POSITIONS */
    int64_t peak_allowance; /* NOTE [peak allowance] (mf_fuse.c): a fused peak up to this many
                             * bytes costs nothing, so the grouping takes the fewest groups
                             * within it; <= 0: none */
} mf_plan_options;

#define MF_DEFAULT_MAX_STATES 200000
#define MF_DEFAULT_DP_BYTES ((int64_t)256 << 20)
#define MF_DEFAULT_REFINE_POSITIONS 300000

/* NOTE [group kinds]: what the planner made of each group, so that no
 * caller has to work it out again from the graph:
 *  MF_GROUP_SINGLE    one op, run as it is (NOTE [cost model]: unfused)
 *  MF_GROUP_REGION    a run of two or more fusible ops, one fused region
 *  MF_GROUP_EPILOGUE  [u, v] with epilogue_of[v] == u and every storage u
 *                     allocates read by the pair alone and no graph output
 *                     (NOTE [epilogue pairs], mf_fuse.c): one kernel, u's
 *                     result never written
 * A two-op group whose ops are both fusible and that also meets the pair's
 * rule is an epilogue pair: the simulator scores it by that rule, which is
 * never above the fused one.  Whether a single op runs through a compiler
 * as a region of its own (a cuBLAS GEMM) is the compiler's choice, not the
 * plan's (docs/ARCHITECTURE.md, "Group kinds").  X(id, name): name is the
 * binding's string for the kind. */
#define MF_GROUP_KINDS(X)                 \
    X(MF_GROUP_SINGLE, "single")          \
    X(MF_GROUP_REGION, "region")          \
    X(MF_GROUP_EPILOGUE, "epilogue")

#define MF_GROUP_KIND_ENUM_(id, name) id,
enum { MF_GROUP_KINDS(MF_GROUP_KIND_ENUM_) MF_GROUP_N_KINDS };
#undef MF_GROUP_KIND_ENUM_

typedef struct mf_plan_result {
    int32_t n_ops;
    int32_t *order;          /* n_ops op ids */
    int32_t n_groups;
    int32_t *group_ptr;      /* n_groups + 1 offsets into order */
    uint8_t *group_kind;     /* n_groups: MF_GROUP_* (NOTE [group kinds]) */
    int64_t peak_bytes;          /* order with groups */
    int64_t unfused_peak_bytes;  /* order, every op alone */
    int64_t baseline_peak_bytes; /* the baseline order, every op alone (below) */
    int64_t lower_bound_bytes;   /* no valid order can beat this */
    int optimal;             /* unfused order proven minimal over valid orders */
    int64_t states;          /* DP states explored (created, over all DP runs) */
    const char *method;      /* static string: "lower-bound", "dp", "greedy", ... */
    int32_t fusion_moves;    /* single-op moves kept for a lower fused peak (mf_fuse.c) */
    int32_t hoists;          /* hoists kept (mf_hoist.c NOTE [hoists]) */
    int32_t comm_moves;      /* collectives issued earlier / waits run later (mf_comm.c) */
} mf_plan_result;
/* method, in detail: "lower-bound" (optimal, proven without search), "dp"
 * (optimal, proven or found by the DP), "dp-partial" (improved by the DP,
 * not proven), otherwise the heuristic whose order was kept: "input",
 * "greedy", "greedy-peak", "dfs", "pieces" (per piece the best of them), or
 * "liu" (Liu's hill/valley merging of parallel chains kept for at least one
 * piece, mf_liu.c).
 * Orders respect NOTE [view order] (csrc/core/mf_graph.c): the producer of a
 * view runs after the producer of its base. */

/* Plan: the order with the least unfused peak (the input order 0..n-1 is
 * always a candidate when it is valid, so the result is never worse), then
 * fusion grouping on that order: the least peak over groupings (runs of
 * consecutive fusible ops, and epilogue pairs; fusing can lower the peak because inner values are
 * never materialized, and can raise it because inputs stay alive until the
 * whole kernel ends), and among groupings at that peak the fewest groups.
 * With fusion on, single-op moves near the peak that lower the fused peak
 * follow (NOTE [fusion-aware moves] in mf_fuse.c; fusion_moves > 0 when some
 * were kept): the order's unfused peak may then rise; `optimal` describes the
 * order as returned, unfused, and `method` the rung that planned it before
 * the moves.  Always peak_bytes <=
 * unfused_peak_bytes, and peak_bytes <= the fused peak of the planned order, but
 * with opt->peak_allowance (NOTE [peak allowance], mf_fuse.c): then the fewest
 * groups whose peak is at most max(that fused peak, the allowance), which may
 * be above the unfused peak, and no fusion-aware moves or fused hoists where the
 * allowance binds.  baseline_peak_bytes is the peak of
 * the baseline order: the input order made valid by a stable topological
 * sort (NOTE [baseline order], mf_order.c), which is 0..n-1 itself whenever
 * that is valid; it is a candidate, so unfused_peak_bytes never exceeds it
 * without fusion moves.  With g->comm (and not
 * opt->no_comm_overlap), collectives and waits are then placed for overlap
 * (mf_comm.c NOTE [collective overlap]; comm_moves > 0 when some moved),
 * never raising either peak.  Cancelled (NOTE [cancel]): MF_ECANCEL.  Free the result with
 * mf_plan_result_free (also safe on a zeroed result). */
int mf_plan(mf_ctx *ctx, const mf_graph_desc *g, const mf_plan_options *opt,
            mf_plan_result *out);
void mf_plan_result_free(mf_ctx *ctx, mf_plan_result *r);

/* NOTE [recomputation] (mf_remat.c): copies of cheap ops run again right
 * before later readers, so what they produce need not stay alive in between.
 * cheap[k] (n_ops): op k may be copied (the caller vouches that a copy
 * computes the same values wherever it runs).  order: a valid order of g
 * (the plan's).  budget_bytes: the most the copies may write in all (<= 0: no
 * copies).  The result is g with the copies, its ops renumbered so that the
 * searched order is 0..n_ops-1: origin[k] is the op of g that op k is or
 * copies, value_origin[v] the value of g that v is or copies (values of g
 * keep their ids; new ones follow).  peak_bytes is the unfused peak of that
 * order, start_peak_bytes the same for `order` on g.  n_splits == 0 (and
 * n_edges == 0): no copy helped.  Free with mf_remat_result_free. */
typedef struct mf_remat_options {
    int64_t budget_bytes;
    int32_t max_rounds;  /* greedy rounds; <= 0: the default */
    /* NOTE [focused splits] (mf_remat_focus.c): with focus_hi > focus_lo (positions
     * in order: the group at a plan's fused peak), no search: the pick-th
     * largest eligible value made before focus_hi and read both before and
     * after it is split at its first reader after it (n_splits 0: none). */
    int32_t focus_lo, focus_hi, focus_pick;
    /* NOTE [region fission] (mf_remat_fission.c): with a focus, the group cut in two around the
     * pick-th largest storage an unfusible op before it makes for it alone, instead of a split */
    int fission;
} mf_remat_options;

typedef struct mf_remat_result {
    int32_t n_ops, n_values, n_after;
    int32_t *in_ptr, *in_idx, *out_ptr, *out_idx, *after;
    int64_t *value_bytes;
    int32_t *alias_of, *epilogue_of, *origin, *value_origin;
    uint8_t *is_input, *is_output, *fusible, *comm, *donatable;
    int32_t n_splits;        /* copies made (one per split; views copied with them not counted) */
    int32_t n_edges;         /* ordering edges added (NOTE [region fission]) */
    int64_t copied_bytes;    /* bytes the split copies write */
    int64_t peak_bytes, start_peak_bytes;
    void *arena_;            /* owns every array above */
} mf_remat_result;

int mf_recompute(mf_ctx *ctx, const mf_graph_desc *g, const uint8_t *cheap, const int32_t *order,
                 const mf_remat_options *opt, mf_remat_result *out);
void mf_remat_result_free(mf_ctx *ctx, mf_remat_result *r);
/* The result as a graph description (its arrays, not copies). */
void mf_remat_result_desc(const mf_remat_result *r, mf_graph_desc *d);

/* mf_pipeline.c NOTE [planning pipeline]: one trace's planning, whole: the
 * planner from labelled starts, recomputation's searches and focused splits
 * (cheap and recompute_budget as mf_recompute takes them; NULL or <= 0: none,
 * one mf_plan), under one budget of work (NOTE [work budget]). */
typedef struct mf_pipeline_options {
    mf_plan_options plan;
    const uint8_t *cheap;      /* n_ops flags, or NULL */
    int64_t recompute_budget;  /* bytes the copies may write in all */
    int32_t passes;            /* searches per start; <= 0: the default (3) */
    int64_t max_work;          /* work units; <= 0: the default, in proportion to the graph */
    int64_t peak_target;       /* bytes; > 0: the plan with the fewest copied bytes whose fused peak is at
                                * most this (NOTE [peak target]); <= 0: the lowest plan */
} mf_pipeline_options;

#define MF_PIPELINE_WORK_FLOOR ((int64_t)MF_DEFAULT_MAX_STATES * 8)
#define MF_PIPELINE_WORK_PER_OP ((int64_t)1000)
#define MF_PIPELINE_MAX_STEPS 16
/* a search's copies; a focused split's; a search's found on the plan's regions (mf_pipeline.c NOTE
 * [searches on regions]); a region cut in two (mf_remat_fission.c NOTE [region fission]) */
enum { MF_STEP_SEARCH = 0, MF_STEP_FOCUSED = 1, MF_STEP_REGIONS = 2, MF_STEP_FISSION = 3 };

typedef struct mf_pipeline_step {
    uint8_t kind;                   /* MF_STEP_* */
    int32_t splits;                 /* copies the step made */
    int64_t copied_bytes;           /* bytes they write */
    int64_t peak_before, peak_after; /* the planned (fused) peak before and after it */
} mf_pipeline_step;

typedef struct mf_pipeline_result {
    mf_plan_result plan;       /* of g, or of copies' graph where has_copies */
    int has_copies;
    /* the graph with copies, as mf_recompute returns it, its origins and value
     * origins in terms of g and n_splits / copied_bytes summed over the kept
     * steps; start_peak_bytes the first step's, peak_bytes the last's */
    mf_remat_result copies;
    int64_t first_peak_bytes;           /* the first plan of g (no copies) */
    int64_t first_baseline_peak_bytes;
    const char *start;                  /* static label of the winning start */
    int32_t n_steps;                    /* the winner's kept steps, in order (at most MAX_STEPS kept) */
    mf_pipeline_step steps[MF_PIPELINE_MAX_STEPS];
    int32_t n_plans;                    /* planner calls */
    int64_t work, max_work;             /* work units spent, and the budget */
    int budget_hit;                     /* a start or pass was skipped for want of work */
    int fits;                           /* peak_target > 0 and the plan's fused peak is at most it */
} mf_pipeline_result;

int mf_plan_pipeline(mf_ctx *ctx, const mf_graph_desc *g, const mf_pipeline_options *opt, mf_pipeline_result *out);
void mf_pipeline_result_free(mf_ctx *ctx, mf_pipeline_result *r);

/* mf_flow.c NOTE [min cut]: a maximum flow from s to t over m directed edges
 * (src[i] -> dst[i], capacity cap[i] >= 0, or MF_FLOW_INF); sink_side[v] (n
 * bytes, written) is 1 for the nodes that reach t in the residual graph: the
 * minimum cut closest to the sink, the same for every maximum flow.  *flow_out
 * (may be NULL) the flow's value.  MF_EINVAL with a message for bad edges or
 * where an infinite-capacity path joins s and t. */
#define MF_FLOW_INF (-1)
int mf_min_cut(mf_ctx *ctx, int32_t n, int32_t m, const int32_t *src, const int32_t *dst, const int64_t *cap,
               int32_t s, int32_t t, int64_t *flow_out, uint8_t *sink_side);

#ifdef __cplusplus
}
#endif
#endif /* MF_CORE_H */
