/* sampler.h — per-request token sampling: logits -> token, with vLLM's semantics.
 *
 * One mk_sampler per request, created when the request is admitted and freed when it ends. It owns
 * the request's sampling parameters, its RNG position, the token counts the penalties need and all
 * scratch of one sampling step, sized from the vocabulary at create: mk_sampler_sample never
 * allocates. Not thread-safe per object; different samplers are independent.
 *
 * One step, in this order (vLLM V1's order, which users compare against):
 *   0. logprobs (when asked) are taken from the raw logits, before anything below: log_softmax of the
 *      model's output ("raw_logprobs", vLLM's default logprobs_mode). NaN logits count as -inf.
 *   1. logit_bias is added (vLLM applies it before the penalties, so a biased positive logit is then
 *      divided by the repetition penalty).
 *   2. min_tokens: while fewer than min_tokens tokens were generated, every stop token (all EOS ids
 *      and stop_token_ids) is set to -inf. As in vLLM this holds even with ignore_eos.
 *   3. penalties: repetition_penalty r for every token seen in the prompt or the output (logit > 0:
 *      divided by r, else multiplied by r); then frequency_penalty * count and presence_penalty *
 *      (count > 0) are subtracted, counting output tokens only.
 *   4. temperature < 1e-5: greedy, the argmax of the processed logits (lowest id on ties); the RNG
 *      is not used. Otherwise the logits are divided by the temperature (vLLM raises 0 < T < 0.01 to
 *      0.01 for numerical safety; so do we).
 *   5. min_p: tokens with p < min_p * p_max are removed (p = softmax of the tempered logits). The
 *      weights exp((l - max) / T) and their integer masses floor(w * 2^31), which steps 7 and 8
 *      add, are defined in sample_math.h, so that a draw on the GPU gives the same token; a
 *      token whose weight is below 2^-31 of the top token's is removed with them.
 *   6. top_k: the k highest logits survive; a token tied with the k-th is kept too (vLLM masks
 *      logits < the k-th value).
 *   7. top_p: over the survivors renormalized, in order of logit descending (id ascending on ties),
 *      a token is kept when the probability mass strictly before it is < top_p: the smallest prefix
 *      whose mass reaches top_p, never empty.
 *   8. One uniform u in [0,1) from Philox4x32-10 keyed by the seed, counter = step (the number of
 *      tokens accepted so far); the token is found by inverse CDF over the kept tokens' masses in
 *      id order (exact integers: the first id whose cumulative mass exceeds floor(u * total)).
 * Order of the filters: min_p, then top_k, then top_p (vLLM V1 applies min_p as a logits processor
 * after temperature and before its top-k/top-p sampler).
 *
 * Seeds: with has_seed the sequence of tokens is a function of (seed, prompt, logits) only. Without,
 * the sampler takes 64 bits from getrandom(2) at create (falling back to the clock mixed with a
 * process-wide counter); mk_sampler_seed reports the seed in use so a run can be replayed.
 *
 * Cost per step on one core at vocab 129280 (-O2, x86-64-v2; bench/bench_sampler.c, 2026-12-05):
 * greedy 0.04 ms, plain temperature 0.27 ms, top_p 0.95 0.44 ms, top_k 50 + top_p 0.38 ms, min_p
 * 0.28 ms (the passes over the vocabulary four floats at a time with SSE4.1, the weights' exp
 * included, sample_math.h; top_k and top_p settle every token by its weight's bin, an eighth of an
 * octave, and sort only the bin where the count or the mass runs out, with a branchless partition).
 * Before the bins, same run: top_p 1.18-1.20 ms, top_k 50 + top_p 0.98-1.00 ms, min_p (its cut then
 * one compare at a time) 0.44 ms; before the vector passes: 0.20 / 0.55 / 1.45 / 1.23 / 0.77 ms.
 * Samplers are independent, so the engine can run a batch's samplers in parallel on its thread pool.
 *
 * Stop decisions: mk_sampler_is_stop_token tells the engine whether a sampled token ends the request
 * (EOS unless ignore_eos; any stop_token_id always). Stop strings are matched on text (stop.h).
 */
#ifndef MK_ENGINE_SAMPLER_H
#define MK_ENGINE_SAMPLER_H

#include <stdint.h>

#include "base/status.h"
#include "num/sample_math.h"

#define MK_SAMPLER_MAX_TOP_LOGPROBS 20
#define MK_SAMPLER_GREEDY_EPS 1e-5f /* temperature below this is greedy (vLLM's _SAMPLING_EPS) */

typedef struct {
    float temperature;        /* >= 0; < 1e-5 = greedy. No upper bound (vLLM has none) */
    int top_k;                /* 0 or -1 = off; >= 1 keeps the k best (>= vocab = off) */
    float top_p;              /* (0, 1]; 1 = off */
    float min_p;              /* [0, 1]; 0 = off */
    float presence_penalty;   /* [-2, 2]; 0 = off */
    float frequency_penalty;  /* [-2, 2]; 0 = off */
    float repetition_penalty; /* > 0; 1 = off */
    const int32_t *bias_ids;  /* [n_bias] token ids in [0, vocab) (copied at create) */
    const float *bias_vals;   /* [n_bias] values in [-100, 100] added to the logits */
    int n_bias;
    int min_tokens;           /* >= 0: stop tokens are masked until this many were generated */
    int ignore_eos;           /* EOS does not end the request (it is still sampled normally) */
    const int32_t *stop_ids;  /* [n_stop_ids] extra stop token ids (copied at create) */
    int n_stop_ids;
    uint64_t seed;            /* used when has_seed */
    int has_seed;
    int logprobs;             /* 1: report the chosen token's logprob */
    int top_logprobs;         /* [0, 20] alternatives to report (implies logprobs) */
} mk_sampling_params;

/* Neutral parameters: temperature 1, top_p 1, top_k off, min_p 0, penalties neutral, no bias,
 * no seed, no logprobs. */
void mk_sampling_defaults(mk_sampling_params *p);

/* Checks every field against the ranges above (token ids against vocab). MK_EINVAL with a message
 * naming the field, the allowed range and the value found. */
int mk_sampling_validate(const mk_sampling_params *p, int vocab, mk_err *err);

/* Reads model_dir/generation_config.json when present: temperature, top_p, top_k, min_p,
 * repetition_penalty, do_sample (false -> temperature 0, Hugging Face's meaning; vLLM ignores it)
 * and eos_token_id (an int or a list; written to eos_ids[0, *n_eos), at most cap). Only keys present
 * (and not null) are written; others keep their values. No file -> MK_OK with nothing touched.
 * Malformed JSON, a wrong type or an out-of-range value -> MK_EFORMAT naming the file and key;
 * more than cap EOS ids -> MK_ERANGE. Unknown keys (max_new_tokens, bos_token_id...) are ignored. */
int mk_generation_config_load(const char *model_dir, mk_sampling_params *p, int32_t *eos_ids,
                              int *n_eos, int cap, mk_err *err);

typedef struct mk_sampler mk_sampler;

/* Validates p and copies everything it points to. eos_ids: the model's EOS tokens [n_eos]; prompt
 * [n_prompt]: the prompt tokens (for repetition_penalty). All ids must lie in [0, vocab). */
int mk_sampler_create(const mk_sampling_params *p, int vocab, const int32_t *eos_ids, int n_eos,
                      const int32_t *prompt, int n_prompt, mk_sampler **out, mk_err *err);
void mk_sampler_free(mk_sampler *s);

typedef struct {
    int32_t token;   /* the chosen token */
    float logprob;   /* its raw logprob (0 when logprobs were not asked) */
    int n_top;       /* number of alternatives filled: top_logprobs (or vocab if smaller) */
    int32_t top_ids[MK_SAMPLER_MAX_TOP_LOGPROBS];    /* by raw logprob descending, id ascending */
    float top_logprobs[MK_SAMPLER_MAX_TOP_LOGPROBS]; /* their raw logprobs */
} mk_sample_out;

/* Samples the next token from logits [vocab] (f32). The array is modified: on return it holds the
 * processed logits (bias, min_tokens mask and penalties applied; not tempered). The RNG position
 * only moves in mk_sampler_accept, so sampling the same step twice gives the same token.
 * MK_ERANGE when every token is masked (-inf). */
int mk_sampler_sample(mk_sampler *s, float *logits, mk_sample_out *out, mk_err *err);

/* The candidate set the next mk_sampler_sample would draw from: steps 1-7 on logits (modified as
 * above), then ids [*n] in ascending order with their renormalized probabilities (probs may be
 * NULL). Greedy parameters give the single argmax with probability 1. ids/probs hold vocab entries.
 * For tests and debugging. */
int mk_sampler_candidates(mk_sampler *s, float *logits, int32_t *ids, float *probs, int *n,
                          mk_err *err);

/* 1 when the next mk_sampler_sample would return the plain argmax of the model's logits: greedy
 * (temperature < 1e-5), no logprobs, no logit_bias, no penalties, and no stop token masked by
 * min_tokens at this step. The engine then lets the model pick the token where the logits are
 * (mk_batch_item.argmax: on the GPU, without copying the logits back), and records it with
 * mk_sampler_take. */
int mk_sampler_plain_greedy(const mk_sampler *s);

/* 1 when the next mk_sampler_sample draws with nothing but temperature, min_p, top_k and top_p
 * (not greedy; no logprobs, logit_bias, penalties or stop token masked by min_tokens at this
 * step): *d then holds that draw (src/num/sample_math.h), which a model may carry out where the
 * logits are (mk_batch_item.draw: the GPU's mk_cuda_sample_rows gives the token this sampler would
 * give); the engine records its token with mk_sampler_take. 0 otherwise (d untouched). */
int mk_sampler_plain_draw(const mk_sampler *s, mk_sample_draw *d);

/* The same for the step `ahead` tokens later (0: the next one), as if that many tokens were
 * accepted first: a plain sampler's state moves only by its step counter (the draw's uniform) and
 * its count of generated tokens (min_tokens), so a step can be handed to the model before the
 * tokens of the steps in flight are known (the engine's asynchronous scheduling). */
int mk_sampler_plain_draw_ahead(const mk_sampler *s, int ahead, mk_sample_draw *d);

/* 1 when the next step is not plain (a logit_bias, penalties, or stop tokens masked by min_tokens;
 * greedy or not) but its token can still be picked by the model where the logits are, once the
 * model adjusts them as mk_sampler_sample would: no logprobs, a repetition penalty of at least 1,
 * no token biased twice, at most cap adjusted tokens. *d then holds the draw (inv_t 0: greedy, the
 * argmax of the adjusted logits) and adj[0, d->n_adj) the adjusted tokens, one each
 * (src/num/sample_math.h: mk_sample_adjust; d->adj points at adj); the engine records the model's
 * token with mk_sampler_take. 0 otherwise (plain steps included: plain_greedy / plain_draw). */
int mk_sampler_model_step(const mk_sampler *s, mk_sample_draw *d, mk_sample_adj *adj, int cap);

/* The result mk_sampler_sample would give when the model picked the token: for a plain greedy
 * step the argmax of the sanitized logits (NaN as -inf, +inf as FLT_MAX, the lowest id on ties),
 * for a plain draw (mk_sampler_plain_draw) the drawn token, for a model step (mk_sampler_model_step)
 * the token of the adjusted logits; -1: every logit is -inf or NaN. out as mk_sampler_sample fills
 * it (no logprobs), MK_ERANGE with the same message for -1, MK_EINVAL when the step is none of
 * those, or the token is not a token id. */
int mk_sampler_take(const mk_sampler *s, int32_t token, mk_sample_out *out, mk_err *err);

/* Records the token generated this step: output counts for the penalties, min_tokens progress and
 * the RNG counter. Ids outside the vocabulary only advance the step. */
void mk_sampler_accept(mk_sampler *s, int32_t token);

/* 1 when token ends the request: an EOS id (unless ignore_eos) or one of stop_ids. */
int mk_sampler_is_stop_token(const mk_sampler *s, int32_t token);

/* Tokens accepted so far, and the seed in use (the request's, or the one drawn at create). */
int mk_sampler_n_generated(const mk_sampler *s);
uint64_t mk_sampler_seed(const mk_sampler *s);

#endif
