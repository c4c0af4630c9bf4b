/* fixed_graph.c -- the C tests' graphs on the core's mf_gbuf (fixed_graph.h). */
#include "fixed_graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fg_check(const fg *g)
{
    if (g->b.nomem || g->b.n_ops > FG_MAX) {
        fprintf(stderr, "fixed_graph: %s\n", g->b.nomem ? g->b.ctx.err : "more than FG_MAX ops");
        exit(2);
    }
}

void fg_init(fg *g)
{
    memset(g->comm, 0, sizeof g->comm);
    mf_gbuf_init(&g->b, NULL);
}

void fg_free(fg *g)
{
    mf_gbuf_free(&g->b);
}

int32_t fg_value(fg *g, int64_t bytes, int is_input)
{
    int32_t v = mf_gbuf_add_value(&g->b, bytes, is_input);
    fg_check(g);
    return v;
}

int32_t fg_op(fg *g, const int32_t *ins, int nin, int64_t bytes, uint8_t comm)
{
    int i;
    int32_t v = fg_value(g, bytes, 0);
    if (g->b.n_ops < FG_MAX)
        g->comm[g->b.n_ops] = comm;
    mf_gbuf_begin_op(&g->b, 0);
    for (i = 0; i < nin; i++)
        mf_gbuf_op_in(&g->b, ins[i]);
    mf_gbuf_op_out(&g->b, v);
    mf_gbuf_end_op(&g->b);
    fg_check(g);
    return v;
}

mf_graph_desc fg_desc(const fg *g, int with_comm)
{
    mf_graph_desc d;
    mf_gbuf_desc(&g->b, &d);
    d.fusible = NULL; /* as before: no op fusible */
    d.comm = with_comm ? g->comm : NULL;
    return d;
}
