/* serverinfo.c — what `minke bench` asks the server about itself: the model (/v1/models), the
 * version (/version) and the counters of /metrics (Prometheus text, vLLM's metric names) that a run
 * scrapes before and after, for prefix-cache hits, speculative-decoding acceptance and the
 * server's own token counts. */
#include "base/status.h"
#include "bench/bench.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int mk_bench_ctx_init(mk_bench_ctx *ctx, const mk_bench_config *cfg, mk_bench_http *h, mk_err *err) {
    memset(ctx, 0, sizeof *ctx);
    ctx->cfg = cfg;
    size_t n = strlen(cfg->base_url);
    if (n + 1 > sizeof ctx->base) return mk_fail(err, MK_EINVAL, "--base-url is too long");
    memcpy(ctx->base, cfg->base_url, n + 1);
    /* accept "http://h:p", "http://h:p/" and "http://h:p/v1" alike */
    while (n && ctx->base[n - 1] == '/') ctx->base[--n] = 0;
    if (n >= 3 && !strcmp(ctx->base + n - 3, "/v1")) ctx->base[n -= 3] = 0;
    if (strncmp(ctx->base, "http://", 7) && strncmp(ctx->base, "https://", 8))
        return mk_fail(err, MK_EINVAL, "--base-url must start with http:// or https:// (got '%s')", cfg->base_url);
    snprintf(ctx->url_completions, sizeof ctx->url_completions, "%s/v1/completions", ctx->base);
    snprintf(ctx->url_chat, sizeof ctx->url_chat, "%s/v1/chat/completions", ctx->base);
    snprintf(ctx->url_tokenize, sizeof ctx->url_tokenize, "%s/tokenize", ctx->base);
    snprintf(ctx->url_detokenize, sizeof ctx->url_detokenize, "%s/detokenize", ctx->base);
    if (cfg->model) {
        snprintf(ctx->model, sizeof ctx->model, "%s", cfg->model);
        return MK_OK;
    }
    char url[600];
    snprintf(url, sizeof url, "%s/v1/models", ctx->base);
    mk_bench_resp r;
    int rc = mk_bench_http_call(h, url, NULL, 30, &r, err);
    if (rc) return rc;
    json_t *j = r.status == 200 ? json_loads(r.body, 0, NULL) : NULL;
    json_t *d = j ? json_object_get(j, "data") : NULL;
    const char *id = json_string_value(json_object_get(json_array_get(d, 0), "id"));
    if (id) snprintf(ctx->model, sizeof ctx->model, "%s", id);
    else rc = mk_fail(err, MK_EIO, "%s answered %ld without a model id; pass --model", url, r.status);
    json_decref(j);
    free(r.body);
    return rc;
}

char *mk_bench_server_version(mk_bench_ctx *ctx, mk_bench_http *h) {
    char url[600];
    snprintf(url, sizeof url, "%s/version", ctx->base);
    mk_bench_resp r;
    mk_err err;
    if (mk_bench_http_call(h, url, NULL, 30, &r, &err)) return NULL;
    json_t *j = r.status == 200 ? json_loads(r.body, 0, NULL) : NULL;
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    free(r.body);
    return s;
}

/* ---- Prometheus text ----------------------------------------------------------------------- */

/* Adds v to *slot when name is base or base_total ("vllm:" prefix included in base). */
static void match(const char *name, size_t n, const char *base, double v, double *slot) {
    size_t b = strlen(base);
    if (n < b || memcmp(name, base, b)) return;
    if (n == b || (n == b + 6 && !memcmp(name + b, "_total", 6))) *slot = (*slot < 0 ? 0 : *slot) + v;
}

void mk_bench_prom_parse(const char *text, mk_bench_prom *p) {
    double *all[] = {&p->prefix_queries, &p->prefix_hits, &p->spec_drafts, &p->spec_draft_tokens,
                     &p->spec_accepted, &p->prompt_tokens, &p->generation_tokens, &p->preemptions};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) *all[i] = -1;
    for (const char *l = text; l && *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        if (len && *l != '#') {
            size_t n = 0;
            while (n < len && l[n] != '{' && l[n] != ' ' && l[n] != '\t') n++;
            const char *v = l + n;
            if (*v == '{') { /* skip the labels, which may contain spaces inside quotes */
                int q = 0;
                while (v < l + len && (q || *v != '}')) {
                    if (*v == '"' && v[-1] != '\\') q = !q;
                    v++;
                }
                if (v < l + len) v++;
            }
            char num[64];
            size_t k = 0;
            while (v < l + len && (*v == ' ' || *v == '\t')) v++;
            while (v < l + len && *v != ' ' && k + 1 < sizeof num) num[k++] = *v++;
            num[k] = 0;
            char *end;
            double x = strtod(num, &end);
            if (k && end != num && isfinite(x)) {
                match(l, n, "vllm:prefix_cache_queries", x, &p->prefix_queries);
                match(l, n, "vllm:prefix_cache_hits", x, &p->prefix_hits);
                match(l, n, "vllm:spec_decode_num_drafts", x, &p->spec_drafts);
                match(l, n, "vllm:spec_decode_num_draft_tokens", x, &p->spec_draft_tokens);
                match(l, n, "vllm:spec_decode_num_accepted_tokens", x, &p->spec_accepted);
                match(l, n, "vllm:prompt_tokens", x, &p->prompt_tokens);
                match(l, n, "vllm:generation_tokens", x, &p->generation_tokens);
                match(l, n, "vllm:num_preemptions", x, &p->preemptions);
            }
        }
        l = e ? e + 1 : NULL;
    }
}

int mk_bench_scrape(mk_bench_ctx *ctx, mk_bench_http *h, mk_bench_prom *p) {
    char url[600];
    snprintf(url, sizeof url, "%s/metrics", ctx->base);
    mk_bench_prom_parse("", p);
    mk_bench_resp r;
    mk_err err;
    if (mk_bench_http_call(h, url, NULL, 30, &r, &err)) return MK_EIO;
    if (r.status == 200) mk_bench_prom_parse(r.body, p);
    free(r.body);
    return r.status == 200 ? MK_OK : MK_EIO;
}
