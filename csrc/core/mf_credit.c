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
 * graph makes, a backward's saved activations no one else holds; on views:
 * those whose elements keep the storage's order, a reshape).  A storage
 * qualifies for the group [i, j) when it is donatable, made before the
 * group, no graph output, read in the group and by no op after it, never
 * read through a view of other bytes (a slice), nor by a fused op through a
 * view not marked (a transpose: the compiler writes in place only at the
 * index it reads), and read by the group through one of its values only: a
 * view the group makes itself is none, but the root and a view made before
 * the group, read in one group, are two inputs of its region, of which the
 * caller donates neither (mf_credit_inputs).  Its bytes are live before the
 * group and freed after it, so without this a result of its size counts
 * beside it.
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
 * once less, on one more condition, Inductor's own: it writes a node's
 * result over a buffer only where every other node reading that buffer is
 * an ancestor of the node or has run already.  The pointwise readers of a
 * source in the group are fused into one kernel with the taker, so each of
 * them must be the taker's op or one of its makers (a bit per reader,
 * propagated to what it makes: mf_credit_op); readers of other kinds
 * (reductions, extern calls) run in kernels of their own and do not block.
 * (A SwiGLU backward region over a checkpointed MLP writes the up branch's
 * gradient and the SiLU over the gate's GEMM result in one kernel; both
 * read the gate, so neither writes over it, and a plan crediting either
 * stood one tensor below its program.)  Where the class's sources are
 * donated storages only, the taker must also be computed from one of them,
 * by its op or through values of the group no extern call stores (the
 * compiler writes it in place: a compiled program frees no input of its
 * own, so a later allocation never reuses one), and some source's readers
 * must meet the condition; a result of the size made before r0 is not
 * counted there.  With the head among a class's sources, the one late taker
 * must be no stored value and follow every pointwise reader of the head,
 * and a taker before r0 blocks it: Inductor writes in place only over a
 * buffer with one reader left, and an earlier result of the size, in the
 * same kernel, may be another (the plan stays an upper bound); and only
 * takers no extern call reads (not marked stored) may take it, as NOTE
 * [stored heads] has always counted them: a head's region whose result a
 * GEMM reads was measured to keep more than the model sees (a checkpointed
 * Phi-3 MLP backward: the gate-up GEMM's gradient, made through pads, is no
 * in-place write).  A donated input's taker may be read by an extern call
 * afterwards (the cross-entropy's gradient over the saved log-softmax, read
 * by the LM head's GEMMs).  Where a class has two or more late takers,
 * nothing is credited: the kernel writing them may read the source while it
 * writes (NOTE [stored heads]), and which of them the compiler gives it is
 * its choice; the plan stays an upper bound of what the program allocates.
 * Pointwise takers only: the compiler gives a dying buffer to a kernel
 * writing at the index it reads, or to a later allocation of its size; an
 * extern call's result is no taker (a GEMM reading the source cannot write
 * over it).  What the rule cannot see: an intermediate Inductor realizes
 * inside the kernel (a sigmoid read twice) may take the dying buffer first,
 * a buffer the model counts as free.
 *
 * The DP (mf_fuse.c) meets the group [i, j) one position at a time and keeps
 * this state across j (mf_credit_inputs / _source / _op / _taker / _drop, in
 * that order at each position); the simulator and group_cost compute one
 * group whole (mf_group_credit).  Both see the same sources and takers, so
 * they agree (mf_sched.c checks the planned peak against the simulator).
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
    int32_t ns = pg->ns, s, v, k, j, c = -1, pass;
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
    for (k = 0; k < g->n_ops; k++) { /* read through a view of other bytes, or of another order into a kernel */
        int kernel = g->fusible && g->fusible[k] && g->fusible[k] != MF_FUSIBLE_STORED;
        for (j = g->in_ptr[k]; j < g->in_ptr[k + 1]; j++) {
            int32_t x = g->in_idx[j];
            if (pg->sid[x] >= 0 && root[x] != x &&
                (g->value_bytes[x] != pg->sbytes[pg->sid[x]] || (kernel && !(g->donatable && g->donatable[x]))))
                pg->sdon[pg->sid[x]] = 0;
        }
    }
    /* each op's distinct reads of donatable storages, by value (NOTE [donated inputs]: a group reading
     * two of a storage's values from outside it is given two inputs, and the caller donates neither) */
    pg->dread_ptr = (int32_t *)mf_arena_array(ctx, a, (size_t)g->n_ops + 1, sizeof(int32_t));
    if (!pg->dread_ptr)
        return MF_ENOMEM;
    for (pass = 0; pass < 2; pass++) {
        int32_t m = 0;
        for (k = 0; k < g->n_ops; k++) {
            if (!pass)
                pg->dread_ptr[k] = m;
            for (j = g->in_ptr[k]; j < g->in_ptr[k + 1]; j++) {
                int32_t x = g->in_idx[j], sx = pg->sid[x], vx = root[x] == x ? -1 : x, q, dup = 0;
                if (sx < 0 || !pg->sdon[sx])
                    continue;
                for (q = g->in_ptr[k]; q < j; q++) /* the same value read twice */
                    dup |= g->in_idx[q] == x;
                if (dup)
                    continue;
                if (pass) {
                    pg->dread_s[m] = sx;
                    pg->dread_v[m] = vx;
                }
                m++;
            }
        }
        if (!pass) {
            pg->dread_ptr[g->n_ops] = m;
            pg->dread_s = (int32_t *)mf_arena_array(ctx, a, (size_t)m + 1, sizeof(int32_t));
            pg->dread_v = (int32_t *)mf_arena_array(ctx, a, (size_t)m + 1, sizeof(int32_t));
            if (!pg->dread_s || !pg->dread_v)
                return MF_ENOMEM;
        }
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
    /* one block: the class arrays, then the storage arrays */
    int32_t **cls[] = {&cr->cstamp, &cr->chead, &cr->tcstamp, &cr->cn, &cr->cnp, &cr->cl, &cr->clp, &cr->cd,
                       &cr->ch, &cr->dstamp, &cr->cfirst};
    int32_t **sto[] = {&cr->tstamp, &cr->sreg, &cr->scarry, &cr->mstamp, &cr->xstamp, &cr->snext, &cr->instamp,
                       &cr->inval, &cr->inconf};
    size_t nc = (size_t)pg->ncls + 1, ns = (size_t)pg->ns + 1, ncl = sizeof cls / sizeof *cls,
           nst = sizeof sto / sizeof *sto, k;
    int32_t *block = (int32_t *)mf_arena_array(ctx, a, ncl * nc + nst * ns, sizeof(int32_t));
    uint64_t *masks = (uint64_t *)mf_arena_array(ctx, a, 2 * ns, sizeof(uint64_t));
    memset(cr, 0, sizeof *cr);
    cr->pg = pg;
    cr->tlate = (uint8_t *)mf_arena_array(ctx, a, ns, 1);
    if (!block || !masks || !cr->tlate)
        return MF_ENOMEM;
    memset(block, 0, sizeof(int32_t) * (ncl * nc + nst * ns));
    for (k = 0; k < ncl; k++)
        *cls[k] = block + k * nc;
    for (k = 0; k < nst; k++)
        *sto[k] = block + ncl * nc + k * ns;
    cr->smask = masks;
    cr->xmask = masks + ns;
    return MF_OK;
}

void mf_credit_begin(mf_credit *cr, int32_t gstart, int32_t hs)
{
    cr->stamp++;
    cr->credit = 0;
    cr->nbits = 0;
    cr->gstart = gstart;
    cr->hs = hs;
}

void mf_credit_inputs(mf_credit *cr, int32_t u)
{
    const mf_pg *pg = cr->pg;
    int32_t q;
    for (q = pg->dread_ptr[u]; q < pg->dread_ptr[u + 1]; q++) {
        int32_t s = pg->dread_s[q], v = pg->dread_v[q];
        if (v >= 0 && pg->prod[v] >= 0 && cr->pos[pg->prod[v]] >= cr->gstart)
            continue; /* a view the group makes: no input of its own */
        if (cr->instamp[s] != cr->stamp) {
            cr->instamp[s] = cr->stamp;
            cr->inval[s] = v;
        } else if (cr->inval[s] != v) {
            cr->inconf[s] = cr->stamp;
        }
    }
}

/* the last reader bit; given to every reader past the first 63, it never passes ancestors_ok */
#define MF_READER_OVERFLOW ((uint64_t)1 << 63)

/* Are the pointwise readers of source x in the group so far (a kernel fuses them with s's) all s's
 * own op or makers of s?  NOTE [reuse credit]: Inductor writes a result over a buffer only where
 * every other node reading it is an ancestor or has run. */
static int readers_before(const mf_credit *cr, int32_t x, int32_t s)
{
    uint64_t have = cr->mstamp[s] == cr->stamp ? cr->smask[s] : 0;
    uint64_t need = cr->xstamp[x] == cr->stamp ? cr->xmask[x] : 0;
    return !(need & MF_READER_OVERFLOW) && !(need & ~have);
}

/* Is there a donated source of class c so far whose pointwise readers all come before s? */
static int ancestors_ok(const mf_credit *cr, int32_t c, int32_t s)
{
    int32_t x;
    if (cr->dstamp[c] != cr->stamp)
        return 0;
    for (x = cr->cfirst[c]; x >= 0; x = cr->snext[x])
        if (readers_before(cr, x, s))
            return 1;
    return 0;
}

/* the class's share of the credit: its bytes where it has a source and exactly one late taker (with
 * the head among its sources: one that is no stored value, and no early taker of any kind; with
 * donated sources only: one computed from a source; NOTE [reuse credit]) */
static int64_t share(const mf_credit *cr, int32_t c)
{
    int one;
    if (cr->cstamp[c] != cr->stamp || cr->tcstamp[c] != cr->stamp)
        return 0;
    one = cr->chead[c] == cr->stamp ? cr->cnp[c] == 1 && cr->clp[c] == 1 && cr->cl[c] == cr->cn[c] && cr->ch[c] == 1
                                    : cr->cl[c] == 1 && cr->cd[c] == 1;
    return one ? cr->pg->cbytes[c] : 0;
}

void mf_credit_source(mf_credit *cr, int32_t s, int head)
{
    int32_t c = cr->pg->scls[s];
    if (!head && cr->inconf[s] == cr->stamp)
        return; /* two inputs of the region: the caller donates neither */
    cr->credit -= share(cr, c);
    cr->cstamp[c] = cr->stamp;
    if (head) {
        cr->chead[c] = cr->stamp;
    } else {
        cr->sreg[s] = cr->stamp;
        cr->snext[s] = cr->dstamp[c] == cr->stamp ? cr->cfirst[c] : -1;
        cr->cfirst[c] = s;
        cr->dstamp[c] = cr->stamp;
    }
    cr->credit += share(cr, c);
}

void mf_credit_taker(mf_credit *cr, int32_t s)
{
    int32_t c = cr->pg->scls[s];
    int stored = cr->pg->smat[s] != 0, late = cr->cstamp[c] == cr->stamp; /* after a source: its buffer is dead */
    /* computed from a donated source whose other pointwise readers all come before it */
    int direct = cr->dstamp[c] == cr->stamp && cr->carry && ancestors_ok(cr, c, s);
    /* late, unstored and made after every pointwise reader of the head */
    int after_head = late && !stored && cr->hs >= 0 && cr->pg->scls[cr->hs] == c && readers_before(cr, cr->hs, s);
    cr->credit -= share(cr, c);
    if (cr->tcstamp[c] != cr->stamp) {
        cr->tcstamp[c] = cr->stamp;
        cr->cn[c] = cr->cnp[c] = cr->cl[c] = cr->clp[c] = cr->cd[c] = cr->ch[c] = 0;
    }
    cr->cn[c]++;
    cr->cnp[c] += !stored;
    cr->cl[c] += late;
    cr->clp[c] += late && !stored;
    cr->cd[c] += direct;
    cr->ch[c] += after_head;
    cr->tstamp[s] = cr->stamp;
    cr->tlate[s] = (uint8_t)(late | direct << 1 | after_head << 2);
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
    cr->cd[c] -= cr->tlate[s] >> 1 & 1;
    cr->ch[c] -= cr->tlate[s] >> 2 & 1;
    cr->credit += share(cr, c);
}

void mf_credit_op(mf_credit *cr, int32_t u)
{
    const mf_pg *pg = cr->pg;
    uint64_t mask = 0, bit = 0;
    int32_t q;
    cr->carry = 0;
    for (q = pg->oread_ptr[u]; q < pg->oread_ptr[u + 1]; q++) {
        int32_t s = pg->oread[q];
        cr->carry |= cr->sreg[s] == cr->stamp || (cr->scarry[s] == cr->stamp && !pg->smat[s]);
        if (cr->mstamp[s] == cr->stamp) /* made in the group: its makers are u's */
            mask |= cr->smask[s];
        if (pg->pointwise[u] && (s == cr->hs || (cr->mstamp[s] != cr->stamp && pg->sdon[s]))) {
            /* a pointwise reader of the head or of a donated input */
            if (!bit)
                bit = cr->nbits < 63 ? (uint64_t)1 << cr->nbits++ : MF_READER_OVERFLOW;
            if (cr->xstamp[s] != cr->stamp) {
                cr->xstamp[s] = cr->stamp;
                cr->xmask[s] = 0;
            }
            cr->xmask[s] |= bit;
        }
    }
    mask |= bit;
    for (q = pg->oalloc_ptr[u]; q < pg->oalloc_ptr[u + 1]; q++) {
        int32_t s = pg->oalloc[q];
        cr->smask[s] = mask;
        cr->mstamp[s] = cr->stamp;
        if (cr->carry)
            cr->scarry[s] = cr->stamp;
    }
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
    mf_credit_begin(cr, i, hs);
    for (p = i; p < j; p++) {
        int32_t u = order[p];
        mf_credit_inputs(cr, u);
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
