/* test_engine.c — the engine thread (src/engine/engine.h) on a DeepSeek-V4 golden model: requests
 * interleaved in the engine produce exactly the tokens each produces alone (mk_seq + sampler
 * driven by hand), seeded sampling is reproducible, cancellation and timeouts end requests and free
 * their slots, a full queue refuses with MK_EBUSY, priorities order admission, and every counter is
 * back to zero when all handles are released. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "test_util.h"

static mk_model *load(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/dsv4/v4-tiny-fp8", mk_test_data_dir());
    mk_err err = {0};
    mk_model *m;
    mk_model_options o = {.n_threads = 1, .max_seq_len = 256};
    cr_assert_eq(mk_model_load(dir, &o, &m, &err), 0, "%s", err.msg);
    return m;
}

static void prompt_of(int k, int32_t *p, int n) {
    for (int i = 0; i < n; i++) p[i] = (i * 37 + k * 101 + 3) % 512;
}

/* tokens of the request run alone, by hand: prefill, then sample/accept/decode */
static int reference(mk_model *m, const int32_t *prompt, int n, const mk_sampling_params *sp, int max_tokens,
                     int32_t *out) {
    mk_err err = {0};
    mk_seq *s;
    mk_sampler *smp;
    static float logits[512];
    int32_t eos = 1;
    cr_assert_eq(mk_seq_create(m, 256, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(mk_sampler_create(sp, 512, &eos, 1, prompt, n, &smp, &err), 0, "%s", err.msg);
    cr_assert_eq(mk_seq_forward(s, prompt, n, logits, &err), 0, "%s", err.msg);
    int k = 0;
    for (;;) {
        mk_sample_out so;
        cr_assert_eq(mk_sampler_sample(smp, logits, &so, &err), 0, "%s", err.msg);
        mk_sampler_accept(smp, so.token);
        out[k++] = so.token;
        if (mk_sampler_is_stop_token(smp, so.token) || k >= max_tokens) break;
        cr_assert_eq(mk_seq_forward(s, &so.token, 1, logits, &err), 0, "%s", err.msg);
    }
    mk_sampler_free(smp);
    mk_seq_free(s);
    return k;
}

/* drains a request's events into toks; returns the finish reason */
static mk_efinish drain(mk_ereq *r, int32_t *toks, int *n) {
    *n = 0;
    for (;;) {
        mk_ereq_event ev;
        if (!mk_ereq_next(r, 10.0, &ev)) cr_assert_fail("no event within 10 s");
        if (ev.type == MK_EV_TOKEN) toks[(*n)++] = ev.tok.token;
        else return ev.finish;
    }
}

static void wait_idle(mk_engine *e) {
    mk_engine_stats st;
    for (int i = 0; i < 1000; i++) {
        mk_engine_stats_get(e, &st);
        if (!st.running && !st.waiting && !st.slots_in_use && !st.live_handles) return;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    cr_assert_fail("engine not idle: running %d waiting %d slots %d live %d", st.running, st.waiting,
                   st.slots_in_use, st.live_handles);
}

Test(engine, interleaved_equals_alone) {
    mk_model *m = load();
    mk_err err = {0};
    mk_engine *e;
    mk_engine_options o = {.max_num_seqs = 3, .max_model_len = 128, .max_waiting = 16};
    cr_assert_eq(mk_engine_create(m, &o, &e, &err), 0, "%s", err.msg);
    enum { N = 7 };
    int32_t prompts[N][40];
    mk_ereq *rq[N];
    mk_sampling_params sp[N];
    int32_t eos = 1;
    for (int k = 0; k < N; k++) {
        prompt_of(k, prompts[k], 5 + 5 * k);
        mk_sampling_defaults(&sp[k]);
        if (k % 2) sp[k].temperature = 0; /* greedy and seeded sampling mixed */
        else { sp[k].has_seed = 1; sp[k].seed = 1000 + (uint64_t)k; sp[k].top_p = 0.9f; }
        sp[k].ignore_eos = 1;
        mk_ereq_params p = {.prompt = prompts[k], .n_prompt = 5 + 5 * k, .sampling = sp[k], .eos_ids = &eos,
                            .n_eos = 1, .max_tokens = 6 + k};
        cr_assert_eq(mk_engine_submit(e, &p, &rq[k], &err), 0, "%s", err.msg);
    }
    for (int k = 0; k < N; k++) {
        int32_t got[64], want[64];
        int n;
        cr_assert_eq(drain(rq[k], got, &n), MK_EFIN_LENGTH);
        int nw = reference(m, prompts[k], 5 + 5 * k, &sp[k], 6 + k, want);
        cr_assert_eq(n, nw, "request %d: %d tokens, alone %d", k, n, nw);
        cr_assert(!memcmp(got, want, sizeof(int32_t) * (size_t)n), "request %d: tokens differ from running alone", k);
        mk_ereq_info info;
        mk_ereq_get_info(rq[k], &info);
        cr_assert(info.t_submit > 0 && info.t_admit >= info.t_submit && info.t_first >= info.t_admit &&
                  info.t_finish >= info.t_first);
        cr_assert_eq(info.n_generated, n);
        mk_ereq_release(rq[k]);
    }
    wait_idle(e);
    mk_engine_stats st;
    mk_engine_stats_get(e, &st);
    cr_assert_eq(st.finished_total[MK_EFIN_LENGTH], N);
    uint64_t gen = 0, pr = 0;
    for (int k = 0; k < N; k++) gen += 6 + k, pr += 5 + 5 * k;
    cr_assert_eq(st.generation_tokens_total, gen);
    cr_assert_eq(st.prompt_tokens_total, pr);
    cr_assert_eq(st.model_argmax_tokens, 0, "the CPU model fills logits; the host samples every token");
    mk_engine_free(e);
    mk_model_free(m);
}

Test(engine, cancel_timeout_busy_and_priority) {
    mk_model *m = load();
    mk_err err = {0};
    mk_engine *e;
    mk_engine_options o = {.max_num_seqs = 1, .max_model_len = 128, .max_waiting = 2};
    cr_assert_eq(mk_engine_create(m, &o, &e, &err), 0, "%s", err.msg);
    int32_t prompt[8], eos = 1;
    prompt_of(1, prompt, 8);
    mk_ereq_params p = {.prompt = prompt, .n_prompt = 8, .eos_ids = &eos, .n_eos = 1, .max_tokens = 100};
    mk_sampling_defaults(&p.sampling);
    p.sampling.ignore_eos = 1;
    /* a long runner holds the only slot */
    mk_ereq *run, *w[3], *x;
    cr_assert_eq(mk_engine_submit(e, &p, &run, &err), 0, "%s", err.msg);
    mk_ereq_event ev;
    cr_assert(mk_ereq_next(run, 10.0, &ev) && ev.type == MK_EV_TOKEN);
    /* two wait (the queue's bound), the third is refused */
    p.max_tokens = 3;
    p.priority = 5;
    cr_assert_eq(mk_engine_submit(e, &p, &w[0], &err), 0, "%s", err.msg);
    p.priority = -5; /* lower runs first */
    cr_assert_eq(mk_engine_submit(e, &p, &w[1], &err), 0, "%s", err.msg);
    cr_assert_eq(mk_engine_submit(e, &p, &x, &err), MK_EBUSY);
    cr_assert(strstr(err.msg, "queue is full"), "%s", err.msg);
    /* bad requests are refused with the field named */
    mk_ereq_params bad = p;
    bad.max_tokens = 200;
    cr_assert_eq(mk_engine_submit(e, &bad, &x, &err), MK_ERANGE);
    cr_assert(strstr(err.msg, "maximum context length is 128"), "%s", err.msg);
    bad = p;
    bad.sampling.top_p = 2;
    cr_assert_eq(mk_engine_submit(e, &bad, &x, &err), MK_EINVAL);
    cr_assert(strstr(err.msg, "top_p"), "%s", err.msg);
    /* cancelling the runner lets the waiting ones in, priority -5 first */
    mk_ereq_cancel(run);
    int32_t toks[128];
    int n;
    cr_assert_eq(drain(run, toks, &n), MK_EFIN_CANCEL);
    cr_assert(n < 99, "the runner must stop early, it produced %d more tokens", n); /* its first token was read above */
    mk_ereq_release(run);
    cr_assert_eq(drain(w[1], toks, &n), MK_EFIN_LENGTH);
    cr_assert_eq(n, 3);
    mk_ereq_info a, b;
    mk_ereq_get_info(w[1], &a);
    cr_assert_eq(drain(w[0], toks, &n), MK_EFIN_LENGTH);
    mk_ereq_get_info(w[0], &b);
    cr_assert(a.t_admit < b.t_admit, "priority -5 must be admitted before priority 5");
    mk_ereq_release(w[0]);
    mk_ereq_release(w[1]);
    /* a timeout ends a long request */
    p.max_tokens = 100;
    p.priority = 0;
    p.timeout_s = 0.05;
    cr_assert_eq(mk_engine_submit(e, &p, &x, &err), 0, "%s", err.msg);
    cr_assert_eq(drain(x, toks, &n), MK_EFIN_TIMEOUT);
    mk_ereq_release(x);
    /* releasing without reading: the engine still frees everything */
    p.timeout_s = 0;
    cr_assert_eq(mk_engine_submit(e, &p, &x, &err), 0, "%s", err.msg);
    mk_ereq_release(x);
    wait_idle(e);
    /* draining refuses new work */
    mk_engine_drain(e);
    cr_assert_eq(mk_engine_submit(e, &p, &x, &err), MK_EBUSY);
    mk_engine_free(e);
    mk_model_free(m);
}

Test(engine, free_with_requests_in_flight) {
    mk_model *m = load();
    mk_err err = {0};
    mk_engine *e;
    mk_engine_options o = {.max_num_seqs = 2, .max_model_len = 128, .max_waiting = 8};
    cr_assert_eq(mk_engine_create(m, &o, &e, &err), 0, "%s", err.msg);
    int32_t prompt[8], eos = 1;
    prompt_of(2, prompt, 8);
    mk_ereq_params p = {.prompt = prompt, .n_prompt = 8, .eos_ids = &eos, .n_eos = 1, .max_tokens = 100};
    mk_sampling_defaults(&p.sampling);
    p.sampling.ignore_eos = 1;
    mk_ereq *r[4];
    for (int i = 0; i < 4; i++) cr_assert_eq(mk_engine_submit(e, &p, &r[i], &err), 0, "%s", err.msg);
    mk_engine_free(e); /* every request ends as cancelled; the handles stay readable */
    for (int i = 0; i < 4; i++) {
        int32_t toks[128];
        int n;
        cr_assert_eq(drain(r[i], toks, &n), MK_EFIN_CANCEL);
        mk_ereq_release(r[i]);
    }
    mk_model_free(m);
}

/* Asynchronous scheduling forced on (the CPU model runs each step at its launch, picks the plain
 * greedy tokens and feeds them to the next step): greedy requests chained step after step produce
 * the tokens they produce alone; one ends on a stop token in the middle of a chain (the piece
 * already queued after it is dropped), a seeded sampled one breaks the chains while it runs, one
 * is cancelled mid-stream, and every counter is back to zero at the end. */
Test(engine, async_scheduling_equals_alone) {
    mk_model *m = load();
    mk_err err = {0};
    mk_engine *e;
    mk_engine_options o = {.max_num_seqs = 3, .max_model_len = 128, .max_waiting = 16, .async_scheduling = 1};
    cr_assert_eq(mk_engine_create(m, &o, &e, &err), 0, "%s", err.msg);
    enum { N = 5 };
    int32_t prompts[N][40], stop = -1, eos = 1;
    int np[N], mt[N];
    mk_sampling_params sp[N];
    for (int k = 0; k < N; k++) {
        np[k] = 6 + 4 * k;
        mt[k] = 10 + 3 * k;
        prompt_of(20 + k, prompts[k], np[k]);
        mk_sampling_defaults(&sp[k]);
        sp[k].temperature = 0;
        sp[k].ignore_eos = 1;
    }
    sp[2].temperature = 0.8f, sp[2].has_seed = 1, sp[2].seed = 77; /* sampled on the host */
    { /* request 4 stops on the token it picks sixth when run alone */
        int32_t w[64];
        cr_assert_geq(reference(m, prompts[4], np[4], &sp[4], mt[4], w), 6);
        stop = w[5];
        sp[4].stop_ids = &stop, sp[4].n_stop_ids = 1;
    }
    mk_ereq *rq[N];
    for (int k = 0; k < N; k++) {
        mk_ereq_params p = {.prompt = prompts[k], .n_prompt = np[k], .sampling = sp[k], .eos_ids = &eos, .n_eos = 1,
                            .max_tokens = mt[k]};
        cr_assert_eq(mk_engine_submit(e, &p, &rq[k], &err), 0, "%s", err.msg);
    }
    for (int k = 0; k < N; k++) {
        int32_t got[64], want[64];
        int n;
        mk_efinish fin = drain(rq[k], got, &n);
        int nw = reference(m, prompts[k], np[k], &sp[k], mt[k], want);
        cr_assert_eq(fin, k == 4 ? MK_EFIN_STOP : MK_EFIN_LENGTH, "request %d finished with %d", k, fin);
        cr_assert_eq(n, nw, "request %d: %d tokens, alone %d", k, n, nw);
        cr_assert(!memcmp(got, want, sizeof(int32_t) * (size_t)n), "request %d: tokens differ from running alone", k);
        if (k == 4) cr_assert(n <= 6 && got[n - 1] == stop, "request 4 ended after %d tokens", n);
        mk_ereq_release(rq[k]);
    }
    wait_idle(e);
    mk_engine_stats st;
    mk_engine_stats_get(e, &st);
    cr_assert_gt(st.chained_steps, 0, "no step was chained");
    cr_assert_gt(st.model_argmax_tokens, 0, "no token was picked by the model");
    const uint64_t chained = st.chained_steps;
    /* a cancelled chain, then one request alone */
    mk_ereq_params p = {.prompt = prompts[0], .n_prompt = np[0], .sampling = sp[0], .eos_ids = &eos, .n_eos = 1,
                        .max_tokens = 100};
    mk_ereq *c;
    cr_assert_eq(mk_engine_submit(e, &p, &c, &err), 0, "%s", err.msg);
    mk_ereq_event ev;
    for (int i = 0; i < 3; i++) cr_assert(mk_ereq_next(c, 10.0, &ev) && ev.type == MK_EV_TOKEN);
    mk_ereq_cancel(c);
    for (;;) {
        cr_assert(mk_ereq_next(c, 10.0, &ev), "no finish within 10 s");
        if (ev.type == MK_EV_FINISH) break;
    }
    cr_assert_eq(ev.finish, MK_EFIN_CANCEL);
    mk_ereq_release(c);
    p.prompt = prompts[3], p.n_prompt = np[3], p.sampling = sp[3], p.max_tokens = mt[3];
    cr_assert_eq(mk_engine_submit(e, &p, &c, &err), 0, "%s", err.msg);
    int32_t got[64], want[64];
    int n;
    cr_assert_eq(drain(c, got, &n), MK_EFIN_LENGTH);
    cr_assert_eq(n, reference(m, prompts[3], np[3], &sp[3], mt[3], want));
    cr_assert(!memcmp(got, want, sizeof(int32_t) * (size_t)n), "tokens differ from running alone");
    mk_ereq_release(c);
    wait_idle(e);
    mk_engine_stats_get(e, &st);
    cr_assert_gt(st.chained_steps, chained + (uint64_t)mt[3] / 2, "the lone request's steps were not chained");
    mk_engine_free(e);
    mk_model_free(m);
}
