/* test_kv.c — the paged KV block pool (src/kv/kv.h): allocation and eviction order, prefix lookups
 * (full and partial blocks, salts keep tenants apart), the tail-first eviction of a finished
 * sequence, and a randomized stress of sequences that share prefixes, finish, get cancelled and
 * exhaust the pool, with the block invariant and the exact reference counts checked after every
 * operation. */
#include <criterion/criterion.h>
#include <string.h>

#include "kv/kv.h"

static mk_kv_pool *mk(int n, int bt) {
    mk_err err = {0};
    mk_kv_pool *p;
    cr_assert_eq(mk_kv_pool_create(n, bt, 64, &p, &err), 0, "%s", err.msg);
    return p;
}

static void check(mk_kv_pool *p, const int *refs) {
    mk_err err = {0};
    cr_assert_eq(mk_kv_check(p, refs, &err), 0, "%s", err.msg);
}

Test(kv, alloc_free_and_exhaustion) {
    mk_kv_pool *p = mk(4, 16);
    int b[4];
    for (int i = 0; i < 4; i++) cr_assert_geq(b[i] = mk_kv_alloc(p), 0);
    cr_assert_eq(mk_kv_alloc(p), -1, "a pool with every block owned must refuse");
    cr_assert_eq(mk_kv_n_available(p), 0);
    int refs[4] = {1, 1, 1, 1};
    check(p, refs);
    memset(mk_kv_block_data(p, b[3]), 7, 64); /* block memory is usable */
    mk_kv_unref(p, b[2]);
    refs[b[2]] = 0;
    check(p, refs);
    cr_assert_eq(mk_kv_alloc(p), b[2]);
    mk_kv_pool_free(p);
}

Test(kv, full_and_partial_lookups_and_salt) {
    mk_kv_pool *p = mk(8, 4);
    int32_t t[8] = {5, 6, 7, 8, 9, 10, 11, 12};
    int a = mk_kv_alloc(p), b = mk_kv_alloc(p), c = mk_kv_alloc(p);
    cr_assert_eq(mk_kv_register(p, a, 0, t, 4, 0), 1);
    uint64_t ka = mk_kv_key(0, t, 4, 0);
    cr_assert_eq(mk_kv_register(p, b, ka, t + 4, 2, 0), 1); /* a partial second block: tokens 9, 10 */
    cr_assert_eq(mk_kv_register(p, c, 0, t, 4, 0), 0, "an identical block is not registered twice");
    mk_kv_unref(p, c);
    /* full lookup: same tokens and parent hit, anything else misses */
    cr_assert_eq(mk_kv_lookup_full(p, 0, t, 0), a);
    cr_assert_eq(mk_kv_lookup_full(p, 0, t, 99), -1, "another salt must not share");
    cr_assert_eq(mk_kv_lookup_full(p, 1, t, 0), -1, "another parent must not share");
    int32_t u[4] = {5, 6, 7, 9};
    cr_assert_eq(mk_kv_lookup_full(p, 0, u, 0), -1);
    /* partial lookup: the longest registered prefix of the asked tokens */
    int m;
    int32_t q[3] = {9, 10, 42};
    cr_assert_eq(mk_kv_lookup_partial(p, ka, q, 3, 0, &m), b);
    cr_assert_eq(m, 2);
    int32_t r[1] = {9};
    cr_assert_eq(mk_kv_lookup_partial(p, ka, r, 1, 0, &m), b, "a block serves a prompt sharing only its beginning");
    cr_assert_eq(m, 1);
    int32_t v[3] = {5, 6, 99};
    cr_assert_eq(mk_kv_lookup_partial(p, 0, v, 3, 0, &m), a, "so does a full block");
    cr_assert_eq(m, 2);
    cr_assert_eq(mk_kv_lookup_partial(p, 0, v, 3, 5, &m), -1, "not across salts");
    int refs[8] = {0};
    refs[a] = 3;
    refs[b] = 3;
    check(p, refs);
    mk_kv_pool_free(p);
}

Test(kv, lru_evicts_tail_blocks_first) {
    mk_kv_pool *p = mk(3, 2);
    int32_t t[6] = {1, 2, 3, 4, 5, 6};
    int blk[3];
    uint64_t parent = 0;
    for (int i = 0; i < 3; i++) {
        blk[i] = mk_kv_alloc(p);
        mk_kv_register(p, blk[i], parent, t + 2 * i, 2, 0);
        parent = mk_kv_key(parent, t + 2 * i, 2, 0);
    }
    for (int i = 2; i >= 0; i--) mk_kv_unref(p, blk[i]); /* a finished sequence frees last-to-first */
    mk_kv_stats st;
    mk_kv_stats_get(p, &st);
    cr_assert_eq(st.n_cached, 3);
    cr_assert_eq(mk_kv_alloc(p), blk[2], "the tail block goes first");
    cr_assert_eq(mk_kv_lookup_full(p, 0, t, 0), blk[0], "the head of the prompt is still cached");
    cr_assert_eq(mk_kv_alloc(p), blk[1]);
    mk_kv_stats_get(p, &st);
    cr_assert_eq(st.evictions, 2);
    check(p, NULL);
    mk_kv_pool_free(p);
}

/* Randomized: sequences with prompts drawn from a few shared prefixes allocate blocks with prefix
 * lookups, grow, finish (tail-first release) or get cancelled; the pool runs out now and then. */
#define NSEQ 12
#define MAXB 16
Test(kv, randomized_stress) {
    enum { NB = 40, BT = 4 };
    mk_kv_pool *p = mk(NB, BT);
    int tables[NSEQ][MAXB], nblk[NSEQ] = {0}, live[NSEQ] = {0};
    int32_t prefixes[3][MAXB * BT];
    uint64_t x = 88172645463325252ull;
#define RND() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < MAXB * BT; i++) prefixes[k][i] = (int32_t)(RND() % 50);
    int hits = 0, refusals = 0;
    for (int step = 0; step < 20000; step++) {
        int s = (int)(RND() % NSEQ);
        if (!live[s]) {
            /* start: a prompt of n blocks from prefix k, looked up block by block */
            int k = (int)(RND() % 3), n = 1 + (int)(RND() % 8);
            uint64_t salt = RND() % 4 == 0 ? 7 : 0, parent = 0;
            int ok = 1;
            nblk[s] = 0;
            for (int i = 0; i < n; i++) {
                const int32_t *tk = prefixes[k] + i * BT;
                int b = mk_kv_lookup_full(p, parent, tk, i == 0 ? salt : 0);
                if (b >= 0) hits++;
                else if ((b = mk_kv_alloc(p)) >= 0) mk_kv_register(p, b, parent, tk, BT, i == 0 ? salt : 0);
                if (b < 0) { ok = 0; refusals++; break; }
                tables[s][nblk[s]++] = b;
                parent = mk_kv_key(parent, tk, BT, i == 0 ? salt : 0);
            }
            live[s] = 1;
            if (!ok) { /* preempted: release what it got */
                for (int i = nblk[s] - 1; i >= 0; i--) mk_kv_unref(p, tables[s][i]);
                nblk[s] = 0;
                live[s] = 0;
            }
        } else if (RND() % 3 && nblk[s] < MAXB) {
            int b = mk_kv_alloc(p); /* decode grows into an unregistered block */
            if (b >= 0) tables[s][nblk[s]++] = b;
            else refusals++;
        } else {
            for (int i = nblk[s] - 1; i >= 0; i--) mk_kv_unref(p, tables[s][i]);
            nblk[s] = 0;
            live[s] = 0;
        }
        int refs[NB] = {0};
        for (int q = 0; q < NSEQ; q++)
            for (int i = 0; i < nblk[q]; i++) refs[tables[q][i]]++;
        check(p, refs);
    }
    cr_assert_gt(hits, 1000, "shared prefixes must hit (%d hits)", hits);
    cr_assert_gt(refusals, 0, "the stress must exhaust the pool sometimes");
    for (int q = 0; q < NSEQ; q++)
        for (int i = nblk[q] - 1; i >= 0; i--) mk_kv_unref(p, tables[q][i]);
    check(p, NULL);
    mk_kv_stats st;
    mk_kv_stats_get(p, &st);
    cr_assert_eq(st.n_owned, 0);
    mk_kv_pool_free(p);
}
