/* dsv4.h — DeepSeek-V4-Flash: configuration, bound weights, per-sequence state, forward pass.
 *
 * The model (dsv4_model) is immutable after loading: the validated config, the mmapped checkpoint
 * and, per layer, mk_wmat views into it, plus RoPE tables. A sequence (dsv4_seq) holds everything a
 * forward call mutates. Its own state (the "slot"): the window ring of each layer, the
 * compressors' pooling state, and the scratch for the largest call. The compressed KV entries
 * (CSA: one per 4 tokens plus the indexer's keys; HCA: one per `ratio` tokens) live in blocks of
 * DSV4_BLOCK_TOKENS positions (dsv4_kv_layout) reached through the sequence's block table: a
 * private pool for a sequence from dsv4_seq_create, the engine's shared pool for one from
 * dsv4_seq_create_paged (src/models/batch.c), whose blocks also carry a snapshot of the slot state
 * at their end, so a prefix-cache hit at a block boundary restores the slot (dsv4_seq_restore).
 * A fresh sequence starts from clean state (KV zero, compressor scores -inf), which is what the
 * reference has on a freshly built model.
 *
 * The forward pass (dsv4.c) mirrors inference/model.py. A call runs n >= 1 tokens at the
 * sequence's position (the reference's prefill at 0 and one-token decodes, and chunks of a prompt
 * at any position). mk_linear's per-row result does not depend on the number of rows, so a
 * prompt run as one call, split into any chunks or fed token by token gives bit-identical logits
 * and state, and dsv4_forward_batch runs pieces of several sequences as one forward (every
 * weight matrix read once) with each piece's results those of its sequence alone. Every intermediate tensor has a name
 * ("L2.attn.q", "L2.h") and is passed to an optional dump hook; discrete decisions (MoE expert
 * choice, indexer top-k) go through an optional decision hook, which the golden tests use to
 * record them or force the reference's choices.
 * Spec: ../shared/docs/model-dsv4.md.
 */
#ifndef MK_MODELS_DSV4_H
#define MK_MODELS_DSV4_H

#include "io/safetensors.h"
#include "minke.h"
#include "ops/ops.h"

#define DSV4_MAX_LAYERS 128

typedef struct dsv4_model dsv4_model;
typedef struct dsv4_seq dsv4_seq;

typedef struct {
    int vocab, dim, n_layers, n_hash, n_mtp;
    int n_heads, head_dim, rope_dim, q_lora, o_groups, o_lora;
    int moe_inter, n_experts, n_act, n_shared;
    float route_scale, swiglu_limit;
    int window;
    int compress_ratio[DSV4_MAX_LAYERS + 4]; /* n_layers + n_mtp entries */
    double rope_theta, compress_rope_theta, rope_factor, beta_fast, beta_slow;
    int original_seq_len;
    int index_heads, index_head_dim, index_topk;
    int hc, hc_iters;
    float hc_eps, norm_eps;
    int fp8;        /* quantization_config: FP8 weights with 128x128 e8m0 block scales */
    int expert_fp4; /* routed experts stored as packed FP4 */
    int bos, eos;
} dsv4_config;

/* Compressor of one layer (attention: D = head_dim; indexer: D = index_head_dim). */
typedef struct {
    int ratio, coff, D;
    mk_wmat wkv, wgate;   /* [coff*D, dim], bf16 in the checkpoint, computed in fp32 */
    const float *ape;     /* [ratio, coff*D] */
    const uint16_t *norm; /* [D] */
} dsv4_compressor;

typedef struct {
    mk_wmat w1, w2, w3;
} dsv4_expert;

typedef struct {
    int ratio;
    const uint16_t *attn_norm, *ffn_norm;
    const float *hc_attn_fn, *hc_attn_base, *hc_attn_scale;
    const float *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
    /* attention */
    mk_wmat wq_a, wq_b, wkv, wo_a, wo_b;
    const uint16_t *q_norm, *kv_norm;
    const float *attn_sink;
    dsv4_compressor cmp;      /* ratio > 0 */
    dsv4_compressor idx_cmp;  /* ratio == 4 */
    mk_wmat idx_wq_b, idx_wproj;
    /* MoE */
    mk_wmat gate;             /* [E, dim] bf16, computed in fp32 */
    const float *gate_bias;   /* [E] or NULL (hash layer) */
    const int64_t *tid2eid;   /* [vocab, n_act] or NULL */
    dsv4_expert shared;
    dsv4_expert *experts;     /* [E] */
    /* MTP only */
    mk_wmat e_proj, h_proj;
    const uint16_t *enorm, *hnorm, *norm;
    const float *hc_head_fn, *hc_head_base, *hc_head_scale;
    mk_rope_table *rope;      /* the table of this layer's attention */
} dsv4_layer;

struct dsv4_model {
    dsv4_config cfg;
    mk_st *st;
    char dir[1024];
    int max_seq_len;
    mk_pool *pool;
    const uint16_t *embed;  /* [vocab, dim] bf16 */
    mk_wmat head;           /* [vocab, dim] bf16, computed in fp32 */
    const uint16_t *norm;
    const float *hc_head_fn, *hc_head_base, *hc_head_scale;
    dsv4_layer layers[DSV4_MAX_LAYERS];
    dsv4_layer mtp;         /* mtp.0 (layer id n_layers) */
    mk_rope_table rope_plain, rope_yarn;
    void **owned;           /* aligned copies of tensors the file stores misaligned */
    int n_owned, cap_owned;
    size_t owned_bytes;
};

/* Hooks: optional, for tests and debugging. */
typedef struct {
    void *ctx;
    /* Every named intermediate tensor, e.g. "L2.attn.q" [n_tok, n_heads, head_dim]. */
    void (*dump)(void *ctx, const char *name, const float *data, int ndim, const int64_t *shape);
    /* MoE selection of a score-routed layer: idx [n_tok, k] (reference order), margin [n_tok]
     * (k-th minus (k+1)-th biased score). The hook may overwrite idx (forced decisions). */
    void (*moe)(void *ctx, int layer, int n_tok, int k, int32_t *idx, const float *margin);
    /* Indexer top-k of a CSA layer for token t of the call: sel [k] compressed-entry indices
     * (-1 = none), in score order; scores [n_scores] the bf16 index scores of the visible
     * entries (for near-tie checks). The hook may overwrite sel. */
    void (*indexer)(void *ctx, int layer, int t, int n_tok, int k, int32_t *sel, const float *scores,
                    int n_scores);
} dsv4_hooks;

/* Per-layer mutable state of one sequence's slot (the compressed entries live in blocks). */
typedef struct {
    float *win;        /* [window, head_dim] ring: position p at slot p % window */
    float *kv_state;   /* [coff*ratio, coff*head_dim] compressor pooling state */
    float *sc_state;
    float *ikv_state, *isc_state; /* the indexer compressor's (CSA) */
    int n_ckv, n_ikv;  /* compressed entries written (attention, indexer) */
} dsv4_layer_state;

/* Block layout of the paged KV (src/kv/README.md, "DeepSeek-V4-Flash"). A block covers positions
 * [DSV4_BLOCK_TOKENS * b, + DSV4_BLOCK_TOKENS) of a sequence in every layer (the MTP layer is
 * layer n_layers). Byte offsets within a block, each region 64-byte aligned:
 *   ckv[l]   fp32 [block_tokens / ratio, head_dim]: attention compressed entries (ratio > 0)
 *   ikv[l]   fp32 [block_tokens / 4, index_head_dim]: indexer keys (ratio 4)
 * and, with snapshots (main layers only), the slot state after the block's last position:
 *   win[l]   bf16 [window, head_dim]: the window ring (slot p % window; values are bf16 already)
 *   cst[l]   fp32 [2, ratio, head_dim]: ratio-4 attention compressor: kv then score of state slots
 *            [0, ratio), first head_dim channels (the only part the next entry reads)
 *   icst[l]  fp32 [2, 4, index_head_dim]: the same for the indexer's compressor
 * Ratio > 4 compressors (no overlap) need no snapshot: at a block end (a multiple of the ratio)
 * every state slot is rewritten before the next entry is pooled. */
#define DSV4_BLOCK_TOKENS 256
typedef struct {
    int block_tokens;
    int snapshots;
    size_t bytes; /* per block */
    size_t ckv[DSV4_MAX_LAYERS + 1], ikv[DSV4_MAX_LAYERS + 1];
    size_t win[DSV4_MAX_LAYERS + 1], cst[DSV4_MAX_LAYERS + 1], icst[DSV4_MAX_LAYERS + 1];
} dsv4_kv_layout;

struct dsv4_seq {
    dsv4_model *m;
    int max_len, pos;
    int mtp_pos;                    /* position of the MTP layer's own stream */
    int max_tok;                    /* tokens per call the scratch is sized for */
    dsv4_layer_state ls[DSV4_MAX_LAYERS + 1]; /* + MTP */
    float *arena;                   /* one allocation for all state above */
    size_t arena_floats;
    /* compressed entries (and snapshots): block b of the table at kv_base + blocks[b] * lay.bytes */
    dsv4_kv_layout lay;
    uint8_t *kv_base;
    const int *blocks;
    int n_blocks;
    uint8_t *own_kv;                /* private pool (dsv4_seq_create): identity block table */
    int *own_blocks;
    int batch;                      /* the current call has more than one row (informational) */
    float *scratch;                 /* per-call scratch (grown for long prefills only) */
    size_t scratch_floats;
    float *h_last;                  /* [max_tok, hc, dim] final mHC stream of the last call */
    int n_last, cap_last;
    int32_t *ids_last;
    dsv4_hooks hooks;
};

/* The DeepSeek-V4 implementation of the public mk_model / mk_seq API (src/models/model.c
 * dispatches to these; tests and tools that need the internals use them directly). */
int dsv4_model_load(const char *dir, const mk_model_options *opt, dsv4_model **out, mk_err *err);
void dsv4_model_free(dsv4_model *m);
int dsv4_model_vocab_size(const dsv4_model *m);
void dsv4_model_print_info(const dsv4_model *m, void *file);
int dsv4_seq_create(dsv4_model *m, int max_len, dsv4_seq **out, mk_err *err);
void dsv4_seq_free(dsv4_seq *s);
void dsv4_seq_reset(dsv4_seq *s);
int dsv4_seq_pos(const dsv4_seq *s);
int dsv4_seq_capacity(const dsv4_seq *s);
int dsv4_seq_vocab_size(const dsv4_seq *s);
/* n >= 1 tokens at the current position (a prompt or a chunk of it, or decodes). */
int dsv4_seq_forward(dsv4_seq *s, const int32_t *tokens, int n, float *logits, mk_err *err);
/* The same; batch is ignored (it chose between two row orders, which now compute the same bits). */
int dsv4_seq_forward_ex(dsv4_seq *s, const int32_t *tokens, int n, int batch, float *logits, mk_err *err);
/* One batched forward over np pieces: n[i] >= 1 tokens[i] on sequence seqs[i] (distinct
 * sequences of one model, each bound to a block table covering its piece) at its position;
 * logits[i] ([vocab] of piece i's last token) or NULL. The rows of all pieces go through every
 * linear and routed expert in one call; attention, compressors, indexer and window run per piece.
 * Each piece computes exactly what dsv4_seq_forward of it alone computes. Every check (tokens,
 * capacity, block tables) and allocation comes first: on failure no sequence has changed. Hooks
 * are those of the longest sequence (the first such) and see all rows. */
int dsv4_forward_batch(dsv4_seq *const *seqs, const int32_t *const *tokens, const int *n, float *const *logits,
                       int np, mk_err *err);

/* Paged sequences (the engine's slots, src/models/batch.c). dsv4_kv_layout_init fills the block
 * layout for this model; a paged sequence has no entries of its own: before each forward call the
 * caller binds the pool's data (block b at kv_base + b * lay->bytes) and the request's block
 * table, which must cover every position up to the end of the call. With lay->snapshots each
 * call writes, at every block end it reaches, the slot state into that block.
 * dsv4_seq_restore(s, pos) sets a bound sequence to position pos (a positive multiple of
 * DSV4_BLOCK_TOKENS) from the snapshot in the block table's entry pos / DSV4_BLOCK_TOKENS - 1:
 * window rings and compressor state, entry counts; the MTP layer starts afresh. */
int dsv4_kv_layout_init(const dsv4_model *m, int snapshots, dsv4_kv_layout *lay, mk_err *err);
int dsv4_seq_create_paged(dsv4_model *m, int max_len, const dsv4_kv_layout *lay, dsv4_seq **out, mk_err *err);
void dsv4_seq_bind(dsv4_seq *s, void *kv_base, const int *blocks, int n_blocks);
int dsv4_seq_restore(dsv4_seq *s, int pos, mk_err *err);

/* The DeepSeek-V4 objects behind a public model / sequence (NULL for other families). */
dsv4_model *mk_model_dsv4(mk_model *m);
dsv4_seq *mk_seq_dsv4(mk_seq *s);

int dsv4_config_parse(const char *path, dsv4_config *c, mk_err *err);
int dsv4_bind(dsv4_model *m, mk_err *err);
/* MTP forward: h_main [n, hc, dim] (the main model's final stream for the prompt), ids [n]
 * (the next tokens), logits [vocab] of the last position. Uses the MTP layer's own state. */
int dsv4_mtp_forward(dsv4_seq *s, const float *h_main, const int32_t *ids, int n, float *logits,
                     mk_err *err);

#endif
