/* dsv4.c — the DeepSeek-V4-Flash forward pass on the CPU, mirroring the reference
 * inference/model.py (spec: ../shared/docs/model-dsv4.md, section 3).
 *
 *   h = embed(ids) repeated over hc streams                        [T, hc, dim]
 *   for each layer:  h = Block(h)   (mHC around attention, then around the MoE)
 *   logits = head(norm(hc_head(h[last])))                          [vocab] fp32
 *
 * A call runs T tokens starting at the sequence's position: the reference's prefill (position 0)
 * and one-token decodes, and any chunk of a prompt at any position (chunked prefill). Activations
 * are fp32 arrays holding bf16 values wherever the reference holds bf16 (see ops.h); the rounding
 * points, FP8/FP4 activation simulations and fp32 islands are the reference's. Every intermediate
 * goes through DUMP with a name such as "L3.attn.q"; MoE and indexer decisions go through the
 * decision hooks (dsv4.h).
 *
 * Chunks. Everything a token computes depends only on its position and the state before it, and
 * the code takes care that it is also computed the same way whatever the split:
 *   - window rows of positions before the call come from the ring, those of the call from its
 *     own kv rows; the ring is written after attention (a chunk longer than the window would
 *     otherwise overwrite rows its first tokens still need);
 *   - the compressors run token by token through their pooling state (the reference's decode
 *     rule), which pools the same values in the same order as its prefill rule, so a chunk may
 *     end anywhere inside a group; the first overlap group reads fresh slots (kv 0, score -inf)
 *     whose weights are exactly 0;
 *   - a query at position p sees the indexer keys and HCA entries of groups that end at or before
 *     p (causal inside a chunk), and top-k keeps min(index_topk, visible) entries, so the
 *     selection does not depend on where the call ends;
 *   - linears: mk_linear's result for a row does not depend on how many rows the call has
 *     (src/ops/cpu/gemm.c), so rows can be stacked freely.
 * So a prompt run as one call or as any chunks, or token by token, gives bit-identical logits and
 * state (tests/unit/test_dsv4_chunked.c).
 *
 * Batched steps (dsv4_forward_batch): several pieces, each on its own sequence at its own
 * position, run as one forward: their rows are concatenated and go through every linear and
 * routed expert in one call (experts see the rows of all pieces routed to them), so each weight
 * matrix is read once per step; attention, compressors, indexer and window run per piece over
 * its own state and blocks. Every op is per row or per piece, so a piece's results are those of
 * its sequence run alone, bit for bit.
 *
 * Entries live in blocks (dsv4_kv_layout): entry j of a ratio-r compressor is row j % (bt / r) of
 * the block table's entry j / (bt / r). At each block end a call passes, the slot state is
 * written into that block when the layout has snapshots.
 */
#include "models/dsv4.h"
#include "num/formats.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- dumping -------------------------------------------------------------------------------- */

static void dump(dsv4_seq *s, const float *data, int ndim, const int64_t *shape, const char *fmt, ...)
    MK_PRINTF(5, 6);
static void dump(dsv4_seq *s, const float *data, int ndim, const int64_t *shape, const char *fmt, ...) {
    if (!s->hooks.dump) return;
    char name[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    s->hooks.dump(s->hooks.ctx, name, data, ndim, shape);
}
#define DUMP2(d, a, b, ...) do { int64_t _sh[2] = {(a), (b)}; dump(s, d, 2, _sh, __VA_ARGS__); } while (0)
#define DUMP3(d, a, b, c, ...) do { int64_t _sh[3] = {(a), (b), (c)}; dump(s, d, 3, _sh, __VA_ARGS__); } while (0)

/* ---- scratch -------------------------------------------------------------------------------- */

/* Per-call scratch, carved from one allocation sized for max_tok tokens. */
typedef struct {
    float *h2, *x, *post, *comb, *sub;       /* mHC */
    float *qr, *q, *kv, *o, *og, *oa, *ot;   /* attention */
    float *ckv, *csc;                        /* compressor projections [T, coff*D] */
    float *cent;                             /* new compressed entries [T/ratio+1, D] */
    float *iq, *iw, *isc;                    /* indexer */
    int32_t *sel;                            /* [T, topk] */
    const float **rows;                      /* [window + max entries] */
    float *gsc, *gw;                         /* gate scores [T, E], weights [T, k] */
    int32_t *gidx;                           /* [T, k] */
    float *gmargin;                          /* [T] */
    float *y;                                /* [T, dim] fp32 MoE accumulator */
    float *xb, *g, *u, *eo;                  /* expert batch buffers */
    float *ewt;                              /* [T] routing weights of an expert's batch */
    int32_t *btok;                           /* [T] */
    int32_t *toks;                           /* [T] token ids of all rows of the call */
    float *lin;                              /* mk_linear scratch */
} scratch;

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Lays out (or, with base == NULL, just measures) the scratch for T tokens. */
static size_t scratch_layout(const dsv4_config *c, int T, int max_len, float *base, scratch *sp) {
    size_t off = 0;
    int HD = c->n_heads * c->head_dim;
    int cmax = 2 * (c->head_dim > c->index_head_dim ? c->head_dim : c->index_head_dim);
    int maxk = c->dim;
    if (c->q_lora > maxk) maxk = c->q_lora;
    if (HD / c->o_groups > maxk) maxk = HD / c->o_groups;
    if (c->o_groups * c->o_lora > maxk) maxk = c->o_groups * c->o_lora;
    if (c->moe_inter > maxk) maxk = c->moe_inter;
    int n_ent = max_len / 4 + 1;
    size_t rows_n = (size_t)c->window + (size_t)max_len / 2 + 16;
#define CARVE(field, type, count)                                              \
    do {                                                                       \
        if (base) sp->field = (type)(void *)(base + off);                      \
        off += align16((size_t)(count));                                       \
    } while (0)
    size_t Tz = (size_t)T;
    CARVE(h2, float *, Tz * c->hc * c->dim);
    CARVE(x, float *, Tz * c->dim);
    CARVE(post, float *, Tz * c->hc);
    CARVE(comb, float *, Tz * c->hc * c->hc);
    CARVE(sub, float *, Tz * c->dim);
    CARVE(qr, float *, Tz * c->q_lora);
    CARVE(q, float *, Tz * HD);
    CARVE(kv, float *, Tz * c->head_dim);
    CARVE(o, float *, Tz * HD);
    CARVE(og, float *, Tz * (HD / c->o_groups));
    CARVE(oa, float *, Tz * c->o_groups * c->o_lora);
    CARVE(ot, float *, Tz * c->o_lora);
    CARVE(ckv, float *, Tz * cmax);
    CARVE(csc, float *, Tz * cmax);
    CARVE(cent, float *, (Tz + 1) * cmax);
    CARVE(iq, float *, Tz * c->index_heads * c->index_head_dim);
    CARVE(iw, float *, Tz * c->index_heads);
    CARVE(isc, float *, (size_t)n_ent);
    CARVE(sel, int32_t *, Tz * (c->index_topk < n_ent ? c->index_topk : n_ent) + 16);
    CARVE(rows, const float **, rows_n * (sizeof(void *) / sizeof(float)));
    CARVE(gsc, float *, Tz * c->n_experts);
    CARVE(gw, float *, Tz * c->n_act);
    CARVE(gidx, int32_t *, Tz * c->n_act);
    CARVE(gmargin, float *, Tz);
    CARVE(y, float *, Tz * c->dim);
    CARVE(xb, float *, Tz * (c->dim > c->moe_inter ? c->dim : c->moe_inter));
    CARVE(g, float *, Tz * c->moe_inter);
    CARVE(u, float *, Tz * c->moe_inter);
    CARVE(eo, float *, Tz * c->dim);
    CARVE(btok, int32_t *, Tz);
    CARVE(ewt, float *, Tz);
    CARVE(toks, int32_t *, Tz);
    CARVE(lin, float *, mk_linear_scratch(T, maxk));
#undef CARVE
    return off;
}

static int ensure_scratch(dsv4_seq *s, int T, scratch *sp, mk_err *err) {
    const dsv4_config *c = &s->m->cfg;
    if (T > s->max_tok || !s->scratch) {
        size_t need = scratch_layout(c, T, s->max_len, NULL, sp);
        float *p = realloc(s->scratch, need * sizeof(float));
        if (!p) return mk_fail(err, MK_ENOMEM, "out of memory for a %d-token call", T);
        s->scratch = p;
        s->scratch_floats = need;
        s->max_tok = T;
    }
    scratch_layout(c, s->max_tok, s->max_len, s->scratch, sp);
    return MK_OK;
}

/* ---- small helpers -------------------------------------------------------------------------- */

static void lin(dsv4_seq *s, scratch *sp, const mk_wmat *W, const float *x, int m, float *y, int round) {
    mk_linear(s->m->pool, W, x, m, y, round, sp->lin);
}

/* One piece of a call: T rows of sequence s at positions [start, start + T), rows [row0, row0 + T)
 * of the call's activations. */
typedef struct {
    dsv4_seq *s;
    int row0, T, start;
    int k_sel;      /* indexer: entries selected per row */
    int32_t *sel;   /* [T, k_sel] */
} piece;

/* ---- blocks --------------------------------------------------------------------------------- */

static uint8_t *block_ptr(const dsv4_seq *s, int b) { return s->kv_base + (size_t)s->blocks[b] * s->lay.bytes; }

/* Entry j (D floats) of a region at byte offset off holding `per` entries per block. */
static float *entry(const dsv4_seq *s, size_t off, int per, int D, int j) {
    return (float *)(block_ptr(s, j / per) + off) + (size_t)(j % per) * D;
}

static float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
static float siluf(float x) { return x / (1.0f + expf(-x)); }

/* Indices of the k largest of v[0..n) in descending order (ties: lower index first). */
static void topk_desc(const float *v, int n, int k, int32_t *out) {
    for (int i = 0; i < k; i++) out[i] = -1;
    for (int j = 0; j < n; j++) {
        float x = v[j];
        int pos = k;
        while (pos > 0 && (out[pos - 1] < 0 || v[out[pos - 1]] < x)) pos--;
        if (pos >= k) continue;
        for (int t = k - 1; t > pos; t--) out[t] = out[t - 1];
        out[pos] = j;
    }
}

/* Per-head RMS normalisation of q without weight, in bf16 arithmetic as the reference does it:
 * q * rsqrt(mean(q^2) + eps) with every intermediate a bf16 tensor. */
static void q_rms_bf16(float *q, int D, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < D; i++) ss += mk_bf16r(q[i] * q[i]);
    float mean = mk_bf16r(ss / (float)D);
    float v = mk_bf16r(mean + eps);
    float r = mk_bf16r(1.0f / sqrtf(v));
    for (int i = 0; i < D; i++) q[i] = mk_bf16r(q[i] * r);
}

/* ---- compressor ----------------------------------------------------------------------------- */

/* Post-processing of one new compressed entry (fp32 pooled values in e, D wide) at position
 * `pos` (its group's first token): bf16, RMSNorm, RoPE on the last rd dims, then the indexer
 * path (Hadamard + FP4 simulation) or the attention path (FP8 simulation of the nope dims). */
static void cmp_finish(const dsv4_model *m, const dsv4_layer *L, const dsv4_compressor *C, int is_idx,
                       float *e, int pos) {
    const dsv4_config *c = &m->cfg;
    int D = C->D, rd = c->rope_dim;
    for (int i = 0; i < D; i++) e[i] = mk_bf16r(e[i]);
    mk_rmsnorm(e, 1, D, C->norm, c->norm_eps, e);
    mk_rope(e + D - rd, rd, L->rope, pos, 0);
    if (is_idx) {
        mk_hadamard(e, D, 1.0f / sqrtf((float)D));
        mk_fp4_quant_sim(e, D, 32);
    } else {
        mk_act_quant_sim(e, D - rd, 64);
    }
}

/* Softmax-pool `ns` slots per channel: out[ch] = sum_slot softmax(score)[slot] * kv[slot]. The
 * slot vectors are given as pointers (kv, score) each D wide. */
static void pool_slots(const float *const *kv, const float *const *sc, int ns, int D, float *out) {
    for (int ch = 0; ch < D; ch++) {
        float mx = -INFINITY;
        for (int j = 0; j < ns; j++) if (sc[j][ch] > mx) mx = sc[j][ch];
        float w[256], sum = 0.0f;
        for (int j = 0; j < ns; j++) sum += (w[j] = expf(sc[j][ch] - mx));
        float acc = 0.0f;
        for (int j = 0; j < ns; j++) acc += kv[j][ch] * (w[j] / sum);
        out[ch] = acc;
    }
}

/* Runs a compressor (the attention's, or with is_idx the indexer's) over the call's rows x
 * [rows, dim]: the projections of all pieces in one call each, then per piece token by token
 * through its sequence's pooling state (the reference's decode rule; it pools the same values in
 * the same order as its prefill rule). New entries go to the piece's blocks (region ckv / ikv,
 * row n_ckv / n_ikv, which advances). With snapshots, an overlap compressor writes its state
 * slots [0, ratio) (first D channels) to the block region cst / icst at every block end. */
static void compressor(dsv4_seq *s0, scratch *sp, int layer, const dsv4_layer *L, const dsv4_compressor *C,
                       int is_idx, const float *x, const piece *pcs, int np, int rows) {
    const dsv4_model *m = s0->m;
    int r = C->ratio, D = C->D, W2 = C->coff * D, ov = C->coff == 2;
    lin(s0, sp, &C->wkv, x, rows, sp->ckv, 0); /* fp32: x.float() @ wkv.float()^T */
    lin(s0, sp, &C->wgate, x, rows, sp->csc, 0);
    for (int pi = 0; pi < np; pi++) {
    dsv4_seq *s = pcs[pi].s;
    dsv4_layer_state *ls = &s->ls[layer];
    const int T = pcs[pi].T, start = pcs[pi].start;
    const int bt = s->lay.block_tokens, per = bt / r;
    const int snap = s->lay.snapshots && layer < m->cfg.n_layers;
    const size_t ent_off = is_idx ? s->lay.ikv[layer] : s->lay.ckv[layer];
    const size_t snap_off = is_idx ? s->lay.icst[layer] : s->lay.cst[layer];
    int *n_cache = is_idx ? &ls->n_ikv : &ls->n_ckv;
    float *kv_state = is_idx ? ls->ikv_state : ls->kv_state, *sc_state = is_idx ? ls->isc_state : ls->sc_state;
    float *kvp = sp->ckv + (size_t)pcs[pi].row0 * W2, *scp = sp->csc + (size_t)pcs[pi].row0 * W2;
    const float *kvs[256] = {0}, *scs[256] = {0};
    for (int t = 0; t < T; t++) {
        int p = start + t;
        float *kt = kvp + (size_t)t * W2, *st = scp + (size_t)t * W2;
        for (int i = 0; i < W2; i++) st[i] += C->ape[(size_t)(p % r) * W2 + i];
        int slot = ov ? r + p % r : p % r;
        memcpy(kv_state + (size_t)slot * W2, kt, sizeof(float) * W2);
        memcpy(sc_state + (size_t)slot * W2, st, sizeof(float) * W2);
        if ((p + 1) % r == 0) {
            float *e = entry(s, ent_off, per, D, *n_cache);
            int ns = 0;
            if (ov) {
                for (int i = 0; i < r; i++) {
                    /* slots 0..r-1: the previous group's first half; -inf scores (fresh state,
                     * the first group) give weight 0 exactly */
                    kvs[ns] = kv_state + (size_t)i * W2;
                    scs[ns++] = sc_state + (size_t)i * W2;
                }
                for (int i = 0; i < r; i++) {
                    kvs[ns] = kv_state + (size_t)(r + i) * W2 + D;
                    scs[ns++] = sc_state + (size_t)(r + i) * W2 + D;
                }
            } else {
                for (int i = 0; i < r; i++) {
                    kvs[ns] = kv_state + (size_t)i * W2;
                    scs[ns++] = sc_state + (size_t)i * W2;
                }
            }
            pool_slots(kvs, scs, ns, D, e);
            if (ov) {
                memcpy(kv_state, kv_state + (size_t)r * W2, sizeof(float) * (size_t)r * W2);
                memcpy(sc_state, sc_state + (size_t)r * W2, sizeof(float) * (size_t)r * W2);
            }
            cmp_finish(m, L, C, is_idx, e, p + 1 - r);
            (*n_cache)++;
        }
        if (snap && ov && (p + 1) % bt == 0) {
            float *dst = (float *)(block_ptr(s, p / bt) + snap_off);
            for (int i = 0; i < r; i++) {
                memcpy(dst + (size_t)i * D, kv_state + (size_t)i * W2, sizeof(float) * D);
                memcpy(dst + (size_t)(r + i) * D, sc_state + (size_t)i * W2, sizeof(float) * D);
            }
        }
    }
    }
}

/* ---- indexer -------------------------------------------------------------------------------- */

/* Lightning indexer of a CSA layer: selects, per query row of each piece, up to index_topk
 * compressed entries of the piece's sequence (pcs[i].sel [T, k_sel], -1 = none). */
static void indexer(dsv4_seq *s0, scratch *sp, int layer, const dsv4_layer *L, const float *x, const float *qr,
                    piece *pcs, int np, int rows) {
    dsv4_seq *s = s0; /* hooks, dumps */
    const dsv4_config *c = &s0->m->cfg;
    int IH = c->index_heads, ID = c->index_head_dim, rd = c->rope_dim;
    float *iq = sp->iq, *iw = sp->iw;
    lin(s0, sp, &L->idx_wq_b, qr, rows, iq, 1);
    for (int pi = 0; pi < np; pi++)
        for (int t = 0; t < pcs[pi].T; t++)
            for (int h = 0; h < IH; h++) {
                float *v = iq + ((size_t)(pcs[pi].row0 + t) * IH + h) * ID;
                mk_rope(v + ID - rd, rd, L->rope, pcs[pi].start + t, 0);
                mk_hadamard(v, ID, 1.0f / sqrtf((float)ID));
                mk_fp4_quant_sim(v, ID, 32);
            }
    DUMP3(iq, rows, IH, ID, "L%d.idx.q", layer);
    compressor(s0, sp, layer, L, &L->idx_cmp, 1, x, pcs, np, rows);
    lin(s0, sp, &L->idx_wproj, x, rows, iw, 1);
    float wscale = (float)(pow((double)ID, -0.5) * pow((double)IH, -0.5));
    for (int i = 0; i < rows * IH; i++) iw[i] = mk_bf16r(iw[i] * wscale);
    /* selections: piece rows at row0 * kcap (kcap >= any piece's k, see scratch_layout) */
    const int n_ent = s0->max_len / 4 + 1, kcap = c->index_topk < n_ent ? c->index_topk : n_ent;
    for (int pi = 0; pi < np; pi++) {
        dsv4_seq *ps = pcs[pi].s;
        const int T = pcs[pi].T, start = pcs[pi].start, r0 = pcs[pi].row0;
        const int per = ps->lay.block_tokens / 4;
        int end = start + T, n_all = end / 4;
        int k = c->index_topk < n_all ? c->index_topk : n_all;
        pcs[pi].k_sel = k;
        pcs[pi].sel = sp->sel + (size_t)r0 * kcap;
        for (int t = 0; t < T; t++) {
            int vis = (start + t + 1) / 4; /* groups that end at or before this token */
            float *sc = sp->isc;
            const float *iqt = iq + (size_t)(r0 + t) * IH * ID, *iwt = iw + (size_t)(r0 + t) * IH;
            for (int j = 0; j < vis; j++) {
                const float *K = entry(ps, ps->lay.ikv[layer], per, ID, j);
                float acc = 0.0f;
                for (int h = 0; h < IH; h++) {
                    float d = mk_bf16r(mk_vdot(iqt + (size_t)h * ID, K, ID));
                    if (d < 0) d = 0;
                    acc += mk_bf16r(d * iwt[h]);
                }
                sc[j] = mk_bf16r(acc);
            }
            int32_t *out = pcs[pi].sel + (size_t)t * k;
            int kk = k < vis ? k : vis;
            topk_desc(sc, vis, kk, out);
            for (int i = kk; i < k; i++) out[i] = -1;
            if (s->hooks.indexer && k > 0) s->hooks.indexer(s->hooks.ctx, layer, t, T, k, out, sc, vis);
            for (int i = 0; i < k; i++)
                if (out[i] >= vis) out[i] = -1; /* a forced choice can only name visible entries */
        }
    }
}

/* ---- attention ------------------------------------------------------------------------------ */

static int attention(dsv4_seq *s, scratch *sp, int layer, const dsv4_layer *L, const float *x, piece *pcs, int np,
                     int T, float *out) {
    const dsv4_model *m = s->m;
    const dsv4_config *c = &m->cfg;
    int H = c->n_heads, D = c->head_dim, rd = c->rope_dim, nope = D - rd, HD = H * D;
    int G = c->o_groups, Dg = HD / G, win = c->window, r = L->ratio;
    /* q path: low-rank with a norm, then per-head RMS normalisation and RoPE */
    lin(s, sp, &L->wq_a, x, T, sp->qr, 1);
    mk_rmsnorm(sp->qr, T, c->q_lora, L->q_norm, c->norm_eps, sp->qr);
    DUMP2(sp->qr, T, c->q_lora, "L%d.attn.qr", layer);
    lin(s, sp, &L->wq_b, sp->qr, T, sp->q, 1);
    for (int pi = 0; pi < np; pi++)
        for (int t = 0; t < pcs[pi].T; t++)
            for (int h = 0; h < H; h++) {
                float *qh = sp->q + ((size_t)(pcs[pi].row0 + t) * H + h) * D;
                q_rms_bf16(qh, D, c->norm_eps);
                mk_rope(qh + nope, rd, L->rope, pcs[pi].start + t, 0);
            }
    DUMP3(sp->q, T, H, D, "L%d.attn.q", layer);
    /* the single shared K=V head */
    lin(s, sp, &L->wkv, x, T, sp->kv, 1);
    mk_rmsnorm(sp->kv, T, D, L->kv_norm, c->norm_eps, sp->kv);
    for (int pi = 0; pi < np; pi++)
        for (int t = 0; t < pcs[pi].T; t++) {
            float *kt = sp->kv + (size_t)(pcs[pi].row0 + t) * D;
            mk_rope(kt + nope, rd, L->rope, pcs[pi].start + t, 0);
            mk_act_quant_sim(kt, nope, 64);
        }
    DUMP2(sp->kv, T, D, "L%d.attn.kv", layer);
    /* compressed-entry selection (CSA: indexer; HCA: all visible) */
    if (r == 4) indexer(s, sp, layer, L, x, sp->qr, pcs, np, T);
    if (r) compressor(s, sp, layer, L, &L->cmp, 0, x, pcs, np, T);
    float scale = 1.0f / sqrtf((float)D);
    for (int pi = 0; pi < np; pi++) {
        dsv4_seq *ps = pcs[pi].s;
        dsv4_layer_state *st = &ps->ls[layer];
        const int start = pcs[pi].start, Tp = pcs[pi].T;
        const float *kvp = sp->kv + (size_t)pcs[pi].row0 * D;
        const int bt = ps->lay.block_tokens, snap = ps->lay.snapshots && layer < c->n_layers;
        const int per = r ? bt / r : 0, k_sel = r == 4 ? pcs[pi].k_sel : 0;
        /* sparse attention per query; window rows before the call from the ring, the call's own */
        for (int t = 0; t < Tp; t++) {
            int p = start + t, n = 0;
            const float **rows = sp->rows;
            for (int q = p - win + 1 < 0 ? 0 : p - win + 1; q <= p; q++)
                rows[n++] = q >= start ? kvp + (size_t)(q - start) * D : st->win + (size_t)(q % win) * D;
            if (r == 4) {
                const int32_t *sl = pcs[pi].sel + (size_t)t * k_sel;
                for (int i = 0; i < k_sel; i++)
                    if (sl[i] >= 0 && sl[i] < st->n_ckv) rows[n++] = entry(ps, ps->lay.ckv[layer], per, D, sl[i]);
            } else if (r) {
                int vis = (p + 1) / r;
                for (int j = 0; j < vis && j < st->n_ckv; j++) rows[n++] = entry(ps, ps->lay.ckv[layer], per, D, j);
            }
            float *ot = sp->o + (size_t)(pcs[pi].row0 + t) * HD;
            mk_sparse_attn(m->pool, sp->q + (size_t)(pcs[pi].row0 + t) * HD, H, D, rows, n, L->attn_sink, scale, ot);
            for (int h = 0; h < H; h++) mk_rope(ot + (size_t)h * D + nope, rd, L->rope, p, 1);
        }
        /* window snapshots at the block ends inside the piece (ring as it stands after that
         * position), then the ring itself */
        for (int e = (start / bt + 1) * bt - 1; snap && e < start + Tp; e += bt) {
            uint16_t *dst = (uint16_t *)(block_ptr(ps, e / bt) + ps->lay.win[layer]);
            for (int q = e - win + 1; q <= e; q++) {
                const float *src = q >= start ? kvp + (size_t)(q - start) * D : st->win + (size_t)(q % win) * D;
                for (int i = 0; i < D; i++) dst[(size_t)(q % win) * D + i] = mk_f32_to_bf16(src[i]);
            }
        }
        for (int t = (Tp > win ? Tp - win : 0); t < Tp; t++)
            memcpy(st->win + (size_t)((start + t) % win) * D, kvp + (size_t)t * D, sizeof(float) * D);
    }
    DUMP3(sp->o, T, H, D, "L%d.attn.o", layer);
    /* grouped output projection: per group g, o[:, g] @ wo_a[g]^T (bf16, no act quant) */
    for (int g = 0; g < G; g++) {
        for (int t = 0; t < T; t++)
            memcpy(sp->og + (size_t)t * Dg, sp->o + (size_t)t * HD + (size_t)g * Dg, sizeof(float) * Dg);
        mk_wmat Wg = L->wo_a;
        Wg.n = c->o_lora;
        if (Wg.kind == MK_W_BF16) {
            Wg.w = (const uint16_t *)L->wo_a.w + (size_t)g * c->o_lora * Dg;
        } else {
            Wg.w = (const uint8_t *)L->wo_a.w + (size_t)g * c->o_lora * Dg;
            Wg.scale = L->wo_a.scale + (size_t)(g * c->o_lora / 128) * ((Dg + 127) / 128);
        }
        float *tmp = sp->ot; /* [T, o_lora] */
        lin(s, sp, &Wg, sp->og, T, tmp, 1);
        for (int t = 0; t < T; t++)
            memcpy(sp->oa + (size_t)t * G * c->o_lora + (size_t)g * c->o_lora, tmp + (size_t)t * c->o_lora,
                    sizeof(float) * c->o_lora);
    }
    DUMP2(sp->oa, T, G * c->o_lora, "L%d.attn.oa", layer);
    lin(s, sp, &L->wo_b, sp->oa, T, out, 1);
    DUMP2(out, T, c->dim, "L%d.attn.out", layer);
    return MK_OK;
}

/* ---- MoE ------------------------------------------------------------------------------------ */

/* One expert on a batch of nb rows xb [nb, dim]; wt [nb] routing weights or NULL (shared).
 * Output bf16 [nb, dim] into eo. */
static void expert(dsv4_seq *s, scratch *sp, const dsv4_expert *E, const float *xb, int nb, const float *wt, float *eo) {
    const dsv4_config *c = &s->m->cfg;
    int I = c->moe_inter;
    float lim = c->swiglu_limit;
    lin(s, sp, &E->w1, xb, nb, sp->g, 1);
    lin(s, sp, &E->w3, xb, nb, sp->u, 1);
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < I; i++) {
            float g = sp->g[(size_t)b * I + i], u = sp->u[(size_t)b * I + i];
            if (lim > 0) {
                u = u < -lim ? -lim : u > lim ? lim : u;
                g = g > lim ? lim : g;
            }
            float a = siluf(g) * u;
            if (wt) a = wt[b] * a;
            sp->g[(size_t)b * I + i] = mk_bf16r(a);
        }
    lin(s, sp, &E->w2, sp->g, nb, eo, 1);
}

static int moe(dsv4_seq *s, scratch *sp, int layer, const dsv4_layer *L, const float *x, const int32_t *tok, int T, float *out) {
    const dsv4_config *c = &s->m->cfg;
    int E = c->n_experts, K = c->n_act, d = c->dim;
    lin(s, sp, &L->gate, x, T, sp->gsc, 0);
    for (int i = 0; i < T * E; i++) sp->gsc[i] = sqrtf(softplusf(sp->gsc[i]));
    for (int t = 0; t < T; t++) {
        const float *sc = sp->gsc + (size_t)t * E;
        int32_t *idx = sp->gidx + (size_t)t * K;
        if (L->tid2eid) {
            for (int k = 0; k < K; k++) idx[k] = (int32_t)L->tid2eid[(size_t)tok[t] * K + k];
            sp->gmargin[t] = INFINITY;
        } else {
            float biased[4096];
            for (int e = 0; e < E; e++) biased[e] = sc[e] + L->gate_bias[e];
            int32_t top[65];
            int kk = K + 1 <= E ? K + 1 : K;
            topk_desc(biased, E, kk, top);
            for (int k = 0; k < K; k++) idx[k] = top[k];
            sp->gmargin[t] = kk > K ? biased[top[K - 1]] - biased[top[K]] : INFINITY;
        }
    }
    if (s->hooks.moe) s->hooks.moe(s->hooks.ctx, layer, T, K, sp->gidx, sp->gmargin);
    for (int t = 0; t < T; t++) {
        const float *sc = sp->gsc + (size_t)t * E;
        int32_t *idx = sp->gidx + (size_t)t * K;
        float sum = 0.0f;
        for (int k = 0; k < K; k++) {
            if (idx[k] < 0 || idx[k] >= E) idx[k] = 0; /* a hook gave garbage: keep memory safe */
            sum += sc[idx[k]];
        }
        for (int k = 0; k < K; k++) sp->gw[(size_t)t * K + k] = sc[idx[k]] / sum * c->route_scale;
    }
    DUMP2(sp->gw, T, K, "L%d.moe.weights", layer);
    memset(sp->y, 0, sizeof(float) * (size_t)T * d);
    /* routed experts in ascending order, each on the batch of tokens routed to it */
    for (int e = 0; e < E; e++) {
        int nb = 0;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++)
                if (sp->gidx[(size_t)t * K + k] == e) {
                    sp->btok[nb] = t;
                    sp->ewt[nb] = sp->gw[(size_t)t * K + k];
                    memcpy(sp->xb + (size_t)nb * d, x + (size_t)t * d, sizeof(float) * d);
                    nb++;
                    break;
                }
        if (!nb) continue;
        expert(s, sp, &L->experts[e], sp->xb, nb, sp->ewt, sp->eo);
        for (int b = 0; b < nb; b++) {
            float *yt = sp->y + (size_t)sp->btok[b] * d;
            for (int i = 0; i < d; i++) yt[i] += sp->eo[(size_t)b * d + i];
        }
    }
    expert(s, sp, &L->shared, x, T, NULL, sp->eo);
    for (size_t i = 0; i < (size_t)T * d; i++) out[i] = mk_bf16r(sp->y[i] + sp->eo[i]);
    DUMP2(out, T, d, "L%d.moe.out", layer);
    return MK_OK;
}

/* ---- block and model ------------------------------------------------------------------------ */

/* One Block over the rows of all pieces: h [T, hc, dim] is updated in place (via sp->h2). */
static int block(dsv4_seq *s, scratch *sp, int layer, const dsv4_layer *L, piece *pcs, int np, float *h,
                 const int32_t *tok, int T) {
    const dsv4_config *c = &s->m->cfg;
    int hc = c->hc, d = c->dim;
    mk_hc_pre(h, T, hc, d, L->hc_attn_fn, L->hc_attn_scale, L->hc_attn_base, c->hc_iters, c->hc_eps,
              c->norm_eps, sp->x, sp->post, sp->comb);
    mk_rmsnorm(sp->x, T, d, L->attn_norm, c->norm_eps, sp->x);
    DUMP2(sp->x, T, d, "L%d.attn.in", layer);
    int rc = attention(s, sp, layer, L, sp->x, pcs, np, T, sp->sub);
    if (rc) return rc;
    mk_hc_post(sp->sub, h, sp->post, sp->comb, T, hc, d, sp->h2);
    DUMP3(sp->h2, T, hc, d, "L%d.h_attn", layer);
    mk_hc_pre(sp->h2, T, hc, d, L->hc_ffn_fn, L->hc_ffn_scale, L->hc_ffn_base, c->hc_iters, c->hc_eps,
              c->norm_eps, sp->x, sp->post, sp->comb);
    mk_rmsnorm(sp->x, T, d, L->ffn_norm, c->norm_eps, sp->x);
    DUMP2(sp->x, T, d, "L%d.moe.in", layer);
    if ((rc = moe(s, sp, layer, L, sp->x, tok, T, sp->sub))) return rc;
    mk_hc_post(sp->sub, sp->h2, sp->post, sp->comb, T, hc, d, h);
    DUMP3(h, T, hc, d, "L%d.h", layer);
    return MK_OK;
}

/* Logits of the last token: hc_head collapse, final norm, fp32 head. */
static void head(dsv4_seq *s, scratch *sp, const float *h_last_tok, const float *fn, const float *scale,
                 const float *base, const uint16_t *norm, float *logits, const char *tag) {
    const dsv4_model *m = s->m;
    const dsv4_config *c = &m->cfg;
    mk_hc_head(h_last_tok, 1, c->hc, c->dim, fn, scale, base, c->hc_eps, c->norm_eps, sp->x);
    mk_rmsnorm(sp->x, 1, c->dim, norm, c->norm_eps, sp->x);
    DUMP2(sp->x, 1, c->dim, "%s.head.in", tag);
    mk_linear(m->pool, &m->head, sp->x, 1, logits, 0, sp->lin);
}

static int check_call(dsv4_seq *s, const int32_t *tokens, int T, int start, mk_err *err) {
    const dsv4_config *c = &s->m->cfg;
    if (T <= 0) return mk_fail(err, MK_EINVAL, "a forward call needs at least one token");
    if (start + T > s->max_len)
        return mk_fail(err, MK_ERANGE, "position %d exceeds the sequence capacity %d (max_seq_len)", start + T, s->max_len);
    if (!s->kv_base || !s->blocks || (long)s->n_blocks * s->lay.block_tokens < (long)start + T)
        return mk_fail(err, MK_EINTERNAL, "the block table (%d blocks of %d) does not cover positions [%d, %d)",
                       s->blocks ? s->n_blocks : 0, s->lay.block_tokens, start, start + T);
    for (int i = 0; i < T; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab)
            return mk_fail(err, MK_ERANGE, "token id %d at index %d is outside the vocabulary [0, %d)", tokens[i], i, c->vocab);
    return MK_OK;
}

int dsv4_seq_forward(dsv4_seq *s, const int32_t *tokens, int T, float *logits, mk_err *err) {
    return dsv4_forward_batch(&s, &tokens, &T, &logits, 1, err);
}

int dsv4_seq_forward_ex(dsv4_seq *s, const int32_t *tokens, int T, int batch, float *logits, mk_err *err) {
    (void)batch; /* one row order for everything now (see the top) */
    return dsv4_forward_batch(&s, &tokens, &T, &logits, 1, err);
}

/* Grows s's record of the final stream (kept for the MTP call) to T rows. */
static int grow_last(dsv4_seq *s, int T, mk_err *err) {
    const dsv4_config *c = &s->m->cfg;
    if (T <= s->cap_last) return MK_OK;
    float *hl = realloc(s->h_last, (size_t)T * c->hc * c->dim * sizeof(float));
    if (hl) s->h_last = hl;
    int32_t *il = realloc(s->ids_last, (size_t)T * sizeof(int32_t));
    if (il) s->ids_last = il;
    if (!hl || !il) return mk_fail(err, MK_ENOMEM, "out of memory for a %d-token call", T);
    s->cap_last = T;
    return MK_OK;
}

int dsv4_forward_batch(dsv4_seq *const *seqs, const int32_t *const *tokens, const int *n, float *const *logits,
                       int np, mk_err *err) {
    if (np <= 0) return mk_fail(err, MK_EINVAL, "a batched forward needs at least one piece");
    const dsv4_model *m = seqs[0]->m;
    const dsv4_config *c = &m->cfg;
    int rc, T = 0, own = 0;
    /* every check and allocation comes before any state changes */
    for (int i = 0; i < np; i++) {
        if (seqs[i]->m != m) return mk_fail(err, MK_EINTERNAL, "batch: pieces of different models");
        for (int j = 0; j < i; j++)
            if (seqs[j] == seqs[i]) return mk_fail(err, MK_EINTERNAL, "batch: two pieces of one sequence");
        if ((rc = check_call(seqs[i], tokens[i], n[i], seqs[i]->pos, err))) return rc;
        if (n[i] > INT_MAX - T) return mk_fail(err, MK_ERANGE, "batch: too many rows");
        T += n[i];
        if (seqs[i]->max_len > seqs[own]->max_len) own = i;
    }
    /* the scratch and the stream of the call are the longest sequence's (its sizes cover all) */
    dsv4_seq *s = seqs[own];
    scratch sp;
    if ((rc = ensure_scratch(s, T, &sp, err))) return rc;
    for (int i = 0; i < np; i++)
        if ((rc = grow_last(seqs[i], i == own ? T : n[i], err))) return rc;
    piece pcs[np];
    int hc = c->hc, d = c->dim, row = 0;
    for (int i = 0; i < np; i++) {
        pcs[i] = (piece){seqs[i], row, n[i], seqs[i]->pos, 0, NULL};
        seqs[i]->batch = n[i] > 1;
        memcpy(sp.toks + row, tokens[i], sizeof(int32_t) * (size_t)n[i]);
        row += n[i];
    }
    float *h = s->h_last;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < hc; j++)
            for (int i = 0; i < d; i++)
                h[((size_t)t * hc + j) * d + i] = mk_bf16_to_f32(m->embed[(size_t)sp.toks[t] * d + i]);
    for (int l = 0; l < c->n_layers; l++)
        if ((rc = block(s, &sp, l, &m->layers[l], pcs, np, h, sp.toks, T))) return rc;
    for (int i = 0; i < np; i++) {
        const float *hi = h + (size_t)pcs[i].row0 * hc * d;
        if (logits[i]) {
            head(s, &sp, hi + (size_t)(n[i] - 1) * hc * d, m->hc_head_fn, m->hc_head_scale, m->hc_head_base, m->norm,
                 logits[i], "out");
            DUMP2(logits[i], 1, c->vocab, "out.logits");
        }
    }
    /* each sequence keeps its own rows of the final stream; the owner's go last (in place) */
    for (int i = 0; i < np; i++) {
        if (i == own) continue;
        memcpy(seqs[i]->h_last, h + (size_t)pcs[i].row0 * hc * d, sizeof(float) * (size_t)n[i] * hc * d);
    }
    memmove(s->h_last, h + (size_t)pcs[own].row0 * hc * d, sizeof(float) * (size_t)n[own] * hc * d);
    for (int i = 0; i < np; i++) {
        memcpy(seqs[i]->ids_last, tokens[i], sizeof(int32_t) * (size_t)n[i]);
        seqs[i]->n_last = n[i];
        seqs[i]->pos += n[i];
    }
    return MK_OK;
}

int dsv4_mtp_forward(dsv4_seq *s, const float *h_main, const int32_t *ids, int T, float *logits, mk_err *err) {
    const dsv4_model *m = s->m;
    const dsv4_config *c = &m->cfg;
    if (!c->n_mtp) return mk_fail(err, MK_ENOTSUP, "this checkpoint has no MTP layer");
    int start = s->mtp_pos;
    int rc;
    if ((rc = check_call(s, ids, T, start, err))) return rc;
    scratch sp;
    if ((rc = ensure_scratch(s, T * c->hc, &sp, err))) return rc; /* h_proj runs on T*hc rows */
    const dsv4_layer *L = &m->mtp;
    int hc = c->hc, d = c->dim;
    float *h = malloc(sizeof(float) * (size_t)T * hc * d);
    float *e = malloc(sizeof(float) * (size_t)T * d);
    float *hn = malloc(sizeof(float) * (size_t)T * hc * d);
    float *hp = malloc(sizeof(float) * (size_t)T * hc * d);
    if (!h || !e || !hn || !hp) { free(h); free(e); free(hn); free(hp); return mk_fail(err, MK_ENOMEM, "out of memory"); }
    for (int t = 0; t < T; t++)
        for (int i = 0; i < d; i++) e[(size_t)t * d + i] = mk_bf16_to_f32(m->embed[(size_t)ids[t] * d + i]);
    mk_rmsnorm(e, T, d, L->enorm, c->norm_eps, e);
    mk_rmsnorm(h_main, T * hc, d, L->hnorm, c->norm_eps, hn);
    lin(s, &sp, &L->e_proj, e, T, sp.sub, 1);
    lin(s, &sp, &L->h_proj, hn, T * hc, hp, 1);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < hc; j++)
            for (int i = 0; i < d; i++)
                h[((size_t)t * hc + j) * d + i] = mk_bf16r(sp.sub[(size_t)t * d + i] + hp[((size_t)t * hc + j) * d + i]);
    piece pc = {s, 0, T, start, 0, NULL};
    rc = block(s, &sp, c->n_layers, L, &pc, 1, h, ids, T);
    if (!rc) {
        head(s, &sp, h + (size_t)(T - 1) * hc * d, L->hc_head_fn, L->hc_head_scale, L->hc_head_base, L->norm, logits, "mtp");
        s->mtp_pos = start + T;
    }
    free(h); free(e); free(hn); free(hp);
    return rc;
}

/* ---- sequences ------------------------------------------------------------------------------ */

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

int dsv4_kv_layout_init(const dsv4_model *m, int snapshots, dsv4_kv_layout *lay, mk_err *err) {
    const dsv4_config *c = &m->cfg;
    const int bt = DSV4_BLOCK_TOKENS;
    memset(lay, 0, sizeof *lay);
    lay->block_tokens = bt;
    lay->snapshots = snapshots;
    if (snapshots && c->window > bt)
        return mk_fail(err, MK_ENOTSUP, "kv layout: window %d is longer than a block (%d positions)", c->window, bt);
    size_t off = 0;
    for (int l = 0; l < c->n_layers + c->n_mtp; l++) {
        int r = c->compress_ratio[l];
        if (r && (r > bt || bt % r))
            return mk_fail(err, MK_ENOTSUP, "kv layout: layer %d's compress ratio %d does not divide the block of %d", l, r, bt);
        if (r) {
            lay->ckv[l] = off;
            off += align64(sizeof(float) * (size_t)(bt / r) * c->head_dim);
        }
        if (r == 4) {
            lay->ikv[l] = off;
            off += align64(sizeof(float) * (size_t)(bt / 4) * c->index_head_dim);
        }
        if (!snapshots || l >= c->n_layers) continue;
        lay->win[l] = off;
        off += align64(sizeof(uint16_t) * (size_t)c->window * c->head_dim);
        if (r == 4) {
            lay->cst[l] = off;
            off += align64(sizeof(float) * 2 * 4 * (size_t)c->head_dim);
            lay->icst[l] = off;
            off += align64(sizeof(float) * 2 * 4 * (size_t)c->index_head_dim);
        }
    }
    lay->bytes = off ? off : 64;
    return MK_OK;
}

/* A sequence with its slot state (arena) and scratch; entries come from a block table. */
static int seq_new(dsv4_model *m, int max_len, dsv4_seq **out, mk_err *err) {
    *out = NULL;
    const dsv4_config *c = &m->cfg;
    if (max_len <= 0) max_len = m->max_seq_len;
    if (max_len > m->max_seq_len)
        return mk_fail(err, MK_ERANGE, "sequence length %d exceeds the model's max_seq_len %d", max_len, m->max_seq_len);
    dsv4_seq *s = calloc(1, sizeof *s);
    if (!s) return mk_fail(err, MK_ENOMEM, "out of memory");
    s->m = m;
    s->max_len = max_len;
    /* one allocation for all per-layer slot state */
    size_t total = 0;
    int nl = c->n_layers + c->n_mtp;
    for (int pass = 0; pass < 2; pass++) {
        size_t off = 0;
        for (int l = 0; l < nl; l++) {
            int r = c->compress_ratio[l], coff = r == 4 ? 2 : 1;
            dsv4_layer_state *st = &s->ls[l];
#define TAKE(field, n)                                        \
    do {                                                      \
        if (pass) st->field = s->arena + off;                 \
        off += align16((size_t)(n));                          \
    } while (0)
            TAKE(win, (size_t)c->window * c->head_dim);
            if (r) {
                TAKE(kv_state, (size_t)coff * r * coff * c->head_dim);
                TAKE(sc_state, (size_t)coff * r * coff * c->head_dim);
            }
            if (r == 4) {
                TAKE(ikv_state, (size_t)2 * 4 * 2 * c->index_head_dim);
                TAKE(isc_state, (size_t)2 * 4 * 2 * c->index_head_dim);
            }
#undef TAKE
        }
        if (!pass) {
            total = off;
            s->arena = malloc(sizeof(float) * total);
            if (!s->arena) { free(s); return mk_fail(err, MK_ENOMEM, "out of memory for sequence state (%zu MiB)", total * 4 >> 20); }
            s->arena_floats = total;
        }
    }
    scratch sp;
    int rc = ensure_scratch(s, 1, &sp, err);
    if (rc) { dsv4_seq_free(s); return rc; }
    *out = s;
    return MK_OK;
}

int dsv4_seq_create(dsv4_model *m, int max_len, dsv4_seq **out, mk_err *err) {
    dsv4_seq *s;
    int rc = seq_new(m, max_len, &s, err);
    if (rc) return rc;
    /* a private pool of entries without snapshots, block table = identity */
    if ((rc = dsv4_kv_layout_init(m, 0, &s->lay, err))) { dsv4_seq_free(s); return rc; }
    int nb = (s->max_len + s->lay.block_tokens - 1) / s->lay.block_tokens;
    s->own_kv = calloc((size_t)nb, s->lay.bytes);
    s->own_blocks = malloc(sizeof(int) * (size_t)nb);
    if (!s->own_kv || !s->own_blocks) {
        size_t mib = ((size_t)nb * s->lay.bytes) >> 20;
        dsv4_seq_free(s);
        return mk_fail(err, MK_ENOMEM, "out of memory for the compressed KV of a sequence (%zu MiB)", mib);
    }
    for (int b = 0; b < nb; b++) s->own_blocks[b] = b;
    dsv4_seq_bind(s, s->own_kv, s->own_blocks, nb);
    dsv4_seq_reset(s);
    *out = s;
    return MK_OK;
}

int dsv4_seq_create_paged(dsv4_model *m, int max_len, const dsv4_kv_layout *lay, dsv4_seq **out, mk_err *err) {
    dsv4_seq *s;
    int rc = seq_new(m, max_len, &s, err);
    if (rc) return rc;
    s->lay = *lay;
    dsv4_seq_reset(s);
    *out = s;
    return MK_OK;
}

void dsv4_seq_bind(dsv4_seq *s, void *kv_base, const int *blocks, int n_blocks) {
    s->kv_base = kv_base;
    s->blocks = blocks;
    s->n_blocks = n_blocks;
}

/* Slot state afresh: rings 0, compressor kv 0 and scores -inf. */
static void slot_clear(dsv4_seq *s) {
    const dsv4_config *c = &s->m->cfg;
    memset(s->arena, 0, sizeof(float) * s->arena_floats);
    for (int l = 0; l < c->n_layers + c->n_mtp; l++) {
        int r = c->compress_ratio[l], coff = r == 4 ? 2 : 1;
        dsv4_layer_state *st = &s->ls[l];
        st->n_ckv = st->n_ikv = 0;
        if (r) for (size_t i = 0; i < (size_t)coff * r * coff * c->head_dim; i++) st->sc_state[i] = -INFINITY;
        if (r == 4) for (size_t i = 0; i < (size_t)2 * 4 * 2 * c->index_head_dim; i++) st->isc_state[i] = -INFINITY;
    }
    s->pos = 0;
    s->mtp_pos = 0;
    s->n_last = 0;
}

void dsv4_seq_reset(dsv4_seq *s) {
    slot_clear(s);
    if (s->own_kv) memset(s->own_kv, 0, (size_t)s->n_blocks * s->lay.bytes);
}

int dsv4_seq_restore(dsv4_seq *s, int pos, mk_err *err) {
    const dsv4_config *c = &s->m->cfg;
    const int bt = s->lay.block_tokens;
    if (!s->lay.snapshots) return mk_fail(err, MK_EINTERNAL, "restore: this sequence's blocks carry no snapshots");
    if (pos <= 0 || pos % bt || pos > s->max_len)
        return mk_fail(err, MK_EINTERNAL, "restore: position %d is not a block boundary in (0, %d]", pos, s->max_len);
    if (!s->kv_base || !s->blocks || s->n_blocks < pos / bt)
        return mk_fail(err, MK_EINTERNAL, "restore: the block table (%d blocks) does not reach position %d",
                       s->blocks ? s->n_blocks : 0, pos);
    slot_clear(s);
    const uint8_t *blk = block_ptr(s, pos / bt - 1);
    for (int l = 0; l < c->n_layers; l++) {
        int r = c->compress_ratio[l];
        dsv4_layer_state *st = &s->ls[l];
        const uint16_t *w = (const uint16_t *)(blk + s->lay.win[l]);
        for (size_t i = 0; i < (size_t)c->window * c->head_dim; i++) st->win[i] = mk_bf16_to_f32(w[i]);
        if (r) st->n_ckv = pos / r;
        if (r == 4) {
            st->n_ikv = pos / 4;
            const float *cs = (const float *)(blk + s->lay.cst[l]), *is = (const float *)(blk + s->lay.icst[l]);
            int D = c->head_dim, ID = c->index_head_dim;
            for (int i = 0; i < 4; i++) {
                memcpy(st->kv_state + (size_t)i * 2 * D, cs + (size_t)i * D, sizeof(float) * D);
                memcpy(st->sc_state + (size_t)i * 2 * D, cs + (size_t)(4 + i) * D, sizeof(float) * D);
                memcpy(st->ikv_state + (size_t)i * 2 * ID, is + (size_t)i * ID, sizeof(float) * ID);
                memcpy(st->isc_state + (size_t)i * 2 * ID, is + (size_t)(4 + i) * ID, sizeof(float) * ID);
            }
        }
    }
    s->pos = pos;
    return MK_OK;
}

void dsv4_seq_free(dsv4_seq *s) {
    if (!s) return;
    free(s->arena);
    free(s->scratch);
    free(s->h_last);
    free(s->ids_last);
    free(s->own_kv);
    free(s->own_blocks);
    free(s);
}

int dsv4_seq_pos(const dsv4_seq *s) { return s->pos; }
int dsv4_seq_capacity(const dsv4_seq *s) { return s->max_len; }
int dsv4_seq_vocab_size(const dsv4_seq *s) { return s->m->cfg.vocab; }
