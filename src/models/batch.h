/* batch.h — one engine step over many sequences, and the KV cache those sequences live in.
 *
 * The engine's scheduler (engine/sched.h) hands out pieces of work: tokens[start, start + n) of
 * some request, over that request's block table in a paged pool (kv/kv.h). mk_model_forward_batch
 * runs all pieces of a step and fills the logits of the pieces that asked for them. A request's
 * logits must not depend on which other requests share the step (batch invariance).
 *
 * mk_kvcache is a model's cache: the block pool (bytes per block from the family's layout) plus
 * per-slot state that does not live in blocks (one slot per running request). Families differ in
 * what they support, reported by mk_kvcache_caps:
 *   llama        paged KV (K and V^T rows of every layer for the block's 32 positions, layout in
 *                llama.h and src/kv/README.md); prefix sharing with copy-on-write of partial
 *                hits (partial_hits); chunked prefill at any position. One step runs every piece in one forward
 *                call (rows concatenated: each weight matrix read once per step). A piece's
 *                results are those of its request run alone through llama.cpp (the prompt as one
 *                batch, then one-token decodes) — which is why an item carries n_prompt.
 *   deepseek_v4  paged hybrid KV (dsv4_kv_layout in dsv4.h, src/kv/README.md): one logical block
 *                = 256 token positions in every group. Block b of a request holds the compressed
 *                entries of positions [256b, 256b + 256) of every layer (CSA entries + indexer
 *                keys, HCA entries) and a snapshot of the slot state after position 256b + 255
 *                (every layer's window ring, the ratio-4 compressors' pooling state). Each slot
 *                (running request) keeps its live window rings and compressor state. Prefix
 *                hits restore the slot from the snapshot of the last hit block, so they are
 *                whole blocks only (partial_hits = 0, replay = 0); chunked prefill at any
 *                position. One step runs every piece in one batched forward (rows concatenated
 *                through each linear and routed expert, so each weight matrix is read once per
 *                step; attention and compressors per piece, see dsv4.h), and a piece's results
 *                are those of its request run alone through mk_seq, bit for bit.
 *                On the GPU (a model loaded with MK_DEVICE_CUDA, model.h) the same, with the
 *                blocks in device memory (dsv4_cuda_pool, the layout of dsv4_kv_layout): the
 *                host pool (mk_kv_pool) keeps only the accounting (blocks, references, prefix
 *                index; no host data), each slot is a paged dsv4_cuda_seq, and a step is one
 *                dsv4_cuda_forward_batch over a device scratch (dsv4_cuda_work) sized once for
 *                max_rows rows and n_slots pieces. The same caps; a piece's results do not
 *                depend on the other pieces of its step (see dsv4_cuda.h).
 */
#ifndef MK_MODELS_BATCH_H
#define MK_MODELS_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "kv/kv.h"
#include "minke.h"
#include "num/sample_math.h"

typedef struct mk_kvcache mk_kvcache;

typedef struct {
    int block_tokens;    /* tokens per logical block */
    int n_blocks;        /* blocks in the pool */
    int n_slots;         /* running requests at most */
    int max_model_len;
    int prefix_caching;  /* blocks can be shared between requests */
    int partial_hits;    /* a partially matching block can be copied (copy-on-write) */
    int chunked_prefill; /* a prompt can run in several pieces, at any position */
    int replay;          /* tokens to recompute before a prefix-hit boundary */
    int picks;           /* the model picks tokens where the logits are (mk_batch_item.argmax and .draw:
                          * the GPU); 0: every piece's logits go to the host */
    int async;           /* mk_model_batch_launch returns before the step ran (the GPU): the host can
                          * plan and queue the next step meanwhile */
    size_t block_bytes;  /* bytes of one block (device memory on the GPU) */
    size_t bytes;        /* memory of the pool and the slots (and the GPU's step scratch) */
} mk_kvcache_caps;

typedef struct {
    int n_slots;       /* running requests at most, >= 1 */
    int max_model_len; /* tokens per sequence, >= 1 (at most the model's context) */
    size_t kv_bytes;   /* memory for the paged pool; 0 = the default: room for n_slots full-length
                        * sequences, on the CPU capped at 512 MiB but never less than one
                        * full-length sequence (on the GPU not capped) */
    int max_rows;      /* tokens one step runs at most (the engine's max_num_batched_tokens): sizes
                        * the GPU's step scratch; 0 = max(2048, max_model_len) */
} mk_kvcache_options;

/* Fails with a message naming the numbers when not even one full-length sequence fits in
 * kv_bytes, or when the GPU's memory cannot hold the pool, the scratch or the slots. */
int mk_kvcache_create(mk_model *m, const mk_kvcache_options *o, mk_kvcache **out, mk_err *err);
void mk_kvcache_free(mk_kvcache *c);
void mk_kvcache_caps_get(const mk_kvcache *c, mk_kvcache_caps *caps);
mk_kv_pool *mk_kvcache_pool(mk_kvcache *c);
/* Host buffers for the logits of the steps: page-locked when the model runs on the GPU (one copy
 * of a step's logits then runs at the bus's speed), else plain. Free with mk_kvcache_host_free on
 * the same cache (before mk_kvcache_free). NULL when out of memory. */
float *mk_kvcache_host_floats(mk_kvcache *c, size_t n);
void mk_kvcache_host_free(mk_kvcache *c, float *p);

typedef struct {
    int slot;                /* the request's slot in [0, n_slots) */
    int start;               /* position of tokens[0] */
    int fresh;               /* the request's first piece in this slot (admission, or after a
                              * preemption): deepseek_v4 starts the slot afresh at start 0, or
                              * restores it from the snapshot in block start / 256 - 1 */
    const int32_t *tokens;   /* [n] */
    int n_prompt;            /* the request's prompt length: positions below it are prompt */
    int n;
    const int *blocks;       /* the request's block table, covering [0, start + n) */
    int n_blocks;
    int copy_from, copy_to;  /* >= 0: copy block copy_from into blocks[copy_to] first (prefix hit) */
    float *logits;           /* [vocab] logits of the last token, or NULL */
    int32_t *argmax;         /* with logits, may be non-NULL: the model may then write here the argmax
                              * of those logits instead of filling them (NaN as -inf, +inf as FLT_MAX,
                              * the lowest id on ties, -1 when every logit is -inf or NaN: the
                              * sampler's greedy rule) and set argmax_done. The GPU model does (no
                              * copy of the logits to the host); the CPU models fill logits. */
    const mk_sample_draw *draw; /* with argmax, may be non-NULL: the model may instead draw the token
                              * with it (the sampler's plain draw, mk_sampler_plain_draw: the token
                              * the host sampler would draw from those logits, -1 when every logit is
                              * -inf or NaN) into *argmax and set argmax_done; with adjusted tokens
                              * (mk_sampler_model_step: draw->n_adj, draw->adj) it adjusts those
                              * logits first, and inv_t 0 asks for the argmax of the adjusted logits.
                              * The GPU model does. */
    int feed;                /* 1 (mk_model_batch_launch only): tokens is not read; the piece's one token is the
                              * one the model picked (argmax_done) for this slot in the step launched just
                              * before, which must have had this slot with an argmax */
    int argmax_done;         /* out: 1 when *argmax was written and logits were not */
    int status;              /* out: MK_OK, or why this piece failed (the others still ran) */
} mk_batch_item;

/* Runs every piece. Returns MK_OK when all succeeded; otherwise the status of the last failure
 * (message in err) with each piece's own status in items[i].status. */
int mk_model_forward_batch(mk_model *m, mk_kvcache *c, mk_batch_item *items, int n, mk_err *err);

/* The same step in two halves, for asynchronous scheduling: launch queues it (caps.async: the GPU
 * runs it while launch returns; otherwise it runs now), wait delivers its results (statuses,
 * argmax ints, logits rows). The host may launch the next step before waiting for this one (at
 * most one step left unwaited at a launch); waits go in launch order, each with the items array
 * of its launch, which must stay untouched until then. Unlike mk_model_forward_batch, a step
 * launched here has its plain greedy pieces (argmax without a draw) picked by the model on the
 * CPU too (the argmax of the logits row, the sampler's greedy rule; the row is filled as well),
 * so that the next step can feed them (mk_batch_item.feed). A step whose launch fails has every
 * piece's status set; its wait returns that status. */
int mk_model_batch_launch(mk_model *m, mk_kvcache *c, mk_batch_item *items, int n, mk_err *err);
int mk_model_batch_wait(mk_model *m, mk_kvcache *c, mk_batch_item *items, int n, mk_err *err);

#endif
