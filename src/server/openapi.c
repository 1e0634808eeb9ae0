/* openapi.c — GET /openapi.json: an OpenAPI 3.1 description of every route, built once at start.
 *
 * The request schemas are generated from the same field tables the handlers validate with
 * (util.h srv_fields_schema), so the document cannot drift from what the server accepts: every
 * accepted field with its type and range, required fields, and additionalProperties false (an
 * unknown field is a 400). Fields known from OpenAI / vLLM / Anthropic that minke rejects as
 * unsupported are left out. Responses: the success shape (JSON, or text/event-stream where a
 * request can stream) and the error shapes with their status codes.
 */
#include "server/srv.h"

#include <stdlib.h>
#include <string.h>

static json_t *ref(const char *name) {
    char b[128];
    snprintf(b, sizeof b, "#/components/schemas/%s", name);
    return json_pack("{s:s}", "$ref", b);
}

static json_t *err_responses(json_t *resp, const char *err_schema, int post) {
    static const struct { const char *code, *desc; } E[] = {
        {"400", "invalid request: the message names the field"}, {"401", "missing or wrong API key"},
        {"404", "unknown model or route"}, {"405", "wrong method"}, {"413", "body larger than --max-body-bytes"},
        {"429", "queue full (Retry-After)"}, {"500", "generation failed"}, {"503", "shutting down (Retry-After)"},
    };
    for (size_t i = 0; i < sizeof E / sizeof E[0]; i++) {
        if (!post && (!strcmp(E[i].code, "400") || !strcmp(E[i].code, "413") || !strcmp(E[i].code, "429"))) continue;
        json_object_set_new(resp, E[i].code, json_pack("{s:s, s:{s:{s:o}}}", "description", E[i].desc, "content",
                                                       "application/json", "schema", ref(err_schema)));
    }
    return resp;
}

/* A POST operation with a JSON body from a field table. */
static json_t *post_op(mk_srv *s, const char *summary, const char *op_id, const srv_field *f, int n, const char *ok_schema,
                       int can_stream, const char *err_schema, int auth) {
    json_t *ok_content = json_pack("{s:{s:o}}", "application/json", "schema", ref(ok_schema));
    if (can_stream)
        json_object_set_new(ok_content, "text/event-stream",
                            json_pack("{s:{s:s, s:s}}", "schema", "type", "string", "description", "server-sent events (stream=true)"));
    json_t *resp = json_pack("{s:{s:s, s:o}}", "200", "description", "OK", "content", ok_content);
    err_responses(resp, err_schema, 1);
    json_t *schema = srv_fields_schema(f, n, s->model_name, s->vocab);
    if (f == srv_tokenize_fields) {
        /* exactly one of prompt and messages: two alternatives */
        json_t *a = json_deep_copy(schema), *b = json_deep_copy(schema);
        json_object_del(json_object_get(a, "properties"), "messages");
        json_object_set_new(a, "required", json_pack("[s]", "prompt"));
        json_object_set_new(json_object_get(a, "properties"), "prompt", json_pack("{s:s}", "type", "string"));
        json_object_del(json_object_get(b, "properties"), "prompt");
        json_object_set_new(b, "required", json_pack("[s]", "messages"));
        json_object_set_new(json_object_get(b, "properties"), "messages", json_pack("{s:s, s:i}", "type", "array", "minItems", 1));
        json_decref(schema);
        schema = json_pack("{s:[o,o]}", "oneOf", a, b);
    }
    json_t *op = json_pack("{s:s, s:s, s:{s:b, s:{s:{s:o}}}, s:o}", "summary", summary, "operationId", op_id, "requestBody",
                           "required", 1, "content", "application/json", "schema", schema, "responses", resp);
    if (!auth) json_object_set_new(op, "security", json_array());
    return op;
}

static json_t *get_op(const char *summary, const char *op_id, const char *ctype, json_t *schema, int auth) {
    json_t *resp = json_pack("{s:{s:s, s:{s:{s:o}}}}", "200", "description", "OK", "content", ctype, "schema", schema);
    err_responses(resp, "OpenAIError", 0);
    json_t *op = json_pack("{s:s, s:s, s:o}", "summary", summary, "operationId", op_id, "responses", resp);
    if (!auth) json_object_set_new(op, "security", json_array());
    return op;
}

static json_t *schemas(void) {
    const char *txt =
        "{"
        "\"OpenAIError\":{\"type\":\"object\",\"required\":[\"error\"],\"properties\":{\"error\":{\"type\":\"object\","
        "\"required\":[\"message\",\"type\",\"param\",\"code\"],\"properties\":{\"message\":{\"type\":\"string\"},"
        "\"type\":{\"type\":\"string\"},\"param\":{\"type\":[\"string\",\"null\"]},\"code\":{\"type\":[\"string\",\"null\"]}}}}},"
        "\"AnthropicError\":{\"type\":\"object\",\"required\":[\"type\",\"error\"],\"properties\":{\"type\":{\"const\":\"error\"},"
        "\"error\":{\"type\":\"object\",\"required\":[\"type\",\"message\"],\"properties\":{\"type\":{\"type\":\"string\"},"
        "\"message\":{\"type\":\"string\"}}}}},"
        "\"Usage\":{\"type\":\"object\",\"required\":[\"prompt_tokens\",\"completion_tokens\",\"total_tokens\"],\"properties\":"
        "{\"prompt_tokens\":{\"type\":\"integer\"},\"completion_tokens\":{\"type\":\"integer\"},\"total_tokens\":{\"type\":\"integer\"}}},"
        "\"ChatCompletion\":{\"type\":\"object\",\"required\":[\"id\",\"object\",\"created\",\"model\",\"choices\",\"usage\"],"
        "\"properties\":{\"id\":{\"type\":\"string\"},\"object\":{\"const\":\"chat.completion\"},\"created\":{\"type\":\"integer\"},"
        "\"model\":{\"type\":\"string\"},\"usage\":{\"$ref\":\"#/components/schemas/Usage\"},\"choices\":{\"type\":\"array\","
        "\"items\":{\"type\":\"object\",\"required\":[\"index\",\"message\",\"finish_reason\"],\"properties\":{\"index\":"
        "{\"type\":\"integer\"},\"finish_reason\":{\"type\":\"string\"},\"stop_reason\":{\"type\":[\"string\",\"integer\",\"null\"]},"
        "\"logprobs\":{\"type\":[\"object\",\"null\"]},\"message\":{\"type\":\"object\",\"required\":[\"role\"],\"properties\":"
        "{\"role\":{\"const\":\"assistant\"},\"content\":{\"type\":[\"string\",\"null\"]},\"reasoning_content\":{\"type\":"
        "[\"string\",\"null\"]},\"tool_calls\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"id\":"
        "{\"type\":\"string\"},\"type\":{\"const\":\"function\"},\"function\":{\"type\":\"object\",\"properties\":{\"name\":"
        "{\"type\":\"string\"},\"arguments\":{\"type\":\"string\"}}}}}}}}}}}}},"
        "\"Completion\":{\"type\":\"object\",\"required\":[\"id\",\"object\",\"created\",\"model\",\"choices\",\"usage\"],"
        "\"properties\":{\"id\":{\"type\":\"string\"},\"object\":{\"const\":\"text_completion\"},\"created\":{\"type\":\"integer\"},"
        "\"model\":{\"type\":\"string\"},\"usage\":{\"$ref\":\"#/components/schemas/Usage\"},\"choices\":{\"type\":\"array\","
        "\"items\":{\"type\":\"object\",\"required\":[\"index\",\"text\",\"finish_reason\"],\"properties\":{\"index\":"
        "{\"type\":\"integer\"},\"text\":{\"type\":\"string\"},\"finish_reason\":{\"type\":\"string\"},\"logprobs\":"
        "{\"type\":[\"object\",\"null\"]}}}}}},"
        "\"Message\":{\"type\":\"object\",\"required\":[\"id\",\"type\",\"role\",\"model\",\"content\",\"stop_reason\",\"usage\"],"
        "\"properties\":{\"id\":{\"type\":\"string\"},\"type\":{\"const\":\"message\"},\"role\":{\"const\":\"assistant\"},"
        "\"model\":{\"type\":\"string\"},\"content\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"required\":[\"type\"]}},"
        "\"stop_reason\":{\"type\":\"string\",\"enum\":[\"end_turn\",\"max_tokens\",\"stop_sequence\",\"tool_use\"]},"
        "\"stop_sequence\":{\"type\":[\"string\",\"null\"]},\"usage\":{\"type\":\"object\",\"properties\":{\"input_tokens\":"
        "{\"type\":\"integer\"},\"output_tokens\":{\"type\":\"integer\"}}}}},"
        "\"CountTokens\":{\"type\":\"object\",\"required\":[\"input_tokens\"],\"properties\":{\"input_tokens\":{\"type\":\"integer\"}}},"
        "\"Tokenize\":{\"type\":\"object\",\"required\":[\"count\",\"max_model_len\",\"tokens\"],\"properties\":{\"count\":"
        "{\"type\":\"integer\"},\"max_model_len\":{\"type\":\"integer\"},\"tokens\":{\"type\":\"array\",\"items\":{\"type\":"
        "\"integer\"}},\"token_strs\":{\"type\":[\"array\",\"null\"],\"items\":{\"type\":\"string\"}}}},"
        "\"Detokenize\":{\"type\":\"object\",\"required\":[\"prompt\"],\"properties\":{\"prompt\":{\"type\":\"string\"}}},"
        "\"Model\":{\"type\":\"object\",\"required\":[\"id\",\"object\",\"created\",\"owned_by\"],\"properties\":{\"id\":"
        "{\"type\":\"string\"},\"object\":{\"const\":\"model\"},\"created\":{\"type\":\"integer\"},\"owned_by\":{\"type\":\"string\"},"
        "\"max_model_len\":{\"type\":\"integer\"}}},"
        "\"ModelList\":{\"type\":\"object\",\"required\":[\"object\",\"data\"],\"properties\":{\"object\":{\"const\":\"list\"},"
        "\"data\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/components/schemas/Model\"}}}},"
        "\"Version\":{\"type\":\"object\",\"required\":[\"version\"],\"properties\":{\"version\":{\"type\":\"string\"},"
        "\"commit\":{\"type\":\"string\"}}}"
        "}";
    return json_loads(txt, 0, NULL);
}

char *srv_openapi_build(mk_srv *s) {
    json_t *paths = json_object();
    json_object_set_new(paths, "/v1/chat/completions",
                        json_pack("{s:o}", "post", post_op(s, "Chat completion (OpenAI)", "createChatCompletion", srv_chat_fields,
                                                           srv_n_chat_fields, "ChatCompletion", 1, "OpenAIError", 1)));
    json_object_set_new(paths, "/v1/completions",
                        json_pack("{s:o}", "post", post_op(s, "Text completion (OpenAI)", "createCompletion", srv_completion_fields,
                                                           srv_n_completion_fields, "Completion", 1, "OpenAIError", 1)));
    json_object_set_new(paths, "/v1/messages",
                        json_pack("{s:o}", "post", post_op(s, "Message (Anthropic)", "createMessage", srv_messages_fields,
                                                           srv_n_messages_fields, "Message", 1, "AnthropicError", 1)));
    json_object_set_new(paths, "/v1/messages/count_tokens",
                        json_pack("{s:o}", "post", post_op(s, "Count a message's prompt tokens (Anthropic)", "countTokens",
                                                           srv_count_tokens_fields, srv_n_count_tokens_fields, "CountTokens", 0,
                                                           "AnthropicError", 1)));
    json_object_set_new(paths, "/tokenize",
                        json_pack("{s:o}", "post", post_op(s, "Tokenize a prompt or a conversation (vLLM)", "tokenize",
                                                           srv_tokenize_fields, srv_n_tokenize_fields, "Tokenize", 0, "OpenAIError", 1)));
    json_object_set_new(paths, "/detokenize",
                        json_pack("{s:o}", "post", post_op(s, "Token ids to text (vLLM)", "detokenize", srv_detokenize_fields,
                                                           srv_n_detokenize_fields, "Detokenize", 0, "OpenAIError", 1)));
    json_object_set_new(paths, "/v1/models", json_pack("{s:o}", "get", get_op("List models", "listModels", "application/json", ref("ModelList"), 1)));
    json_t *mget = get_op("Retrieve a model", "retrieveModel", "application/json", ref("Model"), 1);
    json_object_set_new(mget, "parameters",
                        json_pack("[{s:s, s:s, s:b, s:{s:s, s:[s]}}]", "name", "model", "in", "path", "required", 1, "schema", "type",
                                  "string", "enum", s->model_name));
    json_object_set_new(paths, "/v1/models/{model}", json_pack("{s:o}", "get", mget));
    json_t *health = json_pack("{s:s, s:s, s:{s:{s:s}, s:{s:s}}, s:[]}", "summary", "Liveness: 200 while serving, 503 while shutting down",
                               "operationId", "health", "responses", "200", "description", "serving", "503", "description",
                               "shutting down", "security");
    json_object_set_new(paths, "/health", json_pack("{s:o}", "get", health));
    json_object_set_new(paths, "/version", json_pack("{s:o}", "get", get_op("Version", "version", "application/json", ref("Version"), 0)));
    json_object_set_new(paths, "/metrics",
                        json_pack("{s:o}", "get", get_op("Prometheus metrics (vLLM names)", "metrics", "text/plain",
                                                         json_pack("{s:s}", "type", "string"), 0)));
    json_object_set_new(paths, "/openapi.json",
                        json_pack("{s:o}", "get", get_op("This document", "openapi", "application/json",
                                                         json_pack("{s:s}", "type", "object"), 0)));
    json_t *doc = json_pack("{s:s, s:{s:s, s:s, s:s}, s:o, s:{s:o, s:{s:{s:s, s:s}, s:{s:s, s:s, s:s}}}, s:[{s:[]}, {s:[]}]}",
                            "openapi", "3.1.0", "info", "title", "minke", "version", MK_VERSION, "description",
                            "minke's OpenAI-, Anthropic- and vLLM-compatible API",
                            "paths", paths, "components", "schemas", schemas(), "securitySchemes", "bearer", "type", "http",
                            "scheme", "bearer", "apiKey", "type", "apiKey", "in", "header", "name", "x-api-key",
                            "security", "bearer", "apiKey");
    char *out = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    return out;
}

int srv_h_openapi(const srv_http *h, srv_reply *rep) {
    rep->status = 200;
    rep->text = strdup(h->s->openapi ? h->s->openapi : "{}");
    rep->content_type = "application/json";
    return 0;
}
