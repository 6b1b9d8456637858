/* kvstore._speedups: C twins of the classes and functions in kvstore/_fallback.py.
 *
 * Read kvstore/_backend.py first: it says which paths are here and why, and
 * how the module is chosen at import. This file only walks the segment arrays
 * that the Python side allocates (bytearrays, viewed by numpy for the batch
 * paths), with the same hash, probe sequence, slot encoding and rebuild
 * decisions as _fallback.py, function for function. Rebuilding, sizing and
 * every unusual case (a key to normalize, a closed store, a pread, a CRC
 * failure) are left to Python: the C calls the owner's methods for them.
 *
 * What this code relies on: the GIL. Each method runs from start to end
 * holding it, and nothing in a table walk can release it (no
 * Py_BEGIN_ALLOW_THREADS, no call into Python, no allocation, no DECREF that
 * could run a finalizer). So a walk sees a segment either before or after a
 * writer's change, and a rebuilt segment replaces the old one in one list
 * store. Pointers into a bytearray are taken again after anything that can
 * run Python code (a call, an allocation: the GC may switch threads), because
 * another thread may then have resized or replaced it. Writers take the
 * owner's lock, the same lock that Python's flush holds while os.write() runs
 * without the GIL with the write buffer exported: directly when it is this
 * module's Lock (what the owners create), through its acquire()/release()
 * methods when it is any other object.
 *
 * The GIL is released only while blocked on that Lock and while working on
 * memory that no other thread can see or change: the CRC of a large value
 * (the caller's immutable bytes, or a result not returned yet) and the
 * packing of a big put_many batch (a private copy of the value list into a
 * new bytes object). A free-threaded CPython would need a per-index lock (or atomics with
 * a seqlock per segment) around every walk, atomic loads of the slot state
 * bytes, and readers that hold a reference to the segment list while they
 * walk it; this module declares no Py_mod_gil slot, so such a build re-enables
 * the GIL when it is imported.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

/* Bump when a change here must not run with an older _fallback.py. */
#define API_VERSION 4

#define KEY_SIZE 16
#define NUM_SEGMENTS 16
#define SEG_SHIFT 60
#define STEP_SHIFT 20
#define MAX_LOAD 0.78
#define MIN_LOAD 0.1
#define MIN_SEGMENT_CAPACITY 127
#define REMAP_SLACK (8LL << 20)
#define MULT128_HI 0x9E3779B97F4A7C15ULL
#define MULT128_LO 0xF39CC0605CEDC835ULL
#define MULT64 0xBF58476D1CE4E5B9ULL
#define VAL_HEADER_SIZE 8     /* a plain (format 1, 2) VAL record: u32 length, u32 CRC */
#define RECORD_HEADER_SIZE 24 /* a keyed (format 3) one: u32 length, u32 CRC, the key */
#define DELETED 0xFFFFFFFFLL  /* a keyed record's length field for a deletion */
#define MAX_RECORD_VALUE 0xFFFFFFFELL /* a u32 length, its largest value meaning DELETED */
#define KEY_RECORD_SIZE 24
#define HEADER_SIZE 24 /* of the KEY and VAL files */
#define CRC_NOGIL_BYTES (64 * 1024) /* zlib.crc32 lets go of the GIL above 5 KiB */
#define CRC_ZLIB_BYTES 2048         /* from here on zlib's crc32 is the faster one */
#define AHEAD 16                    /* keys hashed and prefetched ahead in a batch walk */
#define LOOKUP_LANES 16             /* probe walks interleaved by _lookup_into */

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#define PREFETCH_W(p) __builtin_prefetch(p, 1)
#else
#define PREFETCH(p) ((void)0)
#define PREFETCH_W(p) ((void)0)
#endif

static PyObject *check_key_fn; /* kvstore._fallback.check_key: the slow path of every key */

static PyObject *str_acquire, *str_release, *str_rebuild, *str_random_live_key, *str_rng,
    *str_getrandbits, *str_index, *str_wbuf, *str_kbuf, *str_files, *str_mm, *str_live_m,
    *str_writable, *str_check_value, *str_read, *str_flush_locked, *str_get, *str_set,
    *str_delete, *str_keyed;

/* ------------------------------------------------------------------ bytes and hash */

/* W-byte little-endian unsigned integers (W = 1..8). On little-endian hosts a
 * memcpy of a constant size compiles to one load or store. */
static inline uint64_t
load_le(const unsigned char *p, int w)
{
    uint64_t v = 0;
#if PY_LITTLE_ENDIAN
    switch (w) {
    case 8: memcpy(&v, p, 8); break;
    case 6: memcpy(&v, p, 6); break;
    case 4: memcpy(&v, p, 4); break;
    case 1: v = p[0]; break;
    default: memcpy(&v, p, (size_t)w);
    }
#else
    for (int b = w - 1; b >= 0; b--)
        v = (v << 8) | p[b];
#endif
    return v;
}

static inline void
store_le(unsigned char *p, uint64_t v, int w)
{
#if PY_LITTLE_ENDIAN
    switch (w) {
    case 8: memcpy(p, &v, 8); break;
    case 6: memcpy(p, &v, 6); break;
    case 4: memcpy(p, &v, 4); break;
    case 1: p[0] = (unsigned char)v; break;
    default: memcpy(p, &v, (size_t)w);
    }
#else
    for (int b = 0; b < w; b++)
        p[b] = (unsigned char)(v >> (8 * b));
#endif
}

static inline uint64_t
mulhi64(uint64_t a, uint64_t b)
{
#ifdef __SIZEOF_INT128__
    return (uint64_t)(((unsigned __int128)a * b) >> 64);
#else
    uint64_t a_lo = a & 0xFFFFFFFFu, a_hi = a >> 32, b_lo = b & 0xFFFFFFFFu, b_hi = b >> 32;
    uint64_t ll = a_lo * b_lo, lh = a_lo * b_hi, hl = a_hi * b_lo, hh = a_hi * b_hi;
    uint64_t mid = (ll >> 32) + (lh & 0xFFFFFFFFu) + (hl & 0xFFFFFFFFu);
    return hh + (lh >> 32) + (hl >> 32) + (mid >> 32);
#endif
}

/* _index.hash_key: bits 64..127 of key * MULT128 (key read as a little-endian
 * 128-bit integer), then xorshift, multiply, xorshift. */
static inline uint64_t
hash_key(const unsigned char *k)
{
    uint64_t lo = load_le(k, 8), hi = load_le(k + 8, 8);
    uint64_t v = mulhi64(lo, MULT128_LO) + lo * MULT128_HI + hi * MULT128_LO;
    v ^= v >> 32;
    v *= MULT64;
    v ^= v >> 29;
    return v;
}

static inline Py_ssize_t
probe_step(uint64_t h, Py_ssize_t cap)
{
    return 1 + (Py_ssize_t)((h >> STEP_SHIFT) % (uint64_t)(cap - 1));
}

/* x % d without a division, for the batch loops (a 64-bit division costs more than a
 * cached probe). With m = floor((2**64 - 1) / d), mulhi(x, m) is floor(x / d) or one
 * less, so one conditional subtraction makes the remainder exact. */
typedef struct {
    uint64_t d, m;
} Divisor;

static inline Divisor
divisor(uint64_t d)
{
    Divisor dv = {d, UINT64_MAX / d};
    return dv;
}

static inline uint64_t
mod_by(uint64_t x, Divisor dv)
{
    uint64_t r = x - mulhi64(x, dv.m) * dv.d;
    return r >= dv.d ? r - dv.d : r;
}

/* CRC-32 as zlib.crc32 computes it. zlib's own is fast on long inputs, but costs
 * ~1.7 ns a byte on the ~100-byte values of a typical record; slicing by 8 bytes
 * (tables built at import) takes half that. */
static uint32_t crc_table[8][256];

static void
crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        crc_table[0][i] = c;
    }
    for (int i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t
crc32_short(uint32_t crc, const unsigned char *p, Py_ssize_t n)
{
    uint32_t c = ~crc;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w = load_le(p, 8) ^ c;
        c = crc_table[7][w & 0xFF] ^ crc_table[6][(w >> 8) & 0xFF] ^
            crc_table[5][(w >> 16) & 0xFF] ^ crc_table[4][(w >> 24) & 0xFF] ^
            crc_table[3][(w >> 32) & 0xFF] ^ crc_table[2][(w >> 40) & 0xFF] ^
            crc_table[1][(w >> 48) & 0xFF] ^ crc_table[0][w >> 56];
    }
    for (; n > 0; p++, n--)
        c = (c >> 8) ^ crc_table[0][(c ^ *p) & 0xFF];
    return ~c;
}

/* The CRC of n bytes that no other thread can change (an immutable bytes object we
 * hold, or one not handed out yet), so the GIL may go while a long one runs;
 * continued from `start` (0 for a CRC of these bytes alone), as zlib.crc32(p, start). */
static uint32_t
crc32_of(uint32_t start, const unsigned char *p, Py_ssize_t n, int may_release_gil)
{
    if (n < CRC_ZLIB_BYTES)
        return crc32_short(start, p, n);
    uLong crc = start;
    PyThreadState *ts = NULL;
    if (may_release_gil && n >= CRC_NOGIL_BYTES)
        ts = PyEval_SaveThread();
    while (n > 0) {
        uInt part = n > (1 << 30) ? (1u << 30) : (uInt)n;
        crc = crc32(crc, p, part);
        p += part;
        n -= part;
    }
    if (ts)
        PyEval_RestoreThread(ts);
    return (uint32_t)crc;
}

/* _format.keyed_crc up to the value: the CRC of a keyed record's length field and key,
 * which the value's bytes continue. */
static uint32_t
keyed_head_crc(const unsigned char *length_field, const unsigned char *key)
{
    return crc32_short(crc32_short(0, length_field, 4), key, KEY_SIZE);
}

/* --------------------------------------------------------------------- buffers */

/* A C-contiguous buffer of whole items of `itemsize` bytes (1: any bytes). */
static int
get_buffer(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t itemsize, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if ((itemsize > 1 && view->itemsize != itemsize) || view->len % itemsize) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s: expected a contiguous array of %zd-byte items",
                     what, itemsize);
        return -1;
    }
    return 0;
}

/* --------------------------------------------------------------------- segment */

typedef struct {
    PyObject_HEAD
    Py_ssize_t cap, live, deleted;
    PyObject *keys, *vals, *kmv, *vmv;
} SegmentObject;

static PyTypeObject Segment_Type;

static int
Segment_traverse(SegmentObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->keys);
    Py_VISIT(self->vals);
    Py_VISIT(self->kmv);
    Py_VISIT(self->vmv);
    return 0;
}

static int
Segment_clear(SegmentObject *self)
{
    Py_CLEAR(self->keys);
    Py_CLEAR(self->vals);
    Py_CLEAR(self->kmv);
    Py_CLEAR(self->vmv);
    return 0;
}

static void
Segment_dealloc(SegmentObject *self)
{
    PyObject_GC_UnTrack(self);
    Segment_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef Segment_members[] = {
    {"cap", T_PYSSIZET, offsetof(SegmentObject, cap), 0, NULL},
    {"live", T_PYSSIZET, offsetof(SegmentObject, live), 0, NULL},
    {"deleted", T_PYSSIZET, offsetof(SegmentObject, deleted), 0, NULL},
    {"keys", T_OBJECT_EX, offsetof(SegmentObject, keys), 0, NULL},
    {"vals", T_OBJECT_EX, offsetof(SegmentObject, vals), 0, NULL},
    {"kmv", T_OBJECT_EX, offsetof(SegmentObject, kmv), 0, NULL},
    {"vmv", T_OBJECT_EX, offsetof(SegmentObject, vmv), 0, NULL},
    {NULL}};

/* A segment's slots as raw pointers, valid until Python code next runs. */
typedef struct {
    SegmentObject *seg;
    unsigned char *k, *v;
    Py_ssize_t cap;
    Divisor by_cap, by_cap1; /* for start and step; set by batch_slots() only */
} Slots;

static int
slots_of(PyObject *obj, int w, Slots *sl)
{
    if (!PyObject_TypeCheck(obj, &Segment_Type)) {
        PyErr_SetString(PyExc_TypeError, "kvstore index: a segment of the wrong type");
        return -1;
    }
    SegmentObject *seg = (SegmentObject *)obj;
    Py_ssize_t cap = seg->cap;
    if (cap < 2 || cap > PY_SSIZE_T_MAX / KEY_SIZE || seg->kmv == NULL || seg->vmv == NULL ||
        !PyByteArray_Check(seg->kmv) || !PyByteArray_Check(seg->vmv) ||
        PyByteArray_GET_SIZE(seg->kmv) < cap * KEY_SIZE ||
        PyByteArray_GET_SIZE(seg->vmv) < cap * w) {
        PyErr_SetString(PyExc_RuntimeError,
                        "kvstore index: a segment's arrays do not match its capacity");
        return -1;
    }
    sl->seg = seg;
    sl->k = (unsigned char *)PyByteArray_AS_STRING(seg->kmv);
    sl->v = (unsigned char *)PyByteArray_AS_STRING(seg->vmv);
    sl->cap = cap;
    return 0;
}

static int
batch_slots(PyObject *obj, int w, Slots *sl)
{
    if (slots_of(obj, w, sl) < 0)
        return -1;
    sl->by_cap = divisor((uint64_t)sl->cap);
    sl->by_cap1 = divisor((uint64_t)sl->cap - 1);
    return 0;
}

static int
table_full(void)
{
    /* Unreachable on a consistent table (used slots stay <= MAX_LOAD * cap); it stops a
     * corrupted one from hanging a walk that holds the GIL. */
    PyErr_SetString(PyExc_RuntimeError, "kvstore index: a segment has no EMPTY slot (corrupted)");
    return -1;
}

/* The walk of _fallback.IndexBase.get / __contains__ / delete: the slot holding `key`
 * live, -1 when the probe meets an EMPTY slot first, -2 (error set) on a full table. */
static Py_ssize_t
find_live(const Slots *sl, int w, const unsigned char *key, uint64_t h)
{
    Py_ssize_t cap = sl->cap, i = (Py_ssize_t)(h % (uint64_t)cap), step = 0;
    int top = w - 1;
    for (Py_ssize_t n = 0; n < cap; n++) {
        const unsigned char *v = sl->v + i * w;
        if (v[top] >= 0xFE) {
            if (v[0] == 0xFF)
                return -1;
        }
        else if (memcmp(sl->k + i * KEY_SIZE, key, KEY_SIZE) == 0)
            return i;
        if (!step)
            step = probe_step(h, cap);
        i += step;
        if (i >= cap)
            i -= cap;
    }
    table_full();
    return -2;
}

/* ----------------------------------------------------------------------- index */

typedef struct {
    PyObject_HEAD
    int width;
    PyObject *segs;
} IndexObject;

static PyTypeObject Index_Type;

static int
Index_traverse(IndexObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->segs);
    return 0;
}

static int
Index_clear(IndexObject *self)
{
    Py_CLEAR(self->segs);
    return 0;
}

static void
Index_dealloc(IndexObject *self)
{
    PyObject_GC_UnTrack(self);
    Index_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Index_get_width(IndexObject *self, void *closure)
{
    if (self->width == 0) {
        PyErr_SetString(PyExc_AttributeError, "width");
        return NULL;
    }
    return PyLong_FromLong(self->width);
}

static int
Index_set_width(IndexObject *self, PyObject *value, void *closure)
{
    long w = value ? PyLong_AsLong(value) : 0;
    if (w == -1 && PyErr_Occurred())
        return -1;
    if (w < 1 || w > 8) {
        PyErr_SetString(PyExc_ValueError, "width must be 1..8 bytes");
        return -1;
    }
    self->width = (int)w;
    return 0;
}

/* Segment s (borrowed), after checking the list it comes from. */
static PyObject *
seg_at(IndexObject *self, Py_ssize_t s)
{
    PyObject *segs = self->segs;
    if (self->width < 1 || segs == NULL || !PyList_Check(segs) ||
        PyList_GET_SIZE(segs) != NUM_SEGMENTS) {
        PyErr_SetString(PyExc_RuntimeError,
                        "kvstore index: width and a list of 16 segments must be set");
        return NULL;
    }
    return PyList_GET_ITEM(segs, s);
}

static int
key_arg(PyObject *key, const unsigned char **out)
{
    if (!PyBytes_Check(key)) {
        PyErr_Format(PyExc_TypeError, "index keys are bytes, got %.100s", Py_TYPE(key)->tp_name);
        return -1;
    }
    if (PyBytes_GET_SIZE(key) != KEY_SIZE) {
        *out = NULL; /* never stored: absent, as the Python walk finds */
        return 0;
    }
    *out = (const unsigned char *)PyBytes_AS_STRING(key);
    return 0;
}

/* _fallback.IndexBase.get: the value, -1 if absent, -2 on error. */
static long long
index_get(IndexObject *self, const unsigned char *key)
{
    uint64_t h = hash_key(key);
    Slots sl;
    PyObject *seg = seg_at(self, (Py_ssize_t)(h >> SEG_SHIFT));
    if (seg == NULL || slots_of(seg, self->width, &sl) < 0)
        return -2;
    Py_ssize_t i = find_live(&sl, self->width, key, h);
    if (i < 0)
        return i;
    return (long long)load_le(sl.v + i * self->width, self->width);
}

static PyObject *
call_rebuild(IndexObject *self, Py_ssize_t s, Py_ssize_t live_hint)
{
    PyObject *args[3] = {(PyObject *)self, NULL, NULL};
    args[1] = PyLong_FromSsize_t(s);
    args[2] = args[1] ? PyLong_FromSsize_t(live_hint) : NULL;
    PyObject *res = NULL;
    if (args[2])
        res = PyObject_VectorcallMethod(str_rebuild, args,
                                        3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_XDECREF(args[1]);
    Py_XDECREF(args[2]);
    return res;
}

/* _fallback.IndexBase.set: 1 if the key was new, 0 if overwritten, -1 on error. */
static int
index_set(IndexObject *self, const unsigned char *key, uint64_t value)
{
    int w = self->width;
    if (w < 8 && (value >> (8 * w)) != 0) {
        PyErr_SetString(PyExc_OverflowError, "int too big to convert");
        return -1;
    }
    uint64_t h = hash_key(key);
    Py_ssize_t s = (Py_ssize_t)(h >> SEG_SHIFT);
    PyObject *seg = seg_at(self, s);
    if (seg == NULL)
        return -1;
    if (!PyObject_TypeCheck(seg, &Segment_Type)) {
        PyErr_SetString(PyExc_TypeError, "kvstore index: a segment of the wrong type");
        return -1;
    }
    SegmentObject *sg = (SegmentObject *)seg;
    Py_INCREF(seg);
    if ((double)(sg->live + sg->deleted + 1) > MAX_LOAD * (double)sg->cap) {
        PyObject *fresh = call_rebuild(self, s, sg->live + 1);
        Py_DECREF(seg);
        if (fresh == NULL)
            return -1;
        seg = fresh;
    }
    Slots sl;
    if (slots_of(seg, w, &sl) < 0) {
        Py_DECREF(seg);
        return -1;
    }
    Py_ssize_t cap = sl.cap, i = (Py_ssize_t)(h % (uint64_t)cap), step = 0, free_slot = -1;
    int top = w - 1, found_empty = 0;
    for (Py_ssize_t n = 0; n < cap; n++) {
        unsigned char *v = sl.v + i * w;
        if (v[top] >= 0xFE) {
            if (v[0] == 0xFF) {
                found_empty = 1;
                break;
            }
            if (free_slot < 0)
                free_slot = i;
        }
        else if (memcmp(sl.k + i * KEY_SIZE, key, KEY_SIZE) == 0) {
            store_le(v, value, w);
            Py_DECREF(seg);
            return 0;
        }
        if (!step)
            step = probe_step(h, cap);
        i += step;
        if (i >= cap)
            i -= cap;
    }
    if (!found_empty && free_slot < 0) {
        Py_DECREF(seg);
        return table_full();
    }
    if (free_slot >= 0) {
        i = free_slot;
        sl.seg->deleted -= 1;
    }
    memcpy(sl.k + i * KEY_SIZE, key, KEY_SIZE); /* key first: the value makes the slot live */
    store_le(sl.v + i * w, value, w);
    sl.seg->live += 1;
    Py_DECREF(seg);
    return 1;
}

/* _fallback.IndexBase.delete: the old value, -1 if absent, -2 on error. */
static long long
index_delete(IndexObject *self, const unsigned char *key)
{
    int w = self->width;
    uint64_t h = hash_key(key);
    Py_ssize_t s = (Py_ssize_t)(h >> SEG_SHIFT);
    Slots sl;
    PyObject *seg = seg_at(self, s);
    if (seg == NULL || slots_of(seg, w, &sl) < 0)
        return -2;
    Py_ssize_t i = find_live(&sl, w, key, h);
    if (i < 0)
        return i;
    unsigned char *v = sl.v + i * w;
    long long old = (long long)load_le(v, w);
    v[0] = 0xFE; /* DELETED: 0xFE in the low byte, 0xFF above it */
    memset(v + 1, 0xFF, (size_t)(w - 1));
    SegmentObject *sg = sl.seg;
    sg->live -= 1;
    sg->deleted += 1;
    if ((double)sg->live < MIN_LOAD * (double)sg->cap && sg->cap > MIN_SEGMENT_CAPACITY) {
        PyObject *fresh = call_rebuild(self, s, sg->live);
        if (fresh == NULL)
            return -2;
        Py_DECREF(fresh);
    }
    return old;
}

static PyObject *
Index_get(IndexObject *self, PyObject *key)
{
    const unsigned char *k;
    if (key_arg(key, &k) < 0)
        return NULL;
    long long r = k ? index_get(self, k) : -1;
    return r == -2 ? NULL : PyLong_FromLongLong(r);
}

static int
Index_contains(IndexObject *self, PyObject *key)
{
    const unsigned char *k;
    if (key_arg(key, &k) < 0)
        return -1;
    long long r = k ? index_get(self, k) : -1;
    return r == -2 ? -1 : r >= 0;
}

static int
int_arg(PyObject *obj, uint64_t *out)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static PyObject *
Index_set(IndexObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    const unsigned char *k;
    uint64_t value;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set(key, value)");
        return NULL;
    }
    if (key_arg(args[0], &k) < 0 || int_arg(args[1], &value) < 0)
        return NULL;
    if (k == NULL) {
        PyErr_SetString(PyExc_ValueError, "index keys are 16 bytes");
        return NULL;
    }
    int r = index_set(self, k, value);
    return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *
Index_delete(IndexObject *self, PyObject *key)
{
    const unsigned char *k;
    if (key_arg(key, &k) < 0)
        return NULL;
    long long r = k ? index_delete(self, k) : -1;
    return r == -2 ? NULL : PyLong_FromLongLong(r);
}

/* _fallback._randbelow: rng.randrange(n) drawn the way CPython draws it. */
static int
randbelow(PyObject *rng, uint64_t n, uint64_t *out)
{
    int k = 0;
    while (k < 64 && (n >> k) != 0)
        k++;
    PyObject *bits = PyLong_FromLong(k);
    if (bits == NULL)
        return -1;
    for (;;) {
        PyObject *args[2] = {rng, bits};
        PyObject *r = PyObject_VectorcallMethod(str_getrandbits, args,
                                                2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (r == NULL)
            break;
        int bad = int_arg(r, out);
        Py_DECREF(r);
        if (bad < 0)
            break;
        if (*out < n) {
            Py_DECREF(bits);
            return 0;
        }
    }
    Py_DECREF(bits);
    return -1;
}

static PyObject *
Index_random_key(IndexObject *self, PyObject *unused)
{
    uint64_t total = 0;
    int any_live = 0;
    for (Py_ssize_t s = 0; s < NUM_SEGMENTS; s++) {
        Slots sl;
        PyObject *seg = seg_at(self, s);
        if (seg == NULL || slots_of(seg, self->width, &sl) < 0)
            return NULL;
        any_live |= sl.seg->live != 0;
        total += (uint64_t)sl.cap;
    }
    if (!any_live) {
        PyErr_SetString(PyExc_KeyError, "random_key(): the index is empty");
        return NULL;
    }
    PyObject *rng = PyObject_GetAttr((PyObject *)self, str_rng);
    if (rng == NULL)
        return NULL;
    for (int attempt = 0; attempt < 32; attempt++) {
        uint64_t r;
        if (randbelow(rng, total, &r) < 0) {
            Py_DECREF(rng);
            return NULL;
        }
        /* The draw may have run Python code: look the segments up again. */
        for (Py_ssize_t s = 0; s < NUM_SEGMENTS; s++) {
            Slots sl;
            PyObject *seg = seg_at(self, s);
            if (seg == NULL || slots_of(seg, self->width, &sl) < 0) {
                Py_DECREF(rng);
                return NULL;
            }
            if (r < (uint64_t)sl.cap) {
                if (sl.v[r * self->width + self->width - 1] < 0xFE) {
                    Py_DECREF(rng);
                    return PyBytes_FromStringAndSize((const char *)sl.k + r * KEY_SIZE,
                                                     KEY_SIZE);
                }
                break;
            }
            r -= (uint64_t)sl.cap;
        }
    }
    Py_DECREF(rng);
    return PyObject_CallMethodNoArgs((PyObject *)self, str_random_live_key);
}

static PyObject *
Index_set_each(IndexObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer kb, vb;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_set_each(keys, values)");
        return NULL;
    }
    if (get_buffer(args[0], &kb, 0, 1, "keys") < 0)
        return NULL;
    if (get_buffer(args[1], &vb, 0, 8, "values") < 0) {
        PyBuffer_Release(&kb);
        return NULL;
    }
    Py_ssize_t n = vb.len / 8;
    PyObject *res = NULL;
    if (kb.len != n * KEY_SIZE) {
        PyErr_SetString(PyExc_ValueError, "_set_each: keys and values differ in length");
        goto done;
    }
    /* The buffers stay exported (so valid) while _rebuild runs Python code. */
    for (Py_ssize_t j = 0; j < n; j++) {
        const unsigned char *k = (const unsigned char *)kb.buf + j * KEY_SIZE;
        int64_t v;
        memcpy(&v, (const char *)vb.buf + j * 8, 8);
        if (v < 0 ? index_delete(self, k) == -2 : index_set(self, k, (uint64_t)v) < 0)
            goto done;
    }
    res = Py_None;
    Py_INCREF(res);
done:
    PyBuffer_Release(&kb);
    PyBuffer_Release(&vb);
    return res;
}

/* _fallback.IndexBase._lookup_into. No Python code runs in the loop, so the 16
 * segments' pointers are taken once. The walks of AHEAD keys are interleaved: each
 * step examines one key's current slot (prefetched when the key started or last moved
 * on) and, if its probe goes on, prefetches the next slot and turns to the next key,
 * so that the loads of every probe, not only the first, overlap in memory. */
static PyObject *
Index_lookup_into(IndexObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer kb, ob, pb;
    int with_probes;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "_lookup_into(keys, out, probes)");
        return NULL;
    }
    with_probes = args[2] != Py_None;
    if (get_buffer(args[0], &kb, 0, 1, "keys") < 0)
        return NULL;
    if (get_buffer(args[1], &ob, 1, 8, "out") < 0) {
        PyBuffer_Release(&kb);
        return NULL;
    }
    if (with_probes && get_buffer(args[2], &pb, 1, 8, "probes") < 0) {
        PyBuffer_Release(&kb);
        PyBuffer_Release(&ob);
        return NULL;
    }
    PyObject *res = NULL;
    Py_ssize_t n = kb.len / KEY_SIZE;
    int w = self->width, top = w - 1;
    Slots sl[NUM_SEGMENTS];
    struct {
        const Slots *g;
        uint64_t h;
        Py_ssize_t q, i, step, visits; /* q < 0: a free lane */
    } lane[LOOKUP_LANES];
    if (kb.len % KEY_SIZE || ob.len != n * 8 || (with_probes && pb.len != n * 8)) {
        PyErr_SetString(PyExc_ValueError, "_lookup_into: keys, out and probes differ in length");
        goto done;
    }
    for (Py_ssize_t s = 0; s < NUM_SEGMENTS; s++) {
        PyObject *seg = seg_at(self, s);
        if (seg == NULL || batch_slots(seg, w, &sl[s]) < 0)
            goto done;
    }
    const unsigned char *keys = kb.buf;
    Py_ssize_t next = 0, left = n;
    for (int r = 0; r < LOOKUP_LANES; r++)
        lane[r].q = -1;
    for (int r = 0; left > 0; r = r + 1 == LOOKUP_LANES ? 0 : r + 1) {
        if (lane[r].q >= 0) {
            const Slots *g = lane[r].g;
            Py_ssize_t i = lane[r].i, q = lane[r].q;
            const unsigned char *v = g->v + i * w;
            int64_t value = -1;
            if (++lane[r].visits > g->cap) {
                table_full();
                goto done;
            }
            if (v[top] >= 0xFE) {
                if (v[0] != 0xFF)
                    goto more;
            }
            else if (memcmp(g->k + i * KEY_SIZE, keys + q * KEY_SIZE, KEY_SIZE) == 0)
                value = (int64_t)load_le(v, w);
            else
                goto more;
            memcpy((char *)ob.buf + q * 8, &value, 8);
            if (with_probes) {
                int64_t p = lane[r].visits;
                memcpy((char *)pb.buf + q * 8, &p, 8);
            }
            lane[r].q = -1;
            left--;
            goto start;
        more:
            if (!lane[r].step)
                lane[r].step = 1 + (Py_ssize_t)mod_by(lane[r].h >> STEP_SHIFT, g->by_cap1);
            i += lane[r].step;
            if (i >= g->cap)
                i -= g->cap;
            lane[r].i = i;
            PREFETCH(g->v + i * w);
            PREFETCH(g->k + i * KEY_SIZE);
            continue;
        }
    start:
        if (next < n) {
            uint64_t h = hash_key(keys + next * KEY_SIZE);
            const Slots *g = &sl[h >> SEG_SHIFT];
            Py_ssize_t i = (Py_ssize_t)mod_by(h, g->by_cap);
            PREFETCH(g->v + i * w);
            PREFETCH(g->k + i * KEY_SIZE);
            lane[r].g = g;
            lane[r].h = h;
            lane[r].q = next++;
            lane[r].i = i;
            lane[r].step = 0;
            lane[r].visits = 0;
        }
    }
    res = Py_None;
    Py_INCREF(res);
done:
    PyBuffer_Release(&kb);
    PyBuffer_Release(&ob);
    if (with_probes)
        PyBuffer_Release(&pb);
    return res;
}

enum { SLOT_OTHER, SLOT_EMPTY, SLOT_SAME };

/* The rounds of _fallback.IndexBase._insert_segment on m distinct keys (`keys`, their
 * hashes `hb` and values `vb`, 8 bytes each, read with memcpy) into the slots `sl`; the
 * live and deleted counts move by what was written, even when a corrupted table stops
 * the loop (-1, error set). Each round first classifies every pending key's slot as
 * it was when the round began (pass 1, reads only), then settles them in batch order
 * (pass 2): a key on its own slot (live or deleted) takes it; a key on an EMPTY slot
 * takes it if no earlier key of the batch did in this round, else it stays there for
 * the next round (numpy's lowest-position winner); a key on another key's slot moves
 * on. */
static int
insert_rounds(const Slots *sl, int w, const unsigned char *keys, const char *hb, const char *vb,
              Py_ssize_t m)
{
    int top = w - 1, r = -1;
    Py_ssize_t cap = sl->cap;
    Py_ssize_t *at = PyMem_New(Py_ssize_t, m ? m : 1); /* batch positions of the pending keys */
    Py_ssize_t *pos = PyMem_New(Py_ssize_t, m ? m : 1);
    Py_ssize_t *step = PyMem_New(Py_ssize_t, m ? m : 1);
    unsigned char *cls = PyMem_Malloc(m ? (size_t)m : 1);
    Py_ssize_t d_live = 0, d_deleted = 0;
    unsigned char dpat[8];
    if (!at || !pos || !step || !cls) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t p = 0; p < m; p++) {
        uint64_t h;
        memcpy(&h, hb + p * 8, 8);
        at[p] = p;
        pos[p] = (Py_ssize_t)mod_by(h, sl->by_cap);
        step[p] = 1 + (Py_ssize_t)mod_by(h >> STEP_SHIFT, sl->by_cap1);
    }
    dpat[0] = 0xFE;
    memset(dpat + 1, 0xFF, sizeof dpat - 1);
    Py_ssize_t pending = m, rounds = 0;
    while (pending) {
        if (++rounds > 2 * cap + 2) { /* every key moves on at least every other round */
            table_full();
            goto done;
        }
        for (Py_ssize_t p = 0; p < pending; p++) {
            if (p + AHEAD < pending) {
                PREFETCH(sl->v + pos[p + AHEAD] * w);
                PREFETCH(sl->k + pos[p + AHEAD] * KEY_SIZE);
            }
            const unsigned char *v = sl->v + pos[p] * w;
            if (v[top] >= 0xFE && v[0] == 0xFF)
                cls[p] = SLOT_EMPTY;
            else
                cls[p] = memcmp(sl->k + pos[p] * KEY_SIZE, keys + at[p] * KEY_SIZE, KEY_SIZE)
                             ? SLOT_OTHER
                             : SLOT_SAME;
        }
        Py_ssize_t kept = 0;
        for (Py_ssize_t p = 0; p < pending; p++) {
            if (p + AHEAD < pending) { /* pass 1's loads may have left the cache again */
                PREFETCH_W(sl->v + pos[p + AHEAD] * w);
                PREFETCH_W(sl->k + pos[p + AHEAD] * KEY_SIZE);
            }
            Py_ssize_t i = pos[p], j = at[p];
            unsigned char *v = sl->v + i * w;
            int was_live = v[top] < 0xFE, was_empty = !was_live && v[0] == 0xFF;
            if (cls[p] == SLOT_SAME || (cls[p] == SLOT_EMPTY && was_empty)) {
                int64_t value;
                memcpy(&value, vb + j * 8, 8);
                int dele = value < 0;
                memcpy(sl->k + i * KEY_SIZE, keys + j * KEY_SIZE, KEY_SIZE);
                if (dele)
                    memcpy(v, dpat, (size_t)w);
                else
                    store_le(v, (uint64_t)value, w);
                d_live += 1 - dele - was_live;
                d_deleted += dele - (!was_empty && !was_live);
                continue;
            }
            if (cls[p] == SLOT_OTHER) {
                i += step[p];
                if (i >= cap)
                    i -= cap;
            }
            at[kept] = j;
            pos[kept] = i;
            step[kept] = step[p];
            kept++;
        }
        pending = kept;
    }
    r = 0;
done:
    sl->seg->live += d_live;
    sl->seg->deleted += d_deleted;
    PyMem_Free(at);
    PyMem_Free(pos);
    PyMem_Free(step);
    PyMem_Free(cls);
    return r;
}

/* _fallback.IndexBase._insert_segment. */
static PyObject *
Index_insert_segment(IndexObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer kb, hb, vb;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "_insert_segment(seg, keys, h, values)");
        return NULL;
    }
    int w = self->width;
    Slots sl;
    if (w < 1) {
        PyErr_SetString(PyExc_RuntimeError, "kvstore index: width is not set");
        return NULL;
    }
    if (batch_slots(args[0], w, &sl) < 0 || get_buffer(args[1], &kb, 0, 1, "keys") < 0)
        return NULL;
    if (get_buffer(args[2], &hb, 0, 8, "h") < 0) {
        PyBuffer_Release(&kb);
        return NULL;
    }
    if (get_buffer(args[3], &vb, 0, 8, "values") < 0) {
        PyBuffer_Release(&kb);
        PyBuffer_Release(&hb);
        return NULL;
    }
    PyObject *res = NULL;
    Py_ssize_t m = vb.len / 8;
    if (kb.len != m * KEY_SIZE || hb.len != m * 8)
        PyErr_SetString(PyExc_ValueError, "_insert_segment: keys, h and values differ in length");
    else if (insert_rounds(&sl, w, kb.buf, hb.buf, vb.buf, m) == 0) {
        res = Py_None;
        Py_INCREF(res);
    }
    PyBuffer_Release(&kb);
    PyBuffer_Release(&hb);
    PyBuffer_Release(&vb);
    return res;
}

/* _fallback.IndexBase._rehash: the live slots of `old`, in slot order, inserted into
 * `new` as _insert_segment inserts them (a segment rebuild). */
static PyObject *
Index_rehash(IndexObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_rehash(old, new)");
        return NULL;
    }
    int w = self->width, top = w - 1;
    Slots so, sn;
    if (w < 1) {
        PyErr_SetString(PyExc_RuntimeError, "kvstore index: width is not set");
        return NULL;
    }
    if (slots_of(args[0], w, &so) < 0 || batch_slots(args[1], w, &sn) < 0)
        return NULL;
    if (so.seg == sn.seg) {
        PyErr_SetString(PyExc_ValueError, "_rehash: old and new are the same segment");
        return NULL;
    }
    Py_ssize_t m = 0;
    for (Py_ssize_t i = 0; i < so.cap; i++)
        m += so.v[i * w + top] < 0xFE;
    unsigned char *keys = PyMem_Malloc(m ? (size_t)m * KEY_SIZE : 1);
    char *hb = PyMem_Malloc(m ? (size_t)m * 8 : 1), *vb = PyMem_Malloc(m ? (size_t)m * 8 : 1);
    PyObject *res = NULL;
    if (!keys || !hb || !vb) {
        PyErr_NoMemory();
        goto done;
    }
    /* The allocations ran no Python code (PyMem_Malloc does not collect): so's and sn's
     * pointers are still good. */
    Py_ssize_t j = 0;
    for (Py_ssize_t i = 0; i < so.cap && j < m; i++) {
        const unsigned char *v = so.v + i * w;
        if (v[top] >= 0xFE)
            continue;
        int64_t value = (int64_t)load_le(v, w);
        uint64_t h = hash_key(so.k + i * KEY_SIZE);
        memcpy(keys + j * KEY_SIZE, so.k + i * KEY_SIZE, KEY_SIZE);
        memcpy(hb + j * 8, &h, 8);
        memcpy(vb + j * 8, &value, 8);
        j++;
    }
    if (insert_rounds(&sn, w, keys, hb, vb, m) == 0) {
        res = Py_None;
        Py_INCREF(res);
    }
done:
    PyMem_Free(keys);
    PyMem_Free(hb);
    PyMem_Free(vb);
    return res;
}

static PyObject *
Index_hash_keys(PyObject *unused, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer kb, ob;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_hash_keys(keys, out)");
        return NULL;
    }
    if (get_buffer(args[0], &kb, 0, 1, "keys") < 0)
        return NULL;
    if (get_buffer(args[1], &ob, 1, 8, "out") < 0) {
        PyBuffer_Release(&kb);
        return NULL;
    }
    Py_ssize_t n = ob.len / 8;
    PyObject *res = NULL;
    if (kb.len != n * KEY_SIZE)
        PyErr_SetString(PyExc_ValueError, "_hash_keys: keys and out differ in length");
    else {
        for (Py_ssize_t j = 0; j < n; j++) {
            uint64_t h = hash_key((const unsigned char *)kb.buf + j * KEY_SIZE);
            memcpy((char *)ob.buf + j * 8, &h, 8);
        }
        res = Py_None;
        Py_INCREF(res);
    }
    PyBuffer_Release(&kb);
    PyBuffer_Release(&ob);
    return res;
}

/* A read-only buffer of n rows: (n, 16) uint8 keys (`row` 16) or n int64 values (`row`
 * 8), contiguous or strided by rows (the KEY records of an open). */
static int
get_rows(PyObject *obj, Py_buffer *view, Py_ssize_t row, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_STRIDES) < 0)
        return -1;
    int ok = row == KEY_SIZE ? view->ndim == 2 && view->itemsize == 1 &&
                                   view->shape[1] == KEY_SIZE && view->strides[1] == 1
                             : view->ndim == 1 && view->itemsize == row;
    if (ok && view->shape[0] > 1)
        ok = view->strides[0] >= row;
    if (!ok) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s: expected rows of %zd bytes", what, row);
        return -1;
    }
    return 0;
}

/* _fallback.IndexBase._group_batch, in three passes over the batch instead of sorts:
 * count the keys of each segment, copy each key, hash and value to its segment's
 * block (in batch order), then drop the earlier occurrences of a repeated key inside
 * each block with a scratch hash table sized for that block (so it stays in cache).
 * A table entry keeps 32 more bits of the hash, so a key is compared only with keys
 * that probably equal it. The blocks are then closed up at the front. */
static PyObject *
Index_group_batch(PyObject *unused, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer kb, vb, gk, gh, gv, cb;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "_group_batch(keys, values, gkeys, ghash, gvals, counts)");
        return NULL;
    }
    if (get_rows(args[0], &kb, KEY_SIZE, "keys") < 0)
        return NULL;
    if (get_rows(args[1], &vb, 8, "values") < 0) {
        PyBuffer_Release(&kb);
        return NULL;
    }
    int got = 0;
    Py_buffer *outs[4] = {&gk, &gh, &gv, &cb};
    static const Py_ssize_t sizes[4] = {1, 8, 8, 8};
    static const char *names[4] = {"gkeys", "ghash", "gvals", "counts"};
    for (; got < 4; got++)
        if (get_buffer(args[2 + got], outs[got], 1, sizes[got], names[got]) < 0)
            break;
    typedef struct {
        int32_t at; /* -1: free */
        uint32_t tag;
    } Entry;
    PyObject *res = NULL;
    Entry *table = NULL;
    unsigned char *dropped = NULL;
    if (got < 4)
        goto done;
    Py_ssize_t n = kb.shape[0], ks = kb.strides[0], vs = vb.strides[0];
    if (vb.shape[0] != n || gk.len < n * KEY_SIZE || gh.len < n * 8 || gv.len < n * 8 ||
        cb.len != NUM_SEGMENTS * 8) {
        PyErr_SetString(PyExc_ValueError, "_group_batch: the arrays differ in length");
        goto done;
    }
    if (n > INT32_MAX / 2) {
        PyErr_SetString(PyExc_OverflowError, "_group_batch: batch too large");
        goto done;
    }
    const char *kp = kb.buf, *vp = vb.buf;
    unsigned char *ok = gk.buf;
    char *oh = gh.buf, *ov = gv.buf;
    Py_ssize_t count[NUM_SEGMENTS] = {0}, start[NUM_SEGMENTS], fill[NUM_SEGMENTS], most = 0;
    for (Py_ssize_t j = 0; j < n; j++)
        count[hash_key((const unsigned char *)kp + j * ks) >> SEG_SHIFT]++;
    for (Py_ssize_t s = 0, at = 0; s < NUM_SEGMENTS; at += count[s], s++) {
        start[s] = fill[s] = at;
        most = count[s] > most ? count[s] : most;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        const unsigned char *key = (const unsigned char *)kp + j * ks;
        uint64_t h = hash_key(key);
        Py_ssize_t p = fill[h >> SEG_SHIFT]++;
        memcpy(ok + p * KEY_SIZE, key, KEY_SIZE);
        memcpy(oh + p * 8, &h, 8);
        memcpy(ov + p * 8, vp + j * vs, 8);
    }
    Py_ssize_t size = 16;
    while (size < 2 * most)
        size *= 2;
    table = PyMem_New(Entry, size);
    dropped = PyMem_Calloc(n ? (size_t)n : 1, 1);
    if (!table || !dropped) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t m = 0;
    for (int s = 0; s < NUM_SEGMENTS; s++) {
        Py_ssize_t a = start[s], c = count[s], kept = 0, sz = 16;
        while (sz < 2 * c)
            sz *= 2;
        size_t mask = (size_t)sz - 1;
        memset(table, 0xFF, (size_t)sz * sizeof *table);
        for (Py_ssize_t p = a; p < a + c; p++) {
            uint64_t h, ha;
            memcpy(&h, oh + p * 8, 8);
            if (p + AHEAD < a + c) {
                memcpy(&ha, oh + (p + AHEAD) * 8, 8);
                PREFETCH(&table[ha & mask]);
            }
            uint32_t tag = (uint32_t)(h >> 24);
            for (size_t t = (size_t)h & mask;; t = (t + 1) & mask) {
                Entry *e = &table[t];
                if (e->at < 0) {
                    e->at = (int32_t)p;
                    e->tag = tag;
                    break;
                }
                if (e->tag == tag &&
                    memcmp(ok + (Py_ssize_t)e->at * KEY_SIZE, ok + p * KEY_SIZE, KEY_SIZE) == 0) {
                    dropped[e->at] = 1; /* a later occurrence of the key wins */
                    e->at = (int32_t)p;
                    break;
                }
            }
        }
        for (Py_ssize_t p = a; p < a + c; p++) {
            if (dropped[p])
                continue;
            if (m != p) { /* m < p: distinct rows, no overlap */
                memcpy(ok + m * KEY_SIZE, ok + p * KEY_SIZE, KEY_SIZE);
                memcpy(oh + m * 8, oh + p * 8, 8);
                memcpy(ov + m * 8, ov + p * 8, 8);
            }
            m++;
            kept++;
        }
        int64_t kk = kept;
        memcpy((char *)cb.buf + s * 8, &kk, 8);
    }
    res = PyLong_FromSsize_t(m);
done:
    PyMem_Free(table);
    PyMem_Free(dropped);
    PyBuffer_Release(&kb);
    PyBuffer_Release(&vb);
    for (int i = 0; i < got; i++)
        PyBuffer_Release(outs[i]);
    return res;
}

static PyMemberDef Index_members[] = {
    {"_segs", T_OBJECT_EX, offsetof(IndexObject, segs), 0, NULL}, {NULL}};

static PyGetSetDef Index_getset[] = {
    {"width", (getter)Index_get_width, (setter)Index_set_width, NULL, NULL}, {NULL}};

static PyMethodDef Index_methods[] = {
    {"get", (PyCFunction)Index_get, METH_O, NULL},
    {"set", (PyCFunction)(void (*)(void))Index_set, METH_FASTCALL, NULL},
    {"delete", (PyCFunction)Index_delete, METH_O, NULL},
    {"random_key", (PyCFunction)Index_random_key, METH_NOARGS, NULL},
    {"_set_each", (PyCFunction)(void (*)(void))Index_set_each, METH_FASTCALL, NULL},
    {"_lookup_into", (PyCFunction)(void (*)(void))Index_lookup_into, METH_FASTCALL, NULL},
    {"_insert_segment", (PyCFunction)(void (*)(void))Index_insert_segment, METH_FASTCALL, NULL},
    {"_rehash", (PyCFunction)(void (*)(void))Index_rehash, METH_FASTCALL, NULL},
    {"_hash_keys", (PyCFunction)(void (*)(void))Index_hash_keys, METH_FASTCALL | METH_STATIC,
     NULL},
    {"_group_batch", (PyCFunction)(void (*)(void))Index_group_batch,
     METH_FASTCALL | METH_STATIC, NULL},
    {NULL}};

static PySequenceMethods Index_as_sequence = {.sq_contains = (objobjproc)Index_contains};

/* ------------------------------------------------------ index ops on any index object */

/* The owners call these with whatever index they hold: the C paths for ours, the
 * methods of the same names for any other. */

static int
idx_contains(PyObject *index, PyObject *key)
{
    if (PyObject_TypeCheck(index, &Index_Type))
        return Index_contains((IndexObject *)index, key);
    return PySequence_Contains(index, key);
}

static long long
long_result(PyObject *r)
{
    if (r == NULL)
        return -2;
    long long v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return v == -1 && PyErr_Occurred() ? -2 : v;
}

static long long
idx_get(PyObject *index, PyObject *key)
{
    if (PyObject_TypeCheck(index, &Index_Type))
        return index_get((IndexObject *)index, (const unsigned char *)PyBytes_AS_STRING(key));
    return long_result(PyObject_CallMethodOneArg(index, str_get, key));
}

static long long
idx_delete(PyObject *index, PyObject *key)
{
    if (PyObject_TypeCheck(index, &Index_Type))
        return index_delete((IndexObject *)index, (const unsigned char *)PyBytes_AS_STRING(key));
    return long_result(PyObject_CallMethodOneArg(index, str_delete, key));
}

static int
idx_set(PyObject *index, PyObject *key, uint64_t value)
{
    if (PyObject_TypeCheck(index, &Index_Type))
        return index_set((IndexObject *)index, (const unsigned char *)PyBytes_AS_STRING(key),
                         value);
    PyObject *v = PyLong_FromUnsignedLongLong(value);
    if (v == NULL)
        return -1;
    PyObject *args[3] = {index, key, v};
    PyObject *r =
        PyObject_VectorcallMethod(str_set, args, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(v);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* ------------------------------------------------------------------------ lock */

/* _fallback.Lock (threading.Lock): the owners' lock, as a type whose acquire and
 * release the put and delete paths below can call without a method call (a
 * threading.Lock costs ~150 ns a put that way: argument parsing and a clock read). The
 * same semaphore as _thread.lock underneath; a blocked acquire lets go of the GIL and
 * runs signal handlers when interrupted, as _thread.lock does. */
typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    char locked;
} LockObject;

static PyTypeObject Lock_Type;

static PyObject *
Lock_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "Lock() takes no arguments");
        return NULL;
    }
    LockObject *self = (LockObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    if ((self->lock = PyThread_allocate_lock()) == NULL) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_RuntimeError, "can't allocate lock");
        return NULL;
    }
    return (PyObject *)self;
}

static void
Lock_dealloc(LockObject *self)
{
    if (self->lock != NULL) {
        if (self->locked)
            PyThread_release_lock(self->lock);
        PyThread_free_lock(self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* 1 acquired, 0 timed out, -1 error (a signal handler raised). timeout_us < 0: forever. */
static int
lock_take(LockObject *self, PY_TIMEOUT_T timeout_us)
{
    if (PyThread_acquire_lock_timed(self->lock, 0, 0) == PY_LOCK_ACQUIRED) {
        self->locked = 1;
        return 1;
    }
    if (timeout_us == 0)
        return 0;
    for (;;) {
        PyLockStatus r;
        Py_BEGIN_ALLOW_THREADS
        r = PyThread_acquire_lock_timed(self->lock, timeout_us, 1);
        Py_END_ALLOW_THREADS
        if (r == PY_LOCK_ACQUIRED) {
            self->locked = 1;
            return 1;
        }
        if (r == PY_LOCK_FAILURE)
            return 0;
        if (Py_MakePendingCalls() < 0) /* PY_LOCK_INTR: run the signal handlers */
            return -1;
        /* Interrupted: wait again (a timed wait starts over, as it may on EINTR). */
    }
}

static int
lock_give(LockObject *self)
{
    if (!self->locked) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return -1;
    }
    self->locked = 0;
    PyThread_release_lock(self->lock);
    return 0;
}

static PyObject *
Lock_acquire(LockObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"blocking", "timeout", NULL};
    int blocking = 1;
    double timeout = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|pd:acquire", kwlist, &blocking, &timeout))
        return NULL;
    if (!blocking && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0 && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be positive");
        return NULL;
    }
    PY_TIMEOUT_T us = -1;
    if (!blocking)
        us = 0;
    else if (timeout >= 0) {
        if (timeout * 1e6 >= (double)PY_TIMEOUT_MAX) {
            PyErr_SetString(PyExc_OverflowError, "timeout value is too large");
            return NULL;
        }
        us = (PY_TIMEOUT_T)(timeout * 1e6);
    }
    int r = lock_take(self, us);
    return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *
Lock_enter(LockObject *self, PyObject *unused)
{
    int r = lock_take(self, -1);
    return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *
Lock_release(LockObject *self, PyObject *unused)
{
    if (lock_give(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
Lock_exit(LockObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return Lock_release(self, NULL);
}

static PyObject *
Lock_locked(LockObject *self, PyObject *unused)
{
    return PyBool_FromLong(self->locked);
}

static PyObject *
Lock_repr(LockObject *self)
{
    return PyUnicode_FromFormat("<%s kvstore._speedups.Lock object at %p>",
                                self->locked ? "locked" : "unlocked", self);
}

static PyMethodDef Lock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))Lock_acquire, METH_VARARGS | METH_KEYWORDS, NULL},
    {"release", (PyCFunction)Lock_release, METH_NOARGS, NULL},
    {"locked", (PyCFunction)Lock_locked, METH_NOARGS, NULL},
    {"__enter__", (PyCFunction)Lock_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))Lock_exit, METH_FASTCALL, NULL},
    {NULL}};

static PyTypeObject Lock_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvstore._speedups.Lock",
    .tp_basicsize = sizeof(LockObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A mutex like threading.Lock, that the C write paths take without a call.",
    .tp_dealloc = (destructor)Lock_dealloc,
    .tp_repr = (reprfunc)Lock_repr,
    .tp_methods = Lock_methods,
    .tp_new = Lock_new,
};

/* ------------------------------------------------------------- shared owner helpers */

/* New reference to the key as 16 bytes: as is, or through check_key (which raises). */
static PyObject *
checked_key(PyObject *key)
{
    if (PyBytes_CheckExact(key) && PyBytes_GET_SIZE(key) == KEY_SIZE) {
        Py_INCREF(key);
        return key;
    }
    PyObject *k = PyObject_CallOneArg(check_key_fn, key);
    if (k != NULL && !(PyBytes_Check(k) && PyBytes_GET_SIZE(k) == KEY_SIZE)) {
        Py_DECREF(k);
        PyErr_SetString(PyExc_TypeError, "check_key() returned something else than a key");
        return NULL;
    }
    return k;
}

static int
lock_acquire(PyObject *lock)
{
    if (Py_IS_TYPE(lock, &Lock_Type))
        return lock_take((LockObject *)lock, -1) == 1 ? 0 : -1;
    PyObject *r = PyObject_CallMethodNoArgs(lock, str_acquire);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* Release, keeping any pending exception (as a `with` block's exit does). */
static int
lock_release(PyObject *lock)
{
    if (Py_IS_TYPE(lock, &Lock_Type) && ((LockObject *)lock)->locked) {
        ((LockObject *)lock)->locked = 0;
        PyThread_release_lock(((LockObject *)lock)->lock);
        return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *r = PyObject_CallMethodNoArgs(lock, str_release);
    if (r == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return -1;
    }
    Py_DECREF(r);
    PyErr_Restore(type, value, tb);
    return type ? -1 : 0;
}

/* New reference to the owner's lock, or NULL (AttributeError, as Python's read of it). */
static PyObject *
owner_lock(PyObject *lock)
{
    if (lock == NULL) {
        PyErr_SetString(PyExc_AttributeError, "_lock");
        return NULL;
    }
    Py_INCREF(lock);
    return lock;
}

/* n >= limit (0/1) or n > limit (strict), for an int limit read from the owner. */
static int
size_cmp(Py_ssize_t n, PyObject *limit, int op)
{
    if (PyLong_CheckExact(limit)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(limit, &overflow);
        if (!(v == -1 && PyErr_Occurred()))
            return overflow ? overflow < 0 : op == Py_GE ? n >= v : n > v;
        PyErr_Clear();
    }
    PyObject *obj = PyLong_FromSsize_t(n);
    if (obj == NULL)
        return -1;
    int r = PyObject_RichCompareBool(obj, limit, op);
    Py_DECREF(obj);
    return r;
}

static int
parse_get(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **key,
          PyObject **dflt)
{
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    *key = nargs >= 1 ? args[0] : NULL;
    *dflt = nargs >= 2 ? args[1] : NULL;
    if (nargs > 2) {
        PyErr_Format(PyExc_TypeError, "get() takes at most 2 arguments (%zd given)", nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        PyObject **slot = PyUnicode_CompareWithASCIIString(name, "key") == 0 ? key
                          : PyUnicode_CompareWithASCIIString(name, "default") == 0 ? dflt
                                                                                   : NULL;
        if (slot == NULL || *slot != NULL) {
            PyErr_Format(PyExc_TypeError, "get() got an unexpected or repeated argument %R",
                         name);
            return -1;
        }
        *slot = args[nargs + i];
    }
    if (*key == NULL) {
        PyErr_SetString(PyExc_TypeError, "get() missing required argument 'key'");
        return -1;
    }
    if (*dflt == NULL)
        *dflt = Py_None;
    return 0;
}

/* ----------------------------------------------------------------------- store */

typedef struct {
    PyObject_HEAD
    PyObject *g, *lock, *readonly, *max_value_size, *buffer_size;
    /* The last generation whose `keyed` was read, held (so no other can take its
     * address), and that value: a cache of one attribute read on every hot path. */
    PyObject *keyed_of;
    int keyed;
} StoreObject;

static int
Store_traverse(StoreObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->g);
    Py_VISIT(self->lock);
    Py_VISIT(self->readonly);
    Py_VISIT(self->max_value_size);
    Py_VISIT(self->buffer_size);
    Py_VISIT(self->keyed_of);
    return 0;
}

static int
Store_clear(StoreObject *self)
{
    Py_CLEAR(self->g);
    Py_CLEAR(self->lock);
    Py_CLEAR(self->readonly);
    Py_CLEAR(self->max_value_size);
    Py_CLEAR(self->buffer_size);
    Py_CLEAR(self->keyed_of);
    return 0;
}

static void
Store_dealloc(StoreObject *self)
{
    PyObject_GC_UnTrack(self);
    Store_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* New reference to the open generation: self._g, else whatever self._live() does
 * (raise StoreClosedError). */
static PyObject *
store_live(StoreObject *self)
{
    if (self->g != NULL && self->g != Py_None) {
        Py_INCREF(self->g);
        return self->g;
    }
    return PyObject_CallMethodNoArgs((PyObject *)self, str_live_m);
}

/* Under the lock: the generation to write to, or self._writable()'s error. */
static PyObject *
store_writable(StoreObject *self)
{
    if (self->g != NULL && self->g != Py_None && self->readonly == Py_False) {
        Py_INCREF(self->g);
        return self->g;
    }
    return PyObject_CallMethodNoArgs((PyObject *)self, str_writable);
}

static int
Store_contains(StoreObject *self, PyObject *key)
{
    PyObject *k = checked_key(key), *g = NULL, *index = NULL;
    int r = -1;
    if (k && (g = store_live(self)) && (index = PyObject_GetAttr(g, str_index)))
        r = idx_contains(index, k);
    Py_XDECREF(k);
    Py_XDECREF(g);
    Py_XDECREF(index);
    return r;
}

/* A generation's VAL layout (its `keyed`): 1 keyed, 0 plain, -1 error. */
static int
gen_keyed(PyObject *g)
{
    PyObject *kd = PyObject_GetAttr(g, str_keyed);
    if (kd == NULL)
        return -1;
    int keyed = kd == Py_True;
    Py_DECREF(kd);
    return keyed;
}

/* gen_keyed(g), read once per generation. Both fields are set before the old one is
 * let go (which may run a finalizer and switch threads), so a reader never sees a
 * generation with another's value. */
static int
store_keyed(StoreObject *self, PyObject *g)
{
    if (g == self->keyed_of)
        return self->keyed;
    int keyed = gen_keyed(g);
    if (keyed < 0)
        return -1;
    PyObject *old = self->keyed_of;
    Py_INCREF(g);
    self->keyed = keyed;
    self->keyed_of = g;
    Py_XDECREF(old);
    return keyed;
}

/* The common cases of Store._read (a value in the write buffer, or inside the map),
 * checked as it checks them, the record's key against `key` in a keyed generation.
 * Returns NULL *without* an exception for every other case, for _read itself to
 * handle (pread, remap, a bad record, a CRC failure, another key's record). */
static PyObject *
read_fast(PyObject *g, long long off, PyObject *key, int keyed)
{
    PyObject *wbuf = NULL, *files = NULL, *mmt = NULL, *res = NULL;
    Py_buffer view = {0};
    const unsigned char *p;
    long long base, length, crc, hsize;
    uint32_t head_crc = 0;
    if (keyed < 0)
        goto out;
    hsize = keyed ? RECORD_HEADER_SIZE : VAL_HEADER_SIZE;
    if (!(wbuf = PyObject_GetAttr(g, str_wbuf)) || !PyTuple_CheckExact(wbuf) ||
        PyTuple_GET_SIZE(wbuf) != 2)
        goto out;
    base = PyLong_AsLongLong(PyTuple_GET_ITEM(wbuf, 0));
    if (base == -1 && PyErr_Occurred())
        goto out;
    if (off >= base) {
        PyObject *buf = PyTuple_GET_ITEM(wbuf, 1); /* kept alive by wbuf */
        long long rel = off - base, size;
        if (!PyByteArray_Check(buf) || rel > (size = PyByteArray_GET_SIZE(buf)) - hsize)
            goto out;
        p = (const unsigned char *)PyByteArray_AS_STRING(buf) + rel;
        length = (long long)load_le(p, 4);
        crc = (long long)load_le(p + 4, 4);
        if (keyed) {
            if (length == DELETED || memcmp(p + 8, PyBytes_AS_STRING(key), KEY_SIZE) != 0)
                goto out;
            head_crc = keyed_head_crc(p, p + 8);
        }
        if (length > size - rel - hsize || !(res = PyBytes_FromStringAndSize(NULL, length)))
            goto out;
        /* The allocation may have let writers run: the buffer only grows, but it may
         * have moved. */
        if (rel + hsize + length > PyByteArray_GET_SIZE(buf)) {
            Py_CLEAR(res);
            goto out;
        }
        memcpy(PyBytes_AS_STRING(res), PyByteArray_AS_STRING(buf) + rel + hsize, (size_t)length);
    }
    else {
        long long mlen, limit;
        PyObject *mm;
        if (!(files = PyObject_GetAttr(g, str_files)) || !(mmt = PyObject_GetAttr(files, str_mm)) ||
            !PyTuple_CheckExact(mmt) || PyTuple_GET_SIZE(mmt) != 2)
            goto out;
        mm = PyTuple_GET_ITEM(mmt, 0);
        mlen = PyLong_AsLongLong(PyTuple_GET_ITEM(mmt, 1));
        if ((mlen == -1 && PyErr_Occurred()) || base - mlen > REMAP_SLACK || mm == Py_None ||
            off + hsize > mlen)
            goto out;
        /* Our export keeps the map open and mapped even if the files are closed meanwhile. */
        if (PyObject_GetBuffer(mm, &view, PyBUF_SIMPLE) < 0)
            goto out;
        limit = mlen < view.len ? mlen : view.len;
        if (off < 0 || off + hsize > limit)
            goto out;
        p = (const unsigned char *)view.buf + off;
        length = (long long)load_le(p, 4);
        crc = (long long)load_le(p + 4, 4);
        if (keyed) {
            if (length == DELETED || memcmp(p + 8, PyBytes_AS_STRING(key), KEY_SIZE) != 0)
                goto out;
            head_crc = keyed_head_crc(p, p + 8);
        }
        if (off + hsize + length > limit ||
            !(res = PyBytes_FromStringAndSize((const char *)p + hsize, length)))
            goto out;
    }
    if (crc32_of(head_crc, (const unsigned char *)PyBytes_AS_STRING(res), length, 1) !=
        (uint32_t)crc)
        Py_CLEAR(res); /* _read raises CorruptStoreError */
out:
    if (view.obj)
        PyBuffer_Release(&view);
    Py_XDECREF(wbuf);
    Py_XDECREF(files);
    Py_XDECREF(mmt);
    if (res == NULL)
        PyErr_Clear();
    return res;
}

static PyObject *
store_lookup(StoreObject *self, PyObject *key, PyObject *dflt)
{
    PyObject *k = checked_key(key), *g = NULL, *index = NULL, *res = NULL;
    long long off;
    if (!k || !(g = store_live(self)) || !(index = PyObject_GetAttr(g, str_index)))
        goto out;
    if ((off = idx_get(index, k)) == -2)
        goto out;
    if (off < 0) {
        if (dflt == NULL)
            PyErr_SetObject(PyExc_KeyError, k);
        else {
            Py_INCREF(dflt);
            res = dflt;
        }
        goto out;
    }
    if ((res = read_fast(g, off, k, store_keyed(self, g))) == NULL) {
        PyObject *o = PyLong_FromLongLong(off);
        if (o != NULL) {
            PyObject *args[4] = {(PyObject *)self, g, o, k};
            res = PyObject_VectorcallMethod(str_read, args, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                            NULL);
            Py_DECREF(o);
        }
    }
out:
    Py_XDECREF(k);
    Py_XDECREF(g);
    Py_XDECREF(index);
    return res;
}

static PyObject *
Store_subscript(StoreObject *self, PyObject *key)
{
    return store_lookup(self, key, NULL);
}

static PyObject *
Store_get(StoreObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *key, *dflt;
    if (parse_get(args, nargs, kwnames, &key, &dflt) < 0)
        return NULL;
    return store_lookup(self, key, dflt);
}

/* Append n bytes to a bytearray (it must not be exported: the store's lock is held). */
static int
append(PyObject *buf, const void *data, Py_ssize_t n)
{
    Py_ssize_t size = PyByteArray_GET_SIZE(buf);
    if (PyByteArray_Resize(buf, size + n) < 0)
        return -1;
    memcpy(PyByteArray_AS_STRING(buf) + size, data, (size_t)n);
    return 0;
}

static PyObject *
gen_bytearray(PyObject *g, PyObject *name)
{
    PyObject *buf = PyObject_GetAttr(g, name);
    if (buf != NULL && !PyByteArray_Check(buf)) {
        Py_DECREF(buf);
        PyErr_Format(PyExc_TypeError, "kvstore: generation.%U is not a bytearray", name);
        return NULL;
    }
    return buf;
}

static int
flush_if_full(StoreObject *self, PyObject *g, Py_ssize_t buffered)
{
    if (self->buffer_size == NULL) {
        PyErr_SetString(PyExc_AttributeError, "_buffer_size");
        return -1;
    }
    int full = size_cmp(buffered, self->buffer_size, Py_GE);
    if (full <= 0)
        return full;
    PyObject *args[2] = {(PyObject *)self, g};
    PyObject *r =
        PyObject_VectorcallMethod(str_flush_locked, args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* _fallback._record_header: what precedes the value v in its VAL record; returns its
 * size (RECORD_HEADER_SIZE or VAL_HEADER_SIZE). */
static long long
record_header(unsigned char *header, PyObject *k, PyObject *v, int keyed)
{
    Py_ssize_t n = PyBytes_GET_SIZE(v);
    const unsigned char *value = (const unsigned char *)PyBytes_AS_STRING(v);
    store_le(header, (uint64_t)n, 4);
    if (!keyed) {
        store_le(header + 4, crc32_of(0, value, n, 1), 4);
        return VAL_HEADER_SIZE;
    }
    memcpy(header + 8, PyBytes_AS_STRING(k), KEY_SIZE);
    store_le(header + 4, crc32_of(keyed_head_crc(header, header + 8), value, n, 1), 4);
    return RECORD_HEADER_SIZE;
}

/* Under the lock: _fallback.StoreBase.__setitem__ from `with self._lock:` on. The
 * header was made for the layout `keyed`. */
static int
store_put_locked(StoreObject *self, PyObject *k, PyObject *v, unsigned char *header, int keyed)
{
    PyObject *g, *wbuf = NULL, *buf, *kbuf = NULL, *index = NULL;
    unsigned char rec[KEY_RECORD_SIZE];
    long long base, hsize = keyed ? RECORD_HEADER_SIZE : VAL_HEADER_SIZE;
    int r = -1, now;
    if ((g = store_writable(self)) == NULL)
        return -1;
    if ((now = store_keyed(self, g)) < 0)
        goto out;
    if (now != keyed) /* a compaction rewrote the generation meanwhile */
        hsize = record_header(header, k, v, now);
    if (!(wbuf = PyObject_GetAttr(g, str_wbuf)))
        goto out;
    if (!PyTuple_CheckExact(wbuf) || PyTuple_GET_SIZE(wbuf) != 2 ||
        !PyByteArray_Check(PyTuple_GET_ITEM(wbuf, 1))) {
        PyErr_SetString(PyExc_TypeError, "kvstore: generation.wbuf is not (int, bytearray)");
        goto out;
    }
    base = PyLong_AsLongLong(PyTuple_GET_ITEM(wbuf, 0));
    if (base == -1 && PyErr_Occurred())
        goto out;
    buf = PyTuple_GET_ITEM(wbuf, 1);
    long long off = base + PyByteArray_GET_SIZE(buf);
    Py_ssize_t vlen = PyBytes_GET_SIZE(v), size = PyByteArray_GET_SIZE(buf);
    if (PyByteArray_Resize(buf, size + hsize + vlen) < 0)
        goto out;
    memcpy(PyByteArray_AS_STRING(buf) + size, header, (size_t)hsize);
    memcpy(PyByteArray_AS_STRING(buf) + size + hsize, PyBytes_AS_STRING(v), (size_t)vlen);
    memcpy(rec, PyBytes_AS_STRING(k), KEY_SIZE);
    store_le(rec + KEY_SIZE, (uint64_t)off, 8);
    if (!(kbuf = gen_bytearray(g, str_kbuf)) || append(kbuf, rec, KEY_RECORD_SIZE) < 0)
        goto out;
    if (!(index = PyObject_GetAttr(g, str_index)) || idx_set(index, k, (uint64_t)off) < 0)
        goto out; /* published only once the bytes are readable */
    r = flush_if_full(self, g, PyByteArray_GET_SIZE(buf) + PyByteArray_GET_SIZE(kbuf));
out:
    Py_DECREF(g);
    Py_XDECREF(wbuf);
    Py_XDECREF(kbuf);
    Py_XDECREF(index);
    return r;
}

static int
store_put(StoreObject *self, PyObject *key, PyObject *value)
{
    PyObject *k = checked_key(key), *v = NULL, *lock = NULL;
    unsigned char header[RECORD_HEADER_SIZE];
    int r = -1, too_big = 1, keyed = 1;
    if (k == NULL)
        return -1;
    if (PyBytes_CheckExact(value) && self->max_value_size != NULL &&
        (too_big = size_cmp(PyBytes_GET_SIZE(value), self->max_value_size, Py_GT)) < 0)
        goto out;
    if (!too_big) {
        Py_INCREF(value);
        v = value;
    }
    else if ((v = PyObject_CallMethodOneArg((PyObject *)self, str_check_value, value)) == NULL)
        goto out;
    else if (!PyBytes_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "_check_value() did not return bytes");
        goto out;
    }
    if (PyBytes_GET_SIZE(v) > MAX_RECORD_VALUE) { /* only if max_value_size was raised */
        PyErr_SetString(PyExc_OverflowError, "a VAL record holds at most 2**32 - 2 bytes");
        goto out;
    }
    /* The CRC is computed before the lock is taken, for the layout of the generation
     * open now (a closed store: any, _writable() raises under the lock). */
    if (self->g != NULL && self->g != Py_None && (keyed = store_keyed(self, self->g)) < 0)
        goto out;
    record_header(header, k, v, keyed);
    if (!(lock = owner_lock(self->lock)) || lock_acquire(lock) < 0)
        goto out;
    r = store_put_locked(self, k, v, header, keyed);
    if (lock_release(lock) < 0)
        r = -1;
out:
    Py_DECREF(k);
    Py_XDECREF(v);
    Py_XDECREF(lock);
    return r;
}

/* Under the lock: _fallback.StoreBase.__delitem__ from `with self._lock:` on. */
static int
store_delete_locked(StoreObject *self, PyObject *k)
{
    PyObject *g, *index = NULL, *kbuf = NULL, *wbuf = NULL, *buf;
    unsigned char rec[KEY_RECORD_SIZE];
    long long old;
    Py_ssize_t buffered = 0;
    int r = -1, keyed;
    if ((g = store_writable(self)) == NULL)
        return -1;
    if (!(index = PyObject_GetAttr(g, str_index)) || (old = idx_delete(index, k)) == -2)
        goto out;
    if (old < 0) {
        PyErr_SetObject(PyExc_KeyError, k);
        goto out;
    }
    if ((keyed = store_keyed(self, g)) < 0)
        goto out;
    if (keyed) { /* the delete leaves its record in VAL too: _format.pack_deletion */
        unsigned char del[RECORD_HEADER_SIZE];
        store_le(del, (uint64_t)DELETED, 4);
        memcpy(del + 8, PyBytes_AS_STRING(k), KEY_SIZE);
        store_le(del + 4, keyed_head_crc(del, del + 8), 4);
        if (!(wbuf = PyObject_GetAttr(g, str_wbuf)))
            goto out;
        if (!PyTuple_CheckExact(wbuf) || PyTuple_GET_SIZE(wbuf) != 2 ||
            !PyByteArray_Check(PyTuple_GET_ITEM(wbuf, 1))) {
            PyErr_SetString(PyExc_TypeError, "kvstore: generation.wbuf is not (int, bytearray)");
            goto out;
        }
        buf = PyTuple_GET_ITEM(wbuf, 1);
        if (append(buf, del, RECORD_HEADER_SIZE) < 0)
            goto out;
        buffered = PyByteArray_GET_SIZE(buf);
    }
    memcpy(rec, PyBytes_AS_STRING(k), KEY_SIZE);
    memset(rec + KEY_SIZE, 0xFF, 8); /* offset -1: a tombstone */
    if (!(kbuf = gen_bytearray(g, str_kbuf)) || append(kbuf, rec, KEY_RECORD_SIZE) < 0)
        goto out;
    r = flush_if_full(self, g, buffered + PyByteArray_GET_SIZE(kbuf));
out:
    Py_DECREF(g);
    Py_XDECREF(index);
    Py_XDECREF(kbuf);
    Py_XDECREF(wbuf);
    return r;
}

static int
Store_ass_subscript(StoreObject *self, PyObject *key, PyObject *value)
{
    if (value != NULL)
        return store_put(self, key, value);
    PyObject *k = checked_key(key), *lock = NULL;
    int r = -1;
    if (k && (lock = owner_lock(self->lock)) && lock_acquire(lock) == 0) {
        r = store_delete_locked(self, k);
        if (lock_release(lock) < 0)
            r = -1;
    }
    Py_XDECREF(k);
    Py_XDECREF(lock);
    return r;
}

/* _fallback.StoreBase._check_values: every value as a put checks it; the list itself
 * when every value is already bytes within the limit. */
static PyObject *
Store_check_values(StoreObject *self, PyObject *values)
{
    if (self->max_value_size == NULL) {
        PyErr_SetString(PyExc_AttributeError, "max_value_size");
        return NULL;
    }
    if (PyList_CheckExact(values)) {
        Py_ssize_t n = PyList_GET_SIZE(values), j = 0;
        for (; j < n; j++) {
            PyObject *v = PyList_GET_ITEM(values, j);
            int too_big = 1;
            if (PyBytes_CheckExact(v) &&
                (too_big = size_cmp(PyBytes_GET_SIZE(v), self->max_value_size, Py_GT)) < 0)
                return NULL;
            if (too_big)
                break;
        }
        if (j == n) {
            Py_INCREF(values);
            return values;
        }
    }
    PyObject *items = PySequence_List(values); /* our copy, to fill in */
    if (items == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(items); j++) {
        PyObject *v = PyList_GET_ITEM(items, j);
        int too_big = 1;
        if (PyBytes_CheckExact(v) &&
            (too_big = size_cmp(PyBytes_GET_SIZE(v), self->max_value_size, Py_GT)) < 0)
            goto fail;
        if (!too_big)
            continue;
        v = PyObject_CallMethodOneArg((PyObject *)self, str_check_value, v);
        if (v == NULL)
            goto fail;
        if (PyList_SetItem(items, j, v) < 0) /* steals v */
            goto fail;
    }
    return items;
fail:
    Py_DECREF(items);
    return NULL;
}

/* _fallback.StoreBase._pack_values: put_many's VAL records for the keys (rows of 16
 * bytes), keyed or plain, each value checked as a put checks it (others go through
 * self._check_value), back to back. */
static PyObject *
Store_pack_values(StoreObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer rb, kb;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "_pack_values(keys, values, rel, keyed)");
        return NULL;
    }
    if (self->max_value_size == NULL) {
        PyErr_SetString(PyExc_AttributeError, "max_value_size");
        return NULL;
    }
    int keyed = PyObject_IsTrue(args[3]);
    if (keyed < 0)
        return NULL;
    /* Our own copy of the list: no other code can change it while we work. */
    PyObject *items = PySequence_List(args[1]), *res = NULL;
    if (items == NULL)
        return NULL;
    if (get_buffer(args[0], &kb, 0, 1, "keys") < 0) {
        Py_DECREF(items);
        return NULL;
    }
    if (get_buffer(args[2], &rb, 1, 8, "rel") < 0) {
        PyBuffer_Release(&kb);
        Py_DECREF(items);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(items), total = 0, hsize = keyed ? RECORD_HEADER_SIZE : VAL_HEADER_SIZE;
    if (kb.len != n * KEY_SIZE) {
        PyErr_SetString(PyExc_ValueError, "_pack_values: keys and values differ in length");
        goto done;
    }
    if (rb.len != n * 8) {
        PyErr_SetString(PyExc_ValueError, "_pack_values: rel and values differ in length");
        goto done;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *v = PyList_GET_ITEM(items, j);
        int too_big = 1;
        if (PyBytes_CheckExact(v) &&
            (too_big = size_cmp(PyBytes_GET_SIZE(v), self->max_value_size, Py_GT)) < 0)
            goto done;
        if (too_big) {
            v = PyObject_CallMethodOneArg((PyObject *)self, str_check_value, v);
            if (v == NULL)
                goto done;
            if (!PyBytes_Check(v)) {
                Py_DECREF(v);
                PyErr_SetString(PyExc_TypeError, "_check_value() did not return bytes");
                goto done;
            }
            if (PyList_SetItem(items, j, v) < 0) /* steals v, drops the value it replaces */
                goto done;
        }
        if (PyBytes_GET_SIZE(v) > MAX_RECORD_VALUE) {
            PyErr_SetString(PyExc_OverflowError, "a VAL record holds at most 2**32 - 2 bytes");
            goto done;
        }
        if (PyBytes_GET_SIZE(v) > PY_SSIZE_T_MAX - hsize - total) {
            PyErr_NoMemory();
            goto done;
        }
        total += hsize + PyBytes_GET_SIZE(v);
    }
    if ((res = PyBytes_FromStringAndSize(NULL, total)) == NULL)
        goto done;
    /* Everything touched now is ours alone (the list copy, immutable values, the
     * result, the caller's fresh keys and rel arrays): a big batch lets other threads
     * run. */
    PyThreadState *ts = total >= (1 << 20) ? PyEval_SaveThread() : NULL;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(res);
    Py_ssize_t pos = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *v = PyList_GET_ITEM(items, j);
        Py_ssize_t len = PyBytes_GET_SIZE(v);
        const unsigned char *src = (const unsigned char *)PyBytes_AS_STRING(v);
        int64_t at = pos;
        uint32_t start = 0;
        store_le(out + pos, (uint64_t)len, 4);
        if (keyed) {
            memcpy(out + pos + 8, (const char *)kb.buf + j * KEY_SIZE, KEY_SIZE);
            start = keyed_head_crc(out + pos, out + pos + 8);
        }
        store_le(out + pos + 4, crc32_of(start, src, len, 0), 4);
        memcpy(out + pos + hsize, src, (size_t)len);
        memcpy((char *)rb.buf + j * 8, &at, 8);
        pos += hsize + len;
    }
    if (ts)
        PyEval_RestoreThread(ts);
done:
    PyBuffer_Release(&rb);
    PyBuffer_Release(&kb);
    Py_DECREF(items);
    return res;
}

static PyMemberDef Store_members[] = {
    {"_g", T_OBJECT_EX, offsetof(StoreObject, g), 0, NULL},
    {"_lock", T_OBJECT_EX, offsetof(StoreObject, lock), 0, NULL},
    {"readonly", T_OBJECT_EX, offsetof(StoreObject, readonly), 0, NULL},
    {"max_value_size", T_OBJECT_EX, offsetof(StoreObject, max_value_size), 0, NULL},
    {"_buffer_size", T_OBJECT_EX, offsetof(StoreObject, buffer_size), 0, NULL},
    {NULL}};

static PyMethodDef Store_methods[] = {
    {"get", (PyCFunction)(void (*)(void))Store_get, METH_FASTCALL | METH_KEYWORDS,
     "The value, or default if absent. Lock-free."},
    {"_pack_values", (PyCFunction)(void (*)(void))Store_pack_values, METH_FASTCALL, NULL},
    {"_check_values", (PyCFunction)Store_check_values, METH_O, NULL},
    {NULL}};

static PySequenceMethods Store_as_sequence = {.sq_contains = (objobjproc)Store_contains};
static PyMappingMethods Store_as_mapping = {
    .mp_subscript = (binaryfunc)Store_subscript,
    .mp_ass_subscript = (objobjargproc)Store_ass_subscript,
};

/* ------------------------------------------------------------- key set, key -> int */

typedef struct {
    PyObject_HEAD
    PyObject *index, *lock;
} KeyedObject;

static int
Keyed_traverse(KeyedObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->index);
    Py_VISIT(self->lock);
    return 0;
}

static int
Keyed_clear(KeyedObject *self)
{
    Py_CLEAR(self->index);
    Py_CLEAR(self->lock);
    return 0;
}

static void
Keyed_dealloc(KeyedObject *self)
{
    PyObject_GC_UnTrack(self);
    Keyed_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* New reference to self._index (AttributeError if unset, as Python's read). */
static PyObject *
keyed_index(KeyedObject *self)
{
    if (self->index == NULL) {
        PyErr_SetString(PyExc_AttributeError, "_index");
        return NULL;
    }
    Py_INCREF(self->index);
    return self->index;
}

static int
Keyed_contains(KeyedObject *self, PyObject *key)
{
    PyObject *k = checked_key(key), *index = NULL;
    int r = -1;
    if (k && (index = keyed_index(self)))
        r = idx_contains(index, k);
    Py_XDECREF(k);
    Py_XDECREF(index);
    return r;
}

/* With the owner's lock held: set (value >= 0) or delete (value == -1) one key; the
 * delete's old value, or 0 after a set, or -2 on error. */
static long long
keyed_write(KeyedObject *self, PyObject *k, long long value)
{
    PyObject *lock = owner_lock(self->lock), *index = NULL;
    long long r = -2;
    if (lock == NULL || lock_acquire(lock) < 0) {
        Py_XDECREF(lock);
        return -2;
    }
    if ((index = keyed_index(self)) != NULL)
        r = value < 0 ? idx_delete(index, k) : idx_set(index, k, (uint64_t)value) < 0 ? -2 : 0;
    Py_XDECREF(index);
    if (lock_release(lock) < 0)
        r = -2;
    Py_DECREF(lock);
    return r;
}

static PyObject *
KeySet_add(KeyedObject *self, PyObject *key)
{
    PyObject *k = checked_key(key);
    if (k == NULL)
        return NULL;
    long long r = keyed_write(self, k, 0);
    Py_DECREF(k);
    if (r == -2)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
KeySet_discard(KeyedObject *self, PyObject *key)
{
    PyObject *k = checked_key(key);
    if (k == NULL)
        return NULL;
    long long r = keyed_write(self, k, -1);
    Py_DECREF(k);
    if (r == -2)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
keyintmap_lookup(KeyedObject *self, PyObject *key, PyObject *dflt)
{
    PyObject *k = checked_key(key), *index = NULL, *res = NULL;
    long long v;
    if (k && (index = keyed_index(self)) && (v = idx_get(index, k)) != -2) {
        if (v >= 0)
            res = PyLong_FromLongLong(v);
        else if (dflt == NULL)
            PyErr_SetObject(PyExc_KeyError, k);
        else {
            Py_INCREF(dflt);
            res = dflt;
        }
    }
    Py_XDECREF(k);
    Py_XDECREF(index);
    return res;
}

static PyObject *
KeyIntMap_subscript(KeyedObject *self, PyObject *key)
{
    return keyintmap_lookup(self, key, NULL);
}

static PyObject *
KeyIntMap_get(KeyedObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *key, *dflt;
    if (parse_get(args, nargs, kwnames, &key, &dflt) < 0)
        return NULL;
    return keyintmap_lookup(self, key, dflt);
}

/* The value as the owner's _check_value(value) would return it (ints that fit the
 * index's width pass straight through). */
static int
keyintmap_value(KeyedObject *self, PyObject *value, long long *out)
{
    int w = self->index && PyObject_TypeCheck(self->index, &Index_Type)
                ? ((IndexObject *)self->index)->width
                : 0;
    if (w > 0 && PyLong_CheckExact(value)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (!overflow && v >= 0 && (uint64_t)v <= (((uint64_t)1 << (8 * w - 1)) - 1)) {
            *out = v;
            return 0;
        }
    }
    PyObject *checked = PyObject_CallMethodOneArg((PyObject *)self, str_check_value, value);
    if (checked == NULL)
        return -1;
    *out = PyLong_AsLongLong(checked);
    Py_DECREF(checked);
    if (*out == -1 && PyErr_Occurred())
        return -1;
    if (*out < 0) {
        PyErr_SetString(PyExc_ValueError, "_check_value() returned a negative value");
        return -1;
    }
    return 0;
}

static int
KeyIntMap_ass_subscript(KeyedObject *self, PyObject *key, PyObject *value)
{
    PyObject *k = checked_key(key);
    long long v = -1, r = -2;
    if (k == NULL)
        return -1;
    if (value == NULL || keyintmap_value(self, value, &v) == 0)
        r = keyed_write(self, k, v);
    if (value == NULL && r == -1)
        PyErr_SetObject(PyExc_KeyError, k);
    Py_DECREF(k);
    return r < 0 ? -1 : 0;
}

static PyMemberDef Keyed_members[] = {
    {"_index", T_OBJECT_EX, offsetof(KeyedObject, index), 0, NULL},
    {"_lock", T_OBJECT_EX, offsetof(KeyedObject, lock), 0, NULL},
    {NULL}};

static PyMethodDef KeySet_methods[] = {
    {"add", (PyCFunction)KeySet_add, METH_O, NULL},
    {"discard", (PyCFunction)KeySet_discard, METH_O, NULL},
    {NULL}};

static PyMethodDef KeyIntMap_methods[] = {
    {"get", (PyCFunction)(void (*)(void))KeyIntMap_get, METH_FASTCALL | METH_KEYWORDS,
     "The value, or default if absent. Lock-free."},
    {NULL}};

static PySequenceMethods Keyed_as_sequence = {.sq_contains = (objobjproc)Keyed_contains};
static PyMappingMethods KeyIntMap_as_mapping = {
    .mp_subscript = (binaryfunc)KeyIntMap_subscript,
    .mp_ass_subscript = (objobjargproc)KeyIntMap_ass_subscript,
};

/* ------------------------------------------------------------- VAL record checks */

/* _fallback.check_val_records: the value records at `offs` (int64, in file order) of a
 * VAL file whose first `size` bytes are `buf`, each checked as
 * _format.check_val_record checks it against the end of the one before; returns
 * (how many passed, where the last that passed ends, or prev_end). */
static PyObject *
check_val_records(PyObject *unused, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer bb, ob;
    long long size, prev_end;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "check_val_records(buf, offs, size, prev_end)");
        return NULL;
    }
    size = PyLong_AsLongLong(args[2]);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    prev_end = PyLong_AsLongLong(args[3]);
    if (prev_end == -1 && PyErr_Occurred())
        return NULL;
    if (get_buffer(args[0], &bb, 0, 1, "buf") < 0)
        return NULL;
    if (get_buffer(args[1], &ob, 0, 8, "offs") < 0) {
        PyBuffer_Release(&bb);
        return NULL;
    }
    PyObject *res = NULL;
    if (size < 0 || size > bb.len) {
        PyErr_SetString(PyExc_ValueError, "check_val_records: size is outside the buffer");
        goto done;
    }
    Py_ssize_t n = ob.len / 8, j = 0;
    const unsigned char *base = bb.buf;
    for (; j < n; j++) {
        int64_t off;
        memcpy(&off, (const char *)ob.buf + j * 8, 8);
        if (off < HEADER_SIZE || off > size - VAL_HEADER_SIZE)
            break;
        long long length = (long long)load_le(base + off, 4);
        long long end = off + VAL_HEADER_SIZE + length;
        if (end > size ||
            crc32_of(0, base + off + VAL_HEADER_SIZE, (Py_ssize_t)length, 0) !=
                (uint32_t)load_le(base + off + 4, 4) ||
            off < prev_end)
            break;
        prev_end = end;
    }
    res = Py_BuildValue("nL", j, prev_end);
done:
    PyBuffer_Release(&bb);
    PyBuffer_Release(&ob);
    return res;
}

/* _fallback.check_keyed_records: the KEY records `records` (whole 24-byte records, in
 * file order), the first standing for the keyed VAL record at `pos` of a VAL file whose
 * first `size` bytes are `buf`, each next one for the record after, each checked as
 * _format.check_keyed_record checks it; returns (how many passed, where the last that
 * passed ends, or pos). */
static PyObject *
check_keyed_records(PyObject *unused, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer bb, rb;
    long long size, pos;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "check_keyed_records(buf, records, size, pos)");
        return NULL;
    }
    size = PyLong_AsLongLong(args[2]);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    pos = PyLong_AsLongLong(args[3]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    if (get_buffer(args[0], &bb, 0, 1, "buf") < 0)
        return NULL;
    if (get_buffer(args[1], &rb, 0, 1, "records") < 0) {
        PyBuffer_Release(&bb);
        return NULL;
    }
    PyObject *res = NULL;
    if (size < 0 || size > bb.len) {
        PyErr_SetString(PyExc_ValueError, "check_keyed_records: size is outside the buffer");
        goto done;
    }
    if (rb.len % KEY_RECORD_SIZE) {
        PyErr_SetString(PyExc_ValueError, "check_keyed_records: records are not whole KEY records");
        goto done;
    }
    Py_ssize_t n = rb.len / KEY_RECORD_SIZE, j = 0;
    const unsigned char *base = bb.buf;
    for (; j < n; j++) {
        const unsigned char *kr = (const unsigned char *)rb.buf + j * KEY_RECORD_SIZE;
        int64_t off = (int64_t)load_le(kr + KEY_SIZE, 8);
        if (pos < HEADER_SIZE || pos > size - RECORD_HEADER_SIZE)
            break;
        const unsigned char *p = base + pos;
        long long length = (long long)load_le(p, 4);
        int deleted = length == DELETED;
        long long end = pos + RECORD_HEADER_SIZE + (deleted ? 0 : length);
        if (end > size ||
            crc32_of(keyed_head_crc(p, p + 8), p + RECORD_HEADER_SIZE, end - pos - RECORD_HEADER_SIZE,
                     0) != (uint32_t)load_le(p + 4, 4) ||
            deleted != (off == -1) || memcmp(p + 8, kr, KEY_SIZE) != 0 || (off != -1 && off != pos))
            break;
        pos = end;
    }
    res = Py_BuildValue("nL", j, pos);
done:
    PyBuffer_Release(&bb);
    PyBuffer_Release(&rb);
    return res;
}

static PyMethodDef module_methods[] = {
    {"check_val_records", (PyCFunction)(void (*)(void))check_val_records, METH_FASTCALL, NULL},
    {"check_keyed_records", (PyCFunction)(void (*)(void))check_keyed_records, METH_FASTCALL, NULL},
    {NULL}};

/* ---------------------------------------------------------------------- module */

#define BASE_FLAGS (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC)

static PyTypeObject Segment_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvstore._speedups.SegmentBase",
    .tp_basicsize = sizeof(SegmentObject),
    .tp_flags = BASE_FLAGS,
    .tp_doc = "One open-addressing table: the arrays and counts (see kvstore._index).",
    .tp_traverse = (traverseproc)Segment_traverse,
    .tp_clear = (inquiry)Segment_clear,
    .tp_dealloc = (destructor)Segment_dealloc,
    .tp_members = Segment_members,
    .tp_new = PyType_GenericNew,
    .tp_free = PyObject_GC_Del,
};

static PyTypeObject Index_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvstore._speedups.IndexBase",
    .tp_basicsize = sizeof(IndexObject),
    .tp_flags = BASE_FLAGS,
    .tp_doc = "The probing half of HashIndex: every walk over the slots.",
    .tp_traverse = (traverseproc)Index_traverse,
    .tp_clear = (inquiry)Index_clear,
    .tp_dealloc = (destructor)Index_dealloc,
    .tp_members = Index_members,
    .tp_getset = Index_getset,
    .tp_methods = Index_methods,
    .tp_as_sequence = &Index_as_sequence,
    .tp_new = PyType_GenericNew,
    .tp_free = PyObject_GC_Del,
};

static PyTypeObject Store_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvstore._speedups.StoreBase",
    .tp_basicsize = sizeof(StoreObject),
    .tp_flags = BASE_FLAGS,
    .tp_doc = "Store's single-key paths.",
    .tp_traverse = (traverseproc)Store_traverse,
    .tp_clear = (inquiry)Store_clear,
    .tp_dealloc = (destructor)Store_dealloc,
    .tp_members = Store_members,
    .tp_methods = Store_methods,
    .tp_as_sequence = &Store_as_sequence,
    .tp_as_mapping = &Store_as_mapping,
    .tp_new = PyType_GenericNew,
    .tp_free = PyObject_GC_Del,
};

static PyTypeObject KeySet_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvstore._speedups.KeySetBase",
    .tp_basicsize = sizeof(KeyedObject),
    .tp_flags = BASE_FLAGS,
    .tp_doc = "KeySet's single-key paths.",
    .tp_traverse = (traverseproc)Keyed_traverse,
    .tp_clear = (inquiry)Keyed_clear,
    .tp_dealloc = (destructor)Keyed_dealloc,
    .tp_members = Keyed_members,
    .tp_methods = KeySet_methods,
    .tp_as_sequence = &Keyed_as_sequence,
    .tp_new = PyType_GenericNew,
    .tp_free = PyObject_GC_Del,
};

static PyTypeObject KeyIntMap_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvstore._speedups.KeyIntMapBase",
    .tp_basicsize = sizeof(KeyedObject),
    .tp_flags = BASE_FLAGS,
    .tp_doc = "KeyIntMap's single-key paths.",
    .tp_traverse = (traverseproc)Keyed_traverse,
    .tp_clear = (inquiry)Keyed_clear,
    .tp_dealloc = (destructor)Keyed_dealloc,
    .tp_members = Keyed_members,
    .tp_methods = KeyIntMap_methods,
    .tp_as_sequence = &Keyed_as_sequence,
    .tp_as_mapping = &KeyIntMap_as_mapping,
    .tp_new = PyType_GenericNew,
    .tp_free = PyObject_GC_Del,
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT, "kvstore._speedups",
    "C twins of kvstore._fallback; see kvstore._backend.", -1, module_methods};

/* Add a new reference as a module attribute, consuming it (NULL: the error is set). */
static int
add_new(PyObject *m, const char *name, PyObject *obj)
{
    int r = obj ? PyModule_AddObjectRef(m, name, obj) : -1;
    Py_XDECREF(obj);
    return r;
}

static int
intern(PyObject **slot, const char *s)
{
    *slot = PyUnicode_InternFromString(s);
    return *slot ? 0 : -1;
}

PyMODINIT_FUNC
PyInit__speedups(void)
{
    struct {
        PyObject **slot;
        const char *s;
    } names[] = {
        {&str_acquire, "acquire"},       {&str_release, "release"},
        {&str_rebuild, "_rebuild"},      {&str_random_live_key, "_random_live_key"},
        {&str_rng, "_rng"},              {&str_getrandbits, "getrandbits"},
        {&str_index, "index"},           {&str_wbuf, "wbuf"},
        {&str_kbuf, "kbuf"},             {&str_files, "files"},
        {&str_mm, "mm"},                 {&str_live_m, "_live"},
        {&str_writable, "_writable"},    {&str_check_value, "_check_value"},
        {&str_read, "_read"},            {&str_flush_locked, "_flush_locked"},
        {&str_get, "get"},               {&str_set, "set"},
        {&str_delete, "delete"},         {&str_keyed, "keyed"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (intern(names[i].slot, names[i].s) < 0)
            return NULL;
    crc_init();
    PyObject *fallback = PyImport_ImportModule("kvstore._fallback");
    if (fallback == NULL)
        return NULL;
    check_key_fn = PyObject_GetAttrString(fallback, "check_key");
    Py_DECREF(fallback);
    if (check_key_fn == NULL)
        return NULL;

    PyObject *m = PyModule_Create(&speedups_module);
    if (m == NULL)
        return NULL;
    struct {
        PyTypeObject *type;
        const char *name;
    } types[] = {
        {&Segment_Type, "SegmentBase"}, {&Index_Type, "IndexBase"}, {&Store_Type, "StoreBase"},
        {&KeySet_Type, "KeySetBase"},   {&KeyIntMap_Type, "KeyIntMapBase"},
        {&Lock_Type, "Lock"},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (PyType_Ready(types[i].type) < 0 ||
            PyModule_AddObjectRef(m, types[i].name, (PyObject *)types[i].type) < 0)
            goto fail;
    }
    if (PyModule_AddIntConstant(m, "API_VERSION", API_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "KEY_SIZE", KEY_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "NUM_SEGMENTS", NUM_SEGMENTS) < 0 ||
        PyModule_AddIntConstant(m, "MIN_SEGMENT_CAPACITY", MIN_SEGMENT_CAPACITY) < 0 ||
        add_new(m, "MAX_LOAD", PyFloat_FromDouble(MAX_LOAD)) < 0 ||
        add_new(m, "MIN_LOAD", PyFloat_FromDouble(MIN_LOAD)) < 0 ||
        add_new(m, "REMAP_SLACK", PyLong_FromLongLong(REMAP_SLACK)) < 0 ||
        add_new(m, "MULT64", PyLong_FromUnsignedLongLong(MULT64)) < 0 ||
        add_new(m, "MULT128", PyLong_FromString("9E3779B97F4A7C15F39CC0605CEDC835", NULL, 16)) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
