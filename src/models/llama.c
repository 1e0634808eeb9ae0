/* llama.c — Llama-family forward pass over a GGUF checkpoint (llama.h).
 *
 *   x = token_embd[ids]                                             [T, dim]
 *   per layer:  x += Wo · attn(rope(Wq·n1), rope(Wk·n1), Wv·n1)     n1 = rmsnorm(x) * attn_norm
 *               x += Wdown · (silu(Wgate·n2) * (Wup·n2))            n2 = rmsnorm(x) * ffn_norm
 *   logits = output · (rmsnorm(x) * output_norm)      (output = token_embd when tied)
 *
 * Numerics follow llama.cpp's CPU backend where it matters for comparing logits: activations in
 * f32, weight matmuls through the ggml block kernels (activations quantized to Q8 blocks as
 * llama.cpp does), K and V stored in the cache as f16 (llama.cpp's default cache type), softmax in
 * f32. RoPE: "normal" (adjacent pairs) for llama, "neox" (first half with second half) for qwen2.
 */
#include "models/llama.h"
#include "base/status.h"
#include "base/threads.h"
#include "io/gguf.h"
#include "num/formats.h"
#include "num/ggml_quant.h"
#include "ops/ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LLAMA_MAX_LAYERS 256

typedef struct {
    const mk_gguf_tensor *t; /* weight in ggml format: [n rows of k] */
    int n, k;
} lweight;

typedef struct {
    const float *attn_norm, *ffn_norm;   /* [dim] f32 */
    lweight wq, wk, wv, wo, wgate, wup, wdown;
    const float *bq, *bk, *bv;           /* optional biases (qwen2) */
} llama_layer;

struct llama_model {
    mk_gguf *g;
    char arch[32];
    int n_layers, dim, ff, n_head, n_kv, head_dim, rot_dim, vocab, ctx;
    float eps, rope_base;
    int neox;
    lweight embd, output;
    const float *out_norm;
    llama_layer layers[LLAMA_MAX_LAYERS];
    float *owned[LLAMA_MAX_LAYERS * 4 + 4]; /* aligned copies of misaligned f32 tensors */
    int n_owned;
    float *inv_freq;                        /* [rot_dim / 2] */
    mk_pool *pool;
};

struct llama_seq {
    llama_model *m;
    int max_len, pos;
    float *kcache, *vcache; /* [layers][max_len][n_kv * head_dim], values rounded to f16 */
    int max_tok;            /* scratch sized for this many tokens per call */
    float *x, *h, *q, *k, *v, *att, *o, *g, *u, *sc;
    void *mmscratch;
    size_t mmscratch_bytes;
};

/* ---- loading -------------------------------------------------------------------------------- */

static int meta_u32(mk_gguf *g, const char *arch, const char *key, int required, uint32_t def, uint32_t *out, mk_err *err) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    int found = 0;
    int rc = mk_gguf_get_u32(g, k, out, &found, err);
    if (rc) return rc;
    if (!found) {
        if (required) return mk_fail(err, MK_EFORMAT, "%s: missing metadata key '%s'", mk_gguf_fname(g), k);
        *out = def;
    }
    return MK_OK;
}

static int meta_f32(mk_gguf *g, const char *arch, const char *key, float def, float *out, mk_err *err) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    int found = 0;
    int rc = mk_gguf_get_f32(g, k, out, &found, err);
    if (!rc && !found) *out = def;
    return rc;
}

/* Binds tensor `name` as a matrix of n rows by k (ggml ne = [k, n]) in a supported type, or a
 * vector of n f32 values (k == 0). */
static int bind(llama_model *m, const char *name, int n, int k, int optional, lweight *w, const float **vec, mk_err *err) {
    mk_gguf_tensor *t = mk_gguf_find(m->g, name);
    if (!t) {
        if (optional) return MK_OK;
        return mk_fail(err, MK_EFORMAT, "%s: missing tensor '%s'", mk_gguf_fname(m->g), name);
    }
    t->used = 1;
    if (k == 0) {
        if (t->type != MK_GGML_F32 || t->ne[0] != (uint64_t)n || t->ne[1] != 1)
            return mk_fail(err, MK_EFORMAT, "%s: tensor '%s': expected F32 [%d], found %s [%llu, %llu]", mk_gguf_fname(m->g), name, n,
                           mk_ggml_type_name(t->type), (unsigned long long)t->ne[0], (unsigned long long)t->ne[1]);
        const float *p = t->data;
        if ((uintptr_t)p % 4) { /* copy to aligned memory */
            float *c = malloc(sizeof(float) * (size_t)n);
            if (!c) return mk_fail(err, MK_ENOMEM, "out of memory");
            memcpy(c, p, sizeof(float) * (size_t)n);
            m->owned[m->n_owned++] = c;
            p = c;
        }
        *vec = p;
        return MK_OK;
    }
    if (t->ne[0] != (uint64_t)k || t->ne[1] != (uint64_t)n || t->ne[2] != 1 || t->ne[3] != 1)
        return mk_fail(err, MK_EFORMAT, "%s: tensor '%s': expected shape [%d, %d] (ne0 = input features), found [%llu, %llu]",
                       mk_gguf_fname(m->g), name, k, n, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1]);
    if (!mk_ggml_type_supported(t->type) || !mk_ggml_row_bytes(t->type, k))
        return mk_fail(err, MK_ENOTSUP, "%s: tensor '%s' has type %s, which minke does not support (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K)",
                       mk_gguf_fname(m->g), name, mk_ggml_type_name(t->type));
    w->t = t;
    w->n = n;
    w->k = k;
    return MK_OK;
}

#define TRY(x) do { int _rc = (x); if (_rc) return _rc; } while (0)

static int load_inner(llama_model *m, const char *path, const mk_model_options *opt, mk_err *err) {
    TRY(mk_gguf_open(path, &m->g, err));
    const char *arch;
    size_t al;
    int found = 0;
    TRY(mk_gguf_get_str(m->g, "general.architecture", &arch, &al, &found, err));
    if (!found) return mk_fail(err, MK_EFORMAT, "%s: missing metadata key 'general.architecture'", path);
    if (al >= sizeof m->arch) al = sizeof m->arch - 1;
    memcpy(m->arch, arch, al);
    m->arch[al] = 0;
    if (strcmp(m->arch, "llama") && strcmp(m->arch, "qwen2"))
        return mk_fail(err, MK_ENOTSUP, "%s: general.architecture is \"%s\"; the Llama family loader supports \"llama\" and \"qwen2\"", path, m->arch);
    m->neox = !strcmp(m->arch, "qwen2");
    uint32_t u;
    TRY(meta_u32(m->g, m->arch, "block_count", 1, 0, &u, err)); m->n_layers = (int)u;
    TRY(meta_u32(m->g, m->arch, "embedding_length", 1, 0, &u, err)); m->dim = (int)u;
    TRY(meta_u32(m->g, m->arch, "feed_forward_length", 1, 0, &u, err)); m->ff = (int)u;
    TRY(meta_u32(m->g, m->arch, "attention.head_count", 1, 0, &u, err)); m->n_head = (int)u;
    TRY(meta_u32(m->g, m->arch, "attention.head_count_kv", 0, (uint32_t)m->n_head, &u, err)); m->n_kv = (int)u;
    TRY(meta_u32(m->g, m->arch, "context_length", 0, 2048, &u, err)); m->ctx = (int)u;
    TRY(meta_f32(m->g, m->arch, "attention.layer_norm_rms_epsilon", 1e-5f, &m->eps, err));
    TRY(meta_f32(m->g, m->arch, "rope.freq_base", 10000.0f, &m->rope_base, err));
    if (m->n_layers < 1 || m->n_layers > LLAMA_MAX_LAYERS || m->dim < 1 || m->n_head < 1 || m->n_kv < 1 ||
        m->dim % m->n_head || m->n_head % m->n_kv || m->ff < 1)
        return mk_fail(err, MK_EFORMAT, "%s: inconsistent shape: block_count %d, embedding_length %d, head_count %d, head_count_kv %d, feed_forward_length %d",
                       path, m->n_layers, m->dim, m->n_head, m->n_kv, m->ff);
    m->head_dim = m->dim / m->n_head;
    TRY(meta_u32(m->g, m->arch, "rope.dimension_count", 0, (uint32_t)m->head_dim, &u, err));
    m->rot_dim = (int)u;
    if (m->rot_dim < 2 || m->rot_dim > m->head_dim || m->rot_dim % 2 || m->head_dim > 512)
        return mk_fail(err, MK_EFORMAT, "%s: %s.rope.dimension_count %d must be even and <= head dim %d", path, m->arch, m->rot_dim, m->head_dim);
    mk_gguf_tensor *te = mk_gguf_find(m->g, "token_embd.weight");
    if (!te) return mk_fail(err, MK_EFORMAT, "%s: missing tensor 'token_embd.weight'", path);
    m->vocab = (int)te->ne[1];
    int kvd = m->n_kv * m->head_dim;
    TRY(bind(m, "token_embd.weight", m->vocab, m->dim, 0, &m->embd, NULL, err));
    TRY(bind(m, "output_norm.weight", m->dim, 0, 0, NULL, &m->out_norm, err));
    TRY(bind(m, "output.weight", m->vocab, m->dim, 1, &m->output, NULL, err));
    if (!m->output.t) m->output = m->embd; /* tied embeddings */
    for (int l = 0; l < m->n_layers; l++) {
        llama_layer *L = &m->layers[l];
        char nm[96];
#define NM(s) (snprintf(nm, sizeof nm, "blk.%d." s, l), nm)
        TRY(bind(m, NM("attn_norm.weight"), m->dim, 0, 0, NULL, &L->attn_norm, err));
        TRY(bind(m, NM("ffn_norm.weight"), m->dim, 0, 0, NULL, &L->ffn_norm, err));
        TRY(bind(m, NM("attn_q.weight"), m->dim, m->dim, 0, &L->wq, NULL, err));
        TRY(bind(m, NM("attn_k.weight"), kvd, m->dim, 0, &L->wk, NULL, err));
        TRY(bind(m, NM("attn_v.weight"), kvd, m->dim, 0, &L->wv, NULL, err));
        TRY(bind(m, NM("attn_output.weight"), m->dim, m->dim, 0, &L->wo, NULL, err));
        TRY(bind(m, NM("ffn_gate.weight"), m->ff, m->dim, 0, &L->wgate, NULL, err));
        TRY(bind(m, NM("ffn_up.weight"), m->ff, m->dim, 0, &L->wup, NULL, err));
        TRY(bind(m, NM("ffn_down.weight"), m->dim, m->ff, 0, &L->wdown, NULL, err));
        TRY(bind(m, NM("attn_q.bias"), m->dim, 0, 1, NULL, &L->bq, err));
        TRY(bind(m, NM("attn_k.bias"), kvd, 0, 1, NULL, &L->bk, err));
        TRY(bind(m, NM("attn_v.bias"), kvd, 0, 1, NULL, &L->bv, err));
#undef NM
    }
    for (size_t i = 0; i < mk_gguf_n_tensors(m->g); i++) {
        mk_gguf_tensor *t = mk_gguf_tensor_at(m->g, i);
        if (!t->used && strcmp(t->name, "rope_freqs.weight"))
            return mk_fail(err, MK_EFORMAT, "%s: unexpected tensor '%s' for a %s model", path, t->name, m->arch);
    }
    m->inv_freq = malloc(sizeof(float) * (size_t)(m->rot_dim / 2));
    if (!m->inv_freq) return mk_fail(err, MK_ENOMEM, "out of memory");
    for (int i = 0; i < m->rot_dim / 2; i++)
        m->inv_freq[i] = powf(m->rope_base, -2.0f * (float)i / (float)m->rot_dim);
    m->pool = mk_pool_create(opt ? opt->n_threads : 0);
    if (!m->pool) return mk_fail(err, MK_ENOMEM, "cannot create the thread pool");
    return MK_OK;
}

int llama_model_load(const char *path, const mk_model_options *opt, llama_model **out, mk_err *err) {
    *out = NULL;
    mk_num_init();
    llama_model *m = calloc(1, sizeof *m);
    if (!m) return mk_fail(err, MK_ENOMEM, "out of memory");
    int rc = load_inner(m, path, opt, err);
    if (rc) { llama_model_free(m); return rc; }
    *out = m;
    return MK_OK;
}

void llama_model_free(llama_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->inv_freq);
    mk_pool_free(m->pool);
    mk_gguf_close(m->g);
    free(m);
}

int llama_model_vocab_size(const llama_model *m) { return m->vocab; }
struct mk_gguf *llama_model_gguf(const llama_model *m) { return m->g; }
int llama_model_context(const llama_model *m) { return m->ctx; }

void llama_model_print_info(const llama_model *m, void *fp) {
    FILE *f = fp;
    fprintf(f, "model: %s\narchitecture: %s (Llama family, GGUF v%d)\n", mk_gguf_fname(m->g), m->arch, mk_gguf_version(m->g));
    fprintf(f, "  layers %d, hidden %d, ffn %d, heads %d (kv %d) x %d, rope %s dims %d base %g, eps %g, vocab %d, context %d%s\n",
            m->n_layers, m->dim, m->ff, m->n_head, m->n_kv, m->head_dim, m->neox ? "neox" : "normal", m->rot_dim,
            m->rope_base, m->eps, m->vocab, m->ctx, m->output.t == m->embd.t ? ", tied embeddings" : "");
    size_t bytes[64] = {0};
    uint64_t cnt[64] = {0};
    for (size_t i = 0; i < mk_gguf_n_tensors(m->g); i++) {
        mk_gguf_tensor *t = mk_gguf_tensor_at(m->g, i);
        if (t->type < 64) {
            bytes[t->type] += t->nbytes;
            cnt[t->type] += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        }
    }
    fprintf(f, "parameters by type:\n");
    for (int ty = 0; ty < 64; ty++)
        if (cnt[ty]) fprintf(f, "  %-6s %12llu params %10.2f MiB\n", mk_ggml_type_name((uint32_t)ty), (unsigned long long)cnt[ty], bytes[ty] / 1048576.0);
    fprintf(f, "memory:\n  weights (mmapped) %.1f MiB\n  KV cache %.1f KiB per token (f16 values held as f32 here: %.1f KiB)\n",
            mk_gguf_total_bytes(m->g) / 1048576.0, 2.0 * m->n_layers * m->n_kv * m->head_dim * 2 / 1024.0,
            2.0 * m->n_layers * m->n_kv * m->head_dim * 4 / 1024.0);
}

/* ---- sequences ------------------------------------------------------------------------------ */

static void free_scratch(llama_seq *s) {
    free(s->x); free(s->h); free(s->q); free(s->k); free(s->v); free(s->att); free(s->o);
    free(s->g); free(s->u); free(s->sc); free(s->mmscratch);
    s->x = s->h = s->q = s->k = s->v = s->att = s->o = s->g = s->u = s->sc = NULL;
    s->mmscratch = NULL;
}

/* Scratch for calls of up to T tokens (grown only by a longer prefill, never while decoding). */
static int ensure_scratch(llama_seq *s, int T, mk_err *err) {
    if (T <= s->max_tok) return MK_OK;
    const llama_model *m = s->m;
    free_scratch(s);
    size_t Tz = (size_t)T, kvd = (size_t)m->n_kv * m->head_dim;
    s->x = malloc(sizeof(float) * Tz * m->dim);
    s->h = malloc(sizeof(float) * Tz * m->dim);
    s->q = malloc(sizeof(float) * Tz * m->dim);
    s->k = malloc(sizeof(float) * Tz * kvd);
    s->v = malloc(sizeof(float) * Tz * kvd);
    s->att = malloc(sizeof(float) * Tz * m->dim);
    s->o = malloc(sizeof(float) * Tz * m->dim);
    s->g = malloc(sizeof(float) * Tz * m->ff);
    s->u = malloc(sizeof(float) * Tz * m->ff);
    s->sc = malloc(sizeof(float) * (size_t)s->max_len * (size_t)m->n_head);
    size_t mb = 0;
    const lweight *ws[] = {&m->embd, &m->output};
    for (int i = 0; i < 2; i++) {
        size_t b = mk_ggml_matmul_scratch(ws[i]->t->type, T, ws[i]->k);
        if (b > mb) mb = b;
    }
    for (int l = 0; l < m->n_layers; l++) {
        const llama_layer *L = &m->layers[l];
        const lweight *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wgate, &L->wup, &L->wdown};
        for (int i = 0; i < 7; i++) {
            size_t b = mk_ggml_matmul_scratch(lw[i]->t->type, T, lw[i]->k);
            if (b > mb) mb = b;
        }
    }
    s->mmscratch = malloc(mb + 64);
    s->mmscratch_bytes = mb;
    if (!s->x || !s->h || !s->q || !s->k || !s->v || !s->att || !s->o || !s->g || !s->u || !s->sc || !s->mmscratch) {
        free_scratch(s);
        s->max_tok = 0;
        return mk_fail(err, MK_ENOMEM, "out of memory for a %d-token call", T);
    }
    s->max_tok = T;
    return MK_OK;
}

int llama_seq_create(llama_model *m, int max_len, llama_seq **out, mk_err *err) {
    *out = NULL;
    if (max_len <= 0) max_len = m->ctx < 4096 ? m->ctx : 4096;
    if (max_len > m->ctx)
        return mk_fail(err, MK_ERANGE, "sequence length %d exceeds the model's context length %d", max_len, m->ctx);
    llama_seq *s = calloc(1, sizeof *s);
    if (!s) return mk_fail(err, MK_ENOMEM, "out of memory");
    s->m = m;
    s->max_len = max_len;
    size_t n = (size_t)m->n_layers * max_len * m->n_kv * m->head_dim;
    s->kcache = calloc(n, sizeof(float));
    s->vcache = calloc(n, sizeof(float));
    int rc = (!s->kcache || !s->vcache) ? mk_fail(err, MK_ENOMEM, "out of memory for the KV cache (%zu MiB)", 2 * n * 4 >> 20)
                                         : ensure_scratch(s, 1, err);
    if (rc) { llama_seq_free(s); return rc; }
    *out = s;
    return MK_OK;
}

void llama_seq_free(llama_seq *s) {
    if (!s) return;
    free_scratch(s);
    free(s->kcache);
    free(s->vcache);
    free(s);
}

void llama_seq_reset(llama_seq *s) { s->pos = 0; }
int llama_seq_pos(const llama_seq *s) { return s->pos; }
int llama_seq_capacity(const llama_seq *s) { return s->max_len; }

/* ---- forward -------------------------------------------------------------------------------- */

static float f16_round(float x);

static void rmsnorm_f32(const float *x, int d, const float *w, float eps, float *y) {
    double ss = 0.0;
    for (int i = 0; i < d; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / sqrtf((float)(ss / d) + eps);
    for (int i = 0; i < d; i++) y[i] = x[i] * r * w[i];
}

static float f16_round(float x) { return mk_f16_to_f32(mk_f32_to_f16(x)); }

/* RoPE on one head vector at position pos. */
static void rope(const llama_model *m, float *v, int pos) {
    int half = m->rot_dim / 2;
    for (int i = 0; i < half; i++) {
        float th = (float)pos * m->inv_freq[i];
        float c = cosf(th), s = sinf(th);
        int a = m->neox ? i : 2 * i, b = m->neox ? i + half : 2 * i + 1;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

static void mm(llama_seq *s, const lweight *w, const float *x, int T, float *y) {
    mk_ggml_matmul(s->m->pool, w->t->type, w->t->data, w->n, w->k, x, T, y, s->mmscratch);
}

typedef struct {
    llama_seq *s;
    int layer, T, start;
} attn_job;

/* Causal GQA attention of head h for all T query tokens. */
static void attn_head(void *ctx, int h, int tid) {
    (void)tid;
    attn_job *J = ctx;
    llama_seq *s = J->s;
    const llama_model *m = s->m;
    int hd = m->head_dim, kvd = m->n_kv * hd, kvh = h / (m->n_head / m->n_kv);
    const float *kc = s->kcache + (size_t)J->layer * s->max_len * kvd;
    const float *vc = s->vcache + (size_t)J->layer * s->max_len * kvd;
    float *sc = s->sc + (size_t)h * s->max_len;
    float scale = 1.0f / sqrtf((float)hd);
    float qh[512];
    for (int t = 0; t < J->T; t++) {
        int p = J->start + t;
        const float *q0 = s->q + (size_t)t * m->dim + (size_t)h * hd;
        for (int i = 0; i < hd; i++) qh[i] = q0[i];
        const float *q = qh;
        float mx = -INFINITY;
        for (int j = 0; j <= p; j++) {
            sc[j] = mk_vdot(q, kc + (size_t)j * kvd + (size_t)kvh * hd, hd) * scale;
            if (sc[j] > mx) mx = sc[j];
        }
        float sum = 0.0f;
        for (int j = 0; j <= p; j++) sum += (sc[j] = expf(sc[j] - mx));
        float *o = s->att + (size_t)t * m->dim + (size_t)h * hd;
        memset(o, 0, sizeof(float) * (size_t)hd);
        for (int j = 0; j <= p; j++) mk_vaxpy(o, sc[j] / sum, vc + (size_t)j * kvd + (size_t)kvh * hd, hd);
    }
}

int llama_seq_forward(llama_seq *s, const int32_t *tokens, int T, float *logits, mk_err *err) {
    llama_model *m = s->m;
    if (T <= 0) return mk_fail(err, MK_EINVAL, "a forward call needs at least one token");
    if (s->pos + T > s->max_len)
        return mk_fail(err, MK_ERANGE, "position %d exceeds the sequence capacity %d", s->pos + T, s->max_len);
    for (int i = 0; i < T; i++)
        if (tokens[i] < 0 || tokens[i] >= m->vocab)
            return mk_fail(err, MK_ERANGE, "token id %d at index %d is outside the vocabulary [0, %d)", tokens[i], i, m->vocab);
    int rc = ensure_scratch(s, T, err);
    if (rc) return rc;
    int d = m->dim, hd = m->head_dim, kvd = m->n_kv * hd, start = s->pos;
    size_t erow = mk_ggml_row_bytes(m->embd.t->type, d);
    for (int t = 0; t < T; t++)
        mk_ggml_dequant_row(m->embd.t->type, (const uint8_t *)m->embd.t->data + (size_t)tokens[t] * erow, s->x + (size_t)t * d, d);
    for (int l = 0; l < m->n_layers; l++) {
        const llama_layer *L = &m->layers[l];
        for (int t = 0; t < T; t++) rmsnorm_f32(s->x + (size_t)t * d, d, L->attn_norm, m->eps, s->h + (size_t)t * d);
        mm(s, &L->wq, s->h, T, s->q);
        mm(s, &L->wk, s->h, T, s->k);
        mm(s, &L->wv, s->h, T, s->v);
        float *kc = s->kcache + (size_t)l * s->max_len * kvd, *vc = s->vcache + (size_t)l * s->max_len * kvd;
        for (int t = 0; t < T; t++) {
            float *q = s->q + (size_t)t * d, *k = s->k + (size_t)t * kvd, *v = s->v + (size_t)t * kvd;
            if (L->bq) for (int i = 0; i < d; i++) q[i] += L->bq[i];
            if (L->bk) for (int i = 0; i < kvd; i++) k[i] += L->bk[i];
            if (L->bv) for (int i = 0; i < kvd; i++) v[i] += L->bv[i];
            for (int h = 0; h < m->n_head; h++) rope(m, q + (size_t)h * hd, start + t);
            for (int h = 0; h < m->n_kv; h++) rope(m, k + (size_t)h * hd, start + t);
            float *kd = kc + (size_t)(start + t) * kvd, *vd = vc + (size_t)(start + t) * kvd;
            for (int i = 0; i < kvd; i++) { kd[i] = f16_round(k[i]); vd[i] = f16_round(v[i]); }
        }
        attn_job J = {s, l, T, start};
        mk_pool_run(m->pool, m->n_head, attn_head, &J);
        mm(s, &L->wo, s->att, T, s->o);
        for (size_t i = 0; i < (size_t)T * d; i++) s->x[i] += s->o[i];
        for (int t = 0; t < T; t++) rmsnorm_f32(s->x + (size_t)t * d, d, L->ffn_norm, m->eps, s->h + (size_t)t * d);
        mm(s, &L->wgate, s->h, T, s->g);
        mm(s, &L->wup, s->h, T, s->u);
        for (size_t i = 0; i < (size_t)T * m->ff; i++) {
            float g = s->g[i];
            s->g[i] = g / (1.0f + expf(-g)) * s->u[i];
        }
        mm(s, &L->wdown, s->g, T, s->o);
        for (size_t i = 0; i < (size_t)T * d; i++) s->x[i] += s->o[i];
    }
    s->pos += T;
    if (logits) {
        rmsnorm_f32(s->x + (size_t)(T - 1) * d, d, m->out_norm, m->eps, s->h);
        mm(s, &m->output, s->h, 1, logits);
    }
    return MK_OK;
}
