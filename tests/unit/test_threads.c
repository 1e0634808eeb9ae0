/* test_threads.c — unit tests of the fixed thread pool (src/base/threads.h): every index in
 * [0, n) is visited exactly once, with a tid inside the pool, each thread's indices form one
 * contiguous chunk, tid 0 is the calling thread, a pool can be reused many times, and a NULL
 * pool runs the loop serially on the caller.
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "base/threads.h"
#include "test_util.h"

#define MAX_N 1000

typedef struct {
    atomic_int visits[MAX_N];
    atomic_int tid_of[MAX_N];
    atomic_int bad_tid;     /* tid outside [0, pool size) */
    atomic_int tid0_foreign; /* tid 0 seen on a thread other than the caller */
    int size;
    pthread_t caller;
} visit_ctx;

static void visit(void *p, int i, int tid) {
    visit_ctx *c = p;
    if (i < 0 || i >= MAX_N) return; /* would be caught by the count check below */
    atomic_fetch_add(&c->visits[i], 1);
    atomic_store(&c->tid_of[i], tid);
    if (tid < 0 || tid >= c->size) atomic_fetch_add(&c->bad_tid, 1);
    if (tid == 0 && !pthread_equal(pthread_self(), c->caller)) atomic_fetch_add(&c->tid0_foreign, 1);
}

static void run_and_check(mk_pool *pool, int n) {
    static visit_ctx c; /* large; reset per call */
    for (int i = 0; i < MAX_N; i++) {
        atomic_init(&c.visits[i], 0);
        atomic_init(&c.tid_of[i], -1);
    }
    atomic_init(&c.bad_tid, 0);
    atomic_init(&c.tid0_foreign, 0);
    c.size = mk_pool_size(pool);
    c.caller = pthread_self();
    mk_pool_run(pool, n, visit, &c);
    /* mk_pool_run returns only when all tasks are done: the counts are final here */
    for (int i = 0; i < MAX_N; i++)
        cr_assert_eq(atomic_load(&c.visits[i]), i < n ? 1 : 0, "n=%d size=%d: index %d visited %d times",
                     n, c.size, i, atomic_load(&c.visits[i]));
    cr_assert_eq(atomic_load(&c.bad_tid), 0, "n=%d: tid out of range", n);
    cr_assert_eq(atomic_load(&c.tid0_foreign), 0, "n=%d: tid 0 not the caller", n);
    /* contiguous chunks: once a tid's run ends it never appears again */
    int seen[64] = {0};
    for (int i = 0; i < n; i++) {
        int t = atomic_load(&c.tid_of[i]);
        cr_assert(t >= 0 && t < 64);
        if (i > 0 && atomic_load(&c.tid_of[i - 1]) != t) {
            cr_assert(!seen[t], "n=%d size=%d: tid %d has two chunks (at %d)", n, c.size, t, i);
        }
        seen[t] = 1;
    }
}

static const int ns[] = {0, 1, 2, 7, 1000};

Test(threads, every_index_once) {
    for (int threads = 1; threads <= 3; threads++) {
        mk_pool *pool = mk_pool_create(threads);
        cr_assert_not_null(pool);
        cr_assert_eq(mk_pool_size(pool), threads);
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) run_and_check(pool, ns[k]);
        mk_pool_free(pool);
    }
}

Test(threads, repeated_runs) {
    for (int threads = 1; threads <= 3; threads++) {
        mk_pool *pool = mk_pool_create(threads);
        cr_assert_not_null(pool);
        for (int rep = 0; rep < 300; rep++) run_and_check(pool, ns[rep % 5]);
        mk_pool_free(pool);
    }
}

Test(threads, null_pool) {
    cr_assert_eq(mk_pool_size(NULL), 1);
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) run_and_check(NULL, ns[k]);
    mk_pool_free(NULL); /* no-op */
}

Test(threads, default_size) {
    mk_pool *pool = mk_pool_create(0);
    cr_assert_not_null(pool);
    cr_assert_geq(mk_pool_size(pool), 1);
    if (mk_pool_size(pool) <= 64) run_and_check(pool, 1000);
    mk_pool_free(pool);
}

/* Pools created and freed back to back, some never used: no hang, no leak of a waiting run. */
Test(threads, create_free_cycles) {
    for (int k = 0; k < 50; k++) {
        mk_pool *pool = mk_pool_create(1 + k % 3);
        cr_assert_not_null(pool);
        if (k % 2) run_and_check(pool, 7);
        mk_pool_free(pool);
    }
}

/* Calls separated by gaps around the workers' spin period (0 to ~2 ms) so that workers are caught
 * spinning, falling asleep and sleeping: the spin-then-sleep handshake must never lose a wake-up
 * (a lost one hangs here) nor run a chunk twice. */
static void count(void *p, int i, int tid) {
    (void)i;
    (void)tid;
    atomic_fetch_add((atomic_int *)p, 1);
}

Test(threads, wake_at_every_phase, .timeout = MK_TEST_TIMEOUT(60)) {
    for (int threads = 2; threads <= 3; threads++) {
        mk_pool *pool = mk_pool_create(threads);
        cr_assert_not_null(pool);
        unsigned x = 12345;
        for (int rep = 0; rep < 1500; rep++) {
            atomic_int c;
            atomic_init(&c, 0);
            int n = 1 + rep % 9;
            mk_pool_run(pool, n, count, &c);
            cr_assert_eq(atomic_load(&c), n, "run %d: %d of %d tasks", rep, atomic_load(&c), n);
            x = x * 1103515245u + 12345u;
            int gap_us = (int)((x >> 16) % 2000);
            if (rep % 3 == 0) gap_us = (int)((x >> 16) % 150); /* near the end of the spin */
            struct timespec ts = {0, (long)gap_us * 1000};
            nanosleep(&ts, NULL);
        }
        mk_pool_free(pool);
    }
}
