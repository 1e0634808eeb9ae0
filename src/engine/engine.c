/* engine.c — the engine thread, the step loop over the scheduler and the batched forward, and
 * per-request event queues (engine.h).
 *
 * Locks: e->mu guards the incoming list, the draining/stopping flags and the statistics; each
 * request's r->mu guards its event ring and reference count. The scheduler, the KV cache and the
 * active list belong to the engine thread alone. The engine never holds e->mu while it runs a
 * forward pass, so submit and stats stay cheap during long steps. Lock order: e->mu before r->mu.
 *
 * Sampling: a request whose step is plain greedy (mk_sampler_plain_greedy: no logprobs, bias,
 * penalties or min_tokens mask) asks the model for the argmax instead of the logits
 * (mk_batch_item.argmax); the GPU model computes it on the device and copies one int instead of
 * the vocabulary's floats, and the sampler records it with mk_sampler_take (the same token
 * mk_sampler_sample would pick). Likewise (MINKE_MODEL_DRAW, default 1; 0 turns it off), a step
 * whose sampling is plain (mk_sampler_plain_draw: temperature, min_p, top_k, top_p only) hands the
 * model its draw the same way (mk_batch_item.draw): the GPU model draws the token the host
 * sampler would, and mk_sampler_take records it. Likewise (MINKE_MODEL_ADJUST, default 1; 0 turns it off),
 * a step with logit_bias, penalties or masked stop tokens (and no logprobs) goes to the model too,
 * its adjusted tokens listed in the draw (mk_sampler_model_step); a CPU model leaves every draw to
 * the host sampler. Every other step samples the logits on the host, the step's
 * requests in parallel on the engine's sampling pool (samplers are independent; a request's
 * token does not depend on the others or on the thread), then the results are applied in order.
 *
 * Memory: the KV cache, the logits rows and the step's item arrays are allocated at create. A
 * request's token buffer, block table and sampler are allocated when the engine takes it in and
 * freed when it leaves; its event ring starts at 32 entries and doubles only when the producer
 * falls behind.
 */
#include "engine/engine.h"
#include "base/threads.h"
#include "engine/sched.h"
#include "models/batch.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double mk_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
    mk_ev_type type;
    mk_efinish finish;
    double t;
    mk_sample_out tok;
} ev_item;

struct mk_ereq {
    /* immutable after submit */
    mk_sampling_params sp;
    int32_t *bias_ids, *stop_ids, *eos;
    float *bias_vals;
    int n_prompt, n_eos, max_tokens;
    double timeout_s;
    /* shared, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ev_item *ring;
    int head, count, cap;
    int finished; /* the FINISH event was pushed */
    int drained;  /* the producer has read the FINISH event */
    int refs;
    char msg[256];
    mk_ereq_info info;
    atomic_int cancel;
    /* engine thread only */
    mk_sreq sr;   /* the scheduler's view: tokens, block table */
    mk_sampler *smp;
    int slot, n_gen, in_sched;
    struct mk_ereq *next;   /* incoming list (under e->mu), then the engine's active list */
};

/* One step's plan and batch items (two: the one in flight and the next, async scheduling). */
typedef struct {
    mk_sched_item *items; /* [max_num_seqs] */
    mk_batch_item *bitems;
    int32_t *argmax;      /* [max_num_seqs]: plain greedy (or drawn) pieces' tokens, where the model picks them */
    mk_sample_draw *draws; /* [max_num_seqs]: the plain draws handed to the model (model_draw) */
    mk_sample_adj *adj;   /* [max_num_seqs, MK_SAMPLE_ADJ_MAX]: the model steps' adjusted tokens (model_adjust) */
    int n;                /* pieces planned (0 once collected) */
    int launched, committed, rc;
    mk_err err;           /* the launch's message */
} estep;

struct mk_engine {
    mk_model *m;
    mk_engine_options o;
    mk_kvcache *kv;
    mk_kvcache_caps caps;
    mk_sched *sched;
    mk_ereq **slot;       /* [n_slots] owner of each slot */
    float *logits;        /* [max_num_seqs][vocab] */
    int32_t *argmax;      /* [2][max_num_seqs] the two steps' (estep) */
    mk_sample_draw *draws; /* [2][max_num_seqs] */
    mk_sample_adj *adj;   /* [2][max_num_seqs, MK_SAMPLE_ADJ_MAX] */
    estep es[2];
    estep *inflight;      /* launched, not collected (async scheduling) */
    int async;            /* asynchronous scheduling (mk_engine_options.async_scheduling) */
    mk_pool *spool;       /* the step's host sampling, a request per task (NULL: one thread) */
    int *sidx;            /* [max_num_seqs] items sampled on the host this step */
    mk_sample_out *sout;  /* [max_num_seqs] their results, */
    int *src;             /* status */
    mk_err *serr;         /* and messages */
    int model_argmax;     /* let the model pick plain greedy tokens (default; MINKE_MODEL_ARGMAX=0: off,
                           * for A/B benchmarks) */
    int model_draw;       /* and draw plain sampled tokens (default; MINKE_MODEL_DRAW=0: off) */
    int model_adjust;     /* and pick the tokens of steps with logit_bias, penalties or masked stop tokens
                           * (mk_sampler_model_step; default; MINKE_MODEL_ADJUST=0: off. H100, session
                           * 20: 1.39-1.46 ms per batch-1 step against 1.96-2.37 on the host path) */
    mk_sched_item *items; /* [2][max_num_seqs]; while a step is collected, its own (sample_task) */
    mk_batch_item *bitems;
    mk_sched_item *items_all;
    mk_batch_item *bitems_all;
    mk_sreq **preempted;
    int vocab;
    pthread_t th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    mk_ereq *incoming;    /* submitted, not yet seen by the engine thread (under mu) */
    int n_incoming;
    mk_ereq *active;      /* engine thread: every request it holds */
    int draining, stopping;
    uint64_t next_order;
    mk_engine_stats st;
};

static atomic_int g_live; /* mk_ereq objects alive in the process */

/* ---- requests ------------------------------------------------------------------------------- */

static void req_free(mk_ereq *r) {
    mk_sampler_free(r->smp);
    mk_sreq_release(&r->sr);
    free(r->bias_ids);
    free(r->bias_vals);
    free(r->stop_ids);
    free(r->eos);
    free(r->ring);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
    atomic_fetch_sub(&g_live, 1);
}

static void req_unref(mk_ereq *r) {
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left == 0) req_free(r);
}

/* Appends one event (r->mu must not be held). Grows the ring when the producer lags. */
static void push_ev(mk_ereq *r, const ev_item *ev) {
    pthread_mutex_lock(&r->mu);
    if (r->count == r->cap) {
        int nc = r->cap * 2;
        ev_item *n = malloc(sizeof *n * (size_t)nc);
        if (!n) {
            /* cannot queue the token: drop the oldest unread token rather than the finish event */
            if (ev->type == MK_EV_TOKEN) { pthread_mutex_unlock(&r->mu); return; }
            r->head = (r->head + 1) % r->cap;
            r->count--;
        } else {
            for (int i = 0; i < r->count; i++) n[i] = r->ring[(r->head + i) % r->cap];
            free(r->ring);
            r->ring = n;
            r->head = 0;
            r->cap = nc;
        }
    }
    r->ring[(r->head + r->count) % r->cap] = *ev;
    r->count++;
    if (ev->type == MK_EV_FINISH) {
        r->finished = 1;
        r->info.t_finish = ev->t;
    } else if (r->info.t_first == 0) {
        r->info.t_first = ev->t;
    }
    r->info.n_generated = r->n_gen;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void *dup_arr(const void *p, size_t n, size_t sz, int *fail) {
    if (!n || !p) return NULL;
    void *d = malloc(n * sz);
    if (!d) { *fail = 1; return NULL; }
    memcpy(d, p, n * sz);
    return d;
}

int mk_ereq_next(mk_ereq *r, double timeout_s, mk_ereq_event *ev) {
    memset(ev, 0, sizeof *ev);
    pthread_mutex_lock(&r->mu);
    if (!r->count && !r->drained && timeout_s > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double end = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + timeout_s;
        ts.tv_sec = (time_t)end;
        ts.tv_nsec = (long)((end - (double)ts.tv_sec) * 1e9);
        while (!r->count) {
            if (pthread_cond_timedwait(&r->cv, &r->mu, &ts)) break;
        }
    }
    int got = 0;
    if (r->count && !r->drained) {
        ev_item it = r->ring[r->head];
        r->head = (r->head + 1) % r->cap;
        r->count--;
        ev->type = it.type;
        ev->tok = it.tok;
        ev->finish = it.finish;
        ev->t = it.t;
        if (it.type == MK_EV_FINISH) {
            r->drained = 1;
            if (it.finish == MK_EFIN_ERROR) snprintf(ev->msg, sizeof ev->msg, "%s", r->msg);
        }
        got = 1;
    }
    pthread_mutex_unlock(&r->mu);
    return got;
}

void mk_ereq_cancel(mk_ereq *r) { atomic_store(&r->cancel, 1); }

void mk_ereq_release(mk_ereq *r) {
    if (!r) return;
    mk_ereq_cancel(r);
    req_unref(r);
}

void mk_ereq_get_info(mk_ereq *r, mk_ereq_info *out) {
    pthread_mutex_lock(&r->mu);
    *out = r->info;
    pthread_mutex_unlock(&r->mu);
}

/* ---- engine --------------------------------------------------------------------------------- */

static void stats_sync(mk_engine *e) { /* e->mu held */
    mk_sched_stats ss;
    mk_sched_stats_get(e->sched, &ss);
    e->st.running = ss.running;
    e->st.waiting = ss.waiting + e->n_incoming;
    e->st.prefix_cache_queries = ss.prefix_queries;
    e->st.prefix_cache_hits = ss.prefix_hits;
    e->st.preemptions = ss.preemptions;
    mk_kv_stats ks;
    mk_kv_stats_get(mk_kvcache_pool(e->kv), &ks);
    e->st.kv_cache_usage = ks.n_blocks ? (double)ks.n_owned / ks.n_blocks : 0;
}

static void slot_release(mk_engine *e, mk_ereq *r) {
    if (r->slot < 0) return;
    e->slot[r->slot] = NULL;
    r->slot = -1;
    pthread_mutex_lock(&e->mu);
    e->st.slots_in_use--;
    pthread_mutex_unlock(&e->mu);
}

static void unlink_active(mk_engine *e, mk_ereq *r) {
    for (mk_ereq **pp = &e->active; *pp; pp = &(*pp)->next)
        if (*pp == r) { *pp = r->next; r->next = NULL; return; }
}

/* Ends a request: FINISH event, scheduler and slot released, statistics, the engine's reference
 * dropped. Engine thread, e->mu not held. */
static void drop_pieces(mk_engine *e, mk_ereq *r);
static void finish(mk_engine *e, mk_ereq *r, mk_efinish why, const char *msg) {
    if (msg) {
        pthread_mutex_lock(&r->mu);
        snprintf(r->msg, sizeof r->msg, "%s", msg);
        pthread_mutex_unlock(&r->mu);
    }
    if (r->in_sched) mk_sched_remove(e->sched, &r->sr);
    r->in_sched = 0;
    drop_pieces(e, r);
    slot_release(e, r);
    unlink_active(e, r);
    ev_item ev = {.type = MK_EV_FINISH, .finish = why, .t = mk_now()};
    push_ev(r, &ev);
    mk_sampler_free(r->smp);
    r->smp = NULL;
    pthread_mutex_lock(&e->mu);
    e->st.finished_total[why]++;
    stats_sync(e);
    pthread_mutex_unlock(&e->mu);
    req_unref(r);
}

/* Takes a submitted request into the scheduler: token buffer, block table, sampler. */
static void take_in(mk_engine *e, mk_ereq *r, const int32_t *prompt) {
    mk_err err = {0};
    r->next = e->active;
    e->active = r;
    int rc = mk_sampler_create(&r->sp, e->vocab, r->eos, r->n_eos, prompt, r->n_prompt, &r->smp, &err);
    if (!rc) {
        pthread_mutex_lock(&r->mu);
        r->info.seed = mk_sampler_seed(r->smp);
        pthread_mutex_unlock(&r->mu);
        mk_sched_add(e->sched, &r->sr);
        r->in_sched = 1;
    } else {
        finish(e, r, MK_EFIN_ERROR, err.msg);
    }
}

static int free_slot(mk_engine *e) {
    for (int i = 0; i < e->caps.n_slots; i++)
        if (!e->slot[i]) return i;
    return -1;
}

/* ---- steps ------------------------------------------------------------------------------------
 * A step is planned (mk_sched_step), built into batch items, launched (mk_model_batch_launch) and
 * collected (mk_model_batch_wait, then sampling and the events). Without asynchronous scheduling
 * it is collected right after its launch. With it, a launched step is left in flight, and the
 * next call of step() chains when it can: every piece of the step in flight is a one-token decode
 * whose token the model picks (plain greedy, or a plain draw by a model that draws: a CPU model
 * picks only greedy tokens at a launch), none can end by length, none ends a KV block
 * (nothing to register in the prefix cache, no block to allocate: no preemption), nothing waits
 * and nothing is cancelled. Then the step in flight is committed at once, a placeholder token is
 * appended for each request, the next step is planned (the same requests, in the same order) and
 * launched with its tokens fed on the device from the picks of the step in flight, and only then
 * is the step in flight collected: its tokens replace the placeholders (before anything could
 * register them) and go out as events. A request that stops there has already been queued one
 * more token in the next step: that piece is dropped when collected (its blocks are released at
 * once: the device runs steps in order, so a later step's writes into those blocks come after). */

/* Drops the pieces of r from both steps' plans (r is leaving). */
static void drop_pieces(mk_engine *e, mk_ereq *r) {
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < e->es[s].n; i++)
            if (e->es[s].items[i].req == &r->sr) e->es[s].items[i].req = NULL;
}

/* Host sampling of item e->sidx[j] (a task of the sampling pool: one request's sampler each). */
static void sample_task(void *ctx, int j, int tid) {
    (void)tid;
    mk_engine *e = ctx;
    const int i = e->sidx[j];
    mk_ereq *r = e->items[i].req->owner;
    e->src[i] = mk_sampler_sample(r->smp, e->bitems[i].logits, &e->sout[i], &e->serr[i]);
}

/* The batch items of planned step S (n pieces). chained: every piece is fed from the step in
 * flight, and only a plain greedy pick or a plain draw is handed to the model (the draw's counter
 * one step ahead of the sampler's, which has not accepted the token in flight yet; a model step's
 * list of adjusted tokens follows that token, so it is never chained). */
static void build(mk_engine *e, estep *S, int chained) {
    int nl = 0;
    for (int i = 0; i < S->n; i++) {
        mk_sched_item *it = &S->items[i];
        mk_ereq *r = it->req->owner;
        int fresh = 0;
        S->bitems[i] = (mk_batch_item){.slot = -1};
        if (r->slot < 0) {
            fresh = 1;
            r->slot = free_slot(e);
            if (r->slot < 0) { /* cannot happen: running <= max_num_seqs == slots */
                S->bitems[i].status = MK_EINTERNAL;
                continue;
            }
            e->slot[r->slot] = r;
            pthread_mutex_lock(&e->mu);
            e->st.slots_in_use++;
            pthread_mutex_unlock(&e->mu);
            if (r->info.t_admit == 0) {
                pthread_mutex_lock(&r->mu);
                r->info.t_admit = mk_now();
                r->info.n_cached = it->req->n_cached;
                pthread_mutex_unlock(&r->mu);
            }
        }
        /* a plain greedy step (sampler.h) lets the model pick the token where the logits are */
        int32_t *am = it->logits && e->model_argmax && mk_sampler_plain_greedy(r->smp) ? &S->argmax[i] : NULL;
        /* a plain draw (sampler.h) lets the model draw it there (tuning: model_draw) */
        const mk_sample_draw *dr = NULL;
        if (!am && it->logits && e->model_draw && (!chained || e->caps.picks) &&
            mk_sampler_plain_draw_ahead(r->smp, chained, &S->draws[i])) /* chained: after the token in flight */
            am = &S->argmax[i], dr = &S->draws[i];
        /* and a step with adjustments (bias, penalties, masked stop tokens) the model may pick with them */
        if (!chained && !am && it->logits && e->model_draw && e->model_adjust &&
            mk_sampler_model_step(r->smp, &S->draws[i], S->adj + (size_t)i * MK_SAMPLE_ADJ_MAX, MK_SAMPLE_ADJ_MAX))
            am = &S->argmax[i], dr = &S->draws[i];
        S->bitems[i] = (mk_batch_item){.slot = r->slot, .start = it->start, .fresh = fresh, .tokens = it->req->tokens + it->start, .n_prompt = it->req->n_prompt,
                                       .n = it->n, .blocks = it->req->blocks, .n_blocks = it->req->n_blocks,
                                       .copy_from = it->copy_from, .copy_to = it->copy_to,
                                       .logits = it->logits ? e->logits + (size_t)(nl++) * e->vocab : NULL,
                                       .argmax = am, .draw = dr, .feed = chained};
    }
}

/* Plans step S: its pieces, the slots of preempted requests released. Returns the piece count. */
static int plan(mk_engine *e, estep *S) {
    int np = 0;
    S->n = mk_sched_step(e->sched, S->items, e->o.max_num_seqs, e->preempted, &np);
    for (int i = 0; i < np; i++) slot_release(e, (mk_ereq *)e->preempted[i]->owner);
    S->committed = 0;
    return S->n;
}

/* Without asynchronous scheduling a step runs here to the end (mk_model_forward_batch: a CPU
 * model fills every logits row and the host samples every token, as before). */
static void launch(mk_engine *e, estep *S) {
    S->err.msg[0] = 0;
    S->launched = e->async;
    S->rc = e->async ? mk_model_batch_launch(e->m, e->kv, S->bitems, S->n, &S->err)
                     : mk_model_forward_batch(e->m, e->kv, S->bitems, S->n, &S->err);
}

/* Waits for launched step S and applies its results: failures end their requests, each token is
 * sampled (or taken from the model's pick), appended (or replaces its placeholder: S was
 * committed when the next step was chained), sent, and checked for a stop. */
static void collect(mk_engine *e, estep *S) {
    mk_err err = {0};
    if (S->launched) mk_model_batch_wait(e->m, e->kv, S->bitems, S->n, &err);
    S->launched = 0;
    if (!err.msg[0] && S->err.msg[0]) err = S->err;
    const int n = S->n;
    e->items = S->items;
    e->bitems = S->bitems;
    for (int i = 0; i < n; i++) S->items[i].failed = S->bitems[i].status != MK_OK;
    if (!S->committed) mk_sched_commit(e->sched, S->items, n);
    pthread_mutex_lock(&e->mu);
    e->st.steps++;
    pthread_mutex_unlock(&e->mu);
    /* the tokens: the model's argmax, or the sampler on the host (in parallel), then in order */
    int ns = 0;
    for (int i = 0; i < n; i++) {
        if (!S->items[i].req || S->bitems[i].status || !S->items[i].logits) continue;
        e->serr[i].msg[0] = 0;
        if (S->bitems[i].argmax_done)
            e->src[i] = mk_sampler_take(((mk_ereq *)S->items[i].req->owner)->smp, *S->bitems[i].argmax, &e->sout[i],
                                        &e->serr[i]);
        else
            e->sidx[ns++] = i;
    }
    if (ns > 1 && e->spool) mk_pool_run(e->spool, ns, sample_task, e);
    else
        for (int j = 0; j < ns; j++) sample_task(e, j, 0);
    for (int i = 0; i < n; i++) {
        mk_sched_item *it = &S->items[i];
        if (!it->req) continue; /* its request left after this step was queued */
        mk_ereq *r = it->req->owner;
        if (S->bitems[i].status) {
            finish(e, r, MK_EFIN_ERROR, err.msg[0] ? err.msg : mk_status_str(S->bitems[i].status));
            continue;
        }
        if (!it->logits) continue;
        ev_item ev = {.type = MK_EV_TOKEN, .tok = e->sout[i]};
        if (e->src[i]) {
            finish(e, r, MK_EFIN_ERROR, e->serr[i].msg);
            continue;
        }
        mk_sampler_accept(r->smp, ev.tok.token);
        if (S->committed) r->sr.tokens[it->start + it->n] = ev.tok.token; /* the placeholder */
        else mk_sched_append(e->sched, &r->sr, ev.tok.token);
        if (r->n_gen == 0) {
            pthread_mutex_lock(&e->mu);
            e->st.prompt_tokens_total += (uint64_t)r->n_prompt;
            pthread_mutex_unlock(&e->mu);
        }
        r->n_gen++;
        ev.t = mk_now();
        push_ev(r, &ev);
        pthread_mutex_lock(&e->mu);
        e->st.generation_tokens_total++;
        e->st.model_argmax_tokens += S->bitems[i].argmax_done != 0;
        pthread_mutex_unlock(&e->mu);
        if (mk_sampler_is_stop_token(r->smp, ev.tok.token)) finish(e, r, MK_EFIN_STOP, NULL);
        else if (r->n_gen >= r->max_tokens) finish(e, r, MK_EFIN_LENGTH, NULL);
    }
    S->n = 0;
    pthread_mutex_lock(&e->mu);
    stats_sync(e);
    pthread_mutex_unlock(&e->mu);
}

/* Whether the step after S (in flight) can be planned and launched before S is collected. */
static int chainable(mk_engine *e, const estep *S, double now) {
    if (!e->async || S->rc || !S->n) return 0;
    mk_sched_stats ss;
    mk_sched_stats_get(e->sched, &ss);
    if (ss.waiting || ss.running != S->n) return 0;
    for (mk_ereq *r = e->active; r; r = r->next)
        if (atomic_load(&r->cancel) || (r->timeout_s > 0 && now - r->info.t_submit > r->timeout_s)) return 0;
    const int bt = e->caps.block_tokens;
    for (int i = 0; i < S->n; i++) {
        const mk_sched_item *it = &S->items[i];
        const mk_batch_item *b = &S->bitems[i];
        if (!it->req || it->n != 1 || !it->logits || !b->argmax || b->status) return 0;
        if (b->draw && (b->draw->n_adj || !e->caps.picks)) return 0; /* a plain draw, by the model */
        const mk_ereq *r = it->req->owner;
        if (r->n_gen + 1 >= r->max_tokens || (it->start + 1) % bt == 0 || it->req->n_tokens != it->start + 1) return 0;
    }
    return 1;
}

/* One engine step. Returns the pieces launched (0: nothing was schedulable). */
static int step(mk_engine *e) {
    double now = mk_now();
    estep *P = e->inflight;
    if (P && chainable(e, P, now)) {
        mk_sched_commit(e->sched, P->items, P->n); /* optimistic: nothing to register (chainable) */
        P->committed = 1;
        for (int i = 0; i < P->n; i++) mk_sched_append(e->sched, P->items[i].req, 0); /* placeholders */
        estep *Q = &e->es[P == &e->es[0]];
        int n = plan(e, Q), same = n == P->n;
        for (int i = 0; same && i < n; i++)
            same = Q->items[i].req == P->items[i].req && Q->items[i].n == 1 && Q->items[i].logits &&
                   Q->items[i].start == P->items[i].start + 1 && Q->items[i].copy_from < 0;
        if (same) {
            build(e, Q, 1);
            launch(e, Q);
            collect(e, P);
            e->inflight = Q;
            pthread_mutex_lock(&e->mu);
            e->st.chained_steps++;
            pthread_mutex_unlock(&e->mu);
            return n;
        }
        /* not the expected plan (cannot happen with the checks above): the step in flight first
         * (its tokens replace the placeholders), then this plan as a step of its own, without the
         * pieces of requests that ended there */
        collect(e, P);
        e->inflight = NULL;
        int k = 0;
        for (int i = 0; i < Q->n; i++)
            if (Q->items[i].req) Q->items[k++] = Q->items[i];
        Q->n = k;
        if (!k) return 0;
        build(e, Q, 0);
        launch(e, Q);
        e->inflight = Q;
        if (!e->async) {
            collect(e, Q);
            e->inflight = NULL;
        }
        return k;
    }
    if (P) {
        collect(e, P);
        e->inflight = NULL;
    }
    for (mk_ereq *r = e->active, *nx; r; r = nx) {
        nx = r->next;
        if (atomic_load(&r->cancel)) finish(e, r, MK_EFIN_CANCEL, NULL);
        else if (r->timeout_s > 0 && now - r->info.t_submit > r->timeout_s) finish(e, r, MK_EFIN_TIMEOUT, NULL);
    }
    estep *S = &e->es[0];
    int n = plan(e, S);
    if (!n) return 0;
    build(e, S, 0);
    launch(e, S);
    if (e->async) {
        e->inflight = S;
    } else {
        collect(e, S);
    }
    return n;
}

/* Prompts of requests in the incoming list are parked in their token buffers already. */
static void *engine_main(void *arg) {
    mk_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->incoming && !e->active && !e->inflight && !e->stopping) pthread_cond_wait(&e->cv, &e->mu);
        mk_ereq *in = e->incoming;
        e->incoming = NULL;
        e->n_incoming = 0;
        int stop = e->stopping;
        pthread_mutex_unlock(&e->mu);
        /* oldest first: the incoming list is newest first */
        mk_ereq *rev = NULL;
        while (in) { mk_ereq *nx = in->next; in->next = rev; rev = in; in = nx; }
        for (mk_ereq *r = rev, *nx; r; r = nx) {
            nx = r->next;
            take_in(e, r, r->sr.tokens);
        }
        if (stop) {
            if (e->inflight) collect(e, e->inflight);
            e->inflight = NULL;
            break;
        }
        if (!step(e) && e->active) { /* nothing schedulable now (cannot last): do not spin */
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    while (e->active) finish(e, e->active, MK_EFIN_CANCEL, NULL);
    return NULL;
}

int mk_engine_create(mk_model *m, const mk_engine_options *o, mk_engine **out, mk_err *err) {
    *out = NULL;
    if (o->max_num_seqs < 1 || o->max_num_seqs > 4096)
        return mk_fail(err, MK_EINVAL, "max_num_seqs must be in [1, 4096], got %d", o->max_num_seqs);
    if (o->max_model_len < 16)
        return mk_fail(err, MK_EINVAL, "max_model_len must be >= 16, got %d", o->max_model_len);
    if (o->max_waiting < 0) return mk_fail(err, MK_EINVAL, "max_waiting must be >= 0, got %d", o->max_waiting);
    if (o->max_num_batched_tokens < 0 || o->long_prefill_token_threshold < 0)
        return mk_fail(err, MK_EINVAL, "max_num_batched_tokens and long_prefill_token_threshold must be >= 0");
    mk_engine *e = calloc(1, sizeof *e);
    if (!e) return mk_fail(err, MK_ENOMEM, "out of memory");
    e->m = m;
    e->o = *o;
    e->vocab = mk_model_vocab_size(m);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    /* the token budget of a step, which also sizes the GPU's step scratch (a family without
     * chunked prefill gets it raised to max_model_len below; the GPU's has chunked prefill) */
    const int budget = o->max_num_batched_tokens ? o->max_num_batched_tokens
                                                 : (o->max_model_len > 2048 ? o->max_model_len : 2048);
    mk_kvcache_options ko = {.n_slots = o->max_num_seqs, .max_model_len = o->max_model_len, .kv_bytes = o->kv_bytes,
                             .max_rows = budget};
    int rc = mk_kvcache_create(m, &ko, &e->kv, err);
    if (rc) goto fail;
    mk_kvcache_caps_get(e->kv, &e->caps);
    mk_sched_opts so = {.max_num_seqs = o->max_num_seqs,
                        .max_num_batched_tokens = budget,
                        .long_prefill_token_threshold = o->long_prefill_token_threshold ? o->long_prefill_token_threshold : 512,
                        .replay = e->caps.replay,
                        .prefix_caching = e->caps.prefix_caching && !o->no_prefix_caching,
                        .no_partial_hits = !e->caps.partial_hits};
    if (!e->caps.chunked_prefill) { /* the whole prompt in one piece */
        so.long_prefill_token_threshold = 0;
        if (so.max_num_batched_tokens < o->max_model_len) so.max_num_batched_tokens = o->max_model_len;
    }
    e->o.max_num_batched_tokens = so.max_num_batched_tokens;
    e->o.long_prefill_token_threshold = so.long_prefill_token_threshold;
    if ((rc = mk_sched_create(&so, mk_kvcache_pool(e->kv), &e->sched, err))) goto fail;
    e->slot = calloc((size_t)e->caps.n_slots, sizeof *e->slot);
    e->logits = mk_kvcache_host_floats(e->kv, (size_t)e->vocab * (size_t)o->max_num_seqs);
    e->argmax = calloc(2 * (size_t)o->max_num_seqs, sizeof *e->argmax);
    e->model_argmax = !(getenv("MINKE_MODEL_ARGMAX") && atoi(getenv("MINKE_MODEL_ARGMAX")) == 0);
    e->draws = calloc(2 * (size_t)o->max_num_seqs, sizeof *e->draws);
    e->model_draw = !(getenv("MINKE_MODEL_DRAW") && atoi(getenv("MINKE_MODEL_DRAW")) == 0);
    /* (only for a model that picks tokens: a CPU model's steps are all sampled on the host, so their
     * lists of adjusted tokens would be built for nothing) */
    e->model_adjust = e->caps.picks && !(getenv("MINKE_MODEL_ADJUST") && atoi(getenv("MINKE_MODEL_ADJUST")) == 0);
    e->adj = e->model_adjust ? calloc(2 * (size_t)o->max_num_seqs * MK_SAMPLE_ADJ_MAX, sizeof *e->adj) : NULL;
    e->sidx = calloc((size_t)o->max_num_seqs, sizeof *e->sidx);
    e->sout = calloc((size_t)o->max_num_seqs, sizeof *e->sout);
    e->src = calloc((size_t)o->max_num_seqs, sizeof *e->src);
    e->serr = calloc((size_t)o->max_num_seqs, sizeof *e->serr);
    if (o->max_num_seqs > 1) { /* a vocabulary-wide sampling step costs 0.2-3 ms on one core */
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        int nt = nc < 1 ? 1 : nc > 16 ? 16 : (int)nc;
        if (nt > o->max_num_seqs) nt = o->max_num_seqs;
        if (nt > 1) e->spool = mk_pool_create(nt); /* NULL (out of memory): sampled on one thread */
    }
    e->items = e->items_all = calloc(2 * (size_t)o->max_num_seqs, sizeof *e->items);
    e->bitems = e->bitems_all = calloc(2 * (size_t)o->max_num_seqs, sizeof *e->bitems);
    e->preempted = calloc((size_t)o->max_num_seqs, sizeof *e->preempted);
    if (!e->slot || !e->logits || !e->argmax || !e->draws || !e->sidx || !e->sout || !e->src || !e->serr || !e->items || !e->bitems || !e->preempted || (e->model_adjust && !e->adj)) { rc = mk_fail(err, MK_ENOMEM, "out of memory"); goto fail; }
    for (int s = 0; s < 2; s++) {
        const size_t k = (size_t)s * (size_t)o->max_num_seqs;
        e->es[s] = (estep){.items = e->items_all + k, .bitems = e->bitems_all + k, .argmax = e->argmax + k,
                           .draws = e->draws + k, .adj = e->adj ? e->adj + k * MK_SAMPLE_ADJ_MAX : NULL};
    }
    /* asynchronous scheduling: on where the model's steps run asynchronously (the GPU), unless
     * turned off; forced on, a CPU model runs each step at its launch (tests) */
    e->async = o->async_scheduling > 0 || (o->async_scheduling == 0 && e->caps.async);
    e->st.max_num_seqs = o->max_num_seqs;
    e->st.max_model_len = o->max_model_len;
    e->st.kv_blocks = e->caps.n_blocks;
    e->st.kv_block_tokens = e->caps.block_tokens;
    if (pthread_create(&e->th, NULL, engine_main, e)) { rc = mk_fail(err, MK_ENOMEM, "engine: cannot start its thread"); goto fail; }
    e->started = 1;
    *out = e;
    return MK_OK;
fail:
    mk_engine_free(e);
    return rc;
}

void mk_engine_drain(mk_engine *e) {
    pthread_mutex_lock(&e->mu);
    e->draining = 1;
    pthread_mutex_unlock(&e->mu);
}

void mk_engine_free(mk_engine *e) {
    if (!e) return;
    if (e->started) {
        pthread_mutex_lock(&e->mu);
        e->stopping = e->draining = 1;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->th, NULL);
    }
    mk_sched_free(e->sched);
    mk_kvcache_host_free(e->kv, e->logits);
    mk_kvcache_free(e->kv);
    free(e->slot);
    free(e->argmax);
    free(e->draws);
    free(e->adj);
    mk_pool_free(e->spool);
    free(e->sidx);
    free(e->sout);
    free(e->src);
    free(e->serr);
    free(e->items_all);
    free(e->bitems_all);
    free(e->preempted);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

int mk_engine_submit(mk_engine *e, const mk_ereq_params *p, mk_ereq **out, mk_err *err) {
    *out = NULL;
    if (p->n_prompt < 1) return mk_fail(err, MK_EINVAL, "the prompt is empty");
    if (p->max_tokens < 1) return mk_fail(err, MK_EINVAL, "max_tokens must be >= 1, got %d", p->max_tokens);
    if ((long)p->n_prompt + p->max_tokens > e->o.max_model_len)
        return mk_fail(err, MK_ERANGE,
                       "this model's maximum context length is %d tokens; the request has %d prompt tokens and asks for %d more",
                       e->o.max_model_len, p->n_prompt, p->max_tokens);
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= e->vocab)
            return mk_fail(err, MK_ERANGE, "prompt token %d at index %d is outside the vocabulary [0, %d)", p->prompt[i], i, e->vocab);
    if (p->timeout_s < 0) return mk_fail(err, MK_EINVAL, "timeout must be >= 0");
    int rc = mk_sampling_validate(&p->sampling, e->vocab, err);
    if (rc) return rc;
    mk_ereq *r = calloc(1, sizeof *r);
    if (!r) return mk_fail(err, MK_ENOMEM, "out of memory");
    atomic_fetch_add(&g_live, 1);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    int fail = 0;
    if (mk_sreq_init(&r->sr, p->n_prompt + p->max_tokens, e->caps.block_tokens, err)) fail = 1;
    else {
        memcpy(r->sr.tokens, p->prompt, sizeof(int32_t) * (size_t)p->n_prompt);
        r->sr.n_tokens = r->sr.n_prompt = p->n_prompt;
        r->sr.priority = p->priority;
        r->sr.salt = p->cache_salt && *p->cache_salt ? mk_kv_hash_bytes(p->cache_salt, strlen(p->cache_salt)) : 0;
        r->sr.owner = r;
    }
    r->n_prompt = p->n_prompt;
    r->sp = p->sampling;
    r->bias_ids = dup_arr(p->sampling.bias_ids, (size_t)p->sampling.n_bias, sizeof(int32_t), &fail);
    r->bias_vals = dup_arr(p->sampling.bias_vals, (size_t)p->sampling.n_bias, sizeof(float), &fail);
    r->stop_ids = dup_arr(p->sampling.stop_ids, (size_t)p->sampling.n_stop_ids, sizeof(int32_t), &fail);
    r->eos = dup_arr(p->eos_ids, (size_t)p->n_eos, sizeof(int32_t), &fail);
    r->sp.bias_ids = r->bias_ids;
    r->sp.bias_vals = r->bias_vals;
    r->sp.stop_ids = r->stop_ids;
    r->n_eos = p->n_eos;
    r->max_tokens = p->max_tokens;
    r->timeout_s = p->timeout_s;
    r->cap = 32;
    r->ring = malloc(sizeof *r->ring * (size_t)r->cap);
    r->slot = -1;
    r->refs = 2; /* producer + engine */
    r->info.n_prompt = p->n_prompt;
    r->info.t_submit = mk_now();
    if (fail || !r->ring) {
        req_free(r);
        return mk_fail(err, MK_ENOMEM, "out of memory");
    }
    pthread_mutex_lock(&e->mu);
    if (e->draining || e->stopping) {
        pthread_mutex_unlock(&e->mu);
        req_free(r);
        return mk_fail(err, MK_EBUSY, "the server is shutting down");
    }
    int free_slots = e->o.max_num_seqs - e->st.running;
    if (e->st.waiting >= e->o.max_waiting + (free_slots > 0 ? free_slots : 0)) {
        int w = e->st.waiting;
        pthread_mutex_unlock(&e->mu);
        req_free(r);
        return mk_fail(err, MK_EBUSY, "the engine's queue is full (%d requests waiting)", w);
    }
    r->sr.arrival = e->next_order++;
    r->next = e->incoming;
    e->incoming = r;
    e->n_incoming++;
    e->st.waiting++;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    *out = r;
    return MK_OK;
}

void mk_engine_stats_get(mk_engine *e, mk_engine_stats *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->st;
    pthread_mutex_unlock(&e->mu);
    out->live_handles = atomic_load(&g_live);
}
