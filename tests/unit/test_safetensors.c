/* test_safetensors.c — unit tests for the safetensors loader (src/io/safetensors.c).
 *
 * Builds small safetensors files in memory (and in a mkdtemp directory for the file and shard
 * paths), checks that valid ones load with the right dtypes, shapes and data pointers, and that
 * every kind of corruption is rejected with MK_EFORMAT / MK_EIO and a message naming the problem.
 * Ends with the real golden checkpoint tests/data/dsv4/v4-tiny-fp8.
 */
#include <criterion/criterion.h>

#include "io/safetensors.h"
#include "test_util.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers --------------------------------------------------------------------------------- */

/* A safetensors image: 8-byte LE length, the JSON header, then data_len bytes of pattern i*7. */
static uint8_t *mkst(const char *json, size_t data_len, size_t *out_len) {
    size_t hl = strlen(json);
    uint8_t *b = malloc(8 + hl + data_len + 1);
    cr_assert(b);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, json, hl);
    for (size_t i = 0; i < data_len; i++) b[8 + hl + i] = (uint8_t)(i * 7);
    *out_len = 8 + hl + data_len;
    return b;
}

/* Parses json + data_len bytes; returns the status and leaves the message in *err. */
static int parse_json(const char *json, size_t data_len, mk_err *err) {
    size_t len;
    uint8_t *b = mkst(json, data_len, &len);
    mk_st *st = NULL;
    memset(err, 0, sizeof *err);
    int rc = mk_st_parse(b, len, "t.safetensors", &st, err);
    if (rc == MK_OK) cr_assert(st);
    else cr_assert_null(st);
    mk_st_close(st);
    free(b);
    return rc;
}

#define EXPECT_FAIL(rc, err, want_rc, word)                                                   \
    do {                                                                                      \
        cr_assert_eq((rc), (want_rc), "status %d, want %d (%s)", (rc), (want_rc), (err).msg); \
        cr_assert(strstr((err).msg, (word)), "message lacks '%s': %s", (word), (err).msg);    \
    } while (0)

static char g_dir[64];

static void mk_tmp(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/minke_st_XXXXXX");
    cr_assert(mkdtemp(g_dir));
}

/* Removes the flat temp directory and everything in it. */
static void rm_tmp(void) {
    if (!g_dir[0]) return;
    DIR *d = opendir(g_dir);
    if (d) {
        struct dirent *e;
        char p[512];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(g_dir);
    g_dir[0] = '\0';
}

static void write_raw(const char *name, const void *buf, size_t len) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "wb");
    cr_assert(f, "cannot create %s", p);
    cr_assert_eq(fwrite(buf, 1, len, f), len);
    fclose(f);
}

static void write_st(const char *name, const char *json, size_t data_len) {
    size_t len;
    uint8_t *b = mkst(json, data_len, &len);
    write_raw(name, b, len);
    free(b);
}

static void write_text(const char *name, const char *text) { write_raw(name, text, strlen(text)); }

static int open_dir(mk_st **st, mk_err *err) {
    memset(err, 0, sizeof *err);
    *st = NULL;
    int rc = mk_st_open(g_dir, st, err);
    if (rc) cr_assert_null(*st);
    return rc;
}

TestSuite(safetensors, .fini = rm_tmp);

/* ---- dtypes ---------------------------------------------------------------------------------- */

Test(safetensors, dtype_helpers) {
    cr_assert_eq(mk_dtype_size(MK_DT_BF16), 2);
    cr_assert_eq(mk_dtype_size(MK_DT_F32), 4);
    cr_assert_eq(mk_dtype_size(MK_DT_F64), 8);
    cr_assert_eq(mk_dtype_size(MK_DT_F8_E4M3), 1);
    cr_assert_eq(mk_dtype_size(MK_DT_I64), 8);
    cr_assert_eq(mk_dtype_size(MK_DT_UNKNOWN), 0);
    for (int d = MK_DT_F32; d <= MK_DT_BOOL; d++) {
        cr_assert_gt(mk_dtype_size((mk_dtype)d), 0);
        cr_assert_eq(mk_dtype_from_name(mk_dtype_name((mk_dtype)d)), (mk_dtype)d);
    }
    cr_assert_eq(mk_dtype_from_name("F8_E8M0"), MK_DT_F8_E8M0);
    cr_assert_eq(mk_dtype_from_name("bf16"), MK_DT_UNKNOWN);
    cr_assert_eq(mk_dtype_from_name(NULL), MK_DT_UNKNOWN);
    cr_assert_str_eq(mk_dtype_name(MK_DT_UNKNOWN), "UNKNOWN");
}

/* ---- valid files ----------------------------------------------------------------------------- */

static const char *VALID =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"b.scale\":{\"dtype\":\"F8_E8M0\",\"shape\":[2,1],\"data_offsets\":[48,50]},"
    "\"a.weight\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
    "\"c\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[16,32]},"
    "\"d\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[32,36]},"
    "\"e\":{\"dtype\":\"U8\",\"shape\":[0,5],\"data_offsets\":[12,12]}}";

static void check_valid(mk_st *st, const uint8_t *data) {
    cr_assert_eq(mk_st_count(st), 5);
    cr_assert_eq(mk_st_total_bytes(st), 12 + 2 + 16 + 4);
    mk_st_tensor *a = mk_st_find(st, "a.weight");
    cr_assert(a);
    cr_assert_str_eq(a->name, "a.weight");
    cr_assert_eq(a->dtype, MK_DT_BF16);
    cr_assert_eq(a->ndim, 2);
    cr_assert_eq(a->shape[0], 2);
    cr_assert_eq(a->shape[1], 3);
    cr_assert_eq(a->numel, 6);
    cr_assert_eq(a->nbytes, 12);
    cr_assert_eq(a->used, 0);
    cr_assert_eq(a->file, 0);
    if (data) cr_assert_eq((const uint8_t *)a->data, data);
    mk_st_tensor *b = mk_st_find(st, "b.scale");
    cr_assert(b && b->dtype == MK_DT_F8_E8M0 && b->nbytes == 2 && b->numel == 2);
    cr_assert_eq(((const uint8_t *)b->data)[0], (uint8_t)(48 * 7));
    if (data) cr_assert_eq((const uint8_t *)b->data, data + 48);
    mk_st_tensor *c = mk_st_find(st, "c");
    cr_assert(c && c->dtype == MK_DT_I64 && c->ndim == 1 && c->shape[0] == 2 && c->nbytes == 16);
    cr_assert_eq(((const uint8_t *)c->data)[1], (uint8_t)(17 * 7));
    mk_st_tensor *d = mk_st_find(st, "d");
    cr_assert(d && d->ndim == 0 && d->numel == 1 && d->nbytes == 4);
    mk_st_tensor *e = mk_st_find(st, "e");
    cr_assert(e && e->numel == 0 && e->nbytes == 0 && e->ndim == 2 && e->shape[1] == 5);
    cr_assert_null(mk_st_find(st, "nope"));
    cr_assert_null(mk_st_find(st, "__metadata__"));
    /* mk_st_at visits each tensor once */
    int seen = 0;
    for (size_t i = 0; i < mk_st_count(st); i++) seen += mk_st_find(st, mk_st_at(st, i)->name) == mk_st_at(st, i);
    cr_assert_eq(seen, 5);
    cr_assert_null(mk_st_at(st, 5));
}

Test(safetensors, parse_valid) {
    size_t len;
    uint8_t *b = mkst(VALID, 50, &len);
    mk_st *st;
    mk_err err = {0};
    int rc = mk_st_parse(b, len, "mem.safetensors", &st, &err);
    cr_assert_eq(rc, MK_OK, "%s", err.msg);
    check_valid(st, b + 8 + strlen(VALID));
    cr_assert_str_eq(mk_st_file_path(st, 0), "mem.safetensors");
    mk_st_close(st);
    free(b);
}

Test(safetensors, parse_empty_header_object) {
    mk_err err;
    cr_assert_eq(parse_json("{}", 0, &err), MK_OK, "%s", err.msg);
    cr_assert_eq(parse_json("{\"__metadata__\":{}}        ", 3, &err), MK_OK, "%s", err.msg);
}

Test(safetensors, open_single_file_and_dir) {
    mk_tmp();
    write_st("model.safetensors", VALID, 50);
    mk_st *st;
    mk_err err = {0};
    cr_assert_eq(open_dir(&st, &err), MK_OK, "%s", err.msg);
    check_valid(st, NULL);
    cr_assert(strstr(mk_st_file_path(st, 0), "model.safetensors"));
    mk_st_close(st);
    /* the file path itself */
    char p[256];
    snprintf(p, sizeof p, "%s/model.safetensors", g_dir);
    cr_assert_eq(mk_st_open(p, &st, &err), MK_OK, "%s", err.msg);
    check_valid(st, NULL);
    mk_st_close(st);
}

Test(safetensors, sharded_two_shards) {
    mk_tmp();
    write_st("model-00001-of-00002.safetensors",
             "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"y\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[16,24]}}", 24);
    write_st("model-00002-of-00002.safetensors",
             "{\"z\":{\"dtype\":\"F8_E4M3\",\"shape\":[3,2],\"data_offsets\":[0,6]}}", 6);
    write_text("model.safetensors.index.json",
               "{\"metadata\":{\"total_size\":30},\"weight_map\":{"
               "\"x\":\"model-00001-of-00002.safetensors\",\"z\":\"model-00002-of-00002.safetensors\","
               "\"y\":\"model-00001-of-00002.safetensors\"}}");
    mk_st *st;
    mk_err err = {0};
    cr_assert_eq(open_dir(&st, &err), MK_OK, "%s", err.msg);
    cr_assert_eq(mk_st_count(st), 3);
    cr_assert_eq(mk_st_total_bytes(st), 30);
    mk_st_tensor *x = mk_st_find(st, "x"), *y = mk_st_find(st, "y"), *z = mk_st_find(st, "z");
    cr_assert(x && y && z);
    cr_assert_eq(x->file, y->file);
    cr_assert_neq(x->file, z->file);
    cr_assert(strstr(mk_st_file_path(st, x->file), "model-00001-of-00002.safetensors"));
    cr_assert(strstr(mk_st_file_path(st, z->file), "model-00002-of-00002.safetensors"));
    cr_assert_eq(z->dtype, MK_DT_F8_E4M3);
    cr_assert_eq(z->shape[0], 3);
    cr_assert_eq(((const uint8_t *)z->data)[5], 35);
    cr_assert_eq(((const uint8_t *)y->data)[0], (uint8_t)(16 * 7));
    mk_st_close(st);
}

/* ---- corrupt single files -------------------------------------------------------------------- */

Test(safetensors, truncated) {
    size_t len;
    uint8_t *b = mkst(VALID, 50, &len);
    mk_st *st;
    mk_err err = {0};
    /* header length beyond the file */
    int rc = mk_st_parse(b, 8 + 10, "t.safetensors", &st, &err);
    EXPECT_FAIL(rc, err, MK_EFORMAT, "truncated");
    cr_assert(strstr(err.msg, "t.safetensors"));
    /* shorter than the length prefix */
    rc = mk_st_parse(b, 5, "t.safetensors", &st, &err);
    EXPECT_FAIL(rc, err, MK_EFORMAT, "truncated");
    rc = mk_st_parse(NULL, 0, "t.safetensors", &st, &err);
    EXPECT_FAIL(rc, err, MK_EFORMAT, "truncated");
    /* data section cut short: offsets leave the file */
    rc = mk_st_parse(b, len - 1, "t.safetensors", &st, &err);
    EXPECT_FAIL(rc, err, MK_EFORMAT, "out of range");
    /* huge length prefix */
    memset(b, 0xff, 8);
    rc = mk_st_parse(b, len, "t.safetensors", &st, &err);
    EXPECT_FAIL(rc, err, MK_EFORMAT, "truncated");
    free(b);
}

Test(safetensors, truncated_and_empty_files_on_disk) {
    mk_tmp();
    size_t len;
    uint8_t *b = mkst(VALID, 50, &len);
    write_raw("model.safetensors", b, len / 2);
    mk_st *st;
    mk_err err;
    EXPECT_FAIL(open_dir(&st, &err), err, MK_EFORMAT, "truncated");
    write_raw("model.safetensors", b, 3);
    EXPECT_FAIL(open_dir(&st, &err), err, MK_EFORMAT, "truncated");
    write_raw("model.safetensors", b, 0);
    EXPECT_FAIL(open_dir(&st, &err), err, MK_EFORMAT, "empty");
    free(b);
}

Test(safetensors, header_length_zero) {
    uint8_t b[16] = {0};
    mk_st *st;
    mk_err err;
    EXPECT_FAIL(mk_st_parse(b, sizeof b, "t.safetensors", &st, &err), err, MK_EFORMAT, "header length");
}

Test(safetensors, garbage_json) {
    mk_err err;
    EXPECT_FAIL(parse_json("{\"a\": [1, 2", 0, &err), err, MK_EFORMAT, "invalid JSON");
    cr_assert(strstr(err.msg, "line 1"), "%s", err.msg);
    EXPECT_FAIL(parse_json("\x01\x02garbage", 4, &err), err, MK_EFORMAT, "invalid JSON");
    EXPECT_FAIL(parse_json("{} trailing", 0, &err), err, MK_EFORMAT, "invalid JSON");
    EXPECT_FAIL(parse_json("[1,2]", 0, &err), err, MK_EFORMAT, "object");
}

Test(safetensors, unknown_dtype) {
    mk_err err;
    EXPECT_FAIL(parse_json("{\"w\":{\"dtype\":\"F7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, &err),
                err, MK_EFORMAT, "unknown dtype 'F7'");
    cr_assert(strstr(err.msg, "'w'"), "%s", err.msg);
    EXPECT_FAIL(parse_json("{\"w\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, &err),
                err, MK_EFORMAT, "dtype");
}

Test(safetensors, shape_size_mismatch) {
    mk_err err;
    const char *j = "{\"layers.0.attn.wq_a.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[128,256],"
                    "\"data_offsets\":[0,100]}}";
    EXPECT_FAIL(parse_json(j, 100, &err), err, MK_EFORMAT, "needs 32768");
    cr_assert(strstr(err.msg, "t.safetensors: tensor 'layers.0.attn.wq_a.weight': data_offsets "
                              "[0, 100] hold 100 bytes but shape [128, 256] of F8_E4M3"), "%s", err.msg);
    /* negative and non-integer dims, too many dims, overflow */
    EXPECT_FAIL(parse_json("{\"w\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0, &err),
                err, MK_EFORMAT, "non-negative");
    EXPECT_FAIL(parse_json("{\"w\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", 1, &err),
                err, MK_EFORMAT, "non-negative integer");
    EXPECT_FAIL(parse_json("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
                           1, &err), err, MK_EFORMAT, "dims");
    EXPECT_FAIL(parse_json("{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,1]}}",
                           1, &err), err, MK_EFORMAT, "overflow");
    EXPECT_FAIL(parse_json("{\"w\":{\"dtype\":\"I64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,1]}}",
                           1, &err), err, MK_EFORMAT, "overflow");
    /* a zero dim makes huge other dims legal */
    cr_assert_eq(parse_json("{\"w\":{\"dtype\":\"I64\",\"shape\":[9223372036854775807,0],\"data_offsets\":[0,0]}}",
                            0, &err), MK_OK, "%s", err.msg);
}

Test(safetensors, offsets_out_of_range) {
    mk_err err;
    EXPECT_FAIL(parse_json("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 15, &err),
                err, MK_EFORMAT, "out of range");
    EXPECT_FAIL(parse_json("{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[9,4]}}", 15, &err),
                err, MK_EFORMAT, "begin > end");
    EXPECT_FAIL(parse_json("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[-4,12]}}", 15, &err),
                err, MK_EFORMAT, "data_offsets");
    EXPECT_FAIL(parse_json("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16,2]}}", 16, &err),
                err, MK_EFORMAT, "data_offsets");
    EXPECT_FAIL(parse_json("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],"
                           "\"data_offsets\":[18446744073709551612,18446744073709551616]}}", 16, &err),
                err, MK_EFORMAT, "invalid JSON");
}

Test(safetensors, overlapping_tensors) {
    mk_err err;
    EXPECT_FAIL(parse_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                           "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 20, &err),
                err, MK_EFORMAT, "overlap");
    cr_assert(strstr(err.msg, "'a'") && strstr(err.msg, "'b'"), "%s", err.msg);
    /* identical ranges, listed in reverse order */
    EXPECT_FAIL(parse_json("{\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]},"
                           "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, &err),
                err, MK_EFORMAT, "overlap");
    /* contained inside a larger tensor that starts earlier */
    EXPECT_FAIL(parse_json("{\"a\":{\"dtype\":\"U8\",\"shape\":[10],\"data_offsets\":[0,10]},"
                           "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
                           "\"c\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[6,8]}}", 10, &err),
                err, MK_EFORMAT, "overlap");
    /* adjacent is fine */
    cr_assert_eq(parse_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                            "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[16,20]}}", 20, &err),
                 MK_OK, "%s", err.msg);
}

Test(safetensors, duplicate_names) {
    mk_err err;
    EXPECT_FAIL(parse_json("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                           "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, &err),
                err, MK_EFORMAT, "duplicate");
}

Test(safetensors, bad_entries) {
    mk_err err;
    EXPECT_FAIL(parse_json("{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, &err),
                err, MK_EFORMAT, "empty name");
    EXPECT_FAIL(parse_json("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 1, &err),
                err, MK_EFORMAT, "unknown field 'x'");
    EXPECT_FAIL(parse_json("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, &err),
                err, MK_EFORMAT, "missing field 'shape'");
    EXPECT_FAIL(parse_json("{\"a\":[1]}", 1, &err), err, MK_EFORMAT, "expected an object");
    EXPECT_FAIL(parse_json("{\"a\":{\"dtype\":\"U8\",\"shape\":3,\"data_offsets\":[0,1]}}", 1, &err),
                err, MK_EFORMAT, "shape must be an array");
    EXPECT_FAIL(parse_json("{\"__metadata__\":{\"k\":1}}", 0, &err), err, MK_EFORMAT, "__metadata__");
    EXPECT_FAIL(parse_json("{\"__metadata__\":[]}", 0, &err), err, MK_EFORMAT, "__metadata__");
}

/* ---- corrupt sharded checkpoints ------------------------------------------------------------- */

static void two_shards(void) {
    mk_tmp();
    write_st("s1.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16);
    write_st("s2.safetensors", "{\"z\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
                               "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[3,4]}}", 4);
}

Test(safetensors, index_tensor_missing_from_shard) {
    two_shards();
    write_text("model.safetensors.index.json",
               "{\"weight_map\":{\"x\":\"s1.safetensors\",\"z\":\"s2.safetensors\","
               "\"w\":\"s2.safetensors\",\"ghost\":\"s1.safetensors\"}}");
    mk_st *st;
    mk_err err;
    EXPECT_FAIL(open_dir(&st, &err), err, MK_EFORMAT, "missing from");
    cr_assert(strstr(err.msg, "'ghost'") && strstr(err.msg, "s1.safetensors"), "%s", err.msg);
}

Test(safetensors, index_tensor_in_wrong_shard) {
    two_shards();
    write_text("model.safetensors.index.json",
               "{\"weight_map\":{\"x\":\"s1.safetensors\",\"z\":\"s1.safetensors\",\"w\":\"s2.safetensors\"}}");
    mk_st *st;
    mk_err err;
    EXPECT_FAIL(open_dir(&st, &err), err, MK_EFORMAT, "missing from");
    cr_assert(strstr(err.msg, "'z'") && strstr(err.msg, "s2.safetensors"), "%s", err.msg);
}

Test(safetensors, shard_with_unlisted_tensor) {
    two_shards();
    write_text("model.safetensors.index.json",
               "{\"weight_map\":{\"x\":\"s1.safetensors\",\"z\":\"s2.safetensors\"}}");
    mk_st *st;
    mk_err err;
    EXPECT_FAIL(open_dir(&st, &err), err, MK_EFORMAT, "not listed");
    cr_assert(strstr(err.msg, "'w'") && strstr(err.msg, "s2.safetensors"), "%s", err.msg);
}

Test(safetensors, same_tensor_in_two_shards) {
    two_shards();
    write_st("s3.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    write_text("model.safetensors.index.json",
               "{\"weight_map\":{\"x\":\"s1.safetensors\",\"z\":\"s2.safetensors\","
               "\"w\":\"s3.safetensors\"}}");
    mk_st *st;
    mk_err err;
    EXPECT_FAIL(open_dir(&st, &err), err, MK_EFORMAT, "duplicate tensor 'x'");
}

Test(safetensors, missing_shard_file) {
    two_shards();
    write_text("model.safetensors.index.json",
               "{\"weight_map\":{\"x\":\"s1.safetensors\",\"z\":\"s9.safetensors\"}}");
    mk_st *st;
    mk_err err;
    EXPECT_FAIL(open_dir(&st, &err), err, MK_EIO, "missing");
    cr_assert(strstr(err.msg, "s9.safetensors"), "%s", err.msg);
}

Test(safetensors, bad_shard_names_and_index) {
    two_shards();
    mk_st *st;
    mk_err err;
    write_text("model.safetensors.index.json", "{\"weight_map\":{\"x\":\"../s1.safetensors\"}}");
    EXPECT_FAIL(open_dir(&st, &err), err, MK_EFORMAT, "plain file name");
    write_text("model.safetensors.index.json", "{\"weight_map\":{\"x\":\"sub/s1.safetensors\"}}");
    EXPECT_FAIL(open_dir(&st, &err), err, MK_EFORMAT, "plain file name");
    write_text("model.safetensors.index.json", "{\"weight_map\":{\"x\":\"\"}}");
    EXPECT_FAIL(open_dir(&st, &err), err, MK_EFORMAT, "plain file name");
    write_text("model.safetensors.index.json", "{\"weight_map\":{\"x\":7}}");
    EXPECT_FAIL(open_dir(&st, &err), err, MK_EFORMAT, "shard file name");
    write_text("model.safetensors.index.json", "{\"metadata\":{}}");
    EXPECT_FAIL(open_dir(&st, &err), err, MK_EFORMAT, "weight_map");
    write_text("model.safetensors.index.json", "{\"weight_map\":{\"x\":\"s1.safetensors\",");
    EXPECT_FAIL(open_dir(&st, &err), err, MK_EFORMAT, "invalid JSON");
    /* a corrupt shard is reported with its path */
    write_raw("s1.safetensors", "\x05\0\0\0\0\0\0\0{}", 10);
    write_text("model.safetensors.index.json", "{\"weight_map\":{\"x\":\"s1.safetensors\"}}");
    EXPECT_FAIL(open_dir(&st, &err), err, MK_EFORMAT, "s1.safetensors: truncated");
}

Test(safetensors, no_checkpoint) {
    mk_tmp();
    mk_st *st;
    mk_err err;
    EXPECT_FAIL(open_dir(&st, &err), err, MK_EIO, "no model.safetensors or model.safetensors.index.json");
    cr_assert(strstr(err.msg, g_dir), "%s", err.msg);
    cr_assert_eq(mk_st_open("/nonexistent/minke/path", &st, &err), MK_EIO);
    cr_assert_null(st);
}

/* ---- the golden checkpoint ------------------------------------------------------------------- */

Test(safetensors, golden_v4_tiny_fp8) {
    char p[512];
    snprintf(p, sizeof p, "%s/dsv4/v4-tiny-fp8", mk_test_data_dir());
    mk_st *st;
    mk_err err = {0};
    cr_assert_eq(mk_st_open(p, &st, &err), MK_OK, "%s", err.msg);
    cr_assert_eq(mk_st_count(st), 427);
    mk_st_tensor *t = mk_st_find(st, "layers.0.ffn.gate.tid2eid");
    cr_assert(t);
    cr_assert_eq(t->dtype, MK_DT_I64);
    cr_assert_eq(t->ndim, 2);
    cr_assert_eq(t->shape[0], 512);
    cr_assert_eq(t->shape[1], 3);
    cr_assert_eq(t->nbytes, 512 * 3 * 8);
    /* expert ids are small non-negative integers (memcpy: safetensors data need not be aligned) */
    for (int i = 0; i < 512 * 3; i++) {
        int64_t id;
        memcpy(&id, (const uint8_t *)t->data + 8 * i, 8);
        cr_assert(id >= 0 && id < 4096, "tid2eid[%d] = %lld", i, (long long)id);
    }
    t = mk_st_find(st, "layers.1.attn.wq_a.weight");
    cr_assert(t);
    cr_assert_eq(t->dtype, MK_DT_F8_E4M3);
    cr_assert_eq(t->ndim, 2);
    cr_assert_eq(t->shape[0], 128);
    cr_assert_eq(t->shape[1], 256);
    cr_assert(strstr(mk_st_file_path(st, t->file), "model.safetensors"));
    t = mk_st_find(st, "embed.weight");
    cr_assert(t && t->dtype == MK_DT_BF16 && t->shape[0] == 512 && t->shape[1] == 256);
    cr_assert_eq(mk_st_total_bytes(st), 11417878);
    mk_st_close(st);
    /* the shard file alone gives the same tensors */
    snprintf(p, sizeof p, "%s/dsv4/v4-tiny-fp8/model.safetensors", mk_test_data_dir());
    cr_assert_eq(mk_st_open(p, &st, &err), MK_OK, "%s", err.msg);
    cr_assert_eq(mk_st_count(st), 427);
    mk_st_close(st);
}
