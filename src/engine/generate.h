/* generate.h — one request's generation loop over a sequence: prefill the prompt, then sample,
 * detokenize, match stop strings and decode one token at a time until a stop token, a stop string,
 * max_tokens or a cancel flag ends it. Text is handed to a callback as soon as it is complete
 * UTF-8 and cannot be the start of a stop string. This is the single-request path used by
 * `minke generate` and `minke chat`; the batching engine (later) drives the same pieces per step.
 */
#ifndef MK_ENGINE_GENERATE_H
#define MK_ENGINE_GENERATE_H

#include <signal.h>

#include "engine/sampler.h"
#include "minke.h"
#include "text/tokenizer.h"

typedef enum { MK_FINISH_NONE = 0, MK_FINISH_STOP, MK_FINISH_LENGTH, MK_FINISH_CANCEL } mk_finish;

typedef struct {
    const mk_sampling_params *sampling;
    const int32_t *eos_ids; /* end-of-sequence ids (generation_config / tokenizer) */
    int n_eos;
    const char *const *stop; /* stop strings */
    int n_stop;
    int max_tokens;
    int skip_special;        /* detokenize without special tokens' text */
    /* called with each piece of text to show (may be NULL) */
    void (*on_text)(void *ctx, const char *text, size_t len);
    /* called with each sampled token and its logprobs (may be NULL) */
    void (*on_token)(void *ctx, const mk_sample_out *tok);
    void *ctx;
    volatile sig_atomic_t *cancel; /* set to nonzero to stop at the next token (may be NULL) */
} mk_gen_request;

typedef struct {
    int n_prompt, n_generated;
    double prefill_s, decode_s; /* wall time of the prefill, and of all decode steps */
    mk_finish finish;
    int32_t *tokens;            /* generated ids (malloc'd; caller frees) */
} mk_gen_result;

/* Runs the request on sequence s (reset first). Returns 0 or a negative mk_status. */
int mk_generate(mk_seq *s, const mk_tok *tok, const int32_t *prompt, int n_prompt,
                const mk_gen_request *req, mk_gen_result *res, mk_err *err);

#endif
