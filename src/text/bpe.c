/* bpe.c — the BPE model: the merge map, one word's merge loop and a per-scratch word cache.
 *
 * A word (one pre-token) starts as one symbol per unit — a byte when the pre-tokenizer ends with
 * ByteLevel (the unit's vocab entry is the byte's GPT-2 alphabet character), a UTF-8 character
 * otherwise — and then repeatedly merges the adjacent pair of lowest merge rank, leftmost first,
 * exactly as HF's Word::merge_all: a binary heap of (rank, position) candidates, stale entries
 * skipped when popped. Unit lookup follows HF's merge_word: continuing_subword_prefix /
 * end_of_word_suffix decorate the unit string, byte_fallback maps unknown units to "<0xNN>"
 * tokens, otherwise unk_token (fused when fuse_unk), otherwise the unit is dropped.
 *
 * The cache maps a word's bytes to its ids; it lives in the scratch (one per concurrent caller),
 * so it needs no lock, and is cleared wholesale when full.
 */
#include "text/tok_internal.h"

#include <stdlib.h>

/* ---- merge map: (left id, right id) -> (rank, merged id) ------------------------------------- */
typedef struct {
    uint64_t key; /* (left << 32) | right; UINT64_MAX = empty */
    uint32_t rank;
    int32_t id;
} mm_ent;
struct tok_mmap {
    mm_ent *e;
    size_t mask;
};

static inline size_t mm_slot(uint64_t key, size_t mask) {
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & mask;
}

struct tok_mmap *tok_mmap_create(size_t n_merges) {
    struct tok_mmap *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    size_t slots = 64;
    while (slots < n_merges * 2 + 2) slots *= 2;
    m->e = malloc(slots * sizeof *m->e);
    if (!m->e) {
        free(m);
        return NULL;
    }
    for (size_t i = 0; i < slots; i++) m->e[i].key = UINT64_MAX;
    m->mask = slots - 1;
    return m;
}

/* Later duplicates overwrite earlier ones, as HF's collect() into a HashMap does. */
int tok_mmap_put(struct tok_mmap *m, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t j = mm_slot(key, m->mask);
    while (m->e[j].key != UINT64_MAX && m->e[j].key != key) j = (j + 1) & m->mask;
    m->e[j] = (mm_ent){key, rank, id};
    return 0;
}

static inline const mm_ent *mm_get(const struct tok_mmap *m, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t j = mm_slot(key, m->mask);
    for (;;) {
        const mm_ent *e = &m->e[j];
        if (e->key == key) return e;
        if (e->key == UINT64_MAX) return NULL;
        j = (j + 1) & m->mask;
    }
}

void tok_mmap_free(struct tok_mmap *m) {
    if (!m) return;
    free(m->e);
    free(m);
}

/* ---- word cache -------------------------------------------------------------------------------- */
#define CACHE_SLOTS 32768
#define CACHE_MAX 16384   /* entries before a wholesale clear */
#define CACHE_MAX_WORD 96 /* longer words are not cached */
typedef struct {
    uint32_t hash, key_off, key_len, ids_off, ids_n;
} cache_ent;
struct tok_cache {
    uint32_t slot[CACHE_SLOTS]; /* entry index + 1 */
    cache_ent *ent;
    size_t n;
    tok_buf keys;
    tok_ids ids;
};

static tok_cache *cache_create(void) {
    tok_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->ent = malloc(CACHE_MAX * sizeof *c->ent);
    if (!c->ent) {
        free(c);
        return NULL;
    }
    return c;
}

void tok_cache_free(tok_cache *c) {
    if (!c) return;
    free(c->ent);
    free(c->keys.p);
    free(c->ids.p);
    free(c);
}

static const cache_ent *cache_get(const tok_cache *c, const char *w, size_t n, uint32_t h) {
    size_t j = h & (CACHE_SLOTS - 1);
    while (c->slot[j]) {
        const cache_ent *e = &c->ent[c->slot[j] - 1];
        if (e->hash == h && e->key_len == n && memcmp(c->keys.p + e->key_off, w, n) == 0) return e;
        j = (j + 1) & (CACHE_SLOTS - 1);
    }
    return NULL;
}

static void cache_put(tok_cache *c, const char *w, size_t n, uint32_t h, const int32_t *ids, size_t k) {
    if (c->n >= CACHE_MAX) {
        memset(c->slot, 0, sizeof c->slot);
        c->n = 0;
        c->keys.n = 0;
        c->ids.n = 0;
    }
    size_t ko = c->keys.n, io = c->ids.n;
    if (tok_buf_put(&c->keys, w, n) || tok_ids_put(&c->ids, ids, k)) return; /* no room: skip */
    size_t j = h & (CACHE_SLOTS - 1);
    while (c->slot[j]) j = (j + 1) & (CACHE_SLOTS - 1);
    c->ent[c->n] = (cache_ent){h, (uint32_t)ko, (uint32_t)n, (uint32_t)io, (uint32_t)k};
    c->slot[j] = (uint32_t)++c->n;
}

/* ---- one word ------------------------------------------------------------------------------------ */
typedef struct tok_sym {
    int32_t id;
    int32_t prev, next; /* neighbours in the current segmentation, -1 at the ends */
    uint32_t len;       /* bytes covered; 0 = merged into its left neighbour */
} tok_sym;
typedef struct tok_merge {
    uint32_t rank, pos;
    int32_t id;
} tok_merge;

static inline int merge_less(const tok_merge *a, const tok_merge *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(tok_merge *h, size_t *n, tok_merge m) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_less(&m, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static tok_merge heap_pop(tok_merge *h, size_t *n) {
    tok_merge top = h[0], last = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && merge_less(&h[c + 1], &h[c])) c++;
        if (!merge_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = last;
    return top;
}

static int sym_add(tok_scratch *sc, size_t *ns, int32_t id, uint32_t len) {
    if (*ns == sc->sym_cap) {
        size_t cap = sc->sym_cap ? sc->sym_cap * 2 : 256;
        tok_sym *p = realloc(sc->sym, cap * sizeof *p);
        if (!p) return MK_ENOMEM;
        sc->sym = p;
        sc->sym_cap = cap;
    }
    size_t i = (*ns)++;
    sc->sym[i] = (tok_sym){id, (int32_t)i - 1, (int32_t)i + 1, len};
    return 0;
}

/* The unit string HF looks up: [prefix] unit [suffix], the unit mapped to the byte-level
 * alphabet when byte_level. */
static int unit_string(const mk_tok *t, tok_buf *b, const char *u, size_t ul, int first, int last) {
    b->n = 0;
    if (!first && t->cont_prefix && tok_buf_put(b, t->cont_prefix, t->cont_prefix_len)) return MK_ENOMEM;
    if (t->byte_level) {
        if (tok_buf_put_cp(b, tok_byte_to_cp[(uint8_t)u[0]])) return MK_ENOMEM;
    } else if (tok_buf_put(b, u, ul)) {
        return MK_ENOMEM;
    }
    if (last && t->eow_suffix && tok_buf_put(b, t->eow_suffix, t->eow_suffix_len)) return MK_ENOMEM;
    return 0;
}

static int initial_symbols(const mk_tok *t, tok_scratch *sc, const char *w, size_t n, size_t *ns) {
    int fast = t->byte_level && !t->cont_prefix && !t->eow_suffix;
    int32_t unk = -1;
    uint32_t unk_len = 0;
    for (size_t i = 0; i < n;) {
        size_t ul = 1;
        if (!t->byte_level) {
            uint32_t cp;
            ul = (size_t)tok_utf8_next(w + i, &cp);
        }
        int32_t id = fast ? t->byte_id[(uint8_t)w[i]] : -1;
        if (id < 0) {
            if (unit_string(t, &sc->word, w + i, ul, i == 0, i + ul == n)) return MK_ENOMEM;
            id = tok_smap_get(&t->vocab, sc->word.p, sc->word.n);
        }
        if (id >= 0) {
            if (unk >= 0 && sym_add(sc, ns, unk, unk_len)) return MK_ENOMEM;
            unk = -1;
            if (sym_add(sc, ns, id, (uint32_t)ul)) return MK_ENOMEM;
        } else {
            int done = 0;
            if (t->byte_fallback) {
                /* HF: every byte of the (decorated) unit string must have a <0xNN> token; a
                 * pending unk is not flushed here (it follows these bytes), as in HF. */
                int all = 1;
                for (size_t k = 0; k < sc->word.n; k++)
                    if (t->bytefb_id[(uint8_t)sc->word.p[k]] < 0) all = 0;
                if (all) {
                    for (size_t k = 0; k < sc->word.n; k++)
                        if (sym_add(sc, ns, t->bytefb_id[(uint8_t)sc->word.p[k]], 1)) return MK_ENOMEM;
                    done = 1;
                }
            }
            if (!done && t->unk_id >= 0) {
                if (unk >= 0 && t->fuse_unk) {
                    unk_len += (uint32_t)ul;
                } else {
                    if (unk >= 0 && sym_add(sc, ns, unk, unk_len)) return MK_ENOMEM;
                    unk = t->unk_id;
                    unk_len = (uint32_t)ul;
                }
            }
            /* else: HF silently drops a unit it cannot represent */
        }
        i += ul;
    }
    if (unk >= 0 && sym_add(sc, ns, unk, unk_len)) return MK_ENOMEM;
    return 0;
}

static int merge_all(const mk_tok *t, tok_scratch *sc, size_t ns) {
    if (ns < 2) return 0;
    if (sc->heap_cap < ns * 2 + 8) {
        size_t cap = ns * 2 + 8;
        tok_merge *h = realloc(sc->heap, cap * sizeof *h);
        if (!h) return MK_ENOMEM;
        sc->heap = h;
        sc->heap_cap = cap;
    }
    tok_sym *s = sc->sym;
    s[ns - 1].next = -1;
    tok_merge *h = sc->heap;
    size_t hn = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const mm_ent *m = mm_get(t->merges, s[i].id, s[i + 1].id);
        if (m) heap_push(h, &hn, (tok_merge){m->rank, (uint32_t)i, m->id});
    }
    /* Each merge pushes at most 2 entries and removes a symbol, so the heap stays below 2 * ns. */
    while (hn) {
        tok_merge top = heap_pop(h, &hn);
        tok_sym *cur = &s[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        tok_sym *right = &s[cur->next];
        const mm_ent *m = mm_get(t->merges, cur->id, right->id);
        if (!m || m->id != top.id) continue; /* stale entry */
        cur->id = top.id;
        cur->len += right->len;
        right->len = 0;
        cur->next = right->next;
        if (cur->next >= 0) s[cur->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) {
            m = mm_get(t->merges, s[cur->prev].id, cur->id);
            if (m) heap_push(h, &hn, (tok_merge){m->rank, (uint32_t)cur->prev, m->id});
        }
        if (cur->next >= 0) {
            m = mm_get(t->merges, cur->id, s[cur->next].id);
            if (m) heap_push(h, &hn, (tok_merge){m->rank, top.pos, m->id});
        }
    }
    return 0;
}

int tok_bpe_word(const mk_tok *t, tok_scratch *sc, const char *w, size_t n, tok_ids *out, mk_err *err) {
    if (n == 0) return 0;
    uint32_t h = 0;
    int cacheable = n <= CACHE_MAX_WORD;
    if (cacheable) {
        if (!sc->cache && !(sc->cache = cache_create())) return mk_fail(err, MK_ENOMEM, "tokenizer: out of memory");
        h = (uint32_t)tok_hash(w, n);
        const cache_ent *e = cache_get(sc->cache, w, n, h);
        if (e) return tok_ids_put(out, sc->cache->ids.p + e->ids_off, e->ids_n);
    }
    size_t first = out->n;
    int32_t whole = -1;
    if (t->ignore_merges) {
        /* Llama-3 style: a word that is itself a vocab entry is taken whole, without merging. */
        sc->word.n = 0;
        if (t->byte_level) {
            for (size_t i = 0; i < n; i++)
                if (tok_buf_put_cp(&sc->word, tok_byte_to_cp[(uint8_t)w[i]])) return MK_ENOMEM;
        } else if (tok_buf_put(&sc->word, w, n)) {
            return MK_ENOMEM;
        }
        whole = tok_smap_get(&t->vocab, sc->word.p, sc->word.n);
    }
    if (whole >= 0) {
        if (tok_ids_push(out, whole)) return MK_ENOMEM;
    } else {
        size_t ns = 0;
        if (initial_symbols(t, sc, w, n, &ns) || merge_all(t, sc, ns))
            return mk_fail(err, MK_ENOMEM, "tokenizer: out of memory");
        for (size_t i = 0; i < ns; i++)
            if (sc->sym[i].len && tok_ids_push(out, sc->sym[i].id)) return MK_ENOMEM;
    }
    if (cacheable) cache_put(sc->cache, w, n, h, out->p + first, out->n - first);
    return 0;
}
