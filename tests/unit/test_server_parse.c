/* test_server_parse.c — request parsing and validation of `minke serve` (src/server), without an
 * engine or weights: JSON bodies -> srv_req on the tiny DeepSeek-V4 golden checkpoint's config with
 * the 512-token tokenizer. Checks the 400s name the offending field, the limits, the defaults, and
 * that the OpenAI, Anthropic and /tokenize routes render a conversation to the same prompt. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "server/srv.h"
#include "test_util.h"
#include "text/chat_dsv4.h"

#define MAXLEN 2048

static mk_chat *chat;
static mk_srv *srv;

static void setup(void) {
    char model[512], tok[512];
    snprintf(model, sizeof model, "%s/dsv4/v4-tiny-fp8", mk_test_data_dir());
    snprintf(tok, sizeof tok, "%s/tok512/tokenizer.json", mk_test_data_dir());
    mk_err err = {0};
    mk_chat_options o = {.model = model, .tokenizer = tok, .no_weights = 1, .max_model_len = MAXLEN};
    cr_assert_eq(mk_chat_load(&o, &chat, &err), 0, "%s", err.msg);
    mk_srv_options so = {.served_model_name = "tiny", .max_model_len = MAXLEN, .quiet = 1};
    cr_assert_eq(mk_srv_create(chat, NULL, &so, &srv, &err), 0, "%s", err.msg);
}

static void teardown(void) {
    mk_srv_free(srv);
    mk_chat_free(chat);
}

TestSuite(server_parse, .init = setup, .fini = teardown);

typedef int (*parse_fn)(mk_srv *, const json_t *, srv_req *, srv_err *);

/* Parses body with fn; returns the parser's result (the request is freed unless keep). */
static int run(parse_fn fn, const char *body, srv_req *r, srv_err *e) {
    json_t *j = NULL;
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    if (srv_parse_body(body, strlen(body), 64, &j, e)) return -1;
    int rc = fn(srv, j, r, e);
    json_decref(j);
    return rc;
}

/* Expects a failure with status and a param (or message) naming field. */
static void expect_fail(parse_fn fn, const char *body, int status, const char *field) {
    srv_req r;
    srv_err e;
    int rc = run(fn, body, &r, &e);
    srv_req_free(&r);
    cr_assert_neq(rc, 0, "accepted: %s", body);
    cr_assert_eq(e.status, status, "%s -> %d (%s), expected %d", body, e.status, e.msg, status);
    if (field) cr_assert(!strcmp(e.param, field) || strstr(e.msg, field), "%s: error does not name %s: [%s] %s", body, field, e.param, e.msg);
}

/* ---- bodies --------------------------------------------------------------------------------------- */

Test(server_parse, bodies) {
    json_t *j;
    srv_err e;
    const char *bad[] = {"", "{", "[]", "null", "\"x\"", "{\"a\": 1, \"a\": 2}", "{\"a\": \"\\u0000\"}", "{\"a\": \"\\ud800\"}", "{\"a\": 1} x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_neq(srv_parse_body(bad[i], strlen(bad[i]), 64, &j, &e), 0, "accepted %s", bad[i]);
        cr_assert_eq(e.status, 400);
    }
    const char inval[] = "{\"a\": \"\xff\xfe\"}";
    cr_assert_neq(srv_parse_body(inval, sizeof inval - 1, 64, &j, &e), 0);
    /* nesting: 64 levels pass, 65 do not (brackets inside strings do not count) */
    char deep[400];
    size_t k = 0;
    deep[k++] = '{';
    k += (size_t)sprintf(deep + k, "\"a\":\"[[[[{{{\",\"b\":");
    for (int i = 0; i < 63; i++) deep[k++] = '[';
    for (int i = 0; i < 63; i++) deep[k++] = ']';
    deep[k++] = '}';
    deep[k] = 0;
    cr_assert_eq(srv_parse_body(deep, k, 64, &j, &e), 0, "%s", e.msg);
    json_decref(j);
    cr_assert_neq(srv_parse_body(deep, k, 63, &j, &e), 0);
    cr_assert(strstr(e.msg, "deeper"), "%s", e.msg);
}

/* ---- chat ------------------------------------------------------------------------------------------ */

#define MSG "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]"

Test(server_parse, chat_valid_defaults) {
    srv_req r;
    srv_err e;
    cr_assert_eq(run(srv_chat_parse, "{\"model\": \"tiny\", " MSG "}", &r, &e), 0, "%s", e.msg);
    /* the prompt is the chat encoding of the messages */
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}]", 0, NULL);
    mk_chat_render_opts ro;
    mk_chat_render_opts_default(&ro);
    int32_t *ids;
    size_t n;
    mk_err err;
    cr_assert_eq(mk_chat_encode(chat, msgs, NULL, &ro, &ids, &n, &err), 0);
    cr_assert_eq(r.n_prompts, 1);
    cr_assert_eq((size_t)r.prompts[0].n, n);
    cr_assert_eq(memcmp(ids, r.prompts[0].ids, n * sizeof *ids), 0);
    /* chat mode: ends with <｜Assistant｜></think> (ids 4, 6) */
    cr_assert_eq(ids[n - 2], 4);
    cr_assert_eq(ids[n - 1], 6);
    free(ids);
    json_decref(msgs);
    cr_assert_eq(r.max_tokens, MAXLEN - (int)n, "default max_tokens fills the context");
    cr_assert_eq(r.n, 1);
    cr_assert_eq(r.sp.has_seed, 0);
    cr_assert_eq(r.skip_special, 1);
    cr_assert_eq(r.thinking, 0);
    cr_assert_str_eq(r.model, "tiny");
    srv_req_free(&r);
}

Test(server_parse, chat_fields) {
    srv_req r;
    srv_err e;
    const char *body = "{" MSG ", \"max_tokens\": 7, \"temperature\": 0.5, \"top_p\": 0.9, \"top_k\": 0, \"min_p\": 0.1,"
                       " \"seed\": -1, \"n\": 3, \"stop\": \"x\", \"stop_token_ids\": [7, 9], \"logit_bias\": {\"5\": -100},"
                       " \"logprobs\": true, \"top_logprobs\": 4, \"ignore_eos\": true, \"min_tokens\": 2,"
                       " \"skip_special_tokens\": false, \"include_stop_str_in_output\": true, \"priority\": -3,"
                       " \"stream\": true, \"stream_options\": {\"include_usage\": true}, \"cache_salt\": \"t1\","
                       " \"max_completion_tokens\": 5, \"user\": \"u\", \"response_format\": {\"type\": \"text\"}}";
    cr_assert_eq(run(srv_chat_parse, body, &r, &e), 0, "%s", e.msg);
    cr_assert_eq(r.max_tokens, 5, "max_completion_tokens wins");
    cr_assert_float_eq(r.sp.temperature, 0.5f, 1e-6);
    cr_assert_eq(r.sp.top_k, -1);
    cr_assert_eq(r.sp.has_seed, 1);
    cr_assert_eq(r.sp.seed, UINT64_MAX);
    cr_assert_eq(r.n, 3);
    cr_assert_eq(r.n_stops, 1);
    cr_assert_str_eq(r.stops[0], "x");
    cr_assert_eq(r.sp.n_stop_ids, 2);
    cr_assert_eq(r.sp.n_bias, 1);
    cr_assert_eq(r.sp.bias_ids[0], 5);
    cr_assert_eq(r.logprobs, 1);
    cr_assert_eq(r.sp.top_logprobs, 4);
    cr_assert_eq(r.sp.ignore_eos, 1);
    cr_assert_eq(r.sp.min_tokens, 2);
    cr_assert_eq(r.skip_special, 0);
    cr_assert_eq(r.include_stop_str, 1);
    cr_assert_eq(r.priority, -3);
    cr_assert_eq(r.include_usage, 1);
    cr_assert_str_eq(r.cache_salt, "t1");
    srv_req_free(&r);
}

Test(server_parse, chat_errors_name_the_field) {
    expect_fail(srv_chat_parse, "{\"max_tokens\": 2}", 400, "messages");
    expect_fail(srv_chat_parse, "{\"messages\": []}", 400, "messages");
    expect_fail(srv_chat_parse, "{\"messages\": \"hi\"}", 400, "messages");
    expect_fail(srv_chat_parse, "{\"messages\": [{\"content\": \"x\"}]}", 400, "messages");
    expect_fail(srv_chat_parse, "{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", 400, "messages");
    expect_fail(srv_chat_parse, "{" MSG ", \"bogus\": 1}", 400, "bogus");
    expect_fail(srv_chat_parse, "{" MSG ", \"guided_json\": {}}", 400, "guided_json");
    expect_fail(srv_chat_parse, "{" MSG ", \"temperature\": \"hot\"}", 400, "temperature");
    expect_fail(srv_chat_parse, "{" MSG ", \"temperature\": -1}", 400, "temperature");
    expect_fail(srv_chat_parse, "{" MSG ", \"top_p\": 0}", 400, "top_p");
    expect_fail(srv_chat_parse, "{" MSG ", \"top_p\": 1.5}", 400, "top_p");
    expect_fail(srv_chat_parse, "{" MSG ", \"n\": 0}", 400, "n");
    expect_fail(srv_chat_parse, "{" MSG ", \"n\": 1.5}", 400, "n");
    expect_fail(srv_chat_parse, "{" MSG ", \"max_tokens\": 0}", 400, "max_tokens");
    expect_fail(srv_chat_parse, "{" MSG ", \"max_completion_tokens\": 0}", 400, "max_completion_tokens");
    expect_fail(srv_chat_parse, "{" MSG ", \"presence_penalty\": 3}", 400, "presence_penalty");
    expect_fail(srv_chat_parse, "{" MSG ", \"logprobs\": true, \"top_logprobs\": 21}", 400, "top_logprobs");
    expect_fail(srv_chat_parse, "{" MSG ", \"top_logprobs\": 2}", 400, "top_logprobs");
    expect_fail(srv_chat_parse, "{" MSG ", \"logit_bias\": {\"x\": 1}}", 400, "logit_bias");
    expect_fail(srv_chat_parse, "{" MSG ", \"logit_bias\": {\"10\": 500}}", 400, "logit_bias");
    expect_fail(srv_chat_parse, "{" MSG ", \"logit_bias\": {\"512\": 1}}", 400, "logit_bias");
    expect_fail(srv_chat_parse, "{" MSG ", \"seed\": \"abc\"}", 400, "seed");
    expect_fail(srv_chat_parse, "{" MSG ", \"stop\": 42}", 400, "stop");
    expect_fail(srv_chat_parse, "{" MSG ", \"stop\": [\"\"]}", 400, "stop");
    expect_fail(srv_chat_parse, "{" MSG ", \"stop_token_ids\": [512]}", 400, "stop_token_ids");
    expect_fail(srv_chat_parse, "{" MSG ", \"stream_options\": {\"include_usage\": true}}", 400, "stream_options");
    expect_fail(srv_chat_parse, "{" MSG ", \"stream\": true, \"stream_options\": {\"x\": 1}}", 400, "stream_options.x");
    expect_fail(srv_chat_parse, "{" MSG ", \"response_format\": {\"type\": \"json_object\"}}", 400, "response_format");
    expect_fail(srv_chat_parse, "{" MSG ", \"response_format\": {\"type\": \"yaml\"}}", 400, "response_format");
    expect_fail(srv_chat_parse, "{" MSG ", \"reasoning_effort\": \"extreme\"}", 400, "reasoning_effort");
    expect_fail(srv_chat_parse, "{" MSG ", \"chat_template_kwargs\": {\"foo\": true}}", 400, "chat_template_kwargs");
    expect_fail(srv_chat_parse, "{" MSG ", \"continue_final_message\": true}", 400, "continue_final_message");
    expect_fail(srv_chat_parse, "{" MSG ", \"min_tokens\": 9, \"max_tokens\": 3}", 400, "min_tokens");
    expect_fail(srv_chat_parse, "{\"model\": \"gpt-4o\", " MSG "}", 404, "model");
    /* the context: max_tokens beyond it, and a prompt longer than it */
    expect_fail(srv_chat_parse, "{" MSG ", \"max_tokens\": 2048}", 400, "2048");
    static char big[40000];
    int k = sprintf(big, "{\"messages\": [{\"role\": \"user\", \"content\": \"");
    for (int i = 0; i < 3000; i++) k += sprintf(big + k, "ab ");
    sprintf(big + k, "\"}]}");
    expect_fail(srv_chat_parse, big, 400, "maximum context length");
}

#define WEATHER                                                                                       \
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", " \
    "\"properties\": {\"location\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}}, "    \
    "\"required\": [\"location\", \"days\"]}}}"

Test(server_parse, chat_tools) {
    srv_req r;
    srv_err e;
    cr_assert_eq(run(srv_chat_parse, "{" MSG ", \"tools\": [" WEATHER "]}", &r, &e), 0, "%s", e.msg);
    cr_assert_eq(r.tool_choice, SRV_TC_AUTO);
    cr_assert_eq(r.parse_tools, 1);
    cr_assert_null(r.ftools);
    int with_tools = r.prompts[0].n;
    srv_req_free(&r);
    cr_assert_eq(run(srv_chat_parse, "{" MSG ", \"tools\": [" WEATHER "], \"tool_choice\": \"none\"}", &r, &e), 0, "%s", e.msg);
    cr_assert_eq(r.parse_tools, 0);
    cr_assert_lt(r.prompts[0].n, with_tools, "tool_choice none renders no tools");
    srv_req_free(&r);
    /* named: a forced call with the schema's required parameters */
    cr_assert_eq(run(srv_chat_parse, "{" MSG ", \"tools\": [" WEATHER "], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}}",
                     &r, &e), 0, "%s", e.msg);
    cr_assert_eq(r.tool_choice, SRV_TC_NAMED);
    cr_assert_eq(r.n_ftools, 1);
    cr_assert_str_eq(r.ftools[0].name, "get_weather");
    cr_assert_eq(r.ftools[0].n_params, 2);
    cr_assert_str_eq(r.ftools[0].params[0].name, "location");
    cr_assert_eq(r.ftools[0].params[0].is_string, 1);
    cr_assert_eq(r.ftools[0].params[1].is_string, 0);
    cr_assert_not_null(r.prompt_text);
    srv_req_free(&r);
    expect_fail(srv_chat_parse, "{" MSG ", \"tools\": [" WEATHER "], \"tool_choice\": \"sometimes\"}", 400, "tool_choice");
    expect_fail(srv_chat_parse, "{" MSG ", \"tool_choice\": \"required\"}", 400, "tool_choice");
    expect_fail(srv_chat_parse, "{" MSG ", \"tools\": [" WEATHER "], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"nope\"}}}", 400, "tool_choice");
    expect_fail(srv_chat_parse, "{" MSG ", \"tools\": [{\"type\": \"function\"}]}", 400, "tools");
    expect_fail(srv_chat_parse, "{" MSG ", \"tools\": [{\"type\": \"retrieval\", \"function\": {\"name\": \"x\"}}]}", 400, "tools");
    expect_fail(srv_chat_parse, "{" MSG ", \"tools\": [{\"type\": \"function\", \"function\": {\"description\": \"d\"}}]}", 400, "tools");
    expect_fail(srv_chat_parse, "{" MSG ", \"tools\": \"get_weather\"}", 400, "tools");
    /* history: a tool message without a preceding call; arguments that are not JSON */
    expect_fail(srv_chat_parse, "{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"tool\", \"tool_call_id\": \"c\", \"content\": \"r\"}]}",
                400, "messages");
    expect_fail(srv_chat_parse,
                "{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": "
                "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{not json\"}}]}, "
                "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"r\"}]}",
                400, "messages");
}

Test(server_parse, chat_thinking) {
    srv_req r;
    srv_err e;
    const char *ways[] = {"\"chat_template_kwargs\": {\"thinking\": true}", "\"chat_template_kwargs\": {\"enable_thinking\": true}",
                          "\"reasoning_effort\": \"high\"", "\"reasoning_effort\": \"low\""};
    for (int i = 0; i < 4; i++) {
        char b[256];
        snprintf(b, sizeof b, "{" MSG ", %s}", ways[i]);
        cr_assert_eq(run(srv_chat_parse, b, &r, &e), 0, "%s", e.msg);
        cr_assert_eq(r.thinking, 1, "%s", ways[i]);
        int n = r.prompts[0].n;
        cr_assert_eq(r.prompts[0].ids[n - 1], 5, "thinking prompts end with <think>");
        srv_req_free(&r);
    }
    cr_assert_eq(run(srv_chat_parse, "{" MSG ", \"reasoning_effort\": \"none\"}", &r, &e), 0);
    cr_assert_eq(r.thinking, 0);
    int plain = r.prompts[0].n;
    srv_req_free(&r);
    cr_assert_eq(run(srv_chat_parse, "{" MSG ", \"reasoning_effort\": \"max\"}", &r, &e), 0);
    cr_assert_gt(r.prompts[0].n, plain + 20, "max adds the effort paragraph");
    srv_req_free(&r);
}

/* ---- completions ------------------------------------------------------------------------------------ */

Test(server_parse, completions) {
    srv_req r;
    srv_err e;
    cr_assert_eq(run(srv_completion_parse, "{\"prompt\": \"hello world\"}", &r, &e), 0, "%s", e.msg);
    cr_assert_eq(r.n_prompts, 1);
    cr_assert_eq(r.max_tokens, 16, "OpenAI's default");
    cr_assert_str_eq(r.prompts[0].text, "hello world");
    srv_req_free(&r);
    cr_assert_eq(run(srv_completion_parse, "{\"prompt\": \"hello\", \"max_tokens\": null}", &r, &e), 0, "%s", e.msg);
    cr_assert_eq(r.max_tokens, MAXLEN - r.prompts[0].n);
    srv_req_free(&r);
    cr_assert_eq(run(srv_completion_parse, "{\"prompt\": [1, 2, 3], \"n\": 2}", &r, &e), 0, "%s", e.msg);
    cr_assert_eq(r.n_prompts, 1);
    cr_assert_eq(r.prompts[0].n, 3);
    cr_assert_eq(r.prompts[0].ids[2], 3);
    srv_req_free(&r);
    cr_assert_eq(run(srv_completion_parse, "{\"prompt\": [[1, 2], [3]], \"echo\": true}", &r, &e), 0, "%s", e.msg);
    cr_assert_eq(r.n_prompts, 2);
    cr_assert_not_null(r.prompts[1].text, "echo decodes token prompts");
    srv_req_free(&r);
    cr_assert_eq(run(srv_completion_parse, "{\"prompt\": [\"a\", \"b\", \"c\"], \"logprobs\": 2}", &r, &e), 0, "%s", e.msg);
    cr_assert_eq(r.n_prompts, 3);
    cr_assert_eq(r.sp.logprobs, 1);
    cr_assert_eq(r.sp.top_logprobs, 2);
    srv_req_free(&r);
    expect_fail(srv_completion_parse, "{\"max_tokens\": 2}", 400, "prompt");
    expect_fail(srv_completion_parse, "{\"prompt\": \"\"}", 400, "prompt");
    expect_fail(srv_completion_parse, "{\"prompt\": []}", 400, "prompt");
    expect_fail(srv_completion_parse, "{\"prompt\": [1000000000]}", 400, "prompt");
    expect_fail(srv_completion_parse, "{\"prompt\": [\"a\", [1]]}", 400, "prompt");
    expect_fail(srv_completion_parse, "{\"prompt\": [[]]}", 400, "prompt");
    expect_fail(srv_completion_parse, "{\"prompt\": {\"text\": \"x\"}}", 400, "prompt");
    expect_fail(srv_completion_parse, "{\"prompt\": \"x\", \"logprobs\": 50}", 400, "logprobs");
    expect_fail(srv_completion_parse, "{\"prompt\": \"x\", \"echo\": true, \"logprobs\": 1}", 400, "logprobs");
    expect_fail(srv_completion_parse, "{\"prompt\": \"x\", \"echo\": \"yes\"}", 400, "echo");
    expect_fail(srv_completion_parse, "{\"prompt\": \"x\", \"suffix\": \"y\"}", 400, "suffix");
    expect_fail(srv_completion_parse, "{\"prompt\": \"x\", \"max_tokens\": \"many\"}", 400, "max_tokens");
    expect_fail(srv_completion_parse, "{\"prompt\": [\"a\",\"b\",\"c\",\"d\",\"e\"], \"n\": 16}", 400, "n");
}

/* ---- Anthropic ------------------------------------------------------------------------------------- */

/* The Anthropic form and the OpenAI form of one conversation give the same prompt. */
static void same_prompt(const char *anth, const char *oai) {
    srv_req a, o;
    srv_err e;
    cr_assert_eq(run(srv_messages_parse, anth, &a, &e), 0, "%s: %s", anth, e.msg);
    cr_assert_eq(run(srv_chat_parse, oai, &o, &e), 0, "%s: %s", oai, e.msg);
    cr_assert_eq(a.prompts[0].n, o.prompts[0].n, "%s\n%s", a.prompt_text, o.prompt_text);
    cr_assert_str_eq(a.prompt_text, o.prompt_text);
    srv_req_free(&a);
    srv_req_free(&o);
}

Test(server_parse, messages_render_like_openai) {
    same_prompt("{\"max_tokens\": 4, \"system\": \"be brief\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}",
                "{\"max_tokens\": 4, \"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", \"content\": \"hi\"}]}");
    same_prompt("{\"max_tokens\": 4, \"system\": [{\"type\": \"text\", \"text\": \"be brief\"}], \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi\"}]}]}",
                "{\"max_tokens\": 4, \"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", \"content\": \"hi\"}]}");
    /* tool_use / tool_result history */
    same_prompt("{\"max_tokens\": 4, \"system\": \"s\", \"tools\": [{\"name\": \"get_weather\", \"description\": \"d\", \"input_schema\": {\"type\": \"object\"}}],"
                " \"messages\": [{\"role\": \"user\", \"content\": \"w?\"}, {\"role\": \"assistant\", \"content\": [{\"type\": \"text\", \"text\": \"checking\"},"
                " {\"type\": \"tool_use\", \"id\": \"t1\", \"name\": \"get_weather\", \"input\": {\"city\": \"Paris\"}}]},"
                " {\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": \"t1\", \"content\": [{\"type\": \"text\", \"text\": \"sunny\"}]}]}]}",
                "{\"max_tokens\": 4, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"d\", \"parameters\": {\"type\": \"object\"}}}],"
                " \"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"w?\"}, {\"role\": \"assistant\", \"content\": \"checking\","
                " \"tool_calls\": [{\"id\": \"t1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]},"
                " {\"role\": \"tool\", \"tool_call_id\": \"t1\", \"content\": \"sunny\"}]}");
    /* thinking */
    same_prompt("{\"max_tokens\": 4, \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 2}, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}",
                "{\"max_tokens\": 4, \"chat_template_kwargs\": {\"thinking\": true}, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}");
}

Test(server_parse, messages_errors) {
    expect_fail(srv_messages_parse, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", 400, "max_tokens");
    expect_fail(srv_messages_parse, "{\"max_tokens\": 2, \"messages\": []}", 400, "messages");
    expect_fail(srv_messages_parse, "{\"max_tokens\": 2, \"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}", 400, "messages");
    expect_fail(srv_messages_parse, "{\"max_tokens\": 2, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"source\": {}}]}]}", 400, "image");
    expect_fail(srv_messages_parse, "{\"max_tokens\": 2, \"bogus_field\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", 400, "bogus_field");
    expect_fail(srv_messages_parse, "{\"max_tokens\": 2, \"model\": \"claude\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", 404, "model");
    expect_fail(srv_messages_parse, "{\"max_tokens\": 2, \"tools\": [{\"name\": \"x\"}], \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", 400, "input_schema");
    expect_fail(srv_messages_parse,
                "{\"max_tokens\": 2, \"tools\": [{\"name\": \"x\", \"input_schema\": {}}], \"tool_choice\": {\"type\": \"tool\", \"name\": \"y\"}, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
                400, "tool_choice");
    expect_fail(srv_messages_parse,
                "{\"max_tokens\": 2, \"tools\": [{\"name\": \"x\", \"input_schema\": {}}], \"tool_choice\": {\"type\": \"sometimes\"}, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
                400, "tool_choice");
    expect_fail(srv_messages_parse,
                "{\"max_tokens\": 2, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": \"nope\", \"content\": \"x\"}]}]}",
                400, "messages");
    srv_req r;
    srv_err e;
    cr_assert_eq(run(srv_messages_parse,
                     "{\"max_tokens\": 2, \"tools\": [{\"name\": \"x\", \"input_schema\": {}}], \"tool_choice\": {\"type\": \"any\"}, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
                     &r, &e), 0, "%s", e.msg);
    cr_assert_eq(r.tool_choice, SRV_TC_REQUIRED);
    cr_assert_eq(r.n_ftools, 1);
    cr_assert_eq(r.ftools[0].n_params, 0);
    srv_req_free(&r);
}

Test(server_parse, count_tokens) {
    json_t *j;
    srv_err e;
    const char *b = "{\"model\": \"tiny\", \"system\": \"s\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}";
    cr_assert_eq(srv_parse_body(b, strlen(b), 64, &j, &e), 0);
    int n = 0;
    cr_assert_eq(srv_count_tokens_parse(srv, j, &n, &e), 0, "%s", e.msg);
    json_decref(j);
    srv_req r;
    cr_assert_eq(run(srv_messages_parse, "{\"max_tokens\": 3, \"system\": \"s\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", &r, &e), 0);
    cr_assert_eq(n, r.prompts[0].n);
    srv_req_free(&r);
    /* max_tokens is not a count_tokens field */
    b = "{\"max_tokens\": 3, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}";
    cr_assert_eq(srv_parse_body(b, strlen(b), 64, &j, &e), 0);
    cr_assert_neq(srv_count_tokens_parse(srv, j, &n, &e), 0);
    json_decref(j);
}

/* ---- field tables ----------------------------------------------------------------------------------- */

Test(server_parse, field_schema) {
    json_t *s = srv_fields_schema(srv_chat_fields, srv_n_chat_fields, "tiny", 512);
    cr_assert_not_null(s);
    cr_assert(json_is_false(json_object_get(s, "additionalProperties")));
    json_t *props = json_object_get(s, "properties");
    cr_assert_not_null(json_object_get(props, "messages"));
    cr_assert_null(json_object_get(props, "guided_json"), "unsupported fields are not advertised");
    json_t *tp = json_object_get(props, "top_p");
    cr_assert_eq(json_integer_value(json_object_get(tp, "exclusiveMinimum")), 0);
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(s, "required"), 0)), "messages");
    json_t *m = json_object_get(props, "model");
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(m, "enum"), 0)), "tiny");
    json_decref(s);
    s = srv_fields_schema(srv_completion_fields, srv_n_completion_fields, NULL, 512);
    char *t = json_dumps(s, 0);
    cr_assert(strstr(t, "\"maximum\": 511"), "token ids are bounded by the vocabulary");
    free(t);
    json_decref(s);
    /* every table entry: a known type or unsupported */
    for (int i = 0; i < srv_n_chat_fields; i++)
        cr_assert(srv_chat_fields[i].types || (srv_chat_fields[i].flags & SRV_F_UNSUPPORTED), "%s", srv_chat_fields[i].name);
}
