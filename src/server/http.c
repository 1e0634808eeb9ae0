/* http.c — the HTTP core of `minke serve` on libmicrohttpd (0.9.75 API): the daemon, routing,
 * authentication, request bodies and their limits, JSON / error / streamed responses, client
 * disconnects, the access log, and the server's lifecycle (server.h).
 *
 * Threads: libmicrohttpd runs one thread per connection (MHD_USE_THREAD_PER_CONNECTION with an
 * internal polling thread for accepts). A handler may block: a non-streamed generation runs to its
 * end inside the handler, checking the client's socket between engine events; a streamed one is a
 * content-reader callback that blocks up to 50 ms at a time on the engine's event queue and
 * returns whatever SSE bytes are ready. A client that disconnects is seen by polling its socket
 * (POLLRDHUP) between events: its engine requests are cancelled and released, and the engine frees
 * them at its next step.
 *
 * Routes (method, path, key needed):
 *   POST /v1/chat/completions, /v1/completions          OpenAI (openai.c)                 key
 *   POST /v1/messages, /v1/messages/count_tokens         Anthropic (anthropic.c)           key
 *   POST /tokenize, /detokenize; GET /v1/models[/{id}]   vLLM / OpenAI (misc.c)            key
 *   GET  /health, /version, /metrics, /openapi.json      (HEAD too)                        no key
 * An unknown path is 404, a known path with another method 405 (with Allow). The key is accepted as
 * "Authorization: Bearer KEY" or "x-api-key: KEY" (Anthropic's header) on every keyed route.
 *
 * Limits: a body above --max-body-bytes is 413 — at once when Content-Length alone declares more
 * than 8 times the limit, otherwise after reading (and dropping) the body, so that the client,
 * still sending, reads the answer instead of a reset connection; JSON nesting deeper than 64 is
 * 400; while draining, generation routes answer 503 with Retry-After.
 */
#include "server/srv.h"

#include <microhttpd.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

typedef struct {
    mk_srv *s;
    char method[16], path[256], client[64];
    srv_buf body;
    int too_big;
    double t_arrive;
    int status;
    int is_stream; /* the stream logs itself when it ends */
    int prompt_tokens, output_tokens;
    double queue_s, ttft_s;
} conn_ctx;

/* ---- access log ----------------------------------------------------------------------------- */

static void access_log(mk_srv *s, const char *client, const char *method, const char *path, int status, int prompt_tokens,
                       int output_tokens, double queue_s, double ttft_s, double t_arrive) {
    if (s->o.quiet) return;
    char q[32] = "-", t[32] = "-";
    if (queue_s >= 0) snprintf(q, sizeof q, "%.3fs", queue_s);
    if (ttft_s >= 0) snprintf(t, sizeof t, "%.3fs", ttft_s);
    /* one fprintf: lines from concurrent requests do not interleave */
    fprintf(stderr, "minke serve: %s \"%s %s\" %d prompt_tokens=%d output_tokens=%d queue=%s ttft=%s total=%.3fs\n",
            client[0] ? client : "-", method, path, status, prompt_tokens, output_tokens, q, t, mk_now() - t_arrive);
}

/* ---- responses -------------------------------------------------------------------------------- */

int srv_reply_err(srv_reply *rep, const srv_err *e) {
    rep->status = e->status;
    rep->err = *e;
    json_decref(rep->json);
    rep->json = NULL;
    return -1;
}

static enum MHD_Result send_buf(struct MHD_Connection *c, int status, char *buf, size_t len, const char *ctype,
                                int retry_after, const char *allow) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(buf);
        return MHD_NO;
    }
    if (ctype) MHD_add_response_header(r, "Content-Type", ctype);
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", retry_after);
        MHD_add_response_header(r, "Retry-After", ra);
    }
    if (allow) MHD_add_response_header(r, "Allow", allow);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int status, json_t *j, int retry_after, const char *allow) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return MHD_NO;
    return send_buf(c, status, s, strlen(s), "application/json", retry_after, allow);
}

static enum MHD_Result send_err(struct MHD_Connection *c, const srv_err *e, int anthropic, const char *allow) {
    return send_json(c, e->status, anthropic ? srv_err_anthropic(e) : srv_err_openai(e), e->retry_after, allow);
}

/* ---- streams ------------------------------------------------------------------------------------ */

srv_stream *srv_stream_new(mk_srv *s, const srv_http *h, srv_req *req, srv_gen *g, srv_produce_fn fn) {
    srv_stream *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->s = s;
    st->req = req;
    st->g = g;
    st->fd = h->fd;
    st->produce = fn;
    st->status = 200;
    st->t_arrive = h->t_arrive;
    snprintf(st->method, sizeof st->method, "%s", h->method);
    snprintf(st->path, sizeof st->path, "%s", h->path);
    snprintf(st->client, sizeof st->client, "%s", h->client ? h->client : "");
    return st;
}

void srv_stream_free(srv_stream *st) {
    if (!st) return;
    double q = -1, t = -1;
    int out = 0;
    if (st->g) {
        srv_gen_timing(st->g, &q, &t);
        out = srv_gen_completion_tokens(st->g);
        access_log(st->s, st->client, st->method, st->path, st->done ? 200 : 499, st->g->prompt_tokens, out, q, t, st->t_arrive);
    }
    srv_gen_free(st->g); /* cancels what is still running */
    srv_req_free(st->req);
    free(st->req);
    sb_free(&st->out);
    free(st);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    srv_stream *st = cls;
    (void)pos;
    for (;;) {
        if (st->off < st->out.n) {
            size_t k = st->out.n - st->off < max ? st->out.n - st->off : max;
            memcpy(buf, st->out.p + st->off, k);
            st->off += k;
            return (ssize_t)k;
        }
        sb_reset(&st->out);
        st->off = 0;
        if (st->done) return MHD_CONTENT_READER_END_OF_STREAM;
        if (srv_client_gone(st->fd)) {
            srv_gen_cancel(st->g);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        st->produce(st, 0.05);
        if (st->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void stream_free_cb(void *cls) { srv_stream_free(cls); }

/* ---- routing ------------------------------------------------------------------------------------ */

enum { R_CHAT, R_COMP, R_MSG, R_COUNT, R_TOK, R_DETOK, R_MODELS, R_MODEL, R_HEALTH, R_VERSION, R_METRICS, R_OPENAPI };

typedef struct {
    const char *path;
    int post; /* 1: POST with a JSON body; 0: GET (and HEAD) */
    int auth;
    int id;
} route;

static const route ROUTES[] = {
    {"/v1/chat/completions", 1, 1, R_CHAT},    {"/v1/completions", 1, 1, R_COMP},
    {"/v1/messages", 1, 1, R_MSG},             {"/v1/messages/count_tokens", 1, 1, R_COUNT},
    {"/tokenize", 1, 1, R_TOK},                {"/detokenize", 1, 1, R_DETOK},
    {"/v1/models", 0, 1, R_MODELS},            {"/health", 0, 0, R_HEALTH},
    {"/version", 0, 0, R_VERSION},             {"/metrics", 0, 0, R_METRICS},
    {"/openapi.json", 0, 0, R_OPENAPI},
};

static const route *find_route(const char *path, const char **model_id) {
    *model_id = NULL;
    for (size_t i = 0; i < sizeof ROUTES / sizeof ROUTES[0]; i++)
        if (!strcmp(ROUTES[i].path, path)) return &ROUTES[i];
    static const route model = {"/v1/models/{model}", 0, 1, R_MODEL};
    if (!strncmp(path, "/v1/models/", 11) && path[11]) {
        *model_id = path + 11;
        return &model;
    }
    return NULL;
}

/* Constant-time comparison (the key must not leak through timing). */
static int key_eq(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = (unsigned char)(la != lb);
    for (size_t i = 0; i < la; i++) d |= (unsigned char)(a[i] ^ b[i % (lb ? lb : 1)]);
    return d == 0;
}

static int authorized(mk_srv *s, struct MHD_Connection *c) {
    if (!s->has_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (h && !strncasecmp(h, "Bearer ", 7)) {
        h += 7;
        while (*h == ' ') h++;
        if (key_eq(h, s->api_key)) return 1;
    }
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    return x && key_eq(x, s->api_key);
}

static int client_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static void client_addr(struct MHD_Connection *c, char *buf, size_t cap) {
    buf[0] = 0;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr) return;
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET) inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, buf, (socklen_t)cap);
    else if (sa->sa_family == AF_INET6) inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, buf, (socklen_t)cap);
}

static enum MHD_Result fail(conn_ctx *x, struct MHD_Connection *c, int status, int anthropic, const char *allow,
                            const char *code, const char *fmt, const char *arg) {
    srv_err e;
    srv_fail(&e, status, NULL, fmt, arg);
    e.code = code;
    if (status == 503) e.retry_after = 5;
    x->status = status;
    return send_err(c, &e, anthropic, allow);
}

/* The request is complete (headers and body): route it and answer. */
static enum MHD_Result dispatch(mk_srv *s, conn_ctx *x, struct MHD_Connection *c) {
    const char *id;
    const route *rt = find_route(x->path, &id);
    int anthropic = !strncmp(x->path, "/v1/messages", 12);
    if (!rt) return fail(x, c, 404, 0, NULL, "not_found", "no route %s", x->path);
    int is_get = !strcmp(x->method, "GET") || !strcmp(x->method, "HEAD");
    if (rt->post ? strcmp(x->method, "POST") : !is_get)
        return fail(x, c, 405, anthropic, rt->post ? "POST" : "GET, HEAD", "method_not_allowed",
                    "method %s is not allowed here", x->method);
    if (rt->auth && !authorized(s, c)) {
        srv_err e;
        srv_fail(&e, 401, NULL, "invalid or missing API key (send Authorization: Bearer KEY%s)", anthropic ? " or x-api-key: KEY" : "");
        e.code = "invalid_api_key";
        x->status = 401;
        return send_err(c, &e, anthropic, NULL);
    }
    if (x->too_big) {
        char lim[32];
        snprintf(lim, sizeof lim, "%zu", s->o.max_body_bytes);
        return fail(x, c, 413, anthropic, NULL, "request_too_large", "the request body is larger than --max-body-bytes (%s bytes)", lim);
    }
    srv_http h = {.s = s, .fd = client_fd(c), .t_arrive = x->t_arrive, .method = x->method, .path = x->path, .client = x->client};
    srv_reply rep;
    memset(&rep, 0, sizeof rep);
    rep.queue_s = rep.ttft_s = -1;
    rep.anthropic = anthropic;
    int rc = 0;
    if (!rt->post) {
        switch (rt->id) {
        case R_HEALTH:
            if (__atomic_load_n(&s->draining, __ATOMIC_ACQUIRE)) return fail(x, c, 503, 0, NULL, "shutting_down", "%s", "shutting down");
            x->status = 200;
            return send_buf(c, 200, strdup(""), 0, NULL, 0, NULL);
        case R_VERSION: rc = srv_h_version(&h, &rep); break;
        case R_METRICS: rc = srv_h_metrics(&h, &rep); break;
        case R_OPENAPI: rc = srv_h_openapi(&h, &rep); break;
        case R_MODELS: rc = srv_h_models(&h, NULL, &rep); break;
        case R_MODEL: rc = srv_h_models(&h, id, &rep); break;
        }
    } else {
        int generates = rt->id == R_CHAT || rt->id == R_COMP || rt->id == R_MSG;
        if (generates && __atomic_load_n(&s->draining, __ATOMIC_ACQUIRE))
            return fail(x, c, 503, anthropic, NULL, "shutting_down", "%s", "the server is shutting down");
        srv_err e;
        json_t *body = NULL;
        if (srv_parse_body(x->body.p, x->body.n, s->o.max_json_depth, &body, &e)) {
            x->status = e.status;
            return send_err(c, &e, anthropic, NULL);
        }
        sb_free(&x->body);
        switch (rt->id) {
        case R_CHAT: rc = srv_h_chat(&h, body, &rep); break;
        case R_COMP: rc = srv_h_completions(&h, body, &rep); break;
        case R_MSG: rc = srv_h_messages(&h, body, &rep); break;
        case R_COUNT: rc = srv_h_count_tokens(&h, body, &rep); break;
        case R_TOK: rc = srv_h_tokenize(&h, body, &rep); break;
        case R_DETOK: rc = srv_h_detokenize(&h, body, &rep); break;
        }
        json_decref(body);
    }
    x->status = rep.status;
    x->prompt_tokens = rep.prompt_tokens;
    x->output_tokens = rep.output_tokens;
    x->queue_s = rep.queue_s;
    x->ttft_s = rep.ttft_s;
    if (rc == -2) { /* the client went away during a non-streamed generation */
        json_decref(rep.json);
        free(rep.text);
        return MHD_NO;
    }
    if (rep.stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, rep.stream, stream_free_cb);
        if (!r) {
            srv_stream_free(rep.stream);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream; charset=utf-8");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        x->is_stream = 1;
        enum MHD_Result q = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return q;
    }
    if (rep.status >= 400 && !rep.json) return send_err(c, &rep.err, rep.anthropic, NULL);
    if (rep.text) return send_buf(c, rep.status, rep.text, strlen(rep.text), rep.content_type, 0, NULL);
    return send_json(c, rep.status ? rep.status : 200, rep.json ? rep.json : json_object(), 0, NULL);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls) {
    mk_srv *s = cls;
    (void)version;
    conn_ctx *x = *con_cls;
    if (!x) {
        x = calloc(1, sizeof *x);
        if (!x) return MHD_NO;
        x->s = s;
        x->t_arrive = mk_now();
        x->queue_s = x->ttft_s = -1;
        snprintf(x->method, sizeof x->method, "%s", method);
        snprintf(x->path, sizeof x->path, "%s", url);
        client_addr(c, x->client, sizeof x->client);
        *con_cls = x;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            unsigned long long n = strtoull(cl, NULL, 10);
            if (n > s->o.max_body_bytes) {
                x->too_big = 1;
                /* hopelessly large: answer now rather than read it all */
                if (n / 8 > s->o.max_body_bytes) return dispatch(s, x, c);
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!x->too_big) {
            if (x->body.n + *upload_data_size > s->o.max_body_bytes) {
                x->too_big = 1;
                sb_free(&x->body);
            } else {
                sb_put(&x->body, upload_data, *upload_data_size);
                if (x->body.oom) return MHD_NO;
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    return dispatch(s, x, c);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    mk_srv *s = cls;
    conn_ctx *x = *con_cls;
    (void)c;
    (void)toe;
    if (!x) return;
    if (!x->is_stream && x->status)
        access_log(s, x->client, x->method, x->path, x->status, x->prompt_tokens, x->output_tokens, x->queue_s, x->ttft_s,
                   x->t_arrive);
    sb_free(&x->body);
    free(x);
    *con_cls = NULL;
}

/* ---- lifecycle ---------------------------------------------------------------------------------- */

int mk_srv_create(mk_chat *chat, mk_engine *eng, const mk_srv_options *o, mk_srv **out, mk_err *err) {
    *out = NULL;
    mk_srv *s = calloc(1, sizeof *s);
    if (!s) return mk_fail(err, MK_ENOMEM, "out of memory");
    s->chat = chat;
    s->eng = eng;
    s->o = *o;
    if (!s->o.max_json_depth) s->o.max_json_depth = 64;
    if (!s->o.max_body_bytes) s->o.max_body_bytes = 4u << 20;
    snprintf(s->host, sizeof s->host, "%s", o->host ? o->host : "127.0.0.1");
    snprintf(s->model_name, sizeof s->model_name, "%s", o->served_model_name ? o->served_model_name : "minke");
    if (o->api_key && *o->api_key) {
        snprintf(s->api_key, sizeof s->api_key, "%s", o->api_key);
        s->has_key = 1;
    }
    s->vocab = mk_chat_vocab_size(chat);
    s->max_model_len = o->max_model_len > 0 ? o->max_model_len : mk_chat_max_model_len(chat);
    s->think_begin = mk_tok_token_to_id(mk_chat_tok(chat), "<think>");
    s->think_end = mk_tok_token_to_id(mk_chat_tok(chat), "</think>");
    s->created = time(NULL);
    pthread_mutex_init(&s->mu, NULL);
    s->metrics = srv_metrics_new();
    s->openapi = srv_openapi_build(s);
    if (!s->metrics || !s->openapi) {
        mk_srv_free(s);
        return mk_fail(err, MK_ENOMEM, "out of memory");
    }
    *out = s;
    return MK_OK;
}

int mk_srv_start(mk_srv *s, mk_err *err) {
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof port, "%d", s->o.port);
    int g = getaddrinfo(s->host, port, &hints, &ai);
    if (g || !ai) return mk_fail(err, MK_EINVAL, "--host %s: %s", s->host, gai_strerror(g));
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)s->o.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(256 * 1024), MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) return mk_fail(err, MK_EIO, "cannot listen on %s:%d (address in use, or not an address of this machine?)", s->host, s->o.port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di && di->port ? di->port : s->o.port;
    return MK_OK;
}

int mk_srv_port(const mk_srv *s) { return s->port; }

void mk_srv_drain(mk_srv *s) { __atomic_store_n(&s->draining, 1, __ATOMIC_RELEASE); }

int mk_srv_active(mk_srv *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->n_active;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void mk_srv_cancel_all(mk_srv *s) {
    pthread_mutex_lock(&s->mu);
    for (srv_gen *g = s->active; g; g = g->next)
        for (int i = 0; i < g->n_ch; i++)
            if (g->ch[i].er) mk_ereq_cancel(g->ch[i].er);
    pthread_mutex_unlock(&s->mu);
}

void mk_srv_stop(mk_srv *s) {
    if (s->d) MHD_stop_daemon(s->d);
    s->d = NULL;
}

void mk_srv_free(mk_srv *s) {
    if (!s) return;
    mk_srv_stop(s);
    srv_metrics_free(s->metrics);
    free(s->openapi);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
