/* report.c — the human table and the result JSON of `minke bench serve` (report.h). */
#include "bench/report.h"
#include "base/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *ds_name(int d) {
    static const char *n[] = {"random", "prefix-repetition", "agentic", "sharegpt"};
    return d >= 0 && d < 4 ? n[d] : "?";
}

/* counter delta over the run, or -1 when the server does not export it */
static double delta(const mk_bench_report *r, const double *b, const double *a) {
    if (!r->have_prom || *b < 0 || *a < 0) return -1;
    return *a - *b;
}
#define DELTA(r, field) delta((r), &(r)->before.field, &(r)->after.field)

/* ---- failure reasons ----------------------------------------------------------------------- */

typedef struct {
    const char *reason;
    int count;
} reason_count;

/* Distinct reasons with counts, most frequent first. *out malloc'd. */
static int failure_reasons(const mk_bench_results *res, reason_count **out) {
    reason_count *rc = calloc((size_t)(res->n ? res->n : 1), sizeof *rc);
    int k = 0;
    if (!rc) return 0;
    for (int i = 0; i < res->n; i++) {
        if (res->reqs[i].ok) continue;
        int j = 0;
        while (j < k && strcmp(rc[j].reason, res->reqs[i].error)) j++;
        if (j == k) rc[k++].reason = res->reqs[i].error;
        rc[j].count++;
    }
    for (int a = 1; a < k; a++) /* insertion sort by count, stable */
        for (int b = a; b > 0 && rc[b].count > rc[b - 1].count; b--) {
            reason_count t = rc[b];
            rc[b] = rc[b - 1];
            rc[b - 1] = t;
        }
    *out = rc;
    return k;
}

/* ---- the table ----------------------------------------------------------------------------- */

static void row(FILE *f, const char *name, const mk_bench_dist *d) {
    if (!d->n) {
        fprintf(f, "  %-10s %10s %10s %10s %10s %8d\n", name, "-", "-", "-", "-", 0);
        return;
    }
    fprintf(f, "  %-10s %10.2f %10.2f %10.2f %10.2f %8d\n", name, d->mean * 1e3, d->median * 1e3, d->p95 * 1e3,
            d->p99 * 1e3, d->n);
}

void mk_bench_print(FILE *f, const mk_bench_report *r) {
    const mk_bench_config *c = r->cfg;
    const mk_bench_summary *s = &r->sum;
    char conc[32];
    if (r->res->concurrency > 0) snprintf(conc, sizeof conc, "%d", r->res->concurrency);
    else snprintf(conc, sizeof conc, "unlimited");
    fprintf(f, "============ minke bench: %s, %s ============\n", ds_name(c->dataset),
            c->dataset == MK_BENCH_DS_AGENTIC ? "lanes" : "serving");
    fprintf(f, "%-42s %s\n", "Server:", r->ctx->base);
    fprintf(f, "%-42s %s (%s)\n", "Model / endpoint:", r->ctx->model,
            c->endpoint == MK_BENCH_EP_CHAT ? "/v1/chat/completions"
            : c->prompt_ids                 ? "/v1/completions, token-id prompts"
                                            : "/v1/completions, text prompts");
    if (c->dataset == MK_BENCH_DS_AGENTIC) fprintf(f, "%-42s %s\n", "Concurrent lanes:", conc);
    else fprintf(f, "%-42s %s\n", "Maximum request concurrency:", conc);
    if (c->dataset != MK_BENCH_DS_AGENTIC) {
        if (isinf(c->request_rate)) fprintf(f, "%-42s inf\n", "Request rate (req/s):");
        else fprintf(f, "%-42s %.3f (burstiness %.2f)\n", "Request rate (req/s):", c->request_rate, c->burstiness);
    }
    fprintf(f, "%-42s %d\n", "Successful requests:", s->completed);
    fprintf(f, "%-42s %d\n", "Failed requests:", s->failed);
    fprintf(f, "%-42s %.2f\n", "Benchmark duration (s):", s->duration);
    fprintf(f, "%-42s %ld\n", "Total input tokens:", s->total_input);
    fprintf(f, "%-42s %ld\n", "Total generated tokens:", s->total_output);
    fprintf(f, "%-42s %.3f\n", "Request throughput (req/s):", s->request_throughput);
    fprintf(f, "%-42s %.2f\n", "Output token throughput (tok/s):", s->output_throughput);
    fprintf(f, "%-42s %.2f\n", "Peak output token throughput (tok/s):", s->peak_output_throughput);
    fprintf(f, "%-42s %d\n", "Peak concurrent requests:", s->peak_concurrency);
    fprintf(f, "%-42s %.2f\n", "Total token throughput (tok/s):", s->total_throughput);
    fprintf(f, "%-42s %.2f\n", "Interactivity (tok/s/user, 1/P90 ITL):", s->interactivity);
    fprintf(f, "%-42s %.2f\n", "TPGS (total tok/s per GPU):", s->tpgs);
    if (c->slo.ttft > 0 || c->slo.tpot > 0 || c->slo.e2el > 0)
        fprintf(f, "%-42s %.3f (%d of %d requests meet every SLO)\n", "Goodput (req/s):", s->goodput, s->good,
                s->completed + s->failed);
    if (c->gpu_hour_cost > 0)
        fprintf(f, "%-42s %.4f ($%.2f/GPU-hour x %d)\n", "Cost per 1M output tokens ($):", s->cost_per_1m_output,
                c->gpu_hour_cost, c->gpus);
    fprintf(f, "---------------------------------------------------------------------\n");
    fprintf(f, "  %-10s %10s %10s %10s %10s %8s\n", "ms", "mean", "median", "p95", "p99", "n");
    row(f, "TTFT", &s->ttft);
    row(f, "TPOT", &s->tpot);
    row(f, "ITL", &s->itl);
    row(f, "E2EL", &s->e2el);
    fprintf(f, "---------------------------------------------------------------------\n");
    fprintf(f, "%-42s %d of %d exact\n", "Prompt tokens (usage vs built prompt):", s->prompt_exact, s->prompt_checked);
    if (c->ignore_eos)
        fprintf(f, "%-42s %d of %d exact\n", "Output tokens (usage vs max_tokens):", s->output_exact, s->output_checked);
    int missing = 0;
    for (int i = 0; i < r->res->n; i++) missing += r->res->reqs[i].ok && r->res->reqs[i].usage_missing;
    if (missing) fprintf(f, "WARNING: %d streams had no usage; their output tokens are chunk counts\n", missing);
    if (c->dataset == MK_BENCH_DS_AGENTIC && r->res->session_tokens > 0)
        fprintf(f, "%-42s %.1f%% of prompt tokens\n", "Session prefix reuse (client side):",
                100.0 * r->res->reused_tokens / r->res->session_tokens);
    if (s->total_cached > 0) fprintf(f, "%-42s %ld\n", "Cached prompt tokens (usage):", s->total_cached);
    double pq = DELTA(r, prefix_queries), ph = DELTA(r, prefix_hits);
    if (pq > 0) fprintf(f, "%-42s %.1f%% (%.0f of %.0f tokens)\n", "Server prefix cache hit rate:", 100 * ph / pq, ph, pq);
    else if (pq == 0) fprintf(f, "%-42s no queries counted\n", "Server prefix cache hit rate:");
    double dt = DELTA(r, spec_draft_tokens), ac = DELTA(r, spec_accepted), dr = DELTA(r, spec_drafts);
    if (dt > 0)
        fprintf(f, "%-42s %.1f%% (mean acceptance length %.2f)\n", "Spec-decode acceptance:", 100 * ac / dt,
                dr > 0 ? 1 + ac / dr : 0);
    double sp = DELTA(r, prompt_tokens), sg = DELTA(r, generation_tokens);
    if (sp >= 0 && sg >= 0) fprintf(f, "%-42s %.0f prompt, %.0f generated\n", "Server token counters (delta):", sp, sg);
    reason_count *rc = NULL;
    int k = failure_reasons(r->res, &rc);
    for (int i = 0; i < k && i < 10; i++) fprintf(f, "  failed x%d: %s\n", rc[i].count, rc[i].reason);
    if (k > 10) fprintf(f, "  ... and %d more reasons (see the result file)\n", k - 10);
    free(rc);
    fprintf(f, "=====================================================================\n");
}

void mk_bench_print_sweep_row(FILE *f, int concurrency, const mk_bench_summary *s, int header) {
    if (header)
        fprintf(f, "%6s %6s %6s %10s %10s %10s %10s %10s %10s %12s\n", "conc", "ok", "fail", "req/s", "out tok/s",
                "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "tok/s/user");
    fprintf(f, "%6d %6d %6d %10.3f %10.2f %10.1f %10.1f %10.1f %10.1f %12.2f\n", concurrency, s->completed,
            s->failed, s->request_throughput, s->output_throughput, s->ttft.median * 1e3, s->ttft.p99 * 1e3,
            s->tpot.median * 1e3, s->tpot.p99 * 1e3, s->interactivity);
}

/* ---- JSON ---------------------------------------------------------------------------------- */

static void put_dist(json_t *o, const char *name, const mk_bench_dist *d) {
    char k[64];
    const char *st[] = {"mean", "median", "p90", "p95", "p99"};
    double v[] = {d->mean, d->median, d->p90, d->p95, d->p99};
    for (int i = 0; i < 5; i++) {
        snprintf(k, sizeof k, "%s_%s_ms", st[i], name);
        json_object_set_new(o, k, json_real(v[i] * 1e3));
    }
    snprintf(k, sizeof k, "n_%s", name);
    json_object_set_new(o, k, json_integer(d->n));
}

static json_t *num_or_null(double v) { return v < 0 ? json_null() : json_real(v); }

static json_t *config_json(const mk_bench_report *r) {
    const mk_bench_config *c = r->cfg;
    json_t *o = json_object();
    json_object_set_new(o, "base_url", json_string(r->ctx->base));
    json_object_set_new(o, "model", json_string(r->ctx->model));
    json_object_set_new(o, "label", json_string(c->label ? c->label : ""));
    json_object_set_new(o, "endpoint", json_string(c->endpoint == MK_BENCH_EP_CHAT ? "chat" : "completions"));
    json_object_set_new(o, "prompt_format", json_string(c->endpoint == MK_BENCH_EP_CHAT ? "chat" : c->prompt_ids ? "ids" : "text"));
    json_object_set_new(o, "dataset", json_string(ds_name(c->dataset)));
    json_object_set_new(o, "dataset_path", c->dataset_path ? json_string(c->dataset_path) : json_null());
    json_object_set_new(o, "num_prompts", json_integer(c->num_prompts));
    json_object_set_new(o, "seed", json_integer((json_int_t)c->seed));
    json_object_set_new(o, "request_rate", isinf(c->request_rate) ? json_string("inf") : json_real(c->request_rate));
    json_object_set_new(o, "burstiness", json_real(c->burstiness));
    json_object_set_new(o, "max_concurrency", json_integer(r->res->concurrency));
    json_object_set_new(o, "num_warmups", json_integer(c->num_warmups));
    json_object_set_new(o, "ignore_eos", json_boolean(c->ignore_eos));
    json_object_set_new(o, "temperature", json_real(c->temperature));
    json_object_set_new(o, "request_timeout_s", json_real(c->timeout_s));
    json_object_set_new(o, "random_input_len", json_integer(c->input_len));
    json_object_set_new(o, "random_output_len", json_integer(c->output_len));
    json_object_set_new(o, "random_range_ratio", json_real(c->range_ratio));
    if (c->dataset == MK_BENCH_DS_PREFIX)
        json_object_set_new(o, "prefix_repetition", json_pack("{s:i, s:i, s:i}", "prefix_num", c->prefix_num,
                                                              "prefix_len", c->prefix_len, "suffix_len", c->suffix_len));
    if (c->dataset == MK_BENCH_DS_SHAREGPT)
        json_object_set_new(o, "sharegpt_output_len", json_integer(c->sharegpt_output_len));
    if (c->dataset == MK_BENCH_DS_AGENTIC) {
        json_t *a = json_object();
        json_object_set_new(a, "lanes", json_integer(r->res->concurrency));
        json_object_set_new(a, "sessions", json_integer(c->ag_sessions));
        json_object_set_new(a, "turns", json_integer(c->ag_turns));
        json_object_set_new(a, "think_ms", json_real(c->ag_think_ms));
        json_object_set_new(a, "subagent_prob", json_real(c->ag_subagent_prob));
        json_object_set_new(a, "subagents", json_integer(c->ag_subagents));
        json_object_set_new(a, "subagent_turns", json_integer(c->ag_subagent_turns));
        json_object_set_new(a, "system_len", json_integer(c->ag_system_len));
        json_object_set_new(a, "first_len", json_integer(c->ag_first_len));
        json_object_set_new(a, "tool_len", json_integer(c->ag_tool_len));
        json_object_set_new(a, "output_len", json_integer(c->ag_output_len));
        json_object_set_new(a, "max_context", json_integer(c->ag_max_context));
        json_object_set_new(o, "agentic", a);
    }
    json_object_set_new(o, "slo_ms", json_pack("{s:o, s:o, s:o}", "ttft", c->slo.ttft > 0 ? json_real(c->slo.ttft * 1e3) : json_null(),
                                               "tpot", c->slo.tpot > 0 ? json_real(c->slo.tpot * 1e3) : json_null(),
                                               "e2el", c->slo.e2el > 0 ? json_real(c->slo.e2el * 1e3) : json_null()));
    json_object_set_new(o, "gpus", json_integer(c->gpus));
    json_object_set_new(o, "gpu_hour_cost", c->gpu_hour_cost > 0 ? json_real(c->gpu_hour_cost) : json_null());
    return o;
}

static json_t *summary_json(const mk_bench_report *r) {
    const mk_bench_summary *s = &r->sum;
    json_t *o = json_object();
    json_object_set_new(o, "duration", json_real(s->duration));
    json_object_set_new(o, "completed", json_integer(s->completed));
    json_object_set_new(o, "failed", json_integer(s->failed));
    json_object_set_new(o, "total_input_tokens", json_integer(s->total_input));
    json_object_set_new(o, "total_output_tokens", json_integer(s->total_output));
    json_object_set_new(o, "total_cached_tokens", json_integer(s->total_cached));
    json_object_set_new(o, "request_throughput", json_real(s->request_throughput));
    json_object_set_new(o, "request_goodput", json_real(s->goodput));
    json_object_set_new(o, "good_requests", json_integer(s->good));
    json_object_set_new(o, "output_throughput", json_real(s->output_throughput));
    json_object_set_new(o, "total_token_throughput", json_real(s->total_throughput));
    json_object_set_new(o, "max_output_tokens_per_s", json_real(s->peak_output_throughput));
    json_object_set_new(o, "max_concurrent_requests", json_integer(s->peak_concurrency));
    json_object_set_new(o, "interactivity", json_real(s->interactivity));
    json_object_set_new(o, "tpgs", json_real(s->tpgs));
    json_object_set_new(o, "cost_per_1m_output_tokens", s->cost_per_1m_output > 0 ? json_real(s->cost_per_1m_output) : json_null());
    put_dist(o, "ttft", &s->ttft);
    put_dist(o, "tpot", &s->tpot);
    put_dist(o, "itl", &s->itl);
    put_dist(o, "e2el", &s->e2el);
    put_dist(o, "request_itl", &s->req_itl);
    json_object_set_new(o, "prompt_tokens_exact", json_integer(s->prompt_exact));
    json_object_set_new(o, "prompt_tokens_checked", json_integer(s->prompt_checked));
    json_object_set_new(o, "output_tokens_exact", json_integer(s->output_exact));
    json_object_set_new(o, "output_tokens_checked", json_integer(s->output_checked));
    if (r->cfg->dataset == MK_BENCH_DS_AGENTIC) {
        json_object_set_new(o, "session_reused_prompt_tokens", json_integer(r->res->reused_tokens));
        json_object_set_new(o, "session_prompt_tokens", json_integer(r->res->session_tokens));
    }
    return o;
}

static json_t *request_json(const mk_bench_req *q) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer(q->id));
    if (q->session >= 0) {
        json_object_set_new(o, "session", json_integer(q->session));
        json_object_set_new(o, "turn", json_integer(q->turn));
        json_object_set_new(o, "subagent", json_integer(q->subagent));
    }
    json_object_set_new(o, "ok", json_boolean(q->ok));
    if (!q->ok) json_object_set_new(o, "error", json_string(q->error));
    json_object_set_new(o, "start", json_real(q->start));
    json_object_set_new(o, "ttft", q->n_chunks ? json_real(q->ttft) : json_null());
    json_object_set_new(o, "e2el", json_real(q->e2el));
    double tp = mk_bench_tpot(q);
    json_object_set_new(o, "tpot", num_or_null(tp));
    json_t *itl = json_array();
    for (int c = 1; c < q->n_chunks; c++) json_array_append_new(itl, json_real(q->chunk_t[c] - q->chunk_t[c - 1]));
    json_object_set_new(o, "itl", itl);
    json_object_set_new(o, "chunks", json_integer(q->n_chunks));
    json_object_set_new(o, "prompt_tokens", q->prompt_tokens >= 0 ? json_integer(q->prompt_tokens) : json_null());
    json_object_set_new(o, "expected_prompt_tokens",
                        q->expected_prompt_tokens >= 0 ? json_integer(q->expected_prompt_tokens) : json_null());
    json_object_set_new(o, "output_tokens", json_integer(q->output_tokens));
    json_object_set_new(o, "expected_output_tokens", json_integer(q->expected_output_tokens));
    json_object_set_new(o, "usage_missing", json_boolean(q->usage_missing));
    json_object_set_new(o, "cached_tokens", q->cached_tokens >= 0 ? json_integer(q->cached_tokens) : json_null());
    return o;
}

json_t *mk_bench_run_json(const mk_bench_report *r) {
    json_t *o = json_object();
    char date[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_object_set_new(o, "date", json_string(date));
    json_object_set_new(o, "config", config_json(r));
    json_t *v = r->server_version ? json_loads(r->server_version, 0, NULL) : NULL;
    json_object_set_new(o, "server_version", v ? v : json_null());
    json_object_set_new(o, "concurrency", json_integer(r->res->concurrency));
    json_object_set_new(o, "summary", summary_json(r));
    json_t *m = json_object();
    double pq = DELTA(r, prefix_queries), ph = DELTA(r, prefix_hits);
    double dt = DELTA(r, spec_draft_tokens), ac = DELTA(r, spec_accepted), dr = DELTA(r, spec_drafts);
    json_object_set_new(m, "scraped", json_boolean(r->have_prom));
    json_object_set_new(m, "prefix_cache_queries", num_or_null(pq));
    json_object_set_new(m, "prefix_cache_hits", num_or_null(ph));
    json_object_set_new(m, "prefix_cache_hit_rate", pq > 0 && ph >= 0 ? json_real(ph / pq) : json_null());
    json_object_set_new(m, "spec_decode_num_drafts", num_or_null(dr));
    json_object_set_new(m, "spec_decode_num_draft_tokens", num_or_null(dt));
    json_object_set_new(m, "spec_decode_num_accepted_tokens", num_or_null(ac));
    json_object_set_new(m, "spec_decode_acceptance_rate", dt > 0 && ac >= 0 ? json_real(ac / dt) : json_null());
    json_object_set_new(m, "spec_decode_mean_acceptance_length", dr > 0 && ac >= 0 ? json_real(1 + ac / dr) : json_null());
    json_object_set_new(m, "prompt_tokens", num_or_null(DELTA(r, prompt_tokens)));
    json_object_set_new(m, "generation_tokens", num_or_null(DELTA(r, generation_tokens)));
    json_object_set_new(m, "num_preemptions", num_or_null(DELTA(r, preemptions)));
    json_object_set_new(o, "server_metrics", m);
    json_t *fr = json_object();
    reason_count *rc = NULL;
    int k = failure_reasons(r->res, &rc);
    for (int i = 0; i < k; i++) json_object_set_new(fr, rc[i].reason, json_integer(rc[i].count));
    free(rc);
    json_object_set_new(o, "failures", fr);
    json_t *reqs = json_array();
    for (int i = 0; i < r->res->n; i++) json_array_append_new(reqs, request_json(&r->res->reqs[i]));
    json_object_set_new(o, "requests", reqs);
    return o;
}

int mk_bench_save(const char *path, json_t *runs, mk_err *err) {
    json_t *o = json_pack("{s:s, s:s, s:O}", "tool", "minke bench", "version", MK_VERSION, "runs", runs);
    int rc = json_dump_file(o, path, JSON_INDENT(1) | JSON_REAL_PRECISION(9));
    json_decref(o);
    if (rc) return mk_fail(err, MK_EIO, "cannot write %s", path);
    return MK_OK;
}
