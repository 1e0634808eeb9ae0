/* dsv4_golden.c — reference-decision replay and comparison (dsv4_golden.h). */
#include "models/dsv4_golden.h"
#include "num/formats.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const int32_t *idx;   /* [rows, k] */
    const float *margin;  /* [rows] */
    int rows, k;
} dec_table;

struct dsv4_golden {
    mk_st *st;
    int prompt, n_layers, S, n_calls, window;
    const int64_t *tokens, *start_pos, *n_tokens, *mtp_ids;
    int n_tok_total, vocab, n_mtp;
    const float *logits, *h_prefill, *h_decode, *mtp_logits;
    int hc, dim;
    dec_table gate[2][DSV4_MAX_LAYERS];    /* [prefill/decode][layer] */
    dec_table idx[2][DSV4_MAX_LAYERS];
    int call, force, overrides;
    dsv4_flip flip;
};

static mk_st_tensor *get(dsv4_golden *g, const char *fmt, const char *suffix) {
    char nm[160];
    snprintf(nm, sizeof nm, "p%d.%s%s", g->prompt, fmt, suffix ? suffix : "");
    return mk_st_find(g->st, nm);
}

int dsv4_golden_open(const char *path, int prompt, int n_layers, dsv4_golden **out, mk_err *err) {
    *out = NULL;
    dsv4_golden *g = calloc(1, sizeof *g);
    if (!g) return mk_fail(err, MK_ENOMEM, "out of memory");
    g->prompt = prompt;
    g->n_layers = n_layers;
    int rc = mk_st_open(path, &g->st, err);
    if (rc) { free(g); return rc; }
    mk_st_tensor *t;
#define NEED(var, name, dt)                                                                        \
    do {                                                                                           \
        t = get(g, name, NULL);                                                                    \
        if (!t || t->dtype != dt) {                                                                \
            rc = mk_fail(err, MK_EFORMAT, "%s: missing or mistyped tensor 'p%d.%s'", path, prompt, name); \
            goto fail;                                                                             \
        }                                                                                          \
        var = t->data;                                                                             \
    } while (0)
    NEED(g->tokens, "tokens", MK_DT_I64);
    g->n_tok_total = (int)t->numel;
    NEED(g->start_pos, "start_pos", MK_DT_I64);
    g->n_calls = (int)t->numel;
    NEED(g->n_tokens, "n_tokens", MK_DT_I64);
    NEED(g->logits, "logits", MK_DT_F32);
    g->vocab = (int)t->shape[1];
    NEED(g->h_prefill, "h.prefill", MK_DT_F32);
    if (t->ndim != 4 || t->shape[0] != n_layers) { rc = mk_fail(err, MK_EFORMAT, "%s: p%d.h.prefill has an unexpected shape", path, prompt); goto fail; }
    g->hc = (int)t->shape[2];
    g->dim = (int)t->shape[3];
    g->S = (int)g->n_tokens[0];
    t = get(g, "h.decode", NULL);
    g->h_decode = t ? t->data : NULL;
    t = get(g, "mtp.ids", NULL);
    if (t) { g->mtp_ids = t->data; g->n_mtp = (int)t->numel; }
    t = get(g, "mtp.logits", NULL);
    g->mtp_logits = t ? t->data : NULL;
    for (int l = 0; l < n_layers; l++)
        for (int ph = 0; ph < 2; ph++) {
            char nm[64];
            const char *suf = ph ? ".decode" : ".prefill";
            snprintf(nm, sizeof nm, "gate.L%d.idx", l);
            t = get(g, nm, suf);
            if (t && t->dtype == MK_DT_I32 && t->ndim == 2) {
                g->gate[ph][l].idx = t->data;
                g->gate[ph][l].rows = (int)t->shape[0];
                g->gate[ph][l].k = (int)t->shape[1];
                snprintf(nm, sizeof nm, "gate.L%d.margin", l);
                t = get(g, nm, suf);
                if (t && t->dtype == MK_DT_F32) g->gate[ph][l].margin = t->data;
            }
            snprintf(nm, sizeof nm, "indexer.L%d.raw", l);
            t = get(g, nm, suf);
            if (t && t->dtype == MK_DT_I32 && t->ndim == 2) {
                g->idx[ph][l].idx = t->data;
                g->idx[ph][l].rows = (int)t->shape[0];
                g->idx[ph][l].k = (int)t->shape[1];
            }
        }
#undef NEED
    *out = g;
    return MK_OK;
fail:
    mk_st_close(g->st);
    free(g);
    return rc;
}

void dsv4_golden_free(dsv4_golden *g) {
    if (!g) return;
    mk_st_close(g->st);
    free(g);
}

int dsv4_golden_find_prompt(const char *path, const int32_t *tokens, int n, mk_err *err) {
    mk_st *st;
    int rc = mk_st_open(path, &st, err);
    if (rc) return rc;
    int found = -1;
    for (int j = 0; j < 64 && found < 0; j++) {
        char nm[64];
        snprintf(nm, sizeof nm, "p%d.tokens", j);
        mk_st_tensor *t = mk_st_find(st, nm);
        if (!t) break;
        if (t->dtype != MK_DT_I64 || t->numel < n) continue;
        const int64_t *v = t->data;
        int ok = 1;
        for (int i = 0; i < n && ok; i++) ok = v[i] == tokens[i];
        if (ok) found = j;
    }
    mk_st_close(st);
    return found;
}

int dsv4_golden_n_calls(const dsv4_golden *g) { return g->n_calls; }
int dsv4_golden_prompt_len(const dsv4_golden *g) { return g->S; }
int dsv4_golden_start_pos(const dsv4_golden *g, int c) { return (int)g->start_pos[c]; }
int dsv4_golden_n_tokens(const dsv4_golden *g, int c) { return (int)g->n_tokens[c]; }
const int64_t *dsv4_golden_tokens(const dsv4_golden *g, int *n) { *n = g->n_tok_total; return g->tokens; }
const float *dsv4_golden_logits(const dsv4_golden *g, int c, int *vocab) {
    *vocab = g->vocab;
    return g->logits + (size_t)c * g->vocab;
}
const float *dsv4_golden_h(const dsv4_golden *g, int c, int l) {
    size_t per = (size_t)g->hc * g->dim;
    if (c == 0) return g->h_prefill + (size_t)l * g->S * per;
    if (!g->h_decode) return NULL;
    return g->h_decode + ((size_t)(c - 1) * g->n_layers + l) * per;
}
const int64_t *dsv4_golden_mtp_ids(const dsv4_golden *g, int *n) { *n = g->n_mtp; return g->mtp_ids; }
const float *dsv4_golden_mtp_logits(const dsv4_golden *g) { return g->mtp_logits; }
void dsv4_golden_set_call(dsv4_golden *g, int call) { g->call = call; }
const dsv4_flip *dsv4_golden_first_flip(const dsv4_golden *g) { return &g->flip; }
int dsv4_golden_forced_overrides(const dsv4_golden *g) { return g->overrides; }

/* Row of a decision table for token t of the current call (prefill rows are tokens; decode rows
 * are calls 1..D). */
static const int32_t *row(dsv4_golden *g, dec_table *tb, int t, int *k) {
    int r = g->call == 0 ? t : g->call - 1;
    if (!tb->idx || r >= tb->rows) return NULL;
    *k = tb->k;
    return tb->idx + (size_t)r * tb->k;
}

static void note_flip(dsv4_golden *g, int layer, int t, int is_idx, float margin, int near_tie) {
    if (g->flip.found) return;
    g->flip.found = 1;
    g->flip.call = g->call;
    g->flip.layer = layer;
    g->flip.token = t;
    g->flip.is_indexer = is_idx;
    g->flip.margin = margin;
    g->flip.near_tie = near_tie;
}

static void hook_moe(void *ctx, int layer, int n_tok, int k, int32_t *idx, const float *margin) {
    dsv4_golden *g = ctx;
    (void)margin;
    if (layer >= g->n_layers) return; /* the MTP layer's routing is not recorded */
    int ph = g->call ? 1 : 0;
    dec_table *tb = &g->gate[ph][layer];
    for (int t = 0; t < n_tok; t++) {
        int gk;
        const int32_t *gr = row(g, tb, t, &gk);
        if (!gr || gk != k) continue;
        int32_t *mine = idx + (size_t)t * k;
        int same = 1;
        for (int a = 0; a < k && same; a++) {
            int hit = 0;
            for (int b = 0; b < k; b++) hit |= mine[a] == gr[b];
            same = hit;
        }
        if (!same) {
            int r = g->call == 0 ? t : g->call - 1;
            float gm = tb->margin ? tb->margin[r] : INFINITY;
            if (g->force) g->overrides++;
            else note_flip(g, layer, t, 0, gm, 0);
        }
        if (g->force) memcpy(mine, gr, sizeof(int32_t) * (size_t)k);
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void hook_indexer(void *ctx, int layer, int t, int n_tok, int k, int32_t *sel, const float *scores, int n_scores) {
    dsv4_golden *g = ctx;
    (void)n_tok;
    if (layer >= g->n_layers) return;
    int ph = g->call ? 1 : 0;
    int gk;
    const int32_t *gr = row(g, &g->idx[ph][layer], t, &gk);
    if (!gr) return;
    int off = g->call == 0 ? g->S : g->window;
    /* the reference's selection as entry indices */
    int32_t ref[4096], me[4096];
    int nr = 0, nm = 0;
    for (int i = 0; i < gk && nr < 4096; i++)
        if (gr[i] >= 0) ref[nr++] = gr[i] - off;
    for (int i = 0; i < k && nm < 4096; i++)
        if (sel[i] >= 0) me[nm++] = sel[i];
    int32_t rs[4096], ms[4096];
    memcpy(rs, ref, sizeof(int32_t) * (size_t)nr);
    memcpy(ms, me, sizeof(int32_t) * (size_t)nm);
    qsort(rs, (size_t)nr, sizeof(int32_t), cmp_i32);
    qsort(ms, (size_t)nm, sizeof(int32_t), cmp_i32);
    int same = nr == nm && !memcmp(rs, ms, sizeof(int32_t) * (size_t)nr);
    if (!same) {
        if (g->force) g->overrides++;
        else {
            /* boundary gap: minke's lowest selected score minus minke's score of the best entry
             * the reference selected and minke did not, relative to the row's max |score|.
             * near_tie: within one bf16 ulp. */
            float lo = INFINITY, hi = -INFINITY;
            for (int i = 0; i < nm; i++) if (me[i] < n_scores && scores[me[i]] < lo) lo = scores[me[i]];
            for (int i = 0; i < nr; i++) {
                int in = 0;
                for (int j = 0; j < nm; j++) in |= me[j] == ref[i];
                if (!in && ref[i] >= 0 && ref[i] < n_scores && scores[ref[i]] > hi) hi = scores[ref[i]];
            }
            float amax = 0.0f;
            for (int i = 0; i < n_scores; i++) if (fabsf(scores[i]) > amax) amax = fabsf(scores[i]);
            float ulp = fabsf(lo) * (1.0f / 128.0f);
            note_flip(g, layer, t, 1, amax > 0 ? (lo - hi) / amax : 0.0f, lo - hi <= ulp);
        }
    }
    if (g->force) {
        for (int i = 0; i < k; i++) sel[i] = i < nr ? ref[i] : -1;
    }
}

void dsv4_golden_hooks(dsv4_golden *g, int force, dsv4_hooks *h) {
    g->force = force;
    h->ctx = g;
    h->moe = hook_moe;
    h->indexer = hook_indexer;
}

void dsv4_golden_set_window(dsv4_golden *g, int window) { g->window = window; }
