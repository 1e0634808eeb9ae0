/* threads.c — fixed thread pool (threads.h). Workers sleep on a condition variable between
 * calls; each call publishes (fn, ctx, n) under a generation counter and splits [0, n) into one
 * contiguous chunk per thread. */
#include "base/threads.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

struct mk_pool {
    int n;                   /* threads including the caller */
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    unsigned gen;            /* incremented per call */
    int pending;             /* workers still running this generation */
    int quit;
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
        pthread_mutex_lock(&p->mu);
        while (p->gen == seen && !p->quit) pthread_cond_wait(&p->cv_start, &p->mu);
        if (p->quit) { pthread_mutex_unlock(&p->mu); return NULL; }
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        run_chunk(p, tid);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->cv_done);
        pthread_mutex_unlock(&p->mu);
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
    pthread_cond_init(&p->cv_done, NULL);
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
    p->quit = 1;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (int t = 1; t < p->n; t++) pthread_join(p->th[t], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_start);
    pthread_cond_destroy(&p->cv_done);
    free(p->th);
    free(p);
}

int mk_pool_size(const mk_pool *p) { return p ? p->n : 1; }

void mk_pool_run(mk_pool *p, int n, mk_task_fn fn, void *ctx) {
    if (!p || p->n == 1 || n <= 1) {
        for (int i = 0; i < n; i++) fn(ctx, i, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn; p->ctx = ctx; p->n_tasks = n;
    p->pending = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    run_chunk(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
