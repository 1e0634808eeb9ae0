/* runner.c — sending the requests of a benchmark run and measuring each one (bench.h).
 *
 * List workloads (random, prefix-repetition, ShareGPT): the arrival times come from
 * mk_bench_arrivals; W worker threads (W = --max-concurrency, or one per request without a cap)
 * take request indices in order, wait until the request's arrival time and send it. A request that
 * arrives while W are in flight waits for a free worker, and its latencies count from when it is
 * actually sent, as vLLM's semaphore does. Agentic: --agentic-lanes lane threads each run whole
 * sessions one after another (the load is the number of lanes); a session that spawns sub-agents
 * runs them on threads of their own and waits for them, so the concurrency rises above the lanes
 * while they run.
 *
 * One request = one blocking streamed POST on the worker's own curl handle (http_client.h); the SSE
 * callback timestamps each chunk that carries generated content, and reads usage from the final
 * chunk (stream_options.include_usage). A request fails (with the reason kept) on a transport error,
 * a status other than 200, an error object in the stream, or a stream that ends without [DONE].
 */
#include "base/status.h"
#include "bench/bench.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void mk_bench_results_free(mk_bench_results *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) free(r->reqs[i].chunk_t);
    free(r->reqs);
    memset(r, 0, sizeof *r);
}

static void sleep_until(double t) {
    for (;;) {
        double d = t - mk_bench_now();
        if (d <= 0) return;
        struct timespec ts = {(time_t)d, (long)((d - floor(d)) * 1e9)};
        if (!nanosleep(&ts, NULL)) return;
        if (errno != EINTR) return;
    }
}

/* ---- one request --------------------------------------------------------------------------- */

typedef struct {
    mk_bench_req *rec;
    double send; /* absolute send time */
    double *t;   /* content chunk times (relative to send) */
    int n, cap;
    char *answer; /* generated text so far */
    size_t alen, acap;
    int done, oom;
    char stream_err[200];
} stream_state;

static void answer_add(stream_state *s, const char *p) {
    size_t n = strlen(p);
    if (!n || s->oom) return;
    if (s->alen + n + 1 > s->acap) {
        size_t cap = s->acap ? s->acap * 2 : 1024;
        while (cap < s->alen + n + 1) cap *= 2;
        char *q = realloc(s->answer, cap);
        if (!q) {
            s->oom = 1;
            return;
        }
        s->answer = q;
        s->acap = cap;
    }
    memcpy(s->answer + s->alen, p, n + 1);
    s->alen += n;
}

static int nonempty(json_t *v) {
    return (json_is_string(v) && json_string_length(v) > 0) || (json_is_array(v) && json_array_size(v) > 0);
}

static void on_event(void *ctx, const char *data, size_t len, double t) {
    stream_state *s = ctx;
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        s->done = 1;
        return;
    }
    json_t *j = json_loadb(data, len, JSON_ALLOW_NUL, NULL); /* text may hold U+0000 */
    if (!j) {
        if (!s->stream_err[0]) snprintf(s->stream_err, sizeof s->stream_err, "malformed chunk: %.120s", data);
        return;
    }
    json_t *e = json_object_get(j, "error");
    if (e && !s->stream_err[0]) {
        const char *m = json_string_value(json_object_get(e, "message"));
        snprintf(s->stream_err, sizeof s->stream_err, "%.180s", m ? m : json_is_string(e) ? json_string_value(e) : "error");
    }
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    if (c0) {
        json_t *d = json_object_get(c0, "delta");
        json_t *text = json_object_get(c0, "text"), *content = json_object_get(d, "content");
        json_t *reasoning = json_object_get(d, "reasoning_content");
        if (!reasoning) reasoning = json_object_get(d, "reasoning");
        int has = nonempty(text) || nonempty(content) || nonempty(reasoning) || nonempty(json_object_get(d, "tool_calls"));
        if (has) {
            if (s->n == s->cap) {
                int cap = s->cap ? s->cap * 2 : 64;
                double *q = realloc(s->t, sizeof(double) * (size_t)cap);
                if (!q) s->oom = 1;
                else s->t = q, s->cap = cap;
            }
            if (s->n < s->cap) s->t[s->n++] = t - s->send;
            if (json_is_string(text)) answer_add(s, json_string_value(text));
            if (json_is_string(content)) answer_add(s, json_string_value(content));
        }
    }
    json_t *u = json_object_get(j, "usage");
    if (json_is_object(u)) {
        json_t *pt = json_object_get(u, "prompt_tokens"), *ct = json_object_get(u, "completion_tokens");
        if (json_is_integer(pt)) s->rec->prompt_tokens = (int)json_integer_value(pt);
        if (json_is_integer(ct)) {
            s->rec->output_tokens = (int)json_integer_value(ct);
            s->rec->usage_missing = 0;
        }
        json_t *ca = json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens");
        if (json_is_integer(ca)) s->rec->cached_tokens = (int)json_integer_value(ca);
    }
    json_decref(j);
}

char *mk_bench_request_body(const mk_bench_ctx *ctx, const mk_bench_prompt *p) {
    const mk_bench_config *c = ctx->cfg;
    json_t *b = json_object();
    json_object_set_new(b, "model", json_string(ctx->model));
    if (p->messages) {
        json_t *m = json_loads(p->messages, 0, NULL);
        if (!m) {
            json_decref(b);
            return NULL;
        }
        json_object_set_new(b, "messages", m);
    } else if (p->ids) {
        json_t *a = json_array();
        for (int i = 0; i < p->n_ids; i++) json_array_append_new(a, json_integer(p->ids[i]));
        json_object_set_new(b, "prompt", a);
    } else {
        json_object_set_new(b, "prompt", json_string(p->text ? p->text : ""));
    }
    json_object_set_new(b, "max_tokens", json_integer(p->max_tokens));
    json_object_set_new(b, "temperature", json_real(c->temperature));
    if (c->ignore_eos) json_object_set_new(b, "ignore_eos", json_true());
    json_object_set_new(b, "stream", json_true());
    json_object_set_new(b, "stream_options", json_pack("{s:b}", "include_usage", 1));
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

/* An HTTP error body as a short reason: the OpenAI error message when there is one. */
static void http_reason(char *dst, size_t n, long status, const char *body) {
    json_t *j = body ? json_loads(body, 0, NULL) : NULL;
    json_t *e = json_object_get(j, "error");
    const char *m = json_string_value(json_object_get(e, "message"));
    if (!m) m = json_string_value(e);
    if (!m) m = json_string_value(json_object_get(j, "message"));
    if (!m) m = body ? body : "";
    snprintf(dst, n, "HTTP %ld: %.200s", status, m);
    for (char *q = dst; *q; q++)
        if (*q == '\n' || *q == '\r') *q = ' ';
    json_decref(j);
}

/* Sends p and fills rec (its id/session fields are the caller's). *answer (optional) gets the
 * generated text. t0: the run's start (absolute). */
static void send_one(mk_bench_ctx *ctx, mk_bench_http *h, const mk_bench_prompt *p, double t0, mk_bench_req *rec,
                     char **answer) {
    const char *url = ctx->cfg->endpoint == MK_BENCH_EP_CHAT ? ctx->url_chat : ctx->url_completions;
    rec->prompt_tokens = -1;
    rec->cached_tokens = -1;
    rec->usage_missing = 1;
    rec->expected_prompt_tokens = p->expected_prompt;
    rec->expected_output_tokens = p->max_tokens;
    stream_state s = {.rec = rec};
    char *body = mk_bench_request_body(ctx, p);
    if (answer) *answer = NULL;
    if (!body) {
        snprintf(rec->error, sizeof rec->error, "could not build the request body");
        rec->start = mk_bench_now() - t0;
        return;
    }
    long status = 0;
    char *err_body = NULL;
    double t_end = 0;
    mk_err err = {0};
    s.send = mk_bench_now();
    rec->start = s.send - t0;
    int rc = mk_bench_http_stream(h, url, body, ctx->cfg->timeout_s, on_event, &s, &status, &err_body, &t_end, &err);
    free(body);
    rec->e2el = t_end - s.send;
    rec->chunk_t = s.t;
    rec->n_chunks = s.n;
    rec->ttft = s.n ? s.t[0] : 0;
    if (rec->usage_missing) rec->output_tokens = s.n;
    if (rc) snprintf(rec->error, sizeof rec->error, "transport: %.200s", err.msg);
    else if (status != 200) http_reason(rec->error, sizeof rec->error, status, err_body);
    else if (s.oom) snprintf(rec->error, sizeof rec->error, "client out of memory");
    else if (s.stream_err[0]) snprintf(rec->error, sizeof rec->error, "stream error: %s", s.stream_err);
    else if (!s.done) snprintf(rec->error, sizeof rec->error, "stream ended without [DONE]");
    else if (!s.n && rec->output_tokens > 0) snprintf(rec->error, sizeof rec->error, "no content chunk in the stream");
    else rec->ok = 1;
    free(err_body);
    if (answer) *answer = s.answer;
    else free(s.answer);
}

/* ---- list workloads ------------------------------------------------------------------------ */

typedef struct {
    mk_bench_ctx *ctx;
    const mk_bench_prompt *prompts;
    const double *arrive;
    mk_bench_req *reqs;
    int n;
    double t0;
    atomic_int next;
} list_state;

static void *list_worker(void *arg) {
    list_state *st = arg;
    mk_bench_http *h = mk_bench_http_new(st->ctx->cfg->api_key);
    for (;;) {
        int i = atomic_fetch_add(&st->next, 1);
        if (i >= st->n) break;
        mk_bench_req *r = &st->reqs[i];
        r->id = i;
        r->session = -1;
        if (!h) {
            snprintf(r->error, sizeof r->error, "client out of memory");
            continue;
        }
        sleep_until(st->t0 + st->arrive[i]);
        send_one(st->ctx, h, &st->prompts[i], st->t0, r, NULL);
    }
    mk_bench_http_free(h);
    return NULL;
}

/* Starts n threads running fn(arg) with small stacks; returns how many started. */
static int start_threads(pthread_t *th, int n, void *(*fn)(void *), void *arg) {
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, 512 * 1024);
    int k = 0;
    for (; k < n; k++)
        if (pthread_create(&th[k], &a, fn, arg)) break;
    pthread_attr_destroy(&a);
    return k;
}

static int run_list(mk_bench_ctx *ctx, const mk_bench_prompt *prompts, int n, mk_bench_results *out, mk_err *err) {
    const mk_bench_config *c = ctx->cfg;
    list_state st = {.ctx = ctx, .prompts = prompts, .n = n};
    double *arrive = calloc((size_t)n, sizeof(double));
    st.reqs = calloc((size_t)n, sizeof(mk_bench_req));
    int W = c->max_concurrency > 0 && c->max_concurrency < n ? c->max_concurrency : n;
    if (W > 4096) W = 4096; /* past this the client, not the server, would be measured */
    pthread_t *th = calloc((size_t)W, sizeof(pthread_t));
    if (!arrive || !st.reqs || !th) {
        free(arrive);
        free(st.reqs);
        free(th);
        return mk_fail(err, MK_ENOMEM, "out of memory");
    }
    mk_bench_rng g;
    mk_bench_rng_seed(&g, c->seed * 0x9E3779B97F4A7C15ULL + 7);
    mk_bench_arrivals(&g, n, c->request_rate, c->burstiness, arrive);
    st.arrive = arrive;
    atomic_init(&st.next, 0);
    st.t0 = mk_bench_now();
    int started = start_threads(th, W, list_worker, &st);
    if (started == 0) list_worker(&st); /* no thread could start: send from here */
    for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
    out->duration = mk_bench_now() - st.t0;
    out->reqs = st.reqs;
    out->n = n;
    out->concurrency = c->max_concurrency;
    free(arrive);
    free(th);
    return MK_OK;
}

/* ---- agentic ------------------------------------------------------------------------------- */

typedef struct {
    mk_bench_ctx *ctx;
    double t0;
    atomic_int next_session;
    atomic_int stop; /* a workload error: every lane stops */
    pthread_mutex_t mu;
    mk_bench_req *reqs; /* guarded by mu */
    int n, cap;
    long reused, total;
    mk_err fatal;
} ag_state;

typedef struct {
    ag_state *st;
    int index, sub;
    char *last_answer; /* out: the session's final answer */
} sess_job;

static void *session_thread(void *arg);

static void fatal(ag_state *st, const mk_err *e) {
    pthread_mutex_lock(&st->mu);
    if (!atomic_load(&st->stop)) st->fatal = *e;
    atomic_store(&st->stop, 1);
    pthread_mutex_unlock(&st->mu);
}

/* Runs one session (and its sub-agents) to its end on handle h. */
static void run_session(ag_state *st, mk_bench_http *h, sess_job *job) {
    mk_err err = {0};
    mk_bench_session *s;
    if (mk_bench_session_new(st->ctx, h, job->index, job->sub, &s, &err)) {
        fatal(st, &err);
        return;
    }
    double resume = 0; /* absolute time the think time ends */
    for (int turn = 0; !atomic_load(&st->stop); turn++) {
        mk_bench_prompt p;
        int rc = mk_bench_session_next(s, h, &p, &err);
        if (rc == 1) break;
        if (rc) {
            fatal(st, &err);
            break;
        }
        sleep_until(resume);
        mk_bench_req rec = {0};
        char *answer = NULL;
        send_one(st->ctx, h, &p, st->t0, &rec, &answer);
        mk_bench_prompt_free(&p);
        rec.session = job->index;
        rec.turn = turn;
        rec.subagent = job->sub;
        int ok = rec.ok;
        pthread_mutex_lock(&st->mu);
        if (st->n == st->cap) {
            int cap = st->cap ? st->cap * 2 : 256;
            mk_bench_req *q = realloc(st->reqs, sizeof *q * (size_t)cap);
            if (q) st->reqs = q, st->cap = cap;
        }
        if (st->n < st->cap) {
            rec.id = st->n;
            st->reqs[st->n++] = rec;
        } else {
            free(rec.chunk_t);
        }
        pthread_mutex_unlock(&st->mu);
        if (!ok) { /* the history would miss an answer: the session ends here */
            free(answer);
            break;
        }
        /* sub-agents: each a session of its own on its own thread; their answers come back in the
         * next tool result */
        int k = mk_bench_session_spawns(s);
        char *extra = NULL;
        if (k > 0) {
            sess_job *jobs = calloc((size_t)k, sizeof *jobs);
            pthread_t *th = calloc((size_t)k, sizeof *th);
            int started = 0;
            if (jobs && th) {
                for (int j = 0; j < k; j++) jobs[j] = (sess_job){st, job->index, j + 1, NULL};
                pthread_attr_t a;
                pthread_attr_init(&a);
                pthread_attr_setstacksize(&a, 512 * 1024);
                for (; started < k; started++)
                    if (pthread_create(&th[started], &a, session_thread, &jobs[started])) break;
                pthread_attr_destroy(&a);
                for (int j = 0; j < started; j++) pthread_join(th[j], NULL);
                size_t len = 1;
                for (int j = 0; j < started; j++) len += jobs[j].last_answer ? strlen(jobs[j].last_answer) + 1 : 0;
                extra = calloc(1, len);
                for (int j = 0; j < started && extra; j++)
                    if (jobs[j].last_answer) strcat(strcat(extra, jobs[j].last_answer), "\n");
                for (int j = 0; j < started; j++) free(jobs[j].last_answer);
            }
            free(jobs);
            free(th);
        }
        rc = mk_bench_session_advance(s, h, answer, extra, &err);
        free(extra);
        free(job->last_answer);
        job->last_answer = answer;
        if (rc) {
            fatal(st, &err);
            break;
        }
        resume = mk_bench_now() + mk_bench_session_think(s);
    }
    long reused, total;
    mk_bench_session_reuse(s, &reused, &total);
    pthread_mutex_lock(&st->mu);
    st->reused += reused;
    st->total += total;
    pthread_mutex_unlock(&st->mu);
    mk_bench_session_free(s);
}

static void *session_thread(void *arg) {
    sess_job *job = arg;
    mk_bench_http *h = mk_bench_http_new(job->st->ctx->cfg->api_key);
    if (h) run_session(job->st, h, job);
    mk_bench_http_free(h);
    return NULL;
}

static void *lane_thread(void *arg) {
    ag_state *st = arg;
    mk_bench_http *h = mk_bench_http_new(st->ctx->cfg->api_key);
    if (!h) return NULL;
    for (;;) {
        int i = atomic_fetch_add(&st->next_session, 1);
        if (i >= st->ctx->cfg->ag_sessions || atomic_load(&st->stop)) break;
        sess_job job = {st, i, 0, NULL};
        run_session(st, h, &job);
        free(job.last_answer);
    }
    mk_bench_http_free(h);
    return NULL;
}

static int run_agentic(mk_bench_ctx *ctx, mk_bench_results *out, mk_err *err) {
    const mk_bench_config *c = ctx->cfg;
    ag_state st = {.ctx = ctx};
    pthread_mutex_init(&st.mu, NULL);
    atomic_init(&st.next_session, 0);
    atomic_init(&st.stop, 0);
    int L = c->ag_lanes;
    pthread_t *th = calloc((size_t)L, sizeof *th);
    if (!th) return mk_fail(err, MK_ENOMEM, "out of memory");
    st.t0 = mk_bench_now();
    int started = start_threads(th, L, lane_thread, &st);
    if (started == 0) lane_thread(&st);
    for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
    out->duration = mk_bench_now() - st.t0;
    free(th);
    pthread_mutex_destroy(&st.mu);
    out->reqs = st.reqs;
    out->n = st.n;
    out->concurrency = L;
    out->reused_tokens = st.reused;
    out->session_tokens = st.total;
    if (atomic_load(&st.stop)) {
        *err = st.fatal;
        return mk_err_prefix(err, "agentic workload");
    }
    return MK_OK;
}

/* ---- warm-ups and the run ------------------------------------------------------------------ */

static int warmup(mk_bench_ctx *ctx, const mk_bench_prompt *prompts, int n, mk_err *err) {
    const mk_bench_config *c = ctx->cfg;
    if (c->num_warmups <= 0) return MK_OK;
    mk_bench_http *h = mk_bench_http_new(c->api_key);
    if (!h) return mk_fail(err, MK_ENOMEM, "out of memory");
    int rc = MK_OK;
    for (int i = 0; i < c->num_warmups && !rc; i++) {
        mk_bench_req r = {0};
        if (prompts) {
            send_one(ctx, h, &prompts[i % n], mk_bench_now(), &r, NULL);
        } else { /* agentic: the first turn of sessions that the run does not use */
            mk_bench_session *s;
            mk_bench_prompt p;
            if ((rc = mk_bench_session_new(ctx, h, 1000000 + i, 0, &s, err))) break;
            rc = mk_bench_session_next(s, h, &p, err);
            mk_bench_session_free(s);
            if (rc) break;
            send_one(ctx, h, &p, mk_bench_now(), &r, NULL);
            mk_bench_prompt_free(&p);
        }
        if (!r.ok) rc = mk_fail(err, MK_EIO, "warm-up request %d failed: %s", i, r.error);
        free(r.chunk_t);
    }
    mk_bench_http_free(h);
    return rc;
}

int mk_bench_run(mk_bench_ctx *ctx, const mk_bench_prompt *prompts, int n, mk_bench_results *out, mk_err *err) {
    memset(out, 0, sizeof *out);
    int rc = warmup(ctx, prompts, n, err);
    if (rc) return rc;
    if (prompts) return run_list(ctx, prompts, n, out, err);
    return run_agentic(ctx, out, err);
}
