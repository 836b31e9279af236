/* Segment copies for pipeline/to_torch/runs.py: one call writes a whole output buffer as a
 * sequence of rows, each row a few runs (copied values, a constant, positions 0..n-1), so
 * building a tensor from per-row pieces costs one Python call instead of one numpy view per row
 * and run, and the output is written once, in memory order.
 *
 * Every buffer comes through the buffer protocol (numpy arrays, memoryviews, ...), C-contiguous.
 * Outputs hold int64 or float32; sources hold fixed-width integers or floats, converted while
 * copied with C casts (what numpy's casting loops do). Positions and lengths are int64 buffers
 * with one entry per row, counted in elements of the buffer they index. Every run is checked
 * against the buffers' sizes before anything is written: a bad run raises IndexError or
 * ValueError and leaves the output untouched. The copy loop runs without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef enum { K_I8, K_U8, K_I16, K_U16, K_I32, K_U32, K_I64, K_U64, K_F32, K_F64 } Kind;

static const char *kind_names[] = {"int8", "uint8", "int16", "uint16", "int32", "uint32",
                                   "int64", "uint64", "float32", "float64"};

/* The element kind of a buffer from its struct format and item size; -1 (TypeError set) when it
 * is not a native fixed-width integer or float. */
static int buffer_kind(const Py_buffer *v, const char *what) {
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    if (f[0] != '\0' && f[1] == '\0') {
        Py_ssize_t n = v->itemsize;
        switch (f[0]) {
        case 'b': case 'h': case 'i': case 'l': case 'q':
            if (n == 1) return K_I8;
            if (n == 2) return K_I16;
            if (n == 4) return K_I32;
            if (n == 8) return K_I64;
            break;
        case 'B': case 'H': case 'I': case 'L': case 'Q':
            if (n == 1) return K_U8;
            if (n == 2) return K_U16;
            if (n == 4) return K_U32;
            if (n == 8) return K_U64;
            break;
        case 'f':
            if (n == 4) return K_F32;
            break;
        case 'd':
            if (n == 8) return K_F64;
            break;
        }
    }
    PyErr_Format(PyExc_TypeError, "%s: unsupported element format '%s' (itemsize %zd)", what,
                 v->format ? v->format : "B", v->itemsize);
    return -1;
}

/* A C-contiguous buffer (writable when asked) and its kind; -1 with an exception set. */
static int get_buffer(PyObject *obj, Py_buffer *v, int writable, const char *what) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) < 0)
        return -1;
    int kind = buffer_kind(v, what);
    if (kind < 0)
        PyBuffer_Release(v);
    return kind;
}

/* An int64 index buffer of ``n`` entries (n < 0: any length, stored back). */
static const int64_t *get_index(PyObject *obj, Py_buffer *v, Py_ssize_t *n, const char *what) {
    int kind = get_buffer(obj, v, 0, what);
    if (kind < 0)
        return NULL;
    if (kind != K_I64) {
        PyErr_Format(PyExc_TypeError, "%s must hold int64, not %s", what, kind_names[kind]);
    } else if (*n >= 0 && v->len / 8 != *n) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd entries, expected %zd", what, v->len / 8,
                     *n);
    } else {
        *n = v->len / 8;
        return (const int64_t *)v->buf;
    }
    PyBuffer_Release(v);
    return NULL;
}

/* Check that runs at[i] .. at[i] + len[i] (i in [lo, hi)) lie within ``size`` elements. */
static int check_runs(const int64_t *at, const int64_t *len, Py_ssize_t lo, Py_ssize_t hi,
                      Py_ssize_t size, const char *what) {
    for (Py_ssize_t i = lo; i < hi; i++) {   /* lengths: checked non-negative beforehand */
        if (at[i] < 0 || at[i] > size || len[i] > size - at[i]) {
            PyErr_Format(PyExc_IndexError,
                         "row %zd: %s elements [%lld, %lld + %lld) outside its %zd elements", i,
                         what, (long long)at[i], (long long)at[i], (long long)len[i], size);
            return -1;
        }
    }
    return 0;
}

static int is_float(int kind) { return kind == K_F32 || kind == K_F64; }

#define CONVERT(DT, ST)                                                   \
    do {                                                                  \
        DT *d_ = (DT *)dst;                                               \
        const ST *s_ = (const ST *)src;                                   \
        for (int64_t k_ = 0; k_ < n; k_++)                                \
            d_[k_] = (DT)s_[k_];                                          \
    } while (0)

#define FROM_SOURCE(DT)                                                   \
    switch (skind) {                                                      \
    case K_I8: CONVERT(DT, int8_t); break;                                \
    case K_U8: CONVERT(DT, uint8_t); break;                               \
    case K_I16: CONVERT(DT, int16_t); break;                              \
    case K_U16: CONVERT(DT, uint16_t); break;                             \
    case K_I32: CONVERT(DT, int32_t); break;                              \
    case K_U32: CONVERT(DT, uint32_t); break;                             \
    case K_I64: CONVERT(DT, int64_t); break;                              \
    case K_U64: CONVERT(DT, uint64_t); break;                             \
    case K_F32: CONVERT(DT, float); break;                                \
    case K_F64: CONVERT(DT, double); break;                               \
    }

/* Copy ``n`` elements of kind ``skind`` to ``dst`` (int64 or float32), converting. */
static void copy_one(void *dst, int dkind, const void *src, int skind, int64_t n) {
    if ((dkind == K_I64 && (skind == K_I64 || skind == K_U64)) ||
        (dkind == K_F32 && skind == K_F32)) {
        memcpy(dst, src, (size_t)n * (dkind == K_I64 ? 8 : 4));
    } else if (dkind == K_I64) {
        FROM_SOURCE(int64_t)
    } else {
        FROM_SOURCE(float)
    }
}

enum { P_COPY, P_FILL, P_POSITIONS };

/* One run per row: its lengths and what it writes. */
typedef struct {
    int type;
    Py_buffer len_buf, bounds_buf, at_buf;
    const int64_t *len, *bounds, *src_at;
    int have_len, have_bounds, have_at;
    Py_ssize_t nsrc, got;           /* sources, and how many of their buffers are held */
    Py_buffer *srcs;
    int *kinds;
    int64_t ival;
    float fval;
    Py_ssize_t cur;                 /* the source the row being written reads */
} Part;

static void release_part(Part *p) {
    for (Py_ssize_t j = 0; j < p->got; j++)
        PyBuffer_Release(&p->srcs[j]);
    PyMem_Free(p->srcs);
    PyMem_Free(p->kinds);
    if (p->have_len) PyBuffer_Release(&p->len_buf);
    if (p->have_bounds) PyBuffer_Release(&p->bounds_buf);
    if (p->have_at) PyBuffer_Release(&p->at_buf);
}

/* Parse part ``k``: ("copy", lengths, sources, bounds, src_at), ("fill", lengths, value) or
 * ("positions", lengths), checking its source runs. */
static int parse_part(Part *p, PyObject *spec, Py_ssize_t k, Py_ssize_t nrows, int dkind) {
    PyObject *kind_o, *len_o, *a = NULL, *b = NULL, *c = NULL;
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 2) {
        PyErr_Format(PyExc_TypeError, "part %zd must be a tuple (kind, lengths, ...)", k);
        return -1;
    }
    if (!PyArg_ParseTuple(spec, "UO|OOO:part", &kind_o, &len_o, &a, &b, &c))
        return -1;
    Py_ssize_t want;
    if (PyUnicode_CompareWithASCIIString(kind_o, "copy") == 0) {
        p->type = P_COPY;
        want = 5;
    } else if (PyUnicode_CompareWithASCIIString(kind_o, "fill") == 0) {
        p->type = P_FILL;
        want = 3;
    } else if (PyUnicode_CompareWithASCIIString(kind_o, "positions") == 0) {
        p->type = P_POSITIONS;
        want = 2;
    } else {
        PyErr_Format(PyExc_ValueError, "part %zd: unknown kind %R (copy, fill or positions)", k,
                     kind_o);
        return -1;
    }
    if (PyTuple_GET_SIZE(spec) != want) {
        PyErr_Format(PyExc_TypeError, "part %zd (%U) takes %zd items, not %zd", k, kind_o, want,
                     PyTuple_GET_SIZE(spec));
        return -1;
    }
    Py_ssize_t n = nrows;
    if ((p->len = get_index(len_o, &p->len_buf, &n, "a part's lengths")) == NULL)
        return -1;
    p->have_len = 1;
    for (Py_ssize_t i = 0; i < nrows; i++)
        if (p->len[i] < 0) {
            PyErr_Format(PyExc_ValueError, "part %zd: row %zd has a negative length (%lld)", k,
                         i, (long long)p->len[i]);
            return -1;
        }
    if (p->type == P_POSITIONS) {
        if (dkind != K_I64) {
            PyErr_SetString(PyExc_TypeError, "positions are written into an int64 output");
            return -1;
        }
        return 0;
    }
    if (p->type == P_FILL) {
        if (dkind == K_I64)
            p->ival = (int64_t)PyLong_AsLongLong(a);
        else
            p->fval = (float)PyFloat_AsDouble(a);
        return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *seq = PySequence_Fast(a, "a copy part's sources must be a sequence of buffers");
    if (seq == NULL)
        return -1;
    int ok = -1;
    p->nsrc = PySequence_Fast_GET_SIZE(seq);
    p->srcs = PyMem_Calloc(p->nsrc ? p->nsrc : 1, sizeof(Py_buffer));
    p->kinds = PyMem_Calloc(p->nsrc ? p->nsrc : 1, sizeof(int));
    if (p->srcs == NULL || p->kinds == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    Py_ssize_t nb = p->nsrc;
    if ((p->bounds = get_index(b, &p->bounds_buf, &nb, "bounds (one per source)")) == NULL)
        goto out;
    p->have_bounds = 1;
    n = nrows;
    if ((p->src_at = get_index(c, &p->at_buf, &n, "src_at")) == NULL)
        goto out;
    p->have_at = 1;
    for (Py_ssize_t j = 0; j < p->nsrc; j++) {
        p->kinds[j] = get_buffer(PySequence_Fast_GET_ITEM(seq, j), &p->srcs[j], 0, "a source");
        if (p->kinds[j] < 0)
            goto out;
        p->got++;
        if (dkind == K_I64 && is_float(p->kinds[j])) {
            PyErr_Format(PyExc_TypeError, "part %zd: source %zd holds %s, not copied into "
                         "int64", k, j, kind_names[p->kinds[j]]);
            goto out;
        }
        int64_t lo = j ? p->bounds[j - 1] : 0, hi = p->bounds[j];
        if (hi < lo || hi > nrows) {
            PyErr_Format(PyExc_ValueError, "part %zd: bounds[%zd] = %lld: bounds must be "
                         "non-decreasing and at most the number of rows (%zd)", k, j,
                         (long long)hi, nrows);
            goto out;
        }
        if (check_runs(p->src_at, p->len, lo, hi, p->srcs[j].len / p->srcs[j].itemsize,
                       "source") < 0)
            goto out;
    }
    if ((p->nsrc ? p->bounds[p->nsrc - 1] : 0) != nrows) {
        PyErr_Format(PyExc_ValueError, "part %zd: the sources' bounds end at row %lld, not at "
                     "the last row (%zd)", k, (long long)(p->nsrc ? p->bounds[p->nsrc - 1] : 0),
                     nrows);
        goto out;
    }
    ok = 0;
out:
    Py_DECREF(seq);
    return ok;
}

/* Write row i's parts one after another from ``out`` (checked beforehand). */
static void write_row(char *out, Py_ssize_t dsz, int dkind, Part *parts, Py_ssize_t np,
                      Py_ssize_t i) {
    for (Py_ssize_t k = 0; k < np; k++) {
        Part *p = &parts[k];
        int64_t n = p->len[i];
        if (n == 0)
            continue;
        if (p->type == P_COPY) {
            while (i >= p->bounds[p->cur])
                p->cur++;
            const Py_buffer *s = &p->srcs[p->cur];
            copy_one(out, dkind, (const char *)s->buf + p->src_at[i] * s->itemsize,
                     p->kinds[p->cur], n);
        } else if (p->type == P_POSITIONS) {
            int64_t *d = (int64_t *)out;
            for (int64_t j = 0; j < n; j++)
                d[j] = j;
        } else if (dkind == K_I64) {
            int64_t *d = (int64_t *)out, v = p->ival;
            for (int64_t j = 0; j < n; j++)
                d[j] = v;
        } else {
            float *d = (float *)out, v = p->fval;
            for (int64_t j = 0; j < n; j++)
                d[j] = v;
        }
        out += n * dsz;
    }
}

PyDoc_STRVAR(write_rows_doc,
"write_rows(dst, row_at, parts)\n\n"
"Write row i of the flat output dst (int64 or float32) from dst[row_at[i]]: each part's run\n"
"for that row, one after another. A part is\n"
"  (\"copy\", lengths, sources, bounds, src_at): lengths[i] values of its source from\n"
"      src_at[i], converted to dst's type (a float source into an int64 output is refused);\n"
"      row i reads sources[j] for bounds[j-1] <= i < bounds[j] (bounds: one per source,\n"
"      non-decreasing, the last one the number of rows);\n"
"  (\"fill\", lengths, value): lengths[i] copies of value (an int for an int64 output);\n"
"  (\"positions\", lengths): 0, 1, ..., lengths[i] - 1 (an int64 output).\n"
"Positions and lengths are int64 buffers of one entry per row. Nothing is written unless every\n"
"run lies within its buffers (IndexError) and every length is non-negative (ValueError).");

static PyObject *write_rows(PyObject *self, PyObject *args) {
    PyObject *dst_o, *at_o, *parts_o;
    if (!PyArg_ParseTuple(args, "OOO:write_rows", &dst_o, &at_o, &parts_o))
        return NULL;
    PyObject *seq = PySequence_Fast(parts_o, "parts must be a sequence of tuples");
    if (seq == NULL)
        return NULL;
    Py_ssize_t np = PySequence_Fast_GET_SIZE(seq), nrows = -1, parsed = 0;
    Part *parts = PyMem_Calloc(np ? np : 1, sizeof(Part));
    Py_buffer dst, at;
    int have_dst = 0, have_at = 0, ok = 0;
    if (parts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int dkind = get_buffer(dst_o, &dst, 1, "the output");
    if (dkind < 0)
        goto done;
    have_dst = 1;
    if (dkind != K_I64 && dkind != K_F32) {
        PyErr_Format(PyExc_TypeError, "the output must hold int64 or float32, not %s",
                     kind_names[dkind]);
        goto done;
    }
    const int64_t *row_at = get_index(at_o, &at, &nrows, "row_at");
    if (row_at == NULL)
        goto done;
    have_at = 1;
    for (; parsed < np; parsed++)
        if (parse_part(&parts[parsed], PySequence_Fast_GET_ITEM(seq, parsed), parsed, nrows,
                       dkind) < 0) {
            parsed++;
            goto done;
        }
    Py_ssize_t size = dst.len / dst.itemsize;
    for (Py_ssize_t i = 0; i < nrows; i++) {
        int64_t pos = row_at[i];
        if (pos < 0 || pos > size)
            goto outside;
        for (Py_ssize_t k = 0; k < np; k++) {
            if (parts[k].len[i] > size - pos)
                goto outside;
            pos += parts[k].len[i];
        }
        continue;
    outside:
        PyErr_Format(PyExc_IndexError, "row %zd: the runs from output element %lld on (%lld "
                     "elements) pass the output's end (%zd elements)", i, (long long)row_at[i],
                     (long long)(pos - row_at[i]) , size);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < nrows; i++)
        write_row((char *)dst.buf + row_at[i] * dst.itemsize, dst.itemsize, dkind, parts, np, i);
    Py_END_ALLOW_THREADS
    ok = 1;
done:
    for (Py_ssize_t k = 0; k < parsed; k++)
        release_part(&parts[k]);
    PyMem_Free(parts);
    if (have_at) PyBuffer_Release(&at);
    if (have_dst) PyBuffer_Release(&dst);
    Py_DECREF(seq);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"write_rows", write_rows, METH_VARARGS, write_rows_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pipeline.to_torch._runs",
    "Rows of int64 / float32 output buffers written from runs: copies, constants, positions.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__runs(void) { return PyModule_Create(&module); }
