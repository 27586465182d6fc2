/* Positioned writes of many files with one release of the GIL: the compiled loop of storage/common/positioned_writes.py
 * (its docstring states the contract; this file follows it piece for piece).
 *
 * write_pieces(pieces: list[tuple[int | bytes, int, buffer]]) -> (written: int, error: int)
 *
 * Each piece is (target, position, data): target an open descriptor, or a file's path (bytes) opened write-only
 * for the piece and closed after it (no O_CREAT: the file exists). The pieces are written in order, each whole;
 * the first that fails ends the call. `written` counts the pieces written whole, `error` is the errno of the one
 * that failed (0: none did). Arguments of the wrong type raise TypeError before anything is written.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct {
    int fd;           /* the descriptor to write through, or -1: open `path` */
    const char *path; /* into the bytes object of the piece, which the list keeps alive */
    long long position;
    Py_buffer data;
} Piece;

static void release(Piece *pieces, Py_ssize_t count) {
    for (Py_ssize_t i = 0; i < count; i++) PyBuffer_Release(&pieces[i].data);
    PyMem_Free(pieces);
}

static int write_piece(const Piece *piece) {
    int fd = piece->fd;
    if (fd < 0) {
        do fd = open(piece->path, O_WRONLY | O_CLOEXEC);
        while (fd < 0 && errno == EINTR);
        if (fd < 0) return errno;
    }
    const char *data = piece->data.buf;
    Py_ssize_t done = 0, size = piece->data.len;
    int error = 0;
    while (done < size) {
        ssize_t written = pwrite(fd, data + done, (size_t)(size - done), (off_t)(piece->position + done));
        if (written < 0) {
            if (errno == EINTR) continue;
            error = errno;
            break;
        }
        if (written == 0) { /* no progress: what a full device may answer instead of ENOSPC */
            error = ENOSPC;
            break;
        }
        done += written;
    }
    if (piece->fd < 0 && close(fd) != 0 && !error && errno != EINTR) error = errno;
    return error;
}

static PyObject *write_pieces(PyObject *module, PyObject *list) {
    (void)module;
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "write_pieces takes a list of (target, position, data)");
        return NULL;
    }
    /* the list is copied: the pieces' objects stay referenced by it, which no other thread can shrink while the
       caller holds it (the caller's own reference) */
    PyObject *pieces_list = PySequence_List(list);
    if (pieces_list == NULL) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(pieces_list);
    Piece *pieces = PyMem_Calloc(count ? (size_t)count : 1, sizeof(Piece));
    if (pieces == NULL) {
        Py_DECREF(pieces_list);
        return PyErr_NoMemory();
    }
    Py_ssize_t ready = 0;
    for (; ready < count; ready++) {
        PyObject *item = PyList_GET_ITEM(pieces_list, ready);
        PyObject *target, *position, *data;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
            PyErr_Format(PyExc_TypeError, "piece %zd is not a (target, position, data) tuple", ready);
            break;
        }
        target = PyTuple_GET_ITEM(item, 0);
        position = PyTuple_GET_ITEM(item, 1);
        data = PyTuple_GET_ITEM(item, 2);
        Piece *piece = &pieces[ready];
        if (PyLong_Check(target)) {
            piece->fd = (int)PyLong_AsLong(target);
            if (piece->fd < 0) {
                if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "piece %zd: negative descriptor", ready);
                break;
            }
        } else if (PyBytes_Check(target)) {
            piece->fd = -1;
            piece->path = PyBytes_AS_STRING(target);
        } else {
            PyErr_Format(PyExc_TypeError, "piece %zd: the target is a descriptor (int) or a path (bytes)", ready);
            break;
        }
        piece->position = PyLong_AsLongLong(position);
        if (piece->position < 0) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "piece %zd: negative position", ready);
            break;
        }
        if (PyObject_GetBuffer(data, &piece->data, PyBUF_SIMPLE) != 0) break;
    }
    if (ready < count) {
        release(pieces, ready);
        Py_DECREF(pieces_list);
        return NULL;
    }
    Py_ssize_t written = 0;
    int error = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; written < count; written++) {
        error = write_piece(&pieces[written]);
        if (error) break;
    }
    Py_END_ALLOW_THREADS
    release(pieces, count);
    Py_DECREF(pieces_list);
    return Py_BuildValue("(ni)", written, error);
}

static PyMethodDef methods[] = {
    {"write_pieces", write_pieces, METH_O, "Write (target, position, data) pieces in order; (written, errno)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_positioned_writes", "Positioned writes of many files with one release of the GIL.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__positioned_writes(void) { return PyModule_Create(&module_def); }
