/* http_client.h — the HTTP side of `minke bench`, on libcurl's easy interface.
 *
 * One mk_bench_http per thread: it owns a CURL easy handle that is reused from request to request,
 * so a worker keeps its keep-alive connection to the server (as vLLM's aiohttp pool does) and no
 * handle is shared between threads. Requests are blocking; a run puts one worker thread per request
 * in flight (runner.c), so each thread's write callback sees its bytes as they arrive and the
 * timestamps it takes are the arrival times.
 *
 * Streaming responses are parsed as Server-Sent Events: `data:` lines are joined into one event,
 * dispatched at the blank line that ends it, with the monotonic time at which the bytes completing
 * the event were received. A response with a status other than 200 is collected whole instead and
 * handed back as the error body.
 *
 * mk_bench_http_global_init must run once before any thread starts (curl_global_init is not
 * thread-safe).
 */
#ifndef MK_BENCH_HTTP_CLIENT_H
#define MK_BENCH_HTTP_CLIENT_H

#include "minke.h"

#include <stddef.h>

typedef struct mk_bench_http mk_bench_http;

/* Monotonic seconds (CLOCK_MONOTONIC). */
double mk_bench_now(void);

int mk_bench_http_global_init(mk_err *err);
void mk_bench_http_global_cleanup(void);

/* api_key may be NULL (no Authorization header). Returns NULL when out of memory. */
mk_bench_http *mk_bench_http_new(const char *api_key);
void mk_bench_http_free(mk_bench_http *h);

/* A whole response. body is malloc'd and NUL-terminated (the caller frees it). */
typedef struct {
    long status;
    char *body;
    size_t len;
} mk_bench_resp;

/* GET (json == NULL) or POST of a JSON body. A transport failure (refused, timeout) returns
 * MK_EIO with curl's message; an HTTP error status is not a failure here: check out->status. */
int mk_bench_http_call(mk_bench_http *h, const char *url, const char *json, double timeout_s, mk_bench_resp *out,
                       mk_err *err);

/* Called once per SSE event: data (NUL-terminated, len bytes, `[DONE]` included) and the time it
 * completed (mk_bench_now()). */
typedef void (*mk_bench_sse_cb)(void *ctx, const char *data, size_t len, double t);

/* POST json to url and stream the response. *status gets the HTTP status; for a status other than
 * 200, *err_body (malloc'd, may be NULL) gets the body and no event is dispatched. *t_end gets the
 * time the last byte arrived. Transport failures return MK_EIO (message names the URL). */
int mk_bench_http_stream(mk_bench_http *h, const char *url, const char *json, double timeout_s, mk_bench_sse_cb cb,
                         void *ctx, long *status, char **err_body, double *t_end, mk_err *err);

#endif
