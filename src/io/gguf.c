/* gguf.c — GGUF v2/v3 parser, metadata lookups and tensor directory (see gguf.h).
 *
 * Layout of a GGUF file (all little-endian):
 *   "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x   { string key | u32 value_type | value }            (value: scalar, string or array)
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
 *   padding to `alignment` | tensor data (offsets are relative to this aligned start)
 * where a string is { u64 length | bytes, no NUL } and an array is { u32 elem_type | u64 n | n x
 * elem }. Version 1 used 32-bit counts and lengths and is rejected; version 3 only added big-endian
 * files (recognised by a byte-swapped version field, rejected: we run on little-endian hosts).
 *
 * Parsing runs in phases so that nothing is trusted before it is checked:
 *   1. header: magic, version, and both counts bounded by the bytes that remain (a count that
 *      cannot fit is an error before anything is allocated; tables then grow with what parses);
 *   2. metadata and 3. tensor directory: a bounds-checked cursor; every length is compared with
 *      the bytes left before it is used, so all arithmetic stays within the file size;
 *   4. keys and tensor names are hashed (duplicates rejected), general.alignment is read, and
 *      every tensor's byte size, alignment, bounds and non-overlap are checked;
 *   5. one string pool receives NUL-terminated copies of keys, tensor names and string values, and
 *      one offset table indexes the elements of every string array (O(1) mk_gguf_arr_str).
 * Allocation classes: kv table, tensor table (+ name lengths), two hash tables, the string pool,
 * the string-array offsets. An mk_gguf from mk_gguf_open owns its mapping; one from mk_gguf_parse
 * points into the caller's buffer.
 */
#include "io/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Smallest encodings, used to bound counts by the file size before any allocation:
 * a kv is key length (8) + type (4) + a 1-byte value; a tensor info is name length (8) +
 * n_dims (4) + one dim (8) + type (4) + offset (8). */
#define KV_MIN_BYTES 13u
#define TI_MIN_BYTES 32u
#define HEADER_BYTES 24u

typedef struct {
    const uint8_t *kraw;  /* key bytes in the buffer (no NUL) */
    uint64_t klen;
    const char *key;      /* NUL-terminated copy in the pool */
    int type;             /* MK_GGUF_T_* */
    int arr_type;         /* element type when type == ARRAY */
    uint64_t n;           /* element count when type == ARRAY */
    const uint8_t *val;   /* scalar: its bytes; string: its chars; array: first element */
    uint64_t slen;        /* string: byte length */
    const char *str;      /* string: NUL-terminated copy in the pool */
    const uint64_t *soff; /* string array: buffer offset of each element's length prefix */
} gg_kv;

struct mk_gguf {
    const uint8_t *buf;
    size_t len;
    const void *map;      /* our mapping (mk_gguf_open) or NULL */
    char *fname;
    int version;
    uint32_t alignment;
    uint64_t data_off;    /* aligned start of the tensor data section */
    gg_kv *kv;
    size_t n_kv, cap_kv;
    mk_gguf_tensor *t;
    uint64_t *tname_len;  /* parallel to t: name length (the raw name sits in t->name until phase 5) */
    size_t n_t, cap_t, cap_tn;
    size_t *kslots, nkslots; /* open addressing: kv index + 1, 0 = empty; power of two */
    size_t *tslots, ntslots; /* same for tensors */
    char *pool;
    uint64_t *soffs;
    size_t total;         /* sum of tensor nbytes */
};

/* ---- ggml types ------------------------------------------------------------------------------ */

/* Elements and bytes per block (ggml-common.h layouts, QK_K = 256). */
static const struct {
    uint32_t id;
    const char *name;
    int blk, bytes;
} GGML_TYPES[] = {
    {MK_GGML_F32, "F32", 1, 4},           {MK_GGML_F16, "F16", 1, 2},
    {MK_GGML_Q4_0, "Q4_0", 32, 18},       {MK_GGML_Q4_1, "Q4_1", 32, 20},
    {MK_GGML_Q5_0, "Q5_0", 32, 22},       {MK_GGML_Q5_1, "Q5_1", 32, 24},
    {MK_GGML_Q8_0, "Q8_0", 32, 34},       {MK_GGML_Q8_1, "Q8_1", 32, 36},
    {MK_GGML_Q2_K, "Q2_K", 256, 84},      {MK_GGML_Q3_K, "Q3_K", 256, 110},
    {MK_GGML_Q4_K, "Q4_K", 256, 144},     {MK_GGML_Q5_K, "Q5_K", 256, 176},
    {MK_GGML_Q6_K, "Q6_K", 256, 210},     {MK_GGML_Q8_K, "Q8_K", 256, 292},
    {MK_GGML_IQ2_XXS, "IQ2_XXS", 256, 66}, {MK_GGML_IQ2_XS, "IQ2_XS", 256, 74},
    {MK_GGML_IQ3_XXS, "IQ3_XXS", 256, 98}, {MK_GGML_IQ1_S, "IQ1_S", 256, 50},
    {MK_GGML_IQ4_NL, "IQ4_NL", 32, 18},   {MK_GGML_IQ3_S, "IQ3_S", 256, 110},
    {MK_GGML_IQ2_S, "IQ2_S", 256, 82},    {MK_GGML_IQ4_XS, "IQ4_XS", 256, 136},
    {MK_GGML_I8, "I8", 1, 1},             {MK_GGML_I16, "I16", 1, 2},
    {MK_GGML_I32, "I32", 1, 4},           {MK_GGML_I64, "I64", 1, 8},
    {MK_GGML_F64, "F64", 1, 8},           {MK_GGML_IQ1_M, "IQ1_M", 256, 56},
    {MK_GGML_BF16, "BF16", 1, 2},         {MK_GGML_TQ1_0, "TQ1_0", 256, 54},
    {MK_GGML_TQ2_0, "TQ2_0", 256, 66},    {MK_GGML_MXFP4, "MXFP4", 32, 17},
};
#define N_GGML_TYPES (sizeof GGML_TYPES / sizeof GGML_TYPES[0])

const char *mk_ggml_type_name(uint32_t type) {
    for (size_t i = 0; i < N_GGML_TYPES; i++)
        if (GGML_TYPES[i].id == type) return GGML_TYPES[i].name;
    return "unknown";
}

int mk_ggml_type_size(uint32_t type, int *block_elems, int *block_bytes) {
    int e = 0, b = 0;
    for (size_t i = 0; i < N_GGML_TYPES; i++)
        if (GGML_TYPES[i].id == type) {
            e = GGML_TYPES[i].blk;
            b = GGML_TYPES[i].bytes;
            break;
        }
    if (block_elems) *block_elems = e;
    if (block_bytes) *block_bytes = b;
    return b;
}

/* ---- metadata value types -------------------------------------------------------------------- */

static const char *const VT_NAMES[MK_GGUF_T_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool",  "string", "array", "uint64", "int64", "float64",
};

const char *mk_gguf_type_name(int type) {
    return type >= 0 && type < MK_GGUF_T_COUNT ? VT_NAMES[type] : "unknown";
}

/* Size of a fixed-size value type; 0 for string and array (variable) and unknown types. */
static unsigned vt_size(int t) {
    switch (t) {
    case MK_GGUF_T_UINT8: case MK_GGUF_T_INT8: case MK_GGUF_T_BOOL: return 1;
    case MK_GGUF_T_UINT16: case MK_GGUF_T_INT16: return 2;
    case MK_GGUF_T_UINT32: case MK_GGUF_T_INT32: case MK_GGUF_T_FLOAT32: return 4;
    case MK_GGUF_T_UINT64: case MK_GGUF_T_INT64: case MK_GGUF_T_FLOAT64: return 8;
    default: return 0;
    }
}

static int vt_is_int(int t) {
    return t == MK_GGUF_T_UINT8 || t == MK_GGUF_T_INT8 || t == MK_GGUF_T_UINT16 ||
           t == MK_GGUF_T_INT16 || t == MK_GGUF_T_UINT32 || t == MK_GGUF_T_INT32 ||
           t == MK_GGUF_T_UINT64 || t == MK_GGUF_T_INT64;
}

/* ---- little-endian reads (alignment-free) ---------------------------------------------------- */

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

static float lef32(const uint8_t *p) {
    uint32_t u = le32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static double lef64(const uint8_t *p) {
    uint64_t u = le64(p);
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* Integer value of type t at p: signed types into *s (and *neg = 1 when < 0), all into *u when
 * non-negative. */
static void read_int(int t, const uint8_t *p, uint64_t *u, int64_t *s) {
    int64_t v;
    switch (t) {
    case MK_GGUF_T_UINT8: *u = p[0]; *s = (int64_t)*u; return;
    case MK_GGUF_T_UINT16: *u = le16(p); *s = (int64_t)*u; return;
    case MK_GGUF_T_UINT32: *u = le32(p); *s = (int64_t)*u; return;
    case MK_GGUF_T_UINT64: *u = le64(p); *s = *u > INT64_MAX ? INT64_MAX : (int64_t)*u; return;
    case MK_GGUF_T_INT8: v = (int8_t)p[0]; break;
    case MK_GGUF_T_INT16: v = (int16_t)le16(p); break;
    case MK_GGUF_T_INT32: v = (int32_t)le32(p); break;
    default: v = (int64_t)le64(p); break;
    }
    *s = v;
    *u = v < 0 ? 0 : (uint64_t)v;
}

/* ---- small helpers --------------------------------------------------------------------------- */

static uint64_t fnv1a(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

/* Printable form of n raw bytes for messages: non-printables as \xNN, cut to ~100 chars. */
static const char *esc(char *buf, size_t cap, const void *p, uint64_t n) {
    const uint8_t *s = p;
    size_t o = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (o + 8 >= cap || i >= 100) {
            if (o + 4 < cap) memcpy(buf + o, "...", 3), o += 3;
            break;
        }
        if (s[i] >= 0x20 && s[i] < 0x7f && s[i] != '\'' && s[i] != '\\') buf[o++] = (char)s[i];
        else o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", s[i]);
    }
    buf[o] = 0;
    return buf;
}

/* ---- the cursor ------------------------------------------------------------------------------ */

typedef struct {
    const uint8_t *b;
    size_t len, pos;
    const char *fname;
    mk_err *err;
    char ctx[256];  /* "metadata entry #3 ('general.name')" — what is being read */
} cursor;

/* Fails unless n more bytes are available for `what`. */
static int need(cursor *c, uint64_t n, const char *what) {
    if (n <= c->len - c->pos) return MK_OK;
    return mk_fail(c->err, MK_EFORMAT,
                   "%s: %s: truncated file: %s needs %llu bytes at offset %zu but only %zu remain "
                   "(file is %zu bytes)", c->fname, c->ctx, what, (unsigned long long)n, c->pos,
                   c->len - c->pos, c->len);
}

static int get_u32(cursor *c, uint32_t *v, const char *what) {
    int rc = need(c, 4, what);
    if (rc) return rc;
    *v = le32(c->b + c->pos);
    c->pos += 4;
    return MK_OK;
}

static int get_u64(cursor *c, uint64_t *v, const char *what) {
    int rc = need(c, 8, what);
    if (rc) return rc;
    *v = le64(c->b + c->pos);
    c->pos += 8;
    return MK_OK;
}

/* A GGUF string: u64 length + bytes. The length is checked against the bytes left. */
static int get_str(cursor *c, const uint8_t **p, uint64_t *n, const char *what) {
    size_t at = c->pos;
    int rc = get_u64(c, n, what);
    if (rc) return rc;
    if (*n > c->len - c->pos)
        return mk_fail(c->err, MK_EFORMAT,
                       "%s: %s: %s length %llu (at offset %zu) runs past the end of the file: only "
                       "%zu bytes remain", c->fname, c->ctx, what, (unsigned long long)*n, at,
                       c->len - c->pos);
    *p = c->b + c->pos;
    c->pos += (size_t)*n;
    return MK_OK;
}

/* A key or tensor name: non-empty and NUL-free (they are handed out as C strings). */
static int get_name(cursor *c, const uint8_t **p, uint64_t *n, const char *what) {
    int rc = get_str(c, p, n, what);
    if (rc) return rc;
    if (!*n) return mk_fail(c->err, MK_EFORMAT, "%s: %s: empty %s", c->fname, c->ctx, what);
    const void *z = memchr(*p, 0, (size_t)*n);
    if (z) {
        char e[512];
        return mk_fail(c->err, MK_EFORMAT, "%s: %s: %s '%s' contains a NUL byte at position %td",
                       c->fname, c->ctx, what, esc(e, sizeof e, *p, *n),
                       (const uint8_t *)z - *p);
    }
    return MK_OK;
}

/* ---- the object ------------------------------------------------------------------------------ */

void mk_gguf_close(mk_gguf *g) {
    if (!g) return;
    if (g->map) munmap((void *)g->map, g->len);
    free(g->fname);
    free(g->kv);
    free(g->t);
    free(g->tname_len);
    free(g->kslots);
    free(g->tslots);
    free(g->pool);
    free(g->soffs);
    free(g);
}

/* Grows a table by doubling from 64 entries, so that a large declared count costs memory only as
 * its entries actually parse. */
static int grow(void **p, size_t *cap, size_t need_n, size_t elem) {
    if (need_n <= *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 64;
    while (nc < need_n) nc *= 2;
    if (nc > SIZE_MAX / elem) return -1;
    void *q = realloc(*p, nc * elem);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

/* ---- phase 2: metadata ----------------------------------------------------------------------- */

/* Reads one value of fixed-size type t (scalar or array element); checks bool bytes. */
static int get_fixed(cursor *c, int t, const char *what) {
    unsigned sz = vt_size(t);
    int rc = need(c, sz, what);
    if (rc) return rc;
    if (t == MK_GGUF_T_BOOL && c->b[c->pos] > 1)
        return mk_fail(c->err, MK_EFORMAT, "%s: %s: bool value %u at offset %zu (expected 0 or 1)",
                       c->fname, c->ctx, c->b[c->pos], c->pos);
    c->pos += sz;
    return MK_OK;
}

static int parse_value(cursor *c, gg_kv *kv) {
    int rc;
    size_t at = c->pos;
    uint32_t t;
    if ((rc = get_u32(c, &t, "value type"))) return rc;
    if (t >= MK_GGUF_T_COUNT)
        return mk_fail(c->err, MK_EFORMAT,
                       "%s: %s: unknown value type %u at offset %zu (expected 0..%d)", c->fname,
                       c->ctx, t, at, MK_GGUF_T_COUNT - 1);
    kv->type = (int)t;
    kv->val = c->b + c->pos;
    if (t == MK_GGUF_T_STRING) {
        const uint8_t *p;
        if ((rc = get_str(c, &p, &kv->slen, "string value"))) return rc;
        kv->val = p;
        return MK_OK;
    }
    if (t != MK_GGUF_T_ARRAY) return get_fixed(c, (int)t, "value");

    uint32_t et;
    uint64_t n;
    at = c->pos;
    if ((rc = get_u32(c, &et, "array element type"))) return rc;
    if (et == MK_GGUF_T_ARRAY)
        return mk_fail(c->err, MK_ENOTSUP,
                       "%s: %s: arrays of arrays (nested arrays) are not supported", c->fname,
                       c->ctx);
    if (et >= MK_GGUF_T_COUNT)
        return mk_fail(c->err, MK_EFORMAT,
                       "%s: %s: unknown array element type %u at offset %zu (expected 0..%d, not 9)",
                       c->fname, c->ctx, et, at, MK_GGUF_T_COUNT - 1);
    if ((rc = get_u64(c, &n, "array length"))) return rc;
    /* each element takes at least 8 bytes (a string's length) or its fixed size */
    uint64_t esz = et == MK_GGUF_T_STRING ? 8 : vt_size((int)et);
    if (n > (c->len - c->pos) / esz)
        return mk_fail(c->err, MK_EFORMAT,
                       "%s: %s: array of %llu %s elements cannot fit in the %zu bytes left in the "
                       "file (at least %llu bytes each)", c->fname, c->ctx, (unsigned long long)n,
                       mk_gguf_type_name((int)et), c->len - c->pos, (unsigned long long)esz);
    kv->arr_type = (int)et;
    kv->n = n;
    kv->val = c->b + c->pos;
    if (et == MK_GGUF_T_STRING) {
        /* the fast path checks bounds inline; get_str re-reads a failing element for the message */
        for (uint64_t i = 0; i < n; i++) {
            size_t left = c->len - c->pos;
            if (left >= 8 && le64(c->b + c->pos) <= left - 8) {
                c->pos += 8 + (size_t)le64(c->b + c->pos);
                continue;
            }
            const uint8_t *p;
            uint64_t sl;
            char what[64];
            snprintf(what, sizeof what, "array element %llu", (unsigned long long)i);
            return get_str(c, &p, &sl, what);
        }
    } else if (et == MK_GGUF_T_BOOL) {
        for (uint64_t i = 0; i < n; i++)
            if ((rc = get_fixed(c, (int)et, "array element"))) return rc;
    } else {
        c->pos += (size_t)(n * esz); /* bounded above */
    }
    return MK_OK;
}

static int parse_kvs(mk_gguf *g, cursor *c, uint64_t n_kv) {
    char e[512];
    for (uint64_t i = 0; i < n_kv; i++) {
        snprintf(c->ctx, sizeof c->ctx, "metadata entry #%llu", (unsigned long long)i);
        if (grow((void **)&g->kv, &g->cap_kv, g->n_kv + 1, sizeof *g->kv))
            return mk_fail(c->err, MK_ENOMEM, "%s: out of memory for the metadata table", c->fname);
        gg_kv *kv = &g->kv[g->n_kv];
        memset(kv, 0, sizeof *kv);
        int rc = get_name(c, &kv->kraw, &kv->klen, "key");
        if (rc) return rc;
        snprintf(c->ctx, sizeof c->ctx, "metadata entry #%llu ('%s')", (unsigned long long)i,
                 esc(e, sizeof e, kv->kraw, kv->klen));
        if ((rc = parse_value(c, kv))) return rc;
        g->n_kv++;
    }
    return MK_OK;
}

/* ---- phase 3: tensor directory --------------------------------------------------------------- */

static int parse_tensor_infos(mk_gguf *g, cursor *c, uint64_t n_t) {
    char e[512];
    for (uint64_t i = 0; i < n_t; i++) {
        snprintf(c->ctx, sizeof c->ctx, "tensor #%llu", (unsigned long long)i);
        if (grow((void **)&g->t, &g->cap_t, g->n_t + 1, sizeof *g->t) ||
            grow((void **)&g->tname_len, &g->cap_tn, g->n_t + 1, sizeof *g->tname_len))
            return mk_fail(c->err, MK_ENOMEM, "%s: out of memory for the tensor table", c->fname);
        mk_gguf_tensor *t = &g->t[g->n_t];
        memset(t, 0, sizeof *t);
        const uint8_t *name;
        uint64_t nl;
        int rc = get_name(c, &name, &nl, "tensor name");
        if (rc) return rc;
        snprintf(c->ctx, sizeof c->ctx, "tensor #%llu '%s'", (unsigned long long)i,
                 esc(e, sizeof e, name, nl));
        uint32_t nd, type;
        if ((rc = get_u32(c, &nd, "n_dims"))) return rc;
        if (nd < 1 || nd > MK_GGUF_MAX_DIMS)
            return mk_fail(c->err, MK_EFORMAT, "%s: %s: n_dims is %u (expected 1..%d)", c->fname,
                           c->ctx, nd, MK_GGUF_MAX_DIMS);
        for (int d = 0; d < MK_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < nd; d++) {
            if ((rc = get_u64(c, &t->ne[d], "dimension"))) return rc;
            if (t->ne[d] > INT64_MAX)
                return mk_fail(c->err, MK_EFORMAT, "%s: %s: ne[%u] = %lld is negative", c->fname,
                               c->ctx, d, (long long)t->ne[d]);
        }
        if ((rc = get_u32(c, &type, "ggml type"))) return rc;
        if ((rc = get_u64(c, &t->offset, "data offset"))) return rc;
        t->name = (const char *)name; /* raw until phase 5 */
        t->n_dims = (int)nd;
        t->type = type;
        g->tname_len[g->n_t++] = nl;
    }
    return MK_OK;
}

/* ---- phase 4: names, alignment, tensor ranges ------------------------------------------------ */

/* Hash tables over the raw key / tensor-name bytes; duplicates are rejected. */
static int build_kv_index(mk_gguf *g, mk_err *err) {
    size_t ns = 16;
    while (ns < 2 * g->n_kv) ns *= 2;
    g->kslots = calloc(ns, sizeof *g->kslots);
    if (!g->kslots) return mk_fail(err, MK_ENOMEM, "%s: out of memory for the key index", g->fname);
    g->nkslots = ns;
    for (size_t i = 0; i < g->n_kv; i++) {
        const gg_kv *kv = &g->kv[i];
        size_t h = (size_t)fnv1a(kv->kraw, (size_t)kv->klen) & (ns - 1);
        while (g->kslots[h]) {
            const gg_kv *o = &g->kv[g->kslots[h] - 1];
            if (o->klen == kv->klen && !memcmp(o->kraw, kv->kraw, (size_t)kv->klen)) {
                char e[512];
                return mk_fail(err, MK_EFORMAT,
                               "%s: duplicate metadata key '%s' (entries #%zu and #%zu)", g->fname,
                               esc(e, sizeof e, kv->kraw, kv->klen), g->kslots[h] - 1, i);
            }
            h = (h + 1) & (ns - 1);
        }
        g->kslots[h] = i + 1;
    }
    return MK_OK;
}

static int build_tensor_index(mk_gguf *g, mk_err *err) {
    size_t ns = 16;
    while (ns < 2 * g->n_t) ns *= 2;
    g->tslots = calloc(ns, sizeof *g->tslots);
    if (!g->tslots)
        return mk_fail(err, MK_ENOMEM, "%s: out of memory for the tensor index", g->fname);
    g->ntslots = ns;
    for (size_t i = 0; i < g->n_t; i++) {
        const char *nm = g->t[i].name;
        size_t nl = (size_t)g->tname_len[i];
        size_t h = (size_t)fnv1a(nm, nl) & (ns - 1);
        while (g->tslots[h]) {
            size_t j = g->tslots[h] - 1;
            if (g->tname_len[j] == nl && !memcmp(g->t[j].name, nm, nl)) {
                char e[512];
                return mk_fail(err, MK_EFORMAT,
                               "%s: duplicate tensor name '%s' (tensors #%zu and #%zu)", g->fname,
                               esc(e, sizeof e, nm, nl), j, i);
            }
            h = (h + 1) & (ns - 1);
        }
        g->tslots[h] = i + 1;
    }
    return MK_OK;
}

static const gg_kv *lookup(const mk_gguf *g, const char *key) {
    if (!g || !key || !g->nkslots) return NULL;
    size_t kl = strlen(key);
    size_t h = (size_t)fnv1a(key, kl) & (g->nkslots - 1);
    while (g->kslots[h]) {
        const gg_kv *kv = &g->kv[g->kslots[h] - 1];
        if (kv->klen == kl && !memcmp(kv->kraw, key, kl)) return kv;
        h = (h + 1) & (g->nkslots - 1);
    }
    return NULL;
}

static int read_alignment(mk_gguf *g, mk_err *err) {
    g->alignment = MK_GGUF_DEFAULT_ALIGNMENT;
    const gg_kv *kv = lookup(g, "general.alignment");
    if (!kv) return MK_OK;
    if (kv->type != MK_GGUF_T_UINT32)
        return mk_fail(err, MK_EFORMAT, "%s: general.alignment: expected uint32, found %s",
                       g->fname, mk_gguf_type_name(kv->type));
    uint32_t a = le32(kv->val);
    if (a == 0 || (a & (a - 1)))
        return mk_fail(err, MK_EFORMAT,
                       "%s: general.alignment is %u (expected a non-zero power of two)", g->fname,
                       a);
    g->alignment = a;
    return MK_OK;
}

static int cmp_offset(const void *a, const void *b, void *ctx) {
    const mk_gguf_tensor *t = ctx;
    const mk_gguf_tensor *x = &t[*(const size_t *)a], *y = &t[*(const size_t *)b];
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Byte size of every tensor from its ggml type; alignment, bounds and overlap of its range.
 * dir_end is where the tensor directory ended. */
static int check_tensors(mk_gguf *g, size_t dir_end, mk_err *err) {
    uint64_t a = g->alignment;
    /* dir_end <= len < SIZE_MAX, so the round-up cannot overflow 64 bits */
    uint64_t ds = ((uint64_t)dir_end + a - 1) / a * a;
    g->data_off = ds;
    if (!g->n_t) return MK_OK;
    if (ds > g->len)
        return mk_fail(err, MK_EFORMAT,
                       "%s: truncated file: the tensor data section starts at offset %llu (the "
                       "directory ends at %zu, aligned to %llu) but the file has %zu bytes",
                       g->fname, (unsigned long long)ds, dir_end, (unsigned long long)a, g->len);
    uint64_t dlen = g->len - ds;
    char e[512];
    for (size_t i = 0; i < g->n_t; i++) {
        mk_gguf_tensor *t = &g->t[i];
        const char *nm = esc(e, sizeof e, t->name, g->tname_len[i]);
        int blk, bb;
        if (!mk_ggml_type_size(t->type, &blk, &bb))
            return mk_fail(err, MK_EFORMAT, "%s: tensor '%s': unknown ggml type %u", g->fname, nm,
                           t->type);
        if (t->ne[0] % (uint64_t)blk)
            return mk_fail(err, MK_EFORMAT,
                           "%s: tensor '%s': ne[0] = %llu is not a multiple of the %s block size %d",
                           g->fname, nm, (unsigned long long)t->ne[0], mk_ggml_type_name(t->type),
                           blk);
        /* element count must fit int64 (ggml's limit); a zero dim makes the tensor empty */
        uint64_t numel = 1, rows = 1;
        int zero = 0;
        for (int d = 0; d < t->n_dims; d++) zero |= t->ne[d] == 0;
        if (!zero)
            for (int d = 0; d < t->n_dims; d++) {
                if (numel > (uint64_t)INT64_MAX / t->ne[d])
                    return mk_fail(err, MK_EFORMAT,
                                   "%s: tensor '%s': shape [%llu, %llu, %llu, %llu] overflows the "
                                   "element count", g->fname, nm, (unsigned long long)t->ne[0],
                                   (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                                   (unsigned long long)t->ne[3]);
                numel *= t->ne[d];
                if (d) rows *= t->ne[d];
            }
        uint64_t nb = 0;
        if (!zero) {
            uint64_t row = t->ne[0] / (uint64_t)blk * (uint64_t)bb; /* <= 8 * ne[0]: no overflow */
            if (row > UINT64_MAX / rows || row * rows > SIZE_MAX)
                return mk_fail(err, MK_EFORMAT, "%s: tensor '%s': byte size overflows", g->fname,
                               nm);
            nb = row * rows;
        }
        if (t->offset % a)
            return mk_fail(err, MK_EFORMAT,
                           "%s: tensor '%s': data offset %llu is not a multiple of the alignment "
                           "%llu", g->fname, nm, (unsigned long long)t->offset,
                           (unsigned long long)a);
        if (t->offset > dlen || nb > dlen - t->offset)
            return mk_fail(err, MK_EFORMAT,
                           "%s: tensor '%s' (%s, %llu bytes at data offset %llu) extends beyond the "
                           "end of the file: the data section holds %llu bytes (starts at %llu, "
                           "file is %zu bytes)", g->fname, nm, mk_ggml_type_name(t->type),
                           (unsigned long long)nb, (unsigned long long)t->offset,
                           (unsigned long long)dlen, (unsigned long long)ds, g->len);
        t->nbytes = (size_t)nb;
        t->data = g->buf + ds + t->offset;
        g->total += t->nbytes;
    }
    /* overlap: sort indices by offset and compare each start with the furthest end so far;
     * empty tensors own no bytes. */
    size_t *ix = malloc(g->n_t * sizeof *ix);
    if (!ix) return mk_fail(err, MK_ENOMEM, "%s: out of memory", g->fname);
    for (size_t i = 0; i < g->n_t; i++) ix[i] = i;
    qsort_r(ix, g->n_t, sizeof *ix, cmp_offset, g->t);
    uint64_t hi = 0;
    size_t hi_i = SIZE_MAX;
    int rc = MK_OK;
    for (size_t k = 0; k < g->n_t; k++) {
        const mk_gguf_tensor *t = &g->t[ix[k]];
        if (!t->nbytes) continue;
        if (hi_i != SIZE_MAX && t->offset < hi) {
            const mk_gguf_tensor *o = &g->t[hi_i];
            char e2[512];
            rc = mk_fail(err, MK_EFORMAT,
                         "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap", g->fname,
                         esc(e, sizeof e, o->name, g->tname_len[hi_i]),
                         (unsigned long long)o->offset, (unsigned long long)(o->offset + o->nbytes),
                         esc(e2, sizeof e2, t->name, g->tname_len[ix[k]]),
                         (unsigned long long)t->offset, (unsigned long long)(t->offset + t->nbytes));
            break;
        }
        if (t->offset + t->nbytes > hi) {
            hi = t->offset + t->nbytes;
            hi_i = ix[k];
        }
    }
    free(ix);
    return rc;
}

/* ---- phase 5: string pool and string-array index --------------------------------------------- */

static int finish(mk_gguf *g, mk_err *err) {
    /* pool: every piece is a string of the directory, so the sum is bounded by the file size */
    size_t need_b = 1, n_soff = 0;
    for (size_t i = 0; i < g->n_kv; i++) {
        need_b += (size_t)g->kv[i].klen + 1;
        if (g->kv[i].type == MK_GGUF_T_STRING) need_b += (size_t)g->kv[i].slen + 1;
        if (g->kv[i].type == MK_GGUF_T_ARRAY && g->kv[i].arr_type == MK_GGUF_T_STRING)
            n_soff += (size_t)g->kv[i].n;
    }
    for (size_t i = 0; i < g->n_t; i++) need_b += (size_t)g->tname_len[i] + 1;
    g->pool = malloc(need_b);
    g->soffs = malloc((n_soff ? n_soff : 1) * sizeof *g->soffs);
    if (!g->pool || !g->soffs)
        return mk_fail(err, MK_ENOMEM, "%s: out of memory for names and string tables", g->fname);
    char *p = g->pool;
    uint64_t *so = g->soffs;
    for (size_t i = 0; i < g->n_kv; i++) {
        gg_kv *kv = &g->kv[i];
        memcpy(p, kv->kraw, (size_t)kv->klen);
        p[kv->klen] = 0;
        kv->key = p;
        p += kv->klen + 1;
        if (kv->type == MK_GGUF_T_STRING) {
            memcpy(p, kv->val, (size_t)kv->slen);
            p[kv->slen] = 0;
            kv->str = p;
            p += kv->slen + 1;
        } else if (kv->type == MK_GGUF_T_ARRAY && kv->arr_type == MK_GGUF_T_STRING) {
            /* elements were bounds-checked in phase 2; walk them again to record offsets */
            kv->soff = so;
            size_t o = (size_t)(kv->val - g->buf);
            for (uint64_t k = 0; k < kv->n; k++) {
                *so++ = o;
                o += 8 + (size_t)le64(g->buf + o);
            }
        }
    }
    for (size_t i = 0; i < g->n_t; i++) {
        size_t nl = (size_t)g->tname_len[i];
        memcpy(p, g->t[i].name, nl);
        p[nl] = 0;
        g->t[i].name = p;
        p += nl + 1;
    }
    return MK_OK;
}

/* ---- phase 1 and the driver ------------------------------------------------------------------ */

static int parse(mk_gguf *g, mk_err *err) {
    const uint8_t *b = g->buf;
    size_t len = g->len;
    const char *fn = g->fname;
    if (len < 4)
        return mk_fail(err, MK_EFORMAT,
                       "%s: truncated file: %zu bytes, need at least %u for the GGUF header", fn,
                       len, HEADER_BYTES);
    if (memcmp(b, "GGUF", 4)) {
        char e[64];
        return mk_fail(err, MK_EFORMAT, "%s: bad magic '%s' (expected \"GGUF\"): not a GGUF file",
                       fn, esc(e, sizeof e, b, 4));
    }
    if (len < HEADER_BYTES)
        return mk_fail(err, MK_EFORMAT,
                       "%s: truncated file: %zu bytes, need at least %u for the GGUF header", fn,
                       len, HEADER_BYTES);
    uint32_t v = le32(b + 4);
    uint32_t sw = __builtin_bswap32(v);
    if (v == 1)
        return mk_fail(err, MK_ENOTSUP,
                       "%s: GGUF version 1 is not supported (it has 32-bit counts and lengths); "
                       "supported versions are 2 and 3: re-convert the model with a current "
                       "converter", fn);
    if (v > 0xffff && sw >= 1 && sw <= 3)
        return mk_fail(err, MK_ENOTSUP,
                       "%s: big-endian GGUF is not supported (version field reads 0x%08x, i.e. "
                       "version %u byte-swapped); use a little-endian GGUF file", fn, v, sw);
    if (v != 2 && v != 3)
        return mk_fail(err, v > 3 ? MK_ENOTSUP : MK_EFORMAT,
                       "%s: unsupported GGUF version %u (supported versions are 2 and 3)", fn, v);
    g->version = (int)v;
    uint64_t n_t = le64(b + 8), n_kv = le64(b + 16);
    size_t rem = len - HEADER_BYTES;
    if (n_kv > rem / KV_MIN_BYTES)
        return mk_fail(err, MK_EFORMAT,
                       "%s: metadata count %llu cannot fit in the %zu bytes after the header (each "
                       "entry needs at least %u bytes)", fn, (unsigned long long)n_kv, rem,
                       KV_MIN_BYTES);
    if (n_t > rem / TI_MIN_BYTES)
        return mk_fail(err, MK_EFORMAT,
                       "%s: tensor count %llu cannot fit in the %zu bytes after the header (each "
                       "tensor info needs at least %u bytes)", fn, (unsigned long long)n_t, rem,
                       TI_MIN_BYTES);
    if (n_kv * KV_MIN_BYTES + n_t * TI_MIN_BYTES > rem)
        return mk_fail(err, MK_EFORMAT,
                       "%s: %llu metadata entries and %llu tensor infos cannot fit in the %zu bytes "
                       "after the header", fn, (unsigned long long)n_kv, (unsigned long long)n_t,
                       rem);
    cursor c = {.b = b, .len = len, .pos = HEADER_BYTES, .fname = fn, .err = err};
    int rc;
    if ((rc = parse_kvs(g, &c, n_kv))) return rc;
    if ((rc = build_kv_index(g, err))) return rc;
    if ((rc = read_alignment(g, err))) return rc;
    if ((rc = parse_tensor_infos(g, &c, n_t))) return rc;
    if ((rc = build_tensor_index(g, err))) return rc;
    if ((rc = check_tensors(g, c.pos, err))) return rc;
    return finish(g, err);
}

static int make(const uint8_t *buf, size_t len, const void *map, const char *fname, mk_gguf **out,
                mk_err *err) {
    mk_gguf *g = calloc(1, sizeof *g);
    size_t fl = strlen(fname) + 1;
    char *fn = malloc(fl);
    if (!g || !fn) {
        free(g);
        free(fn);
        if (map) munmap((void *)map, len);
        return mk_fail(err, MK_ENOMEM, "%s: out of memory", fname);
    }
    memcpy(fn, fname, fl);
    g->buf = buf;
    g->len = len;
    g->map = map;
    g->fname = fn;
    int rc = parse(g, err);
    if (rc) {
        mk_gguf_close(g);
        return rc;
    }
    *out = g;
    return MK_OK;
}

int mk_gguf_parse(const uint8_t *buf, size_t len, const char *fname, mk_gguf **out, mk_err *err) {
    *out = NULL;
    if (!fname) fname = "<buffer>";
    if (!buf && len) return mk_fail(err, MK_EINVAL, "%s: NULL buffer", fname);
    static const uint8_t empty[1];
    return make(buf ? buf : empty, len, NULL, fname, out, err);
}

/* The file size is checked against every range before any byte is touched, so a truncated file
 * fails cleanly instead of faulting (SIGBUS) on the mapping. */
int mk_gguf_open(const char *path, mk_gguf **out, mk_err *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mk_fail(err, MK_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb)) {
        int e = errno;
        close(fd);
        return mk_fail(err, MK_EIO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return mk_fail(err, MK_EIO, "%s: not a regular file", path);
    }
    if (sb.st_size == 0) {
        close(fd);
        return mk_fail(err, MK_EFORMAT, "%s: empty file (0 bytes)", path);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return mk_fail(err, MK_EIO, "%s: file too large to map", path);
    }
    size_t len = (size_t)sb.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return mk_fail(err, MK_EIO, "cannot mmap %s: %s", path, strerror(e));
    return make(map, len, map, path, out, err);
}

/* ---- queries --------------------------------------------------------------------------------- */

int mk_gguf_version(const mk_gguf *g) { return g ? g->version : 0; }
uint32_t mk_gguf_alignment(const mk_gguf *g) { return g ? g->alignment : 0; }
uint64_t mk_gguf_data_offset(const mk_gguf *g) { return g ? g->data_off : 0; }
const char *mk_gguf_fname(const mk_gguf *g) { return g ? g->fname : "?"; }
size_t mk_gguf_n_kv(const mk_gguf *g) { return g ? g->n_kv : 0; }
const char *mk_gguf_key(const mk_gguf *g, size_t i) {
    return g && i < g->n_kv ? g->kv[i].key : NULL;
}
int mk_gguf_kv_type(const mk_gguf *g, size_t i) { return g && i < g->n_kv ? g->kv[i].type : -1; }

int64_t mk_gguf_find_key(const mk_gguf *g, const char *key) {
    const gg_kv *kv = lookup(g, key);
    return kv ? (int64_t)(kv - g->kv) : -1;
}

/* "array[string; 3]" or "uint32" for messages. */
static const char *kv_type_desc(const gg_kv *kv, char *buf, size_t cap) {
    if (kv->type == MK_GGUF_T_ARRAY)
        snprintf(buf, cap, "array[%s; %llu]", mk_gguf_type_name(kv->arr_type),
                 (unsigned long long)kv->n);
    else
        snprintf(buf, cap, "%s", mk_gguf_type_name(kv->type));
    return buf;
}

/* Looks key up; handles absence (found flag, or MK_EFORMAT when found == NULL). *kv = NULL and
 * MK_OK when absent but optional. */
static int find_kv(const mk_gguf *g, const char *key, int *found, const gg_kv **kv, mk_err *err) {
    *kv = lookup(g, key);
    if (found) *found = *kv != NULL;
    if (!*kv && !found)
        return mk_fail(err, MK_EFORMAT, "%s: missing required metadata key '%.200s'",
                       mk_gguf_fname(g), key);
    return MK_OK;
}

static int wrong_type(const mk_gguf *g, const gg_kv *kv, const char *want, mk_err *err) {
    char d[96];
    return mk_fail(err, MK_EFORMAT, "%s: metadata key '%.200s': expected %s, found %s", g->fname,
                   kv->key, want, kv_type_desc(kv, d, sizeof d));
}

int mk_gguf_get_u32(const mk_gguf *g, const char *key, uint32_t *out, int *found, mk_err *err) {
    const gg_kv *kv;
    int rc = find_kv(g, key, found, &kv, err);
    if (rc || !kv) return rc;
    if (!vt_is_int(kv->type)) return wrong_type(g, kv, "an integer (uint32)", err);
    uint64_t u;
    int64_t s;
    read_int(kv->type, kv->val, &u, &s);
    if (s < 0 || u > UINT32_MAX)
        return mk_fail(err, MK_EFORMAT,
                       "%s: metadata key '%.200s': %s value %s%llu does not fit in uint32",
                       g->fname, kv->key, mk_gguf_type_name(kv->type), s < 0 ? "-" : "",
                       s < 0 ? (unsigned long long)(-(s + 1)) + 1 : (unsigned long long)u);
    *out = (uint32_t)u;
    return MK_OK;
}

int mk_gguf_get_i64(const mk_gguf *g, const char *key, int64_t *out, int *found, mk_err *err) {
    const gg_kv *kv;
    int rc = find_kv(g, key, found, &kv, err);
    if (rc || !kv) return rc;
    if (!vt_is_int(kv->type)) return wrong_type(g, kv, "an integer (int64)", err);
    uint64_t u;
    int64_t s;
    read_int(kv->type, kv->val, &u, &s);
    if (kv->type == MK_GGUF_T_UINT64 && u > INT64_MAX)
        return mk_fail(err, MK_EFORMAT, "%s: metadata key '%.200s': uint64 value %llu does not fit "
                       "in int64", g->fname, kv->key, (unsigned long long)u);
    *out = s;
    return MK_OK;
}

int mk_gguf_get_f32(const mk_gguf *g, const char *key, float *out, int *found, mk_err *err) {
    const gg_kv *kv;
    int rc = find_kv(g, key, found, &kv, err);
    if (rc || !kv) return rc;
    if (kv->type == MK_GGUF_T_FLOAT32) {
        *out = lef32(kv->val);
        return MK_OK;
    }
    if (kv->type != MK_GGUF_T_FLOAT64) return wrong_type(g, kv, "float32 or float64", err);
    double d = lef64(kv->val);
    if (isfinite(d) && fabs(d) > FLT_MAX)
        return mk_fail(err, MK_EFORMAT, "%s: metadata key '%.200s': float64 value %g does not fit "
                       "in float32", g->fname, kv->key, d);
    *out = (float)d;
    return MK_OK;
}

int mk_gguf_get_str(const mk_gguf *g, const char *key, const char **s, size_t *len, int *found,
                    mk_err *err) {
    const gg_kv *kv;
    int rc = find_kv(g, key, found, &kv, err);
    if (rc || !kv) return rc;
    if (kv->type != MK_GGUF_T_STRING) return wrong_type(g, kv, "string", err);
    *s = kv->str;
    if (len) *len = (size_t)kv->slen;
    return MK_OK;
}

int mk_gguf_get_bool(const mk_gguf *g, const char *key, int *out, int *found, mk_err *err) {
    const gg_kv *kv;
    int rc = find_kv(g, key, found, &kv, err);
    if (rc || !kv) return rc;
    if (kv->type != MK_GGUF_T_BOOL) return wrong_type(g, kv, "bool", err);
    *out = kv->val[0] != 0;
    return MK_OK;
}

int mk_gguf_get_arr(const mk_gguf *g, const char *key, int *elem_type, uint64_t *n,
                    const void **data, int *found, mk_err *err) {
    const gg_kv *kv;
    int rc = find_kv(g, key, found, &kv, err);
    if (rc || !kv) return rc;
    if (kv->type != MK_GGUF_T_ARRAY) return wrong_type(g, kv, "an array", err);
    if (elem_type) *elem_type = kv->arr_type;
    if (n) *n = kv->n;
    if (data) *data = kv->val;
    return MK_OK;
}

int mk_gguf_arr_str(const mk_gguf *g, const char *key, uint64_t i, const char **s, size_t *len) {
    const gg_kv *kv = lookup(g, key);
    if (!kv || kv->type != MK_GGUF_T_ARRAY || kv->arr_type != MK_GGUF_T_STRING || i >= kv->n)
        return MK_EINVAL;
    const uint8_t *p = g->buf + kv->soff[i];
    *s = (const char *)p + 8;
    if (len) *len = (size_t)le64(p);
    return MK_OK;
}

/* Shared front of the array copy helpers: key present, an array of n elements. */
static int arr_front(const mk_gguf *g, const char *key, uint64_t n, int *found, const gg_kv **kv,
                     const char *want, mk_err *err) {
    int rc = find_kv(g, key, found, kv, err);
    if (rc || !*kv) return rc;
    if ((*kv)->type != MK_GGUF_T_ARRAY) return wrong_type(g, *kv, want, err);
    if ((*kv)->n != n)
        return mk_fail(err, MK_EFORMAT, "%s: metadata key '%.200s': expected %llu elements, found "
                       "%llu", g->fname, (*kv)->key, (unsigned long long)n,
                       (unsigned long long)(*kv)->n);
    return MK_OK;
}

int mk_gguf_arr_f32(const mk_gguf *g, const char *key, float *dst, uint64_t n, int *found,
                    mk_err *err) {
    const gg_kv *kv;
    int rc = arr_front(g, key, n, found, &kv, "an array of float32", err);
    if (rc || !kv) return rc;
    if (kv->arr_type == MK_GGUF_T_FLOAT32) {
        for (uint64_t i = 0; i < n; i++) dst[i] = lef32(kv->val + 4 * i);
        return MK_OK;
    }
    if (kv->arr_type != MK_GGUF_T_FLOAT64) return wrong_type(g, kv, "an array of float32", err);
    for (uint64_t i = 0; i < n; i++) {
        double d = lef64(kv->val + 8 * i);
        if (isfinite(d) && fabs(d) > FLT_MAX)
            return mk_fail(err, MK_EFORMAT, "%s: metadata key '%.200s': element %llu = %g does not "
                           "fit in float32", g->fname, kv->key, (unsigned long long)i, d);
        dst[i] = (float)d;
    }
    return MK_OK;
}

int mk_gguf_arr_i32(const mk_gguf *g, const char *key, int32_t *dst, uint64_t n, int *found,
                    mk_err *err) {
    const gg_kv *kv;
    int rc = arr_front(g, key, n, found, &kv, "an array of int32", err);
    if (rc || !kv) return rc;
    if (!vt_is_int(kv->arr_type)) return wrong_type(g, kv, "an array of int32", err);
    unsigned sz = vt_size(kv->arr_type);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t u;
        int64_t s;
        read_int(kv->arr_type, kv->val + sz * i, &u, &s);
        if (s < INT32_MIN || s > INT32_MAX)
            return mk_fail(err, MK_EFORMAT, "%s: metadata key '%.200s': element %llu does not fit "
                           "in int32", g->fname, kv->key, (unsigned long long)i);
        dst[i] = (int32_t)s;
    }
    return MK_OK;
}

const char *mk_gguf_format_kv(const mk_gguf *g, size_t i, char *buf, size_t cap) {
    if (!cap) return buf;
    buf[0] = 0;
    if (!g || i >= g->n_kv) return buf;
    const gg_kv *kv = &g->kv[i];
    const char *tn = mk_gguf_type_name(kv->type);
    uint64_t u;
    int64_t s;
    char e[512];
    switch (kv->type) {
    case MK_GGUF_T_UINT8: case MK_GGUF_T_UINT16: case MK_GGUF_T_UINT32: case MK_GGUF_T_UINT64:
        read_int(kv->type, kv->val, &u, &s);
        snprintf(buf, cap, "%s %llu", tn, (unsigned long long)u);
        break;
    case MK_GGUF_T_INT8: case MK_GGUF_T_INT16: case MK_GGUF_T_INT32: case MK_GGUF_T_INT64:
        read_int(kv->type, kv->val, &u, &s);
        snprintf(buf, cap, "%s %lld", tn, (long long)s);
        break;
    case MK_GGUF_T_FLOAT32: snprintf(buf, cap, "%s %g", tn, (double)lef32(kv->val)); break;
    case MK_GGUF_T_FLOAT64: snprintf(buf, cap, "%s %g", tn, lef64(kv->val)); break;
    case MK_GGUF_T_BOOL: snprintf(buf, cap, "%s %s", tn, kv->val[0] ? "true" : "false"); break;
    case MK_GGUF_T_STRING:
        snprintf(buf, cap, "%s '%s'", tn, esc(e, sizeof e, kv->val, kv->slen));
        break;
    default: kv_type_desc(kv, buf, cap); break;
    }
    return buf;
}

size_t mk_gguf_n_tensors(const mk_gguf *g) { return g ? g->n_t : 0; }

mk_gguf_tensor *mk_gguf_tensor_at(mk_gguf *g, size_t i) {
    return g && i < g->n_t ? &g->t[i] : NULL;
}

mk_gguf_tensor *mk_gguf_find(mk_gguf *g, const char *name) {
    if (!g || !name || !g->ntslots) return NULL;
    size_t nl = strlen(name);
    size_t h = (size_t)fnv1a(name, nl) & (g->ntslots - 1);
    while (g->tslots[h]) {
        size_t j = g->tslots[h] - 1;
        if (g->tname_len[j] == nl && !memcmp(g->t[j].name, name, nl)) return &g->t[j];
        h = (h + 1) & (g->ntslots - 1);
    }
    return NULL;
}

size_t mk_gguf_total_bytes(const mk_gguf *g) { return g ? g->total : 0; }
