/* tok_util.c — small building blocks of the tokenizer: growable buffers, UTF-8 checking and
 * lossy decoding with Rust's exact rules, Unicode predicates HF uses (char::is_whitespace, \w),
 * the string hash map of vocabularies, and regex matching with PCRE2 (JIT).
 *
 * The regex part reproduces what HF does with Oniguruma: `find_iter` skips an empty match that
 * directly follows the previous match, and `find_matches` turns the matches into a cover of the
 * whole string (gaps tagged 0, matches tagged 1) that the Split behaviors then combine.
 */
#include "text/tok_internal.h"

#include <stdlib.h>
#include <utf8proc.h>

/* ---- buffers ------------------------------------------------------------------------------- */

/* Buffers keep one spare byte so that text can always be NUL-terminated in place. */
int tok_buf_reserve(tok_buf *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return MK_ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

int tok_buf_put(tok_buf *b, const void *s, size_t n) {
    if (tok_buf_reserve(b, n)) return MK_ENOMEM;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int tok_buf_putc(tok_buf *b, int c) {
    char ch = (char)c;
    return tok_buf_put(b, &ch, 1);
}

int tok_buf_put_cp(tok_buf *b, uint32_t cp) {
    char u[4];
    int n;
    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    return tok_buf_put(b, u, (size_t)n);
}

int tok_ids_push(tok_ids *v, int32_t id) { return tok_ids_put(v, &id, 1); }

int tok_ids_put(tok_ids *v, const int32_t *ids, size_t n) {
    if (v->n + n > v->cap) {
        size_t cap = v->cap ? v->cap : 64;
        while (cap < v->n + n) cap *= 2;
        int32_t *p = realloc(v->p, cap * sizeof *p);
        if (!p) return MK_ENOMEM;
        v->p = p;
        v->cap = cap;
    }
    if (n) memcpy(v->p + v->n, ids, n * sizeof *ids);
    v->n += n;
    return 0;
}

int tok_spans_push(tok_spans *v, uint32_t s, uint32_t e, int32_t tag) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        tok_span *p = realloc(v->p, cap * sizeof *p);
        if (!p) return MK_ENOMEM;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = (tok_span){s, e, tag};
    return 0;
}

/* ---- UTF-8 --------------------------------------------------------------------------------- */

/* Length of the valid prefix of one UTF-8 sequence at s[0..n) and whether it is complete: returns
 * the sequence length when complete, else -(bytes of the maximal invalid subpart, >= 1). These are
 * the ranges of Unicode Table 3-7 (well-formed byte sequences), which Rust's str follows. */
static int utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c == 0xE0) need = 3, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC) need = 3;
    else if (c == 0xED) need = 3, hi = 0x9F;
    else if (c >= 0xEE && c <= 0xEF) need = 3;
    else if (c == 0xF0) need = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) need = 4;
    else if (c == 0xF4) need = 4, hi = 0x8F;
    else return -1;
    for (int k = 1; k < need; k++) {
        if ((size_t)k >= n) return -k;
        unsigned b = s[k];
        unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) return -k;
    }
    return need;
}

/* Rust's str validity: no overlongs, no surrogates, nothing above U+10FFFF; NUL is valid. */
size_t tok_utf8_check(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        /* ASCII fast path, 8 bytes at a time */
        while (i + 8 <= len) {
            uint64_t v;
            memcpy(&v, u + i, 8);
            if (v & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= len) break;
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_seq(u + i, len - i);
        if (k < 0) return i;
        i += (size_t)k;
    }
    return len;
}

int tok_utf8_next(const char *s, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    unsigned c = u[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c < 0xE0) {
        *cp = ((c & 0x1Fu) << 6) | (u[1] & 0x3Fu);
        return 2;
    }
    if (c < 0xF0) {
        *cp = ((c & 0x0Fu) << 12) | ((u[1] & 0x3Fu) << 6) | (u[2] & 0x3Fu);
        return 3;
    }
    *cp = ((c & 0x07u) << 18) | ((u[1] & 0x3Fu) << 12) | ((u[2] & 0x3Fu) << 6) | (u[3] & 0x3Fu);
    return 4;
}

/* Valid runs are copied in one piece; each maximal invalid subpart becomes one U+FFFD, so that
 * e.g. a truncated 3-byte sequence gives one replacement character and a lone surrogate three. */
int tok_utf8_lossy(tok_buf *out, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; /* [run, i) is valid and not yet copied */
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_seq(u + i, n - i);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        if (tok_buf_put(out, s + run, i - run)) return MK_ENOMEM;
        if (tok_buf_put(out, "\xEF\xBF\xBD", 3)) return MK_ENOMEM;
        i += (size_t)(-k);
        run = i;
    }
    return tok_buf_put(out, s + run, n - run);
}

int tok_is_whitespace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* Unicode \w (Alphabetic, marks, decimal numbers, connector punctuation, Join_Control) from the
 * general categories; Alphabetic's Other_Alphabetic beyond marks is only the circled letters. */
int tok_is_word_char(uint32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9)) return 1; /* Join_Control, circled letters */
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

/* ---- hash map ------------------------------------------------------------------------------ */

/* A fast 64-bit hash for short keys (tokens, words): 8-byte words folded with multiply-xorshift.
 * Not for adversarial keys across processes; vocabularies are fixed at load. */
uint64_t tok_hash(const void *p, size_t n) {
    const unsigned char *u = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, u, 8);
        h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        u += 8;
        n -= 8;
    }
    if (n) {
        uint64_t v = 0;
        memcpy(&v, u, n);
        h = (h ^ v) * 0x94d049bb133111ebull;
        h ^= h >> 29;
    }
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
}

/* Doubles the slot table (load factor <= 1/2) and reinserts the entries by their stored hash. */
static int smap_grow(tok_smap *m) {
    size_t slots = m->mask ? (m->mask + 1) * 2 : 1024;
    uint32_t *s = calloc(slots, sizeof *s);
    if (!s) return MK_ENOMEM;
    for (size_t i = 0; i < m->n; i++) {
        size_t j = m->ent[i].hash & (slots - 1);
        while (s[j]) j = (j + 1) & (slots - 1);
        s[j] = (uint32_t)i + 1;
    }
    free(m->slot);
    m->slot = s;
    m->mask = slots - 1;
    return 0;
}

int tok_smap_put(tok_smap *m, const char *k, size_t n, int32_t val) {
    if ((m->n + 1) * 2 > m->mask + 1 && smap_grow(m)) return MK_ENOMEM;
    uint32_t h = (uint32_t)tok_hash(k, n);
    size_t j = h & m->mask;
    while (m->slot[j]) {
        tok_smap_ent *e = &m->ent[m->slot[j] - 1];
        if (e->hash == h && e->len == n && memcmp(m->pool.p + e->off, k, n) == 0) {
            e->val = val;
            return 0;
        }
        j = (j + 1) & m->mask;
    }
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 512;
        tok_smap_ent *e = realloc(m->ent, cap * sizeof *e);
        if (!e) return MK_ENOMEM;
        m->ent = e;
        m->cap = cap;
    }
    size_t off = m->pool.n;
    if (tok_buf_put(&m->pool, k, n) || tok_buf_putc(&m->pool, 0)) return MK_ENOMEM;
    m->ent[m->n] = (tok_smap_ent){(uint32_t)off, (uint32_t)n, h, val};
    m->slot[j] = (uint32_t)++m->n;
    return 0;
}

int32_t tok_smap_get(const tok_smap *m, const char *k, size_t n) {
    if (!m->slot) return -1;
    uint32_t h = (uint32_t)tok_hash(k, n);
    size_t j = h & m->mask;
    while (m->slot[j]) {
        const tok_smap_ent *e = &m->ent[m->slot[j] - 1];
        if (e->hash == h && e->len == n && memcmp(m->pool.p + e->off, k, n) == 0) return e->val;
        j = (j + 1) & m->mask;
    }
    return -1;
}

void tok_smap_free(tok_smap *m) {
    free(m->slot);
    free(m->ent);
    free(m->pool.p);
    memset(m, 0, sizeof *m);
}

/* ---- regex ---------------------------------------------------------------------------------- */

int tok_re_compile(tok_re *re, const char *pat, size_t n, int literal, const char *what, mk_err *err) {
    int ec;
    PCRE2_SIZE eo;
    /* Oniguruma's Ruby syntax (what HF compiles with) treats ^ and $ as line anchors and classes
     * such as \s, \d, \w as Unicode; MULTILINE and UCP give PCRE2 the same meaning. */
    uint32_t opt = literal ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE);
    re->code = pcre2_compile((PCRE2_SPTR)pat, n, opt, &ec, &eo, NULL);
    if (!re->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return mk_fail(err, MK_ENOTSUP, "%s: regex \"%.*s\" does not compile at offset %zu: %s", what,
                       (int)(n > 200 ? 200 : n), pat, (size_t)eo, (char *)msg);
    }
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
    if (!re->jit) mk_log(MK_LOG_WARN, "%s: PCRE2 JIT unavailable for a tokenizer regex; using the slower interpreter", what);
    return 0;
}

void tok_re_free(tok_re *re) {
    if (re->code) pcre2_code_free(re->code);
    re->code = NULL;
}

/* One search from `start`; returns 1 with [*ms, *me) on a match, 0 on none, <0 on error. */
static int re_search(const tok_re *re, tok_scratch *sc, const char *s, size_t n, size_t start,
                     size_t *ms, size_t *me, mk_err *err) {
    int rc;
    if (re->jit) {
        rc = pcre2_jit_match(re->code, (PCRE2_SPTR)s, n, start, 0, sc->md, sc->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* very long input: the interpreter uses the heap */
            rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, start, PCRE2_NO_JIT | PCRE2_NO_UTF_CHECK, sc->md, NULL);
    } else {
        rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, sc->md, NULL);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return mk_fail(err, MK_EINTERNAL, "tokenizer regex match failed at byte %zu: %s", start, (char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

/* An empty string gives one empty gap, as HF's find_matches; empty matches are kept (they split a
 * gap and take part in the Split behaviors) and dropped only later as empty pieces. */
int tok_re_find_matches(const tok_re *re, tok_scratch *sc, const char *s, size_t n, tok_spans *out,
                        mk_err *err) {
    out->n = 0;
    if (n == 0) return tok_spans_push(out, 0, 0, 0);
    size_t last_end = 0, prev = 0, last_match_end = 0;
    int have_last = 0;
    while (last_end <= n) {
        size_t ms, me;
        int rc = re_search(re, sc, s, n, last_end, &ms, &me, err);
        if (rc < 0) return rc;
        if (rc == 0) break;
        if (ms == me && have_last && last_match_end == me) {
            /* Oniguruma's find_iter: no empty match right after the previous match; step one
             * character (past the end stops the loop). */
            if (last_end >= n) break;
            uint32_t cp;
            last_end += (size_t)tok_utf8_next(s + last_end, &cp);
            continue;
        }
        last_end = me;
        last_match_end = me;
        have_last = 1;
        if (prev != ms && tok_spans_push(out, (uint32_t)prev, (uint32_t)ms, 0)) return MK_ENOMEM;
        if (tok_spans_push(out, (uint32_t)ms, (uint32_t)me, 1)) return MK_ENOMEM;
        prev = me;
    }
    if (prev != n && tok_spans_push(out, (uint32_t)prev, (uint32_t)n, 0)) return MK_ENOMEM;
    return 0;
}
