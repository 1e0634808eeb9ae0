/* openai.c — POST /v1/chat/completions and POST /v1/completions: the field tables (what each
 * endpoint accepts, which doubles as its OpenAPI schema), JSON -> srv_req, and the answers
 * (JSON objects, or server-sent events as the OpenAI SDKs read them).
 *
 * Semantics follow vLLM's OpenAI server where OpenAI leaves room: sampling fields with vLLM's
 * names and defaults (the model's generation_config.json), max_tokens defaulting to the room left
 * in the context for chat and to 16 for completions, n choices as n engine requests (child i of a
 * seeded request uses seed + i), `stop_reason` next to `finish_reason` (the stop string or stop
 * token id that ended a choice), reasoning_content for DeepSeek-V4's thinking mode, DSML tool
 * calls as `tool_calls`. Differences are listed in server.h.
 */
#include "server/srv.h"

#include "text/chat_dsv4.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define RNG(lo, hi) SRV_F_RANGE, lo, hi
#define RNGX(lo, hi) SRV_F_RANGE | SRV_F_LO_EXCL, lo, hi
#define NUL SRV_T_NULL

/* ---- field tables ------------------------------------------------------------------------------ */

#define MESSAGES_SCHEMA                                                                              \
    "{\"type\":\"array\",\"minItems\":1,\"items\":{\"type\":\"object\",\"required\":[\"role\"],"    \
    "\"properties\":{\"role\":{\"type\":\"string\",\"enum\":[\"system\",\"user\",\"assistant\","    \
    "\"tool\",\"developer\"]},\"content\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"},"    \
    "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"required\":[\"type\",\"text\"],"           \
    "\"properties\":{\"type\":{\"type\":\"string\",\"enum\":[\"text\"]},\"text\":{\"type\":"         \
    "\"string\"}}}}]},\"name\":{\"type\":\"string\"},\"reasoning_content\":{\"type\":[\"string\","   \
    "\"null\"]},\"tool_call_id\":{\"type\":\"string\"},\"tool_calls\":{\"type\":\"array\","          \
    "\"items\":{\"type\":\"object\",\"required\":[\"type\",\"function\"],\"properties\":{\"id\":"     \
    "{\"type\":\"string\"},\"type\":{\"type\":\"string\",\"enum\":[\"function\"]},\"function\":"     \
    "{\"type\":\"object\",\"required\":[\"name\",\"arguments\"],\"properties\":{\"name\":{\"type\":" \
    "\"string\"},\"arguments\":{\"type\":\"string\"}}}}}}}},\"description\":\"the conversation "     \
    "(OpenAI message objects); DeepSeek-V4 models also take tool messages, tool_calls and "         \
    "reasoning_content; GGUF chat templates take system, user and assistant text\"}"

#define TOOLS_SCHEMA                                                                                 \
    "{\"type\":[\"array\",\"null\"],\"items\":{\"type\":\"object\",\"required\":[\"type\","          \
    "\"function\"],\"additionalProperties\":false,\"properties\":{\"type\":{\"type\":\"string\","    \
    "\"enum\":[\"function\"]},\"function\":{\"type\":\"object\",\"required\":[\"name\"],"            \
    "\"additionalProperties\":false,\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1}," \
    "\"description\":{\"type\":\"string\"},\"parameters\":{\"type\":\"object\"},\"strict\":"        \
    "{\"type\":[\"boolean\",\"null\"]}}}}},\"description\":\"function tools (DeepSeek-V4 models "   \
    "only: rendered as DSML, calls parsed back into tool_calls)\"}"

#define STOP_SCHEMA                                                                                  \
    "{\"anyOf\":[{\"type\":\"string\",\"minLength\":1},{\"type\":\"array\",\"maxItems\":64,"         \
    "\"items\":{\"type\":\"string\",\"minLength\":1}},{\"type\":\"null\"}],\"description\":"         \
    "\"stop strings: the output ends before the first match (include_stop_str_in_output keeps it)\"}"

#define BIAS_SCHEMA                                                                                  \
    "{\"type\":[\"object\",\"null\"],\"additionalProperties\":{\"type\":\"number\",\"minimum\":"     \
    "-100,\"maximum\":100},\"description\":\"token id (decimal string) -> bias added to its logit\"}"

#define STREAM_OPTS_SCHEMA                                                                           \
    "{\"type\":[\"object\",\"null\"],\"additionalProperties\":false,\"properties\":"                 \
    "{\"include_usage\":{\"type\":[\"boolean\",\"null\"]},\"continuous_usage_stats\":{\"type\":"    \
    "[\"boolean\",\"null\"]}},\"description\":\"only with stream=true\"}"

#define STOP_IDS_SCHEMA                                                                              \
    "{\"type\":[\"array\",\"null\"],\"maxItems\":256,\"items\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":\"VOCAB_MAX\"}," \
    "\"description\":\"token ids that end generation (ids must be in the vocabulary)\"}"

/* Sampling and limits shared by chat and completions (vLLM's names). */
#define SAMPLING_FIELDS                                                                              \
    {"model", SRV_T_STR | NUL, 0, 0, 0, "the served model name (optional)", NULL},                   \
    {"temperature", SRV_T_NUM | NUL, RNG(0, 1e6), "sampling temperature; 0 = greedy", NULL},        \
    {"top_p", SRV_T_NUM | NUL, RNGX(0, 1), "nucleus sampling mass", NULL},           \
    {"top_k", SRV_T_INT | NUL, RNG(-1, 1073741824), "keep the k best tokens; -1 or 0 = off", NULL}, \
    {"min_p", SRV_T_NUM | NUL, RNG(0, 1), "drop tokens below min_p x the best probability", NULL},  \
    {"presence_penalty", SRV_T_NUM | NUL, RNG(-2, 2), NULL, NULL},                                   \
    {"frequency_penalty", SRV_T_NUM | NUL, RNG(-2, 2), NULL, NULL},                                  \
    {"repetition_penalty", SRV_T_NUM | NUL, RNGX(0, 1e6), "1 = off", NULL},          \
    {"seed", SRV_T_INT | NUL, RNG(-9223372036854775807.0, 9223372036854775807.0),                  \
     "the same seed gives the same tokens; choice i of n uses seed + i", NULL},                      \
    {"n", SRV_T_INT | NUL, RNG(1, SRV_MAX_N), "choices to generate", NULL},                          \
    {"stream", SRV_T_BOOL | NUL, 0, 0, 0, "answer as server-sent events", NULL},                     \
    {"stream_options", SRV_T_OBJ | NUL, 0, 0, 0, NULL, STREAM_OPTS_SCHEMA},                          \
    {"stop", SRV_T_STR | SRV_T_ARR | NUL, 0, 0, 0, NULL, STOP_SCHEMA},                               \
    {"logit_bias", SRV_T_OBJ | NUL, 0, 0, 0, NULL, BIAS_SCHEMA},                                     \
    {"user", SRV_T_STR | NUL, 0, 0, 0, "accepted and ignored", NULL},                                \
    {"min_tokens", SRV_T_INT | NUL, RNG(0, 1073741824), "stop tokens are masked until this many", NULL}, \
    {"stop_token_ids", SRV_T_ARR | NUL, 0, 0, 0, NULL, STOP_IDS_SCHEMA},                             \
    {"ignore_eos", SRV_T_BOOL | NUL, 0, 0, 0, "keep generating after EOS", NULL},                    \
    {"skip_special_tokens", SRV_T_BOOL | NUL, 0, 0, 0, "leave special tokens out of the text (default true)", NULL}, \
    {"include_stop_str_in_output", SRV_T_BOOL | NUL, 0, 0, 0, NULL, NULL},                           \
    {"priority", SRV_T_INT | NUL, RNG(-2147483648.0, 2147483647.0), "lower runs first", NULL},      \
    {"cache_salt", SRV_T_STR | NUL, 0, 0, 0, "accepted (minke has no prefix cache to isolate)", NULL}, \
    {"response_format", SRV_T_OBJ | NUL, 0, 0, 0, NULL,                                              \
     "{\"type\":[\"object\",\"null\"],\"required\":[\"type\"],\"additionalProperties\":false,"       \
     "\"properties\":{\"type\":{\"type\":\"string\",\"enum\":[\"text\"]}},\"description\":"          \
     "\"only {type: text}; json_object and json_schema are not supported\"}"},                       \
    /* known, not supported: any non-null value is a 400 saying so */                                \
    {"best_of", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                                             \
    {"use_beam_search", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                                     \
    {"length_penalty", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                                      \
    {"prompt_logprobs", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                                     \
    {"guided_json", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                                         \
    {"guided_regex", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                                        \
    {"guided_choice", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                                       \
    {"guided_grammar", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                                      \
    {"guided_decoding_backend", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                             \
    {"structured_outputs", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                                  \
    {"logits_processors", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                                   \
    {"truncate_prompt_tokens", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                              \
    {"return_tokens_as_token_ids", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                          \
    {"kv_transfer_params", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                                  \
    {"vllm_xargs", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                                          \
    {"service_tier", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                                        \
    {"store", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                                               \
    {"metadata", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                                            \
    {"prompt_cache_key", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},                                    \
    {"safety_identifier", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL}

const srv_field srv_chat_fields[] = {
    {"messages", SRV_T_ARR, SRV_F_REQUIRED, 0, 0, NULL, MESSAGES_SCHEMA},
    SAMPLING_FIELDS,
    {"max_tokens", SRV_T_INT | NUL, RNG(1, 1073741824), "output tokens at most (default: the room left in the context)", NULL},
    {"max_completion_tokens", SRV_T_INT | NUL, RNG(1, 1073741824), "as max_tokens (takes precedence)", NULL},
    {"logprobs", SRV_T_BOOL | NUL, 0, 0, 0, "return each output token's logprob", NULL},
    {"top_logprobs", SRV_T_INT | NUL, RNG(0, MK_SAMPLER_MAX_TOP_LOGPROBS), "alternatives per token (needs logprobs)", NULL},
    {"tools", SRV_T_ARR | NUL, 0, 0, 0, NULL, TOOLS_SCHEMA},
    {"tool_choice", SRV_T_STR | SRV_T_OBJ | NUL, 0, 0, 0, NULL,
     "{\"anyOf\":[{\"type\":\"string\",\"enum\":[\"none\",\"auto\",\"required\"]},{\"type\":\"object\","
     "\"required\":[\"type\",\"function\"],\"additionalProperties\":false,\"properties\":{\"type\":"
     "{\"type\":\"string\",\"enum\":[\"function\"]},\"function\":{\"type\":\"object\",\"required\":"
     "[\"name\"],\"additionalProperties\":false,\"properties\":{\"name\":{\"type\":\"string\"}}}}},"
     "{\"type\":\"null\"}]}"},
    {"parallel_tool_calls", SRV_T_BOOL | NUL, 0, 0, 0, "accepted; every call the model writes is returned", NULL},
    {"reasoning_effort", SRV_T_STR | NUL, 0, 0, 0, NULL,
     "{\"type\":[\"string\",\"null\"],\"enum\":[\"none\",\"minimal\",\"low\",\"medium\",\"high\",\"max\",null],"
     "\"description\":\"DeepSeek-V4: any value but none turns thinking mode on; max adds the "
     "maximum-effort instruction\"}"},
    {"chat_template_kwargs", SRV_T_OBJ | NUL, 0, 0, 0, NULL,
     "{\"type\":[\"object\",\"null\"],\"additionalProperties\":false,\"properties\":{\"thinking\":"
     "{\"type\":\"boolean\"},\"enable_thinking\":{\"type\":\"boolean\"}},\"description\":"
     "\"DeepSeek-V4: thinking (or enable_thinking) selects thinking mode\"}"},
    {"add_generation_prompt", SRV_T_BOOL | NUL, 0, 0, 0, "end the prompt with the assistant turn's opening (default true)", NULL},
    {"continue_final_message", SRV_T_BOOL | NUL, 0, 0, 0, "only false is supported", "{\"type\":[\"boolean\",\"null\"],\"enum\":[false,null]}"},
    {"echo", SRV_T_BOOL | NUL, 0, 0, 0, "only false is supported", "{\"type\":[\"boolean\",\"null\"],\"enum\":[false,null]}"},
    {"functions", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},
    {"function_call", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},
    {"audio", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},
    {"modalities", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},
    {"prediction", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},
    {"web_search_options", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},
    {"verbosity", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},
    {"documents", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},
    {"chat_template", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},
    {"mm_processor_kwargs", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},
};
const int srv_n_chat_fields = (int)(sizeof srv_chat_fields / sizeof srv_chat_fields[0]);

const srv_field srv_completion_fields[] = {
    {"prompt", SRV_T_STR | SRV_T_ARR, SRV_F_REQUIRED, 0, 0, NULL,
     "{\"anyOf\":[{\"type\":\"string\",\"minLength\":1},{\"type\":\"array\",\"minItems\":1,\"maxItems\":64,\"items\":"
     "{\"type\":\"string\",\"minLength\":1}},{\"type\":\"array\",\"minItems\":1,\"items\":{\"type\":\"integer\","
     "\"minimum\":0,\"maximum\":\"VOCAB_MAX\"}},{\"type\":\"array\",\"minItems\":1,\"maxItems\":64,\"items\":{\"type\":"
     "\"array\",\"minItems\":1,\"items\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":\"VOCAB_MAX\"}}}],\"description\":"
     "\"text, token ids, or a batch of either (one choice group per prompt)\"}"},
    SAMPLING_FIELDS,
    {"max_tokens", SRV_T_INT | NUL, RNG(1, 1073741824), "output tokens at most (default 16; null: the room left in the context)", NULL},
    {"logprobs", SRV_T_INT | NUL, RNG(0, MK_SAMPLER_MAX_TOP_LOGPROBS), "return logprobs with this many alternatives per token", NULL},
    {"echo", SRV_T_BOOL | NUL, 0, 0, 0, "put the prompt text before the output (not with logprobs)", NULL},
    {"add_special_tokens", SRV_T_BOOL | NUL, 0, 0, 0, "apply the tokenizer's post-processor, e.g. BOS (default true)", NULL},
    {"suffix", 0, SRV_F_UNSUPPORTED, 0, 0, NULL, NULL},
};
const int srv_n_completion_fields = (int)(sizeof srv_completion_fields / sizeof srv_completion_fields[0]);

static const srv_field stream_opts_fields[] = {
    {"include_usage", SRV_T_BOOL | NUL, 0, 0, 0, NULL, NULL},
    {"continuous_usage_stats", SRV_T_BOOL | NUL, 0, 0, 0, NULL, NULL},
};

/* ---- shared request pieces ---------------------------------------------------------------------- */

void srv_req_free(srv_req *r) {
    if (!r) return;
    free(r->model);
    for (int i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].ids);
        free(r->prompts[i].text);
    }
    free(r->prompts);
    free(r->bias_ids);
    free(r->bias_vals);
    free(r->stop_ids);
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    free(r->stops);
    for (int i = 0; i < r->n_ftools; i++) {
        for (int k = 0; k < r->ftools[i].n_params; k++) free(r->ftools[i].params[k].name);
        free(r->ftools[i].params);
        free(r->ftools[i].name);
    }
    free(r->ftools);
    free(r->prompt_text);
    free(r->cache_salt);
    memset(r, 0, sizeof *r);
}

int srv_check_model(mk_srv *s, const json_t *body, srv_req *r, srv_err *e) {
    const char *m = srv_get_str(body, "model");
    if (m && strcmp(m, s->model_name)) {
        srv_fail(e, 404, "model", "The model `%s` does not exist (this server serves `%s`).", m, s->model_name);
        e->code = "model_not_found";
        return -1;
    }
    free(r->model);
    r->model = strdup(s->model_name);
    return r->model ? 0 : srv_fail(e, 500, NULL, "out of memory");
}

int srv_resolve_max_tokens(mk_srv *s, srv_req *r, long long asked, int has_asked, srv_err *e) {
    int L = s->max_model_len, longest = 0;
    for (int i = 0; i < r->n_prompts; i++)
        if (r->prompts[i].n > longest) longest = r->prompts[i].n;
    if (longest >= L)
        return srv_fail(e, 400, "messages",
                        "This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input.",
                        L, longest);
    if (!has_asked) asked = L - longest;
    if (asked < 1) return srv_fail(e, 400, "max_tokens", "max_tokens must be at least 1, got %lld", asked);
    if (longest + asked > L)
        return srv_fail(e, 400, "max_tokens",
                        "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d in the input, %lld in the completion). Please reduce the length of the input or completion.",
                        L, longest + asked, longest, asked);
    r->max_tokens = (int)asked;
    if (r->sp.min_tokens > r->max_tokens)
        return srv_fail(e, 400, "min_tokens", "min_tokens (%d) must not exceed max_tokens (%d)", r->sp.min_tokens, r->max_tokens);
    return 0;
}

int srv_parse_stops(const json_t *v, const char *name, srv_req *r, srv_err *e) {
    if (!v || json_is_null(v)) return 0;
    size_t n = json_is_string(v) ? 1 : json_is_array(v) ? json_array_size(v) : 0;
    if (!json_is_string(v) && !json_is_array(v)) return srv_fail(e, 400, name, "'%s' must be a string or an array of strings", name);
    if (n > SRV_MAX_STOPS) return srv_fail(e, 400, name, "'%s' has %zu strings; at most %d are accepted", name, n, SRV_MAX_STOPS);
    r->stops = calloc(n ? n : 1, sizeof *r->stops);
    if (!r->stops) return srv_fail(e, 500, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *it = json_is_string(v) ? v : json_array_get(v, i);
        if (!json_is_string(it)) return srv_fail(e, 400, name, "'%s[%zu]' must be a string", name, i);
        if (!json_string_length(it)) return srv_fail(e, 400, name, "'%s' strings must not be empty", name);
        r->stops[r->n_stops] = strdup(json_string_value(it));
        if (!r->stops[r->n_stops]) return srv_fail(e, 500, NULL, "out of memory");
        r->n_stops++;
    }
    return 0;
}

/* Strict decimal token id in [0, vocab). */
static int parse_id_key(const char *k, int vocab, int32_t *out) {
    if (!*k || strlen(k) > 10) return -1;
    long long v = 0;
    for (const char *p = k; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (*p - '0');
    }
    if (v >= vocab) return -1;
    *out = (int32_t)v;
    return 0;
}

int srv_parse_sampling(mk_srv *s, const json_t *b, srv_req *r, srv_err *e) {
    double d;
    long long ll;
    int bl;
    if (srv_get_num(b, "temperature", &d)) r->sp.temperature = (float)d;
    if (srv_get_num(b, "top_p", &d)) r->sp.top_p = (float)d;
    if (srv_get_int(b, "top_k", &ll)) r->sp.top_k = ll == 0 ? -1 : (int)ll;
    if (srv_get_num(b, "min_p", &d)) r->sp.min_p = (float)d;
    if (srv_get_num(b, "presence_penalty", &d)) r->sp.presence_penalty = (float)d;
    if (srv_get_num(b, "frequency_penalty", &d)) r->sp.frequency_penalty = (float)d;
    if (srv_get_num(b, "repetition_penalty", &d)) r->sp.repetition_penalty = (float)d;
    if (srv_get_int(b, "seed", &ll)) {
        r->sp.seed = (uint64_t)ll;
        r->sp.has_seed = 1;
    }
    if (srv_get_int(b, "min_tokens", &ll)) r->sp.min_tokens = (int)ll;
    if (srv_get_bool(b, "ignore_eos", &bl)) r->sp.ignore_eos = bl;
    if (srv_get_bool(b, "skip_special_tokens", &bl)) r->skip_special = bl;
    if (srv_get_bool(b, "include_stop_str_in_output", &bl)) r->include_stop_str = bl;
    if (srv_get_int(b, "priority", &ll)) r->priority = (int)ll;
    const char *salt = srv_get_str(b, "cache_salt");
    if (salt && !(r->cache_salt = strdup(salt))) return srv_fail(e, 500, NULL, "out of memory");
    json_t *lb = json_object_get(b, "logit_bias");
    if (json_is_object(lb) && json_object_size(lb)) {
        size_t n = json_object_size(lb);
        if (n > 1024) return srv_fail(e, 400, "logit_bias", "logit_bias has %zu entries; at most 1024 are accepted", n);
        r->bias_ids = malloc(n * sizeof *r->bias_ids);
        r->bias_vals = malloc(n * sizeof *r->bias_vals);
        if (!r->bias_ids || !r->bias_vals) return srv_fail(e, 500, NULL, "out of memory");
        const char *k;
        json_t *v;
        int i = 0;
        json_object_foreach(lb, k, v) {
            if (parse_id_key(k, s->vocab, &r->bias_ids[i]))
                return srv_fail(e, 400, "logit_bias", "logit_bias key '%s' is not a token id in [0, %d)", k, s->vocab);
            if (!json_is_number(v) || !(json_number_value(v) >= -100 && json_number_value(v) <= 100))
                return srv_fail(e, 400, "logit_bias", "logit_bias['%s'] must be a number in [-100, 100]", k);
            r->bias_vals[i++] = (float)json_number_value(v);
        }
        r->sp.bias_ids = r->bias_ids;
        r->sp.bias_vals = r->bias_vals;
        r->sp.n_bias = i;
    }
    json_t *si = json_object_get(b, "stop_token_ids");
    if (json_is_array(si) && json_array_size(si)) {
        size_t n = json_array_size(si);
        if (n > 256) return srv_fail(e, 400, "stop_token_ids", "stop_token_ids has %zu ids; at most 256 are accepted", n);
        r->stop_ids = malloc(n * sizeof *r->stop_ids);
        if (!r->stop_ids) return srv_fail(e, 500, NULL, "out of memory");
        for (size_t i = 0; i < n; i++) {
            if (!srv_json_int(json_array_get(si, i), &ll) || ll < 0 || ll >= s->vocab)
                return srv_fail(e, 400, "stop_token_ids", "stop_token_ids[%zu] must be a token id in [0, %d)", i, s->vocab);
            r->stop_ids[i] = (int32_t)ll;
        }
        r->sp.stop_ids = r->stop_ids;
        r->sp.n_stop_ids = (int)n;
    }
    if (srv_parse_stops(json_object_get(b, "stop"), "stop", r, e)) return -1;
    json_t *so = json_object_get(b, "stream_options");
    if (json_is_object(so)) {
        if (!r->stream) return srv_fail(e, 400, "stream_options", "stream_options can only be given with stream=true");
        if (srv_check_fields(so, stream_opts_fields, 2, "stream_options.", e)) return -1;
        srv_get_bool(so, "include_usage", &r->include_usage);
        srv_get_bool(so, "continuous_usage_stats", &r->continuous_usage);
    }
    json_t *rf = json_object_get(b, "response_format");
    if (json_is_object(rf)) {
        const char *t = srv_get_str(rf, "type");
        const char *k;
        json_t *v;
        json_object_foreach(rf, k, v) if (strcmp(k, "type") && strcmp(k, "json_schema"))
            return srv_fail(e, 400, "response_format", "unknown field 'response_format.%s'", k);
        if (!t) return srv_fail(e, 400, "response_format", "'response_format.type' must be a string");
        if (!strcmp(t, "json_object") || !strcmp(t, "json_schema") || !strcmp(t, "structural_tag") || !strcmp(t, "regex") || !strcmp(t, "grammar"))
            return srv_fail(e, 400, "response_format", "response_format type '%s' is not supported by minke (no structured output yet)", t);
        if (strcmp(t, "text")) return srv_fail(e, 400, "response_format", "response_format.type must be 'text', got '%s'", t);
        if (json_object_get(rf, "json_schema")) return srv_fail(e, 400, "response_format", "response_format.json_schema is not supported by minke");
    }
    return 0;
}

int srv_check_tools(const json_t *tools, const char *where, srv_err *e) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        if (!json_is_object(t)) return srv_fail(e, 400, where, "%s[%zu] must be an object", where, i);
        const char *k;
        json_t *v;
        json_object_foreach(t, k, v) if (strcmp(k, "type") && strcmp(k, "function"))
            return srv_fail(e, 400, where, "unknown field '%s[%zu].%s'", where, i, k);
        const char *ty = srv_get_str(t, "type");
        if (!ty || strcmp(ty, "function"))
            return srv_fail(e, 400, where, "%s[%zu].type must be 'function'", where, i);
        json_t *f = json_object_get(t, "function");
        if (!json_is_object(f)) return srv_fail(e, 400, where, "%s[%zu].function must be an object", where, i);
        json_object_foreach(f, k, v) {
            if (!strcmp(k, "name")) {
                if (!json_is_string(v) || !json_string_length(v))
                    return srv_fail(e, 400, where, "%s[%zu].function.name must be a non-empty string", where, i);
            } else if (!strcmp(k, "description")) {
                if (!json_is_string(v)) return srv_fail(e, 400, where, "%s[%zu].function.description must be a string", where, i);
            } else if (!strcmp(k, "parameters")) {
                if (!json_is_object(v)) return srv_fail(e, 400, where, "%s[%zu].function.parameters must be an object", where, i);
            } else if (!strcmp(k, "strict")) {
                if (!json_is_boolean(v) && !json_is_null(v)) return srv_fail(e, 400, where, "%s[%zu].function.strict must be a boolean", where, i);
            } else {
                return srv_fail(e, 400, where, "unknown field '%s[%zu].function.%s'", where, i, k);
            }
        }
        if (!json_object_get(f, "name")) return srv_fail(e, 400, where, "%s[%zu].function.name is required", where, i);
    }
    return 0;
}

int srv_render_prompt(mk_srv *s, const json_t *messages, const json_t *tools, int thinking,
                      const char *effort, int add_gen, srv_req *r, srv_err *e) {
    mk_chat_render_opts ro;
    mk_chat_render_opts_default(&ro);
    ro.thinking = thinking;
    ro.reasoning_effort = effort;
    ro.add_generation_prompt = add_gen;
    char *text = NULL;
    mk_err err = {0};
    int rc = mk_chat_render(s->chat, messages, tools, &ro, &text, &err);
    if (rc) return srv_fail(e, rc == MK_ENOMEM ? 500 : 400, "messages", "%s", err.msg);
    free(r->prompt_text);
    r->prompt_text = text;
    r->prompts = calloc(1, sizeof *r->prompts);
    if (!r->prompts) return srv_fail(e, 500, NULL, "out of memory");
    r->n_prompts = 1;
    size_t n = 0;
    rc = mk_tok_encode(mk_chat_tok(s->chat), text, strlen(text), 0, &r->prompts[0].ids, &n, &err);
    if (rc) return srv_fail(e, rc == MK_ENOMEM ? 500 : 400, "messages", "%s", err.msg);
    r->prompts[0].n = (int)n;
    return 0;
}

/* The common start of every generation request. */
static void req_init(mk_srv *s, srv_req *r, srv_api api) {
    memset(r, 0, sizeof *r);
    r->api = api;
    mk_chat_sampling_defaults(s->chat, &r->sp);
    r->skip_special = 1;
    r->n = 1;
}

static int finish_sampling(mk_srv *s, srv_req *r, srv_err *e) {
    mk_err err = {0};
    if (mk_sampling_validate(&r->sp, s->vocab, &err)) return srv_fail(e, 400, NULL, "%s", err.msg);
    return 0;
}

/* ---- chat: request ----------------------------------------------------------------------------- */

static int parse_tool_choice(const json_t *tc, const json_t *tools, srv_req *r, const char **named, srv_err *e) {
    size_t n_tools = json_is_array(tools) ? json_array_size(tools) : 0;
    *named = NULL;
    r->tool_choice = n_tools ? SRV_TC_AUTO : SRV_TC_NONE;
    if (!tc || json_is_null(tc)) return 0;
    if (json_is_string(tc)) {
        const char *v = json_string_value(tc);
        if (!strcmp(v, "none")) r->tool_choice = SRV_TC_NONE;
        else if (!strcmp(v, "auto")) r->tool_choice = n_tools ? SRV_TC_AUTO : SRV_TC_NONE;
        else if (!strcmp(v, "required")) r->tool_choice = SRV_TC_REQUIRED;
        else return srv_fail(e, 400, "tool_choice", "tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}, got '%s'", v);
    } else {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)tc, k, v) if (strcmp(k, "type") && strcmp(k, "function"))
            return srv_fail(e, 400, "tool_choice", "unknown field 'tool_choice.%s'", k);
        const char *ty = srv_get_str(tc, "type");
        json_t *f = json_object_get(tc, "function");
        const char *name = json_is_object(f) ? srv_get_str(f, "name") : NULL;
        if (!ty || strcmp(ty, "function") || !name)
            return srv_fail(e, 400, "tool_choice", "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}");
        json_object_foreach(f, k, v) if (strcmp(k, "name"))
            return srv_fail(e, 400, "tool_choice", "unknown field 'tool_choice.function.%s'", k);
        r->tool_choice = SRV_TC_NAMED;
        *named = name;
    }
    if (r->tool_choice >= SRV_TC_REQUIRED && !n_tools)
        return srv_fail(e, 400, "tool_choice", "tool_choice '%s' needs tools", *named ? "function" : "required");
    if (*named) {
        size_t i;
        json_t *t;
        int found = 0;
        json_array_foreach(tools, i, t) {
            const char *tn = srv_get_str(json_object_get(t, "function"), "name");
            if (tn && !strcmp(tn, *named)) found = 1;
        }
        if (!found) return srv_fail(e, 400, "tool_choice", "tool_choice names '%s', which is not in tools", *named);
    }
    return 0;
}

int srv_forced_tools(srv_req *r, const json_t *tools, const char *named, srv_err *e) {
    size_t n = json_array_size(tools), i;
    json_t *t;
    r->ftools = calloc(n ? n : 1, sizeof *r->ftools);
    if (!r->ftools) return srv_fail(e, 500, NULL, "out of memory");
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function");
        const char *name = srv_get_str(f, "name");
        if (!name || (named && strcmp(name, named))) continue;
        srv_ftool *ft = &r->ftools[r->n_ftools++];
        ft->name = strdup(name);
        json_t *params = json_object_get(f, "parameters");
        json_t *req = json_object_get(params, "required"), *props = json_object_get(params, "properties");
        size_t nr = json_array_size(req), k;
        json_t *pn;
        ft->params = calloc(nr ? nr : 1, sizeof *ft->params);
        if (!ft->name || !ft->params) return srv_fail(e, 500, NULL, "out of memory");
        json_array_foreach(req, k, pn) {
            if (!json_is_string(pn)) continue;
            json_t *ty = json_object_get(json_object_get(props, json_string_value(pn)), "type");
            srv_fparam *p = &ft->params[ft->n_params++];
            p->name = strdup(json_string_value(pn));
            if (!p->name) return srv_fail(e, 500, NULL, "out of memory");
            p->is_string = !json_is_string(ty) || !strcmp(json_string_value(ty), "string");
        }
    }
    return 0;
}

int srv_chat_build_prompt(mk_srv *s, const json_t *b, srv_req *r, srv_err *e) {
    json_t *msgs = json_object_get(b, "messages");
    if (!json_array_size(msgs)) return srv_fail(e, 400, "messages", "messages must be a non-empty array");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m)) return srv_fail(e, 400, "messages", "messages[%zu] must be an object", i);
        if (!json_is_string(json_object_get(m, "role"))) return srv_fail(e, 400, "messages", "messages[%zu].role must be a string", i);
        /* tool-call arguments must be JSON (vLLM parses them for the template and answers 400;
         * DeepSeek's encoder would pass non-JSON text through as one "arguments" parameter) */
        size_t k;
        json_t *tc;
        json_array_foreach(json_object_get(m, "tool_calls"), k, tc) {
            json_t *a = json_object_get(json_object_get(tc, "function"), "arguments");
            if (json_is_string(a)) {
                json_t *j = json_loads(json_string_value(a), JSON_DECODE_ANY, NULL);
                if (!j) return srv_fail(e, 400, "messages", "messages[%zu].tool_calls[%zu].function.arguments is not valid JSON", i, k);
                json_decref(j);
            }
        }
    }
    int bl = 0;
    if (srv_get_bool(b, "continue_final_message", &bl) && bl)
        return srv_fail(e, 400, "continue_final_message", "continue_final_message is not supported by minke");

    /* tools */
    json_t *tools = json_object_get(b, "tools");
    if (tools && !json_is_null(tools) && !json_is_array(tools)) return srv_fail(e, 400, "tools", "'tools' must be an array");
    if (json_is_array(tools) && srv_check_tools(tools, "tools", e)) return -1;
    const char *named = NULL;
    if (parse_tool_choice(json_object_get(b, "tool_choice"), tools, r, &named, e)) return -1;
    int dsv4 = mk_chat_is_dsv4(s->chat);
    if (!dsv4 && r->tool_choice != SRV_TC_NONE)
        return srv_fail(e, 400, "tools", "tools are not supported by this model (%s chat template); only DeepSeek-V4 models take tools",
                        mk_chat_template_name(s->chat));

    /* thinking mode (DeepSeek-V4) */
    const char *effort = srv_get_str(b, "reasoning_effort");
    int thinking = 0;
    const char *dsv4_effort = NULL;
    if (effort) {
        static const char *const ok[] = {"none", "minimal", "low", "medium", "high", "max"};
        int k = 0;
        while (k < 6 && strcmp(ok[k], effort)) k++;
        if (k == 6) return srv_fail(e, 400, "reasoning_effort", "reasoning_effort must be one of none, minimal, low, medium, high, max; got '%s'", effort);
        thinking = k > 0;
        dsv4_effort = k == 5 ? "max" : k == 4 ? "high" : NULL;
    }
    json_t *kw = json_object_get(b, "chat_template_kwargs");
    if (json_is_object(kw)) {
        const char *k;
        json_t *v;
        json_object_foreach(kw, k, v) {
            if (strcmp(k, "thinking") && strcmp(k, "enable_thinking"))
                return srv_fail(e, 400, "chat_template_kwargs", "chat_template_kwargs.%s is not supported (only thinking / enable_thinking)", k);
            if (!json_is_boolean(v)) return srv_fail(e, 400, "chat_template_kwargs", "chat_template_kwargs.%s must be a boolean", k);
            thinking = json_is_true(v);
        }
    } else if (kw && !json_is_null(kw)) {
        return srv_fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    }
    if (!dsv4) thinking = 0; /* the GGUF templates have no thinking mode */
    r->thinking = thinking;
    r->parse_tools = dsv4 && r->tool_choice != SRV_TC_NONE;
    if (dsv4 && (r->tool_choice == SRV_TC_REQUIRED || r->tool_choice == SRV_TC_NAMED) &&
        srv_forced_tools(r, tools, named, e))
        return -1;
    int add_gen = 1;
    srv_get_bool(b, "add_generation_prompt", &add_gen);

    /* the prompt: for a named choice only that tool is shown */
    json_t *use_tools = NULL;
    if (r->tool_choice == SRV_TC_NAMED) {
        use_tools = json_array();
        size_t k;
        json_t *t;
        json_array_foreach(tools, k, t) {
            const char *tn = srv_get_str(json_object_get(t, "function"), "name");
            if (tn && !strcmp(tn, named)) json_array_append(use_tools, t);
        }
    } else if (r->tool_choice != SRV_TC_NONE) {
        use_tools = json_incref(tools);
    }
    int rc = srv_render_prompt(s, msgs, use_tools, thinking, dsv4_effort, add_gen, r, e);
    json_decref(use_tools);
    return rc;
}

int srv_chat_parse(mk_srv *s, const json_t *b, srv_req *r, srv_err *e) {
    req_init(s, r, SRV_API_CHAT);
    if (srv_check_fields(b, srv_chat_fields, srv_n_chat_fields, NULL, e)) return -1;
    if (srv_check_model(s, b, r, e)) return -1;
    srv_get_bool(b, "stream", &r->stream);
    long long ll;
    int bl = 0;
    if (srv_get_int(b, "n", &ll)) r->n = (int)ll;
    if (srv_get_bool(b, "echo", &bl) && bl) return srv_fail(e, 400, "echo", "echo is not supported for chat completions");
    if (srv_parse_sampling(s, b, r, e)) return -1;
    int lp = 0;
    srv_get_bool(b, "logprobs", &lp);
    if (srv_get_int(b, "top_logprobs", &ll)) {
        if (!lp && ll > 0) return srv_fail(e, 400, "top_logprobs", "top_logprobs needs logprobs=true");
        r->top_logprobs = (int)ll;
    }
    r->logprobs = lp;
    r->sp.logprobs = lp;
    r->sp.top_logprobs = lp ? r->top_logprobs : 0;
    if (srv_chat_build_prompt(s, b, r, e)) return -1;
    long long mt = 0;
    int has = srv_get_int(b, "max_completion_tokens", &mt) || srv_get_int(b, "max_tokens", &mt);
    if (srv_resolve_max_tokens(s, r, mt, has, e)) return -1;
    return finish_sampling(s, r, e);
}

/* ---- completions: request ------------------------------------------------------------------- */

static int add_prompt_ids(mk_srv *s, srv_req *r, const json_t *arr, size_t which, srv_err *e) {
    size_t n = json_array_size(arr);
    if (!n) return srv_fail(e, 400, "prompt", "prompt %zu is an empty token list", which);
    srv_prompt *p = &r->prompts[r->n_prompts];
    p->ids = malloc(n * sizeof *p->ids);
    if (!p->ids) return srv_fail(e, 500, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        long long v;
        if (!srv_json_int(json_array_get(arr, i), &v) || v < 0 || v >= s->vocab) {
            free(p->ids);
            p->ids = NULL;
            return srv_fail(e, 400, "prompt", "prompt token %zu must be a token id in [0, %d)", i, s->vocab);
        }
        p->ids[i] = (int32_t)v;
    }
    p->n = (int)n;
    r->n_prompts++;
    return 0;
}

static int add_prompt_text(mk_srv *s, srv_req *r, const char *text, size_t len, int add_special, srv_err *e) {
    srv_prompt *p = &r->prompts[r->n_prompts];
    if (!len) return srv_fail(e, 400, "prompt", "the prompt must not be empty");
    size_t n = 0;
    mk_err err = {0};
    int rc = mk_tok_encode(mk_chat_tok(s->chat), text, len, add_special, &p->ids, &n, &err);
    if (rc) return srv_fail(e, rc == MK_ENOMEM ? 500 : 400, "prompt", "%s", err.msg);
    p->text = strndup(text, len);
    if (!p->text) return srv_fail(e, 500, NULL, "out of memory");
    p->n = (int)n;
    r->n_prompts++;
    if (!n) return srv_fail(e, 400, "prompt", "the prompt is empty (no tokens)");
    return 0;
}

int srv_completion_parse(mk_srv *s, const json_t *b, srv_req *r, srv_err *e) {
    req_init(s, r, SRV_API_COMPLETION);
    if (srv_check_fields(b, srv_completion_fields, srv_n_completion_fields, NULL, e)) return -1;
    if (srv_check_model(s, b, r, e)) return -1;
    srv_get_bool(b, "stream", &r->stream);
    long long ll;
    if (srv_get_int(b, "n", &ll)) r->n = (int)ll;
    srv_get_bool(b, "echo", &r->echo);
    if (srv_parse_sampling(s, b, r, e)) return -1;
    if (srv_get_int(b, "logprobs", &ll)) {
        if (r->echo)
            return srv_fail(e, 400, "logprobs", "echo together with logprobs is not supported: minke does not compute prompt logprobs");
        r->logprobs = 1;
        r->top_logprobs = (int)ll;
        r->sp.logprobs = 1;
        r->sp.top_logprobs = (int)ll;
    }
    int add_special = 1;
    srv_get_bool(b, "add_special_tokens", &add_special);
    json_t *p = json_object_get(b, "prompt");
    size_t np = json_is_string(p) ? 1 : json_array_size(p);
    if (!np) return srv_fail(e, 400, "prompt", "prompt must not be an empty array");
    json_t *first = json_is_array(p) ? json_array_get(p, 0) : NULL;
    int ids_one = first && json_is_number(first);
    if (ids_one) np = 1;
    if (np > SRV_MAX_PROMPTS) return srv_fail(e, 400, "prompt", "at most %d prompts per request, got %zu", SRV_MAX_PROMPTS, np);
    if (np * (size_t)r->n > SRV_MAX_CHOICES)
        return srv_fail(e, 400, "n", "prompts x n = %zu choices; at most %d per request", np * (size_t)r->n, SRV_MAX_CHOICES);
    r->prompts = calloc(np, sizeof *r->prompts);
    if (!r->prompts) return srv_fail(e, 500, NULL, "out of memory");
    if (json_is_string(p)) {
        if (add_prompt_text(s, r, json_string_value(p), json_string_length(p), add_special, e)) return -1;
    } else if (ids_one) {
        if (add_prompt_ids(s, r, p, 0, e)) return -1;
    } else {
        int strs = json_is_string(first);
        for (size_t i = 0; i < np; i++) {
            json_t *it = json_array_get(p, i);
            if (strs && json_is_string(it)) {
                if (add_prompt_text(s, r, json_string_value(it), json_string_length(it), add_special, e)) return -1;
            } else if (!strs && json_is_array(it)) {
                if (add_prompt_ids(s, r, it, i, e)) return -1;
            } else {
                return srv_fail(e, 400, "prompt", "prompt must be a string, an array of strings, an array of token ids, or an array of token-id arrays (prompt[%zu] does not fit)", i);
            }
        }
    }
    if (r->echo) /* the prompt text for token-id prompts */
        for (int i = 0; i < r->n_prompts; i++)
            if (!r->prompts[i].text) {
                size_t tl;
                mk_err err;
                if (mk_tok_decode(mk_chat_tok(s->chat), r->prompts[i].ids, (size_t)r->prompts[i].n, 0, &r->prompts[i].text, &tl, &err))
                    return srv_fail(e, 500, NULL, "%s", err.msg);
            }
    long long mt = 16;
    json_t *mtv = json_object_get(b, "max_tokens");
    int has = 1;
    if (mtv && json_is_null(mtv)) has = 0;
    else srv_get_int(b, "max_tokens", &mt);
    if (srv_resolve_max_tokens(s, r, mt, has, e)) return -1;
    return finish_sampling(s, r, e);
}

/* ---- logprobs ------------------------------------------------------------------------------------ */

char *srv_token_text(mk_srv *s, int32_t id, size_t *len) {
    char *t = NULL;
    mk_err err;
    if (mk_tok_decode(mk_chat_tok(s->chat), &id, 1, 0, &t, len, &err)) {
        t = strdup("");
        *len = 0;
    }
    return t;
}

static json_t *bytes_of(const char *t, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)t[i]));
    return a;
}

/* {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]} */
static json_t *chat_lp_entry(mk_srv *s, const mk_sample_out *t, int top) {
    size_t n;
    char *txt = srv_token_text(s, t->token, &n);
    json_t *o = json_object();
    json_object_set_new(o, "token", json_stringn(txt ? txt : "", txt ? n : 0));
    json_object_set_new(o, "logprob", json_real(srv_finite(t->logprob)));
    json_object_set_new(o, "bytes", bytes_of(txt ? txt : "", txt ? n : 0));
    free(txt);
    json_t *tops = json_array();
    for (int k = 0; k < t->n_top && k < top; k++) {
        char *a = srv_token_text(s, t->top_ids[k], &n);
        json_array_append_new(tops, json_pack("{s:s%, s:f, s:o}", "token", a ? a : "", a ? n : 0, "logprob",
                                              srv_finite(t->top_logprobs[k]), "bytes", bytes_of(a ? a : "", a ? n : 0)));
        free(a);
    }
    json_object_set_new(o, "top_logprobs", tops);
    return o;
}

/* Appends one token to a completions logprobs object {tokens, token_logprobs, top_logprobs,
 * text_offset}; *off is the text offset of the token. */
static void comp_lp_append(mk_srv *s, json_t *lp, const mk_sample_out *t, int top, size_t *off) {
    size_t n;
    char *txt = srv_token_text(s, t->token, &n);
    json_array_append_new(json_object_get(lp, "tokens"), json_stringn(txt ? txt : "", txt ? n : 0));
    json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(srv_finite(t->logprob)));
    json_t *d = json_object();
    for (int k = 0; k < t->n_top && k < top; k++) {
        size_t an;
        char *a = srv_token_text(s, t->top_ids[k], &an);
        if (a && !json_object_get(d, a)) json_object_set_new(d, a, json_real(srv_finite(t->top_logprobs[k])));
        free(a);
    }
    if (txt && !json_object_get(d, txt)) json_object_set_new(d, txt, json_real(srv_finite(t->logprob)));
    json_array_append_new(json_object_get(lp, "top_logprobs"), d);
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)*off));
    *off += n;
    free(txt);
}

static json_t *comp_lp_new(void) {
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

static json_t *usage_json(const srv_gen *g) {
    int c = srv_gen_completion_tokens(g);
    json_t *u = json_pack("{s:i, s:i, s:i}", "prompt_tokens", g->prompt_tokens, "completion_tokens", c, "total_tokens",
                          g->prompt_tokens + c);
    if (g->s->o.prompt_tokens_details)
        json_object_set_new(u, "prompt_tokens_details", json_pack("{s:i}", "cached_tokens", srv_gen_cached_tokens(g)));
    return u;
}

static json_t *stop_reason_json(const srv_choice *c, const srv_req *r) {
    if (c->stop_str >= 0 && c->stop_str < r->n_stops) return json_string(r->stops[c->stop_str]);
    if (c->stop_tok >= 0 && !c->stop_tok_is_eos) return json_integer(c->stop_tok);
    return json_null();
}

/* ---- chat: answers ------------------------------------------------------------------------------ */

static json_t *tool_calls_json(const srv_choice *c, int from, int to, int with_index) {
    json_t *a = json_array();
    for (int i = from; i < to; i++) {
        json_t *t = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", c->calls.v[i].id, "type", "function", "function", "name",
                              c->calls.v[i].name, "arguments", c->calls.v[i].args);
        if (with_index) json_object_set_new(t, "index", json_integer(i));
        json_array_append_new(a, t);
    }
    return a;
}

json_t *srv_chat_response(srv_gen *g) {
    srv_req *r = g->r;
    json_t *choices = json_array();
    for (int i = 0; i < g->n_ch; i++) {
        srv_choice *c = &g->ch[i];
        json_t *msg = json_object();
        json_object_set_new(msg, "role", json_string("assistant"));
        if (c->calls.n && !c->content.n) json_object_set_new(msg, "content", json_null());
        else json_object_set_new(msg, "content", json_stringn(c->content.p ? c->content.p : "", c->content.n));
        if (r->thinking) {
            json_object_set_new(msg, "reasoning_content", json_stringn(c->reasoning.p ? c->reasoning.p : "", c->reasoning.n));
            json_object_set_new(msg, "reasoning", json_stringn(c->reasoning.p ? c->reasoning.p : "", c->reasoning.n));
        }
        if (c->calls.n) json_object_set_new(msg, "tool_calls", tool_calls_json(c, 0, c->calls.n, 0));
        json_t *lp = json_null();
        if (r->logprobs) {
            json_t *content = json_array();
            for (int k = 0; k < c->n_toks; k++) json_array_append_new(content, chat_lp_entry(g->s, &c->toks[k], r->top_logprobs));
            lp = json_pack("{s:o}", "content", content);
        }
        json_array_append_new(choices, json_pack("{s:i, s:o, s:o, s:s, s:o}", "index", c->index, "message", msg, "logprobs", lp,
                                                 "finish_reason", c->finish ? c->finish : "stop", "stop_reason",
                                                 stop_reason_json(c, r)));
    }
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", g->id, "object", "chat.completion", "created",
                     (json_int_t)g->created, "model", r->model, "choices", choices, "usage", usage_json(g));
}

static json_t *chat_chunk(srv_gen *g, json_t *choice) {
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", g->id, "object", "chat.completion.chunk", "created",
                          (json_int_t)g->created, "model", g->r->model, "choices", choice);
    if (g->r->continuous_usage) json_object_set_new(o, "usage", usage_json(g));
    return o;
}

static void chat_emit(srv_stream *st, json_t *choice) {
    json_t *c = chat_chunk(st->g, choice);
    sb_sse(&st->out, NULL, c);
    json_decref(c);
}

static json_t *choice_delta(int index, json_t *delta) {
    return json_pack("{s:i, s:o, s:n, s:n}", "index", index, "delta", delta, "logprobs", "finish_reason");
}

static int chat_delta(void *ctx, srv_gen *g, const srv_delta *d) {
    srv_stream *st = ctx;
    srv_choice *c = d->c;
    srv_req *r = g->r;
    if (!c->sent_role) {
        c->sent_role = 1;
        chat_emit(st, choice_delta(c->index, json_pack("{s:s, s:s}", "role", "assistant", "content", "")));
    }
    json_t *lp = NULL;
    if (d->tok && r->logprobs) lp = json_pack("{s:[o]}", "content", chat_lp_entry(g->s, d->tok, r->top_logprobs));
    if (d->reasoning_len) {
        json_t *delta = json_pack("{s:s%, s:s%}", "reasoning_content", d->reasoning, d->reasoning_len, "reasoning", d->reasoning,
                                  d->reasoning_len);
        json_t *ch = choice_delta(c->index, delta);
        if (lp && !d->content_len) {
            json_object_set_new(ch, "logprobs", lp);
            lp = NULL;
        }
        chat_emit(st, ch);
    }
    if (d->content_len || lp) {
        json_t *ch = choice_delta(c->index, json_pack("{s:s%}", "content", d->content ? d->content : "", d->content_len));
        if (lp) json_object_set_new(ch, "logprobs", lp);
        chat_emit(st, ch);
    }
    if (d->call_to > d->call_from)
        chat_emit(st, choice_delta(c->index, json_pack("{s:o}", "tool_calls", tool_calls_json(c, d->call_from, d->call_to, 1))));
    if (d->finished) {
        json_t *ch = choice_delta(c->index, json_object());
        json_object_set_new(ch, "finish_reason", json_string(c->finish ? c->finish : "stop"));
        json_object_set_new(ch, "stop_reason", stop_reason_json(c, r));
        if (!strcmp(c->finish ? c->finish : "", "error")) {
            srv_err e;
            srv_fail(&e, 500, NULL, "generation failed: %s", c->errmsg);
            json_t *ej = srv_err_openai(&e);
            sb_sse(&st->out, NULL, ej);
            json_decref(ej);
        }
        chat_emit(st, ch);
    }
    return 0;
}

static void stream_tail(srv_stream *st) {
    if (st->req->include_usage) {
        srv_gen *g = st->g;
        json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", g->id, "object",
                              st->req->api == SRV_API_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                              (json_int_t)g->created, "model", g->r->model, "choices", "usage", usage_json(g));
        sb_sse(&st->out, NULL, o);
        json_decref(o);
    }
    sb_puts(&st->out, "data: [DONE]\n\n");
    st->done = 1;
}

int srv_chat_produce(srv_stream *st, double timeout_s) {
    srv_gen *g = st->g;
    if (!st->begun) {
        st->begun = 1;
        for (int i = 0; i < g->n_ch; i++) {
            g->ch[i].sent_role = 1;
            chat_emit(st, choice_delta(g->ch[i].index, json_pack("{s:s, s:s}", "role", "assistant", "content", "")));
            if (g->ch[i].done) { /* a forced call to a tool without parameters: complete already */
                srv_delta d = {.c = &g->ch[i], .content = "", .reasoning = "", .call_from = 0, .call_to = g->ch[i].calls.n,
                               .finished = 1};
                chat_delta(st, g, &d);
            }
        }
        if (g->n_done == g->n_ch) stream_tail(st);
        return 0;
    }
    if (g->n_done == g->n_ch) {
        stream_tail(st);
        return 0;
    }
    srv_gen_poll(g, timeout_s, chat_delta, st);
    if (g->n_done == g->n_ch) stream_tail(st);
    return 0;
}

/* ---- completions: answers ------------------------------------------------------------------------ */

json_t *srv_completion_response(srv_gen *g) {
    srv_req *r = g->r;
    json_t *choices = json_array();
    for (int i = 0; i < g->n_ch; i++) {
        srv_choice *c = &g->ch[i];
        srv_buf text = {0};
        if (r->echo && r->prompts[c->prompt].text) sb_puts(&text, r->prompts[c->prompt].text);
        sb_put(&text, c->content.p ? c->content.p : "", c->content.n);
        json_t *lp = json_null();
        if (r->logprobs) {
            lp = comp_lp_new();
            size_t off = 0;
            for (int k = 0; k < c->n_toks; k++) comp_lp_append(g->s, lp, &c->toks[k], r->top_logprobs, &off);
        }
        json_array_append_new(choices, json_pack("{s:i, s:s%, s:o, s:s, s:o}", "index", c->index, "text", text.p ? text.p : "",
                                                 text.n, "logprobs", lp, "finish_reason", c->finish ? c->finish : "stop",
                                                 "stop_reason", stop_reason_json(c, r)));
        sb_free(&text);
    }
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", g->id, "object", "text_completion", "created",
                     (json_int_t)g->created, "model", r->model, "choices", choices, "usage", usage_json(g));
}

static void comp_emit(srv_stream *st, int index, const char *text, size_t n, json_t *lp, const srv_choice *fin) {
    srv_gen *g = st->g;
    json_t *ch = json_pack("{s:i, s:s%, s:o, s:n}", "index", index, "text", text ? text : "", n, "logprobs", lp ? lp : json_null(),
                           "finish_reason");
    if (fin) {
        json_object_set_new(ch, "finish_reason", json_string(fin->finish ? fin->finish : "stop"));
        json_object_set_new(ch, "stop_reason", stop_reason_json(fin, g->r));
    }
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", g->id, "object", "text_completion", "created",
                          (json_int_t)g->created, "model", g->r->model, "choices", ch);
    if (g->r->continuous_usage) json_object_set_new(o, "usage", usage_json(g));
    sb_sse(&st->out, NULL, o);
    json_decref(o);
}

static int comp_delta(void *ctx, srv_gen *g, const srv_delta *d) {
    srv_stream *st = ctx;
    srv_choice *c = d->c;
    json_t *lp = NULL;
    if (d->tok && g->r->logprobs) {
        lp = comp_lp_new();
        comp_lp_append(g->s, lp, d->tok, g->r->top_logprobs, &c->lp_off);
    }
    if (d->content_len || lp) comp_emit(st, c->index, d->content, d->content_len, lp, NULL);
    if (d->finished) {
        if (!strcmp(c->finish ? c->finish : "", "error")) {
            srv_err e;
            srv_fail(&e, 500, NULL, "generation failed: %s", c->errmsg);
            json_t *ej = srv_err_openai(&e);
            sb_sse(&st->out, NULL, ej);
            json_decref(ej);
        }
        comp_emit(st, c->index, "", 0, NULL, c);
    }
    return 0;
}

int srv_completion_produce(srv_stream *st, double timeout_s) {
    srv_gen *g = st->g;
    if (!st->begun) {
        st->begun = 1;
        if (st->req->echo)
            for (int i = 0; i < g->n_ch; i++) {
                const char *t = st->req->prompts[g->ch[i].prompt].text;
                if (t) comp_emit(st, g->ch[i].index, t, strlen(t), NULL, NULL);
            }
        return 0;
    }
    if (g->n_done == g->n_ch) {
        stream_tail(st);
        return 0;
    }
    srv_gen_poll(g, timeout_s, comp_delta, st);
    if (g->n_done == g->n_ch) stream_tail(st);
    return 0;
}

/* ---- handlers ------------------------------------------------------------------------------------ */

/* Parse, start, and either stream or run to the end with `respond` building the JSON. */
static int run_request(const srv_http *h, json_t *body, srv_reply *rep,
                       int (*parse)(mk_srv *, const json_t *, srv_req *, srv_err *), const char *id_prefix,
                       srv_produce_fn produce, json_t *(*respond)(srv_gen *)) {
    srv_err e = {0};
    srv_req *r = calloc(1, sizeof *r);
    if (!r) return srv_reply_err(rep, (srv_fail(&e, 500, NULL, "out of memory"), &e));
    srv_gen *g = NULL;
    if (parse(h->s, body, r, &e) || srv_gen_start(h->s, r, h->t_arrive, id_prefix, &g, &e)) {
        srv_req_free(r);
        free(r);
        return srv_reply_err(rep, &e);
    }
    rep->prompt_tokens = g->prompt_tokens;
    if (r->stream) {
        rep->status = 200;
        rep->stream = srv_stream_new(h->s, h, r, g, produce);
        if (!rep->stream) {
            srv_gen_free(g);
            srv_req_free(r);
            free(r);
            return srv_reply_err(rep, (srv_fail(&e, 500, NULL, "out of memory"), &e));
        }
        return 0;
    }
    int gone = srv_gen_run(g, h->fd);
    rep->output_tokens = srv_gen_completion_tokens(g);
    srv_gen_timing(g, &rep->queue_s, &rep->ttft_s);
    int rc = 0;
    if (gone) {
        rep->status = 499; /* nginx's "client closed request": for the log only */
        rc = -2;
    } else {
        for (int i = 0; i < g->n_ch; i++)
            if (g->ch[i].finish && !strcmp(g->ch[i].finish, "error")) {
                srv_fail(&e, 500, NULL, "generation failed: %s", g->ch[i].errmsg);
                rc = srv_reply_err(rep, &e);
                break;
            }
        if (!rc) {
            rep->status = 200;
            rep->json = respond(g);
        }
    }
    srv_gen_free(g);
    srv_req_free(r);
    free(r);
    return rc;
}

int srv_h_chat(const srv_http *h, json_t *body, srv_reply *rep) {
    return run_request(h, body, rep, srv_chat_parse, "chatcmpl-", srv_chat_produce, srv_chat_response);
}

int srv_h_completions(const srv_http *h, json_t *body, srv_reply *rep) {
    return run_request(h, body, rep, srv_completion_parse, "cmpl-", srv_completion_produce, srv_completion_response);
}

int srv_h_messages(const srv_http *h, json_t *body, srv_reply *rep) {
    rep->anthropic = 1;
    return run_request(h, body, rep, srv_messages_parse, "msg_", srv_messages_produce, srv_messages_response);
}
