/* test_dsv4_prefix.c — the DeepSeek-V4 paged hybrid KV through the engine (src/models/batch.c) on
 * a golden checkpoint: a request sharing a >= 2-block prefix with an earlier one finds whole
 * 256-position blocks only (no partial hits), restores its slot from the snapshot in the last hit
 * block and produces exactly (bit for bit) the greedy tokens and logprobs of the request run
 * alone on a cold sequence; the engine's prefix counters move; cache_salt separates tenants; a
 * pool too small for the offered load preempts and every request still produces what it does
 * alone. Prompts are chunked (small token budget) so chunks cross block ends mid-chunk. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "models/batch.h"
#include "models/dsv4.h"
#include "test_util.h"

enum { LEN = 1024, MAX_GEN = 32 };

typedef struct {
    int32_t tok[MAX_GEN];
    float lp[MAX_GEN];
    int n;
} out_t;

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static void tokens(int32_t *t, int n) {
    for (int i = 0; i < n; i++) t[i] = 3 + (int32_t)(rnd() % 509);
}

static mk_model *load(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/dsv4/v4-tiny-fp8", mk_test_data_dir());
    mk_err err = {0};
    mk_model *m;
    mk_model_options o = {.n_threads = 2, .max_seq_len = LEN};
    cr_assert_eq(mk_model_load(dir, &o, &m, &err), 0, "%s", err.msg);
    return m;
}

/* greedy alone on a cold sequence: the prompt in one call, then one-token decodes */
static void alone(mk_model *m, const int32_t *prompt, int n_prompt, int max_tokens, out_t *o) {
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
        /* the engine sampler's log-sum-exp (float expf terms summed in double), so that equal
         * logits give equal logprobs (a double exp differs from it by an ulp at times) */
        double se = 0;
        for (int i = 0; i < vocab; i++) se += expf(logits[i] - logits[best]);
        o->lp[o->n] = (float)((double)logits[best] - ((double)logits[best] + log(se)));
        o->tok[o->n++] = best;
        if (o->n >= max_tokens) break;
        int32_t t = best;
        cr_assert_eq(mk_seq_forward(s, &t, 1, logits, &err), 0, "%s", err.msg);
    }
    mk_seq_free(s);
    free(logits);
}

static mk_ereq *submit(mk_engine *e, const int32_t *prompt, int n, int max_tokens, const char *salt) {
    static const int32_t no_eos = -1;
    mk_ereq_params p = {.prompt = prompt, .n_prompt = n, .eos_ids = &no_eos, .n_eos = 0, .max_tokens = max_tokens,
                        .cache_salt = salt};
    mk_sampling_defaults(&p.sampling);
    p.sampling.temperature = 0;
    p.sampling.logprobs = 1;
    mk_err err = {0};
    mk_ereq *r;
    cr_assert_eq(mk_engine_submit(e, &p, &r, &err), 0, "%s", err.msg);
    return r;
}

static mk_efinish drain(mk_ereq *r, out_t *o) {
    o->n = 0;
    for (;;) {
        mk_ereq_event ev;
        cr_assert(mk_ereq_next(r, 120.0, &ev), "no event within 120 s");
        if (ev.type == MK_EV_FINISH) return ev.finish;
        cr_assert_lt(o->n, MAX_GEN);
        o->tok[o->n] = ev.tok.token;
        o->lp[o->n++] = ev.tok.logprob;
    }
}

/* bit-identical: same tokens, same logprobs */
static void assert_same(const out_t *got, const out_t *want, const char *what) {
    cr_assert_eq(got->n, want->n, "%s: %d tokens, %d alone", what, got->n, want->n);
    for (int i = 0; i < want->n; i++) {
        cr_assert_eq(got->tok[i], want->tok[i], "%s: token %d is %d, %d alone", what, i, got->tok[i], want->tok[i]);
        cr_assert(got->lp[i] == want->lp[i], "%s: token %d logprob %.9g, %.9g alone", what, i, got->lp[i], want->lp[i]);
    }
}

static void run(mk_engine *e, const int32_t *prompt, int n, int max_tokens, const char *salt, out_t *o, mk_ereq_info *info) {
    mk_ereq *r = submit(e, prompt, n, max_tokens, salt);
    cr_assert_eq(drain(r, o), MK_EFIN_LENGTH);
    mk_ereq_get_info(r, info);
    mk_ereq_release(r);
}

/* small budget: prompts run in 100-token chunks, which cross the 256-position block ends */
static mk_engine *engine(mk_model *m, size_t kv_bytes, int max_num_seqs) {
    mk_err err = {0};
    mk_engine *e;
    mk_engine_options o = {.max_num_seqs = max_num_seqs, .max_model_len = LEN, .max_waiting = 64, .kv_bytes = kv_bytes,
                           .max_num_batched_tokens = 160, .long_prefill_token_threshold = 100};
    cr_assert_eq(mk_engine_create(m, &o, &e, &err), 0, "%s", err.msg);
    return e;
}

Test(dsv4_prefix, caps) {
    mk_model *m = load();
    mk_err err = {0};
    mk_kvcache *c;
    mk_kvcache_caps caps;
    cr_assert_eq(mk_kvcache_create(m, &(mk_kvcache_options){.n_slots = 2, .max_model_len = LEN}, &c, &err), 0, "%s", err.msg);
    mk_kvcache_caps_get(c, &caps);
    dsv4_kv_layout lay;
    cr_assert_eq(dsv4_kv_layout_init(mk_model_dsv4(m), 1, &lay, &err), 0, "%s", err.msg);
    cr_assert_eq(caps.block_tokens, 256);
    cr_assert(caps.prefix_caching && caps.chunked_prefill && !caps.partial_hits && !caps.replay);
    cr_assert(!caps.picks, "a CPU model does not pick tokens where the logits are: every step is sampled on the host");
    cr_assert_eq(caps.n_blocks, 2 * (LEN / 256), "room for 2 full sequences: %d blocks", caps.n_blocks);
    cr_assert_eq(mk_kv_n_blocks(mk_kvcache_pool(c)), caps.n_blocks);
    cr_assert_eq(caps.block_bytes, lay.bytes);
    cr_assert_geq(caps.bytes, (size_t)caps.n_blocks * lay.bytes);
    cr_log_info("v4-tiny-fp8: %zu bytes per 256-position block", lay.bytes);
    mk_kvcache_free(c);
    /* a pool that cannot hold one full-length sequence is refused with the numbers */
    cr_assert_eq(mk_kvcache_create(m, &(mk_kvcache_options){.n_slots = 2, .max_model_len = LEN, .kv_bytes = 3 * lay.bytes}, &c, &err), MK_EINVAL);
    cr_assert(strstr(err.msg, "needs 4 blocks"), "%s", err.msg);
    mk_model_free(m);
}

Test(dsv4_prefix, shared_prefix_is_exact, .timeout = MK_TEST_TIMEOUT(600)) {
    mk_model *m = load();
    mk_engine *e = engine(m, 0, 4);
    static int32_t a[600], b[560], d[513];
    tokens(a, 600);
    memcpy(b, a, sizeof(int32_t) * 540);
    tokens(b + 540, 20);
    b[540] = a[540] == 7 ? 8 : 7; /* diverges after 540 shared tokens: 2 whole blocks */
    memcpy(d, a, sizeof(int32_t) * 513);
    d[512] = a[512] == 9 ? 10 : 9; /* 2 blocks and one new token (a one-row batch-order piece) */
    out_t oa, ob, oc, od, want;
    mk_ereq_info ia, ib, ic, id;
    mk_engine_stats s0, s1;
    run(e, a, 600, 6, NULL, &oa, &ia);
    cr_assert_eq(ia.n_cached, 0, "cold cache: %d tokens found", ia.n_cached);
    mk_engine_stats_get(e, &s0);
    run(e, b, 560, 6, NULL, &ob, &ib);
    mk_engine_stats_get(e, &s1);
    cr_assert_eq(ib.n_cached, 512, "shared 540 tokens: %d found (whole blocks only)", ib.n_cached);
    cr_assert_eq(s1.prefix_cache_hits - s0.prefix_cache_hits, 512);
    cr_assert_eq(s1.prefix_cache_queries - s0.prefix_cache_queries, 560);
    run(e, a, 600, 6, NULL, &oc, &ic); /* a resent: its 2 full prompt blocks */
    cr_assert_eq(ic.n_cached, 512, "resent: %d found", ic.n_cached);
    run(e, d, 513, 6, NULL, &od, &id);
    cr_assert_eq(id.n_cached, 512, "513-token prompt: %d found", id.n_cached);
    alone(m, a, 600, 6, &want);
    assert_same(&oa, &want, "a cold");
    assert_same(&oc, &want, "a resent (hit)");
    alone(m, b, 560, 6, &want);
    assert_same(&ob, &want, "b after a (hit)");
    alone(m, d, 513, 6, &want);
    assert_same(&od, &want, "d after a (hit, one new token)");
    mk_engine_free(e);
    mk_model_free(m);
}

Test(dsv4_prefix, cache_salt_separates_tenants, .timeout = MK_TEST_TIMEOUT(600)) {
    mk_model *m = load();
    mk_engine *e = engine(m, 0, 2);
    static int32_t p[300];
    tokens(p, 300);
    out_t o, want;
    mk_ereq_info info;
    run(e, p, 300, 3, "alice", &o, &info);
    cr_assert_eq(info.n_cached, 0);
    run(e, p, 300, 3, "bob", &o, &info);
    cr_assert_eq(info.n_cached, 0, "another tenant found %d tokens", info.n_cached);
    run(e, p, 300, 3, NULL, &o, &info);
    cr_assert_eq(info.n_cached, 0, "no salt found %d tokens of salted requests", info.n_cached);
    run(e, p, 300, 3, "alice", &o, &info);
    cr_assert_eq(info.n_cached, 256, "the same tenant found %d tokens", info.n_cached);
    alone(m, p, 300, 3, &want);
    assert_same(&o, &want, "alice again");
    mk_engine_free(e);
    mk_model_free(m);
}

/* 8 concurrent requests (some sharing a 2-block prefix) with room for 1.25 full sequences: the
 * pool runs out, requests are preempted and recomputed (finding their own or others' blocks),
 * and every one produces exactly what it does alone. */
Test(dsv4_prefix, preemption_is_exact, .timeout = MK_TEST_TIMEOUT(900)) {
    mk_model *m = load();
    mk_err err = {0};
    dsv4_kv_layout lay;
    cr_assert_eq(dsv4_kv_layout_init(mk_model_dsv4(m), 1, &lay, &err), 0, "%s", err.msg);
    mk_engine *e = engine(m, (size_t)(1.25 * (LEN / 256)) * lay.bytes, 4);
    enum { N = 8 };
    static int32_t prompt[N][600];
    int np[N], mt[N];
    out_t want[N], got[N];
    tokens(prompt[0], 600);
    for (int k = 0; k < N; k++) {
        np[k] = 260 + (int)(rnd() % 300);
        mt[k] = 4 + (int)(rnd() % 12);
        if (k && k % 2 == 0) memcpy(prompt[k], prompt[0], sizeof(int32_t) * 600); /* shared head */
        else if (k) tokens(prompt[k], 600);
        if (k % 2 == 0) prompt[k][520 + k] ^= 1; /* then diverge */
    }
    mk_ereq *rq[N];
    for (int k = 0; k < N; k++) rq[k] = submit(e, prompt[k], np[k], mt[k], NULL);
    for (int k = 0; k < N; k++) {
        cr_assert_eq(drain(rq[k], &got[k]), MK_EFIN_LENGTH, "request %d", k);
        mk_ereq_release(rq[k]);
    }
    mk_engine_stats st;
    mk_engine_stats_get(e, &st);
    cr_log_info("dsv4 preemption: %d blocks, %llu preemptions, prefix hits %llu of %llu tokens", st.kv_blocks,
                (unsigned long long)st.preemptions, (unsigned long long)st.prefix_cache_hits,
                (unsigned long long)st.prefix_cache_queries);
    cr_assert_gt(st.preemptions, 0, "the pool was meant to be too small");
    for (int k = 0; k < N; k++) {
        char what[64];
        snprintf(what, sizeof what, "request %d (%d prompt tokens)", k, np[k]);
        alone(m, prompt[k], np[k], mt[k], &want[k]);
        assert_same(&got[k], &want[k], what);
    }
    for (int i = 0; i < 400; i++) { /* the engine thread releases the last request's slot */
        mk_engine_stats_get(e, &st);
        if (!st.running && !st.slots_in_use) break;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    cr_assert_eq(st.running, 0);
    cr_assert_eq(st.kv_cache_usage, 0.0, "every block free or cached at the end");
    mk_engine_free(e);
    mk_model_free(m);
}
