/*
 * mf_codegen_expr.c -- the expressions of a region's kernel: the string
 * builder, operand casts and literals, and one instruction
 * (mf_cg_emit_instr: a dispatcher over small emitters, one per op kind of
 * mf_codegen_types.c), following NOTE [compute types] in mf_codegen.c.
 */
#include "mf_codegen_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- string builder ------------------------------------------------------ */

void mf_sb_printf(mf_sb *s, const char *fmt, ...)
{
    va_list ap;
    int need;
    if (s->oom)
        return;
    for (;;) {
        size_t room = s->cap - s->len;
        va_start(ap, fmt);
        need = vsnprintf(s->buf ? s->buf + s->len : NULL, s->buf ? room : 0, fmt, ap);
        va_end(ap);
        if (need < 0) {
            s->oom = 1;
            return;
        }
        if (s->buf && (size_t)need < room) {
            s->len += (size_t)need;
            return;
        }
        {
            size_t cap = s->cap ? s->cap : 4096;
            char *grown;
            while (cap < s->len + (size_t)need + 1)
                cap *= 2;
            grown = (char *)realloc(s->buf, cap);
            if (!grown) {
                s->oom = 1;
                return;
            }
            s->buf = grown;
            s->cap = cap;
        }
    }
}

/* ---- operands and literals ----------------------------------------------- */

int mf_cg_fail(mf_cg_gen *g, const char *fmt, ...)
{
    va_list ap;
    if (g->ctx) {
        va_start(ap, fmt);
        vsnprintf(g->ctx->err, sizeof g->ctx->err, fmt, ap);
        va_end(ap);
    }
    return MF_EINVAL;
}

/* Widest (for promotion of tensor-tensor comparisons): rank in this order. */
static int rank(int dt)
{
    static const int order[MF_DT_COUNT] = {0, 1, 1, 2, 3, 4, 5, 5, 6, 7};
    return order[dt];
}

/* "vN" converted to the compute type of dt. */
static void cast_to(mf_sb *s, mf_cg_gen *g, int v, int dt)
{
    int from = g->vdtype[v];
    const char *ct = mf_cg_dtypes[dt].ctype;
    if (strcmp(mf_cg_dtypes[from].ctype, ct) == 0)
        mf_sb_printf(s, "v%d", v);
    else if (dt == MF_DT_BOOL)
        mf_sb_printf(s, "(v%d != 0)", v);
    else
        mf_sb_printf(s, "((%s)v%d)", ct, v);
}

/* Compute dtype of a comparison (NOTE [compute types]). */
static int compare_dtype(mf_cg_gen *g, const mf_codegen_instr *in)
{
    int i, best_t = -1, best_s = -1;
    for (i = 0; i < in->nargs; i++) {
        int dt = g->vdtype[in->args[i]];
        if (g->vscalar[in->args[i]]) {
            if (best_s < 0 || cat(dt) > cat(best_s))
                best_s = dt;
        } else if (best_t < 0 || cat(dt) > cat(best_t) ||
                   (cat(dt) == cat(best_t) && rank(dt) > rank(best_t))) {
            best_t = dt;
        }
    }
    if (best_t < 0)
        return best_s;
    if (best_s >= 0 && cat(best_s) > cat(best_t))
        return cat(best_s) == 2 ? MF_DT_F32 : MF_DT_I64;
    return best_t;
}

static void emit_double(mf_sb *s, double x)
{
    if (x != x)
        mf_sb_printf(s, "__longlong_as_double(0x7ff8000000000000LL)");
    else if (isinf(x))
        mf_sb_printf(s, "__longlong_as_double(%s)", x > 0 ? "0x7ff0000000000000LL" : "(long long)0xfff0000000000000ULL");
    else {
        char tmp[64];
        snprintf(tmp, sizeof tmp, "%.17g", x);
        if (!strpbrk(tmp, ".eE"))
            strcat(tmp, ".0");
        mf_sb_printf(s, "%s", tmp);
    }
}

static void emit_int(mf_sb *s, int64_t x)
{
    if (x == INT64_MIN)
        mf_sb_printf(s, "(-9223372036854775807LL - 1LL)");
    else
        mf_sb_printf(s, "%lldLL", (long long)x);
}

/* "(<cast>)(a <op> b)", or "(a <op> b)" when cast is NULL; both operands
 * converted to the compute type of dt. */
static void emit_infix(mf_sb *s, mf_cg_gen *g, const char *cast, int a, const char *op, int b, int dt)
{
    if (cast)
        mf_sb_printf(s, "(%s)", cast);
    mf_sb_printf(s, "(");
    cast_to(s, g, a, dt);
    mf_sb_printf(s, " %s ", op);
    cast_to(s, g, b, dt);
    mf_sb_printf(s, ")");
}

/* "fn(args)", or "fn<targ>(args)" when targ is not NULL: every argument of
 * the instruction, comma separated, converted to the compute type of dt. */
static void emit_call(mf_sb *s, mf_cg_gen *g, const char *fn, const char *targ, const mf_codegen_instr *in, int dt)
{
    int j;
    if (targ)
        mf_sb_printf(s, "%s<%s>(", fn, targ);
    else
        mf_sb_printf(s, "%s(", fn);
    for (j = 0; j < in->nargs; j++) {
        if (j > 0)
            mf_sb_printf(s, ", ");
        cast_to(s, g, in->args[j], dt);
    }
    mf_sb_printf(s, ")");
}

/* ---- one instruction: a helper per op kind ------------------------------- */

/* What the emitters of one instruction read: the instruction, its op, its
 * index (for messages), its result dtype with that dtype's category and
 * compute type, and its arguments (-1 past the arity). */
typedef struct instr_view {
    const mf_codegen_instr *in;
    const mf_cg_op_desc *op;
    int i;
    int dt, c;
    const char *ct;
    int a0, a1, a2;
} instr_view;

/* Each writes the expression of one instruction (after "const T vN = "),
 * or returns MF_EINVAL for a combination the kind does not support. */
typedef int (*emit_kind_fn)(mf_sb *s, mf_cg_gen *g, const instr_view *x);

/* A literal: bool (const_kind 2), float (1) or integer (0), written in its
 * own dtype (a 16-bit float is rounded once, on the device). */
static int emit_const(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    const mf_codegen_instr *in = x->in;
    int dt = x->dt;
    if (in->const_kind == 2) {
        mf_sb_printf(s, "%s", in->iconst ? "true" : "false");
        if (dt != MF_DT_BOOL)
            return mf_cg_fail(g, "const #%d: bool literal with dtype %s", x->i, mf_cg_dtypes[dt].name);
    } else if (in->const_kind == 1) {
        if (x->c != 2)
            return mf_cg_fail(g, "const #%d: float literal with dtype %s", x->i, mf_cg_dtypes[dt].name);
        if (dt == MF_DT_F64)
            emit_double(s, in->fconst);
        else {
            /* Round the literal to its own dtype once, on the device. */
            mf_sb_printf(s, "%s((float)", dt == MF_DT_F16 ? "mf_rh" : dt == MF_DT_BF16 ? "mf_rbf" : "");
            emit_double(s, in->fconst);
            mf_sb_printf(s, ")");
            if (is16(dt))
                g->helpers |= dt == MF_DT_F16 ? H_F16 : H_BF16;
        }
    } else if (x->c == 0) {
        mf_sb_printf(s, "%s", in->iconst ? "true" : "false");
    } else {
        if (is16(dt)) {
            mf_sb_printf(s, "%s(", dt == MF_DT_F16 ? "mf_rh" : "mf_rbf");
            g->helpers |= dt == MF_DT_F16 ? H_F16 : H_BF16;
        }
        mf_sb_printf(s, "(%s)", x->ct);
        emit_int(s, in->iconst);
        if (is16(dt))
            mf_sb_printf(s, ")");
    }
    return MF_OK;
}

/* The op's float or double function on every argument. */
static void emit_fcall(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    emit_call(s, g, x->dt == MF_DT_F64 ? x->op->f64 : x->op->f32, NULL, x->in, x->dt);
}

static int emit_math1(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    if (x->c != 2)
        return mf_cg_fail(g, "%s #%d: result dtype %s is not floating", x->op->name, x->i,
                          mf_cg_dtypes[x->dt].name);
    emit_fcall(s, g, x);
    return MF_OK;
}

/* floor / ceil / trunc / round: the identity on integers and bools. */
static int emit_round1(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    if (x->c == 2)
        emit_fcall(s, g, x);
    else
        cast_to(s, g, x->a0, x->dt);
    return MF_OK;
}

static int emit_abs(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    if (x->c == 2)
        emit_fcall(s, g, x);
    else if (x->c == 1)
        mf_sb_printf(s, "(%s)(v%d < 0 ? -v%d : v%d)", x->ct, x->a0, x->a0, x->a0);
    else
        cast_to(s, g, x->a0, x->dt);
    return MF_OK;
}

static int emit_neg(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    if (x->c == 0)
        return mf_cg_fail(g, "neg #%d: bool result", x->i);
    mf_sb_printf(s, "(%s)(-", x->ct);
    cast_to(s, g, x->a0, x->dt);
    mf_sb_printf(s, ")");
    return MF_OK;
}

static int emit_sign(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    if (x->c == 0) {
        cast_to(s, g, x->a0, x->dt);
    } else {
        mf_sb_printf(s, "(%s)((", x->ct);
        cast_to(s, g, x->a0, x->dt);
        mf_sb_printf(s, " > 0) - (");
        cast_to(s, g, x->a0, x->dt);
        mf_sb_printf(s, " < 0))");
    }
    return MF_OK;
}

/* signbit and isfinite look at the argument's own dtype. */
static int emit_signbit(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    int adt = g->vdtype[x->a0];
    if (cat(adt) == 2)
        mf_sb_printf(s, adt == MF_DT_F64 ? "(%s)(__double_as_longlong(v%d) < 0)" : "(%s)(__float_as_int(v%d) < 0)",
                     x->ct, x->a0);
    else if (cat(adt) == 1)
        mf_sb_printf(s, "(%s)(v%d < 0)", x->ct, x->a0);
    else
        mf_sb_printf(s, "(%s)false", x->ct);
    return MF_OK;
}

static int emit_isfinite(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    int adt = g->vdtype[x->a0];
    if (cat(adt) == 2)
        mf_sb_printf(s, "(%s)isfinite(v%d)", x->ct, x->a0);
    else
        mf_sb_printf(s, "(%s)true", x->ct);
    return MF_OK;
}

static int emit_bnot(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    if (x->c == 0) {
        mf_sb_printf(s, "!");
        cast_to(s, g, x->a0, x->dt);
    } else if (x->c == 1) {
        mf_sb_printf(s, "(%s)(~", x->ct);
        cast_to(s, g, x->a0, x->dt);
        mf_sb_printf(s, ")");
    } else {
        return mf_cg_fail(g, "bitwise_not #%d: floating result", x->i);
    }
    return MF_OK;
}

static int emit_recip(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    if (x->c != 2)
        return mf_cg_fail(g, "reciprocal #%d: result dtype %s is not floating", x->i, mf_cg_dtypes[x->dt].name);
    mf_sb_printf(s, "(%s / ", x->dt == MF_DT_F64 ? "1.0" : "1.0f");
    cast_to(s, g, x->a0, x->dt);
    mf_sb_printf(s, ")");
    return MF_OK;
}

static int emit_lnot(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    mf_sb_printf(s, "(%s)!", x->ct);
    cast_to(s, g, x->a0, MF_DT_BOOL);
    return MF_OK;
}

static int emit_convert(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    cast_to(s, g, x->a0, x->dt);
    return MF_OK;
}

static int emit_arith2(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    if (x->c == 0) {
        /* PyTorch on bool: add == or, mul == and; it rejects sub, and div
         * of bools yields a float. */
        const char *bop = x->op->f32[0] == '+' ? "||" : x->op->f32[0] == '*' ? "&&" : NULL;
        if (!bop)
            return mf_cg_fail(g, "%s #%d: bool result", x->op->name, x->i);
        emit_infix(s, g, "bool", x->a0, bop, x->a1, MF_DT_BOOL);
        return MF_OK;
    }
    emit_infix(s, g, x->ct, x->a0, x->op->f32, x->a1, x->dt);
    return MF_OK;
}

/* fmod / remainder / pow / atan2 / nextafter: math functions on floats;
 * on integers fmod is %, remainder and pow are our helpers. */
static int emit_math2(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    const char *name = x->op->name;
    if (x->c == 2) {
        if (strcmp(name, "remainder") == 0)
            g->helpers |= H_REM;
        emit_fcall(s, g, x);
    } else if (x->c == 1 && strcmp(name, "fmod") == 0) {
        emit_infix(s, g, x->ct, x->a0, "%", x->a1, x->dt);
    } else if (x->c == 1 && (strcmp(name, "remainder") == 0 || strcmp(name, "pow") == 0)) {
        int isrem = name[0] == 'r';
        g->helpers |= isrem ? H_IREM : H_IPOW;
        emit_call(s, g, isrem ? "mf_irem" : "mf_ipow", x->ct, x->in, x->dt);
    } else {
        return mf_cg_fail(g, "%s #%d: unsupported result dtype %s", name, x->i, mf_cg_dtypes[x->dt].name);
    }
    return MF_OK;
}

static int emit_maxmin(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    if (x->c == 0) {
        emit_infix(s, g, NULL, x->a0, strcmp(x->op->f32, "mf_max") == 0 ? "||" : "&&", x->a1, MF_DT_BOOL);
        return MF_OK;
    }
    g->helpers |= H_MAXMIN;
    emit_call(s, g, x->op->f32, x->ct, x->in, x->dt);
    return MF_OK;
}

static int emit_bit2(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    const char *o = x->op->f32;
    if (x->c == 2)
        return mf_cg_fail(g, "%s #%d: floating result", x->op->name, x->i);
    if (x->c == 0) {
        const char *bop = o[0] == '&' ? "&&" : o[0] == '|' ? "||" : o[0] == '^' ? "!=" : NULL;
        if (!bop)
            return mf_cg_fail(g, "%s #%d: bool operands", x->op->name, x->i);
        emit_infix(s, g, NULL, x->a0, bop, x->a1, MF_DT_BOOL);
        return MF_OK;
    }
    emit_infix(s, g, x->ct, x->a0, o, x->a1, x->dt);
    return MF_OK;
}

static int emit_cmp(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    emit_infix(s, g, x->ct, x->a0, x->op->f32, x->a1, compare_dtype(g, x->in));
    return MF_OK;
}

static int emit_logic2(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    emit_infix(s, g, x->ct, x->a0, x->op->f32, x->a1, MF_DT_BOOL);
    return MF_OK;
}

static int emit_where(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    mf_sb_printf(s, "(");
    cast_to(s, g, x->a0, MF_DT_BOOL);
    mf_sb_printf(s, " ? ");
    cast_to(s, g, x->a1, x->dt);
    mf_sb_printf(s, " : ");
    cast_to(s, g, x->a2, x->dt);
    mf_sb_printf(s, ")");
    return MF_OK;
}

static int emit_lerp(mf_sb *s, mf_cg_gen *g, const instr_view *x)
{
    if (x->c != 2)
        return mf_cg_fail(g, "lerp #%d: result dtype %s is not floating", x->i, mf_cg_dtypes[x->dt].name);
    g->helpers |= H_LERP;
    emit_call(s, g, "mf_lerp", x->ct, x->in, x->dt);
    return MF_OK;
}

static const emit_kind_fn g_emit_kind[K_COUNT] = {
    [K_CONST] = emit_const,     [K_MATH1] = emit_math1,   [K_ROUND1] = emit_round1,
    [K_ABS] = emit_abs,         [K_NEG] = emit_neg,       [K_SIGN] = emit_sign,
    [K_SIGNBIT] = emit_signbit, [K_ISFINITE] = emit_isfinite, [K_BNOT] = emit_bnot,
    [K_RECIP] = emit_recip,     [K_LNOT] = emit_lnot,     [K_CONVERT] = emit_convert,
    [K_ARITH2] = emit_arith2,   [K_MATH2] = emit_math2,   [K_MAXMIN] = emit_maxmin,
    [K_BIT2] = emit_bit2,       [K_CMP] = emit_cmp,       [K_LOGIC2] = emit_logic2,
    [K_WHERE] = emit_where,     [K_LERP] = emit_lerp,
};

/* The dispatcher: the declaration, the kind's expression, and around it
 * the rounding of a 16-bit float result (NOTE [compute types]; a literal
 * rounds itself). */
int mf_cg_emit_instr(mf_sb *s, mf_cg_gen *g, int i)
{
    const mf_codegen_instr *in = &g->r->instrs[i];
    instr_view x;
    int round16, rc;

    x.in = in;
    x.op = &mf_cg_ops[in->op];
    x.i = i;
    x.dt = in->dtype;
    x.c = cat(x.dt);
    x.ct = mf_cg_dtypes[x.dt].ctype;
    x.a0 = in->nargs > 0 ? in->args[0] : -1;
    x.a1 = in->nargs > 1 ? in->args[1] : -1;
    x.a2 = in->nargs > 2 ? in->args[2] : -1;
    round16 = is16(x.dt) && x.op->kind != K_CONST;

    mf_sb_printf(s, "    const %s v%d = ", x.ct, g->r->n_inputs + i);
    if (round16)
        mf_sb_printf(s, "%s(", x.dt == MF_DT_F16 ? "mf_rh" : "mf_rbf");
    if (x.op->kind < 0 || x.op->kind >= K_COUNT || !g_emit_kind[x.op->kind])
        return mf_cg_fail(g, "internal: op kind %d", x.op->kind);
    if ((rc = g_emit_kind[x.op->kind](s, g, &x)) != MF_OK)
        return rc;
    if (round16) {
        mf_sb_printf(s, ")");
        g->helpers |= x.dt == MF_DT_F16 ? H_F16 : H_BF16;
    }
    mf_sb_printf(s, ";\n");
    return MF_OK;
}
