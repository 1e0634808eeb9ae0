/* http_client.c — blocking libcurl requests and an SSE parser for `minke bench` (http_client.h). */
#include "bench/http_client.h"
#include "base/status.h"

#include <curl/curl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct mk_bench_http {
    CURL *curl;
    char *auth; /* "Authorization: Bearer KEY" or NULL */
};

double mk_bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int mk_bench_http_global_init(mk_err *err) {
    CURLcode c = curl_global_init(CURL_GLOBAL_DEFAULT);
    if (c != CURLE_OK) return mk_fail(err, MK_EIO, "curl_global_init: %s", curl_easy_strerror(c));
    return MK_OK;
}

void mk_bench_http_global_cleanup(void) { curl_global_cleanup(); }

mk_bench_http *mk_bench_http_new(const char *api_key) {
    mk_bench_http *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->curl = curl_easy_init();
    if (!h->curl) {
        free(h);
        return NULL;
    }
    if (api_key && *api_key) {
        size_t n = strlen(api_key) + 32;
        h->auth = malloc(n);
        if (!h->auth) {
            mk_bench_http_free(h);
            return NULL;
        }
        snprintf(h->auth, n, "Authorization: Bearer %s", api_key);
    }
    return h;
}

void mk_bench_http_free(mk_bench_http *h) {
    if (!h) return;
    if (h->curl) curl_easy_cleanup(h->curl);
    free(h->auth);
    free(h);
}

/* ---- growable buffer ----------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} buf;

static void buf_add(buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* Common options for one request on the reused handle. Returns the header list to free. */
static struct curl_slist *setup(mk_bench_http *h, const char *url, const char *json, double timeout_s, int sse) {
    CURL *c = h->curl;
    curl_easy_reset(c); /* keeps the connection cache: the keep-alive connection survives */
    struct curl_slist *hd = NULL;
    if (json) hd = curl_slist_append(hd, "Content-Type: application/json");
    if (sse) hd = curl_slist_append(hd, "Accept: text/event-stream");
    if (h->auth) hd = curl_slist_append(hd, h->auth);
    hd = curl_slist_append(hd, "Expect:"); /* no 100-continue round trip on large bodies */
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
    if (timeout_s > 0) curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    if (json) {
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, json);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(json));
    }
    return hd;
}

static size_t on_body(char *p, size_t sz, size_t nm, void *ud) {
    buf_add(ud, p, sz * nm);
    return ((buf *)ud)->oom ? 0 : sz * nm;
}

int mk_bench_http_call(mk_bench_http *h, const char *url, const char *json, double timeout_s, mk_bench_resp *out,
                       mk_err *err) {
    memset(out, 0, sizeof *out);
    buf b = {0};
    char eb[CURL_ERROR_SIZE] = "";
    struct curl_slist *hd = setup(h, url, json, timeout_s, 0);
    curl_easy_setopt(h->curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h->curl, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h->curl, CURLOPT_ERRORBUFFER, eb);
    CURLcode c = curl_easy_perform(h->curl);
    curl_slist_free_all(hd);
    if (b.oom) {
        free(b.p);
        return mk_fail(err, MK_ENOMEM, "%s: out of memory reading the response", url);
    }
    if (c != CURLE_OK) {
        free(b.p);
        return mk_fail(err, MK_EIO, "%s: %s", url, eb[0] ? eb : curl_easy_strerror(c));
    }
    curl_easy_getinfo(h->curl, CURLINFO_RESPONSE_CODE, &out->status);
    if (!b.p) buf_add(&b, "", 0);
    out->body = b.p;
    out->len = b.n;
    return MK_OK;
}

/* ---- SSE ----------------------------------------------------------------------------------- */

typedef struct {
    CURL *curl;
    long status;     /* 0 until the first body byte */
    buf line;        /* the incomplete line */
    buf data;        /* the event's data lines so far */
    buf errbody;     /* the whole body of a non-200 response */
    int has_data;
    mk_bench_sse_cb cb;
    void *ctx;
    double t_last;
} sse;

static void sse_line(sse *s, const char *l, size_t n, double t) {
    if (n && l[n - 1] == '\r') n--;
    if (n == 0) { /* blank line: dispatch */
        if (s->has_data) s->cb(s->ctx, s->data.p ? s->data.p : "", s->data.n, t);
        s->data.n = 0;
        if (s->data.p) s->data.p[0] = 0;
        s->has_data = 0;
        return;
    }
    if (n >= 5 && !memcmp(l, "data:", 5)) {
        l += 5;
        n -= 5;
        if (n && *l == ' ') l++, n--;
        if (s->has_data) buf_add(&s->data, "\n", 1);
        buf_add(&s->data, l, n);
        if (!s->data.p) buf_add(&s->data, "", 0);
        s->has_data = 1;
    }
    /* event:, id:, retry: and comments are ignored */
}

static size_t on_sse(char *p, size_t sz, size_t nm, void *ud) {
    sse *s = ud;
    size_t n = sz * nm;
    double t = mk_bench_now();
    s->t_last = t;
    if (!s->status) curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &s->status);
    if (s->status != 200) {
        buf_add(&s->errbody, p, n);
        return s->errbody.oom ? 0 : n;
    }
    size_t i = 0;
    while (i < n) {
        char *nl = memchr(p + i, '\n', n - i);
        if (!nl) {
            buf_add(&s->line, p + i, n - i);
            break;
        }
        size_t k = (size_t)(nl - (p + i));
        if (s->line.n) {
            buf_add(&s->line, p + i, k);
            sse_line(s, s->line.p, s->line.n, t);
            s->line.n = 0;
        } else {
            sse_line(s, p + i, k, t);
        }
        i += k + 1;
    }
    return s->line.oom || s->data.oom ? 0 : n;
}

int mk_bench_http_stream(mk_bench_http *h, const char *url, const char *json, double timeout_s, mk_bench_sse_cb cb,
                         void *ctx, long *status, char **err_body, double *t_end, mk_err *err) {
    sse s = {.curl = h->curl, .cb = cb, .ctx = ctx};
    char eb[CURL_ERROR_SIZE] = "";
    *status = 0;
    if (err_body) *err_body = NULL;
    struct curl_slist *hd = setup(h, url, json, timeout_s, 1);
    curl_easy_setopt(h->curl, CURLOPT_WRITEFUNCTION, on_sse);
    curl_easy_setopt(h->curl, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(h->curl, CURLOPT_ERRORBUFFER, eb);
    CURLcode c = curl_easy_perform(h->curl);
    double t = mk_bench_now();
    curl_slist_free_all(hd);
    if (!s.status) curl_easy_getinfo(h->curl, CURLINFO_RESPONSE_CODE, &s.status);
    *status = s.status;
    if (t_end) *t_end = t;
    int rc = MK_OK;
    if (c != CURLE_OK) {
        rc = mk_fail(err, MK_EIO, "%s: %s", url, eb[0] ? eb : curl_easy_strerror(c));
    } else if (s.status == 200) {
        /* a stream that ends without the final blank line still delivers its last event */
        if (s.line.n) sse_line(&s, s.line.p, s.line.n, t);
        if (s.has_data) cb(ctx, s.data.p ? s.data.p : "", s.data.n, t);
    }
    if (err_body && s.status != 200 && s.errbody.p) {
        *err_body = s.errbody.p;
        s.errbody.p = NULL;
    }
    free(s.line.p);
    free(s.data.p);
    free(s.errbody.p);
    return rc;
}
