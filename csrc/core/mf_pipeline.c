/*
 * mf_pipeline.c -- one trace's planning, whole: the planner (mf_sched.c's
 * ladder, with coarse orders, hoists and fusion-aware moves) from several
 * labelled starts, the recomputation search and its passes (mf_remat.c), the
 * focused splits (mf_remat_focus.c), scored by the one simulator and bounded
 * by one budget of work (NOTE [planning pipeline]).
 *
 * NOTE [planning pipeline]
 * mf_plan_pipeline plans graph g.  Without recomputation (no cheap ops or no
 * budget) that is one mf_plan.  With it, a candidate is a plan of g or of g
 * with copies; the passes on a candidate (NOTE [recomputation passes]) run the
 * search on its plan's order (where it keeps nothing, once more on the bytes
 * the plan's regions store: NOTE [searches on regions]), plan the graph with
 * the copies again and keep the result where its fused peak is lower, up to
 * `passes` times, and then,
 * where regions are formed, up to MF_FOCUS_PASSES focused passes (NOTE
 * [focused splits]).  The starts, each a candidate the passes run from:
 *   "plan"                 g planned with every option on;
 *   "no hoists"            where the first plan kept hoists (mf_hoist.c), g
 *                          planned without them: the search from another
 *                          order ends elsewhere;
 *   "no donations"         where g marks donatable storages and no peak
 *                          target is set, g planned without them (NOTE
 *                          [reuse credit], mf_credit.c), every pass with
 *                          them, kept only where a pass kept copies (the
 *                          first plan's peak is not g's): which buffers a
 *                          group's results may take changes the first
 *                          order, and so the copies the searches find;
 *   "no coarse orders"     where regions are formed, g planned without coarse
 *                          orders (mf_coarse.c), every pass without them too,
 *                          focused ones included, the result planned once more
 *                          with them;
 *   "no coarse orders, passes with them": the same start, each pass's copies
 *                          planned with coarse orders.
 * A coarse order changes each pass's order and so the copies later searches
 * find; on the checkpointed workloads of benchmarks/ each of the last two is
 * the lowest somewhere, and "no donations" on a checkpointed pre-LN step.
 * The lowest candidate wins (the earlier start on a tie), and the focused
 * passes then run on the winner alone (the other starts
 * would try the same group at the fused peak again).  The result names the
 * winning start and each pass it kept (what kind, the copies it made, the peak
 * before and after), so a report can say why a value was recomputed.
 *
 * NOTE [work budget]  Every planner call and search costs work units: the
 * graph's ops, plus the DP states the planner created.  They are counted over
 * the whole pipeline, so a plan does not depend on the machine or its load;
 * once the total passes max_work, no further start or pass begins (the best
 * candidate so far is the plan, and the result says the budget ran out).
 * The default is MF_PIPELINE_WORK_PER_OP units per op of g plus a floor of
 * MF_PIPELINE_WORK_FLOOR: a budget in proportion to the trace, so a larger
 * model gets proportionally more search, never a cliff.
 *
 * NOTE [peak target]  With a peak target (bytes, > 0) the pipeline wants the
 * plan with the least extra work that fits: the fewest bytes written by copies
 * among the candidates whose fused peak is at most the target.  Each start's
 * passes stop at the first plan that fits (a later pass only adds copies),
 * and a candidate that fits beats one that does not; two that fit are ranked
 * by copied bytes, then peak; two that do not, by peak (as without a target).
 * The "no coarse orders" start ends with its plan planned again with coarse
 * orders, so its passes stop where that plan would fit.  Where nothing fits
 * the result is the lowest plan, the one without a target.
 * So a smaller target never gives a higher plan: as the target falls, the
 * first fitting plan of a start only moves later in its chain, to a plan that
 * fits the smaller target, and one that fits both is ranked the same among
 * fewer rivals.  (That holds while the work budget is not hit: a start cut
 * short for want of work ends elsewhere.)  The first plan, no copies, wins
 * outright where it fits.
 */
#include "mf_internal.h"

#include <string.h>

#define MF_RECOMPUTE_PASSES 3
/* NOTE [focused splits] here: where regions are formed, once the searches
 * keep nothing, the plan's first group at the fused peak offers the
 * MF_FOCUS_TRIES largest focused splits, one graph each, and then as many
 * region fissions (mf_remat_fission.c NOTE [region fission]).  A try only ranks a
 * candidate, so each is planned with 1/MF_FOCUS_STATE_SHARE of the plan's
 * search budgets: its DP states (NOTE [state budget]: the short windows and
 * pieces find the same orders on these graphs; what differs is the long
 * windows' last few bytes) and its fusion-aware moves' window positions
 * (mf_plan_options.max_refine); the lowest below the current plan is planned
 * again with the full budgets and the lower of its two plans kept.  At most
 * MF_FOCUS_PASSES such passes, each from the plan the last one kept. */
#define MF_FOCUS_TRIES 4
#define MF_FOCUS_PASSES 3
#define MF_FOCUS_STATE_SHARE 10

typedef struct cand {
    mf_plan_result plan;
    int has_copies;
    mf_remat_result r;  /* the graph with copies; origins in terms of the pipeline's g */
    const char *start;
    uint8_t kind;       /* MF_STEP_* of the step that made it (pass_step) */
    int32_t n_steps;
    mf_pipeline_step steps[MF_PIPELINE_MAX_STEPS];
} cand;

typedef struct pipe {
    mf_ctx *ctx;
    const mf_graph_desc *g;
    const uint8_t *cheap;
    int64_t work, max_work, target;
    int32_t n_plans;
    int budget_hit;
} pipe;

static void cand_clear(pipe *p, cand *c)
{
    mf_plan_result_free(p->ctx, &c->plan);
    if (c->has_copies)
        mf_remat_result_free(p->ctx, &c->r);
    memset(c, 0, sizeof *c);
}

static void cand_graph(const pipe *p, const cand *c, mf_graph_desc *d)
{
    if (c->has_copies)
        mf_remat_result_desc(&c->r, d);
    else
        *d = *p->g;
}

static int64_t copied(const cand *c)
{
    return c->has_copies ? c->r.copied_bytes : 0;
}

/* NOTE [peak target]: does c's plan fit the target? */
static int fits(const pipe *p, const cand *c)
{
    return p->target > 0 && c->plan.peak_bytes <= p->target;
}

static int out_of_work(pipe *p)
{
    if (p->work < p->max_work)
        return 0;
    p->budget_hit = 1;
    return 1;
}

static int run_plan(pipe *p, const mf_graph_desc *d, const mf_plan_options *o, mf_plan_result *out)
{
    int st = mf_graph_check(p->ctx, d);
    memset(out, 0, sizeof *out);
    if (st == MF_OK)
        st = mf_plan(p->ctx, d, o, out);
    if (st != MF_OK) {
        mf_plan_result_free(p->ctx, out);
        return st;
    }
    p->n_plans++;
    p->work += (int64_t)d->n_ops + out->states;
    return MF_OK;
}

static int plan_copy(mf_ctx *ctx, const mf_plan_result *src, mf_plan_result *dst)
{
    *dst = *src;
    dst->order = mf_alloc(ctx, sizeof(int32_t) * ((size_t)src->n_ops + 1));
    dst->group_ptr = mf_alloc(ctx, sizeof(int32_t) * ((size_t)src->n_groups + 1));
    dst->group_kind = mf_alloc(ctx, (size_t)src->n_groups + 1);
    if (!dst->order || !dst->group_ptr || !dst->group_kind) {
        mf_plan_result_free(ctx, dst);
        return MF_ENOMEM;
    }
    memcpy(dst->order, src->order, sizeof(int32_t) * (size_t)src->n_ops);
    memcpy(dst->group_ptr, src->group_ptr, sizeof(int32_t) * ((size_t)src->n_groups + 1));
    memcpy(dst->group_kind, src->group_kind, (size_t)src->n_groups);
    return MF_OK;
}

/* cheap flags of c's ops: those of the ops of g they are or copy (NULL: g's own). */
static int cheap_of(pipe *p, const cand *c, uint8_t **own, const uint8_t **ch)
{
    int32_t k;
    *own = NULL;
    *ch = p->cheap;
    if (!c->has_copies)
        return MF_OK;
    if (!(*own = mf_alloc(p->ctx, (size_t)c->r.n_ops + 1)))
        return MF_ENOMEM;
    for (k = 0; k < c->r.n_ops; k++) {
        int32_t j = c->r.origin[k];
        if (j < 0 || j >= p->g->n_ops)
            return mf_set_error(p->ctx, MF_EINTERNAL, "recompute: a copy's origin is out of range");
        (*own)[k] = p->cheap[j];
    }
    *ch = *own;
    return MF_OK;
}

/* The unfused peaks of r's searched order on r's graph and of order on d (NOTE [cost model]). */
static int unfused_peaks(pipe *p, const mf_graph_desc *d, const int32_t *order, mf_remat_result *r)
{
    mf_graph_desc d2;
    int32_t *id, k;
    int st;
    if (!(id = mf_alloc(p->ctx, sizeof(int32_t) * ((size_t)r->n_ops + 1))))
        return MF_ENOMEM;
    for (k = 0; k < r->n_ops; k++)
        id[k] = k;
    mf_remat_result_desc(r, &d2);
    st = mf_simulate(p->ctx, &d2, id, NULL, 0, &r->peak_bytes, NULL, NULL);
    if (st == MF_OK)
        st = mf_simulate(p->ctx, d, order, NULL, 0, &r->start_peak_bytes, NULL, NULL);
    mf_free(p->ctx, id);
    return st;
}

/* NOTE [searches on regions]  The search scores splits by the unfused rule:
 * where a plan's regions keep most intermediates out of memory, its peak
 * step is not the fused peak, and it may find nothing that lowers the plan
 * (on the Llama-style plain step of benchmarks/real_sizes.py no pass kept
 * anything).  Where it keeps nothing, the search runs once more on d with
 * the bytes c's groups never store zeroed (mf_sim.c NOTE [grouped bytes]):
 * its steps then count what c's regions keep, and its peak step is at the
 * fused peak.  The copies' graph gets d's bytes back, its copied bytes are
 * counted with them (a result past the budget is dropped) and its unfused
 * peaks are scored again; it is kept, as any search's, only where its plan
 * is lower.  It follows the plain search rather than replacing it: on the
 * checkpointed pre-LN step the plain search's copies give the lower plan. */
static int search_on_regions(pipe *p, const mf_graph_desc *d, const cand *c, const uint8_t *ch,
                             const mf_remat_options *ro, mf_remat_result *r)
{
    mf_graph_desc dz = *d;
    int64_t *vb, cb = 0;
    int32_t k;
    int st;
    memset(r, 0, sizeof *r);
    if (!(vb = mf_alloc(p->ctx, sizeof(int64_t) * ((size_t)d->n_values + 1))))
        return MF_ENOMEM;
    st = mf_grouped_bytes(p->ctx, d, c->plan.order, c->plan.group_ptr, c->plan.n_groups, vb);
    dz.value_bytes = vb;
    if (st == MF_OK)
        st = mf_recompute(p->ctx, &dz, ch, c->plan.order, ro, r);
    mf_free(p->ctx, vb);
    p->work += d->n_ops;
    if (st != MF_OK || r->n_splits == 0)
        return st;
    for (k = 0; k < r->n_values; k++) {
        int32_t o = r->value_origin[k];
        if (o < 0 || o >= d->n_values)
            return mf_set_error(p->ctx, MF_EINTERNAL, "recompute: a copy's origin is out of range");
        r->value_bytes[k] = d->value_bytes[o];
        if (k >= d->n_values && r->alias_of[k] < 0) /* a copy's own storage; views write nothing */
            cb += r->value_bytes[k];
    }
    r->copied_bytes = cb;
    if (cb > ro->budget_bytes) {
        mf_remat_result_free(p->ctx, r);
        return MF_OK;
    }
    return unfused_peaks(p, d, c->plan.order, r);
}

/* One step on c: the search (focus NULL; NOTE [searches on regions]) or one
 * focused split, the copies' graph planned with o; *got 1 with *out set
 * where that plan's peak is lower (out's origins relative to c's graph),
 * else 0 with out empty. */
static int pass_step(pipe *p, const cand *c, const uint8_t *ch, int64_t budget, const mf_plan_options *o,
                     const int32_t *focus, cand *out, int *got)
{
    mf_graph_desc d, d2;
    mf_remat_options ro;
    int st, on_regions;
    *got = 0;
    memset(out, 0, sizeof *out);
    memset(&ro, 0, sizeof ro);
    ro.budget_bytes = budget;
    if (focus) {
        ro.focus_lo = focus[0];
        ro.focus_hi = focus[1];
        ro.focus_pick = focus[2];
        ro.fission = focus[3];
    }
    cand_graph(p, c, &d);
    for (on_regions = 0; on_regions < 2; on_regions++) {
        if (on_regions && (focus || !o->fuse))
            break;
        if (on_regions) {
            st = search_on_regions(p, &d, c, ch, &ro, &out->r);
        } else {
            st = mf_recompute(p->ctx, &d, ch, c->plan.order, &ro, &out->r);
            p->work += d.n_ops;
        }
        if (st != MF_OK || (out->r.n_splits == 0 && out->r.n_edges == 0)) {
            mf_remat_result_free(p->ctx, &out->r);
            if (st != MF_OK)
                return st;
            continue;
        }
        out->has_copies = 1;
        mf_remat_result_desc(&out->r, &d2);
        if ((st = run_plan(p, &d2, o, &out->plan)) != MF_OK || out->plan.peak_bytes >= c->plan.peak_bytes) {
            cand_clear(p, out);
            if (st != MF_OK)
                return st;
            continue;
        }
        out->kind = focus ? (focus[3] ? MF_STEP_FISSION : MF_STEP_FOCUSED)
                          : on_regions ? MF_STEP_REGIONS
                                       : MF_STEP_SEARCH;
        *got = 1;
        return MF_OK;
    }
    return MF_OK;
}

/* The group at the fused peak of c's plan: its positions [*lo, *hi) in the
 * order; *hi == *lo when it has no groups. */
static int fused_peak_group(pipe *p, const cand *c, int32_t *lo, int32_t *hi)
{
    mf_graph_desc d;
    int64_t *step, peak = 0;
    int32_t g;
    int st;
    *lo = *hi = 0;
    if (!(step = mf_alloc(p->ctx, sizeof(int64_t) * ((size_t)c->plan.n_groups + 1))))
        return MF_ENOMEM;
    cand_graph(p, c, &d);
    st = mf_simulate(p->ctx, &d, c->plan.order, c->plan.group_ptr, c->plan.n_groups, &peak, step, NULL);
    for (g = 0; st == MF_OK && g < c->plan.n_groups; g++)
        if (step[g] == peak) {
            *lo = c->plan.group_ptr[g];
            *hi = c->plan.group_ptr[g + 1];
            break;
        }
    mf_free(p->ctx, step);
    return st;
}

static int64_t focus_share(int64_t budget, int64_t dflt)
{
    int64_t q = (budget > 0 ? budget : dflt) / MF_FOCUS_STATE_SHARE;
    return q > 0 ? q : 1;
}

/* One focused pass on c: *got 1 with *out set (the best try, planned in full). */
static int focused_step(pipe *p, const cand *c, const uint8_t *ch, int64_t budget, const mf_plan_options *o,
                        cand *out, int *got)
{
    mf_plan_options quick = *o;
    mf_plan_result full;
    mf_graph_desc d;
    int32_t f[4];
    int st;
    *got = 0;
    memset(out, 0, sizeof *out);
    quick.max_states = focus_share(o->max_states, MF_DEFAULT_MAX_STATES);
    quick.max_refine = focus_share(o->max_refine, MF_DEFAULT_REFINE_POSITIONS);
    if ((st = fused_peak_group(p, c, &f[0], &f[1])) != MF_OK)
        return st;
    for (f[3] = 0, f[2] = 0; f[3] < 2 && f[1] > f[0]; f[2] = f[2] + 1 < MF_FOCUS_TRIES ? f[2] + 1 : (f[3]++, 0)) {
        cand t;
        int r;
        if ((st = pass_step(p, c, ch, budget, &quick, f, &t, &r)) != MF_OK) {
            cand_clear(p, out);
            return st;
        }
        if (!r)
            continue;
        if (*got && t.plan.peak_bytes >= out->plan.peak_bytes) {
            cand_clear(p, &t);
            continue;
        }
        cand_clear(p, out);
        *out = t;
        *got = 1;
    }
    if (!*got)
        return MF_OK;
    mf_remat_result_desc(&out->r, &d);
    if ((st = run_plan(p, &d, o, &full)) != MF_OK) {
        cand_clear(p, out);
        *got = 0;
        return st;
    }
    if (full.peak_bytes <= out->plan.peak_bytes) {
        mf_plan_result_free(p->ctx, &out->plan);
        out->plan = full;
    } else {
        mf_plan_result_free(p->ctx, &full);
    }
    return MF_OK;
}

/* Keep step o on s: o's origins composed onto s's, its graph and plan s's; o is emptied. */
static int keep_step(pipe *p, cand *s, cand *o, uint8_t kind)
{
    mf_pipeline_step st;
    int32_t k;
    st.kind = kind;
    st.splits = o->r.n_splits;
    st.copied_bytes = o->r.copied_bytes;
    st.peak_before = s->plan.peak_bytes;
    st.peak_after = o->plan.peak_bytes;
    if (s->has_copies) {
        for (k = 0; k < o->r.n_ops; k++) {
            if (o->r.origin[k] < 0 || o->r.origin[k] >= s->r.n_ops)
                return mf_set_error(p->ctx, MF_EINTERNAL, "recompute: a copy's origin is out of range");
            o->r.origin[k] = s->r.origin[o->r.origin[k]];
        }
        for (k = 0; k < o->r.n_values; k++) {
            if (o->r.value_origin[k] < 0 || o->r.value_origin[k] >= s->r.n_values)
                return mf_set_error(p->ctx, MF_EINTERNAL, "recompute: a copy's origin is out of range");
            o->r.value_origin[k] = s->r.value_origin[o->r.value_origin[k]];
        }
        o->r.n_splits += s->r.n_splits;
        o->r.n_edges += s->r.n_edges;
        o->r.copied_bytes += s->r.copied_bytes;
        o->r.start_peak_bytes = s->r.start_peak_bytes;
    }
    o->start = s->start;
    o->n_steps = s->n_steps;
    memcpy(o->steps, s->steps, sizeof s->steps);
    if (o->n_steps < MF_PIPELINE_MAX_STEPS)
        o->steps[o->n_steps++] = st;
    cand_clear(p, s);
    *s = *o;
    memset(o, 0, sizeof *o);
    return MF_OK;
}

/* NOTE [recomputation passes]  The search (mf_remat.c NOTE [recomputation])
 * splits values on one planned order; planning the graph with the copies
 * again finds another order, on which further splits may pay.  So the search
 * runs again on each kept plan, with what is left of the byte budget, up to
 * `passes` times, while the planned peak keeps falling; then (where regions
 * are formed) up to `focus` focused passes.  A later pass's origins are
 * composed with the earlier ones' (keep_step), so the result names ops and
 * values of the pipeline's graph. */
/* NOTE [peak target]: does s fit, planned as it is or, where eval is given, with eval's options (the
 * plan the "no coarse orders" start ends with)? */
static int fits_as_kept(pipe *p, const cand *s, const mf_plan_options *eval, int *ok)
{
    mf_graph_desc d;
    mf_plan_result re;
    int st;
    *ok = fits(p, s);
    if (*ok || p->target <= 0 || !eval || !s->has_copies)
        return MF_OK;
    mf_remat_result_desc(&s->r, &d);
    if ((st = run_plan(p, &d, eval, &re)) != MF_OK)
        return st;
    *ok = re.peak_bytes <= p->target;
    mf_plan_result_free(p->ctx, &re);
    return MF_OK;
}

static int passes_on(pipe *p, int64_t budget, const mf_plan_options *o, const mf_plan_options *eval, int passes,
                     int focus, cand *s)
{
    int pass, st = MF_OK;
    for (pass = 0; pass < passes + focus; pass++) {
        int64_t left = budget - (s->has_copies ? s->r.copied_bytes : 0);
        uint8_t *own;
        const uint8_t *ch;
        cand t;
        int got, ok;
        if (left <= 0 || (pass >= passes && !o->fuse) || out_of_work(p))
            break;
        if ((st = fits_as_kept(p, s, eval, &ok)) != MF_OK || ok)
            return st;
        if ((st = cheap_of(p, s, &own, &ch)) != MF_OK) {
            mf_free(p->ctx, own);
            return st;
        }
        if (pass < passes)
            st = pass_step(p, s, ch, left, o, NULL, &t, &got);
        else
            st = focused_step(p, s, ch, left, o, &t, &got);
        mf_free(p->ctx, own);
        if (st != MF_OK)
            return st;
        if (!got) {
            if (pass < passes) { /* the search keeps nothing: on to the focused passes */
                pass = passes - 1;
                continue;
            }
            break;
        }
        if ((st = keep_step(p, s, &t, t.kind)) != MF_OK) {
            cand_clear(p, &t);
            return st;
        }
    }
    return st;
}

/* s := the better of s and c (s on a tie): the lower, or with a peak target
 * (NOTE [peak target]) the one that fits, of two that fit the one with fewer
 * copied bytes, then the lower; c is emptied. */
static void keep_better(pipe *p, cand *s, cand *c)
{
    int fs = fits(p, s), fc = fits(p, c), better;
    if (fs != fc)
        better = fc;
    else if (fs && copied(c) != copied(s))
        better = copied(c) < copied(s);
    else
        better = c->plan.peak_bytes < s->plan.peak_bytes;
    if (better) {
        cand t = *s;
        *s = *c;
        *c = t;
    }
    cand_clear(p, c);
}

int mf_plan_pipeline(mf_ctx *ctx, const mf_graph_desc *g, const mf_pipeline_options *opt, mf_pipeline_result *out)
{
    pipe p;
    cand s, c;
    mf_plan_options pa = opt->plan, nh, nc;
    mf_plan_result first, noc;
    int passes = opt->passes > 0 ? opt->passes : MF_RECOMPUTE_PASSES, k, st;
    int64_t budget = opt->recompute_budget;

    memset(out, 0, sizeof *out);
    memset(&s, 0, sizeof s);
    memset(&c, 0, sizeof c);
    memset(&first, 0, sizeof first);
    memset(&noc, 0, sizeof noc);
    memset(&p, 0, sizeof p);
    p.ctx = ctx;
    p.g = g;
    p.cheap = opt->cheap;
    p.target = opt->peak_target;
    p.max_work = opt->max_work > 0 ? opt->max_work
                                   : MF_PIPELINE_WORK_FLOOR + MF_PIPELINE_WORK_PER_OP * (int64_t)g->n_ops;
    if ((st = run_plan(&p, g, &pa, &first)) != MF_OK)
        goto done;
    out->first_peak_bytes = first.peak_bytes;
    out->first_baseline_peak_bytes = first.baseline_peak_bytes;
    s.start = "plan";
    if (budget <= 0 || !opt->cheap || (p.target > 0 && first.peak_bytes <= p.target)) {
        s.plan = first;
        memset(&first, 0, sizeof first);
        goto finish;
    }
    if ((st = plan_copy(ctx, &first, &s.plan)) != MF_OK || (st = passes_on(&p, budget, &pa, NULL, passes, 0, &s)) != MF_OK)
        goto done;
    nh = pa;
    nh.no_hoists = 1;
    if (!pa.no_hoists && first.hoists > 0 && !out_of_work(&p)) { /* the plan without hoists */
        c.start = "no hoists";
        if ((st = run_plan(&p, g, &nh, &c.plan)) != MF_OK || (st = passes_on(&p, budget, &pa, NULL, passes, 0, &c)) != MF_OK)
            goto done;
        keep_better(&p, &s, &c);
    }
    if (g->donatable && p.target <= 0 && !out_of_work(&p)) { /* g planned without donations, passes with them */
        mf_graph_desc nd = *g;
        nd.donatable = NULL;
        c.start = "no donations";
        if ((st = run_plan(&p, &nd, &pa, &c.plan)) != MF_OK || (st = passes_on(&p, budget, &pa, NULL, passes, 0, &c)) != MF_OK)
            goto done;
        if (c.has_copies) /* a kept pass planned it with them; else its peak is not g's */
            keep_better(&p, &s, &c);
        else
            cand_clear(&p, &c);
    }
    nc = pa;
    nc.no_coarse = 1;
    if (pa.fuse && !pa.no_coarse && !out_of_work(&p) && (st = run_plan(&p, g, &nc, &noc)) != MF_OK)
        goto done;
    for (k = 0; noc.order && k < 2 && !out_of_work(&p); k++) { /* the starts without coarse orders */
        mf_plan_result re;
        int have_re = 0;
        c.start = k ? "no coarse orders, passes with them" : "no coarse orders";
        if ((st = plan_copy(ctx, &noc, &c.plan)) != MF_OK ||
            (st = passes_on(&p, budget, k ? &pa : &nc, k ? NULL : &pa, passes, 0, &c)) != MF_OK ||
            (!k && (st = passes_on(&p, budget, &nc, &pa, 0, MF_FOCUS_PASSES, &c)) != MF_OK))
            goto done;
        /* planned with coarse orders: no copies, the first plan; copies planned with them in every
         * pass (k = 1), c's own plan; else planned here */
        if (!c.has_copies) {
            if ((st = plan_copy(ctx, &first, &re)) != MF_OK)
                goto done;
            have_re = 1;
        } else if (k == 0) {
            mf_graph_desc d;
            mf_remat_result_desc(&c.r, &d);
            if ((st = run_plan(&p, &d, &pa, &re)) != MF_OK)
                goto done;
            have_re = 1;
        }
        if (have_re && re.peak_bytes < c.plan.peak_bytes) {
            mf_plan_result_free(ctx, &c.plan);
            c.plan = re;
        } else if (have_re) {
            mf_plan_result_free(ctx, &re);
        }
        keep_better(&p, &s, &c);
    }
    if ((st = passes_on(&p, budget, &pa, NULL, 0, MF_FOCUS_PASSES, &s)) != MF_OK)
        goto done;
finish:
    out->fits = fits(&p, &s);
    out->plan = s.plan;
    out->has_copies = s.has_copies;
    out->copies = s.r;
    out->start = s.start;
    out->n_steps = s.n_steps;
    memcpy(out->steps, s.steps, sizeof s.steps);
    memset(&s, 0, sizeof s);
    out->n_plans = p.n_plans;
    out->work = p.work;
    out->max_work = p.max_work;
    out->budget_hit = p.budget_hit;
done:
    cand_clear(&p, &s);
    cand_clear(&p, &c);
    mf_plan_result_free(ctx, &first);
    mf_plan_result_free(ctx, &noc);
    if (st != MF_OK)
        mf_pipeline_result_free(ctx, out);
    return st;
}

void mf_pipeline_result_free(mf_ctx *ctx, mf_pipeline_result *r)
{
    mf_plan_result_free(ctx, &r->plan);
    if (r->has_copies)
        mf_remat_result_free(ctx, &r->copies);
    memset(r, 0, sizeof *r);
}
