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
 *   - K and V stored as f16 (llama.cpp's default cache type) in the paged blocks, V transposed
 *     per block as llama.cpp stores it without flash attention; KQ = K · f16(q), softmax(KQ *
 *     scale) with exp on vector lanes and the sum in double, KQV = V^T · f16(softmax), read
 *     across the blocks in the contiguous order (num/ggml_paged.h). Which dot order: llama.cpp
 *     computes a one-token call with ggml_vec_dot_f16 and a call of 2+ tokens with tinyBLAS
 *     (llamafile sgemm); here every row carries the order of the llama.cpp call it stands for
 *     (the exactness rule in llama.h), so a row's result does not depend on how the engine
 *     chunked or grouped it. Masked (future) positions, which llama.cpp carries up to its padded
 *     KV length, contribute exact zeros, so only the causal prefix, padded to the vector width,
 *     is computed here;
 *   - SwiGLU on ggml_v_silu lanes.
 * RoPE: "normal" (adjacent pairs) for llama, "neox" (first half with second half) for qwen2.
 *
 * Structure: one forward implementation. llama_forward (the engine's step, many sequences over a
 * shared pool) and llama_seq_forward (one sequence over a private pool whose block table is the
 * whole pool) both go through forward_pieces (checks; cuts the rows into calls of at most 512)
 * and forward_call (embedding, the layers, logits) over the rows of every piece concatenated:
 * weight matmuls take all rows at once (a batched decode step of N rows reads each weight block
 * once for up to 16 rows: num/ggml_quant.h's multi-row kernels; Q, K, V, and gate, up, share
 * one quantization of their input and one pool run each), attention runs per (KV group,
 * row) on the thread pool over the row's own block table (per (head, row) when there are few
 * rows), and from the last layer's attention output on only the rows whose logits are asked go
 * on (the output matrix, the largest, runs only for those); the per-row steps between the
 * matmuls (norms, RoPE, KV writes, SwiGLU, residuals) run on the pool too when a call has many
 * rows. Memory: the KV blocks belong to the caller's pool; llama_work holds the scratch (rows
 * grown to the largest call, per-thread attention buffers fixed at create).
 */
#include "models/llama.h"
#include "base/status.h"
#include "base/threads.h"
#include "io/gguf.h"
#include "num/formats.h"
#include "num/ggml_exact.h"
#include "num/ggml_paged.h"
#include "num/ggml_quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LLAMA_MAX_LAYERS 256
#define LLAMA_UBATCH 512 /* llama.cpp's default n_ubatch; also the most rows of one forward call */

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

/* ---- paged forward -------------------------------------------------------------------------- */

#define LLAMA_LOGIT_ROWS 32 /* rows per call of the output matrix (bounds the logits scratch) */

struct llama_work {
    llama_model *m;
    int max_len;            /* positions below this */
    int plen;               /* max_len rounded up to 64: the longest attention row */
    int nthr;               /* threads of the model's pool */
    int cap_rows, cap_lg, cap_sub;
    /* row scratch (R = rows of one call, <= cap_rows) */
    float *x, *h, *q, *att, *o;   /* [R, dim] */
    float *k, *v;                 /* [R, kvd] */
    float *g, *u;                 /* [R, ff] */
    float *rope;                  /* [R][rot_dim]: cos, sin per pair */
    int *rpc, *rpos;              /* [R] piece and position of each row */
    unsigned char *rtb;           /* [R] attention order: 1 tinyBLAS, 0 vec_dot */
    void *mms;                    /* mk_ggml_matmul scratch for cap_rows rows */
    float *lg;                    /* [cap_lg][vocab] rows of one output-matrix call */
    llama_piece *sub;             /* [cap_sub] the pieces of one call of <= LLAMA_UBATCH rows */
    /* per-thread attention scratch, fixed at create */
    float *sc;                    /* [nthr][plen] scores, then probabilities */
    uint16_t *p16;                /* [nthr][plen] probabilities in f16 */
    uint16_t *q16;                /* [nthr][head_dim] the query in f16 */
    const uint16_t **seg;         /* [nthr][seg_cap] a row's V^T block pieces */
    int seg_cap;
    uint16_t *zseg;               /* [head_dim][LLAMA_MAX_BLOCK_TOKENS] zeros: V^T past the table */
    uint16_t *v16;                /* [nthr][kvd] one V row in f16 */
    size_t fixed_bytes, row_bytes;
};

typedef struct {
    llama_dump_fn fn;
    void *ctx;
} dumper;

size_t llama_block_bytes(const llama_model *m, int bt) {
    return (size_t)m->n_layers * 2 * (size_t)bt * (size_t)m->n_kv * (size_t)m->head_dim * sizeof(uint16_t);
}

/* Layer l's K rows of a block ([bt][kvd] f16); its V^T ([kvd][bt]) follows at + bt * kvd. */
static inline uint16_t *blk_k(mk_kv_pool *pool, int block, int layer, int bt, int kvd) {
    return (uint16_t *)mk_kv_block_data(pool, block) + (size_t)layer * 2 * (size_t)bt * (size_t)kvd;
}

static void free_rows(llama_work *w) {
    free(w->x); free(w->h); free(w->q); free(w->att); free(w->o); free(w->k); free(w->v); free(w->g);
    free(w->u); free(w->rope); free(w->rpc); free(w->rpos); free(w->rtb); free(w->mms);
    w->x = w->h = w->q = w->att = w->o = w->k = w->v = w->g = w->u = w->rope = NULL;
    w->rpc = w->rpos = NULL;
    w->rtb = NULL;
    w->mms = NULL;
    w->cap_rows = 0;
    w->row_bytes = 0;
}

/* Row scratch for calls of R rows (rounded up to a power of two, at most LLAMA_UBATCH): grown by
 * a longer call than any before, never by a decode after the first. */
static int ensure_rows(llama_work *w, int R, mk_err *err) {
    if (R <= w->cap_rows) return MK_OK;
    int cap = 1;
    while (cap < R) cap *= 2;
    if (cap > LLAMA_UBATCH) cap = LLAMA_UBATCH > R ? LLAMA_UBATCH : R;
    const llama_model *m = w->m;
    free_rows(w);
    size_t C = (size_t)cap, d = (size_t)m->dim, kvd = (size_t)m->n_kv * m->head_dim, ff = (size_t)m->ff;
    size_t mb = 0;
    const lweight *ws[] = {&m->embd, &m->output};
    for (int i = 0; i < 2; i++) {
        size_t b = mk_ggml_matmul_scratch(ws[i]->t->type, cap, ws[i]->k);
        if (b > mb) mb = b;
    }
    for (int l = 0; l < m->n_layers; l++) {
        const llama_layer *L = &m->layers[l];
        const lweight *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wgate, &L->wup, &L->wdown};
        for (int i = 0; i < 7; i++) {
            size_t b = mk_ggml_matmul_scratch(lw[i]->t->type, cap, lw[i]->k);
            if (b > mb) mb = b;
        }
    }
    w->x = malloc(sizeof(float) * C * d);
    w->h = malloc(sizeof(float) * C * d);
    w->q = malloc(sizeof(float) * C * d);
    w->att = malloc(sizeof(float) * C * d);
    w->o = malloc(sizeof(float) * C * d);
    w->k = malloc(sizeof(float) * C * kvd);
    w->v = malloc(sizeof(float) * C * kvd);
    w->g = malloc(sizeof(float) * C * ff);
    w->u = malloc(sizeof(float) * C * ff);
    w->rope = malloc(sizeof(float) * C * (size_t)m->rot_dim);
    w->rpc = malloc(sizeof(int) * C);
    w->rpos = malloc(sizeof(int) * C);
    w->rtb = malloc(C);
    w->mms = malloc(mb + 64);
    if (!w->x || !w->h || !w->q || !w->att || !w->o || !w->k || !w->v || !w->g || !w->u || !w->rope || !w->rpc ||
        !w->rpos || !w->rtb || !w->mms) {
        free_rows(w);
        return mk_fail(err, MK_ENOMEM, "out of memory for a forward call of %d rows", cap);
    }
    w->cap_rows = cap;
    w->row_bytes = C * (sizeof(float) * (5 * d + 2 * kvd + 2 * ff + (size_t)m->rot_dim) + 2 * sizeof(int) + 1) + mb;
    return MK_OK;
}

static int ensure_lg(llama_work *w, int n, mk_err *err) {
    if (n <= w->cap_lg) return MK_OK;
    free(w->lg);
    w->lg = malloc(sizeof(float) * (size_t)n * (size_t)w->m->vocab);
    w->cap_lg = w->lg ? n : 0;
    return w->lg ? MK_OK : mk_fail(err, MK_ENOMEM, "out of memory for %d rows of logits", n);
}

int llama_work_create(llama_model *m, int max_len, llama_work **out, mk_err *err) {
    *out = NULL;
    if (max_len < 1 || max_len > m->ctx)
        return mk_fail(err, MK_ERANGE, "sequence length %d outside [1, %d] (the model's context length)", max_len, m->ctx);
    llama_work *w = calloc(1, sizeof *w);
    if (!w) return mk_fail(err, MK_ENOMEM, "out of memory");
    w->m = m;
    w->max_len = max_len;
    w->plen = (max_len + 63) & ~63;
    w->nthr = mk_pool_size(m->pool);
    w->seg_cap = w->plen / 16 + 1;
    size_t T = (size_t)w->nthr, hd = (size_t)m->head_dim, kvd = (size_t)m->n_kv * hd;
    w->sc = malloc(sizeof(float) * T * (size_t)w->plen);
    w->p16 = calloc(T * (size_t)w->plen, sizeof(uint16_t));
    w->q16 = malloc(sizeof(uint16_t) * T * hd);
    w->seg = malloc(sizeof(*w->seg) * T * (size_t)w->seg_cap);
    w->zseg = calloc(hd * LLAMA_MAX_BLOCK_TOKENS, sizeof(uint16_t));
    w->v16 = malloc(sizeof(uint16_t) * T * kvd);
    w->fixed_bytes = T * ((size_t)w->plen * 6 + hd * 2 + sizeof(*w->seg) * (size_t)w->seg_cap) +
                     hd * LLAMA_MAX_BLOCK_TOKENS * 2 + T * kvd * 2;
    int rc = (!w->sc || !w->p16 || !w->q16 || !w->seg || !w->zseg || !w->v16) ? mk_fail(err, MK_ENOMEM, "out of memory")
                                                                              : ensure_rows(w, 1, err);
    if (rc) { llama_work_free(w); return rc; }
    *out = w;
    return MK_OK;
}

void llama_work_free(llama_work *w) {
    if (!w) return;
    free_rows(w);
    free(w->lg);
    free(w->sub);
    free(w->sc);
    free(w->p16);
    free(w->q16);
    free(w->seg);
    free(w->zseg);
    free(w->v16);
    free(w);
}

size_t llama_work_bytes(const llama_work *w) {
    return w->fixed_bytes + w->row_bytes + sizeof(float) * (size_t)w->cap_lg * (size_t)w->m->vocab;
}

int llama_piece_check(const llama_model *m, const llama_work *w, mk_kv_pool *pool, const llama_piece *p, mk_err *err) {
    const int bt = mk_kv_block_tokens(pool), nb = mk_kv_n_blocks(pool);
    if (bt < 16 || bt > LLAMA_MAX_BLOCK_TOKENS || bt % 16)
        return mk_fail(err, MK_EINTERNAL, "llama: block_tokens %d is not a multiple of 16 in [16, %d]", bt, LLAMA_MAX_BLOCK_TOKENS);
    if (p->n < 1 || p->pos < 0) return mk_fail(err, MK_EINVAL, "llama: a piece of %d tokens at position %d", p->n, p->pos);
    if (p->pos + p->n > w->max_len)
        return mk_fail(err, MK_ERANGE, "position %d exceeds the sequence capacity %d", p->pos + p->n, w->max_len);
    int need = (p->pos + p->n + bt - 1) / bt;
    if (p->n_blocks < need)
        return mk_fail(err, MK_EINTERNAL, "llama: positions [0, %d) need %d blocks, the table has %d", p->pos + p->n, need, p->n_blocks);
    for (int i = 0; i < need; i++)
        if (p->blocks[i] < 0 || p->blocks[i] >= nb)
            return mk_fail(err, MK_EINTERNAL, "llama: block table entry %d is %d, outside [0, %d)", i, p->blocks[i], nb);
    for (int i = 0; i < p->n; i++)
        if (p->tokens[i] < 0 || p->tokens[i] >= m->vocab)
            return mk_fail(err, MK_ERANGE, "token id %d at index %d is outside the vocabulary [0, %d)", p->tokens[i], i, m->vocab);
    return MK_OK;
}

static void dump(const dumper *dd, const char *what, int layer, const float *x, int rows, int cols) {
    if (!dd || !dd->fn) return;
    char name[64];
    if (layer >= 0) snprintf(name, sizeof name, "%s-%d", what, layer);
    else snprintf(name, sizeof name, "%s", what);
    dd->fn(dd->ctx, name, x, rows, cols);
}

/* y[R, n] = x[R, k] @ W^T. Calls of 2+ rows take the multi-row kernels where the CPU has them
 * (AVX-512 VNNI: every weight block read once for up to 16 rows, each output still summed in
 * llama.cpp's order, so the bits are the same); a model set to a level below AVX-512
 * (llama_model_set_isa) keeps to the AVX2 kernels, as that machine would. */
static void mm(llama_work *w, const lweight *wt, const float *x, int R, float *y) {
    mk_ggml_matmul_ex(w->m->pool, wt->t->type, wt->t->data, wt->n, wt->k, x, R, y, w->mms,
                      w->m->isa == MK_GX_AVX512 ? 0 : MK_GGML_MM_NO_VNNI);
}

/* Two or three products of the same input x[R, k] (Q, K, V; gate, up): one call that quantizes x
 * once and runs every matrix's rows in one pool run when the matrices share a type, else one mm
 * each. The results are the same bits either way. */
static void mm_same_x(llama_work *w, const lweight *const *wts, float *const *ys, int nw, const float *x, int R) {
    int same = 1;
    for (int i = 1; i < nw; i++) same &= wts[i]->t->type == wts[0]->t->type && wts[i]->k == wts[0]->k;
    if (!same) {
        for (int i = 0; i < nw; i++) mm(w, wts[i], x, R, ys[i]);
        return;
    }
    mk_ggml_mat mats[3];
    for (int i = 0; i < nw; i++) mats[i] = (mk_ggml_mat){wts[i]->t->data, wts[i]->n, ys[i]};
    mk_ggml_matmul_n(w->m->pool, wts[0]->t->type, wts[0]->k, mats, nw, x, R, w->mms,
                     w->m->isa == MK_GX_AVX512 ? 0 : MK_GGML_MM_NO_VNNI);
}

/* The exactness rule (llama.h): 1 when the row at `pos` takes tinyBLAS order, i.e. it lies in the
 * piece's llama.cpp batch span and its 512-token ubatch there holds 2+ tokens. */
static int row_tb(const llama_piece *p, int pos) {
    if (pos < p->ub_lo || pos >= p->ub_hi) return 0;
    int u0 = p->ub_lo + (pos - p->ub_lo) / LLAMA_UBATCH * LLAMA_UBATCH;
    int size = p->ub_hi - u0 < LLAMA_UBATCH ? p->ub_hi - u0 : LLAMA_UBATCH;
    return size >= 2;
}

typedef struct {
    llama_work *w;
    mk_kv_pool *pool;
    const llama_piece *pc;
    int layer, R, bt;
} attn_job;

/* Attention of head h for row r, as llama.cpp's mul_mat / soft_max / mul_mat:
 * scores over the causal prefix of P = pos + 1 keys read block by block, padded with masked
 * entries to a multiple of 16 (the softmax's vector chunks; exp(-inf) = 0 exactly),
 * probabilities rounded to f16, and V^T rows read up to a multiple of 64 (the f16 dot's step)
 * across the blocks with zero probabilities past P. Order: the row's (rtb). */
static void attn_head(const attn_job *J, int h, int r, int tid) {
    llama_work *w = J->w;
    const llama_model *m = w->m;
    const mk_gx_isa isa = m->isa;
    const int bt = J->bt;
    const int hd = m->head_dim, kvd = m->n_kv * hd, g = h / (m->n_head / m->n_kv);
    const int kn = mk_gx_tb_kn(isa), batch = w->rtb[r] && kn > 0;
    const int tb_kq = batch && hd % kn == 0, tb_kqv = batch && hd % 4 == 0;
    const llama_piece *p = &J->pc[w->rpc[r]];
    const int P = w->rpos[r] + 1, P16 = (P + 15) & ~15, P64 = (P + 63) & ~63, nkqv = tb_kqv ? P16 : P64;
    float *sc = w->sc + (size_t)tid * w->plen;
    uint16_t *p16 = w->p16 + (size_t)tid * w->plen, *q16 = w->q16 + (size_t)tid * hd;
    const uint16_t **seg = w->seg + (size_t)tid * w->seg_cap;
    const float scale = 1.0f / sqrtf((float)hd);
    mk_gx_f32_to_f16(hd, w->q + (size_t)r * m->dim + (size_t)h * hd, q16);
    /* KQ: every score is a dot of its own, so it is computed block by block */
    int nb = 0;
    for (; nb * bt < nkqv && nb < p->n_blocks; nb++) {
        const uint16_t *kb = blk_k(J->pool, p->blocks[nb], J->layer, bt, kvd);
        int j0 = nb * bt, cnt = P - j0 < bt ? P - j0 : bt;
        if (cnt > 0) mk_gx_dot_f16_n(isa, tb_kq, hd, kb + (size_t)g * hd, (size_t)kvd, cnt, q16, sc + j0);
        seg[nb] = kb + (size_t)bt * kvd + (size_t)g * hd * bt;
    }
    for (; nb * bt < nkqv; nb++) seg[nb] = w->zseg; /* padding past the table: times zero */
    float mx = -INFINITY;
    for (int i = 0; i < P; i++) {
        sc[i] *= scale;
        if (sc[i] > mx) mx = sc[i];
    }
    for (int i = P; i < P16; i++) sc[i] = -INFINITY;
    double sum = mk_gx_softmax_exp(isa, P16, sc, sc, mx);
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < P16; i++) sc[i] *= inv;
    mk_gx_f32_to_f16(P16, sc, p16);
    for (int i = P16; i < P64; i++) p16[i] = 0;
    /* KQV: row i of the group's V^T, across the blocks, times p */
    float *o = w->att + (size_t)r * m->dim + (size_t)h * hd;
    mk_gx_dot_f16_paged(isa, tb_kqv, nkqv, seg, bt, (size_t)bt, hd, p16, o);
}

/* Job j = h * R + r: head h for row r (the pool's contiguous chunks split the heads, not the short
 * rows from the long ones). For calls of few rows, where the heads are what the threads share. */
static void attn_row(void *ctx, int j, int tid) {
    const attn_job *J = ctx;
    attn_head(J, j / J->R, j % J->R, tid);
}

/* Job j = g * R + r: the heads of KV group g for row r, one after the other, so the group's K and
 * V^T pieces of the row's sequence are read from memory once and are cache-hot for the group's
 * other heads (the KV is most of a batched step's memory traffic). The pool's contiguous chunks
 * split the groups, not the short rows from the long ones. */
static void attn_group(void *ctx, int j, int tid) {
    const attn_job *J = ctx;
    const llama_model *m = J->w->m;
    const int g = j / J->R, r = j % J->R, hpg = m->n_head / m->n_kv;
    for (int h = g * hpg; h < (g + 1) * hpg; h++) attn_head(J, h, r, tid);
}

/* ---- per-row steps between the matmuls (independent rows: run on the pool for many rows) ---- */

typedef struct {
    llama_work *w;
    mk_kv_pool *pool;
    const llama_piece *pc;
    const llama_layer *L;
    int layer, bt;
} rows_job;

#define LLAMA_POOL_ROWS 16 /* rows from which the per-row steps are spread over the pool */

static void rows_run(const rows_job *J, int R, mk_task_fn fn) {
    if (R >= LLAMA_POOL_ROWS) mk_pool_run(J->w->m->pool, R, fn, (void *)J);
    else for (int r = 0; r < R; r++) fn((void *)J, r, 0);
}

/* h = rmsnorm(x) * attn_norm */
static void row_attn_norm(void *ctx, int r, int tid) {
    (void)tid;
    const rows_job *J = ctx;
    const llama_model *m = J->w->m;
    mk_gx_rmsnorm(m->dim, J->w->x + (size_t)r * m->dim, J->L->attn_norm, m->eps, J->w->h + (size_t)r * m->dim);
}

/* biases, RoPE of q and k, and the row's K row and V^T column in its block */
static void row_qkv(void *ctx, int r, int tid) {
    const rows_job *J = ctx;
    llama_work *w = J->w;
    const llama_model *m = w->m;
    const llama_layer *L = J->L;
    const int d = m->dim, hd = m->head_dim, kvd = m->n_kv * hd, bt = J->bt;
    float *q = w->q + (size_t)r * d, *k = w->k + (size_t)r * kvd, *v = w->v + (size_t)r * kvd;
    const float *rc_r = w->rope + (size_t)r * m->rot_dim;
    if (L->bq) for (int i = 0; i < d; i++) q[i] += L->bq[i];
    if (L->bk) for (int i = 0; i < kvd; i++) k[i] += L->bk[i];
    if (L->bv) for (int i = 0; i < kvd; i++) v[i] += L->bv[i];
    for (int h = 0; h < m->n_head; h++) mk_gx_rope(m->rot_dim, m->neox, rc_r, q + (size_t)h * hd);
    for (int h = 0; h < m->n_kv; h++) mk_gx_rope(m->rot_dim, m->neox, rc_r, k + (size_t)h * hd);
    /* K row and V^T column of this position in its block */
    const int pos = w->rpos[r], off = pos % bt;
    uint16_t *kb = blk_k(J->pool, J->pc[w->rpc[r]].blocks[pos / bt], J->layer, bt, kvd), *vt = kb + (size_t)bt * kvd;
    uint16_t *v16 = w->v16 + (size_t)tid * kvd;
    mk_gx_f32_to_f16(kvd, k, kb + (size_t)off * kvd);
    mk_gx_f32_to_f16(kvd, v, v16);
    for (int i = 0; i < kvd; i++) vt[(size_t)i * bt + off] = v16[i];
}

/* Before row_qkv: a block's first write (position 0 of the block in this call) zeroes the
 * block's V^T past that position, which is read (times zero probabilities) and must be finite.
 * Done for all rows first, on the calling thread: rows of the same block run in parallel in
 * row_qkv, and a later position's column must not be wiped by its block's first row. */
static void vt_first_writes(const rows_job *J, int R) {
    llama_work *w = J->w;
    const int kvd = w->m->n_kv * w->m->head_dim, bt = J->bt;
    for (int r = 0; r < R; r++) {
        const int pos = w->rpos[r];
        if (pos % bt) continue;
        uint16_t *vt = blk_k(J->pool, J->pc[w->rpc[r]].blocks[pos / bt], J->layer, bt, kvd) + (size_t)bt * kvd;
        for (int i = 0; i < kvd; i++) memset(vt + (size_t)i * bt + 1, 0, sizeof(uint16_t) * (size_t)(bt - 1));
    }
}

/* x += attention output; h = rmsnorm(x) * ffn_norm */
static void row_ffn_in(void *ctx, int r, int tid) {
    (void)tid;
    const rows_job *J = ctx;
    const llama_model *m = J->w->m;
    const size_t d = (size_t)m->dim;
    float *x = J->w->x + (size_t)r * d;
    const float *o = J->w->o + (size_t)r * d;
    for (size_t i = 0; i < d; i++) x[i] += o[i];
    mk_gx_rmsnorm(m->dim, x, J->L->ffn_norm, m->eps, J->w->h + (size_t)r * d);
}

/* g = silu(g) * u */
static void row_swiglu(void *ctx, int r, int tid) {
    (void)tid;
    const rows_job *J = ctx;
    const llama_model *m = J->w->m;
    float *g = J->w->g + (size_t)r * m->ff;
    mk_gx_swiglu(m->isa, m->ff, g, g, J->w->u + (size_t)r * m->ff);
}

/* x += FFN output */
static void row_ffn_out(void *ctx, int r, int tid) {
    (void)tid;
    const rows_job *J = ctx;
    const size_t d = (size_t)J->w->m->dim;
    float *x = J->w->x + (size_t)r * d;
    const float *o = J->w->o + (size_t)r * d;
    for (size_t i = 0; i < d; i++) x[i] += o[i];
}

/* One call: the pieces' R <= cap_rows rows, all layers. */
static int forward_call(llama_model *m, llama_work *w, mk_kv_pool *pool, const llama_piece *pc, int np, int R,
                        const dumper *dd, mk_err *err) {
    int rc = ensure_rows(w, R, err);
    if (rc) return rc;
    const int d = m->dim, hd = m->head_dim, kvd = m->n_kv * hd, ff = m->ff, bt = mk_kv_block_tokens(pool);
    size_t erow = mk_ggml_row_bytes(m->embd.t->type, d);
    for (int i = 0, r = 0; i < np; i++)
        for (int t = 0; t < pc[i].n; t++, r++) {
            w->rpc[r] = i;
            w->rpos[r] = pc[i].pos + t;
            w->rtb[r] = (unsigned char)row_tb(&pc[i], w->rpos[r]);
            mk_ggml_dequant_row(m->embd.t->type, (const uint8_t *)m->embd.t->data + (size_t)pc[i].tokens[t] * erow,
                                w->x + (size_t)r * d, d);
            mk_gx_rope_cache(m->rot_dim, m->rope_base, w->rpos[r], w->rope + (size_t)r * m->rot_dim);
        }
    dump(dd, "embd", -1, w->x, R, d);
    int Rk = R; /* rows kept: all, until the last layer keeps only the rows whose logits are asked */
    for (int l = 0; l < m->n_layers; l++) {
        const llama_layer *L = &m->layers[l];
        const rows_job RJ = {w, pool, pc, L, l, bt};
        rows_run(&RJ, R, row_attn_norm);
        dump(dd, "attn_norm", l, w->h, R, d);
        mm_same_x(w, (const lweight *const[]){&L->wq, &L->wk, &L->wv}, (float *const[]){w->q, w->k, w->v}, 3, w->h, R);
        vt_first_writes(&RJ, R);
        rows_run(&RJ, R, row_qkv);
        dump(dd, "Qcur", l, w->q, R, d);
        dump(dd, "Kcur", l, w->k, R, kvd);
        dump(dd, "Vcur", l, w->v, R, kvd);
        attn_job J = {w, pool, pc, l, R, bt};
        if (m->n_kv * R >= 8 * w->nthr) mk_pool_run(m->pool, m->n_kv * R, attn_group, &J);
        else mk_pool_run(m->pool, m->n_head * R, attn_row, &J);
        dump(dd, "kqv_out", l, w->att, R, d);
        if (l == m->n_layers - 1) {
            /* the last layer's output is needed only for the rows whose logits are asked
             * (llama.cpp's inp_out_ids): the others are dropped from the attention output on */
            Rk = 0;
            for (int r = 0; r < R; r++) {
                const llama_piece *p = &pc[w->rpc[r]];
                if (!p->logits || w->rpos[r] != p->pos + p->n - 1) continue;
                if (Rk != r) {
                    memcpy(w->att + (size_t)Rk * d, w->att + (size_t)r * d, sizeof(float) * (size_t)d);
                    memcpy(w->x + (size_t)Rk * d, w->x + (size_t)r * d, sizeof(float) * (size_t)d);
                    w->rpc[Rk] = w->rpc[r];
                    w->rpos[Rk] = w->rpos[r];
                }
                Rk++;
            }
            if (!Rk) break;
        }
        mm(w, &L->wo, w->att, Rk, w->o);
        dump(dd, "attn_out", l, w->o, Rk, d);
        rows_run(&RJ, Rk, row_ffn_in);
        dump(dd, "ffn_inp", l, w->x, Rk, d);
        dump(dd, "ffn_norm", l, w->h, Rk, d);
        mm_same_x(w, (const lweight *const[]){&L->wgate, &L->wup}, (float *const[]){w->g, w->u}, 2, w->h, Rk);
        rows_run(&RJ, Rk, row_swiglu);
        dump(dd, "ffn_swiglu", l, w->g, Rk, ff);
        mm(w, &L->wdown, w->g, Rk, w->o);
        dump(dd, "ffn_out", l, w->o, Rk, d);
        rows_run(&RJ, Rk, row_ffn_out);
        dump(dd, "l_out", l, w->x, Rk, d);
    }
    /* logits: the output matrix (the largest one) read once per LLAMA_LOGIT_ROWS sequences */
    for (int r0 = 0; r0 < Rk; r0 += LLAMA_LOGIT_ROWS) {
        int cnt = Rk - r0 < LLAMA_LOGIT_ROWS ? Rk - r0 : LLAMA_LOGIT_ROWS;
        if ((rc = ensure_lg(w, cnt, err))) return rc;
        for (int t = 0; t < cnt; t++)
            mk_gx_rmsnorm(d, w->x + (size_t)(r0 + t) * d, m->out_norm, m->eps, w->h + (size_t)t * d);
        dump(dd, "result_norm", -1, w->h, cnt, d);
        mm(w, &m->output, w->h, cnt, w->lg);
        dump(dd, "result_output", -1, w->lg, cnt, m->vocab);
        for (int t = 0; t < cnt; t++)
            memcpy(pc[w->rpc[r0 + t]].logits, w->lg + (size_t)t * m->vocab, sizeof(float) * (size_t)m->vocab);
    }
    return MK_OK;
}

/* Cuts the pieces into calls of at most LLAMA_UBATCH rows (a piece may span two calls: its first
 * part's KV is in the blocks before the second part runs; numerically nothing depends on where
 * the cut falls). */
static int forward_pieces(llama_model *m, llama_work *w, mk_kv_pool *pool, const llama_piece *pc, int n,
                          const dumper *dd, mk_err *err) {
    for (int i = 0; i < n; i++) {
        int rc = llama_piece_check(m, w, pool, &pc[i], err);
        if (rc) return rc;
    }
    if (n > w->cap_sub) {
        llama_piece *s = realloc(w->sub, sizeof *s * (size_t)n);
        if (!s) return mk_fail(err, MK_ENOMEM, "out of memory for a step of %d pieces", n);
        w->sub = s;
        w->cap_sub = n;
    }
    for (int i = 0, off = 0; i < n;) {
        int ns = 0, rows = 0;
        while (i < n && rows < LLAMA_UBATCH) {
            int take = pc[i].n - off < LLAMA_UBATCH - rows ? pc[i].n - off : LLAMA_UBATCH - rows;
            llama_piece *s = &w->sub[ns++];
            *s = pc[i];
            s->tokens += off;
            s->pos += off;
            s->n = take;
            s->logits = off + take == pc[i].n ? pc[i].logits : NULL;
            rows += take;
            off += take;
            if (off == pc[i].n) { i++; off = 0; }
        }
        int rc = forward_call(m, w, pool, w->sub, ns, rows, dd, err);
        if (rc) return rc;
    }
    return MK_OK;
}

int llama_forward(llama_model *m, llama_work *w, mk_kv_pool *pool, const llama_piece *pieces, int n, mk_err *err) {
    return forward_pieces(m, w, pool, pieces, n, NULL, err);
}

/* ---- one sequence: a private pool with the whole table allocated -------------------------------- */

#define LLAMA_SEQ_BLOCK_TOKENS 64

struct llama_seq {
    llama_model *m;
    int max_len, pos;
    mk_kv_pool *kv;   /* ceil(max_len / bt) blocks, all owned by this sequence */
    int *blocks, n_blocks;
    llama_work *w;
    dumper dd;
};

int llama_seq_create(llama_model *m, int max_len, llama_seq **out, mk_err *err) {
    *out = NULL;
    if (max_len <= 0) max_len = m->ctx < 4096 ? m->ctx : 4096;
    if (max_len > m->ctx)
        return mk_fail(err, MK_ERANGE, "sequence length %d exceeds the model's context length %d", max_len, m->ctx);
    llama_seq *s = calloc(1, sizeof *s);
    if (!s) return mk_fail(err, MK_ENOMEM, "out of memory");
    s->m = m;
    s->max_len = max_len;
    const int bt = LLAMA_SEQ_BLOCK_TOKENS;
    s->n_blocks = (max_len + bt - 1) / bt;
    s->blocks = malloc(sizeof(int) * (size_t)s->n_blocks);
    int rc = s->blocks ? mk_kv_pool_create(s->n_blocks, bt, llama_block_bytes(m, bt), &s->kv, err)
                       : mk_fail(err, MK_ENOMEM, "out of memory");
    if (!rc) {
        for (int i = 0; i < s->n_blocks; i++) s->blocks[i] = mk_kv_alloc(s->kv);
        rc = llama_work_create(m, max_len, &s->w, err);
    }
    if (rc) {
        mk_err_prefix(err, "sequence of %d tokens", max_len);
        llama_seq_free(s);
        return rc;
    }
    *out = s;
    return MK_OK;
}

void llama_seq_free(llama_seq *s) {
    if (!s) return;
    llama_work_free(s->w);
    mk_kv_pool_free(s->kv);
    free(s->blocks);
    free(s);
}

void llama_seq_reset(llama_seq *s) { s->pos = 0; }
int llama_seq_pos(const llama_seq *s) { return s->pos; }
int llama_seq_capacity(const llama_seq *s) { return s->max_len; }

void llama_seq_set_dump(llama_seq *s, llama_dump_fn fn, void *ctx) {
    s->dd.fn = fn;
    s->dd.ctx = ctx;
}

int llama_seq_forward(llama_seq *s, const int32_t *tokens, int T, float *logits, mk_err *err) {
    if (T <= 0) return mk_fail(err, MK_EINVAL, "a forward call needs at least one token");
    /* the call is one llama.cpp batch: its ubatches of 512 from s->pos decide the order */
    llama_piece p = {.tokens = tokens, .pos = s->pos, .n = T, .blocks = s->blocks, .n_blocks = s->n_blocks,
                     .ub_lo = s->pos, .ub_hi = s->pos + T, .logits = logits};
    int rc = forward_pieces(s->m, s->w, s->kv, &p, 1, &s->dd, err);
    if (rc) return rc;
    s->pos += T;
    return MK_OK;
}
