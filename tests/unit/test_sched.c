/* test_sched.c — the continuous-batching scheduler (src/engine/sched.h) driven by a simulated
 * engine (no model): token budget and per-request prefill cap, decodes scheduled before prefills,
 * max_num_seqs, priority order, prefix-cache hits on full and partial blocks with salts, replay
 * before a hit boundary, preemption by recompute under a small KV pool, and a randomized stress
 * with cancellations where the block invariant (exact reference counts) holds after every step
 * and every request completes with the right number of tokens. */
#include <criterion/criterion.h>
#include <string.h>

#include "engine/sched.h"

static mk_kv_pool *pool_of(int n, int bt) {
    mk_err err = {0};
    mk_kv_pool *p;
    cr_assert_eq(mk_kv_pool_create(n, bt, 0, &p, &err), 0, "%s", err.msg);
    return p;
}

static mk_sched *sched_of(mk_kv_pool *p, int seqs, int budget, int thr, int replay) {
    mk_err err = {0};
    mk_sched *s;
    mk_sched_opts o = {.max_num_seqs = seqs, .max_num_batched_tokens = budget, .long_prefill_token_threshold = thr,
                       .replay = replay, .prefix_caching = 1};
    cr_assert_eq(mk_sched_create(&o, p, &s, &err), 0, "%s", err.msg);
    return s;
}

static void req(mk_sreq *r, const int32_t *prompt, int n, int cap, int bt, uint64_t arrival) {
    mk_err err = {0};
    cr_assert_eq(mk_sreq_init(r, cap, bt, &err), 0, "%s", err.msg);
    memcpy(r->tokens, prompt, sizeof(int32_t) * (size_t)n);
    r->n_tokens = r->n_prompt = n;
    r->arrival = arrival;
}

static void check(mk_sched *s) {
    mk_err err = {0};
    cr_assert_eq(mk_sched_check(s, &err), 0, "%s", err.msg);
}

/* one step: plan, check, commit, append a token to every request that produced logits */
static int step(mk_sched *s, mk_sched_item *it, int32_t tok) {
    mk_sreq *pre[64];
    int np;
    int n = mk_sched_step(s, it, 64, pre, &np);
    check(s);
    mk_sched_commit(s, it, n);
    for (int i = 0; i < n; i++)
        if (it[i].logits) mk_sched_append(s, it[i].req, tok);
    check(s);
    return n;
}

Test(sched, budget_cap_and_decode_first) {
    mk_kv_pool *p = pool_of(64, 16);
    mk_sched *s = sched_of(p, 4, 100, 40, 0);
    int32_t pr[200];
    for (int i = 0; i < 200; i++) pr[i] = i;
    mk_sreq a, b;
    req(&a, pr, 10, 64, 16, 1);
    req(&b, pr + 50, 150, 200, 16, 2);
    mk_sched_add(s, &a);
    mk_sched_add(s, &b);
    mk_sched_item it[64];
    int n = step(s, it, 7);
    cr_assert_eq(n, 2);
    cr_assert(it[0].req == &a && it[0].n == 10 && it[0].logits);
    cr_assert(it[1].req == &b && it[1].n == 40 && !it[1].logits, "the long prompt is capped at 40 tokens a step");
    n = step(s, it, 7);
    cr_assert(it[0].req == &a && it[0].n == 1 && it[0].start == 10, "the decode comes first");
    cr_assert(it[1].req == &b && it[1].start == 40 && it[1].n == 40);
    for (int k = 0; k < 2; k++) step(s, it, 7);
    cr_assert_eq(b.n_computed, 150);
    cr_assert_eq(b.n_tokens, 151, "the last prefill chunk produced a token");
    mk_sched_remove(s, &a);
    mk_sched_remove(s, &b);
    check(s);
    mk_sreq_release(&a);
    mk_sreq_release(&b);
    mk_sched_free(s);
    mk_kv_pool_free(p);
}

Test(sched, prefix_hits_full_partial_salt_and_replay) {
    mk_kv_pool *p = pool_of(64, 16);
    mk_sched *s = sched_of(p, 4, 1000, 0, 0);
    int32_t pr[100];
    for (int i = 0; i < 100; i++) pr[i] = 1000 + i;
    mk_sched_item it[64];
    /* a cold run of 70 tokens caches 4 full blocks and the 6-token tail */
    mk_sreq a;
    req(&a, pr, 70, 80, 16, 1);
    mk_sched_add(s, &a);
    step(s, it, 5);
    cr_assert_eq(a.n_cached, 0);
    mk_sched_remove(s, &a);
    /* the same prompt: 64 tokens from full blocks + 5 from the partial tail (one is recomputed) */
    mk_sreq b;
    req(&b, pr, 70, 80, 16, 2);
    mk_sched_add(s, &b);
    mk_sched_step(s, it, 64, (mk_sreq *[64]){0}, &(int){0});
    cr_assert_eq(b.n_cached, 69);
    cr_assert_eq(it[0].start, 69);
    cr_assert_eq(it[0].n, 1);
    cr_assert_geq(it[0].copy_from, 0, "a partial hit is copied");
    cr_assert_eq(it[0].copy_to, 4);
    mk_sched_commit(s, it, 1);
    check(s);
    mk_sched_remove(s, &b);
    /* a short prompt below one block hits the partial block of an earlier identical one */
    mk_sreq c, d;
    req(&c, pr + 80, 9, 20, 16, 3);
    mk_sched_add(s, &c);
    step(s, it, 5);
    mk_sched_remove(s, &c);
    req(&d, pr + 80, 9, 20, 16, 4);
    mk_sched_add(s, &d);
    step(s, it, 5);
    cr_assert_eq(d.n_cached, 8, "short prompts must hit");
    mk_sched_remove(s, &d);
    /* another tenant's salt: no hit */
    mk_sreq e;
    req(&e, pr, 70, 80, 16, 5);
    e.salt = 42;
    mk_sched_add(s, &e);
    step(s, it, 5);
    cr_assert_eq(e.n_cached, 0, "a different cache_salt must not share blocks");
    mk_sched_remove(s, &e);
    check(s);
    mk_sched_stats st;
    mk_sched_stats_get(s, &st);
    cr_assert_eq(st.prefix_hits, 69 + 8);
    cr_assert_eq(st.prefix_queries, 70 + 70 + 9 + 9 + 70);
    mk_sched_free(s);
    /* replay: a family that must recompute 20 tokens before the boundary */
    mk_sched *r = sched_of(p, 4, 1000, 0, 20);
    mk_sreq f;
    req(&f, pr, 70, 80, 16, 6);
    mk_sched_add(r, &f);
    mk_sched_step(r, it, 64, (mk_sreq *[64]){0}, &(int){0});
    cr_assert_eq(f.n_cached, 69);
    cr_assert_eq(it[0].start, 49, "the 20 tokens before the hit boundary are replayed");
    cr_assert_eq(it[0].n, 21);
    mk_sched_commit(r, it, 1);
    mk_sched_remove(r, &f);
    mk_err err = {0};
    cr_assert_eq(mk_kv_check(p, NULL, &err), 0, "%s", err.msg);
    mk_sched_free(r);
    mk_sreq_release(&a);
    mk_sreq_release(&b);
    mk_sreq_release(&c);
    mk_sreq_release(&d);
    mk_sreq_release(&e);
    mk_sreq_release(&f);
    mk_kv_pool_free(p);
}

Test(sched, priority_and_max_num_seqs) {
    mk_kv_pool *p = pool_of(64, 16);
    mk_sched *s = sched_of(p, 2, 1000, 0, 0);
    int32_t pr[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    mk_sreq r[4];
    int prio[4] = {3, 1, 2, 1};
    for (int i = 0; i < 4; i++) {
        req(&r[i], pr, 4 + i, 32, 16, (uint64_t)i);
        r[i].priority = prio[i];
        mk_sched_add(s, &r[i]);
    }
    mk_sched_item it[64];
    int n = step(s, it, 9);
    cr_assert_eq(n, 2, "max_num_seqs = 2");
    cr_assert(it[0].req == &r[1] && it[1].req == &r[3], "priority 1 first, then arrival order");
    mk_sched_remove(s, &r[1]);
    n = step(s, it, 9);
    cr_assert(it[0].req == &r[3] && it[1].req == &r[2]);
    for (int i = 0; i < 4; i++) {
        mk_sched_remove(s, &r[i]);
        mk_sreq_release(&r[i]);
    }
    check(s);
    mk_sched_free(s);
    mk_kv_pool_free(p);
}

/* Randomized: arrivals, growth, cancellations and finishes under a pool too small for the load.
 * Every request must finish with exactly its target token count; preemption must happen. */
Test(sched, randomized_preemption_stress) {
    enum { NR = 40, BT = 8 };
    mk_kv_pool *p = pool_of(24, BT);
    mk_sched *s = sched_of(p, 6, 48, 16, 0);
    mk_sreq r[NR];
    int target[NR], done[NR] = {0}, added[NR] = {0};
    int32_t base[3][64];
    uint64_t x = 0x9e3779b97f4a7c15ull;
#define RND() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 64; i++) base[k][i] = (int32_t)(RND() % 1000);
    for (int i = 0; i < NR; i++) {
        int n = 3 + (int)(RND() % 40);
        int32_t pr[64];
        memcpy(pr, base[RND() % 3], sizeof pr);
        for (int j = n - 3; j < n; j++) pr[j] = (int32_t)(RND() % 1000); /* unique-ish tails */
        target[i] = n + 1 + (int)(RND() % 30);
        req(&r[i], pr, n, 128, BT, (uint64_t)i);
    }
    mk_sched_item it[64];
    mk_sreq *pre[64];
    int np, finished = 0, cancelled = 0, steps = 0;
    mk_sched_stats st;
    while (finished + cancelled < NR) {
        cr_assert_lt(++steps, 100000, "no progress");
        for (int i = 0; i < NR; i++)
            if (!added[i] && RND() % 8 == 0) { mk_sched_add(s, &r[i]); added[i] = 1; }
        int n = mk_sched_step(s, it, 64, pre, &np);
        check(s);
        for (int k = 0; k < np; k++) pre[k]->n_tokens = pre[k]->n_tokens; /* engine keeps tokens: recompute */
        mk_sched_commit(s, it, n);
        for (int k = 0; k < n; k++) {
            mk_sreq *q = it[k].req;
            cr_assert_leq(q->n_computed, q->n_tokens);
            if (!it[k].logits) continue;
            int i = (int)(q - r);
            if (q->n_tokens >= target[i]) continue;
            mk_sched_append(s, q, (int32_t)(RND() % 1000));
            if (q->n_tokens == target[i]) { mk_sched_remove(s, q); done[i] = 1; finished++; }
        }
        for (int i = 0; i < NR; i++) /* cancellations, in any state */
            if (added[i] && !done[i] && RND() % 400 == 0) { mk_sched_remove(s, &r[i]); done[i] = 2; cancelled++; }
        check(s);
    }
    mk_sched_stats_get(s, &st);
    cr_assert_gt(st.preemptions, 0, "the pool is too small: preemption must happen");
    cr_assert_gt(st.prefix_hits, 0);
    for (int i = 0; i < NR; i++) {
        if (done[i] == 1) cr_assert_eq(r[i].n_tokens, target[i]);
        mk_sreq_release(&r[i]);
    }
    mk_kv_stats ks;
    mk_kv_stats_get(p, &ks);
    cr_assert_eq(ks.n_owned, 0, "every block is free or cached at the end");
    mk_sched_free(s);
    mk_kv_pool_free(p);
}

/* A piece whose forward failed: nothing of it is registered in the prefix cache, so a later
 * request with the same prompt finds no hit (and the block invariant holds). */
Test(sched, failed_piece_registers_nothing) {
    mk_kv_pool *p = pool_of(16, 16);
    mk_sched *s = sched_of(p, 4, 256, 0, 0);
    int32_t pr[40];
    for (int i = 0; i < 40; i++) pr[i] = 100 + i;
    mk_sreq a, b;
    req(&a, pr, 40, 64, 16, 1);
    mk_sched_add(s, &a);
    mk_sched_item it[64];
    mk_sreq *pre[64];
    int np, n = mk_sched_step(s, it, 64, pre, &np);
    cr_assert_eq(n, 1);
    cr_assert_eq(it[0].n, 40);
    it[0].failed = 1;
    mk_sched_commit(s, it, n);
    check(s);
    cr_assert_eq(a.n_computed, 0, "a failed piece computed nothing");
    mk_sched_remove(s, &a);
    check(s);
    req(&b, pr, 40, 64, 16, 2);
    mk_sched_add(s, &b);
    n = step(s, it, 7);
    cr_assert_eq(n, 1);
    cr_assert_eq(b.n_cached, 0, "found %d tokens registered by a failed piece", b.n_cached);
    mk_sched_remove(s, &b);
    check(s);
    mk_sreq_release(&a);
    mk_sreq_release(&b);
    mk_sched_free(s);
    mk_kv_pool_free(p);
}
