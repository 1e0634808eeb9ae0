/* detok.c — decoding: HF's decoder chain (ByteLevel, Replace, ByteFallback, Fuse, Strip),
 * mk_tok_decode, and the streaming detokenizer.
 *
 * HF decodes by mapping ids to token strings (added tokens to their content; unknown ids dropped;
 * special ones dropped when skipping), passing the list through each decoder's decode_chain and
 * joining the result (or, without a decoder, joining the tokens with spaces). We keep the list as
 * one byte buffer plus spans, and each decoder writes a new list.
 *
 * The streaming detokenizer is HF's DecodeStream: it keeps the ids since a "prefix" point, decodes
 * them after each push and emits what extends the prefix's text, unless that ends in U+FFFD (an
 * incomplete UTF-8 character whose remaining bytes may still come). After emitting, the window
 * slides so that it starts one emission back: decoders that look at the first token (Strip)
 * behave the same as over the whole sequence.
 */
#include "text/tok_internal.h"

#include <stdlib.h>

typedef struct {
    tok_buf b;
    tok_spans s; /* tokens: [s, e) of b */
} tok_list;

static void list_free(tok_list *l) {
    free(l->b.p);
    free(l->s.p);
}

static int list_add(tok_list *l, const char *s, size_t n) {
    size_t at = l->b.n;
    if (tok_buf_put(&l->b, s, n)) return MK_ENOMEM;
    return tok_spans_push(&l->s, (uint32_t)at, (uint32_t)l->b.n, 0);
}

/* One token of the ByteLevel decoder: its characters mapped back to bytes, or (when one of them
 * is outside the byte alphabet, e.g. an added token like "<｜User｜>") its UTF-8 as is. */
static int bytelevel_token(tok_buf *out, const char *s, size_t n) {
    size_t start = out->n;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)tok_utf8_next(s + i, &cp);
        int b = tok_cp_to_byte(cp);
        if (b < 0) {
            out->n = start;
            return tok_buf_put(out, s, n);
        }
        if (tok_buf_putc(out, b)) return MK_ENOMEM;
    }
    return 0;
}

/* "<0xNN>" -> NN, else -1 (HF: length 6, "<0x" prefix, ">" suffix, two hex digits) */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* ByteFallback's flush: the pending bytes as one token if valid UTF-8, else one U+FFFD each. */
static int flush_bytes(tok_list *out, tok_buf *pend) {
    if (!pend->n) return 0;
    int rc = 0;
    if (tok_utf8_check(pend->p, pend->n) == pend->n) {
        rc = list_add(out, pend->p, pend->n);
    } else {
        for (size_t i = 0; i < pend->n && !rc; i++) rc = list_add(out, "\xEF\xBF\xBD", 3);
    }
    pend->n = 0;
    return rc;
}

static int dec_one(const tok_dec *d, tok_scratch *sc, const tok_list *in, tok_list *out, mk_err *err) {
    int rc = 0;
    out->b.n = 0;
    out->s.n = 0;
    switch (d->kind) {
    case DEC_BYTELEVEL: {
        tok_buf raw = {0};
        for (size_t i = 0; i < in->s.n && !rc; i++)
            rc = bytelevel_token(&raw, in->b.p + in->s.p[i].s, in->s.p[i].e - in->s.p[i].s);
        size_t at = out->b.n;
        if (!rc) rc = tok_utf8_lossy(&out->b, raw.p ? raw.p : "", raw.n);
        if (!rc) rc = tok_spans_push(&out->s, (uint32_t)at, (uint32_t)out->b.n, 0);
        free(raw.p);
        return rc;
    }
    case DEC_FUSE: {
        for (size_t i = 0; i < in->s.n && !rc; i++)
            rc = tok_buf_put(&out->b, in->b.p + in->s.p[i].s, in->s.p[i].e - in->s.p[i].s);
        return rc ? rc : tok_spans_push(&out->s, 0, (uint32_t)out->b.n, 0);
    }
    case DEC_BYTEFALLBACK: {
        tok_buf pend = {0};
        for (size_t i = 0; i < in->s.n && !rc; i++) {
            const char *s = in->b.p + in->s.p[i].s;
            size_t n = in->s.p[i].e - in->s.p[i].s;
            int b = byte_token(s, n);
            if (b >= 0) {
                rc = tok_buf_putc(&pend, b);
            } else {
                rc = flush_bytes(out, &pend);
                if (!rc) rc = list_add(out, s, n);
            }
        }
        if (!rc) rc = flush_bytes(out, &pend);
        free(pend.p);
        return rc;
    }
    case DEC_REPLACE:
        for (size_t i = 0; i < in->s.n && !rc; i++) {
            const char *s = in->b.p + in->s.p[i].s;
            size_t n = in->s.p[i].e - in->s.p[i].s, at = out->b.n;
            rc = tok_re_find_matches(&d->re, sc, s, n, &sc->matches, err);
            for (size_t k = 0; k < sc->matches.n && !rc; k++) {
                const tok_span *m = &sc->matches.p[k];
                rc = m->tag ? tok_buf_put(&out->b, d->content, d->content_len) : tok_buf_put(&out->b, s + m->s, m->e - m->s);
            }
            if (!rc) rc = tok_spans_push(&out->s, (uint32_t)at, (uint32_t)out->b.n, 0);
        }
        return rc;
    case DEC_STRIP:
        /* up to `start` leading and `stop` trailing copies of the content character */
        for (size_t i = 0; i < in->s.n && !rc; i++) {
            const char *s = in->b.p + in->s.p[i].s;
            size_t n = in->s.p[i].e - in->s.p[i].s, a = 0, b = n, cl = d->content_len;
            for (int k = 0; k < d->start && a + cl <= b && !memcmp(s + a, d->content, cl); k++) a += cl;
            for (int k = 0; k < d->stop; k++) {
                /* the last character of s[a..b) */
                if (b <= a) break;
                size_t p = b - 1;
                while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
                if (b - p != cl || memcmp(s + p, d->content, cl)) break;
                b = p;
            }
            size_t at = out->b.n;
            rc = tok_buf_put(&out->b, s + a, b - a);
            if (!rc) rc = tok_spans_push(&out->s, (uint32_t)at, (uint32_t)out->b.n, 0);
        }
        return rc;
    }
    return mk_fail(err, MK_EINTERNAL, "tokenizer: unknown decoder kind %d", d->kind);
}

int tok_decode_into(const mk_tok *t, tok_scratch *sc, const int32_t *ids, size_t n, int skip_special,
                    tok_buf *out, mk_err *err) {
    tok_list l[2] = {{{0}, {0}}, {{0}, {0}}};
    int rc = 0, cur = 0;
    out->n = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->vocab_size || !t->id_tok[id]) continue; /* HF drops unknown ids */
        if (skip_special && (t->id_added[id] & TOK_ID_SKIP)) continue;
        rc = list_add(&l[0], t->id_tok[id], t->id_len[id]);
    }
    for (int k = 0; k < t->n_dec && !rc; k++) {
        rc = dec_one(&t->dec[k], sc, &l[cur], &l[cur ^ 1], err);
        cur ^= 1;
    }
    /* join: with the decoder chain's result as is, without a decoder with spaces (HF) */
    for (size_t i = 0; i < l[cur].s.n && !rc; i++) {
        if (!t->has_decoder && i && tok_buf_putc(out, ' ')) rc = MK_ENOMEM;
        if (!rc) rc = tok_buf_put(out, l[cur].b.p + l[cur].s.p[i].s, l[cur].s.p[i].e - l[cur].s.p[i].s);
    }
    if (!rc) rc = tok_buf_reserve(out, 0); /* room for the NUL even when empty */
    if (!rc) out->p[out->n] = 0;
    list_free(&l[0]);
    list_free(&l[1]);
    return rc;
}

int mk_tok_decode(const mk_tok *t, const int32_t *ids, size_t n, int skip_special, char **out,
                  size_t *len, mk_err *err) {
    *out = NULL;
    *len = 0;
    tok_scratch *sc = tok_scratch_get(t);
    if (!sc) return mk_fail(err, MK_ENOMEM, "tokenizer: out of memory");
    tok_buf b = {0};
    int rc = tok_decode_into(t, sc, ids, n, skip_special, &b, err);
    tok_scratch_put(t, sc);
    if (rc) {
        free(b.p);
        return rc == MK_ENOMEM ? mk_fail(err, rc, "tokenizer: out of memory while decoding") : rc;
    }
    *out = b.p;
    *len = b.n;
    return 0;
}

void tok_dec_free(tok_dec *d) {
    tok_re_free(&d->re);
    free(d->content);
}

/* ---- streaming ------------------------------------------------------------------------------------ */

struct mk_detok {
    const mk_tok *t;
    int skip_special;
    tok_ids ids;         /* ids of the current window */
    size_t prefix_index; /* ids[0..prefix_index) decode to `prefix` */
    tok_buf prefix, cur, emit;
};

int mk_detok_create(const mk_tok *t, int skip_special, mk_detok **out, mk_err *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) return mk_fail(err, MK_ENOMEM, "detokenizer: out of memory");
    (*out)->t = t;
    (*out)->skip_special = skip_special;
    return 0;
}

void mk_detok_reset(mk_detok *d) {
    d->ids.n = 0;
    d->prefix_index = 0;
    d->prefix.n = 0;
}

void mk_detok_free(mk_detok *d) {
    if (!d) return;
    free(d->ids.p);
    free(d->prefix.p);
    free(d->cur.p);
    free(d->emit.p);
    free(d);
}

static int ends_with_fffd(const tok_buf *b) {
    return b->n >= 3 && !memcmp(b->p + b->n - 3, "\xEF\xBF\xBD", 3);
}

static int detok_decode(mk_detok *d, const int32_t *ids, size_t n, tok_buf *out) {
    tok_scratch *sc = tok_scratch_get(d->t);
    if (!sc) return MK_ENOMEM;
    int rc = tok_decode_into(d->t, sc, ids, n, d->skip_special, out, NULL);
    tok_scratch_put(d->t, sc);
    return rc;
}

/* Emits cur[prefix.n..) into d->emit; MK_EINTERNAL if cur does not extend the prefix (cannot
 * happen with the supported decoders, which never rewrite text already emitted). */
static int take_new(mk_detok *d, const char **text, size_t *len) {
    if (memcmp(d->cur.p, d->prefix.p ? d->prefix.p : "", d->prefix.n)) return MK_EINTERNAL;
    d->emit.n = 0;
    if (tok_buf_put(&d->emit, d->cur.p + d->prefix.n, d->cur.n - d->prefix.n)) return MK_ENOMEM;
    *text = d->emit.p;
    *len = d->emit.n;
    return 0;
}

int mk_detok_push(mk_detok *d, int32_t id, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    if (tok_ids_push(&d->ids, id)) return MK_ENOMEM;
    int rc = detok_decode(d, d->ids.p, d->ids.n, &d->cur);
    if (rc) return rc;
    if (d->cur.n <= d->prefix.n || ends_with_fffd(&d->cur)) return 0;
    if ((rc = take_new(d, text, len))) return rc;
    /* slide: keep the ids from prefix_index on; they decode to the new prefix */
    size_t keep = d->ids.n - d->prefix_index;
    memmove(d->ids.p, d->ids.p + d->prefix_index, keep * sizeof *d->ids.p);
    d->ids.n = keep;
    if ((rc = detok_decode(d, d->ids.p, d->ids.n, &d->prefix))) return rc;
    d->prefix_index = keep;
    return 0;
}

int mk_detok_flush(mk_detok *d, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    int rc = detok_decode(d, d->ids.p, d->ids.n, &d->cur);
    if (!rc && d->cur.n > d->prefix.n) rc = take_new(d, text, len);
    mk_detok_reset(d);
    return rc;
}
