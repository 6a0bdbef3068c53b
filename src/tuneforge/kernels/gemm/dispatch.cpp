// tuneforge.gemm's fast path: after a layout has been tuned, later calls with that layout are answered
// here without a Python frame. The key (sizes, strides, dtypes, beta != 0, bias given, space) is read
// straight from the arrays; a hit calls the compiled kernel through its C function pointer, or numpy's
// matmul, or the prepared Python call. Anything unusual (a miss, a subclass, a read-only or misaligned
// output, overlapping operands, an odd bias) goes to the Python slow path, which checks and tunes.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <vector>

// @BUSY_THREADS@
// @HANDOFF@

namespace {

typedef void (*GemmKernel)(int64_t M, int64_t N, int64_t K, int64_t rsa, int64_t csa, int64_t rsb, int64_t csb,
                           int64_t rsc, int64_t csc, int64_t MC, int64_t KC, int64_t NC, int64_t threads,
                           int64_t par, double alpha, double beta, const void* a, const void* b, void* c,
                           const void* bias);

struct Key {  // zero-initialised as a whole, so memcmp over the padding is well defined
    int64_t m, n, k, strides[6];
    int32_t types[3];
    uint8_t beta_nonzero, has_bias, space;
};

enum Kind { KERNEL = 0, LIBRARY = 1, CALL = 2 };

struct Entry {
    Key key;
    bool used;
    Kind kind;
    GemmKernel kernel;
    int64_t params[5];  // MC, KC, NC, threads, mode (template.runtime_args)
    PyObject* call;     // (alpha, beta, a, b, out, bias); owned
    tfhandoff::Handoff handoff;  // a multi-threaded kernel's plain calls, handed to numpy while crowded
};

std::vector<Entry> table(64);  // open addressing, power-of-two size, at most half full
size_t filled = 0;
PyObject* slow_path = nullptr;  // tuneforge.kernels.gemm.op's Python implementation
PyObject* matmul = nullptr;     // numpy.matmul
PyObject* out_kwname = nullptr;  // ("out",)
const char* const SPACES[] = {"default", "exhaustive"};

uint64_t hash_key(const Key& key) {
    static_assert(sizeof(Key) % 8 == 0, "the key hashes as whole words");
    uint64_t words[sizeof(Key) / 8], h = 0x9e3779b97f4a7c15ull;
    memcpy(words, &key, sizeof(Key));
    for (uint64_t w : words) h = (h ^ w) * 0xff51afd7ed558ccdull, h ^= h >> 32;  // multiply-xorshift per word
    return h;
}

Entry* slot(const Key& key) {
    const size_t mask = table.size() - 1;
    for (size_t i = hash_key(key) & mask;; i = (i + 1) & mask)
        if (!table[i].used || memcmp(&table[i].key, &key, sizeof(Key)) == 0) return &table[i];
}

uint64_t deferred_calls = 0;

// Whether the kernel may run on fewer threads than it was tuned with and give the same result: not the few-rows
// kernel (MC = 0) splitting the depth (mode bit 1), whose partial sums are added per thread.
bool may_use_fewer(const Entry& e) { return !(e.params[0] == 0 && (e.params[4] & 1)); }

// Notes a watched call's time (the entry is looked up again: the table may have changed during the call).
void learn(const Key& key, GemmKernel kernel, tfhandoff::Plan planned, bool explored, int64_t start, int64_t end) {
    Entry* e = slot(key);
    if (e->used && e->kernel == kernel) tfhandoff::learn(&e->handoff, planned, explored, start, end);
}

int space_index(PyObject* space) {
    if (!PyUnicode_Check(space)) return -1;
    for (int i = 0; i < 2; ++i)
        if (PyUnicode_CompareWithASCIIString(space, SPACES[i]) == 0) return i;
    return -1;
}

bool as_double(PyObject* obj, double* out) {
    if (PyFloat_Check(obj)) {  // float and its subclasses (numpy.float64)
        *out = PyFloat_AS_DOUBLE(obj);
        return true;
    }
    if (PyLong_CheckExact(obj)) {
        *out = PyLong_AsDouble(obj);
        if (*out == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return false;
        }
        return true;
    }
    return false;
}

bool is_matrix(PyObject* obj) { return PyArray_CheckExact(obj) && PyArray_NDIM((PyArrayObject*)obj) == 2; }

// The bytes an array's elements span, for the overlap test: [lo, hi).
void extent(PyArrayObject* arr, char** lo, char** hi) {
    char* base = PyArray_BYTES(arr);
    *lo = *hi = base;
    for (int d = 0; d < PyArray_NDIM(arr); ++d) {
        const npy_intp span = (PyArray_DIM(arr, d) - 1) * PyArray_STRIDE(arr, d);
        if (span < 0) *lo += span; else *hi += span;
    }
    *hi += PyArray_ITEMSIZE(arr);
}

bool overlaps(PyArrayObject* x, PyArrayObject* y) {
    char *xl, *xh, *yl, *yh;
    extent(x, &xl, &xh);
    extent(y, &yl, &yh);
    return xl < yh && yl < xh;
}

// The key of a call, or false when the call is not one the fast path takes.
bool make_key(PyObject* a_obj, PyObject* b_obj, PyObject* out_obj, bool beta_nonzero, PyObject* bias,
              PyObject* space, Key* key) {
    if (!is_matrix(a_obj) || !is_matrix(b_obj) || !is_matrix(out_obj)) return false;
    PyArrayObject *a = (PyArrayObject*)a_obj, *b = (PyArrayObject*)b_obj, *out = (PyArrayObject*)out_obj;
    const int space_id = space_index(space);
    if (space_id < 0) return false;
    memset(key, 0, sizeof(Key));
    key->m = PyArray_DIM(a, 0);
    key->k = PyArray_DIM(a, 1);
    key->n = PyArray_DIM(b, 1);
    PyArrayObject* arrays[3] = {a, b, out};
    for (int i = 0; i < 3; ++i) {
        key->strides[2 * i] = PyArray_STRIDE(arrays[i], 0);
        key->strides[2 * i + 1] = PyArray_STRIDE(arrays[i], 1);
        key->types[i] = PyArray_TYPE(arrays[i]);
    }
    key->beta_nonzero = beta_nonzero;
    key->has_bias = bias != Py_None;
    key->space = (uint8_t)space_id;
    return true;
}

// Whether the arrays of a call with a known key are safe to hand to the registered call as they are.
bool safe_operands(PyArrayObject* a, PyArrayObject* b, PyArrayObject* out, PyObject* bias, const Key& key) {
    if (PyArray_DIM(b, 0) != key.k || PyArray_DIM(out, 0) != key.m || PyArray_DIM(out, 1) != key.n) return false;
    if (!PyArray_ISWRITEABLE(out) || !PyArray_ISALIGNED(out) || !PyArray_ISALIGNED(a) || !PyArray_ISALIGNED(b))
        return false;
    if (overlaps(out, a) || overlaps(out, b)) return false;
    if (bias != Py_None) {
        if (!PyArray_CheckExact(bias)) return false;
        PyArrayObject* v = (PyArrayObject*)bias;
        if (PyArray_NDIM(v) != 1 || PyArray_DIM(v, 0) != key.n || PyArray_TYPE(v) != key.types[0] ||
            (key.n > 1 && PyArray_STRIDE(v, 0) != PyArray_ITEMSIZE(v)) || !PyArray_ISALIGNED(v) || overlaps(out, v))
            return false;
    }
    return true;
}

PyObject* call_slow(PyObject* const* args) {
    if (slow_path == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "tuneforge gemm dispatcher used before init()");
        return nullptr;
    }
    return PyObject_Vectorcall(slow_path, args, 7, nullptr);
}

// gemm(a, b, out, alpha, beta, bias, space) -> out
PyObject* gemm(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "gemm dispatcher takes 7 arguments (%zd given)", nargs);
        return nullptr;
    }
    PyObject *a = args[0], *b = args[1], *out = args[2], *bias = args[5], *space = args[6];
    double alpha, beta;
    if (!as_double(args[3], &alpha) || !as_double(args[4], &beta) || !is_matrix(a) || !is_matrix(b))
        return call_slow(args);
    PyObject* allocated = nullptr;
    if (out == Py_None) {
        if (beta != 0) return call_slow(args);  // the slow path explains the error
        npy_intp dims[2] = {PyArray_DIM((PyArrayObject*)a, 0), PyArray_DIM((PyArrayObject*)b, 1)};
        allocated = PyArray_EMPTY(2, dims, PyArray_TYPE((PyArrayObject*)a), 0);
        if (allocated == nullptr) return nullptr;
        out = allocated;
    }
    Key key;
    const Entry* hit = nullptr;
    if (make_key(a, b, out, beta != 0, bias, space, &key)) {
        const Entry* e = slot(key);
        if (e->used && safe_operands((PyArrayObject*)a, (PyArrayObject*)b, (PyArrayObject*)out, bias, key)) hit = e;
    }
    if (hit == nullptr) {
        Py_XDECREF(allocated);
        return call_slow(args);
    }
    PyObject* result = nullptr;
    const Entry entry = *hit;  // the table may change (another thread, or the Python call) while this runs
    PyObject* keep = entry.call;
    Py_INCREF(keep);
    const bool plain = alpha == 1 && beta == 0 && bias == Py_None;
    const bool watched = entry.kind == KERNEL && entry.params[3] > 1 && plain;
    const int64_t start = watched ? tfhandoff::now_ns() : 0;
    int64_t threads = entry.params[3];
    bool explored = false;
    const tfhandoff::Plan planned =
        watched ? tfhandoff::plan(&slot(key)->handoff, threads, may_use_fewer(entry), start, &threads, &explored)
                : tfhandoff::QUIET;
    if (watched && planned == tfhandoff::LIBRARY_TAKES) {
        ++deferred_calls;
        PyObject* call_args[3] = {a, b, out};
        PyObject* returned = PyObject_Vectorcall(matmul, call_args, 2, out_kwname);
        if (returned != nullptr) {
            Py_DECREF(returned);
            Py_INCREF(out);
            result = out;
            learn(key, entry.kernel, planned, explored, start, tfhandoff::now_ns());
        }
    } else if (entry.kind == KERNEL) {
        const void* bias_data = bias == Py_None ? nullptr : PyArray_DATA((PyArrayObject*)bias);
        const int64_t item = PyArray_ITEMSIZE((PyArrayObject*)a);
        const int64_t* s = key.strides;
        const void* a_data = PyArray_DATA((PyArrayObject*)a);
        const void* b_data = PyArray_DATA((PyArrayObject*)b);
        void* c_data = PyArray_DATA((PyArrayObject*)out);
        const int64_t* p = entry.params;
        const bool long_call = key.m * key.n * key.k >= (1 << 16);  // worth the cost of releasing the GIL
        PyThreadState* state = long_call ? PyEval_SaveThread() : nullptr;
        entry.kernel(key.m, key.n, key.k, s[0] / item, s[1] / item, s[2] / item, s[3] / item, s[4] / item,
                    s[5] / item, p[0], p[1], p[2], threads, p[4], alpha, beta, a_data, b_data, c_data, bias_data);
        if (state != nullptr) PyEval_RestoreThread(state);
        if (watched) learn(key, entry.kernel, planned, explored, start, tfhandoff::now_ns());
        Py_INCREF(out);
        result = out;
    } else {
        PyObject* returned;
        if (entry.kind == LIBRARY && plain) {
            PyObject* call_args[3] = {a, b, out};
            returned = PyObject_Vectorcall(matmul, call_args, 2, out_kwname);
        } else {
            PyObject* call_args[6] = {args[3], args[4], a, b, out, bias};
            returned = PyObject_Vectorcall(keep, call_args, 6, nullptr);
        }
        if (returned != nullptr) {
            Py_DECREF(returned);
            Py_INCREF(out);
            result = out;
        }
    }
    Py_DECREF(keep);
    Py_XDECREF(allocated);
    return result;
}

void grow() {
    std::vector<Entry> old(table.size() * 2);
    old.swap(table);
    for (const Entry& e : old)
        if (e.used) *slot(e.key) = e;
}

// register(a, b, out, beta, bias, space, kind, call, address, params) -> bool: whether the layout was taken
PyObject* register_call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 10 && nargs != 11) {
        PyErr_Format(PyExc_TypeError, "register takes 10 or 11 arguments (%zd given)", nargs);
        return nullptr;
    }
    double library_ratio = 0;  // numpy's tuned time over the kernel's; 0: not known
    if (nargs == 11 && !as_double(args[10], &library_ratio)) {
        PyErr_SetString(PyExc_TypeError, "register: library_ratio must be a number");
        return nullptr;
    }
    double beta;
    Key key;
    if (!as_double(args[3], &beta) || !make_key(args[0], args[1], args[2], beta != 0, args[4], args[5], &key))
        Py_RETURN_FALSE;
    const long kind = PyLong_AsLong(args[6]);
    if (kind == -1 && PyErr_Occurred()) return nullptr;
    if (kind < KERNEL || kind > CALL) {
        PyErr_Format(PyExc_ValueError, "register: kind must be 0, 1 or 2, not %ld", kind);
        return nullptr;
    }
    void* address = PyLong_AsVoidPtr(args[8]);
    if (PyErr_Occurred()) return nullptr;
    if (kind == KERNEL && address == nullptr) {
        PyErr_SetString(PyExc_ValueError, "register: a kernel needs its address");
        return nullptr;
    }
    int64_t params[5] = {0, 0, 0, 0, 0};
    if (kind == KERNEL) {
        if (!PyTuple_Check(args[9]) || PyTuple_GET_SIZE(args[9]) != 5) {
            PyErr_SetString(PyExc_TypeError, "register: params must be (MC, KC, NC, threads, mode)");
            return nullptr;
        }
        for (int i = 0; i < 5; ++i) {
            params[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(args[9], i));
            if (params[i] == -1 && PyErr_Occurred()) return nullptr;
        }
    }
    if (2 * (filled + 1) > table.size()) grow();
    Entry* e = slot(key);
    if (e->used) Py_DECREF(e->call);
    else ++filled;
    Py_INCREF(args[7]);
    *e = Entry{key, true, (Kind)kind, (GemmKernel)address, {params[0], params[1], params[2], params[3], params[4]},
               args[7], {0, 0, 0, 0, 0, 0, library_ratio}};
    Py_RETURN_TRUE;
}

PyObject* clear(PyObject*, PyObject*) {
    for (Entry& e : table)
        if (e.used) Py_DECREF(e.call);
    std::vector<Entry>(64).swap(table);
    filled = 0;
    Py_RETURN_NONE;
}

PyObject* size(PyObject*, PyObject*) { return PyLong_FromSize_t(filled); }

PyObject* deferred(PyObject*, PyObject*) { return PyLong_FromUnsignedLongLong(deferred_calls); }

PyObject* busy_threads(PyObject*, PyObject*) { return PyLong_FromLong(tfbusy::running_others()); }

PyObject* echo_ns(PyObject*, PyObject*) { return PyLong_FromLongLong(tfhandoff::library_echo_ns); }

// What the hand-off has learned of each multi-threaded kernel (times in ns, 0: not seen yet), for diagnostics.
PyObject* handoff(PyObject*, PyObject*) {
    PyObject* list = PyList_New(0);
    if (list == nullptr) return nullptr;
    for (const Entry& e : table) {
        if (!e.used || e.kind != KERNEL || e.params[3] < 2) continue;
        PyObject* item = Py_BuildValue("{s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:d,s:L}", "m", (long long)e.key.m, "n",
                                       (long long)e.key.n, "k", (long long)e.key.k, "threads", (long long)e.params[3],
                                       "best_ns", (long long)e.handoff.best_ns, "contended_ns", (long long)e.handoff.contended_ns,
                                       "fewer_ns", (long long)e.handoff.fewer_ns, "library_ns", (long long)e.handoff.library_ns,
                                       "window_ns", (long long)e.handoff.window_ns, "library_ratio", e.handoff.library_ratio,
                                       "crowded", (long long)e.handoff.crowded);
        if (item == nullptr || PyList_Append(list, item) != 0) {
            Py_XDECREF(item);
            Py_DECREF(list);
            return nullptr;
        }
        Py_DECREF(item);
    }
    return list;
}

// init(slow_path, matmul)
PyObject* init(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "init takes (slow_path, matmul), both callable");
        return nullptr;
    }
    Py_INCREF(args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(slow_path, args[0]);
    Py_XSETREF(matmul, args[1]);
    tfhandoff::start_echo();
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"gemm", (PyCFunction)(void (*)(void))gemm, METH_FASTCALL,
     "gemm(a, b, out, alpha, beta, bias, space) -> out: a registered layout's call, else the slow path"},
    {"register", (PyCFunction)(void (*)(void))register_call, METH_FASTCALL,
     "register(a, b, out, beta, bias, space, kind, call, address, params[, library_ratio]) -> bool"},
    {"init", (PyCFunction)(void (*)(void))init, METH_FASTCALL, "init(slow_path, matmul)"},
    {"clear", clear, METH_NOARGS, "forget every registered layout"},
    {"size", size, METH_NOARGS, "how many layouts are registered"},
    {"deferred", deferred, METH_NOARGS,
     "how many kernel calls numpy.matmul took while the kernel's threads would have shared cores"},
    {"handoff", handoff, METH_NOARGS, "what the hand-off to numpy has learned of each multi-threaded kernel"},
    {"echo_ns", echo_ns, METH_NOARGS, "how long OpenBLAS's workers are taken to spin after a call, in ns"},
    {"busy_threads", busy_threads, METH_NOARGS,
     "how many other threads of this process are running now (the caller and tuneforge's pool workers aside)"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "tuneforge_gemm_dispatch", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_tuneforge_gemm_dispatch(void) {
    import_array();
    out_kwname = Py_BuildValue("(s)", "out");
    if (out_kwname == nullptr) return nullptr;
    return PyModule_Create(&module);
}
