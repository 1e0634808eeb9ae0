/* tokenizer.c — loading a Hugging Face tokenizer.json into an mk_tok, the encode pipeline and the
 * small public lookups (see tokenizer.h for the supported features).
 *
 * Loading reads the JSON with jansson, then builds everything encode needs into flat structures:
 * the vocab hash map, the merge map, the flattened normalizer / pre-tokenizer / decoder chains
 * with their regexes compiled (PCRE2 JIT), the two added-token tries (raw and normalized text)
 * and the id -> token table. Every type or option the file uses that we cannot reproduce exactly
 * fails the load with a message naming it; nothing is silently approximated.
 *
 * Encoding is HF's pipeline without its per-character alignment bookkeeping (offsets are not part
 * of our API): pre-tokenizer stages are applied recursively, piece by piece, on views into the
 * text, so a Split allocates nothing; only ByteLevel's prefix space copies a piece. The byte-level
 * character mapping is folded into the BPE model (units are bytes; their ids are precomputed).
 */
#include "text/tok_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
 * U+0100.. in byte order. */
const uint16_t tok_byte_to_cp[256] = {
    0x100, 0x101, 0x102, 0x103, 0x104, 0x105, 0x106, 0x107, 0x108, 0x109, 0x10A, 0x10B, 0x10C, 0x10D, 0x10E, 0x10F,
    0x110, 0x111, 0x112, 0x113, 0x114, 0x115, 0x116, 0x117, 0x118, 0x119, 0x11A, 0x11B, 0x11C, 0x11D, 0x11E, 0x11F,
    0x120, 0x021, 0x022, 0x023, 0x024, 0x025, 0x026, 0x027, 0x028, 0x029, 0x02A, 0x02B, 0x02C, 0x02D, 0x02E, 0x02F,
    0x030, 0x031, 0x032, 0x033, 0x034, 0x035, 0x036, 0x037, 0x038, 0x039, 0x03A, 0x03B, 0x03C, 0x03D, 0x03E, 0x03F,
    0x040, 0x041, 0x042, 0x043, 0x044, 0x045, 0x046, 0x047, 0x048, 0x049, 0x04A, 0x04B, 0x04C, 0x04D, 0x04E, 0x04F,
    0x050, 0x051, 0x052, 0x053, 0x054, 0x055, 0x056, 0x057, 0x058, 0x059, 0x05A, 0x05B, 0x05C, 0x05D, 0x05E, 0x05F,
    0x060, 0x061, 0x062, 0x063, 0x064, 0x065, 0x066, 0x067, 0x068, 0x069, 0x06A, 0x06B, 0x06C, 0x06D, 0x06E, 0x06F,
    0x070, 0x071, 0x072, 0x073, 0x074, 0x075, 0x076, 0x077, 0x078, 0x079, 0x07A, 0x07B, 0x07C, 0x07D, 0x07E, 0x121,
    0x122, 0x123, 0x124, 0x125, 0x126, 0x127, 0x128, 0x129, 0x12A, 0x12B, 0x12C, 0x12D, 0x12E, 0x12F, 0x130, 0x131,
    0x132, 0x133, 0x134, 0x135, 0x136, 0x137, 0x138, 0x139, 0x13A, 0x13B, 0x13C, 0x13D, 0x13E, 0x13F, 0x140, 0x141,
    0x142, 0x0A1, 0x0A2, 0x0A3, 0x0A4, 0x0A5, 0x0A6, 0x0A7, 0x0A8, 0x0A9, 0x0AA, 0x0AB, 0x0AC, 0x143, 0x0AE, 0x0AF,
    0x0B0, 0x0B1, 0x0B2, 0x0B3, 0x0B4, 0x0B5, 0x0B6, 0x0B7, 0x0B8, 0x0B9, 0x0BA, 0x0BB, 0x0BC, 0x0BD, 0x0BE, 0x0BF,
    0x0C0, 0x0C1, 0x0C2, 0x0C3, 0x0C4, 0x0C5, 0x0C6, 0x0C7, 0x0C8, 0x0C9, 0x0CA, 0x0CB, 0x0CC, 0x0CD, 0x0CE, 0x0CF,
    0x0D0, 0x0D1, 0x0D2, 0x0D3, 0x0D4, 0x0D5, 0x0D6, 0x0D7, 0x0D8, 0x0D9, 0x0DA, 0x0DB, 0x0DC, 0x0DD, 0x0DE, 0x0DF,
    0x0E0, 0x0E1, 0x0E2, 0x0E3, 0x0E4, 0x0E5, 0x0E6, 0x0E7, 0x0E8, 0x0E9, 0x0EA, 0x0EB, 0x0EC, 0x0ED, 0x0EE, 0x0EF,
    0x0F0, 0x0F1, 0x0F2, 0x0F3, 0x0F4, 0x0F5, 0x0F6, 0x0F7, 0x0F8, 0x0F9, 0x0FA, 0x0FB, 0x0FC, 0x0FD, 0x0FE, 0x0FF,
};

int tok_cp_to_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp < 0x100 || cp > 0x143) return -1;
    /* the n-th byte outside the printable ranges: 0x00-0x20, then 0x7F-0xA0, then 0xAD */
    uint32_t n = cp - 0x100;
    return (int)(n <= 0x20 ? n : n <= 0x42 ? 0x7F + (n - 0x21) : 0xAD);
}

/* The regex of HF's ByteLevel pre-tokenizer (GPT-2's). */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- JSON helpers ------------------------------------------------------------------------------- */

/* Load context: every error message starts with the file's path. */
typedef struct {
    const char *path;
    mk_err *err;
} ld_ctx;


/* The "type" of a component object, or NULL. */
static const char *jtype(json_t *o) {
    json_t *t = json_object_get(o, "type");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

/* A boolean field; absent or null gives HF's default for that field. */
static int jbool(json_t *o, const char *k, int dflt) {
    json_t *v = json_object_get(o, k);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* A string field (copied, NUL-terminated, length in *n); NULL with *n = 0 when absent/null. */
static int jstrdup(ld_ctx *c, json_t *o, const char *k, const char *what, char **out, size_t *n) {
    json_t *v = json_object_get(o, k);
    *out = NULL;
    if (n) *n = 0;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v))
        return mk_fail(c->err, MK_EFORMAT, "%s: %s.%s: expected a string", c->path, what, k);
    size_t l = json_string_length(v);
    *out = malloc(l + 1);
    if (!*out) return mk_fail(c->err, MK_ENOMEM, "%s: out of memory", c->path);
    memcpy(*out, json_string_value(v), l);
    (*out)[l] = 0;
    if (n) *n = l;
    return 0;
}

/* A {"String": s} or {"Regex": r} pattern. HF escapes a String pattern and compiles it as a regex;
 * PCRE2_LITERAL does the same without the escaping. */
static int jpattern(ld_ctx *c, json_t *o, const char *what, tok_re *re) {
    json_t *p = json_object_get(o, "pattern"), *v;
    char where[160];
    snprintf(where, sizeof where, "%s: %s.pattern", c->path, what);
    if (json_is_object(p) && json_is_string(v = json_object_get(p, "String")))
        return tok_re_compile(re, json_string_value(v), json_string_length(v), 1, where, c->err);
    if (json_is_object(p) && json_is_string(v = json_object_get(p, "Regex")))
        return tok_re_compile(re, json_string_value(v), json_string_length(v), 0, where, c->err);
    return mk_fail(c->err, MK_EFORMAT, "%s: expected {\"String\": ...} or {\"Regex\": ...}", where);
}

/* ---- normalizer --------------------------------------------------------------------------------- */

/* Appends one normalizer to the flattened chain (takes ownership of nm, freeing it on failure). */
static int add_norm(mk_tok *t, ld_ctx *c, tok_norm nm) {
    tok_norm *p = realloc(t->norm, (size_t)(t->n_norm + 1) * sizeof *p);
    if (!p) {
        tok_norm_free(&nm);
        return mk_fail(c->err, MK_ENOMEM, "%s: out of memory", c->path);
    }
    t->norm = p;
    t->norm[t->n_norm++] = nm;
    return 0;
}

/* Parses a normalizer (recursively for Sequence) into t->norm. A nested Sequence flattens into
 * its parent: applying [A, [B, C]] is applying A, B, C in turn. */
static int load_normalizer(mk_tok *t, ld_ctx *c, json_t *o, int depth) {
    if (!o || json_is_null(o)) return 0;
    const char *ty = jtype(o);
    if (!ty) return mk_fail(c->err, MK_EFORMAT, "%s: normalizer: missing \"type\"", c->path);
    if (depth > 8) return mk_fail(c->err, MK_ENOTSUP, "%s: normalizer: Sequence nested too deeply", c->path);
    tok_norm nm = {0};
    int rc;
    if (!strcmp(ty, "Sequence")) {
        json_t *a = json_object_get(o, "normalizers");
        if (!json_is_array(a)) return mk_fail(c->err, MK_EFORMAT, "%s: normalizer Sequence: expected a \"normalizers\" list", c->path);
        for (size_t i = 0; i < json_array_size(a); i++)
            if ((rc = load_normalizer(t, c, json_array_get(a, i), depth + 1))) return rc;
        return 0;
    }
    if (!strcmp(ty, "NFC")) nm.kind = NORM_NFC;
    else if (!strcmp(ty, "NFD")) nm.kind = NORM_NFD;
    else if (!strcmp(ty, "NFKC")) nm.kind = NORM_NFKC;
    else if (!strcmp(ty, "NFKD")) nm.kind = NORM_NFKD;
    else if (!strcmp(ty, "Lowercase")) nm.kind = NORM_LOWER;
    else if (!strcmp(ty, "Replace")) {
        nm.kind = NORM_REPLACE;
        if ((rc = jpattern(c, o, "normalizer Replace", &nm.re))) return rc;
        if ((rc = jstrdup(c, o, "content", "normalizer Replace", &nm.content, &nm.content_len))) {
            tok_norm_free(&nm);
            return rc;
        }
    } else if (!strcmp(ty, "Prepend")) {
        nm.kind = NORM_PREPEND;
        if ((rc = jstrdup(c, o, "prepend", "normalizer Prepend", &nm.content, &nm.content_len))) return rc;
    } else if (!strcmp(ty, "Strip")) {
        nm.kind = NORM_STRIP;
        nm.left = jbool(o, "strip_left", 0);
        nm.right = jbool(o, "strip_right", 0);
    } else {
        return mk_fail(c->err, MK_ENOTSUP, "%s: normalizer type \"%s\" is not supported", c->path, ty);
    }
    return add_norm(t, c, nm);
}

/* ---- pre-tokenizer ------------------------------------------------------------------------------ */

/* Appends one pre-tokenizer stage. ByteLevel must be last because the byte -> character mapping is
 * deferred to the BPE model: a stage after it would see raw bytes instead of mapped characters. */
static int add_stage(mk_tok *t, ld_ctx *c, tok_stage st, const char *name) {
    if (t->byte_level) {
        tok_re_free(&st.re);
        return mk_fail(c->err, MK_ENOTSUP, "%s: pre_tokenizer %s after ByteLevel is not supported (ByteLevel must come last)", c->path, name);
    }
    if (t->n_stage == TOK_MAX_STAGES) {
        tok_re_free(&st.re);
        return mk_fail(c->err, MK_ENOTSUP, "%s: pre_tokenizer: more than %d steps", c->path, TOK_MAX_STAGES);
    }
    t->stage[t->n_stage++] = st;
    return 0;
}

/* Parses a pre-tokenizer (recursively for Sequence, which flattens like the normalizers') into
 * t->stage. Each HF pre-tokenizer becomes one or two stages (ByteLevel: prefix space, regex). */
static int load_pretok(mk_tok *t, ld_ctx *c, json_t *o, int depth) {
    if (!o || json_is_null(o)) return 0;
    const char *ty = jtype(o);
    if (!ty) return mk_fail(c->err, MK_EFORMAT, "%s: pre_tokenizer: missing \"type\"", c->path);
    if (depth > 8) return mk_fail(c->err, MK_ENOTSUP, "%s: pre_tokenizer: Sequence nested too deeply", c->path);
    int rc;
    if (!strcmp(ty, "Sequence")) {
        json_t *a = json_object_get(o, "pretokenizers");
        if (!json_is_array(a)) return mk_fail(c->err, MK_EFORMAT, "%s: pre_tokenizer Sequence: expected a \"pretokenizers\" list", c->path);
        for (size_t i = 0; i < json_array_size(a); i++)
            if ((rc = load_pretok(t, c, json_array_get(a, i), depth + 1))) return rc;
        return 0;
    }
    tok_stage st = {0};
    if (!strcmp(ty, "Split")) {
        st.kind = ST_SPLIT;
        json_t *b = json_object_get(o, "behavior");
        const char *bs = json_is_string(b) ? json_string_value(b) : "";
        if (!strcmp(bs, "Removed")) st.behavior = SPLIT_REMOVED;
        else if (!strcmp(bs, "Isolated")) st.behavior = SPLIT_ISOLATED;
        else if (!strcmp(bs, "MergedWithPrevious")) st.behavior = SPLIT_MERGED_PREV;
        else if (!strcmp(bs, "MergedWithNext")) st.behavior = SPLIT_MERGED_NEXT;
        else if (!strcmp(bs, "Contiguous")) st.behavior = SPLIT_CONTIGUOUS;
        else return mk_fail(c->err, MK_ENOTSUP, "%s: pre_tokenizer Split: behavior \"%s\" is not supported", c->path, bs);
        st.invert = jbool(o, "invert", 0);
        if ((rc = jpattern(c, o, "pre_tokenizer Split", &st.re))) return rc;
        return add_stage(t, c, st, "Split");
    }
    if (!strcmp(ty, "Digits")) {
        st.kind = ST_SPLIT;
        st.behavior = jbool(o, "individual_digits", 0) ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS;
        /* HF splits on char::is_numeric, one character per match: \p{N} */
        char where[160];
        snprintf(where, sizeof where, "%s: pre_tokenizer Digits", c->path);
        if ((rc = tok_re_compile(&st.re, "\\p{N}", 5, 0, where, c->err))) return rc;
        return add_stage(t, c, st, "Digits");
    }
    if (!strcmp(ty, "ByteLevel")) {
        /* add_prefix_space applies to every piece that reaches ByteLevel, then the GPT-2 regex
         * splits it; the byte -> character mapping itself is done by the BPE model. */
        if (jbool(o, "add_prefix_space", 1)) {
            st.kind = ST_PREFIX_SPACE;
            if ((rc = add_stage(t, c, st, "ByteLevel"))) return rc;
        }
        if (jbool(o, "use_regex", 1)) {
            tok_stage sp = {ST_SPLIT, {0}, SPLIT_ISOLATED, 0};
            char where[160];
            snprintf(where, sizeof where, "%s: pre_tokenizer ByteLevel", c->path);
            if ((rc = tok_re_compile(&sp.re, GPT2_PATTERN, sizeof GPT2_PATTERN - 1, 0, where, c->err))) return rc;
            if ((rc = add_stage(t, c, sp, "ByteLevel"))) return rc;
        }
        t->byte_level = 1;
        return 0;
    }
    return mk_fail(c->err, MK_ENOTSUP, "%s: pre_tokenizer type \"%s\" is not supported", c->path, ty);
}

/* ---- post-processor ----------------------------------------------------------------------------- */

/* Ids of one special token of a TemplateProcessing (its special_tokens entry). */
static int template_ids(mk_tok *t, ld_ctx *c, json_t *specials, const char *name, tok_ids *dst) {
    json_t *e = json_object_get(specials, name), *ids = e ? json_object_get(e, "ids") : NULL;
    if (!json_is_array(ids))
        return mk_fail(c->err, MK_EFORMAT, "%s: post_processor TemplateProcessing: special token \"%s\" has no ids", c->path, name);
    for (size_t i = 0; i < json_array_size(ids); i++) {
        json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return mk_fail(c->err, MK_EFORMAT, "%s: post_processor TemplateProcessing: bad id for \"%s\"", c->path, name);
        if (tok_ids_push(dst, (int32_t)json_integer_value(v))) return mk_fail(c->err, MK_ENOMEM, "out of memory");
    }
    (void)t;
    return 0;
}

/* Parses one post-processor into (pre, post) ids put around the encoded text. */
static int load_post(mk_tok *t, ld_ctx *c, json_t *o, tok_ids *pre, tok_ids *post, int depth) {
    if (!o || json_is_null(o)) return 0;
    const char *ty = jtype(o);
    if (!ty) return mk_fail(c->err, MK_EFORMAT, "%s: post_processor: missing \"type\"", c->path);
    if (depth > 8) return mk_fail(c->err, MK_ENOTSUP, "%s: post_processor: Sequence nested too deeply", c->path);
    int rc = 0;
    if (!strcmp(ty, "ByteLevel")) return 0; /* offsets only */
    if (!strcmp(ty, "Sequence")) {
        json_t *a = json_object_get(o, "processors");
        if (!json_is_array(a)) return mk_fail(c->err, MK_EFORMAT, "%s: post_processor Sequence: expected a \"processors\" list", c->path);
        for (size_t i = 0; i < json_array_size(a) && !rc; i++) {
            /* each processor wraps the result of the previous ones */
            tok_ids p = {0}, q = {0};
            rc = load_post(t, c, json_array_get(a, i), &p, &q, depth + 1);
            if (!rc && (tok_ids_put(&p, pre->p, pre->n) || tok_ids_put(post, q.p, q.n)))
                rc = mk_fail(c->err, MK_ENOMEM, "out of memory");
            if (!rc) {
                free(pre->p);
                *pre = p;
                p.p = NULL;
            }
            free(p.p);
            free(q.p);
        }
        return rc;
    }
    if (!strcmp(ty, "TemplateProcessing")) {
        json_t *single = json_object_get(o, "single"), *specials = json_object_get(o, "special_tokens");
        if (!json_is_array(single)) return mk_fail(c->err, MK_EFORMAT, "%s: post_processor TemplateProcessing: expected a \"single\" list", c->path);
        int seen_a = 0;
        for (size_t i = 0; i < json_array_size(single); i++) {
            json_t *it = json_array_get(single, i), *v;
            if ((v = json_object_get(it, "SpecialToken"))) {
                json_t *id = json_object_get(v, "id");
                if (!json_is_string(id)) return mk_fail(c->err, MK_EFORMAT, "%s: post_processor TemplateProcessing: SpecialToken without id", c->path);
                if ((rc = template_ids(t, c, specials, json_string_value(id), seen_a ? post : pre))) return rc;
            } else if ((v = json_object_get(it, "Sequence"))) {
                json_t *id = json_object_get(v, "id");
                if (!json_is_string(id) || strcmp(json_string_value(id), "A") || seen_a)
                    return mk_fail(c->err, MK_ENOTSUP, "%s: post_processor TemplateProcessing: the single template must hold sequence A once", c->path);
                seen_a = 1;
            } else {
                return mk_fail(c->err, MK_EFORMAT, "%s: post_processor TemplateProcessing: unknown template piece", c->path);
            }
        }
        return 0;
    }
    if (!strcmp(ty, "RobertaProcessing") || !strcmp(ty, "BertProcessing")) {
        json_t *cls = json_object_get(o, "cls"), *sep = json_object_get(o, "sep");
        json_t *ci = json_array_get(cls, 1), *si = json_array_get(sep, 1);
        if (!json_is_integer(ci) || !json_is_integer(si))
            return mk_fail(c->err, MK_EFORMAT, "%s: post_processor %s: expected cls and sep as [token, id]", c->path, ty);
        if (tok_ids_push(pre, (int32_t)json_integer_value(ci)) || tok_ids_push(post, (int32_t)json_integer_value(si)))
            return mk_fail(c->err, MK_ENOMEM, "out of memory");
        return 0;
    }
    return mk_fail(c->err, MK_ENOTSUP, "%s: post_processor type \"%s\" is not supported", c->path, ty);
}

/* ---- decoder ------------------------------------------------------------------------------------- */

/* Parses a decoder (recursively for Sequence) into t->dec. has_decoder records that one exists even
 * if the chain is empty: without any decoder HF joins tokens with spaces, with one it does not. */
static int load_decoder(mk_tok *t, ld_ctx *c, json_t *o, int depth) {
    if (!o || json_is_null(o)) return 0;
    const char *ty = jtype(o);
    if (!ty) return mk_fail(c->err, MK_EFORMAT, "%s: decoder: missing \"type\"", c->path);
    if (depth > 8) return mk_fail(c->err, MK_ENOTSUP, "%s: decoder: Sequence nested too deeply", c->path);
    t->has_decoder = 1;
    int rc;
    if (!strcmp(ty, "Sequence")) {
        json_t *a = json_object_get(o, "decoders");
        if (!json_is_array(a)) return mk_fail(c->err, MK_EFORMAT, "%s: decoder Sequence: expected a \"decoders\" list", c->path);
        for (size_t i = 0; i < json_array_size(a); i++)
            if ((rc = load_decoder(t, c, json_array_get(a, i), depth + 1))) return rc;
        return 0;
    }
    tok_dec d = {0};
    if (!strcmp(ty, "ByteLevel")) d.kind = DEC_BYTELEVEL;
    else if (!strcmp(ty, "ByteFallback")) d.kind = DEC_BYTEFALLBACK;
    else if (!strcmp(ty, "Fuse")) d.kind = DEC_FUSE;
    else if (!strcmp(ty, "Replace")) {
        d.kind = DEC_REPLACE;
        if ((rc = jpattern(c, o, "decoder Replace", &d.re))) return rc;
        if ((rc = jstrdup(c, o, "content", "decoder Replace", &d.content, &d.content_len))) {
            tok_dec_free(&d);
            return rc;
        }
    } else if (!strcmp(ty, "Strip")) {
        d.kind = DEC_STRIP;
        if ((rc = jstrdup(c, o, "content", "decoder Strip", &d.content, &d.content_len))) return rc;
        json_t *a = json_object_get(o, "start"), *b = json_object_get(o, "stop");
        d.start = json_is_integer(a) ? (int)json_integer_value(a) : 0;
        d.stop = json_is_integer(b) ? (int)json_integer_value(b) : 0;
        uint32_t cp;
        if (!d.content || d.content_len == 0 || (size_t)tok_utf8_next(d.content, &cp) != d.content_len || d.start < 0 || d.stop < 0) {
            tok_dec_free(&d);
            return mk_fail(c->err, MK_EFORMAT, "%s: decoder Strip: expected one content character and start/stop >= 0", c->path);
        }
    } else {
        return mk_fail(c->err, MK_ENOTSUP, "%s: decoder type \"%s\" is not supported", c->path, ty);
    }
    tok_dec *p = realloc(t->dec, (size_t)(t->n_dec + 1) * sizeof *p);
    if (!p) {
        tok_dec_free(&d);
        return mk_fail(c->err, MK_ENOMEM, "%s: out of memory", c->path);
    }
    t->dec = p;
    t->dec[t->n_dec++] = d;
    return 0;
}

/* ---- model ---------------------------------------------------------------------------------------- */

/* The BPE model: vocab, options and merges. Merge i gets rank i; its result is the vocab id of the
 * concatenated token, which must exist (HF refuses such a file too). A model without "type" is
 * taken as BPE when it has merges, as HF's untagged deserializer does. */
static int load_model(mk_tok *t, ld_ctx *c, json_t *m) {
    if (!json_is_object(m)) return mk_fail(c->err, MK_EFORMAT, "%s: missing \"model\"", c->path);
    const char *ty = jtype(m);
    if (ty && strcmp(ty, "BPE")) return mk_fail(c->err, MK_ENOTSUP, "%s: model type \"%s\" is not supported (only BPE)", c->path, ty);
    json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges");
    if (!json_is_object(vocab)) return mk_fail(c->err, MK_EFORMAT, "%s: model.vocab: expected an object", c->path);
    if (!ty && !json_is_array(merges)) return mk_fail(c->err, MK_ENOTSUP, "%s: model without \"type\" nor merges is not supported (only BPE)", c->path);
    if (!json_is_array(merges)) return mk_fail(c->err, MK_EFORMAT, "%s: model.merges: expected a list", c->path);
    json_t *dropout = json_object_get(m, "dropout");
    if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0.0)
        return mk_fail(c->err, MK_ENOTSUP, "%s: model.dropout %g is not supported (BPE dropout is random)", c->path, json_number_value(dropout));

    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= INT32_MAX)
            return mk_fail(c->err, MK_EFORMAT, "%s: model.vocab[\"%s\"]: expected an id >= 0", c->path, key);
        int32_t id = (int32_t)json_integer_value(val);
        if (tok_smap_put(&t->vocab, key, strlen(key), id)) return mk_fail(c->err, MK_ENOMEM, "%s: out of memory", c->path);
        if (id + 1 > t->vocab_size) t->vocab_size = id + 1;
    }
    int rc;
    size_t plen;
    if ((rc = jstrdup(c, m, "continuing_subword_prefix", "model", &t->cont_prefix, &t->cont_prefix_len))) return rc;
    if ((rc = jstrdup(c, m, "end_of_word_suffix", "model", &t->eow_suffix, &t->eow_suffix_len))) return rc;
    plen = t->cont_prefix_len;
    t->fuse_unk = jbool(m, "fuse_unk", 0);
    t->byte_fallback = jbool(m, "byte_fallback", 0);
    t->ignore_merges = jbool(m, "ignore_merges", 0);
    char *unk = NULL;
    size_t unk_len;
    t->unk_id = -1;
    if ((rc = jstrdup(c, m, "unk_token", "model", &unk, &unk_len))) return rc;
    if (unk) {
        t->unk_id = tok_smap_get(&t->vocab, unk, unk_len);
        if (t->unk_id < 0) rc = mk_fail(c->err, MK_EFORMAT, "%s: model.unk_token \"%s\" is not in the vocab", c->path, unk);
        free(unk);
        if (rc) return rc;
    }

    size_t nm = json_array_size(merges);
    if (!(t->merges = tok_mmap_create(nm))) return mk_fail(c->err, MK_ENOMEM, "%s: out of memory", c->path);
    tok_buf nb = {0};
    for (size_t i = 0; i < nm && !rc; i++) {
        json_t *e = json_array_get(merges, i);
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(e)) { /* "a b", split at the first space */
            a = json_string_value(e);
            const char *sp = memchr(a, ' ', json_string_length(e));
            if (!sp) {
                rc = mk_fail(c->err, MK_EFORMAT, "%s: model.merges[%zu] \"%s\": expected two tokens separated by a space", c->path, i, a);
                break;
            }
            al = (size_t)(sp - a);
            b = sp + 1;
            bl = json_string_length(e) - al - 1;
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0));
            al = json_string_length(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            bl = json_string_length(json_array_get(e, 1));
        } else {
            rc = mk_fail(c->err, MK_EFORMAT, "%s: model.merges[%zu]: expected \"a b\" or [a, b]", c->path, i);
            break;
        }
        int32_t ia = tok_smap_get(&t->vocab, a, al), ib = tok_smap_get(&t->vocab, b, bl);
        /* the merged token is a + b without b's continuing_subword_prefix, as HF builds it */
        size_t skip = plen < bl ? plen : bl;
        nb.n = 0;
        if (tok_buf_put(&nb, a, al) || tok_buf_put(&nb, b + skip, bl - skip)) {
            rc = mk_fail(c->err, MK_ENOMEM, "%s: out of memory", c->path);
            break;
        }
        int32_t in = tok_smap_get(&t->vocab, nb.p, nb.n);
        if (ia < 0 || ib < 0 || in < 0) {
            rc = mk_fail(c->err, MK_EFORMAT, "%s: model.merges[%zu]: token \"%.*s\" is not in the vocab", c->path, i,
                         (int)(ia < 0 ? al : ib < 0 ? bl : nb.n), ia < 0 ? a : ib < 0 ? b : nb.p);
            break;
        }
        tok_mmap_put(t->merges, ia, ib, (uint32_t)i, in);
    }
    free(nb.p);
    return rc;
}

/* ---- added tokens --------------------------------------------------------------------------------- */

/* added_tokens: content, id and flags. `normalized` defaults to !special as in HF's AddedToken.
 * The tries are built later (finish_load), once the normalizer is known. */
static int load_added(mk_tok *t, ld_ctx *c, json_t *a) {
    if (!a || json_is_null(a)) return 0;
    if (!json_is_array(a)) return mk_fail(c->err, MK_EFORMAT, "%s: added_tokens: expected a list", c->path);
    size_t n = json_array_size(a);
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added) return mk_fail(c->err, MK_ENOMEM, "%s: out of memory", c->path);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(a, i), *id = json_object_get(e, "id");
        tok_added *ad = &t->added[t->n_added];
        int rc = jstrdup(c, e, "content", "added_tokens[]", &ad->content, &ad->len);
        if (rc) return rc;
        if (!ad->content || !json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT32_MAX) {
            free(ad->content);
            return mk_fail(c->err, MK_EFORMAT, "%s: added_tokens[%zu]: expected a content string and an id >= 0", c->path, i);
        }
        t->n_added++;
        ad->id = (int32_t)json_integer_value(id);
        ad->special = (uint8_t)jbool(e, "special", 0);
        ad->lstrip = (uint8_t)jbool(e, "lstrip", 0);
        ad->rstrip = (uint8_t)jbool(e, "rstrip", 0);
        ad->single_word = (uint8_t)jbool(e, "single_word", 0);
        ad->normalized = (uint8_t)jbool(e, "normalized", !ad->special);
        if (tok_smap_put(&t->added_map, ad->content, ad->len, ad->id)) return mk_fail(c->err, MK_ENOMEM, "%s: out of memory", c->path);
        if (ad->id + 1 > t->vocab_size) t->vocab_size = ad->id + 1;
    }
    return 0;
}

/* ---- scratch pool ---------------------------------------------------------------------------------- */

/* Scratch is pooled rather than per-thread so the tokenizer owns no thread-local state: a caller
 * pops one (or makes one), uses it for one call, and pushes it back. The pool grows to the peak
 * number of concurrent callers. Each scratch carries its own PCRE2 match data and JIT stack (they
 * must not be shared between threads) and its own word cache. */
tok_scratch *tok_scratch_get(const mk_tok *ct) {
    mk_tok *t = (mk_tok *)ct; /* only the pool is mutable, under its lock */
    pthread_mutex_lock(&t->lock);
    tok_scratch *sc = t->free_scratch;
    if (sc) t->free_scratch = sc->next;
    pthread_mutex_unlock(&t->lock);
    if (sc) return sc;
    sc = calloc(1, sizeof *sc);
    if (!sc) return NULL;
    sc->md = pcre2_match_data_create(16, NULL);
    sc->mctx = pcre2_match_context_create(NULL);
    /* JIT stack: 32 KiB up front, up to 8 MiB for pathological inputs (reserved lazily) */
    sc->jstack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!sc->md || !sc->mctx || !sc->jstack) {
        if (sc->md) pcre2_match_data_free(sc->md);
        if (sc->mctx) pcre2_match_context_free(sc->mctx);
        if (sc->jstack) pcre2_jit_stack_free(sc->jstack);
        free(sc);
        return NULL;
    }
    pcre2_jit_stack_assign(sc->mctx, NULL, sc->jstack);
    return sc;
}

void tok_scratch_put(const mk_tok *ct, tok_scratch *sc) {
    mk_tok *t = (mk_tok *)ct;
    pthread_mutex_lock(&t->lock);
    sc->next = t->free_scratch;
    t->free_scratch = sc;
    pthread_mutex_unlock(&t->lock);
}

static void scratch_free(tok_scratch *sc) {
    pcre2_match_data_free(sc->md);
    pcre2_match_context_free(sc->mctx);
    pcre2_jit_stack_free(sc->jstack);
    for (int i = 0; i < 3; i++) free(sc->norm[i].p);
    free(sc->raw_pieces.p);
    free(sc->norm_pieces.p);
    for (int i = 0; i < TOK_MAX_STAGES; i++) {
        free(sc->stage_spans[i].p);
        free(sc->stage_buf[i].p);
    }
    free(sc->matches.p);
    free(sc->word.p);
    free(sc->sym);
    free(sc->heap);
    tok_cache_free(sc->cache);
    free(sc);
}

/* ---- load / free ------------------------------------------------------------------------------------ */

void mk_tok_free(mk_tok *t) {
    if (!t) return;
    free(t->path);
    tok_smap_free(&t->vocab);
    tok_mmap_free(t->merges);
    free(t->cont_prefix);
    free(t->eow_suffix);
    for (int i = 0; i < t->n_norm; i++) tok_norm_free(&t->norm[i]);
    free(t->norm);
    for (int i = 0; i < t->n_stage; i++) tok_re_free(&t->stage[i].re);
    for (int i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].ncontent);
    }
    free(t->added);
    tok_smap_free(&t->added_map);
    tok_trie_free(&t->trie_raw);
    tok_trie_free(&t->trie_norm);
    free(t->pre_ids.p);
    free(t->post_ids.p);
    for (int i = 0; i < t->n_dec; i++) tok_dec_free(&t->dec[i]);
    free(t->dec);
    free(t->id_tok);
    free(t->id_len);
    free(t->id_added);
    while (t->free_scratch) {
        tok_scratch *n = t->free_scratch->next;
        scratch_free(t->free_scratch);
        t->free_scratch = n;
    }
    pthread_mutex_destroy(&t->lock);
    free(t);
}

/* bos_token of tokenizer_config.json beside the tokenizer, if any: a string or {"content": s}. */
static int32_t config_bos(const mk_tok *t) {
    const char *slash = strrchr(t->path, '/');
    size_t dl = slash ? (size_t)(slash - t->path) + 1 : 0;
    char *p = malloc(dl + 32);
    if (!p) return -1;
    memcpy(p, t->path, dl);
    strcpy(p + dl, "tokenizer_config.json");
    json_error_t je;
    json_t *root = json_load_file(p, JSON_ALLOW_NUL, &je);
    free(p);
    if (!root) return -1;
    json_t *b = json_object_get(root, "bos_token");
    if (json_is_object(b)) b = json_object_get(b, "content");
    int32_t id = json_is_string(b) ? mk_tok_token_to_id(t, json_string_value(b)) : -1;
    json_decref(root);
    return id;
}

/* Everything derived from the parsed parts: byte tables, added-token tries, the id -> token table
 * with its flags (the BOS id is left to the caller). Shared with tok_gguf.c, which fills the same
 * parts from GGUF metadata. */
int tok_finish_tables(mk_tok *t, mk_err *err) {
    ld_ctx cc = {t->path, err}, *c = &cc;
    /* byte-level unit ids and byte_fallback ids */
    for (int b = 0; b < 256; b++) {
        tok_buf u = {0};
        char fb[8];
        if (tok_buf_put_cp(&u, tok_byte_to_cp[b])) return mk_fail(c->err, MK_ENOMEM, "out of memory");
        t->byte_id[b] = tok_smap_get(&t->vocab, u.p, u.n);
        free(u.p);
        snprintf(fb, sizeof fb, "<0x%02X>", b);
        t->bytefb_id[b] = tok_smap_get(&t->vocab, fb, strlen(fb));
    }
    /* added-token tries; normalized tokens are matched in their normalized form */
    tok_scratch *sc = tok_scratch_get(t);
    if (!sc) return mk_fail(c->err, MK_ENOMEM, "out of memory");
    int rc = 0;
    for (int i = 0; i < t->n_added && !rc; i++) {
        tok_added *a = &t->added[i];
        if (!a->normalized) {
            rc = tok_trie_add(&t->trie_raw, a->content, a->len, i);
        } else {
            const char *s;
            size_t n;
            rc = tok_normalize(t, sc, a->content, a->len, &s, &n, c->err);
            if (!rc) rc = tok_trie_add(&t->trie_norm, s, n, i);
            if (!rc && !(a->ncontent = malloc(n + 1))) rc = MK_ENOMEM;
            if (!rc) {
                memcpy(a->ncontent, s, n);
                a->ncontent[n] = 0;
                a->nlen = n;
            }
        }
    }
    tok_scratch_put(t, sc);
    if (rc) return rc == MK_ENOMEM ? mk_fail(c->err, MK_ENOMEM, "out of memory") : rc;
    /* id -> token: model vocab, then added tokens on top (HF looks up added tokens first) */
    size_t vs = (size_t)(t->vocab_size > 0 ? t->vocab_size : 1);
    t->id_tok = calloc(vs, sizeof *t->id_tok);
    t->id_len = calloc(vs, sizeof *t->id_len);
    t->id_added = calloc(vs, 1);
    if (!t->id_tok || !t->id_len || !t->id_added) return mk_fail(c->err, MK_ENOMEM, "out of memory");
    for (size_t i = 0; i < t->vocab.n; i++) {
        const tok_smap_ent *e = &t->vocab.ent[i];
        t->id_tok[e->val] = t->vocab.pool.p + e->off;
        t->id_len[e->val] = e->len;
    }
    tok_smap specials = {0};
    for (int i = 0; i < t->n_added && !rc; i++) {
        const tok_added *a = &t->added[i];
        t->id_tok[a->id] = a->ncontent ? a->ncontent : a->content;
        t->id_len[a->id] = (uint32_t)(a->ncontent ? a->nlen : a->len);
        t->id_added[a->id] |= TOK_ID_ADDED | (a->special ? TOK_ID_SPECIAL : 0);
        if (a->special) rc = tok_smap_put(&specials, a->content, a->len, a->id);
    }
    /* HF skips a token on decode when its text is the content of a special token: so a
     * normalized special token whose text the normalizer changed is not skipped, and a model
     * token spelled like a special token is. */
    for (int i = 0; i < t->vocab_size && !rc && specials.n; i++)
        if (t->id_tok[i] && tok_smap_get(&specials, t->id_tok[i], t->id_len[i]) >= 0) t->id_added[i] |= TOK_ID_SKIP;
    tok_smap_free(&specials);
    if (rc) return mk_fail(c->err, MK_ENOMEM, "out of memory");
    return 0;
}

/* The derived tables, then the BOS id (tokenizer.json: the post-processor's, else the config's). */
static int finish_load(mk_tok *t, ld_ctx *c) {
    int rc = tok_finish_tables(t, c->err);
    if (rc) return rc;
    t->bos_id = t->pre_ids.n ? t->pre_ids.p[0] : config_bos(t);
    return 0;
}

/* A zeroed mk_tok with its lock initialised and a copy of path (with room for "/tokenizer.json");
 * ids that have no source yet are -1. NULL when out of memory. */
mk_tok *tok_alloc(const char *path) {
    mk_tok *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    pthread_mutex_init(&t->lock, NULL);
    t->unk_id = t->bos_id = t->eos_id = -1;
    size_t pl = strlen(path);
    t->path = malloc(pl + 32);
    if (!t->path) {
        mk_tok_free(t);
        return NULL;
    }
    memcpy(t->path, path, pl + 1);
    return t;
}

/* Parsing order matters: the model first (merges and the post-processor refer to vocab ids), the
 * normalizer before finish_load (normalized added tokens are matched in normalized form). */
int mk_tok_load(const char *path, mk_tok **out, mk_err *err) {
    *out = NULL;
    if (!path) return mk_fail(err, MK_EINVAL, "tokenizer: no path given");
    struct stat st;
    if (stat(path, &st) != 0) return mk_fail(err, MK_EIO, "%s: %s", path, strerror(errno));
    mk_tok *t = tok_alloc(path);
    if (!t) return mk_fail(err, MK_ENOMEM, "tokenizer: out of memory");
    size_t pl = strlen(path);
    if (S_ISDIR(st.st_mode)) {
        while (pl > 1 && t->path[pl - 1] == '/') t->path[--pl] = 0;
        strcpy(t->path + pl, "/tokenizer.json");
    }
    ld_ctx c = {t->path, err};
    FILE *f = fopen(t->path, "rb");
    if (!f) {
        int rc = mk_fail(err, MK_EIO, "%s: %s", t->path, strerror(errno));
        mk_tok_free(t);
        return rc;
    }
    json_error_t je;
    json_t *root = json_loadf(f, JSON_ALLOW_NUL, &je);
    fclose(f);
    if (!root) {
        int rc = mk_fail(err, MK_EFORMAT, "%s: invalid JSON at line %d, column %d: %s", t->path, je.line, je.column, je.text);
        mk_tok_free(t);
        return rc;
    }
    int rc = 0;
    json_t *tr = json_object_get(root, "truncation"), *pad = json_object_get(root, "padding");
    if (!json_is_object(root)) rc = mk_fail(err, MK_EFORMAT, "%s: expected a JSON object", t->path);
    if (!rc && tr && !json_is_null(tr))
        mk_log(MK_LOG_WARN, "%s: \"truncation\" is ignored (minke never truncates a prompt silently)", t->path);
    if (!rc && pad && !json_is_null(pad)) mk_log(MK_LOG_INFO, "%s: \"padding\" is ignored", t->path);
    if (!rc) rc = load_model(t, &c, json_object_get(root, "model"));
    if (!rc) rc = load_added(t, &c, json_object_get(root, "added_tokens"));
    if (!rc) rc = load_normalizer(t, &c, json_object_get(root, "normalizer"), 0);
    if (!rc) rc = load_pretok(t, &c, json_object_get(root, "pre_tokenizer"), 0);
    if (!rc) rc = load_post(t, &c, json_object_get(root, "post_processor"), &t->pre_ids, &t->post_ids, 0);
    if (!rc) rc = load_decoder(t, &c, json_object_get(root, "decoder"), 0);
    json_decref(root);
    if (!rc) rc = finish_load(t, &c);
    if (!rc) {
        for (size_t i = 0; i < t->pre_ids.n + t->post_ids.n && !rc; i++) {
            int32_t id = i < t->pre_ids.n ? t->pre_ids.p[i] : t->post_ids.p[i - t->pre_ids.n];
            if (id >= t->vocab_size || !t->id_tok[id])
                rc = mk_fail(err, MK_EFORMAT, "%s: post_processor: id %d is not a token", t->path, id);
        }
    }
    if (rc) {
        mk_tok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* ---- encode ------------------------------------------------------------------------------------------ */

/* Runs pre-tokenizer stage k on s[0..n) and everything after it, down to the BPE model. */
static int run_stage(const mk_tok *t, tok_scratch *sc, int k, const char *s, size_t n, tok_ids *out, mk_err *err) {
    if (n == 0) return 0; /* HF drops empty pieces */
    if (k == t->n_stage) return tok_bpe_word(t, sc, s, n, out, err);
    const tok_stage *st = &t->stage[k];
    if (st->kind == ST_BYTE_BARRIER) {
        size_t a = 0;
        for (size_t i = 0; i < n; i++) {
            if (t->byte_id[(uint8_t)s[i]] >= 0) continue;
            int rc = run_stage(t, sc, k + 1, s + a, i - a, out, err);
            if (rc) return rc;
            a = i + 1;
        }
        return run_stage(t, sc, k + 1, s + a, n - a, out, err);
    }
    if (st->kind == ST_PREFIX_SPACE) {
        if (s[0] == ' ') return run_stage(t, sc, k + 1, s, n, out, err);
        tok_buf *b = &sc->stage_buf[k];
        b->n = 0;
        if (tok_buf_putc(b, ' ') || tok_buf_put(b, s, n)) return MK_ENOMEM;
        return run_stage(t, sc, k + 1, b->p, b->n, out, err);
    }
    tok_spans *v = &sc->stage_spans[k];
    int rc = tok_re_find_matches(&st->re, sc, s, n, v, err);
    if (rc) return rc;
    if (st->invert)
        for (size_t i = 0; i < v->n; i++) v->p[i].tag = !v->p[i].tag;
    size_t m = v->n, w = 0;
    tok_span *p = v->p;
    switch (st->behavior) {
    case SPLIT_ISOLATED: w = m; break;
    case SPLIT_REMOVED:
        for (size_t i = 0; i < m; i++)
            if (!p[i].tag) p[w++] = p[i];
        break;
    case SPLIT_CONTIGUOUS: { /* runs of equal match flags become one piece */
        int prev = 0;
        for (size_t i = 0; i < m; i++) {
            int cur = p[i].tag;
            if (cur == prev && w) p[w - 1].e = p[i].e;
            else p[w++] = p[i];
            prev = cur;
        }
        break;
    }
    case SPLIT_MERGED_PREV: { /* a match joins the piece before it */
        int prev = 0;
        for (size_t i = 0; i < m; i++) {
            int cur = p[i].tag;
            if (cur && !prev && w) p[w - 1].e = p[i].e;
            else p[w++] = p[i];
            prev = cur;
        }
        break;
    }
    case SPLIT_MERGED_NEXT: { /* a match joins the piece after it: the same, walking backwards */
        int prev = 0;
        size_t r = m; /* pieces are written to p[r..m) */
        for (size_t i = m; i-- > 0;) {
            int cur = p[i].tag;
            if (cur && !prev && r < m) p[r].s = p[i].s;
            else p[--r] = p[i];
            prev = cur;
        }
        memmove(p, p + r, (m - r) * sizeof *p);
        w = m - r;
        break;
    }
    }
    for (size_t i = 0; i < w; i++) {
        /* v->p stays valid: deeper stages use their own span lists */
        tok_span sp = v->p[i];
        if ((rc = run_stage(t, sc, k + 1, s + sp.s, sp.e - sp.s, out, err))) return rc;
    }
    return 0;
}

/* HF's encode of one sequence: AddedVocabulary::extract_and_normalize (raw added tokens, normalize
 * each remaining piece, normalized added tokens), pre-tokenize, BPE, then the post-processor. */
static int encode_in(const mk_tok *t, tok_scratch *sc, const char *text, size_t len, int add_special,
                     tok_ids *out, mk_err *err) {
    int rc;
    if (add_special && tok_ids_put(out, t->pre_ids.p, t->pre_ids.n)) return MK_ENOMEM;
    if ((rc = tok_added_split(t, &t->trie_raw, text, len, &sc->raw_pieces))) return rc;
    for (size_t i = 0; i < sc->raw_pieces.n; i++) {
        tok_span rp = sc->raw_pieces.p[i];
        if (rp.tag >= 0) {
            if (tok_ids_push(out, rp.tag)) return MK_ENOMEM;
            continue;
        }
        if (rp.e == rp.s) continue;
        const char *ns;
        size_t nn;
        if ((rc = tok_normalize(t, sc, text + rp.s, rp.e - rp.s, &ns, &nn, err))) return rc;
        if ((rc = tok_added_split(t, &t->trie_norm, ns, nn, &sc->norm_pieces))) return rc;
        for (size_t j = 0; j < sc->norm_pieces.n; j++) {
            tok_span np = sc->norm_pieces.p[j];
            if (np.tag >= 0) rc = tok_ids_push(out, np.tag);
            else rc = run_stage(t, sc, 0, ns + np.s, np.e - np.s, out, err);
            if (rc) return rc;
        }
    }
    if (add_special && tok_ids_put(out, t->post_ids.p, t->post_ids.n)) return MK_ENOMEM;
    return 0;
}

/* Validates UTF-8 once here, so every later stage (PCRE2 with NO_UTF_CHECK, utf8proc, the char
 * walkers) may assume valid input. Spans are 32-bit, hence the length limit. */
int mk_tok_encode(const mk_tok *t, const char *text, size_t len, int add_special, int32_t **ids,
                  size_t *n, mk_err *err) {
    *ids = NULL;
    *n = 0;
    if (!text && len) return mk_fail(err, MK_EINVAL, "tokenizer: NULL text");
    if (len > UINT32_MAX / 2) return mk_fail(err, MK_EINVAL, "tokenizer: text of %zu bytes is too long", len);
    size_t bad = tok_utf8_check(text, len);
    if (bad != len) return mk_fail(err, MK_EINVAL, "tokenizer: input is not valid UTF-8 at byte %zu (0x%02x)", bad, (unsigned char)text[bad]);
    tok_scratch *sc = tok_scratch_get(t);
    if (!sc) return mk_fail(err, MK_ENOMEM, "tokenizer: out of memory");
    tok_ids out = {0};
    if (err) err->msg[0] = 0;
    int rc = encode_in(t, sc, len ? text : "", len, add_special, &out, err);
    tok_scratch_put(t, sc);
    if (rc) {
        free(out.p);
        if (rc == MK_ENOMEM || !err || !err->msg[0]) return mk_fail(err, rc, "tokenizer: encode failed: %s", mk_status_str(rc));
        return rc;
    }
    *ids = out.p;
    *n = out.n;
    return 0;
}

/* ---- lookups ------------------------------------------------------------------------------------------ */

int mk_tok_vocab_size(const mk_tok *t) { return t->vocab_size; }

/* Added tokens first, then the model vocab, as HF's token_to_id. */
int mk_tok_token_to_id(const mk_tok *t, const char *token) {
    size_t n = strlen(token);
    int32_t id = tok_smap_get(&t->added_map, token, n);
    return id >= 0 ? id : tok_smap_get(&t->vocab, token, n);
}

const char *mk_tok_id_to_token(const mk_tok *t, int id) {
    return id >= 0 && id < t->vocab_size ? t->id_tok[id] : NULL;
}

int mk_tok_is_special(const mk_tok *t, int id) {
    return id >= 0 && id < t->vocab_size && (t->id_added[id] & TOK_ID_SPECIAL);
}

int mk_tok_bos_id(const mk_tok *t) { return t->bos_id; }

int mk_tok_eos_id(const mk_tok *t) { return t->eos_id; }
