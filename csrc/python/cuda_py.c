/*
 * cuda_py.c -- the CPython face of csrc/cuda: loader status, code generation,
 * NVRTC compilation with the kernel cache, kernel load/launch, cuBLAS GEMM and
 * cuBLASLt GEMM with a fused epilogue.
 *
 * Invariants:
 *  - Nothing CUDA is opened at import: mf_py_cuda_exec only adds functions and
 *    the KernelCompileError type.  Libraries load at the first call that needs
 *    them (csrc/cuda/mf_cuda_load.c).
 *  - No static PyObject globals: KernelCompileError lives on the module and is
 *    looked up per raise (errors.c).
 *  - One error label per function; every temporary is Py_XDECREF'd there.
 *  - Every status of csrc/cuda becomes an exception in mf_py_raise_status
 *    (errors.c NOTE [one error path]), as the core's do.
 *  - Device pointers, streams and CUfunction handles cross this boundary as
 *    Python ints (this is a private module; thunder_memfuse/regions/nvrtc/ is the
 *    only caller).  The GIL is released around NVRTC compilation.
 */
#include "mf_py.h"

#include <string.h>

#include "mf_codegen.h"
#include "mf_cuda.h"
#include "mf_nvrtc.h"

/* ---- helpers ------------------------------------------------------------ */

/* A failed compile: the KernelCompileError of mf_py_raise_status, with the
 * log in its message and .log and .source set. */
static void raise_compile_error(const char *msg, const char *log, const char *source)
{
    PyObject *type = NULL, *exc = NULL, *tb = NULL, *log_obj = NULL, *src_obj = NULL;
    PyObject *text = PyUnicode_FromFormat("%s\n--- NVRTC log ---\n%s", msg, log ? log : "");
    const char *s = text ? PyUnicode_AsUTF8(text) : NULL;
    if (!s)
        goto error;
    (void)mf_py_raise_status(MF_CUDA_ECOMPILE, s);
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    log_obj = PyUnicode_DecodeUTF8(log ? log : "", (Py_ssize_t)strlen(log ? log : ""), "replace");
    src_obj = PyUnicode_DecodeUTF8(source ? source : "", (Py_ssize_t)strlen(source ? source : ""),
                                   "replace");
    if (log_obj && src_obj && exc && PyObject_SetAttrString(exc, "log", log_obj) == 0 &&
        PyObject_SetAttrString(exc, "source", src_obj) == 0) {
        PyErr_Restore(type, exc, tb); /* steals all three */
        type = exc = tb = NULL;
    }
error:
    Py_XDECREF(type);
    Py_XDECREF(exc);
    Py_XDECREF(tb);
    Py_XDECREF(log_obj);
    Py_XDECREF(src_obj);
    Py_XDECREF(text);
}

/* d[key] = v, taking the reference to v; v NULL (its creation failed) gives
 * -1 with that exception set.  0 or -1. */
static int set_item_steal(PyObject *d, const char *key, PyObject *v)
{
    int rc;
    if (!v)
        return -1;
    rc = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return rc;
}

/* d[key] = value as str (undecodable bytes replaced), None for NULL. */
static int set_item_str(PyObject *d, const char *key, const char *value)
{
    return set_item_steal(d, key, value ? PyUnicode_DecodeUTF8(value, (Py_ssize_t)strlen(value), "replace")
                                        : Py_NewRef(Py_None));
}

/* d[key] = value as int. */
static int set_item_ll(PyObject *d, const char *key, long long value)
{
    return set_item_steal(d, key, PyLong_FromLongLong(value));
}

static int set_item_bool(PyObject *d, const char *key, int value)
{
    return PyDict_SetItemString(d, key, value ? Py_True : Py_False);
}

/* PyMem_Calloc of n + 1 items (so never 0 bytes); NULL with MemoryError set. */
static void *calloc_items(Py_ssize_t n, size_t size)
{
    void *p = PyMem_Calloc((size_t)n + 1, size);
    if (!p)
        PyErr_NoMemory();
    return p;
}

/* obj (a Python int) as a pointer in *out; 0, or -1 with an exception set. */
static int ptr_arg(PyObject *obj, void **out)
{
    *out = PyLong_AsVoidPtr(obj);
    return (!*out && PyErr_Occurred()) ? -1 : 0;
}

/* ---- cuda_set_search_dirs ------------------------------------------------------ */

PyDoc_STRVAR(set_dirs_doc,
             "cuda_set_search_dirs($module, dirs, /)\n--\n\n"
             "Directories searched for libnvrtc/libcublas before CUDA_HOME/lib64 and the\n"
             "default loader path (the nvidia pip wheels' lib folders).  Forgets failed\n"
             "loads so the next use searches again.");

static PyObject *py_set_dirs(PyObject *self, PyObject *arg)
{
    PyObject *seq = NULL, *result = NULL;
    const char **dirs = NULL;
    Py_ssize_t n, i;
    int rc;
    mf_cuda_ctx ctx = {""};
    (void)self;
    seq = mf_py_tuple(arg, "cuda_set_search_dirs: dirs");
    if (!seq)
        goto error;
    n = PyTuple_GET_SIZE(seq);
    dirs = calloc_items(n, sizeof(char *));
    if (!dirs)
        goto error;
    for (i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(seq, i);
        dirs[i] = PyUnicode_AsUTF8(item);
        if (!dirs[i])
            goto error;
    }
    rc = mf_cuda_set_search_dirs(dirs, (int)n, &ctx);
    if (rc != MF_OK) {
        mf_py_raise_status(rc, ctx.err);
        goto error;
    }
    result = Py_NewRef(Py_None);
error:
    PyMem_Free((void *)dirs);
    Py_XDECREF(seq);
    return result;
}

/* ---- cuda_status --------------------------------------------------------------- */

static PyObject *lib_dict(int which, const char *label)
{
    mf_cuda_lib_info info;
    mf_cuda_ctx ctx = {""};
    PyObject *d = NULL, *result = NULL;
    ctx.err[0] = '\0';
    (void)mf_cuda_load(which, &ctx);
    mf_cuda_lib_info_get(which, &info);
    d = PyDict_New();
    if (!d)
        goto error;
    if (set_item_str(d, "library", label) < 0 || set_item_bool(d, "found", info.loaded) < 0 ||
        set_item_str(d, "path", info.loaded ? info.path : NULL) < 0 ||
        set_item_str(d, "how", info.loaded ? info.how : NULL) < 0 ||
        set_item_str(d, "error", info.loaded ? NULL : (info.error[0] ? info.error : ctx.err)) < 0)
        goto error;
    result = Py_NewRef(d);
error:
    Py_XDECREF(d);
    return result;
}

static int add_cache_stats(PyObject *d)
{
    mf_nvrtc_cache_stats st;
    mf_nvrtc_cache_stats_get(&st);
    return (set_item_ll(d, "memory_entries", st.memory_entries) < 0 ||
            set_item_ll(d, "memory_hits", st.memory_hits) < 0 ||
            set_item_ll(d, "disk_hits", st.disk_hits) < 0 ||
            set_item_ll(d, "disk_writes", st.disk_writes) < 0 ||
            set_item_ll(d, "disk_errors", st.disk_errors) < 0 ||
            set_item_ll(d, "compiles", st.compiles) < 0 ||
            set_item_ll(d, "compile_failures", st.compile_failures) < 0)
               ? -1
               : 0;
}

PyDoc_STRVAR(status_doc,
             "cuda_status($module, /)\n--\n\n"
             "Load (at first use) the CUDA driver, NVRTC, cuBLAS and cuBLASLt and say what was\n"
             "found: paths, versions, driver version and device count, or why not.");

static PyObject *py_status(PyObject *self, PyObject *noargs)
{
    PyObject *d = NULL, *drv = NULL, *nv = NULL, *cb = NULL, *lt = NULL, *archs = NULL, *cache = NULL;
    PyObject *result = NULL;
    char buf[4096];
    mf_cuda_ctx ctx = {""};
    int version = -1, count = 0, rc, major = 0, minor = 0, n = 0, i, list[64];
    int driver_ok, nvrtc_ok;
    (void)self;
    (void)noargs;

    d = PyDict_New();
    drv = lib_dict(MF_CUDA_LIB_DRIVER, "CUDA driver");
    nv = lib_dict(MF_CUDA_LIB_NVRTC, "NVRTC");
    cb = lib_dict(MF_CUDA_LIB_CUBLAS, "cuBLAS");
    lt = lib_dict(MF_CUDA_LIB_CUBLASLT, "cuBLASLt");
    cache = PyDict_New();
    if (!d || !drv || !nv || !cb || !lt || !cache)
        goto error;

    /* driver: version and devices */
    ctx.err[0] = '\0';
    rc = mf_cuda_driver_info(&version, &count, &ctx);
    driver_ok = rc == MF_OK;
    if (set_item_ll(drv, "version", version) < 0 || set_item_ll(drv, "device_count", count) < 0 ||
        set_item_str(drv, "init_error", driver_ok ? NULL : ctx.err) < 0)
        goto error;

    /* NVRTC: version and architectures */
    ctx.err[0] = '\0';
    rc = mf_nvrtc_version(&major, &minor, &ctx);
    nvrtc_ok = rc == MF_OK;
    if (nvrtc_ok) {
        snprintf(buf, sizeof buf, "%d.%d", major, minor);
        if (set_item_str(nv, "version", buf) < 0)
            goto error;
        if (mf_nvrtc_supported_archs(list, 64, &n, &ctx) != MF_OK)
            n = 0;
    } else if (set_item_str(nv, "version", NULL) < 0) {
        goto error;
    }
    archs = PyList_New(n);
    if (!archs)
        goto error;
    for (i = 0; i < n; i++) {
        PyObject *a = PyLong_FromLong(list[i]);
        if (!a)
            goto error;
        PyList_SET_ITEM(archs, i, a);
    }
    if (PyDict_SetItemString(nv, "supported_archs", archs) < 0)
        goto error;

    /* cuBLAS version */
    {
        int v = mf_cuda_cublas_version();
        if (v >= 0)
            snprintf(buf, sizeof buf, "%d.%d.%d", v / 10000, (v / 100) % 100, v % 100);
        if (set_item_str(cb, "version", v >= 0 ? buf : NULL) < 0)
            goto error;
    }
    /* cuBLASLt version (cublasLtGetVersion: major*10000+minor*100+patch) */
    {
        long long v = mf_cuda_cublaslt_version();
        if (v >= 0)
            snprintf(buf, sizeof buf, "%lld.%lld.%lld", v / 10000, (v / 100) % 100, v % 100);
        if (set_item_str(lt, "version", v >= 0 ? buf : NULL) < 0)
            goto error;
    }

    if (add_cache_stats(cache) < 0)
        goto error;
    if (PyDict_SetItemString(d, "driver", drv) < 0 || PyDict_SetItemString(d, "nvrtc", nv) < 0 ||
        PyDict_SetItemString(d, "cublas", cb) < 0 || PyDict_SetItemString(d, "cublaslt", lt) < 0 ||
        PyDict_SetItemString(d, "cache", cache) < 0)
        goto error;
    mf_cuda_get_search_dirs(buf, sizeof buf);
    if (set_item_str(d, "search_dirs", buf) < 0)
        goto error;
    mf_nvrtc_default_cache_dir(buf, sizeof buf);
    if (set_item_str(d, "cache_dir", buf[0] ? buf : NULL) < 0)
        goto error;
    if (set_item_bool(d, "can_compile", nvrtc_ok) < 0 ||
        set_item_bool(d, "can_run", driver_ok && count > 0 && nvrtc_ok) < 0)
        goto error;
    result = Py_NewRef(d);
error:
    Py_XDECREF(d);
    Py_XDECREF(drv);
    Py_XDECREF(nv);
    Py_XDECREF(cb);
    Py_XDECREF(lt);
    Py_XDECREF(archs);
    Py_XDECREF(cache);
    return result;
}

/* ---- cuda_codegen ------------------------------------------------------------- */

static int dtype_arg(PyObject *obj, const char *what, Py_ssize_t idx)
{
    const char *name = PyUnicode_AsUTF8(obj);
    int dt;
    if (!name)
        return -1;
    dt = mf_codegen_dtype_id(name);
    if (dt < 0) {
        PyErr_Format(PyExc_ValueError, "%s %zd: unknown dtype %R", what, idx, obj);
        return -1;
    }
    return dt;
}

typedef struct parsed_region {
    mf_codegen_region r;
    mf_codegen_input *inputs;
    mf_codegen_instr *instrs;
    mf_codegen_output *outputs;
} parsed_region;

static void free_region(parsed_region *p)
{
    PyMem_Free(p->inputs);
    PyMem_Free(p->instrs);
    PyMem_Free(p->outputs);
    memset(p, 0, sizeof *p);
}

/* Parse (inputs, instrs, outputs, ndim, index64, contiguous); 0 or -1 with an
 * exception set.  Caller frees with free_region in both cases. */
static int parse_region(PyObject *obj, parsed_region *p)
{
    PyObject *ins = NULL, *instrs = NULL, *outs = NULL, *item = NULL, *args = NULL;
    PyObject *in_obj, *instr_obj, *out_obj;
    Py_ssize_t i, j, n;
    int ndim, index64, contiguous, rc = -1;

    memset(p, 0, sizeof *p);
    if (!PyArg_ParseTuple(obj, "OOOipp;region must be (inputs, instrs, outputs, ndim, index64, contiguous)",
                          &in_obj, &instr_obj, &out_obj, &ndim, &index64, &contiguous))
        goto error;
    ins = mf_py_tuple(in_obj, "region inputs");
    instrs = mf_py_tuple(instr_obj, "region instrs");
    outs = mf_py_tuple(out_obj, "region outputs");
    if (!ins || !instrs || !outs)
        goto error;

    n = PyTuple_GET_SIZE(ins);
    p->inputs = calloc_items(n, sizeof *p->inputs);
    if (!p->inputs)
        goto error;
    for (i = 0; i < n; i++) {
        PyObject *kind, *dt;
        const char *k;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(ins, i), "OO;input must be (kind, dtype)", &kind, &dt))
            goto error;
        k = PyUnicode_AsUTF8(kind);
        if (!k)
            goto error;
        if (strcmp(k, "tensor") != 0 && strcmp(k, "scalar") != 0) {
            PyErr_Format(PyExc_ValueError, "input %zd: kind must be 'tensor' or 'scalar'", i);
            goto error;
        }
        p->inputs[i].is_scalar = k[0] == 's';
        p->inputs[i].dtype = dtype_arg(dt, "input", i);
        if (p->inputs[i].dtype < 0)
            goto error;
    }
    p->r.n_inputs = (int)n;

    n = PyTuple_GET_SIZE(instrs);
    p->instrs = calloc_items(n, sizeof *p->instrs);
    if (!p->instrs)
        goto error;
    for (i = 0; i < n; i++) {
        PyObject *opname, *dt, *cval = NULL;
        const char *name;
        mf_codegen_instr *in = &p->instrs[i];
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(instrs, i), "OOO|O;instr must be (op, args, dtype[, const])",
                              &opname, &item, &dt, &cval))
            goto error;
        name = PyUnicode_AsUTF8(opname);
        if (!name)
            goto error;
        in->op = mf_codegen_op_id(name);
        if (in->op < 0) {
            PyErr_Format(PyExc_ValueError, "instr %zd: unsupported op %R", i, opname);
            goto error;
        }
        in->dtype = dtype_arg(dt, "instr", i);
        if (in->dtype < 0)
            goto error;
        args = mf_py_tuple(item, "instr args");
        if (!args)
            goto error;
        if (PyTuple_GET_SIZE(args) > MF_CODEGEN_MAX_ARGS) {
            PyErr_Format(PyExc_ValueError, "instr %zd: too many arguments", i);
            goto error;
        }
        in->nargs = (int)PyTuple_GET_SIZE(args);
        for (j = 0; j < in->nargs; j++) {
            long v = PyLong_AsLong(PyTuple_GET_ITEM(args, j));
            if (v == -1 && PyErr_Occurred())
                goto error;
            in->args[j] = (int32_t)v;
        }
        Py_CLEAR(args);
        if (strcmp(name, "const") == 0) {
            if (!cval) {
                PyErr_Format(PyExc_ValueError, "instr %zd: const needs a value", i);
                goto error;
            }
            if (PyBool_Check(cval)) {
                in->const_kind = 2;
                in->iconst = cval == Py_True;
            } else if (PyLong_Check(cval)) {
                in->const_kind = 0;
                in->iconst = PyLong_AsLongLong(cval);
                if (in->iconst == -1 && PyErr_Occurred())
                    goto error;
            } else if (PyFloat_Check(cval)) {
                in->const_kind = 1;
                in->fconst = PyFloat_AsDouble(cval);
            } else {
                PyErr_Format(PyExc_ValueError, "instr %zd: const value must be bool, int or float", i);
                goto error;
            }
        }
    }
    p->r.n_instrs = (int)n;

    n = PyTuple_GET_SIZE(outs);
    p->outputs = calloc_items(n, sizeof *p->outputs);
    if (!p->outputs)
        goto error;
    for (i = 0; i < n; i++) {
        int value, guarded;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(outs, i), "ip;output must be (value, guarded)",
                              &value, &guarded))
            goto error;
        p->outputs[i].value = value;
        p->outputs[i].guarded = guarded;
    }
    p->r.n_outputs = (int)n;
    p->r.inputs = p->inputs;
    p->r.instrs = p->instrs;
    p->r.outputs = p->outputs;
    p->r.ndim = ndim;
    p->r.index64 = index64;
    p->r.contiguous = contiguous;
    rc = 0;
error:
    Py_XDECREF(ins);
    Py_XDECREF(instrs);
    Py_XDECREF(outs);
    Py_XDECREF(args);
    return rc;
}

PyDoc_STRVAR(codegen_doc,
             "cuda_codegen($module, region, /)\n--\n\n"
             "CUDA C source of the one kernel for region = (inputs, instrs, outputs, ndim,\n"
             "index64, contiguous); see docs/CUDA.md.  ValueError for a malformed or\n"
             "unsupported region.");

static PyObject *py_codegen(PyObject *self, PyObject *arg)
{
    parsed_region p;
    char *src = NULL;
    size_t len = 0;
    mf_cuda_ctx ctx = {""};
    PyObject *result = NULL;
    int rc;
    (void)self;
    if (parse_region(arg, &p) < 0)
        goto error;
    rc = mf_codegen_emit(&p.r, &src, &len, &ctx);
    if (rc != MF_OK) {
        mf_py_raise_status(rc, ctx.err);
        goto error;
    }
    result = PyUnicode_FromStringAndSize(src, (Py_ssize_t)len);
error:
    free(src);
    free_region(&p);
    return result;
}

PyDoc_STRVAR(codegen_info_doc,
             "cuda_codegen_info($module, /)\n--\n\n"
             "{'ops': {name: arity}, 'dtypes': [...], 'block': int, 'kernel_name': str,\n"
             " 'max_dims': int, 'max_param_bytes': int}");

static PyObject *py_codegen_info(PyObject *self, PyObject *noargs)
{
    PyObject *d = NULL, *ops = NULL, *dts = NULL, *result = NULL;
    int i;
    (void)self;
    (void)noargs;
    d = PyDict_New();
    ops = PyDict_New();
    dts = PyList_New(0);
    if (!d || !ops || !dts)
        goto error;
    for (i = 0; i < mf_codegen_op_count(); i++)
        if (set_item_steal(ops, mf_codegen_op_name(i), PyLong_FromLong(mf_codegen_op_arity(i))) < 0)
            goto error;
    for (i = 0; i < MF_DT_COUNT; i++) {
        PyObject *s = PyUnicode_FromString(mf_codegen_dtype_name(i));
        int rc;
        if (!s)
            goto error;
        rc = PyList_Append(dts, s);
        Py_DECREF(s);
        if (rc < 0)
            goto error;
    }
    if (PyDict_SetItemString(d, "ops", ops) < 0 || PyDict_SetItemString(d, "dtypes", dts) < 0 ||
        set_item_ll(d, "block", MF_CODEGEN_BLOCK) < 0 ||
        set_item_str(d, "kernel_name", MF_CODEGEN_KERNEL_NAME) < 0 ||
        set_item_ll(d, "max_dims", MF_CODEGEN_MAX_DIMS) < 0 ||
        set_item_ll(d, "max_param_bytes", MF_CODEGEN_MAX_PARAM_BYTES) < 0)
        goto error;
    result = Py_NewRef(d);
error:
    Py_XDECREF(d);
    Py_XDECREF(ops);
    Py_XDECREF(dts);
    return result;
}

/* ---- nvrtc_compile ----------------------------------------------------------- */

PyDoc_STRVAR(compile_doc,
             "nvrtc_compile($module, /, source, arch, mode='auto', cache=True, cache_dir=None, name='mf_kernel')\n--\n\n"
             "Compile with NVRTC for compute capability arch (e.g. 90).  mode: 'auto'\n"
             "(cubin when NVRTC knows the arch, else PTX), 'cubin' or 'ptx'.  cache_dir:\n"
             "None = $THUNDER_MEMFUSE_CACHE or ~/.cache/thunder_memfuse/kernels, '' = no\n"
             "disk cache.  Returns {'image', 'kind', 'target', 'origin', 'log', 'hash'}.\n"
             "Raises KernelCompileError (with .log and .source) when the source does not\n"
             "compile, RuntimeError when NVRTC is missing.");

static PyObject *py_compile(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"source", "arch", "mode", "cache", "cache_dir", "name", NULL};
    const char *src = NULL, *mode_s = "auto", *cache_dir = NULL, *name = MF_CODEGEN_KERNEL_NAME;
    int arch = 0, use_cache = 1, mode, rc;
    mf_nvrtc_result res;
    mf_cuda_ctx ctx = {""};
    char *log = NULL;
    PyObject *d = NULL, *img = NULL, *result = NULL;

    (void)self;
    memset(&res, 0, sizeof res);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "si|spzs", kwlist, &src, &arch, &mode_s,
                                     &use_cache, &cache_dir, &name))
        goto error;
    if (strcmp(mode_s, "auto") == 0)
        mode = MF_NVRTC_AUTO;
    else if (strcmp(mode_s, "cubin") == 0)
        mode = MF_NVRTC_CUBIN;
    else if (strcmp(mode_s, "ptx") == 0)
        mode = MF_NVRTC_PTX;
    else {
        PyErr_Format(PyExc_ValueError, "mode must be 'auto', 'cubin' or 'ptx', not '%s'", mode_s);
        goto error;
    }
    ctx.err[0] = '\0';
    Py_BEGIN_ALLOW_THREADS
    rc = mf_nvrtc_compile(src, name, arch, mode, cache_dir, use_cache, &res, &log, &ctx);
    Py_END_ALLOW_THREADS
    if (rc == MF_CUDA_ECOMPILE) {
        raise_compile_error(ctx.err, log, src);
        goto error;
    }
    if (rc != MF_OK) {
        mf_py_raise_status(rc, ctx.err);
        goto error;
    }
    /* PTX goes to cuModuleLoadData NUL-terminated: keep the NUL in the bytes. */
    img = PyBytes_FromStringAndSize(res.image, (Py_ssize_t)res.size);
    d = PyDict_New();
    if (!img || !d)
        goto error;
    if (PyDict_SetItemString(d, "image", img) < 0 ||
        set_item_str(d, "kind", res.is_cubin ? "cubin" : "ptx") < 0 ||
        set_item_str(d, "target", res.target) < 0 || set_item_str(d, "origin", res.origin) < 0 ||
        set_item_str(d, "log", res.log) < 0 ||
        set_item_steal(d, "hash", PyLong_FromUnsignedLongLong((unsigned long long)res.key_hash)) < 0)
        goto error;
    result = Py_NewRef(d);
error:
    mf_nvrtc_result_free(&res);
    free(log);
    Py_XDECREF(img);
    Py_XDECREF(d);
    return result;
}

PyDoc_STRVAR(cache_stats_doc, "cuda_cache_stats($module, /)\n--\n\nCounters of the kernel cache.");

static PyObject *py_cache_stats(PyObject *self, PyObject *noargs)
{
    PyObject *d = PyDict_New();
    (void)self;
    (void)noargs;
    if (!d)
        return NULL;
    if (add_cache_stats(d) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

PyDoc_STRVAR(cache_clear_doc, "cuda_cache_clear($module, /)\n--\n\nDrop the in-memory kernel cache.");

static PyObject *py_cache_clear(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    mf_nvrtc_cache_clear();
    Py_RETURN_NONE;
}

/* ---- device, load, launch ------------------------------------------------------ */

PyDoc_STRVAR(device_info_doc,
             "cuda_device_info($module, device, /)\n--\n\n(compute capability as major*10+minor, SM count).");

static PyObject *py_device_info(PyObject *self, PyObject *arg)
{
    int device, arch = 0, sms = 0, rc;
    mf_cuda_ctx ctx = {""};
    (void)self;
    device = (int)PyLong_AsLong(arg);
    if (device == -1 && PyErr_Occurred())
        return NULL;
    rc = mf_cuda_device_arch(device, &arch, &sms, &ctx);
    if (rc != MF_OK)
        return mf_py_raise_status(rc, ctx.err);
    return Py_BuildValue("(ii)", arch, sms);
}

PyDoc_STRVAR(load_doc,
             "cuda_load_function($module, image, name, device, /)\n--\n\n"
             "cuModuleLoadData into device's primary context; the CUfunction as an int.");

static PyObject *py_load_function(PyObject *self, PyObject *args)
{
    Py_buffer img = {0};
    const char *name;
    int device, rc;
    mf_CUfunction fn = NULL;
    mf_cuda_ctx ctx = {""};
    PyObject *result = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*si", &img, &name, &device))
        goto error;
    rc = mf_cuda_load_function(device, img.buf, name, &fn, &ctx);
    if (rc != MF_OK) {
        mf_py_raise_status(rc, ctx.err);
        goto error;
    }
    result = PyLong_FromVoidPtr(fn);
error:
    if (img.obj)
        PyBuffer_Release(&img);
    return result;
}

PyDoc_STRVAR(launch_doc,
             "cuda_launch($module, function, device, grid, block, stream, params, /)\n--\n\n"
             "cuLaunchKernel with one by-value parameter: the packed bytes `params`.");

static PyObject *py_launch(PyObject *self, PyObject *args)
{
    PyObject *fn_obj, *stream_obj, *result = NULL;
    Py_buffer params = {0};
    int device, rc;
    unsigned int grid, block;
    void *fn, *stream;
    mf_cuda_ctx ctx = {""};
    (void)self;
    if (!PyArg_ParseTuple(args, "OiIIOy*", &fn_obj, &device, &grid, &block, &stream_obj, &params))
        goto error;
    if (ptr_arg(fn_obj, &fn) < 0 || ptr_arg(stream_obj, &stream) < 0)
        goto error;
    if (!fn || grid == 0 || block == 0) {
        PyErr_SetString(PyExc_ValueError, "cuda_launch: null function or empty grid/block");
        goto error;
    }
    rc = mf_cuda_launch(device, fn, grid, block, stream, params.buf, &ctx);
    if (rc != MF_OK) {
        mf_py_raise_status(rc, ctx.err);
        goto error;
    }
    result = Py_NewRef(Py_None);
error:
    if (params.obj)
        PyBuffer_Release(&params);
    return result;
}

/* ---- cuBLAS --------------------------------------------------------------- */

PyDoc_STRVAR(gemm_doc,
             "cublas_gemm($module, device, stream, workspace, workspace_bytes, transa, transb, m, n, k,\n"
             "            A, lda, stride_a, B, ldb, stride_b, C, ldc, stride_c, batch, dtype,\n"
             "            alpha, beta, allow_tf32, /)\n--\n\n"
             "Column-major C = alpha*op(A)@op(B) + beta*C with cublasGemmEx (batch == 1) or\n"
             "cublasGemmStridedBatchedEx; pointers and the stream are ints; dtype is one\n"
             "of 'float32', 'float16', 'bfloat16', 'float64'.");

/* The cudaDataType of a GEMM dtype name ("float64" only with allow_f64); ValueError
 * naming fn otherwise.  0 or -1. */
static int gemm_dtype(const char *fn, const char *dtype, int allow_f64, int *out)
{
    if (strcmp(dtype, "float32") == 0)
        *out = MF_CUDA_R_32F;
    else if (strcmp(dtype, "float16") == 0)
        *out = MF_CUDA_R_16F;
    else if (strcmp(dtype, "bfloat16") == 0)
        *out = MF_CUDA_R_16BF;
    else if (allow_f64 && strcmp(dtype, "float64") == 0)
        *out = MF_CUDA_R_64F;
    else {
        PyErr_Format(PyExc_ValueError, "%s: unsupported dtype %s", fn, dtype);
        return -1;
    }
    return 0;
}

static PyObject *py_gemm(PyObject *self, PyObject *args)
{
    mf_cuda_gemm g;
    PyObject *stream, *ws, *a, *b, *c;
    void *pa, *pb;
    unsigned long long ws_bytes;
    const char *dtype;
    mf_cuda_ctx ctx = {""};
    int rc;
    (void)self;
    memset(&g, 0, sizeof g);
    if (!PyArg_ParseTuple(args, "iOOKiiiiiOiLOiLOiLisddp", &g.device, &stream, &ws, &ws_bytes,
                          &g.transa, &g.transb, &g.m, &g.n, &g.k, &a, &g.lda, &g.stride_a, &b,
                          &g.ldb, &g.stride_b, &c, &g.ldc, &g.stride_c, &g.batch, &dtype, &g.alpha,
                          &g.beta, &g.allow_tf32))
        return NULL;
    if (ptr_arg(stream, &g.stream) < 0 || ptr_arg(ws, &g.workspace) < 0 || ptr_arg(a, &pa) < 0 ||
        ptr_arg(b, &pb) < 0 || ptr_arg(c, &g.C) < 0)
        return NULL;
    g.workspace_bytes = (size_t)ws_bytes;
    g.A = pa;
    g.B = pb;
    if (gemm_dtype("cublas_gemm", dtype, 1, &g.dtype) < 0)
        return NULL;
    rc = mf_cuda_gemm_run(&g, &ctx);
    if (rc != MF_OK)
        return mf_py_raise_status(rc, ctx.err);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(lt_matmul_doc,
             "cublaslt_matmul($module, device, stream, workspace, workspace_bytes, transa, transb, m, n, k,\n"
             "                A, lda, stride_a, B, ldb, stride_b, D, ldd, stride_d, batch, dtype,\n"
             "                allow_tf32, bias, act, /)\n--\n\n"
             "Column-major D = act(op(A)@op(B) [+ bias]) as ONE cublasLtMatmul with a fused\n"
             "epilogue (NOTE [cublasLt matmul] in csrc/cuda/mf_cuda_blas.c).  Pointers and the stream\n"
             "are ints; bias is a pointer to m elements of dtype, or 0 for none; dtype is\n"
             "'float32', 'float16' or 'bfloat16'; act is 'none' or 'relu'.  Raises ValueError\n"
             "for bad arguments, NotImplementedError when libcublasLt (or the driver) is\n"
             "missing or its heuristic has no algorithm for the problem (the caller falls\n"
             "back), RuntimeError when a call fails.");

static PyObject *py_lt_matmul(PyObject *self, PyObject *args)
{
    mf_cuda_lt_matmul g;
    PyObject *stream, *ws, *a, *b, *d, *bias;
    void *pa, *pb, *pbias;
    unsigned long long ws_bytes;
    const char *dtype, *act;
    mf_cuda_ctx ctx = {""};
    int rc;
    (void)self;
    memset(&g, 0, sizeof g);
    if (!PyArg_ParseTuple(args, "iOOKiiiiiOiLOiLOiLispOs", &g.device, &stream, &ws, &ws_bytes, &g.transa,
                          &g.transb, &g.m, &g.n, &g.k, &a, &g.lda, &g.stride_a, &b, &g.ldb, &g.stride_b, &d,
                          &g.ldd, &g.stride_d, &g.batch, &dtype, &g.allow_tf32, &bias, &act))
        return NULL;
    if (ptr_arg(stream, &g.stream) < 0 || ptr_arg(ws, &g.workspace) < 0 || ptr_arg(a, &pa) < 0 ||
        ptr_arg(b, &pb) < 0 || ptr_arg(d, &g.D) < 0 || ptr_arg(bias, &pbias) < 0)
        return NULL;
    g.workspace_bytes = (size_t)ws_bytes;
    g.A = pa;
    g.B = pb;
    g.bias = pbias;
    if (gemm_dtype("cublaslt_matmul", dtype, 0, &g.dtype) < 0)
        return NULL;
    if (strcmp(act, "relu") == 0)
        g.act = MF_CUDA_ACT_RELU;
    else if (strcmp(act, "none") == 0)
        g.act = MF_CUDA_ACT_NONE;
    else {
        PyErr_Format(PyExc_ValueError, "cublaslt_matmul: unsupported activation %s", act);
        return NULL;
    }
    ctx.err[0] = '\0';
    rc = mf_cuda_lt_matmul_run(&g, &ctx);
    /* cuBLASLt is optional: without it the pair runs as torch ops, so a
     * missing library is a case not covered here, like no algorithm. */
    if (rc == MF_CUDA_ENOTFOUND)
        rc = MF_CUDA_EUNSUPPORTED;
    if (rc != MF_OK)
        return mf_py_raise_status(rc, ctx.err);
    Py_RETURN_NONE;
}

/* ---- registration ------------------------------------------------------------ */

static PyMethodDef cuda_methods[] = {
    {"cuda_set_search_dirs", (PyCFunction)py_set_dirs, METH_O, set_dirs_doc},
    {"cuda_status", (PyCFunction)py_status, METH_NOARGS, status_doc},
    {"cuda_codegen", (PyCFunction)py_codegen, METH_O, codegen_doc},
    {"cuda_codegen_info", (PyCFunction)py_codegen_info, METH_NOARGS, codegen_info_doc},
    {"nvrtc_compile", (PyCFunction)(void (*)(void))py_compile, METH_VARARGS | METH_KEYWORDS, compile_doc},
    {"cuda_cache_stats", (PyCFunction)py_cache_stats, METH_NOARGS, cache_stats_doc},
    {"cuda_cache_clear", (PyCFunction)py_cache_clear, METH_NOARGS, cache_clear_doc},
    {"cuda_device_info", (PyCFunction)py_device_info, METH_O, device_info_doc},
    {"cuda_load_function", (PyCFunction)py_load_function, METH_VARARGS, load_doc},
    {"cuda_launch", (PyCFunction)py_launch, METH_VARARGS, launch_doc},
    {"cublas_gemm", (PyCFunction)py_gemm, METH_VARARGS, gemm_doc},
    {"cublaslt_matmul", (PyCFunction)py_lt_matmul, METH_VARARGS, lt_matmul_doc},
    {NULL, NULL, 0, NULL},
};

int mf_py_cuda_exec(PyObject *module)
{
    PyObject *exc = NULL, *base = NULL;
    int rc = -1;
    if (PyModule_AddFunctions(module, cuda_methods) < 0)
        goto error;
    base = PyObject_GetAttrString(module, "MemFuseError"); /* module.c adds it first */
    if (!base)
        goto error;
    exc = PyErr_NewExceptionWithDoc(
        "thunder_memfuse._C.KernelCompileError",
        "A generated kernel did not compile; .log holds the NVRTC log, .source the source.",
        base, NULL);
    if (!exc)
        goto error;
    if (PyModule_AddObjectRef(module, "KernelCompileError", exc) < 0)
        goto error;
    rc = 0;
error:
    Py_XDECREF(exc);
    Py_XDECREF(base);
    return rc;
}
