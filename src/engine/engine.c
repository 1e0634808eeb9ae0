/* engine.c — the engine thread, its waiting list and sequence slots, and per-request event queues
 * (engine.h).
 *
 * Locks: e->mu guards the waiting list, the draining/stopping flags and the statistics; each
 * request's r->mu guards its event ring and reference count. The engine never holds e->mu while it
 * runs a forward pass, so submit and stats stay cheap during long steps. Lock order: e->mu before
 * r->mu (only mk_engine_submit and the admission scan take both).
 *
 * Memory: slots (one mk_seq each) and the logits buffer are allocated at create. A request's
 * sampler is created when it is admitted and freed when it leaves; its event ring starts at 32
 * entries and doubles only when the producer falls behind.
 */
#include "engine/engine.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    int32_t *prompt;
    int n_prompt;
    mk_sampling_params sp;
    int32_t *bias_ids, *stop_ids, *eos;
    float *bias_vals;
    int n_eos, max_tokens, priority;
    double timeout_s;
    uint64_t order;
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
    mk_sampler *smp;
    int slot, n_gen;
    int32_t last;
    struct mk_ereq *next; /* waiting list */
};

struct mk_engine {
    mk_model *m;
    mk_engine_options o;
    mk_seq **seqs;
    mk_ereq **slot;
    float *logits;
    int vocab;
    pthread_t th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    mk_ereq *waiting;
    int n_waiting, n_running, draining, stopping;
    uint64_t next_order;
    mk_engine_stats st;
};

static atomic_int g_live; /* mk_ereq objects alive in the process */

/* ---- requests ------------------------------------------------------------------------------- */

static void req_free(mk_ereq *r) {
    mk_sampler_free(r->smp);
    free(r->prompt);
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

/* Ends a request: FINISH event, statistics, slot released, the engine's reference dropped.
 * Called by the engine thread without e->mu held. */
static void finish(mk_engine *e, mk_ereq *r, mk_efinish why, const char *msg) {
    if (msg) {
        pthread_mutex_lock(&r->mu);
        snprintf(r->msg, sizeof r->msg, "%s", msg);
        pthread_mutex_unlock(&r->mu);
    }
    ev_item ev = {.type = MK_EV_FINISH, .finish = why, .t = mk_now()};
    push_ev(r, &ev);
    mk_sampler_free(r->smp);
    r->smp = NULL;
    pthread_mutex_lock(&e->mu);
    if (r->slot >= 0) {
        e->slot[r->slot] = NULL;
        e->n_running--;
        e->st.slots_in_use--;
    }
    e->st.finished_total[why]++;
    pthread_mutex_unlock(&e->mu);
    r->slot = -1;
    req_unref(r);
}

/* One step of one running request: its prefill (first step) or one decode, then sampling. */
static void step_one(mk_engine *e, mk_ereq *r) {
    if (atomic_load(&r->cancel)) { finish(e, r, MK_EFIN_CANCEL, NULL); return; }
    if (r->timeout_s > 0 && mk_now() - r->info.t_submit > r->timeout_s) {
        finish(e, r, MK_EFIN_TIMEOUT, NULL);
        return;
    }
    mk_err err = {0};
    mk_seq *s = e->seqs[r->slot];
    int rc;
    if (!r->smp) {
        rc = mk_sampler_create(&r->sp, e->vocab, r->eos, r->n_eos, r->prompt, r->n_prompt, &r->smp, &err);
        if (!rc) {
            mk_seq_reset(s);
            rc = mk_seq_forward(s, r->prompt, r->n_prompt, e->logits, &err);
        }
        if (!rc) {
            pthread_mutex_lock(&r->mu);
            r->info.seed = mk_sampler_seed(r->smp);
            pthread_mutex_unlock(&r->mu);
            pthread_mutex_lock(&e->mu);
            e->st.prompt_tokens_total += (uint64_t)r->n_prompt;
            pthread_mutex_unlock(&e->mu);
        }
    } else {
        rc = mk_seq_forward(s, &r->last, 1, e->logits, &err);
    }
    ev_item ev = {.type = MK_EV_TOKEN};
    if (!rc) rc = mk_sampler_sample(r->smp, e->logits, &ev.tok, &err);
    if (rc) { finish(e, r, MK_EFIN_ERROR, err.msg); return; }
    mk_sampler_accept(r->smp, ev.tok.token);
    r->last = ev.tok.token;
    r->n_gen++;
    ev.t = mk_now();
    push_ev(r, &ev);
    pthread_mutex_lock(&e->mu);
    e->st.generation_tokens_total++;
    pthread_mutex_unlock(&e->mu);
    if (mk_sampler_is_stop_token(r->smp, ev.tok.token)) finish(e, r, MK_EFIN_STOP, NULL);
    else if (r->n_gen >= r->max_tokens) finish(e, r, MK_EFIN_LENGTH, NULL);
}

/* Removes cancelled or timed-out waiting requests (e->mu held); returns them chained for finish. */
static mk_ereq *reap_waiting(mk_engine *e, double now) {
    mk_ereq *dead = NULL, **pp = &e->waiting;
    while (*pp) {
        mk_ereq *r = *pp;
        int gone = atomic_load(&r->cancel) || e->stopping ||
                   (r->timeout_s > 0 && now - r->info.t_submit > r->timeout_s);
        if (gone) {
            *pp = r->next;
            r->next = dead;
            dead = r;
            e->n_waiting--;
        } else {
            pp = &r->next;
        }
    }
    return dead;
}

static void finish_chain(mk_engine *e, mk_ereq *dead) {
    while (dead) {
        mk_ereq *n = dead->next;
        mk_efinish why = MK_EFIN_CANCEL;
        if (!atomic_load(&dead->cancel) && !e->stopping && dead->timeout_s > 0) why = MK_EFIN_TIMEOUT;
        finish(e, dead, why, NULL);
        dead = n;
    }
}

static void *engine_main(void *arg) {
    mk_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        mk_ereq *dead = reap_waiting(e, mk_now());
        if (dead) {
            pthread_mutex_unlock(&e->mu);
            finish_chain(e, dead);
            pthread_mutex_lock(&e->mu);
            continue;
        }
        if (e->stopping) break;
        /* admit FCFS (the list is kept in priority, then arrival order) */
        for (int i = 0; i < e->o.max_num_seqs && e->waiting; i++) {
            if (e->slot[i]) continue;
            mk_ereq *r = e->waiting;
            e->waiting = r->next;
            r->next = NULL;
            e->n_waiting--;
            e->slot[i] = r;
            r->slot = i;
            e->n_running++;
            e->st.slots_in_use++;
            pthread_mutex_lock(&r->mu);
            r->info.t_admit = mk_now();
            pthread_mutex_unlock(&r->mu);
        }
        if (!e->n_running) {
            pthread_cond_wait(&e->cv, &e->mu);
            continue;
        }
        e->st.steps++;
        pthread_mutex_unlock(&e->mu);
        for (int i = 0; i < e->o.max_num_seqs; i++)
            if (e->slot[i]) step_one(e, e->slot[i]);
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    /* stopping: cancel whatever still runs */
    for (int i = 0; i < e->o.max_num_seqs; i++)
        if (e->slot[i]) finish(e, e->slot[i], MK_EFIN_CANCEL, NULL);
    return NULL;
}

int mk_engine_create(mk_model *m, const mk_engine_options *o, mk_engine **out, mk_err *err) {
    *out = NULL;
    if (o->max_num_seqs < 1 || o->max_num_seqs > 4096)
        return mk_fail(err, MK_EINVAL, "max_num_seqs must be in [1, 4096], got %d", o->max_num_seqs);
    if (o->max_model_len < 16)
        return mk_fail(err, MK_EINVAL, "max_model_len must be >= 16, got %d", o->max_model_len);
    if (o->max_waiting < 0) return mk_fail(err, MK_EINVAL, "max_waiting must be >= 0, got %d", o->max_waiting);
    mk_engine *e = calloc(1, sizeof *e);
    if (!e) return mk_fail(err, MK_ENOMEM, "out of memory");
    e->m = m;
    e->o = *o;
    e->vocab = mk_model_vocab_size(m);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->seqs = calloc((size_t)o->max_num_seqs, sizeof *e->seqs);
    e->slot = calloc((size_t)o->max_num_seqs, sizeof *e->slot);
    e->logits = malloc(sizeof(float) * (size_t)e->vocab);
    int rc = MK_OK;
    if (!e->seqs || !e->slot || !e->logits) { rc = mk_fail(err, MK_ENOMEM, "out of memory"); goto fail; }
    for (int i = 0; i < o->max_num_seqs; i++) {
        if ((rc = mk_seq_create(m, o->max_model_len, &e->seqs[i], err))) {
            mk_err_prefix(err, "engine: sequence slot %d of %d (max_model_len %d)", i, o->max_num_seqs, o->max_model_len);
            goto fail;
        }
        if (mk_seq_capacity(e->seqs[i]) < o->max_model_len) {
            rc = mk_fail(err, MK_ERANGE, "engine: max_model_len %d exceeds the model's context %d", o->max_model_len,
                         mk_seq_capacity(e->seqs[i]));
            goto fail;
        }
    }
    e->st.max_num_seqs = o->max_num_seqs;
    e->st.max_model_len = o->max_model_len;
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
    if (e->seqs)
        for (int i = 0; i < e->o.max_num_seqs; i++) mk_seq_free(e->seqs[i]);
    free(e->seqs);
    free(e->slot);
    free(e->logits);
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
    r->prompt = dup_arr(p->prompt, (size_t)p->n_prompt, sizeof(int32_t), &fail);
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
    r->priority = p->priority;
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
    int free_slots = e->o.max_num_seqs - e->n_running;
    if (e->n_waiting >= e->o.max_waiting + (free_slots > 0 ? free_slots : 0)) {
        int w = e->n_waiting;
        pthread_mutex_unlock(&e->mu);
        req_free(r);
        return mk_fail(err, MK_EBUSY, "the engine's queue is full (%d requests waiting)", w);
    }
    r->order = e->next_order++;
    mk_ereq **pp = &e->waiting;
    while (*pp && ((*pp)->priority < r->priority || ((*pp)->priority == r->priority && (*pp)->order < r->order)))
        pp = &(*pp)->next;
    r->next = *pp;
    *pp = r;
    e->n_waiting++;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    *out = r;
    return MK_OK;
}

void mk_engine_stats_get(mk_engine *e, mk_engine_stats *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->st;
    out->running = e->n_running;
    out->waiting = e->n_waiting;
    pthread_mutex_unlock(&e->mu);
    out->live_handles = atomic_load(&g_live);
}
