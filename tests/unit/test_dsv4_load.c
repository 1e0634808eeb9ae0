/* test_dsv4_load.c — corruption tests for loading a DeepSeek-V4 checkpoint (src/models/dsv4_load.c
 * on top of src/io/safetensors.c).
 *
 * Each test copies the golden checkpoint tests/data/dsv4/v4-tiny-fp8 (config.json,
 * model.safetensors, model.safetensors.index.json) into a fresh mkdtemp directory under /tmp,
 * corrupts the copy in one specific way, and checks that mk_model_load fails cleanly: a negative
 * status, *out set to NULL, no crash, and an error message that names what is wrong (the tensor,
 * field or file, plus a key word). Safetensors corruptions are made in C by parsing the header
 * (8-byte little-endian length + JSON) with jansson, editing it and writing it back with a new
 * length in front of the unchanged data section. The untouched copy and the three golden
 * checkpoints (v4-tiny-bf16, -fp8, -wide) must load, and `minke info` output must name the
 * architecture.
 */
#include <criterion/criterion.h>

#include "minke.h"
#include "test_util.h"

#include <dirent.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SRC_CKPT "dsv4/v4-tiny-fp8"
#define ST_FILE "model.safetensors"
#define IDX_FILE "model.safetensors.index.json"
#define CFG_FILE "config.json"

static const mk_model_options OPTS = {.n_threads = 1, .max_seq_len = 256};

/* ---- temp checkpoint copy -------------------------------------------------------------------- */

static char g_dir[64];

/* "<g_dir>/<name>" in a static buffer (one of two, so two paths can be live at once). */
static const char *tmp_path(const char *name) {
    static char buf[2][512];
    static int k;
    k ^= 1;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static uint8_t *read_whole(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    cr_assert_geq(n, 0);
    rewind(f);
    uint8_t *b = malloc((size_t)n + 1);
    cr_assert(b);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n, "short read on %s", path);
    fclose(f);
    b[n] = 0;
    *len = (size_t)n;
    return b;
}

static void write_whole(const char *path, const void *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot create %s", path);
    cr_assert_eq(fwrite(buf, 1, len, f), len, "short write on %s", path);
    cr_assert_eq(fclose(f), 0);
}

static void copy_in(const char *name) {
    char src[512];
    snprintf(src, sizeof src, "%s/%s/%s", mk_test_data_dir(), SRC_CKPT, name);
    size_t len;
    uint8_t *b = read_whole(src, &len);
    write_whole(tmp_path(name), b, len);
    free(b);
}

static void setup(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/minke_dsv4_XXXXXX");
    cr_assert(mkdtemp(g_dir), "mkdtemp failed");
    copy_in(CFG_FILE);
    copy_in(ST_FILE);
    copy_in(IDX_FILE);
}

/* Removes the flat temp directory and everything in it. */
static void teardown(void) {
    if (!g_dir[0]) return;
    DIR *d = opendir(g_dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlink(tmp_path(e->d_name));
        closedir(d);
    }
    rmdir(g_dir);
    g_dir[0] = '\0';
}

TestSuite(dsv4_load, .init = setup, .fini = teardown);

/* ---- safetensors header editing -------------------------------------------------------------- */

typedef struct {
    json_t *hdr;   /* the JSON header */
    uint8_t *data; /* a copy of the data section */
    size_t dlen;
    size_t data_start; /* file offset of the data section (8 + header length) */
} st_image;

static void st_load(st_image *im) {
    size_t len;
    uint8_t *b = read_whole(tmp_path(ST_FILE), &len);
    cr_assert_geq(len, 8);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
    cr_assert_leq(hl, len - 8);
    json_error_t je;
    im->hdr = json_loadb((const char *)b + 8, (size_t)hl, 0, &je);
    cr_assert(im->hdr, "golden header does not parse: %s", je.text);
    im->data_start = 8 + (size_t)hl;
    im->dlen = len - im->data_start;
    im->data = malloc(im->dlen + 64);
    cr_assert(im->data);
    memcpy(im->data, b + im->data_start, im->dlen);
    free(b);
}

/* Writes the header (padded with spaces so the data section stays 8-byte aligned) and the data
 * section back, and frees the image. */
static void st_store(st_image *im) {
    char *js = json_dumps(im->hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    cr_assert(js);
    size_t hl = strlen(js);
    size_t pad = (8 - (8 + hl) % 8) % 8;
    size_t total = 8 + hl + pad + im->dlen;
    uint8_t *b = malloc(total);
    cr_assert(b);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)(hl + pad) >> (8 * i));
    memcpy(b + 8, js, hl);
    memset(b + 8 + hl, ' ', pad);
    memcpy(b + 8 + hl + pad, im->data, im->dlen);
    write_whole(tmp_path(ST_FILE), b, total);
    free(b);
    free(js);
    free(im->data);
    json_decref(im->hdr);
    memset(im, 0, sizeof *im);
}

static json_t *st_entry(st_image *im, const char *name) {
    json_t *e = json_object_get(im->hdr, name);
    cr_assert(e && json_is_object(e), "golden checkpoint lacks tensor '%s'", name);
    return e;
}

/* ---- JSON file editing (config.json, index) -------------------------------------------------- */

static json_t *json_file_load(const char *name) {
    json_error_t je;
    json_t *j = json_load_file(tmp_path(name), 0, &je);
    cr_assert(j, "%s: %s", name, je.text);
    return j;
}

static void json_file_store(const char *name, json_t *j) {
    cr_assert_eq(json_dump_file(j, tmp_path(name), JSON_INDENT(2) | JSON_PRESERVE_ORDER), 0);
    json_decref(j);
}

static json_t *index_weight_map(json_t *idx) {
    json_t *wm = json_object_get(idx, "weight_map");
    cr_assert(wm && json_is_object(wm));
    return wm;
}

/* ---- expectations ---------------------------------------------------------------------------- */

/* Loads the temp checkpoint and checks it fails: negative status equal to err.status, *out NULL.
 * Returns the status; the message stays in *err. */
static int load_fail(mk_err *err) {
    memset(err, 0, sizeof *err);
    mk_model *m = (mk_model *)(void *)err; /* non-NULL sentinel: the loader must reset it */
    int rc = mk_model_load(g_dir, &OPTS, &m, err);
    cr_assert_lt(rc, 0, "corrupt checkpoint was accepted (rc %d)", rc);
    cr_assert_null(m, "*out not NULL after a failed load");
    cr_assert_eq(err->status, rc, "err.status %d != returned %d", err->status, rc);
    cr_assert(err->msg[0], "empty error message");
    mk_model_free(m);
    return rc;
}

#define EXPECT_MSG(err, word) \
    cr_assert(strstr((err).msg, (word)), "message lacks '%s': %s", (word), (err).msg)

/* ---- safetensors corruptions ----------------------------------------------------------------- */

Test(dsv4_load, wrong_dtype) {
    st_image im;
    st_load(&im);
    json_t *e = st_entry(&im, "layers.1.attn.wq_a.weight");
    cr_assert_str_eq(json_string_value(json_object_get(e, "dtype")), "F8_E4M3");
    json_object_set_new(e, "dtype", json_string("I8")); /* same byte size: offsets stay valid */
    st_store(&im);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, "layers.1.attn.wq_a.weight");
    EXPECT_MSG(err, "F8_E4M3");
    EXPECT_MSG(err, "found I8");
}

Test(dsv4_load, wrong_shape) {
    st_image im;
    st_load(&im);
    json_t *e = st_entry(&im, "layers.0.attn.wkv.weight");
    json_t *s = json_object_get(e, "shape");
    cr_assert_eq(json_integer_value(json_array_get(s, 0)), 256);
    cr_assert_eq(json_integer_value(json_array_get(s, 1)), 256);
    json_object_set_new(e, "shape", json_pack("[ii]", 128, 512));
    st_store(&im);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, "layers.0.attn.wkv.weight");
    EXPECT_MSG(err, "256, 256");
    EXPECT_MSG(err, "128, 512");
}

Test(dsv4_load, missing_tensor) {
    const char *name = "layers.2.attn.compressor.ape";
    st_image im;
    st_load(&im);
    st_entry(&im, name);
    cr_assert_eq(json_object_del(im.hdr, name), 0);
    st_store(&im); /* the bytes stay in the data section, unreferenced */
    json_t *idx = json_file_load(IDX_FILE);
    cr_assert_eq(json_object_del(index_weight_map(idx), name), 0);
    json_file_store(IDX_FILE, idx);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, "missing tensor");
    EXPECT_MSG(err, name);
}

/* Removed from the shard only: the index and the shard disagree. */
Test(dsv4_load, tensor_missing_from_shard_but_indexed) {
    const char *name = "layers.2.attn.compressor.ape";
    st_image im;
    st_load(&im);
    st_entry(&im, name);
    cr_assert_eq(json_object_del(im.hdr, name), 0);
    st_store(&im);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, name);
    EXPECT_MSG(err, "weight_map");
}

Test(dsv4_load, extra_tensor) {
    st_image im;
    st_load(&im);
    size_t b = im.dlen;
    float one = 1.0f;
    memcpy(im.data + im.dlen, &one, 4); /* st_load left 64 spare bytes */
    im.dlen += 4;
    json_object_set_new(im.hdr, "extra.tensor",
                        json_pack("{s:s, s:[i], s:[I,I]}", "dtype", "F32", "shape", 1,
                                  "data_offsets", (json_int_t)b, (json_int_t)(b + 4)));
    st_store(&im);
    json_t *idx = json_file_load(IDX_FILE);
    json_object_set_new(index_weight_map(idx), "extra.tensor", json_string(ST_FILE));
    json_file_store(IDX_FILE, idx);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, "unexpected tensor");
    EXPECT_MSG(err, "extra.tensor");
}

Test(dsv4_load, truncated_file) {
    size_t len;
    uint8_t *b = read_whole(tmp_path(ST_FILE), &len);
    cr_assert_eq(truncate(tmp_path(ST_FILE), (off_t)(len / 2)), 0);
    free(b);
    mk_err err;
    int rc = load_fail(&err);
    cr_assert(rc == MK_EFORMAT || rc == MK_EIO, "status %d: %s", rc, err.msg);
    EXPECT_MSG(err, ST_FILE);
}

Test(dsv4_load, truncated_inside_header) {
    cr_assert_eq(truncate(tmp_path(ST_FILE), 1000), 0);
    mk_err err;
    int rc = load_fail(&err);
    cr_assert(rc == MK_EFORMAT || rc == MK_EIO, "status %d: %s", rc, err.msg);
    EXPECT_MSG(err, "truncated");
}

Test(dsv4_load, header_length_beyond_file) {
    size_t len;
    uint8_t *b = read_whole(tmp_path(ST_FILE), &len);
    uint64_t hl = (uint64_t)len + 100;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(hl >> (8 * i));
    write_whole(tmp_path(ST_FILE), b, len);
    free(b);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, ST_FILE);
    EXPECT_MSG(err, "header length");
}

Test(dsv4_load, header_length_huge) {
    size_t len;
    uint8_t *b = read_whole(tmp_path(ST_FILE), &len);
    memset(b, 0xff, 8); /* 2^64 - 1: must not wrap around in the bounds check */
    write_whole(tmp_path(ST_FILE), b, len);
    free(b);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, "header length");
}

Test(dsv4_load, garbage_header) {
    size_t len;
    uint8_t *b = read_whole(tmp_path(ST_FILE), &len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
    cr_assert_leq(hl, len - 8);
    for (uint64_t i = 0; i < hl; i++) b[8 + i] = (uint8_t)("\x01garbage\xff{["[i % 12]);
    write_whole(tmp_path(ST_FILE), b, len);
    free(b);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, ST_FILE);
    EXPECT_MSG(err, "invalid JSON header");
}

Test(dsv4_load, header_not_an_object) {
    st_image im;
    st_load(&im);
    json_decref(im.hdr);
    im.hdr = json_pack("[i]", 1);
    st_store(&im);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, "must be an object");
}

Test(dsv4_load, data_offsets_out_of_range) {
    st_image im;
    st_load(&im);
    json_t *e = st_entry(&im, "layers.0.attn.wkv.weight");
    json_int_t end = (json_int_t)im.dlen + 65536;
    json_object_set_new(e, "data_offsets", json_pack("[I,I]", end - 65536, end));
    st_store(&im);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, "layers.0.attn.wkv.weight");
    EXPECT_MSG(err, "out of range");
}

Test(dsv4_load, overlapping_tensors) {
    st_image im;
    st_load(&im);
    /* point wq_a of layer 1 at the bytes of layer 0's wkv (same byte size: 128*256 < 256*256) */
    json_t *src = json_object_get(st_entry(&im, "layers.0.attn.wkv.weight"), "data_offsets");
    json_int_t b = json_integer_value(json_array_get(src, 0));
    json_object_set_new(st_entry(&im, "layers.1.attn.wq_a.weight"), "data_offsets",
                        json_pack("[I,I]", b, b + 128 * 256));
    st_store(&im);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, "overlap");
}

/* ---- config.json ----------------------------------------------------------------------------- */

Test(dsv4_load, config_wrong_model_type) {
    json_t *c = json_file_load(CFG_FILE);
    json_object_set_new(c, "model_type", json_string("llama"));
    json_file_store(CFG_FILE, c);
    mk_err err;
    load_fail(&err);
    EXPECT_MSG(err, "'model_type'");
    EXPECT_MSG(err, "llama");
}

Test(dsv4_load, config_missing_hidden_size) {
    json_t *c = json_file_load(CFG_FILE);
    cr_assert_eq(json_object_del(c, "hidden_size"), 0);
    json_file_store(CFG_FILE, c);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, "missing field 'hidden_size'");
    EXPECT_MSG(err, CFG_FILE);
}

Test(dsv4_load, config_compress_ratios_wrong_length) {
    json_t *c = json_file_load(CFG_FILE);
    json_t *cr = json_object_get(c, "compress_ratios");
    cr_assert(json_is_array(cr) && json_array_size(cr) == 5);
    cr_assert_eq(json_array_remove(cr, 1), 0);
    json_file_store(CFG_FILE, c);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, "'compress_ratios'");
}

Test(dsv4_load, config_compress_ratio_invalid_value) {
    json_t *c = json_file_load(CFG_FILE);
    cr_assert_eq(json_array_set_new(json_object_get(c, "compress_ratios"), 1, json_integer(1)), 0);
    json_file_store(CFG_FILE, c);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, "compress_ratios[1]");
}

Test(dsv4_load, config_hidden_size_disagrees_with_tensors) {
    json_t *c = json_file_load(CFG_FILE);
    json_object_set_new(c, "hidden_size", json_integer(512));
    json_file_store(CFG_FILE, c);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, "tensor '");
    EXPECT_MSG(err, "expected");
    EXPECT_MSG(err, "512");
    EXPECT_MSG(err, "256");
}

Test(dsv4_load, config_index_head_dim_invalid) {
    json_t *c = json_file_load(CFG_FILE);
    json_object_set_new(c, "index_head_dim", json_integer(100));
    json_file_store(CFG_FILE, c);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, "index_head_dim");
    EXPECT_MSG(err, "100");
}

Test(dsv4_load, config_field_wrong_type) {
    json_t *c = json_file_load(CFG_FILE);
    json_object_set_new(c, "num_attention_heads", json_string("4"));
    json_file_store(CFG_FILE, c);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, "'num_attention_heads'");
}

Test(dsv4_load, config_field_out_of_range) {
    json_t *c = json_file_load(CFG_FILE);
    json_object_set_new(c, "num_hidden_layers", json_integer(100000));
    json_file_store(CFG_FILE, c);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, "'num_hidden_layers'");
    EXPECT_MSG(err, "out of range");
}

Test(dsv4_load, config_invalid_json) {
    write_whole(tmp_path(CFG_FILE), "{\"model_type\": \"deepseek_v4\",,}", 31);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, "invalid JSON");
    EXPECT_MSG(err, CFG_FILE);
}

Test(dsv4_load, config_missing_file) {
    cr_assert_eq(unlink(tmp_path(CFG_FILE)), 0);
    mk_err err;
    load_fail(&err);
    EXPECT_MSG(err, CFG_FILE);
}

/* ---- index.json and shards ------------------------------------------------------------------- */

Test(dsv4_load, index_names_missing_shard) {
    const char *shard = "model-00002-of-00002.safetensors";
    json_t *idx = json_file_load(IDX_FILE);
    json_object_set_new(index_weight_map(idx), "layers.0.attn.wkv.weight", json_string(shard));
    json_file_store(IDX_FILE, idx);
    mk_err err;
    int rc = load_fail(&err);
    cr_assert(rc == MK_EIO || rc == MK_EFORMAT, "status %d: %s", rc, err.msg);
    EXPECT_MSG(err, shard);
}

Test(dsv4_load, index_shard_path_escape) {
    json_t *idx = json_file_load(IDX_FILE);
    json_object_set_new(index_weight_map(idx), "norm.weight", json_string("../model.safetensors"));
    json_file_store(IDX_FILE, idx);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, "norm.weight");
}

Test(dsv4_load, index_invalid_json) {
    write_whole(tmp_path(IDX_FILE), "{\"weight_map\": [", 16);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, IDX_FILE);
    EXPECT_MSG(err, "invalid JSON");
}

/* ---- tensor contents ------------------------------------------------------------------------- */

static void set_tid2eid(int64_t value) {
    st_image im;
    st_load(&im);
    json_t *e = st_entry(&im, "layers.0.ffn.gate.tid2eid");
    cr_assert_str_eq(json_string_value(json_object_get(e, "dtype")), "I64");
    json_int_t b = json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 0));
    size_t at = (size_t)b + 7 * 8; /* row 2, column 1 of [vocab, 3] */
    cr_assert_leq(at + 8, im.dlen);
    uint64_t u = (uint64_t)value;
    for (int i = 0; i < 8; i++) im.data[at + (size_t)i] = (uint8_t)(u >> (8 * i));
    st_store(&im);
}

Test(dsv4_load, tid2eid_out_of_range) {
    set_tid2eid(999);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, "layers.0.ffn.gate.tid2eid");
    EXPECT_MSG(err, "999");
    EXPECT_MSG(err, "row 2");
}

Test(dsv4_load, tid2eid_negative) {
    set_tid2eid(-1);
    mk_err err;
    cr_assert_eq(load_fail(&err), MK_EFORMAT, "%s", err.msg);
    EXPECT_MSG(err, "tid2eid");
    EXPECT_MSG(err, "-1");
}

/* ---- valid checkpoints ----------------------------------------------------------------------- */

/* The copy round-tripped through st_load/st_store (new, padded header) still loads. */
Test(dsv4_load, rewritten_header_loads) {
    st_image im;
    st_load(&im);
    st_store(&im);
    mk_model *m = NULL;
    mk_err err = {0};
    int rc = mk_model_load(g_dir, &OPTS, &m, &err);
    cr_assert_eq(rc, MK_OK, "%s", err.msg);
    cr_assert(m);
    mk_model_free(m);
}

Test(dsv4_load, untouched_copy_loads_and_prints_info) {
    mk_model *m = NULL;
    mk_err err = {0};
    int rc = mk_model_load(g_dir, &OPTS, &m, &err);
    cr_assert_eq(rc, MK_OK, "%s", err.msg);
    cr_assert(m);
    cr_assert_eq(mk_model_vocab_size(m), 512);
    FILE *f = tmpfile();
    cr_assert(f);
    mk_model_print_info(m, f);
    long n = ftell(f);
    cr_assert_gt(n, 0);
    rewind(f);
    char *text = calloc(1, (size_t)n + 1);
    cr_assert(text);
    cr_assert_eq(fread(text, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    cr_assert(strstr(text, "deepseek_v4"), "info lacks the architecture:\n%s", text);
    cr_assert(strstr(text, g_dir), "info lacks the model path:\n%s", text);
    free(text);
    mk_model_free(m);
}

Test(dsv4_golden, all_golden_checkpoints_load) {
    static const char *dirs[] = {"v4-tiny-bf16", "v4-tiny-fp8", "v4-tiny-wide"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        char d[512];
        snprintf(d, sizeof d, "%s/dsv4/%s", mk_test_data_dir(), dirs[i]);
        mk_model *m = NULL;
        mk_err err = {0};
        int rc = mk_model_load(d, &OPTS, &m, &err);
        cr_assert_eq(rc, MK_OK, "%s: %s", d, err.msg);
        cr_assert(m, "%s", d);
        cr_assert_gt(mk_model_vocab_size(m), 0);
        mk_model_free(m);
    }
}

Test(dsv4_golden, missing_directory) {
    mk_model *m = NULL;
    mk_err err = {0};
    int rc = mk_model_load("/nonexistent/minke_ckpt", &OPTS, &m, &err);
    cr_assert_lt(rc, 0);
    cr_assert_null(m);
    EXPECT_MSG(err, "/nonexistent/minke_ckpt");
}
