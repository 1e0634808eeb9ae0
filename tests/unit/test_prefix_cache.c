/* test_prefix_cache.c — prefix caching through the engine on the default Llama-family model
 * (paged KV, src/models/batch.c): a request that shares a prefix with an earlier one reuses its
 * blocks (full blocks, and a partial block copied on write), computes only the rest — counted in
 * tokens through mk_ereq_info.n_cached and the engine's prefix counters, not timed — and still
 * produces exactly the tokens and logprobs of the request run alone on a cold sequence. Covered:
 * a 300-token shared prefix, a prompt shorter than one block (resent, and extended), a 5-turn
 * agent-like session resending its history (hit rate asserted), and cache_salt separating
 * tenants. Skipped when the default model is not installed. */
#include "engine_llama.h"

static mk_engine *engine(mk_model *m) {
    mk_err err = {0};
    mk_engine *e;
    mk_engine_options o = {.max_num_seqs = 4, .max_model_len = 1024, .max_waiting = 16};
    cr_assert_eq(mk_engine_create(m, &o, &e, &err), 0, "%s", err.msg);
    return e;
}

/* Runs one greedy request to completion; returns its info (n_cached) and output. */
static void run(mk_engine *e, const int32_t *prompt, int n, int max_tokens, const char *salt, el_out *out,
                mk_ereq_info *info) {
    mk_ereq *r = el_submit(e, prompt, n, max_tokens, salt);
    cr_assert_eq(el_drain(r, out), MK_EFIN_LENGTH);
    mk_ereq_get_info(r, info);
    mk_ereq_release(r);
}

Test(prefix_cache, shared_long_prefix_is_exact_and_shorter, .timeout = MK_TEST_TIMEOUT(120)) {
    mk_model *m = el_load();
    if (!m) return;
    mk_engine *e = engine(m);
    int32_t a[320], b[315];
    el_tokens(a, 320);
    memcpy(b, a, sizeof(int32_t) * 300);
    el_tokens(b + 300, 15);
    b[300] = a[300] + 1; /* diverges right after the shared 300 tokens */
    el_out oa, ob, want;
    mk_ereq_info ia, ib;
    mk_engine_stats s0, s1;
    run(e, a, 320, 8, NULL, &oa, &ia);
    cr_assert_eq(ia.n_cached, 0, "cold cache: %d tokens found", ia.n_cached);
    mk_engine_stats_get(e, &s0);
    run(e, b, 315, 8, NULL, &ob, &ib);
    mk_engine_stats_get(e, &s1);
    /* 9 full blocks of 32 (288 tokens) + 12 tokens of a's 10th block, copied on write */
    cr_assert_eq(ib.n_cached, 300, "the shared prefix: %d tokens found", ib.n_cached);
    cr_assert_eq(s1.prefix_cache_hits - s0.prefix_cache_hits, 300);
    cr_assert_eq(s1.prefix_cache_queries - s0.prefix_cache_queries, 315);
    cr_log_info("prefill computed %d tokens instead of 315", 315 - ib.n_cached);
    el_alone(m, b, 315, 8, &want);
    el_assert_same(&ob, &want, "b after a");
    el_alone(m, a, 320, 8, &want);
    el_assert_same(&oa, &want, "a (cold)");
    mk_engine_free(e);
    mk_model_free(m);
}

Test(prefix_cache, short_prompt_below_one_block, .timeout = MK_TEST_TIMEOUT(60)) {
    mk_model *m = el_load();
    if (!m) return;
    mk_engine *e = engine(m);
    int32_t p[26];
    el_tokens(p, 26);
    el_out o, want;
    mk_ereq_info info;
    run(e, p, 20, 6, NULL, &o, &info);
    cr_assert_eq(info.n_cached, 0);
    /* the same prompt again (a regenerate): all but the last token, which must be recomputed */
    run(e, p, 20, 6, NULL, &o, &info);
    cr_assert_eq(info.n_cached, 19, "resent 20-token prompt: %d tokens found", info.n_cached);
    el_alone(m, p, 20, 6, &want);
    el_assert_same(&o, &want, "resent");
    /* the prompt extended: the whole first prompt comes from its partial block */
    run(e, p, 26, 6, NULL, &o, &info);
    cr_assert_eq(info.n_cached, 20, "extended prompt: %d tokens found", info.n_cached);
    el_alone(m, p, 26, 6, &want);
    el_assert_same(&o, &want, "extended");
    mk_engine_free(e);
    mk_model_free(m);
}

/* An agent loop: each turn resends the whole history (system prompt, every earlier user turn and
 * answer) plus new text. Every turn after the first must find at least its previous prompt. */
Test(prefix_cache, agent_session_hit_rate, .timeout = MK_TEST_TIMEOUT(120)) {
    mk_model *m = el_load();
    if (!m) return;
    mk_engine *e = engine(m);
    enum { TURNS = 5, GEN = 12 };
    int32_t hist[1024];
    int n = 60; /* system prompt + first user message */
    el_tokens(hist, n);
    mk_engine_stats s0, s1;
    mk_engine_stats_get(e, &s0);
    long sum_prompt = 0, sum_cached = 0;
    int prev_prompt = 0, exact = 0, exact_tok = 0;
    for (int t = 0; t < TURNS; t++) {
        el_out o, want;
        mk_ereq_info info;
        run(e, hist, n, GEN, NULL, &o, &info);
        if (t > 0)
            cr_assert_geq(info.n_cached, prev_prompt, "turn %d: %d tokens found, the previous prompt had %d", t,
                          info.n_cached, prev_prompt);
        sum_prompt += n;
        sum_cached += info.n_cached;
        /* tokens of the earlier answers come from blocks computed while decoding (one-token
         * order), where a cold run computes them as prompt (batch order): same tokens expected,
         * last bits of the logprobs may differ, so this is reported, not asserted */
        if (t <= 1 || t == TURNS - 1) { /* three cold runs are enough to show it (time) */
            el_alone(m, hist, n, GEN, &want);
            int same = o.n == want.n, same_tok = same;
            for (int i = 0; same_tok && i < o.n; i++) {
                same_tok = o.tok[i] == want.tok[i];
                same = same && same_tok && o.lp[i] == want.lp[i];
            }
            exact += same;
            exact_tok += same_tok;
        }
        prev_prompt = n;
        memcpy(hist + n, o.tok, sizeof(int32_t) * (size_t)o.n); /* the answer joins the history */
        n += o.n;
        el_tokens(hist + n, 40); /* a tool result / the next user message */
        n += 40;
    }
    mk_engine_stats_get(e, &s1);
    double rate = (double)(s1.prefix_cache_hits - s0.prefix_cache_hits) / (double)(s1.prefix_cache_queries - s0.prefix_cache_queries);
    cr_log_info("agent session: %d turns, hit rate %.3f (%ld of %ld prompt tokens), of 3 turns compared with a cold run %d "
                "bit-identical, %d with the same tokens", TURNS, rate, sum_cached, sum_prompt, exact, exact_tok);
    cr_assert_gt(rate, 0.6, "hit rate %.3f", rate);
    cr_assert_gt(exact, 0, "not even the first turn (no hit) equals its cold run");
    mk_engine_free(e);
    mk_model_free(m);
}

Test(prefix_cache, cache_salt_separates_tenants, .timeout = MK_TEST_TIMEOUT(60)) {
    mk_model *m = el_load();
    if (!m) return;
    mk_engine *e = engine(m);
    int32_t p[100];
    el_tokens(p, 100);
    el_out o, want;
    mk_ereq_info info;
    run(e, p, 100, 4, "alice", &o, &info);
    cr_assert_eq(info.n_cached, 0);
    run(e, p, 100, 4, "bob", &o, &info);
    cr_assert_eq(info.n_cached, 0, "another tenant found %d tokens", info.n_cached);
    run(e, p, 100, 4, NULL, &o, &info);
    cr_assert_eq(info.n_cached, 0, "no salt found %d tokens of salted requests", info.n_cached);
    run(e, p, 100, 4, "alice", &o, &info);
    cr_assert_eq(info.n_cached, 99, "the same tenant found %d tokens", info.n_cached);
    el_alone(m, p, 100, 4, &want);
    el_assert_same(&o, &want, "alice again");
    mk_engine_free(e);
    mk_model_free(m);
}
