/* generate.c — the single-request generation loop (generate.h).
 *
 * Order per step, as vLLM does it: sample from the last logits; record the token (penalties, RNG
 * step); a stop token ends the request without being shown; otherwise detokenize it, pass the
 * text through the stop-string matcher, show what is safe; then, unless max_tokens is reached,
 * run the one-token decode that yields the next logits. */
#include "engine/generate.h"
#include "engine/stop.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void emit(const mk_gen_request *r, const char *t, size_t n) {
    if (n && r->on_text) r->on_text(r->ctx, t, n);
}

int mk_generate(mk_seq *s, const mk_tok *tok, const int32_t *prompt, int n_prompt,
                const mk_gen_request *req, mk_gen_result *res, mk_err *err) {
    memset(res, 0, sizeof *res);
    res->n_prompt = n_prompt;
    int vocab = mk_seq_vocab_size(s);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= vocab)
            return mk_fail(err, MK_ERANGE,
                           "prompt token %d (id %d) is outside the model's vocabulary of %d: does the tokenizer belong to this model?",
                           i, prompt[i], vocab);
    if (n_prompt <= 0) return mk_fail(err, MK_EINVAL, "the prompt is empty");
    if (req->max_tokens < 0) return mk_fail(err, MK_EINVAL, "max_tokens must be >= 0");
    if (n_prompt + req->max_tokens > mk_seq_capacity(s))
        return mk_fail(err, MK_ERANGE, "prompt (%d tokens) + max_tokens (%d) exceeds the sequence capacity %d",
                       n_prompt, req->max_tokens, mk_seq_capacity(s));
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    res->tokens = malloc(sizeof(int32_t) * (size_t)(req->max_tokens + 1));
    mk_sampler *smp = NULL;
    mk_detok *dt = NULL;
    mk_stop *st = NULL;
    int rc = MK_OK;
    if (!logits || !res->tokens) { rc = mk_fail(err, MK_ENOMEM, "out of memory"); goto out; }
    if ((rc = mk_sampler_create(req->sampling, vocab, req->eos_ids, req->n_eos, prompt, n_prompt, &smp, err))) goto out;
    if ((rc = mk_detok_create(tok, req->skip_special, &dt, err))) goto out;
    if ((rc = mk_stop_create(req->stop, req->n_stop, 0, &st, err))) goto out;
    mk_seq_reset(s);
    double t0 = now();
    if ((rc = mk_seq_forward(s, prompt, n_prompt, logits, err))) goto out;
    res->prefill_s = now() - t0;
    t0 = now();
    const char *txt;
    size_t tl;
    for (;;) {
        if (res->n_generated >= req->max_tokens) { res->finish = MK_FINISH_LENGTH; break; }
        if (req->cancel && *req->cancel) { res->finish = MK_FINISH_CANCEL; break; }
        mk_sample_out so;
        if ((rc = mk_sampler_sample(smp, logits, &so, err))) goto out;
        mk_sampler_accept(smp, so.token);
        res->tokens[res->n_generated++] = so.token;
        if (req->on_token) req->on_token(req->ctx, &so);
        if (mk_sampler_is_stop_token(smp, so.token)) { res->finish = MK_FINISH_STOP; break; }
        mk_detok_push(dt, so.token, &txt, &tl);
        const char *e;
        size_t el;
        int hit = mk_stop_feed(st, txt, tl, &e, &el);
        if (hit < 0) { rc = mk_fail(err, hit, "out of memory in the stop matcher"); goto out; }
        emit(req, e, el);
        if (hit) { res->finish = MK_FINISH_STOP; break; }
        if (res->n_generated >= req->max_tokens) { res->finish = MK_FINISH_LENGTH; break; }
        if ((rc = mk_seq_forward(s, &so.token, 1, logits, err))) goto out;
    }
    if (mk_stop_matched(st) < 0) {
        /* flush what the detokenizer and the stop matcher still hold */
        const char *e;
        size_t el;
        mk_detok_flush(dt, &txt, &tl);
        int hit = mk_stop_feed(st, txt, tl, &e, &el);
        emit(req, e, el);
        if (!hit) {
            mk_stop_flush(st, &e, &el);
            emit(req, e, el);
        }
    }
    res->decode_s = now() - t0;
out:
    mk_stop_free(st);
    mk_detok_free(dt);
    mk_sampler_free(smp);
    free(logits);
    return rc;
}
