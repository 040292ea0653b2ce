/*
 * Compiled fast path of the STRACE log reader (dsprof.analysis.ingest.strace_log).
 *
 * A Scanner is built once from the format's vocabulary (marker, version, the
 * required fields and their kinds, the promoted attribute names: Python passes
 * them from profiler/strace_format.py and analysis/spans.py, so no name of the
 * format is written here). Scanner.scan(piece, line_base, threads) reads one
 * piece of a log (whole lines) and returns span columns as buffers that Arrow
 * wraps without copying.
 *
 * What it reads itself: lines whose STRACE records all follow the plain
 * grammar of one version, one or more per line, with or without a log prefix,
 * percent-escapes included. Everything else -- a torn or garbled record, a
 * record the next line may continue, a marker cut by a newline, another
 * version, a value that would be dropped, control bytes or invalid UTF-8 on a
 * record line, clock anchors and chip_process lines -- is left to the Python
 * reader, which defines the result: such a line opens an "island" that runs to
 * the next line starting with '[' (no record can reach across such a line, see
 * strace_log._chunks), and the islands of a piece are returned as one text,
 * each separated from the next by a line "[]" that can neither continue nor
 * complete anything, with the log line number of each of its lines.
 *
 * How: a line is found with memchr and looked over in 16-byte blocks (SSE2,
 * or a portable loop) for '[', control and non-ASCII bytes; a record line gets
 * a bitmap of where its tokens end, and each record is read field by field
 * into the row columns at once (a line that turns out unusual is undone). The
 * piece is shared out to threads at lines starting with '['; the scan runs
 * without the GIL, each thread into its own columns, whose memory goes back to
 * a pool when Arrow is done with it.
 *
 * Parsing untrusted input: every read stays within the piece (blocks and
 * words near its end are copied out first) and every record field within its
 * line; lines are at most strace_log.MAX_LINE_BYTES long. The build with
 * AddressSanitizer and UndefinedBehaviorSanitizer in tests/test_ingest_fast.py
 * runs a corpus of damaged logs through it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#ifdef __GLIBC__
#include <malloc.h>
#endif

#define MAX_FIELDS 16
#define MAX_INT_KEYS 32
#define MAX_TEXT_KEYS 16
#define MAX_THREADS 16
#define KEY_TABLE 128
#define MAX_PIECE_BYTES ((size_t)1 << 30)
/* the bound on span times, analysis/spans.py MAX_TIME_NS: rows past it are left to the Python reader, which drops and counts them */
#define MAX_TIME_NS ((int64_t)1 << 62)

/* ------------------------------------------------------------------ memory */

/*
 * Blocks kept for the next scans: a piece's columns take about as much as the
 * last piece's, and reusing their pages spares faulting in and zeroing fresh
 * ones. A block goes back when Arrow lets go of the column (Buf). Thread-safe;
 * bounded; only where the C library tells a block's size (glibc).
 */
#define POOL_BLOCKS 512
#define POOL_BYTES ((size_t)128 << 20)

typedef struct {
    pthread_mutex_t lock;
    int n;
    size_t bytes;
    void *block[POOL_BLOCKS];
    size_t size[POOL_BLOCKS];
} Pool;

static void *pool_alloc(Pool *pool, size_t want)
{
    if (pool) {
        pthread_mutex_lock(&pool->lock);
        int best = -1;
        for (int i = 0; i < pool->n; i++)
            if (pool->size[i] >= want && (best < 0 || pool->size[i] < pool->size[best]))
                best = i;
        if (best >= 0) {
            void *block = pool->block[best];
            pool->bytes -= pool->size[best];
            pool->n--;
            pool->block[best] = pool->block[pool->n];
            pool->size[best] = pool->size[pool->n];
            pthread_mutex_unlock(&pool->lock);
            return block;
        }
        pthread_mutex_unlock(&pool->lock);
    }
    return malloc(want ? want : 1);
}

static void pool_free(Pool *pool, void *data)
{
#ifdef __GLIBC__
    if (pool && data) {
        size_t size = malloc_usable_size(data);
        pthread_mutex_lock(&pool->lock);
        if (pool->n < POOL_BLOCKS && pool->bytes + size <= POOL_BYTES) {
            pool->block[pool->n] = data;
            pool->size[pool->n++] = size;
            pool->bytes += size;
            pthread_mutex_unlock(&pool->lock);
            return;
        }
        pthread_mutex_unlock(&pool->lock);
    }
#else
    (void)pool;
#endif
    free(data);
}

static void *pool_realloc(Pool *pool, void *data, size_t want) { return data ? realloc(data, want) : pool_alloc(pool, want); }

static void pool_clear(Pool *pool)
{
    for (int i = 0; i < pool->n; i++)
        free(pool->block[i]);
    pool->n = 0;
    pool->bytes = 0;
}

/* ------------------------------------------------------------------ growable buffers */

typedef struct {
    char *data;
    size_t len, cap;
    Pool *pool; /* where its first block comes from (NULL: malloc) */
} Vec;

static int vec_grow(Vec *v, size_t extra)
{
    size_t cap = v->cap ? v->cap : 4096;
    while (cap < v->len + extra)
        cap *= 2;
    char *data = pool_realloc(v->pool, v->data, cap);
    if (!data)
        return -1;
    v->data = data;
    v->cap = cap;
    return 0;
}

static inline int vec_reserve(Vec *v, size_t extra) { return v->len + extra <= v->cap ? 0 : vec_grow(v, extra); }

static inline int vec_append(Vec *v, const void *src, size_t n)
{
    if (vec_reserve(v, n))
        return -1;
    if (n)
        memcpy(v->data + v->len, src, n);
    v->len += n;
    return 0;
}

/*
 * vec_append for text, which is mostly short: up to 16 bytes are copied as one
 * fixed-size block when both ends have room for it (src_end: how far src may be read).
 */
static inline int vec_append_text(Vec *v, const uint8_t *src, size_t n, const uint8_t *src_end)
{
    if (vec_reserve(v, n + 16))
        return -1;
    if (n <= 16 && src_end - src >= 16)
        memcpy(v->data + v->len, src, 16);
    else if (n)
        memcpy(v->data + v->len, src, n);
    v->len += n;
    return 0;
}

/* ------------------------------------------------------------------ configuration */

typedef enum { K_VERSION, K_I64, K_N64, K_U64, K_TOKEN, K_TOKEN0 } Kind;

typedef struct {
    const char *s;
    size_t n;
} Str;

typedef struct {
    char *storage; /* every string below points into it */
    Str marker;
    Str side[4];
    int n_side;
    int n_fields;
    Str field_lit[MAX_FIELDS]; /* " <name>=" */
    Kind kind[MAX_FIELDS];
    int column[MAX_FIELDS]; /* index among the numeric or the text outputs; -1 for the version */
    int n_numeric, n_text;
    Str version;
    int ts_field, dur_field;
    Str clk_attr, clk_dev, clk_host;
    Str int_keys[MAX_INT_KEYS];
    int n_int;
    Str text_keys[MAX_TEXT_KEYS];
    int n_textkeys;
    /* literals of up to 8 bytes are compared as one masked word */
    uint64_t field_word[MAX_FIELDS], field_mask[MAX_FIELDS], version_word, version_mask;
    uint64_t marker_word, marker_mask, side_word[4], side_mask[4]; /* their first 8 bytes */
    /* key -> slot: the integer keys, then the text keys, then clk; open addressing on (length, first 8 bytes) */
    Str slot_key[MAX_INT_KEYS + MAX_TEXT_KEYS + 1];
    uint64_t slot_head[MAX_INT_KEYS + MAX_TEXT_KEYS + 1];
    int8_t key_table[KEY_TABLE];
    int clk_slot;
} Config;

/* ------------------------------------------------------------------ one part of a piece */

typedef struct {
    int64_t first_line, end_line; /* part-local line indices, end exclusive */
    size_t b0, b1;
} Island;

typedef struct {
    const Config *cfg;
    Pool *pool; /* of the row columns */
    const uint8_t *buf;
    size_t start, end, piece_len;
    /* rows */
    size_t rows, rows_cap;
    int64_t *line;
    int64_t *num[MAX_FIELDS];
    int32_t *text_off[MAX_FIELDS];
    Vec text_data[MAX_FIELDS];
    int32_t *clk_off;
    Vec clk_data;
    int64_t *iattr[MAX_INT_KEYS];
    uint8_t *iattr_valid[MAX_INT_KEYS];
    int32_t *tattr_off[MAX_TEXT_KEYS];
    Vec tattr_data[MAX_TEXT_KEYS];
    uint8_t *tattr_valid[MAX_TEXT_KEYS];
    int32_t *map_off;
    size_t pairs, pairs_cap;
    int32_t *key_off, *val_off;
    Vec key_data, val_data;
    /* everything else */
    Vec islands; /* Island[] */
    int64_t n_lines;
    int64_t nul_line, invalid_line, fffd_line; /* part-local, -1: none */
    int failed;
    /* scratch of one line */
    Vec markers; /* size_t[] positions of the markers */
    Vec maps;    /* uint64_t[]: see Maps */
    Vec scratch; /* decoded text */
} Part;

/* ------------------------------------------------------------------ bytes */

/* Short literal comparison, inlined (the literals are a few bytes long). */
static inline int same_bytes(const uint8_t *a, const char *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] != (uint8_t)b[i])
            return 0;
    return 1;
}

static inline int starts_with(const uint8_t *p, const uint8_t *e, Str lit)
{
    return (size_t)(e - p) >= lit.n && same_bytes(p, lit.s, lit.n);
}

static inline uint64_t load64(const uint8_t *p)
{
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}


/* Up to 8 bytes as a zero-padded word (reading no further than n bytes). */
static inline uint64_t head_of(const uint8_t *s, size_t n)
{
    if (n >= 8)
        return load64(s);
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++)
        w |= (uint64_t)s[i] << (8 * i);
    return w;
}

static inline uint64_t head_mask(size_t n) { return n >= 8 ? ~0ULL : (1ULL << (8 * n)) - 1; }

/* Length of the valid UTF-8 sequence at p (strict: no overlongs, surrogates or > U+10FFFF), 0 if invalid. */
static size_t utf8_len(const uint8_t *p, const uint8_t *e)
{
    uint8_t c = p[0];
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return (e - p >= 2 && (p[1] & 0xC0) == 0x80) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (e - p < 3 || (p[2] & 0xC0) != 0x80)
            return 0;
        uint8_t lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        return (p[1] >= lo && p[1] <= hi) ? 3 : 0;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (e - p < 4 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80)
            return 0;
        uint8_t lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        return (p[1] >= lo && p[1] <= hi) ? 4 : 0;
    }
    return 0;
}

static int valid_utf8(const uint8_t *p, const uint8_t *e)
{
    while (p < e) {
        size_t n = utf8_len(p, e);
        if (!n)
            return 0;
        p += n;
    }
    return 1;
}

typedef struct {
    int ctrl, nul, invalid, fffd;
} ByteFlags;

/*
 * 16-byte blocks as bit masks (bit i: byte i). `special`: the bytes a line scan
 * must look at ('[', control bytes, bytes >= 0x80); `stops`: the bytes that
 * end a token (space, control bytes, '[', ']', '=') and, in *percent, the '%'.
 * SSE2 where the compiler has it, a portable loop elsewhere. The token
 * separators are copies of strace_format.TOKEN_SEPARATORS, and '[' opens every
 * marker: tests/test_strace_vocabulary.py::test_the_compiled_scanner_keeps_the_format_grammar
 * checks both versions against profiler/strace_format.py.
 */
#ifdef __SSE2__
static inline uint32_t special_bytes(const uint8_t *p)
{
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m128i ctrl = _mm_cmpeq_epi8(_mm_max_epu8(v, _mm_set1_epi8(0x1F)), _mm_set1_epi8(0x1F));
    return (uint32_t)_mm_movemask_epi8(_mm_or_si128(_mm_or_si128(ctrl, v), _mm_cmpeq_epi8(v, _mm_set1_epi8('['))));
}

static inline uint32_t stops(const uint8_t *p, uint32_t *percent)
{
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m128i stop = _mm_cmpeq_epi8(_mm_max_epu8(v, _mm_set1_epi8(0x20)), _mm_set1_epi8(0x20));
    stop = _mm_or_si128(stop, _mm_cmpeq_epi8(v, _mm_set1_epi8('[')));
    stop = _mm_or_si128(stop, _mm_cmpeq_epi8(v, _mm_set1_epi8(']')));
    stop = _mm_or_si128(stop, _mm_cmpeq_epi8(v, _mm_set1_epi8('=')));
    *percent = (uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8('%')));
    return (uint32_t)_mm_movemask_epi8(stop);
}
#else
static inline uint32_t special_bytes(const uint8_t *p)
{
    uint32_t m = 0;
    for (int i = 0; i < 16; i++)
        m |= (uint32_t)(p[i] < 0x20 || p[i] >= 0x80 || p[i] == '[') << i;
    return m;
}

static inline uint32_t stops(const uint8_t *p, uint32_t *percent)
{
    uint32_t stop = 0, pct = 0;
    for (int i = 0; i < 16; i++) {
        stop |= (uint32_t)(p[i] <= 0x20 || p[i] == '[' || p[i] == ']' || p[i] == '=') << i;
        pct |= (uint32_t)(p[i] == '%') << i;
    }
    *percent = pct;
    return stop;
}
#endif

/* A block of the piece at q: 16 bytes, or fewer at its end (copied, the rest zero: the caller masks them off). */
static inline const uint8_t *block_at(const uint8_t *b, size_t q, size_t piece_len, uint8_t tail[16])
{
    if (piece_len - q >= 16)
        return b + q;
    memset(tail, 0, 16);
    memcpy(tail, b + q, piece_len - q);
    return tail;
}

typedef struct {
    size_t le, ce; /* end of the line (after its '\n') and of its content */
    int newline;   /* the line ends with '\n' */
    int side;      /* it names a clock anchor or chip_process marker */
    ByteFlags f;
} Line;

/* A '[' at `at`: a STRACE marker (its position goes to P->markers), a side marker, or neither. */
static inline int at_bracket(Part *P, size_t at, const uint8_t *end, Line *L)
{
    const Config *C = P->cfg;
    const uint8_t *q = P->buf + at;
    uint64_t head = end - q >= 8 ? load64(q) : head_of(q, (size_t)(end - q));
    if ((head & C->marker_mask) == C->marker_word && starts_with(q, end, C->marker))
        return vec_append(&P->markers, &at, sizeof at);
    for (int i = 0; i < C->n_side; i++)
        L->side |= (head & C->side_mask[i]) == C->side_word[i] && starts_with(q, end, C->side[i]);
    return 0;
}

/*
 * Read the line starting at pos: where it ends, the STRACE markers in it (into
 * P->markers), whether it names a side marker, and what its bytes hold
 * (control bytes but a '\r' ending it, NUL, invalid UTF-8, U+FFFD). Blocks
 * without such bytes are passed over at once. Returns -1 when memory runs out.
 */
static int read_line(Part *P, size_t pos, Line *L)
{
    const uint8_t *b = P->buf;
    P->markers.len = 0;
    memset(L, 0, sizeof *L);
    const uint8_t *nl = memchr(b + pos, '\n', P->piece_len - pos);
    L->newline = nl != NULL;
    L->ce = nl ? (size_t)(nl - b) : P->piece_len;
    L->le = L->ce + L->newline;
    const uint8_t *ce = b + L->ce;
    size_t ctrl_count = 0, last_ctrl = 0, utf8_from = pos;
    uint8_t tail[16];
    for (size_t q = pos; q < L->ce; q += 16) {
        uint32_t bits = special_bytes(block_at(b, q, P->piece_len, tail));
        if (L->ce - q < 16)
            bits &= (1u << (L->ce - q)) - 1;
        for (; bits; bits &= bits - 1) {
            size_t at = q + (size_t)__builtin_ctz(bits);
            uint8_t c = b[at];
            if (c == '[') {
                if (at_bracket(P, at, ce, L))
                    return -1;
            } else if (c < 0x20) {
                last_ctrl = at;
                L->f.nul |= c == 0;
                ctrl_count++;
            } else if (at >= utf8_from) {
                size_t n = utf8_len(b + at, ce);
                L->f.invalid |= n == 0;
                L->f.fffd |= n == 3 && c == 0xEF && b[at + 1] == 0xBF && b[at + 2] == 0xBD;
                utf8_from = at + (n ? n : 1);
            }
        }
    }
    L->f.ctrl = ctrl_count > 1 || (ctrl_count == 1 && !(last_ctrl + 1 == L->ce && b[last_ctrl] == '\r'));
    return 0;
}

/*
 * Where the tokens of a line's records end: bit i of stop[i / 64] is set when
 * byte base + i ends a token (and every bit from the end of the stretch on),
 * likewise pct for '%'. Built once per record line; fields are then found by
 * scanning bits rather than bytes.
 */
typedef struct {
    size_t base;
    const uint64_t *stop, *pct;
    int any_pct; /* most lines hold no '%' at all */
} Maps;

static int build_maps(Part *P, size_t base, size_t end, Maps *M)
{
    size_t words = (end - base) / 64 + 2;
    if (vec_reserve(&P->maps, 2 * words * sizeof(uint64_t)))
        return -1;
    uint64_t *stop = (uint64_t *)P->maps.data, *pct = stop + words, any_pct = 0;
    uint8_t tail[16];
    for (size_t w = 0; w < words; w++) {
        uint64_t s = 0, c = 0;
        for (int k = 0; k < 4; k++) {
            size_t q = base + w * 64 + (size_t)k * 16;
            if (q >= end) {
                s |= ~0ULL << (16 * k);
                break;
            }
            uint32_t here, bits = stops(block_at(P->buf, q, P->piece_len, tail), &here);
            if (end - q < 16) {
                bits |= ~((1u << (end - q)) - 1);
                here &= (1u << (end - q)) - 1;
            }
            s |= (uint64_t)(bits & 0xFFFF) << (16 * k);
            c |= (uint64_t)(here & 0xFFFF) << (16 * k);
        }
        stop[w] = s;
        pct[w] = c;
        any_pct |= c;
    }
    M->base = base;
    M->stop = stop;
    M->pct = pct;
    M->any_pct = any_pct != 0;
    return 0;
}

/* The first token end at or after pos (there is always one: the stretch's end). */
static inline size_t next_stop(const Maps *M, size_t pos)
{
    size_t off = pos - M->base, i = off >> 6;
    uint64_t w = M->stop[i] & (~0ULL << (off & 63));
    while (!w)
        w = M->stop[++i];
    return M->base + (i << 6) + (size_t)__builtin_ctzll(w);
}

/* Whether [a, b) holds a '%'. */
static inline int has_percent(const Maps *M, size_t a, size_t b)
{
    if (!M->any_pct || a == b)
        return 0;
    size_t i = (a - M->base) >> 6, j = (b - 1 - M->base) >> 6;
    uint64_t first = ~0ULL << ((a - M->base) & 63), last = ~0ULL >> (63 - ((b - 1 - M->base) & 63));
    if (i == j)
        return (M->pct[i] & first & last) != 0;
    if (M->pct[i] & first || M->pct[j] & last)
        return 1;
    for (size_t k = i + 1; k < j; k++)
        if (M->pct[k])
            return 1;
    return 0;
}

/* ------------------------------------------------------------------ percent-decoding */

static inline int hexval(uint8_t c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/*
 * Append the percent-decoding of [s, e) to out, as Python's urllib.parse.unquote
 * does it: each maximal ASCII run is unescaped to bytes and read as UTF-8, the
 * other characters are kept. Returns -1 when a run's bytes are not valid UTF-8
 * (unquote would put U+FFFD there: the Python reader handles such a line), -2
 * when memory runs out.
 */
static int decode_append(Vec *out, const uint8_t *s, const uint8_t *e)
{
    if (vec_reserve(out, e - s))
        return -2;
    uint8_t *o = (uint8_t *)out->data + out->len;
    uint8_t *run = o;
    int run_high = 0;
    while (s < e) {
        uint8_t c = *s;
        if (c >= 0x80) {
            if (run_high && !valid_utf8(run, o))
                return -1;
            while (s < e && *s >= 0x80)
                *o++ = *s++;
            run = o;
            run_high = 0;
            continue;
        }
        if (c == '%' && e - s >= 3) {
            int h = hexval(s[1]), l = hexval(s[2]);
            if (h >= 0 && l >= 0) {
                uint8_t byte = (uint8_t)(h * 16 + l);
                run_high |= byte >= 0x80;
                *o++ = byte;
                s += 3;
                continue;
            }
        }
        *o++ = c;
        s++;
    }
    if (run_high && !valid_utf8(run, o))
        return -1;
    out->len = (char *)o - out->data;
    return 0;
}

/* ------------------------------------------------------------------ numbers */

/* Whether the first n (1..8) bytes of a word are ASCII digits. */
static inline int word_is_digits(uint64_t w, size_t n)
{
    uint64_t t = (w & 0xF0F0F0F0F0F0F0F0ULL) | (((w + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) >> 4);
    return ((t ^ 0x3333333333333333ULL) & head_mask(n)) == 0; /* digits read 0x33 */
}

/* The value of the n (1..8) digits at the start of a word. */
static inline uint64_t word_value(uint64_t w, size_t n)
{
    uint64_t v = (w - 0x3030303030303030ULL) << (8 * (8 - n)); /* the digits, behind leading zeros */
    v = ((v & 0x0F0F0F0F0F0F0F0FULL) * 2561) >> 8;
    v = ((v & 0x00FF00FF00FF00FFULL) * 6553601) >> 16;
    return ((v & 0x0000FFFF0000FFFFULL) * 42949672960001ULL) >> 32;
}

static const uint64_t POW10[9] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000};

/* Up to 8 bytes at p (bounded by the piece's end) as a word. */
static inline uint64_t load_upto8(const uint8_t *p, const uint8_t *limit)
{
    if (limit - p >= 8)
        return load64(p);
    uint64_t w = 0;
    memcpy(&w, p, (size_t)(limit - p));
    return w;
}

/*
 * The decimal number that is exactly [p, q) (one token), as `kind` takes it:
 * at most 19 digits (20 for u64), in range. Returns 0 if it is not one.
 */
static inline int token_number(const uint8_t *p, const uint8_t *q, const uint8_t *limit, Kind kind, int64_t *out)
{
    int negative = kind == K_I64 && p < q && *p == '-';
    p += negative;
    size_t n = (size_t)(q - p);
    if (n - 1 < 8 && limit - p >= 8) { /* 1 to 8 digits, the common case: one word */
        uint64_t w = load64(p);
        if (!word_is_digits(w, n))
            return 0;
        int64_t v = (int64_t)word_value(w, n);
        *out = negative ? -v : v;
        return 1;
    }
    if (n == 0 || n > (kind == K_U64 ? 20u : 19u))
        return 0;
    uint64_t v = 0;
    while (n) {
        size_t k = n < 8 ? n : 8;
        uint64_t w = load_upto8(p, limit);
        if (!word_is_digits(w, k) || __builtin_mul_overflow(v, POW10[k], &v) || __builtin_add_overflow(v, word_value(w, k), &v))
            return 0;
        p += k;
        n -= k;
    }
    if (kind == K_U64) {
        memcpy(out, &v, 8);
        return 1;
    }
    if (v > (uint64_t)INT64_MAX + (uint64_t)negative)
        return 0;
    *out = negative ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

/* Promoted integer attribute text: -?[0-9]{1,18}, the whole value (words may be read up to end). */
static inline int int_text(const uint8_t *s, size_t n, const uint8_t *end, int64_t *out)
{
    if (n - 1 < 8 && end - s >= 8 && s[0] != '-') { /* 1 to 8 digits, the common case */
        uint64_t w = load64(s);
        if (!word_is_digits(w, n))
            return 0;
        *out = (int64_t)word_value(w, n);
        return 1;
    }
    size_t i = 0;
    int negative = 0;
    if (n && s[0] == '-') {
        negative = 1;
        i = 1;
    }
    if (n - i < 1 || n - i > 18)
        return 0;
    int64_t v = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        v = v * 10 + (s[i] - '0');
    }
    *out = negative ? -v : v;
    return 1;
}

/* ------------------------------------------------------------------ one record */

/* starts_with for a literal of up to 8 bytes given as a masked word (see Config). */
static inline int starts_with_word(const uint8_t *p, const uint8_t *e, Str lit, uint64_t word, uint64_t mask)
{
    if (e - p >= 8 && lit.n <= 8)
        return ((load64(p) ^ word) & mask) == 0;
    return starts_with(p, e, lit);
}

/* The promoted column (or clk) a decoded key names, -1 for none. */
static inline int key_slot(const Config *C, const uint8_t *k, size_t n, const uint8_t *end)
{
    uint64_t head = end - k >= 8 ? load64(k) & head_mask(n) : head_of(k, n);
    unsigned i = (unsigned)(((head ^ n) * 0x9E3779B97F4A7C15ULL) >> 57) & (KEY_TABLE - 1);
    for (int j; (j = C->key_table[i]) >= 0; i = (i + 1) & (KEY_TABLE - 1)) {
        Str key = C->slot_key[j];
        if (n == key.n && head == C->slot_head[j] && (n <= 8 || same_bytes(k + 8, key.s + 8, n - 8)))
            return j;
    }
    return -1;
}

/* ------------------------------------------------------------------ one record, read into the row columns */

static int grow_rows_to(Part *P, size_t cap)
{
    const Config *C = P->cfg;
    size_t bits_old = (P->rows_cap + 7) / 8, bits = (cap + 7) / 8;
#define GROW(ptr, type, n)                                               \
    do {                                                                 \
        type *grown = pool_realloc(P->pool, (ptr), (n) * sizeof(type)); \
        if (!grown)                                                      \
            return -1;                                                   \
        (ptr) = grown;                                                   \
    } while (0)
#define GROW_BITS(ptr)                                    \
    do {                                                  \
        GROW(ptr, uint8_t, bits);                         \
        memset((ptr) + bits_old, 0, bits - bits_old);     \
    } while (0)
    GROW(P->line, int64_t, cap);
    for (int f = 0; f < C->n_fields; f++) {
        if (C->kind[f] == K_I64 || C->kind[f] == K_N64 || C->kind[f] == K_U64)
            GROW(P->num[C->column[f]], int64_t, cap);
        else if (C->kind[f] != K_VERSION)
            GROW(P->text_off[C->column[f]], int32_t, cap + 1);
    }
    GROW(P->clk_off, int32_t, cap + 1);
    for (int i = 0; i < C->n_int; i++) {
        GROW(P->iattr[i], int64_t, cap); /* values under nulls are zeroed when the part is done: see zero_nulls */
        GROW_BITS(P->iattr_valid[i]);
    }
    for (int i = 0; i < C->n_textkeys; i++) {
        GROW(P->tattr_off[i], int32_t, cap + 1);
        GROW_BITS(P->tattr_valid[i]);
    }
    GROW(P->map_off, int32_t, cap + 1);
#undef GROW_BITS
#undef GROW
    if (!P->rows_cap) { /* first offsets */
        for (int i = 0; i < C->n_text; i++)
            P->text_off[i][0] = 0;
        P->clk_off[0] = 0;
        for (int i = 0; i < C->n_textkeys; i++)
            P->tattr_off[i][0] = 0;
        P->map_off[0] = 0;
    }
    P->rows_cap = cap;
    return 0;
}

static int grow_rows(Part *P) { return grow_rows_to(P, P->rows_cap ? P->rows_cap * 2 : 8192); }

/*
 * Room for the rows and text a part of this size usually holds, reserved at
 * once: growing by copies costs more. Pages never written take no memory.
 */
static int presize(Part *P)
{
    size_t bytes = P->end - P->start;
    int failed = grow_rows_to(P, bytes / 128 + 1024);
    for (int i = 0; i < P->cfg->n_text; i++)
        failed |= vec_reserve(&P->text_data[i], bytes / 8 + 4096);
    failed |= vec_reserve(&P->clk_data, bytes / 32 + 4096);
    for (int i = 0; i < P->cfg->n_textkeys; i++)
        failed |= vec_reserve(&P->tattr_data[i], bytes / 16 + 4096);
    failed |= vec_reserve(&P->key_data, bytes / 8 + 4096) | vec_reserve(&P->val_data, bytes / 8 + 4096);
    return failed;
}

static int add_pair(Part *P, const uint8_t *k, size_t kn, const uint8_t *k_end, const uint8_t *v, size_t vn, const uint8_t *v_end)
{
    if (P->pairs + 1 >= P->pairs_cap) {
        size_t cap = P->pairs_cap ? P->pairs_cap * 2 : 8192;
        int32_t *ko = pool_realloc(P->pool, P->key_off, (cap + 1) * sizeof(int32_t));
        if (!ko)
            return -1;
        P->key_off = ko;
        int32_t *vo = pool_realloc(P->pool, P->val_off, (cap + 1) * sizeof(int32_t));
        if (!vo)
            return -1;
        P->val_off = vo;
        if (!P->pairs_cap)
            P->key_off[0] = P->val_off[0] = 0;
        P->pairs_cap = cap;
    }
    if (vec_append_text(&P->key_data, k, kn, k_end) || vec_append_text(&P->val_data, v, vn, v_end))
        return -1;
    P->pairs++;
    P->key_off[P->pairs] = (int32_t)P->key_data.len;
    P->val_off[P->pairs] = (int32_t)P->val_data.len;
    return 0;
}

static inline int str_eq(const uint8_t *s, size_t n, Str lit) { return n == lit.n && same_bytes(s, lit.s, n); }

static inline void set_bit(uint8_t *bits, size_t row) { bits[row >> 3] |= (uint8_t)(1u << (row & 7)); }

static inline void clear_bit(uint8_t *bits, size_t row) { bits[row >> 3] &= (uint8_t)~(1u << (row & 7)); }

/* How far a line's rows got in every column: a line handed to the Python reader is undone to it. */
typedef struct {
    size_t rows, pairs, text[MAX_FIELDS], clk, tattr[MAX_TEXT_KEYS], keys, values;
} Mark;

static void mark(const Part *P, Mark *m)
{
    m->rows = P->rows;
    m->pairs = P->pairs;
    for (int i = 0; i < P->cfg->n_text; i++)
        m->text[i] = P->text_data[i].len;
    m->clk = P->clk_data.len;
    for (int i = 0; i < P->cfg->n_textkeys; i++)
        m->tattr[i] = P->tattr_data[i].len;
    m->keys = P->key_data.len;
    m->values = P->val_data.len;
}

static void undo(Part *P, const Mark *m)
{
    const Config *C = P->cfg;
    for (size_t row = m->rows; row <= P->rows && row < P->rows_cap; row++) { /* the rows written and the one begun */
        for (int j = 0; j < C->n_int; j++)
            clear_bit(P->iattr_valid[j], row);
        for (int j = 0; j < C->n_textkeys; j++)
            clear_bit(P->tattr_valid[j], row);
    }
    P->rows = m->rows;
    P->pairs = m->pairs;
    for (int i = 0; i < C->n_text; i++)
        P->text_data[i].len = m->text[i];
    P->clk_data.len = m->clk;
    for (int i = 0; i < C->n_textkeys; i++)
        P->tattr_data[i].len = m->tattr[i];
    P->key_data.len = m->keys;
    P->val_data.len = m->values;
}

/* Results of reading a record: OK, or the Python reader must read the line (PYTHON), or memory ran out (FAILED). */
enum { OK = 1, PYTHON = 0, FAILED = -1 };

/* Append the text [s, e) to out, percent-decoded where it holds a '%'. */
static inline int put_token(Part *P, const Maps *M, Vec *out, size_t s, size_t e)
{
    const uint8_t *b = P->buf;
    if (!has_percent(M, s, e))
        return vec_append_text(out, b + s, e - s, b + P->piece_len) ? FAILED : OK;
    int rc = decode_append(out, b + s, b + e);
    return rc == 0 ? OK : rc == -1 ? PYTHON : FAILED;
}

/* One attribute of row `row`: the clk flag, a promoted column (its first valid occurrence), or the attrs map. */
static int put_attribute(Part *P, const Maps *M, size_t k, size_t ke, size_t v, size_t ve, size_t row, uint64_t *taken, int *dev)
{
    const Config *C = P->cfg;
    /* each text, and how far it may be read (the piece, or the scratch it was decoded into) */
    const uint8_t *b = P->buf, *key = b + k, *value = b + v, *key_end = b + P->piece_len, *value_end = key_end;
    size_t kn = ke - k, vn = ve - v;
    int key_percent = has_percent(M, k, ke), value_percent = has_percent(M, v, ve);
    if (key_percent || value_percent) { /* decoded into scratch, key then value; reserved at once, so it does not move */
        P->scratch.len = 0;
        if (vec_reserve(&P->scratch, kn + vn + 16))
            return FAILED;
        for (int i = 0; i < 2; i++) {
            if (!(i ? value_percent : key_percent))
                continue;
            size_t at = P->scratch.len;
            int rc = decode_append(&P->scratch, i ? value : key, i ? value + vn : key + kn);
            if (rc)
                return rc == -1 ? PYTHON : FAILED;
            *(i ? &value : &key) = (const uint8_t *)P->scratch.data + at;
            *(i ? &vn : &kn) = P->scratch.len - at;
            *(i ? &value_end : &key_end) = (const uint8_t *)P->scratch.data + P->scratch.cap;
        }
    }
    int slot = key_slot(C, key, kn, key_end);
    if (slot == C->clk_slot) {
        if (!key_percent) { /* clk counts only as written, undecoded, and its value is compared raw */
            *dev |= str_eq(b + v, ve - v, C->clk_dev);
            return OK;
        }
        slot = -1;
    }
    if (slot >= 0 && !(*taken >> slot & 1)) {
        int64_t number;
        if (slot < C->n_int && int_text(value, vn, value_end, &number)) {
            P->iattr[slot][row] = number;
            set_bit(P->iattr_valid[slot], row);
            *taken |= 1ULL << slot;
            return OK;
        }
        if (slot >= C->n_int) {
            int j = slot - C->n_int;
            if (vec_append_text(&P->tattr_data[j], value, vn, value_end))
                return FAILED;
            set_bit(P->tattr_valid[j], row);
            *taken |= 1ULL << slot;
            return OK;
        }
    }
    return add_pair(P, key, kn, key_end, value, vn, value_end) ? FAILED : OK;
}

/*
 * Read the record whose text runs from s (just after its marker) to e (the
 * next marker or the end of the line's content ce), its token ends given by M,
 * into a new row. OK, or PYTHON / FAILED with the row perhaps half written
 * (the caller undoes the line).
 */
static int read_record(Part *P, const Maps *M, size_t s, size_t e, size_t ce, int64_t line)
{
    const Config *C = P->cfg;
    const uint8_t *b = P->buf, *limit = P->buf + P->piece_len;
    if (P->rows == P->rows_cap && grow_rows(P))
        return FAILED;
    size_t row = P->rows, p = s;
    for (int f = 0; f < C->n_fields; f++) {
        if (!starts_with_word(b + p, b + e, C->field_lit[f], C->field_word[f], C->field_mask[f]))
            return PYTHON;
        p += C->field_lit[f].n;
        if (C->kind[f] == K_VERSION) {
            if (!starts_with_word(b + p, b + e, C->version, C->version_word, C->version_mask))
                return PYTHON;
            p += C->version.n;
            continue;
        }
        size_t q = next_stop(M, p); /* never past e: e is a '[' or the end of the line's content */
        int col = C->column[f];
        if (C->kind[f] == K_TOKEN || C->kind[f] == K_TOKEN0) {
            if (C->kind[f] == K_TOKEN && q == p)
                return PYTHON;
            int rc = put_token(P, M, &P->text_data[col], p, q);
            if (rc != OK)
                return rc;
            P->text_off[col][row + 1] = (int32_t)P->text_data[col].len;
        } else if (!token_number(b + p, b + q, limit, C->kind[f], &P->num[col][row])) {
            return PYTHON;
        }
        p = q;
    }
    /* values the Python reader drops: it counts them */
    int64_t ts = P->num[C->column[C->ts_field]][row], dur = P->num[C->column[C->dur_field]][row];
    if (ts < 0 || dur < 0 || ts >= MAX_TIME_NS || dur >= MAX_TIME_NS - ts)
        return PYTHON;
    /* attributes: " key=value" while they parse, greedily, as the reader's pattern takes them */
    uint64_t taken = 0;
    int dev = 0;
    while (p < e && b[p] == ' ') {
        size_t k = p + 1, ke = next_stop(M, k);
        if (ke == k || ke >= e || b[ke] != '=')
            break;
        size_t v = ke + 1, ve = next_stop(M, v);
        int rc = put_attribute(P, M, k, ke, v, ve, row, &taken, &dev);
        if (rc != OK)
            return rc;
        p = ve;
    }
    /* what may follow a record: its end, a space (not two: more spaces may lead to an attribute), '[' or a final '\r' */
    if (p < e && !(b[p] == '[' || (b[p] == '\r' && p + 1 == ce) || (b[p] == ' ' && !(p + 1 < e && b[p + 1] == ' '))))
        return PYTHON;
    for (int j = 0; j < C->n_textkeys; j++)
        P->tattr_off[j][row + 1] = (int32_t)P->tattr_data[j].len;
    Str clk = dev ? C->clk_dev : C->clk_host;
    if (vec_append(&P->clk_data, clk.s, clk.n))
        return FAILED;
    P->clk_off[row + 1] = (int32_t)P->clk_data.len;
    P->map_off[row + 1] = (int32_t)P->pairs;
    P->line[row] = line;
    P->rows++;
    return OK;
}

/* ------------------------------------------------------------------ lines */

/* Whether a line's content ends in a proper prefix of the marker (the marker cut by a newline). */
static int ends_in_marker_prefix(const Config *C, const uint8_t *s, const uint8_t *ce)
{
    for (size_t k = 1; k < C->marker.n; k++)
        if ((size_t)(ce - s) >= k && memcmp(ce - k, C->marker.s, k) == 0)
            return 1;
    return 0;
}

/*
 * Read one line with markers; returns 1 when its records were emitted, 0 when
 * the Python reader must read it (nothing was emitted), -1 on allocation failure.
 */
static int read_record_line(Part *P, size_t ce, int64_t line)
{
    size_t n = P->markers.len / sizeof(size_t);
    const size_t *m = (const size_t *)P->markers.data;
    Maps M;
    Mark before;
    if (build_maps(P, m[0] + P->cfg->marker.n, ce, &M))
        return FAILED;
    mark(P, &before);
    for (size_t i = 0; i < n; i++) {
        int rc = read_record(P, &M, m[i] + P->cfg->marker.n, i + 1 < n ? m[i + 1] : ce, ce, line);
        if (rc != OK) {
            undo(P, &before);
            return rc;
        }
    }
    return OK;
}

static int close_island(Part *P, Island *open, int64_t end_line, size_t b1)
{
    open->end_line = end_line;
    open->b1 = b1;
    return vec_append(&P->islands, open, sizeof *open);
}

/* The promoted integer columns hold 0 under their nulls (rather than what the memory held before). */
static void zero_nulls(Part *P)
{
    for (int j = 0; j < P->cfg->n_int; j++)
        for (size_t row = 0; row < P->rows; row++)
            if (!(P->iattr_valid[j][row >> 3] >> (row & 7) & 1))
                P->iattr[j][row] = 0;
}

static void scan_part(Part *P)
{
    const Config *C = P->cfg;
    const uint8_t *b = P->buf;
    size_t pos = P->start;
    int64_t li = 0;
    int in_island = 0;
    Island island = {0, 0, 0, 0};
    Line L;
    P->failed = presize(P) != 0;
    while (pos < P->end && !P->failed) {
        if (read_line(P, pos, &L)) {
            P->failed = 1;
            break;
        }
        if (L.f.nul && P->nul_line < 0)
            P->nul_line = li;
        if (L.f.invalid && P->invalid_line < 0)
            P->invalid_line = li;
        if (L.f.fffd && P->fffd_line < 0)
            P->fffd_line = li;
        if (in_island && b[pos] == '[') {
            if (close_island(P, &island, li, pos))
                P->failed = 1;
            in_island = 0;
        }
        if (!in_island) {
            int hard = 0, has_markers = P->markers.len > 0;
            uint8_t next = L.le < P->piece_len ? b[L.le] : '[';
            if (L.side)
                hard = 1;
            else if (L.newline && next != '[' && ends_in_marker_prefix(C, b + pos, b + L.ce))
                hard = 1; /* a marker cut by the newline: the next line holds its rest */
            else if (has_markers && (L.f.ctrl || L.f.invalid || (next != '[' && next != '\n' && next != '\r')))
                hard = 1; /* odd bytes, or the next line may continue the last record */
            else if (has_markers) {
                int rc = read_record_line(P, L.ce, li);
                if (rc < 0)
                    P->failed = 1;
                hard = rc == 0;
            }
            if (hard) {
                island.first_line = li;
                island.b0 = pos;
                in_island = 1;
            }
        }
        pos = L.le;
        li++;
    }
    if (in_island && !P->failed && close_island(P, &island, li, pos))
        P->failed = 1;
    P->n_lines = li;
    zero_nulls(P);
}

static void *scan_thread(void *arg)
{
    scan_part((Part *)arg);
    return NULL;
}

/* Give back what is left of a part (columns not handed over, scratch); its row columns go to the pool. */
static void free_part(Part *P)
{
    Pool *pool = P->pool;
    pool_free(pool, P->line);
    for (int i = 0; i < MAX_FIELDS; i++) {
        pool_free(pool, P->num[i]);
        pool_free(pool, P->text_off[i]);
        pool_free(pool, P->text_data[i].data);
    }
    pool_free(pool, P->clk_off);
    pool_free(pool, P->clk_data.data);
    for (int i = 0; i < MAX_INT_KEYS; i++) {
        pool_free(pool, P->iattr[i]);
        pool_free(pool, P->iattr_valid[i]);
    }
    for (int i = 0; i < MAX_TEXT_KEYS; i++) {
        pool_free(pool, P->tattr_off[i]);
        pool_free(pool, P->tattr_data[i].data);
        pool_free(pool, P->tattr_valid[i]);
    }
    pool_free(pool, P->map_off);
    pool_free(pool, P->key_off);
    pool_free(pool, P->val_off);
    pool_free(pool, P->key_data.data);
    pool_free(pool, P->val_data.data);
    free(P->islands.data);
    free(P->markers.data);
    free(P->maps.data);
    free(P->scratch.data);
    memset(P, 0, sizeof *P);
}

/* ------------------------------------------------------------------ Buf: memory handed to Arrow */

typedef struct {
    PyObject_HEAD void *data;
    Py_ssize_t len;
    Pool *pool;      /* where data goes back (NULL: freed) */
    PyObject *owner; /* keeps the pool alive */
} BufObject;

static void buf_dealloc(BufObject *self)
{
    pool_free(self->pool, self->data);
    Py_XDECREF(self->owner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int buf_getbuffer(BufObject *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->len, 1, flags);
}

static PyBufferProcs buf_as_buffer = {(getbufferproc)buf_getbuffer, NULL};

static PyTypeObject BufType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dsprof.analysis.ingest._strace_scan.Buf",
    .tp_basicsize = sizeof(BufObject),
    .tp_dealloc = (destructor)buf_dealloc,
    .tp_as_buffer = &buf_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Memory filled by the scanner, exposed through the buffer protocol (read-only).",
};

/* A Buf owning data (len bytes used), given back to `pool` of `owner` when Arrow is done with it; takes ownership even on failure. */
static PyObject *pooled_buf(void *data, size_t len, Pool *pool, PyObject *owner)
{
    if (!data)
        data = pool_alloc(pool, 1);
    BufObject *self = data ? PyObject_New(BufObject, &BufType) : NULL;
    if (!self) {
        pool_free(pool, data);
        return NULL;
    }
    self->data = data;
    self->len = (Py_ssize_t)len;
    self->pool = pool;
    self->owner = owner;
    Py_XINCREF(owner);
    return (PyObject *)self;
}

static PyObject *take_buf(void *data, size_t len) { return pooled_buf(data, len, NULL, NULL); }

/* ------------------------------------------------------------------ Scanner */

typedef struct {
    PyObject_HEAD Config cfg;
    Pool pool;
    int pool_ready;
} ScannerObject;

static void scanner_dealloc(ScannerObject *self)
{
    free(self->cfg.storage);
    if (self->pool_ready) {
        pool_clear(&self->pool);
        pthread_mutex_destroy(&self->pool.lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define STORAGE_BYTES (1 << 16)

/* Copy the bytes objects of a sequence into dst (at most max), their text into storage, each between ' ' and '='. */
static int bytes_list(PyObject *seq, Str *dst, int max, char **cursor, const char *storage_end, const char *what)
{
    PyObject *fast = PySequence_Fast(seq, what);
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > max) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "%s: at most %d", what, max);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyBytes_Check(item)) {
            Py_DECREF(fast);
            PyErr_Format(PyExc_TypeError, "%s: bytes expected", what);
            return -1;
        }
        dst[i].n = PyBytes_GET_SIZE(item);
        if (dst[i].n + 2 > (size_t)(storage_end - *cursor)) {
            Py_DECREF(fast);
            PyErr_Format(PyExc_ValueError, "%s: names too long", what);
            return -1;
        }
        char *at = *cursor;
        at[0] = ' ';
        memcpy(at + 1, PyBytes_AS_STRING(item), dst[i].n);
        at[dst[i].n + 1] = '=';
        dst[i].s = at + 1;
        *cursor += dst[i].n + 2;
    }
    Py_DECREF(fast);
    return (int)n;
}

/* The tables derived from the vocabulary: literal words and the key -> slot table. */
static void config_finish(Config *C)
{
    for (int f = 0; f < C->n_fields; f++) {
        C->field_word[f] = head_of((const uint8_t *)C->field_lit[f].s, C->field_lit[f].n);
        C->field_mask[f] = head_mask(C->field_lit[f].n);
    }
    C->version_word = head_of((const uint8_t *)C->version.s, C->version.n);
    C->version_mask = head_mask(C->version.n);
    C->marker_word = head_of((const uint8_t *)C->marker.s, C->marker.n);
    C->marker_mask = head_mask(C->marker.n);
    for (int i = 0; i < C->n_side; i++) {
        C->side_word[i] = head_of((const uint8_t *)C->side[i].s, C->side[i].n);
        C->side_mask[i] = head_mask(C->side[i].n);
    }
    int n_slots = 0;
    for (int i = 0; i < C->n_int; i++)
        C->slot_key[n_slots++] = C->int_keys[i];
    for (int i = 0; i < C->n_textkeys; i++)
        C->slot_key[n_slots++] = C->text_keys[i];
    C->clk_slot = n_slots;
    C->slot_key[n_slots++] = C->clk_attr;
    memset(C->key_table, -1, sizeof C->key_table);
    for (int j = 0; j < n_slots; j++) {
        Str key = C->slot_key[j];
        C->slot_head[j] = head_of((const uint8_t *)key.s, key.n);
        if (key_slot(C, (const uint8_t *)key.s, key.n, (const uint8_t *)key.s) >= 0)
            continue; /* a repeated name keeps its first slot */
        unsigned i = (unsigned)(((C->slot_head[j] ^ key.n) * 0x9E3779B97F4A7C15ULL) >> 57) & (KEY_TABLE - 1);
        while (C->key_table[i] >= 0)
            i = (i + 1) & (KEY_TABLE - 1);
        C->key_table[i] = (int8_t)j;
    }
}

/* The field kinds of profiler/strace_format.py (KIND_*, FIELD_KINDS), in this order;
 * tests/test_strace_vocabulary.py::test_the_compiled_scanner_keeps_the_format_grammar checks the copy. */
static const char *const KIND_NAMES[] = {"version", "i64", "n64", "u64", "token", "token0"};

static int scanner_init(ScannerObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"marker", "side_markers", "version", "fields", "kinds", "ts_field", "dur_field", "clk", "int_keys", "text_keys", NULL};
    PyObject *marker, *side, *version, *fields, *kinds, *clk, *int_keys, *text_keys;
    int ts_field, dur_field;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "SOSOOiiOOO", kwlist, &marker, &side, &version, &fields, &kinds, &ts_field, &dur_field, &clk,
                                     &int_keys, &text_keys))
        return -1;
    Config *C = &self->cfg;
    free(C->storage);
    memset(C, 0, sizeof *C);
    if (!self->pool_ready) {
        memset(&self->pool, 0, sizeof self->pool);
        pthread_mutex_init(&self->pool.lock, NULL);
        self->pool_ready = 1;
    }
    C->storage = malloc(STORAGE_BYTES);
    if (!C->storage) {
        PyErr_NoMemory();
        return -1;
    }
    char *cursor = C->storage;
    const char *storage_end = C->storage + STORAGE_BYTES;
    Str one[1];
    PyObject *marker_list = PyTuple_Pack(1, marker), *version_list = PyTuple_Pack(1, version);
    int ok = marker_list && version_list && bytes_list(marker_list, one, 1, &cursor, storage_end, "marker") == 1;
    if (ok)
        C->marker = one[0];
    ok = ok && bytes_list(version_list, one, 1, &cursor, storage_end, "version") == 1;
    if (ok)
        C->version = one[0];
    Py_XDECREF(marker_list);
    Py_XDECREF(version_list);
    if (!ok)
        return -1;
    if ((C->n_side = bytes_list(side, C->side, 4, &cursor, storage_end, "side_markers")) < 0)
        return -1;
    Str names[MAX_FIELDS];
    if ((C->n_fields = bytes_list(fields, names, MAX_FIELDS, &cursor, storage_end, "fields")) < 0)
        return -1;
    for (int f = 0; f < C->n_fields; f++) { /* " <name>=": each name is stored between a space and '=' */
        C->field_lit[f].s = names[f].s - 1;
        C->field_lit[f].n = names[f].n + 2;
    }
    Str kind_names[MAX_FIELDS];
    if (bytes_list(kinds, kind_names, MAX_FIELDS, &cursor, storage_end, "kinds") != C->n_fields) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "one kind per field");
        return -1;
    }
    for (int f = 0; f < C->n_fields; f++) {
        int k = -1;
        for (int j = 0; j < 6; j++)
            if (str_eq((const uint8_t *)kind_names[f].s, kind_names[f].n, (Str){KIND_NAMES[j], strlen(KIND_NAMES[j])}))
                k = j;
        if (k < 0 || (k == K_VERSION) != (f == 0)) {
            PyErr_SetString(PyExc_ValueError, "kinds: the first field is the version, then i64, n64, u64, token or token0");
            return -1;
        }
        C->kind[f] = (Kind)k;
        C->column[f] = k == K_VERSION ? -1 : (k == K_TOKEN || k == K_TOKEN0) ? C->n_text++ : C->n_numeric++;
    }
    if (ts_field <= 0 || ts_field >= C->n_fields || C->kind[ts_field] != K_I64 || dur_field <= 0 || dur_field >= C->n_fields ||
        C->kind[dur_field] != K_I64) {
        PyErr_SetString(PyExc_ValueError, "ts_field and dur_field: signed fields");
        return -1;
    }
    C->ts_field = ts_field;
    C->dur_field = dur_field;
    Str clk_parts[3];
    if (bytes_list(clk, clk_parts, 3, &cursor, storage_end, "clk") != 3) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "clk: (attribute, device value, host value)");
        return -1;
    }
    C->clk_attr = clk_parts[0];
    C->clk_dev = clk_parts[1];
    C->clk_host = clk_parts[2];
    if ((C->n_int = bytes_list(int_keys, C->int_keys, MAX_INT_KEYS, &cursor, storage_end, "int_keys")) < 0)
        return -1;
    if ((C->n_textkeys = bytes_list(text_keys, C->text_keys, MAX_TEXT_KEYS, &cursor, storage_end, "text_keys")) < 0)
        return -1;
    config_finish(C);
    if (C->marker.n == 0) {
        PyErr_SetString(PyExc_ValueError, "marker must not be empty");
        return -1;
    }
    return 0;
}

/* Part boundaries: just before a line starting with '[', near equal shares of the piece. */
static int split_piece(const uint8_t *b, size_t len, int threads, size_t *cuts)
{
    int n = 1;
    cuts[0] = 0;
    for (int k = 1; k < threads; k++) {
        size_t target = len / threads * k;
        if (target <= cuts[n - 1])
            continue;
        const uint8_t *hit = memmem(b + target - 1, len - target + 1, "\n[", 2);
        if (!hit)
            break;
        size_t cut = (size_t)(hit - b) + 1;
        if (cut > cuts[n - 1] && cut < len)
            cuts[n++] = cut;
    }
    cuts[n] = len;
    return n;
}

#define SET_ITEM(dict, key, value)                              \
    do {                                                        \
        PyObject *v_ = (value);                                 \
        if (!v_ || PyDict_SetItemString((dict), (key), v_)) {   \
            Py_XDECREF(v_);                                     \
            goto fail;                                          \
        }                                                       \
        Py_DECREF(v_);                                          \
    } while (0)

/* Pack a part's columns into a dict of Bufs; the part gives up its memory to them. */
/* A column's memory as a Buf that gives it back to the part's pool. */
static PyObject *column_buf(Part *P, PyObject *owner, void *data, size_t len) { return pooled_buf(data, len, P->pool, owner); }

/* Pack a part's columns into a dict of Bufs; the part gives up its memory to them. */
static PyObject *part_dict(Part *P, PyObject *owner)
{
    const Config *C = &((const Config *)P->cfg)[0];
    size_t rows = P->rows;
    size_t bits = (rows + 7) / 8;
    PyObject *d = PyDict_New(), *list = NULL;
    if (!d)
        return NULL;
    SET_ITEM(d, "rows", PyLong_FromSize_t(rows));
    SET_ITEM(d, "pairs", PyLong_FromSize_t(P->pairs));
    SET_ITEM(d, "line", column_buf(P, owner, P->line, rows * 8));
    P->line = NULL;
    if (!(list = PyList_New(0)))
        goto fail;
    for (int f = 0; f < C->n_fields; f++) {
        int col = C->column[f];
        PyObject *item = NULL;
        if (C->kind[f] == K_VERSION)
            continue;
        if (C->kind[f] == K_TOKEN || C->kind[f] == K_TOKEN0) {
            item = Py_BuildValue("(NN)", column_buf(P, owner, P->text_off[col], rows ? (rows + 1) * 4 : 0), column_buf(P, owner, P->text_data[col].data, P->text_data[col].len));
            P->text_off[col] = NULL;
            P->text_data[col].data = NULL;
        } else {
            item = column_buf(P, owner, P->num[col], rows * 8);
            P->num[col] = NULL;
        }
        if (!item || PyList_Append(list, item)) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
    }
    SET_ITEM(d, "fields", list);
    list = NULL;
    SET_ITEM(d, "clk", Py_BuildValue("(NN)", column_buf(P, owner, P->clk_off, rows ? (rows + 1) * 4 : 0), column_buf(P, owner, P->clk_data.data, P->clk_data.len)));
    P->clk_off = NULL;
    P->clk_data.data = NULL;
    if (!(list = PyList_New(0)))
        goto fail;
    for (int i = 0; i < C->n_int; i++) {
        PyObject *item = Py_BuildValue("(NN)", column_buf(P, owner, P->iattr[i], rows * 8), column_buf(P, owner, P->iattr_valid[i], bits));
        P->iattr[i] = NULL;
        P->iattr_valid[i] = NULL;
        if (!item || PyList_Append(list, item)) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
    }
    SET_ITEM(d, "int_attrs", list);
    if (!(list = PyList_New(0)))
        goto fail;
    for (int i = 0; i < C->n_textkeys; i++) {
        PyObject *item = Py_BuildValue("(NNN)", column_buf(P, owner, P->tattr_off[i], rows ? (rows + 1) * 4 : 0), column_buf(P, owner, P->tattr_data[i].data, P->tattr_data[i].len),
                                       column_buf(P, owner, P->tattr_valid[i], bits));
        P->tattr_off[i] = NULL;
        P->tattr_data[i].data = NULL;
        P->tattr_valid[i] = NULL;
        if (!item || PyList_Append(list, item)) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
    }
    SET_ITEM(d, "text_attrs", list);
    list = NULL;
    SET_ITEM(d, "attrs",
             Py_BuildValue("(NNNNN)", column_buf(P, owner, P->map_off, rows ? (rows + 1) * 4 : 0), column_buf(P, owner, P->key_off, P->pairs ? (P->pairs + 1) * 4 : 0),
                           column_buf(P, owner, P->key_data.data, P->key_data.len), column_buf(P, owner, P->val_off, P->pairs ? (P->pairs + 1) * 4 : 0),
                           column_buf(P, owner, P->val_data.data, P->val_data.len)));
    P->map_off = P->key_off = P->val_off = NULL;
    P->key_data.data = P->val_data.data = NULL;
    return d;
fail:
    Py_XDECREF(list);
    Py_DECREF(d);
    return NULL;
}

static const char ISLAND_SEPARATOR[] = "[]\n";

/* The islands of every part as one text (separated by ISLAND_SEPARATOR), and the log line of each of its lines (0 for a separator). */
static int join_islands(Part *parts, int n, const int64_t *line_base, Vec *text, Vec *lines)
{
    int first = 1;
    for (int i = 0; i < n; i++) {
        const Island *is = (const Island *)parts[i].islands.data;
        size_t count = parts[i].islands.len / sizeof(Island);
        for (size_t j = 0; j < count; j++) {
            if (!first) {
                int64_t none = 0;
                if (vec_append(text, ISLAND_SEPARATOR, sizeof ISLAND_SEPARATOR - 1) || vec_append(lines, &none, 8))
                    return -1;
            }
            first = 0;
            if (vec_append(text, parts[i].buf + is[j].b0, is[j].b1 - is[j].b0))
                return -1;
            for (int64_t l = is[j].first_line; l < is[j].end_line; l++) {
                int64_t number = line_base[i] + l + 1;
                if (vec_append(lines, &number, 8))
                    return -1;
            }
        }
    }
    return 0;
}

static int64_t first_line(Part *parts, int n, const int64_t *base, size_t offset)
{
    for (int i = 0; i < n; i++) {
        int64_t local = *(int64_t *)((char *)&parts[i] + offset);
        if (local >= 0)
            return base[i] + local + 1;
    }
    return 0;
}

PyDoc_STRVAR(scan_doc,
             "scan(piece, line_base, threads, min_part_bytes=1 MiB) -> dict\n\n"
             "Read one piece of a log (whole lines; line_base lines come before it), shared out to up to `threads` "
             "threads of at least min_part_bytes each. Returns n_lines; nul_line, "
             "invalid_line, fffd_line (1-based line in the piece of the first NUL byte, invalid UTF-8, U+FFFD; 0: none); "
             "parts (one dict of column buffers per thread's share, in order); islands (the text the Python reader "
             "must read) and island_lines (int64 log line of each of its lines, 0 for separators).");

static PyObject *scanner_scan(ScannerObject *self, PyObject *args)
{
    Py_buffer view;
    long long line_base;
    int threads;
    Py_ssize_t min_part = (Py_ssize_t)1 << 20;
    if (!PyArg_ParseTuple(args, "y*Li|n", &view, &line_base, &threads, &min_part))
        return NULL;
    const uint8_t *b = view.buf;
    size_t len = (size_t)view.len;
    if (len > MAX_PIECE_BYTES) { /* the columns' offsets are 32-bit */
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "scan: a piece of at most 1 GiB");
        return NULL;
    }
    if (threads < 1)
        threads = 1;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    if (min_part < 1)
        min_part = 1;
    if (len / (size_t)threads < (size_t)min_part) /* a thread is not worth starting for less */
        threads = (int)(len / (size_t)min_part) > 1 ? (int)(len / (size_t)min_part) : 1;
    size_t cuts[MAX_THREADS + 1];
    Part parts[MAX_THREADS];
    pthread_t tids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    int n = split_piece(b, len, threads, cuts);
    memset(parts, 0, sizeof parts);
    for (int i = 0; i < n; i++) {
        Part *P = &parts[i];
        P->cfg = &self->cfg;
        P->pool = &self->pool;
        for (int j = 0; j < MAX_FIELDS; j++)
            P->text_data[j].pool = P->pool;
        for (int j = 0; j < MAX_TEXT_KEYS; j++)
            P->tattr_data[j].pool = P->pool;
        P->clk_data.pool = P->key_data.pool = P->val_data.pool = P->pool;
        P->buf = b;
        P->start = cuts[i];
        P->end = cuts[i + 1];
        P->piece_len = len;
        P->nul_line = P->invalid_line = P->fffd_line = -1;
    }
    int64_t base[MAX_THREADS];
    Vec text = {0}, lines = {0};
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (int i = 1; i < n; i++)
        started[i] = pthread_create(&tids[i], NULL, scan_thread, &parts[i]) == 0;
    scan_part(&parts[0]);
    for (int i = 1; i < n; i++) {
        if (started[i])
            pthread_join(tids[i], NULL);
        else
            scan_part(&parts[i]);
    }
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        base[i] = total;
        total += parts[i].n_lines;
        failed |= parts[i].failed;
        for (size_t r = 0; r < parts[i].rows; r++) /* part-local line index -> log line number */
            parts[i].line[r] += line_base + base[i] + 1;
    }
    if (!failed) {
        int64_t piece_base[MAX_THREADS];
        for (int i = 0; i < n; i++)
            piece_base[i] = base[i] + line_base;
        failed = join_islands(parts, n, piece_base, &text, &lines) != 0;
    }
    Py_END_ALLOW_THREADS;
    PyObject *result = NULL, *list = NULL;
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    if (!(result = PyDict_New()))
        goto done;
    int64_t n_lines = 0;
    for (int i = 0; i < n; i++)
        n_lines += parts[i].n_lines;
    {
        const char *keys[] = {"n_lines", "nul_line", "invalid_line", "fffd_line"};
        long long values[] = {n_lines, first_line(parts, n, base, offsetof(Part, nul_line)), first_line(parts, n, base, offsetof(Part, invalid_line)),
                              first_line(parts, n, base, offsetof(Part, fffd_line))};
        for (int i = 0; i < 4; i++) {
            PyObject *v = PyLong_FromLongLong(values[i]);
            if (!v || PyDict_SetItemString(result, keys[i], v)) {
                Py_XDECREF(v);
                goto fail_result;
            }
            Py_DECREF(v);
        }
    }
    if (!(list = PyList_New(0)))
        goto fail_result;
    for (int i = 0; i < n; i++) {
        PyObject *d = part_dict(&parts[i], (PyObject *)self);
        if (!d || PyList_Append(list, d)) {
            Py_XDECREF(d);
            goto fail_result;
        }
        Py_DECREF(d);
    }
    if (PyDict_SetItemString(result, "parts", list))
        goto fail_result;
    Py_CLEAR(list);
    {
        PyObject *t = take_buf(text.data, text.len), *l;
        text.data = NULL;
        if (!t || PyDict_SetItemString(result, "islands", t)) {
            Py_XDECREF(t);
            goto fail_result;
        }
        Py_DECREF(t);
        l = take_buf(lines.data, lines.len);
        lines.data = NULL;
        if (!l || PyDict_SetItemString(result, "island_lines", l)) {
            Py_XDECREF(l);
            goto fail_result;
        }
        Py_DECREF(l);
    }
    goto done;
fail_result:
    Py_XDECREF(list);
    Py_CLEAR(result);
done:
    free(text.data);
    free(lines.data);
    for (int i = 0; i < n; i++)
        free_part(&parts[i]);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef scanner_methods[] = {
    {"scan", (PyCFunction)scanner_scan, METH_VARARGS, scan_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dsprof.analysis.ingest._strace_scan.Scanner",
    .tp_basicsize = sizeof(ScannerObject),
    .tp_dealloc = (destructor)scanner_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scanner(marker, side_markers, version, fields, kinds, ts_field, dur_field, clk, int_keys, text_keys): "
              "the STRACE grammar's vocabulary, given once; scan() reads pieces of a log with it.",
    .tp_methods = scanner_methods,
    .tp_init = (initproc)scanner_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------ module */

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_strace_scan",
    .m_doc = "Compiled fast path of the STRACE log reader (see strace_log.py).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__strace_scan(void)
{
    if (PyType_Ready(&BufType) < 0 || PyType_Ready(&ScannerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(m, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(&ScannerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
