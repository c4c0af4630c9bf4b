/*
 * mf_credit.c -- buffers a fused group's program gives from a dying storage
 * to a result of its size: what the fused rule of NOTE [cost model] counts
 * twice and the compiler stores once.
 *
 * NOTE [donated inputs]
 * A compiler that knows an input dies with its program may write a result
 * over it (Inductor's donated buffers: torch.compile's backward reuses the
 * saved activations it frees that way).  The caller says which storages it
 * lets a group write over (mf_graph_desc.donatable, on roots: values the
 * graph makes, a backward's saved activations no one else holds).  A
 * storage qualifies for the group [i, j) when it is donatable, made before
 * the group, no graph output, read in the group and by no op after it, and
 * read only through its root value anywhere (two views of one storage are
 * two inputs of a region, which the caller never donates; a view's bytes
 * are not the storage's either).  Its bytes are live before the group and
 * freed after it, so without this a result of its size counts beside it.
 *
 * NOTE [reuse credit]
 * One rule for the dead buffers a group's results may take: a donated
 * storage (above) or the group's stored head (NOTE [stored heads],
 * mf_fuse.c).  Each such source has a position r, its last read in the
 * group (for the head at least the group's second position).  Sources are
 * grouped by size class (equal bytes); in a class, with r0 the least r of
 * its sources, the takers are the storages of the class that an op given as
 * MF_FUSIBLE_POINTWISE allocates anywhere in the group and that leave it
 * (graph outputs or read after it); late ones are allocated at a position
 * >= r0, when a source's buffer is dead.  Where a class has exactly one late
 * taker, it takes one source's buffer: the group counts that class's bytes
 * once less.  Where the class's sources are donated storages only, that
 * taker must be computed from one of them, by its op or through values of
 * the group no extern call stores (the compiler writes it in place: a
 * compiled program frees no input of its own, so a later allocation never
 * reuses one; measured on the seed's paths, where a relu of an input beside
 * a GEMM reading two dying results kept a buffer of its own); a result of
 * the size made before r0 is not counted there (the in-place write needs
 * only the source's last reader to be the taker, and an earlier result need
 * not read it: blocking on one raised a checkpointed pre-LN step's planned
 * and measured peak by three activations, where the plan ignoring it equals
 * its program).  With the head among a class's sources, a taker
 * before r0 blocks it: Inductor writes in place only over a buffer with one
 * reader left, and an earlier result of the size, in the same kernel, may be
 * another (the plan stays an upper bound); and only takers no extern call
 * reads (not marked stored) may take it, as NOTE [stored heads] has always
 * counted them: a head's region whose result a GEMM reads was measured to
 * keep more than the model sees (a checkpointed Phi-3 MLP backward: the
 * gate-up GEMM's gradient, made through pads, is no in-place write).  Such a
 * result still blocks where it is early: a SwiGLU backward region (OLMo,
 * checkpointed) writes the up branch's gradient, which a GEMM reads next,
 * and the SiLU over the head in one kernel; both read the head, so neither
 * writes over it, and crediting the SiLU put the plan one tensor below its
 * program.  A donated input's taker may be read by an extern call afterwards
 * (the cross-entropy's gradient over the saved log-softmax, read by the LM
 * head's GEMMs).  Where a class has two or more late takers, nothing is
 * credited: the kernel writing them may read the source while it writes
 * (NOTE [stored heads]), and which of them the compiler gives it is its
 * choice; the plan stays an upper bound of what the program allocates.
 * Pointwise takers only: the compiler gives a dying buffer to a kernel
 * writing at the index it reads, or to a later allocation of its size; an
 * extern call's result is no taker (a GEMM reading the source cannot write
 * over it).
 *
 * The DP (mf_fuse.c) meets the group [i, j) one position at a time and keeps
 * this state across j (mf_credit_source / _taker / _drop); the simulator and
 * group_cost compute one group whole (mf_group_credit).  Both see the same
 * sources and takers, so they agree (mf_sched.c checks the planned peak
 * against the simulator).
 */
#include "mf_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t b;
    int32_t s;
} size_key;

static int by_bytes(const void *x, const void *y)
{
    const size_key *a = (const size_key *)x, *b = (const size_key *)y;
    return a->b < b->b ? -1 : a->b > b->b;
}

int mf_credit_setup(mf_ctx *ctx, mf_arena *a, const mf_graph_desc *g, const int32_t *root, mf_pg *pg)
{
    int32_t ns = pg->ns, s, v, k, j, c = -1;
    size_key *keys;
    int32_t *sroot;
    pg->sdon = (uint8_t *)mf_arena_array(ctx, a, (size_t)ns + 1, 1);
    pg->scls = (int32_t *)mf_arena_array(ctx, a, (size_t)ns + 1, sizeof(int32_t));
    pg->cbytes = (int64_t *)mf_arena_array(ctx, a, (size_t)ns + 1, sizeof(int64_t));
    keys = (size_key *)mf_arena_array(ctx, a, (size_t)ns + 1, sizeof(size_key));
    sroot = (int32_t *)mf_arena_array(ctx, a, (size_t)ns + 1, sizeof(int32_t));
    if (!pg->sdon || !pg->scls || !pg->cbytes || !keys || !sroot)
        return MF_ENOMEM;
    for (v = 0; v < pg->nv; v++)
        if (pg->sid[v] >= 0 && root[v] == v)
            sroot[pg->sid[v]] = v;
    for (s = 0; s < ns; s++) {
        pg->sdon[s] = (uint8_t)(g->donatable && g->donatable[sroot[s]] && pg->sbytes[s] > 0 && !pg->sout[s]);
        keys[s].b = pg->sbytes[s];
        keys[s].s = s;
    }
    for (k = 0; k < g->n_ops; k++) /* read through a view: never donated */
        for (j = g->in_ptr[k]; j < g->in_ptr[k + 1]; j++) {
            int32_t x = g->in_idx[j];
            if (pg->sid[x] >= 0 && root[x] != x)
                pg->sdon[pg->sid[x]] = 0;
        }
    qsort(keys, (size_t)ns, sizeof *keys, by_bytes);
    for (s = 0; s < ns; s++) {
        if (s == 0 || keys[s].b != keys[s - 1].b)
            pg->cbytes[++c] = keys[s].b;
        pg->scls[keys[s].s] = c;
    }
    pg->ncls = c + 1;
    return MF_OK;
}

int mf_credit_init(mf_ctx *ctx, mf_arena *a, const mf_pg *pg, mf_credit *cr)
{
    /* one block: nine class arrays, then three storage arrays */
    size_t nc = (size_t)pg->ncls + 1, ns = (size_t)pg->ns + 1;
    int32_t *block = (int32_t *)mf_arena_array(ctx, a, 9 * nc + 3 * ns, sizeof(int32_t));
    memset(cr, 0, sizeof *cr);
    cr->pg = pg;
    cr->tlate = (uint8_t *)mf_arena_array(ctx, a, ns, 1);
    if (!block || !cr->tlate)
        return MF_ENOMEM;
    memset(block, 0, sizeof(int32_t) * (9 * nc + 3 * ns));
    cr->cstamp = block;
    cr->chead = block + nc;
    cr->tcstamp = block + 2 * nc;
    cr->cn = block + 3 * nc;
    cr->cnp = block + 4 * nc;
    cr->clp = block + 5 * nc;
    cr->cd = block + 6 * nc;
    cr->dstamp = block + 7 * nc;
    cr->cl = block + 8 * nc;
    cr->tstamp = block + 9 * nc;
    cr->sreg = block + 9 * nc + ns;
    cr->scarry = block + 9 * nc + 2 * ns;
    return MF_OK;
}

void mf_credit_begin(mf_credit *cr)
{
    cr->stamp++;
    cr->credit = 0;
}

/* the class's share of the credit: its bytes where it has a source and exactly one late taker (with
 * the head among its sources: one that is no stored value, and no early taker of any kind; with
 * donated sources only: one computed from a source; NOTE [reuse credit]) */
static int64_t share(const mf_credit *cr, int32_t c)
{
    int one;
    if (cr->cstamp[c] != cr->stamp || cr->tcstamp[c] != cr->stamp)
        return 0;
    one = cr->chead[c] == cr->stamp ? cr->cnp[c] == 1 && cr->clp[c] == 1 && cr->cl[c] == cr->cn[c]
                                    : cr->cl[c] == 1 && cr->cd[c] == 1;
    return one ? cr->pg->cbytes[c] : 0;
}

void mf_credit_source(mf_credit *cr, int32_t s, int head)
{
    int32_t c = cr->pg->scls[s];
    cr->credit -= share(cr, c);
    cr->cstamp[c] = cr->stamp;
    if (head) {
        cr->chead[c] = cr->stamp;
    } else {
        cr->dstamp[c] = cr->stamp;
        cr->sreg[s] = cr->stamp;
    }
    cr->credit += share(cr, c);
}

void mf_credit_taker(mf_credit *cr, int32_t s)
{
    int32_t c = cr->pg->scls[s];
    int stored = cr->pg->smat[s] != 0, late = cr->cstamp[c] == cr->stamp; /* after a source: its buffer is dead */
    int direct = cr->dstamp[c] == cr->stamp && cr->carry; /* computed from a donated source */
    cr->credit -= share(cr, c);
    if (cr->tcstamp[c] != cr->stamp) {
        cr->tcstamp[c] = cr->stamp;
        cr->cn[c] = cr->cnp[c] = cr->cl[c] = cr->clp[c] = cr->cd[c] = 0;
    }
    cr->cn[c]++;
    cr->cnp[c] += !stored;
    cr->cl[c] += late;
    cr->clp[c] += late && !stored;
    cr->cd[c] += direct;
    cr->tstamp[s] = cr->stamp;
    cr->tlate[s] = (uint8_t)(late | direct << 1);
    cr->credit += share(cr, c);
}

void mf_credit_drop(mf_credit *cr, int32_t s)
{
    int32_t c = cr->pg->scls[s];
    int stored, late;
    if (cr->tstamp[s] != cr->stamp)
        return;
    stored = cr->pg->smat[s] != 0;
    late = cr->tlate[s] & 1;
    cr->tstamp[s] = 0;
    cr->credit -= share(cr, c);
    cr->cn[c]--;
    cr->cnp[c] -= !stored;
    cr->cl[c] -= late;
    cr->clp[c] -= late && !stored;
    cr->cd[c] -= cr->tlate[s] >> 1;
    cr->credit += share(cr, c);
}

void mf_credit_op(mf_credit *cr, int32_t u)
{
    const mf_pg *pg = cr->pg;
    int32_t q;
    cr->carry = 0;
    for (q = pg->oread_ptr[u]; q < pg->oread_ptr[u + 1] && !cr->carry; q++) {
        int32_t s = pg->oread[q];
        cr->carry = cr->sreg[s] == cr->stamp || (cr->scarry[s] == cr->stamp && !pg->smat[s]);
    }
    if (cr->carry)
        for (q = pg->oalloc_ptr[u]; q < pg->oalloc_ptr[u + 1]; q++)
            cr->scarry[pg->oalloc[q]] = cr->stamp;
}

int mf_credit_is_taker(const mf_pg *pg, const int32_t *order, int32_t p, int32_t s, int32_t hs)
{
    return s != hs && pg->pointwise[order[p]] && pg->sbytes[s] > 0;
}

int32_t mf_credit_head(const mf_pg *pg, int32_t u)
{
    int32_t s;
    if (pg->oalloc_ptr[u + 1] - pg->oalloc_ptr[u] != 1)
        return -1;
    s = pg->oalloc[pg->oalloc_ptr[u]];
    return pg->smat[s] && !pg->sout[s] && pg->sbytes[s] > 0 ? s : -1;
}

int64_t mf_group_credit(mf_credit *cr, const int32_t *order, const int32_t *apos, const int32_t *lastpos, int32_t i,
                        int32_t j)
{
    const mf_pg *pg = cr->pg;
    int32_t hs = mf_credit_head(pg, order[i]), p, q;
    mf_credit_begin(cr);
    for (p = i; p < j; p++) {
        int32_t u = order[p];
        if (hs >= 0 && lastpos[hs] < j && p == (lastpos[hs] > i ? lastpos[hs] : i))
            mf_credit_source(cr, hs, 1); /* read after the group: no source (and never a taker) */
        for (q = pg->oread_ptr[u]; q < pg->oread_ptr[u + 1]; q++) {
            int32_t s = pg->oread[q];
            if (pg->sdon[s] && apos[s] < i && lastpos[s] == p)
                mf_credit_source(cr, s, 0);
        }
        mf_credit_op(cr, u);
        for (q = pg->oalloc_ptr[u]; q < pg->oalloc_ptr[u + 1]; q++) {
            int32_t s = pg->oalloc[q];
            if ((pg->sout[s] || lastpos[s] >= j) && mf_credit_is_taker(pg, order, p, s, hs))
                mf_credit_taker(cr, s);
        }
    }
    return cr->credit;
}
