/* megatron-core's blending rule (greedy.py says it), compiled: about 100 times the Python
 * loop's speed, for a blend megatron-core never saved of hundreds of millions of samples.
 *
 * blend(weights, size, which, nth): weights is a float64 buffer (one per dataset, already
 * normalised); which (int16) and nth (int64) are writable buffers of at least size entries.
 * The arithmetic is megatron-core's own, in IEEE doubles (compiled as ISO C: no contraction
 * of a multiply and a subtract into one rounding), so the choices are the same to the bit.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

#define ABI 1

static PyObject *blend(PyObject *self, PyObject *args) {
    Py_buffer weights, which, nth;
    Py_ssize_t size;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nw*w*", &weights, &size, &which, &nth)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t k = weights.len / (Py_ssize_t)sizeof(double);
    if (weights.len % (Py_ssize_t)sizeof(double) || k < 1 || k > 32767) {
        PyErr_SetString(PyExc_ValueError, "weights: 1 to 32767 float64 values");
    } else if (size < 0 || which.len < size * (Py_ssize_t)sizeof(int16_t) ||
               nth.len < size * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "which and nth must hold size entries");
    } else {
        int64_t *drawn = calloc((size_t)k, sizeof(int64_t));
        if (drawn == NULL) {
            PyErr_NoMemory();
        } else {
            const double *w = (const double *)weights.buf;
            int16_t *out_which = (int16_t *)which.buf;
            int64_t *out_nth = (int64_t *)nth.buf;
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t t = 0; t < size; ++t) {
                double scale = (double)t > 1.0 ? (double)t : 1.0;
                Py_ssize_t best = 0;
                double best_error = w[0] * scale - (double)drawn[0];
                for (Py_ssize_t i = 1; i < k; ++i) {
                    double error = w[i] * scale - (double)drawn[i];
                    if (error > best_error) {
                        best_error = error;
                        best = i;
                    }
                }
                out_which[t] = (int16_t)best;
                out_nth[t] = drawn[best];
                drawn[best] += 1;
            }
            Py_END_ALLOW_THREADS
            free(drawn);
            Py_INCREF(Py_None);
            result = Py_None;
        }
    }
    PyBuffer_Release(&weights);
    PyBuffer_Release(&which);
    PyBuffer_Release(&nth);
    return result;
}

static PyMethodDef methods[] = {
    {"blend", blend, METH_VARARGS, "megatron-core's greedy blend into two buffers."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cgreedy", NULL, -1, methods};

PyMODINIT_FUNC PyInit__cgreedy(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
