/* normalize.c — HF normalizers (NFC/NFD/NFKC/NFKD, Lowercase, Replace, Prepend, Strip; a
 * Sequence is flattened into mk_tok.norm at load) and added-token matching (the byte trie and
 * HF's AddedVocabulary::find_matches with lstrip / rstrip / single_word).
 *
 * Normalizers run on a whole piece of text between added tokens (HF normalizes each such piece
 * separately: Prepend therefore prepends to every piece, not only to the start of the input).
 * Output goes to the scratch's ping-pong buffers, so a chain allocates nothing once warm, except
 * utf8proc_map's own result for the Unicode normal forms of non-ASCII text.
 */
#include "text/tok_internal.h"

#include <stdlib.h>
#include <utf8proc.h>

static int all_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return 0;
    return 1;
}

/* Apply one normalizer: s[0..n) -> out (cleared first). */
static int norm_one(const tok_norm *nm, tok_scratch *sc, const char *s, size_t n, tok_buf *out,
                    mk_err *err) {
    out->n = 0;
    switch (nm->kind) {
    case NORM_NFC: case NORM_NFD: case NORM_NFKC: case NORM_NFKD: {
        if (all_ascii(s, n)) return tok_buf_put(out, s, n); /* ASCII is invariant under all four */
        utf8proc_option_t opt = UTF8PROC_STABLE;
        opt |= (nm->kind == NORM_NFC || nm->kind == NORM_NFKC) ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
        if (nm->kind == NORM_NFKC || nm->kind == NORM_NFKD) opt |= UTF8PROC_COMPAT;
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, opt);
        if (r < 0) return mk_fail(err, MK_EINTERNAL, "tokenizer: unicode normalization failed: %s", utf8proc_errmsg(r));
        int rc = tok_buf_put(out, dst, (size_t)r);
        free(dst);
        return rc;
    }
    case NORM_LOWER: {
        /* Rust's char::to_lowercase, char by char (no final-sigma context, as HF): the simple
         * mapping, except U+0130 which lowercases to "i\u0307". */
        if (tok_buf_reserve(out, n)) return MK_ENOMEM;
        for (size_t i = 0; i < n;) {
            unsigned char c = (unsigned char)s[i];
            if (c < 0x80) {
                if (tok_buf_putc(out, c >= 'A' && c <= 'Z' ? c + 32 : c)) return MK_ENOMEM;
                i++;
                continue;
            }
            uint32_t cp;
            i += (size_t)tok_utf8_next(s + i, &cp);
            if (cp == 0x130) {
                if (tok_buf_put(out, "i\xCC\x87", 3)) return MK_ENOMEM;
                continue;
            }
            if (tok_buf_put_cp(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp))) return MK_ENOMEM;
        }
        return 0;
    }
    case NORM_REPLACE: {
        int rc = tok_re_find_matches(&nm->re, sc, s, n, &sc->matches, err);
        if (rc) return rc;
        for (size_t k = 0; k < sc->matches.n; k++) {
            const tok_span *m = &sc->matches.p[k];
            rc = m->tag ? tok_buf_put(out, nm->content, nm->content_len) : tok_buf_put(out, s + m->s, m->e - m->s);
            if (rc) return rc;
        }
        return 0;
    }
    case NORM_PREPEND:
        if (n && tok_buf_put(out, nm->content, nm->content_len)) return MK_ENOMEM;
        return tok_buf_put(out, s, n);
    case NORM_STRIP: {
        size_t a = 0, b = n;
        if (nm->left)
            while (a < b) {
                uint32_t cp;
                int k = tok_utf8_next(s + a, &cp);
                if (!tok_is_whitespace(cp)) break;
                a += (size_t)k;
            }
        if (nm->right)
            while (b > a) {
                size_t p = b - 1;
                while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
                uint32_t cp;
                tok_utf8_next(s + p, &cp);
                if (!tok_is_whitespace(cp)) break;
                b = p;
            }
        return tok_buf_put(out, s + a, b - a);
    }
    }
    return mk_fail(err, MK_EINTERNAL, "tokenizer: unknown normalizer kind %d", nm->kind);
}

/* Runs the chain; *out points to s itself when there is no normalizer (the common case: DeepSeek's
 * empty Sequence), else into a scratch buffer valid until the next tok_normalize call. */
int tok_normalize(const mk_tok *t, tok_scratch *sc, const char *s, size_t n, const char **out,
                  size_t *out_n, mk_err *err) {
    const char *cur = s;
    size_t cur_n = n;
    for (int i = 0; i < t->n_norm; i++) {
        tok_buf *dst = &sc->norm[i & 1]; /* never the buffer `cur` points into */
        int rc = norm_one(&t->norm[i], sc, cur, cur_n, dst, err);
        if (rc) return rc;
        cur = dst->p ? dst->p : "";
        cur_n = dst->n;
    }
    *out = cur;
    *out_n = cur_n;
    return 0;
}

void tok_norm_free(tok_norm *nm) {
    tok_re_free(&nm->re);
    free(nm->content);
}

/* ---- added tokens --------------------------------------------------------------------------- */

/* Children are a linked list except at the root, which has a 256-entry table: most text bytes
 * start no added token, so the scan rejects them with one load. */
int tok_trie_add(tok_trie *tr, const char *s, size_t n, int32_t match) {
    if (n == 0) return 0;
    if (tr->n_patterns == 0 && tr->n == 0)
        for (int i = 0; i < 256; i++) tr->root_child[i] = -1;
    int32_t node = -1; /* -1 = root */
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t child = node < 0 ? tr->root_child[b] : tr->node[node].first;
        if (node >= 0)
            while (child >= 0 && tr->node[child].byte != b) child = tr->node[child].sibling;
        if (child < 0) {
            if (tr->n == tr->cap) {
                size_t cap = tr->cap ? tr->cap * 2 : 256;
                tok_trie_node *p = realloc(tr->node, cap * sizeof *p);
                if (!p) return MK_ENOMEM;
                tr->node = p;
                tr->cap = cap;
            }
            child = (int32_t)tr->n++;
            tr->node[child] = (tok_trie_node){-1, -1, -1, b};
            if (node < 0) {
                tr->root_child[b] = child;
            } else {
                tr->node[child].sibling = tr->node[node].first;
                tr->node[node].first = child;
            }
        }
        node = child;
    }
    if (tr->node[node].match < 0) tr->node[node].match = match; /* first pattern wins a tie */
    tr->n_patterns++;
    return 0;
}

void tok_trie_free(tok_trie *tr) {
    free(tr->node);
    memset(tr, 0, sizeof *tr);
}

/* Longest pattern starting at s[i]; returns the pattern index and sets *end, or -1. */
static int32_t trie_longest(const tok_trie *tr, const char *s, size_t n, size_t i, size_t *end) {
    int32_t node = tr->root_child[(uint8_t)s[i]], best = -1;
    size_t j = i + 1;
    while (node >= 0) {
        if (tr->node[node].match >= 0) {
            best = tr->node[node].match;
            *end = j;
        }
        if (j >= n) break;
        uint8_t b = (uint8_t)s[j++];
        int32_t c = tr->node[node].first;
        while (c >= 0 && tr->node[c].byte != b) c = tr->node[c].sibling;
        node = c;
    }
    return best;
}

static uint32_t cp_before(const char *s, size_t at, size_t *start) {
    size_t p = at - 1;
    while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
    uint32_t cp;
    tok_utf8_next(s + p, &cp);
    if (start) *start = p;
    return cp;
}

/* Leftmost-longest scan; a match that single_word rejects still consumes its bytes (the
 * aho-corasick iterator HF uses has moved past it). lstrip / rstrip widen the token's span over
 * neighbouring whitespace (Rust's char::is_whitespace), never back into the previous token. */
int tok_added_split(const mk_tok *t, const tok_trie *tr, const char *s, size_t n, tok_spans *out) {
    out->n = 0;
    size_t start_offset = 0, i = 0;
    if (tr->n_patterns > 0) {
        while (i < n) {
            if (tr->root_child[(uint8_t)s[i]] < 0) {
                i++;
                continue;
            }
            size_t stop = 0;
            int32_t k = trie_longest(tr, s, n, i, &stop);
            if (k < 0) {
                i++;
                continue;
            }
            size_t start = i;
            i = stop; /* matches never overlap, whatever happens to this one below */
            const tok_added *a = &t->added[k];
            if (a->single_word) {
                uint32_t cp;
                int start_space = start == 0 || !tok_is_word_char(cp_before(s, start, NULL));
                int stop_space = stop == n || (tok_utf8_next(s + stop, &cp), !tok_is_word_char(cp));
                if (!start_space || !stop_space) continue;
            }
            if (a->lstrip) {
                size_t p = start;
                while (p > 0) {
                    size_t q;
                    if (!tok_is_whitespace(cp_before(s, p, &q))) break;
                    p = q;
                }
                start = p > start_offset ? p : start_offset;
            }
            if (a->rstrip) {
                while (stop < n) {
                    uint32_t cp;
                    int l = tok_utf8_next(s + stop, &cp);
                    if (!tok_is_whitespace(cp)) break;
                    stop += (size_t)l;
                }
            }
            if (start_offset < start && tok_spans_push(out, (uint32_t)start_offset, (uint32_t)start, -1))
                return MK_ENOMEM;
            if (tok_spans_push(out, (uint32_t)start, (uint32_t)stop, a->id)) return MK_ENOMEM;
            start_offset = stop;
        }
    }
    if (start_offset < n && tok_spans_push(out, (uint32_t)start_offset, (uint32_t)n, -1)) return MK_ENOMEM;
    return 0;
}
