/* dsv4_cuda.h — the DeepSeek-V4-Flash forward pass on a CUDA GPU (host C over ops_cuda.h).
 *
 * A dsv4_cuda holds the weights of a loaded dsv4_model on one device, uploaded once from the
 * mmapped checkpoint exactly as stored (FP8 / FP4 bytes with their e8m0 scales, bf16, f32), plus
 * the routed experts' pointer tables for the grouped expert kernels. A dsv4_cuda_seq owns the
 * per-sequence state in device memory (window rings, compressed KV, compressor pooling state,
 * indexer keys) and the device scratch of one call; nothing is allocated per call.
 *
 * The forward mirrors src/models/dsv4.c call for call (one prefill at position 0, then one-token
 * decodes; the MTP layer on the last call's final stream) and returns fp32 logits of the last
 * position. Every discrete decision is taken on the GPU (MoE gate scores, top-k with bias, hash
 * routing through tid2eid, route scale; the indexer's scores and top-k); the hooks of dsv4.h are
 * honoured for the golden tests: with a moe / indexer hook set, the decisions are copied to the
 * host, passed to the hook (which may overwrite them: forced decisions) and copied back, and a
 * dump hook receives the mHC stream "L<l>.h" after every layer. Without hooks a call copies only
 * the token ids in and the logits out. Errors from CUDA come back as mk_status codes.
 */
#ifndef MK_MODELS_DSV4_CUDA_H
#define MK_MODELS_DSV4_CUDA_H

#include "models/dsv4.h"
#include "ops/cuda/ops_cuda.h"

typedef struct dsv4_cuda dsv4_cuda;
typedef struct dsv4_cuda_seq dsv4_cuda_seq;

/* Uploads m's weights to ctx's device. m must outlive the result (its config is read). */
int dsv4_cuda_create(mk_cuda_ctx *ctx, const dsv4_model *m, dsv4_cuda **out, mk_err *err);
void dsv4_cuda_free(dsv4_cuda *g);
/* Device bytes of the uploaded weights. */
size_t dsv4_cuda_weight_bytes(const dsv4_cuda *g);
/* Bytes of weights one batch-1 decode step reads (dense weights, n_act routed experts and the
 * shared expert per layer, the head; embedding row and small vectors included). */
size_t dsv4_cuda_decode_weight_bytes(const dsv4_cuda *g);

/* A sequence of up to max_len tokens (<= the model's max_seq_len; 0 = that), calls of up to
 * max_tok tokens (0 = max_len). */
int dsv4_cuda_seq_create(dsv4_cuda *g, int max_len, int max_tok, dsv4_cuda_seq **out, mk_err *err);
void dsv4_cuda_seq_free(dsv4_cuda_seq *s);
int dsv4_cuda_seq_reset(dsv4_cuda_seq *s, mk_err *err);
int dsv4_cuda_seq_pos(const dsv4_cuda_seq *s);
/* Hooks as in dsv4.h (copied; NULL clears them). */
void dsv4_cuda_seq_set_hooks(dsv4_cuda_seq *s, const dsv4_hooks *h);

/* Runs T >= 1 tokens at the current position (a prompt, a chunk of one at any position, or a
 * decode); logits [vocab] (host) of the last position, or NULL to skip the head. */
int dsv4_cuda_forward(dsv4_cuda_seq *s, const int32_t *tokens, int T, float *logits, mk_err *err);
/* The same with the last position's greedy token (dsv4_cuda_forward_batch_am's rule) instead of its
 * logits: an int crosses the bus (the engine's plain greedy steps). */
int dsv4_cuda_forward_argmax(dsv4_cuda_seq *s, const int32_t *tokens, int T, int32_t *argmax, mk_err *err);

/* ---- the engine's paged KV on the device (src/models/batch.c) ----
 * A dsv4_cuda_pool is the device memory of n_blocks blocks laid out as dsv4_kv_layout (with
 * snapshots: compressed entries of 256 positions of every layer plus the slot state at the
 * block's end), the GPU twin of the engine's host pool (whose accounting, mk_kv_pool, stays on
 * the host). A dsv4_cuda_work is the device scratch of one batched call of up to max_rows rows
 * and max_pieces pieces over sequences of up to max_len tokens. A paged sequence is one slot:
 * its window rings and compressor state on the device; its entries in the pool, reached
 * through the block table bound before each call (host ints, copied to the device per call). */
typedef struct dsv4_cuda_pool dsv4_cuda_pool;
typedef struct dsv4_cuda_work dsv4_cuda_work;
int dsv4_cuda_pool_create(dsv4_cuda *g, int n_blocks, dsv4_cuda_pool **out, mk_err *err);
void dsv4_cuda_pool_free(dsv4_cuda_pool *p);
size_t dsv4_cuda_pool_block_bytes(const dsv4_cuda_pool *p);
int dsv4_cuda_work_create(dsv4_cuda *g, int max_rows, int max_pieces, int max_len, dsv4_cuda_work **out,
                          mk_err *err);
void dsv4_cuda_work_free(dsv4_cuda_work *w);
size_t dsv4_cuda_work_bytes(const dsv4_cuda_work *w);
int dsv4_cuda_seq_create_paged(dsv4_cuda *g, int max_len, dsv4_cuda_pool *pool, dsv4_cuda_seq **out, mk_err *err);
size_t dsv4_cuda_seq_bytes(const dsv4_cuda_seq *s);
/* Binds the request's block table (copied; it must cover every position up to the end of the
 * next call). */
int dsv4_cuda_seq_bind(dsv4_cuda_seq *s, const int *blocks, int n_blocks, mk_err *err);
/* Sets a bound paged sequence to position pos (a positive multiple of DSV4_BLOCK_TOKENS) from
 * the snapshot in its block table's entry pos / DSV4_BLOCK_TOKENS - 1 (as dsv4_seq_restore). */
int dsv4_cuda_seq_restore(dsv4_cuda_seq *s, int pos, mk_err *err);
/* One batched call over np pieces on distinct sequences of one KV pool (as dsv4_forward_batch):
 * rows of every piece through each linear and routed expert together; the attention rows, sparse
 * attention, windows, compressor states and indexer of all pieces in one launch each (per-piece
 * descriptors), a compressor's completed groups per piece. A piece's results do not depend on the
 * other pieces (every kernel computes a row the same way whatever the row count; see the GEMV
 * note in linear.cu). logits[i] [vocab] (host) or NULL: rows that follow each other in host memory
 * are copied at once (page-locked memory, e.g. mk_kvcache_host_floats, makes that fast). Every
 * check comes first: when one fails, no sequence has changed. A failure after
 * the checks (a CUDA error) leaves the pieces' sequences in an undefined state: further calls on
 * them fail until dsv4_cuda_seq_reset or dsv4_cuda_seq_restore. */
int dsv4_cuda_forward_batch(dsv4_cuda_work *w, dsv4_cuda_seq *const *seqs, const int32_t *const *tokens,
                            const int *n, float *const *logits, int np, mk_err *err);
/* The same, where a piece with logits[i] and argmax[i] (argmax may be NULL) gets, instead of its
 * logits row, the row's argmax in *argmax[i], computed on the GPU with the sampler's greedy rule
 * (NaN as -inf, +inf as FLT_MAX, the lowest id on ties; -1 when every logit is -inf or NaN): an int
 * crosses the bus instead of vocab floats. logits[i] is then left untouched. With draws (may be
 * NULL) and draws[i] (inv_t > 0), that piece gets instead the token of the sampler's plain draw
 * (src/num/sample_math.h; mk_cuda_sample_rows: the token the host sampler draws from that row).
 * A draw with adjustments (n_adj > 0: mk_sampler_model_step's, greedy with inv_t 0 or drawn) has
 * them applied to that row on the GPU first (mk_cuda_adjust_rows: bias, masked stop tokens,
 * penalties), then its argmax or its draw; at most MK_SAMPLE_ADJ_MAX per draw. Rows of other
 * pieces, and any logits copied to the host, are never adjusted. */
int dsv4_cuda_forward_batch_am(dsv4_cuda_work *w, dsv4_cuda_seq *const *seqs, const int32_t *const *tokens,
                               const int *n, float *const *logits, int32_t *const *argmax,
                               const mk_sample_draw *const *draws, int np, mk_err *err);
/* The same call queued without waiting for it where it can be (a decode step replayed as a graph;
 * other calls run to the end here): dsv4_cuda_batch_wait then waits for it and writes its argmax
 * ints (the logits rows are copied by the stream meanwhile: they too are there after the wait).
 * The sequences' positions advance at the launch. One launched call may be left unwaited while
 * the next one is launched (the host plans and queues step k + 1 while the GPU runs step k);
 * waits go in launch order. feed (NULL, or [np]): feed[i] != 0 makes piece i's single token the
 * one the previous call picked for the same sequence (its argmax or draw, read on the device by
 * the embedding, mk_cuda_embed_hc_fed: tokens[i] is not read); that call must have had an argmax for it. A token the device picked as
 * -1 (every logit NaN) is read as token 0 by the embedding. */
int dsv4_cuda_batch_launch(dsv4_cuda_work *w, dsv4_cuda_seq *const *seqs, const int32_t *const *tokens,
                           const int *n, float *const *logits, int32_t *const *argmax,
                           const mk_sample_draw *const *draws, const char *feed, int np, mk_err *err);
/* Waits for the oldest launched call and delivers its results. A failure marks its sequences
 * broken (as a failed forward call does). */
int dsv4_cuda_batch_wait(dsv4_cuda_work *w, mk_err *err);
/* The MTP layer on the final stream of the last forward call (which must have had n tokens):
 * ids [n] the next tokens; logits [vocab] of the last position. */
int dsv4_cuda_mtp_forward(dsv4_cuda_seq *s, const int32_t *ids, int n, float *logits, mk_err *err);

/* Benchmarks: what a CUDA graph would save on one decode step of a standalone sequence s (its next
 * position, token tok; a position that completes no compressed group and no KV block): the step's
 * kernels launched reps times back to back (ms_stream per step), then captured into one graph
 * (nodes, ms_capture) replayed reps times (ms_graph per step), and the argmax of each (the same
 * step: they must agree). Leaves s broken (reset or restore it). */
typedef struct {
    double ms_stream, ms_graph, ms_capture;
    size_t nodes;
    int32_t argmax_stream, argmax_graph;
} dsv4_cuda_graph_stats;
int dsv4_cuda_graph_probe(dsv4_cuda_seq *s, int32_t tok, int reps, dsv4_cuda_graph_stats *st, mk_err *err);

/* Decode steps as CUDA graphs (on unless MINKE_CUDA_GRAPHS=0): a call in which every piece has
 * one token, none or all of them want logits, no hook is set and no piece ends a KV block of a
 * pool with snapshots is captured the first time its shape (piece count, the indexer's score
 * columns, the head's mode, the pool) is seen and replayed afterwards; its per-step inputs (ids,
 * positions, block tables, attention pieces) are uploaded into the work's device buffers before
 * the launch, and every launch of such a step reads its positions there (the compressors decide on
 * the device which pieces complete an entry). The same bits as the launches it replaces. A capture
 * that fails (or records a launch the host decided from the positions) turns graphs off for the
 * work; the step then runs as launches. Counts of the work's calls since its creation: */
typedef struct {
    long captured, replayed, eager; /* eager: calls not eligible or with graphs off */
    int off;                        /* graphs turned off for this work (tuning, or a failed capture) */
} dsv4_cuda_graph_counts;
void dsv4_cuda_work_graph_counts(const dsv4_cuda_work *w, dsv4_cuda_graph_counts *out);
/* The work of a standalone sequence (NULL for a paged one). */
dsv4_cuda_work *dsv4_cuda_seq_work(dsv4_cuda_seq *s);

/* With MINKE_CUDA_PROFILE=1 in the environment every forward call synchronizes at phase marks
 * and accumulates the time per phase (for benchmarks; it slows calls down). Prints the table
 * accumulated since the last report (markdown) to file (a FILE *) and clears it. */
void dsv4_cuda_profile_report(void *file, const char *title);

#endif
