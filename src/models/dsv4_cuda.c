/* dsv4_cuda.c — the DeepSeek-V4-Flash forward pass on the GPU: the structure of dsv4.c with every
 * step an op of ops_cuda.h on the context's stream (see dsv4_cuda.h). Host code only: no CUDA
 * headers; sizes and positions that the CPU code derives from the position (how many compressed
 * entries exist, which ring slot a token lands in) are derived on the host the same way, so a
 * call without hooks never waits for the device until it copies the logits back.
 */
#include "models/dsv4_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRY(x)                      \
    do {                            \
        int rc_ = (x);              \
        if (rc_) return rc_;        \
    } while (0)

typedef struct {
    int ratio, coff, D;
    mk_wmat wkv, wgate;
    const float *ape;
    const uint16_t *norm;
} gcmp;

typedef struct {
    int ratio;
    const uint16_t *attn_norm, *ffn_norm;
    const float *hc_attn_fn, *hc_attn_base, *hc_attn_scale;
    const float *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
    mk_wmat wq_a, wq_b, wkv, wo_a, wo_b;
    const uint16_t *q_norm, *kv_norm;
    const float *attn_sink;
    gcmp cmp, idx_cmp;
    mk_wmat idx_wq_b, idx_wproj;
    mk_wmat gate;
    const float *gate_bias;
    const int64_t *tid2eid;
    mk_wmat sh1, sh2, sh3;
    int ekind;
    const void **ew1, **ew2, **ew3;     /* device tables [E] */
    const uint8_t **es1, **es2, **es3;
    /* MTP */
    mk_wmat e_proj, h_proj;
    const uint16_t *enorm, *hnorm, *norm;
    const float *hc_head_fn, *hc_head_base, *hc_head_scale;
    const mk_rope_table *rope;
} glayer;

struct dsv4_cuda {
    mk_cuda_ctx *ctx;
    const dsv4_model *m;
    glayer layers[DSV4_MAX_LAYERS];
    glayer mtp;
    const uint16_t *embed, *norm;
    mk_wmat head;
    const float *hc_head_fn, *hc_head_base, *hc_head_scale;
    mk_rope_table rope_plain, rope_yarn;
    void **allocs;
    int n_allocs, cap_allocs;
    size_t bytes;
    size_t lin_scratch_rows1; /* max linear scratch for m = 1 (for sizing) */
};

typedef struct {
    float *win, *ckv, *kv_state, *sc_state, *ikv, *ikv_state, *isc_state;
    int n_ckv, n_ikv;
} gstate;

struct dsv4_cuda_seq {
    dsv4_cuda *g;
    int max_len, max_tok, pos, mtp_pos, n_last;
    gstate ls[DSV4_MAX_LAYERS + 1];
    dsv4_hooks hooks;
    /* device scratch */
    float *h, *h2, *x, *post, *comb, *sub;
    float *qr, *q, *kv, *o, *og, *oa, *ot;
    float *ckvp, *cscp;
    float *iq, *iw, *isc;
    int32_t *sel;
    const float **rows;
    int32_t *row_start;
    float *gsc, *gw, *gmargin, *sw, *xd, *act, *actd, *eo, *sg, *su, *seo;
    int32_t *gidx, *plan, *tok;
    float *logits;
    float *me, *mhn, *mhp, *mh; /* MTP */
    void *lin;
    size_t lin_bytes;
    int isc_ld, sel_cap;
    /* host buffers of the hooks */
    float *hh;
    size_t hh_n;
    int32_t *hi;
    float *hf;
    void **allocs;
    int n_allocs, cap_allocs;
};

static int dumpv(dsv4_cuda_seq *s, const float *dev, int64_t a, int64_t b, int64_t c3, mk_err *err, const char *fmt,
                 int layer);

/* ---- allocation helpers ------------------------------------------------------------------- */

static int track(void ***list, int *n, int *cap, void *p, mk_err *err) {
    if (*n == *cap) {
        int nc = *cap ? 2 * *cap : 256;
        void **l = realloc(*list, sizeof(void *) * (size_t)nc);
        if (!l) return mk_fail(err, MK_ENOMEM, "out of memory");
        *list = l;
        *cap = nc;
    }
    (*list)[(*n)++] = p;
    return MK_OK;
}

static int galloc(dsv4_cuda *g, size_t bytes, void **p, mk_err *err) {
    TRY(mk_cuda_alloc(g->ctx, bytes, p, err));
    g->bytes += bytes;
    return track(&g->allocs, &g->n_allocs, &g->cap_allocs, *p, err);
}

/* Uploads `bytes` from host (NULL pointer stays NULL). */
static int up(dsv4_cuda *g, const void *host, size_t bytes, const void **dev, mk_err *err) {
    *dev = NULL;
    if (!host) return MK_OK;
    void *p;
    TRY(galloc(g, bytes, &p, err));
    TRY(mk_cuda_upload(g->ctx, p, host, bytes, err));
    *dev = p;
    return MK_OK;
}

static int upw(dsv4_cuda *g, const mk_wmat *h, mk_wmat *d, mk_err *err) {
    memset(d, 0, sizeof *d);
    if (!h->w) return MK_OK;
    TRY(mk_cuda_wmat_upload(g->ctx, h, d, err));
    g->bytes += mk_wmat_bytes(h);
    TRY(track(&g->allocs, &g->n_allocs, &g->cap_allocs, (void *)d->w, err));
    if (d->scale) TRY(track(&g->allocs, &g->n_allocs, &g->cap_allocs, (void *)d->scale, err));
    size_t ls = mk_cuda_linear_scratch(g->ctx, d, 1);
    if (ls > g->lin_scratch_rows1) g->lin_scratch_rows1 = ls;
    return MK_OK;
}

static int up_cmp(dsv4_cuda *g, const dsv4_compressor *h, gcmp *d, mk_err *err) {
    const dsv4_config *c = &g->m->cfg;
    d->ratio = h->ratio;
    d->coff = h->coff;
    d->D = h->D;
    TRY(upw(g, &h->wkv, &d->wkv, err));
    TRY(upw(g, &h->wgate, &d->wgate, err));
    TRY(up(g, h->ape, sizeof(float) * (size_t)h->ratio * h->coff * h->D, (const void **)&d->ape, err));
    TRY(up(g, h->norm, sizeof(uint16_t) * (size_t)h->D, (const void **)&d->norm, err));
    (void)c;
    return MK_OK;
}

static int up_layer(dsv4_cuda *g, const dsv4_layer *L, glayer *G, int is_mtp, mk_err *err) {
    const dsv4_config *c = &g->m->cfg;
    int d = c->dim, hc = c->hc, nmix = (2 + hc) * hc;
    size_t fnb = sizeof(float) * (size_t)nmix * hc * d;
    G->ratio = L->ratio;
    G->rope = L->rope == &g->m->rope_yarn ? &g->rope_yarn : &g->rope_plain;
    TRY(up(g, L->attn_norm, 2 * (size_t)d, (const void **)&G->attn_norm, err));
    TRY(up(g, L->ffn_norm, 2 * (size_t)d, (const void **)&G->ffn_norm, err));
    TRY(up(g, L->hc_attn_fn, fnb, (const void **)&G->hc_attn_fn, err));
    TRY(up(g, L->hc_attn_base, sizeof(float) * nmix, (const void **)&G->hc_attn_base, err));
    TRY(up(g, L->hc_attn_scale, sizeof(float) * 3, (const void **)&G->hc_attn_scale, err));
    TRY(up(g, L->hc_ffn_fn, fnb, (const void **)&G->hc_ffn_fn, err));
    TRY(up(g, L->hc_ffn_base, sizeof(float) * nmix, (const void **)&G->hc_ffn_base, err));
    TRY(up(g, L->hc_ffn_scale, sizeof(float) * 3, (const void **)&G->hc_ffn_scale, err));
    TRY(upw(g, &L->wq_a, &G->wq_a, err));
    TRY(upw(g, &L->wq_b, &G->wq_b, err));
    TRY(upw(g, &L->wkv, &G->wkv, err));
    TRY(upw(g, &L->wo_a, &G->wo_a, err));
    TRY(upw(g, &L->wo_b, &G->wo_b, err));
    TRY(up(g, L->q_norm, 2 * (size_t)c->q_lora, (const void **)&G->q_norm, err));
    TRY(up(g, L->kv_norm, 2 * (size_t)c->head_dim, (const void **)&G->kv_norm, err));
    TRY(up(g, L->attn_sink, sizeof(float) * c->n_heads, (const void **)&G->attn_sink, err));
    if (L->ratio) TRY(up_cmp(g, &L->cmp, &G->cmp, err));
    if (L->ratio == 4) {
        TRY(up_cmp(g, &L->idx_cmp, &G->idx_cmp, err));
        TRY(upw(g, &L->idx_wq_b, &G->idx_wq_b, err));
        TRY(upw(g, &L->idx_wproj, &G->idx_wproj, err));
    }
    TRY(upw(g, &L->gate, &G->gate, err));
    TRY(up(g, L->gate_bias, sizeof(float) * c->n_experts, (const void **)&G->gate_bias, err));
    TRY(up(g, L->tid2eid, sizeof(int64_t) * (size_t)c->vocab * c->n_act, (const void **)&G->tid2eid, err));
    TRY(upw(g, &L->shared.w1, &G->sh1, err));
    TRY(upw(g, &L->shared.w2, &G->sh2, err));
    TRY(upw(g, &L->shared.w3, &G->sh3, err));
    int E = c->n_experts;
    G->ekind = L->experts[0].w1.kind;
    if (G->ekind != MK_W_BF16 && G->ekind != MK_W_FP8 && G->ekind != MK_W_FP4)
        return mk_fail(err, MK_ENOTSUP, "cuda: routed experts of weight kind %d are not supported", G->ekind);
    const void **tw = calloc((size_t)E * 6, sizeof(void *));
    if (!tw) return mk_fail(err, MK_ENOMEM, "out of memory");
    int rc = MK_OK;
    for (int e = 0; e < E && !rc; e++) {
        const dsv4_expert *X = &L->experts[e];
        const mk_wmat *hw[3] = {&X->w1, &X->w2, &X->w3};
        for (int i = 0; i < 3 && !rc; i++) {
            mk_wmat dw;
            if ((int)hw[i]->kind != G->ekind) {
                rc = mk_fail(err, MK_EFORMAT, "cuda: expert %d mixes weight kinds", e);
                break;
            }
            rc = upw(g, hw[i], &dw, err);
            tw[(size_t)i * E + e] = dw.w;
            tw[(size_t)(3 + i) * E + e] = dw.scale;
        }
    }
    const void *tabs[6] = {0};
    for (int i = 0; i < 6 && !rc; i++) rc = up(g, tw + (size_t)i * E, sizeof(void *) * E, &tabs[i], err);
    free(tw);
    if (rc) return rc;
    G->ew1 = (const void **)tabs[0];
    G->ew2 = (const void **)tabs[1];
    G->ew3 = (const void **)tabs[2];
    G->es1 = (const uint8_t **)tabs[3];
    G->es2 = (const uint8_t **)tabs[4];
    G->es3 = (const uint8_t **)tabs[5];
    if (G->ekind == MK_W_BF16) G->es1 = G->es2 = G->es3 = NULL;
    if (is_mtp) {
        TRY(upw(g, &L->e_proj, &G->e_proj, err));
        TRY(upw(g, &L->h_proj, &G->h_proj, err));
        TRY(up(g, L->enorm, 2 * (size_t)d, (const void **)&G->enorm, err));
        TRY(up(g, L->hnorm, 2 * (size_t)d, (const void **)&G->hnorm, err));
        TRY(up(g, L->norm, 2 * (size_t)d, (const void **)&G->norm, err));
        TRY(up(g, L->hc_head_fn, sizeof(float) * (size_t)hc * hc * d, (const void **)&G->hc_head_fn, err));
        TRY(up(g, L->hc_head_base, sizeof(float) * hc, (const void **)&G->hc_head_base, err));
        TRY(up(g, L->hc_head_scale, sizeof(float), (const void **)&G->hc_head_scale, err));
    }
    return MK_OK;
}

int dsv4_cuda_create(mk_cuda_ctx *ctx, const dsv4_model *m, dsv4_cuda **out, mk_err *err) {
    *out = NULL;
    const dsv4_config *c = &m->cfg;
    if (c->hc > 4) return mk_fail(err, MK_ENOTSUP, "cuda: hc_mult %d > 4", c->hc);
    if (c->head_dim > 1024) return mk_fail(err, MK_ENOTSUP, "cuda: head_dim %d > 1024", c->head_dim);
    dsv4_cuda *g = calloc(1, sizeof *g);
    if (!g) return mk_fail(err, MK_ENOMEM, "out of memory");
    g->ctx = ctx;
    g->m = m;
    int rc = mk_cuda_rope_table_upload(ctx, &m->rope_plain, &g->rope_plain, err);
    if (!rc) rc = mk_cuda_rope_table_upload(ctx, &m->rope_yarn, &g->rope_yarn, err);
    int d = c->dim, hc = c->hc;
    if (!rc) rc = up(g, m->embed, 2 * (size_t)c->vocab * d, (const void **)&g->embed, err);
    if (!rc) rc = up(g, m->norm, 2 * (size_t)d, (const void **)&g->norm, err);
    if (!rc) rc = upw(g, &m->head, &g->head, err);
    if (!rc) rc = up(g, m->hc_head_fn, sizeof(float) * (size_t)hc * hc * d, (const void **)&g->hc_head_fn, err);
    if (!rc) rc = up(g, m->hc_head_base, sizeof(float) * hc, (const void **)&g->hc_head_base, err);
    if (!rc) rc = up(g, m->hc_head_scale, sizeof(float), (const void **)&g->hc_head_scale, err);
    for (int l = 0; l < c->n_layers && !rc; l++) rc = up_layer(g, &m->layers[l], &g->layers[l], 0, err);
    if (!rc && c->n_mtp) rc = up_layer(g, &m->mtp, &g->mtp, 1, err);
    if (!rc) rc = mk_cuda_ctx_sync(ctx, err);
    if (rc) {
        dsv4_cuda_free(g);
        return rc;
    }
    *out = g;
    return MK_OK;
}

void dsv4_cuda_free(dsv4_cuda *g) {
    if (!g) return;
    for (int i = 0; i < g->n_allocs; i++) mk_cuda_free(g->ctx, g->allocs[i]);
    free(g->allocs);
    if (g->rope_plain.cs) mk_cuda_rope_table_free(g->ctx, &g->rope_plain);
    if (g->rope_yarn.cs) mk_cuda_rope_table_free(g->ctx, &g->rope_yarn);
    free(g);
}

size_t dsv4_cuda_weight_bytes(const dsv4_cuda *g) { return g->bytes; }

size_t dsv4_cuda_decode_weight_bytes(const dsv4_cuda *g) {
    const dsv4_model *m = g->m;
    const dsv4_config *c = &m->cfg;
    size_t b = mk_wmat_bytes(&m->head) + 2 * (size_t)c->dim;
    for (int l = 0; l < c->n_layers; l++) {
        const dsv4_layer *L = &m->layers[l];
        const mk_wmat *ws[] = {&L->wq_a, &L->wq_b, &L->wkv, &L->wo_a, &L->wo_b, &L->gate,
                               &L->shared.w1, &L->shared.w2, &L->shared.w3, &L->cmp.wkv,
                               &L->cmp.wgate, &L->idx_cmp.wkv, &L->idx_cmp.wgate, &L->idx_wq_b,
                               &L->idx_wproj};
        int nw = L->ratio == 4 ? 15 : L->ratio ? 11 : 9;
        for (int i = 0; i < nw; i++) b += mk_wmat_bytes(ws[i]);
        b += (size_t)c->n_act * (mk_wmat_bytes(&L->experts[0].w1) + mk_wmat_bytes(&L->experts[0].w2) +
                                 mk_wmat_bytes(&L->experts[0].w3));
        b += 2 * sizeof(float) * (size_t)(2 + c->hc) * c->hc * c->hc * c->dim;
    }
    return b;
}

/* ---- sequences ------------------------------------------------------------------------------ */

static int salloc(dsv4_cuda_seq *s, size_t bytes, void *pp, mk_err *err) {
    void **p = pp;
    TRY(mk_cuda_alloc(s->g->ctx, bytes, p, err));
    TRY(track(&s->allocs, &s->n_allocs, &s->cap_allocs, *p, err));
    return mk_cuda_memset(s->g->ctx, *p, 0, bytes, err);
}

#define F(n) (sizeof(float) * (size_t)(n))

static int seq_alloc(dsv4_cuda_seq *s, mk_err *err) {
    dsv4_cuda *g = s->g;
    const dsv4_config *c = &g->m->cfg;
    size_t Tm = (size_t)s->max_tok;
    int d = c->dim, hc = c->hc, HD = c->n_heads * c->head_dim, D = c->head_dim, ID = c->index_head_dim;
    int cmax = 2 * (D > ID ? D : ID), E = c->n_experts, K = c->n_act, I = c->moe_inter;
    int n_ent = s->max_len / 4 + 1;
    s->isc_ld = n_ent;
    s->sel_cap = c->index_topk < n_ent ? c->index_topk : n_ent;
    size_t rows_per = (size_t)c->window + (size_t)(s->sel_cap > s->max_len / 4 + 1 ? s->sel_cap : s->max_len / 4 + 1) + 16;
    for (int l = 0; l < c->n_layers + c->n_mtp; l++) {
        int r = c->compress_ratio[l], coff = r == 4 ? 2 : 1;
        gstate *st = &s->ls[l];
        TRY(salloc(s, F((size_t)c->window * D), &st->win, err));
        if (r) {
            TRY(salloc(s, F((size_t)(s->max_len / r + 1) * D), &st->ckv, err));
            TRY(salloc(s, F((size_t)coff * r * coff * D), &st->kv_state, err));
            TRY(salloc(s, F((size_t)coff * r * coff * D), &st->sc_state, err));
        }
        if (r == 4) {
            TRY(salloc(s, F((size_t)n_ent * ID), &st->ikv, err));
            TRY(salloc(s, F((size_t)16 * ID), &st->ikv_state, err));
            TRY(salloc(s, F((size_t)16 * ID), &st->isc_state, err));
        }
    }
    size_t Th = Tm * hc;
    TRY(salloc(s, F(Th * d), &s->h, err));
    TRY(salloc(s, F(Th * d), &s->h2, err));
    TRY(salloc(s, F(Tm * d), &s->x, err));
    TRY(salloc(s, F(Th), &s->post, err));
    TRY(salloc(s, F(Th * hc), &s->comb, err));
    TRY(salloc(s, F(Tm * d), &s->sub, err));
    TRY(salloc(s, F(Tm * c->q_lora), &s->qr, err));
    TRY(salloc(s, F(Tm * HD), &s->q, err));
    TRY(salloc(s, F(Tm * D), &s->kv, err));
    TRY(salloc(s, F(Tm * HD), &s->o, err));
    TRY(salloc(s, F(Tm * (HD / c->o_groups)), &s->og, err));
    TRY(salloc(s, F(Tm * c->o_groups * c->o_lora), &s->oa, err));
    TRY(salloc(s, F(Tm * c->o_lora), &s->ot, err));
    TRY(salloc(s, F(Tm * cmax), &s->ckvp, err));
    TRY(salloc(s, F(Tm * cmax), &s->cscp, err));
    TRY(salloc(s, F(Tm * c->index_heads * ID), &s->iq, err));
    TRY(salloc(s, F(Tm * c->index_heads), &s->iw, err));
    TRY(salloc(s, F(Tm * n_ent), &s->isc, err));
    TRY(salloc(s, F(Tm * s->sel_cap + 16), &s->sel, err));
    TRY(salloc(s, sizeof(void *) * Tm * rows_per, &s->rows, err));
    TRY(salloc(s, sizeof(int32_t) * (Tm + 1), &s->row_start, err));
    TRY(salloc(s, F(Tm * E), &s->gsc, err));
    TRY(salloc(s, F(Tm * K), &s->gw, err));
    TRY(salloc(s, F(Tm), &s->gmargin, err));
    TRY(salloc(s, F(Tm * K), &s->sw, err));
    TRY(salloc(s, sizeof(int32_t) * Tm * K, &s->gidx, err));
    TRY(salloc(s, sizeof(int32_t) * mk_cuda_moe_plan_ints((int)Tm, K, E), &s->plan, err));
    TRY(salloc(s, sizeof(int32_t) * Tm, &s->tok, err));
    TRY(salloc(s, F(Tm * d), &s->xd, err));
    TRY(salloc(s, F(Tm * K * I), &s->act, err));
    TRY(salloc(s, F(Tm * K * I), &s->actd, err));
    TRY(salloc(s, F(Tm * K * d), &s->eo, err));
    TRY(salloc(s, F(Tm * I), &s->sg, err));
    TRY(salloc(s, F(Tm * I), &s->su, err));
    TRY(salloc(s, F(Tm * d), &s->seo, err));
    TRY(salloc(s, F(c->vocab), &s->logits, err));
    if (c->n_mtp) {
        TRY(salloc(s, F(Tm * d), &s->me, err));
        TRY(salloc(s, F(Th * d), &s->mhn, err));
        TRY(salloc(s, F(Th * d), &s->mhp, err));
        TRY(salloc(s, F(Th * d), &s->mh, err));
    }
    /* linear scratch: the largest need of any weight at Tm * hc rows (MTP h_proj) */
    size_t lb = 0;
    const mk_wmat *all[64];
    int na = 0;
    for (int l = 0; l <= c->n_layers; l++) {
        const glayer *L = l < c->n_layers ? &g->layers[l] : (c->n_mtp ? &g->mtp : NULL);
        if (!L) break;
        const mk_wmat *ws[] = {&L->wq_a, &L->wq_b, &L->wkv, &L->wo_a, &L->wo_b, &L->gate, &L->sh1,
                               &L->sh2, &L->sh3, &L->cmp.wkv, &L->cmp.wgate, &L->idx_cmp.wkv,
                               &L->idx_cmp.wgate, &L->idx_wq_b, &L->idx_wproj, &L->e_proj, &L->h_proj};
        na = 0;
        for (int i = 0; i < 17; i++) if (ws[i]->w) all[na++] = ws[i];
        for (int i = 0; i < na; i++) {
            size_t b = mk_cuda_linear_scratch(g->ctx, all[i], (int)Th);
            if (b > lb) lb = b;
        }
    }
    size_t hb = mk_cuda_linear_scratch(g->ctx, &g->head, 1);
    if (hb > lb) lb = hb;
    s->lin_bytes = lb;
    TRY(salloc(s, lb, &s->lin, err));
    size_t hn = Th * d;
    if ((size_t)c->vocab > hn) hn = c->vocab;
    if (Tm * n_ent > hn) hn = Tm * n_ent;
    if (Tm * HD > hn) hn = Tm * HD;
    if ((size_t)(s->max_len / 4 + 1) * D > hn) hn = (size_t)(s->max_len / 4 + 1) * D;
    s->hh_n = hn;
    s->hh = malloc(F(hn));
    s->hf = malloc(F(Tm + 16));
    size_t ni = Tm * K;
    if (Tm * s->sel_cap > ni) ni = Tm * s->sel_cap;
    s->hi = malloc(sizeof(int32_t) * (ni + 16));
    if (!s->hh || !s->hf || !s->hi) return mk_fail(err, MK_ENOMEM, "out of memory");
    return MK_OK;
}

int dsv4_cuda_seq_create(dsv4_cuda *g, int max_len, int max_tok, dsv4_cuda_seq **out, mk_err *err) {
    *out = NULL;
    if (max_len <= 0) max_len = g->m->max_seq_len;
    if (max_len > g->m->max_seq_len)
        return mk_fail(err, MK_ERANGE, "sequence length %d exceeds the model's max_seq_len %d", max_len,
                       g->m->max_seq_len);
    if (max_tok <= 0 || max_tok > max_len) max_tok = max_len;
    dsv4_cuda_seq *s = calloc(1, sizeof *s);
    if (!s) return mk_fail(err, MK_ENOMEM, "out of memory");
    s->g = g;
    s->max_len = max_len;
    s->max_tok = max_tok;
    int rc = seq_alloc(s, err);
    if (!rc) rc = dsv4_cuda_seq_reset(s, err);
    if (rc) {
        dsv4_cuda_seq_free(s);
        return rc;
    }
    *out = s;
    return MK_OK;
}

void dsv4_cuda_seq_free(dsv4_cuda_seq *s) {
    if (!s) return;
    for (int i = 0; i < s->n_allocs; i++) mk_cuda_free(s->g->ctx, s->allocs[i]);
    free(s->allocs);
    free(s->hh);
    free(s->hf);
    free(s->hi);
    free(s);
}

int dsv4_cuda_seq_reset(dsv4_cuda_seq *s, mk_err *err) {
    const dsv4_config *c = &s->g->m->cfg;
    mk_cuda_ctx *ctx = s->g->ctx;
    int D = c->head_dim, ID = c->index_head_dim;
    for (int l = 0; l < c->n_layers + c->n_mtp; l++) {
        int r = c->compress_ratio[l], coff = r == 4 ? 2 : 1;
        gstate *st = &s->ls[l];
        st->n_ckv = st->n_ikv = 0;
        TRY(mk_cuda_memset(ctx, st->win, 0, F((size_t)c->window * D), err));
        if (r) {
            size_t n = (size_t)coff * r * coff * D;
            TRY(mk_cuda_memset(ctx, st->ckv, 0, F((size_t)(s->max_len / r + 1) * D), err));
            TRY(mk_cuda_memset(ctx, st->kv_state, 0, F(n), err));
            TRY(mk_cuda_fill(ctx, st->sc_state, n, -INFINITY, err));
        }
        if (r == 4) {
            TRY(mk_cuda_memset(ctx, st->ikv, 0, F((size_t)(s->max_len / 4 + 1) * ID), err));
            TRY(mk_cuda_memset(ctx, st->ikv_state, 0, F((size_t)16 * ID), err));
            TRY(mk_cuda_fill(ctx, st->isc_state, (size_t)16 * ID, -INFINITY, err));
        }
    }
    s->pos = s->mtp_pos = s->n_last = 0;
    return mk_cuda_ctx_sync(ctx, err);
}

int dsv4_cuda_seq_pos(const dsv4_cuda_seq *s) { return s->pos; }

void dsv4_cuda_seq_set_hooks(dsv4_cuda_seq *s, const dsv4_hooks *h) {
    if (h) s->hooks = *h;
    else memset(&s->hooks, 0, sizeof s->hooks);
}

/* ---- the forward pass ----------------------------------------------------------------------- */

static int lin(dsv4_cuda_seq *s, const mk_wmat *W, const float *x, int m, float *y, int round, mk_err *err) {
    return mk_cuda_linear(s->g->ctx, W, x, m, y, round, s->lin, s->lin_bytes, err);
}

/* New compressed entries of a compressor: rmsnorm, RoPE, then the indexer (Hadamard + FP4) or
 * attention (FP8 of the nope dims) simulation; the pooling already rounded them to bf16. */
static int cmp_finish(dsv4_cuda_seq *s, const glayer *L, const gcmp *C, int is_idx, float *e, int n,
                      int pos0, mk_err *err) {
    const dsv4_config *c = &s->g->m->cfg;
    mk_cuda_ctx *ctx = s->g->ctx;
    int D = C->D, rd = c->rope_dim;
    if (n <= 0) return MK_OK;
    TRY(mk_cuda_rmsnorm(ctx, e, n, D, C->norm, c->norm_eps, e, err));
    TRY(mk_cuda_rope_step(ctx, e + D - rd, n, D, rd, L->rope, pos0, C->ratio, 0, err));
    if (is_idx) {
        TRY(mk_cuda_hadamard(ctx, e, n, D, 1.0f / sqrtf((float)D), err));
        TRY(mk_cuda_quant_sim(ctx, e, n, D, D, 32, 1, e, err));
    } else {
        TRY(mk_cuda_quant_sim(ctx, e, n, D, D - rd, 64, 0, e, err));
    }
    return MK_OK;
}

static int compressor(dsv4_cuda_seq *s, const glayer *L, const gcmp *C, int is_idx, const float *x,
                      int T, int start, float *cache, int *n_cache, float *kvs, float *scs, mk_err *err) {
    mk_cuda_ctx *ctx = s->g->ctx;
    int r = C->ratio, D = C->D, W2 = C->coff * D, ov = C->coff == 2;
    float *kvp = s->ckvp, *scp = s->cscp;
    TRY(lin(s, &C->wkv, x, T, kvp, 0, err));
    TRY(lin(s, &C->wgate, x, T, scp, 0, err));
    if (start == 0) {
        int rem = T % r, cutoff = T - rem, off = ov ? r : 0;
        TRY(mk_cuda_add_ape(ctx, scp, T, W2, C->ape, r, 0, err));
        if (ov && cutoff >= r) {
            TRY(mk_cuda_copy(ctx, kvs, kvp + (size_t)(cutoff - r) * W2, F((size_t)r * W2), err));
            TRY(mk_cuda_copy(ctx, scs, scp + (size_t)(cutoff - r) * W2, F((size_t)r * W2), err));
        }
        if (rem) {
            TRY(mk_cuda_copy(ctx, kvs + (size_t)off * W2, kvp + (size_t)cutoff * W2, F((size_t)rem * W2), err));
            TRY(mk_cuda_copy(ctx, scs + (size_t)off * W2, scp + (size_t)cutoff * W2, F((size_t)rem * W2), err));
        }
        int ng = cutoff / r;
        float *e = cache + (size_t)(*n_cache) * D;
        TRY(mk_cuda_cmp_pool(ctx, kvp, scp, W2, D, r, ov, 1, ng, e, err));
        TRY(cmp_finish(s, L, C, is_idx, e, ng, 0, err));
        *n_cache += ng;
    } else {
        int p = start;
        TRY(mk_cuda_add_ape(ctx, scp, 1, W2, C->ape, r, p, err));
        int slot = ov ? r + p % r : p % r;
        TRY(mk_cuda_copy(ctx, kvs + (size_t)slot * W2, kvp, F(W2), err));
        TRY(mk_cuda_copy(ctx, scs + (size_t)slot * W2, scp, F(W2), err));
        if ((p + 1) % r) return MK_OK;
        float *e = cache + (size_t)(*n_cache) * D;
        TRY(mk_cuda_cmp_pool(ctx, kvs, scs, W2, D, r, ov, 0, 1, e, err));
        if (ov) {
            TRY(mk_cuda_copy(ctx, kvs, kvs + (size_t)r * W2, F((size_t)r * W2), err));
            TRY(mk_cuda_copy(ctx, scs, scs + (size_t)r * W2, F((size_t)r * W2), err));
        }
        TRY(cmp_finish(s, L, C, is_idx, e, 1, p + 1 - r, err));
        (*n_cache)++;
    }
    return MK_OK;
}

static int indexer(dsv4_cuda_seq *s, int layer, const glayer *L, gstate *st, const float *x, int T,
                   int start, int *k_out, mk_err *err) {
    const dsv4_config *c = &s->g->m->cfg;
    mk_cuda_ctx *ctx = s->g->ctx;
    int IH = c->index_heads, ID = c->index_head_dim, rd = c->rope_dim;
    *k_out = 0;
    TRY(lin(s, &L->idx_wq_b, s->qr, T, s->iq, 1, err));
    TRY(mk_cuda_rope(ctx, s->iq + ID - rd, T * IH, ID, rd, L->rope, start, IH, 0, err));
    TRY(mk_cuda_hadamard(ctx, s->iq, T * IH, ID, 1.0f / sqrtf((float)ID), err));
    TRY(mk_cuda_quant_sim(ctx, s->iq, T * IH, ID, ID, 32, 1, s->iq, err));
    TRY(dumpv(s, s->iq, T, IH, ID, err, "L%d.idx.q", layer));
    TRY(compressor(s, L, &L->idx_cmp, 1, x, T, start, st->ikv, &st->n_ikv, st->ikv_state, st->isc_state, err));
    TRY(lin(s, &L->idx_wproj, x, T, s->iw, 1, err));
    float wscale = (float)(pow((double)ID, -0.5) * pow((double)IH, -0.5));
    TRY(mk_cuda_scale_bf16(ctx, s->iw, (size_t)T * IH, wscale, err));
    int end = start + T, n_all = end / 4, prefill = start == 0;
    int k = c->index_topk < n_all ? c->index_topk : n_all;
    if (k <= 0) return MK_OK;
    if (k > s->sel_cap) return mk_fail(err, MK_ERANGE, "cuda: indexer top-k %d over capacity %d", k, s->sel_cap);
    TRY(mk_cuda_index_scores(ctx, s->iq, s->iw, st->ikv, T, IH, ID, prefill, n_all, s->isc, err));
    TRY(mk_cuda_index_topk(ctx, s->isc, T, n_all, prefill, k, s->sel, err));
    if (s->hooks.indexer) {
        TRY(mk_cuda_download(ctx, s->hi, s->sel, sizeof(int32_t) * (size_t)T * k, err));
        TRY(mk_cuda_download(ctx, s->hh, s->isc, F((size_t)T * n_all), err));
        for (int t = 0; t < T; t++) {
            int vis = prefill ? (t + 1) / 4 : n_all;
            s->hooks.indexer(s->hooks.ctx, layer, t, T, k, s->hi + (size_t)t * k, s->hh + (size_t)t * n_all, vis);
        }
        TRY(mk_cuda_upload(ctx, s->sel, s->hi, sizeof(int32_t) * (size_t)T * k, err));
        TRY(mk_cuda_index_clamp(ctx, s->sel, T, n_all, prefill, k, err));
    }
    *k_out = k;
    return MK_OK;
}

static int attention(dsv4_cuda_seq *s, int layer, const glayer *L, gstate *st, const float *x, int T,
                     int start, float *out, mk_err *err) {
    const dsv4_config *c = &s->g->m->cfg;
    mk_cuda_ctx *ctx = s->g->ctx;
    int H = c->n_heads, D = c->head_dim, rd = c->rope_dim, nope = D - rd, HD = H * D;
    int G = c->o_groups, Dg = HD / G, win = c->window, r = L->ratio;
    TRY(lin(s, &L->wq_a, x, T, s->qr, 1, err));
    TRY(mk_cuda_rmsnorm(ctx, s->qr, T, c->q_lora, L->q_norm, c->norm_eps, s->qr, err));
    TRY(dumpv(s, s->qr, T, c->q_lora, 0, err, "L%d.attn.qr", layer));
    TRY(lin(s, &L->wq_b, s->qr, T, s->q, 1, err));
    TRY(mk_cuda_head_rms_bf16(ctx, s->q, T * H, D, c->norm_eps, err));
    TRY(mk_cuda_rope(ctx, s->q + nope, T * H, D, rd, L->rope, start, H, 0, err));
    TRY(dumpv(s, s->q, T, H, D, err, "L%d.attn.q", layer));
    TRY(lin(s, &L->wkv, x, T, s->kv, 1, err));
    TRY(mk_cuda_rmsnorm(ctx, s->kv, T, D, L->kv_norm, c->norm_eps, s->kv, err));
    TRY(mk_cuda_rope(ctx, s->kv + nope, T, D, rd, L->rope, start, 1, 0, err));
    TRY(mk_cuda_quant_sim(ctx, s->kv, T, D, nope, 64, 0, s->kv, err));
    TRY(dumpv(s, s->kv, T, D, 0, err, "L%d.attn.kv", layer));
    int k_sel = 0;
    if (r == 4) TRY(indexer(s, layer, L, st, x, T, start, &k_sel, err));
    for (int t = (T > win ? T - win : 0); t < T; t++)
        TRY(mk_cuda_copy(ctx, st->win + (size_t)((start + t) % win) * D, s->kv + (size_t)t * D, F(D), err));
    if (r) TRY(compressor(s, L, &L->cmp, 0, x, T, start, st->ckv, &st->n_ckv, st->kv_state, st->sc_state, err));
    if (r && st->n_ckv) TRY(dumpv(s, st->ckv, st->n_ckv, D, 0, err, "L%d.attn.ckv", layer));
    TRY(mk_cuda_attn_rows(ctx, T, start, win, D, s->kv, st->win, st->ckv, st->n_ckv, r, s->sel, k_sel,
                          s->rows, s->row_start, err));
    TRY(mk_cuda_sparse_attn(ctx, s->q, T, H, D, (const float *const *)s->rows, s->row_start, L->attn_sink,
                            1.0f / sqrtf((float)D), s->o, err));
    TRY(mk_cuda_rope(ctx, s->o + nope, T * H, D, rd, L->rope, start, H, 1, err));
    TRY(dumpv(s, s->o, T, H, D, err, "L%d.attn.o", layer));
    for (int g = 0; g < G; g++) {
        mk_wmat Wg = L->wo_a;
        Wg.n = c->o_lora;
        if (Wg.kind == MK_W_BF16) {
            Wg.w = (const uint16_t *)L->wo_a.w + (size_t)g * c->o_lora * Dg;
        } else {
            Wg.w = (const uint8_t *)L->wo_a.w + (size_t)g * c->o_lora * Dg;
            Wg.scale = L->wo_a.scale + (size_t)(g * c->o_lora / 128) * ((Dg + 127) / 128);
        }
        if (T == 1) {
            TRY(lin(s, &Wg, s->o + (size_t)g * Dg, 1, s->oa + (size_t)g * c->o_lora, 1, err));
        } else {
            TRY(mk_cuda_copy2d(ctx, s->og, F(Dg), s->o + (size_t)g * Dg, F(HD), F(Dg), (size_t)T, err));
            TRY(lin(s, &Wg, s->og, T, s->ot, 1, err));
            TRY(mk_cuda_copy2d(ctx, s->oa + (size_t)g * c->o_lora, F(G * c->o_lora), s->ot, F(c->o_lora),
                               F(c->o_lora), (size_t)T, err));
        }
    }
    TRY(dumpv(s, s->oa, T, G * c->o_lora, 0, err, "L%d.attn.oa", layer));
    TRY(lin(s, &L->wo_b, s->oa, T, out, 1, err));
    return dumpv(s, out, T, c->dim, 0, err, "L%d.attn.out", layer);
}

static int moe(dsv4_cuda_seq *s, int layer, const glayer *L, const float *x, int T, float *out, mk_err *err) {
    const dsv4_config *c = &s->g->m->cfg;
    mk_cuda_ctx *ctx = s->g->ctx;
    int E = c->n_experts, K = c->n_act, d = c->dim, I = c->moe_inter;
    float lim = c->swiglu_limit;
    TRY(lin(s, &L->gate, x, T, s->gsc, 0, err));
    TRY(mk_cuda_moe_route(ctx, s->gsc, T, E, K, L->gate_bias, L->tid2eid, s->tok, c->vocab, s->gidx,
                          s->gmargin, err));
    if (s->hooks.moe) {
        TRY(mk_cuda_download(ctx, s->hi, s->gidx, sizeof(int32_t) * (size_t)T * K, err));
        TRY(mk_cuda_download(ctx, s->hf, s->gmargin, F(T), err));
        s->hooks.moe(s->hooks.ctx, layer, T, K, s->hi, s->hf);
        TRY(mk_cuda_upload(ctx, s->gidx, s->hi, sizeof(int32_t) * (size_t)T * K, err));
    }
    TRY(mk_cuda_moe_weights(ctx, s->gsc, T, E, K, c->route_scale, s->gidx, s->gw, err));
    TRY(dumpv(s, s->gw, T, K, 0, err, "L%d.moe.weights", layer));
    TRY(mk_cuda_moe_plan(ctx, s->gidx, s->gw, T, K, E, s->plan, s->sw, err));
    const float *xd = x, *ad = s->act;
    if (L->ekind != MK_W_BF16) {
        TRY(mk_cuda_quant_sim(ctx, x, T, d, d, 128, 0, s->xd, err));
        xd = s->xd;
    }
    TRY(mk_cuda_moe_gemv(ctx, L->ekind, (const void *const *)L->ew1, (const uint8_t *const *)L->es1,
                         (const void *const *)L->ew3, (const uint8_t *const *)L->es3, I, d, xd, 1, s->plan,
                         s->sw, T, K, E, lim, s->act, err));
    if (L->ekind != MK_W_BF16) {
        TRY(mk_cuda_quant_sim(ctx, s->act, T * K, I, I, 128, 0, s->actd, err));
        ad = s->actd;
    }
    TRY(mk_cuda_moe_gemv(ctx, L->ekind, (const void *const *)L->ew2, (const uint8_t *const *)L->es2, NULL,
                         NULL, d, I, ad, 0, s->plan, s->sw, T, K, E, lim, s->eo, err));
    /* shared expert */
    TRY(lin(s, &L->sh1, x, T, s->sg, 1, err));
    TRY(mk_cuda_linear_ex(ctx, MK_CUDA_K_AUTO, MK_CUDA_LIN_REUSE_X, &L->sh3, x, T, s->su, 1, s->lin,
                          s->lin_bytes, err));
    TRY(mk_cuda_swiglu(ctx, s->sg, s->su, (size_t)T * I, lim, s->sg, err));
    TRY(lin(s, &L->sh2, s->sg, T, s->seo, 1, err));
    TRY(mk_cuda_moe_combine(ctx, s->eo, s->gidx, s->plan, T, K, E, d, s->seo, out, err));
    return MK_OK;
}

/* Test mode: a named intermediate (dsv4.c's names) copied to the host for the dump hook. */
static int dumpv(dsv4_cuda_seq *s, const float *dev, int64_t a, int64_t b, int64_t c3, mk_err *err, const char *fmt,
                 int layer) {
    if (!s->hooks.dump) return MK_OK;
    size_t n = (size_t)a * (size_t)b * (size_t)(c3 ? c3 : 1);
    if (n > s->hh_n) return MK_OK;
    TRY(mk_cuda_download(s->g->ctx, s->hh, dev, F(n), err));
    char name[48];
    snprintf(name, sizeof name, fmt, layer);
    int64_t sh[3] = {a, b, c3};
    s->hooks.dump(s->hooks.ctx, name, s->hh, c3 ? 3 : 2, sh);
    return MK_OK;
}

static int block(dsv4_cuda_seq *s, int layer, const glayer *L, gstate *st, float *h, int T, int start,
                 mk_err *err) {
    const dsv4_config *c = &s->g->m->cfg;
    mk_cuda_ctx *ctx = s->g->ctx;
    int hc = c->hc, d = c->dim;
    TRY(mk_cuda_hc_pre(ctx, h, T, hc, d, L->hc_attn_fn, L->hc_attn_scale, L->hc_attn_base, c->hc_iters,
                       c->hc_eps, c->norm_eps, s->x, s->post, s->comb, err));
    TRY(mk_cuda_rmsnorm(ctx, s->x, T, d, L->attn_norm, c->norm_eps, s->x, err));
    TRY(dumpv(s, s->x, T, d, 0, err, "L%d.attn.in", layer));
    TRY(attention(s, layer, L, st, s->x, T, start, s->sub, err));
    TRY(mk_cuda_hc_post(ctx, s->sub, h, s->post, s->comb, T, hc, d, s->h2, err));
    TRY(dumpv(s, s->h2, T, hc, d, err, "L%d.h_attn", layer));
    TRY(mk_cuda_hc_pre(ctx, s->h2, T, hc, d, L->hc_ffn_fn, L->hc_ffn_scale, L->hc_ffn_base, c->hc_iters,
                       c->hc_eps, c->norm_eps, s->x, s->post, s->comb, err));
    TRY(mk_cuda_rmsnorm(ctx, s->x, T, d, L->ffn_norm, c->norm_eps, s->x, err));
    TRY(dumpv(s, s->x, T, d, 0, err, "L%d.moe.in", layer));
    TRY(moe(s, layer, L, s->x, T, s->sub, err));
    TRY(dumpv(s, s->sub, T, d, 0, err, "L%d.moe.out", layer));
    TRY(mk_cuda_hc_post(ctx, s->sub, s->h2, s->post, s->comb, T, hc, d, h, err));
    return dumpv(s, h, T, hc, d, err, "L%d.h", layer);
}

static int head(dsv4_cuda_seq *s, const float *h_last, const float *fn, const float *scale,
                const float *base, const uint16_t *norm, float *logits, mk_err *err) {
    dsv4_cuda *g = s->g;
    const dsv4_config *c = &g->m->cfg;
    TRY(mk_cuda_hc_head(g->ctx, h_last, 1, c->hc, c->dim, fn, scale, base, c->hc_eps, c->norm_eps, s->x, err));
    TRY(mk_cuda_rmsnorm(g->ctx, s->x, 1, c->dim, norm, c->norm_eps, s->x, err));
    TRY(lin(s, &g->head, s->x, 1, s->logits, 0, err));
    return mk_cuda_download(g->ctx, logits, s->logits, F(c->vocab), err);
}

static int check_call(dsv4_cuda_seq *s, const int32_t *tokens, int T, int start, mk_err *err) {
    const dsv4_config *c = &s->g->m->cfg;
    if (T <= 0) return mk_fail(err, MK_EINVAL, "a forward call needs at least one token");
    if (start > 0 && T != 1)
        return mk_fail(err, MK_ENOTSUP, "a call at position %d has %d tokens: after the prefill only one-token decodes are supported", start, T);
    if (T > s->max_tok) return mk_fail(err, MK_ERANGE, "a call of %d tokens exceeds this sequence's %d", T, s->max_tok);
    if (start + T > s->max_len)
        return mk_fail(err, MK_ERANGE, "position %d exceeds the sequence capacity %d", start + T, s->max_len);
    for (int i = 0; i < T; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab)
            return mk_fail(err, MK_ERANGE, "token id %d at index %d is outside the vocabulary [0, %d)", tokens[i], i, c->vocab);
    return MK_OK;
}

int dsv4_cuda_forward(dsv4_cuda_seq *s, const int32_t *tokens, int T, float *logits, mk_err *err) {
    dsv4_cuda *g = s->g;
    const dsv4_config *c = &g->m->cfg;
    int start = s->pos;
    TRY(check_call(s, tokens, T, start, err));
    TRY(mk_cuda_upload(g->ctx, s->tok, tokens, sizeof(int32_t) * (size_t)T, err));
    TRY(mk_cuda_embed_hc(g->ctx, g->embed, c->vocab, s->tok, T, c->hc, c->dim, s->h, err));
    for (int l = 0; l < c->n_layers; l++) TRY(block(s, l, &g->layers[l], &s->ls[l], s->h, T, start, err));
    s->n_last = T;
    if (logits)
        TRY(head(s, s->h + (size_t)(T - 1) * c->hc * c->dim, g->hc_head_fn, g->hc_head_scale, g->hc_head_base,
                 g->norm, logits, err));
    else
        TRY(mk_cuda_ctx_sync(g->ctx, err));
    s->pos += T;
    return MK_OK;
}

int dsv4_cuda_mtp_forward(dsv4_cuda_seq *s, const int32_t *ids, int T, float *logits, mk_err *err) {
    dsv4_cuda *g = s->g;
    const dsv4_config *c = &g->m->cfg;
    mk_cuda_ctx *ctx = g->ctx;
    if (!c->n_mtp) return mk_fail(err, MK_ENOTSUP, "this checkpoint has no MTP layer");
    if (T != s->n_last) return mk_fail(err, MK_EINVAL, "MTP call of %d ids after a call of %d tokens", T, s->n_last);
    int start = s->mtp_pos, hc = c->hc, d = c->dim;
    TRY(check_call(s, ids, T, start, err));
    const glayer *L = &g->mtp;
    TRY(mk_cuda_upload(ctx, s->tok, ids, sizeof(int32_t) * (size_t)T, err));
    TRY(mk_cuda_embed_hc(ctx, g->embed, c->vocab, s->tok, T, 1, d, s->me, err));
    TRY(mk_cuda_rmsnorm(ctx, s->me, T, d, L->enorm, c->norm_eps, s->me, err));
    TRY(mk_cuda_rmsnorm(ctx, s->h, T * hc, d, L->hnorm, c->norm_eps, s->mhn, err));
    TRY(lin(s, &L->e_proj, s->me, T, s->sub, 1, err));
    TRY(lin(s, &L->h_proj, s->mhn, T * hc, s->mhp, 1, err));
    TRY(mk_cuda_add_bcast_bf16(ctx, s->mhp, s->sub, T * hc, hc, d, s->mh, err));
    TRY(block(s, c->n_layers, L, &s->ls[c->n_layers], s->mh, T, start, err));
    TRY(head(s, s->mh + (size_t)(T - 1) * hc * d, L->hc_head_fn, L->hc_head_scale, L->hc_head_base, L->norm,
             logits, err));
    s->mtp_pos = start + T;
    return MK_OK;
}
