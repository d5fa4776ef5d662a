/* The tape's two hot loops, compiled: the keyed permutation's network and cycle walk
   (tokentape._src.tape.permutation), and the blend's split of scattered positions into
   (source, pass, offset) (tokentape._src.tape.blend and resolve).

   The same arithmetic as the numpy paths, bit for bit: a balanced Feistel network on
   [0, 4**h), ROUNDS rounds, its round function a splitmix64 (64-bit words) or murmur3 fmix32
   (32-bit words, h <= 16) finaliser of half + key without its last xor-shift, keeping the top h
   bits; cycle walking until the value is below n. Unsigned arithmetic wraps in C exactly as
   numpy's uint32/uint64 does, so both paths give identical results (the tests compare them on
   random domains, values and tapes). Python falls back to numpy where this does not build.

   walk(values, group, keys, halves, bounds, rounds, forward): every value is replaced in place
   by its image (or preimage) under the permutation of its domain. split(...): see its comment.
   Buffers are read through the buffer protocol (no numpy headers): 8-byte integers (the blend
   table may be 2-byte), C-contiguous. Nothing is trusted: sizes, domain indices, widths, table
   slots and the values themselves (a value at or above its domain's n could walk forever) are
   checked, and a bad one raises ValueError. The loops run without the GIL. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define NARROW_HALF_BITS 16

static inline uint32_t
round32(uint32_t half, uint32_t key, unsigned out_shift)
{
    uint32_t z = half + key;
    z ^= z >> 16;
    z *= 0x85EBCA6Bu;
    z ^= z >> 13;
    z *= 0xC2B2AE35u;
    return z >> out_shift;
}

static inline uint64_t
round64(uint64_t half, uint64_t key, unsigned out_shift)
{
    uint64_t z = half + key;
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBull;
    return z >> out_shift;
}

/* Where the compiler can, the round loops below are built for several instruction sets and
   the best one the processor has is picked when the module loads (GCC's target_clones);
   elsewhere they are built once, for the baseline. The arithmetic is the same in every build. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

/* Every round over a block of m values (halves in a and b), on 32-bit words. */
CLONES static void
rounds32(uint32_t *restrict a, uint32_t *restrict b, int m, const uint64_t *k, int rounds,
         unsigned out_shift, int forward)
{
    /* Forward, (L, R) -> (R, L ^ F(R)): with L in a and R in b, a ^= F(b) makes a the new R
       and b the new L, so the arrays swap roles each round. Backwards, (L, R) -> (R ^ F(L), L):
       b ^= F(a), and the same swap. */
    for (int r = 0; r < rounds; r++) {
        uint32_t key = (uint32_t)k[forward ? r : rounds - 1 - r];
        uint32_t *dst = (r % 2 == 0) == (forward != 0) ? a : b;
        const uint32_t *src = dst == a ? b : a;
        for (int t = 0; t < m; t++)
            dst[t] ^= round32(src[t], key, out_shift);
    }
}

CLONES static void
rounds64(uint64_t *restrict a, uint64_t *restrict b, int m, const uint64_t *k, int rounds,
         unsigned out_shift, int forward)
{
    for (int r = 0; r < rounds; r++) {
        uint64_t key = k[forward ? r : rounds - 1 - r];
        uint64_t *dst = (r % 2 == 0) == (forward != 0) ? a : b;
        const uint64_t *src = dst == a ? b : a;
        for (int t = 0; t < m; t++)
            dst[t] ^= round64(src[t], key, out_shift);
    }
}

#define BLOCK 512

/* One pass of the network (or its inverse) over m <= BLOCK values of one domain, in place. */
static void
pass_block(uint64_t *x, int m, const uint64_t *k, int rounds, unsigned h, int forward)
{
    if (h <= NARROW_HALF_BITS) {
        uint32_t a[BLOCK], b[BLOCK], low = (uint32_t)((1u << h) - 1u);
        for (int t = 0; t < m; t++) {
            a[t] = (uint32_t)(x[t] >> h);
            b[t] = (uint32_t)x[t] & low;
        }
        rounds32(a, b, m, k, rounds, 32u - h, forward);
        /* After an even number of rounds a holds L again; after an odd one, b does. */
        const uint32_t *left = rounds % 2 == 0 ? a : b, *right = left == a ? b : a;
        for (int t = 0; t < m; t++)
            x[t] = ((uint64_t)left[t] << h) | right[t];
    } else {
        uint64_t a[BLOCK], b[BLOCK], low = (1ull << h) - 1ull;
        for (int t = 0; t < m; t++) {
            a[t] = x[t] >> h;
            b[t] = x[t] & low;
        }
        rounds64(a, b, m, k, rounds, 64u - h, forward);
        const uint64_t *left = rounds % 2 == 0 ? a : b, *right = left == a ? b : a;
        for (int t = 0; t < m; t++)
            x[t] = (left[t] << h) | right[t];
    }
}

/* One round over lanes of different domains: dst[t] ^= F(src[t], key[t]), each lane with its
   own key and shift. */
CLONES static void
lanes_round32(uint32_t *restrict dst, const uint32_t *restrict src, const uint32_t *restrict key,
              const uint32_t *restrict shift, int m)
{
    for (int t = 0; t < m; t++)
        dst[t] ^= round32(src[t], key[t], shift[t]);
}

CLONES static void
lanes_round64(uint64_t *restrict dst, const uint64_t *restrict src, const uint64_t *restrict key,
              const uint64_t *restrict shift, int m)
{
    for (int t = 0; t < m; t++)
        dst[t] ^= round64(src[t], key[t], (unsigned)shift[t]);
}

/* One pass over the values x[lane[t]], t < m, each of domain dom[lane[t]], all on 32-bit words
   (wide = 0) or all on 64-bit words (wide = 1). */
static void
pass_lanes(uint64_t *x, const int64_t *dom, const int *lane, int m, const uint64_t *keys,
           int rounds, const int64_t *h_of, int forward, int wide)
{
    uint64_t a[BLOCK], b[BLOCK], key[BLOCK], shift[BLOCK];
    uint32_t a32[BLOCK], b32[BLOCK], key32[BLOCK], shift32[BLOCK];
    unsigned bits = wide ? 64u : 32u;
    for (int t = 0; t < m; t++) {
        int i = lane[t];
        unsigned h = (unsigned)h_of[dom[i]];
        uint64_t left = x[i] >> h, right = x[i] & ((1ull << h) - 1ull);
        if (wide) {
            a[t] = left, b[t] = right, shift[t] = bits - h;
        } else {
            a32[t] = (uint32_t)left, b32[t] = (uint32_t)right, shift32[t] = bits - h;
        }
    }
    for (int r = 0; r < rounds; r++) {
        int rr = forward ? r : rounds - 1 - r, to_a = (r % 2 == 0) == (forward != 0);
        for (int t = 0; t < m; t++) {
            uint64_t k = keys[dom[lane[t]] * rounds + rr];
            if (wide)
                key[t] = k;
            else
                key32[t] = (uint32_t)k;
        }
        if (wide)
            lanes_round64(to_a ? a : b, to_a ? b : a, key, shift, m);
        else
            lanes_round32(to_a ? a32 : b32, to_a ? b32 : a32, key32, shift32, m);
    }
    int even = rounds % 2 == 0; /* as in pass_block: which array holds L at the end */
    for (int t = 0; t < m; t++) {
        unsigned h = (unsigned)h_of[dom[lane[t]]];
        uint64_t left, right;
        if (wide)
            left = even ? a[t] : b[t], right = even ? b[t] : a[t];
        else
            left = even ? a32[t] : b32[t], right = even ? b32[t] : a32[t];
        x[lane[t]] = (left << h) | right;
    }
}

#define SORTED_DOMAINS 256
#define ALONE 64
#define STRETCH 8192 /* values sorted by domain together */

/* One pass over x[t], t < m, value t of domain dom[t], each with its own key and width. */
static void
pass_mixed(uint64_t *x, const int64_t *dom, int m, const uint64_t *keys, int rounds,
           const int64_t *h_of, int forward)
{
    int narrow[BLOCK], wide[BLOCK], nn = 0, nw = 0;
    for (int t = 0; t < m; t++) {
        if (h_of[dom[t]] <= NARROW_HALF_BITS)
            narrow[nn++] = t;
        else
            wide[nw++] = t;
    }
    if (nn)
        pass_lanes(x, dom, narrow, nn, keys, rounds, h_of, forward, 0);
    if (nw)
        pass_lanes(x, dom, wide, nw, keys, rounds, h_of, forward, 1);
}

/* Cycle walking for the m <= BLOCK values of one domain in x: a pass over every value still
   outside [0, n), then again over those that stay outside; each is written to v[where[t]] once
   it lands. */
static void
walk_one(uint64_t *v, uint64_t *x, Py_ssize_t *where, int m, const uint64_t *k, int rounds,
         unsigned h, uint64_t n, int forward)
{
    while (m) {
        pass_block(x, m, k, rounds, h, forward);
        int keep = 0;
        for (int t = 0; t < m; t++) { /* no branch: a value still walking is overwritten */
            uint64_t y = x[t];
            Py_ssize_t at = where[t];
            v[at] = y;
            x[keep] = y;
            where[keep] = at;
            keep += y >= n;
        }
        m = keep;
    }
}

/* walk_one for values of several domains, value t of domain dom[t]. */
static void
walk_mixed(uint64_t *v, uint64_t *x, Py_ssize_t *where, int64_t *dom, int m,
           const uint64_t *keys, int rounds, const int64_t *h_of, const uint64_t *n_of,
           int forward)
{
    while (m) {
        pass_mixed(x, dom, m, keys, rounds, h_of, forward);
        int keep = 0;
        for (int t = 0; t < m; t++) {
            uint64_t y = x[t];
            Py_ssize_t at = where[t];
            int64_t d = dom[t];
            v[at] = y;
            x[keep] = y;
            where[keep] = at;
            dom[keep] = d;
            keep += y >= n_of[d];
        }
        m = keep;
    }
}

/* Working room for walk_values: a stretch of up to cap values, sorted by domain. */
typedef struct {
    Py_ssize_t cap;
    uint64_t *x, *xs;
    Py_ssize_t *where, *ws;
    int64_t *dom;
} Room;

static int
room_open(Room *room, Py_ssize_t cap)
{
    char *mem = PyMem_RawMalloc((size_t)cap * 5 * 8);
    if (!mem)
        return -1;
    room->cap = cap;
    room->x = (uint64_t *)mem;
    room->xs = room->x + cap;
    room->where = (Py_ssize_t *)(room->xs + cap);
    room->ws = room->where + cap;
    room->dom = (int64_t *)(room->ws + cap);
    return 0;
}

/* walk_one over m values of one domain (any m), BLOCK by BLOCK. */
static void
walk_run(uint64_t *v, uint64_t *x, Py_ssize_t *where, Py_ssize_t m, const uint64_t *k,
         int rounds, unsigned h, uint64_t n, int forward)
{
    for (Py_ssize_t b = 0; b < m; b += BLOCK)
        walk_one(v, x + b, where + b, m - b < BLOCK ? (int)(m - b) : BLOCK, k, rounds, h, n,
                 forward);
}

/* Cycle walking for v[i], i < count, value i of domain g[i] (every value of domain 0 when g is
   NULL; room is then unused). Every value must already lie below its domain's n.

   A stretch of values of one domain walks with that domain's key and width for all of them
   (the fastest rounds). A stretch of several is sorted by domain (a counting sort, where the
   domains are numbered below SORTED_DOMAINS): a domain with at least ALONE values there walks
   them on its own, the others walk together, each value with its own key and width. */
static void
walk_values(uint64_t *v, const int64_t *g, Py_ssize_t count, const uint64_t *keys, int rounds,
            const int64_t *h_of, const uint64_t *n_of, int forward, Room *room)
{
    if (!g) {
        uint64_t x[BLOCK];
        Py_ssize_t where[BLOCK];
        for (Py_ssize_t start = 0; start < count; start += BLOCK) {
            int m = count - start < BLOCK ? (int)(count - start) : BLOCK;
            for (int t = 0; t < m; t++) {
                where[t] = start + t;
                x[t] = v[start + t];
            }
            walk_one(v, x, where, m, keys, rounds, (unsigned)h_of[0], n_of[0], forward);
        }
        return;
    }
    uint64_t *x = room->x, *xs = room->xs;
    Py_ssize_t *where = room->where, *ws = room->ws;
    int64_t *dom = room->dom;
    for (Py_ssize_t start = 0; start < count; start += room->cap) {
        Py_ssize_t m = count - start < room->cap ? count - start : room->cap;
        int64_t first = g[start], top = 0;
        int same = 1;
        for (Py_ssize_t t = 0; t < m; t++) {
            where[t] = start + t;
            x[t] = v[start + t];
            dom[t] = g[start + t];
            same &= dom[t] == first;
            top = dom[t] > top ? dom[t] : top;
        }
        if (same) {
            walk_run(v, x, where, m, keys + first * rounds, rounds, (unsigned)h_of[first],
                     n_of[first], forward);
            continue;
        }
        if (top >= SORTED_DOMAINS) {
            for (Py_ssize_t b = 0; b < m; b += BLOCK)
                walk_mixed(v, x + b, where + b, dom + b, m - b < BLOCK ? (int)(m - b) : BLOCK,
                           keys, rounds, h_of, n_of, forward);
            continue;
        }
        Py_ssize_t next[SORTED_DOMAINS + 1] = {0};
        for (Py_ssize_t t = 0; t < m; t++)
            next[dom[t] + 1]++;
        for (int64_t e = 0; e < top; e++)
            next[e + 1] += next[e]; /* next[e]: where domain e's values start */
        for (Py_ssize_t t = 0; t < m; t++) {
            Py_ssize_t j = next[dom[t]]++;
            xs[j] = x[t];
            ws[j] = where[t];
        }
        Py_ssize_t rest = 0, begin = 0;
        for (int64_t e = 0; e <= top; e++) { /* next[e] is now where domain e's values end */
            Py_ssize_t len = next[e] - begin;
            if (len >= ALONE) {
                walk_run(v, xs + begin, ws + begin, len, keys + e * rounds, rounds,
                         (unsigned)h_of[e], n_of[e], forward);
            } else {
                for (Py_ssize_t t = begin; t < next[e]; t++, rest++) {
                    x[rest] = xs[t];
                    where[rest] = ws[t];
                    dom[rest] = e;
                }
            }
            begin = next[e];
        }
        for (Py_ssize_t b = 0; b < rest; b += BLOCK)
            walk_mixed(v, x + b, where + b, dom + b, rest - b < BLOCK ? (int)(rest - b) : BLOCK,
                       keys, rounds, h_of, n_of, forward);
    }
}

/* A buffer of 8-byte integers, C-contiguous (writable when asked). */
static int
get_words(PyObject *obj, Py_buffer *view, int writable, const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    if (view->itemsize != 8 || view->ndim > 1) {
        PyErr_Format(PyExc_ValueError, "walk: %s must be a flat array of 8-byte integers",
                     what);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Whether two buffers share memory: an output written while another array is read could
   change a width, a bound or a divisor under the loop. */
static int
overlaps(const Py_buffer *a, const Py_buffer *b)
{
    const char *a0 = a->buf, *b0 = b->buf;
    return a->len > 0 && b->len > 0 && a0 < b0 + b->len && b0 < a0 + a->len;
}

static PyObject *
walk(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *values_obj, *group_obj, *keys_obj, *halves_obj, *bounds_obj;
    int rounds, forward;
    if (!PyArg_ParseTuple(args, "OOOOOip", &values_obj, &group_obj, &keys_obj, &halves_obj,
                          &bounds_obj, &rounds, &forward))
        return NULL;
    if (rounds < 1) {
        PyErr_SetString(PyExc_ValueError, "walk: rounds must be at least 1");
        return NULL;
    }
    Py_buffer values, group, keys, halves, bounds;
    int have_group = group_obj != Py_None, ok = 0;
    if (get_words(values_obj, &values, 1, "values") < 0)
        return NULL;
    if (have_group && get_words(group_obj, &group, 0, "group") < 0)
        goto release_values;
    if (get_words(keys_obj, &keys, 0, "keys") < 0)
        goto release_group;
    if (get_words(halves_obj, &halves, 0, "halves") < 0)
        goto release_keys;
    if (get_words(bounds_obj, &bounds, 0, "bounds") < 0)
        goto release_halves;

    Py_ssize_t count = values.len / 8, domains = halves.len / 8;
    const int64_t *h_of = (const int64_t *)halves.buf;
    const uint64_t *n_of = (const uint64_t *)bounds.buf;
    if (domains < 1 || bounds.len / 8 != domains || keys.len / 8 / rounds != domains ||
        keys.len / 8 % rounds != 0 || (have_group && group.len / 8 != count)) {
        PyErr_SetString(PyExc_ValueError,
                        "walk: sizes disagree (keys: domains x rounds; group: one per value)");
        goto release_all;
    }
    if (overlaps(&values, &keys) || overlaps(&values, &halves) || overlaps(&values, &bounds) ||
        (have_group && overlaps(&values, &group))) {
        PyErr_SetString(PyExc_ValueError, "walk: values must not share memory with the tables");
        goto release_all;
    }
    for (Py_ssize_t d = 0; d < domains; d++) {
        /* n must be in [1, 4**h] and h the smallest width for it: no walk can go forever. */
        int64_t h = h_of[d];
        uint64_t n = n_of[d];
        int fits = h >= 1 && h <= 32 && n >= 1 && (h == 32 || n <= (1ull << (2 * h))) &&
                   (h == 1 || n > (1ull << (2 * (h - 1))));
        if (!fits) {
            PyErr_Format(PyExc_ValueError,
                         "walk: domain %zd: half width %lld does not fit n = %llu", d,
                         (long long)h, (unsigned long long)n);
            goto release_all;
        }
    }

    uint64_t *v = (uint64_t *)values.buf;
    const int64_t *g = have_group ? (const int64_t *)group.buf : NULL;
    const uint64_t *k = (const uint64_t *)keys.buf;
    Py_ssize_t bad = -1;
    Room room = {0, NULL, NULL, NULL, NULL, NULL};
    int nomem = g && room_open(&room, count < STRETCH ? count : STRETCH) < 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) { /* a value at or above n could walk forever */
        int64_t d = g ? g[i] : 0;
        if (d < 0 || d >= domains || v[i] >= n_of[d]) {
            bad = i;
            break;
        }
    }
    if (bad < 0 && !nomem)
        walk_values(v, g, count, k, rounds, h_of, n_of, forward, &room);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(room.x);
    if (nomem) {
        PyErr_NoMemory();
        goto release_all;
    }
    if (bad >= 0) {
        int64_t d = g ? g[bad] : 0;
        if (d < 0 || d >= domains)
            PyErr_Format(PyExc_ValueError, "walk: value %zd names domain %lld of %zd", bad,
                         (long long)d, domains);
        else
            PyErr_Format(PyExc_ValueError, "walk: value %zd is %llu, outside [0, %llu)", bad,
                         (unsigned long long)v[bad], (unsigned long long)n_of[d]);
        goto release_all;
    }
    ok = 1;

release_all:
    PyBuffer_Release(&bounds);
release_halves:
    PyBuffer_Release(&halves);
release_keys:
    PyBuffer_Release(&keys);
release_group:
    if (have_group)
        PyBuffer_Release(&group);
release_values:
    PyBuffer_Release(&values);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* split(positions, table, rank, weights, n, source, epoch, offset, first, last): the blend
   and the passes of a scattered batch in one loop, as blend.source_and_draw and a divmod by each
   source's n do in numpy. Position p sits at slot r = p mod D of the period (D = len(table)),
   source s = table[r], draw q * weights[s] + rank[r] with q = p div D; the draw's pass is
   draw div n[s] and its offset draw mod n[s]. first[s] and last[s] receive the first and last
   pass of source s met (INT64_MAX and -1 for a source not met). The table may hold 2-, 4- or
   8-byte integers; everything else is 8-byte. */
static PyObject *
split(PyObject *self, PyObject *args)
{
    (void)self;
    enum { POSITIONS, TABLE, RANK, WEIGHTS, N, SOURCE, EPOCH, OFFSET, FIRST, LAST, ARGS };
    PyObject *obj[ARGS];
    if (!PyArg_ParseTuple(args, "OOOOOOOOOO", &obj[0], &obj[1], &obj[2], &obj[3], &obj[4],
                          &obj[5], &obj[6], &obj[7], &obj[8], &obj[9]))
        return NULL;
    static const char *what[ARGS] = {"positions", "table", "rank",   "weights", "n",
                                     "source",    "epoch", "offset", "first",   "last"};
    Py_buffer view[ARGS];
    int got = 0, ok = 0;
    for (; got < ARGS; got++) {
        int out = got >= SOURCE;
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (out ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(obj[got], &view[got], flags) < 0)
            goto release;
        Py_ssize_t size = view[got].itemsize;
        int fits = size == 8 || (got == TABLE && (size == 2 || size == 4));
        if (view[got].ndim > 1 || !fits) {
            PyErr_Format(PyExc_ValueError, "split: %s must be a flat array of %s integers",
                         what[got], got == TABLE ? "2-, 4- or 8-byte" : "8-byte");
            got++;
            goto release;
        }
    }
    Py_ssize_t count = view[POSITIONS].len / 8;
    Py_ssize_t period = view[TABLE].len / view[TABLE].itemsize, sources = view[WEIGHTS].len / 8;
    if (period < 1 || view[RANK].len / 8 != period || sources < 1 ||
        view[N].len / 8 != sources || view[FIRST].len / 8 != sources ||
        view[LAST].len / 8 != sources || view[SOURCE].len / 8 != count ||
        view[EPOCH].len / 8 != count || view[OFFSET].len / 8 != count) {
        PyErr_SetString(PyExc_ValueError,
                        "split: sizes disagree (rank: one per slot; n, first, last: one per "
                        "source; outputs: one per position)");
        goto release;
    }
    for (int out = SOURCE; out < ARGS; out++) {
        for (int other = 0; other < ARGS; other++) {
            if (other != out && overlaps(&view[out], &view[other])) {
                PyErr_Format(PyExc_ValueError, "split: %s must not share memory with %s",
                             what[out], what[other]);
                goto release;
            }
        }
    }
    const int64_t *p = view[POSITIONS].buf, *rank = view[RANK].buf, *w = view[WEIGHTS].buf;
    const int64_t *n = view[N].buf;
    Py_ssize_t width = view[TABLE].itemsize;
    const void *table = view[TABLE].buf;
    int64_t *source = view[SOURCE].buf, *epoch = view[EPOCH].buf, *offset = view[OFFSET].buf;
    int64_t *first = view[FIRST].buf, *last = view[LAST].buf;
    for (Py_ssize_t d = 0; d < sources; d++) {
        if (n[d] < 1 || w[d] < 1 || w[d] > period) {
            PyErr_Format(PyExc_ValueError, "split: source %zd: n and weight must be >= 1", d);
            goto release;
        }
        first[d] = INT64_MAX;
        last[d] = -1;
    }
    Py_ssize_t bad = -1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t at = p[i];
        if (at < 0 || at >= ((int64_t)1 << 62)) {
            bad = i;
            break;
        }
        int64_t q = at / period, r = at % period;
        int64_t s = width == 2   ? ((const int16_t *)table)[r]
                    : width == 4 ? ((const int32_t *)table)[r]
                                 : ((const int64_t *)table)[r];
        if (s < 0 || s >= sources || rank[r] < 0 || rank[r] >= w[s]) {
            bad = i;
            break;
        }
        int64_t draw = q * w[s] + rank[r], e = draw / n[s];
        source[i] = s;
        epoch[i] = e;
        offset[i] = draw - e * n[s];
        first[s] = e < first[s] ? e : first[s];
        last[s] = e > last[s] ? e : last[s];
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError,
                     "split: position %zd (%lld) is outside [0, 2**62) or meets a bad table slot",
                     bad, (long long)p[bad]);
        goto release;
    }
    ok = 1;
release:
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&view[i]);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS,
     "walk(values, group, keys, halves, bounds, rounds, forward): each value (int64, in place) "
     "through its domain's permutation, or its inverse."},
    {"split", split, METH_VARARGS,
     "split(positions, table, rank, weights, n, source, epoch, offset, first, last): the "
     "blend's source and each draw's pass and offset, for scattered positions."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cwalk",
    "The keyed permutation's Feistel network and cycle walk, compiled (see permutation.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

/* The interface's version: permutation.py uses this module only when it carries the number
   it expects, so a stale build (an editable install not rebuilt after a pull) falls back to
   numpy instead of failing. Bump it with any change to the functions' arguments or results. */
#define ABI 2

PyMODINIT_FUNC
PyInit__cwalk(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "ABI", ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
