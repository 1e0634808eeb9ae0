/* kv.c — paged KV block pool and prefix index (kv.h).
 *
 * Lists: one intrusive doubly linked list per state that has one (free, LRU of cached blocks),
 * index 0..n-1 with -1 as the end. The prefix index is a chained hash table of registered blocks
 * (bucket heads + a next pointer per block); each block is in it at most once. Keys fold the
 * token ids one at a time, so the keys of every prefix of a block's tokens come out of one pass
 * (what the partial-block lookup needs). */
#include "kv/kv.h"

#include <stdlib.h>
#include <string.h>

enum { ST_FREE, ST_OWNED, ST_CACHED };

typedef struct {
    int head, tail;
} list;

struct mk_kv_pool {
    int n, bt;
    size_t bpb;
    unsigned char *data;
    int *refs;
    unsigned char *state;
    int *prev, *next;   /* list links (free list or LRU) */
    list free_l, lru;
    int n_free, n_cached;
    /* prefix index */
    unsigned char *reg;
    uint64_t *key, *parent, *extra;
    int *ntok;
    int32_t *toks;      /* [n * bt] */
    int *bucket, *chain;     /* by full key */
    int *bucket2, *chain2;   /* by (parent, extra, first token): candidates for partial reuse */
    unsigned nbucket;
    uint64_t evictions;
};

/* ---- lists ---------------------------------------------------------------------------------- */

static void l_push_tail(mk_kv_pool *p, list *l, int b) {
    p->prev[b] = l->tail;
    p->next[b] = -1;
    if (l->tail >= 0) p->next[l->tail] = b;
    else l->head = b;
    l->tail = b;
}

static void l_remove(mk_kv_pool *p, list *l, int b) {
    if (p->prev[b] >= 0) p->next[p->prev[b]] = p->next[b];
    else l->head = p->next[b];
    if (p->next[b] >= 0) p->prev[p->next[b]] = p->prev[b];
    else l->tail = p->prev[b];
    p->prev[b] = p->next[b] = -1;
}

/* ---- hashing -------------------------------------------------------------------------------- */

static uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static uint64_t fold_seed(uint64_t parent, uint64_t extra) { return mix(parent ^ 0x9e3779b97f4a7c15ull) ^ mix(extra + 0x632be59bd9b4e019ull); }
static uint64_t fold(uint64_t h, int32_t t) { return mix(h + (uint64_t)(uint32_t)t + 0x9e3779b97f4a7c15ull); }
static uint64_t fold_fin(uint64_t h, int n) { return mix(h ^ ((uint64_t)(unsigned)n << 32)) | 1; /* never 0 */ }

uint64_t mk_kv_key(uint64_t parent, const int32_t *tokens, int n, uint64_t extra) {
    uint64_t h = fold_seed(parent, extra);
    for (int i = 0; i < n; i++) h = fold(h, tokens[i]);
    return fold_fin(h, n);
}

uint64_t mk_kv_hash_bytes(const void *data, size_t n) {
    const unsigned char *s = data;
    uint64_t h = 0x84222325cbf29ce4ull;
    for (size_t i = 0; i < n; i++) h = mix(h ^ s[i]) + i;
    return mix(h ^ n);
}

/* ---- pool ----------------------------------------------------------------------------------- */

int mk_kv_pool_create(int n_blocks, int block_tokens, size_t bytes_per_block, mk_kv_pool **out, mk_err *err) {
    *out = NULL;
    if (n_blocks < 1) return mk_fail(err, MK_EINVAL, "kv: the pool needs at least one block, got %d", n_blocks);
    if (block_tokens < 1) return mk_fail(err, MK_EINVAL, "kv: block_tokens must be >= 1, got %d", block_tokens);
    mk_kv_pool *p = calloc(1, sizeof *p);
    if (!p) return mk_fail(err, MK_ENOMEM, "kv: out of memory");
    p->n = n_blocks;
    p->bt = block_tokens;
    p->bpb = bytes_per_block;
    size_t n = (size_t)n_blocks;
    p->nbucket = 16;
    while (p->nbucket < 2 * n) p->nbucket *= 2;
    if (bytes_per_block && n > ((size_t)-1) / bytes_per_block) { free(p); return mk_fail(err, MK_ENOMEM, "kv: pool size overflows"); }
    p->data = bytes_per_block ? malloc(n * bytes_per_block) : NULL;
    p->refs = calloc(n, sizeof *p->refs);
    p->state = calloc(n, 1);
    p->prev = malloc(n * sizeof *p->prev);
    p->next = malloc(n * sizeof *p->next);
    p->reg = calloc(n, 1);
    p->key = calloc(n, sizeof *p->key);
    p->parent = calloc(n, sizeof *p->parent);
    p->extra = calloc(n, sizeof *p->extra);
    p->ntok = calloc(n, sizeof *p->ntok);
    p->toks = malloc(n * (size_t)block_tokens * sizeof *p->toks);
    p->chain = malloc(n * sizeof *p->chain);
    p->bucket = malloc(p->nbucket * sizeof *p->bucket);
    p->chain2 = malloc(n * sizeof *p->chain2);
    p->bucket2 = malloc(p->nbucket * sizeof *p->bucket2);
    if (!p->chain2 || !p->bucket2 || (bytes_per_block && !p->data) || !p->refs || !p->state || !p->prev || !p->next || !p->reg || !p->key ||
        !p->parent || !p->extra || !p->ntok || !p->toks || !p->chain || !p->bucket) {
        size_t mb = (n * bytes_per_block) >> 20;
        mk_kv_pool_free(p);
        return mk_fail(err, MK_ENOMEM, "kv: cannot allocate %d blocks (%zu MiB of KV)", n_blocks, mb);
    }
    for (unsigned i = 0; i < p->nbucket; i++) p->bucket[i] = p->bucket2[i] = -1;
    p->free_l.head = p->free_l.tail = -1;
    p->lru.head = p->lru.tail = -1;
    for (int b = 0; b < n_blocks; b++) {
        p->state[b] = ST_FREE;
        p->chain[b] = p->chain2[b] = -1;
        l_push_tail(p, &p->free_l, b);
    }
    p->n_free = n_blocks;
    *out = p;
    return MK_OK;
}

void mk_kv_pool_free(mk_kv_pool *p) {
    if (!p) return;
    free(p->data);
    free(p->refs);
    free(p->state);
    free(p->prev);
    free(p->next);
    free(p->reg);
    free(p->key);
    free(p->parent);
    free(p->extra);
    free(p->ntok);
    free(p->toks);
    free(p->chain);
    free(p->bucket);
    free(p->chain2);
    free(p->bucket2);
    free(p);
}

int mk_kv_n_blocks(const mk_kv_pool *p) { return p->n; }
int mk_kv_block_tokens(const mk_kv_pool *p) { return p->bt; }
void *mk_kv_block_data(mk_kv_pool *p, int block) { return p->data + (size_t)block * p->bpb; }
int mk_kv_n_available(const mk_kv_pool *p) { return p->n_free + p->n_cached; }

static unsigned key2(const mk_kv_pool *p, uint64_t parent, uint64_t extra, int32_t first) {
    return (unsigned)(mix(fold_seed(parent, extra) ^ (uint64_t)(uint32_t)first) & (p->nbucket - 1));
}

static void unindex(mk_kv_pool *p, int b) {
    if (!p->reg[b]) return;
    int *pp = &p->bucket[p->key[b] & (p->nbucket - 1)];
    while (*pp != b) pp = &p->chain[*pp];
    *pp = p->chain[b];
    p->chain[b] = -1;
    pp = &p->bucket2[key2(p, p->parent[b], p->extra[b], p->toks[(size_t)b * p->bt])];
    while (*pp != b) pp = &p->chain2[*pp];
    *pp = p->chain2[b];
    p->chain2[b] = -1;
    p->reg[b] = 0;
}

int mk_kv_alloc(mk_kv_pool *p) {
    int b;
    if (p->free_l.head >= 0) {
        b = p->free_l.head;
        l_remove(p, &p->free_l, b);
        p->n_free--;
    } else if (p->lru.head >= 0) {
        b = p->lru.head;
        l_remove(p, &p->lru, b);
        p->n_cached--;
        unindex(p, b);
        p->evictions++;
    } else {
        return -1;
    }
    p->state[b] = ST_OWNED;
    p->refs[b] = 1;
    return b;
}

void mk_kv_ref(mk_kv_pool *p, int b) {
    if (p->state[b] == ST_CACHED) {
        l_remove(p, &p->lru, b);
        p->n_cached--;
        p->state[b] = ST_OWNED;
    }
    p->refs[b]++;
}

void mk_kv_unref(mk_kv_pool *p, int b) {
    if (--p->refs[b] > 0) return;
    if (p->reg[b]) {
        p->state[b] = ST_CACHED;
        l_push_tail(p, &p->lru, b);
        p->n_cached++;
    } else {
        p->state[b] = ST_FREE;
        l_push_tail(p, &p->free_l, b);
        p->n_free++;
    }
}

static int same(const mk_kv_pool *p, int b, uint64_t parent, const int32_t *tokens, int n, uint64_t extra) {
    return p->parent[b] == parent && p->extra[b] == extra && p->ntok[b] == n &&
           !memcmp(p->toks + (size_t)b * p->bt, tokens, sizeof(int32_t) * (size_t)n);
}

static int find(const mk_kv_pool *p, uint64_t key, uint64_t parent, const int32_t *tokens, int n, uint64_t extra) {
    for (int b = p->bucket[key & (p->nbucket - 1)]; b >= 0; b = p->chain[b])
        if (p->key[b] == key && same(p, b, parent, tokens, n, extra)) return b;
    return -1;
}

int mk_kv_register(mk_kv_pool *p, int b, uint64_t parent, const int32_t *tokens, int n, uint64_t extra) {
    if (n < 1 || n > p->bt || p->state[b] != ST_OWNED) return 0;
    uint64_t key = mk_kv_key(parent, tokens, n, extra);
    if (find(p, key, parent, tokens, n, extra) >= 0) return 0;
    unindex(p, b); /* a block re-registered with more tokens replaces its older entry */
    p->reg[b] = 1;
    p->key[b] = key;
    p->parent[b] = parent;
    p->extra[b] = extra;
    p->ntok[b] = n;
    memcpy(p->toks + (size_t)b * p->bt, tokens, sizeof(int32_t) * (size_t)n);
    unsigned h = (unsigned)(key & (p->nbucket - 1));
    p->chain[b] = p->bucket[h];
    p->bucket[h] = b;
    h = key2(p, parent, extra, tokens[0]);
    p->chain2[b] = p->bucket2[h];
    p->bucket2[h] = b;
    return 1;
}

int mk_kv_lookup_full(mk_kv_pool *p, uint64_t parent, const int32_t *tokens, uint64_t extra) {
    int b = find(p, mk_kv_key(parent, tokens, p->bt, extra), parent, tokens, p->bt, extra);
    if (b >= 0) mk_kv_ref(p, b);
    return b;
}

int mk_kv_lookup_partial(mk_kv_pool *p, uint64_t parent, const int32_t *tokens, int n, uint64_t extra,
                         int *matched) {
    *matched = 0;
    if (n > p->bt) n = p->bt;
    if (n < 1) return -1;
    int best = -1, best_n = 0;
    for (int b = p->bucket2[key2(p, parent, extra, tokens[0])]; b >= 0; b = p->chain2[b]) {
        if (p->parent[b] != parent || p->extra[b] != extra) continue;
        const int32_t *t = p->toks + (size_t)b * p->bt;
        int lim = p->ntok[b] < n ? p->ntok[b] : n, c = 0;
        while (c < lim && t[c] == tokens[c]) c++;
        if (c > best_n) { best = b; best_n = c; }
    }
    if (best >= 0) {
        mk_kv_ref(p, best);
        *matched = best_n;
    }
    return best;
}

void mk_kv_stats_get(const mk_kv_pool *p, mk_kv_stats *st) {
    st->n_blocks = p->n;
    st->n_free = p->n_free;
    st->n_cached = p->n_cached;
    st->n_owned = p->n - p->n_free - p->n_cached;
    st->evictions = p->evictions;
}

static int check_list(const mk_kv_pool *p, const list *l, int state, int want, const char *name, mk_err *err) {
    int k = 0, prev = -1;
    for (int b = l->head; b >= 0; b = p->next[b]) {
        if (b >= p->n || k > p->n) return mk_fail(err, MK_EINTERNAL, "kv: %s list is corrupt at block %d", name, b);
        if (p->state[b] != state) return mk_fail(err, MK_EINTERNAL, "kv: block %d on the %s list has state %d", b, name, p->state[b]);
        if (p->prev[b] != prev) return mk_fail(err, MK_EINTERNAL, "kv: %s list back link broken at block %d", name, b);
        prev = b;
        k++;
    }
    if (l->tail != prev) return mk_fail(err, MK_EINTERNAL, "kv: %s list tail is %d, walked to %d", name, l->tail, prev);
    if (k != want) return mk_fail(err, MK_EINTERNAL, "kv: %s list holds %d blocks, counter says %d", name, k, want);
    return MK_OK;
}

int mk_kv_check(const mk_kv_pool *p, const int *expected_refs, mk_err *err) {
    int nf = 0, nc = 0;
    for (int b = 0; b < p->n; b++) {
        switch (p->state[b]) {
        case ST_FREE:
            nf++;
            if (p->refs[b] || p->reg[b]) return mk_fail(err, MK_EINTERNAL, "kv: free block %d has refs %d / registered %d", b, p->refs[b], p->reg[b]);
            break;
        case ST_CACHED:
            nc++;
            if (p->refs[b] || !p->reg[b]) return mk_fail(err, MK_EINTERNAL, "kv: cached block %d has refs %d / registered %d", b, p->refs[b], p->reg[b]);
            break;
        case ST_OWNED:
            if (p->refs[b] < 1) return mk_fail(err, MK_EINTERNAL, "kv: owned block %d has refs %d", b, p->refs[b]);
            break;
        default: return mk_fail(err, MK_EINTERNAL, "kv: block %d has an unknown state %d", b, p->state[b]);
        }
        if (expected_refs && p->refs[b] != expected_refs[b])
            return mk_fail(err, MK_EINTERNAL, "kv: block %d has %d references, the block tables hold %d", b, p->refs[b], expected_refs[b]);
    }
    if (nf != p->n_free || nc != p->n_cached)
        return mk_fail(err, MK_EINTERNAL, "kv: counters free %d cached %d, blocks say %d / %d", p->n_free, p->n_cached, nf, nc);
    int rc = check_list(p, &p->free_l, ST_FREE, nf, "free", err);
    if (!rc) rc = check_list(p, &p->lru, ST_CACHED, nc, "LRU", err);
    if (rc) return rc;
    int nreg = 0;
    for (int b = 0; b < p->n; b++) nreg += p->reg[b];
    int inidx = 0;
    for (unsigned h = 0; h < p->nbucket; h++)
        for (int b = p->bucket[h]; b >= 0; b = p->chain[b]) {
            if (++inidx > p->n) return mk_fail(err, MK_EINTERNAL, "kv: index chain loops");
            if (!p->reg[b] || (p->key[b] & (p->nbucket - 1)) != h)
                return mk_fail(err, MK_EINTERNAL, "kv: block %d is in the wrong index bucket", b);
            if (p->key[b] != mk_kv_key(p->parent[b], p->toks + (size_t)b * p->bt, p->ntok[b], p->extra[b]))
                return mk_fail(err, MK_EINTERNAL, "kv: block %d's key does not match its tokens", b);
        }
    if (inidx != nreg) return mk_fail(err, MK_EINTERNAL, "kv: %d blocks registered, %d in the index", nreg, inidx);
    inidx = 0;
    for (unsigned h = 0; h < p->nbucket; h++)
        for (int b = p->bucket2[h]; b >= 0; b = p->chain2[b]) {
            if (++inidx > p->n) return mk_fail(err, MK_EINTERNAL, "kv: prefix index chain loops");
            if (!p->reg[b] || key2(p, p->parent[b], p->extra[b], p->toks[(size_t)b * p->bt]) != h)
                return mk_fail(err, MK_EINTERNAL, "kv: block %d is in the wrong prefix bucket", b);
        }
    if (inidx != nreg) return mk_fail(err, MK_EINTERNAL, "kv: %d blocks registered, %d in the prefix index", nreg, inidx);
    return MK_OK;
}
