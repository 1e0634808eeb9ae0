/* anthropic.c — POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API).
 *
 * A Messages request is converted into the OpenAI-style conversation the chat encodings take
 * (text/chat.h), so both APIs render a conversation to the same prompt:
 *   system (string or text blocks)        -> a system message
 *   user text blocks                       -> user content parts
 *   user tool_result blocks                -> tool messages (tool_call_id = tool_use_id), before
 *                                             the user's text, as Anthropic orders them
 *   assistant text / thinking / tool_use   -> content, reasoning_content, tool_calls (arguments =
 *                                             the input object)
 *   tools [{name, description, input_schema}] -> function tools; tool_choice auto / any / tool /
 *                                             none -> auto / required / named / none
 *   thinking {type: enabled}              -> DeepSeek-V4 thinking mode (budget_tokens is accepted
 *                                             and not enforced: max_tokens bounds the output)
 * Answers: content blocks thinking (signature ""), text, tool_use; stop_reason end_turn /
 * max_tokens / stop_sequence / tool_use; streamed as message_start, content_block_start / _delta /
 * _stop per block, message_delta (stop_reason, usage), message_stop. Errors use Anthropic's shape
 * {"type": "error", "error": {"type", "message"}} (http.c). vLLM's sampling extras (seed, min_p,
 * penalties, ...) are accepted as on the OpenAI routes.
 */
#include "server/srv.h"

#include <stdlib.h>
#include <string.h>

#define NUL SRV_T_NULL
#define RNG(lo, hi) SRV_F_RANGE, lo, hi
#define RNGX(lo, hi) SRV_F_RANGE | SRV_F_LO_EXCL, lo, hi

#define A_MESSAGES_SCHEMA                                                                            \
    "{\"type\":\"array\",\"minItems\":1,\"items\":{\"type\":\"object\",\"required\":[\"role\","     \
    "\"content\"],\"properties\":{\"role\":{\"type\":\"string\",\"enum\":[\"user\",\"assistant\"]}," \
    "\"content\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"array\",\"items\":{\"type\":"         \
    "\"object\",\"required\":[\"type\"],\"properties\":{\"type\":{\"type\":\"string\",\"enum\":"     \
    "[\"text\",\"thinking\",\"redacted_thinking\",\"tool_use\",\"tool_result\"]},\"text\":{\"type\":" \
    "\"string\"},\"thinking\":{\"type\":\"string\"},\"id\":{\"type\":\"string\"},\"name\":{\"type\":" \
    "\"string\"},\"input\":{\"type\":\"object\"},\"tool_use_id\":{\"type\":\"string\"},\"content\":"  \
    "{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"array\"}]}}}}]}}},\"description\":\"the "          \
    "conversation (Anthropic message objects)\"}"

#define A_SYSTEM_SCHEMA                                                                              \
    "{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"array\",\"items\":{\"type\":\"object\","          \
    "\"required\":[\"type\",\"text\"],\"properties\":{\"type\":{\"type\":\"string\",\"enum\":"       \
    "[\"text\"]},\"text\":{\"type\":\"string\"}}}},{\"type\":\"null\"}]}"

#define A_TOOLS_SCHEMA                                                                               \
    "{\"type\":[\"array\",\"null\"],\"items\":{\"type\":\"object\",\"required\":[\"name\","          \
    "\"input_schema\"],\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1},"              \
    "\"description\":{\"type\":\"string\"},\"input_schema\":{\"type\":\"object\"},\"type\":"         \
    "{\"type\":\"string\",\"enum\":[\"custom\"]}}},\"description\":\"client tools (DeepSeek-V4 "     \
    "models only)\"}"

#define A_TOOL_CHOICE_SCHEMA                                                                         \
    "{\"type\":[\"object\",\"null\"],\"required\":[\"type\"],\"properties\":{\"type\":{\"type\":"    \
    "\"string\",\"enum\":[\"auto\",\"any\",\"tool\",\"none\"]},\"name\":{\"type\":\"string\"},"      \
    "\"disable_parallel_tool_use\":{\"type\":\"boolean\"}}}"

#define A_THINKING_SCHEMA                                                                            \
    "{\"type\":[\"object\",\"null\"],\"required\":[\"type\"],\"properties\":{\"type\":{\"type\":"    \
    "\"string\",\"enum\":[\"enabled\",\"disabled\"]},\"budget_tokens\":{\"type\":\"integer\","       \
    "\"minimum\":1}},\"description\":\"DeepSeek-V4: enabled selects thinking mode\"}"

#define A_COMMON                                                                                     \
    {"model", SRV_T_STR | NUL, 0, 0, 0, "the served model name", NULL},                              \
    {"messages", SRV_T_ARR, SRV_F_REQUIRED, 0, 0, NULL, A_MESSAGES_SCHEMA},                          \
    {"system", SRV_T_STR | SRV_T_ARR | NUL, 0, 0, 0, NULL, A_SYSTEM_SCHEMA},                         \
    {"tools", SRV_T_ARR | NUL, 0, 0, 0, NULL, A_TOOLS_SCHEMA},                                       \
    {"tool_choice", SRV_T_OBJ | NUL, 0, 0, 0, NULL, A_TOOL_CHOICE_SCHEMA},                           \
    {"thinking", SRV_T_OBJ | NUL, 0, 0, 0, NULL, A_THINKING_SCHEMA},                                 \
    {"mcp_servers", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                                         \
    {"container", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                                           \
    {"context_management", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL}

const srv_field srv_messages_fields[] = {
    A_COMMON,
    {"max_tokens", SRV_T_INT, SRV_F_REQUIRED | SRV_F_RANGE, 1, 1073741824, "output tokens at most", NULL},
    {"stop_sequences", SRV_T_ARR | NUL, 0, 0, 0, NULL,
     "{\"type\":[\"array\",\"null\"],\"maxItems\":64,\"items\":{\"type\":\"string\",\"minLength\":1}}"},
    {"stream", SRV_T_BOOL | NUL, 0, 0, 0, "answer as server-sent events", NULL},
    {"temperature", SRV_T_NUM | NUL, RNG(0, 1e6), NULL, NULL},
    {"top_p", SRV_T_NUM | NUL, RNGX(0, 1), NULL, NULL},
    {"top_k", SRV_T_INT | NUL, RNG(0, 1073741824), "0 = off", NULL},
    {"metadata", SRV_T_OBJ | NUL, 0, 0, 0, "accepted and ignored", NULL},
    {"service_tier", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},
    /* vLLM's sampling extras */
    {"seed", SRV_T_INT | NUL, RNG(-9223372036854775807.0, 9223372036854775807.0), NULL, NULL},
    {"min_p", SRV_T_NUM | NUL, RNG(0, 1), NULL, NULL},
    {"presence_penalty", SRV_T_NUM | NUL, RNG(-2, 2), NULL, NULL},
    {"frequency_penalty", SRV_T_NUM | NUL, RNG(-2, 2), NULL, NULL},
    {"repetition_penalty", SRV_T_NUM | NUL, RNGX(0, 1e6), NULL, NULL},
    {"min_tokens", SRV_T_INT | NUL, RNG(0, 1073741824), NULL, NULL},
    {"ignore_eos", SRV_T_BOOL | NUL, 0, 0, 0, NULL, NULL},
    {"skip_special_tokens", SRV_T_BOOL | NUL, 0, 0, 0, NULL, NULL},
    {"priority", SRV_T_INT | NUL, RNG(-2147483648.0, 2147483647.0), NULL, NULL},
};
const int srv_n_messages_fields = (int)(sizeof srv_messages_fields / sizeof srv_messages_fields[0]);

const srv_field srv_count_tokens_fields[] = {A_COMMON};
const int srv_n_count_tokens_fields = (int)(sizeof srv_count_tokens_fields / sizeof srv_count_tokens_fields[0]);

/* ---- request -------------------------------------------------------------------------------------- */

/* Text of a tool_result's content: a string, or text blocks (as content parts). */
static json_t *result_content(const json_t *v, size_t i, size_t k, srv_err *e) {
    if (!v || json_is_null(v)) return json_string("");
    if (json_is_string(v)) return json_incref((json_t *)v);
    if (!json_is_array(v)) {
        srv_fail(e, 400, "messages", "messages[%zu].content[%zu].content must be a string or text blocks", i, k);
        return NULL;
    }
    json_t *parts = json_array();
    size_t j;
    json_t *b;
    json_array_foreach(v, j, b) {
        const char *ty = srv_get_str(b, "type");
        if (!ty || strcmp(ty, "text") || !json_is_string(json_object_get(b, "text"))) {
            json_decref(parts);
            srv_fail(e, 400, "messages", "messages[%zu].content[%zu].content[%zu]: only text blocks are supported in tool results", i, k, j);
            return NULL;
        }
        json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", json_object_get(b, "text")));
    }
    return parts;
}

/* Anthropic messages (+ system) -> OpenAI-style messages. NULL with e filled on bad input. */
static json_t *convert(const json_t *b, srv_err *e) {
    json_t *out = json_array();
    json_t *sys = json_object_get(b, "system");
    if (json_is_string(sys)) {
        json_array_append_new(out, json_pack("{s:s, s:O}", "role", "system", "content", sys));
    } else if (json_is_array(sys)) {
        json_t *parts = json_array();
        size_t i;
        json_t *blk;
        json_array_foreach(sys, i, blk) {
            const char *ty = srv_get_str(blk, "type");
            if (!ty || strcmp(ty, "text") || !json_is_string(json_object_get(blk, "text"))) {
                json_decref(parts);
                json_decref(out);
                srv_fail(e, 400, "system", "system[%zu] must be a text block {\"type\": \"text\", \"text\": ...}", i);
                return NULL;
            }
            json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", json_object_get(blk, "text")));
        }
        json_array_append_new(out, json_pack("{s:s, s:o}", "role", "system", "content", parts));
    }
    json_t *msgs = json_object_get(b, "messages");
    if (!json_array_size(msgs)) {
        json_decref(out);
        srv_fail(e, 400, "messages", "messages must be a non-empty array");
        return NULL;
    }
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_is_object(m) ? srv_get_str(m, "role") : NULL;
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant"))) {
            json_decref(out);
            srv_fail(e, 400, "messages", "messages[%zu].role must be \"user\" or \"assistant\"", i);
            return NULL;
        }
        int user = !strcmp(role, "user");
        json_t *c = json_object_get(m, "content");
        if (json_is_string(c)) {
            json_array_append_new(out, json_pack("{s:s, s:O}", "role", role, "content", c));
            continue;
        }
        if (!json_is_array(c)) {
            json_decref(out);
            srv_fail(e, 400, "messages", "messages[%zu].content must be a string or an array of content blocks", i);
            return NULL;
        }
        json_t *parts = json_array(), *calls = json_array(), *tools_msgs = json_array();
        srv_buf reasoning = {0};
        int has_reasoning = 0;
        size_t k;
        json_t *blk;
        const char *bad = NULL;
        json_array_foreach(c, k, blk) {
            const char *ty = json_is_object(blk) ? srv_get_str(blk, "type") : NULL;
            if (!ty) { bad = "a content block needs a type"; break; }
            if (!strcmp(ty, "text")) {
                json_t *t = json_object_get(blk, "text");
                if (!json_is_string(t)) { bad = "text blocks need a string text"; break; }
                json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", t));
            } else if (!strcmp(ty, "thinking") && !user) {
                const char *t = srv_get_str(blk, "thinking");
                if (!t) { bad = "thinking blocks need a string thinking"; break; }
                sb_puts(&reasoning, t);
                has_reasoning = 1;
            } else if (!strcmp(ty, "redacted_thinking") && !user) {
                /* opaque: nothing to render */
            } else if (!strcmp(ty, "tool_use") && !user) {
                const char *id = srv_get_str(blk, "id"), *name = srv_get_str(blk, "name");
                json_t *input = json_object_get(blk, "input");
                if (!id || !name || !json_is_object(input)) { bad = "tool_use blocks need id, name and an input object"; break; }
                json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:O}}", "id", id, "type", "function", "function",
                                                       "name", name, "arguments", input));
            } else if (!strcmp(ty, "tool_result") && user) {
                const char *id = srv_get_str(blk, "tool_use_id");
                if (!id) { bad = "tool_result blocks need a tool_use_id"; break; }
                json_t *rc = result_content(json_object_get(blk, "content"), i, k, e);
                if (!rc) {
                    json_decref(parts);
                    json_decref(calls);
                    json_decref(tools_msgs);
                    json_decref(out);
                    sb_free(&reasoning);
                    return NULL;
                }
                json_array_append_new(tools_msgs, json_pack("{s:s, s:s, s:o}", "role", "tool", "tool_call_id", id, "content", rc));
            } else {
                bad = NULL;
                json_decref(parts);
                json_decref(calls);
                json_decref(tools_msgs);
                json_decref(out);
                sb_free(&reasoning);
                srv_fail(e, 400, "messages", "messages[%zu].content[%zu]: content blocks of type '%s' are not supported in %s messages",
                         i, k, ty, role);
                return NULL;
            }
        }
        if (bad) {
            json_decref(parts);
            json_decref(calls);
            json_decref(tools_msgs);
            json_decref(out);
            sb_free(&reasoning);
            srv_fail(e, 400, "messages", "messages[%zu].content[%zu]: %s", i, k, bad);
            return NULL;
        }
        json_array_extend(out, tools_msgs);
        json_decref(tools_msgs);
        if (user) {
            if (json_array_size(parts)) json_array_append_new(out, json_pack("{s:s, s:o}", "role", "user", "content", parts));
            else json_decref(parts);
            json_decref(calls);
        } else {
            /* one text block is plain content (as the same turn sent through the OpenAI route) */
            json_t *content = json_array_size(parts) == 1 ? json_incref(json_object_get(json_array_get(parts, 0), "text"))
                                                          : json_array_size(parts) ? json_incref(parts) : json_string("");
            json_decref(parts);
            json_t *am = json_pack("{s:s, s:o}", "role", "assistant", "content", content);
            if (has_reasoning) json_object_set_new(am, "reasoning_content", json_string(reasoning.p ? reasoning.p : ""));
            if (json_array_size(calls)) json_object_set_new(am, "tool_calls", calls);
            else json_decref(calls);
            json_array_append_new(out, am);
        }
        sb_free(&reasoning);
    }
    return out;
}

/* tools -> OpenAI tool objects (validated). */
static json_t *convert_tools(const json_t *tools, srv_err *e) {
    json_t *out = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        if (!json_is_object(t)) {
            json_decref(out);
            srv_fail(e, 400, "tools", "tools[%zu] must be an object", i);
            return NULL;
        }
        const char *k;
        json_t *v;
        json_object_foreach(t, k, v) {
            if (!strcmp(k, "type")) {
                if (!json_is_string(v) || strcmp(json_string_value(v), "custom")) {
                    json_decref(out);
                    srv_fail(e, 400, "tools", "tools[%zu]: tools of type '%s' are not supported (only client tools)", i,
                             json_is_string(v) ? json_string_value(v) : "?");
                    return NULL;
                }
            } else if (strcmp(k, "name") && strcmp(k, "description") && strcmp(k, "input_schema") && strcmp(k, "cache_control")) {
                json_decref(out);
                srv_fail(e, 400, "tools", "unknown field 'tools[%zu].%s'", i, k);
                return NULL;
            }
        }
        const char *name = srv_get_str(t, "name");
        json_t *schema = json_object_get(t, "input_schema"), *desc = json_object_get(t, "description");
        if (!name || !*name) {
            json_decref(out);
            srv_fail(e, 400, "tools", "tools[%zu].name must be a non-empty string", i);
            return NULL;
        }
        if (!json_is_object(schema)) {
            json_decref(out);
            srv_fail(e, 400, "tools", "tools[%zu].input_schema must be an object (a JSON schema)", i);
            return NULL;
        }
        if (desc && !json_is_string(desc)) {
            json_decref(out);
            srv_fail(e, 400, "tools", "tools[%zu].description must be a string", i);
            return NULL;
        }
        /* key order as OpenAI tools are written (it shows in the DSML tool schemas) */
        json_t *fo = json_pack("{s:s}", "name", name);
        if (desc) json_object_set(fo, "description", desc);
        json_object_set(fo, "parameters", schema);
        json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fo));
    }
    return out;
}

/* The shared part of messages and count_tokens: conversation, tools, tool_choice, thinking ->
 * r's prompt. */
static int build_prompt(mk_srv *s, const json_t *b, srv_req *r, srv_err *e) {
    json_t *tools = NULL;
    json_t *tv = json_object_get(b, "tools");
    if (json_is_array(tv) && !(tools = convert_tools(tv, e))) return -1;
    const char *named = NULL;
    size_t n_tools = json_array_size(tools);
    r->tool_choice = n_tools ? SRV_TC_AUTO : SRV_TC_NONE;
    json_t *tc = json_object_get(b, "tool_choice");
    int rc = -1;
    json_t *msgs = NULL, *use_tools = NULL;
    if (json_is_object(tc)) {
        const char *k;
        json_t *v;
        json_object_foreach(tc, k, v) if (strcmp(k, "type") && strcmp(k, "name") && strcmp(k, "disable_parallel_tool_use")) {
            srv_fail(e, 400, "tool_choice", "unknown field 'tool_choice.%s'", k);
            goto out;
        }
        const char *ty = srv_get_str(tc, "type");
        if (!ty) { srv_fail(e, 400, "tool_choice", "tool_choice.type must be a string"); goto out; }
        if (!strcmp(ty, "auto")) r->tool_choice = n_tools ? SRV_TC_AUTO : SRV_TC_NONE;
        else if (!strcmp(ty, "none")) r->tool_choice = SRV_TC_NONE;
        else if (!strcmp(ty, "any")) r->tool_choice = SRV_TC_REQUIRED;
        else if (!strcmp(ty, "tool")) {
            named = srv_get_str(tc, "name");
            if (!named) { srv_fail(e, 400, "tool_choice", "tool_choice {type: tool} needs a name"); goto out; }
            r->tool_choice = SRV_TC_NAMED;
        } else {
            srv_fail(e, 400, "tool_choice", "tool_choice.type must be auto, any, tool or none, got '%s'", ty);
            goto out;
        }
        if (r->tool_choice >= SRV_TC_REQUIRED && !n_tools) {
            srv_fail(e, 400, "tool_choice", "tool_choice '%s' needs tools", ty);
            goto out;
        }
        if (named) {
            size_t i;
            json_t *t;
            int found = 0;
            json_array_foreach(tools, i, t) if (!strcmp(srv_get_str(json_object_get(t, "function"), "name"), named)) found = 1;
            if (!found) { srv_fail(e, 400, "tool_choice", "tool_choice names '%s', which is not in tools", named); goto out; }
        }
    }
    int dsv4 = mk_chat_is_dsv4(s->chat);
    if (!dsv4 && r->tool_choice != SRV_TC_NONE) {
        srv_fail(e, 400, "tools", "tools are not supported by this model (%s chat template); only DeepSeek-V4 models take tools",
                 mk_chat_template_name(s->chat));
        goto out;
    }
    json_t *th = json_object_get(b, "thinking");
    int thinking = 0;
    if (json_is_object(th)) {
        const char *k;
        json_t *v;
        json_object_foreach(th, k, v) if (strcmp(k, "type") && strcmp(k, "budget_tokens")) {
            srv_fail(e, 400, "thinking", "unknown field 'thinking.%s'", k);
            goto out;
        }
        const char *ty = srv_get_str(th, "type");
        long long bt;
        json_t *btv = json_object_get(th, "budget_tokens");
        if (!ty || (strcmp(ty, "enabled") && strcmp(ty, "disabled"))) {
            srv_fail(e, 400, "thinking", "thinking.type must be enabled or disabled");
            goto out;
        }
        if (btv && (!srv_json_int(btv, &bt) || bt < 1)) {
            srv_fail(e, 400, "thinking", "thinking.budget_tokens must be a positive integer");
            goto out;
        }
        thinking = !strcmp(ty, "enabled");
    }
    r->thinking = dsv4 && thinking;
    r->parse_tools = dsv4 && r->tool_choice != SRV_TC_NONE;
    if (dsv4 && r->tool_choice >= SRV_TC_REQUIRED && srv_forced_tools(r, tools, named, e)) goto out;
    if (!(msgs = convert(b, e))) goto out;
    if (r->tool_choice == SRV_TC_NAMED) {
        use_tools = json_array();
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t) if (!strcmp(srv_get_str(json_object_get(t, "function"), "name"), named))
            json_array_append(use_tools, t);
    } else if (r->tool_choice != SRV_TC_NONE) {
        use_tools = json_incref(tools);
    }
    rc = srv_render_prompt(s, msgs, use_tools, r->thinking, NULL, 1, r, e);
out:
    json_decref(msgs);
    json_decref(use_tools);
    json_decref(tools);
    return rc;
}

int srv_messages_parse(mk_srv *s, const json_t *b, srv_req *r, srv_err *e) {
    memset(r, 0, sizeof *r);
    r->api = SRV_API_MESSAGES;
    mk_chat_sampling_defaults(s->chat, &r->sp);
    r->skip_special = 1;
    r->n = 1;
    if (srv_check_fields(b, srv_messages_fields, srv_n_messages_fields, NULL, e)) return -1;
    if (srv_check_model(s, b, r, e)) return -1;
    srv_get_bool(b, "stream", &r->stream);
    if (srv_parse_sampling(s, b, r, e)) return -1;
    if (srv_parse_stops(json_object_get(b, "stop_sequences"), "stop_sequences", r, e)) return -1;
    if (build_prompt(s, b, r, e)) return -1;
    long long mt = 0;
    srv_get_int(b, "max_tokens", &mt);
    if (srv_resolve_max_tokens(s, r, mt, 1, e)) return -1;
    mk_err err = {0};
    if (mk_sampling_validate(&r->sp, s->vocab, &err)) return srv_fail(e, 400, NULL, "%s", err.msg);
    return 0;
}

int srv_count_tokens_parse(mk_srv *s, const json_t *b, int *n_tokens, srv_err *e) {
    srv_req r;
    memset(&r, 0, sizeof r);
    r.api = SRV_API_MESSAGES;
    r.n = 1;
    int rc = srv_check_fields(b, srv_count_tokens_fields, srv_n_count_tokens_fields, NULL, e);
    if (!rc) rc = srv_check_model(s, b, &r, e);
    if (!rc) rc = build_prompt(s, b, &r, e);
    if (!rc) *n_tokens = r.prompts[0].n;
    srv_req_free(&r);
    return rc;
}

/* ---- answers ------------------------------------------------------------------------------------ */

static const char *stop_reason(const srv_choice *c) {
    if (c->stop_str >= 0) return "stop_sequence";
    if (c->calls.n) return "tool_use";
    if (c->finish && !strcmp(c->finish, "length")) return "max_tokens";
    return "end_turn";
}

static json_t *stop_seq(const srv_choice *c, const srv_req *r) {
    return c->stop_str >= 0 && c->stop_str < r->n_stops ? json_string(r->stops[c->stop_str]) : json_null();
}

static json_t *tool_use_block(const srv_call *call) {
    json_t *input = json_loads(call->args, 0, NULL);
    if (!json_is_object(input)) {
        json_decref(input);
        input = json_object();
    }
    return json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", call->id, "name", call->name, "input", input);
}

json_t *srv_messages_response(srv_gen *g) {
    srv_choice *c = &g->ch[0];
    srv_req *r = g->r;
    json_t *content = json_array();
    if (r->thinking && c->reasoning.n)
        json_array_append_new(content, json_pack("{s:s, s:s%, s:s}", "type", "thinking", "thinking", c->reasoning.p, c->reasoning.n,
                                                 "signature", ""));
    if (c->content.n || (!json_array_size(content) && !c->calls.n))
        json_array_append_new(content, json_pack("{s:s, s:s%}", "type", "text", "text", c->content.p ? c->content.p : "", c->content.n));
    for (int i = 0; i < c->calls.n; i++) json_array_append_new(content, tool_use_block(&c->calls.v[i]));
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:{s:i, s:i}}", "id", g->id, "type", "message", "role", "assistant",
                     "model", r->model, "content", content, "stop_reason", stop_reason(c), "stop_sequence", stop_seq(c, r),
                     "usage", "input_tokens", g->prompt_tokens, "output_tokens", c->n_gen);
}

enum { BLK_NONE, BLK_THINKING, BLK_TEXT };

static void ev(srv_stream *st, const char *type, json_t *data) {
    json_object_set_new(data, "type", json_string(type));
    sb_sse(&st->out, type, data);
    json_decref(data);
}

static void close_block(srv_stream *st) {
    if (!st->blk_open) return;
    ev(st, "content_block_stop", json_pack("{s:i}", "index", st->blk_index));
    st->blk_open = 0;
    st->blk_index++;
}

static void text_delta(srv_stream *st, int kind, const char *t, size_t n) {
    if (!n) return;
    if (st->blk_open && st->blk_kind != kind) close_block(st);
    if (!st->blk_open) {
        json_t *cb = kind == BLK_THINKING ? json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", "")
                                          : json_pack("{s:s, s:s}", "type", "text", "text", "");
        ev(st, "content_block_start", json_pack("{s:i, s:o}", "index", st->blk_index, "content_block", cb));
        st->blk_open = 1;
        st->blk_kind = kind;
    }
    json_t *d = kind == BLK_THINKING ? json_pack("{s:s, s:s%}", "type", "thinking_delta", "thinking", t, n)
                                     : json_pack("{s:s, s:s%}", "type", "text_delta", "text", t, n);
    ev(st, "content_block_delta", json_pack("{s:i, s:o}", "index", st->blk_index, "delta", d));
}

static int msg_delta(void *ctx, srv_gen *g, const srv_delta *d) {
    srv_stream *st = ctx;
    srv_choice *c = d->c;
    if (g->r->thinking) text_delta(st, BLK_THINKING, d->reasoning, d->reasoning_len);
    else text_delta(st, BLK_TEXT, d->reasoning, d->reasoning_len);
    text_delta(st, BLK_TEXT, d->content, d->content_len);
    for (int i = d->call_from; i < d->call_to; i++) {
        close_block(st);
        json_t *cb = json_pack("{s:s, s:s, s:s, s:{}}", "type", "tool_use", "id", c->calls.v[i].id, "name", c->calls.v[i].name, "input");
        ev(st, "content_block_start", json_pack("{s:i, s:o}", "index", st->blk_index, "content_block", cb));
        ev(st, "content_block_delta", json_pack("{s:i, s:{s:s, s:s}}", "index", st->blk_index, "delta", "type", "input_json_delta",
                                                "partial_json", c->calls.v[i].args));
        st->blk_open = 1;
        st->blk_kind = BLK_NONE;
        close_block(st);
    }
    if (d->finished) {
        if (c->finish && !strcmp(c->finish, "error")) {
            srv_err e;
            srv_fail(&e, 500, NULL, "generation failed: %s", c->errmsg);
            json_t *ej = srv_err_anthropic(&e);
            sb_sse(&st->out, "error", ej);
            json_decref(ej);
        }
        if (!st->blk_open && st->blk_index == 0) { /* no block at all: an empty text block */
            ev(st, "content_block_start", json_pack("{s:i, s:{s:s, s:s}}", "index", 0, "content_block", "type", "text", "text", ""));
            st->blk_open = 1;
        }
        close_block(st);
        ev(st, "message_delta", json_pack("{s:{s:s, s:o}, s:{s:i}}", "delta", "stop_reason", stop_reason(c), "stop_sequence",
                                          stop_seq(c, g->r), "usage", "output_tokens", c->n_gen));
        ev(st, "message_stop", json_object());
        st->done = 1;
    }
    return 0;
}

int srv_messages_produce(srv_stream *st, double timeout_s) {
    srv_gen *g = st->g;
    if (!st->begun) {
        st->begun = 1;
        json_t *msg = json_pack("{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:{s:i, s:i}}", "id", g->id, "type", "message", "role",
                                "assistant", "model", g->r->model, "content", "stop_reason", "stop_sequence", "usage",
                                "input_tokens", g->prompt_tokens, "output_tokens", 0);
        ev(st, "message_start", json_pack("{s:o}", "message", msg));
        return 0;
    }
    if (g->n_done == g->n_ch) { /* finished before the stream began (a forced call without parameters) */
        srv_delta d = {.c = &g->ch[0], .content = "", .reasoning = "", .call_from = 0, .call_to = g->ch[0].calls.n, .finished = 1};
        return msg_delta(st, g, &d);
    }
    srv_gen_poll(g, timeout_s, msg_delta, st);
    return 0;
}

int srv_h_count_tokens(const srv_http *h, json_t *body, srv_reply *rep) {
    rep->anthropic = 1;
    srv_err e = {0};
    int n = 0;
    if (srv_count_tokens_parse(h->s, body, &n, &e)) return srv_reply_err(rep, &e);
    rep->status = 200;
    rep->json = json_pack("{s:i}", "input_tokens", n);
    rep->prompt_tokens = n;
    return 0;
}
