/*
 * mf_codegen.h -- CUDA C source generation for one fused elementwise region.
 *
 * A region is a straight-line SSA program evaluated once per point of an
 * iteration space of `ndim` dimensions; the generated kernel is a grid-stride
 * loop over the points.  The format is documented in full at the top of
 * mf_codegen.c (NOTE [region format]) and in docs/CUDA.md.
 *
 * Invariants: the output is a pure function of the region (same region ->
 * byte-identical source), self-contained (no #include), C99 here, no Python.h.
 */
#ifndef MF_CODEGEN_H
#define MF_CODEGEN_H

#include <stddef.h>
#include <stdint.h>

#include "mf_cuda.h" /* mf_cuda_ctx, the statuses (NOTE [cuda errors]) */

#ifdef __cplusplus
extern "C" {
#endif

/* Element types.  16-bit floats are stored as 16 bits and computed in float. */
typedef enum mf_dtype {
    MF_DT_BOOL = 0,
    MF_DT_U8,
    MF_DT_I8,
    MF_DT_I16,
    MF_DT_I32,
    MF_DT_I64,
    MF_DT_F16,
    MF_DT_BF16,
    MF_DT_F32,
    MF_DT_F64,
    MF_DT_COUNT
} mf_dtype;

#define MF_CODEGEN_MAX_ARGS 3
#define MF_CODEGEN_MAX_DIMS 16
/* Size limit of the by-value parameter struct (CUDA's classic 4 KiB). */
#define MF_CODEGEN_MAX_PARAM_BYTES 4096
#define MF_CODEGEN_BLOCK 256
#define MF_CODEGEN_KERNEL_NAME "mf_kernel"

typedef struct mf_codegen_input {
    int is_scalar;        /* 0: tensor (pointer + strides), 1: scalar kernel argument */
    int dtype;            /* mf_dtype; scalars: BOOL, I64 or F64 */
} mf_codegen_input;

typedef struct mf_codegen_instr {
    int op;                               /* mf_codegen_op_id(name) */
    int nargs;
    int32_t args[MF_CODEGEN_MAX_ARGS];    /* value ids, each < this value's id */
    int dtype;                            /* mf_dtype of the result */
    int const_kind;                       /* "const": 0 int, 1 float, 2 bool */
    int64_t iconst;
    double fconst;
} mf_codegen_instr;

typedef struct mf_codegen_output {
    int32_t value;        /* value id */
    int guarded;          /* 1: the output is smaller than the iteration space
                             (stride 0 along some dims): store only at index 0
                             of those dims, see NOTE [broadcast outputs] */
} mf_codegen_output;

typedef struct mf_codegen_region {
    int n_inputs;
    const mf_codegen_input *inputs;       /* value ids 0 .. n_inputs-1 */
    int n_instrs;
    const mf_codegen_instr *instrs;       /* value ids n_inputs + i */
    int n_outputs;
    const mf_codegen_output *outputs;
    int ndim;             /* 1 .. MF_CODEGEN_MAX_DIMS (strided variant) */
    int index64;          /* 64-bit indexing */
    int contiguous;       /* fast path: every tensor is dense in iteration order */
} mf_codegen_region;

/* Name <-> id tables; -1 for an unknown name. */
int mf_codegen_op_id(const char *name);
const char *mf_codegen_op_name(int op);
int mf_codegen_op_arity(int op);   /* -1 for unknown */
int mf_codegen_op_count(void);
int mf_codegen_dtype_id(const char *name);
const char *mf_codegen_dtype_name(int dtype);

/* Bytes of the parameter struct for this region (see NOTE [kernel parameters]). */
size_t mf_codegen_param_bytes(const mf_codegen_region *r);

/*
 * Generate the kernel source.  On success *src_out is malloc'd (caller frees),
 * NUL-terminated, *len_out its length.  MF_EINVAL with a message in
 * ctx->err for a malformed or unsupported region (e.g. exp producing int32).
 */
int mf_codegen_emit(const mf_codegen_region *r, char **src_out, size_t *len_out, mf_cuda_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif /* MF_CODEGEN_H */
