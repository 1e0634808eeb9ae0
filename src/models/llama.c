/* llama.c — Llama-family forward pass over a GGUF checkpoint (llama.h).
 *
 *   x = token_embd[ids]                                             [T, dim]
 *   per layer:  x += Wo · attn(rope(Wq·n1), rope(Wk·n1), Wv·n1)     n1 = rmsnorm(x) * attn_norm
 *               x += Wdown · (silu(Wgate·n2) * (Wup·n2))            n2 = rmsnorm(x) * ffn_norm
 *   logits = output · (rmsnorm(x) * output_norm)      (output = token_embd when tied)
 *
 * Numerics: llama.cpp's CPU backend, bit for bit (flash attention off, its default), so that on
 * the same GGUF the logits are identical and greedy decoding picks the same tokens. Every op uses
 * ggml's rounding points and summation order, for the instruction set llama.cpp would be built
 * for on this CPU (mk_gx_isa_native(); num/ggml_exact.h lists the kernels):
 *   - weight matmuls through the ggml block kernels (num/ggml_quant.h): activations quantized
 *     to Q8_0 / Q8_1 as ggml does, dots in ggml's x86 order;
 *   - RMSNorm with the sum of squares in double, then the weight as a separate product;
 *   - RoPE angles by ggml's repeated product, sincosf, and the fused products GCC made of ggml's
 *     rotation;
 *   - K and V stored as f16 (llama.cpp's default cache type), V transposed as llama.cpp stores
 *     it without flash attention; KQ = K · f16(q), softmax(KQ * scale) with exp on vector lanes
 *     and the sum in double, KQV = V^T · f16(softmax). Which dot order: llama.cpp computes a
 *     one-token call with ggml_vec_dot_f16 and a call of 2+ tokens with tinyBLAS (llamafile
 *     sgemm), so a forward call here takes the path of a llama.cpp ubatch of the same size;
 *     identical outputs need the same split of the prompt into calls (llama.cpp: one ubatch of up
 *     to 512 tokens for the prompt, then one token per decode). Masked (future) positions, which
 *     llama.cpp carries up to its padded KV length, contribute exact zeros, so only the causal
 *     prefix, padded to the vector width, is computed here;
 *   - SwiGLU on ggml_v_silu lanes.
 * RoPE: "normal" (adjacent pairs) for llama, "neox" (first half with second half) for qwen2.
 */
#include "models/llama.h"
#include "base/status.h"
#include "base/threads.h"
#include "io/gguf.h"
#include "num/formats.h"
#include "num/ggml_exact.h"
#include "num/ggml_quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LLAMA_MAX_LAYERS 256
#define LLAMA_UBATCH 512 /* tokens per forward pass: llama.cpp's default n_ubatch */

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
    mk_gx_isa isa;                          /* whose float order the kernels follow */
    mk_pool *pool;
};

struct llama_seq {
    llama_model *m;
    int max_len, pos;
    int vlen;               /* max_len rounded up to 64: the V^T row length */
    uint16_t *kcache;       /* [layers][max_len][n_kv * head_dim] f16 */
    uint16_t *vcache;       /* [layers][n_kv * head_dim][vlen] f16, transposed (zeros past pos) */
    int max_tok;            /* scratch sized for this many tokens per call */
    float *x, *h, *q, *k, *v, *att, *o, *g, *u; /* [T, dim] / [T, kv dim] / [T, ff] */
    float *rope;            /* [T][rot_dim]: cos, sin per pair */
    float *sc;              /* [n_head][vlen] attention scores / probabilities */
    uint16_t *q16, *p16;    /* [n_head][head_dim], [n_head][vlen]: f16 operands of KQ, KQV */
    void *mmscratch;
    size_t mmscratch_bytes;
    llama_dump_fn dump;
    void *dump_ctx;
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
    m->isa = mk_gx_isa_native();
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
    mk_pool_free(m->pool);
    mk_gguf_close(m->g);
    free(m);
}

int llama_model_vocab_size(const llama_model *m) { return m->vocab; }
struct mk_gguf *llama_model_gguf(const llama_model *m) { return m->g; }
int llama_model_context(const llama_model *m) { return m->ctx; }
mk_gx_isa llama_model_isa(const llama_model *m) { return m->isa; }
void llama_model_set_isa(llama_model *m, mk_gx_isa isa) { m->isa = isa; }

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
    fprintf(f, "memory:\n  weights (mmapped) %.1f MiB\n  KV cache %.1f KiB per token (f16)\n",
            mk_gguf_total_bytes(m->g) / 1048576.0, 2.0 * m->n_layers * m->n_kv * m->head_dim * 2 / 1024.0);
    fprintf(f, "numerics: llama.cpp's CPU order for %s\n", mk_gx_isa_name(m->isa));
}

/* ---- sequences ------------------------------------------------------------------------------ */

static void free_scratch(llama_seq *s) {
    free(s->x); free(s->h); free(s->q); free(s->k); free(s->v); free(s->att); free(s->o);
    free(s->g); free(s->u); free(s->rope); free(s->sc); free(s->q16); free(s->p16); free(s->mmscratch);
    s->x = s->h = s->q = s->k = s->v = s->att = s->o = s->g = s->u = s->rope = s->sc = NULL;
    s->q16 = s->p16 = NULL;
    s->mmscratch = NULL;
}

/* Scratch for calls of up to T tokens (grown only by a longer prefill, never while decoding). */
static int ensure_scratch(llama_seq *s, int T, mk_err *err) {
    if (T <= s->max_tok) return MK_OK;
    const llama_model *m = s->m;
    free_scratch(s);
    size_t Tz = (size_t)T, kvd = (size_t)m->n_kv * m->head_dim, nh = (size_t)m->n_head;
    s->x = malloc(sizeof(float) * Tz * m->dim);
    s->h = malloc(sizeof(float) * Tz * m->dim);
    s->q = malloc(sizeof(float) * Tz * m->dim);
    s->k = malloc(sizeof(float) * Tz * kvd);
    s->v = malloc(sizeof(float) * Tz * kvd);
    s->att = malloc(sizeof(float) * Tz * m->dim);
    s->o = malloc(sizeof(float) * Tz * m->dim);
    s->g = malloc(sizeof(float) * Tz * m->ff);
    s->u = malloc(sizeof(float) * Tz * m->ff);
    s->rope = malloc(sizeof(float) * Tz * (size_t)m->rot_dim);
    s->sc = malloc(sizeof(float) * nh * (size_t)s->vlen);
    s->q16 = malloc(sizeof(uint16_t) * nh * (size_t)m->head_dim);
    s->p16 = calloc(nh * (size_t)s->vlen, sizeof(uint16_t));
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
    if (!s->x || !s->h || !s->q || !s->k || !s->v || !s->att || !s->o || !s->g || !s->u || !s->rope || !s->sc ||
        !s->q16 || !s->p16 || !s->mmscratch) {
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
    s->vlen = (max_len + 63) & ~63;
    size_t kvd = (size_t)m->n_kv * m->head_dim;
    /* zeroed: the V^T entries past the last position are read (times a zero probability) */
    s->kcache = calloc((size_t)m->n_layers * max_len * kvd, sizeof(uint16_t));
    s->vcache = calloc((size_t)m->n_layers * kvd * s->vlen, sizeof(uint16_t));
    int rc = (!s->kcache || !s->vcache)
                 ? mk_fail(err, MK_ENOMEM, "out of memory for the KV cache (%zu MiB)",
                           (size_t)m->n_layers * kvd * (max_len + s->vlen) * 2 >> 20)
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

void llama_seq_set_dump(llama_seq *s, llama_dump_fn fn, void *ctx) {
    s->dump = fn;
    s->dump_ctx = ctx;
}

/* ---- forward -------------------------------------------------------------------------------- */

static void dump(llama_seq *s, const char *what, int layer, const float *x, int rows, int cols) {
    if (!s->dump) return;
    char name[64];
    if (layer >= 0) snprintf(name, sizeof name, "%s-%d", what, layer);
    else snprintf(name, sizeof name, "%s", what);
    s->dump(s->dump_ctx, name, x, rows, cols);
}

static void mm(llama_seq *s, const lweight *w, const float *x, int T, float *y) {
    mk_ggml_matmul(s->m->pool, w->t->type, w->t->data, w->n, w->k, x, T, y, s->mmscratch);
}

typedef struct {
    llama_seq *s;
    int layer, T, start;
} attn_job;

/* Attention of head h for the T query tokens of this call, as llama.cpp's mul_mat / soft_max /
 * mul_mat: scores over the causal prefix of P = pos + 1 keys, padded with masked entries to a
 * multiple of 16 (the softmax's vector chunks; exp(-inf) = 0 exactly), probabilities rounded to
 * f16, and V^T rows read up to a multiple of 64 (the f16 dot's step; zero probabilities there).
 * One token: ggml_vec_dot_f16 order; two or more: tinyBLAS order (where llama.cpp can use it). */
static void attn_head(void *ctx, int h, int tid) {
    (void)tid;
    attn_job *J = ctx;
    llama_seq *s = J->s;
    const llama_model *m = s->m;
    const mk_gx_isa isa = m->isa;
    const int hd = m->head_dim, kvd = m->n_kv * hd, g = h / (m->n_head / m->n_kv);
    const int kn = mk_gx_tb_kn(isa), batch = J->T >= 2 && kn > 0;
    const int tb_kq = batch && hd % kn == 0, tb_kqv = batch && hd % 4 == 0;
    const uint16_t *kc = s->kcache + (size_t)J->layer * s->max_len * kvd + (size_t)g * hd;
    const uint16_t *vt = s->vcache + (size_t)J->layer * kvd * s->vlen + (size_t)g * hd * s->vlen;
    float *sc = s->sc + (size_t)h * s->vlen;
    uint16_t *q16 = s->q16 + (size_t)h * hd, *p16 = s->p16 + (size_t)h * s->vlen;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int t = 0; t < J->T; t++) {
        const int P = J->start + t + 1, P16 = (P + 15) & ~15, P64 = (P + 63) & ~63;
        mk_gx_f32_to_f16(hd, s->q + (size_t)t * m->dim + (size_t)h * hd, q16);
        mk_gx_dot_f16_n(isa, tb_kq, hd, kc, (size_t)kvd, P, q16, sc); /* KQ */
        float mx = -INFINITY;
        for (int j = 0; j < P; j++) {
            sc[j] *= scale;
            if (sc[j] > mx) mx = sc[j];
        }
        for (int j = P; j < P16; j++) sc[j] = -INFINITY;
        double sum = mk_gx_softmax_exp(isa, P16, sc, sc, mx);
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j < P16; j++) sc[j] *= inv;
        mk_gx_f32_to_f16(P16, sc, p16);
        for (int j = P16; j < P64; j++) p16[j] = 0;
        float *o = s->att + (size_t)t * m->dim + (size_t)h * hd; /* KQV: rows of V^T times p */
        mk_gx_dot_f16_n(isa, tb_kqv, tb_kqv ? P16 : P64, vt, (size_t)s->vlen, hd, p16, o);
    }
}

/* One ubatch: T <= LLAMA_UBATCH tokens at s->pos (checked by the caller). */
static int forward_ubatch(llama_seq *s, const int32_t *tokens, int T, float *logits, mk_err *err) {
    llama_model *m = s->m;
    int rc = ensure_scratch(s, T, err);
    if (rc) return rc;
    const int d = m->dim, hd = m->head_dim, kvd = m->n_kv * hd, start = s->pos, ff = m->ff;
    const mk_gx_isa isa = m->isa;
    size_t erow = mk_ggml_row_bytes(m->embd.t->type, d);
    for (int t = 0; t < T; t++)
        mk_ggml_dequant_row(m->embd.t->type, (const uint8_t *)m->embd.t->data + (size_t)tokens[t] * erow, s->x + (size_t)t * d, d);
    dump(s, "embd", -1, s->x, T, d);
    for (int t = 0; t < T; t++) mk_gx_rope_cache(m->rot_dim, m->rope_base, start + t, s->rope + (size_t)t * m->rot_dim);
    for (int l = 0; l < m->n_layers; l++) {
        const llama_layer *L = &m->layers[l];
        /* the last layer's output is needed for the last token only (llama.cpp's inp_out_ids):
         * from the attention output on, rows other than the last one are dropped */
        const int last = l == m->n_layers - 1;
        for (int t = 0; t < T; t++) mk_gx_rmsnorm(d, s->x + (size_t)t * d, L->attn_norm, m->eps, s->h + (size_t)t * d);
        dump(s, "attn_norm", l, s->h, T, d);
        mm(s, &L->wq, s->h, T, s->q);
        mm(s, &L->wk, s->h, T, s->k);
        mm(s, &L->wv, s->h, T, s->v);
        uint16_t *kc = s->kcache + (size_t)l * s->max_len * kvd, *vt = s->vcache + (size_t)l * kvd * s->vlen;
        for (int t = 0; t < T; t++) {
            float *q = s->q + (size_t)t * d, *k = s->k + (size_t)t * kvd, *v = s->v + (size_t)t * kvd;
            const float *rc_t = s->rope + (size_t)t * m->rot_dim;
            if (L->bq) for (int i = 0; i < d; i++) q[i] += L->bq[i];
            if (L->bk) for (int i = 0; i < kvd; i++) k[i] += L->bk[i];
            if (L->bv) for (int i = 0; i < kvd; i++) v[i] += L->bv[i];
            for (int h = 0; h < m->n_head; h++) mk_gx_rope(m->rot_dim, m->neox, rc_t, q + (size_t)h * hd);
            for (int h = 0; h < m->n_kv; h++) mk_gx_rope(m->rot_dim, m->neox, rc_t, k + (size_t)h * hd);
            mk_gx_f32_to_f16(kvd, k, kc + (size_t)(start + t) * kvd);
            uint16_t v16[4096];
            for (int i0 = 0; i0 < kvd; i0 += 4096) {
                int n = kvd - i0 < 4096 ? kvd - i0 : 4096;
                mk_gx_f32_to_f16(n, v + i0, v16);
                for (int i = 0; i < n; i++) vt[(size_t)(i0 + i) * s->vlen + start + t] = v16[i];
            }
        }
        dump(s, "Qcur", l, s->q, T, d);
        dump(s, "Kcur", l, s->k, T, kvd);
        dump(s, "Vcur", l, s->v, T, kvd);
        attn_job J = {s, l, T, start};
        mk_pool_run(m->pool, m->n_head, attn_head, &J);
        dump(s, "kqv_out", l, s->att, T, d);
        const int r0 = last ? T - 1 : 0, R = T - r0; /* rows kept from here on */
        float *x = s->x + (size_t)r0 * d;
        mm(s, &L->wo, s->att + (size_t)r0 * d, R, s->o);
        dump(s, "attn_out", l, s->o, R, d);
        for (size_t i = 0; i < (size_t)R * d; i++) x[i] += s->o[i];
        dump(s, "ffn_inp", l, x, R, d);
        for (int t = 0; t < R; t++) mk_gx_rmsnorm(d, x + (size_t)t * d, L->ffn_norm, m->eps, s->h + (size_t)t * d);
        dump(s, "ffn_norm", l, s->h, R, d);
        mm(s, &L->wgate, s->h, R, s->g);
        mm(s, &L->wup, s->h, R, s->u);
        for (int t = 0; t < R; t++) mk_gx_swiglu(isa, ff, s->g + (size_t)t * ff, s->g + (size_t)t * ff, s->u + (size_t)t * ff);
        dump(s, "ffn_swiglu", l, s->g, R, ff);
        mm(s, &L->wdown, s->g, R, s->o);
        dump(s, "ffn_out", l, s->o, R, d);
        for (size_t i = 0; i < (size_t)R * d; i++) x[i] += s->o[i];
        dump(s, "l_out", l, x, R, d);
    }
    s->pos += T;
    if (logits) {
        mk_gx_rmsnorm(d, s->x + (size_t)(T - 1) * d, m->out_norm, m->eps, s->h);
        dump(s, "result_norm", -1, s->h, 1, d);
        mm(s, &m->output, s->h, 1, logits);
        dump(s, "result_output", -1, logits, 1, m->vocab);
    }
    return MK_OK;
}

int llama_seq_forward(llama_seq *s, const int32_t *tokens, int T, float *logits, mk_err *err) {
    llama_model *m = s->m;
    if (T <= 0) return mk_fail(err, MK_EINVAL, "a forward call needs at least one token");
    if (s->pos + T > s->max_len)
        return mk_fail(err, MK_ERANGE, "position %d exceeds the sequence capacity %d", s->pos + T, s->max_len);
    for (int i = 0; i < T; i++)
        if (tokens[i] < 0 || tokens[i] >= m->vocab)
            return mk_fail(err, MK_ERANGE, "token id %d at index %d is outside the vocabulary [0, %d)", tokens[i], i, m->vocab);
    /* llama.cpp runs a batch as ubatches of at most n_ubatch (512 by default) tokens, and the
     * attention's summation order depends on the ubatch size, so a long prompt is split the same
     * way (this also bounds the scratch memory) */
    for (int i = 0; i < T; i += LLAMA_UBATCH) {
        int n = T - i < LLAMA_UBATCH ? T - i : LLAMA_UBATCH;
        int rc = forward_ubatch(s, tokens + i, n, i + n == T ? logits : NULL, err);
        if (rc) return rc;
    }
    return MK_OK;
}
