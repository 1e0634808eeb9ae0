/* llama.h — the Llama family from GGUF (Llama, SmolLM2, Qwen2-style dense models): the model's
 * shape from GGUF metadata, its tensors bound from the mmapped file, and a forward pass built
 * from the shared blocks: RMSNorm, RoPE (the variant the architecture implies: adjacent pairs for
 * llama, halves for qwen2), grouped-query attention with a per-sequence KV cache, SwiGLU, optional
 * q/k/v biases, tied embeddings. Matmuls run on the ggml block formats (src/num/ggml_quant.h)
 * with activations quantized the way llama.cpp does, so logits can be compared with it.
 *
 * A sequence can take any number of tokens per call at any position (prefill, chunked prefill,
 * decode): attention is causal over the cache.
 */
#ifndef MK_MODELS_LLAMA_H
#define MK_MODELS_LLAMA_H

#include "minke.h"

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

int llama_seq_create(llama_model *m, int max_len, llama_seq **out, mk_err *err);
void llama_seq_free(llama_seq *s);
void llama_seq_reset(llama_seq *s);
int llama_seq_pos(const llama_seq *s);
int llama_seq_capacity(const llama_seq *s);
int llama_seq_forward(llama_seq *s, const int32_t *tokens, int n, float *logits, mk_err *err);

#endif
