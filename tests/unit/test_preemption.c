/* test_preemption.c — an engine whose paged KV pool is too small for the load it is offered, on
 * the default Llama-family model: requests are preempted (their blocks released, recomputed
 * later) and still produce exactly the tokens and logprobs each produces alone; a randomized
 * stress with shared prefixes and cancellations ends with no block owned (every block free or
 * cached); a pool that cannot hold one full-length sequence is refused with the numbers.
 * Skipped when the default model is not installed. */
#include "engine_llama.h"
#include "models/batch.h"
#include "models/llama.h"

enum { LEN = 128 }; /* max_model_len: 4 blocks of 32 */

/* Bytes of one block of the engine's paged pool. */
static size_t block_bytes(mk_model *m, int *bt) {
    mk_err err = {0};
    mk_kvcache *c;
    mk_kvcache_caps caps;
    cr_assert_eq(mk_kvcache_create(m, &(mk_kvcache_options){.n_slots = 1, .max_model_len = LEN}, &c, &err), 0, "%s", err.msg);
    mk_kvcache_caps_get(c, &caps);
    mk_kvcache_free(c);
    cr_assert(caps.prefix_caching && caps.chunked_prefill);
    cr_assert(!caps.picks, "the default model on the CPU picks no tokens");
    *bt = caps.block_tokens;
    return llama_block_bytes(mk_model_llama(m), caps.block_tokens);
}

static mk_engine *small_engine_as(mk_model *m, double n_seqs_of_room, int async) {
    int bt;
    size_t bpb = block_bytes(m, &bt);
    mk_err err = {0};
    mk_engine *e;
    mk_engine_options o = {.max_num_seqs = 8, .max_model_len = LEN, .max_waiting = 64,
                           .kv_bytes = (size_t)(n_seqs_of_room * (LEN / bt)) * bpb, .async_scheduling = async};
    cr_assert_eq(mk_engine_create(m, &o, &e, &err), 0, "%s", err.msg);
    return e;
}

static mk_engine *small_engine(mk_model *m, double n_seqs_of_room) { return small_engine_as(m, n_seqs_of_room, 0); }

/* A plain greedy request (no logprobs: with async scheduling its steps chain) */
static mk_ereq *submit_plain(mk_engine *e, const int32_t *prompt, int n_prompt, int max_tokens) {
    static const int32_t no_eos = -1;
    mk_ereq_params p = {.prompt = prompt, .n_prompt = n_prompt, .eos_ids = &no_eos, .n_eos = 0, .max_tokens = max_tokens};
    mk_sampling_defaults(&p.sampling);
    p.sampling.temperature = 0;
    mk_err err = {0};
    mk_ereq *r;
    cr_assert_eq(mk_engine_submit(e, &p, &r, &err), 0, "%s", err.msg);
    return r;
}

Test(preemption, too_small_pool_is_refused) {
    mk_model *m = el_load();
    if (!m) return;
    int bt;
    size_t bpb = block_bytes(m, &bt);
    mk_err err = {0};
    mk_engine *e;
    mk_engine_options o = {.max_num_seqs = 2, .max_model_len = LEN, .max_waiting = 4, .kv_bytes = 3 * bpb};
    cr_assert_eq(mk_engine_create(m, &o, &e, &err), MK_EINVAL);
    cr_assert(strstr(err.msg, "max_model_len 128 needs 4 blocks"), "%s", err.msg);
    mk_model_free(m);
}

/* 8 concurrent requests, room for 1.5 sequences: every one completes exactly as alone. */
Test(preemption, overload_is_exact, .timeout = MK_TEST_TIMEOUT(120)) {
    mk_model *m = el_load();
    if (!m) return;
    enum { N = 8 };
    static int32_t prompt[N][48];
    int np[N], mt[N];
    el_out want[N], got[N];
    for (int k = 0; k < N; k++) {
        np[k] = 8 + (int)(el_rnd() % 33);
        mt[k] = 16 + (int)(el_rnd() % 17);
        el_tokens(prompt[k], np[k]);
        el_alone(m, prompt[k], np[k], mt[k], &want[k]);
    }
    double t0 = mk_now();
    mk_engine *e = small_engine(m, 1.5);
    mk_ereq *r[N];
    for (int k = 0; k < N; k++) r[k] = el_submit(e, prompt[k], np[k], mt[k], NULL);
    for (int k = 0; k < N; k++) {
        cr_assert_eq(el_drain(r[k], &got[k]), MK_EFIN_LENGTH, "request %d", k);
        mk_ereq_release(r[k]);
        char what[32];
        snprintf(what, sizeof what, "request %d", k);
        el_assert_same(&got[k], &want[k], what);
    }
    mk_engine_stats st;
    el_wait_idle(e, &st);
    cr_log_info("%llu preemptions, %llu steps, %d blocks, engine %.2f s", (unsigned long long)st.preemptions,
                (unsigned long long)st.steps, st.kv_blocks, mk_now() - t0);
    cr_assert_gt(st.preemptions, 0, "the pool was large enough: nothing preempted");
    cr_assert_eq(st.kv_cache_usage, 0.0);
    mk_engine_free(e);
    mk_model_free(m);
}

/* Random prompts, some sharing prefixes (hits and copy-on-write under pressure), random output
 * lengths, a third cancelled at a random point: every request ends, the uncancelled ones with
 * their full length and the tokens they produce alone (checked for a few), and the pool ends
 * with no block owned. */
static void random_stress(int async) {
    mk_model *m = el_load();
    if (!m) return;
    enum { N = 16, CHECK = 3 };
    static int32_t base[3][60], prompt[N][100];
    int np[N], mt[N], cancel_at[N];
    for (int i = 0; i < 3; i++) el_tokens(base[i], 60);
    for (int k = 0; k < N; k++) {
        int shared = (int)(el_rnd() % 4); /* 0: none, else the length of a shared prefix */
        int ns = shared ? 10 + (int)(el_rnd() % 50) : 0;
        np[k] = ns + 5 + (int)(el_rnd() % 30);
        if (ns) memcpy(prompt[k], base[shared - 1], sizeof(int32_t) * (size_t)ns);
        el_tokens(prompt[k] + ns, np[k] - ns);
        mt[k] = 4 + (int)(el_rnd() % 28);
        cancel_at[k] = el_rnd() % 3 == 0 ? (int)(el_rnd() % (uint64_t)mt[k]) : -1;
    }
    el_out want[CHECK];
    int checked[CHECK], nc = 0;
    for (int k = 0; k < N && nc < CHECK; k++)
        if (cancel_at[k] < 0) {
            el_alone(m, prompt[k], np[k], mt[k], &want[nc]);
            checked[nc++] = k;
        }
    mk_engine *e = small_engine_as(m, 1.5, async);
    mk_ereq *r[N];
    for (int k = 0; k < N; k++) {
        r[k] = async ? submit_plain(e, prompt[k], np[k], mt[k]) : el_submit(e, prompt[k], np[k], mt[k], NULL);
        if (cancel_at[k] == 0) mk_ereq_cancel(r[k]);
    }
    for (int k = 0; k < N; k++) {
        el_out o = {.n = 0};
        mk_efinish fin = 0;
        for (;;) {
            mk_ereq_event ev;
            cr_assert(mk_ereq_next(r[k], 60.0, &ev), "request %d: no event within 60 s", k);
            if (ev.type == MK_EV_FINISH) { fin = ev.finish; break; }
            o.tok[o.n] = ev.tok.token;
            o.lp[o.n++] = ev.tok.logprob;
            if (o.n == cancel_at[k]) mk_ereq_cancel(r[k]);
        }
        if (cancel_at[k] < 0) {
            cr_assert_eq(fin, MK_EFIN_LENGTH, "request %d finished with %d", k, fin);
            cr_assert_eq(o.n, mt[k]);
        } else {
            cr_assert(fin == MK_EFIN_CANCEL || fin == MK_EFIN_LENGTH, "request %d finished with %d", k, fin);
        }
        for (int c = 0; c < nc; c++)
            if (checked[c] == k) {
                char what[32];
                snprintf(what, sizeof what, "request %d", k);
                if (async) { /* tokens only: a plain request has no logprobs */
                    cr_assert_eq(o.n, want[c].n, "%s: %d tokens, %d alone", what, o.n, want[c].n);
                    for (int i = 0; i < o.n; i++)
                        cr_assert_eq(o.tok[i], want[c].tok[i], "%s: token %d is %d, %d alone", what, i, o.tok[i],
                                     want[c].tok[i]);
                } else {
                    el_assert_same(&o, &want[c], what);
                }
            }
        mk_ereq_release(r[k]);
    }
    mk_engine_stats st;
    el_wait_idle(e, &st);
    cr_log_info("%llu preemptions, prefix hits %llu of %llu tokens, %llu steps", (unsigned long long)st.preemptions,
                (unsigned long long)st.prefix_cache_hits, (unsigned long long)st.prefix_cache_queries,
                (unsigned long long)st.steps);
    cr_assert_gt(st.preemptions, 0);
    cr_assert_gt(st.prefix_cache_hits, 0);
    cr_assert_eq(st.kv_cache_usage, 0.0, "blocks still owned after every request left: usage %g", st.kv_cache_usage);
    if (async) cr_assert_gt(st.chained_steps, 0, "no step chained");
    mk_engine_free(e);
    mk_model_free(m);
}

Test(preemption, random_stress_with_cancellations, .timeout = MK_TEST_TIMEOUT(120)) { random_stress(0); }

/* The same with asynchronous scheduling forced on and plain greedy requests: steps chain between
 * preemptions, prefix hits and cancellations, with the same end state. */
Test(preemption, random_stress_async_scheduling, .timeout = MK_TEST_TIMEOUT(120)) { random_stress(1); }
