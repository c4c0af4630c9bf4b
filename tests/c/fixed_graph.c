/* fixed_graph.c -- the shared fixed-capacity graph builder of the C tests (fixed_graph.h). */
#include "fixed_graph.h"

#include <string.h>

void fg_init(fg *g)
{
    memset(g, 0, sizeof *g);
    memset(g->alias_of, 0xff, sizeof g->alias_of);
}

int32_t fg_value(fg *g, int64_t bytes, int is_input)
{
    g->bytes[g->n_values] = bytes;
    g->is_input[g->n_values] = (uint8_t)is_input;
    return g->n_values++;
}

int32_t fg_op(fg *g, const int32_t *ins, int nin, int64_t bytes, uint8_t comm)
{
    int i;
    int32_t v = fg_value(g, bytes, 0);
    for (i = 0; i < nin; i++)
        g->in_idx[g->n_in++] = ins[i];
    g->out_idx[g->n_out++] = v;
    g->comm[g->n_ops] = comm;
    g->n_ops++;
    g->in_ptr[g->n_ops] = g->n_in;
    g->out_ptr[g->n_ops] = g->n_out;
    return v;
}

mf_graph_desc fg_desc(const fg *g, int with_comm)
{
    mf_graph_desc d;
    memset(&d, 0, sizeof d);
    d.n_ops = g->n_ops;
    d.n_values = g->n_values;
    d.in_ptr = g->in_ptr;
    d.in_idx = g->in_idx;
    d.out_ptr = g->out_ptr;
    d.out_idx = g->out_idx;
    d.value_bytes = g->bytes;
    d.alias_of = g->alias_of;
    d.is_input = g->is_input;
    d.is_output = g->is_output;
    d.comm = with_comm ? g->comm : NULL;
    return d;
}
