/*
 * Compiled helper of the span dataset (analysis/store/dataset.py): the
 * earliest host start of each row's invocation, which decides the time window
 * a row is written to. Optional: where it is not built, dataset.py does the
 * same with an Arrow group-by, and tests/test_predicates.py holds both to the
 * SQL definition (predicates.row_host_start).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/*
 * The earliest host start of each row's invocation (pid, inv) among the rows
 * given, for the span dataset's time windows (analysis/store/dataset.py, which
 * has the same in Arrow when this module is not built). Rows without an inv keep
 * their own start; an invocation without host rows gets INT64_MAX.
 */
static PyObject *invocation_starts(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer pid, inv, has_inv, ts, host, out;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*w*", &pid, &inv, &has_inv, &ts, &host, &out))
        return NULL;
    size_t n = (size_t)ts.len / 8;
    PyObject *result = NULL;
    if ((size_t)pid.len != n * 8 || (size_t)inv.len != n * 8 || (size_t)has_inv.len != n || (size_t)host.len != n || (size_t)out.len != n * 8) {
        PyErr_SetString(PyExc_ValueError, "invocation_starts: pid, inv, ts, out of n int64 and has_inv, host of n bytes");
        goto done;
    }
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    /* a table of entry numbers (4 bytes a slot) over the entries, one per invocation: little memory to touch */
    uint32_t *table = malloc(cap * sizeof(uint32_t));
    int64_t *entry_pid = malloc((n ? n : 1) * sizeof(int64_t)), *first = malloc((n ? n : 1) * sizeof(int64_t));
    uint64_t *entry_inv = malloc((n ? n : 1) * sizeof(uint64_t));
    uint32_t *entry_of = malloc((n ? n : 1) * sizeof(uint32_t));
    if (!table || !entry_pid || !first || !entry_inv || !entry_of || n >= UINT32_MAX) {
        free(table);
        free(entry_pid);
        free(first);
        free(entry_inv);
        free(entry_of);
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *p = pid.buf, *t = ts.buf;
    const uint64_t *v = inv.buf;
    const uint8_t *with = has_inv.buf, *on_host = host.buf;
    int64_t *o = out.buf;
    Py_BEGIN_ALLOW_THREADS;
    memset(table, 0xFF, cap * sizeof(uint32_t));
    uint32_t entries = 0;
    for (size_t r = 0; r < n; r++) {
        if (!with[r])
            continue;
        uint64_t h = ((uint64_t)p[r] * 0x9E3779B97F4A7C15ULL) ^ (v[r] * 0xC2B2AE3D27D4EB4FULL);
        size_t i = (size_t)(h ^ (h >> 29)) & (cap - 1);
        uint32_t e;
        while ((e = table[i]) != UINT32_MAX && !(entry_pid[e] == p[r] && entry_inv[e] == v[r]))
            i = (i + 1) & (cap - 1);
        if (e == UINT32_MAX) {
            e = table[i] = entries++;
            entry_pid[e] = p[r];
            entry_inv[e] = v[r];
            first[e] = INT64_MAX;
        }
        if (on_host[r] && t[r] < first[e])
            first[e] = t[r];
        entry_of[r] = e;
    }
    for (size_t r = 0; r < n; r++)
        o[r] = with[r] ? first[entry_of[r]] : t[r];
    Py_END_ALLOW_THREADS;
    free(table);
    free(entry_pid);
    free(first);
    free(entry_inv);
    free(entry_of);
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&pid);
    PyBuffer_Release(&inv);
    PyBuffer_Release(&has_inv);
    PyBuffer_Release(&ts);
    PyBuffer_Release(&host);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef module_methods[] = {
    {"invocation_starts", invocation_starts, METH_VARARGS,
     "invocation_starts(pid, inv, has_inv, ts, host, out): out[r] = the earliest host ts of row r's (pid, inv), INT64_MAX if it has "
     "none; ts[r] for rows without inv (int64 buffers, has_inv and host one byte per row)."},
    {NULL, NULL, 0, NULL},
};


static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_invocation_starts",
    .m_doc = "Compiled helper of the span dataset's time windows (dataset.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__invocation_starts(void) { return PyModule_Create(&module); }
