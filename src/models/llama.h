/* llama.h — the Llama family from GGUF (Llama, SmolLM2, Qwen2-style dense models): the model's
 * shape from GGUF metadata, its tensors bound from the mmapped file, and a forward pass built
 * from the shared blocks: RMSNorm, RoPE (the variant the architecture implies: adjacent pairs for
 * llama, halves for qwen2), grouped-query attention over a paged f16 KV cache, SwiGLU, optional
 * q/k/v biases, tied embeddings. Every op follows llama.cpp's CPU backend rounding for rounding
 * (num/ggml_exact.h, num/ggml_quant.h), so on the same GGUF the logits are bit-identical to
 * llama.cpp's (flash attention off, f16 KV cache) and greedy outputs are the same tokens.
 *
 * One forward implementation serves two users: the engine's batched step (mk_model_forward_batch,
 * models/batch.c), which runs pieces of many sequences over a shared paged KV pool, and llama_seq
 * (`minke generate`, `minke logits`, the llama.cpp comparison), a single sequence over a private
 * pool of its own. A step concatenates the rows of every piece, so each weight matrix is read once
 * per step (up to 512 rows; a bigger step runs in several calls of 512 rows); attention runs per
 * row over the row's sequence's block table.
 *
 * Paged KV (block of bt positions, bt a multiple of 16, at most LLAMA_MAX_BLOCK_TOKENS; f16):
 *   per layer l, at l * 2 * bt * kvd values into the block:
 *     K    [bt][kvd]   row = the block's position, as llama.cpp's K cache row
 *     V^T  [kvd][bt]   row = one value dimension over the block's positions (llama.cpp stores V
 *                      transposed without flash attention; here each block holds its piece)
 *   kvd = n_kv_heads * head_dim. A block's V^T entries past the positions written are zero (set
 *   when its first position is written) or a copied block's finite values: the padded positions
 *   of KQV multiply them by zero probabilities.
 *
 * Exactness rule (why: llama.cpp computes attention in a different summation order for a call of
 * one token (ggml_vec_dot_f16) than for a call of 2+ (tinyBLAS); see num/ggml_exact.h): each piece
 * names the span [ub_lo, ub_hi) of positions that llama.cpp would have run as one batch, split
 * into ubatches of 512 from ub_lo. A row at a position in that span takes the tinyBLAS order if its
 * ubatch holds 2+ tokens; every other row (single-token ubatches, positions outside the span) the
 * vec_dot order. The engine passes [0, n_prompt) (the prompt as one llama.cpp batch, generated
 * tokens as one-token decodes), whatever the chunking, the batch or a preemption did; llama_seq
 * passes the call's own span, so a call behaves as the same llama.cpp call. A row's result
 * depends only on its order, position and the KV before it: matmul rows are independent of how
 * many rows a call has. (KV reused from the prefix cache carries the order it was computed in:
 * src/kv/README.md says when that differs from a cold run.)
 */
#ifndef MK_MODELS_LLAMA_H
#define MK_MODELS_LLAMA_H

#include <stddef.h>
#include <stdint.h>

#include "kv/kv.h"
#include "minke.h"
#include "num/ggml_exact.h"

typedef struct llama_model llama_model;
typedef struct llama_seq llama_seq;
struct mk_gguf;

int llama_model_load(const char *path, const mk_model_options *opt, llama_model **out, mk_err *err);
void llama_model_free(llama_model *m);
int llama_model_vocab_size(const llama_model *m);
void llama_model_print_info(const llama_model *m, void *file);
/* The GGUF the model was loaded from (tokenizer and chat template live in its metadata). */
struct mk_gguf *llama_model_gguf(const llama_model *m);
/* Context length from the metadata. */
int llama_model_context(const llama_model *m);
/* Whose float order the forward pass follows: by default llama.cpp built natively for this CPU
 * (mk_gx_isa_native()); tests set another level to compare with a llama.cpp built for it. Not
 * to be changed while a sequence of the model is running. */
mk_gx_isa llama_model_isa(const llama_model *m);
void llama_model_set_isa(llama_model *m, mk_gx_isa isa);

/* ---- paged forward (the engine's batched step) ---- */

#define LLAMA_MAX_BLOCK_TOKENS 64

/* Bytes of one KV block of bt positions (layout above). */
size_t llama_block_bytes(const llama_model *m, int bt);

/* One piece of a step: tokens[0, n) at positions [pos, pos + n) of a sequence whose block table
 * (block ids in the pool) covers [0, pos + n); positions [0, pos) are already in the blocks. */
typedef struct {
    const int32_t *tokens;
    int pos, n;
    const int *blocks;
    int n_blocks;
    int ub_lo, ub_hi; /* positions llama.cpp would run as one batch (exactness rule above) */
    float *logits;    /* [vocab] logits of the last token, or NULL */
} llama_piece;

/* Scratch of forward calls (row buffers, per-thread attention buffers), for positions below
 * max_len. Grows to the largest call seen (at most 512 rows), never while decoding. One forward
 * call at a time per work. */
typedef struct llama_work llama_work;
int llama_work_create(llama_model *m, int max_len, llama_work **out, mk_err *err);
void llama_work_free(llama_work *w);
size_t llama_work_bytes(const llama_work *w);

/* MK_OK when the piece can run in `pool` with `w` (sizes, block table, token ids), else why. */
int llama_piece_check(const llama_model *m, const llama_work *w, mk_kv_pool *pool, const llama_piece *p, mk_err *err);
/* Runs the pieces (each checked first; any failure fails the call): writes their K and V into
 * their blocks, fills the logits asked for. Pieces must belong to different sequences. */
int llama_forward(llama_model *m, llama_work *w, mk_kv_pool *pool, const llama_piece *pieces, int n, mk_err *err);

/* ---- one sequence (private pool) ---- */

int llama_seq_create(llama_model *m, int max_len, llama_seq **out, mk_err *err);
void llama_seq_free(llama_seq *s);
void llama_seq_reset(llama_seq *s);
int llama_seq_pos(const llama_seq *s);
int llama_seq_capacity(const llama_seq *s);
/* Runs n tokens at the sequence's position; logits (if not NULL) of the last one. The tokens run
 * as llama.cpp runs a batch: in ubatches of up to 512 (its default n_ubatch). A ubatch of one
 * token computes attention as a llama.cpp decode does, one of 2+ as a llama.cpp ubatch of that
 * size: for identical results, give the tokens in the calls llama.cpp is given them (a prompt in
 * one call, then one call per token). */
int llama_seq_forward(llama_seq *s, const int32_t *tokens, int n, float *logits, mk_err *err);

/* Observability: fn is called during a forward call with each named intermediate tensor,
 * rows x cols floats, named as in llama.cpp's graph ("attn_norm-3", "Qcur-3" (after RoPE),
 * "kqv_out-3", "ffn_out-3", "l_out-3", "result_output", ...). In the last layer, tensors from
 * "attn_out" on have only the last token's row. NULL turns it off. */
typedef void (*llama_dump_fn)(void *ctx, const char *name, const float *data, int rows, int cols);
void llama_seq_set_dump(llama_seq *s, llama_dump_fn fn, void *ctx);

/* The Llama-family model behind an mk_model (NULL for another family); defined in model.c. */
llama_model *mk_model_llama(mk_model *m);

#endif
