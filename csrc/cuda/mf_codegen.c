/*
 * mf_codegen.c -- generate ONE self-contained CUDA C kernel for a fused region
 * of elementwise operations: checking the region, then assembling the kernel
 * (parameters, index arithmetic, loads, the instructions of
 * mf_codegen_expr.c, stores, the helpers they use).  Tables:
 * mf_codegen_types.c.
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
#include "mf_codegen_internal.h"
#include "mf_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers emitted into the kernel ------------------------------------- */

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

/* ---- kernel assembly ------------------------------------------------------ */

static int validate(mf_cg_gen *g)
{
    const mf_codegen_region *r = g->r;
    int i, j;
    if (r->n_inputs < 0 || r->n_instrs < 0 || r->n_outputs < 1)
        return mf_cg_fail(g, "region needs at least one output");
    if (r->ndim < 1 || r->ndim > MF_CODEGEN_MAX_DIMS)
        return mf_cg_fail(g, "ndim %d out of range 1..%d", r->ndim, MF_CODEGEN_MAX_DIMS);
    for (i = 0; i < r->n_inputs; i++) {
        int dt = r->inputs[i].dtype;
        if (dt < 0 || dt >= MF_DT_COUNT)
            return mf_cg_fail(g, "input %d: bad dtype %d", i, dt);
        if (r->inputs[i].is_scalar && dt != MF_DT_BOOL && dt != MF_DT_I64 && dt != MF_DT_F64)
            return mf_cg_fail(g, "scalar input %d must be bool, int64 or float64, not %s", i,
                        mf_cg_dtypes[dt].name);
    }
    for (i = 0; i < r->n_instrs; i++) {
        const mf_codegen_instr *in = &r->instrs[i];
        int v = r->n_inputs + i;
        if (in->op < 0 || in->op >= mf_cg_n_ops)
            return mf_cg_fail(g, "instr %d: unknown op %d", i, in->op);
        if (in->nargs != mf_cg_ops[in->op].arity)
            return mf_cg_fail(g, "instr %d (%s): %d arguments, expected %d", i, mf_cg_ops[in->op].name,
                        in->nargs, mf_cg_ops[in->op].arity);
        if (in->dtype < 0 || in->dtype >= MF_DT_COUNT)
            return mf_cg_fail(g, "instr %d (%s): bad dtype %d", i, mf_cg_ops[in->op].name, in->dtype);
        for (j = 0; j < in->nargs; j++)
            if (in->args[j] < 0 || in->args[j] >= v)
                return mf_cg_fail(g, "instr %d (%s): argument %d refers to value %d, not defined before",
                            i, mf_cg_ops[in->op].name, j, in->args[j]);
    }
    for (i = 0; i < r->n_outputs; i++)
        if (r->outputs[i].value < 0 || r->outputs[i].value >= g->n_values)
            return mf_cg_fail(g, "output %d refers to value %d of %d", i, r->outputs[i].value,
                        g->n_values);
    if (mf_codegen_param_bytes(r) > MF_CODEGEN_MAX_PARAM_BYTES)
        return mf_cg_fail(g, "kernel parameters need %zu bytes (> %d): too many operands or dims",
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

/* Per-value dtypes and scalar flags, tensor input slots (after validate). */
static int gen_init(mf_cg_gen *g, const mf_codegen_region *r, mf_cuda_ctx *ctx)
{
    int i;
    memset(g, 0, sizeof *g);
    g->r = r;
    g->ctx = ctx;
    g->n_values = r->n_inputs + r->n_instrs;
    g->vdtype = (int *)calloc((size_t)g->n_values + 1, sizeof(int));
    g->vscalar = (int *)calloc((size_t)g->n_values + 1, sizeof(int));
    g->tensor_slot = (int *)calloc((size_t)r->n_inputs + 1, sizeof(int));
    if (!g->vdtype || !g->vscalar || !g->tensor_slot) {
        mf_cg_fail(g, "out of memory");
        return MF_ENOMEM;
    }
    if ((i = validate(g)) != MF_OK)
        return i;
    for (i = 0; i < r->n_inputs; i++) {
        g->vdtype[i] = r->inputs[i].dtype;
        g->vscalar[i] = r->inputs[i].is_scalar;
        g->tensor_slot[i] = r->inputs[i].is_scalar ? -1 : g->n_tensor_inputs++;
    }
    for (i = 0; i < r->n_instrs; i++) {
        g->vdtype[r->n_inputs + i] = r->instrs[i].dtype;
        g->vscalar[r->n_inputs + i] = mf_cg_ops[r->instrs[i].op].kind == K_CONST;
    }
    g->nt = g->n_tensor_inputs + r->n_outputs;
    return MF_OK;
}

static void gen_free(mf_cg_gen *g)
{
    free(g->vdtype);
    free(g->vscalar);
    free(g->tensor_slot);
}

/* The kernel's signature, the operand pointers, sizes and strides. */
static void emit_prologue(mf_sb *body, mf_cg_gen *g)
{
    const mf_codegen_region *r = g->r;
    const int D = r->ndim;
    int i, d, slot;
    mf_sb_printf(body, "extern \"C\" __global__ void __launch_bounds__(MF_BLOCK) %s(const MfParams P) {\n",
                 MF_CODEGEN_KERNEL_NAME);
    mf_sb_printf(body, "  typedef %s mf_idx;\n", r->index64 ? "unsigned long long" : "unsigned int");
    mf_sb_printf(body, "  const mf_idx n = (mf_idx)P.numel;\n");
    mf_sb_printf(body, "  const mf_idx step = (mf_idx)gridDim.x * (mf_idx)blockDim.x;\n");
    for (i = 0; i < r->n_inputs; i++) {
        if (r->inputs[i].is_scalar)
            continue;
        if (is16(r->inputs[i].dtype))
            g->helpers |= r->inputs[i].dtype == MF_DT_F16 ? H_F16 : H_BF16;
        mf_sb_printf(body, "  const %s* __restrict__ p%d = (const %s*)P.ptr[%d];\n",
                     mf_cg_dtypes[r->inputs[i].dtype].stype, g->tensor_slot[i],
                     mf_cg_dtypes[r->inputs[i].dtype].stype, g->tensor_slot[i]);
    }
    for (i = 0; i < r->n_outputs; i++) {
        int dt = g->vdtype[r->outputs[i].value];
        if (is16(dt))
            g->helpers |= dt == MF_DT_F16 ? H_F16 : H_BF16;
        mf_sb_printf(body, "  %s* __restrict__ q%d = (%s*)P.ptr[%d];\n", mf_cg_dtypes[dt].stype, i,
                     mf_cg_dtypes[dt].stype, g->n_tensor_inputs + i);
    }
    if (!r->contiguous) {
        for (d = 1; d < D; d++) /* the outermost size is implied by numel */
            mf_sb_printf(body, "  const mf_idx sz%d = (mf_idx)P.size[%d];\n", d, d);
        for (slot = 0; slot < g->nt; slot++)
            for (d = 0; d < D; d++)
                mf_sb_printf(body, "  const mf_idx st%d_%d = (mf_idx)P.stride[%d];\n", slot, d, slot * D + d);
    }
}

/* The grid-stride loop's head; in the strided variant each operand's offset
 * and the guards of broadcast outputs (NOTE [broadcast outputs]). */
static void emit_index(mf_sb *body, mf_cg_gen *g)
{
    const mf_codegen_region *r = g->r;
    int i, d, slot;
    mf_sb_printf(body, "  for (mf_idx i = (mf_idx)blockIdx.x * (mf_idx)blockDim.x + (mf_idx)threadIdx.x; "
                       "i < n; i += step) {\n");
    if (r->contiguous)
        return;
    for (slot = 0; slot < g->nt; slot++)
        mf_sb_printf(body, "    mf_idx o%d = 0;\n", slot);
    for (i = 0; i < r->n_outputs; i++)
        if (r->outputs[i].guarded)
            mf_sb_printf(body, "    bool w%d = true;\n", i);
    mf_sb_printf(body, "    mf_idx r = i;\n");
    for (d = r->ndim - 1; d >= 0; d--) {
        if (d > 0)
            mf_sb_printf(body, "    { const mf_idx c = r %% sz%d; r = r / sz%d;\n", d, d);
        else
            mf_sb_printf(body, "    { const mf_idx c = r;\n");
        for (slot = 0; slot < g->nt; slot++)
            mf_sb_printf(body, "      o%d += c * st%d_%d;\n", slot, slot, d);
        for (i = 0; i < r->n_outputs; i++)
            if (r->outputs[i].guarded)
                mf_sb_printf(body, "      if (c != 0 && st%d_%d == 0) w%d = false;\n", g->n_tensor_inputs + i, d,
                             i);
        mf_sb_printf(body, "    }\n");
    }
}

/* One value per input: a scalar argument, or a tensor element in its
 * compute type. */
static void emit_loads(mf_sb *body, mf_cg_gen *g)
{
    const mf_codegen_region *r = g->r;
    char off[32], ptr[16];
    int i;
    for (i = 0; i < r->n_inputs; i++) {
        int dt = r->inputs[i].dtype;
        if (r->inputs[i].is_scalar) {
            if (dt == MF_DT_BOOL)
                mf_sb_printf(body, "    const bool v%d = P.s%d != 0;\n", i, i);
            else
                mf_sb_printf(body, "    const %s v%d = P.s%d;\n", mf_cg_dtypes[dt].ctype, i, i);
            continue;
        }
        snprintf(off, sizeof off, r->contiguous ? "i" : "o%d", g->tensor_slot[i]);
        snprintf(ptr, sizeof ptr, "p%d", g->tensor_slot[i]);
        mf_sb_printf(body, "    const %s v%d = ", mf_cg_dtypes[dt].ctype, i);
        mf_sb_printf(body, load_expr(dt), ptr, off);
        mf_sb_printf(body, ";\n");
    }
}

/* Each output stored in its dtype (guarded ones only where their guard
 * holds), then the loop and the kernel closed. */
static void emit_stores(mf_sb *body, mf_cg_gen *g)
{
    const mf_codegen_region *r = g->r;
    const int strided = !r->contiguous;
    char off[32];
    int i;
    for (i = 0; i < r->n_outputs; i++) {
        int v = r->outputs[i].value, dt = g->vdtype[v];
        snprintf(off, sizeof off, strided ? "o%d" : "i", g->n_tensor_inputs + i);
        mf_sb_printf(body, "    ");
        if (strided && r->outputs[i].guarded)
            mf_sb_printf(body, "if (w%d) ", i);
        switch (dt) {
        case MF_DT_BOOL: mf_sb_printf(body, "q%d[%s] = (unsigned char)v%d;\n", i, off, v); break;
        case MF_DT_F16: mf_sb_printf(body, "q%d[%s] = mf_f2h(v%d);\n", i, off, v); break;
        case MF_DT_BF16: mf_sb_printf(body, "q%d[%s] = mf_f2bf(v%d);\n", i, off, v); break;
        default: mf_sb_printf(body, "q%d[%s] = v%d;\n", i, off, v); break;
        }
    }
    mf_sb_printf(body, "  }\n}\n");
}

/* The source: header comment, the helpers the body used, the parameter
 * struct (NOTE [kernel parameters]), the body. */
static void emit_source(mf_sb *out, const mf_cg_gen *g, const mf_sb *body)
{
    const mf_codegen_region *r = g->r;
    const int D = r->ndim, strided = !r->contiguous;
    static const struct {
        unsigned bit;
        const char *text;
    } helpers[] = {{H_F16, HELP_F16},   {H_BF16, HELP_BF16},     {H_REM, HELP_REM}, {H_IREM, HELP_IREM},
                   {H_IPOW, HELP_IPOW}, {H_MAXMIN, HELP_MAXMIN}, {H_LERP, HELP_LERP}};
    size_t h;
    int i;
    mf_sb_printf(out, "// thunder_memfuse generated kernel: %d inputs, %d instructions, %d outputs;\n",
                 r->n_inputs, r->n_instrs, r->n_outputs);
    mf_sb_printf(out, "// variant: %s, ndim %d, %s indexing.\n", strided ? "strided" : "contiguous", D,
                 r->index64 ? "64-bit" : "32-bit");
    mf_sb_printf(out, "// ops:");
    for (i = 0; i < r->n_instrs; i++)
        mf_sb_printf(out, " %s", mf_cg_ops[r->instrs[i].op].name);
    mf_sb_printf(out, "\n#define MF_BLOCK %d\n", MF_CODEGEN_BLOCK);
    for (h = 0; h < sizeof helpers / sizeof helpers[0]; h++)
        if (g->helpers & helpers[h].bit)
            mf_sb_printf(out, "%s", helpers[h].text);
    mf_sb_printf(out, "struct MfParams {\n  long long numel;\n");
    if (strided)
        mf_sb_printf(out, "  long long size[%d];\n", D);
    mf_sb_printf(out, "  void* ptr[%d];\n", g->nt);
    if (strided)
        mf_sb_printf(out, "  long long stride[%d];\n", g->nt * D);
    for (i = 0; i < r->n_inputs; i++)
        if (r->inputs[i].is_scalar)
            mf_sb_printf(out, "  %s s%d;\n", r->inputs[i].dtype == MF_DT_F64 ? "double" : "long long", i);
    mf_sb_printf(out, "};\n");
    mf_sb_printf(out, "%s", body->buf);
}

int mf_codegen_emit(const mf_codegen_region *r, char **src_out, size_t *len_out, mf_cuda_ctx *ctx)
{
    mf_cg_gen g;
    mf_sb body = {NULL, 0, 0, 0}, out = {NULL, 0, 0, 0};
    int i, rc;

    *src_out = NULL;
    *len_out = 0;
    if ((rc = gen_init(&g, r, ctx)) != MF_OK)
        goto done;
    /* the body first: it decides which helpers are used */
    emit_prologue(&body, &g);
    emit_index(&body, &g);
    emit_loads(&body, &g);
    for (i = 0; i < r->n_instrs && rc == MF_OK; i++)
        rc = mf_cg_emit_instr(&body, &g, i);
    if (rc != MF_OK)
        goto done;
    emit_stores(&body, &g);
    if (body.oom) {
        rc = MF_ENOMEM;
        mf_cg_fail(&g, "out of memory");
        goto done;
    }
    emit_source(&out, &g, &body);
    if (out.oom) {
        rc = MF_ENOMEM;
        mf_cg_fail(&g, "out of memory");
        goto done;
    }
    *src_out = out.buf;
    *len_out = out.len;
    out.buf = NULL;
done:
    free(body.buf);
    free(out.buf);
    gen_free(&g);
    return rc;
}
