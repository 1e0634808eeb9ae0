/* threads.h — a small fixed thread pool for data-parallel loops in the forward pass.
 *
 * mk_pool_run(pool, n, fn, ctx) calls fn(ctx, i, tid) for i in [0, n), spread over the pool's
 * threads (the caller's thread takes part as tid 0), and returns when all are done. Tasks are
 * handed out in contiguous chunks so each thread streams its own slice of a weight matrix.
 * The pool is created once per model; nothing is allocated per call.
 */
#ifndef MK_BASE_THREADS_H
#define MK_BASE_THREADS_H

typedef struct mk_pool mk_pool;
typedef void (*mk_task_fn)(void *ctx, int i, int tid);

/* n_threads <= 0: number of online CPUs. Returns NULL on allocation failure. */
mk_pool *mk_pool_create(int n_threads);
void mk_pool_free(mk_pool *p);
int mk_pool_size(const mk_pool *p);
/* Runs fn over [0, n). Not reentrant: one mk_pool_run at a time per pool. */
void mk_pool_run(mk_pool *p, int n, mk_task_fn fn, void *ctx);

#endif
