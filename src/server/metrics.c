/* metrics.c — GET /metrics: Prometheus text exposition (format 0.0.4) with vLLM's metric names
 * and buckets, so existing dashboards work, plus minke's own engine gauges.
 *
 *   histograms  vllm:time_to_first_token_seconds (from arrival at the server, tokenization
 *               included), vllm:inter_token_latency_seconds, vllm:e2e_request_latency_seconds,
 *               vllm:request_queue_time_seconds (submitted -> admitted into a sequence slot)
 *   counters    vllm:prompt_tokens_total, vllm:generation_tokens_total (what the responses'
 *               usage reports), vllm:request_success_total{finished_reason=stop|length|abort}
 *               vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total,
 *               vllm:num_preemptions_total (engine)
 *   gauges      vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc (engine),
 *               minke:live_requests (engine request handles alive), minke:slots_in_use,
 *               minke:http_generations_in_flight
 * One "request" is one engine request (a choice): n = 3 counts three, as vLLM counts its child
 * requests. Every series carries model_name. The histograms and counters live here under one mutex;
 * the gauges are read from the engine at scrape time.
 */
#include "server/srv.h"

#include <stdlib.h>
#include <string.h>

static const double TTFT_B[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double ITL_B[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
static const double REQ_B[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                               50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

#define MAX_B 24

typedef struct {
    const double *le;
    int n;
    uint64_t counts[MAX_B + 1]; /* per bucket (not cumulative); [n] = above the last */
    double sum;
    uint64_t count;
} hist;

struct srv_metrics {
    pthread_mutex_t mu;
    hist ttft, itl, e2e, queue;
    uint64_t prompt_tokens, gen_tokens;
    uint64_t success[3]; /* stop, length, abort */
};

static void hist_init(hist *h, const double *le, int n) {
    memset(h, 0, sizeof *h);
    h->le = le;
    h->n = n;
}

static void hist_add(hist *h, double v) {
    if (v < 0) v = 0;
    int i = 0;
    while (i < h->n && v > h->le[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

srv_metrics *srv_metrics_new(void) {
    srv_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    hist_init(&m->ttft, TTFT_B, (int)(sizeof TTFT_B / sizeof TTFT_B[0]));
    hist_init(&m->itl, ITL_B, (int)(sizeof ITL_B / sizeof ITL_B[0]));
    hist_init(&m->e2e, REQ_B, (int)(sizeof REQ_B / sizeof REQ_B[0]));
    hist_init(&m->queue, REQ_B, (int)(sizeof REQ_B / sizeof REQ_B[0]));
    return m;
}

void srv_metrics_free(srv_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void srv_metrics_request(srv_metrics *m, const char *reason, int prompt_tokens, int gen_tokens,
                         double ttft_s, double e2e_s, double queue_s) {
    if (!m) return;
    int k = !strcmp(reason, "stop") ? 0 : !strcmp(reason, "length") ? 1 : 2;
    pthread_mutex_lock(&m->mu);
    m->success[k]++;
    m->prompt_tokens += (uint64_t)(prompt_tokens > 0 ? prompt_tokens : 0);
    m->gen_tokens += (uint64_t)(gen_tokens > 0 ? gen_tokens : 0);
    if (ttft_s >= 0) hist_add(&m->ttft, ttft_s);
    hist_add(&m->e2e, e2e_s);
    if (queue_s >= 0) hist_add(&m->queue, queue_s);
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_itl(srv_metrics *m, double s) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    hist_add(&m->itl, s);
    pthread_mutex_unlock(&m->mu);
}

/* Label values: escape backslash, quote and newline. */
static void label(srv_buf *b, const char *v) {
    for (const char *p = v; *p; p++) {
        if (*p == '\\' || *p == '"') sb_put(b, "\\", 1);
        if (*p == '\n') sb_puts(b, "\\n");
        else sb_put(b, p, 1);
    }
}

static void head(srv_buf *b, const char *name, const char *type, const char *help) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void hist_out(srv_buf *b, const char *name, const char *help, const hist *h, const char *model) {
    head(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i <= h->n; i++) {
        cum += h->counts[i];
        sb_printf(b, "%s_bucket{le=\"", name);
        if (i < h->n) sb_printf(b, "%g", h->le[i]);
        else sb_puts(b, "+Inf");
        sb_puts(b, "\",model_name=\"");
        label(b, model);
        sb_printf(b, "\"} %llu\n", (unsigned long long)cum);
    }
    sb_printf(b, "%s_sum{model_name=\"", name);
    label(b, model);
    sb_printf(b, "\"} %.9g\n%s_count{model_name=\"", h->sum, name);
    label(b, model);
    sb_printf(b, "\"} %llu\n", (unsigned long long)h->count);
}

static void scalar(srv_buf *b, const char *name, const char *type, const char *help, const char *model, double v) {
    head(b, name, type, help);
    sb_printf(b, "%s{model_name=\"", name);
    label(b, model);
    sb_printf(b, "\"} %.17g\n", v);
}

char *srv_metrics_render(mk_srv *s) {
    srv_metrics *m = s->metrics;
    srv_buf b = {0};
    mk_engine_stats st;
    memset(&st, 0, sizeof st);
    if (s->eng) mk_engine_stats_get(s->eng, &st);
    const char *mn = s->model_name;
    pthread_mutex_lock(&s->mu);
    int inflight = s->n_active;
    pthread_mutex_unlock(&s->mu);
    scalar(&b, "vllm:num_requests_running", "gauge", "Requests holding a sequence slot.", mn, st.running);
    scalar(&b, "vllm:num_requests_waiting", "gauge", "Requests waiting for a sequence slot.", mn, st.waiting);
    scalar(&b, "vllm:kv_cache_usage_perc", "gauge", "Fraction of KV-cache blocks in use (0 to 1).", mn, st.kv_cache_usage);
    scalar(&b, "vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.", mn,
           (double)st.prefix_cache_queries);
    scalar(&b, "vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.", mn, (double)st.prefix_cache_hits);
    scalar(&b, "vllm:num_preemptions_total", "counter", "Requests preempted (KV cache full) and recomputed later.", mn,
           (double)st.preemptions);
    pthread_mutex_lock(&m->mu);
    scalar(&b, "vllm:prompt_tokens_total", "counter", "Prompt tokens of finished requests (as usage reports them).", mn,
           (double)m->prompt_tokens);
    scalar(&b, "vllm:generation_tokens_total", "counter", "Generated tokens (as usage reports them).", mn, (double)m->gen_tokens);
    head(&b, "vllm:request_success_total", "counter", "Finished requests by finish reason.");
    static const char *const reasons[3] = {"stop", "length", "abort"};
    for (int k = 0; k < 3; k++) {
        sb_printf(&b, "vllm:request_success_total{finished_reason=\"%s\",model_name=\"", reasons[k]);
        label(&b, mn);
        sb_printf(&b, "\"} %llu\n", (unsigned long long)m->success[k]);
    }
    hist_out(&b, "vllm:time_to_first_token_seconds", "Time from arrival at the server to the first token.", &m->ttft, mn);
    hist_out(&b, "vllm:inter_token_latency_seconds", "Time between consecutive tokens of a request.", &m->itl, mn);
    hist_out(&b, "vllm:e2e_request_latency_seconds", "Time from arrival to the end of a request.", &m->e2e, mn);
    hist_out(&b, "vllm:request_queue_time_seconds", "Time a request waited for a sequence slot.", &m->queue, mn);
    pthread_mutex_unlock(&m->mu);
    scalar(&b, "minke:live_requests", "gauge", "Engine request handles alive (0 when idle: nothing leaked).", mn, st.live_handles);
    scalar(&b, "minke:slots_in_use", "gauge", "Sequence slots owned by a request.", mn, st.slots_in_use);
    scalar(&b, "minke:http_generations_in_flight", "gauge", "Generations the HTTP side is running.", mn, inflight);
    scalar(&b, "minke:engine_steps_total", "counter", "Engine steps run.", mn, (double)st.steps);
    scalar(&b, "minke:max_num_seqs", "gauge", "Sequence slots.", mn, st.max_num_seqs);
    if (b.oom) {
        sb_free(&b);
        return NULL;
    }
    return b.p;
}

int srv_h_metrics(const srv_http *h, srv_reply *rep) {
    char *t = srv_metrics_render(h->s);
    if (!t) {
        srv_err e;
        return srv_reply_err(rep, (srv_fail(&e, 500, NULL, "out of memory"), &e));
    }
    rep->status = 200;
    rep->text = t;
    rep->content_type = "text/plain; version=0.0.4; charset=utf-8";
    return 0;
}
