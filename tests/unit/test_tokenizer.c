/* test_tokenizer.c — unit tests of the tokenizer (src/text/tokenizer.h) against the goldens that HF
 * `tokenizers` produced for the DeepSeek-V3 tokenizer (tests/data/tokenizer/: fixed.json and
 * random-dev.json, see its README): byte-exact ids with and without special tokens, decoded text,
 * the streaming detokenizer fed one id at a time reproducing decode() (including characters split
 * over several byte-level tokens), round trips, lookups, invalid UTF-8, load errors naming the
 * unsupported feature, a post-processor BOS, concurrent use and very long inputs.
 * The property test against HF on trained tokenizers is tests/tokenizer/prop_test.py.
 */
#include <criterion/criterion.h>

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"
#include "text/tokenizer.h"

static char g_path[512];

static const char *ds_path(void) {
    snprintf(g_path, sizeof g_path, "%s/tokenizer/deepseek-v3/tokenizer.json", mk_test_data_dir());
    return g_path;
}

static mk_tok *load_ds(void) {
    mk_err err;
    mk_tok *t = NULL;
    int rc = mk_tok_load(ds_path(), &t, &err);
    cr_assert_eq(rc, 0, "load: %s", err.msg);
    return t;
}

static json_t *load_golden(const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/tokenizer/%s", mk_test_data_dir(), name);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    cr_assert(json_is_array(j), "%s: %s", p, je.text);
    return j;
}

static void check_ids(const char *what, const char *text, json_t *want, const int32_t *ids, size_t n) {
    cr_assert_eq(n, json_array_size(want), "%s: %zu ids, golden has %zu, text \"%s\"", what, n, json_array_size(want), text);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(ids[i], json_integer_value(json_array_get(want, i)), "%s: id %zu differs, text \"%s\"", what, i, text);
}

/* Concatenation of the streaming detokenizer's output over ids, one id at a time, then flush.
 * Every piece it emits must be valid UTF-8 on its own. */
static char *stream(const mk_tok *t, const int32_t *ids, size_t n, int skip, size_t *len) {
    mk_err err;
    mk_detok *d;
    cr_assert_eq(mk_detok_create(t, skip, &d, &err), 0);
    char *acc = calloc(1, 1);
    size_t al = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *p;
        size_t pl;
        int rc = i < n ? mk_detok_push(d, ids[i], &p, &pl) : mk_detok_flush(d, &p, &pl);
        cr_assert_eq(rc, 0);
        json_t *chk = json_stringn(p, pl); /* NULL when not valid UTF-8 */
        cr_assert(pl == 0 || chk, "detok emitted invalid UTF-8 at id %zu", i);
        json_decref(chk);
        acc = realloc(acc, al + pl + 1);
        memcpy(acc + al, p, pl);
        al += pl;
        acc[al] = 0;
    }
    mk_detok_free(d);
    *len = al;
    return acc;
}

/* For every golden case: ids (add_special 0 and 1), decode, round trip, and the streaming
 * detokenizer against decode. The DeepSeek goldens are all lossless, so decode == text. */
static void run_golden(const char *file) {
    mk_tok *t = load_ds();
    json_t *cases = load_golden(file);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        size_t tl = json_string_length(json_object_get(c, "text"));
        mk_err err;
        int32_t *ids, *ids2;
        size_t n, n2;
        cr_assert_eq(mk_tok_encode(t, text, tl, 0, &ids, &n, &err), 0, "%s", err.msg);
        cr_assert_eq(mk_tok_encode(t, text, tl, 1, &ids2, &n2, &err), 0, "%s", err.msg);
        check_ids("ids", text, json_object_get(c, "ids"), ids, n);
        check_ids("ids_special", text, json_object_get(c, "ids_special"), ids2, n2);
        char *dec;
        size_t dl;
        cr_assert_eq(mk_tok_decode(t, ids, n, 0, &dec, &dl, &err), 0, "%s", err.msg);
        json_t *want = json_object_get(c, "decoded");
        cr_assert(dl == json_string_length(want) && !memcmp(dec, json_string_value(want), dl), "decoded differs: \"%s\" vs \"%s\"", dec, json_string_value(want));
        cr_assert(dl == tl && !memcmp(dec, text, tl), "round trip differs for \"%s\"", text);
        size_t sl;
        char *s = stream(t, ids, n, 0, &sl);
        cr_assert(sl == dl && !memcmp(s, dec, dl), "stream \"%s\" vs decode \"%s\"", s, dec);
        free(s);
        free(dec);
        free(ids);
        free(ids2);
    }
    json_decref(cases);
    mk_tok_free(t);
}

Test(tokenizer, golden_fixed) { run_golden("fixed.json"); }
Test(tokenizer, golden_random_dev) { run_golden("random-dev.json"); }

/* Lookups agree with HF's (ids checked there), and the BOS comes from tokenizer_config.json. */
Test(tokenizer, lookups_and_bos) {
    mk_tok *t = load_ds();
    cr_assert_eq(mk_tok_vocab_size(t), 128815);
    cr_assert_eq(mk_tok_token_to_id(t, "<｜begin▁of▁sentence｜>"), 0);
    cr_assert_eq(mk_tok_token_to_id(t, "<｜User｜>"), 128803);
    cr_assert_eq(mk_tok_token_to_id(t, "no such token"), -1);
    cr_assert_str_eq(mk_tok_id_to_token(t, 130), "Ã");
    cr_assert_null(mk_tok_id_to_token(t, -1));
    cr_assert_null(mk_tok_id_to_token(t, 128815));
    cr_assert(mk_tok_is_special(t, 0));
    cr_assert(mk_tok_is_special(t, 1));
    cr_assert_not(mk_tok_is_special(t, 44));
    /* tokenizer.json's post-processor adds nothing; the BOS comes from tokenizer_config.json */
    cr_assert_eq(mk_tok_bos_id(t), 0);
    mk_tok_free(t);
    /* a directory works as well */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tokenizer/deepseek-v3/", mk_test_data_dir());
    mk_err err;
    cr_assert_eq(mk_tok_load(dir, &t, &err), 0, "%s", err.msg);
    mk_tok_free(t);
}

Test(tokenizer, skip_special) {
    mk_tok *t = load_ds();
    int32_t ids[] = {0, 44, 1};
    char *s;
    size_t l;
    mk_err err;
    cr_assert_eq(mk_tok_decode(t, ids, 3, 1, &s, &l, &err), 0);
    cr_assert_str_eq(s, "J");
    free(s);
    cr_assert_eq(mk_tok_decode(t, ids, 3, 0, &s, &l, &err), 0);
    cr_assert_str_eq(s, "<｜begin▁of▁sentence｜>J<｜end▁of▁sentence｜>");
    free(s);
    char *st = stream(t, ids, 3, 1, &l);
    cr_assert_str_eq(st, "J");
    free(st);
    /* unknown ids are dropped, as HF does */
    int32_t bad[] = {44, 999999, -5, 44};
    cr_assert_eq(mk_tok_decode(t, bad, 4, 0, &s, &l, &err), 0);
    cr_assert_str_eq(s, "JJ");
    free(s);
    mk_tok_free(t);
}

/* A character split over byte-level tokens is emitted only once complete. */
Test(tokenizer, stream_split_multibyte) {
    mk_tok *t = load_ds();
    mk_detok *d;
    mk_err err;
    cr_assert_eq(mk_detok_create(t, 0, &d, &err), 0);
    const char *p;
    size_t l;
    int32_t c3 = mk_tok_token_to_id(t, "Ã"), a9 = mk_tok_token_to_id(t, "©"); /* bytes C3, A9: "é" */
    cr_assert(c3 >= 0 && a9 >= 0);
    cr_assert_eq(mk_detok_push(d, 44, &p, &l), 0);
    cr_assert(l == 1 && p[0] == 'J');
    cr_assert_eq(mk_detok_push(d, c3, &p, &l), 0);
    cr_assert_eq(l, 0, "half a character must not be emitted");
    cr_assert_eq(mk_detok_push(d, a9, &p, &l), 0);
    cr_assert(l == 2 && !memcmp(p, "\xC3\xA9", 2));
    /* an incomplete character at the end becomes U+FFFD on flush, as HF's decode does */
    cr_assert_eq(mk_detok_push(d, c3, &p, &l), 0);
    cr_assert_eq(l, 0);
    cr_assert_eq(mk_detok_flush(d, &p, &l), 0);
    cr_assert(l == 3 && !memcmp(p, "\xEF\xBF\xBD", 3));
    /* after flush the stream starts afresh */
    cr_assert_eq(mk_detok_push(d, 44, &p, &l), 0);
    cr_assert(l == 1 && p[0] == 'J');
    mk_detok_reset(d);
    cr_assert_eq(mk_detok_flush(d, &p, &l), 0);
    cr_assert_eq(l, 0);
    mk_detok_free(d);

    /* 4-byte emoji split over two tokens: "🙂" = [80300, 227] */
    const char *txt = "a🙂b👨\u200d👩\u200d👧\u200d👦深度";
    int32_t *ids;
    size_t n;
    cr_assert_eq(mk_tok_encode(t, txt, strlen(txt), 0, &ids, &n, &err), 0);
    char *s = stream(t, ids, n, 0, &l);
    cr_assert_str_eq(s, txt);
    free(s);
    free(ids);
    mk_tok_free(t);
}

/* Invalid UTF-8 is refused naming the offset of the first bad byte: lone 0xFF, an overlong, a
 * surrogate, a truncated sequence, a code point above U+10FFFF, a stray continuation byte. */
Test(tokenizer, invalid_utf8) {
    mk_tok *t = load_ds();
    static const struct {
        const char *s;
        size_t n, at;
    } bad[] = {
        {"ab\xff", 3, 2}, {"\xc0\xaf", 2, 0}, {"x\xed\xa0\x80", 4, 1}, {"xy\xe4\xb8", 4, 2},
        {"\xf4\x90\x80\x80", 4, 0}, {"ok\x80", 3, 2},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t *ids;
        size_t n;
        mk_err err;
        int rc = mk_tok_encode(t, bad[i].s, bad[i].n, 0, &ids, &n, &err);
        cr_assert_eq(rc, MK_EINVAL, "case %zu", i);
        char want[64];
        snprintf(want, sizeof want, "byte %zu", bad[i].at);
        cr_assert(strstr(err.msg, want), "case %zu: \"%s\" should name %s", i, err.msg, want);
    }
    /* NUL bytes are valid UTF-8 */
    int32_t *ids;
    size_t n;
    mk_err err;
    cr_assert_eq(mk_tok_encode(t, "a\0b", 3, 0, &ids, &n, &err), 0);
    char *s;
    size_t l;
    cr_assert_eq(mk_tok_decode(t, ids, n, 0, &s, &l, &err), 0);
    cr_assert(l == 3 && !memcmp(s, "a\0b", 3));
    free(s);
    free(ids);
    /* empty input */
    cr_assert_eq(mk_tok_encode(t, "", 0, 1, &ids, &n, &err), 0);
    cr_assert_eq(n, 0);
    free(ids);
    mk_tok_free(t);
}

/* Long runs stress the regexes (JIT stack, the \s+(?!\S) lookahead) and BPE on one huge word
 * (the merge heap); all must encode and round-trip. */
Test(tokenizer, long_inputs) {
    mk_tok *t = load_ds();
    size_t n = 1 << 18; /* 256 KiB runs: one giant word for BPE, long regex matches */
    char *big = malloc(n + 1);
    const char *pats[] = {"a", " ", "\n", "1", "\xe6\xb7\xb1", "!"};
    for (size_t k = 0; k < sizeof pats / sizeof pats[0]; k++) {
        size_t pl = strlen(pats[k]), m = n / pl * pl;
        for (size_t i = 0; i < m; i += pl) memcpy(big + i, pats[k], pl);
        big[m - 1] = pl == 1 ? 'x' : big[m - 1]; /* a non-space at the end for the \s+(?!\S) case */
        int32_t *ids;
        size_t ni;
        mk_err err;
        cr_assert_eq(mk_tok_encode(t, big, m, 0, &ids, &ni, &err), 0, "pattern %zu: %s", k, err.msg);
        cr_assert_gt(ni, 0);
        char *s;
        size_t l;
        cr_assert_eq(mk_tok_decode(t, ids, ni, 0, &s, &l, &err), 0);
        cr_assert(l == m && !memcmp(s, big, m), "round trip of pattern %zu", k);
        free(s);
        free(ids);
    }
    free(big);
    mk_tok_free(t);
}

/* ---- concurrency: one mk_tok, several threads ----------------------------------------------------- */
typedef struct {
    const mk_tok *t;
    json_t *cases;
    int bad;
} thr_arg;

static void *thr_main(void *p) {
    thr_arg *a = p;
    for (int rep = 0; rep < 3; rep++) {
        size_t i;
        json_t *c;
        json_array_foreach(a->cases, i, c) {
            json_t *tx = json_object_get(c, "text"), *want = json_object_get(c, "ids");
            int32_t *ids;
            size_t n;
            mk_err err;
            if (mk_tok_encode(a->t, json_string_value(tx), json_string_length(tx), 0, &ids, &n, &err)) {
                a->bad++;
                continue;
            }
            if (n != json_array_size(want)) a->bad++;
            for (size_t k = 0; k < n && k < json_array_size(want); k++)
                if (ids[k] != json_integer_value(json_array_get(want, k))) a->bad++;
            free(ids);
        }
    }
    return NULL;
}

/* One mk_tok encoding the golden strings on 4 threads at once (the scratch pool under load). */
Test(tokenizer, concurrent_encode) {
    mk_tok *t = load_ds();
    json_t *cases = load_golden("random-dev.json");
    pthread_t th[4];
    thr_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (thr_arg){t, cases, 0};
        pthread_create(&th[i], NULL, thr_main, &a[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(a[i].bad, 0, "thread %d saw %d differences", i, a[i].bad);
    }
    json_decref(cases);
    mk_tok_free(t);
}

/* ---- small hand-written tokenizers: errors and post-processors ------------------------------------ */

static char g_dir[256];

/* Writes a small tokenizer.json into a per-process temporary directory; returns its path. */
static const char *write_tok(const char *name, const char *json) {
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/minke-tok-XXXXXX");
        cr_assert_not_null(mkdtemp(g_dir));
    }
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fputs(json, f);
    fclose(f);
    return p;
}

#define MINI_MODEL                                                                                     \
    "\"model\": {\"type\": \"BPE\", \"vocab\": {\"<s>\": 0, \"</s>\": 1, \"a\": 2, \"b\": 3, \"ab\": 4, " \
    "\"Ġ\": 5, \"Ġa\": 6}, \"merges\": [\"a b\", \"Ġ a\"]}"

/* Loading must fail with `status`, leave *out NULL and say `needle` (the feature it names). */
static void expect_load_error(const char *name, const char *json, int status, const char *needle) {
    const char *p = write_tok(name, json);
    mk_tok *t = NULL;
    mk_err err = {0};
    int rc = mk_tok_load(p, &t, &err);
    cr_assert_eq(rc, status, "%s: status %d, expected %d (%s)", name, rc, status, err.msg);
    cr_assert_null(t);
    cr_assert(strstr(err.msg, needle), "%s: message \"%s\" should contain \"%s\"", name, err.msg, needle);
}

Test(tokenizer, load_errors) {
    mk_tok *t = NULL;
    mk_err err;
    cr_assert_eq(mk_tok_load("/nonexistent/tokenizer.json", &t, &err), MK_EIO);
    cr_assert(strstr(err.msg, "/nonexistent/tokenizer.json"), "%s", err.msg);
    expect_load_error("bad.json", "{\"model\": {", MK_EFORMAT, "invalid JSON at line 1");
    expect_load_error("wp.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", MK_ENOTSUP,
                      "model type \"WordPiece\" is not supported");
    expect_load_error("ws.json", "{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, " MINI_MODEL "}", MK_ENOTSUP,
                      "pre_tokenizer type \"Whitespace\" is not supported");
    expect_load_error("bert.json", "{\"normalizer\": {\"type\": \"BertNormalizer\"}, " MINI_MODEL "}", MK_ENOTSUP,
                      "normalizer type \"BertNormalizer\" is not supported");
    expect_load_error("dec.json", "{\"decoder\": {\"type\": \"WordPiece\"}, " MINI_MODEL "}", MK_ENOTSUP,
                      "decoder type \"WordPiece\" is not supported");
    expect_load_error("pp.json", "{\"post_processor\": {\"type\": \"Weird\"}, " MINI_MODEL "}", MK_ENOTSUP,
                      "post_processor type \"Weird\" is not supported");
    expect_load_error("order.json",
                      "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"}, "
                      "{\"type\": \"Digits\"}]}, " MINI_MODEL "}",
                      MK_ENOTSUP, "Digits after ByteLevel");
    expect_load_error("re.json",
                      "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": "
                      "\"Isolated\"}, " MINI_MODEL "}",
                      MK_ENOTSUP, "does not compile");
    expect_load_error("merge.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a c\"]}}",
                      MK_EFORMAT, "token \"c\" is not in the vocab");
    expect_load_error("drop.json", "{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {}, \"merges\": []}}",
                      MK_ENOTSUP, "dropout");
}

/* A TemplateProcessing "<s> $A </s>" with add_special, ByteLevel with add_prefix_space, and an
 * added token matched before the model. */
Test(tokenizer, template_bos_and_bytelevel) {
    const char *p = write_tok("tmpl.json",
        "{\"added_tokens\": [{\"id\": 0, \"content\": \"<s>\", \"special\": true, \"normalized\": false},"
        "                   {\"id\": 1, \"content\": \"</s>\", \"special\": true, \"normalized\": false}],"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": true},"
        " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}},"
        "   {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"</s>\", \"type_id\": 0}}],"
        "   \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [0], \"tokens\": [\"<s>\"]},"
        "                      \"</s>\": {\"id\": \"</s>\", \"ids\": [1], \"tokens\": [\"</s>\"]}}},"
        " \"decoder\": {\"type\": \"ByteLevel\"}, " MINI_MODEL "}");
    mk_tok *t;
    mk_err err;
    cr_assert_eq(mk_tok_load(p, &t, &err), 0, "%s", err.msg);
    cr_assert_eq(mk_tok_bos_id(t), 0);
    int32_t *ids;
    size_t n;
    /* "ab a" -> prefix space -> " ab", " a" words -> [Ġ a b] merges: "a b" (rank 0) then nothing
     * for Ġ+ab; " a" -> Ġa */
    cr_assert_eq(mk_tok_encode(t, "ab a", 4, 1, &ids, &n, &err), 0, "%s", err.msg);
    int32_t want[] = {0, 5, 4, 6, 1};
    cr_assert_eq(n, 5);
    for (size_t i = 0; i < n; i++) cr_assert_eq(ids[i], want[i], "id %zu", i);
    free(ids);
    cr_assert_eq(mk_tok_encode(t, "<s>a", 4, 0, &ids, &n, &err), 0);
    cr_assert(n == 2 && ids[0] == 0 && ids[1] == 6); /* the added token, then " a" */
    free(ids);
    mk_tok_free(t);
}
