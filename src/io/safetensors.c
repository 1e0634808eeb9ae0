/* safetensors.c — safetensors header parser, shard loader and tensor index (see safetensors.h).
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of JSON mapping tensor
 * names to {dtype, shape, data_offsets}, then the data section that the offsets index. parse_file()
 * validates one such buffer completely before any tensor pointer is handed out: every size is
 * computed in 64-bit arithmetic with explicit overflow checks, every range is checked against the
 * data section, ranges are sorted and checked for overlap. mk_st_open() adds the file layer:
 * a directory with a model.safetensors.index.json is opened shard by shard (each distinct shard
 * mmapped once) and the union of shard tensors must equal the index's weight_map exactly.
 *
 * Ownership: an mk_st owns its tensor table, names, file paths and hash table, and owns the
 * mappings of files it mmapped itself (mk_st_open). Objects from mk_st_parse point into the
 * caller's buffer and never unmap it.
 */
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Largest JSON header accepted; real checkpoints have headers of a few hundred KB. */
#define ST_MAX_HEADER ((uint64_t)100 << 20)
/* Longest tensor name printed in a message, so the reason after it is never cut off. */
#define NM "%.200s"

typedef struct {
    char *path;        /* as given to messages: fname or dir/shard */
    const void *map;   /* mmapped file, or NULL when the buffer belongs to the caller */
    size_t map_len;
} st_file;

struct mk_st {
    mk_st_tensor *t;
    size_t n, cap;
    st_file *files;
    int nfiles;
    size_t *slots;     /* open-addressing hash: tensor index + 1, 0 = empty */
    size_t nslots;     /* power of two, >= 2n */
    size_t total;      /* sum of nbytes */
};

/* ---- dtypes ---------------------------------------------------------------------------------- */

static const struct {
    mk_dtype dt;
    const char *name;
    size_t size;
} DTYPES[] = {
    {MK_DT_F32, "F32", 4},         {MK_DT_F16, "F16", 2},       {MK_DT_BF16, "BF16", 2},
    {MK_DT_F64, "F64", 8},         {MK_DT_F8_E4M3, "F8_E4M3", 1}, {MK_DT_F8_E5M2, "F8_E5M2", 1},
    {MK_DT_F8_E8M0, "F8_E8M0", 1}, {MK_DT_I8, "I8", 1},         {MK_DT_U8, "U8", 1},
    {MK_DT_I16, "I16", 2},         {MK_DT_I32, "I32", 4},       {MK_DT_I64, "I64", 8},
    {MK_DT_BOOL, "BOOL", 1},
};
#define N_DTYPES (sizeof DTYPES / sizeof DTYPES[0])

size_t mk_dtype_size(mk_dtype dt) {
    for (size_t i = 0; i < N_DTYPES; i++)
        if (DTYPES[i].dt == dt) return DTYPES[i].size;
    return 0;
}

const char *mk_dtype_name(mk_dtype dt) {
    for (size_t i = 0; i < N_DTYPES; i++)
        if (DTYPES[i].dt == dt) return DTYPES[i].name;
    return "UNKNOWN";
}

mk_dtype mk_dtype_from_name(const char *name) {
    if (!name) return MK_DT_UNKNOWN;
    for (size_t i = 0; i < N_DTYPES; i++)
        if (!strcmp(DTYPES[i].name, name)) return DTYPES[i].dt;
    return MK_DT_UNKNOWN;
}

/* ---- small helpers --------------------------------------------------------------------------- */

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* "a/b" in a fresh allocation (NULL when out of memory). */
static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t o = a;
    if (a && dir[a - 1] != '/') p[o++] = '/';
    memcpy(p + o, name, b + 1);
    return p;
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* "[128, 256]" into buf (truncated if needed). */
static const char *fmt_shape(char *buf, size_t cap, const int64_t *shape, int ndim) {
    size_t o = 0;
    buf[0] = '\0';
    o += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
    return buf;
}

static const char *json_type_name(const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* ---- the object ------------------------------------------------------------------------------ */

static mk_st *st_new(void) { return calloc(1, sizeof(mk_st)); }

void mk_st_close(mk_st *st) {
    if (!st) return;
    for (size_t i = 0; i < st->n; i++) free(st->t[i].name);
    free(st->t);
    for (int i = 0; i < st->nfiles; i++) {
        if (st->files[i].map) munmap((void *)st->files[i].map, st->files[i].map_len);
        free(st->files[i].path);
    }
    free(st->files);
    free(st->slots);
    free(st);
}

/* Registers a file; takes ownership of map (may be NULL) but copies path. Returns its index. */
static int st_add_file(mk_st *st, const char *path, const void *map, size_t map_len, int *idx,
                       mk_err *err) {
    st_file *f = realloc(st->files, (size_t)(st->nfiles + 1) * sizeof *f);
    if (!f) goto oom;
    st->files = f;
    f[st->nfiles].path = dup_str(path);
    if (!f[st->nfiles].path) goto oom;
    f[st->nfiles].map = map;
    f[st->nfiles].map_len = map_len;
    *idx = st->nfiles++;
    return MK_OK;
oom:
    if (map) munmap((void *)map, map_len);
    return mk_fail(err, MK_ENOMEM, "out of memory registering %s", path);
}

static mk_st_tensor *st_push(mk_st *st) {
    if (st->n == st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 64;
        mk_st_tensor *t = realloc(st->t, cap * sizeof *t);
        if (!t) return NULL;
        st->t = t;
        st->cap = cap;
    }
    mk_st_tensor *t = &st->t[st->n++];
    memset(t, 0, sizeof *t);
    return t;
}

/* Builds the name -> index table over all tensors; a name seen twice (two shards) is an error. */
static int st_build_index(mk_st *st, mk_err *err) {
    size_t ns = 16;
    while (ns < 2 * st->n) ns *= 2;
    free(st->slots);
    st->slots = calloc(ns, sizeof *st->slots);
    st->nslots = ns;
    if (!st->slots) { st->nslots = 0; return mk_fail(err, MK_ENOMEM, "out of memory for tensor index"); }
    for (size_t i = 0; i < st->n; i++) {
        size_t h = (size_t)fnv1a(st->t[i].name) & (ns - 1);
        while (st->slots[h]) {
            const mk_st_tensor *o = &st->t[st->slots[h] - 1];
            if (!strcmp(o->name, st->t[i].name))
                return mk_fail(err, MK_EFORMAT, "duplicate tensor '" NM "': in %s and in %s",
                               o->name, st->files[o->file].path, st->files[st->t[i].file].path);
            h = (h + 1) & (ns - 1);
        }
        st->slots[h] = i + 1;
    }
    return MK_OK;
}

/* ---- header parsing -------------------------------------------------------------------------- */

static int cmp_data(const void *a, const void *b) {
    const mk_st_tensor *x = a, *y = b;
    const uint8_t *px = x->data, *py = y->data;
    if (px != py) return px < py ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Reads a JSON integer that must be >= 0. */
static int get_nonneg(const json_t *j, uint64_t *out) {
    if (!json_is_integer(j) || json_integer_value(j) < 0) return -1;
    *out = (uint64_t)json_integer_value(j);
    return 0;
}

/* Validates one tensor entry and appends it to st. base is the data section (dlen bytes). */
static int parse_entry(mk_st *st, const char *fname, int fi, const char *name, const json_t *v,
                       const uint8_t *base, uint64_t dlen, mk_err *err) {
    if (!name[0]) return mk_fail(err, MK_EFORMAT, "%s: tensor with an empty name", fname);
    if (!json_is_object(v))
        return mk_fail(err, MK_EFORMAT, "%s: tensor '" NM "': expected an object, found %s", fname,
                       name, json_type_name(v));
    /* exactly dtype, shape, data_offsets */
    const char *key;
    const json_t *x;
    json_object_foreach((json_t *)v, key, x) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return mk_fail(err, MK_EFORMAT,
                           "%s: tensor '" NM "': unknown field '%.100s' (expected dtype, shape, "
                           "data_offsets)", fname, name, key);
    }
    const json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
                 *jo = json_object_get(v, "data_offsets");
    if (!jd || !js || !jo)
        return mk_fail(err, MK_EFORMAT, "%s: tensor '" NM "': missing field '%s'", fname, name,
                       !jd ? "dtype" : !js ? "shape" : "data_offsets");

    if (!json_is_string(jd))
        return mk_fail(err, MK_EFORMAT, "%s: tensor '" NM "': dtype must be a string, found %s",
                       fname, name, json_type_name(jd));
    mk_dtype dt = mk_dtype_from_name(json_string_value(jd));
    if (dt == MK_DT_UNKNOWN)
        return mk_fail(err, MK_EFORMAT, "%s: tensor '" NM "': unknown dtype '%.40s'", fname, name,
                       json_string_value(jd));

    if (!json_is_array(js))
        return mk_fail(err, MK_EFORMAT, "%s: tensor '" NM "': shape must be an array, found %s",
                       fname, name, json_type_name(js));
    size_t nd = json_array_size(js);
    if (nd > MK_ST_MAX_DIMS)
        return mk_fail(err, MK_EFORMAT, "%s: tensor '" NM "': shape has %zu dims, at most %d supported",
                       fname, name, nd, MK_ST_MAX_DIMS);
    int64_t shape[MK_ST_MAX_DIMS] = {0};
    int any_zero = 0;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (get_nonneg(json_array_get(js, i), &d))
            return mk_fail(err, MK_EFORMAT,
                           "%s: tensor '" NM "': shape[%zu] must be a non-negative integer", fname,
                           name, i);
        shape[i] = (int64_t)d;
        any_zero |= d == 0;
    }
    char sb[200];
    /* numel and byte size with overflow checks (a zero dim makes any product legal) */
    uint64_t numel = 1;
    if (any_zero) numel = 0;
    else
        for (size_t i = 0; i < nd; i++) {
            if (numel > (uint64_t)INT64_MAX / (uint64_t)shape[i])
                return mk_fail(err, MK_EFORMAT, "%s: tensor '" NM "': shape %s overflows the element count",
                               fname, name, fmt_shape(sb, sizeof sb, shape, (int)nd));
            numel *= (uint64_t)shape[i];
        }
    uint64_t esz = mk_dtype_size(dt);
    if (numel > (uint64_t)INT64_MAX / esz || numel * esz > SIZE_MAX)
        return mk_fail(err, MK_EFORMAT, "%s: tensor '" NM "': shape %s of %s overflows the byte size",
                       fname, name, fmt_shape(sb, sizeof sb, shape, (int)nd), mk_dtype_name(dt));
    uint64_t need = numel * esz;

    uint64_t b, e;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || get_nonneg(json_array_get(jo, 0), &b) ||
        get_nonneg(json_array_get(jo, 1), &e))
        return mk_fail(err, MK_EFORMAT,
                       "%s: tensor '" NM "': data_offsets must be [begin, end] with non-negative "
                       "integers", fname, name);
    if (b > e)
        return mk_fail(err, MK_EFORMAT, "%s: tensor '" NM "': data_offsets [%llu, %llu] has begin > end",
                       fname, name, (unsigned long long)b, (unsigned long long)e);
    if (e > dlen)
        return mk_fail(err, MK_EFORMAT,
                       "%s: tensor '" NM "': data_offsets [%llu, %llu] out of range: data section "
                       "holds %llu bytes", fname, name, (unsigned long long)b,
                       (unsigned long long)e, (unsigned long long)dlen);
    if (e - b != need)
        return mk_fail(err, MK_EFORMAT,
                       "%s: tensor '" NM "': data_offsets [%llu, %llu] hold %llu bytes but shape %s "
                       "of %s needs %llu", fname, name, (unsigned long long)b,
                       (unsigned long long)e, (unsigned long long)(e - b),
                       fmt_shape(sb, sizeof sb, shape, (int)nd), mk_dtype_name(dt),
                       (unsigned long long)need);

    mk_st_tensor *t = st_push(st);
    if (!t) return mk_fail(err, MK_ENOMEM, "%s: out of memory for tensor table", fname);
    t->name = dup_str(name);
    if (!t->name) { st->n--; return mk_fail(err, MK_ENOMEM, "%s: out of memory", fname); }
    t->dtype = dt;
    t->ndim = (int)nd;
    memcpy(t->shape, shape, sizeof shape);
    t->numel = (int64_t)numel;
    t->data = base + b;
    t->nbytes = (size_t)need;
    t->file = fi;
    return MK_OK;
}

/* __metadata__ must be an object of string -> string; its content is not kept. */
static int check_metadata(const char *fname, const json_t *v, mk_err *err) {
    if (!json_is_object(v))
        return mk_fail(err, MK_EFORMAT, "%s: __metadata__ must be an object, found %s", fname,
                       json_type_name(v));
    const char *k;
    const json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        if (!json_is_string(x))
            return mk_fail(err, MK_EFORMAT, "%s: __metadata__ '%.100s' must be a string, found %s",
                           fname, k, json_type_name(x));
    }
    return MK_OK;
}

/* Parses one whole safetensors buffer (registered as file fi) and appends its tensors to st,
 * sorted by data offset. */
static int parse_file(mk_st *st, const uint8_t *buf, size_t len, const char *fname, int fi,
                      mk_err *err) {
    if (len < 8)
        return mk_fail(err, MK_EFORMAT,
                       "%s: truncated file: %zu bytes, need at least 8 for the header length",
                       fname, len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | buf[i];
    if (hl == 0) return mk_fail(err, MK_EFORMAT, "%s: header length is 0 (empty JSON header)", fname);
    if (hl > len - 8)
        return mk_fail(err, MK_EFORMAT,
                       "%s: truncated file: header length %llu but only %zu bytes follow the "
                       "length prefix", fname, (unsigned long long)hl, len - 8);
    if (hl > ST_MAX_HEADER)
        return mk_fail(err, MK_EFORMAT, "%s: header length %llu exceeds the %llu-byte limit", fname,
                       (unsigned long long)hl, (unsigned long long)ST_MAX_HEADER);

    json_error_t je;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hl, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return mk_fail(err, MK_EFORMAT, "%s: %s at line %d column %d: %s", fname,
                       strstr(je.text, "duplicate") ? "duplicate tensor name in JSON header"
                                                    : "invalid JSON header",
                       je.line, je.column, je.text);
    int rc = MK_OK;
    if (!json_is_object(root)) {
        rc = mk_fail(err, MK_EFORMAT, "%s: JSON header must be an object, found %s", fname,
                     json_type_name(root));
        goto out;
    }
    const uint8_t *base = buf + 8 + hl;
    uint64_t dlen = len - 8 - hl;
    size_t first = st->n;
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v) {
        if (!strcmp(name, "__metadata__")) rc = check_metadata(fname, v, err);
        else rc = parse_entry(st, fname, fi, name, v, base, dlen, err);
        if (rc) goto out;
    }

    /* Ranges must not overlap: sort by start, compare with the furthest end so far. Empty tensors
     * own no bytes and may sit anywhere inside the data section. */
    size_t n = st->n - first;
    if (!n) goto out;
    mk_st_tensor *t = st->t + first;
    if (n > 1) qsort(t, n, sizeof *t, cmp_data);
    const uint8_t *hi = base;
    size_t hi_i = 0;
    for (size_t i = 0; i < n; i++) {
        if (!t[i].nbytes) continue;
        const uint8_t *p = t[i].data;
        if (p < hi) {
            const mk_st_tensor *o = &t[hi_i];
            const uint8_t *ob = o->data;
            rc = mk_fail(err, MK_EFORMAT,
                         "%s: tensors '" NM "' [%td, %td] and '" NM "' [%td, %td] overlap", fname,
                         o->name, ob - base, ob + o->nbytes - base, t[i].name, p - base,
                         p + t[i].nbytes - base);
            goto out;
        }
        hi = p + t[i].nbytes;
        hi_i = i;
    }
    for (size_t i = 0; i < n; i++) st->total += t[i].nbytes;
out:
    json_decref(root);
    return rc;
}

int mk_st_parse(const uint8_t *buf, size_t len, const char *fname, mk_st **out, mk_err *err) {
    *out = NULL;
    if (!fname) fname = "<buffer>";
    if (!buf && len) return mk_fail(err, MK_EINVAL, "%s: NULL buffer", fname);
    mk_st *st = st_new();
    if (!st) return mk_fail(err, MK_ENOMEM, "out of memory");
    int fi, rc;
    if ((rc = st_add_file(st, fname, NULL, 0, &fi, err)) ||
        (rc = parse_file(st, buf, len, fname, fi, err)) || (rc = st_build_index(st, err))) {
        mk_st_close(st);
        return rc;
    }
    *out = st;
    return MK_OK;
}

/* ---- files ----------------------------------------------------------------------------------- */

/* mmaps path read-only, registers it in st and parses it. Size is checked against the header in
 * parse_file before any data byte is touched, so a truncated file fails cleanly (no SIGBUS). */
static int open_file(mk_st *st, const char *path, mk_err *err) {
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
    int fi, rc;
    if ((rc = st_add_file(st, path, map, len, &fi, err))) return rc;
    return parse_file(st, map, len, path, fi, err);
}

/* Reads a whole (small) file into a malloc'd buffer. */
static int read_all(const char *path, char **out, size_t *out_len, mk_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return mk_fail(err, MK_EIO, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    while (b) {
        n += fread(b + n, 1, cap - n, f);
        if (n < cap) break;
        if (cap > ST_MAX_HEADER) {
            free(b);
            fclose(f);
            return mk_fail(err, MK_EFORMAT, "%s: larger than %llu bytes", path,
                           (unsigned long long)ST_MAX_HEADER);
        }
        char *nb = realloc(b, cap * 2);
        if (!nb) { free(b); b = NULL; break; }
        b = nb;
        cap *= 2;
    }
    int bad = b && ferror(f);
    fclose(f);
    if (!b) return mk_fail(err, MK_ENOMEM, "out of memory reading %s", path);
    if (bad) { free(b); return mk_fail(err, MK_EIO, "read error on %s", path); }
    *out = b;
    *out_len = n;
    return MK_OK;
}

/* Index of shard name s among the distinct shards (it is always there). */
static size_t shard_of(const char **shards, size_t n, const char *s) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(shards[i], s)) return i;
    return 0;
}

/* Shard names come from the index and must stay inside the checkpoint directory. */
static int shard_name_ok(const char *s) { return s[0] && !strchr(s, '/') && !strstr(s, ".."); }

static int open_index(mk_st *st, const char *dir, const char *ipath, mk_err *err) {
    char *text = NULL;
    size_t tlen = 0;
    int rc = read_all(ipath, &text, &tlen, err);
    if (rc) return rc;
    json_error_t je;
    json_t *root = json_loadb(text, tlen, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root)
        return mk_fail(err, MK_EFORMAT, "%s: invalid JSON at line %d column %d: %s", ipath, je.line,
                       je.column, je.text);
    const char **shards = NULL; /* distinct shard names, in first-seen order */
    size_t nsh = 0;
    size_t *hs = NULL, nhs = 16; /* hash set over shards: index + 1 */
    char *spath = NULL;
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm)) {
        rc = mk_fail(err, MK_EFORMAT, "%s: expected an object with a \"weight_map\" object", ipath);
        goto out;
    }
    size_t nw = json_object_size(wm);
    while (nhs < 2 * nw) nhs *= 2;
    shards = malloc((nw ? nw : 1) * sizeof *shards);
    hs = calloc(nhs, sizeof *hs);
    if (!shards || !hs) { rc = mk_fail(err, MK_ENOMEM, "out of memory reading %s", ipath); goto out; }
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v) {
        if (!json_is_string(v)) {
            rc = mk_fail(err, MK_EFORMAT, "%s: weight_map['" NM "'] must be a shard file name, found %s",
                         ipath, name, json_type_name(v));
            goto out;
        }
        const char *s = json_string_value(v);
        if (!shard_name_ok(s)) {
            rc = mk_fail(err, MK_EFORMAT,
                         "%s: weight_map['" NM "']: shard name '%.200s' must be a plain file name "
                         "(no '/' or '..')", ipath, name, s);
            goto out;
        }
        size_t h = (size_t)fnv1a(s) & (nhs - 1);
        while (hs[h] && strcmp(shards[hs[h] - 1], s)) h = (h + 1) & (nhs - 1);
        if (!hs[h]) {
            shards[nsh++] = s;
            hs[h] = nsh;
        }
    }
    /* open every distinct shard once; file index i == shards[i] */
    for (size_t i = 0; i < nsh; i++) {
        spath = join_path(dir, shards[i]);
        if (!spath) { rc = mk_fail(err, MK_ENOMEM, "out of memory"); goto out; }
        if (access(spath, F_OK)) {
            rc = mk_fail(err, MK_EIO, "%s: shard file %s listed in the weight_map is missing", ipath,
                         spath);
            goto out;
        }
        if ((rc = open_file(st, spath, err))) goto out;
        free(spath);
        spath = NULL;
    }
    if ((rc = st_build_index(st, err))) goto out;
    /* the shards' tensors must be exactly the weight_map */
    json_object_foreach(wm, name, v) {
        const char *s = json_string_value(v);
        mk_st_tensor *t = mk_st_find(st, name);
        if (!t) {
            rc = mk_fail(err, MK_EFORMAT,
                         "%s: tensor '" NM "' is listed in weight_map but missing from its shard %s",
                         ipath, name, st->files[shard_of(shards, nsh, s)].path);
            goto out;
        }
        if (strcmp(shards[t->file], s)) {
            rc = mk_fail(err, MK_EFORMAT,
                         "%s: tensor '" NM "' is listed in weight_map under shard %s but missing "
                         "from it (found in %s)", ipath, name, s, st->files[t->file].path);
            goto out;
        }
    }
    for (size_t i = 0; i < st->n; i++) {
        if (!json_object_get(wm, st->t[i].name)) {
            rc = mk_fail(err, MK_EFORMAT, "%s: tensor '" NM "' in shard %s is not listed in weight_map",
                         ipath, st->t[i].name, st->files[st->t[i].file].path);
            goto out;
        }
    }
out:
    free(spath);
    free(shards);
    free(hs);
    json_decref(root);
    return rc;
}

int mk_st_open(const char *path, mk_st **out, mk_err *err) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb)) return mk_fail(err, MK_EIO, "cannot open %s: %s", path, strerror(errno));
    mk_st *st = st_new();
    if (!st) return mk_fail(err, MK_ENOMEM, "out of memory");
    int rc;
    if (S_ISDIR(sb.st_mode)) {
        char *ipath = join_path(path, "model.safetensors.index.json");
        char *mpath = join_path(path, "model.safetensors");
        if (!ipath || !mpath) rc = mk_fail(err, MK_ENOMEM, "out of memory");
        else if (!access(ipath, F_OK)) rc = open_index(st, path, ipath, err);
        else if (!access(mpath, F_OK)) {
            rc = open_file(st, mpath, err);
            if (!rc) rc = st_build_index(st, err);
        } else
            rc = mk_fail(err, MK_EIO, "no model.safetensors or model.safetensors.index.json in %s",
                         path);
        free(ipath);
        free(mpath);
    } else {
        rc = open_file(st, path, err);
        if (!rc) rc = st_build_index(st, err);
    }
    if (rc) {
        mk_st_close(st);
        return rc;
    }
    *out = st;
    return MK_OK;
}

/* ---- queries --------------------------------------------------------------------------------- */

size_t mk_st_count(const mk_st *st) { return st ? st->n : 0; }

mk_st_tensor *mk_st_at(mk_st *st, size_t i) { return st && i < st->n ? &st->t[i] : NULL; }

mk_st_tensor *mk_st_find(mk_st *st, const char *name) {
    if (!st || !st->nslots || !name) return NULL;
    size_t h = (size_t)fnv1a(name) & (st->nslots - 1);
    while (st->slots[h]) {
        mk_st_tensor *t = &st->t[st->slots[h] - 1];
        if (!strcmp(t->name, name)) return t;
        h = (h + 1) & (st->nslots - 1);
    }
    return NULL;
}

const char *mk_st_file_path(const mk_st *st, int i) {
    return st && i >= 0 && i < st->nfiles ? st->files[i].path : "?";
}

size_t mk_st_total_bytes(const mk_st *st) { return st ? st->total : 0; }
