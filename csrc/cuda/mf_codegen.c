/*
 * mf_codegen.c -- generate ONE self-contained CUDA C kernel for a fused region
 * of elementwise operations.
 *
 * NOTE [region format]
 * The Python side (thunder_memfuse/regions/nvrtc/lowering.py) lowers Thunder's bound symbols
 * to leaf prims and then to this flat, shape-free program:
 *
 *   inputs   : n_inputs entries (is_scalar, dtype).  Value ids 0..n_inputs-1.
 *              A tensor input is read at the current point through its own
 *              strides over the iteration space (stride 0 = broadcast); the
 *              same tensor may appear twice with different strides.  A scalar
 *              input is a kernel argument (bool / int64 / float64).
 *   instrs   : n_instrs entries (op, args[nargs], dtype[, constant]).  Value id
 *              of instr i is n_inputs + i; args refer to smaller ids only.
 *              Ops carry Thunder's prim names (add, where, convert_element_type,
 *              ...; the table below), plus "const" for a literal that the trace
 *              holds (emitted into the source).
 *   outputs  : (value id, guarded).  The storage dtype is the value's dtype.
 *   variant  : ndim (rank of the collapsed iteration space), index64,
 *              contiguous.
 *
 * In Python the same region is written as a tuple, parsed by cuda_py.c:
 *   (inputs, instrs, outputs, ndim, index64, contiguous) with
 *   inputs  = [(kind "tensor"|"scalar", dtype name), ...]
 *   instrs  = [(op name, (arg ids...), dtype name[, constant]), ...]
 *   outputs = [(value id, guarded bool), ...]
 *
 * Shapes are not part of the program: broadcast_in_dim / transpose / squeeze
 * are resolved in Python into per-input stride vectors, so one kernel serves
 * every shape of the same rank.
 *
 * NOTE [kernel parameters]
 * The kernel takes ONE by-value struct whose fields are all 8 bytes, in this
 * order (so host packing is a flat little-endian array of 8-byte slots):
 *   long long numel;
 *   long long size[ndim];                 (strided variant only)
 *   void *ptr[NT];                        tensor inputs in input order, then outputs
 *   long long stride[NT][ndim];           (strided variant only), in elements
 *   double|long long s<i>;                one per scalar input, in input order
 *                                         (float64 -> double, int64/bool -> long long)
 * NT = number of tensor inputs + number of outputs.
 *
 * NOTE [compute types]
 *   bool -> bool, uint8/int8/int16/int32/int64 -> the C type of that width,
 *   float16/bfloat16/float32 -> float, float64 -> double.
 *   16-bit floats are converted with bit operations (no cuda_fp16.h) and every
 *   float16/bfloat16 result is rounded to its storage type right away, so
 *   intermediates match eager PyTorch, which materializes them.
 *   Arithmetic and math ops compute in the result's compute type (arguments
 *   are cast to it).  Comparisons compute in the promoted type of their
 *   arguments: the tensor types decide unless a scalar has a higher category
 *   (bool < int < float), in which case int -> long long, float -> float
 *   (PyTorch's default dtype), which is how PyTorch treats Python scalars.
 *   where: condition as bool, branches in the result type.
 *
 * NOTE [broadcast outputs]
 * An output smaller than the iteration space (e.g. a (4,) value used by a
 * (4,4) one) has stride 0 along the missing dims.  Every point would store the
 * same value there; a guarded output is stored only by the points whose index
 * is 0 along each stride-0 dim, so each element has exactly one writer.
 *
 * NOTE [index width]
 * index64 = 0 uses unsigned 32-bit index arithmetic: the caller chooses it only
 * when numel, every extent and every tensor's largest element offset are below
 * 2^31, so i + grid stride never wraps.  index64 = 1 uses unsigned 64-bit.
 */
#include "mf_codegen.h"
#include "mf_cuda.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- tables ----------------------------------------------------------------- */

typedef struct dtype_desc {
    const char *name;
    const char *ctype;     /* compute type */
    const char *stype;     /* storage type */
    int category;          /* 0 bool, 1 integer, 2 floating */
} dtype_desc;

static const dtype_desc g_dtypes[MF_DT_COUNT] = {
    {"bool", "bool", "unsigned char", 0},
    {"uint8", "unsigned char", "unsigned char", 1},
    {"int8", "signed char", "signed char", 1},
    {"int16", "short", "short", 1},
    {"int32", "int", "int", 1},
    {"int64", "long long", "long long", 1},
    {"float16", "float", "unsigned short", 2},
    {"bfloat16", "float", "unsigned short", 2},
    {"float32", "float", "float", 2},
    {"float64", "double", "double", 2},
};

enum {
    K_CONST,
    K_MATH1,    /* float-only unary math: f32/f64 function names */
    K_ROUND1,   /* floor/ceil/trunc/round: identity on integers */
    K_ABS,
    K_NEG,
    K_SIGN,
    K_SIGNBIT,
    K_ISFINITE,
    K_BNOT,
    K_RECIP,
    K_LNOT,
    K_CONVERT,
    K_ARITH2,   /* add sub mul div: f32 holds the C operator */
    K_MATH2,    /* fmod pow atan2 nextafter remainder */
    K_MAXMIN,
    K_BIT2,     /* bitwise and/or/xor, shifts: f32 holds the operator */
    K_CMP,      /* f32 holds the operator */
    K_LOGIC2,   /* logical and/or/xor: f32 holds the operator */
    K_WHERE,
    K_LERP
};

typedef struct op_desc {
    const char *name;
    int arity;
    int kind;
    const char *f32;   /* float function / operator */
    const char *f64;   /* double function */
} op_desc;

/* Names follow thunder.core.prims (PrimIDs lower-cased) where a prim exists. */
static const op_desc g_ops[] = {
    {"const", 0, K_CONST, NULL, NULL},
    /* unary math (float results) */
    {"exp", 1, K_MATH1, "expf", "exp"},
    {"exp2", 1, K_MATH1, "exp2f", "exp2"},
    {"expm1", 1, K_MATH1, "expm1f", "expm1"},
    {"log", 1, K_MATH1, "logf", "log"},
    {"log1p", 1, K_MATH1, "log1pf", "log1p"},
    {"log2", 1, K_MATH1, "log2f", "log2"},
    {"log10", 1, K_MATH1, "log10f", "log10"},
    {"sqrt", 1, K_MATH1, "sqrtf", "sqrt"},
    {"rsqrt", 1, K_MATH1, "rsqrtf", "rsqrt"},
    {"sin", 1, K_MATH1, "sinf", "sin"},
    {"cos", 1, K_MATH1, "cosf", "cos"},
    {"tan", 1, K_MATH1, "tanf", "tan"},
    {"sinh", 1, K_MATH1, "sinhf", "sinh"},
    {"cosh", 1, K_MATH1, "coshf", "cosh"},
    {"tanh", 1, K_MATH1, "tanhf", "tanh"},
    {"asin", 1, K_MATH1, "asinf", "asin"},
    {"acos", 1, K_MATH1, "acosf", "acos"},
    {"atan", 1, K_MATH1, "atanf", "atan"},
    {"asinh", 1, K_MATH1, "asinhf", "asinh"},
    {"acosh", 1, K_MATH1, "acoshf", "acosh"},
    {"atanh", 1, K_MATH1, "atanhf", "atanh"},
    {"erf", 1, K_MATH1, "erff", "erf"},
    {"erfc", 1, K_MATH1, "erfcf", "erfc"},
    {"erfinv", 1, K_MATH1, "erfinvf", "erfinv"},
    {"erfcinv", 1, K_MATH1, "erfcinvf", "erfcinv"},
    {"lgamma", 1, K_MATH1, "lgammaf", "lgamma"},
    {"ndtri", 1, K_MATH1, "normcdfinvf", "normcdfinv"},
    {"floor", 1, K_ROUND1, "floorf", "floor"},
    {"ceil", 1, K_ROUND1, "ceilf", "ceil"},
    {"trunc", 1, K_ROUND1, "truncf", "trunc"},
    {"round", 1, K_ROUND1, "rintf", "rint"}, /* half to even, like torch.round */
    {"abs", 1, K_ABS, "fabsf", "fabs"},
    {"neg", 1, K_NEG, NULL, NULL},
    {"sign", 1, K_SIGN, NULL, NULL},
    {"signbit", 1, K_SIGNBIT, NULL, NULL},
    {"isfinite", 1, K_ISFINITE, NULL, NULL},
    {"bitwise_not", 1, K_BNOT, NULL, NULL},
    {"reciprocal", 1, K_RECIP, NULL, NULL},
    {"logical_not", 1, K_LNOT, NULL, NULL},
    {"convert_element_type", 1, K_CONVERT, NULL, NULL},
    /* binary */
    {"add", 2, K_ARITH2, "+", NULL},
    {"sub", 2, K_ARITH2, "-", NULL},
    {"mul", 2, K_ARITH2, "*", NULL},
    {"div", 2, K_ARITH2, "/", NULL}, /* integers: truncation, like prims.div */
    {"fmod", 2, K_MATH2, "fmodf", "fmod"},
    {"remainder", 2, K_MATH2, "mf_rem_f", "mf_rem_d"},
    {"pow", 2, K_MATH2, "powf", "pow"},
    {"atan2", 2, K_MATH2, "atan2f", "atan2"},
    {"nextafter", 2, K_MATH2, "nextafterf", "nextafter"},
    {"maximum", 2, K_MAXMIN, "mf_max", NULL},
    {"minimum", 2, K_MAXMIN, "mf_min", NULL},
    {"bitwise_and", 2, K_BIT2, "&", NULL},
    {"bitwise_or", 2, K_BIT2, "|", NULL},
    {"bitwise_xor", 2, K_BIT2, "^", NULL},
    {"bitwise_left_shift", 2, K_BIT2, "<<", NULL},
    {"bitwise_right_shift", 2, K_BIT2, ">>", NULL},
    {"eq", 2, K_CMP, "==", NULL},
    {"ne", 2, K_CMP, "!=", NULL},
    {"lt", 2, K_CMP, "<", NULL},
    {"le", 2, K_CMP, "<=", NULL},
    {"gt", 2, K_CMP, ">", NULL},
    {"ge", 2, K_CMP, ">=", NULL},
    {"logical_and", 2, K_LOGIC2, "&&", NULL},
    {"logical_or", 2, K_LOGIC2, "||", NULL},
    {"logical_xor", 2, K_LOGIC2, "!=", NULL},
    /* ternary */
    {"where", 3, K_WHERE, NULL, NULL},
    {"lerp", 3, K_LERP, NULL, NULL},
};

#define N_OPS ((int)(sizeof g_ops / sizeof g_ops[0]))

int mf_codegen_op_count(void) { return N_OPS; }

int mf_codegen_op_id(const char *name)
{
    int i;
    for (i = 0; i < N_OPS; i++)
        if (strcmp(g_ops[i].name, name) == 0)
            return i;
    return -1;
}

const char *mf_codegen_op_name(int op) { return op >= 0 && op < N_OPS ? g_ops[op].name : NULL; }
int mf_codegen_op_arity(int op) { return op >= 0 && op < N_OPS ? g_ops[op].arity : -1; }

int mf_codegen_dtype_id(const char *name)
{
    int i;
    for (i = 0; i < MF_DT_COUNT; i++)
        if (strcmp(g_dtypes[i].name, name) == 0)
            return i;
    return -1;
}

const char *mf_codegen_dtype_name(int dt) { return dt >= 0 && dt < MF_DT_COUNT ? g_dtypes[dt].name : NULL; }

/* ---- string builder ------------------------------------------------------ */

typedef struct sb {
    char *buf;
    size_t len, cap;
    int oom;
} sb;

static void sb_printf(sb *s, const char *fmt, ...)
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

/* ---- helpers emitted into the kernel ------------------------------------- */

enum {
    H_F16 = 1 << 0,
    H_BF16 = 1 << 1,
    H_REM = 1 << 2,
    H_IREM = 1 << 3,
    H_IPOW = 1 << 4,
    H_MAXMIN = 1 << 5,
    H_LERP = 1 << 6
};

static const char HELP_F16[] =
    "/* float16 <-> float by bit operations (round to nearest even). */\n"
    "__device__ __forceinline__ float mf_h2f(unsigned short h) {\n"
    "  unsigned int s = ((unsigned int)h & 0x8000u) << 16;\n"
    "  unsigned int e = ((unsigned int)h >> 10) & 0x1fu;\n"
    "  unsigned int m = (unsigned int)h & 0x3ffu;\n"
    "  unsigned int bits;\n"
    "  if (e == 0u) {\n"
    "    if (m == 0u) {\n"
    "      bits = s;\n"
    "    } else {\n"
    "      e = 113u;\n"
    "      while ((m & 0x400u) == 0u) { m <<= 1; e -= 1u; }\n"
    "      bits = s | (e << 23) | ((m & 0x3ffu) << 13);\n"
    "    }\n"
    "  } else if (e == 31u) {\n"
    "    bits = s | 0x7f800000u | (m << 13);\n"
    "  } else {\n"
    "    bits = s | ((e + 112u) << 23) | (m << 13);\n"
    "  }\n"
    "  return __int_as_float((int)bits);\n"
    "}\n"
    "__device__ __forceinline__ unsigned short mf_f2h(float f) {\n"
    "  unsigned int x = (unsigned int)__float_as_int(f);\n"
    "  unsigned int s = (x >> 16) & 0x8000u;\n"
    "  unsigned int a = x & 0x7fffffffu;\n"
    "  if (a > 0x7f800000u) return (unsigned short)(s | 0x7e00u);\n"
    "  if (a >= 0x477ff000u) return (unsigned short)(s | 0x7c00u);\n"
    "  if (a < 0x38800000u) {\n"
    "    unsigned int m = (unsigned int)rintf(__int_as_float((int)a) * 16777216.0f);\n"
    "    return (unsigned short)(s | m);\n"
    "  }\n"
    "  a -= 0x38000000u;\n"
    "  a += 0x0fffu + ((a >> 13) & 1u);\n"
    "  return (unsigned short)(s | (a >> 13));\n"
    "}\n"
    "__device__ __forceinline__ float mf_rh(float f) { return mf_h2f(mf_f2h(f)); }\n";

static const char HELP_BF16[] =
    "/* bfloat16 <-> float by bit operations (round to nearest even). */\n"
    "__device__ __forceinline__ float mf_bf2f(unsigned short h) {\n"
    "  return __int_as_float((int)((unsigned int)h << 16));\n"
    "}\n"
    "__device__ __forceinline__ unsigned short mf_f2bf(float f) {\n"
    "  unsigned int x = (unsigned int)__float_as_int(f);\n"
    "  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x0040u);\n"
    "  x += 0x7fffu + ((x >> 16) & 1u);\n"
    "  return (unsigned short)(x >> 16);\n"
    "}\n"
    "__device__ __forceinline__ float mf_rbf(float f) { return mf_bf2f(mf_f2bf(f)); }\n";

static const char HELP_REM[] =
    "/* Python-style remainder: the result takes the sign of the divisor. */\n"
    "__device__ __forceinline__ float mf_rem_f(float a, float b) {\n"
    "  float r = fmodf(a, b);\n"
    "  if (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) r += b;\n"
    "  return r;\n"
    "}\n"
    "__device__ __forceinline__ double mf_rem_d(double a, double b) {\n"
    "  double r = fmod(a, b);\n"
    "  if (r != 0.0 && ((r < 0.0) != (b < 0.0))) r += b;\n"
    "  return r;\n"
    "}\n";

static const char HELP_IREM[] =
    "template <typename T> __device__ __forceinline__ T mf_irem(T a, T b) {\n"
    "  T r = (T)(a % b);\n"
    "  if (r != 0 && ((r < 0) != (b < 0))) r = (T)(r + b);\n"
    "  return r;\n"
    "}\n";

static const char HELP_IPOW[] =
    "template <typename T> __device__ __forceinline__ T mf_ipow(T a, T b) {\n"
    "  if (b < 0) {\n"
    "    if (a == 1) return (T)1;\n"
    "    if (a == (T)-1) return (b & 1) ? (T)-1 : (T)1;\n"
    "    return (T)0;\n"
    "  }\n"
    "  T r = (T)1;\n"
    "  while (b != 0) {\n"
    "    if (b & 1) r = (T)(r * a);\n"
    "    b = (T)(b >> 1);\n"
    "    a = (T)(a * a);\n"
    "  }\n"
    "  return r;\n"
    "}\n";

static const char HELP_MAXMIN[] =
    "/* maximum/minimum propagate NaN like torch.maximum/minimum. */\n"
    "template <typename T> __device__ __forceinline__ T mf_max(T a, T b) {\n"
    "  return (a != a) ? a : ((a > b) ? a : b);\n"
    "}\n"
    "template <typename T> __device__ __forceinline__ T mf_min(T a, T b) {\n"
    "  return (a != a) ? a : ((a < b) ? a : b);\n"
    "}\n";

static const char HELP_LERP[] =
    "template <typename T> __device__ __forceinline__ T mf_lerp(T s, T e, T w) {\n"
    "  return (w < (T)0.5) ? s + w * (e - s) : e - (e - s) * ((T)1 - w);\n"
    "}\n";

/* ---- emission ------------------------------------------------------------- */

typedef struct gen {
    const mf_codegen_region *r;
    int *vdtype;        /* dtype of each value */
    int *vscalar;       /* value is a scalar (input scalar or const) */
    int *tensor_slot;   /* input id -> operand slot (tensor inputs), -1 otherwise */
    int n_values;
    int n_tensor_inputs;
    int nt;             /* tensor operands: tensor inputs + outputs */
    unsigned helpers;
    mf_cuda_ctx *ctx;   /* messages of bad regions (NOTE [cuda errors]) */
} gen;

static int fail(gen *g, const char *fmt, ...)
{
    va_list ap;
    if (g->ctx) {
        va_start(ap, fmt);
        vsnprintf(g->ctx->err, sizeof g->ctx->err, fmt, ap);
        va_end(ap);
    }
    return MF_EINVAL;
}

static int is16(int dt) { return dt == MF_DT_F16 || dt == MF_DT_BF16; }
static int cat(int dt) { return g_dtypes[dt].category; }

/* Widest (for promotion of tensor-tensor comparisons): rank in this order. */
static int rank(int dt)
{
    static const int order[MF_DT_COUNT] = {0, 1, 1, 2, 3, 4, 5, 5, 6, 7};
    return order[dt];
}

/* "vN" converted to the compute type of dt. */
static void cast_to(sb *s, gen *g, int v, int dt)
{
    int from = g->vdtype[v];
    const char *ct = g_dtypes[dt].ctype;
    if (strcmp(g_dtypes[from].ctype, ct) == 0)
        sb_printf(s, "v%d", v);
    else if (dt == MF_DT_BOOL)
        sb_printf(s, "(v%d != 0)", v);
    else
        sb_printf(s, "((%s)v%d)", ct, v);
}

/* Compute dtype of a comparison (NOTE [compute types]). */
static int compare_dtype(gen *g, const mf_codegen_instr *in)
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

static void emit_double(sb *s, double x)
{
    if (x != x)
        sb_printf(s, "__longlong_as_double(0x7ff8000000000000LL)");
    else if (isinf(x))
        sb_printf(s, "__longlong_as_double(%s)", x > 0 ? "0x7ff0000000000000LL" : "(long long)0xfff0000000000000ULL");
    else {
        char tmp[64];
        snprintf(tmp, sizeof tmp, "%.17g", x);
        if (!strpbrk(tmp, ".eE"))
            strcat(tmp, ".0");
        sb_printf(s, "%s", tmp);
    }
}

static void emit_int(sb *s, int64_t x)
{
    if (x == INT64_MIN)
        sb_printf(s, "(-9223372036854775807LL - 1LL)");
    else
        sb_printf(s, "%lldLL", (long long)x);
}

/* "(<cast>)(a <op> b)", or "(a <op> b)" when cast is NULL; both operands
 * converted to the compute type of dt. */
static void emit_infix(sb *s, gen *g, const char *cast, int a, const char *op, int b, int dt)
{
    if (cast)
        sb_printf(s, "(%s)", cast);
    sb_printf(s, "(");
    cast_to(s, g, a, dt);
    sb_printf(s, " %s ", op);
    cast_to(s, g, b, dt);
    sb_printf(s, ")");
}

/* "fn(args)", or "fn<targ>(args)" when targ is not NULL: every argument of
 * the instruction, comma separated, converted to the compute type of dt. */
static void emit_call(sb *s, gen *g, const char *fn, const char *targ, const mf_codegen_instr *in, int dt)
{
    int j;
    if (targ)
        sb_printf(s, "%s<%s>(", fn, targ);
    else
        sb_printf(s, "%s(", fn);
    for (j = 0; j < in->nargs; j++) {
        if (j > 0)
            sb_printf(s, ", ");
        cast_to(s, g, in->args[j], dt);
    }
    sb_printf(s, ")");
}

/* Emit "const <ctype> vN = <expr>;" for instruction i. */
static int emit_instr(sb *s, gen *g, int i)
{
    const mf_codegen_instr *in = &g->r->instrs[i];
    const op_desc *op = &g_ops[in->op];
    int v = g->r->n_inputs + i;
    int dt = in->dtype;
    int c = cat(dt);
    const char *ct = g_dtypes[dt].ctype;
    int a0 = in->nargs > 0 ? in->args[0] : -1;
    int a1 = in->nargs > 1 ? in->args[1] : -1;
    int a2 = in->nargs > 2 ? in->args[2] : -1;
    int round16 = is16(dt) && op->kind != K_CONST;
    int adt;

    sb_printf(s, "    const %s v%d = ", ct, v);
    if (round16)
        sb_printf(s, "%s(", dt == MF_DT_F16 ? "mf_rh" : "mf_rbf");

    switch (op->kind) {
    case K_CONST:
        if (in->const_kind == 2) {
            sb_printf(s, "%s", in->iconst ? "true" : "false");
            if (dt != MF_DT_BOOL)
                return fail(g, "const #%d: bool literal with dtype %s", i, g_dtypes[dt].name);
        } else if (in->const_kind == 1) {
            if (c != 2)
                return fail(g, "const #%d: float literal with dtype %s", i, g_dtypes[dt].name);
            if (dt == MF_DT_F64)
                emit_double(s, in->fconst);
            else {
                /* Round the literal to its own dtype once, on the device. */
                sb_printf(s, "%s((float)", dt == MF_DT_F16 ? "mf_rh" : dt == MF_DT_BF16 ? "mf_rbf" : "");
                emit_double(s, in->fconst);
                sb_printf(s, ")");
                if (is16(dt))
                    g->helpers |= dt == MF_DT_F16 ? H_F16 : H_BF16;
            }
        } else {
            if (c == 0) {
                sb_printf(s, "%s", in->iconst ? "true" : "false");
            } else {
                if (is16(dt)) {
                    sb_printf(s, "%s(", dt == MF_DT_F16 ? "mf_rh" : "mf_rbf");
                    g->helpers |= dt == MF_DT_F16 ? H_F16 : H_BF16;
                }
                sb_printf(s, "(%s)", ct);
                emit_int(s, in->iconst);
                if (is16(dt))
                    sb_printf(s, ")");
            }
        }
        break;
    case K_MATH1:
        if (c != 2)
            return fail(g, "%s #%d: result dtype %s is not floating", op->name, i, g_dtypes[dt].name);
        emit_call(s, g, dt == MF_DT_F64 ? op->f64 : op->f32, NULL, in, dt);
        break;
    case K_ROUND1:
        if (c == 2) {
            emit_call(s, g, dt == MF_DT_F64 ? op->f64 : op->f32, NULL, in, dt);
        } else {
            cast_to(s, g, a0, dt);
        }
        break;
    case K_ABS:
        if (c == 2) {
            emit_call(s, g, dt == MF_DT_F64 ? op->f64 : op->f32, NULL, in, dt);
        } else if (c == 1) {
            sb_printf(s, "(%s)(v%d < 0 ? -v%d : v%d)", ct, a0, a0, a0);
        } else {
            cast_to(s, g, a0, dt);
        }
        break;
    case K_NEG:
        if (c == 0)
            return fail(g, "neg #%d: bool result", i);
        sb_printf(s, "(%s)(-", ct);
        cast_to(s, g, a0, dt);
        sb_printf(s, ")");
        break;
    case K_SIGN:
        if (c == 0) {
            cast_to(s, g, a0, dt);
        } else {
            sb_printf(s, "(%s)((", ct);
            cast_to(s, g, a0, dt);
            sb_printf(s, " > 0) - (");
            cast_to(s, g, a0, dt);
            sb_printf(s, " < 0))");
        }
        break;
    case K_SIGNBIT:
        adt = g->vdtype[a0];
        if (cat(adt) == 2)
            sb_printf(s, adt == MF_DT_F64 ? "(%s)(__double_as_longlong(v%d) < 0)" : "(%s)(__float_as_int(v%d) < 0)", ct, a0);
        else if (cat(adt) == 1)
            sb_printf(s, "(%s)(v%d < 0)", ct, a0);
        else
            sb_printf(s, "(%s)false", ct);
        break;
    case K_ISFINITE:
        adt = g->vdtype[a0];
        if (cat(adt) == 2)
            sb_printf(s, "(%s)isfinite(v%d)", ct, a0);
        else
            sb_printf(s, "(%s)true", ct);
        break;
    case K_BNOT:
        if (c == 0) {
            sb_printf(s, "!");
            cast_to(s, g, a0, dt);
        } else if (c == 1) {
            sb_printf(s, "(%s)(~", ct);
            cast_to(s, g, a0, dt);
            sb_printf(s, ")");
        } else {
            return fail(g, "bitwise_not #%d: floating result", i);
        }
        break;
    case K_RECIP:
        if (c != 2)
            return fail(g, "reciprocal #%d: result dtype %s is not floating", i, g_dtypes[dt].name);
        sb_printf(s, "(%s / ", dt == MF_DT_F64 ? "1.0" : "1.0f");
        cast_to(s, g, a0, dt);
        sb_printf(s, ")");
        break;
    case K_LNOT:
        sb_printf(s, "(%s)!", ct);
        cast_to(s, g, a0, MF_DT_BOOL);
        break;
    case K_CONVERT:
        cast_to(s, g, a0, dt);
        break;
    case K_ARITH2:
        if (c == 0) {
            /* PyTorch on bool: add == or, mul == and; it rejects sub, and div
             * of bools yields a float. */
            const char *bop = op->f32[0] == '+' ? "||" : op->f32[0] == '*' ? "&&" : NULL;
            if (!bop)
                return fail(g, "%s #%d: bool result", op->name, i);
            emit_infix(s, g, "bool", a0, bop, a1, MF_DT_BOOL);
            break;
        }
        emit_infix(s, g, ct, a0, op->f32, a1, dt);
        break;
    case K_MATH2:
        if (c == 2) {
            if (strcmp(op->name, "remainder") == 0)
                g->helpers |= H_REM;
            emit_call(s, g, dt == MF_DT_F64 ? op->f64 : op->f32, NULL, in, dt);
        } else if (c == 1 && strcmp(op->name, "fmod") == 0) {
            emit_infix(s, g, ct, a0, "%", a1, dt);
        } else if (c == 1 && (strcmp(op->name, "remainder") == 0 || strcmp(op->name, "pow") == 0)) {
            int isrem = op->name[0] == 'r';
            g->helpers |= isrem ? H_IREM : H_IPOW;
            emit_call(s, g, isrem ? "mf_irem" : "mf_ipow", ct, in, dt);
        } else {
            return fail(g, "%s #%d: unsupported result dtype %s", op->name, i, g_dtypes[dt].name);
        }
        break;
    case K_MAXMIN:
        if (c == 0) {
            emit_infix(s, g, NULL, a0, strcmp(op->f32, "mf_max") == 0 ? "||" : "&&", a1, MF_DT_BOOL);
            break;
        }
        g->helpers |= H_MAXMIN;
        emit_call(s, g, op->f32, ct, in, dt);
        break;
    case K_BIT2:
        if (c == 2)
            return fail(g, "%s #%d: floating result", op->name, i);
        if (c == 0) {
            const char *bop = op->f32[0] == '&' ? "&&" : op->f32[0] == '|' ? "||" : op->f32[0] == '^' ? "!=" : NULL;
            if (!bop)
                return fail(g, "%s #%d: bool operands", op->name, i);
            emit_infix(s, g, NULL, a0, bop, a1, MF_DT_BOOL);
            break;
        }
        emit_infix(s, g, ct, a0, op->f32, a1, dt);
        break;
    case K_CMP:
        emit_infix(s, g, ct, a0, op->f32, a1, compare_dtype(g, in));
        break;
    case K_LOGIC2:
        emit_infix(s, g, ct, a0, op->f32, a1, MF_DT_BOOL);
        break;
    case K_WHERE:
        sb_printf(s, "(");
        cast_to(s, g, a0, MF_DT_BOOL);
        sb_printf(s, " ? ");
        cast_to(s, g, a1, dt);
        sb_printf(s, " : ");
        cast_to(s, g, a2, dt);
        sb_printf(s, ")");
        break;
    case K_LERP:
        if (c != 2)
            return fail(g, "lerp #%d: result dtype %s is not floating", i, g_dtypes[dt].name);
        g->helpers |= H_LERP;
        emit_call(s, g, "mf_lerp", ct, in, dt);
        break;
    default:
        return fail(g, "internal: op kind %d", op->kind);
    }
    if (round16) {
        sb_printf(s, ")");
        g->helpers |= dt == MF_DT_F16 ? H_F16 : H_BF16;
    }
    sb_printf(s, ";\n");
    return MF_OK;
}

static int validate(gen *g)
{
    const mf_codegen_region *r = g->r;
    int i, j;
    if (r->n_inputs < 0 || r->n_instrs < 0 || r->n_outputs < 1)
        return fail(g, "region needs at least one output");
    if (r->ndim < 1 || r->ndim > MF_CODEGEN_MAX_DIMS)
        return fail(g, "ndim %d out of range 1..%d", r->ndim, MF_CODEGEN_MAX_DIMS);
    for (i = 0; i < r->n_inputs; i++) {
        int dt = r->inputs[i].dtype;
        if (dt < 0 || dt >= MF_DT_COUNT)
            return fail(g, "input %d: bad dtype %d", i, dt);
        if (r->inputs[i].is_scalar && dt != MF_DT_BOOL && dt != MF_DT_I64 && dt != MF_DT_F64)
            return fail(g, "scalar input %d must be bool, int64 or float64, not %s", i,
                        g_dtypes[dt].name);
    }
    for (i = 0; i < r->n_instrs; i++) {
        const mf_codegen_instr *in = &r->instrs[i];
        int v = r->n_inputs + i;
        if (in->op < 0 || in->op >= N_OPS)
            return fail(g, "instr %d: unknown op %d", i, in->op);
        if (in->nargs != g_ops[in->op].arity)
            return fail(g, "instr %d (%s): %d arguments, expected %d", i, g_ops[in->op].name,
                        in->nargs, g_ops[in->op].arity);
        if (in->dtype < 0 || in->dtype >= MF_DT_COUNT)
            return fail(g, "instr %d (%s): bad dtype %d", i, g_ops[in->op].name, in->dtype);
        for (j = 0; j < in->nargs; j++)
            if (in->args[j] < 0 || in->args[j] >= v)
                return fail(g, "instr %d (%s): argument %d refers to value %d, not defined before",
                            i, g_ops[in->op].name, j, in->args[j]);
    }
    for (i = 0; i < r->n_outputs; i++)
        if (r->outputs[i].value < 0 || r->outputs[i].value >= g->n_values)
            return fail(g, "output %d refers to value %d of %d", i, r->outputs[i].value,
                        g->n_values);
    if (mf_codegen_param_bytes(r) > MF_CODEGEN_MAX_PARAM_BYTES)
        return fail(g, "kernel parameters need %zu bytes (> %d): too many operands or dims",
                    mf_codegen_param_bytes(r), MF_CODEGEN_MAX_PARAM_BYTES);
    return MF_OK;
}

size_t mf_codegen_param_bytes(const mf_codegen_region *r)
{
    size_t nt = (size_t)r->n_outputs, ns = 0, d = r->contiguous ? 0 : (size_t)r->ndim;
    int i;
    for (i = 0; i < r->n_inputs; i++) {
        if (r->inputs[i].is_scalar)
            ns++;
        else
            nt++;
    }
    return 8 * (1 + d + nt + nt * d + ns);
}

static const char *load_expr(int dt)
{
    switch (dt) {
    case MF_DT_BOOL: return "(%s[%s] != 0)";
    case MF_DT_F16: return "mf_h2f(%s[%s])";
    case MF_DT_BF16: return "mf_bf2f(%s[%s])";
    default: return "%s[%s]";
    }
}

int mf_codegen_emit(const mf_codegen_region *r, char **src_out, size_t *len_out, mf_cuda_ctx *ctx)
{
    gen g;
    sb body = {NULL, 0, 0, 0}, out = {NULL, 0, 0, 0};
    int i, d, rc = MF_OK, slot;
    const int D = r->ndim;
    const int strided = !r->contiguous;
    const char *idx = r->index64 ? "unsigned long long" : "unsigned int";
    char off[32];

    *src_out = NULL;
    *len_out = 0;
    memset(&g, 0, sizeof g);
    g.r = r;
    g.ctx = ctx;
    g.n_values = r->n_inputs + r->n_instrs;
    g.vdtype = (int *)calloc((size_t)g.n_values + 1, sizeof(int));
    g.vscalar = (int *)calloc((size_t)g.n_values + 1, sizeof(int));
    g.tensor_slot = (int *)calloc((size_t)r->n_inputs + 1, sizeof(int));
    if (!g.vdtype || !g.vscalar || !g.tensor_slot) {
        rc = fail(&g, "out of memory");
        rc = MF_ENOMEM;
        goto done;
    }
    rc = validate(&g);
    if (rc != MF_OK)
        goto done;
    for (i = 0; i < r->n_inputs; i++) {
        g.vdtype[i] = r->inputs[i].dtype;
        g.vscalar[i] = r->inputs[i].is_scalar;
        g.tensor_slot[i] = r->inputs[i].is_scalar ? -1 : g.n_tensor_inputs++;
    }
    for (i = 0; i < r->n_instrs; i++) {
        g.vdtype[r->n_inputs + i] = r->instrs[i].dtype;
        g.vscalar[r->n_inputs + i] = g_ops[r->instrs[i].op].kind == K_CONST;
    }
    g.nt = g.n_tensor_inputs + r->n_outputs;

    /* ---- kernel body (emitted first: it decides which helpers are used) */
    sb_printf(&body, "extern \"C\" __global__ void __launch_bounds__(MF_BLOCK) %s(const MfParams P) {\n",
              MF_CODEGEN_KERNEL_NAME);
    sb_printf(&body, "  typedef %s mf_idx;\n", idx);
    sb_printf(&body, "  const mf_idx n = (mf_idx)P.numel;\n");
    sb_printf(&body, "  const mf_idx step = (mf_idx)gridDim.x * (mf_idx)blockDim.x;\n");
    for (i = 0; i < r->n_inputs; i++) {
        if (r->inputs[i].is_scalar)
            continue;
        if (is16(r->inputs[i].dtype))
            g.helpers |= r->inputs[i].dtype == MF_DT_F16 ? H_F16 : H_BF16;
        sb_printf(&body, "  const %s* __restrict__ p%d = (const %s*)P.ptr[%d];\n",
                  g_dtypes[r->inputs[i].dtype].stype, g.tensor_slot[i],
                  g_dtypes[r->inputs[i].dtype].stype, g.tensor_slot[i]);
    }
    for (i = 0; i < r->n_outputs; i++) {
        int dt = g.vdtype[r->outputs[i].value];
        if (is16(dt))
            g.helpers |= dt == MF_DT_F16 ? H_F16 : H_BF16;
        sb_printf(&body, "  %s* __restrict__ q%d = (%s*)P.ptr[%d];\n", g_dtypes[dt].stype, i,
                  g_dtypes[dt].stype, g.n_tensor_inputs + i);
    }
    if (strided) {
        for (d = 1; d < D; d++) /* the outermost size is implied by numel */
            sb_printf(&body, "  const mf_idx sz%d = (mf_idx)P.size[%d];\n", d, d);
        for (slot = 0; slot < g.nt; slot++)
            for (d = 0; d < D; d++)
                sb_printf(&body, "  const mf_idx st%d_%d = (mf_idx)P.stride[%d];\n", slot, d,
                          slot * D + d);
    }
    sb_printf(&body, "  for (mf_idx i = (mf_idx)blockIdx.x * (mf_idx)blockDim.x + (mf_idx)threadIdx.x; "
                     "i < n; i += step) {\n");
    if (strided) {
        for (slot = 0; slot < g.nt; slot++)
            sb_printf(&body, "    mf_idx o%d = 0;\n", slot);
        for (i = 0; i < r->n_outputs; i++)
            if (r->outputs[i].guarded)
                sb_printf(&body, "    bool w%d = true;\n", i);
        sb_printf(&body, "    mf_idx r = i;\n");
        for (d = D - 1; d >= 0; d--) {
            if (d > 0)
                sb_printf(&body, "    { const mf_idx c = r %% sz%d; r = r / sz%d;\n", d, d);
            else
                sb_printf(&body, "    { const mf_idx c = r;\n");
            for (slot = 0; slot < g.nt; slot++)
                sb_printf(&body, "      o%d += c * st%d_%d;\n", slot, slot, d);
            for (i = 0; i < r->n_outputs; i++)
                if (r->outputs[i].guarded)
                    sb_printf(&body, "      if (c != 0 && st%d_%d == 0) w%d = false;\n",
                              g.n_tensor_inputs + i, d, i);
            sb_printf(&body, "    }\n");
        }
    }
    /* loads */
    for (i = 0; i < r->n_inputs; i++) {
        int dt = r->inputs[i].dtype;
        if (r->inputs[i].is_scalar) {
            if (dt == MF_DT_BOOL)
                sb_printf(&body, "    const bool v%d = P.s%d != 0;\n", i, i);
            else
                sb_printf(&body, "    const %s v%d = P.s%d;\n", g_dtypes[dt].ctype, i, i);
            continue;
        }
        snprintf(off, sizeof off, strided ? "o%d" : "i", g.tensor_slot[i]);
        {
            char ptr[16];
            snprintf(ptr, sizeof ptr, "p%d", g.tensor_slot[i]);
            sb_printf(&body, "    const %s v%d = ", g_dtypes[dt].ctype, i);
            sb_printf(&body, load_expr(dt), ptr, off);
            sb_printf(&body, ";\n");
        }
    }
    for (i = 0; i < r->n_instrs && rc == MF_OK; i++)
        rc = emit_instr(&body, &g, i);
    if (rc != MF_OK)
        goto done;
    /* stores */
    for (i = 0; i < r->n_outputs; i++) {
        int v = r->outputs[i].value, dt = g.vdtype[v];
        snprintf(off, sizeof off, strided ? "o%d" : "i", g.n_tensor_inputs + i);
        sb_printf(&body, "    ");
        if (strided && r->outputs[i].guarded)
            sb_printf(&body, "if (w%d) ", i);
        switch (dt) {
        case MF_DT_BOOL: sb_printf(&body, "q%d[%s] = (unsigned char)v%d;\n", i, off, v); break;
        case MF_DT_F16: sb_printf(&body, "q%d[%s] = mf_f2h(v%d);\n", i, off, v); break;
        case MF_DT_BF16: sb_printf(&body, "q%d[%s] = mf_f2bf(v%d);\n", i, off, v); break;
        default: sb_printf(&body, "q%d[%s] = v%d;\n", i, off, v); break;
        }
    }
    sb_printf(&body, "  }\n}\n");
    if (body.oom) {
        rc = MF_ENOMEM;
        fail(&g, "out of memory");
        goto done;
    }

    /* ---- header, helpers, parameter struct, body */
    sb_printf(&out, "// thunder_memfuse generated kernel: %d inputs, %d instructions, %d outputs;\n",
              r->n_inputs, r->n_instrs, r->n_outputs);
    sb_printf(&out, "// variant: %s, ndim %d, %s indexing.\n", strided ? "strided" : "contiguous", D,
              r->index64 ? "64-bit" : "32-bit");
    sb_printf(&out, "// ops:");
    for (i = 0; i < r->n_instrs; i++)
        sb_printf(&out, " %s", g_ops[r->instrs[i].op].name);
    sb_printf(&out, "\n#define MF_BLOCK %d\n", MF_CODEGEN_BLOCK);
    if (g.helpers & H_F16)
        sb_printf(&out, "%s", HELP_F16);
    if (g.helpers & H_BF16)
        sb_printf(&out, "%s", HELP_BF16);
    if (g.helpers & H_REM)
        sb_printf(&out, "%s", HELP_REM);
    if (g.helpers & H_IREM)
        sb_printf(&out, "%s", HELP_IREM);
    if (g.helpers & H_IPOW)
        sb_printf(&out, "%s", HELP_IPOW);
    if (g.helpers & H_MAXMIN)
        sb_printf(&out, "%s", HELP_MAXMIN);
    if (g.helpers & H_LERP)
        sb_printf(&out, "%s", HELP_LERP);
    sb_printf(&out, "struct MfParams {\n  long long numel;\n");
    if (strided)
        sb_printf(&out, "  long long size[%d];\n", D);
    sb_printf(&out, "  void* ptr[%d];\n", g.nt);
    if (strided)
        sb_printf(&out, "  long long stride[%d];\n", g.nt * D);
    for (i = 0; i < r->n_inputs; i++)
        if (r->inputs[i].is_scalar)
            sb_printf(&out, "  %s s%d;\n", r->inputs[i].dtype == MF_DT_F64 ? "double" : "long long", i);
    sb_printf(&out, "};\n");
    sb_printf(&out, "%s", body.buf);
    if (out.oom) {
        rc = MF_ENOMEM;
        fail(&g, "out of memory");
        goto done;
    }
    *src_out = out.buf;
    *len_out = out.len;
    out.buf = NULL;
done:
    free(body.buf);
    free(out.buf);
    free(g.vdtype);
    free(g.vscalar);
    free(g.tensor_slot);
    return rc;
}
