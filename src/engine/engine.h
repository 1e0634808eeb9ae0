/* engine.h — the engine: one thread that owns the model, the KV cache, every sequence and all
 * per-request state, and advances every admitted request by one step at a time (continuous
 * batching: requests join and leave the batch at any step).
 *
 * Producers (the server's HTTP threads, tests) submit fully typed requests — token ids, sampling
 * parameters, limits; never JSON or text — and get back an mk_ereq handle. Each step the engine
 * thread asks the scheduler (engine/sched.h) for this step's work — running decodes first, then
 * prefill chunks of running and newly admitted requests under a token budget, with prefix-cache
 * hits and preemption by recompute when KV runs out — runs it as one batch
 * (models/batch.h), samples for every request whose prompt is complete, and appends events
 * (token, finish) to each request's own output queue. With asynchronous scheduling (on by default
 * where the model runs steps asynchronously: the GPU) the next step of a batch of plain greedy or
 * plainly sampled decodes is planned and queued, its tokens fed on the device, before this step's tokens are read
 * (engine.c says when steps chain); the tokens are the same. The producer reads that queue with
 * mk_ereq_next (blocking with a timeout) and detokenizes and matches stop strings itself; when it
 * sees a stop string or its client goes away, it calls mk_ereq_cancel, and the engine drops the
 * request at its next step. A request's resources (slot, sampler) are released by the engine when it
 * finishes or is cancelled; the handle itself is freed when both sides are done with it
 * (mk_ereq_release by the producer; the engine's reference drops when the request leaves).
 *
 * Exactness: a request's tokens do not depend on what else is in the batch (each piece's logits
 * are computed as if alone; sampling uses the request's own seeded RNG).
 *
 * Thread-safety: mk_engine_submit, mk_ereq_* and mk_engine_stats may be called from any thread.
 * Everything else is called by the thread that created the engine.
 */
#ifndef MK_ENGINE_ENGINE_H
#define MK_ENGINE_ENGINE_H

#include <stdint.h>

#include "engine/sampler.h"
#include "minke.h"

typedef struct mk_engine mk_engine;
typedef struct mk_ereq mk_ereq;

typedef struct {
    int max_num_seqs;  /* requests running at once (each holds one sequence slot); >= 1 */
    int max_model_len; /* tokens per sequence (prompt + output); >= 16 */
    int max_waiting;   /* requests waiting for a slot before submit refuses with MK_EBUSY; >= 0 */
    int max_num_batched_tokens;       /* tokens per step; 0 = max(2048, max_model_len) */
    int long_prefill_token_threshold; /* prefill tokens per request per step; 0 = 512 */
    size_t kv_bytes;                  /* paged KV pool; 0 = room for max_num_seqs full sequences */
    int no_prefix_caching;            /* 1 disables prefix caching */
    int async_scheduling;             /* 0: on where the model runs steps asynchronously (the GPU: the
                                       * next step is planned and queued while the device runs this
                                       * one; see engine.c), 1: on (a CPU model then runs each step at
                                       * its launch: the same tokens, each one step later), -1: off */
} mk_engine_options;

/* The model is borrowed (must outlive the engine). Creates max_num_seqs sequences up front and
 * starts the engine thread. */
int mk_engine_create(mk_model *m, const mk_engine_options *o, mk_engine **out, mk_err *err);
/* Stops accepting, cancels every waiting and running request (their producers see
 * MK_FINISH_CANCEL ... see mk_ereq_event), joins the thread and frees everything the engine owns.
 * Handles not yet released by their producers stay valid until mk_ereq_release. */
void mk_engine_free(mk_engine *e);
/* Stop admitting new requests (submit returns MK_EBUSY with "shutting down"); running ones go on. */
void mk_engine_drain(mk_engine *e);

typedef struct {
    const int32_t *prompt; /* [n_prompt] token ids (copied) */
    int n_prompt;
    mk_sampling_params sampling; /* validated at submit; arrays it points to are copied */
    const int32_t *eos_ids;      /* [n_eos] the model's end tokens (copied) */
    int n_eos;
    int max_tokens;    /* >= 1; n_prompt + max_tokens <= max_model_len */
    int priority;      /* lower runs first (vLLM's convention); 0 default */
    double timeout_s;  /* 0 = none; past it the request finishes with MK_FINISH_TIMEOUT */
    const char *cache_salt; /* NULL or a tenant key: prefix-cache blocks are shared only within it */
} mk_ereq_params;

/* Refuses with MK_EINVAL (bad parameters; message names the field), MK_ERANGE (prompt + max_tokens
 * longer than max_model_len; message says both numbers), MK_EBUSY (queue full or draining: the
 * server answers 429/503 with Retry-After). On success *out is a handle the caller must release. */
int mk_engine_submit(mk_engine *e, const mk_ereq_params *p, mk_ereq **out, mk_err *err);

typedef enum {
    MK_EV_NONE = 0,   /* mk_ereq_next timed out: nothing new */
    MK_EV_TOKEN,      /* a sampled token (with logprobs when asked). A stop token (EOS,
                         stop_token_ids) is delivered too, then FINISH with MK_EFIN_STOP: count it
                         in usage (vLLM does), do not show it as text */
    MK_EV_FINISH,     /* the last event: finish reason (and error message for MK_FINISH_ERROR) */
} mk_ev_type;

typedef enum {
    MK_EFIN_STOP = 1,    /* a stop token (EOS / stop_token_ids), not shown as text */
    MK_EFIN_LENGTH,      /* max_tokens reached */
    MK_EFIN_CANCEL,      /* cancelled by the producer or the engine shutting down */
    MK_EFIN_TIMEOUT,     /* timeout_s passed */
    MK_EFIN_ERROR,       /* the forward pass or sampler failed: msg says why */
} mk_efinish;

typedef struct {
    mk_ev_type type;
    mk_sample_out tok;   /* MK_EV_TOKEN: token id, logprob, top alternatives */
    mk_efinish finish;   /* MK_EV_FINISH */
    char msg[256];       /* MK_EV_FINISH with MK_EFIN_ERROR */
    double t;            /* CLOCK_MONOTONIC seconds when the event was produced */
} mk_ereq_event;

/* Next event of the request, waiting up to timeout_s (0 = do not wait). Returns 1 when *ev was
 * filled, 0 on timeout (ev->type = MK_EV_NONE). After MK_EV_FINISH every call returns 0. */
int mk_ereq_next(mk_ereq *r, double timeout_s, mk_ereq_event *ev);
/* Ask the engine to stop the request at its next step (idempotent, any thread). */
void mk_ereq_cancel(mk_ereq *r);
/* The producer is done with the handle (cancels the request if still active). */
void mk_ereq_release(mk_ereq *r);

/* Timestamps (CLOCK_MONOTONIC seconds; 0 when not reached yet): submitted, admitted into a slot
 * (queue time = admitted - submitted), first token. And the prompt length and tokens generated. */
typedef struct {
    double t_submit, t_admit, t_first, t_finish;
    int n_prompt, n_generated;
    int n_cached;  /* prompt tokens found in the prefix cache (usage.prompt_tokens_details.cached_tokens) */
    uint64_t seed; /* the sampler's seed (request's or drawn) */
} mk_ereq_info;
void mk_ereq_get_info(mk_ereq *r, mk_ereq_info *out);

/* Engine-wide counters for /metrics and for the leak checks in tests. */
typedef struct {
    int running;          /* requests holding a slot */
    int waiting;          /* submitted, not yet admitted */
    int slots_in_use;     /* sequence slots owned by a request (== running when consistent) */
    int live_handles;     /* mk_ereq objects not yet freed (engine or producer still holds them) */
    int max_num_seqs, max_model_len;
    uint64_t prompt_tokens_total, generation_tokens_total;
    uint64_t model_argmax_tokens; /* generated tokens the model picked itself (plain greedy steps on
                                   * the GPU: its argmax, no logits copied to the host) */
    uint64_t finished_total[MK_EFIN_ERROR + 1]; /* by mk_efinish */
    uint64_t steps;       /* engine steps run */
    uint64_t chained_steps; /* steps launched before the previous step's tokens were read (async
                             * scheduling) */
    uint64_t prefix_cache_queries, prefix_cache_hits; /* prompt tokens looked up / found */
    uint64_t preemptions;
    double kv_cache_usage;   /* fraction of KV blocks owned by requests [0, 1] */
    int kv_blocks, kv_block_tokens;
} mk_engine_stats;
void mk_engine_stats_get(mk_engine *e, mk_engine_stats *out);

double mk_now(void); /* CLOCK_MONOTONIC seconds */

#endif
