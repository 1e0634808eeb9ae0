/* dsv4_cuda.c — the DeepSeek-V4-Flash forward pass on the GPU: the structure of dsv4.c with every
 * step an op of ops_cuda.h on the context's stream (see dsv4_cuda.h). Host code only: no CUDA
 * headers; sizes and positions that the CPU code derives from the position (how many compressed
 * entries exist, which ring slot a token lands in, which block an entry lives in) are derived on
 * the host the same way, so a call without hooks waits for the device only to upload its token
 * ids and block tables (one copy) and to copy the logits back.
 *
 * A call runs pieces of one or more sequences: their rows are concatenated through every linear
 * (the row-invariant kernels: a row's bits never depend on the others), the MoE and the mHC
 * mixing; RoPE, the window, the compressors, the indexer and the attention run per piece on its
 * own state and block table. Compressed entries live in a pool of 256-position blocks with the
 * CPU's layout (dsv4_kv_layout): a standalone sequence has a private pool (identity table, no
 * snapshots), the engine's slots share one with snapshots.
 */
#include "models/dsv4_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    int fp4_tiles;            /* the tuning's fp4_tiles when the experts were uploaded (their layout) */
};

/* Per-layer state of one sequence (slot) on the device; the compressed entries live in blocks. */
typedef struct {
    float *win, *kv_state, *sc_state, *ikv_state, *isc_state;
    int n_ckv, n_ikv;
} gstate;

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

static int moe_fp4_mma(const dsv4_config *c, const glayer *L);

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
    const int lane_order = moe_fp4_mma(c, G); /* moe() runs mk_cuda_moe_gemv_fp4 on these */
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
            if (!rc && lane_order) rc = mk_cuda_fp4_expert_layout(g->ctx, &dw, err); /* the tensor-core path's layout */
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
    {
        mk_cuda_tuning tu;
        mk_cuda_ctx_get_tuning(ctx, &tu);
        g->fp4_tiles = tu.fp4_tiles; /* the experts' layout (mk_cuda_fp4_expert_layout) */
    }
    int rc = mk_cuda_rope_table_upload(ctx, &m->rope_plain, &g->rope_plain, err);
    if (!rc) rc = mk_cuda_rope_table_upload(ctx, &m->rope_yarn, &g->rope_yarn, err);
    int d = c->dim, hc = c->hc;
    if (!rc) rc = up(g, m->embed, 2 * (size_t)c->vocab * d, (const void **)&g->embed, err);
    if (!rc) rc = up(g, m->norm, 2 * (size_t)d, (const void **)&g->norm, err);
    if (!rc) rc = upw(g, &m->head, &g->head, err);
    { /* the tuning's head_tiles: the head in slab tiles (its GEMVs read them; the same bits); where the
       * context records no more tiled matrices (MK_ENOTSUP, nothing moved), it stays in rows */
        mk_cuda_tuning tu;
        mk_cuda_ctx_get_tuning(ctx, &tu);
        if (!rc && tu.head_tiles && g->head.kind == MK_W_BF16 && g->head.n % 16 == 0 && g->head.k % 128 == 0) {
            mk_err e2 = {0};
            rc = mk_cuda_bf16_tiles(ctx, &g->head, &e2);
            if (rc == MK_ENOTSUP) rc = MK_OK;
            else if (rc) *err = e2;
        }
    }
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
    if (g->head.w) mk_cuda_bf16_tiles_forget(g->ctx, g->head.w); /* nothing when it is in rows */
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

/* ---- device memory: the paged pool, the call scratch, the sequences -------------------------- */

#define F(n) (sizeof(float) * (size_t)(n))

typedef struct {
    void **list;
    int n, cap;
} dlist;

static int dalloc(mk_cuda_ctx *ctx, dlist *l, size_t bytes, void *pp, mk_err *err) {
    void **p = pp;
    TRY(mk_cuda_alloc(ctx, bytes, p, err));
    int rc = track(&l->list, &l->n, &l->cap, *p, err);
    if (rc) {
        mk_cuda_free(ctx, *p);
        *p = NULL;
        return rc;
    }
    return mk_cuda_memset(ctx, *p, 0, bytes, err);
}

static void dfree(mk_cuda_ctx *ctx, dlist *l) {
    for (int i = 0; i < l->n; i++) mk_cuda_free(ctx, l->list[i]);
    free(l->list);
    memset(l, 0, sizeof *l);
}

struct dsv4_cuda_pool {
    dsv4_cuda *g;
    dsv4_kv_layout lay;
    int n_blocks;
    uint8_t *base;
};

static int pool_create(dsv4_cuda *g, int n_blocks, int snapshots, dsv4_cuda_pool **out, mk_err *err) {
    *out = NULL;
    if (n_blocks < 1) return mk_fail(err, MK_EINVAL, "cuda kv pool: need at least one block, got %d", n_blocks);
    dsv4_cuda_pool *p = calloc(1, sizeof *p);
    if (!p) return mk_fail(err, MK_ENOMEM, "out of memory");
    p->g = g;
    p->n_blocks = n_blocks;
    int rc = dsv4_kv_layout_init(g->m, snapshots, &p->lay, err);
    if (!rc && (rc = mk_cuda_alloc(g->ctx, p->lay.bytes * (size_t)n_blocks, (void **)&p->base, err)))
        mk_err_prefix(err, "cuda kv pool of %d blocks of %zu bytes", n_blocks, p->lay.bytes);
    if (!rc) rc = mk_cuda_memset(g->ctx, p->base, 0, p->lay.bytes * (size_t)n_blocks, err);
    if (rc) {
        dsv4_cuda_pool_free(p);
        return rc;
    }
    *out = p;
    return MK_OK;
}

int dsv4_cuda_pool_create(dsv4_cuda *g, int n_blocks, dsv4_cuda_pool **out, mk_err *err) {
    return pool_create(g, n_blocks, 1, out, err);
}

void dsv4_cuda_pool_free(dsv4_cuda_pool *p) {
    if (!p) return;
    if (p->base) mk_cuda_free(p->g->ctx, p->base);
    free(p);
}

size_t dsv4_cuda_pool_block_bytes(const dsv4_cuda_pool *p) { return p->lay.bytes; }

/* A captured decode step and what it was captured for: the piece count, the indexer's score
 * columns (idx_cols), the head's mode (head_mode: which of its kernels run) and the
 * KV pool's device base and block size (which the kernels' arguments hold; the layout within a
 * block follows from the model and the block size). */
#define GRAPH_SLOTS 32 /* a shape's graph per staging half with step I/O (each half has its own ids region) */
typedef struct {
    mk_cuda_graph *g;
    int np, n_cap, mode;
    const void *base, *ids; /* ids: the call's ids region (set_layout), which the kernels read */
    size_t block_bytes;
    unsigned long used;
} ggraph;

/* Scratch of one call: rows of every piece concatenated (row0 of a piece = its first row). */
struct dsv4_cuda_work {
    dsv4_cuda *g;
    int max_rows, max_pieces, max_len, tbl_cap, with_mtp;
    float *h, *h2, *x, *post, *comb, *sub;
    float *qr, *q, *kv, *o, *og, *oa, *ot;
    float *ckvp, *cscp, *ekv, *esc, *ents;
    float *ickvp, *icscp;                   /* the indexer compressor's projections (xproj) */
    float *iq, *iw, *isc;
    int32_t *icnt;                          /* the fused indexer top-k's counters (zero between uses) */
    int32_t *sel;
    const float **rows;
    int32_t *row_start;
    float *gsc, *gw, *gmargin, *sw, *xd, *act, *actd, *eo, *sg, *su, *seo;
    uint8_t *mxq;                           /* FP4 experts: quantized activations [max(T d, T K I)] */
    float *msa;                             /* and their scales */
    int32_t *gidx, *plan, *ids, *tok, *tbl, *pos, *fsrc; /* ids = tok [max_rows] | tbl [max_pieces, tbl_cap] |
                                                          * pos [max_rows] | fsrc [max_rows] (fed rows: the
                                                          * previous call's row in am, else -1) */
    float *hl, *xl, *logits;                /* head: [max_pieces, hc, dim], [max_pieces, dim], [max_pieces, vocab] */
    int32_t *am, *ham;                      /* argmax of the logits rows [max_pieces]: device, host */
    mk_sample_draw *draw, *hdraw;           /* the logits rows' draws [max_pieces] (inv_t 0: none), in the
                                             * ids region (uploaded with them): device, host staging */
    float *sws;                             /* the draws' weights [max_pieces, vocab] (mk_cuda_sample_rows) */
    float *me, *mhn, *mhp, *mh;             /* MTP */
    void *lin;
    size_t lin_bytes;
    void *lin_side;                         /* the side branch's linear scratch (tuning branch): the
                                             * compressors' projections and the shared expert of up to
                                             * 8 rows */
    size_t lin_side_bytes;
    int sel_cap, rows_per;
    int32_t *hids;                          /* host staging of ids (and of apc; page-locked): the current half */
    mk_sample_adj *adj, *hadj;              /* the draws' adjusted tokens (mk_sampler_model_step), packed:
                                             * device, host staging (page-locked, the current half) [adj_cap] */
    size_t adj_cap;                         /* max_pieces x MK_SAMPLE_ADJ_MAX */
    /* Two halves of the host staging (hids, hadj) and of ham, a call each in turn, so that the host
     * writes the next call's inputs while the previous call's upload may still be queued
     * (dsv4_cuda_batch_launch). */
    int32_t *hids_buf[2], *ham_buf[2];
    mk_sample_adj *hadj_buf[2];
    int half;
    int upl_pending[2];                     /* an asynchronous upload from that half may not have run yet */
    struct gpend *call;                     /* [2] the launched calls of each half (batch_launch / _wait) */
    int n_pending, oldest;                  /* launched calls not waited for; the half of the oldest */
    dsv4_cuda_seq **prev_seq;               /* [max_pieces] the last call's logits rows with an argmax on the
                                             * device (feed), in row order; NULL for rows without */
    int prev_rows;
    int *feed_src;                          /* [max_pieces] the call's fed pieces: the previous call's row */
    mk_cuda_apiece *apc, *happ;             /* attention pieces [max_pieces, n_layers + n_mtp], after the ids */
    size_t ids_bytes;                       /* the ints of ids then the draws, each 256-aligned: apc starts there */
    size_t draw_off;                        /* the draws' offset in the ids region */
    /* the ids region laid out for max_rows rows (ids_full) and for max_pieces rows (ids_small: a call
     * of at most that many rows, every decode step, unless MINKE_CUDA_IDS_COMPACT=0): a call uploads
     * its layout's region whole, ~12 bytes a row of capacity (set_layout) */
    int32_t *ids_full[2], *ids_small[2]; /* [half]: the same region in both halves unless step_io() */
    size_t ids_bytes_l[2], draw_off_l[2];
    int layout_rows[2];
    int layout;                             /* the current call's (set_view) */
    int io;                                 /* the current call's I/O on the I/O streams (step_io) */
    int32_t *am_buf[2];                     /* [half] the picks on the device; one buffer unless step_io() */
    int32_t *am_prev;                       /* the previous call's picks (the other half's), fed rows read */
    /* host buffers of the hooks (standalone sequences only) */
    float *hh;
    size_t hh_n;
    int32_t *hi;
    float *hf;
    /* decode steps as CUDA graphs (run_graph) */
    ggraph graphs[GRAPH_SLOTS];
    unsigned long graph_tick;
    int graphs_off;                         /* a capture failed: eager launches from then on */
    int *cnt_save;                          /* the compressors' counters before a capture [max_pieces, layers, 2] */
    dsv4_cuda_graph_counts gcount;
    size_t bytes;
    dlist mem;
};

static int pend_create(dsv4_cuda_work *w, size_t max_pieces, mk_err *err);
static void pend_free(dsv4_cuda_work *w);

static int walloc(dsv4_cuda_work *w, size_t bytes, void *pp, mk_err *err) {
    w->bytes += bytes;
    return dalloc(w->g->ctx, &w->mem, bytes, pp, err);
}

/* A switch read once from the environment, on unless set to 0 (*v: -1 until read). */
static int env_on(const char *name, int *v) {
    if (*v < 0) {
        const char *e = getenv(name);
        *v = !(e && atoi(e) == 0);
    }
    return *v;
}

/* The ids region of the next call: layout 1 (max_pieces rows: every decode step) for a call of at
 * most that many rows, else 0 (max_rows rows), so that a decode step uploads ~1 KB and not ~25 KB
 * at a 2048-row budget; MINKE_CUDA_IDS_COMPACT=0 uses layout 0 always. The device pointers of the
 * inputs, and the host staging's offsets, follow. */
static int ids_compact(void) {
    static int v = -1;
    return env_on("MINKE_CUDA_IDS_COMPACT", &v);
}

/* Step I/O (default on; MINKE_CUDA_STEP_IO=0 off): a call launched while another is pending (the
 * engine's async scheduling: w->io) sends its ids up on an upload stream into its half's device
 * region while the previous call still runs, and brings its picks down on a download stream
 * (mk_cuda_copy_on), so that only event waits sit between two chained steps on the main stream.
 * The device ids regions and picks are per half: a call reads the picks of the previous one (the
 * other half) and writes its own. The host waits for call k (its download stream's event: after
 * its kernels and copies, or the context's sync) before it launches call k + 2 into the same half
 * (at most two calls pending). A call launched with none pending uses the main stream: the GPU
 * waits for it anyway, and the streams' hand-overs cost a waited step ~5-10 us. */
static int step_io(void) {
    static int v = -1;
    return env_on("MINKE_CUDA_STEP_IO", &v);
}

/* The next call's view of half h (host staging, results, and with step_io its device regions) in
 * ids layout l: the device pointers of its inputs and the host staging's offsets. */
static void set_view(dsv4_cuda_work *w, int h, int l) {
    const size_t rows = (size_t)w->layout_rows[l];
    w->half = h;
    w->layout = l;
    w->ids = l ? w->ids_small[h] : w->ids_full[h];
    w->ids_bytes = w->ids_bytes_l[l];
    w->draw_off = w->draw_off_l[l];
    w->tok = w->ids;
    w->tbl = w->ids + rows;
    w->pos = w->tbl + (size_t)w->max_pieces * w->tbl_cap;
    w->fsrc = w->pos + rows;
    w->apc = (mk_cuda_apiece *)((uint8_t *)w->ids + w->ids_bytes);
    w->draw = (mk_sample_draw *)((uint8_t *)w->ids + w->draw_off);
    w->am = w->am_buf[h];
    w->am_prev = w->am_buf[h ^ 1];
    w->hids = w->hids_buf[h];
    w->hadj = w->hadj_buf[h];
    w->ham = w->ham_buf[h];
    w->happ = (mk_cuda_apiece *)((uint8_t *)w->hids + w->ids_bytes);
    w->hdraw = (mk_sample_draw *)((uint8_t *)w->hids + w->draw_off);
}

static void set_layout(dsv4_cuda_work *w, int l) { set_view(w, w->half, l); }
static void use_half(dsv4_cuda_work *w, int h) { set_view(w, h, w->layout); }

static int work_create(dsv4_cuda *g, int max_rows, int max_pieces, int max_len, int with_mtp, int with_hooks,
                       dsv4_cuda_work **out, mk_err *err) {
    *out = NULL;
    const dsv4_config *c = &g->m->cfg;
    if (max_rows < 1 || max_pieces < 1 || max_len < 1)
        return mk_fail(err, MK_EINVAL, "cuda work: rows %d, pieces %d, length %d must be >= 1", max_rows, max_pieces,
                       max_len);
    dsv4_cuda_work *w = calloc(1, sizeof *w);
    if (!w) return mk_fail(err, MK_ENOMEM, "out of memory");
    w->g = g;
    w->max_rows = max_rows;
    w->max_pieces = max_pieces;
    w->max_len = max_len;
    w->with_mtp = with_mtp && c->n_mtp;
    w->tbl_cap = max_len / DSV4_BLOCK_TOKENS + 1;
    size_t Tm = (size_t)max_rows, P = (size_t)max_pieces;
    int d = c->dim, hc = c->hc, HD = c->n_heads * c->head_dim, D = c->head_dim, ID = c->index_head_dim;
    int cmax = 2 * (D > ID ? D : ID), E = c->n_experts, K = c->n_act, I = c->moe_inter, rmax = 4;
    for (int l = 0; l < c->n_layers + c->n_mtp; l++)
        if (c->compress_ratio[l] > rmax) rmax = c->compress_ratio[l];
    int n_ent = max_len / 4 + 1;
    w->sel_cap = c->index_topk < n_ent ? c->index_topk : n_ent;
    w->rows_per = c->window + (w->sel_cap > n_ent ? w->sel_cap : n_ent) + 16;
    size_t Th = Tm * hc;
    int rc = MK_OK;
#define WA(ptr, bytes) \
    if (!rc) rc = walloc(w, (bytes), &(ptr), err)
    WA(w->h, F(Th * d));
    WA(w->h2, F(Th * d));
    WA(w->x, F(Tm * d));
    WA(w->post, F(Th));
    WA(w->comb, F(Th * hc));
    WA(w->sub, F(Tm * d));
    WA(w->qr, F(Tm * c->q_lora));
    WA(w->q, F(Tm * HD));
    WA(w->kv, F(Tm * D));
    WA(w->o, F(Tm * HD));
    WA(w->og, F(Tm * (HD / c->o_groups)));
    WA(w->oa, F(Tm * c->o_groups * c->o_lora));
    WA(w->ot, F(Tm * c->o_lora));
    WA(w->ckvp, F(Tm * cmax));
    WA(w->cscp, F(Tm * cmax));
    WA(w->ickvp, F(Tm * 2 * (size_t)ID));
    WA(w->icscp, F(Tm * 2 * (size_t)ID));
    WA(w->ekv, F((Tm + 2 * (size_t)rmax) * cmax));
    WA(w->esc, F((Tm + 2 * (size_t)rmax) * cmax));
    WA(w->ents, F((Tm / 4 + 2) * (size_t)(D > ID ? D : ID)));
    WA(w->iq, F(Tm * c->index_heads * ID));
    WA(w->iw, F(Tm * c->index_heads));
    WA(w->isc, F(Tm * n_ent));
    WA(w->icnt, sizeof(int32_t) * Tm); /* zero, and left zero by each use */
    WA(w->sel, F(Tm * w->sel_cap + 16));
    WA(w->rows, sizeof(void *) * Tm * w->rows_per);
    WA(w->row_start, sizeof(int32_t) * (Tm + 1));
    WA(w->gsc, F(Tm * E));
    WA(w->gw, F(Tm * K));
    WA(w->gmargin, F(Tm));
    WA(w->sw, F(Tm * K));
    WA(w->gidx, sizeof(int32_t) * Tm * K);
    WA(w->plan, sizeof(int32_t) * mk_cuda_moe_plan_ints((int)Tm, K, E));
    const size_t apc_bytes = sizeof(mk_cuda_apiece) * P * (size_t)(c->n_layers + c->n_mtp);
    for (int l = 0; l < 2; l++) { /* 0: max_rows rows, 1: max_pieces rows (ids_compact) */
        const size_t rows = l ? (P < Tm ? P : Tm) : Tm;
        w->layout_rows[l] = (int)rows;
        w->draw_off_l[l] = (sizeof(int32_t) * (3 * rows + P * w->tbl_cap) + 255) & ~(size_t)255;
        w->ids_bytes_l[l] = w->draw_off_l[l] + ((sizeof(mk_sample_draw) * P + 255) & ~(size_t)255);
    }
    w->ids_bytes = w->ids_bytes_l[0];
    for (int h = 0; h < 2; h++) {
        if (h && !step_io()) {
            w->ids_full[1] = w->ids_full[0], w->ids_small[1] = w->ids_small[0];
            break;
        }
        WA(w->ids_full[h], w->ids_bytes_l[0] + apc_bytes);
        WA(w->ids_small[h], w->ids_bytes_l[1] + apc_bytes);
    }
    WA(w->xd, F(Tm * d));
    WA(w->act, F(Tm * K * I));
    WA(w->actd, F(Tm * K * I));
    WA(w->eo, F(Tm * K * d));
    WA(w->sg, F(Tm * I));
    WA(w->su, F(Tm * I));
    WA(w->seo, F(Tm * d));
    {
        size_t mq = Tm * (size_t)K * I > Tm * (size_t)d ? Tm * (size_t)K * I : Tm * (size_t)d;
        WA(w->mxq, mq);
        WA(w->msa, F(mq / 128 + 1));
    }
    WA(w->hl, F(P * hc * d));
    WA(w->xl, F(P * d));
    WA(w->logits, F(P * c->vocab));
    WA(w->am_buf[0], sizeof(int32_t) * P);
    if (step_io()) {
        WA(w->am_buf[1], sizeof(int32_t) * P);
    } else {
        w->am_buf[1] = w->am_buf[0];
    }
    WA(w->sws, F(P * c->vocab));
    if (w->with_mtp) {
        WA(w->me, F(Tm * d));
        WA(w->mhn, F(Th * d));
        WA(w->mhp, F(Th * d));
        WA(w->mh, F(Th * d));
    }
#undef WA
    if (rc) {
        dsv4_cuda_work_free(w);
        return rc;
    }
    /* linear scratch: the largest need of any weight at its largest row count */
    size_t lb = 0;
    for (int l = 0; l <= c->n_layers; l++) {
        const glayer *L = l < c->n_layers ? &g->layers[l] : (w->with_mtp ? &g->mtp : NULL);
        if (!L) break;
        const mk_wmat *ws[] = {&L->wq_a, &L->wq_b, &L->wkv, &L->wo_a, &L->wo_b, &L->gate, &L->sh1,
                               &L->sh2, &L->sh3, &L->cmp.wkv, &L->cmp.wgate, &L->idx_cmp.wkv,
                               &L->idx_cmp.wgate, &L->idx_wq_b, &L->idx_wproj, &L->e_proj, &L->h_proj};
        for (int i = 0; i < 17; i++) {
            if (!ws[i]->w) continue;
            size_t b = mk_cuda_linear_scratch(g->ctx, ws[i], (int)(ws[i] == &L->h_proj ? Th : Tm));
            if (b > lb) lb = b;
        }
        if (L->wo_a.w) { /* wo_a as one grouped launch */
            size_t b = mk_cuda_linear_grouped_scratch(g->ctx, &L->wo_a, c->o_groups, (int)Tm);
            if (b > lb) lb = b;
        }
        const mk_wmat *pairs[][2] = {{&L->wq_a, &L->wkv},         {&L->sh1, &L->sh3},
                                     {&L->wq_b, &L->idx_wq_b},    {&L->cmp.wkv, &L->cmp.wgate},
                                     {&L->idx_cmp.wkv, &L->idx_cmp.wgate}}; /* together */
        for (int i = 0; i < 5; i++) {
            if (!pairs[i][0]->w || !pairs[i][1]->w) continue;
            size_t b = mk_cuda_linear_pair_scratch(g->ctx, pairs[i][0], pairs[i][1], (int)Tm);
            if (b > lb) lb = b;
        }
    }
    size_t hb = mk_cuda_linear_scratch(g->ctx, &g->head, (int)P);
    if (hb > lb) lb = hb;
    w->lin_bytes = lb;
    rc = walloc(w, lb, &w->lin, err);
    { /* the side branch's: the compressors' projections and the shared expert of at most 8 rows */
        const int m8 = Tm < 8 ? (int)Tm : 8;
        size_t sb = 0;
        for (int l = 0; l < c->n_layers; l++) {
            const glayer *L = &g->layers[l];
            const mk_wmat *ws[] = {&L->cmp.wkv, &L->cmp.wgate, &L->idx_cmp.wkv, &L->idx_cmp.wgate, &L->idx_wproj};
            for (int i = 0; i < 5; i++) {
                if (!ws[i]->w) continue;
                size_t b = mk_cuda_linear_scratch(g->ctx, ws[i], m8);
                if (b > sb) sb = b;
            }
            const mk_wmat *pairs[][2] = {{&L->cmp.wkv, &L->cmp.wgate}, {&L->idx_cmp.wkv, &L->idx_cmp.wgate},
                                         {&L->sh1, &L->sh3}};
            if (L->sh2.w) { /* and the shared expert's */
                size_t b = mk_cuda_linear_scratch(g->ctx, &L->sh2, m8);
                if (b > sb) sb = b;
            }
            for (int i = 0; i < 3; i++) {
                if (!pairs[i][0]->w || !pairs[i][1]->w) continue;
                size_t b = mk_cuda_linear_pair_scratch(g->ctx, pairs[i][0], pairs[i][1], m8);
                if (b > sb) sb = b;
            }
        }
        w->lin_side_bytes = sb;
        if (!rc && sb) rc = walloc(w, sb, &w->lin_side, err);
    }
    w->adj_cap = P * MK_SAMPLE_ADJ_MAX;
    if (!rc) rc = walloc(w, sizeof(mk_sample_adj) * w->adj_cap, &w->adj, err);
    for (int h = 0; h < 2; h++) {
        if (!rc) rc = mk_cuda_host_alloc(w->ids_bytes + apc_bytes, (void **)&w->hids_buf[h], err);
        if (!rc) rc = mk_cuda_host_alloc(sizeof(mk_sample_adj) * w->adj_cap, (void **)&w->hadj_buf[h], err);
        /* page-locked: a copy to pageable memory returns only when it has run, which would hold the
         * host until the step ends and undo the lookahead of dsv4_cuda_batch_launch */
        if (!rc) rc = mk_cuda_host_alloc(sizeof(int32_t) * P, (void **)&w->ham_buf[h], err);
    }
    if (!rc) rc = pend_create(w, P, err);
    w->prev_seq = calloc(P, sizeof *w->prev_seq);
    w->feed_src = calloc(P, sizeof *w->feed_src);
    w->cnt_save = malloc(sizeof(int) * 2 * (size_t)max_pieces * (c->n_layers + 1));
    if (!rc && (!w->ham_buf[0] || !w->ham_buf[1] || !w->prev_seq || !w->feed_src || !w->cnt_save))
        rc = mk_fail(err, MK_ENOMEM, "out of memory");
    w->oldest = -1;
    if (!rc) set_layout(w, 0);
    if (!rc && with_hooks) {
        size_t hn = Th * d;
        if ((size_t)c->vocab > hn) hn = c->vocab;
        if (Tm * n_ent > hn) hn = Tm * n_ent;
        if (Tm * HD > hn) hn = Tm * HD;
        if ((size_t)n_ent * D > hn) hn = (size_t)n_ent * D;
        w->hh_n = hn;
        w->hh = malloc(F(hn));
        w->hf = malloc(F(Tm + 16));
        size_t ni = Tm * K;
        if (Tm * w->sel_cap > ni) ni = Tm * w->sel_cap;
        w->hi = malloc(sizeof(int32_t) * (ni + 16));
        if (!w->hh || !w->hf || !w->hi) rc = mk_fail(err, MK_ENOMEM, "out of memory");
    }
    if (rc) {
        dsv4_cuda_work_free(w);
        return rc;
    }
    *out = w;
    return MK_OK;
}

int dsv4_cuda_work_create(dsv4_cuda *g, int max_rows, int max_pieces, int max_len, dsv4_cuda_work **out,
                          mk_err *err) {
    return work_create(g, max_rows, max_pieces, max_len, 0, 0, out, err);
}

void dsv4_cuda_work_free(dsv4_cuda_work *w) {
    if (!w) return;
    if (w->upl_pending[0] || w->upl_pending[1] || w->n_pending) {
        mk_err e2;
        mk_cuda_ctx_sync(w->g->ctx, &e2);
    }
    for (int i = 0; i < GRAPH_SLOTS; i++) mk_cuda_graph_free(w->graphs[i].g);
    free(w->cnt_save);
    dfree(w->g->ctx, &w->mem);
    for (int h = 0; h < 2; h++) {
        mk_cuda_host_free(w->hids_buf[h]);
        mk_cuda_host_free(w->hadj_buf[h]);
        mk_cuda_host_free(w->ham_buf[h]);
    }
    pend_free(w);
    free(w->prev_seq);
    free(w->feed_src);
    free(w->hh);
    free(w->hf);
    free(w->hi);
    free(w);
}

size_t dsv4_cuda_work_bytes(const dsv4_cuda_work *w) { return w->bytes; }

struct dsv4_cuda_seq {
    dsv4_cuda *g;
    int max_len, pos, mtp_pos, n_last;
    gstate ls[DSV4_MAX_LAYERS + 1];
    dsv4_cuda_pool *pool;
    dsv4_cuda_work *work;      /* standalone: its own (with MTP and hooks); paged: NULL */
    int own;                   /* pool and work are this sequence's */
    int *blocks, n_blocks, cap_blocks;
    int broken;                /* a call failed after its checks: state undefined until reset/restore */
    dsv4_hooks hooks;
    size_t bytes;
    dlist mem;
};

static int seq_new(dsv4_cuda *g, int max_len, dsv4_cuda_seq **out, mk_err *err) {
    *out = NULL;
    if (max_len <= 0) max_len = g->m->max_seq_len;
    if (max_len > g->m->max_seq_len)
        return mk_fail(err, MK_ERANGE, "sequence length %d exceeds the model's max_seq_len %d", max_len,
                       g->m->max_seq_len);
    const dsv4_config *c = &g->m->cfg;
    dsv4_cuda_seq *s = calloc(1, sizeof *s);
    if (!s) return mk_fail(err, MK_ENOMEM, "out of memory");
    s->g = g;
    s->max_len = max_len;
    s->cap_blocks = max_len / DSV4_BLOCK_TOKENS + 1;
    s->blocks = calloc((size_t)s->cap_blocks, sizeof *s->blocks);
    int rc = s->blocks ? MK_OK : mk_fail(err, MK_ENOMEM, "out of memory");
    int D = c->head_dim, ID = c->index_head_dim;
    for (int l = 0; l < c->n_layers + c->n_mtp && !rc; l++) {
        int r = c->compress_ratio[l], coff = r == 4 ? 2 : 1;
        gstate *st = &s->ls[l];
        size_t sb[5] = {F((size_t)c->window * D), r ? F((size_t)coff * r * coff * D) : 0,
                        r ? F((size_t)coff * r * coff * D) : 0, r == 4 ? F((size_t)16 * ID) : 0,
                        r == 4 ? F((size_t)16 * ID) : 0};
        float **dst[5] = {&st->win, &st->kv_state, &st->sc_state, &st->ikv_state, &st->isc_state};
        for (int i = 0; i < 5 && !rc; i++) {
            if (!sb[i]) continue;
            s->bytes += sb[i];
            rc = dalloc(g->ctx, &s->mem, sb[i], dst[i], err);
        }
    }
    if (rc) {
        dsv4_cuda_seq_free(s);
        return rc;
    }
    *out = s;
    return MK_OK;
}

int dsv4_cuda_seq_create(dsv4_cuda *g, int max_len, int max_tok, dsv4_cuda_seq **out, mk_err *err) {
    dsv4_cuda_seq *s;
    TRY(seq_new(g, max_len, &s, err));
    if (max_tok <= 0 || max_tok > s->max_len) max_tok = s->max_len;
    s->own = 1;
    int nb = (s->max_len + DSV4_BLOCK_TOKENS - 1) / DSV4_BLOCK_TOKENS;
    int rc = pool_create(g, nb, 0, &s->pool, err);
    if (!rc) rc = work_create(g, max_tok, 1, s->max_len, 1, 1, &s->work, err);
    if (!rc) {
        for (int b = 0; b < nb; b++) s->blocks[b] = b;
        s->n_blocks = nb;
        rc = dsv4_cuda_seq_reset(s, err);
    }
    if (!rc) rc = mk_cuda_ctx_sync(g->ctx, err);
    if (rc) {
        dsv4_cuda_seq_free(s);
        return rc;
    }
    *out = s;
    return MK_OK;
}

int dsv4_cuda_seq_create_paged(dsv4_cuda *g, int max_len, dsv4_cuda_pool *pool, dsv4_cuda_seq **out, mk_err *err) {
    dsv4_cuda_seq *s;
    if (!pool || pool->g != g) return mk_fail(err, MK_EINVAL, "cuda: paged sequence without its model's pool");
    TRY(seq_new(g, max_len, &s, err));
    s->pool = pool;
    int rc = dsv4_cuda_seq_reset(s, err);
    if (rc) {
        dsv4_cuda_seq_free(s);
        return rc;
    }
    *out = s;
    return MK_OK;
}

size_t dsv4_cuda_seq_bytes(const dsv4_cuda_seq *s) { return s->bytes; }

void dsv4_cuda_seq_free(dsv4_cuda_seq *s) {
    if (!s) return;
    dfree(s->g->ctx, &s->mem);
    if (s->own) {
        dsv4_cuda_pool_free(s->pool);
        dsv4_cuda_work_free(s->work);
    }
    free(s->blocks);
    free(s);
}

/* Fresh state of one layer: compressor scores -inf (the first group's "previous" slots weigh 0). */
static int layer_reset(dsv4_cuda_seq *s, int l, mk_err *err) {
    const dsv4_config *c = &s->g->m->cfg;
    mk_cuda_ctx *ctx = s->g->ctx;
    int D = c->head_dim, ID = c->index_head_dim, r = c->compress_ratio[l], coff = r == 4 ? 2 : 1;
    gstate *st = &s->ls[l];
    st->n_ckv = st->n_ikv = 0;
    TRY(mk_cuda_memset(ctx, st->win, 0, F((size_t)c->window * D), err));
    if (r) {
        size_t n = (size_t)coff * r * coff * D;
        TRY(mk_cuda_memset(ctx, st->kv_state, 0, F(n), err));
        TRY(mk_cuda_fill(ctx, st->sc_state, n, -INFINITY, err));
    }
    if (r == 4) {
        TRY(mk_cuda_memset(ctx, st->ikv_state, 0, F((size_t)16 * ID), err));
        TRY(mk_cuda_fill(ctx, st->isc_state, (size_t)16 * ID, -INFINITY, err));
    }
    return MK_OK;
}

int dsv4_cuda_seq_reset(dsv4_cuda_seq *s, mk_err *err) {
    const dsv4_config *c = &s->g->m->cfg;
    for (int l = 0; l < c->n_layers + c->n_mtp; l++) TRY(layer_reset(s, l, err));
    s->pos = s->mtp_pos = s->n_last = 0;
    s->broken = 0;
    return MK_OK;
}

int dsv4_cuda_seq_pos(const dsv4_cuda_seq *s) { return s->pos; }

void dsv4_cuda_seq_set_hooks(dsv4_cuda_seq *s, const dsv4_hooks *h) {
    if (h) s->hooks = *h;
    else memset(&s->hooks, 0, sizeof s->hooks);
}

int dsv4_cuda_seq_bind(dsv4_cuda_seq *s, const int *blocks, int n_blocks, mk_err *err) {
    if (s->own) return mk_fail(err, MK_EINVAL, "cuda: a standalone sequence has its own block table");
    if (n_blocks < 0 || n_blocks > s->cap_blocks)
        return mk_fail(err, MK_ERANGE, "cuda: block table of %d entries (room for %d)", n_blocks, s->cap_blocks);
    for (int b = 0; b < n_blocks; b++)
        if (blocks[b] < 0 || blocks[b] >= s->pool->n_blocks)
            return mk_fail(err, MK_ERANGE, "cuda: block table entry %d is %d (pool of %d)", b, blocks[b],
                           s->pool->n_blocks);
    if (n_blocks) memcpy(s->blocks, blocks, sizeof(int) * (size_t)n_blocks);
    s->n_blocks = n_blocks;
    return MK_OK;
}

static uint8_t *blk(const dsv4_cuda_seq *s, int b) {
    return s->pool->base + (size_t)s->blocks[b] * s->pool->lay.bytes;
}

/* Compressor state slots [0, r) (first D channels of kv, then of score) <-> a block's cst region. */
static int state_snap(mk_cuda_ctx *ctx, float *dst, const float *kv, const float *sc, int W2, int D, int r,
                      mk_err *err) {
    TRY(mk_cuda_copy2d(ctx, dst, F(D), kv, F(W2), F(D), (size_t)r, err));
    return mk_cuda_copy2d(ctx, dst + (size_t)r * D, F(D), sc, F(W2), F(D), (size_t)r, err);
}

int dsv4_cuda_seq_restore(dsv4_cuda_seq *s, int pos, mk_err *err) {
    const dsv4_config *c = &s->g->m->cfg;
    mk_cuda_ctx *ctx = s->g->ctx;
    const dsv4_kv_layout *lay = &s->pool->lay;
    const int bt = lay->block_tokens, D = c->head_dim, ID = c->index_head_dim;
    if (!lay->snapshots) return mk_fail(err, MK_EINTERNAL, "restore: this sequence's blocks carry no snapshots");
    if (pos <= 0 || pos % bt || pos > s->max_len)
        return mk_fail(err, MK_EINTERNAL, "restore: position %d is not a block boundary in (0, %d]", pos, s->max_len);
    if (s->n_blocks < pos / bt)
        return mk_fail(err, MK_EINTERNAL, "restore: the block table (%d blocks) does not reach position %d",
                       s->n_blocks, pos);
    const uint8_t *b = blk(s, pos / bt - 1);
    for (int l = 0; l < c->n_layers; l++) {
        int r = c->compress_ratio[l];
        gstate *st = &s->ls[l];
        TRY(mk_cuda_bf16_to_f32(ctx, (const uint16_t *)(b + lay->win[l]), (size_t)c->window * D, st->win, err));
        st->n_ckv = r ? pos / r : 0;
        st->n_ikv = r == 4 ? pos / 4 : 0;
        if (r == 4) {
            const float *cs = (const float *)(b + lay->cst[l]), *ics = (const float *)(b + lay->icst[l]);
            TRY(mk_cuda_copy2d(ctx, st->kv_state, F(2 * D), cs, F(D), F(D), (size_t)r, err));
            TRY(mk_cuda_copy2d(ctx, st->sc_state, F(2 * D), cs + (size_t)r * D, F(D), F(D), (size_t)r, err));
            TRY(mk_cuda_copy2d(ctx, st->ikv_state, F(2 * ID), ics, F(ID), F(ID), 4, err));
            TRY(mk_cuda_copy2d(ctx, st->isc_state, F(2 * ID), ics + (size_t)4 * ID, F(ID), F(ID), 4, err));
        }
    }
    for (int l = c->n_layers; l < c->n_layers + c->n_mtp; l++) TRY(layer_reset(s, l, err));
    s->pos = pos;
    s->mtp_pos = s->n_last = 0;
    s->broken = 0;
    return MK_OK;
}

/* ---- the forward pass ----------------------------------------------------------------------- */

typedef struct {
    dsv4_cuda_seq *s;
    int T, start, row0, k_sel;
    const int32_t *dtbl; /* the block table on the device */
    float *logits;       /* host, or NULL */
    int32_t *argmax;     /* host, or NULL: the argmax of the logits row instead of the row */
    const mk_sample_draw *draw; /* with argmax, or NULL: that draw's token instead of the argmax */
} gpiece;

/* One call's context: the scratch, the pieces, and the hooks (a single-piece call only). */
typedef struct {
    dsv4_cuda *g;
    mk_cuda_ctx *ctx;
    dsv4_cuda_work *w;
    gpiece *pc;
    int np, R;
    const dsv4_hooks *hk;
    int no_sync;   /* queue the head's kernels only: no copies to the host, no wait (graph capture) */
    int xproj;     /* this layer's bf16 projections of x are done (xproj()): the compressors' into
                      ckvp / cscp and ickvp / icscp, the indexer's weights into iw */
    int iq_prep;   /* this layer's indexer queries are prepared already (mk_cuda_attn_prep), and
                      the indexer's scores scale its head weights (tuning attn_prep) */
    int replay_bad; /* a launch decided on the host from the positions was queued (see run_graph) */
    int side;      /* queuing the side branch (tuning branch): linears use w->lin_side */
    int cmp_done;  /* this layer's compressors (projections and steps) ran on the side branch */
    double t_mark; /* phase profiling: the last mark */
    int32_t *ham;  /* the host half the head's argmax ints come back into */
    int defer;     /* a replayed graph's head copies are queued, not waited for (dsv4_cuda_batch_launch) */
    int deferred;  /* and they were */
} gcall;

/* A call of one staging half, launched (dsv4_cuda_batch_launch) and maybe not waited for yet. */
struct gpend {
    gcall C;
    gpiece *pc;          /* [max_pieces] */
    int pending;         /* launched, not waited for */
    int queued;          /* its head's copies and the event `done` were queued (else it ran to the end) */
    mk_cuda_event *done; /* recorded after the call's copies to the host */
    mk_cuda_event *up;   /* step_io: its ids uploaded (the main stream waits for it) */
    mk_cuda_event *end;  /* step_io: its kernels ran (the download stream waits for it) */
};

static int pend_create(dsv4_cuda_work *w, size_t max_pieces, mk_err *err) {
    w->call = calloc(2, sizeof *w->call);
    if (!w->call) return mk_fail(err, MK_ENOMEM, "out of memory");
    for (int h = 0; h < 2; h++) {
        w->call[h].pc = calloc(max_pieces, sizeof *w->call[h].pc);
        if (!w->call[h].pc) return mk_fail(err, MK_ENOMEM, "out of memory");
        TRY(mk_cuda_event_create(&w->call[h].done, err));
        TRY(mk_cuda_event_create(&w->call[h].up, err));
        TRY(mk_cuda_event_create(&w->call[h].end, err));
    }
    return MK_OK;
}

static void pend_free(dsv4_cuda_work *w) {
    for (int h = 0; w->call && h < 2; h++) {
        free(w->call[h].pc);
        mk_cuda_event_free(w->call[h].done);
        mk_cuda_event_free(w->call[h].up);
        mk_cuda_event_free(w->call[h].end);
    }
    free(w->call);
    w->call = NULL;
}

/* ---- phase profile (MINKE_CUDA_PROFILE=1) ------------------------------------------------------
 * Each mark synchronizes the stream and charges the time since the previous mark (device work and
 * the host's launch overhead alike) to a named phase. Off by default: a mark is then one branch.
 * Single-threaded use (benchmarks). */
#define PH_MAX 24
static struct {
    int on;
    int n;
    const char *name[PH_MAX];
    double s[PH_MAX];
    long calls[PH_MAX];
} g_prof = {-1, 0, {0}, {0}, {0}};

static double ph_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int prof_on(void) {
    if (g_prof.on < 0) {
        const char *e = getenv("MINKE_CUDA_PROFILE");
        g_prof.on = e && *e && strcmp(e, "0");
    }
    return g_prof.on;
}

static void mark(gcall *C, const char *phase) {
    if (!prof_on()) return;
    mk_err e;
    mk_cuda_ctx_sync(C->ctx, &e);
    double t = ph_now();
    int i = 0;
    while (i < g_prof.n && strcmp(g_prof.name[i], phase)) i++;
    if (i == g_prof.n && g_prof.n < PH_MAX) g_prof.name[g_prof.n++] = phase;
    if (i < PH_MAX) {
        g_prof.s[i] += t - C->t_mark;
        g_prof.calls[i]++;
    }
    C->t_mark = t;
}

void dsv4_cuda_profile_report(void *file, const char *title) {
    FILE *f = file;
    if (!prof_on() || !g_prof.n) return;
    double tot = 0;
    for (int i = 0; i < g_prof.n; i++) tot += g_prof.s[i];
    fprintf(f, "\n%s: phase profile (MINKE_CUDA_PROFILE, synchronized marks), total %.2f ms\n\n", title, tot * 1e3);
    fprintf(f, "| phase | ms | share |\n| --- | --- | --- |\n");
    for (int i = 0; i < g_prof.n; i++)
        fprintf(f, "| %s | %.2f | %.1f%% |\n", g_prof.name[i], g_prof.s[i] * 1e3, tot > 0 ? 100 * g_prof.s[i] / tot : 0);
    g_prof.n = 0;
}

static mk_cuda_paged paged(const gpiece *p, size_t off, int epb) {
    mk_cuda_paged q = {p->s->pool->base, p->dtbl, p->s->pool->lay.bytes, off, epb};
    return q;
}

static int lin_f(gcall *C, int flags, const mk_wmat *W, const float *x, int m, float *y, int round, mk_err *err) {
    return mk_cuda_linear_ex(C->ctx, MK_CUDA_K_AUTO, flags | MK_CUDA_LIN_ROW_INVARIANT, W, x, m, y, round, C->w->lin,
                             C->w->lin_bytes, err);
}

static int lin(gcall *C, const mk_wmat *W, const float *x, int m, float *y, int round, mk_err *err) {
    return lin_f(C, 0, W, x, m, y, round, err);
}

/* A wait for the stream: after it, both staging halves are free again. */
static int work_sync(dsv4_cuda_work *w, mk_err *err) {
    TRY(mk_cuda_ctx_sync(w->g->ctx, err));
    w->upl_pending[0] = w->upl_pending[1] = 0;
    return MK_OK;
}

/* The wait at the end of a call. */
static int sync_call(gcall *C, mk_err *err) { return work_sync(C->w, err); }

/* Uploads the call's ids / block tables / attention pieces from the page-locked staging buffer
 * without waiting: the first kernel waits for it in the stream, the host goes on launching. */
static int upload_ids(dsv4_cuda_work *w, size_t bytes, mk_err *err) {
    if (w->io) { /* on the upload stream; the main stream waits for it (step_io) */
        mk_cuda_event *up = w->call[w->half].up;
        TRY(mk_cuda_copy_on(w->g->ctx, MK_CUDA_S_UP, w->ids, w->hids, bytes, err));
        TRY(mk_cuda_event_record_on(w->g->ctx, MK_CUDA_S_UP, up, err));
        TRY(mk_cuda_stream_wait_on(w->g->ctx, MK_CUDA_S_MAIN, up, err));
        w->upl_pending[w->half] = 1;
        return MK_OK;
    }
    TRY(mk_cuda_upload_async(w->g->ctx, w->ids, w->hids, bytes, err));
    w->upl_pending[w->half] = 1;
    return MK_OK;
}

/* Before a call writes the host staging: the other half becomes the current one. Its last upload
 * may still be queued only if its call was launched and not waited for (an error: at most one call
 * is left unwaited when the next is launched) or failed (then a wait for the stream). */
static int staging_next(dsv4_cuda_work *w, mk_err *err) {
    const int h = w->half ^ 1;
    if (w->call[h].pending)
        return mk_fail(err, MK_EINTERNAL, "cuda: a third call launched while two are not waited for");
    use_half(w, h);
    w->io = 0;
    return w->upl_pending[h] ? work_sync(w, err) : MK_OK;
}

/* Test mode: a named intermediate (dsv4.c's names) copied to the host for the dump hook. */
static int dumpv(gcall *C, const float *dev, int64_t a, int64_t b, int64_t c3, mk_err *err, const char *fmt,
                 int layer) {
    if (!C->hk || !C->hk->dump) return MK_OK;
    size_t n = (size_t)a * (size_t)b * (size_t)(c3 ? c3 : 1);
    if (n > C->w->hh_n) return MK_OK;
    TRY(mk_cuda_download(C->ctx, C->w->hh, dev, F(n), err));
    char name[48];
    snprintf(name, sizeof name, fmt, layer);
    int64_t sh[3] = {a, b, c3};
    C->hk->dump(C->hk->ctx, name, C->w->hh, c3 ? 3 : 2, sh);
    return MK_OK;
}

/* Test mode: every compressed entry of layer l (gathered from the blocks) to the dump hook. */
static int dump_entries(gcall *C, const gpiece *p, int layer, size_t off, int r, int n, int D, mk_err *err) {
    if (!C->hk || !C->hk->dump || !n || (size_t)n * D > C->w->hh_n) return MK_OK;
    int epb = DSV4_BLOCK_TOKENS / r;
    for (int e = 0; e < n; e += epb) {
        int cnt = n - e < epb ? n - e : epb;
        TRY(mk_cuda_download(C->ctx, C->w->hh + (size_t)e * D, blk(p->s, e / epb) + off, F((size_t)cnt * D), err));
    }
    char name[48];
    snprintf(name, sizeof name, "L%d.attn.ckv", layer);
    int64_t sh[3] = {n, D, 0};
    C->hk->dump(C->hk->ctx, name, C->w->hh, 2, sh);
    return MK_OK;
}

/* New compressed entries of a compressor: rmsnorm, RoPE, then the indexer (Hadamard + FP4) or
 * attention (FP8 of the nope dims) simulation; the pooling already rounded them to bf16. */
static int cmp_finish(gcall *C, const glayer *L, const gcmp *Cm, int is_idx, float *e, int n, int pos0,
                      mk_err *err) {
    const dsv4_config *c = &C->g->m->cfg;
    int D = Cm->D, rd = c->rope_dim;
    if (n <= 0) return MK_OK;
    TRY(mk_cuda_rmsnorm(C->ctx, e, n, D, Cm->norm, c->norm_eps, e, err));
    TRY(mk_cuda_rope_step(C->ctx, e + D - rd, n, D, rd, L->rope, pos0, Cm->ratio, 0, err));
    if (is_idx) {
        TRY(mk_cuda_hadamard(C->ctx, e, n, D, 1.0f / sqrtf((float)D), err));
        TRY(mk_cuda_quant_sim(C->ctx, e, n, D, D, 32, 1, e, err));
    } else {
        TRY(mk_cuda_quant_sim(C->ctx, e, n, D, D - rd, 64, 0, e, err));
    }
    return MK_OK;
}

/* Entries [n0, n0 + n) of one region (offset off, epb per block) <- src [n, D]. */
static int put_entries(gcall *C, const dsv4_cuda_seq *s, size_t off, int epb, int D, int n0, int n, const float *src,
                       mk_err *err) {
    for (int i = 0; i < n;) {
        int e = n0 + i, cnt = epb - e % epb;
        if (cnt > n - i) cnt = n - i;
        float *dst = (float *)(blk(s, e / epb) + off) + (size_t)(e % epb) * D;
        TRY(mk_cuda_copy(C->ctx, dst, src + (size_t)i * D, F((size_t)cnt * D), err));
        i += cnt;
    }
    return MK_OK;
}

/* A compressor (the attention's, or with is_idx the indexer's) over the call's rows x: the
 * projections of all pieces in one call each, then per piece its pooling state. A one-token piece
 * goes through the state slots (the reference's decode rule); a longer one pools from E = [the
 * state's rows before the call | the call's rows] (the prefill rule over the same rows in the same
 * order: the same bits), then keeps the rows the next call needs. New entries go to the piece's
 * blocks; with snapshots, an overlap compressor's state slots [0, r) go to every block end. */
static int compressor(gcall *C, int layer, const glayer *L, const gcmp *Cm, int is_idx, const float *x,
                      mk_err *err) {
    const dsv4_config *c = &C->g->m->cfg;
    mk_cuda_ctx *ctx = C->ctx;
    dsv4_cuda_work *w = C->w;
    const int r = Cm->ratio, D = Cm->D, W2 = Cm->coff * D, ov = Cm->coff == 2, bt = DSV4_BLOCK_TOKENS;
    float *ckvp = is_idx && C->xproj ? w->ickvp : w->ckvp, *cscp = is_idx && C->xproj ? w->icscp : w->cscp;
    /* wkv and wgate on the same x: its preparation (bf16 conversion) done once for both */
    if (!C->xproj)
        TRY(mk_cuda_linear_pair(ctx, MK_CUDA_LIN_ROW_INVARIANT, &Cm->wkv, &Cm->wgate, x, C->R, ckvp, cscp, 0,
                                C->side ? w->lin_side : w->lin, C->side ? w->lin_side_bytes : w->lin_bytes, err));
    /* every one-token piece's state slot in one launch, with the entry it completes where the
     * kernel takes the shape (the device decides which pieces complete one: a decode step's launches
     * do not depend on the positions); the rest per piece */
    const int nL = c->n_layers + c->n_mtp;
    const size_t eoff = is_idx ? C->pc[0].s->pool->lay.ikv[layer] : C->pc[0].s->pool->lay.ckv[layer];
    int st1 = mk_cuda_cmp_step_multi(ctx, w->apc + layer, C->np, nL, is_idx, ckvp, cscp, W2, D, Cm->ape, r, ov,
                                     Cm->norm, c->norm_eps, c->rope_dim, L->rope, is_idx, 1.0f / sqrtf((float)D),
                                     paged(&C->pc[0], eoff, bt / r), err);
    const int stepped = st1 == MK_OK;
    if (!stepped) C->replay_bad = 1;
    if (st1 == MK_ENOTSUP)
        TRY(mk_cuda_cmp_put_multi(ctx, w->apc + layer, C->np, nL, is_idx, ckvp, cscp, W2, Cm->ape, r, ov, err));
    else TRY(st1);
    for (int pi = 0; pi < C->np; pi++) {
        const gpiece *p = &C->pc[pi];
        dsv4_cuda_seq *s = p->s;
        gstate *st = &s->ls[layer];
        const int T = p->T, start = p->start, epb = bt / r;
        const dsv4_kv_layout *lay = &s->pool->lay;
        const int snap = lay->snapshots && layer < c->n_layers && ov;
        const size_t off = is_idx ? lay->ikv[layer] : lay->ckv[layer];
        const size_t soff = is_idx ? lay->icst[layer] : lay->cst[layer];
        int *n_cache = is_idx ? &st->n_ikv : &st->n_ckv;
        float *kvs = is_idx ? st->ikv_state : st->kv_state, *scs = is_idx ? st->isc_state : st->sc_state;
        float *kvp = ckvp + (size_t)p->row0 * W2, *scp = cscp + (size_t)p->row0 * W2;
        if (T == 1) { /* its state slot (and with stepped, its entry) was written above */
            if ((start + 1) % r) continue;
            if (start + 1 - r >= L->rope->max_pos)
                return mk_fail(err, MK_ERANGE, "cuda: compressor entry at position %d past the rope table's %d",
                               start + 1 - r, L->rope->max_pos);
            if (stepped) {
                if (*n_cache != (start + 1) / r - 1)
                    return mk_fail(err, MK_EINTERNAL, "cuda: compressor of layer %d: %d entries before position %d",
                                   layer, *n_cache, start);
                (*n_cache)++;
                if (snap && (start + 1) % bt == 0)
                    TRY(state_snap(ctx, (float *)(blk(s, start / bt) + soff), kvs, scs, W2, D, r, err));
                continue;
            }
            TRY(mk_cuda_cmp_pool(ctx, kvs, scs, W2, D, r, ov, 0, 1, w->ents, err));
            if (ov) {
                TRY(mk_cuda_copy(ctx, kvs, kvs + (size_t)r * W2, F((size_t)r * W2), err));
                TRY(mk_cuda_copy(ctx, scs, scs + (size_t)r * W2, F((size_t)r * W2), err));
            }
            TRY(cmp_finish(C, L, Cm, is_idx, w->ents, 1, start + 1 - r, err));
            TRY(put_entries(C, s, off, epb, D, *n_cache, 1, w->ents, err));
            (*n_cache)++;
            if (snap && (start + 1) % bt == 0)
                TRY(state_snap(ctx, (float *)(blk(s, start / bt) + soff), kvs, scs, W2, D, r, err));
            continue;
        }
        TRY(mk_cuda_add_ape(ctx, scp, T, W2, Cm->ape, r, start, err));
        const int pre = (ov ? r : 0) + start % r, a = start - pre;
        const int g0 = start / r, g1 = (start + T) / r, ng = g1 - g0, rem = (start + T) % r;
        TRY(mk_cuda_copy(ctx, w->ekv, kvs, F((size_t)pre * W2), err));
        TRY(mk_cuda_copy(ctx, w->esc, scs, F((size_t)pre * W2), err));
        TRY(mk_cuda_copy(ctx, w->ekv + (size_t)pre * W2, kvp, F((size_t)T * W2), err));
        TRY(mk_cuda_copy(ctx, w->esc + (size_t)pre * W2, scp, F((size_t)T * W2), err));
        if (ng > 0) {
            size_t g0row = (size_t)(ov ? r : 0) * W2;
            TRY(mk_cuda_cmp_pool(ctx, w->ekv + g0row, w->esc + g0row, W2, D, r, ov, 1, ng, w->ents, err));
            TRY(cmp_finish(C, L, Cm, is_idx, w->ents, ng, g0 * r, err));
            TRY(put_entries(C, s, off, epb, D, *n_cache, ng, w->ents, err));
            *n_cache += ng;
            for (int e = (start / bt + 1) * bt - 1; snap && e < start + T; e += bt) {
                size_t i = (size_t)((e + 1) / r - 1) * r - a;
                TRY(state_snap(ctx, (float *)(blk(s, e / bt) + soff), w->ekv + i * W2, w->esc + i * W2, W2, D, r, err));
            }
        }
        if (ov && g1 >= 1) {
            size_t i = (size_t)(g1 - 1) * r - a;
            TRY(mk_cuda_copy(ctx, kvs, w->ekv + i * W2, F((size_t)r * W2), err));
            TRY(mk_cuda_copy(ctx, scs, w->esc + i * W2, F((size_t)r * W2), err));
        }
        if (rem) {
            size_t i = (size_t)g1 * r - a, slot = ov ? r : 0;
            TRY(mk_cuda_copy(ctx, kvs + slot * W2, w->ekv + i * W2, F((size_t)rem * W2), err));
            TRY(mk_cuda_copy(ctx, scs + slot * W2, w->esc + i * W2, F((size_t)rem * W2), err));
        }
    }
    return MK_OK;
}

/* The layer's projections of its attention input x by the compressor (wkv, wgate) and, with the
 * indexer (ratio 4), by its compressor and its weights projection, in one conversion and one launch
 * where they are bf16 GEMVs of one k and launch plan (mk_cuda_linear_multi; else one call each),
 * each output as its own call would give it. Sets C->xproj; the compressors and the indexer then
 * take their inputs from ckvp / cscp, ickvp / icscp and iw. */
static int xproj(gcall *C, const glayer *L, const float *x, mk_err *err) {
    dsv4_cuda_work *w = C->w;
    const mk_wmat *W[5];
    float *y[5];
    int rnd[5], n = 0;
    if (L->ratio == 4) {
        W[n] = &L->idx_cmp.wkv, y[n] = w->ickvp, rnd[n++] = 0;
        W[n] = &L->idx_cmp.wgate, y[n] = w->icscp, rnd[n++] = 0;
        W[n] = &L->idx_wproj, y[n] = w->iw, rnd[n++] = 1;
    }
    W[n] = &L->cmp.wkv, y[n] = w->ckvp, rnd[n++] = 0;
    W[n] = &L->cmp.wgate, y[n] = w->cscp, rnd[n++] = 0;
    for (int i = 0; i < n; i++)
        if (!W[i]->w) return MK_OK;
    if (L->ratio == 4 && 2 * (size_t)C->g->m->cfg.index_head_dim < (size_t)L->idx_cmp.wkv.n) return MK_OK;
    TRY(mk_cuda_linear_multi(C->ctx, MK_CUDA_LIN_ROW_INVARIANT, n, W, x, C->R, y, rnd, C->side ? w->lin_side : w->lin,
                             C->side ? w->lin_side_bytes : w->lin_bytes, err));
    C->xproj = 1;
    return MK_OK;
}

/* The indexer's score columns for a call whose pieces have at most n_all entries: rounded up to
 * IDX_COLS_STEP, at most the scratch's (columns past a piece's entries score -inf, the picks are
 * the same), so that a decode step's launches change every 4 IDX_COLS_STEP positions, not every 4. */
#define IDX_COLS_STEP 64
static int idx_cols(const dsv4_cuda_work *w, int n_all) {
    if (n_all <= 0) return 0;
    const int n = (n_all + IDX_COLS_STEP - 1) / IDX_COLS_STEP * IDX_COLS_STEP, cap = w->max_len / 4 + 1;
    return n < cap ? n : cap;
}

/* Lightning indexer of a CSA layer: per piece, up to index_topk entries per row into sel (rows of
 * the piece at row0, stride the piece's k_sel). */
static int indexer(gcall *C, int layer, const glayer *L, const float *x, mk_err *err) {
    const dsv4_config *c = &C->g->m->cfg;
    mk_cuda_ctx *ctx = C->ctx;
    dsv4_cuda_work *w = C->w;
    int IH = c->index_heads, ID = c->index_head_dim, rd = c->rope_dim, R = C->R;
    /* iq = idx_wq_b(qr) was computed by attention(), next to wq_b */
    /* RoPE, Hadamard, FP4 simulation of the queries (one launch; or done with the attention's q) */
    if (!C->iq_prep)
        TRY(mk_cuda_idx_q_prep(ctx, w->iq, R * IH, ID, rd, L->rope, w->pos, IH, 1.0f / sqrtf((float)ID), err));
    TRY(dumpv(C, w->iq, R, IH, ID, err, "L%d.idx.q", layer));
    if (!C->cmp_done) TRY(compressor(C, layer, L, &L->idx_cmp, 1, x, err));
    if (!C->xproj) TRY(lin(C, &L->idx_wproj, x, R, w->iw, 1, err));
    /* the head weights bf16(iw * wscale): here, or where the scores read them */
    float wscale = (float)(pow((double)ID, -0.5) * pow((double)IH, -0.5));
    if (!C->iq_prep) TRY(mk_cuda_scale_bf16(ctx, w->iw, (size_t)R * IH, wscale, err));
    /* every piece's scores and picks in two launches; the hooks (one piece) see its rows */
    int n_cap = 0;
    for (int pi = 0; pi < C->np; pi++) {
        gpiece *p = &C->pc[pi];
        const int n_all = (p->start + p->T) / 4;
        const int k = c->index_topk < n_all ? c->index_topk : n_all;
        p->k_sel = k > 0 ? k : 0;
        if (k > w->sel_cap) return mk_fail(err, MK_ERANGE, "cuda: indexer top-k %d over capacity %d", k, w->sel_cap);
        if (n_all > n_cap) n_cap = n_all;
    }
    if (!n_cap) return MK_OK;
    if (!(C->hk && C->hk->indexer)) n_cap = idx_cols(w, n_cap);
    const int nL = c->n_layers + c->n_mtp;
    TRY(mk_cuda_index_multi(ctx, w->apc + layer, C->np, nL, w->iq, w->iw, C->iq_prep ? wscale : 0.0f,
                            paged(&C->pc[0], C->pc[0].s->pool->lay.ikv[layer], DSV4_BLOCK_TOKENS / 4), R, IH, ID, n_cap,
                            w->isc, w->icnt, w->sel_cap, w->sel, err));
    if (C->hk && C->hk->indexer) {
        const gpiece *p = &C->pc[0];
        const int T = p->T, start = p->start, n_all = n_cap, k = p->k_sel;
        if (k > 0) {
            TRY(mk_cuda_download(ctx, w->hi, w->sel, sizeof(int32_t) * (size_t)T * k, err));
            TRY(mk_cuda_download(ctx, w->hh, w->isc, F((size_t)T * n_all), err));
            for (int t = 0; t < T; t++) {
                int vis = (start + t + 1) / 4 < n_all ? (start + t + 1) / 4 : n_all;
                C->hk->indexer(C->hk->ctx, layer, t, T, k, w->hi + (size_t)t * k, w->hh + (size_t)t * n_all, vis);
            }
            TRY(mk_cuda_upload(ctx, w->sel, w->hi, sizeof(int32_t) * (size_t)T * k, err));
            TRY(mk_cuda_index_clamp(ctx, w->sel, T, n_all, start, k, err));
        }
    }
    return MK_OK;
}

/* Where the linear W keeps its quantized input in the work's linear scratch, as an act_quant
 * output for the op that computes that input (0: W takes no quantized input). */
static int lin_in_q(gcall *C, const mk_wmat *W, mk_cuda_actq *aq) {
    mk_err e2 = {0};
    return mk_cuda_linear_xq(C->ctx, W, C->R, C->w->lin, C->w->lin_bytes, &aq->q, &aq->sa, &aq->perm, &e2) == MK_OK;
}

/* The L2 lane (tuning l2_lane, ops_cuda.h): the data of the weights W (in the order their linears
 * read them) requested into L2 on a second stream, after everything queued so far, while the main
 * stream runs the latency-bound kernels before those linears. Captured decode steps only (elsewhere
 * mk_cuda_lane_prefetch does nothing); a hint: no value depends on it. */
static int lane(gcall *C, const mk_wmat *const *W, int n, mk_err *err) {
    if (C->R > 8) return MK_OK;
    mk_cuda_span sp[MK_CUDA_LANE_SPANS];
    int k = 0;
    for (int i = 0; i < n && k < MK_CUDA_LANE_SPANS; i++) {
        if (W[i] && W[i]->w) sp[k++] = (mk_cuda_span){W[i]->w, mk_cuda_wmat_data_bytes(W[i])};
    }
    return mk_cuda_lane_prefetch(C->ctx, sp, k, err);
}

/* A layer's first linears: q / kv, q's second, the indexer's queries, the compressors' projections. */
static int lane_attn_in(gcall *C, const glayer *L, mk_err *err) {
    const mk_wmat *W[8] = {&L->wq_a, &L->wkv, &L->wq_b, L->ratio == 4 ? &L->idx_wq_b : NULL};
    return lane(C, W, 4, err);
}

/* Whether moe() runs the routed experts on the tensor cores from FP4-permuted activations in
 * w->mxq / w->msa (then the op computing its input may write them: see moe()). */
static int moe_fp4_mma(const dsv4_config *c, const glayer *L) {
    const int I = c->moe_inter, d = c->dim;
    return L->ekind == MK_W_FP4 && I % 128 == 0 && d % 128 == 0 && I % 16 == 0 && d % 16 == 0;
}

/* x_q: x was already quantized into wq_a's place in the linear scratch (lin_in_q). */
static int attention(gcall *C, int layer, const glayer *L, const float *x, int x_q, float *out, mk_err *err) {
    const dsv4_config *c = &C->g->m->cfg;
    mk_cuda_ctx *ctx = C->ctx;
    dsv4_cuda_work *w = C->w;
    const int H = c->n_heads, D = c->head_dim, rd = c->rope_dim, nope = D - rd, HD = H * D, R = C->R;
    const int G = c->o_groups, Dg = HD / G, win = c->window, r = L->ratio, bt = DSV4_BLOCK_TOKENS;
    /* the tuning's branch (a captured decode step of a compressed layer; mk_cuda_branch_begin says
     * whether it is on): the compressors' projections and steps on a side branch, beside the q / kv
     * path below. They read x and the pieces' tables, write only their own outputs, entries and
     * state slots, and take their own linear scratch; the main stream joins them before the indexer. */
    C->cmp_done = 0;
    if (r && R <= 8 && w->lin_side && !(C->hk && (C->hk->dump || C->hk->indexer))) {
        const int b = mk_cuda_branch_begin(ctx, err);
        if (b < 0) return b;
        if (b) {
            C->side = 1;
            C->xproj = 0;
            int st = xproj(C, L, x, err);
            if (!st && r == 4) st = compressor(C, layer, L, &L->idx_cmp, 1, x, err);
            if (!st) st = compressor(C, layer, L, &L->cmp, 0, x, err);
            C->side = 0;
            const int st2 = mk_cuda_branch_end(ctx, err);
            TRY(st);
            TRY(st2);
            C->cmp_done = 1;
        }
    }
    /* wq_a and wkv read x, wq_b and the indexer's wq_b read qr: each input is prepared (quantized)
     * once for both where the kinds agree */
    TRY(mk_cuda_linear_pair(ctx, MK_CUDA_LIN_ROW_INVARIANT | (x_q ? MK_CUDA_LIN_REUSE_X : 0), &L->wq_a, &L->wkv, x, R,
                            w->qr, w->kv, 1, w->lin, w->lin_bytes, err));
    /* q_norm, and where wq_b takes a quantized input, its quantization (the indexer's wq_b, of the
     * same kind and k, reuses it) in the same launch */
    mk_cuda_actq aqb;
    const int qb = lin_in_q(C, &L->wq_b, &aqb) && (r != 4 || (L->idx_wq_b.kind == L->wq_b.kind &&
                                                               L->idx_wq_b.k == L->wq_b.k));
    if (qb) TRY(mk_cuda_rmsnorm_quant(ctx, w->qr, R, c->q_lora, L->q_norm, c->norm_eps, w->qr, &aqb, err));
    else TRY(mk_cuda_rmsnorm(ctx, w->qr, R, c->q_lora, L->q_norm, c->norm_eps, w->qr, err));
    TRY(dumpv(C, w->qr, R, c->q_lora, 0, err, "L%d.attn.qr", layer));
    const int fq = MK_CUDA_LIN_ROW_INVARIANT | (qb ? MK_CUDA_LIN_REUSE_X : 0);
    if (r == 4)
        TRY(mk_cuda_linear_pair(ctx, fq, &L->wq_b, &L->idx_wq_b, w->qr, R, w->q, w->iq, 1, w->lin, w->lin_bytes, err));
    else
        TRY(lin_f(C, fq, &L->wq_b, w->qr, R, w->q, 1, err));
    { /* the lane: the compressors' projections, then wo_a and wo_b, while q / kv are prepared and the
       * indexer, the compressors and the sparse attention run */
        const mk_wmat *W[7];
        int n = 0;
        if (r == 4 && !C->cmp_done) W[n++] = &L->idx_cmp.wkv, W[n++] = &L->idx_cmp.wgate, W[n++] = &L->idx_wproj;
        if (r && !C->cmp_done) W[n++] = &L->cmp.wkv, W[n++] = &L->cmp.wgate;
        W[n++] = &L->wo_a, W[n++] = &L->wo_b;
        TRY(lane(C, W, n, err));
    }
    /* q's and kv's norms and RoPE (and, with the tuning's attn_prep, the indexer's queries: iq is
     * ready) in one launch where nothing is dumped between them */
    mk_cuda_tuning tu;
    mk_cuda_ctx_get_tuning(ctx, &tu);
    C->iq_prep = tu.attn_prep && !(C->hk && C->hk->dump);
    if (C->iq_prep) {
        const int IH = c->index_heads, ID = c->index_head_dim;
        TRY(mk_cuda_attn_prep(ctx, R, w->q, H, D, c->norm_eps, w->kv, L->kv_norm, rd, L->rope, w->pos,
                              r == 4 ? w->iq : NULL, IH, ID, 1.0f / sqrtf((float)ID), err));
    } else {
        TRY(mk_cuda_head_rms_rope(ctx, w->q, R * H, D, c->norm_eps, rd, L->rope, w->pos, H, err));
        TRY(dumpv(C, w->q, R, H, D, err, "L%d.attn.q", layer));
        TRY(mk_cuda_kv_norm_rope_q(ctx, w->kv, R, D, L->kv_norm, c->norm_eps, rd, L->rope, w->pos, err));
        TRY(dumpv(C, w->kv, R, D, 0, err, "L%d.attn.kv", layer));
    }
    mark(C, "attn: q/kv projections, rope");
    for (int pi = 0; pi < C->np; pi++) C->pc[pi].k_sel = 0;
    if (C->cmp_done) {
        TRY(mk_cuda_branch_join(ctx, err));
    } else {
        C->xproj = 0;
        if (r) TRY(xproj(C, L, x, err));
    }
    if (r == 4) TRY(indexer(C, layer, L, x, err));
    mark(C, "indexer (incl. its compressor)");
    if (r && !C->cmp_done) TRY(compressor(C, layer, L, &L->cmp, 0, x, err));
    mark(C, "attn compressor");
    if (r && C->np == 1)
        TRY(dump_entries(C, &C->pc[0], layer, C->pc[0].s->pool->lay.ckv[layer], r, C->pc[0].s->ls[layer].n_ckv, D, err));
    /* every piece at once: row lists, the sparse attention, the rings (after the snapshots of the
     * window at the block ends inside each piece, which read the ring before the call's rows) */
    const int nL = c->n_layers + c->n_mtp;
    const mk_cuda_apiece *apc = w->apc + layer, *happ = w->happ + layer;
    for (int pi = 0; pi < C->np; pi++) {
        const gpiece *p = &C->pc[pi];
        const mk_cuda_apiece *a = happ + (size_t)pi * nL;
        if (a->n_ckv != (r ? p->s->ls[layer].n_ckv : 0) || a->k_sel != p->k_sel || a->row0 != p->row0)
            return mk_fail(err, MK_EINTERNAL, "cuda: attention piece %d of layer %d: planned %d entries / %d picks, "
                           "found %d / %d", pi, layer, a->n_ckv, a->k_sel, p->s->ls[layer].n_ckv, p->k_sel);
    }
    mk_cuda_paged ckv = {0};
    if (r) ckv = paged(&C->pc[0], C->pc[0].s->pool->lay.ckv[layer], bt / r);
    const int rows_ring = tu.rows_ring && R == C->np; /* one-row pieces: the rings written with the lists */
    TRY(mk_cuda_attn_rows_multi(ctx, apc, C->np, nL, R, win, D, w->kv, ckv, r, w->sel, w->sel_cap, w->rows,
                                w->row_start, rows_ring, err));
    /* wo_a: all groups in one launch where the kernel takes the shape, else group by group; the
     * inverse RoPE of o then goes with that launch (its input preparation; not when o is dumped), or,
     * under the tuning's attn_f16, with the attention's own (one-row pieces: nothing runs between) */
    int grouped = L->wo_a.kind == MK_W_FP8_DQ && L->wo_a.n == G * c->o_lora && L->wo_a.k == Dg &&
                  c->o_lora % 16 == 0 && Dg % 128 == 0;
    const int fuse_rope = grouped && !(C->hk && C->hk->dump);
    const mk_cuda_rope_at_desc ro = {L->rope, w->pos, D, rd, 1};
    int pre_o = 0;
    if (fuse_rope && rows_ring && tu.attn_f16) {
        uint16_t *oxh = NULL;
        float *osx = NULL;
        mk_err e2 = {0};
        if (mk_cuda_linear_grouped_input(ctx, &L->wo_a, G, R, w->lin, w->lin_bytes, &oxh, &osx, &e2) == MK_OK && oxh) {
            const int st = mk_cuda_sparse_attn_f16(ctx, w->q, R, H, D, (const float *const *)w->rows, w->row_start,
                                                   L->attn_sink, 1.0f / sqrtf((float)D), w->o, oxh, osx, &ro, &e2);
            if (st == MK_OK) pre_o = 1;
            else if (st != MK_ENOTSUP) return *err = e2, st;
        }
    }
    if (!pre_o)
        TRY(mk_cuda_sparse_attn(ctx, w->q, R, H, D, (const float *const *)w->rows, w->row_start, L->attn_sink,
                                1.0f / sqrtf((float)D), w->o, err));
    for (int pi = 0; pi < C->np; pi++) {
        const gpiece *p = &C->pc[pi];
        dsv4_cuda_seq *s = p->s;
        const int T = p->T, start = p->start;
        for (int e = (start / bt + 1) * bt - 1; s->pool->lay.snapshots && layer < c->n_layers && e < start + T; e += bt)
            TRY(mk_cuda_snap_ring(ctx, (uint16_t *)(blk(s, e / bt) + s->pool->lay.win[layer]), s->ls[layer].win,
                                  w->kv + (size_t)p->row0 * D, start, e, win, D, err));
    }
    if (!rows_ring) TRY(mk_cuda_ring_put_multi(ctx, apc, C->np, nL, R, w->kv, win, D, err));
    if (!fuse_rope) TRY(mk_cuda_rope_at(ctx, w->o + nope, R * H, D, rd, L->rope, w->pos, H, 1, err));
    mark(C, "attn: rows, sparse attention, window");
    TRY(dumpv(C, w->o, R, H, D, err, "L%d.attn.o", layer));
    if (grouped) {
        int st = pre_o ? mk_cuda_linear_grouped_prepared(ctx, &L->wo_a, G, R, w->oa, 1, w->lin, w->lin_bytes, err)
                 : fuse_rope ? mk_cuda_linear_grouped_rope(ctx, &L->wo_a, G, w->o, &ro, R, w->oa, 1, w->lin,
                                                           w->lin_bytes, err)
                             : mk_cuda_linear_grouped(ctx, &L->wo_a, G, w->o, R, w->oa, 1, w->lin, w->lin_bytes, err);
        if (st == MK_ENOTSUP && pre_o) return mk_fail(err, MK_EINTERNAL, "cuda: wo_a refused its prepared input");
        if (st == MK_ENOTSUP) { /* e.g. split-K GEMVs by tuning: o untouched, group by group below */
            grouped = 0;
            if (fuse_rope) TRY(mk_cuda_rope_at(ctx, w->o + nope, R * H, D, rd, L->rope, w->pos, H, 1, err));
        } else {
            TRY(st);
        }
    }
    for (int g = 0; g < G && !grouped; g++) {
        mk_wmat Wg = L->wo_a;
        Wg.n = c->o_lora;
        if (Wg.kind == MK_W_BF16) {
            Wg.w = (const uint16_t *)L->wo_a.w + (size_t)g * c->o_lora * Dg;
        } else {
            Wg.w = (const uint8_t *)L->wo_a.w + (size_t)g * c->o_lora * Dg;
            Wg.scale = L->wo_a.scale + (size_t)(g * c->o_lora / 128) * ((Dg + 127) / 128);
        }
        if (R == 1) {
            TRY(lin(C, &Wg, w->o + (size_t)g * Dg, 1, w->oa + (size_t)g * c->o_lora, 1, err));
        } else {
            TRY(mk_cuda_copy2d(ctx, w->og, F(Dg), w->o + (size_t)g * Dg, F(HD), F(Dg), (size_t)R, err));
            TRY(lin(C, &Wg, w->og, R, w->ot, 1, err));
            TRY(mk_cuda_copy2d(ctx, w->oa + (size_t)g * c->o_lora, F(G * c->o_lora), w->ot, F(c->o_lora),
                               F(c->o_lora), (size_t)R, err));
        }
    }
    TRY(dumpv(C, w->oa, R, G * c->o_lora, 0, err, "L%d.attn.oa", layer));
    TRY(lin(C, &L->wo_b, w->oa, R, out, 1, err));
    { /* the lane: the gate and the shared expert, while hc_post / hc_pre and the routing run */
        const mk_wmat *W[4] = {&L->gate, &L->sh1, &L->sh3, &L->sh2};
        TRY(lane(C, W, 4, err));
    }
    mark(C, "attn: output projections");
    return dumpv(C, out, R, c->dim, 0, err, "L%d.attn.out", layer);
}

/* The shared expert of x into w->seo with the linear scratch scr (its input quantized there by its
 * own linears): sh1 and sh3 in one launch, the SwiGLU straight into sh2's quantized input where sh2
 * takes one, sh2. flags: MK_CUDA_LIN_REUSE_X where x is already quantized in scr for sh1 (the same
 * bits either way). */
static int shared_expert(gcall *C, const glayer *L, const float *x, int flags, void *scr, size_t scr_bytes,
                         mk_err *err) {
    const dsv4_config *c = &C->g->m->cfg;
    mk_cuda_ctx *ctx = C->ctx;
    dsv4_cuda_work *w = C->w;
    const int T = C->R, I = c->moe_inter;
    TRY(mk_cuda_linear_pair(ctx, MK_CUDA_LIN_ROW_INVARIANT | flags, &L->sh1, &L->sh3, x, T, w->sg, w->su, 1, scr,
                            scr_bytes, err));
    uint8_t *xq;
    float *sa;
    mk_err e2 = {0};
    int perm, q = mk_cuda_linear_xq(ctx, &L->sh2, T, scr, scr_bytes, &xq, &sa, &perm, &e2) == MK_OK;
    if (q) TRY(mk_cuda_swiglu_quant(ctx, w->sg, w->su, NULL, T, I, c->swiglu_limit, perm, NULL, xq, sa, err));
    else TRY(mk_cuda_swiglu(ctx, w->sg, w->su, (size_t)T * I, c->swiglu_limit, w->sg, err));
    /* sh2 through scr as well: its quantized input is there (the side branch's scratch on the branch,
     * where the main stream's w->lin is in use) */
    TRY(mk_cuda_linear_ex(ctx, MK_CUDA_K_AUTO, MK_CUDA_LIN_ROW_INVARIANT | (q ? MK_CUDA_LIN_REUSE_X : 0), &L->sh2, w->sg,
                          T, w->seo, 1, scr, scr_bytes, err));
    return MK_OK;
}

/* x_q: x was already quantized (FP4-permuted) into w->mxq / w->msa (moe_fp4_mma, and sh1 takes
 * a quantized input: lin_in_q). */
static int moe(gcall *C, int layer, const glayer *L, const float *x, int x_q, float *out, mk_err *err) {
    const dsv4_config *c = &C->g->m->cfg;
    mk_cuda_ctx *ctx = C->ctx;
    dsv4_cuda_work *w = C->w;
    int E = c->n_experts, K = c->n_act, d = c->dim, I = c->moe_inter, T = C->R;
    float lim = c->swiglu_limit;
    /* the tuning's branch (a captured decode step with tensor-core experts; mk_cuda_branch_begin says
     * whether it is on): the shared expert on a side branch from here, with its own scratch, beside
     * the gate, the routing and the routed experts (nothing of theirs does it read or write); joined
     * before the combine */
    int sh_side = 0;
    if (T <= 8 && moe_fp4_mma(c, L) && w->lin_side && !(C->hk && (C->hk->dump || C->hk->moe))) {
        sh_side = mk_cuda_branch_begin(ctx, err);
        if (sh_side < 0) return sh_side;
        if (sh_side) {
            C->side = 1;
            const int st = shared_expert(C, L, x, 0, w->lin_side, w->lin_side_bytes, err);
            C->side = 0;
            const int st2 = mk_cuda_branch_end(ctx, err);
            TRY(st);
            TRY(st2);
        }
    }
    TRY(lin(C, &L->gate, x, T, w->gsc, 0, err));
    if (C->hk && C->hk->moe) { /* the hook may change the picks before the weights */
        TRY(mk_cuda_moe_route(ctx, w->gsc, T, E, K, L->gate_bias, L->tid2eid, w->tok, c->vocab, w->gidx, w->gmargin,
                              err));
        TRY(mk_cuda_download(ctx, w->hi, w->gidx, sizeof(int32_t) * (size_t)T * K, err));
        TRY(mk_cuda_download(ctx, w->hf, w->gmargin, F(T), err));
        C->hk->moe(C->hk->ctx, layer, T, K, w->hi, w->hf);
        TRY(mk_cuda_upload(ctx, w->gidx, w->hi, sizeof(int32_t) * (size_t)T * K, err));
        TRY(mk_cuda_moe_weights(ctx, w->gsc, T, E, K, c->route_scale, w->gidx, w->gw, err));
        TRY(mk_cuda_moe_plan(ctx, w->gidx, w->gw, T, K, E, w->plan, w->sw, err));
    } else { /* the routing, its weights and the plan (one launch for one token) */
        TRY(mk_cuda_moe_route_plan(ctx, w->gsc, T, E, K, L->gate_bias, L->tid2eid, w->tok, c->vocab, c->route_scale,
                                   w->gidx, w->gmargin, w->gw, w->plan, w->sw, err));
    }
    TRY(dumpv(C, w->gw, T, K, 0, err, "L%d.moe.weights", layer));
    mark(C, "moe: gate, route, plan");
    if (T <= 8 && moe_fp4_mma(c, L)) /* the lane: the picked experts' w2, while w1 / w3 and the SwiGLU run */
        TRY(mk_cuda_lane_prefetch_experts(ctx, w->gidx, T * K, E, (const void *const *)L->ew2,
                                          (size_t)d * (size_t)I / 2, err));
    mk_cuda_actq shq = {0};
    int sh_q = 0;
    if (moe_fp4_mma(c, L)) {
        /* tensor cores: activations quantized once (the FP8 simulation's very bytes), w1 and w3
         * results, the SwiGLU epilogue, then w2 by slot. The expert GEMV reads the plan before it
         * waits for the kernel before it, so a kernel must run between the plan and it: the
         * activation quantization for the routed experts, or, when the op that made x already
         * wrote that, the shared expert's (kept in the linear scratch until its linears run) */
        if (!x_q || sh_side) { /* with the shared expert on the side: the routed experts' input
                                  * again (the same bytes), the kernel between the plan and the GEMV */
            TRY(mk_cuda_act_quant(ctx, x, T, d, 1, w->mxq, w->msa, err));
        } else {
            sh_q = lin_in_q(C, &L->sh1, &shq); /* block() checked it */
            TRY(mk_cuda_act_quant(ctx, x, T, d, shq.perm, shq.q, shq.sa, err));
        }
        /* decode: the shared expert's sh1 / sh3 GEMVs ride along in w1 / w3's launch and sh2 in w2's
         * (mk_cuda_moe_gemv_fp4_with; the same bits), both SwiGLUs in between */
        uint8_t *xq2 = NULL;
        float *sa2 = NULL;
        int perm2 = 0;
        mk_err e2 = {0};
        int ride = sh_q && L->sh1.kind == MK_W_FP8 && L->sh3.kind == MK_W_FP8 && L->sh2.kind == MK_W_FP8 &&
                   mk_cuda_linear_xq(ctx, &L->sh2, T, w->lin, w->lin_bytes, &xq2, &sa2, &perm2, &e2) == MK_OK;
        if (ride && !sh_side) {
            const mk_cuda_fp8_job j1 = {&L->sh1, &L->sh3, shq.q, shq.sa, T, w->sg, w->su, 1};
            int st = mk_cuda_moe_gemv_fp4_with(ctx, (const void *const *)L->ew1, (const uint8_t *const *)L->es1,
                                               (const void *const *)L->ew3, (const uint8_t *const *)L->es3, I, d,
                                               w->mxq, w->msa, 1, w->plan, T, K, E, w->act, w->actd, 0, &j1, err);
            if (st == MK_ENOTSUP) ride = 0;
            else TRY(st);
        }
        if (ride && !sh_side) {
            const mk_cuda_swiglu_job s1 = {w->act, w->actd, w->sw, T * K, I, 1, NULL, w->mxq, w->msa};
            const mk_cuda_swiglu_job s2 = {w->sg, w->su, NULL, T, I, perm2, NULL, xq2, sa2};
            TRY(mk_cuda_swiglu_quant2(ctx, &s1, &s2, lim, err)); /* one launch with the tuning's swiglu_pair */
            const mk_cuda_fp8_job j2 = {&L->sh2, NULL, xq2, sa2, T, w->seo, NULL, 1};
            int st = mk_cuda_moe_gemv_fp4_with(ctx, (const void *const *)L->ew2, (const uint8_t *const *)L->es2, NULL,
                                               NULL, d, I, w->mxq, w->msa, 0, w->plan, T, K, E, w->eo, NULL, 1, &j2,
                                               err);
            if (st == MK_ENOTSUP) { /* w2 and sh2 one after the other */
                TRY(mk_cuda_moe_gemv_fp4(ctx, (const void *const *)L->ew2, (const uint8_t *const *)L->es2, NULL, NULL,
                                         d, I, w->mxq, w->msa, 0, w->plan, T, K, E, w->eo, NULL, 1, err));
                TRY(lin_f(C, MK_CUDA_LIN_REUSE_X, &L->sh2, w->sg, T, w->seo, 1, err));
            } else {
                TRY(st);
            }
            mark(C, "moe: routed and shared experts");
            goto combine;
        }
        TRY(mk_cuda_moe_gemv_fp4(ctx, (const void *const *)L->ew1, (const uint8_t *const *)L->es1,
                                 (const void *const *)L->ew3, (const uint8_t *const *)L->es3, I, d, w->mxq, w->msa, 1,
                                 w->plan, T, K, E, w->act, w->actd, 0, err));
        TRY(mk_cuda_swiglu_quant(ctx, w->act, w->actd, w->sw, T * K, I, lim, 1, NULL, w->mxq, w->msa, err));
        TRY(mk_cuda_moe_gemv_fp4(ctx, (const void *const *)L->ew2, (const uint8_t *const *)L->es2, NULL, NULL, d, I,
                                 w->mxq, w->msa, 0, w->plan, T, K, E, w->eo, NULL, 1, err));
        goto shared;
    }
    const float *xd = x, *ad = w->act;
    if (L->ekind != MK_W_BF16) {
        TRY(mk_cuda_quant_sim(ctx, x, T, d, d, 128, 0, w->xd, err));
        xd = w->xd;
    }
    TRY(mk_cuda_moe_gemv(ctx, L->ekind, (const void *const *)L->ew1, (const uint8_t *const *)L->es1,
                         (const void *const *)L->ew3, (const uint8_t *const *)L->es3, I, d, xd, 1, w->plan, w->sw, T,
                         K, E, lim, w->act, err));
    if (L->ekind != MK_W_BF16) {
        TRY(mk_cuda_quant_sim(ctx, w->act, T * K, I, I, 128, 0, w->actd, err));
        ad = w->actd;
    }
    TRY(mk_cuda_moe_gemv(ctx, L->ekind, (const void *const *)L->ew2, (const uint8_t *const *)L->es2, NULL, NULL, d, I,
                         ad, 0, w->plan, w->sw, T, K, E, lim, w->eo, err));
shared:
    mark(C, "moe: routed experts");
    if (!sh_side) TRY(shared_expert(C, L, x, sh_q ? MK_CUDA_LIN_REUSE_X : 0, w->lin, w->lin_bytes, err));
    mark(C, "moe: shared expert");
combine:
    if (sh_side) TRY(mk_cuda_branch_join(ctx, err)); /* w->seo: the side's */
    if (!out) return MK_OK; /* the caller's hc op combines (mk_cuda_moe_sum) */
    TRY(mk_cuda_moe_combine(ctx, w->eo, w->gidx, w->plan, T, K, E, d, w->seo, out, err));
    mark(C, "moe: combine");
    return MK_OK;
}

/* The collapse that follows a block's last hc_post, done with it in one op (the hc_post kernel
 * also reduces the split path's chunks of the row it writes; the same bits): the next layer's
 * attention hc_pre (into w->x, w->post, w->comb, which that block then takes as done) or, when
 * every row of the call is a logits row, the head's hc_head_norm (into w->xl, see head()). */
typedef struct {
    const float *fn, *scale, *base;
    const uint16_t *norm;
    int head;
    const mk_wmat *wq_a; /* the next layer's first linear: its input quantized too (lin_in_q) */
    const glayer *layer; /* the next layer (NULL: the head) */
} gnext;

static gnext next_attn(const glayer *L) {
    return (gnext){L->hc_attn_fn, L->hc_attn_scale, L->hc_attn_base, L->attn_norm, 0, &L->wq_a, L};
}

/* One layer on h [T, hc, d]. pre_done: h's attention hc_pre is already in w->x / w->post /
 * w->comb (the previous block's nx). nx: what to fuse into the last hc_post (NULL: nothing). */
static int block(gcall *C, int layer, const glayer *L, float *h, int pre_done, const gnext *nx, mk_err *err) {
    const dsv4_config *c = &C->g->m->cfg;
    mk_cuda_ctx *ctx = C->ctx;
    dsv4_cuda_work *w = C->w;
    int hc = c->hc, d = c->dim, T = C->R;
    /* each hc_pre also quantizes its output for the linear that reads it where that one takes a
     * quantized input: wq_a (into the linear scratch; the previous block's last op did it for this
     * one when pre_done), the routed experts (w->mxq) */
    mk_cuda_actq aqa = {0}, tmp = {0};
    const int attn_q = lin_in_q(C, &L->wq_a, &aqa), moe_q = moe_fp4_mma(c, L) && lin_in_q(C, &L->sh1, &tmp);
    mk_cuda_tuning tu;
    mk_cuda_ctx_get_tuning(ctx, &tu);
    const mk_cuda_actq aqm = {w->mxq, w->msa, 1};
    if (!pre_done) {
        TRY(mk_cuda_hc_pre_norm(ctx, h, T, hc, d, L->hc_attn_fn, L->hc_attn_scale, L->hc_attn_base, c->hc_iters,
                                c->hc_eps, c->norm_eps, L->attn_norm, c->norm_eps, w->x, w->post, w->comb,
                                attn_q ? &aqa : NULL, err));
        mark(C, "mHC pre/post, norms");
    }
    TRY(dumpv(C, w->x, T, d, 0, err, "L%d.attn.in", layer));
    TRY(attention(C, layer, L, w->x, attn_q, w->sub, err));
    /* h2 = hc_post(sub, h), then the ffn hc_pre of h2 (post / comb read, then overwritten) */
    TRY(mk_cuda_hc_post_pre_norm(ctx, w->sub, h, w->post, w->comb, T, hc, d, w->h2, L->hc_ffn_fn, L->hc_ffn_scale,
                                 L->hc_ffn_base, c->hc_iters, c->hc_eps, c->norm_eps, L->ffn_norm, c->norm_eps, w->x,
                                 w->post, w->comb, moe_q ? &aqm : NULL, NULL, err));
    mark(C, "mHC pre/post, norms");
    TRY(dumpv(C, w->h2, T, hc, d, err, "L%d.h_attn", layer));
    TRY(dumpv(C, w->x, T, d, 0, err, "L%d.moe.in", layer));
    /* with a next op (the next hc_pre or the head's collapse) the last hc_post may take the MoE
     * combine's operands instead of its output (tuning hc_moe_sum; not when dumping: no moe.out) */
    const mk_cuda_moe_sum ms = {w->eo, w->gidx, w->plan, T, c->n_act, c->n_experts, w->seo, w->sub};
    const int sum = nx && tu.hc_moe_sum && !(C->hk && C->hk->dump) && c->n_act <= 64;
    TRY(moe(C, layer, L, w->x, moe_q, sum ? NULL : w->sub, err));
    if (nx && nx->layer) TRY(lane_attn_in(C, nx->layer, err)); /* the lane: the next layer's first linears */
    TRY(dumpv(C, w->sub, T, d, 0, err, "L%d.moe.out", layer));
    if (!nx) {
        TRY(mk_cuda_hc_post(ctx, w->sub, w->h2, w->post, w->comb, T, hc, d, h, err));
    } else if (nx->head) {
        TRY(mk_cuda_hc_post_head_norm(ctx, w->sub, w->h2, w->post, w->comb, T, hc, d, h, nx->fn, nx->scale, nx->base,
                                      c->hc_eps, c->norm_eps, nx->norm, c->norm_eps, w->xl, sum ? &ms : NULL, err));
    } else {
        mk_cuda_actq nq = {0};
        const int q = nx->wq_a && lin_in_q(C, nx->wq_a, &nq);
        TRY(mk_cuda_hc_post_pre_norm(ctx, w->sub, w->h2, w->post, w->comb, T, hc, d, h, nx->fn, nx->scale, nx->base,
                                     c->hc_iters, c->hc_eps, c->norm_eps, nx->norm, c->norm_eps, w->x, w->post, w->comb,
                                     q ? &nq : NULL, sum ? &ms : NULL, err));
    }
    mark(C, "mHC pre/post, norms");
    return dumpv(C, h, T, hc, d, err, "L%d.h", layer);
}

static int head_collect(gcall *C, mk_err *err);

/* Which of the head's kernels a call needs: the argmax (a plain greedy row, or a greedy row with
 * adjustments: a draw with inv_t 0), the draw (a draw with inv_t > 0), the adjustment (a draw with
 * adjusted tokens). */
static void head_kernels(const gcall *C, int *greedy, int *draw, int *adj) {
    *greedy = *draw = *adj = 0;
    for (int pi = 0; pi < C->np; pi++) {
        const gpiece *p = &C->pc[pi];
        if (!p->logits || !p->argmax) continue;
        *greedy |= !p->draw || !(p->draw->inv_t > 0.0f);
        *draw |= p->draw && p->draw->inv_t > 0.0f;
        *adj |= p->draw && p->draw->n_adj > 0;
    }
}

/* Logits of the pieces that want them: their last rows of h gathered, then one head call.
 * done: the last block already ran the head's collapse of every row into w->xl (every row is a
 * logits row, in piece order: a decode step). */
static int head(gcall *C, const float *h, const float *fn, const float *scale, const float *base,
                const uint16_t *norm, int done, mk_err *err) {
    const dsv4_config *c = &C->g->m->cfg;
    mk_cuda_ctx *ctx = C->ctx;
    dsv4_cuda_work *w = C->w;
    size_t row = (size_t)c->hc * c->dim;
    int n = 0;
    for (int pi = 0; pi < C->np; pi++) {
        const gpiece *p = &C->pc[pi];
        if (!p->logits) continue;
        if (!done)
            TRY(mk_cuda_copy(ctx, w->hl + (size_t)n * row, h + (size_t)(p->row0 + p->T - 1) * row, F(row), err));
        n++;
    }
    if (!n) return C->no_sync ? MK_OK : sync_call(C, err);
    if (!done)
        TRY(mk_cuda_hc_head_norm(ctx, w->hl, n, c->hc, c->dim, fn, scale, base, c->hc_eps, c->norm_eps, norm,
                                 c->norm_eps, w->xl, err));
    int any_greedy, any_draw, any_adj;
    head_kernels(C, &any_greedy, &any_draw, &any_adj);
    /* greedy pieces: the argmax of every logits row, then only those ints to the host (with no
     * adjusted rows: from the head's linear, in its launch where the tuning's head_argmax can) */
    if (any_greedy && !any_adj)
        TRY(mk_cuda_linear_argmax(ctx, MK_CUDA_LIN_ROW_INVARIANT, &C->g->head, w->xl, n, w->logits, 0, w->am, w->lin,
                                  w->lin_bytes, err));
    else
        TRY(lin(C, &C->g->head, w->xl, n, w->logits, 0, err));
    /* adjusted tokens (bias, penalties, masked stop tokens: mk_sampler_model_step), in place, then the
     * greedy pieces' argmax of the adjusted rows */
    if (any_adj) TRY(mk_cuda_adjust_rows(ctx, w->logits, n, c->vocab, w->draw, w->adj, err));
    if (any_greedy && any_adj) TRY(mk_cuda_argmax_rows(ctx, w->logits, n, c->vocab, w->am, err));
    /* pieces with a draw: the sampler's token instead (rows without a draw, inv_t 0 in w->draw, keep
     * theirs) */
    if (any_draw) TRY(mk_cuda_sample_rows(ctx, w->logits, n, c->vocab, w->draw, w->sws, w->am, err));
    return C->no_sync ? MK_OK : head_collect(C, err);
}

/* The head's results to the host (after head(), or a replayed graph that ran it): the argmax of
 * the greedy pieces' rows, the other rows' logits; then the wait at the end of the call. */
static int head_queue(gcall *C, mk_err *err);
static void head_fill(const gcall *C);
static int head_collect(gcall *C, mk_err *err) {
    TRY(head_queue(C, err));
    TRY(sync_call(C, err));
    head_fill(C);
    return MK_OK;
}

/* The head's copies to the host, queued: the argmax ints into C->ham, the logits rows. */
static int head_queue(gcall *C, mk_err *err) {
    const dsv4_config *c = &C->g->m->cfg;
    mk_cuda_ctx *ctx = C->ctx;
    dsv4_cuda_work *w = C->w;
    int n = 0, any_am = 0;
    for (int pi = 0; pi < C->np; pi++) {
        n += C->pc[pi].logits != NULL;
        any_am |= C->pc[pi].logits && C->pc[pi].argmax;
    }
    const int sid = w->io ? MK_CUDA_S_DOWN : MK_CUDA_S_MAIN;
    if (sid != MK_CUDA_S_MAIN) { /* the copies on the download stream, after the call's kernels */
        mk_cuda_event *end = w->call[w->half].end;
        TRY(mk_cuda_event_record_on(ctx, MK_CUDA_S_MAIN, end, err));
        TRY(mk_cuda_stream_wait_on(ctx, sid, end, err));
    }
    if (!n) return MK_OK;
    if (any_am) TRY(mk_cuda_copy_on(ctx, sid, C->ham, w->am, sizeof(int32_t) * (size_t)n, err));
    /* the other pieces' rows: one copy per run of pieces whose host rows follow each other (the
     * engine's are one array: page-locked, mk_kvcache_host_floats), then one wait */
    int r0 = 0, run = 0;
    float *dst = NULL;
    n = 0;
    for (int pi = 0; pi <= C->np; pi++) {
        const gpiece *p = pi < C->np ? &C->pc[pi] : NULL;
        if (p && !p->logits) continue;
        float *l = p && !p->argmax ? p->logits : NULL; /* a row to copy; NULL ends a run */
        if (run && l && l == dst + (size_t)run * c->vocab && r0 + run == n) {
            run++;
        } else {
            if (run)
                TRY(mk_cuda_copy_on(ctx, sid, dst, w->logits + (size_t)r0 * c->vocab, F((size_t)run * c->vocab), err));
            dst = l, r0 = n, run = l ? 1 : 0;
        }
        if (p) n++;
    }
    return MK_OK;
}

/* After the wait: the argmax ints to the pieces that asked for them. */
static void head_fill(const gcall *C) {
    int n = 0;
    for (int pi = 0; pi < C->np; pi++) {
        const gpiece *p = &C->pc[pi];
        if (!p->logits) continue;
        if (p->argmax) *p->argmax = C->ham[n];
        n++;
    }
}

static int check_tokens(const dsv4_config *c, const int32_t *tokens, int T, int piece, mk_err *err) {
    for (int i = 0; i < T; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab)
            return mk_fail(err, MK_ERANGE, "token id %d at index %d of piece %d is outside the vocabulary [0, %d)",
                           tokens[i], i, piece, c->vocab);
    return MK_OK;
}

/* The attention pieces of piece i for layers [l0, l1) (host staging; uploaded with the ids): what
 * the call's compressors and indexer will leave for the attention, computed from the positions
 * (entries of ratio r: one per r positions; indexer picks min(index_topk, entries)). attention()
 * checks them against the host's counters. */
static void fill_apc(dsv4_cuda_work *w, const gpiece *p, int i, int l0, int l1) {
    const dsv4_config *c = &w->g->m->cfg;
    const int nL = c->n_layers + c->n_mtp, e = p->start + p->T;
    for (int l = l0; l < l1; l++) {
        const int r = c->compress_ratio[l];
        const gstate *st = &p->s->ls[l];
        int ks = r == 4 ? (c->index_topk < e / 4 ? c->index_topk : e / 4) : 0;
        w->happ[(size_t)i * nL + l] = (mk_cuda_apiece){.ring = st->win, .tbl = p->dtbl, .row0 = p->row0, .T = p->T,
                                                       .start = p->start,
                                                       .n_ckv = r ? st->n_ckv + e / r - p->start / r : 0,
                                                       .k_sel = ks > 0 ? ks : 0,
                                                       .cst = {{st->kv_state, st->sc_state}, {st->ikv_state, st->isc_state}}};
    }
}

/* Checks every piece, lays out the rows and uploads token ids and block tables (one copy). */
static int call_setup(gcall *C, dsv4_cuda_work *w, dsv4_cuda_seq *const *seqs, const int32_t *const *tokens,
                      const int *n, float *const *logits, int32_t *const *argmax, const mk_sample_draw *const *draws,
                      const char *feed, int np, gpiece *pc, mk_err *err) {
    const dsv4_config *c = &w->g->m->cfg;
    memset(C, 0, sizeof *C);
    if (np < 1) return mk_fail(err, MK_EINVAL, "a batched call needs at least one piece");
    if (np > w->max_pieces) return mk_fail(err, MK_ERANGE, "a call of %d pieces exceeds the scratch's %d", np, w->max_pieces);
    {
        mk_cuda_tuning tu;
        mk_cuda_ctx_get_tuning(w->g->ctx, &tu);
        if (tu.fp4_tiles != w->g->fp4_tiles)
            return mk_fail(err, MK_EINVAL,
                           "cuda: the routed experts were uploaded with the tuning's fp4_tiles %d, it is now %d (set it "
                           "before dsv4_cuda_create)",
                           w->g->fp4_tiles, tu.fp4_tiles);
    }
    int R = 0;
    for (int i = 0; i < np; i++) {
        dsv4_cuda_seq *s = seqs[i];
        if (s->g != w->g) return mk_fail(err, MK_EINVAL, "piece %d: a sequence of another model", i);
        for (int j = 0; j < i; j++)
            if (seqs[j] == s) return mk_fail(err, MK_EINVAL, "pieces %d and %d run on the same sequence", j, i);
        if (s->broken)
            return mk_fail(err, MK_EINTERNAL, "piece %d: its sequence failed in the middle of a call; reset or restore it", i);
        if (n[i] <= 0) return mk_fail(err, MK_EINVAL, "piece %d: a forward call needs at least one token", i);
        if (s->pool != seqs[0]->pool)
            return mk_fail(err, MK_EINVAL, "pieces 0 and %d: sequences of different KV pools in one call", i);
        if (s->pos + n[i] > s->max_len)
            return mk_fail(err, MK_ERANGE, "piece %d: position %d exceeds the sequence capacity %d", i, s->pos + n[i],
                           s->max_len);
        if ((long)s->n_blocks * DSV4_BLOCK_TOKENS < (long)s->pos + n[i])
            return mk_fail(err, MK_EINTERNAL, "piece %d: [%d, %d) is not covered by its %d blocks", i, s->pos,
                           s->pos + n[i], s->n_blocks);
        if (s->pos + n[i] > w->max_len)
            return mk_fail(err, MK_ERANGE, "piece %d: position %d exceeds the scratch's length %d", i, s->pos + n[i],
                           w->max_len);
        if (feed && feed[i]) { /* the previous call's pick for this sequence, on the device */
            int j = 0;
            while (j < w->prev_rows && w->prev_seq[j] != s) j++;
            if (n[i] != 1 || j == w->prev_rows)
                return mk_fail(err, MK_EINTERNAL,
                               n[i] != 1 ? "piece %d: a fed piece has %d tokens (needs 1)"
                                         : "piece %d: fed from a previous call that picked no token for its sequence",
                               i, n[i]);
            w->feed_src[i] = j;
        } else {
            TRY(check_tokens(c, tokens[i], n[i], i, err));
        }
        pc[i] = (gpiece){.s = s, .T = n[i], .start = s->pos, .row0 = R, .logits = logits ? logits[i] : NULL,
                         .argmax = logits && logits[i] && argmax ? argmax[i] : NULL};
        pc[i].draw = pc[i].argmax && draws ? draws[i] : NULL;
        const mk_sample_draw *d = pc[i].draw;
        if (d && !(d->inv_t > 0.0f) && !(d->inv_t == 0.0f && (d->n_adj > 0 || d->adj)))
            return mk_fail(err, MK_EINVAL, "piece %d: a draw with inverse temperature %g (needs > 0, or 0 with "
                           "adjustments: greedy)", i, (double)d->inv_t);
        if (d && (d->n_adj < 0 || d->n_adj > MK_SAMPLE_ADJ_MAX || (d->n_adj && !d->adj)))
            return mk_fail(err, MK_EINVAL, "piece %d: a draw with %d adjusted tokens (at most %d)", i, d->n_adj,
                           MK_SAMPLE_ADJ_MAX);
        for (int e = 0; d && e < d->n_adj; e++)
            if (d->adj[e].id < 0 || d->adj[e].id >= c->vocab)
                return mk_fail(err, MK_EINVAL, "piece %d: adjusted token %d is outside the vocabulary [0, %d)", i,
                               (int)d->adj[e].id, c->vocab);
        R += n[i];
        if (R > w->max_rows)
            return mk_fail(err, MK_ERANGE, "a call of %d or more tokens exceeds the scratch's %d rows", R, w->max_rows);
    }
    set_layout(w, ids_compact() && R <= w->layout_rows[1]);
    int32_t *hpos = w->hids + (w->pos - w->ids), *hfsrc = w->hids + (w->fsrc - w->ids);
    for (int i = 0; i < np; i++) {
        for (int j = 0; j < n[i]; j++) hfsrc[pc[i].row0 + j] = -1;
        if (feed && feed[i]) { /* the embedding reads it from the previous call's picks */
            w->hids[pc[i].row0] = 0;
            hfsrc[pc[i].row0] = w->feed_src[i];
        } else {
            memcpy(w->hids + pc[i].row0, tokens[i], sizeof(int32_t) * (size_t)n[i]);
        }
        int32_t *t = w->hids + (w->tbl - w->ids) + (size_t)i * w->tbl_cap;
        for (int b = 0; b < seqs[i]->n_blocks && b < w->tbl_cap; b++) t[b] = seqs[i]->blocks[b];
        pc[i].dtbl = w->tbl + (size_t)i * w->tbl_cap;
        for (int j = 0; j < n[i]; j++) hpos[pc[i].row0 + j] = pc[i].start + j;
        fill_apc(w, &pc[i], i, 0, c->n_layers);
    }
    size_t n_adj = 0; /* the draws' adjusted tokens, packed (at most max_pieces x MK_SAMPLE_ADJ_MAX) */
    for (int i = 0, r = 0; i < np; i++) { /* the logits rows' draws, in row order (inv_t 0: none) */
        if (!pc[i].logits) continue;
        mk_sample_draw d = pc[i].draw ? *pc[i].draw : (mk_sample_draw){0};
        if (d.n_adj) memcpy(w->hadj + n_adj, d.adj, sizeof(mk_sample_adj) * (size_t)d.n_adj);
        d.adj_off = (int)n_adj;
        d.adj = NULL; /* a host pointer: not for the device */
        n_adj += (size_t)d.n_adj;
        w->hdraw[r++] = d;
    }
    const size_t nL = (size_t)(c->n_layers + c->n_mtp);
    TRY(upload_ids(w, w->ids_bytes + sizeof(mk_cuda_apiece) * nL * (size_t)np, err));
    if (n_adj) TRY(mk_cuda_upload_async(w->g->ctx, w->adj, w->hadj, sizeof(mk_sample_adj) * n_adj, err));
    C->g = w->g;
    C->ctx = w->g->ctx;
    C->w = w;
    C->pc = pc;
    C->np = np;
    C->R = R;
    C->hk = np == 1 && w->hh ? &seqs[0]->hooks : NULL;
    C->ham = w->ham;
    w->prev_rows = 0; /* w->am is this call's from here on */
    return MK_OK;
}

/* The call's work (set up by call_setup): the embedding, the blocks, the head. */
static int run_call(gcall *C, mk_err *err) {
    dsv4_cuda_work *w = C->w;
    dsv4_cuda *g = w->g;
    const dsv4_config *c = &g->m->cfg;
    if (prof_on()) C->t_mark = ph_now();
    TRY(mk_cuda_embed_hc_fed(g->ctx, g->embed, c->vocab, w->tok, w->fsrc, w->am_prev, C->R, c->hc, c->dim, w->h, err));
    /* each block's last hc_post runs with the next block's hc_pre, the last one's with the head's
     * collapse when every row is a logits row (a decode step: one token per piece, each wanting
     * logits) */
    int head_fused = c->n_layers > 0;
    for (int i = 0; i < C->np; i++) head_fused = head_fused && C->pc[i].T == 1 && C->pc[i].logits;
    const gnext nx_head = {g->hc_head_fn, g->hc_head_scale, g->hc_head_base, g->norm, 1, NULL, NULL};
    if (c->n_layers > 0) TRY(lane_attn_in(C, &g->layers[0], err)); /* the lane: layer 0's first linears */
    for (int l = 0; l < c->n_layers; l++) {
        const gnext nx = l + 1 < c->n_layers ? next_attn(&g->layers[l + 1]) : nx_head;
        TRY(block(C, l, &g->layers[l], w->h, l > 0, l + 1 < c->n_layers || head_fused ? &nx : NULL, err));
    }
    TRY(head(C, w->h, g->hc_head_fn, g->hc_head_scale, g->hc_head_base, g->norm, head_fused, err));
    mark(C, "head, logits to the host");
    return MK_OK;
}

/* ---- decode steps as CUDA graphs (dsv4_cuda.h) --------------------------------------------------
 * A graph replays its kernels' recorded arguments, so a replayable step's launches must not depend
 * on the positions: everything that does is read on the device (ids, positions, block tables and
 * attention pieces in w->ids / w->apc, uploaded before the launch; the compressors' entries by
 * mk_cuda_cmp_step_multi; the indexer's columns rounded by idx_cols). The host side of a step that
 * the replay skips is the compressors' counters (step_counters). */

/* The head's mode of a call: 0 no piece wants logits, -1 some do and some not (not replayable: the
 * head gathers some rows), else 1 + the head's kernels (head_kernels): 1 for the argmax, 2 for the
 * draw, 4 for the adjustment (1: logits only, 2: and argmaxes, 3: and draws, 4: draws and argmaxes,
 * ...). A step captured without a kernel must not be replayed for one that needs it: a replay for a
 * greedy row of a graph captured with every row drawn would leave its token stale. */
static int head_mode(const gcall *C) {
    int n = 0;
    for (int i = 0; i < C->np; i++) n += C->pc[i].logits != NULL;
    if (!n) return 0;
    if (n < C->np) return -1;
    int g, d, a;
    head_kernels(C, &g, &d, &a);
    return 1 + g + 2 * d + 4 * a;
}

/* Whether the call is a replayable decode step; its indexer columns in *n_cap. */
static int graph_ok(const gcall *C, int *n_cap) {
    const dsv4_config *c = &C->g->m->cfg;
    mk_cuda_tuning tu;
    mk_cuda_ctx_get_tuning(C->ctx, &tu);
    if (!tu.graphs || !tu.cmp_step || C->w->graphs_off || prof_on() || mk_cuda_trace_active(C->ctx) ||
        c->n_layers < 1 || head_mode(C) < 0)
        return 0;
    if (C->hk && (C->hk->dump || C->hk->indexer || C->hk->moe)) return 0;
    int n_all = 0, idx = 0;
    for (int l = 0; l < c->n_layers; l++) idx |= c->compress_ratio[l] == 4;
    for (int i = 0; i < C->np; i++) {
        const gpiece *p = &C->pc[i];
        if (p->T != 1) return 0;
        if (p->s->pool->lay.snapshots && (p->start + 1) % DSV4_BLOCK_TOKENS == 0) return 0; /* snapshots */
        if ((p->start + 1) / 4 > n_all) n_all = (p->start + 1) / 4;
    }
    *n_cap = idx ? idx_cols(C->w, n_all) : 0;
    return 1;
}

/* The compressors' counters of the call's pieces: saved (dir 0), restored (dir -1), or advanced as
 * a decode step's compressors advance them (dir 1: an entry where the position completes a group;
 * the indexer's compressor exists in the layers of ratio 4). */
static void step_counters(gcall *C, int dir) {
    const dsv4_config *c = &C->g->m->cfg;
    int *sv = C->w->cnt_save;
    for (int i = 0; i < C->np; i++) {
        const int start = C->pc[i].start;
        for (int l = 0; l < c->n_layers; l++) {
            gstate *st = &C->pc[i].s->ls[l];
            int *q = sv + 2 * ((size_t)i * c->n_layers + l);
            const int r = c->compress_ratio[l];
            if (dir == 0) q[0] = st->n_ckv, q[1] = st->n_ikv;
            else if (dir < 0) st->n_ckv = q[0], st->n_ikv = q[1];
            else if (r && (start + 1) % r == 0) st->n_ckv++, st->n_ikv += r == 4;
        }
    }
}

/* Whether the counters now are the saved ones advanced by one step (the capture's host side did
 * what a replay's step_counters will do). */
static int counters_stepped(gcall *C) {
    const dsv4_config *c = &C->g->m->cfg;
    for (int i = 0; i < C->np; i++)
        for (int l = 0; l < c->n_layers; l++) {
            const gstate *st = &C->pc[i].s->ls[l];
            const int *q = C->w->cnt_save + 2 * ((size_t)i * c->n_layers + l);
            const int r = c->compress_ratio[l], done = r && (C->pc[i].start + 1) % r == 0;
            if (st->n_ckv != q[0] + done || st->n_ikv != q[1] + (done && r == 4)) return 0;
        }
    return 1;
}

/* Graphs off for the work from now on (why: said once on stderr), and this step as launches. */
static int run_without_graphs(gcall *C, const char *why, mk_err *err) {
    C->w->graphs_off = 1;
    fprintf(stderr, "minke: cuda: decode steps run without graphs from now on: %s\n", why);
    C->no_sync = 0;
    C->w->gcount.eager++;
    return run_call(C, err);
}

/* A replayable step: the graph of its shape replayed (captured first if new), then the head's
 * results to the host. */
static int run_graph(gcall *C, int n_cap, mk_err *err) {
    dsv4_cuda_work *w = C->w;
    mk_cuda_ctx *ctx = C->ctx;
    const int mode = head_mode(C);
    const dsv4_cuda_pool *pool = C->pc[0].s->pool;
    ggraph *e = NULL, *lru = &w->graphs[0];
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        ggraph *q = &w->graphs[i];
        if (q->g && q->np == C->np && q->n_cap == n_cap && q->mode == mode && q->base == pool->base &&
            q->ids == w->ids && q->block_bytes == pool->lay.bytes)
            e = q;
        if (!q->g || (lru->g && q->used < lru->used)) lru = q;
    }
    C->no_sync = 1;
    if (e) {
        step_counters(C, 1);
        w->gcount.replayed++;
    } else {
        step_counters(C, 0);
        C->replay_bad = 0;
        mk_err e0 = {0};
        if (mk_cuda_capture_begin(ctx, &e0)) /* (the lane's or the branch's streams refused, say) */
            return run_without_graphs(C, e0.msg, err);
        mk_err e1 = {0}, e2 = {0};
        int rc = run_call(C, &e1);
        mk_cuda_graph *gr = NULL;
        int rc2 = mk_cuda_capture_end(ctx, &gr, &e2);
        if (rc || rc2 || C->replay_bad || !counters_stepped(C)) { /* nothing ran: the step as launches */
            mk_cuda_graph_free(gr);
            step_counters(C, -1);
            return run_without_graphs(C,
                                      rc ? e1.msg : rc2 ? e2.msg : C->replay_bad ? "a launch depends on the positions"
                                                                               : "the capture's counters differ from a step's",
                                      err);
        }
        mk_cuda_graph_free(lru->g);
        *lru = (ggraph){gr, C->np, n_cap, mode, pool->base, w->ids, pool->lay.bytes, 0};
        e = lru;
        w->gcount.captured++;
    }
    e->used = ++w->graph_tick;
    C->no_sync = 0;
    TRY(mk_cuda_graph_launch(ctx, e->g, err));
    if (C->defer) {
        C->deferred = 1;
        return head_queue(C, err);
    }
    return head_collect(C, err);
}

void dsv4_cuda_work_graph_counts(const dsv4_cuda_work *w, dsv4_cuda_graph_counts *out) {
    *out = w->gcount;
    mk_cuda_tuning tu;
    mk_cuda_ctx_get_tuning(w->g->ctx, &tu);
    out->off = w->graphs_off || !tu.graphs || !tu.cmp_step;
}

dsv4_cuda_work *dsv4_cuda_seq_work(dsv4_cuda_seq *s) { return s->work; }

int dsv4_cuda_forward_batch(dsv4_cuda_work *w, dsv4_cuda_seq *const *seqs, const int32_t *const *tokens,
                            const int *n, float *const *logits, int np, mk_err *err) {
    return dsv4_cuda_forward_batch_am(w, seqs, tokens, n, logits, NULL, NULL, np, err);
}

int dsv4_cuda_forward_batch_am(dsv4_cuda_work *w, dsv4_cuda_seq *const *seqs, const int32_t *const *tokens,
                               const int *n, float *const *logits, int32_t *const *argmax,
                               const mk_sample_draw *const *draws, int np, mk_err *err) {
    if (w->n_pending) return mk_fail(err, MK_EINTERNAL, "cuda: a forward call while a launched call is not waited for");
    TRY(dsv4_cuda_batch_launch(w, seqs, tokens, n, logits, argmax, draws, NULL, np, err));
    return dsv4_cuda_batch_wait(w, err);
}

int dsv4_cuda_batch_launch(dsv4_cuda_work *w, dsv4_cuda_seq *const *seqs, const int32_t *const *tokens,
                           const int *n, float *const *logits, int32_t *const *argmax,
                           const mk_sample_draw *const *draws, const char *feed, int np, mk_err *err) {
    const int io = step_io() && w->n_pending > 0;
    TRY(staging_next(w, err));
    w->io = io;
    struct gpend *P = &w->call[w->half];
    gcall *C = &P->C;
    int rc = call_setup(C, w, seqs, tokens, n, logits, argmax, draws, feed, np, P->pc, err);
    if (rc) return rc;
    C->defer = 1;
    int n_cap = 0;
    if (graph_ok(C, &n_cap)) {
        rc = run_graph(C, n_cap, err);
    } else {
        w->gcount.eager++;
        rc = run_call(C, err);
    }
    if (!rc && C->deferred)
        rc = mk_cuda_event_record_on(C->ctx, w->io ? MK_CUDA_S_DOWN : MK_CUDA_S_MAIN, P->done, err);
    for (int i = 0; i < np; i++) {
        if (rc) {
            seqs[i]->broken = 1; /* the device may have changed its state before the failure */
            continue;
        }
        seqs[i]->pos += n[i];
        seqs[i]->n_last = n[i];
    }
    if (rc) return rc;
    int r = 0; /* the rows a next call may be fed from */
    for (int i = 0; i < np; i++)
        if (P->pc[i].logits) w->prev_seq[r++] = P->pc[i].argmax ? seqs[i] : NULL;
    w->prev_rows = r;
    P->pending = 1;
    P->queued = C->deferred;
    if (!w->n_pending++) w->oldest = w->half;
    return MK_OK;
}

int dsv4_cuda_batch_wait(dsv4_cuda_work *w, mk_err *err) {
    if (!w->n_pending) return mk_fail(err, MK_EINTERNAL, "cuda: no launched call to wait for");
    const int h = w->oldest;
    struct gpend *P = &w->call[h];
    int rc = P->queued ? mk_cuda_event_wait(P->done, err) : MK_OK;
    P->pending = 0;
    w->oldest = --w->n_pending ? h ^ 1 : -1;
    if (rc) {
        for (int i = 0; i < P->C.np; i++) P->pc[i].s->broken = 1;
        w->prev_rows = 0;
        return rc;
    }
    if (P->queued) w->upl_pending[h] = 0; /* its upload ran before its kernels */
    head_fill(&P->C);
    return MK_OK;
}

int dsv4_cuda_forward(dsv4_cuda_seq *s, const int32_t *tokens, int T, float *logits, mk_err *err) {
    if (!s->work) return mk_fail(err, MK_EINVAL, "cuda: a paged sequence runs through dsv4_cuda_forward_batch");
    return dsv4_cuda_forward_batch(s->work, &s, &tokens, &T, logits ? &logits : NULL, 1, err);
}

int dsv4_cuda_forward_argmax(dsv4_cuda_seq *s, const int32_t *tokens, int T, int32_t *argmax, mk_err *err) {
    if (!s->work) return mk_fail(err, MK_EINVAL, "cuda: a paged sequence runs through dsv4_cuda_forward_batch");
    float dummy = 0.0f, *lg = &dummy;
    return dsv4_cuda_forward_batch_am(s->work, &s, &tokens, &T, &lg, &argmax, NULL, 1, err);
}

int dsv4_cuda_mtp_forward(dsv4_cuda_seq *s, const int32_t *ids, int T, float *logits, mk_err *err) {
    dsv4_cuda *g = s->g;
    const dsv4_config *c = &g->m->cfg;
    mk_cuda_ctx *ctx = g->ctx;
    dsv4_cuda_work *w = s->work;
    if (!c->n_mtp) return mk_fail(err, MK_ENOTSUP, "this checkpoint has no MTP layer");
    if (!w || !w->with_mtp) return mk_fail(err, MK_ENOTSUP, "cuda: the MTP layer runs on standalone sequences only");
    if (s->broken) return mk_fail(err, MK_EINTERNAL, "the sequence failed in the middle of a call; reset or restore it");
    if (T != s->n_last) return mk_fail(err, MK_EINVAL, "MTP call of %d ids after a call of %d tokens", T, s->n_last);
    if (!logits) return mk_fail(err, MK_EINVAL, "MTP call without logits");
    int start = s->mtp_pos, hc = c->hc, d = c->dim;
    if (start + T > s->max_len)
        return mk_fail(err, MK_ERANGE, "position %d exceeds the sequence capacity %d", start + T, s->max_len);
    TRY(check_tokens(c, ids, T, 0, err));
    const glayer *L = &g->mtp;
    gpiece p = {.s = s, .T = T, .start = start, .row0 = 0, .logits = logits, .dtbl = w->tbl};
    gcall C = {.g = g, .ctx = ctx, .w = w, .pc = &p, .np = 1, .R = T, .hk = w->hh ? &s->hooks : NULL};
    if (w->n_pending) return mk_fail(err, MK_EINTERNAL, "cuda: an MTP call while a launched call is not waited for");
    TRY(staging_next(w, err));
    C.ham = w->ham;
    w->prev_rows = 0;
    set_layout(w, 0);
    p.dtbl = w->tbl;
    for (int b = 0; b < s->n_blocks && b < w->tbl_cap; b++) w->hids[(w->tbl - w->ids) + b] = s->blocks[b];
    memcpy(w->hids, ids, sizeof(int32_t) * (size_t)T);
    for (int j = 0; j < T; j++) w->hids[(w->pos - w->ids) + j] = start + j;
    fill_apc(w, &p, 0, c->n_layers, c->n_layers + 1);
    TRY(upload_ids(w, w->ids_bytes + sizeof(mk_cuda_apiece) * (size_t)(c->n_layers + c->n_mtp), err));
    TRY(mk_cuda_embed_hc(ctx, g->embed, c->vocab, w->tok, T, 1, d, w->me, err));
    TRY(mk_cuda_rmsnorm(ctx, w->me, T, d, L->enorm, c->norm_eps, w->me, err));
    TRY(mk_cuda_rmsnorm(ctx, w->h, T * hc, d, L->hnorm, c->norm_eps, w->mhn, err));
    TRY(lin(&C, &L->e_proj, w->me, T, w->sub, 1, err));
    TRY(lin(&C, &L->h_proj, w->mhn, T * hc, w->mhp, 1, err));
    TRY(mk_cuda_add_bcast_bf16(ctx, w->mhp, w->sub, T * hc, hc, d, w->mh, err));
    /* one row (T == 1) is the logits row: the head's collapse runs with the block's last hc_post */
    const gnext nx_head = {L->hc_head_fn, L->hc_head_scale, L->hc_head_base, L->norm, 1, NULL, NULL};
    TRY(block(&C, c->n_layers, L, w->mh, 0, T == 1 ? &nx_head : NULL, err));
    TRY(head(&C, w->mh, L->hc_head_fn, L->hc_head_scale, L->hc_head_base, L->norm, T == 1, err));
    s->mtp_pos = start + T;
    return MK_OK;
}

/* ---- CUDA graph probe (benchmarks) --------------------------------------------------------------
 * The same decode step (s's next position, token tok) run `reps` times back to back as the stream
 * of kernels the forward call launches, then captured once into a CUDA graph and replayed `reps`
 * times: what a graph would save on the GPU. Steps at the same position recompute the same values
 * (the window and state slots are rewritten with the same bytes), so the two argmaxes must agree.
 * Only at a position that completes no compressed group and no KV block (the host decides those
 * launches), without hooks or MINKE_CUDA_PROFILE. The sequence is then left broken. */
static double probe_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int dsv4_cuda_graph_probe(dsv4_cuda_seq *s, int32_t tok, int reps, dsv4_cuda_graph_stats *st, mk_err *err) {
    dsv4_cuda_work *w = s->work;
    memset(st, 0, sizeof *st);
    if (!w) return mk_fail(err, MK_EINVAL, "graph probe: needs a standalone sequence");
    if (reps < 1) return mk_fail(err, MK_EINVAL, "graph probe: reps %d < 1", reps);
    const dsv4_config *c = &s->g->m->cfg;
    for (int l = 0; l < c->n_layers; l++) {
        const int r = c->compress_ratio[l];
        if (r && (s->pos + 1) % r == 0)
            return mk_fail(err, MK_EINVAL, "graph probe: position %d completes a group of ratio %d (layer %d)", s->pos,
                           r, l);
    }
    if ((s->pos + 1) % DSV4_BLOCK_TOKENS == 0)
        return mk_fail(err, MK_EINVAL, "graph probe: position %d ends a KV block", s->pos);
    mk_cuda_ctx *ctx = s->g->ctx;
    float dummy = 0.0f;
    float *lg = &dummy;
    int32_t am = -1, *amp = &am;
    const int32_t *tk = &tok;
    int one = 1;
    gpiece pc;
    gcall C;
    if (w->n_pending) return mk_fail(err, MK_EINTERNAL, "graph probe: a launched call is not waited for");
    TRY(staging_next(w, err));
    TRY(call_setup(&C, w, &s, &tk, &one, &lg, &amp, NULL, NULL, 1, &pc, err));
    C.no_sync = 1;
    s->broken = 1; /* from here on the state is that of a repeated step */
    TRY(run_call(&C, err)); /* warm-up */
    TRY(sync_call(&C, err));
    double t0 = probe_now();
    for (int i = 0; i < reps; i++) TRY(run_call(&C, err));
    TRY(sync_call(&C, err));
    st->ms_stream = (probe_now() - t0) * 1e3 / reps;
    TRY(mk_cuda_download(ctx, &st->argmax_stream, w->am, sizeof(int32_t), err));
    t0 = probe_now();
    TRY(mk_cuda_capture_begin(ctx, err));
    int rc = run_call(&C, err);
    mk_cuda_graph *gr = NULL;
    mk_err e2 = {0};
    int rc2 = mk_cuda_capture_end(ctx, &gr, rc ? &e2 : err);
    if (rc || rc2) {
        mk_cuda_graph_free(gr);
        return rc ? rc : rc2;
    }
    st->ms_capture = (probe_now() - t0) * 1e3;
    st->nodes = mk_cuda_graph_nodes(gr);
    rc = mk_cuda_graph_launch(ctx, gr, err); /* warm-up */
    if (!rc) rc = sync_call(&C, err);
    t0 = probe_now();
    for (int i = 0; i < reps && !rc; i++) rc = mk_cuda_graph_launch(ctx, gr, err);
    if (!rc) rc = sync_call(&C, err);
    st->ms_graph = (probe_now() - t0) * 1e3 / reps;
    if (!rc) rc = mk_cuda_download(ctx, &st->argmax_graph, w->am, sizeof(int32_t), err);
    mk_cuda_graph_free(gr);
    return rc;
}
