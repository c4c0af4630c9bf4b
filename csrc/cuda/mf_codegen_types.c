/*
 * mf_codegen_types.c -- the code generator's tables: element types (name,
 * compute type, storage type: NOTE [compute types] in mf_codegen.c) and ops
 * (Thunder's prim names, arity, how each is emitted), and their lookups by
 * name for the binding.
 */
#include "mf_codegen_internal.h"

#include <string.h>

const mf_cg_dtype_desc mf_cg_dtypes[MF_DT_COUNT] = {
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

/* Names follow thunder.core.prims (PrimIDs lower-cased) where a prim exists. */
const mf_cg_op_desc mf_cg_ops[] = {
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

const int mf_cg_n_ops = (int)(sizeof mf_cg_ops / sizeof mf_cg_ops[0]);

int mf_codegen_op_count(void) { return mf_cg_n_ops; }

int mf_codegen_op_id(const char *name)
{
    int i;
    for (i = 0; i < mf_cg_n_ops; i++)
        if (strcmp(mf_cg_ops[i].name, name) == 0)
            return i;
    return -1;
}

const char *mf_codegen_op_name(int op) { return op >= 0 && op < mf_cg_n_ops ? mf_cg_ops[op].name : NULL; }
int mf_codegen_op_arity(int op) { return op >= 0 && op < mf_cg_n_ops ? mf_cg_ops[op].arity : -1; }

int mf_codegen_dtype_id(const char *name)
{
    int i;
    for (i = 0; i < MF_DT_COUNT; i++)
        if (strcmp(mf_cg_dtypes[i].name, name) == 0)
            return i;
    return -1;
}

const char *mf_codegen_dtype_name(int dt) { return dt >= 0 && dt < MF_DT_COUNT ? mf_cg_dtypes[dt].name : NULL; }
