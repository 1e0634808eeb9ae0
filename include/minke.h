/* minke.h — the public C API of minke.
 *
 * minke loads a DeepSeek-V4-family checkpoint exactly as DeepSeek ships it (Hugging Face safetensors,
 * FP8/FP4 weights, mmapped) and computes what DeepSeek's reference inference/model.py computes.
 *
 * Objects and lifetimes:
 *   mk_model  immutable after mk_model_load: config, mmapped weights, RoPE tables. Shareable
 *             between threads for reading.
 *   mk_seq    one sequence's mutable state (window KV ring, compressed KV, compressor states,
 *             per-call scratch). Owned by one thread at a time (later: by the engine).
 *
 * Errors: every function returns MK_OK (0) or a negative mk_status and, when given an mk_err, a
 * message with context (file, tensor, field, expected vs found). Nothing reachable from a file or
 * a request aborts the process.
 *
 * Usage:
 *   mk_err err; mk_model *m; mk_seq *s;
 *   if (mk_model_load("ckpt/", NULL, &m, &err)) { fprintf(stderr, "%s\n", err.msg); ... }
 *   mk_seq_create(m, 4096, &s, &err);
 *   mk_seq_forward(s, prompt, n_prompt, logits, &err);     // prefill at position 0
 *   mk_seq_forward(s, &next, 1, logits, &err);              // one-token decodes
 *   mk_seq_free(s); mk_model_free(m);
 *
 * Thread-safety: mk_model is read-only after load; an mk_seq must not be used by two threads at
 * once. The CPU backend runs each call on its own thread pool (mk_model_options.n_threads). A
 * model on the GPU (MK_DEVICE_CUDA) queues every call of every sequence on its device's one
 * stream: use its sequences from one thread at a time.
 */
#ifndef MINKE_H
#define MINKE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MK_VERSION "0.1.0"

typedef enum {
    MK_OK = 0,
    MK_EINVAL = -1,    /* bad argument or request */
    MK_EIO = -2,       /* open/read/mmap failed */
    MK_ENOMEM = -3,    /* allocation failed */
    MK_EFORMAT = -4,   /* malformed file: header, dtype, shape, missing/extra tensor */
    MK_ENOTSUP = -5,   /* valid but unsupported (model type, feature) */
    MK_ERANGE = -6,    /* value out of range (position beyond max_seq_len, token id) */
    MK_EINTERNAL = -7, /* a bug: an invariant did not hold */
    MK_EBUSY = -8,     /* temporarily refused: queue full or shutting down (retry later) */
} mk_status;

/* Error context: a human message, filled by the function that failed. */
typedef struct {
    int status;
    char msg[1024];
} mk_err;

const char *mk_status_str(int status);

typedef struct mk_model mk_model;
typedef struct mk_seq mk_seq;

/* Where the forward pass runs. The CUDA backend (a build with `make cuda`: build-cuda/minke)
 * runs DeepSeek-V4 checkpoints only: their weights are loaded (mmapped) as on the CPU, then
 * uploaded once to the device. */
enum { MK_DEVICE_CPU = 0, MK_DEVICE_CUDA = 1 };

/* Zero-initialised options mean: all cores, 4096 tokens, on the CPU. */
typedef struct {
    int n_threads;   /* CPU threads for the forward pass; 0 = all online cores */
    int max_seq_len; /* default capacity of sequences; 0 = 4096 */
    int device;      /* MK_DEVICE_CPU (default) or MK_DEVICE_CUDA */
    int cuda_device; /* with MK_DEVICE_CUDA: the CUDA device index (0 = the first) */
} mk_model_options;

/* Load a model: a DeepSeek-V4 checkpoint directory (config.json + model.safetensors[.index.json])
 * or a Llama-family .gguf file. */
int mk_model_load(const char *path, const mk_model_options *opt, mk_model **out, mk_err *err);
/* "deepseek_v4" or "llama". */
const char *mk_model_family(const mk_model *m);
/* MK_DEVICE_CPU or MK_DEVICE_CUDA, and a short description for logs: "cpu" or
 * "cuda:0 (NVIDIA H200)". */
int mk_model_device(const mk_model *m);
const char *mk_model_device_name(const mk_model *m);
void mk_model_free(mk_model *m);
int mk_model_vocab_size(const mk_model *m);
/* Print architecture, parameter counts by dtype and memory needs. */
void mk_model_print_info(const mk_model *m, void *file /* FILE* */);

/* A sequence with room for max_len tokens (0 = the model's default). Starts from clean state. */
int mk_seq_create(mk_model *m, int max_len, mk_seq **out, mk_err *err);
void mk_seq_free(mk_seq *s);
/* Reset to clean state (a fresh sequence). */
void mk_seq_reset(mk_seq *s);
int mk_seq_pos(const mk_seq *s);
/* Tokens the sequence can hold, and the model's vocabulary size. */
int mk_seq_capacity(const mk_seq *s);
int mk_seq_vocab_size(const mk_seq *s);
/* Run n tokens at the sequence's current position (first call: the prefill; later: n == 1).
 * logits: f32 [vocab] for the last token, or NULL. */
int mk_seq_forward(mk_seq *s, const int32_t *tokens, int n, float *logits, mk_err *err);

#ifdef __cplusplus
}
#endif
#endif
