/*
 * mf_codegen_internal.h -- what the code generator's own files share: the
 * type and op tables (mf_codegen_types.c), the string builder and the
 * emission of one instruction (mf_codegen_expr.c), used by the kernel
 * assembly (mf_codegen.c).  Not for the binding.
 */
#ifndef MF_CODEGEN_INTERNAL_H
#define MF_CODEGEN_INTERNAL_H

#include <stddef.h>

#include "mf_codegen.h"

/* ---- tables (mf_codegen_types.c) ---- */

typedef struct mf_cg_dtype_desc {
    const char *name;
    const char *ctype;     /* compute type */
    const char *stype;     /* storage type */
    int category;          /* 0 bool, 1 integer, 2 floating */
} mf_cg_dtype_desc;

extern const mf_cg_dtype_desc mf_cg_dtypes[MF_DT_COUNT];

/* How an op is emitted (the per-kind emitters of mf_codegen_expr.c). */
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
    K_LERP,
    K_COUNT
};

typedef struct mf_cg_op_desc {
    const char *name;
    int arity;
    int kind;
    const char *f32;   /* float function / operator */
    const char *f64;   /* double function */
} mf_cg_op_desc;

extern const mf_cg_op_desc mf_cg_ops[];
extern const int mf_cg_n_ops;

static inline int is16(int dt) { return dt == MF_DT_F16 || dt == MF_DT_BF16; }
static inline int cat(int dt) { return mf_cg_dtypes[dt].category; }

/* ---- string builder (mf_codegen_expr.c) ---- */

typedef struct mf_sb {
    char *buf;
    size_t len, cap;
    int oom; /* sticky: a failed allocation; the text is then incomplete */
} mf_sb;

void mf_sb_printf(mf_sb *s, const char *fmt, ...);

/* ---- emission ---- */

/* Helpers emitted into the kernel (their text: mf_codegen.c), one bit each,
 * set by the emitters that use them. */
enum {
    H_F16 = 1 << 0,
    H_BF16 = 1 << 1,
    H_REM = 1 << 2,
    H_IREM = 1 << 3,
    H_IPOW = 1 << 4,
    H_MAXMIN = 1 << 5,
    H_LERP = 1 << 6
};

typedef struct mf_cg_gen {
    const mf_codegen_region *r;
    int *vdtype;        /* dtype of each value */
    int *vscalar;       /* value is a scalar (input scalar or const) */
    int *tensor_slot;   /* input id -> operand slot (tensor inputs), -1 otherwise */
    int n_values;
    int n_tensor_inputs;
    int nt;             /* tensor operands: tensor inputs + outputs */
    unsigned helpers;
    mf_cuda_ctx *ctx;   /* messages of bad regions (NOTE [cuda errors]) */
} mf_cg_gen;

/* MF_EINVAL, with the message in g->ctx when there is one. */
int mf_cg_fail(mf_cg_gen *g, const char *fmt, ...);

/* Emit "const <ctype> vN = <expr>;" for instruction i. */
int mf_cg_emit_instr(mf_sb *s, mf_cg_gen *g, int i);

#endif /* MF_CODEGEN_INTERNAL_H */
