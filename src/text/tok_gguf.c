/* tok_gguf.c — an mk_tok built from a GGUF file's tokenizer.ggml.* metadata, tokenizing as
 * llama.cpp does (see mk_tok_load_gguf in tokenizer.h for the keys).
 *
 * The result is the same mk_tok the tokenizer.json loader makes, filled in directly: the vocab
 * map, the merge map, one Split (Isolated) pre-tokenizer stage per llama.cpp regex, byte-level
 * units, added tokens for the control / unknown / user-defined tokens, BOS/EOS as the
 * post-processor ids and a ByteLevel decoder. Encoding then runs the shared pipeline; how each of
 * llama.cpp's steps maps onto it:
 *   - special tokens: llama.cpp cuts control, unknown and user-defined tokens out of the text
 *     longest first (tokenizer_st_partition with parse_special); we cut them leftmost-longest
 *     with the added-token trie. The two agree unless two such tokens overlap in the text.
 *   - pre-tokenizer: llama.cpp runs each regex of the pre type over the pieces the previous one
 *     left, keeping both matches and the text between them as pieces — a Split with behaviour
 *     Isolated. Its regexes run in three engines (hand-written GPT-2 / Llama-3 matchers,
 *     std::regex on a "collapsed" one-byte-per-character text for patterns with \p{..}, and
 *     std::wregex otherwise); the PCRE2 patterns below are written to match what those engines
 *     match, not what the patterns would mean in Oniguruma (see "the regexes" below).
 *   - BPE: llama.cpp merges the lowest-ranked adjacent pair, leftmost on ties, over the byte-level
 *     characters of a word, like HF; with ignore_merges (llama3, tekken) a word that is itself a
 *     token is taken whole. A byte with no token is dropped (llama.cpp has no unk for BPE) but,
 *     unlike in HF, still keeps its neighbours from merging: a final ST_BYTE_BARRIER stage cuts
 *     the word there when the vocab lacks some byte.
 * Not reproduced: llama.cpp's load-time "control-looking token" fix-ups (a token spelled
 * "<|im_end|>", "<|eot_id|>", a FIM marker ... that the file marks as normal is promoted to control
 * when the corresponding special-id key is absent) and its per-model-name attribute hacks (phi-3
 * rstrip, jina <mask> lstrip); files that need them tokenize those tokens as plain text here.
 */
#include "text/tok_internal.h"

#include "io/gguf.h"

#include <stdlib.h>

/* ---- the regexes -------------------------------------------------------------------------------
 * llama.cpp's whitespace is Unicode White_Space (its unicode_set_whitespace); its engines agree:
 * the hand-written matchers use that table, and before std::regex / std::wregex run, every
 * non-ASCII White_Space character is replaced by U+000B, which their \s matches. PCRE2's \s with
 * UCP differs (it also matches U+180E), so \s and \S are spelled out as WS classes. The same
 * replacement means that in the std::wregex patterns (no \p{..}) a literal class never matches a
 * non-ASCII whitespace character even when its range spans one: such classes get a (?!\s) guard.
 * (The collapsed patterns' ASCII lists for \p{P} and \p{S} are Unicode's; llama.cpp versions
 * before the fix that added '~' to its \p{S} list split "~~" differently for deepseek-v3.) */
#define WS "\\x09-\\x0D\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define SP "[" WS "]"   /* \s */
#define NSP "[^" WS "]" /* \S */
#define WS_TAIL "|" SP "*[\\r\\n]+|" SP "+(?!" NSP ")|" SP "+" /* \s*[\r\n]+|\s+(?!\S)|\s+ */

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|" SP "+(?!" NSP ")|" SP "+"
/* (?i:'s|'t|'re|'ve|'m|'ll|'d) as llama.cpp writes it */
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3 RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*" WS_TAIL
#define RE_QWEN2 RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*" WS_TAIL
/* Tekken distinguishes upper and lower case only on ASCII: (?=\p{L})[^a-z] is "a letter that is
 * not a-z", which is what llama.cpp's collapsed text gives for every non-ASCII letter too. */
#define RE_TEKKEN                                                                                  \
    "[^\\r\\n\\p{L}\\p{N}]?(?:(?=\\p{L})[^a-z])*(?:(?=\\p{L})[^A-Z])+"                             \
    "|[^\\r\\n\\p{L}\\p{N}]?(?:(?=\\p{L})[^a-z])+(?:(?=\\p{L})[^A-Z])*"                            \
    "|\\p{N}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*" WS_TAIL
/* DeepSeek-V3: [!-~ punctuation][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|... */
#define RE_DSV3_WORDS                                                                              \
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"                                        \
    "|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*" WS_TAIL
/* DeepSeek-LLM's cased-letter class (\p{L&} as of the tokenizer's making), code point by code
 * point as in its tokenizer.json. */
#define RE_DSLLM_LETTERS                                                                           \
    SP "?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"              \
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"          \
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}"  \
    "\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}"   \
    "\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}"                  \
    "\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}"                  \
    "\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"          \
    "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}"         \
    "\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"                  \
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}"          \
    "\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}"                    \
    "\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}"          \
    "\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"                   \
    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}"                  \
    "\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}"                  \
    "\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}"            \
    "\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+"
/* [^(\s|.,!?…。，、।۔،)]: BLOOM-style words (std::wregex; the class holds no whitespace) */
#define RE_BLOOM " ?[^(" WS "|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+"

#define MAX_RE 6
typedef struct {
    const char *names; /* the tokenizer.ggml.pre values, space-separated */
    const char *re[MAX_RE];
    int ignore_merges, add_bos;
} pre_def;

/* llama.cpp's pre types (llama-vocab.cpp, llm_tokenizer_bpe), for the names we support, with the
 * flags llama.cpp sets for them. The leading space of " default" makes that entry also the one for
 * a missing tokenizer.ggml.pre, which llama.cpp treats as "default". Every name here is checked
 * against llama.cpp by tests/tokenizer/gguf_vs_llamacpp.py. */
static const pre_def PRE[] = {
    {" default", {"[\\p{P}$+<=>^~|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}, 0, 0},
    {"gpt-2 phi-2 mpt olmo jais gigachat jina-es jina-de a.x-4.0 mellum trillion granite-docling exaone4",
     {RE_GPT2}, 0, 0},
    {"smollm starcoder refact command-r codeshell exaone minerva-7b mellum2", {"\\p{N}", RE_GPT2}, 0, 0},
    {"llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano", {RE_LLAMA3}, 1, 1},
    {"dbrx smaug-bpe", {RE_LLAMA3}, 0, 0},
    {"qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan solar-open", {RE_QWEN2}, 0, 0},
    {"falcon", {"[\\p{P}$+<=>^~|`]+", RE_GPT2, "[0-9][0-9][0-9]"}, 0, 0},
    {"deepseek-llm",
     {"[\\r\\n]", RE_DSLLM_LETTERS,
      SP "?(?:(?!" SP ")[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}])+",
      SP "+\\z", "(?:(?!" SP ")[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}])+", "\\p{N}+"},
     0, 0},
    {"deepseek-v3 hunyuan-dense joyai-llm hy_v4",
     {"\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+", RE_DSV3_WORDS}, 0, 0},
    {"tekken", {RE_TEKKEN}, 1, 1},
    {"bloom poro-chat gpt3-finnish", {RE_BLOOM}, 0, 0},
    {"viking", {RE_BLOOM, "\\p{N}"}, 0, 0},
};

/* The entry whose name list holds name ("" for a missing key), or NULL. */
static const pre_def *find_pre(const char *name) {
    size_t nl = strlen(name);
    for (size_t i = 0; i < sizeof PRE / sizeof PRE[0]; i++) {
        const char *p = PRE[i].names;
        if (!nl) {
            if (p[0] == ' ') return &PRE[i];
            continue;
        }
        for (const char *q = p; (q = strstr(q, name)); q += nl)
            if ((q == p || q[-1] == ' ') && (q[nl] == ' ' || q[nl] == 0)) return &PRE[i];
    }
    return NULL;
}

/* ---- metadata ------------------------------------------------------------------------------------ */

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5, TT_BYTE = 6 };

/* A string-array key: its element count (0 with *found = 0 when absent and optional). */
static int str_array(const mk_gguf *g, const char *key, uint64_t *n, int *found, mk_err *err) {
    int et;
    int rc = mk_gguf_get_arr(g, key, &et, n, NULL, found, err);
    if (rc || (found && !*found)) return rc;
    if (et != MK_GGUF_T_STRING)
        return mk_fail(err, MK_EFORMAT, "%s: %s: expected an array of strings, found an array of %s",
                       mk_gguf_fname(g), key, mk_gguf_type_name(et));
    return 0;
}

/* An optional token id key: -1 when absent; out of range is a warning and -1 (llama.cpp also
 * ignores such an id, keeping its default). */
static int token_id(const mk_gguf *g, const char *key, int32_t n_vocab, int32_t *out, mk_err *err) {
    uint32_t v;
    int found;
    *out = -1;
    int rc = mk_gguf_get_u32(g, key, &v, &found, err);
    if (rc || !found) return rc;
    if (v >= (uint32_t)n_vocab) {
        mk_log(MK_LOG_WARN, "%s: %s = %u is outside the vocab (%d tokens); ignored", mk_gguf_fname(g), key, v,
               n_vocab);
        return 0;
    }
    *out = (int32_t)v;
    return 0;
}

/* Vocab: id = index. An empty token gets llama.cpp's placeholder "[EMPTY_<id>]"; a repeated token
 * is an error (as in llama.cpp) since one of the two ids could never be produced. */
static int load_vocab(mk_tok *t, const mk_gguf *g, uint64_t n, mk_err *err) {
    const char *key = "tokenizer.ggml.tokens";
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        char ph[32];
        if (mk_gguf_arr_str(g, key, i, &s, &len)) return mk_fail(err, MK_EINTERNAL, "%s: %s[%llu] unreadable", t->path, key, (unsigned long long)i);
        if (len == 0) {
            len = (size_t)snprintf(ph, sizeof ph, "[EMPTY_%llu]", (unsigned long long)i);
            s = ph;
        }
        int32_t prev = tok_smap_get(&t->vocab, s, len);
        if (prev >= 0)
            return mk_fail(err, MK_EFORMAT, "%s: %s: token \"%.*s\" appears twice (ids %d and %llu)", t->path, key,
                           (int)(len > 200 ? 200 : len), s, prev, (unsigned long long)i);
        if (tok_smap_put(&t->vocab, s, len, (int32_t)i)) return mk_fail(err, MK_ENOMEM, "%s: out of memory", t->path);
    }
    t->vocab_size = (int)n;
    return 0;
}

/* Merges: "a b", split at the first space after the first byte (as llama.cpp: a token may start
 * with a space). Rank = index; llama.cpp keeps the first rank of a repeated pair, so the merges
 * are put last to first (tok_mmap_put overwrites). Both halves and their concatenation must be
 * tokens: otherwise the merge could only produce a symbol with no id. */
static int load_merges(mk_tok *t, const mk_gguf *g, uint64_t nm, mk_err *err) {
    const char *key = "tokenizer.ggml.merges";
    if (!(t->merges = tok_mmap_create((size_t)nm))) return mk_fail(err, MK_ENOMEM, "%s: out of memory", t->path);
    tok_buf nb = {0};
    int rc = 0;
    for (uint64_t i = nm; i-- > 0 && !rc;) {
        const char *s;
        size_t len;
        if (mk_gguf_arr_str(g, key, i, &s, &len)) {
            rc = mk_fail(err, MK_EINTERNAL, "%s: %s[%llu] unreadable", t->path, key, (unsigned long long)i);
            break;
        }
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!sp) {
            rc = mk_fail(err, MK_EFORMAT, "%s: %s[%llu] \"%.*s\": expected two tokens separated by a space", t->path,
                         key, (unsigned long long)i, (int)(len > 200 ? 200 : len), s);
            break;
        }
        size_t al = (size_t)(sp - s), bl = len - al - 1;
        int32_t ia = tok_smap_get(&t->vocab, s, al), ib = tok_smap_get(&t->vocab, sp + 1, bl);
        nb.n = 0;
        if (tok_buf_put(&nb, s, al) || tok_buf_put(&nb, sp + 1, bl)) {
            rc = mk_fail(err, MK_ENOMEM, "%s: out of memory", t->path);
            break;
        }
        int32_t in = tok_smap_get(&t->vocab, nb.p, nb.n);
        if (ia < 0 || ib < 0 || in < 0) {
            const char *bad = ia < 0 ? s : ib < 0 ? sp + 1 : nb.p;
            size_t badn = ia < 0 ? al : ib < 0 ? bl : nb.n;
            rc = mk_fail(err, MK_EFORMAT, "%s: %s[%llu]: \"%.*s\" is not a token", t->path, key,
                         (unsigned long long)i, (int)(badn > 200 ? 200 : badn), bad);
            break;
        }
        tok_mmap_put(t->merges, ia, ib, (uint32_t)i, in);
    }
    free(nb.p);
    return rc;
}

/* Control, unknown and user-defined tokens become added tokens (matched raw: GGUF tokenizers have
 * no normalizer). Only control and unknown ones are special (skipped by skip_special), as
 * llama.cpp renders user-defined tokens as text. token_type may be longer than the vocab, as
 * llama.cpp allows; it must be int32 as llama.cpp requires. */
static int load_token_types(mk_tok *t, const mk_gguf *g, uint64_t n, mk_err *err) {
    const char *key = "tokenizer.ggml.token_type";
    int et, found;
    uint64_t nt;
    const void *data;
    int rc = mk_gguf_get_arr(g, key, &et, &nt, &data, &found, err);
    if (rc || !found) return rc;
    if (et != MK_GGUF_T_INT32)
        return mk_fail(err, MK_EFORMAT, "%s: %s: expected an array of int32, found an array of %s", t->path, key,
                       mk_gguf_type_name(et));
    if (nt < n)
        return mk_fail(err, MK_EFORMAT, "%s: %s: %llu entries for %llu tokens", t->path, key, (unsigned long long)nt,
                       (unsigned long long)n);
    const uint8_t *p = data;
    size_t n_added = 0;
    for (int pass = 0; pass < 2; pass++) { /* count, then fill */
        for (uint64_t i = 0; i < n; i++) {
            int32_t ty;
            memcpy(&ty, p + 4 * i, 4); /* little-endian host (gguf.c rejects big-endian files) */
            if (ty != TT_CONTROL && ty != TT_UNKNOWN && ty != TT_USER_DEFINED) continue;
            if (!pass) {
                n_added++;
                continue;
            }
            /* the vocab entry's text (the placeholder for an empty token) */
            tok_added *a = &t->added[t->n_added];
            const char *txt;
            size_t len;
            if (mk_gguf_arr_str(g, "tokenizer.ggml.tokens", i, &txt, &len))
                return mk_fail(err, MK_EINTERNAL, "%s: tokens[%llu] unreadable", t->path, (unsigned long long)i);
            char ph[32];
            if (len == 0) {
                len = (size_t)snprintf(ph, sizeof ph, "[EMPTY_%llu]", (unsigned long long)i);
                txt = ph;
            }
            if (!(a->content = malloc(len + 1))) return mk_fail(err, MK_ENOMEM, "%s: out of memory", t->path);
            memcpy(a->content, txt, len);
            a->content[len] = 0;
            a->len = len;
            a->id = (int32_t)i;
            a->special = ty != TT_USER_DEFINED;
            t->n_added++;
            if (tok_smap_put(&t->added_map, txt, len, (int32_t)i))
                return mk_fail(err, MK_ENOMEM, "%s: out of memory", t->path);
        }
        if (!pass && !(t->added = calloc(n_added ? n_added : 1, sizeof *t->added)))
            return mk_fail(err, MK_ENOMEM, "%s: out of memory", t->path);
    }
    return 0;
}

/* One Split (Isolated) stage per regex of the pre type. */
static int add_stages(mk_tok *t, const pre_def *pd, const char *pre_name, mk_err *err) {
    for (int i = 0; i < MAX_RE && pd->re[i]; i++) {
        char where[256];
        snprintf(where, sizeof where, "%s: tokenizer.ggml.pre \"%s\": regex %d", t->path, pre_name, i);
        tok_stage *st = &t->stage[t->n_stage];
        *st = (tok_stage){ST_SPLIT, {0}, SPLIT_ISOLATED, 0};
        int rc = tok_re_compile(&st->re, pd->re[i], strlen(pd->re[i]), 0, where, err);
        if (rc) return rc;
        t->n_stage++;
    }
    return 0;
}

/* A boolean key (any integer type is accepted too, as 0 / non-zero), or dflt when absent. */
static int get_flag(const mk_gguf *g, const char *key, int dflt, int *out, mk_err *err) {
    int found;
    *out = dflt;
    int rc = mk_gguf_get_bool(g, key, out, &found, err);
    if (!rc && !found) *out = dflt;
    return rc;
}

/* The order follows the data dependencies: the vocab first (merges and added tokens refer to its
 * ids), the checks that can fail on small keys before the big arrays are read. */
int mk_tok_load_gguf(const mk_gguf *g, mk_tok **out, mk_err *err) {
    *out = NULL;
    if (!g) return mk_fail(err, MK_EINVAL, "tokenizer: no GGUF given");
    const char *fname = mk_gguf_fname(g);
    const char *model, *pre = "";
    int found, rc;
    if ((rc = mk_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL, NULL, err))) return rc;
    if (!strcmp(model, "llama"))
        return mk_fail(err, MK_ENOTSUP,
                       "%s: tokenizer.ggml.model \"llama\" (SentencePiece) is not supported yet; only \"gpt2\" "
                       "(byte-level BPE) is",
                       fname);
    if (strcmp(model, "gpt2"))
        return mk_fail(err, MK_ENOTSUP, "%s: tokenizer.ggml.model \"%s\" is not supported; only \"gpt2\" (byte-level BPE) is",
                       fname, model);
    if ((rc = mk_gguf_get_str(g, "tokenizer.ggml.pre", &pre, NULL, &found, err))) return rc;
    if (!found) {
        mk_log(MK_LOG_WARN, "%s: no tokenizer.ggml.pre; using llama.cpp's \"default\" pre-tokenizer", fname);
        pre = "";
    }
    const pre_def *pd = find_pre(pre);
    if (!pd)
        return mk_fail(err, MK_ENOTSUP,
                       "%s: tokenizer.ggml.pre \"%s\" is not a supported pre-tokenizer (known: default, gpt-2, "
                       "smollm, starcoder, refact, llama3, llama-bpe, qwen2, deepseek-llm, deepseek-v3, tekken, ...)",
                       fname, pre);
    uint64_t n, nm;
    if ((rc = str_array(g, "tokenizer.ggml.tokens", &n, NULL, err))) return rc;
    if (n == 0 || n > INT32_MAX / 2)
        return mk_fail(err, MK_EFORMAT, "%s: tokenizer.ggml.tokens: %llu tokens", fname, (unsigned long long)n);
    if ((rc = str_array(g, "tokenizer.ggml.merges", &nm, NULL, err))) return rc;
    int32_t bos, eos, unk, pad;
    if ((rc = token_id(g, "tokenizer.ggml.bos_token_id", (int32_t)n, &bos, err)) ||
        (rc = token_id(g, "tokenizer.ggml.eos_token_id", (int32_t)n, &eos, err)) ||
        (rc = token_id(g, "tokenizer.ggml.unknown_token_id", (int32_t)n, &unk, err)) ||
        (rc = token_id(g, "tokenizer.ggml.padding_token_id", (int32_t)n, &pad, err)))
        return rc;
    (void)unk; /* llama.cpp's BPE never emits unk; pad is the caller's business */
    (void)pad;
    int add_bos, add_eos;
    if ((rc = get_flag(g, "tokenizer.ggml.add_bos_token", pd->add_bos, &add_bos, err)) ||
        (rc = get_flag(g, "tokenizer.ggml.add_eos_token", 0, &add_eos, err)))
        return rc;
    if (add_bos && bos < 0)
        return mk_fail(err, MK_EFORMAT, "%s: tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set", fname);
    if (add_eos && eos < 0)
        return mk_fail(err, MK_EFORMAT, "%s: tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set", fname);

    mk_tok *t = tok_alloc(fname);
    if (!t) return mk_fail(err, MK_ENOMEM, "tokenizer: out of memory");
    t->byte_level = 1;
    t->ignore_merges = pd->ignore_merges;
    rc = load_vocab(t, g, n, err);
    if (!rc) rc = load_merges(t, g, nm, err);
    if (!rc) rc = load_token_types(t, g, n, err);
    if (!rc) rc = add_stages(t, pd, pre, err);
    if (!rc && add_bos && tok_ids_push(&t->pre_ids, bos)) rc = mk_fail(err, MK_ENOMEM, "out of memory");
    if (!rc && add_eos && tok_ids_push(&t->post_ids, eos)) rc = mk_fail(err, MK_ENOMEM, "out of memory");
    if (!rc) {
        /* the ByteLevel decoder: byte-level characters back to bytes */
        if (!(t->dec = calloc(1, sizeof *t->dec))) rc = mk_fail(err, MK_ENOMEM, "out of memory");
        else {
            t->dec[0].kind = DEC_BYTELEVEL;
            t->n_dec = 1;
            t->has_decoder = 1;
        }
    }
    if (!rc) rc = tok_finish_tables(t, err);
    if (!rc) { /* llama.cpp's treatment of bytes without a token (see ST_BYTE_BARRIER) */
        int missing = 0;
        for (int b = 0; b < 256; b++) missing += t->byte_id[b] < 0;
        if (missing) t->stage[t->n_stage++] = (tok_stage){ST_BYTE_BARRIER, {0}, 0, 0};
    }
    if (rc) {
        mk_tok_free(t);
        return rc;
    }
    t->bos_id = bos;
    t->eos_id = eos;
    *out = t;
    return 0;
}
