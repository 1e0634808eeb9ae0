/* test_server_resp.c — what `minke serve` answers, without an engine: the DeepSeek-V4 reasoning /
 * tool-call splitter fed in every chunking, JSON answers and SSE streams built from finished
 * choices (OpenAI chat and completions, Anthropic messages), error shapes, /metrics text and the
 * OpenAPI document. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "server/srv.h"
#include "test_util.h"
#include "text/chat_dsv4.h"

static mk_chat *chat;
static mk_srv *srv;

static void setup(void) {
    char model[512], tok[512];
    snprintf(model, sizeof model, "%s/dsv4/v4-tiny-fp8", mk_test_data_dir());
    snprintf(tok, sizeof tok, "%s/tok512/tokenizer.json", mk_test_data_dir());
    mk_err err = {0};
    mk_chat_options o = {.model = model, .tokenizer = tok, .no_weights = 1, .max_model_len = 2048};
    cr_assert_eq(mk_chat_load(&o, &chat, &err), 0, "%s", err.msg);
    mk_srv_options so = {.served_model_name = "tiny", .max_model_len = 2048, .quiet = 1};
    cr_assert_eq(mk_srv_create(chat, NULL, &so, &srv, &err), 0, "%s", err.msg);
}

static void teardown(void) {
    mk_srv_free(srv);
    mk_chat_free(chat);
}

TestSuite(server_resp, .init = setup, .fini = teardown);

/* ---- splitter --------------------------------------------------------------------------------------- */

typedef struct {
    srv_buf reasoning, content;
    srv_calls calls;
    int calls_before_finish;
} split_out;

/* Feeds text in chunks of `chunk` bytes (0: all at once) and finishes. */
static void split_run(const char *text, int thinking, int tools, size_t chunk, split_out *o) {
    memset(o, 0, sizeof *o);
    srv_split *s;
    cr_assert_eq(srv_split_create(thinking, tools, &s), 0);
    size_t n = strlen(text), step = chunk ? chunk : n;
    for (size_t i = 0; i < n; i += step) {
        size_t k = n - i < step ? n - i : step;
        cr_assert_eq(srv_split_feed(s, text + i, k, &o->reasoning, &o->content, &o->calls), 0);
    }
    o->calls_before_finish = o->calls.n;
    cr_assert_eq(srv_split_finish(s, &o->reasoning, &o->content, &o->calls), 0);
    srv_split_free(s);
}

static void split_free(split_out *o) {
    sb_free(&o->reasoning);
    sb_free(&o->content);
    srv_calls_free(&o->calls);
}

static const char *str(const srv_buf *b) { return b->p ? b->p : ""; }

#define D MK_DSV4_DSML
#define CALL(name, p, v)                                                                              \
    "<" D "invoke name=\"" name "\">\n<" D "parameter name=\"" p "\" string=\"true\">" v "</" D "parameter>\n</" D "invoke>\n"

Test(server_resp, split_reasoning_any_chunking) {
    const char *t = "I think so</think>The answer.";
    for (size_t chunk = 0; chunk <= 9; chunk++) {
        split_out o;
        split_run(t, 1, 0, chunk, &o);
        cr_assert_str_eq(str(&o.reasoning), "I think so", "chunk %zu", chunk);
        cr_assert_str_eq(str(&o.content), "The answer.", "chunk %zu", chunk);
        split_free(&o);
    }
    /* no </think>: all reasoning (truncated); chat mode: all content, </think> included */
    split_out o;
    split_run("still </thi", 1, 0, 2, &o);
    cr_assert_str_eq(str(&o.reasoning), "still </thi");
    cr_assert_str_eq(str(&o.content), "");
    split_free(&o);
    split_run("a</think>b", 0, 0, 1, &o);
    cr_assert_str_eq(str(&o.content), "a</think>b");
    split_free(&o);
}

Test(server_resp, split_tool_calls_stream_as_they_close) {
    const char *t = "Let me check.\n\n<" D "tool_calls>\n" CALL("get_weather", "city", "Paris") CALL("get_time", "tz", "CET") "</" D "tool_calls>";
    for (size_t chunk = 0; chunk <= 7; chunk++) {
        split_out o;
        split_run(t, 0, 1, chunk, &o);
        cr_assert_str_eq(str(&o.content), "Let me check.", "chunk %zu", chunk);
        cr_assert_eq(o.calls.n, 2);
        cr_assert_eq(o.calls_before_finish, 2, "calls are returned as each invoke closes");
        cr_assert_str_eq(o.calls.v[0].name, "get_weather");
        cr_assert_str_eq(o.calls.v[0].args, "{\"city\": \"Paris\"}");
        cr_assert_str_eq(o.calls.v[1].name, "get_time");
        cr_assert(!strncmp(o.calls.v[0].id, "call_", 5));
        cr_assert_str_neq(o.calls.v[0].id, o.calls.v[1].id);
        cr_assert_null(strstr(str(&o.content), D), "no DSML in the text");
        split_free(&o);
    }
    /* thinking, then a call */
    split_out o;
    split_run("hmm</think>\n\n<" D "tool_calls>\n" CALL("f", "a", "1") "</" D "tool_calls>", 1, 1, 3, &o);
    cr_assert_str_eq(str(&o.reasoning), "hmm");
    cr_assert_str_eq(str(&o.content), "");
    cr_assert_eq(o.calls.n, 1);
    split_free(&o);
    /* truncated inside the second call: the first is kept, the rest dropped (never shown as text) */
    split_run("x\n\n<" D "tool_calls>\n" CALL("f", "a", "1") "<" D "invoke name=\"g\">\n<" D "param", 0, 1, 4, &o);
    cr_assert_str_eq(str(&o.content), "x");
    cr_assert_eq(o.calls.n, 1);
    cr_assert_str_eq(o.calls.v[0].name, "f");
    split_free(&o);
    /* without tool parsing the block is ordinary content */
    split_run("x\n\n<" D "tool_calls>\n", 0, 0, 1, &o);
    cr_assert_str_eq(str(&o.content), "x\n\n<" D "tool_calls>\n");
    split_free(&o);
    /* a held-back "\n\n<" that turns out not to be the marker comes out */
    split_run("a\n\n<b", 0, 1, 1, &o);
    cr_assert_str_eq(str(&o.content), "a\n\n<b");
    cr_assert_eq(o.calls.n, 0);
    split_free(&o);
}

/* ---- answers ---------------------------------------------------------------------------------------- */

static json_t *parse_req(int (*fn)(mk_srv *, const json_t *, srv_req *, srv_err *), const char *body, srv_req *r) {
    json_t *j;
    srv_err e;
    cr_assert_eq(srv_parse_body(body, strlen(body), 64, &j, &e), 0);
    cr_assert_eq(fn(srv, j, r, &e), 0, "%s", e.msg);
    return j;
}

/* A finished generation with one choice per entry of texts. */
static srv_gen *fake_gen(srv_req *r, int n, const char *const *texts, const char *finish) {
    srv_gen *g = calloc(1, sizeof *g);
    g->s = srv;
    g->r = r;
    g->n_ch = n;
    g->n_done = n;
    g->ch = calloc((size_t)n, sizeof *g->ch);
    g->created = 1700000000;
    g->prompt_tokens = r->prompts[0].n;
    snprintf(g->id, sizeof g->id, "id-1");
    for (int i = 0; i < n; i++) {
        srv_choice *c = &g->ch[i];
        c->index = i;
        c->stop_str = -1;
        c->stop_tok = -1;
        c->done = 1;
        c->finish = finish;
        sb_puts(&c->content, texts[i]);
        c->n_gen = 3;
    }
    return g;
}

static void fake_free(srv_gen *g) {
    for (int i = 0; i < g->n_ch; i++) {
        sb_free(&g->ch[i].content);
        sb_free(&g->ch[i].reasoning);
        srv_calls_free(&g->ch[i].calls);
        free(g->ch[i].toks);
    }
    free(g->ch);
    free(g);
}

Test(server_resp, chat_response) {
    srv_req r;
    json_t *b = parse_req(srv_chat_parse, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"n\": 2, \"stop\": [\"zz\"], \"logprobs\": true}", &r);
    const char *texts[] = {"hello", "world"};
    srv_gen *g = fake_gen(&r, 2, texts, "stop");
    g->ch[1].stop_str = 0;
    g->ch[0].toks = calloc(1, sizeof *g->ch[0].toks);
    g->ch[0].toks[0].token = 7;
    g->ch[0].toks[0].logprob = -0.5f;
    g->ch[0].n_toks = 1;
    json_t *j = srv_chat_response(g);
    cr_assert_str_eq(json_string_value(json_object_get(j, "object")), "chat.completion");
    cr_assert_str_eq(json_string_value(json_object_get(j, "model")), "tiny");
    json_t *ch = json_object_get(j, "choices");
    cr_assert_eq(json_array_size(ch), 2);
    json_t *c0 = json_array_get(ch, 0), *c1 = json_array_get(ch, 1);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(c0, "message"), "content")), "hello");
    cr_assert_str_eq(json_string_value(json_object_get(c0, "finish_reason")), "stop");
    cr_assert(json_is_null(json_object_get(c0, "stop_reason")));
    cr_assert_str_eq(json_string_value(json_object_get(c1, "stop_reason")), "zz");
    json_t *lp = json_object_get(json_object_get(c0, "logprobs"), "content");
    cr_assert_eq(json_array_size(lp), 1);
    cr_assert_float_eq(json_real_value(json_object_get(json_array_get(lp, 0), "logprob")), -0.5, 1e-6);
    cr_assert(json_is_array(json_object_get(json_array_get(lp, 0), "bytes")));
    json_t *u = json_object_get(j, "usage");
    cr_assert_eq(json_integer_value(json_object_get(u, "completion_tokens")), 6);
    cr_assert_eq(json_integer_value(json_object_get(u, "total_tokens")), 6 + r.prompts[0].n);
    json_decref(j);

    /* streamed: role chunks, the finish chunks, usage when asked, [DONE] */
    r.include_usage = 1;
    srv_stream st = {.s = srv, .req = &r, .g = g, .produce = srv_chat_produce};
    g->ch[0].done = g->ch[1].done = 1;
    srv_chat_produce(&st, 0);
    cr_assert(st.done);
    cr_assert(strstr(st.out.p, "\"role\":\"assistant\""));
    cr_assert(strstr(st.out.p, "\"choices\":[],\"usage\""));
    cr_assert(strstr(st.out.p, "data: [DONE]\n\n"));
    /* every event is one "data: <json>" line */
    for (char *p = st.out.p; p && *p;) {
        cr_assert(!strncmp(p, "data: ", 6), "%s", p);
        char *nl = strstr(p, "\n\n");
        cr_assert_not_null(nl);
        if (strncmp(p, "data: [DONE]", 12)) {
            json_t *ev = json_loadb(p + 6, (size_t)(nl - p - 6), 0, NULL);
            cr_assert_not_null(ev, "%.*s", (int)(nl - p), p);
            json_decref(ev);
        }
        p = nl + 2;
    }
    sb_free(&st.out);
    fake_free(g);
    srv_req_free(&r);
    json_decref(b);
}

Test(server_resp, chat_response_tool_calls_and_reasoning) {
    srv_req r;
    json_t *b = parse_req(srv_chat_parse, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"chat_template_kwargs\": {\"thinking\": true}}", &r);
    const char *texts[] = {""};
    srv_gen *g = fake_gen(&r, 1, texts, "tool_calls");
    sb_puts(&g->ch[0].reasoning, "because");
    g->ch[0].calls.v = calloc(1, sizeof(srv_call));
    g->ch[0].calls.n = g->ch[0].calls.cap = 1;
    snprintf(g->ch[0].calls.v[0].id, sizeof g->ch[0].calls.v[0].id, "call_1");
    g->ch[0].calls.v[0].name = strdup("f");
    g->ch[0].calls.v[0].args = strdup("{\"a\": 1}");
    json_t *j = srv_chat_response(g);
    json_t *m = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    cr_assert(json_is_null(json_object_get(m, "content")));
    cr_assert_str_eq(json_string_value(json_object_get(m, "reasoning_content")), "because");
    json_t *tc = json_array_get(json_object_get(m, "tool_calls"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(tc, "id")), "call_1");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(tc, "function"), "arguments")), "{\"a\": 1}");
    json_decref(j);
    /* Anthropic: thinking block, then tool_use with the input object */
    j = srv_messages_response(g);
    json_t *content = json_object_get(j, "content");
    cr_assert_eq(json_array_size(content), 2);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(content, 0), "type")), "thinking");
    json_t *tu = json_array_get(content, 1);
    cr_assert_str_eq(json_string_value(json_object_get(tu, "type")), "tool_use");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(tu, "input"), "a")), 1);
    cr_assert_str_eq(json_string_value(json_object_get(j, "stop_reason")), "tool_use");
    json_decref(j);
    /* its stream: message_start, thinking block? (no deltas: finished before), tool_use block, message_delta, message_stop */
    srv_stream st = {.s = srv, .req = &r, .g = g, .produce = srv_messages_produce};
    while (!st.done) srv_messages_produce(&st, 0);
    const char *order[] = {"event: message_start", "event: content_block_start", "\"type\":\"tool_use\"", "input_json_delta",
                           "event: content_block_stop", "event: message_delta", "\"stop_reason\":\"tool_use\"", "event: message_stop"};
    const char *p = st.out.p;
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        const char *q = strstr(p, order[i]);
        cr_assert_not_null(q, "missing %s after %s", order[i], p);
        p = q;
    }
    sb_free(&st.out);
    fake_free(g);
    srv_req_free(&r);
    json_decref(b);
}

Test(server_resp, completion_response) {
    srv_req r;
    json_t *b = parse_req(srv_completion_parse, "{\"prompt\": \"abc\", \"echo\": true}", &r);
    const char *texts[] = {"def"};
    srv_gen *g = fake_gen(&r, 1, texts, "length");
    json_t *j = srv_completion_response(g);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(c, "text")), "abcdef", "echo puts the prompt first");
    cr_assert_str_eq(json_string_value(json_object_get(c, "finish_reason")), "length");
    cr_assert_str_eq(json_string_value(json_object_get(j, "object")), "text_completion");
    json_decref(j);
    fake_free(g);
    srv_req_free(&r);
    json_decref(b);
    /* logprobs: tokens, token_logprobs, top_logprobs (with the chosen token), text_offset */
    b = parse_req(srv_completion_parse, "{\"prompt\": \"abc\", \"logprobs\": 1}", &r);
    g = fake_gen(&r, 1, texts, "stop");
    srv_choice *ch = &g->ch[0];
    ch->toks = calloc(2, sizeof *ch->toks);
    ch->n_toks = 2;
    for (int i = 0; i < 2; i++) {
        ch->toks[i].token = 100 + i;
        ch->toks[i].logprob = -1.0f - (float)i;
        ch->toks[i].n_top = 1;
        ch->toks[i].top_ids[0] = 200;
        ch->toks[i].top_logprobs[0] = -0.25f;
    }
    j = srv_completion_response(g);
    json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    cr_assert_eq(json_array_size(json_object_get(lp, "tokens")), 2);
    cr_assert_eq(json_array_size(json_object_get(lp, "text_offset")), 2);
    cr_assert_eq(json_integer_value(json_array_get(json_object_get(lp, "text_offset"), 0)), 0);
    size_t l0 = strlen(json_string_value(json_array_get(json_object_get(lp, "tokens"), 0)));
    cr_assert_eq((size_t)json_integer_value(json_array_get(json_object_get(lp, "text_offset"), 1)), l0);
    cr_assert_eq(json_object_size(json_array_get(json_object_get(lp, "top_logprobs"), 0)), 2, "the top one plus the chosen token");
    json_decref(j);
    fake_free(g);
    srv_req_free(&r);
    json_decref(b);
}

/* ---- errors, metrics, OpenAPI ---------------------------------------------------------------------- */

Test(server_resp, error_shapes) {
    srv_err e;
    srv_fail(&e, 400, "temperature", "bad %s", "value");
    json_t *o = srv_err_openai(&e);
    json_t *in = json_object_get(o, "error");
    cr_assert_str_eq(json_string_value(json_object_get(in, "message")), "bad value");
    cr_assert_str_eq(json_string_value(json_object_get(in, "type")), "invalid_request_error");
    cr_assert_str_eq(json_string_value(json_object_get(in, "param")), "temperature");
    cr_assert(json_is_null(json_object_get(in, "code")));
    json_decref(o);
    static const struct { int status; const char *type; } A[] = {{400, "invalid_request_error"}, {401, "authentication_error"},
                                                                 {404, "not_found_error"}, {413, "request_too_large"},
                                                                 {429, "rate_limit_error"}, {500, "api_error"}, {503, "overloaded_error"}};
    for (size_t i = 0; i < sizeof A / sizeof A[0]; i++) {
        srv_fail(&e, A[i].status, NULL, "x");
        o = srv_err_anthropic(&e);
        cr_assert_str_eq(json_string_value(json_object_get(o, "type")), "error");
        cr_assert_str_eq(json_string_value(json_object_get(json_object_get(o, "error"), "type")), A[i].type);
        json_decref(o);
    }
}

Test(server_resp, metrics_text) {
    srv_metrics_request(srv->metrics, "stop", 10, 5, 0.02, 0.5, 0.001);
    srv_metrics_request(srv->metrics, "length", 7, 3, 3.0, 4.0, -1);
    srv_metrics_request(srv->metrics, "abort", 0, 1, -1, 100.0, 0.5);
    srv_metrics_itl(srv->metrics, 0.03);
    char *t = srv_metrics_render(srv);
    cr_assert_not_null(t);
    cr_assert(strstr(t, "vllm:prompt_tokens_total{model_name=\"tiny\"} 17\n"), "%s", t);
    cr_assert(strstr(t, "vllm:generation_tokens_total{model_name=\"tiny\"} 9\n"));
    cr_assert(strstr(t, "vllm:request_success_total{finished_reason=\"stop\",model_name=\"tiny\"} 1\n"));
    cr_assert(strstr(t, "vllm:request_success_total{finished_reason=\"abort\",model_name=\"tiny\"} 1\n"));
    cr_assert(strstr(t, "# TYPE vllm:time_to_first_token_seconds histogram\n"));
    cr_assert(strstr(t, "vllm:time_to_first_token_seconds_bucket{le=\"0.02\",model_name=\"tiny\"} 1\n"), "le is inclusive");
    cr_assert(strstr(t, "vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"tiny\"} 2\n"));
    cr_assert(strstr(t, "vllm:time_to_first_token_seconds_count{model_name=\"tiny\"} 2\n"));
    cr_assert(strstr(t, "vllm:e2e_request_latency_seconds_count{model_name=\"tiny\"} 3\n"));
    cr_assert(strstr(t, "vllm:inter_token_latency_seconds_count{model_name=\"tiny\"} 1\n"));
    cr_assert(strstr(t, "minke:live_requests{model_name=\"tiny\"} 0\n"));
    cr_assert(strstr(t, "minke:slots_in_use{model_name=\"tiny\"} 0\n"));
    /* buckets never decrease */
    const char *p = t;
    unsigned long long last = 0;
    while ((p = strstr(p, "vllm:e2e_request_latency_seconds_bucket"))) {
        unsigned long long v = strtoull(strchr(p, '}') + 2, NULL, 10);
        cr_assert_geq(v, last);
        last = v;
        p++;
    }
    cr_assert_eq(last, 3);
    free(t);
}

Test(server_resp, openapi_document) {
    json_t *d = json_loads(srv->openapi, 0, NULL);
    cr_assert_not_null(d);
    cr_assert(!strncmp(json_string_value(json_object_get(d, "openapi")), "3.", 2));
    json_t *paths = json_object_get(d, "paths");
    const char *want[] = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens", "/tokenize",
                          "/detokenize", "/v1/models", "/v1/models/{model}", "/health", "/version", "/metrics", "/openapi.json"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) cr_assert_not_null(json_object_get(paths, want[i]), "%s", want[i]);
    json_t *chat_schema = json_object_get(json_object_get(json_object_get(json_object_get(json_object_get(
                                              json_object_get(paths, "/v1/chat/completions"), "post"), "requestBody"), "content"),
                                              "application/json"), "schema");
    cr_assert_not_null(json_object_get(json_object_get(chat_schema, "properties"), "max_completion_tokens"));
    json_decref(d);
}

Test(server_resp, buffers_and_ids) {
    srv_buf b = {0};
    for (int i = 0; i < 1000; i++) sb_printf(&b, "%d,", i);
    cr_assert_eq(b.n, strlen(b.p));
    cr_assert(!strncmp(b.p + b.n - 4, "999,", 4));
    sb_reset(&b);
    cr_assert_eq(b.n, 0);
    sb_free(&b);
    char a[64], c[64];
    srv_rand_id("chatcmpl-", a, sizeof a);
    srv_rand_id("chatcmpl-", c, sizeof c);
    cr_assert_eq(strlen(a), 9 + 24);
    cr_assert_str_neq(a, c);
}
