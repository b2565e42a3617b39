/* CPython's arena allocator: obmalloc's arenas and, since 3.11, the 16 KiB chunks of each
   thread's frame stack. Its default maps every block with mmap and unmaps it when freed, so a
   call depth that swings across a chunk boundary maps and unmaps a chunk at every crossing: page
   faults on each touch, and TLB shootdowns on the other threads. install() routes new blocks
   through malloc, which keeps freed blocks for reuse. Blocks made before install() go back
   through the allocator that made them: a hash set tells the two apart. Every call happens
   with the GIL held (obmalloc and frame pushes need it), so nothing here locks. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef Py_GIL_DISABLED
#error "the arena cache relies on the GIL"
#endif

static PyObjectArenaAllocator previous;
static int installed;
static void **slots;  /* open addressing, linear probing; NULL marks an empty slot */
static size_t capacity;  /* a power of two, 2 ** bits */
static int bits;
static size_t live;  /* blocks of ours not yet freed */
static unsigned long long made, freed, passed_on, passed_back;

static size_t slot_of(void *p)
{
    /* Fibonacci hashing: the top bits of the product mix every bit of the address */
    return (size_t)(((uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

static void *cache_alloc(void *ctx, size_t size)
{
    (void)ctx;
    if (2 * (live + 1) > capacity) {  /* table half full: new blocks the old way */
        passed_on++;
        return previous.alloc(previous.ctx, size);
    }
    void *p = malloc(size);
    if (p == NULL)
        return NULL;
    size_t i = slot_of(p);
    while (slots[i] != NULL)
        i = (i + 1) & (capacity - 1);
    slots[i] = p;
    live++;
    made++;
    return p;
}

static void cache_free(void *ctx, void *p, size_t size)
{
    (void)ctx;
    if (p == NULL)
        return;
    size_t i = slot_of(p);
    while (slots[i] != NULL && slots[i] != p)
        i = (i + 1) & (capacity - 1);
    if (slots[i] == NULL) {  /* made before install(), or while the table was full */
        passed_back++;
        previous.free(previous.ctx, p, size);
        return;
    }
    /* backward-shift deletion keeps every probe run unbroken, with no tombstones */
    size_t j = i;
    for (;;) {
        j = (j + 1) & (capacity - 1);
        if (slots[j] == NULL)
            break;
        size_t home = slot_of(slots[j]);
        /* move slots[j] into the hole at i unless its home lies cyclically in (i, j] */
        int stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            slots[i] = slots[j];
            i = j;
        }
    }
    slots[i] = NULL;
    live--;
    freed++;
    free(p);
}

static PyObject *install(PyObject *module, PyObject *args)
{
    (void)module;
    Py_ssize_t max_blocks = 32768;
    if (!PyArg_ParseTuple(args, "|n", &max_blocks))
        return NULL;
    if (installed)
        Py_RETURN_FALSE;
    if (max_blocks < 1 || max_blocks > (1 << 24)) {
        PyErr_SetString(PyExc_ValueError, "max_blocks must be between 1 and 16777216");
        return NULL;
    }
    size_t n = 2;
    int b = 1;
    while (n < 2 * (size_t)max_blocks) {
        n <<= 1;
        b++;
    }
    slots = calloc(n, sizeof(void *));
    if (slots == NULL)
        return PyErr_NoMemory();
    capacity = n;
    bits = b;
    PyObjectArenaAllocator ours = {NULL, cache_alloc, cache_free};
    PyObject_GetArenaAllocator(&previous);
    PyObject_SetArenaAllocator(&ours);
    installed = 1;
    Py_RETURN_TRUE;
}

static PyObject *stats(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return Py_BuildValue("{s:O,s:n,s:K,s:K,s:K,s:K}", "installed", installed ? Py_True : Py_False,
                         "live", (Py_ssize_t)live, "made", made, "freed", freed,
                         "passed_on", passed_on, "passed_back", passed_back);
}

static PyMethodDef methods[] = {
    {"install", install, METH_VARARGS,
     "install(max_blocks=32768) -> bool: route new arena blocks through malloc (False if this "
     "process already did). Past max_blocks live blocks, new ones are made the old way."},
    {"stats", stats, METH_NOARGS,
     "stats() -> dict: installed, live blocks, and counts made / freed by malloc, made the old "
     "way while full (passed_on) and freed the old way (passed_back)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_arena_cache", "CPython's arena blocks served by malloc.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__arena_cache(void)
{
    return PyModule_Create(&module_def);
}
