/* threads.c — fixed thread pool (threads.h).
 *
 * A call publishes (fn, ctx, n) and then increments the generation counter `gen`; workers that
 * see a new generation run their contiguous chunk and decrement `pending`; the caller runs chunk 0
 * and waits for `pending` to reach 0. Waking a sleeping thread costs ~15 µs and a decode step makes
 * ~200 calls, so workers first spin on `gen` for a while (a decode's calls come back to back) and
 * only then sleep on a condition variable.
 *
 * The sleep handshake is a Dekker pattern and needs sequentially consistent atomics on both sides:
 *   worker: sleepers += 1 (under mu)  then  reads gen (under mu) and waits while unchanged
 *   caller: gen += 1                  then  reads sleepers; if > 0, locks mu and broadcasts
 * In the single total order of seq_cst operations, either the caller sees the worker counted as a
 * sleeper (and its broadcast, taken under mu, cannot fall between the worker's check and its wait),
 * or the worker sees the new generation and does not wait. (A release/acquire version of this
 * handshake deadlocks: both sides can miss each other's write.)
 * The fields fn/ctx/n_tasks are plain: written before the seq_cst increment of gen, read after a
 * worker's load of gen, so the increment orders them. */
#include "base/threads.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define SPIN_ROUNDS 20000 /* ~50-100 µs of pause instructions before a worker sleeps */

struct mk_pool {
    int n;                   /* threads including the caller */
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t cv_start;
    atomic_uint gen;         /* incremented per call */
    atomic_int pending;      /* workers still running this generation */
    atomic_int sleepers;     /* workers counted as sleeping (changed under mu) */
    atomic_int quit;
    mk_task_fn fn;
    void *ctx;
    int n_tasks;
};

typedef struct { mk_pool *p; int tid; } worker_arg;

static void run_chunk(mk_pool *p, int tid) {
    int n = p->n_tasks, per = (n + p->n - 1) / p->n;
    int lo = tid * per, hi = lo + per < n ? lo + per : n;
    for (int i = lo; i < hi; i++) p->fn(p->ctx, i, tid);
}

static void *worker(void *arg) {
    worker_arg *wa = arg;
    mk_pool *p = wa->p;
    int tid = wa->tid;
    free(wa);
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load(&p->gen);
        for (int s = 0; g == seen && s < SPIN_ROUNDS && !atomic_load_explicit(&p->quit, memory_order_relaxed); s++) {
            _mm_pause();
            g = atomic_load(&p->gen);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->quit)) pthread_cond_wait(&p->cv_start, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit)) return NULL;
        seen = g;
        run_chunk(p, tid);
        atomic_fetch_sub(&p->pending, 1);
    }
}

mk_pool *mk_pool_create(int n_threads) {
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    mk_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    p->th = calloc((size_t)n_threads, sizeof *p->th);
    if (!p->th) { free(p); return NULL; }
    for (int t = 1; t < n_threads; t++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) { p->n = t; break; }
        wa->p = p; wa->tid = t;
        if (pthread_create(&p->th[t], NULL, worker, wa)) { free(wa); p->n = t; break; }
    }
    return p;
}

void mk_pool_free(mk_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, 1);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (int t = 1; t < p->n; t++) pthread_join(p->th[t], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_start);
    free(p->th);
    free(p);
}

int mk_pool_size(const mk_pool *p) { return p ? p->n : 1; }

void mk_pool_run(mk_pool *p, int n, mk_task_fn fn, void *ctx) {
    if (!p || p->n == 1 || n <= 1) {
        for (int i = 0; i < n; i++) fn(ctx, i, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n;
    atomic_store(&p->pending, p->n - 1);
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_start);
        pthread_mutex_unlock(&p->mu);
    }
    run_chunk(p, 0);
    /* wait for the workers; yield now and then in case they are not scheduled (oversubscribed) */
    for (int s = 0; atomic_load(&p->pending) > 0; s++) {
        _mm_pause();
        if ((s & 1023) == 1023) sched_yield();
    }
}
