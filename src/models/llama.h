/* llama.h — the Llama family from GGUF (Llama, SmolLM2, Qwen2-style dense models): the model's
 * shape from GGUF metadata, its tensors bound from the mmapped file, and a forward pass built
 * from the shared blocks: RMSNorm, RoPE (the variant the architecture implies: adjacent pairs for
 * llama, halves for qwen2), grouped-query attention with a per-sequence KV cache, SwiGLU, optional
 * q/k/v biases, tied embeddings. Every op follows llama.cpp's CPU backend rounding for rounding
 * (num/ggml_exact.h, num/ggml_quant.h), so on the same GGUF the logits are bit-identical to
 * llama.cpp's (flash attention off, f16 KV cache) and greedy outputs are the same tokens.
 *
 * A sequence can take any number of tokens per call at any position (prefill, chunked prefill,
 * decode): attention is causal over the cache.
 */
#ifndef MK_MODELS_LLAMA_H
#define MK_MODELS_LLAMA_H

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

#endif
